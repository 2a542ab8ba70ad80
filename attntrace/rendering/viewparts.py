"""The pieces every step view shares: names and letters, blocks, references to matrices.

A *block* is one display: a list of lines (one line, or the lines of an aligned block with
'&' before each relation). A `Ref` is a matrix a step reads (an earlier step or an operand)
with the names its entries and the matrix itself go by in reports.
"""

from __future__ import annotations

import re
from typing import Any

from attntrace.inputs.expr import entry_symbol
from attntrace.kinds import kind_of
from attntrace.rendering import views
from attntrace.kinds.notation import operand_names  # the reports' names of operands
from attntrace.model.formula import Juxt, Node, Num, Op, Rel, Seq, Shape, Stack, Word, node, sym, to
from attntrace.rendering.formulatext import ACCENTS, RELATIONS, tex
from attntrace.rendering.layout import SIDE_BY_SIDE
from attntrace.rendering.printing import entry_name, pick

#: A softmax row whose largest weight is at least this is called saturated in the report.
SATURATED = 0.999
#: Entries of one row written out at most (the first ones, a gap, the last), unless rows are
#: asked for: a reader who has followed three entries can do the rest (page budgets).
ENTRY_COLUMNS = 4


#: In the report of a whole Transformer block, where attention is one part of many: the first two
#: entries, the gap, the last.
BLOCK_ENTRY_COLUMNS = 3


def report_params(trace) -> dict[str, Any]:
    """What the trace's kinds tell a report's introduction (`Kind.report_params`, each kind from
    its steps): a variable two kinds give comes from the kind whose step is first in the trace."""
    by_id: dict[str, list] = {}
    for s in trace.steps:
        by_id.setdefault(s.id, []).append(s)
    told: dict[str, Any] = {}
    for step_id, steps in by_id.items():
        for key, value in kind_of(step_id).report_params(steps).items():
            told.setdefault(key, value)
    return told


def in_block(sv) -> bool:
    """Whether the step belongs to a report where attention is one part of many: a Transformer
    block's (it has a residual step) or multi-head latent attention's (it has the latent C^KV)."""
    found = getattr(sv, "_in_block", None)
    if found is None:
        found = sv._in_block = any(kind_of(s.id).one_of_many for s in sv.t.steps)
    return found


def entry_columns(sv, cols: int) -> list[int | None]:
    """The columns whose entries a report writes out for one row (None: the gap, shown as dots)."""
    limit = BLOCK_ENTRY_COLUMNS if in_block(sv) else ENTRY_COLUMNS
    limit = sv.out.max_size if sv.rows_opt else min(sv.out.max_size, limit)
    # a line of dots in place of one entry saves nothing: s_11, s_12, s_13, ⋮, s_15 hid only s_14
    return pick(cols, cols if cols == limit + 1 else limit)


#: Lines per aligned block at most where a view packs blocks itself (the given matrices).
BLOCK_LINES = 8


#: An alignment mark before a line's relation (=, or the approximation sign of the relations' table).
_ALIGNED = (" &= ", f" &{RELATIONS['approx'][0].strip()} ", "} &= ")


def block(lines: list[str]) -> dict[str, Any]:
    """A display: its lines, and whether they form an aligned block (several lines, or one
    line with an alignment mark before its relation)."""
    aligned = len(lines) > 1 or any(m in lines[0] for m in _ALIGNED)
    return {"lines": list(lines), "aligned": aligned}


class Ref:
    """A matrix a step reads: its value, shape, entry base name and matrix name."""

    def __init__(self, value, shape, base, matrix: Node, head, symbol: Node | None = None):
        self.value, self.shape, self.base, self.head = value, tuple(shape), base, head
        #: its name as a formula symbol (T-tilde, W_Q) without its head, and with it
        self.matrix, self.named = matrix, matrix.head(head)
        self.letter = tex(matrix)  # its LaTeX name, what a template compares
        #: the base of its entry names as a formula symbol (t-tilde), with its head
        self.symbol = (symbol or node(base)).head(head)

    def name(self, i: int, j: int) -> str:
        wide = max(self.shape) >= 10
        if self.base.startswith("\\"):  # \tilde{t}: not a parser name; the name SymPy's entries have
            return entry_symbol(self.base, i + 1, j + 1, self.head, wide)
        return entry_name(self.base, i + 1, j + 1, self.head, wide=wide)


