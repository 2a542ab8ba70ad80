"""The interval arithmetic behind "carried forward": every value computed from inputs inside
the boxes lies inside the computed box (else a correct student could be marked wrong), and the
boxes are not much wider than the spread of those values (else a mistake could hide in them).
Checked against plain NumPy on sampled corners and random points of the input boxes."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from attntrace.grading import intervals

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def _box(rng, shape, scale, radius):
    mid = rng.uniform(-scale, scale, size=shape)
    return intervals.around(mid, np.full(shape, radius))


def _samples(rng, box, k=40):
    out = [box.lo, box.hi]
    for _ in range(k):
        out.append(box.lo + (box.hi - box.lo) * rng.integers(0, 2, size=box.shape))  # corners
        out.append(rng.uniform(box.lo, box.hi))
    return out


def _softmax(t):
    e = np.exp(t - t.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@SETTINGS
@given(seed=st.integers(0, 10 ** 6), n=st.integers(1, 4), m=st.integers(1, 4), k=st.integers(1, 4),
       radius=st.sampled_from([0.0, 0.05, 0.005, 0.0005]))
def test_matmul_box_holds_every_product(seed, n, m, k, radius):
    rng = np.random.default_rng(seed)
    a, b = _box(rng, (n, k), 3, radius), _box(rng, (k, m), 3, radius)
    box = intervals.matmul(a, b)
    got = [x @ y for x, y in zip(_samples(rng, a), _samples(rng, b))]
    for g in got:
        assert np.all(g >= box.lo) and np.all(g <= box.hi)
    spread = np.max(got, axis=0) - np.min(got, axis=0)
    assert np.all(box.hi - box.lo <= 4 * spread + 1e-9)


@SETTINGS
@given(seed=st.integers(0, 10 ** 6), n=st.integers(1, 4), m=st.integers(2, 5), radius=st.sampled_from([0.05, 0.005, 0.0005]),
       masked=st.booleans())
def test_softmax_box_holds_every_row_softmax(seed, n, m, radius, masked):
    rng = np.random.default_rng(seed)
    t = _box(rng, (n, m), 4, radius)
    keep = np.tril(np.ones((n, m), dtype=bool)) if masked else np.ones((n, m), dtype=bool)
    box = intervals.softmax_rows(intervals.fill_where(t, keep, -np.inf))  # a causal mask: -inf above the diagonal
    got = [_softmax(np.where(keep, x, -np.inf)) for x in _samples(rng, t)]
    for g in got:
        assert np.all(g >= box.lo - 1e-15) and np.all(g <= box.hi + 1e-15)
    if masked:
        assert np.all(box.hi[~keep] == 0)
    spread = np.max(got, axis=0) - np.min(got, axis=0)
    assert np.all(box.hi - box.lo <= 2.5 * spread + 1e-9)  # the corners reach the bounds: tight


def test_exact_inputs_give_a_point():
    a = intervals.point(np.array([[1.0, 2.0], [3.0, 4.0]]))
    box = intervals.softmax_rows(intervals.divide(intervals.matmul(a, a.T), 2.0))
    assert np.allclose(box.lo, box.hi, rtol=0, atol=1e-9)  # a point, but for a few ulps of float64 rounding
