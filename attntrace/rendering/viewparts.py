"""The pieces every step view shares: names and letters, blocks, references to matrices.

A *block* is one display: a list of lines (one line, or the lines of an aligned block with
'&' before each relation). A `Ref` is a matrix a step reads (an earlier step or an operand)
with the names its entries and the matrix itself go by in reports.
"""

from __future__ import annotations

from typing import Any

from attntrace.kinds import kind_of
from attntrace.rendering import views
from attntrace.inputs.blockspec import BLOCK_OPERANDS
from attntrace.inputs.mlaspec import MLA_OPERANDS
from attntrace.inputs.moespec import MOE_OPERANDS
from attntrace.rendering.printing import entry_name, pick
from attntrace.inputs.expr import accented_with_head

OPERAND_BASE = {"X": "x", "X_kv": "y", "W_Q": "w^{Q}", "W_K": "w^{K}", "W_V": "w^{V}", "W_O": "w^{O}", "b_Q": "b^{Q}", "b_K": "b^{K}",
                "b_V": "b^{V}", "b_O": "b^{O}", "Q": "q", "K": "k", "V": "v", "scores": "s", "weights": "a", "Z": "z"}
OPERAND_LETTER = {"X": "X", "X_kv": "X_{kv}", "W_Q": "W_Q", "W_K": "W_K", "W_V": "W_V", "W_O": "W_O", "b_Q": "b_Q", "b_K": "b_K",
                  "b_V": "b_V", "b_O": "b_O", "Q": "Q", "K": "K", "V": "V", "scores": "S", "weights": "A", "Z": "Z"}
OPERAND_PLAIN = {"X_kv": "X_kv"}
#: The KV cache's past keys and values (attntrace.kinds.cache).
OPERAND_LETTER.update({"K_past": "K_{\\text{past}}", "V_past": "V_{\\text{past}}"})
OPERAND_PLAIN.update({"K_past": "K_past", "V_past": "V_past"})
OPERAND_BASE.update({"K_past": "k^{p}", "V_past": "v^{p}"})
# the Transformer block's matrices (attntrace.inputs.blockspec): P, gamma_1, W_1, W_gate, ...
OPERAND_LETTER.update({k: v[0] for k, v in BLOCK_OPERANDS.items()})
OPERAND_PLAIN.update({k: v[1] for k, v in BLOCK_OPERANDS.items()})
OPERAND_BASE.update({k: v[2] for k, v in BLOCK_OPERANDS.items()})
# multi-head latent attention's matrices (attntrace.inputs.mlaspec): W^{DKV}, W^{UK}, ...
OPERAND_LETTER.update({k: v[0] for k, v in MLA_OPERANDS.items()})
OPERAND_PLAIN.update({k: v[1] for k, v in MLA_OPERANDS.items()})
OPERAND_BASE.update({k: v[2] for k, v in MLA_OPERANDS.items()})
# a mixture of experts' matrices (attntrace.inputs.moespec): W_r, each expert's W_gate^(e), ...
OPERAND_LETTER.update({k: v[0] for k, v in MOE_OPERANDS.items()})
OPERAND_PLAIN.update({k: v[1] for k, v in MOE_OPERANDS.items()})
OPERAND_BASE.update({k: v[2] for k, v in MOE_OPERANDS.items()})
#: A softmax row whose largest weight is at least this is called saturated in the report.
SATURATED = 0.999
#: Entries of one row written out at most (the first ones, a gap, the last), unless rows are
#: asked for: a reader who has followed three entries can do the rest (page budgets).
ENTRY_COLUMNS = 4


def entry_columns(sv, cols: int) -> list[int | None]:
    """The columns whose entries a report writes out for one row (None: the gap, shown as dots)."""
    return pick(cols, sv.out.max_size if sv.rows_opt else min(sv.out.max_size, ENTRY_COLUMNS))


#: Lines per aligned block at most where a view packs blocks itself (the given matrices).
BLOCK_LINES = 8


def block(lines: list[str]) -> dict[str, Any]:
    """A display: its lines, and whether they form an aligned block (several lines, or one
    line with an alignment mark before its relation)."""
    aligned = len(lines) > 1 or any(m in lines[0] for m in (" &= ", " &\\approx ", "} &= "))
    return {"lines": list(lines), "aligned": aligned}


class Ref:
    """A matrix a step reads: its value, shape, entry base name and matrix name."""

    def __init__(self, value, shape, base, letter, head, plain_letter=None):
        self.value, self.shape, self.base, self.letter, self.head = value, tuple(shape), base, letter, head
        self.plain_letter = plain_letter or letter

    def name(self, i: int, j: int) -> str:
        wide = max(self.shape) >= 10
        if self.base.startswith("\\"):  # \tilde{t}: not a parser name, written out here
            sub = f"{i + 1},{j + 1}" if wide else f"{i + 1}{j + 1}"
            return f"{accented_with_head(self.base, self.head)}_{{{sub}}}"
        return entry_name(self.base, i + 1, j + 1, self.head, wide=wide)


