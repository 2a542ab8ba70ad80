"""Exact and symbolic traces, with numbers substituted, agree with the numeric trace;
every mode's shapes agree with shape mode."""

import numpy as np
import sympy as sp
from hypothesis import given, settings, strategies as st

import attntrace
from attntrace.algebra.substitute import substitute

KEYS = ("X", "W_Q", "W_K", "W_V")


@st.composite
def problems(draw):
    n = draw(st.integers(1, 3))
    m = draw(st.integers(1, 3))
    d = draw(st.integers(1, 3))
    dk = draw(st.integers(1, 3))
    dv = draw(st.integers(1, 3))
    cross = draw(st.booleans())
    mask = draw(st.sampled_from([None, "causal"]))
    scale = draw(st.sampled_from([True, False, 2]))
    seed = draw(st.integers(0, 2**32 - 1))
    shapes = {"X": (n, d), "W_Q": (d, dk), "W_K": (d, dk), "W_V": (d, dv)}
    if cross:
        shapes["X_kv"] = (m, d)
    return shapes, mask, scale, seed


def _numbers(shapes, seed):
    rng = np.random.default_rng(seed)
    # small rationals so that exact mode stays exact and quick
    return {k: rng.integers(-4, 5, size=s) / 2 for k, s in shapes.items()}


def _options(mask, scale):
    opts = {"scale": scale}
    if mask:
        opts["mask"] = mask
    return opts


@settings(max_examples=25, deadline=None)
@given(problems())
def test_symbolic_substituted_equals_numeric(problem):
    shapes, mask, scale, seed = problem
    nums = _numbers(shapes, seed)
    numeric = attntrace.run({**nums, **_options(mask, scale)})
    symbolic = attntrace.run({k: {"shape": list(s)} for k, s in shapes.items()} | _options(mask, scale), mode="symbolic")
    names = {"X": "x", "X_kv": "y", "W_Q": "w^{Q}", "W_K": "w^{K}", "W_V": "w^{V}"}
    values = {}
    for k, arr in nums.items():
        for i in range(arr.shape[0]):
            for j in range(arr.shape[1]):
                values[sp.Symbol(f"{names[k]}_{{{i + 1}{j + 1}}}")] = arr[i, j]
    got = substitute(symbolic, values)
    assert [s.key for s in symbolic.steps] == [s.key for s in numeric.steps]
    for step in numeric.steps:
        np.testing.assert_allclose(got[step.key], step.value, atol=1e-10, rtol=0, err_msg=step.key)


@settings(max_examples=20, deadline=None)
@given(problems())
def test_exact_equals_numeric_and_shapes_equal_shape_mode(problem):
    shapes, mask, scale, seed = problem
    nums = _numbers(shapes, seed)
    numeric = attntrace.run({**nums, **_options(mask, scale)})
    exact = attntrace.run({k: [[str(sp.Rational(x)) for x in row] for row in v.tolist()] for k, v in nums.items()}
                          | _options(mask, scale), mode="exact")
    shape = attntrace.run({**nums, **_options(mask, scale)}, mode="shape")
    for step in numeric.steps:
        ex = exact.step(step.id, step.head).value
        approx = np.array([[float(sp.N(e, 20)) if e != -sp.oo else -np.inf for e in ex.row(i)] for i in range(ex.rows)])
        np.testing.assert_allclose(approx, step.value, atol=1e-10, rtol=0, err_msg=step.key)
        assert shape.step(step.id, step.head).shape == step.shape == ex.shape
    if mask:
        w = exact.step("weights").value
        keep = exact.step("masked").details["keep"]
        assert all(w[i, j] == 0 for i in range(w.rows) for j in range(w.cols) if not keep[i, j])


def test_symbolic_is_one_level_deep():
    t = attntrace.run({k: {"shape": [2, 2]} for k in KEYS}, mode="symbolic")
    s = t.step("scores")
    assert {str(x) for x in s.expansion[0, 1].free_symbols} == {"q_{11}", "q_{12}", "k_{21}", "k_{22}"}
    a = t.step("weights")
    assert {str(x) for x in a.expansion[0, 0].free_symbols} == {"t_{11}", "t_{12}"}


def test_full_expansion_option_is_in_terms_of_inputs():
    t = attntrace.run({k: {"shape": [1, 1]} for k in KEYS}, mode="symbolic", expand="full")
    z = t.step("Z").value[0, 0]
    assert {str(x) for x in z.free_symbols} == {"x_{11}", "w^{V}_{11}"}  # a single key: weight 1
