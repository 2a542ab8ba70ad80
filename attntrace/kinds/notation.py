"""One notation per trace: every symbol a report uses, with one meaning and a shape.

Each kind declares the symbols it introduces (`Kind.notation`: its matrix with its entries,
and `Kind.symbols` such as the row maximum m or the ALiBi slope lambda); the operands a trace
starts from are named here and by the kind modules that bring them (a module's `OPERANDS`),
read through `operand_names`, the one table the reports use too. `notation_of`
collects them in trace order, once per symbol, and records a *clash* when one letter gets two
meanings: m for a slope and for a row maximum, say. Letters are compared without their index
decorations (m_i, m^{(j)} and m are one letter; W_Q and W_K are two, and so are Z^{(eta)} and Z), entry names too (q_{ij}
is q). tests/test_notation.py asserts that no example has a clash. The table is data: the
meanings are keys; their words live in the `words` macro of the prose module of the kind that
makes them, else in templates/prose/{en,zh}/notation.j2.
"""

from __future__ import annotations

import dataclasses
import re

from attntrace.inputs.blockspec import BLOCK_OPERANDS
from attntrace.inputs.spec import KV_KEYS
from attntrace.kinds import kind_of
from attntrace.kinds.base import HEAD_INDEX, KV_HEAD_INDEX, Symbol, base_sym
from attntrace.kinds.registry import operand_module
from attntrace.model.formula import Index, Sym, Word, node, nodes, substitute, sym
from attntrace.model.record import record

#: operand name -> its entries' base name in symbolic mode; its symbol in formulas (the reports use these)
OPERAND_BASE = {"X": "x", "X_kv": "y", "W_Q": "w^{Q}", "W_K": "w^{K}", "W_V": "w^{V}", "W_O": "w^{O}", "b_Q": "b^{Q}", "b_K": "b^{K}",
                "b_V": "b^{V}", "b_O": "b^{O}", "Q": "q", "K": "k", "V": "v", "scores": "s", "weights": "a", "Z": "z"}
#: The symbol of each given matrix in formulas (an operand named like a step stands in for it).
OPERAND_SYMBOL = {"X": sym("X"), "X_kv": sym("X", Word("kv", roman=True)), "scores": sym("S"), "weights": sym("A"), "Z": sym("Z"),
                  **{m: sym(m) for m in "QKV"}, **{f"{w}_{m}": sym(w, m) for w in "Wb" for m in "QKVO"}}
# the Transformer block's matrices (attntrace.inputs.blockspec): P, gamma_1, W_1, W_gate, ...
OPERAND_SYMBOL.update({k: v[0] for k, v in BLOCK_OPERANDS.items()})
OPERAND_BASE.update({k: v[1] for k, v in BLOCK_OPERANDS.items()})
# the operands kinds bring (the cache's past keys, QK-norm's gains, the sandwich's norms): each kind
# module's OPERANDS, name -> (symbol in formulas, base name of its entries), read when a trace has one


def operand_names(name: str) -> tuple:
    """(symbol in formulas, entries' base name) of the operand `name`, either None when unknown:
    the shared tables, else the OPERANDS of the kind module that brings it (imported then)."""
    if name not in OPERAND_SYMBOL:
        module = operand_module(name)
        if module is not None:
            OPERAND_SYMBOL[name], OPERAND_BASE[name] = module.OPERANDS[name]
    return OPERAND_SYMBOL.get(name), OPERAND_BASE.get(name)


#: operands that stand in for a step (a trace that starts mid-way) mean what the step means
_STEP_OPERANDS = {"Q": "Q", "K": "K", "V": "V", "scores": "scores", "weights": "weights", "Z": "Z", "P": "pos_enc"}


#: index decorations that do not change which letter it is: _i, _{ij}, _{r}, ^{(j)} (a head's ^{(eta)} does:
#: Z^{(eta)} is one head's output, Z the heads side by side)
_INDEX = re.compile(r"(_\{?[ijkr]{1,2}\}?|\^\{\([jk]\)\})$")


def letter_of(tex: str) -> str:
    """The letter a symbol is, without its index decorations: m_i -> m, q^{(eta)}_{ij} -> q^{(eta)}, W_Q -> W_Q."""
    prev = None
    while prev != tex:
        prev, tex = tex, _INDEX.sub("", tex)
    return tex