def vector_entry(name: str) -> str:
    """Entry j of a one-row operand (a norm's gain, a bias) by its column alone, as its formula
    writes it: gamma_j, so gamma_{11} becomes gamma_{1}, b^{h}_{13} becomes b^{h}_{3}
    (gamma_{1j} next to gamma_j read as two symbols)."""
    return re.sub(r"_\{1,?(\d+)\}$", r"_{\1}", re.sub(r"_1,?(\d+)$", r"_\1", name))


_ENTRY_NAME = r"(?:\\(" + "|".join(ACCENTS) + r")\{(\w)\}|(\w))(?:\^\{\((\d+)\)\})?_\{[\d,]+\}"  # compiled by `re` on first use


def entry_base(name: str) -> Node:
    """The base of a SymPy entry name as a formula symbol: t^{(2)}_{11} -> t with head 2,
    \\tilde{t}_{11} -> t-tilde (also hat, bar); another name is kept whole."""
    m = re.fullmatch(_ENTRY_NAME, name)
    if m is None:
        return sym(name.rsplit("_", 1)[0])
    accent, accented, letter, head = m.groups()
    return sym(accented or letter, accent=accent).head(None if head is None else int(head))


def resolve(trace, name: str, head: int | None) -> Ref:
    if "@" in name:
        name, h = name.split("@")
        head = int(h)
    for h in dict.fromkeys((head, None)):
        if trace.has(name, h):
            # an online step's input: the block its address names, else (a plain id) its first block
            return step_ref(trace.step(name, h) if "#" in name else trace.step(name, h, block=1))
        try:
            o = trace.operand(name, h)
        except KeyError:
            continue
        return operand_ref(o)
    gone = not_kept_ref(trace, name, head)
    if gone is not None:
        return gone
    raise KeyError(name)


def not_kept_ref(trace, name: str, head: int | None) -> Ref | None:
    """A step computed but not recorded (`trace(..., keep=)`): its names and shape, no value."""
    keys = trace.settings.get("not_kept")
    if not keys:
        return None
    for h in dict.fromkeys((head, None)):
        key = name if h is None else f"{name}@{h}"
        if key in keys:
            kind = kind_of(name)
            entry = node(kind.entry)
            return Ref(None, trace.settings["not_kept_shapes"][keys.index(key)], tex(entry), node(kind.letter), h, entry)
    return None


def inputs_not_kept(trace, step) -> list[str]:
    """The inputs of `step` that were computed but not recorded (keep=): a report shows the step's result only."""
    if not trace.settings.get("not_kept"):
        return []
    out = []
    for n in step.inputs:
        name, _, h = n.partition("@")
        head = int(h) if h else step.head
        if not any(trace.has(name, x) for x in dict.fromkeys((head, None))) and not_kept_ref(trace, name, head) is not None:
            out.append(n)
    return out


def operand_ref(op) -> Ref:
    symbol, base = operand_names(op.name)
    base = op.symbol or base or "x"
    # a given Z_i in symbolic mode already carries its head in its symbol (z^{(2)})
    head = None if (op.symbol and "(" in op.symbol) else op.head
    return Ref(op.value, op.shape, base, symbol or node(op.name), head if op.symbol else op.head)


def step_ref(step) -> Ref:
    kind = kind_of(step.id)  # its entry and matrix names (the masked scores are T-tilde, not T)
    entry = node(kind.entry)
    return Ref(step.value, step.shape, tex(entry), node(kind.letter), step.head, entry)


def rows_to_expand(option, n: int, default: int) -> list[int]:
    """0-based rows: the option's list (1-based), 'all' (every shown row), or the first `default`."""
    if option == "all":
        return [i for i in pick(n, 10**9) if i is not None]
    if option:
        return [r - 1 for r in option if r <= n]
    return list(range(min(n, default)))


