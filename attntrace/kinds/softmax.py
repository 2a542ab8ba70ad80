"""Attention weights A = softmax(T), row by row (stable: the row maximum is subtracted first)."""

from __future__ import annotations

import numpy as np

from attntrace.kinds.base import Kind, Symbol
from attntrace.model.formula import Frac, Func, Parts, Power, Sum, sym
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

    def notation(self, step):
        """A, a_ij, and the row maximum m_i the stable softmax subtracts (numbers only: symbols have no maximum)."""
        row_max = step.details.get("row_max")
        known = row_max is not None and any(x is not None for x in row_max)
        return super().notation(step) + ([Symbol("m_i", "m_i", "row_max", (step.shape[0], 1))] if known else [])

    def compute(self, ctx, head, state):
        t = state["S"]
        result, details = ctx.alg.softmax(t.value)
        if ctx.numeric and ctx.float_trouble():  # NumPy reported an overflow (kinds.context.FloatWatch)
            _check_shift(ctx, head, t.value, details["shifted"])
        e, t_entry = sym("e"), t.entry.head(head)
        entry = Power(e, t_entry.at("i", "j")) / Sum(sym("k"), Power(e, t_entry.at("i", "k")))
        formula = Parts((sym("A").head(head).eq(Func("softmax", (t.letter.head(head),), sized=True)),
                         sym("a").head(head).at("i", "j").eq(entry)))
        # weights of finite shifted scores lie in [0, 1]: no overflow check needed
        return ctx.emit(self, head, [t.ref], formula, result, t.shape, details, checked=True)


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