@record
class Notation:
    """A trace's notation table: its rows in order of first use, and the clashes found
    (letter, first meaning, second meaning); a right trace has none."""

    rows: tuple[Symbol, ...]
    clashes: tuple[tuple[str, str, str], ...]

    def to_list(self) -> list[dict]:
        """The table as JSON: symbol (LaTeX), plain, meaning (a key), shape ([rows, cols] or a word
        key), entry (LaTeX): the trees printed."""
        return [{"symbol": r.tex, "plain": r.plain, "meaning": r.meaning,
                 "shape": list(r.shape) if isinstance(r.shape, tuple) else r.shape, "entry": r.entry_tex} for r in self.rows]


def _with_head(row: Symbol, index=HEAD_INDEX) -> Symbol:
    """The symbol of a per-head matrix in a multi-head trace: Q^{(eta)}, q^{(eta)}_{ij} (a key/value
    head's under GQA: K^{(g)}); an entry whose base has a superscript of its own (w^{Q}_{ij}) keeps it."""
    entry = row.entry
    if isinstance(entry, Index) and isinstance(entry.of, Sym) and entry.of.sup is None:
        entry = substitute(entry, {entry.of: entry.of.head(index)})
    return dataclasses.replace(row, symbol=row.symbol.head(index), entry=entry)


#: Constants the formulas write, letter -> meaning: no row of the table (a reader knows e), but a
#: matrix or entry named with that letter in the same trace is a clash (entries e_ij beside the
#: softmax's e^{t_ij})
CONSTANTS = {"e": "euler"}


def _constants(trace) -> dict[str, str]:
    """The constants of `CONSTANTS` some step's formula writes (Euler's e: a softmax, a sigmoid)."""
    names = {n.name for step in trace.steps if step.expr is not None
             for n in nodes(step.expr) if isinstance(n, Sym) and n.sub is None and n.sup is None}
    return {letter: meaning for letter, meaning in CONSTANTS.items() if letter in names}


def _index_row(index, meaning: str) -> Symbol:
    return Symbol(index, meaning, "index")


def _operand(op) -> Symbol:
    symbol, base = operand_names(op.name)
    letter = symbol or node(op.name)
    base = op.symbol or base
    meaning = _STEP_OPERANDS.get(op.name, op.name)
    return Symbol(letter, meaning, tuple(op.shape), base_sym(base).at("i", "j") if base else None)


def notation_of(trace, operands=None) -> Notation:
    """The notation table of `trace`: operands first (in the trace's order, or in `operands`'
    order: a report lists them as its Given section does), then every step's symbols in trace
    order."""
    multi = trace.num_heads > 1
    rows: list[Symbol] = []
    seen: dict[str, str] = _constants(trace)  # letter -> meaning key (entries: "entry of" + the matrix's meaning)
    clashes: list[tuple[str, str, str]] = []

    def add(sym: Symbol) -> None:
        keys = [(letter_of(sym.tex), sym.meaning)]
        if sym.entry and letter_of(sym.entry_tex) != keys[0][0]:  # a vector's entries may share its letter (gamma_j of gamma)
            keys.append((letter_of(sym.entry_tex), f"entry:{sym.meaning}"))
        new = False
        for letter, meaning in keys:
            if letter not in seen:
                seen[letter] = meaning
                new = True
            elif seen[letter] != meaning and (letter, seen[letter], meaning) not in clashes:
                clashes.append((letter, seen[letter], meaning))
        if new:
            rows.append(sym)

    gqa = bool(trace.settings.get("kv_groups"))
    if multi:  # the head indices first: the per-head symbols below carry them
        add(_index_row(HEAD_INDEX, "head_index"))
        if gqa:
            add(_index_row(KV_HEAD_INDEX, "kv_head_index"))
    per_head_ops = {op.name for op in trace.operands if op.head is not None}
    for op in trace.operands if operands is None else operands:
        if op.head is None or op.head == 1:
            sym = _operand(op)
            kv = gqa and op.name in KV_KEYS
            add(_with_head(sym, KV_HEAD_INDEX if kv else HEAD_INDEX) if op.name in per_head_ops and multi else sym)
    for step in trace.steps:
        kv = gqa and "query_heads" in step.details  # a key/value head's own step (GQA)
        for sym in kind_of(step.id).notation(step):
            own = multi and step.head is not None and sym.symbol == node(kind_of(step.id).letter)
            add(_with_head(sym, KV_HEAD_INDEX if kv else HEAD_INDEX) if own else sym)
    return Notation(tuple(rows), tuple(clashes))
