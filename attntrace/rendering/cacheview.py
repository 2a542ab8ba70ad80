"""The KV-cache steps' view (K_cache, V_cache): the cache after the new rows are appended.

One chain: K_cache = [K_past; K] = the cache's values, the new token's rows set off below a
horizontal rule (TeX; plain text names them in the prose), so the
reader sees the cache grow by one row. What the prose needs (how many rows were cached,
which rows are new, the total) is counted here, not in the templates.
"""

from __future__ import annotations

from attntrace.model.formula import after_lhs
from attntrace.rendering.stepview import register_view
from attntrace.rendering.viewparts import block, resolve


@register_view("cache")
def build_cache(sv, vm) -> None:
    s, o = sv.s, sv.out
    past, new = s.details.get("past_rows", 0), s.details.get("new_rows", 1)
    new_ref = resolve(sv.t, s.inputs[1], s.head)
    x = vm["extra"]
    x.update(which=s.id[0], past_rows=past, new_rows=new, total=past + new, first_new=past + 1, last_new=past + new,
             new_name=sv.mname(new_ref), past_name=sv.mname(resolve(sv.t, s.inputs[0], s.head)))
    lhs = sv.named(sv.ref)
    stacked = o.math(after_lhs(s.expr))  # [K_past; K]: the formula's right side, then the values
    matrix = o.matrix(s.value, s.shape, sv.budget(lhs))
    if not o.plain and s.shape[0] <= o.max_size:  # no rows elided: the rule falls between past and new
        matrix = o.rule_before(matrix, past)
        x["ruled"] = past > 0
    vm["main"] = [block(sv.fit(lhs, [stacked, matrix]))]
