"""Interval rules of the block's nonlinear steps: LayerNorm and RMSNorm, the FFN's products
and its activation (ReLU, GELU, its tanh form, SiLU, SwiGLU).

Each computes the step, right, from the student's world (`intervals.Box`: what each earlier
value may have been before it was rounded), so that a step computed right from the student's
own wrong or rounded input is `carried`, never marked wrong. The bounds are valid enclosures,
not first-order guesses (docs/DESIGN.md, "Carried forward through nonlinear steps"):

- products and sums: `intervals.matmul` / `intervals.add` (|ab - m_a m_b| <= |m_a| r_b + r_a |m_b| + r_a r_b);
- LayerNorm of a row r (d entries): the centred entry c_j = (1 - 1/d) r_j - sum_{k != j} r_k / d
  is linear, so its interval is exact; the variance sum_j c_j^2 / d is enclosed by the sum of
  each c_j^2's interval (the c_j are dependent, so this only widens it); sigma = sqrt(var + eps)
  is monotone; y_j = c_j / sigma is enclosed by the four quotients of the end points
  (sigma > 0); then the gain and bias, by interval products and sums;
- RMSNorm: the mean square sum_j r_j^2 / d as above, y_j = r_j / sqrt(ms + eps) likewise;
- ReLU is monotone; GELU, its tanh form and SiLU decrease down to one minimum x* and increase
  after it, so over [lo, hi] the maximum is at an end point and the minimum at an end point or
  at x* when lo <= x* <= hi; SwiGLU is SiLU(H) * U, an interval product.

Every bound is widened by a few ulps of the values' size (`intervals._widen`) for float
rounding. The planted mistakes of these kinds (norm_unbiased_variance, norm_wrong_axis,
gelu_relu_confused) are their kinds' (`Kind.carry`); only the right computation is here.
"""

from __future__ import annotations


import numpy as np

from attntrace.grading import intervals
from attntrace.grading.intervals import Box

#: x*: where GELU, its tanh form and SiLU take their minimum (a bounded minimiser to 1e-14;
#: f is flat there, so an x* off by delta moves f(x*) by O(delta^2), covered by MIN_SLACK).
MINIMUM_AT = {"gelu": -0.7517915280268221, "gelu_tanh": -0.7524614257680738, "silu": -1.2784645424748815}
MIN_SLACK = 1e-12


def _square(b: Box) -> Box:
    """x^2 over [lo, hi]: 0 when the interval holds 0, else the squares of the ends."""
    lo2, hi2 = b.lo * b.lo, b.hi * b.hi
    low = np.where((b.lo <= 0) & (b.hi >= 0), 0.0, np.minimum(lo2, hi2))
    return Box(low, np.maximum(lo2, hi2))


def _quotient(num: Box, den: Box) -> Box:
    """num / den for den > 0 everywhere: the extremes of the end points' quotients."""
    cands = [num.lo / den.lo, num.lo / den.hi, num.hi / den.lo, num.hi / den.hi]
    return Box(np.minimum.reduce(cands), np.maximum.reduce(cands))


def _times(a: Box, b: Box) -> Box:
    cands = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
    return Box(np.minimum.reduce(cands), np.maximum.reduce(cands))


def _padded(b: Box) -> Box:
    """b widened by a few ulps of its size, for the float rounding of the steps above."""
    mid, rad = b.mid, b.rad
    return intervals._widen(mid, rad, np.abs(b.lo) + np.abs(b.hi) + 1e-300)


def norm(r: Box, gain: Box | None, bias: Box | None, eps: float, rms: bool) -> Box:
    """LayerNorm (biased variance) or RMSNorm of each row of r, enclosed (see the module doc)."""
    if not (np.isfinite(r.lo).all() and np.isfinite(r.hi).all()):
        raise ValueError("a norm of an infinite entry")
    d = r.lo.shape[1]
    if rms:
        centred = r
    else:
        sum_lo, sum_hi = r.lo.sum(axis=1, keepdims=True), r.hi.sum(axis=1, keepdims=True)
        # c_j = (1 - 1/d) r_j - (sum_k r_k - r_j) / d
        c_lo = (1 - 1 / d) * r.lo - (sum_hi - r.hi) / d
        c_hi = (1 - 1 / d) * r.hi - (sum_lo - r.lo) / d
        centred = _padded(Box(c_lo, c_hi))
    sq = _square(centred)
    spread = Box(sq.lo.sum(axis=1, keepdims=True) / d, sq.hi.sum(axis=1, keepdims=True) / d)
    sigma = _padded(Box(np.sqrt(spread.lo + eps), np.sqrt(spread.hi + eps)))
    y = _padded(_quotient(centred, Box(np.maximum(sigma.lo, np.sqrt(eps)), sigma.hi)))
    if gain is not None:
        y = _padded(_times(y, gain))
    if bias is not None:
        y = intervals.add(y, bias)
    return y


def activation(h: Box, name: str, f) -> Box:
    """f (the algebra's relu / gelu / gelu_tanh / silu) over each entry's interval."""
    f_lo, f_hi = f(h.lo, name), f(h.hi, name)
    low, high = np.minimum(f_lo, f_hi), np.maximum(f_lo, f_hi)
    if name in MINIMUM_AT:
        x_star = MINIMUM_AT[name]
        inside = (h.lo <= x_star) & (h.hi >= x_star)
        f_star = float(f(np.array([x_star]), name)[0]) - MIN_SLACK
        low = np.where(inside, np.minimum(low, f_star), low)
    return _padded(Box(low, high))


def swiglu(gate: Box, up: Box, f) -> Box:
    """SiLU(H) * U entry by entry."""
    return _padded(_times(activation(gate, "silu", f), up))


def linear(a: Box, w: Box, bias: Box | None) -> Box:
    """a W (+ b): the FFN's products."""
    if a.shape[1] != w.shape[0] or (bias is not None and bias.shape[1] != w.shape[1]):
        raise ValueError("shapes")
    out = intervals.matmul(a, w)
    return out if bias is None else intervals.add(out, bias)
