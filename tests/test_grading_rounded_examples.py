"""The right answer of every built-in numeric example, every step written to 2, 3 or 4
decimals, is never marked wrong: the checker's tolerance reads each number by the decimals it
is written with, through every step kind the examples use (RoPE, ALiBi, the KV cache, GQA,
windows, the online softmax, the backward pass, whole blocks). What a student computes from
their own rounded values is tested kind by kind in test_grading_carry_blocks.py and the
grading tests of each kind."""

from __future__ import annotations

import numpy as np
import pytest

import attntrace
from attntrace.teach.examples import list_examples


def _numeric_examples():
    out = []
    for name, _ in list_examples():
        try:
            trace = attntrace.run(name, mode="numeric")
        except attntrace.BadInput:  # a symbol table (the symbolic and shape examples)
            continue
        out.append(pytest.param(trace, id=name))
    return out


@pytest.mark.parametrize("trace", _numeric_examples())
@pytest.mark.parametrize("decimals", [2, 3, 4])
def test_rounded_right_answer_is_never_wrong(trace, decimals):
    answer = {s.key: np.round(np.asarray(s.value, dtype=float), decimals).tolist() for s in trace.steps}
    report = attntrace.check(trace, answer)
    assert [s.key for s in report.steps if s.status == "wrong"] == []
    assert len(report.steps) == len({s.key for s in trace.steps})  # an online step id: its last block


def test_the_examples_cover_many_kinds():
    ids = {s.id for p in _numeric_examples() for s in p.values[0].steps}
    assert {"Q_rope", "biased", "K_cache", "online_max", "dX", "norm1", "ffn_act", "masked"} <= ids
