"""The views of the biased scores: ALiBi's step (biased: the head's slope, the bias matrix B,
T-hat = T + B) and a given bias (bias: B, T-hat = T + B).

The slope is written as the paper writes it (2^(-8/H), ...: a power of two) with its value;
B is shown whole (b_ij = -lambda (i - j): zero on the diagonal, -lambda, -2 lambda, ... to the left); then
the sum with the scores and, entry by entry, the last row, the one whose keys all lie in the
past and get the whole range of penalties.
"""

from __future__ import annotations

import numpy as np

from attntrace.model import formula as F

from attntrace.rendering.printing import decimals_needed, pick
from attntrace.rendering.stepview import register_view
from attntrace.rendering.viewparts import block, pack, resolve, rows_to_expand


def _slope_chain(sv) -> list[str]:
    s, o = sv.s, sv.out
    d = s.details
    slope, exponent = d["slope"], d.get("exponent")
    lhs = o.math(F.sym("lambda").head(s.head))
    value = o.num(float(slope))
    sides: list = []
    if exponent is not None:
        r = F.Num(exponent.numerator) if exponent.denominator == 1 else F.Frac(F.Num(exponent.numerator), F.Num(exponent.denominator), inline=True)
        sides.append(o.math(F.Power(F.Num(2), -r)))
    elif not isinstance(slope, (float, np.floating)):
        sides.append(o.expr(slope))
    exact = float(slope) == float(o.num(float(slope)))
    if o.plain:
        line = o.eq(lhs, *sides) if sides else lhs
        return [o.eq(line, value) if exact else o.approx(line, value)]
    if not sides or sides[-1] != value:
        sides.append(value if exact else (o.rel("approx"), value))
    return sv.fit(lhs, sides)


def _bias_matrix(sv, bias, shape, budget) -> str:
    o = sv.out
    if isinstance(bias, np.ndarray):
        return o.numeric_matrix(bias, shape, budget)
    return o.matrix(bias, shape, budget)


@register_view("alibi")
def build_alibi(sv, vm) -> None:
    s, o = sv.s, sv.out
    d = s.details
    src = resolve(sv.t, s.inputs[0], s.head)
    vm["extra"].update({"heads": str(d["heads"]), "paper": d.get("exponent") is not None, "source": sv.mname(src),
                        "slope": o.num(float(d["slope"]))})
    _biased_scores(sv, vm, src, [_slope_chain(sv)])


@register_view("bias")
def build_bias(sv, vm) -> None:
    """A given bias (attntrace.kinds.bias, a torch float mask): B, then T-hat = T + B, as ALiBi's."""
    src = resolve(sv.t, sv.s.inputs[0], sv.s.head)
    vm["extra"].update({"source": sv.mname(src)})
    _biased_scores(sv, vm, src, [])


def _biased_scores(sv, vm, src, chains: list) -> None:
    """The bias matrix B (after the chains that make it), T-hat = T + B and its entries."""
    s, o = sv.s, sv.out
    d = s.details
    vm["formula_block"] = sv.fit_formula(vm["formula"])
    bname = o.math(F.sym("B").head(s.head))
    blhs = o.named(bname, s.shape)
    chains = chains + [sv.fit(blhs, [_bias_matrix(sv, d["bias"], s.shape, sv.budget(blhs))])]
    vm["extra"]["bias"] = [block(c) for c in pack(chains, o)]
    lhs = sv.named(sv.ref)
    budget = sv.budget(lhs)
    sides: list = [f"{sv.mname(src)} + {bname}"]  # both matrices are on the page already: T above, B just now
    if sv.mode == "symbolic":
        sides.append(o.matrix(s.value, s.shape, budget))
    else:
        sides += sv.result_side(s.value, budget)
    vm["main"] = [block(sv.fit(lhs, sides))]
    n = s.shape[0]
    rows = rows_to_expand(sv.rows_opt, n, 1) if sv.rows_opt else [n - 1]
    vm["entry_rows"] = rows
    chains = []
    for i in rows:
        numeric = isinstance(s.value, np.ndarray)
        cols = [j for j in pick(s.shape[1], o.max_size) if j is not None]
        dec = decimals_needed([float(m[i, j]) for m in (s.value, src.value, d["bias"]) for j in cols], o.precision) if numeric else 0
        fx = lambda x: o.fixed(float(x), dec, pad=False)  # noqa: E731
        for j in cols:
            b_name = o.math(F.sym("b").head(s.head).at(i + 1, j + 1))
            names = f"{sv.ename(src, i, j)} + {b_name}"
            if sv.mode == "symbolic":
                chains.append(sv.fit(sv.entry_label(i, j), [names, o.expr(s.value[i, j])], align=True, lhs_width=sv.lw))
                continue
            if numeric:
                b = fx(d["bias"][i, j])
                nums = f"{fx(src.value[i, j])} + {o.paren(b) if b.startswith('-') else b}"
                result = [fx(s.value[i, j])]
            else:
                nums = f"{o.entry(src.value, i, j)} + {o.factor(d['bias'], i, j)}"
                result = sv.entry_result(s.value, i, j)
            chains.append(sv.fit(sv.entry_label(i, j), [names, nums] + result, align=True, lhs_width=sv.lw))
    vm["entries"] = sv.blocks_of(chains)
