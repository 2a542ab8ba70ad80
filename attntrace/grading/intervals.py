"""Interval matrices: what a step could be, given inputs the student wrote rounded.

A student who wrote 0.6457 may have gone on with 0.64566.. (their calculator) or with 0.6457
(their paper); both are fine. So a later step is recomputed over every input in
[written - half a unit, written + half a unit] and the student's value is right when it is
right against some value in the resulting interval. `Box(lo, hi)` holds those bounds entry by
entry; exact inputs and operands are boxes of width 0.

Every operation here gives bounds that contain every exact result (matmul by midpoint and
radius, softmax by its monotonicity: a weight grows with its own score and falls with the
others), widened by a few ulps for float64 rounding. `divide_by_row_sum` (a mistake's
computation, used only to name it) is bounded to first order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

#: Relative widening for float64 rounding in a recomputation.
_ULPS = 1e-12


@dataclass(frozen=True)
class Box:
    lo: np.ndarray
    hi: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.lo.shape)

    @cached_property
    def mid(self) -> np.ndarray:
        """Computed once per box (a student's box is read by many recomputations)."""
        with np.errstate(invalid="ignore"):
            m = (self.lo + self.hi) / 2
        return np.where(self.lo == self.hi, self.lo, m)

    @cached_property
    def rad(self) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            r = (self.hi - self.lo) / 2
        return np.where(self.lo == self.hi, 0.0, r)

    @property
    def T(self) -> "Box":
        return Box(self.lo.T, self.hi.T)


def point(a: np.ndarray) -> Box:
    return Box(a, a)


def around(values: np.ndarray, radii: np.ndarray) -> Box:
    """Written values and half a unit of their last decimal (-inf stays -inf)."""
    with np.errstate(invalid="ignore"):
        lo, hi = values - radii, values + radii
    inf = np.isinf(values)
    return Box(np.where(inf, values, lo), np.where(inf, values, hi))


def _widen(mid: np.ndarray, rad: np.ndarray, size: np.ndarray) -> Box:
    with np.errstate(invalid="ignore", over="ignore"):
        r = rad + _ULPS * size
        return Box(mid - r, mid + r)


def matmul(a: Box, b: Box) -> Box:
    """a @ b: |a b - ma mb| <= |ma| rb + ra |mb| + ra rb."""
    ma, ra, mb, rb = a.mid, a.rad, b.mid, b.rad
    with np.errstate(invalid="ignore", over="ignore"):
        mid = ma @ mb
        rad = np.abs(ma) @ rb + ra @ np.abs(mb) + ra @ rb
        size = np.abs(ma) @ np.abs(mb)
    return _widen(mid, rad, size)


def add(a: Box, b: Box) -> Box:
    """a + b (b broadcast as a bias row)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return _widen(a.mid + b.mid, a.rad + b.rad, np.abs(a.mid) + np.abs(b.mid))


def divide(a: Box, factor: float) -> Box:
    """a / factor for a number factor != 0."""
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = a.lo / factor, a.hi / factor
    return Box(np.minimum(lo, hi), np.maximum(lo, hi))


def fill_where(a: Box, keep: np.ndarray, value: float) -> Box:
    """Entries outside `keep` set to `value` exactly (-inf for a mask)."""
    return Box(np.where(keep, a.lo, value), np.where(keep, a.hi, value))


def softmax_rows(a: Box) -> Box:
    """Row-wise softmax bounds: weight j is largest with its score at hi and the others at lo.

    upper_j = e^{hi_j} / (e^{hi_j} + sum_{k != j} e^{lo_k}), and lower_j alike with lo and hi
    swapped; -inf scores give weight exactly 0.
    """
    lo, hi = a.lo, a.hi
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        shift = np.max(hi, axis=1, keepdims=True)
        shift = np.where(np.isfinite(shift), shift, 0.0)
        elo, ehi = np.exp(lo - shift), np.exp(hi - shift)
        sum_lo = elo.sum(axis=1, keepdims=True)
        sum_hi = ehi.sum(axis=1, keepdims=True)
        upper = ehi / (ehi + np.maximum(sum_lo - elo, 0.0))
        lower = elo / (elo + np.maximum(sum_hi - ehi, 0.0))
    upper = np.where(np.isnan(upper), 0.0, upper)
    lower = np.where(np.isnan(lower), 0.0, lower)
    masked = np.isneginf(hi)
    return _widen((upper + lower) / 2, (upper - lower) / 2, np.where(masked, 0.0, 1.0))


def divide_by_row_sum(a: Box) -> Box:
    """Each row divided by its sum (-inf taken as 0): a mistake's computation, bounded to
    first order: |d(t_j / S)| <= (r_j + |t_j / S| sum_k r_k) / |S|."""
    m = np.where(np.isinf(a.mid), 0.0, a.mid)
    r = np.where(np.isinf(a.mid), 0.0, a.rad)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        s = m.sum(axis=1, keepdims=True)
        mid = m / s
        rad = (r + np.abs(mid) * r.sum(axis=1, keepdims=True)) / np.abs(s)
    return _widen(mid, rad, np.abs(mid))


def stack(boxes: list[Box], axis: int) -> Box:
    join = np.hstack if axis == 1 else np.vstack
    return Box(join([b.lo for b in boxes]), join([b.hi for b in boxes]))


def exp_diff(a: Box, b: Box) -> Box:
    """e^(a - b) entry by entry (b may be a column, broadcast along the rows). It increases with
    a and decreases with b: [e^(a_lo - b_hi), e^(a_hi - b_lo)], each end moved out by 4 ulps of
    (1 + |a| + |b|) relative (the rounding of the difference, which exp turns into a relative
    error, and of exp itself). An a of -inf gives 0 exactly (a masked score; m^(0) = -inf:
    nothing to rescale) and a b of -inf is taken as 0, as `algebra.numeric.online_update` does."""
    b_lo = np.where(np.isneginf(b.lo), 0.0, b.lo)
    b_hi = np.where(np.isneginf(b.hi), 0.0, b.hi)
    with np.errstate(invalid="ignore", over="ignore"):
        lo = np.exp(a.lo - b_hi) * (1 - 4 * _ULPS * (1 + np.abs(a.lo) + np.abs(b_hi)))
        hi = np.exp(a.hi - b_lo) * (1 + 4 * _ULPS * (1 + np.abs(a.hi) + np.abs(b_lo)))
    lo = np.where(np.isneginf(a.lo), 0.0, lo)
    hi = np.where(np.isneginf(a.hi), 0.0, hi)
    return Box(np.maximum(lo, 0.0), hi)


def plus(a: Box, b: Box) -> Box:
    """a + b end point by end point (b may broadcast), widened by a few ulps."""
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = a.lo + b.lo, a.hi + b.hi
        return _widen((lo + hi) / 2, (hi - lo) / 2, np.abs(a.lo) + np.abs(a.hi) + np.abs(b.lo) + np.abs(b.hi))


def rowsum(a: Box) -> Box:
    """The sum of each row, as a column: the sums of the lower and of the upper ends."""
    return plus(Box(a.lo.sum(axis=1, keepdims=True), a.hi.sum(axis=1, keepdims=True)),
                Box(np.zeros((a.shape[0], 1)), np.zeros((a.shape[0], 1))))


def row_max(a: Box) -> Box:
    """The largest entry of each row, as a column: monotone in every entry, exact in floats."""
    return Box(a.lo.max(axis=1, keepdims=True), a.hi.max(axis=1, keepdims=True))


def maximum(a: Box, b: Box) -> Box:
    """max(a, b) entry by entry: monotone in both, exact in floats."""
    return Box(np.maximum(a.lo, b.lo), np.maximum(a.hi, b.hi))


def log(a: Box) -> Box:
    """log over intervals of positive numbers (increasing), widened by a few ulps."""
    with np.errstate(invalid="ignore", divide="ignore"):
        lo, hi = np.log(a.lo), np.log(a.hi)
    return _widen((lo + hi) / 2, (hi - lo) / 2, np.abs(lo) + np.abs(hi) + 1.0)


def block(a: Box, rows: tuple[int, int], cols: tuple[int, int] | None = None) -> Box:
    """Rows (and columns) first..last, 1-based inclusive."""
    r = slice(rows[0] - 1, rows[1])
    c = slice(None) if cols is None else slice(cols[0] - 1, cols[1])
    return Box(a.lo[r, c], a.hi[r, c])
