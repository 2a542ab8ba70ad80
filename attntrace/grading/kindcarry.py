"""The interval toolkit a kind's `carry` rule computes with, and the kind that recomputes a step.

A kind declares, in its module, how a step is recomputed from the student's values (`carry`,
written against the toolkit below, which is passed in, so the kind never imports the checker)
and its mistakes (`attntrace.kinds.base.Mistake`). `mistakes` plants them and calls the rules;
the catalogue lists the declared codes (`catalogue.CATALOGUE`), and a code's sentence is the
macro of that name in the kind's prose templates (`messages`).
"""

from __future__ import annotations

import numpy as np

from attntrace.grading import blockrules, intervals
from attntrace.grading.catalogue import Impossible, to_float
from attntrace.grading.intervals import Box
from attntrace.kinds import KINDS


class Toolkit:
    """The interval operations a kind's `carry` rule computes with (valid enclosures: each
    contains every value the computation can give on its input intervals, except where a
    mistake's computation is bounded to first order: it only names a mistake)."""

    Impossible = Impossible
    Box = Box
    point = staticmethod(intervals.point)
    add = staticmethod(intervals.add)
    matmul = staticmethod(intervals.matmul)
    divide = staticmethod(intervals.divide)
    stack = staticmethod(intervals.stack)
    fill_where = staticmethod(intervals.fill_where)
    softmax_rows = staticmethod(intervals.softmax_rows)
    divide_by_row_sum = staticmethod(intervals.divide_by_row_sum)
    widen = staticmethod(intervals._widen)  # (mid, rad, size): mid +- rad, widened by a few ulps of size
    floats = staticmethod(to_float)  # a step's value or detail (ndarray or SymPy matrix) as float64

    @staticmethod
    def product(a: Box, b: Box) -> Box:
        """a b, Impossible when the shapes do not fit."""
        if a.shape[1] != b.shape[0]:
            raise Impossible()
        return intervals.matmul(a, b)

    @staticmethod
    def sum_same_shape(a: Box, b: Box) -> Box:
        """a + b entry by entry (a residual, X-tilde = X + P), Impossible when the shapes differ (no
        broadcasting: a student's row of the wrong width is not a bias)."""
        if a.shape != b.shape:
            raise Impossible()
        return intervals.add(a, b)

    @staticmethod
    def monotone(x: Box, f) -> Box:
        """f over each entry's interval, f increasing (tanh, exp, a positive scale): [f(lo), f(hi)],
        widened by a few ulps for float rounding."""
        with np.errstate(over="ignore", invalid="ignore"):
            lo, hi = f(x.lo), f(x.hi)
        return intervals._widen((lo + hi) / 2, (hi - lo) / 2, np.abs(lo) + np.abs(hi))

    exp_diff = staticmethod(intervals.exp_diff)
    plus = staticmethod(intervals.plus)
    rowsum = staticmethod(intervals.rowsum)
    row_max = staticmethod(intervals.row_max)
    maximum = staticmethod(intervals.maximum)
    log = staticmethod(intervals.log)
    block = staticmethod(intervals.block)

    @staticmethod
    def times(a: Box, b: Box) -> Box:
        """a o b entry by entry (b may broadcast): the extremes of the end points' products."""
        return blockrules._padded(blockrules._times(a, b))

    @staticmethod
    def hadamard(a: Box, b: Box) -> Box:
        """a o b entry by entry by midpoint and radius: |xy - mx my| <= |mx| ry + rx |my| + rx ry."""
        ma, ra, mb, rb = a.mid, a.rad, b.mid, b.rad
        with np.errstate(invalid="ignore", over="ignore"):
            return intervals._widen(ma * mb, np.abs(ma) * rb + ra * np.abs(mb) + ra * rb, np.abs(ma * mb))

    @staticmethod
    def minus_row(a: Box, r: Box) -> Box:
        """a - r 1^T (r a column, one number a row)."""
        with np.errstate(invalid="ignore", over="ignore"):
            return intervals._widen(a.mid - r.mid, a.rad + r.rad, np.abs(a.mid) + np.abs(r.mid))

    @staticmethod
    def colsum(a: Box) -> Box:
        """The column sums of a, a row."""
        return intervals._widen((a.lo.sum(axis=0, keepdims=True) + a.hi.sum(axis=0, keepdims=True)) / 2,
                                (a.hi - a.lo).sum(axis=0, keepdims=True) / 2, np.abs(a.mid).sum(axis=0, keepdims=True))

    @staticmethod
    def first_order(f, x: Box) -> Box:
        """f (a smooth map of matrices) over the box x, bounded to first order: f(mid) and the
        finite-difference Jacobian times the radii (a mistake's computation, used only to name it)."""
        mid = f(x.mid)
        rad = np.zeros_like(mid)
        flat_rad = x.rad.ravel()
        for k in np.flatnonzero(flat_rad):
            h = max(1e-7, 1e-7 * abs(x.mid.flat[k]))
            bumped = x.mid.copy()
            bumped.flat[k] += h
            rad += np.abs((f(bumped) - mid) / h) * flat_rad[k]
        return intervals._widen(mid, rad * 1.01, np.abs(mid) + 1.0)

    @staticmethod
    def quotient(num: Box, den: Box) -> Box:
        """num / den entry by entry for den > 0 (den may broadcast): the end points' quotients."""
        if (den.lo <= 0).any():
            raise Impossible()
        return blockrules._padded(blockrules._quotient(num, den))

    @staticmethod
    def norm(r: Box, gain: Box | None, bias: Box | None, eps: float, rms: bool) -> Box:
        """LayerNorm (rms=False, biased variance) or RMSNorm of each row (`blockrules.norm`)."""
        try:
            return blockrules.norm(r, gain, bias, eps, rms)
        except ValueError:
            raise Impossible() from None

    @staticmethod
    def activation(h: Box, name: str) -> Box:
        """relu / gelu / gelu_tanh / silu over each entry's interval (`blockrules.activation`)."""
        from attntrace.algebra.numeric import NumericAlgebra

        return blockrules.activation(h, name, NumericAlgebra().activation)

    @staticmethod
    def linear(a: Box, w: Box, bias: Box | None) -> Box:
        """a W (+ b): the FFN's products (`blockrules.linear`)."""
        try:
            return blockrules.linear(a, w, bias)
        except ValueError:
            raise Impossible() from None

    @staticmethod
    def swiglu(gate: Box, up: Box) -> Box:
        """SiLU(gate) ⊙ up (`blockrules.swiglu`: SiLU's minimum handled, an interval product)."""
        from attntrace.algebra.numeric import NumericAlgebra

        if gate.shape != up.shape:
            raise Impossible()
        return blockrules.swiglu(gate, up, NumericAlgebra().activation)


TOOLKIT = Toolkit()


def rule_of(step_id: str):
    """The kind that recomputes steps of this id (its `carry`), or None: the step is taken at
    its true value and nothing is carried through it."""
    kind = KINDS.get(step_id)
    return kind if kind is not None and kind.carry is not None else None
