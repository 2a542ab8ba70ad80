"""What makes a drawn exercise worth handing out: `problems(spec)` lists every reason it is not.

A generated exercise (`attntrace.teach.exercise`) passes when:

- every row of X is non-zero and the rows are distinct;
- per head, the blocks of W_Q, W_K, W_V (d, d_k) have full column rank d_k (for small
  integer matrices: exact, as the rank of the integer matrix), V is not all zero, and W_O
  (d, d) is invertible (rank d), so no projection throws a direction away;
- per head, the rows of Q are not all equal, the n scores of every row are distinct,
  every softmax weight lies in [MIN_WEIGHT, MAX_WEIGHT) = [0.001, 0.95) (not saturated,
  and no weight that rounds to 0.000x looks like a zero), and no two rows of weights are
  equal at 4 decimals.
"""

from __future__ import annotations

import math

import numpy as np

#: Every softmax weight is below MAX_WEIGHT (no saturated row) and at least MIN_WEIGHT.
MAX_WEIGHT, MIN_WEIGHT = 0.95, 0.001


def _rank(m) -> int:
    m = np.asarray(m)
    if m.shape[1] == 1:
        return int(m.any())
    return int(np.linalg.matrix_rank(np.asarray(m, dtype=float)))


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def x_problem(x: np.ndarray) -> str | None:
    if not x.any(axis=1).all():
        return "X has a zero row"
    if len({tuple(r) for r in x.tolist()}) < len(x):
        return "X has two equal rows"
    return None


def head_problem(x: np.ndarray, wq: np.ndarray, wk: np.ndarray) -> str | None:
    """What makes one head's (W_Q, W_K) blocks (d, d_k) a poor exercise, or None."""
    n, d_k = x.shape[0], wq.shape[1]
    q, k = x @ wq, x @ wk
    if (q == q[0]).all():
        return "all rows of Q equal"
    s = q @ k.T
    if (np.diff(np.sort(s, axis=1), axis=1) == 0).any():
        return "equal scores in a row"
    a = _softmax(s / math.sqrt(d_k))
    if a.max() >= MAX_WEIGHT:
        return f"saturated softmax (a weight >= {MAX_WEIGHT})"
    if a.min() < MIN_WEIGHT:
        return f"a weight below {MIN_WEIGHT}"
    if len({tuple(r) for r in np.round(a, 4).tolist()}) < n:
        return "two equal rows of weights"
    if _rank(wq) < d_k or _rank(wk) < d_k:
        return "rank-deficient W_Q or W_K block"
    return None


def value_problem(x: np.ndarray, wv: np.ndarray) -> str | None:
    if _rank(wv) < wv.shape[1]:
        return "rank-deficient W_V block"
    if not (x @ wv).any():
        return "V is zero"
    return None


def output_problem(wo: np.ndarray) -> str | None:
    return None if _rank(wo) == wo.shape[0] else "W_O is not invertible"


def problems(spec: dict) -> list[str]:
    """Every reason why `spec` (a generated exercise) would not be worth handing out."""
    x = np.asarray(spec["X"])
    wq, wk, wv = (np.asarray(spec[k]) for k in ("W_Q", "W_K", "W_V"))
    heads = int(spec.get("num_heads", 1))
    d_k = x.shape[1] // heads
    found = [p for p in [x_problem(x)] if p]
    for h in range(heads):
        c = slice(h * d_k, (h + 1) * d_k)
        for p in (head_problem(x, wq[:, c], wk[:, c]), value_problem(x, wv[:, c])):
            if p:
                found.append(f"head {h + 1}: {p}")
    if heads > 1:
        p = output_problem(np.asarray(spec["W_O"]))
        if p:
            found.append(p)
    return found
