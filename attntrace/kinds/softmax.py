"""Attention weights A = softmax(T), row by row (stable: the row maximum is subtracted first)."""

from __future__ import annotations

import numpy as np

from attntrace.kinds.base import Kind, plain_math, plain_sup, sup
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
        result, details = ctx.alg.softmax(t.value)
        if ctx.numeric and ctx.float_trouble():  # NumPy reported an overflow (kinds.context.FloatWatch)
            _check_shift(ctx, head, t.value, details["shifted"])
        h, ph = sup(head), plain_sup(head)
        m, e = t.letter, t.entry
        formula = (f"A{h} = \\operatorname{{softmax}}\\left({m}{h}\\right), \\quad a{h}_{{ij}} = "
                   f"\\frac{{e^{{{e}{h}_{{ij}}}}}}{{\\sum_{{k}} e^{{{e}{h}_{{ik}}}}}}")
        pe = plain_math(e)
        plain = f"A{ph} = softmax({plain_math(m)}{ph}),  a_ij = e^({pe}_ij) / sum_k e^({pe}_ik)"
        # weights of finite shifted scores lie in [0, 1]: no overflow check needed
        return ctx.emit(self, head, [t.ref], formula, plain, result, t.shape, details, checked=True)


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
