"""check() on a trace made with keep=: refused in one line, since carrying a student's numbers
forward needs every step (the steps keep= dropped cannot be recomputed from)."""
import pytest

import attntrace
from attntrace.model.errors import BadInput
from attntrace.tracer import trace_spec


def test_check_refuses_a_trace_that_dropped_steps():
    trace = trace_spec("sentence-4x6", keep=["weights", "Z"])
    with pytest.raises(BadInput) as err:
        attntrace.check(trace, {"Z": [[1, 0, 0, 0, 0, 0]] * 4})
    message = str(err.value)
    assert "\n" not in message
    assert "keep=" in message and "scores" in message


def test_check_accepts_a_trace_that_kept_every_step():
    full = trace_spec("sentence-4x6")
    kept = trace_spec("sentence-4x6", keep=[s.id for s in full.steps])
    report = attntrace.check(kept, {"Z": full.step("Z").value.tolist()})
    assert report.ok


def test_cli_check_of_a_full_trace_still_works(tmp_path):
    # the refusal is about dropped steps only: the spec path (traced in full) is unaffected
    report = attntrace.check("sentence-4x6", {"weights": trace_spec("sentence-4x6").step("weights").value.tolist()})
    assert report.ok
