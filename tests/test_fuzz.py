"""Random specs and answers never crash: each gives a trace/report or a one-line AttntraceError."""

import json

from hypothesis import HealthCheck, given, settings, strategies as st

import attntrace
from attntrace.grading.checker import render_report
from attntrace.model.errors import AttntraceError

ATOMS = st.sampled_from([0, 1, 2, -1, 0.5, "1/3", "x", "abc", "sqrt(2)", "", None, True, "causal", "exp(1000)", "1e400", "-inf", [1]])
MATRICES = st.lists(st.lists(ATOMS | st.integers(-3, 3), min_size=0, max_size=3), min_size=0, max_size=3)
TABLES = st.fixed_dictionaries({"shape": st.lists(st.integers(-1, 3), min_size=0, max_size=3)},
                               optional={"symbol": st.sampled_from(["v", "w^Q", "1x", "", "z^{(1)}"])})
VALUES = ATOMS | MATRICES | TABLES
KEYS = ["X", "X_kv", "W_Q", "W_K", "W_V", "b_Q", "W_O", "b_O", "Q", "K", "V", "scores", "weights", "Z", "num_heads",
        "mask", "scale", "d_k", "title", "tokens", "expand", "colour"]
BASE = {"X": [[1, 2], [3, 4]], "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [0, 1]], "W_V": [[1, 0], [0, 1]]}


def _one_line(exc: Exception) -> None:
    assert isinstance(exc, AttntraceError), f"{type(exc).__name__}: {exc}"
    assert "\n" not in str(exc) and str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(KEYS), VALUES, min_size=1, max_size=5), st.booleans(),
       st.sampled_from(["numeric", "exact", "symbolic", "shape"]))
def test_random_specs_trace_or_fail_in_one_line(spec, with_base, mode):
    if with_base:
        spec = {**BASE, **spec}
    try:
        trace = attntrace.run(spec, mode=mode)
        attntrace.render(trace, format="md")
        json.dumps(trace.to_dict())
    except Exception as exc:  # noqa: BLE001 - the property is about which exceptions
        _one_line(exc)


PROBLEM = attntrace.run({**BASE, "mask": "causal"})
STEP_KEYS = ["Q", "K", "V", "scores", "scaled", "masked", "weights", "Z", "concat", "weights@2", "foo", "title"]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(STEP_KEYS), VALUES, min_size=1, max_size=4))
def test_random_answers_check_or_fail_in_one_line(answer):
    try:
        report = attntrace.check(PROBLEM, answer)
        json.dumps(report.to_dict())
        render_report(report, format="text")
    except Exception as exc:  # noqa: BLE001
        _one_line(exc)
