"""The views of the mixture-of-experts steps (attntrace.kinds.moe).

"routing": the gates G, then for the first tokens the chosen experts 𝒯_i and their weights
written out (the names, the numbers, the result). "experts": each expert's output matrix
Y^(e) on its own line. "moe_sum": F, then for the first tokens f_i as the weighted sum of the
rows of the experts it chose (and the shared expert's row), which is all a token computes.
What the prose needs (the experts chosen by each token) is put in vm.extra here.
"""

from __future__ import annotations

import math

from attntrace.model import formula as F
from attntrace.rendering.layout import Seq
from attntrace.rendering.printing import reproducing_digits
from attntrace.rendering.stepview import register_view
from attntrace.rendering.viewparts import SHAPE_LINES, block, pack, resolve

#: Tokens whose routing and sum are written out.
TOKENS_SHOWN = 2


def _chosen(chosen) -> list[F.Node]:
    """𝒯_i = {experts token i chose}, 1-based (calligraphic: a set, not a row of the scaled scores T)."""
    return [F.sym("T", style="calligraphic").at(i + 1).eq(F.Seq(tuple(F.Num(e + 1) for e in sorted(es)), braces=True)) for i, es in enumerate(chosen)]


def _tokens(sv, n: int) -> list[int]:
    return [r - 1 for r in sv.rows_opt if r <= n] if isinstance(sv.rows_opt, list) else list(range(min(n, TOKENS_SHOWN)))


@register_view("routing")
def build_routing(sv, vm) -> None:
    s, o = sv.s, sv.out
    d = s.details
    lhs = sv.named(sv.ref)
    x = vm["extra"]
    x.update(router=d["router"], top_k=d["top_k"], experts=s.shape[1], normalize=d.get("normalize", True),
             scaling=str(d.get("scaling", 1)), grouped=d.get("n_group", 1) > 1, n_group=d.get("n_group", 1),
             topk_group=d.get("topk_group", 1), bias=bool(d.get("bias")))
    vm["formula_block"] = block([vm["formula"]])
    if s.value is None:
        return
    vm["main"] = [block(sv.fit(lhs, sv.result_side(s.value, sv.budget(lhs)) if sv.mode != "symbolic" else [o.matrix(s.value, s.shape, sv.budget(lhs))]))]
    chosen = d["chosen"]
    vm["extra"]["chosen_blocks"] = [block(c) for c in pack([[o.math(t)] for t in _chosen(chosen)], o)]
    src = resolve(sv.t, s.inputs[0], None)  # L (softmax) or S^r (sigmoid)
    chains = []
    for i in _tokens(sv, s.shape[0]):
        es = sorted(chosen[i])
        for j in es:
            chains.append(_gate_chain(sv, o, src, d, i, j, es))
    vm["entry_rows"] = _tokens(sv, s.shape[0])
    vm["entries"] = sv.blocks_of(chains)


def _routing_shapes(step, out) -> str:
    n, e = step.shape
    return out.math(F.to(F.Shape(n, e), F.Shape(n, e)))


SHAPE_LINES["routing"] = _routing_shapes


def _gate_chain(sv, o, src, d, i, j, es) -> list[str]:
    label = sv.entry_label(i, j)
    soft = d["router"] == "softmax"
    names_n = [sv.ename(src, i, k) for k in es]
    scale = None if soft or str(d.get("scaling", 1)) in ("1", "1.0") else F.Num(str(d["scaling"]))
    norm = soft or d.get("normalize", True)
    digits = o.precision
    if sv.mode == "numeric":  # the scores at the decimals that give the printed gate
        k, c = es.index(j), float(d.get("scaling", 1))

        def gate(xs: list[float]) -> float:
            top, parts = (math.exp(xs[k]), [math.exp(x) for x in xs]) if soft else (c * xs[k], xs)
            return top / sum(parts) if norm else top
        digits = reproducing_digits(o.precision, [float(src.value[i, q]) for q in es], gate, sv.entry_result(sv.s.value, i, j)[0])
    with o.digits(digits):
        nums_n = [o.entry(src.value, i, k) for k in es] if sv.mode != "symbolic" else None

    def frac(top, parts) -> str:
        """The gate: top / (sum of parts) when normalised, times the scaling factor."""
        body = F.Frac(top, F.Add(tuple(parts))) if norm else top
        return o.math(F.Op("mul", scale, body) if scale is not None else body)

    e = lambda t: F.Power(F.sym("e"), t)  # noqa: E731  (t: an entry's name or number, printed for this output)
    k = es.index(j)
    if soft:
        names = frac(e(names_n[k]), [e(t) for t in names_n])
        nums = frac(e(nums_n[k]), [e(t) for t in nums_n]) if nums_n else None
    else:
        names = frac(names_n[k], names_n)
        nums = frac(nums_n[k], nums_n) if nums_n else None
    sides = [names] + ([nums] if nums else []) + (sv.entry_result(sv.s.value, i, j) if sv.mode != "symbolic" else [])
    return sv.fit(label, sides, align=True, lhs_width=getattr(sv, "lw", 0.0))


