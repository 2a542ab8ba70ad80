"""Interval rules of the online softmax (attntrace.kinds.online), block by block.

FlashAttention-2's loop (Algorithm 1) writes one m, P-tilde, l and O per key block j (and query
block i). In the checker's world each block is a step of its own, keyed by its address
(`online_max#2`, `online_max#1.2`; `key`), so an answer gives, and the checker judges, every
block. Each block is recomputed from the student's own earlier blocks (`input_keys` says which),
so a slip in m^(1) that the student carries into block 2 correctly is `carried`:

    m^(j) = max(m^(j-1), rowmax T_j)        P^(j) = exp(T_j - m^(j))
    l^(j) = e^(m^(j-1) - m^(j)) l^(j-1) + rowsum P^(j)
    O^(j) = diag(e^(m^(j-1) - m^(j))) O^(j-1) + P^(j) V_j
    L = m^(Tc) + log l^(Tc)                 Z = diag(l^(Tc))^-1 O^(Tc)

The bounds are valid enclosures over the student's boxes (intervals.Box), as DESIGN's
"Carried forward through nonlinear steps" asks:

- max is monotone in each argument and exact in floating point: [max of lo, max of hi];
- exp(a - b) increases with a and decreases with b: [e^(a_lo - b_hi), e^(a_hi - b_lo)], each end
  moved out by a few ulps of (1 + |a| + |b|) relative (the rounding of the difference, which exp
  turns into a relative error, and of exp itself);
- a product of intervals by the extremes of its end points (blockrules); P V by
  intervals.matmul; sums end point by end point, widened by a few ulps;
- log is monotone (l > 0); the quotient O / l by the end points' quotients (l > 0).

A masked score (-inf) gives P = 0 exactly, and a row that has seen only masked keys (m = -inf)
has nothing to rescale (the factor 0), as `algebra.numeric.online_update` computes them.
"""

from __future__ import annotations

import numpy as np

from attntrace.grading import blockrules, intervals
from attntrace.grading.catalogue import Impossible, to_float
from attntrace.grading.intervals import Box
from attntrace.model.trace import block_address

#: the per-block steps of the online softmax
BLOCK_STEPS = ("online_max", "online_exp", "online_sum", "online_out")
#: relative widening for float64 rounding (intervals._ULPS)
_ULPS = intervals._ULPS


def key(step) -> tuple:
    """The world's key of a step: (its block address, head) for a block of the online softmax
    (online_max#2), else (id, head)."""
    return (block_address(step) or step.id, step.head)


def _address(step_id: str, det, block: int, query_block: int | None = None) -> str:
    qb = det.get("query_block", 1) if query_block is None else query_block
    return f"{step_id}#{block}" if det.get("query_blocks", 1) == 1 else f"{step_id}#{qb}.{block}"


def input_keys(step, key_of) -> tuple | None:
    """The keys an online-softmax step reads in the world (None for any other step): the
    scores and V as the step names them (`key_of(ref)`), the blocks by address. A block also
    reads m^(j-1) and m^(j), the factor e^(m^(j-1) - m^(j)) of its update; L and the online Z
    read the last block of every query block."""
    det = step.details
    if step.id in BLOCK_STEPS and "query_block" in det:
        j, h = det["block"], step.head
        at = lambda sid, b: (_address(sid, det, b), h)  # noqa: E731
        prev = [at("online_max", j - 1), at("online_max", j)] if j > 1 else []
        if step.id == "online_max":
            return (key_of(step.inputs[0]),) + ((at("online_max", j - 1),) if j > 1 else ())
        if step.id == "online_exp":
            return (key_of(step.inputs[0]), at("online_max", j))
        if step.id == "online_sum":
            return (at("online_exp", j),) + ((at("online_sum", j - 1), *prev) if j > 1 else ())
        return (at("online_exp", j), key_of(step.inputs[1])) + ((at("online_out", j - 1), *prev) if j > 1 else ())
    if step.id == "lse" or (step.id == "Z" and det.get("online")):
        blocks, qbs = det["blocks"], det["query_blocks"]
        first, second = ("online_max", "online_sum") if step.id == "lse" else ("online_out", "online_sum")
        last = lambda sid: [(_address(sid, det, blocks, qb), step.head) for qb in range(1, qbs + 1)]  # noqa: E731
        return tuple(last(first) + last(second))
    return None


# -- interval pieces -------------------------------------------------------------------------------
def _score_block(t: Box, det) -> Box:
    """Rows and columns of the block (1-based inclusive in the step's details) of the scores."""
    (r0, r1), (c0, c1) = det["rows"], det["cols"]
    if t.shape[0] < r1 or t.shape[1] < c1:
        raise Impossible()
    return Box(t.lo[r0 - 1:r1, c0 - 1:c1], t.hi[r0 - 1:r1, c0 - 1:c1])


def _column(b: Box, rows: int) -> Box:
    if b.shape != (rows, 1):
        raise Impossible()
    return b