#: Shape lines of registered views (`views.modules()`) whose inputs do not tell their shapes (a transposed factor, blocks of
#: a matrix): view name -> function(step, out) giving the line, or None for the usual one.
SHAPE_LINES: dict = {}


def shape_of(shape) -> Node:
    return Shape(*shape)


def shapes_of(*shapes) -> Node:
    """Factors of a product, (4 x 3)(3 x 2): a thin space apart."""
    return Juxt(tuple(Shape(*s) for s in shapes), thin=True)


def shape_dims(trace, step, out, short: bool = False) -> str:
    """(100 x 3) (3 x 3) -> (100 x 3): the shapes a step reads and the shape it makes."""
    view = kind_of(step.id).view
    if view not in SHAPE_LINES:
        views.load(view)
    custom = SHAPE_LINES.get(view)
    line = custom(step, out) if custom else None
    if line is not None:
        return line
    made = shape_of(step.shape)
    if kind_of(step.id).joins_heads:
        refs = [resolve(trace, n, None) for n in step.inputs]
        if len({r.shape for r in refs}) == 1 and not short:  # the article's (n, d_v h): h heads of (n, d_v)
            h, (n, d) = len(refs), refs[0].shape
            return out.math(Rel((Op("times", Num(h), Shape(n, d)), Shape(n, Op("cdot", Num(d), Num(h))), made), ("to", "eq")))
        if len({r.shape for r in refs}) == 1:
            return out.math(to(Op("times", Num(len(refs)), shape_of(refs[0].shape)), made))
        return out.math(to(Seq(tuple(shape_of(r.shape) for r in refs), sep="semi"), made))
    ins = [resolve(trace, n, step.head) for n in step.inputs]
    shapes = [r.shape for r in ins]
    if kind_of(step.id).transposes_second or step.details.get("transposed"):  # A B^T
        shapes[1] = shapes[1][::-1]
    op = kind_of(step.id).elementwise  # two inputs that meet entry by entry: (4 x 6) + (4 x 6) -> (4 x 6)
    if op is not None and len(shapes) == 2:  # an addition or an entrywise product, not a matrix product
        a, b = shape_of(shapes[0]), shape_of(shapes[1])
        return out.math(to(a + b if op == "add" else a - b if op == "sub" else Op(op, a, b), made))
    if view == "cache" and len(shapes) == 2:  # the new rows stacked under the cached ones
        return out.math(to(Stack((shape_of(shapes[0]), shape_of(shapes[1])), inline=True), made))
    if len(shapes) == 3 and shapes[2][0] == 1 and shapes[0][0] != 1:  # X W + b: the bias row is broadcast, added
        return out.math(to(shapes_of(shapes[0], shapes[1]) + shape_of(shapes[2]), made))
    return out.math(to(shapes_of(*shapes), made))


def pack(chains: list[list[str]], out, first_fit: list[bool] | None = None) -> list[list[str]]:
    """Put one-line equations side by side (\\qquad apart) while they fit on a line. `first_fit`
    (one flag per chain): that equation, when it does not fit on the last line, goes on the first
    earlier one it fits on (a block's last gain beside W_gate rather than alone on a line)."""
    blocks: list[list[str]] = []

    def fits(b: list[str], lines: list[str]) -> bool:
        return (not out.plain and not block(b)["aligned"] and not block(lines)["aligned"]
                and out.measure(b[0]) + 2.0 + out.measure(lines[0]) <= out.limit)

    for n, lines in enumerate(chains):
        candidates = blocks if first_fit and first_fit[n] else blocks[-1:]
        k = next((k for k in range(len(blocks) - len(candidates), len(blocks)) if fits(blocks[k], lines)), None)
        if k is not None:
            blocks[k] = [blocks[k][0] + SIDE_BY_SIDE + lines[0]]
        else:
            blocks.append(list(lines))
    return blocks
