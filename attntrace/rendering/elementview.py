"""The view of a step that maps each entry of one matrix on its own (soft-capping, ...).

The step is written like the scaling: the general formula, the result matrix, then the entries
of the chosen rows, each as the kind's entry form in names, the same with numbers, and the
value. The kind gives its entry form (`entry_form(x, details)`: the map applied to x, as a
formula tree, e.g. c tanh(x / c) with its constant written out) and the numbers its prose quotes
(`view_numbers(details)`, formatted here); so a new element-wise kind needs no view of its own.
"""

from __future__ import annotations

from attntrace.kinds import kind_of
from attntrace.model.formula import after_lhs
from attntrace.rendering.printing import pick
from attntrace.rendering.stepview import register_view
from attntrace.rendering.viewparts import block, resolve, rows_to_expand


@register_view("elementwise")
def build_elementwise(sv, vm) -> None:
    s, o = sv.s, sv.out
    kind = kind_of(s.id)
    src = resolve(sv.t, s.inputs[0], s.head)
    vm["extra"].update({k: o.num(float(v)) for k, v in kind.view_numbers(s.details).items()})
    lhs = sv.named(sv.ref)
    rhs = o.math(after_lhs(s.expr))
    if sv.mode == "symbolic":
        sides = [rhs, o.matrix(s.value, s.shape, sv.budget(lhs))]
    else:
        sides = [rhs] + sv.result_side(s.value, sv.budget(lhs))
    vm["main"] = [block(sv.fit(lhs, sides))]
    rows = rows_to_expand(sv.rows_opt, s.shape[0], 1)
    vm["entry_rows"] = rows
    chains = []
    for i in rows:
        for j in pick(s.shape[1], o.max_size):
            if j is None:
                continue
            if sv.mode == "symbolic":
                chains.append(sv.fit(sv.entry_label(i, j), [sv.symbolic_sum(i, j)], align=True, lhs_width=sv.lw))
                continue
            names = o.math(kind.entry_form(sv.ename(src, i, j), s.details))
            nums = o.math(kind.entry_form(o.entry(src.value, i, j), s.details))
            chains.append(sv.fit(sv.ename(sv.ref, i, j), [names, nums] + sv.entry_result(s.value, i, j), align=True,
                                 lhs_width=sv.lw))
    vm["entries"] = sv.blocks_of(chains)
