"""Attention weights A = softmax(T), row by row (stable: the row maximum is subtracted first)."""

from __future__ import annotations

import numpy as np

from attntrace.kinds.base import Kind, Symbol
from attntrace.model.formula import Frac, Func, Num, Parts, Power, Rel, Slice, Sum, sym
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
        # a logit column with no value (a kind before this one may append one): it takes part in every row's softmax but has no row of V to weight, so A keeps
        # only the columns of the keys
        v = state.get("V")
        extra = t.shape[1] - v.shape[0] if v is not None and v.shape[0] < t.shape[1] else 0
        shape = (t.shape[0], t.shape[1] - extra)
        result, details = ctx.alg.softmax(t.value)
        if extra and result is not None:
            result = ctx.alg.columns(result, 0, shape[1])
        if ctx.numeric and ctx.float_trouble():  # NumPy reported an overflow (kinds.context.FloatWatch)
            _check_shift(ctx, head, t.value, details["shifted"])
        e, t_entry = sym("e"), t.entry.head(head)
        softmax = Func("softmax", (t.letter.head(head),), sized=True)
        if extra:  # the keys' columns of the softmax; the extra column's exponential is the denominator's last term
            keys = Rel((sym("k"), Num(shape[1])), ("le",))  # k <= n_k: the keys' columns, then the extra one
            denominator = Sum(keys, Power(e, t_entry.at("i", "k"))) + Power(e, t_entry.at("i", Num(t.shape[1])))
            formula = Parts((sym("A").head(head).eq(Slice(softmax, None, (1, shape[1]))),
                             sym("a").head(head).at("i", "j").eq(Power(e, t_entry.at("i", "j")) / denominator)))
        else:
            entry = Power(e, t_entry.at("i", "j")) / Sum(sym("k"), Power(e, t_entry.at("i", "k")))
            formula = Parts((sym("A").head(head).eq(softmax), sym("a").head(head).at("i", "j").eq(entry)))
        # weights of finite shifted scores lie in [0, 1]: no overflow check needed
        return ctx.emit(self, head, [t.ref], formula, result, shape, details, checked=True)


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