def resolve(trace, name: str, head: int | None) -> Ref:
    if "@" in name:
        name, h = name.split("@")
        head = int(h)
    for h in dict.fromkeys((head, None)):
        if trace.has(name, h):
            return step_ref(trace.step(name, h, block=1))  # an online step's input: its first block, as always
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
            return Ref(None, trace.settings["not_kept_shapes"][keys.index(key)], kind.entry, kind.letter, h, kind.plain_letter)
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
    base = op.symbol or OPERAND_BASE.get(op.name, "x")
    # a given Z_i in symbolic mode already carries its head in its symbol (z^{(2)})
    head = None if (op.symbol and "(" in op.symbol) else op.head
    return Ref(op.value, op.shape, base, OPERAND_LETTER.get(op.name, op.name), head if op.symbol else op.head,
               OPERAND_PLAIN.get(op.name))


def step_ref(step) -> Ref:
    kind = kind_of(step.id)  # its entry and matrix names (the masked scores are T-tilde, not T)
    return Ref(step.value, step.shape, kind.entry, kind.letter, step.head, kind.plain_letter)


def rows_to_expand(option, n: int, default: int) -> list[int]:
    """0-based rows: the option's list (1-based), 'all' (every shown row), or the first `default`."""
    if option == "all":
        return [i for i in pick(n, 10**9) if i is not None]
    if option:
        return [r - 1 for r in option if r <= n]
    return list(range(min(n, default)))


#: Shape lines of registered views (`views.MODULES`) whose inputs do not tell their shapes (a transposed factor, blocks of
#: a matrix): view name -> function(step, out) giving the line, or None for the usual one.
SHAPE_LINES: dict = {}


#: Steps whose two inputs meet entry by entry (a row or a column broadcast where the shapes
#: differ): (TeX, plain) sign of their shape line, (4 x 6) + (4 x 6) -> (4 x 6).
ELEMENTWISE = {"embed": ("+", "+"), "residual1": ("+", "+"), "residual2": ("+", "+"), "lse": ("+", "+"),
               "ffn_act": ("\\odot", "*"), "dscaled": ("\\odot", "*"), "norm1": ("\\odot", "*"), "norm2": ("\\odot", "*"),
               "online_exp": ("-", "-")}


def shape_dims(trace, step, out, short: bool = False) -> str:
    """(100 x 3) (3 x 3) -> (100 x 3): the shapes a step reads and the shape it makes."""
    arrow = " -> " if out.plain else " \\to "
    paren = lambda shape: f"({out.shape(shape)})"  # noqa: E731
    view = kind_of(step.id).view
    if view not in SHAPE_LINES:
        views.load(view)
    custom = SHAPE_LINES.get(view)
    line = custom(step, out) if custom else None
    if line is not None:
        return line
    if step.id == "concat":
        refs = [resolve(trace, n, None) for n in step.inputs]
        if len({r.shape for r in refs}) == 1 and not short:  # the article's (n, d_v h): h heads of (n, d_v)
            h, (n, d) = len(refs), refs[0].shape
            if out.plain:
                return f"{h} x ({n} x {d}){arrow}({n} x {d}*{h}) = ({n} x {d * h})"
            return f"{h} \\times ({n} \\times {d}){arrow}({n} \\times {d} \\cdot {h}) = ({n} \\times {d * h})"
        if len({r.shape for r in refs}) == 1:
            times = " x " if out.plain else " \\times "
            return f"{len(refs)}{times}{paren(refs[0].shape)}{arrow}{paren(step.shape)}"
        return ("; " if out.plain else ",\\ ").join(paren(r.shape) for r in refs) + arrow + paren(step.shape)
    ins = [resolve(trace, n, step.head) for n in step.inputs]
    shapes = [r.shape for r in ins]
    if step.id == "scores" or step.details.get("transposed"):  # A B^T
        shapes[1] = shapes[1][::-1]
    op = ELEMENTWISE.get(step.id) or kind_of(step.id).elementwise
    if op is not None and len(shapes) == 2:  # an addition or an entrywise product, not a matrix product
        sign = op[1] if out.plain else op[0]
        return f"{paren(shapes[0])} {sign} {paren(shapes[1])}{arrow}{paren(step.shape)}"
    if view == "cache" and len(shapes) == 2:  # the new rows stacked under the cached ones
        stacked = f"[{paren(shapes[0])}; {paren(shapes[1])}]" if out.plain else f"\\bigl[{paren(shapes[0])};\\ {paren(shapes[1])}\\bigr]"
        return stacked + arrow + paren(step.shape)
    if len(shapes) == 3 and shapes[2][0] == 1 and shapes[0][0] != 1:  # X W + b: the bias row is broadcast, added
        return (f"{paren(shapes[0])}{' ' if out.plain else chr(92) + ','}{paren(shapes[1])} + {paren(shapes[2])}"
                + arrow + paren(step.shape))
    return (" " if out.plain else "\\,").join(paren(sh) for sh in shapes) + arrow + paren(step.shape)


def pack(chains: list[list[str]], out) -> list[list[str]]:
    """Put one-line equations side by side (\\qquad apart) while they fit on a line."""
    blocks: list[list[str]] = []
    for lines in chains:
        if (not out.plain and blocks and not block(blocks[-1])["aligned"] and not block(lines)["aligned"]
                and out.measure(blocks[-1][0]) + 2.0 + out.measure(lines[0]) <= out.limit):
            blocks[-1] = [blocks[-1][0] + " \\qquad " + lines[0]]
        else:
            blocks.append(list(lines))
    return blocks
