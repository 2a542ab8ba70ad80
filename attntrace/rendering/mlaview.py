"""The views of multi-head latent attention's own steps (attntrace.kinds.mla).

"stack": a head's query or key, its parts side by side, Q = [Q^C  Q̃^R] = the values, with a
rule between the parts (TeX), so the reader sees which columns carry position.
"absorbed": S^A = S^C + S^R = the values, and the largest difference from S = Q K^T, which the
prose reports (0 in exact mode: the identity; float rounding in numeric mode).
"""

from __future__ import annotations

from attntrace.model import formula as F
from attntrace.rendering.printing import within_rounding
from attntrace.rendering.stepview import register_view
from attntrace.rendering.viewparts import SHAPE_LINES, block, report_params, resolve


def _stack_shapes(step, out) -> str:
    """[(n x a)  (n x b)] -> (n x (a + b)): two blocks side by side."""
    (n, c), (a, b) = step.shape, step.details["parts"]
    return out.math(F.to(F.Hcat((F.Shape(n, a), F.Shape(n, b)), inline=True), F.Shape(n, c)))


SHAPE_LINES["stack"] = _stack_shapes


@register_view("stack")
def build_stack(sv, vm) -> None:
    s, o = sv.s, sv.out
    first, second = s.details["parts"]
    a, b = (resolve(sv.t, n, s.head) for n in s.inputs)
    vm["extra"].update(first=sv.mname(a), second=sv.mname(b), first_cols=first, second_cols=second, width=first + second,
                       scale_given=report_params(sv.t).get("scale_given", False))
    lhs = sv.named(sv.ref)
    matrix = o.rule_after(o.matrix(s.value, s.shape, sv.budget(lhs)), first)
    vm["main"] = [block(sv.fit(lhs, [o.math(F.after_lhs(s.expr)), matrix]))]


@register_view("absorbed")
def build_absorbed(sv, vm) -> None:
    s, o = sv.s, sv.out
    gap = s.details.get("gap")
    scores = resolve(sv.t, s.details["scores"], s.head)
    # a gap within float noise of the scores (`printing.NOISE`: 4.4e-16 beside scores near 1) is 0, as its matrices print it
    noise = gap is not None and within_rounding(gap, scores.value)
    vm["extra"].update(scores=sv.mname(scores), gap=None if gap is None else ("0" if gap == 0 or noise else f"{gap:.1e}"),
                       exact=sv.mode == "exact", rounding=noise)
    lhs = sv.named(sv.ref)
    sides = [o.math(F.after_lhs(s.expr))]
    sides += sv.result_side(s.value, sv.budget(lhs)) if sv.mode != "symbolic" else [o.matrix(sv.expressions(), s.shape, sv.budget(lhs))]
    vm["main"] = [block(sv.fit(lhs, sides))]
