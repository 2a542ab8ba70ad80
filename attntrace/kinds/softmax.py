"""Attention weights A = softmax(T), row by row (stable: the row maximum is subtracted first)."""

from __future__ import annotations

import math

import numpy as np

from attntrace.kinds.base import Kind, Mistake, Symbol, formula_once
from attntrace.model.formula import Frac, Func, Num, Parts, Power, Rel, Slice, Sum, sym
from attntrace.kinds.context import sum_finite
from attntrace.model.errors import BadInput


def _rows_not_normalised(step, answer, reference, bad, allowed):
    """Rows of weights that do not sum to 1, beyond what rounding each entry allows (`allowed()`:
    each entry's allowed error); not when the softmax ran over logit columns with no value (its
    exponentials are wider than the weights: then a row sums to less than 1)."""
    exp = step.details.get("exp") if step.details else None
    if exp is not None and tuple(exp.shape)[1] != step.shape[1]:
        return None
    values = answer.values
    sums = np.where(np.isfinite(values), values, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore"):
        slack = allowed()
    rows = [i + 1 for i, s in enumerate(sums) if abs(s - 1.0) > sum(slack[i].tolist()) + 1e-9]
    return {"rows": rows, "sums": [float(sums[i - 1]) for i in rows]} if rows else None


def _logit_columns(step, default: int) -> int:
    """How many columns the softmax of this step ran over (its exponentials' width: more than
    the weights' when a kind appended a logit column with no value), `default` when unknown.
    Scores of another width (K and V from the wrong sequence) are then a student's mistake,
    whose softmax is carried whole, not cut to the weights' width."""
    exp = step.details.get("exp") if step.details else None
    return default if exp is None else tuple(exp.shape)[1]


class Weights(Kind):
    pipeline, after = "head", ("masked",)
    id = "weights"
    reads, writes = ("S",), "A"
    starts = ("X", "QKV", "scores")
    letter, entry, symbol = "A", "a", "a"
    view, prose = "softmax", "attention"
    mistakes = (Mistake("skipped_softmax"), Mistake("column_softmax"), Mistake("softmax_without_exp"),
                Mistake("rows_not_normalised", planted=False, read_off=_rows_not_normalised))
    _OWN = ("skipped_softmax", "column_softmax", "softmax_without_exp")

    def report_params(self, steps):
        return {"has_weights": True}

    def carry(self, iv, step, args, mistake):
        """softmax of each row; skipped_softmax: T itself; column_softmax: down each column;
        softmax_without_exp: each row divided by its sum. Logit columns with no value (a kind
        before this one appended them) take part in the softmax and are then dropped; under
        that kind's mistake they were left out."""
        t = args[0]
        n = step.shape[1]
        if t.shape[1] > n and t.shape[1] == _logit_columns(step, t.shape[1]):
            keys = iv.Box(t.lo[:, :n], t.hi[:, :n])
            if mistake in self._OWN:  # the softmax's own mistakes, on the keys
                return self.carry(iv, step, (keys,), mistake)
            if mistake is not None and mistake != "transposed":  # the mistake of the kind that appended the columns
                return iv.softmax_rows(keys)
            full = iv.softmax_rows(t)
            return iv.Box(full.lo[:, :n], full.hi[:, :n])
        if mistake == "skipped_softmax":
            return t
        if mistake == "column_softmax":
            return iv.softmax_rows(t.T).T
        if mistake == "softmax_without_exp":
            return iv.divide_by_row_sum(t)
        return iv.softmax_rows(t)

    def notation(self, step):
        """A, a_ij, and the row maximum m_i the stable softmax subtracts (numbers only: symbols have no maximum)."""
        row_max = step.details.get("row_max")
        known = row_max is not None and any(x is not None for x in row_max)
        return super().notation(step) + ([Symbol(sym("m", "i"), "row_max", (step.shape[0], 1))] if known else [])

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
        keys = (shape[1], t.shape[1]) if extra else None
        formula = formula_once((self.id, head, t.letter, t.entry, keys), lambda: _formula(head, t.letter, t.entry, keys))
        # weights of finite shifted scores lie in [0, 1]: no overflow check needed
        flow = ctx.emit(self, head, [t.ref], formula, result, shape, details, checked=True)
        flow.norm = math.sqrt(shape[0])  # each row is >= 0 and sums to at most 1: its length is at most 1
        return flow


def _formula(head, letter, entry, keys):
    """A = softmax(T), a_ij = e^{t_ij} / sum_k e^{t_ik}; with `keys` = (n_k, columns) the
    softmax runs over more columns than there are keys (a logit column with no value) and A
    keeps the keys' columns: the extra column's exponential is the denominator's last term."""
    e, t_entry = sym("e"), entry.head(head)
    softmax = Func("softmax", (letter.head(head),), sized=True)
    if keys:
        within = Rel((sym("k"), Num(keys[0])), ("le",))  # k <= n_k: the keys' columns, then the extra one
        denominator = Sum(within, Power(e, t_entry.at("i", "k"))) + Power(e, t_entry.at("i", Num(keys[1])))
        return Parts((sym("A").head(head).eq(Slice(softmax, None, (1, keys[0]))),
                      sym("a").head(head).at("i", "j").eq(Power(e, t_entry.at("i", "j")) / denominator)))
    entry_ij = Power(e, t_entry.at("i", "j")) / Sum(sym("k"), Power(e, t_entry.at("i", "k")))
    return Parts((sym("A").head(head).eq(softmax), sym("a").head(head).at("i", "j").eq(entry_ij)))


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
