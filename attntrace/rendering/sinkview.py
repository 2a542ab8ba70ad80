"""The sink step's view (attntrace.kinds.sink): T-check = [T~ | s 1], the scores with the head's sink
logit appended as one more column. The weights step then shows that column's exponential in
every row's sum (attntrace.rendering.softmaxview takes the source's columns for the shift and
the exponentials, the step's own for the weights), which is the extra denominator term."""

from __future__ import annotations

from attntrace.rendering.stepview import register_view
from attntrace.rendering.viewparts import block, resolve


@register_view("sink")
def build_sink(sv, vm) -> None:
    s, o = sv.s, sv.out
    src = resolve(sv.t, s.inputs[0], s.head)
    sink = s.details["logit"] if sv.mode in ("exact", "symbolic") else s.details["sink"]  # exact: 1/2, not 0.5
    vm["extra"].update(source=sv.mname(src), n_keys=s.details["keys"], column=s.details["keys"] + 1,
                       sink=o.num(float(sink)) if sv.mode == "numeric" else o.expr(sink))
    vm["formula_block"] = sv.fit_formula(vm["formula"]) if not o.plain else [vm["formula"]]
    lhs = sv.named(sv.ref)
    budget = sv.budget(lhs)
    if sv.mode == "symbolic":
        vm["main"] = [block(sv.fit(lhs, [o.matrix(s.value, s.shape, budget)]))]
    elif s.value is not None:
        vm["main"] = [block(sv.fit(lhs, sv.result_side(s.value, budget)))]
