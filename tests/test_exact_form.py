"""Exact mode's canonical forms (attntrace.algebra.exact_form, ExactAlgebra in attntrace.algebra.modes).

Expected forms are compared as printed by SymPy's str printer with order="none", which
writes the arguments in the order the trace stored them, so a test fails when the term
order changes, not only when the value does.

Hand checks (the softmax cases use scores s with d_k given, so t = s / sqrt(d_k)):

- Two keys, scores (5, 0), d_k = 2: t = (5/sqrt 2, 0) = (5 sqrt(2)/2, 0), the max is t_1,
  shifted (0, -5 sqrt(2)/2), exponentials (1, e^{-5 sqrt(2)/2}), S = 1 + e^{-5 sqrt(2)/2};
  a_1 = e^{t_1}/(e^{t_1} + e^{t_2}) = 1/(1 + e^{t_2 - t_1}) = 1/(1 + e^{-5 sqrt(2)/2}) and
  a_2 = 1/(1 + e^{t_1 - t_2}) = 1/(1 + e^{5 sqrt(2)/2}).
- Ties, scaled row (0, 0, 1/2): max 1/2 (column 3), shifted (-1/2, -1/2, 0), S = 1 + 2
  e^{-1/2} (the two equal exponentials are one term); a_1 = a_2 = e^0/(e^0 + e^0 + e^{1/2})
  = 1/(2 + e^{1/2}); a_3 = e^{1/2}/(2 + e^{1/2}) = 1/(1 + 2 e^{-1/2}).
- Masked row (1/2, -oo, -oo): one kept key, weight 1, the others exactly 0, S = 1.
- Z with weights of the first case and V = [[1/2, 0, 1], [3, 5, 1]]:
  z_1 = (1/2 + 3 e^{-5 sqrt(2)/2})/S = (1 + 6 e^{-5 sqrt(2)/2})/(2 (1 + e^{-5 sqrt(2)/2}));
  z_2 = 5 e^{-5 sqrt(2)/2}/S = 5/(1 + e^{5 sqrt(2)/2}) = 5 a_2; z_3 = (1 + e^{..})/S = 1.
  The tied row (scores (1, 1)) has weights 1/2, 1/2: z = (7/4, 5/2, 1).
- Numbers: 1/(1 + sqrt 2) = (sqrt 2 - 1)/((sqrt 2 + 1)(sqrt 2 - 1)) = -1 + sqrt(2);
  sqrt(8)/4 = 2 sqrt(2)/4 = sqrt(2)/2; sqrt(3 + 2 sqrt 2) = sqrt((1 + sqrt 2)^2) = 1 + sqrt(2);
  (1 + sqrt 2)(1 - sqrt 2)/sqrt 3 = -1/sqrt 3 = -sqrt(3)/3.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import sympy as sp
from hypothesis import HealthCheck, given, settings, strategies as st

import attntrace
from attntrace.algebra import exact_form as xf


def s(e) -> str:
    """The expression as stored: str printer, arguments in stored order."""
    return sp.sstr(e, order="none")


def run(spec, **kw):
    return attntrace.run({**spec, "mode": "exact"}, **kw)


# -- numbers ----------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("1/(1 + sqrt(2))", "-1 + sqrt(2)"),
    ("sqrt(8)/4", "sqrt(2)/2"),
    ("sqrt(3 + 2*sqrt(2))", "1 + sqrt(2)"),
    ("(1 + sqrt(2))*(1 - sqrt(2))/sqrt(3)", "-sqrt(3)/3"),
    ("12/sqrt(6)", "2*sqrt(6)"),
    ("1/2 + sqrt(3)/2 - 1/2", "sqrt(3)/2"),
])
def test_canonical_numbers_by_hand(text, expected):
    from attntrace.inputs.expr import parse_expr

    assert s(xf.canonical(parse_expr(text))) == expected


def test_projection_and_scaling_entries_are_canonical():
    t = run({"scores": [["12", "1/(1 + sqrt(2))"]], "d_k": 6, "V": [[1], [2]]})
    assert [s(x) for x in t.step("scaled").value] == ["2*sqrt(6)", "-sqrt(6)/6 + sqrt(3)/3"]


_atoms = st.sampled_from(["0", "1", "-1", "2", "1/2", "-3/2", "1/3", "sqrt(2)", "-sqrt(3)/2", "sqrt(6)", "1 + sqrt(2)", "1/(2 - sqrt(3))"])


@st.composite
def _numbers(draw):
    from attntrace.inputs.expr import parse_expr

    terms = draw(st.lists(st.tuples(_atoms, _atoms), min_size=1, max_size=3))
    return sp.Add(*[parse_expr(a) * parse_expr(b) for a, b in terms])


@settings(max_examples=60, deadline=None)
@given(_numbers())
def test_canonical_is_idempotent_and_exact(x):
    c = xf.canonical(x)
    assert xf.canonical(c) == c
    assert s(xf.canonical(c)) == s(c)
    assert abs(complex(sp.N(c - x, 30))) < 1e-25


@settings(max_examples=40, deadline=None)
@given(_numbers(), _numbers())
def test_equal_numbers_have_equal_forms_and_sign_is_exact(x, y):
    d = xf.difference(xf.canonical(x), xf.canonical(y))
    value = sp.N(x - y, 50)
    sign = xf.sign(d)
    if abs(value) < 1e-40:
        assert d == 0 and sign == 0
    else:
        assert sign == (1 if value > 0 else -1)


# -- the softmax: hand-checked rows ------------------------------------------------------


def test_two_keys_weights_are_logistic():
    t = run({"scores": [["5", "0"]], "d_k": 2, "V": [["1/2", "0", "1"], ["3", "5", "1"]]})
    w = t.step("weights")
    assert [s(x) for x in w.value] == ["1/(1 + exp(-5*sqrt(2)/2))", "1/(1 + exp(5*sqrt(2)/2))"]
    d = w.details
    assert s(d["row_max"][0]) == "5*sqrt(2)/2"
    assert [s(x) for x in d["shifted"]] == ["0", "-5*sqrt(2)/2"]
    assert [s(x) for x in d["exp"]] == ["1", "exp(-5*sqrt(2)/2)"]
    assert s(d["row_sum"][0]) == "1 + exp(-5*sqrt(2)/2)"
    z = t.step("Z").value
    assert [s(x) for x in z] == ["(1 + 6*exp(-5*sqrt(2)/2))/(2*(1 + exp(-5*sqrt(2)/2)))",
                                 "5/(1 + exp(5*sqrt(2)/2))", "1"]


def test_ties_are_one_term_and_masked_entries_exact_zero():
    t = run({"scores": [["1", "2", "0"], ["1/2", "1", "3"], ["0", "0", "1"]], "d_k": 4, "mask": "causal",
             "V": [[1], [2], [3]]})
    w = t.step("weights")
    rows = [[s(w.value[i, j]) for j in range(3)] for i in range(3)]
    assert rows == [["1", "0", "0"],
                    ["1/(1 + exp(1/4))", "1/(1 + exp(-1/4))", "0"],
                    ["1/(2 + exp(1/2))", "1/(2 + exp(1/2))", "1/(1 + 2*exp(-1/2))"]]
    assert all(w.value[i, j] is sp.S.Zero for i in range(3) for j in range(3) if j > i)
    d = w.details
    assert [s(x) for x in d["row_max"]] == ["1/2", "1/2", "1/2"]
    assert [s(x) for x in d["shifted"].row(0)] == ["0", "-oo", "-oo"]
    assert [s(x) for x in d["exp"].row(0)] == ["1", "0", "0"]
    assert [s(x) for x in d["shifted"].row(2)] == ["-1/2", "-1/2", "0"]
    assert [s(x) for x in d["row_sum"]] == ["1", "1 + exp(-1/4)", "1 + 2*exp(-1/2)"]
    z = t.step("Z").value
    assert s(z[0, 0]) == "1"
    assert s(z[2, 0]) == "(3 + 3*exp(-1/2))/(1 + 2*exp(-1/2))"  # (v_3 + (v_1 + v_2) e^{-1/2}) / S, v = (1, 2, 3)


def test_tied_row_of_z_is_its_average():
    t = run({"scores": [["5", "0"], ["1", "1"]], "d_k": 2, "V": [["1/2", "0", "1"], ["3", "5", "1"]]})
    assert [s(x) for x in t.step("weights").value.row(1)] == ["1/2", "1/2"]
    assert [s(x) for x in t.step("Z").value.row(1)] == ["7/4", "5/2", "1"]


def test_terms_in_column_order_with_the_constant_first():
    # t = (0, 3, 1, 2): max column 2; S = 1 + e^{-3} + e^{-2} + e^{-1} (columns 1, 3, 4)
    t = run({"scores": [["0", "3", "1", "2"]], "scale": False, "V": [[1], [2], [3], [5]]})
    w, d = t.step("weights").value, t.step("weights").details
    assert s(d["row_sum"][0]) == "1 + exp(-3) + exp(-2) + exp(-1)"
    assert s(w[0, 1]) == "1/(1 + exp(-3) + exp(-2) + exp(-1))"
    assert s(w[0, 0]) == "1/(1 + exp(3) + exp(1) + exp(2))"    # a_1: columns 2, 3, 4 relative to t_1
    assert s(w[0, 3]) == "1/(1 + exp(-2) + exp(1) + exp(-1))"  # a_4: columns 1, 2, 3 relative to t_4
    assert s(t.step("Z").value[0, 0]) == "(2 + exp(-3) + 3*exp(-2) + 5*exp(-1))/(1 + exp(-3) + exp(-2) + exp(-1))"


# -- the row max, decided exactly ---------------------------------------------------------


def _sqrt2_convergents():
    """Continued-fraction convergents p/q of sqrt(2), alternately below and above it."""
    p0, q0, p1, q1 = 1, 1, 3, 2
    out = [sp.Rational(p0, q0), sp.Rational(p1, q1)]
    while q1 < 10**12:
        p0, q0, p1, q1 = p1, q1, 2 * p1 + p0, 2 * q1 + q0
        out.append(sp.Rational(p1, q1))
    return out


def _row_max_column(row: list[str]) -> int:
    t = run({"scores": [row], "scale": False, "V": [[1]] * len(row)})
    d = t.step("weights").details
    shifted = list(d["shifted"])
    assert all(xf.sign(x) in (0, -1) for x in shifted), shifted  # every shifted exponent <= 0
    return shifted.index(0)


def test_row_max_of_close_surds():
    c = _sqrt2_convergents()
    above = [x for x in c if x > sp.sqrt(2)][-1]  # 1.4142135623730950488... + ~1e-24
    below = [x for x in c if x < sp.sqrt(2)][-1]
    assert abs(float(above) - math.sqrt(2)) < 1e-15 and abs(float(below) - math.sqrt(2)) < 1e-15  # floats cannot tell
    assert _row_max_column(["sqrt(2)", "99/70", "7071/5000"]) == 1  # 99/70 = 1.4142857 > sqrt(2)
    assert _row_max_column(["sqrt(2)", "7071/5000", str(below)]) == 0
    assert _row_max_column([str(below), "sqrt(2)", str(above)]) == 2
    assert _row_max_column(["sqrt(2) + sqrt(3)", "sqrt(10)", "3"]) == 1  # 3.1463 < 3.1623
    assert _row_max_column(["2718281828459045/1000000000000000", "exp(1)"]) == 1  # e is larger by 2.4e-16


def test_equal_numbers_written_differently_are_ties():
    for row in (["sqrt(8)/2", "sqrt(2)"], ["sqrt(3 + 2*sqrt(2))", "1 + sqrt(2)"], ["1/(sqrt(2) - 1)", "1 + sqrt(2)"]):
        t = run({"scores": [row], "scale": False, "V": [[1], [1]]})
        assert [s(x) for x in t.step("weights").value] == ["1/2", "1/2"], row
        assert s(t.step("weights").details["row_sum"][0]) == "2"


def test_rows_with_symbols_are_not_shifted():
    t = run({"scores": [["a", "1"], ["0", "1"]], "scale": False, "V": [[1], [2]]})
    d = t.step("weights").details
    assert d["row_max"][0] is None and s(d["row_max"][1]) == "1"
    assert [s(x) for x in d["shifted"].row(0)] == ["a", "1"]
    a = sp.Symbol("a")
    w = t.step("weights").value
    for val in (-2, 0, 3):
        got = float(w[0, 0].subs(a, val))
        assert abs(got - 1 / (1 + math.exp(1 - val))) < 1e-14


# -- one term order in the value and the details ------------------------------------------


def _exponent(term):
    """x of a term c * exp(x)."""
    return [f for f in sp.Mul.make_args(term) if isinstance(f, sp.exp)][0].args[0]


def _check_consistent(step, z_step):
    w, d = step.value, step.details
    rows, cols = w.shape
    for i in range(rows):
        S = d["row_sum"][i]
        kept = [j for j in range(cols) if d["shifted"][i, j] != -sp.oo]
        jmax = [j for j in kept if d["shifted"][i, j] == 0][0]
        # the max entry's weight is 1/S: the very same sum
        assert w[i, jmax] == (sp.Integer(1) / S if S.is_Number else sp.Pow(S, -1)), (i, s(w[i, jmax]), s(S))
        for j in range(cols):
            if j in kept:
                assert d["exp"][i, j] == (1 if d["shifted"][i, j] == 0 else sp.exp(d["shifted"][i, j]))
            else:
                assert w[i, j] is sp.S.Zero and d["exp"][i, j] is sp.S.Zero
        # S lists the exponentials: constant first, then the other exponents in column order
        exps = [x for x in sp.Add.make_args(S) if not x.is_Number]
        exponents = [_exponent(x) for x in exps]
        firsts = []
        for j in kept:
            e = d["shifted"][i, j]
            if e != 0 and e not in firsts:
                firsts.append(e)
        assert exponents == firsts, (s(S), firsts)
        # every Z entry of the row that is a fraction over S uses S itself as its denominator
        if z_step is not None:
            for zij in z_step.value.row(i):
                dens = [f.base for f in sp.Mul.make_args(zij) if f.is_Pow and f.exp == -1 and f.base.is_Add]
                numer = [f for f in sp.Mul.make_args(zij) if f.is_Add]
                if dens and numer and numer[0].has(sp.exp):  # several numerator terms: over S itself
                    assert dens == [S]
                    assert [_exponent(x) for x in sp.Add.make_args(numer[0]) if x.has(sp.exp)] \
                        == [e for e in exponents if numer[0].has(sp.exp(e))]  # S's order


def test_details_and_values_share_one_term_order():
    t = run({"scores": [["0", "3", "1", "2"], ["2", "2", "-1", "1/2"], ["sqrt(2)", "1", "sqrt(2)", "0"]],
             "scale": False, "V": [[1, 0], [2, 1], [3, 0], [5, "1/2"]]})
    _check_consistent(t.step("weights"), t.step("Z"))


def test_numeric_details_have_the_same_keys():
    t = attntrace.run({"scores": [[1.0, 2.0, 0.0], [0.5, 1.0, 3.0]], "mask": [[1, 1, 0], [1, 1, 1]], "scale": False, "V": [[1], [2], [3]]})
    d = t.step("weights").details
    assert set(d) == {"row_max", "shifted", "exp", "row_sum"}
    assert all(not d[k].flags.writeable and d[k].dtype == np.float64 for k in d)
    np.testing.assert_array_equal(d["shifted"], [[-1.0, 0.0, -np.inf], [-2.5, -2.0, 0.0]])
    np.testing.assert_allclose(d["exp"], np.exp(d["shifted"]))
    e = run({"scores": [["1", "2", "0"], ["1/2", "1", "3"]], "mask": [[1, 1, 0], [1, 1, 1]], "scale": False, "V": [[1], [2], [3]]})
    assert set(e.step("weights").details) == set(d)


# -- exact equals numeric ------------------------------------------------------------------

_entries = st.sampled_from(["0", "1", "-1", "2", "-2", "1/2", "-3/2", "1/3", "sqrt(2)", "-sqrt(2)/2", "sqrt(3)"])


@st.composite
def _specs(draw):
    n = draw(st.integers(1, 3))
    d = draw(st.integers(1, 3))
    heads = draw(st.sampled_from([1, 1, 2]))
    dk = draw(st.integers(1, 2)) * heads

    def mat(r, c):
        return [[draw(_entries) for _ in range(c)] for _ in range(r)]

    spec = {"X": mat(n, d), "W_Q": mat(d, dk), "W_K": mat(d, dk), "W_V": mat(d, dk)}
    spec["scale"] = draw(st.sampled_from([True, False]))
    if draw(st.booleans()):
        spec["mask"] = "causal"
    if heads > 1:
        spec["num_heads"] = heads
        spec["W_O"] = mat(dk, 2)
        if draw(st.booleans()):
            spec["b_O"] = mat(1, 2)
    return spec


def _floats(m) -> np.ndarray:
    return np.array([[-np.inf if x == -sp.oo else float(sp.N(x, 30)) for x in m.row(i)] for i in range(m.rows)])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_specs())
def test_exact_equals_numeric(spec):
    numeric = attntrace.run(spec)
    exact = attntrace.run({**spec, "mode": "exact"})
    assert [x.key for x in exact.steps] == [x.key for x in numeric.steps]
    for step in numeric.steps:
        ex = exact.step(step.id, step.head)
        np.testing.assert_allclose(_floats(ex.value), step.value, rtol=1e-12, atol=1e-12, err_msg=step.key)
        if step.id == "weights":
            for key in ("shifted", "exp"):
                np.testing.assert_allclose(_floats(ex.details[key]), step.details[key], rtol=1e-12, atol=1e-12, err_msg=key)
            for key in ("row_max", "row_sum"):
                got = [float(sp.N(x, 30)) for x in ex.details[key]]
                np.testing.assert_allclose(got, step.details[key], rtol=1e-12, atol=1e-12, err_msg=key)
            _check_consistent(ex, exact.step("Z", step.head))


def test_output_projection_is_one_fraction_per_head_after_the_bias():
    spec = {"X": [["1", "0", "1/2", "1"], ["0", "1", "1", "-1"]],
            "W_Q": [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0], [0, 0, 1, 1]],
            "W_K": [[0, 0, 1, 1], [1, 1, 0, 0], [0, 1, 0, 1], [1, 0, 1, 0]],
            "W_V": [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0], [0, 0, 1, 1]],
            "num_heads": 2, "W_O": [[1, 0], [0, 1], [1, 1], ["1/2", 0]], "b_O": [["1/3", 0]]}
    o = run(spec).step("output").value[0, 0]
    terms = o.args
    assert o.is_Add and terms[0] == sp.Rational(1, 3) and len(terms) == 3
    dens = [[f.base for f in sp.Mul.make_args(t) if f.is_Pow and f.exp == -1][0] for t in terms[1:]]
    t = run(spec)
    assert dens == [t.step("weights", 1).details["row_sum"][0], t.step("weights", 2).details["row_sum"][0]]
    np.testing.assert_allclose(_floats(t.step("output").value), attntrace.run(spec).step("output").value, rtol=1e-12)


def test_exact_4x4_stays_fast():
    X = [["1", "1/2", "0", "sqrt(2)"], ["-1", "2", "1/3", "0"], ["0", "1", "-1/2", "1"], ["2", "0", "1", "-1"]]
    W = [["1", "0", "1/2", "-1"], ["0", "1", "1", "0"], ["1/2", "-1", "0", "1"], ["0", "1", "0", "1/2"]]
    xf.clear_caches()
    start = time.process_time()
    run({"X": X, "W_Q": W, "W_K": [r[::-1] for r in W], "W_V": W[::-1], "mask": "causal"})
    assert time.process_time() - start < 3.0  # about 0.04 s on the benchmark machine
