"""Attention weights A = softmax(T), row by row (stable: the row maximum is subtracted first)."""

from __future__ import annotations

import numpy as np

from attntrace.kinds.base import Kind, plain_braces, plain_math, plain_sup, sup
from attntrace.kinds.context import sum_finite
from attntrace.model.errors import BadInput


class Weights(Kind):
    pipeline, after = "head", ("masked",)
    id = "weights"
    reads, writes = ("S",), "A"
    starts = ("X", "QKV", "scores")
    letter, entry, symbol = "A", "a", "a"
    view, prose = "softmax", "weights"
    mistakes = ("skipped_softmax", "column_softmax", "softmax_without_exp", "rows_not_normalised")

    def compute(self, ctx, head, state):
        t = state["S"]
        # a logit column with no value (a kind before this one may append one, e.g. an attention
        # sink's): it takes part in every row's softmax but has no row of V to weight, so A keeps
        # only the columns of the keys
        v = state.get("V")
        extra = t.shape[1] - v.shape[0] if v is not None and v.shape[0] < t.shape[1] else 0
        shape = (t.shape[0], t.shape[1] - extra)
        result, details = ctx.alg.softmax(t.value)
        if extra and result is not None:
            result = ctx.alg.columns(result, 0, shape[1])
        if ctx.numeric and ctx.float_trouble():  # NumPy reported an overflow (kinds.context.FloatWatch)
            _check_shift(ctx, head, t.value, details["shifted"])
        h, ph = sup(head), plain_sup(head)
        m, e = t.letter, t.entry
        formula = (f"A{h} = \\operatorname{{softmax}}\\left({m}{h}\\right), \\quad a{h}_{{ij}} = "
                   f"\\frac{{e^{{{e}{h}_{{ij}}}}}}{{\\sum_{{k}} e^{{{e}{h}_{{ik}}}}}}")
        pe = plain_math(e)
        plain = f"A{ph} = softmax({plain_math(m)}{ph}),  a_ij = e^({pe}_ij) / sum_k e^({pe}_ik)"
        if extra:  # the extra column's exponential written as the denominator's last term
            n, last = shape[1], t.shape[1]
            formula = (f"A{h} = \\operatorname{{softmax}}\\left({m}{h}\\right)_{{:,\\,1..{n}}}, \\quad a{h}_{{ij}} = "
                       f"\\frac{{e^{{{e}{h}_{{ij}}}}}}{{\\sum_{{k=1}}^{{{n}}} e^{{{e}{h}_{{ik}}}} + e^{{{e}{h}_{{i,{last}}}}}}}")
            pm, pe = plain_braces(plain_math(m)), plain_braces(pe)  # braces of a name out in plain text
            plain = f"A{ph} = softmax({pm}{ph})[:, 1..{n}],  a_ij = e^({pe}_ij) / (sum_k=1..{n} e^({pe}_ik) + e^({pe}_i,{last}))"
        # weights of finite shifted scores lie in [0, 1]: no overflow check needed
        return ctx.emit(self, head, [t.ref], formula, plain, result, shape, details, checked=True)


def _check_shift(ctx, head, t, shifted) -> None:
    """t - max overflows when a row spans more than the float range (1e308 and -1e308)."""
    if sum_finite(shifted):
        return
    bad = np.isneginf(shifted) & ~np.isneginf(t)
    if bad.any():
        i, j = (int(k) + 1 for k in np.argwhere(bad)[0])
        where = "weights" if head is None else f"weights (head {head})"
        raise BadInput(f"step {where}: entry ({i}, {j}) minus its row maximum overflows float64 "
                       f"(the row spans more than the float range); scale the inputs down")


WEIGHTS = Weights()
