"""Exercises: a random attention problem with small integers, drawn from a seed.

`make_exercise(n, d, heads, seed)` draws X (n, d) with entries in {-1, 0, 1, 2} and weight
matrices with entries in {-1, 0, 1} from `numpy.random.default_rng([seed, n, d, heads])`, so
the same seed always gives the same exercise (the redraws included). Each head gets
d_k = d / heads columns (the standard split of full-width (d, d) matrices). A whole
sqrt(d_k): d_k = 4 (--d 4 with 1 head, --d 8 with 2 heads; 4 heads would need d = 16, above
the limit of 12) or d_k = 1 (--d 2 with 2 heads, --d 4 with 4 heads). Multi-head exercises
add W_O (h d_v, d) with entries in {0, 1}. For wider d the matrices are sparser (about 2.5
non-zero entries per column of W for d_k > 4, 2.6 per row of X), so the scores stay small.

Every draw is checked (`attntrace.teach.exercisechecks.problems`) and redrawn until it passes.

X is drawn first (up to X_TRIES = 2000 times, MAX_DRAWS = 60000 candidates in all); then
each head's W_Q and W_K blocks (up to HEAD_TRIES per head, drawn BATCH at a time; with
d_k = 1, where a block is one column, every pair of candidate columns of {-1, 0, 1}^d is
tried, in a seeded random order, as random draws rarely hit the few that work), then W_V's
blocks and W_O (up to MATRIX_TRIES each). A head that finds no
valid block redraws X. When nothing passes within these bounds the options admit no
exercise (n = 4 with d = 1, for instance: four distinct non-zero entries of X do not exist)
and `make_exercise` raises BadInput in one line naming the options.

The worksheet is `attntrace.teach.worksheet`, the answer key `attntrace.teach.answerkey`, the
quizzes for learning-management systems `attntrace.teach.lms`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attntrace.model.errors import BadInput
from attntrace.model.trace import Trace
from attntrace.teach.exercisechecks import MAX_WEIGHT, MIN_WEIGHT, head_problem, output_problem, value_problem, x_problem

MAX_N, MAX_D, MAX_HEADS = 12, 12, 6
#: Drawn entries: X from {-1, 0, 1, 2}; W_Q, W_K, W_V from {-1, 0, 1}; W_O from {0, 1}.
X_VALUES, W_VALUES, O_VALUES = (-1, 0, 1, 2), (-1, 0, 1), (0, 1)
X_TRIES, HEAD_TRIES, MATRIX_TRIES = 2000, 128, 200
#: (W_Q, W_K) candidates are drawn BATCH at a time (HEAD_TRIES is a multiple of it).
BATCH = 32
#: All candidates drawn together (X, blocks, W_O) stop at this; it bounds the time of a hopeless search.
MAX_DRAWS = 60000


def _x_p(d: int):
    nz = min(0.65, 2.6 / d)  # d = 4: 0.15, 0.35, 0.35, 0.15
    return (0.23 * nz, 1 - nz, 0.54 * nz, 0.23 * nz)


def _w_p(d: int, d_k: int):
    nz = min(0.55, 2.5 / d_k)  # d_k <= 4: 0.15, 0.45, 0.40
    return (0.27 * nz, 1 - nz, 0.73 * nz)


def _int_arg(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise BadInput(f"{name} must be an integer, not {value!r}")
    if not low <= value <= high:
        raise BadInput(f"{name} must be from {low} to {high}, not {value}")
    return int(value)


def _validate(n, d, heads, seed) -> tuple[int, int, int, int]:
    n = _int_arg(n, "n (sequence length)", 2, MAX_N)  # one word: its softmax weight is always 1
    d = _int_arg(d, "d (model width)", 1, MAX_D)
    heads = _int_arg(heads, "heads", 1, MAX_HEADS)
    if d % heads:
        raise BadInput(f"heads = {heads} does not divide d = {d}: each head takes d / heads columns")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise BadInput(f"seed must be a non-negative integer, not {seed!r}")
    return n, d, heads, int(seed)


# --------------------------------------------------------------------------- drawing


@dataclass
class Draw:
    x: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray | None
    #: candidates drawn: {"X": k, "QK": k, "V": k, "O": k}; "X" > 1 means X was redrawn.
    tries: dict = field(default_factory=dict)


def _columns(d: int) -> np.ndarray:
    """Every non-zero column of {-1, 0, 1}^d (the candidates of a d_k = 1 block)."""
    cols = np.array(list(itertools.product(W_VALUES, repeat=d)), dtype=np.int64)
    return cols[cols.any(axis=1)]


def _head_blocks(rng, x, d, d_k, tries):
    """A valid (W_Q, W_K) block pair for one head, or None."""
    if d_k == 1:  # few candidates: try them all, in a seeded order, the promising ones only
        cols = _columns(d)[rng.permutation(3 ** d - 1)]
        vals = x @ cols.T  # (n, candidates)
        distinct = np.array([len(set(v)) == len(v) for v in vals.T.tolist()])
        q_cols = cols[distinct & vals.all(axis=0)]
        k_cols = cols[distinct]
        q_vals, k_vals = x @ q_cols.T, x @ k_cols.T  # (n, A), (n, B)
        for a in range(len(q_cols)):  # pairs in order (a, b); a quick test of the softmax bounds first
            s = q_vals[:, a][None, :, None] * k_vals.T[:, None, :]  # (B, n, n)
            w = np.exp(s - s.max(axis=2, keepdims=True))
            w /= w.sum(axis=2, keepdims=True)
            quick = (w.max(axis=(1, 2)) < MAX_WEIGHT) & (w.min(axis=(1, 2)) >= MIN_WEIGHT)
            for b in np.flatnonzero(quick):
                wq, wk = q_cols[a][:, None], k_cols[b][:, None]
                if head_problem(x, wq, wk) is None:
                    tries["QK"] += a * len(k_cols) + int(b) + 1
                    return wq, wk
        tries["QK"] += len(q_cols) * len(k_cols)
        return None
    p = _w_p(d, d_k)
    for _ in range(HEAD_TRIES // BATCH):
        # BATCH candidate pairs drawn at once; a quick vectorised test of the scores picks the
        # ones worth the full check, which is the only judge; tries counts candidates looked at
        wqs, wks = (rng.choice(W_VALUES, size=(BATCH, d, d_k), p=p) for _ in range(2))
        s = (x @ wqs) @ np.swapaxes(x @ wks, 1, 2)  # (BATCH, n, n)
        distinct = (np.diff(np.sort(s, axis=2), axis=2) != 0).all(axis=(1, 2))
        for b in range(BATCH):
            tries["QK"] += 1
            if distinct[b] and head_problem(x, wqs[b], wks[b]) is None:
                return wqs[b], wks[b]
    return None


def _draw_matrix(rng, shape, values, p, ok, tries, key):
    for _ in range(MATRIX_TRIES):
        tries[key] += 1
        m = rng.choice(values, size=shape, p=p)
        if ok(m):
            return m
    return None


def draw_exercise(n: int, d: int, heads: int, seed: int) -> Draw:
    """The validated matrices of an exercise (no trace): see the module's docstring."""
    n, d, heads, seed = _validate(n, d, heads, seed)
    d_k = d // heads
    rng = np.random.default_rng([seed, n, d, heads])
    tries = {"X": 0, "QK": 0, "V": 0, "O": 0}
    for _ in range(X_TRIES):
        if sum(tries.values()) >= MAX_DRAWS:
            break
        tries["X"] += 1
        x = rng.choice(X_VALUES, size=(n, d), p=_x_p(d))
        if x_problem(x):
            continue
        blocks = []
        for _h in range(heads):
            pair = _head_blocks(rng, x, d, d_k, tries)
            if pair is None:
                break
            blocks.append(pair)
        else:
            wvs = [_draw_matrix(rng, (d, d_k), W_VALUES, _w_p(d, d_k), lambda m: value_problem(x, m) is None, tries, "V")
                   for _h in range(heads)]
            if any(m is None for m in wvs):
                continue
            wo = None
            if heads > 1:
                wo = _draw_matrix(rng, (d, d), O_VALUES, (0.5, 0.5), lambda m: output_problem(m) is None, tries, "O")
                if wo is None:
                    continue
            wq = np.hstack([b[0] for b in blocks])
            wk = np.hstack([b[1] for b in blocks])
            return Draw(x, wq, wk, np.hstack(wvs), wo, tries)
    raise BadInput(f"no exercise worth handing out for --n {n} --d {d} --heads {heads} --seed {seed} "
                   f"within {X_TRIES} draws of X and {MAX_DRAWS} draws in all (distinct non-zero rows, full-rank projections, every "
                   f"softmax weight in [{MIN_WEIGHT}, {MAX_WEIGHT})); try another seed, a smaller n or d_k > 1")


def make_exercise(n: int = 2, d: int = 4, heads: int = 1, seed: int = 0) -> tuple[dict, Trace]:
    """A reproducible exercise: (spec dict, its numeric trace)."""
    from attntrace.tracer import trace_spec

    spec = exercise_spec(n, d, heads, seed)
    return spec, trace_spec(spec)


def exercise_spec(n: int = 2, d: int = 4, heads: int = 1, seed: int = 0) -> dict:
    """The spec of `make_exercise` without tracing it."""
    n, d, heads, seed = _validate(n, d, heads, seed)
    draw = draw_exercise(n, d, heads, seed)
    spec: dict[str, Any] = {
        "title": f"Exercise (seed {seed}): n = {n}, d = {d}, {heads} head{'s' if heads > 1 else ''}",
        "description": f"Generated by attntrace exercise --n {n} --d {d} --heads {heads} --seed {seed}.",
        "mode": "numeric",
        "X": draw.x.tolist(),
        "W_Q": draw.wq.tolist(),
        "W_K": draw.wk.tolist(),
        "W_V": draw.wv.tolist(),
    }
    if heads > 1:
        spec["num_heads"] = heads
        spec["W_O"] = draw.wo.tolist()
    return spec
