"""The views of multi-head latent attention's own steps (attntrace.kinds.mla).

"stack": a head's query or key, its parts side by side, Q = [Q^C  Q̃^R] = the values, with a
rule between the parts (TeX), so the reader sees which columns carry position.
"absorbed": S^A = S^C + S^R = the values, and the largest difference from S = Q K^T, which the
prose reports (0 in exact mode: the identity; float rounding in numeric mode).
"""

from __future__ import annotations

import re

from attntrace.rendering.stepview import register_view
from attntrace.rendering.viewparts import SHAPE_LINES, block, resolve


def _rule_after(matrix: str, col: int) -> str:
    """The matrix's TeX with a vertical rule after column `col` (when no column is elided)."""
    m = re.match(r"^\\left\[\\begin\{array\}\{r+\}(.*)\\end\{array\}\\right\]$", matrix, re.S)
    if m is None or "dots" in matrix:
        return matrix
    body = m.group(1)
    cols = body.split(" \\\\")[0].count("&") + 1
    if not 0 < col < cols:
        return matrix
    spec = "r" * col + "|" + "r" * (cols - col)
    return f"\\left[\\begin{{array}}{{{spec}}}{body}\\end{{array}}\\right]"


def _stack_shapes(step, out) -> str:
    """[(n x a)  (n x b)] -> (n x (a + b)): two blocks side by side."""
    (n, c), (a, b) = step.shape, step.details["parts"]
    if out.plain:
        return f"[({n} x {a})  ({n} x {b})] -> ({n} x {c})"
    return f"\\bigl[({n} \\times {a})\\ \\ ({n} \\times {b})\\bigr] \\to ({n} \\times {c})"


SHAPE_LINES["stack"] = _stack_shapes


@register_view("stack")
def build_stack(sv, vm) -> None:
    s, o = sv.s, sv.out
    first, second = s.details["parts"]
    a, b = (resolve(sv.t, n, s.head) for n in s.inputs)
    vm["extra"].update(first=sv.mname(a), second=sv.mname(b), first_cols=first, second_cols=second, width=first + second,
                       scale_given=any(t.id == "scaled" and t.details.get("by_sqrt_dk") is False for t in sv.t.steps))
    lhs = sv.named(sv.ref)
    matrix = o.matrix(s.value, s.shape, sv.budget(lhs))
    if not o.plain:
        matrix = _rule_after(matrix, first)
    vm["main"] = [block(sv.fit(lhs, [vm["formula"].partition(" = ")[2], matrix]))]


@register_view("absorbed")
def build_absorbed(sv, vm) -> None:
    s, o = sv.s, sv.out
    gap = s.details.get("gap")
    scores = resolve(sv.t, s.details["scores"], s.head)
    vm["extra"].update(scores=sv.mname(scores), gap=None if gap is None else ("0" if gap == 0 else f"{gap:.1e}"),
                       exact=sv.mode == "exact")
    lhs = sv.named(sv.ref)
    sides = [vm["formula"].partition(" = ")[2]]
    sides += sv.result_side(s.value, sv.budget(lhs)) if sv.mode != "symbolic" else [o.matrix(sv.expressions(), s.shape, sv.budget(lhs))]
    vm["main"] = [block(sv.fit(lhs, sides))]
