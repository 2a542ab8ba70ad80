"""Views of the online softmax (attntrace.kinds.online): each block's running values next to
the ordinary softmax's, and the final Z = diag(l)^-1 O next to A V.

The block steps are named by their block, m^(2) or m_1^(2) with several query blocks (the
step's head is the section the report puts it in). Numbers only: the values and the ordinary
softmax's row maxima, sums and A V were all computed by the kind.
"""

from __future__ import annotations

from attntrace.model import formula as F
from attntrace.rendering.printing import scientific, within_rounding
from attntrace.rendering.stepview import register_view
from attntrace.rendering.viewparts import SHAPE_LINES, block

#: block step id -> the ordinary softmax's counterpart, shown beside it
_ORDINARY = {"online_max": F.sym("m"), "online_sum": F.sym("ell"),
             "lse": F.Func("log", (F.Sum(F.sym("j"), F.Power(F.sym("e"), F.sym("t").at("i", "j"))),), bare=True)}


def _name(sv, d) -> str:
    name = sv.ref.matrix
    if "block" not in d:
        return sv.out.math(name)
    if d.get("query_blocks", 1) > 1:
        name = name.at(d["query_block"])
    return sv.out.math(name.head(d["block"]))


def _result(sv, value, shape, budget):
    if sv.mode == "exact":
        sides = []
        approx = sv.out.approx_matrix(value, shape, budget)
        exact = sv.out.matrix(value, shape, budget)
        if sv.out.plain or sv.out.measure(exact) <= budget:
            sides.append(exact)
        if approx:
            sides.append((sv.out.rel("approx"), approx))
        return sides or [exact]
    return [sv.out.matrix(value, shape, budget)]


@register_view("online")
def build_online(sv, vm) -> None:
    s, o, d = sv.s, sv.out, sv.s.details
    extra = vm["extra"]
    extra.update(block=d.get("block", 0), blocks=d.get("blocks", 0), query_block=d.get("query_block", 0),
                 query_blocks=d.get("query_blocks", 1), rows=list(d.get("rows", ())), cols=list(d.get("cols", ())),
                 first=d.get("block") == 1, last=d.get("block") == d.get("blocks"), alpha=None, ordinary=None)
    # a range of two is said "3 and 4", not "3 to 4"; the block's width is said in the first block's prose
    for k in ("rows", "cols"):
        span = extra[k]
        extra[k + "_two"] = len(span) == 2 and span[1] == span[0] + 1
    extra["block_size"] = extra["cols"][1] - extra["cols"][0] + 1 if extra["cols"] else 0
    name = _name(sv, d)
    vm["name"] = name
    lhs = o.named(name, s.shape)
    budget = sv.budget(lhs)
    sides = s.expr.sides[1:] if isinstance(s.expr, F.Rel) else [s.expr]
    vm["main"] = [block(sv.fit(lhs, [o.math(x) for x in sides] + _result(sv, s.value, s.shape, budget)))]
    if d.get("alpha") is not None and s.id == "online_sum":
        j = d["block"]
        m = F.sym("m").at(d["query_block"]) if d.get("query_blocks", 1) > 1 else F.sym("m")
        alhs = o.named(o.math(F.Power(F.sym("e"), m.head(j - 1) - m.head(j))), s.shape[:1] + (1,))
        extra["alpha"] = block(sv.fit(alhs, _result(sv, d["alpha"], (s.shape[0], 1), sv.budget(alhs))))
    ordinary = d.get("ordinary")
    if ordinary is not None and s.id in _ORDINARY:
        olhs = o.named(o.math(_ORDINARY[s.id]), (s.shape[0], 1))
        extra["ordinary"] = block(sv.fit(olhs, _result(sv, ordinary, (s.shape[0], 1), sv.budget(olhs))))


def _shapes(o, s, d) -> str:
    """What a block step reads and makes: (rows x block keys) -> (rows x 1), and so on."""
    n = s.shape[0]
    made = F.Shape(*s.shape)
    if "rows" not in d:  # L from m and l; Z from l and O
        # L = m + log l: an addition; Z = diag(l)^-1 O: a product
        column = F.Shape(n, 1)
        return o.math(F.to(column + column if s.id == "lse" else F.Juxt((column, made)), made))
    r, c = d["rows"][1] - d["rows"][0] + 1, d["cols"][1] - d["cols"][0] + 1
    block_, reads = F.Shape(r, c), {"online_exp": F.Shape(r, 1), "online_out": F.Shape(c, s.shape[1])}.get(s.id)
    # the exponentials subtract the row maximum, a column broadcast across the block
    return o.math(F.to(block_ if reads is None else block_ - reads if s.id == "online_exp" else F.Juxt((block_, reads)), made))


@register_view("online_z")
def build_online_z(sv, vm) -> None:
    """The ordinary Z = A V as the product view; the online Z with A V beside it and their difference."""
    s, o, d = sv.s, sv.out, sv.s.details
    if not d.get("online"):
        sv.build_product(vm)
        return
    vm["extra"].update(online=True, blocks=d["blocks"], block_keys=d["block_keys"], block_queries=d["block_queries"],
                       query_blocks=d["query_blocks"], ordinary=None, max_diff="")
    lhs = sv.named(sv.ref)
    budget = sv.budget(lhs)
    vm["main"] = [block(sv.fit(lhs, vm["formula"].split(" = ")[1:] + _result(sv, s.value, s.shape, budget)))]
    if d.get("ordinary") is not None:
        alhs = o.named("A V", s.shape)
        vm["extra"]["ordinary"] = block(sv.fit(alhs, _result(sv, d["ordinary"], s.shape, sv.budget(alhs))))
        diff = d.get("max_diff") or 0.0
        # a difference within float noise of Z (`printing.NOISE`: 2.2e-16 beside entries near 1) is float64
        # rounding, said in words as the matrices print it 0; a larger one is printed
        rounding = within_rounding(diff, s.value)
        vm["extra"]["rounding"] = rounding
        vm["extra"]["max_diff"] = "0" if diff == 0 or rounding else (o.num(diff) if diff >= 10 ** -o.precision else o.sci(*scientific(diff)))


SHAPE_LINES["online"] = lambda step, out: _shapes(out, step, step.details)
SHAPE_LINES["online_z"] = lambda step, out: _shapes(out, step, {}) if step.details.get("online") else None