@register_view("experts")
def build_experts(sv, vm) -> None:
    s, o = sv.s, sv.out
    vm["formula_block"] = block([vm["formula"]])
    x = vm["extra"]
    x.update(experts=s.details["experts"], width=s.details["width"], activation=s.details.get("activation", "swiglu"),
             clamp_alpha=str(s.details.get("alpha", "")), clamp_limit=str(s.details.get("limit", "")))
    if s.details.get("activation") == "clamped_swiglu":  # gpt-oss's rule takes three lines: one equation a line
        lines = [o.math(part) for part in s.expr.items]
        vm["formula_block"] = block(lines if o.plain else [line.replace(" = ", " &= ", 1) for line in lines])
    if s.value is None:
        return
    d, n_exp = s.details["width"], s.details["experts"]
    vm["elided"] = s.shape[0] > o.max_size or d > o.max_size  # each expert's block is shown whole when it fits
    if s.id == "shared_expert":
        lhs = sv.named(sv.ref)
        vm["main"] = [block(sv.fit(lhs, [o.matrix(s.value, s.shape, sv.budget(lhs))]))]
        return
    chains = []
    for e in range(n_exp):
        part = s.value[:, e * d:(e + 1) * d]
        name = o.head_name("Y", e + 1)
        lhs = o.named(name, (s.shape[0], d))
        chains.append(sv.fit(lhs, [o.matrix(part, (s.shape[0], d), sv.budget(lhs))]))
    vm["main"] = [block(c) for c in pack(chains, o)]


def _experts_shapes(step, out) -> str:
    n, width = step.shape
    if step.id == "shared_expert":
        return out.math(F.to(F.Shape(n, width), F.Shape(n, width)))
    e, d = step.details["experts"], step.details["width"]
    return out.math(F.Rel((F.Op("times", F.Num(e), F.Shape(n, d)), F.Shape(n, F.Op("cdot", F.Num(e), F.Num(d))), F.Shape(n, width)), ("to", "eq")))


SHAPE_LINES["experts"] = _experts_shapes


def _sum_shapes(step, out) -> str:
    """G (n x E); Y (n x E d) [; Y^s (n x d)] -> F (n x d): inputs met block by block, not one product."""
    n, d = step.shape
    e = step.details["experts"]
    shapes = [(n, e), (n, e * d)] + ([(n, d)] if step.details["shared"] else [])
    return out.math(F.to(F.Seq(tuple(F.Shape(a, b) for a, b in shapes), sep="semi"), F.Shape(n, d)))


SHAPE_LINES["moe_sum"] = _sum_shapes


@register_view("moe_sum")
def build_moe_sum(sv, vm) -> None:
    s, o = sv.s, sv.out
    vm["formula_block"] = block([vm["formula"]])
    vm["extra"].update(shared=s.details["shared"])
    if s.value is None:
        return
    lhs = sv.named(sv.ref)
    vm["main"] = [block(sv.fit(lhs, sv.result_side(s.value, sv.budget(lhs)) if sv.mode != "symbolic" else [o.matrix(s.value, s.shape, sv.budget(lhs))]))]
    g = resolve(sv.t, s.inputs[0], None)
    y = resolve(sv.t, s.inputs[1], None)
    ys = resolve(sv.t, s.inputs[2], None) if len(s.inputs) > 2 else None
    d = s.details["width"]
    chains = []
    for i in _tokens(sv, s.shape[0]):
        es = sorted(s.details["chosen"][i])
        row = lambda v, e: o.matrix(v[i:i + 1, e * d:(e + 1) * d], (1, d))  # noqa: E731
        terms = tuple(F.Juxt((F.sym("g", sup="r").at(i + 1, e + 1), F.Space(), F.sym("y").head(e + 1).at(i + 1))) for e in es)
        sides = [o.math(F.Add(terms + ((F.sym("y", sup="s").at(i + 1),) if ys else ())))]
        if sv.mode != "symbolic":
            terms = [f"{o.entry(g.value, i, e)} {row(y.value, e)}" for e in es] + ([row(ys.value, 0)] if ys else [])
            # a Seq: the layout breaks the weighted rows after a + when they do not fit the line
            sides.append(terms[0] if o.plain else Seq(tuple([terms[0]] + ["+ " + t for t in terms[1:]]), joiner=" "))
            if o.plain:
                sides[-1] = " + ".join(terms)
            sides.append(o.matrix(s.value[i:i + 1, :], (1, d)))
        chains.append(sv.fit(o.math(F.sym("f").at(i + 1)), sides, align=True))
    vm["entry_rows"] = _tokens(sv, s.shape[0])
    vm["entries"] = sv.blocks_of(chains)