def exp_diff(a: Box, b: Box) -> Box:
    """e^(a - b) entry by entry (b a column, broadcast along the rows): 0 exactly where a is
    -inf (a masked score, or m^(j-1) = -inf: nothing to rescale); a b of -inf taken as 0."""
    b_lo = np.where(np.isneginf(b.lo), 0.0, b.lo)
    b_hi = np.where(np.isneginf(b.hi), 0.0, b.hi)
    with np.errstate(invalid="ignore", over="ignore"):
        lo_arg, hi_arg = a.lo - b_hi, a.hi - b_lo
        lo = np.exp(lo_arg) * (1 - 4 * _ULPS * (1 + np.abs(a.lo) + np.abs(b_hi)))
        hi = np.exp(hi_arg) * (1 + 4 * _ULPS * (1 + np.abs(a.hi) + np.abs(b_lo)))
    lo = np.where(np.isneginf(a.lo), 0.0, lo)
    hi = np.where(np.isneginf(a.hi), 0.0, hi)
    if np.isnan(lo).any() or np.isnan(hi).any():
        raise Impossible()
    return Box(np.maximum(lo, 0.0), hi)


def _rowsum(p: Box) -> Box:
    lo, hi = p.lo.sum(axis=1, keepdims=True), p.hi.sum(axis=1, keepdims=True)
    return intervals._widen((lo + hi) / 2, (hi - lo) / 2, np.abs(p.lo).sum(axis=1, keepdims=True) + np.abs(p.hi).sum(axis=1, keepdims=True))


def _plus(a: Box, b: Box) -> Box:
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = a.lo + b.lo, a.hi + b.hi
    return intervals._widen((lo + hi) / 2, (hi - lo) / 2, np.abs(a.lo) + np.abs(a.hi) + np.abs(b.lo) + np.abs(b.hi))


def _rescaled(args, rows: int) -> Box:
    """e^(m^(j-1) - m^(j)) from the student's two running maxima (the last two arguments)."""
    return exp_diff(_column(args[-2], rows), _column(args[-1], rows))


# -- the rules (world, step, args, mistake code, mutation) -> Box ------------------------------------
def running_max(world, step, args, m, mutation):
    """m^(j) = max(m^(j-1), rowmax T_j): monotone, exact in floats."""
    t = _score_block(args[0], step.details)
    lo, hi = t.lo.max(axis=1, keepdims=True), t.hi.max(axis=1, keepdims=True)
    if len(args) > 1:
        prev = _column(args[1], lo.shape[0])
        lo, hi = np.maximum(prev.lo, lo), np.maximum(prev.hi, hi)
    return Box(lo, hi)


def exponentials(world, step, args, m, mutation):
    """P^(j) = exp(T_j - m^(j)), the running maximum broadcast along each row."""
    t = _score_block(args[0], step.details)
    return exp_diff(t, _column(args[1], t.shape[0]))


def running_sum(world, step, args, m, mutation):
    """l^(j) = e^(m^(j-1) - m^(j)) l^(j-1) + rowsum P^(j) (block 1: rowsum P^(1))."""
    p = args[0]
    total = _rowsum(p)
    if len(args) == 1:
        return total
    prev = _column(args[1], p.shape[0])
    return _plus(blockrules._padded(blockrules._times(_rescaled(args, p.shape[0]), prev)), total)


def running_output(world, step, args, m, mutation):
    """O^(j) = diag(e^(m^(j-1) - m^(j))) O^(j-1) + P^(j) V_j (block 1: P^(1) V_1);
    online_no_rescale: O^(j-1) + P^(j) V_j, the factor dropped."""
    p, v = args[0], args[1]
    c0, c1 = step.details["cols"]
    if v.shape[0] < c1 or p.shape[1] != c1 - c0 + 1:
        raise Impossible()
    pv = intervals.matmul(p, Box(v.lo[c0 - 1:c1], v.hi[c0 - 1:c1]))
    if len(args) == 2:
        return pv
    prev = args[2]
    if prev.shape != pv.shape:
        raise Impossible()
    if m == "online_no_rescale":
        return _plus(prev, pv)
    return _plus(blockrules._padded(blockrules._times(_rescaled(args, p.shape[0]), prev)), pv)


def _halves(args) -> tuple[Box, Box]:
    """The last blocks of every query block, stacked: (first quantity, l)."""
    half = len(args) // 2
    if half == 0 or len(args) % 2:
        raise Impossible()
    return intervals.stack(list(args[:half]), axis=0), intervals.stack(list(args[half:]), axis=0)


def log_sum_exp(world, step, args, m, mutation):
    """L = m^(Tc) + log l^(Tc); lse_without_max: L = log l^(Tc)."""
    mm, ll = _halves(args)
    if mm.shape != ll.shape or mm.shape != tuple(step.shape) or (ll.lo <= 0).any():
        raise Impossible()
    with np.errstate(invalid="ignore", divide="ignore"):
        log_l = intervals._widen((np.log(ll.lo) + np.log(ll.hi)) / 2, (np.log(ll.hi) - np.log(ll.lo)) / 2,
                                 np.abs(np.log(ll.lo)) + np.abs(np.log(ll.hi)) + 1.0)
    if m == "lse_without_max":
        return log_l
    if not (np.isfinite(mm.lo).all() and np.isfinite(mm.hi).all()):
        return intervals.point(to_float(step.value))  # a row that saw only masked keys
    return _plus(mm, log_l)


def normalised(world, step, args, m, mutation):
    """Z = diag(l^(Tc))^-1 O^(Tc), each query block's rows divided by their running sum."""
    o, ll = _halves(args)
    if o.shape[0] != ll.shape[0] or ll.shape[1] != 1 or o.shape != tuple(step.shape) or (ll.lo <= 0).any():
        raise Impossible()
    return blockrules._padded(blockrules._quotient(o, ll))


RULES = {"online_max": running_max, "online_exp": exponentials, "online_sum": running_sum,
         "online_out": running_output, "lse": log_sum_exp}
