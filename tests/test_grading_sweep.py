"""The mistake sweep: every catalogued mistake planted into many random problems, and correct
answers written every way a student writes them.

A simulated student (plain NumPy, independent of attntrace) computes each step from their own
*written* earlier values, rounded to 1-4 decimals as on paper, and makes one mistake in one
step of one head. The checker must name the mistake at that step (or list it among the
alternatives, when other mistakes give the same numbers in that problem), call the steps
before it correct and the steps after it carried (never wrong). Problems vary in shape,
heads (1-3, with W_O), causal mask and cross-attention (K and V from X_kv).

`simulate` is also the student of tests/test_classcheck.py.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import attntrace
from attntrace.grading.answer import MAX_TEXT
from attntrace.grading.checker import check
from attntrace.grading.diagnose import CATALOGUE

# -- problems ---------------------------------------------------------------------------------------
def problem(n=3, d_model=4, d_k=2, h=1, causal=False, cross=0, seed=0):
    """A random problem (numbers with one decimal, so that exact mode can read them too).

    cross: n_kv > 0 makes it cross-attention (K and V from an (n_kv, d_model) X_kv).
    """
    rng = np.random.default_rng(seed)
    X = rng.integers(-3, 4, size=(n, d_model)).astype(float)
    X_kv = rng.integers(-3, 4, size=(cross, d_model)).astype(float) if cross else None
    W = [[np.round(rng.uniform(-1, 1, size=(d_model, d_k)), 1) for _ in range(3)] for _ in range(h)]
    spec = {"X": X.tolist()}
    if X_kv is not None:
        spec["X_kv"] = X_kv.tolist()
    spec.update({name: np.hstack([w[i] for w in W]).tolist() for i, name in enumerate(("W_Q", "W_K", "W_V"))})
    WO = None
    if h > 1:
        spec["num_heads"] = h
        WO = np.round(rng.uniform(-1, 1, size=(h * d_k, d_model)), 1)
        spec["W_O"] = WO.tolist()
    if causal:
        spec["mask"] = "causal"
    return spec, {"X": X, "X_kv": X_kv, "W": W, "WO": WO, "d_k": d_k, "d_model": d_model, "h": h, "causal": causal}


def _softmax(t, axis=1):
    m = t.max(axis=axis, keepdims=True)
    e = np.exp(t - m)
    return e / e.sum(axis=axis, keepdims=True)


def _truncate(a, decimals):
    """Digits cut off instead of rounded (0.29 stays 0.29: the float 28.999.. is not cut to 28)."""
    return np.trunc(np.round(a * 10 ** decimals, 6)) / 10 ** decimals


#: Where each mistake is made (the step that becomes wrong; kv_from_queries: K and V).
TARGET = {"same_weights": "K", "kv_from_queries": "K", "transposed_scores": "scores", "no_transpose": "scores",
          "missing_scale": "scaled", "scaled_by_dk": "scaled", "wrong_dk": "scaled", "scaled_by_dmodel": "scaled",
          "mask_ignored": "masked", "mask_wrong_triangle": "masked", "mask_not_infinite": "masked",
          "skipped_softmax": "weights", "column_softmax": "weights", "softmax_without_exp": "weights",
          "rows_not_normalised": "weights", "values_first": "Z", "concat_rows": "concat", "head_order": "concat",
          "forgot_output_projection": "output", "output_weights_transposed": "output",
          "transposed": "weights", "rounding": "scaled", "arithmetic_slip": "Q"}
PER_HEAD = ("Q", "K", "V", "scores", "scaled", "masked", "weights", "Z")


def simulate(p, plant=None, plant_head=1, decimals=4):
    """The student's written steps {key: matrix of strings}, with `plant` made in head `plant_head`.

    The student stops where their mistake leaves nothing computable (V A of another shape,
    weights with -inf in them, head outputs stacked as rows).
    """
    r = lambda a: np.round(a, decimals)  # noqa: E731 - what the student writes down
    multi = p["h"] > 1
    X, Xkv = p["X"], (p["X_kv"] if p["X_kv"] is not None else p["X"])
    out, zs = {}, []
    for i, (WQ, WK, WV) in enumerate(p["W"], start=1):
        m = plant if (i == plant_head or not multi) else None
        key = (lambda s: f"{s}@{i}") if multi else (lambda s: s)  # noqa: E731
        Q = r(X @ WQ)
        if m == "arithmetic_slip":
            Q = Q.copy()
            Q[0, 0] += 1.0
        src = X if m == "kv_from_queries" else Xkv
        K = r(src @ (WQ if m == "same_weights" else WK))
        V = r(src @ WV)
        S = r(K @ Q.T if m == "transposed_scores" else Q @ K if m == "no_transpose" else Q @ K.T)
        factor = {"missing_scale": 1.0, "scaled_by_dk": p["d_k"], "wrong_dk": math.sqrt(p["d_model"]),
                  "scaled_by_dmodel": p["d_model"]}.get(m, math.sqrt(p["d_k"]))
        T = _truncate(S / factor, decimals) if m == "rounding" else r(S / factor)
        out.update({key("Q"): Q, key("K"): K, key("V"): V, key("scores"): S, key("scaled"): T})
        if p["causal"]:
            keep = np.tril(np.ones(T.shape, dtype=bool))
            if m == "mask_wrong_triangle":
                keep = keep.T
            T = T if m == "mask_ignored" else np.where(keep, T, 0.0 if m == "mask_not_infinite" else -np.inf)
            out[key("masked")] = T
        if m == "skipped_softmax":
            A = T
        elif m == "column_softmax":
            A = _softmax(T, axis=0)
        elif m == "softmax_without_exp":
            A = np.where(np.isinf(T), 0.0, T) / np.where(np.isinf(T), 0.0, T).sum(axis=1, keepdims=True)
        elif m == "rows_not_normalised":  # normalised over the whole matrix instead of each row
            e = np.exp(T - T.max())
            A = e / e.sum()
        else:
            A = _softmax(T)
        A = r(A)
        if m == "transposed":
            A = A.T
        out[key("weights")] = A
        if np.isinf(A).any() or A.shape[1] != V.shape[0] or (m == "values_first" and V.shape[1] != A.shape[0]):
            zs = None  # nothing computable after this on paper
            continue
        Z = r(V @ A if m == "values_first" else A @ V)
        out[key("Z")] = Z
        if zs is not None and Z.shape == (X.shape[0], p["d_k"]):
            zs.append(Z)
        else:
            zs = None
    if multi and zs is not None:
        if plant == "concat_rows":
            out["concat"] = r(np.vstack(zs))
        else:
            C = r(np.hstack(zs[::-1] if plant == "head_order" else zs))
            out["concat"] = C
            if plant == "forgot_output_projection":
                out["output"] = C
            else:
                out["output"] = r(C @ (p["WO"].T if plant == "output_weights_transposed" else p["WO"]))
    fmt = lambda x: "-inf" if x == -np.inf else f"{x:.{decimals}f}"  # noqa: E731
    return {k: [[fmt(x) for x in row] for row in v] for k, v in out.items()}


def target_keys(code, p, plant_head):
    step = TARGET[code]
    suffix = f"@{plant_head}" if p["h"] > 1 and step in PER_HEAD else ""
    if code == "kv_from_queries":
        return {"K" + suffix, "V" + suffix}
    return {step + suffix}


def visible(code, answer, clean, targets, decimals) -> bool:
    """Whether the mistake shows in the numbers written: some entry of the planted step differs
    from the right one by more than 1.5 units of the last decimal (by any amount for rounding).
    Scores near 0 divided by the wrong factor, at 1 decimal, may not show at all."""
    need = 0.0 if code == "rounding" else 1.5 * 10.0 ** -decimals
    for t in targets:
        a, b = answer[t], clean.get(t)
        if b is None or np.shape(a) != np.shape(b):
            return True
        x, y = np.array(a, dtype=float), np.array(b, dtype=float)
        with np.errstate(invalid="ignore"):
            diff = np.where(np.isinf(x) | np.isinf(y), np.where(x == y, 0.0, np.inf), np.abs(x - y))
        if diff.max() > need + 1e-12:
            return True
    return False


def plantable(code, p, decimals=4) -> bool:
    """Whether a student can make this mistake in this problem and still write the step."""
    n, n_kv = p["X"].shape[0], (p["X_kv"].shape[0] if p["X_kv"] is not None else p["X"].shape[0])
    return {
        "kv_from_queries": p["X_kv"] is not None,
        "no_transpose": p["d_k"] == n_kv,
        "values_first": p["d_k"] == n,
        "mask_ignored": p["causal"], "mask_wrong_triangle": p["causal"], "mask_not_infinite": p["causal"],
        "concat_rows": p["h"] > 1, "head_order": p["h"] > 1,
        "forgot_output_projection": p["h"] > 1 and p["h"] * p["d_k"] == p["d_model"],
        "output_weights_transposed": p["h"] > 1 and p["h"] * p["d_k"] == p["d_model"],
        "transposed": n == n_kv,
        # truncation is told from rounding when the scores were written exactly (they have 2
        # decimals: X integer, W one decimal); after a rounded input it may be that rounding
        "rounding": decimals >= 2,
    }.get(code, True)


# -- the sweep -------------------------------------------------------------------------------------
TALLY: Counter = Counter()


def _verdict(report, code, targets):
    """(named | alternative | missed, first problem found or None)."""
    named = "missed"
    for key in targets:
        s = report.step(*_split(key))
        if s.status != "wrong":
            return "missed", f"{key} is {s.status}"
        codes = [s.diagnosis.code] + [a.code for a in s.diagnosis.alternatives]
        if s.diagnosis.code == code:
            named = "named" if named != "alternative" else named
        elif code in codes:
            named = "alternative"
        else:
            return "missed", f"{key}: {codes}"
    return named, None


def _split(key):
    sid, _, h = key.partition("@")
    return sid, (int(h) if h else None)


shapes = st.fixed_dictionaries({
    "n": st.integers(2, 4), "d_model": st.integers(2, 6), "d_k": st.integers(1, 3), "h": st.integers(1, 3),
    "causal": st.booleans(), "cross": st.sampled_from([0, 0, 2, 3, 4]), "seed": st.integers(0, 10 ** 6)})


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(shape=shapes, code=st.sampled_from(sorted(TARGET)), decimals=st.integers(1, 4), data=st.data())
def test_every_planted_mistake_is_named_and_later_steps_carried(shape, code, decimals, data):
    if shape["cross"] and shape["causal"]:
        shape = {**shape, "cross": shape["n"]}  # a causal mask needs square weights
    spec, p = problem(**shape)
    assume(plantable(code, p, decimals))
    plant_head = data.draw(st.integers(1, p["h"]))
    answer = simulate(p, plant=code, plant_head=plant_head, decimals=decimals)
    assume(not any(x in ("nan", "inf") for v in answer.values() for row in v for x in row))  # a row sum of 0: nothing to write
    clean = simulate(p, decimals=decimals)
    targets = target_keys(code, p, plant_head)
    assume(all(t in answer for t in targets) and visible(code, answer, clean, targets, decimals))
    report = check(spec, answer)
    verdict, why = _verdict(report, code, targets)
    TALLY[(code, verdict)] += 1
    assert verdict != "missed", (code, why, shape, decimals, {s.key: (s.status, s.diagnosis and s.diagnosis.code) for s in report.steps})
    order = [s.key for s in report.trace.steps]
    first = min(order.index(t) for t in targets)
    for s in report.steps:
        if s.key in targets:
            continue
        if order.index(s.key) < first:
            assert s.status in ("correct", "carried") and (s.status == "correct" or s.diagnosis.code == "early_rounding"), (code, s.key, s.status)
        else:  # after the mistake: carried (or right anyway), never wrong
            assert s.status != "wrong", (code, s.key, s.diagnosis and s.diagnosis.code, shape, decimals)
    assert report.first_wrong == min(targets, key=order.index)


def test_the_sweep_covers_every_catalogued_code():
    from test_grading_new_kinds import NEW_CODES  # planted in problems with RoPE, ALiBi, a cache, ...

    from attntrace.kinds import MISTAKES  # declared by their kinds, planted in each kind's own tests

    assert set(TARGET) | set(NEW_CODES) | set(MISTAKES) == set(CATALOGUE) and not set(TARGET) & set(NEW_CODES)


#: (code, decimals) whose planted mistake does not show in the problem below (seed 1).
_INVISIBLE_HERE = {("rounding", 1), ("transposed", 1), ("transposed", 2), ("values_first", 1), ("values_first", 2)}


@pytest.mark.parametrize("decimals", [1, 2, 3, 4])
@pytest.mark.parametrize("code", sorted(TARGET))
def test_each_code_in_a_problem_that_admits_every_one(code, decimals):
    """Two heads, causal mask, cross-attention, h*d_k = d_model, d_k = n: every code can be
    made here (the random sweep rarely draws, e.g., forgot_output_projection); planted in head 2."""
    spec, p = problem(n=3, d_model=6, d_k=3, h=2, causal=True, cross=3, seed=1)
    assert plantable(code, p, max(decimals, 2))
    answer, clean = simulate(p, plant=code, plant_head=2, decimals=decimals), simulate(p, decimals=decimals)
    targets = target_keys(code, p, 2)
    shows = visible(code, answer, clean, targets, decimals) and plantable(code, p, decimals)
    # In this problem these few are within 1.5 units of the right numbers (or rounding at one
    # decimal is cutting): nothing to grade. Named, not skipped, so a change in what shows fails.
    assert shows == ((code, decimals) not in _INVISIBLE_HERE), (code, decimals, shows)
    if not shows:
        return
    verdict, why = _verdict(check(spec, answer), code, targets)
    assert verdict != "missed", why


# -- correct answers, written every way ------------------------------------------------------------
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(shape=shapes, decimals=st.integers(1, 4))
def test_correct_answers_at_any_decimals_are_accepted(shape, decimals):
    """Each step from the student's own rounded values (chained), and the truth rounded step by
    step: no step wrong at 1 to 4 decimals."""
    if shape["cross"] and shape["causal"]:
        shape = {**shape, "cross": shape["n"]}
    spec, p = problem(**shape)
    chained = check(spec, simulate(p, decimals=decimals))
    assert chained.ok, [(s.key, s.status, s.diagnosis and s.diagnosis.code) for s in chained.steps if s.status == "wrong"]
    trace = attntrace.run(spec)
    rounded = check(trace, {s.key: np.round(np.asarray(s.value, float), decimals).tolist() for s in trace.steps})
    assert rounded.ok and all(s.status == "correct" for s in rounded.steps)


def _exact_text(x) -> str:
    """An exact entry as a student types it (exp(1), not SymPy's E); one too long to type
    (answer.MAX_TEXT) as a decimal with 6 places."""
    import sympy

    if x == -sympy.oo:
        return "-inf"
    text = str(x).replace("E", "exp(1)")
    return text if len(text) <= MAX_TEXT else f"{float(x):.6f}"


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(shape=st.fixed_dictionaries({"n": st.integers(2, 3), "d_model": st.integers(2, 3), "d_k": st.integers(1, 2),
                                    "h": st.integers(1, 2), "causal": st.booleans(), "cross": st.just(0),
                                    "seed": st.integers(0, 10 ** 6)}))
def test_exact_forms_and_fractions_are_accepted(shape):
    spec, _ = problem(**shape)
    trace = attntrace.run(spec, mode="exact")
    answer = {s.key: [[_exact_text(s.value[i, j]) for j in range(s.value.shape[1])] for i in range(s.value.shape[0])]
              for s in trace.steps}
    forms = [x for m in answer.values() for row in m for x in row]
    assert any("/" in x or "exp" in x or "sqrt" in x for x in forms)  # fractions and exact forms, not decimals
    report = check(trace, answer)
    assert report.ok and all(s.status == "correct" for s in report.steps), report.to_dict()



def teardown_module(module):
    """The tally of the sweep, for the record (pytest -s shows it)."""
    if TALLY:
        rows = sorted({c for c, _ in TALLY})
        print("\nsweep: code named / alternative / missed")
        for c in rows:
            print(f"  {c:26s} {TALLY[(c, 'named')]:4d} {TALLY[(c, 'alternative')]:4d} {TALLY[(c, 'missed')]:4d}")
