"""The checker on traces with the new step kinds (RoPE, KV cache, ALiBi, online softmax,
backward, block steps, GQA): it never crashes, accepts the trace's own numbers, and finds a
wrong entry planted in a new-kind step in every format and language."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import attntrace
from attntrace.grading.diagnose import to_float
from attntrace.model.errors import BadInput
from attntrace.model.trace import STEP_IDS
from attntrace.teach.examples import example_path, list_examples


def _numeric_traces():
    out = []
    for name, _ in list_examples():
        try:
            out.append((name, attntrace.run(str(example_path(name)), mode="numeric")))
        except BadInput:  # a symbolic or shape-only example
            continue
    return out


TRACES = _numeric_traces()
NEW = [(n, t) for n, t in TRACES if any(s.id not in STEP_IDS for s in t.steps)]


def _entry(x: float):
    return "-inf" if np.isneginf(x) else round(float(x), 4)


def own_answer(trace) -> dict:
    return {s.key: [[_entry(x) for x in row] for row in to_float(s.value)] for s in trace.steps}


def test_enough_examples_are_checked():
    assert len(TRACES) >= 20 and len(NEW) >= 8, (len(TRACES), len(NEW))


@pytest.mark.parametrize("name,trace", TRACES, ids=[n for n, _ in TRACES])
def test_own_numbers_are_accepted(name, trace):
    report = attntrace.check(trace, own_answer(trace))
    assert report.ok, (name, report.first_wrong)
    assert {s.key for s in report.steps} == {s.key for s in trace.steps}


@pytest.mark.parametrize("name,trace", NEW, ids=[n for n, _ in NEW])
def test_a_planted_entry_in_a_new_step_is_found(name, trace):
    answer = own_answer(trace)
    step = next(s for s in trace.steps if s.id not in STEP_IDS and np.isfinite(to_float(s.value)[0, 0]))
    answer[step.key][0][0] = round(float(to_float(step.value)[0, 0]) + 0.5, 4)
    for lang in ("en", "zh"):
        report = attntrace.check(trace, answer, lang=lang)
        assert not report.ok and report.first_wrong == step.key, (name, report.first_wrong)
        diagnosis = report.first_wrong_step.diagnosis
        assert diagnosis is not None and diagnosis.code in ("arithmetic_slip", "unknown", "rounding", "transposed")
        for fmt in ("text", "md", "tex"):
            out = report.render(fmt)
            assert step.id in out.replace("\\_", "_"), (fmt, lang)
        data = json.loads(json.dumps(report.to_dict()))
        assert data["first_wrong"] == step.key
        message = data["steps"][[s["key"] for s in data["steps"]].index(step.key)]["diagnosis"]["message"]
        if lang == "zh":
            assert re.search(r"[\u4e00-\u9fff]", message)
            assert not re.search(r"\b(the|wrong|recompute|entry|entries|mistake)\b", message, re.I), message


def test_answer_names_the_trace_steps_for_an_id_it_lacks():
    name, trace = next((n, t) for n, t in TRACES if n == "causal-mask")
    with pytest.raises(BadInput) as e:
        attntrace.check(trace, {"Q_rope": [[1.0]]})
    assert "\n" not in str(e.value) and "Q_rope" in str(e.value) and "scores" in str(e.value)
    with pytest.raises(BadInput) as e:
        attntrace.check(trace, {"Qrope": [[1.0]]})
    assert "unknown step 'Qrope'" in str(e.value) and "masked" in str(e.value)


def test_a_per_head_new_step_is_given_in_a_head_table():
    name, trace = next((n, t) for n, t in TRACES if n == "alibi-causal")
    answer = own_answer(trace)
    per_head = {"head": {"1": {"biased": answer.pop("biased@1")}}}
    answer.update(per_head)
    assert attntrace.check(trace, answer).ok
