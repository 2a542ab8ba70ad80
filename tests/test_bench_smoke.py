"""bench/bench.py runs at tiny sizes (no wall-time assertions), and numeric mode never imports SymPy."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("attntrace_bench", ROOT / "bench" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_numeric_bench_runs(bench):
    r = bench.bench_numeric(n=6, d=8, h=2, repeats=3)
    assert r["ratio"] > 0 and r["attntrace_s"] > 0 and r["numpy_s"] > 0


def test_numpy_reference_is_the_trace(bench):
    import numpy as np

    import attntrace

    p = bench.bert_layer(n=5, d=6, h=3, seed=1)
    np.testing.assert_allclose(attntrace.run(p).step("output").value, bench.numpy_layer(p), atol=1e-12)


def test_symbolic_bench_runs(bench):
    r = bench.bench_symbolic(n=2, d=2, big=3, repeats=1)
    assert r["speedup"] > 0 and r["big_ratio"] > 0 and r["naive_chars"] > 0
    if r["rendered"]:
        assert r["text_ratio"] > 0


def test_symbolic_fresh_process_bench_runs(bench):
    r = bench.bench_symbolic_fresh(n=2, d=2, repeats=1)
    assert r["speedup"] > 0 and r["first_speedup"] > 0 and r["attntrace_s"] > 0
    table = bench.markdown({"machine": bench.machine(), "symbolic_fresh": r})
    assert "fresh process" in table


def test_startup_bench_runs_and_report_is_a_table(bench, tmp_path):
    r = bench.bench_startup(repeats=1)
    assert r["ratio"] > 0 and r["first_ratio"] > 0 and r["no_pyc_ratio"] > 0
    results = {"machine": bench.machine(), "startup": r, "numeric": bench.bench_numeric(n=4, d=4, h=2, repeats=1)}
    table = bench.markdown(results)
    assert "| benchmark |" in table and "cores" in table
    json.dumps(results, default=str)


def test_numeric_mode_does_not_import_sympy(tmp_path):
    spec = tmp_path / "numeric.json"
    spec.write_text(json.dumps({"X": [[1, 0], [0, 1], [1, 1]], "W_Q": [[1, 0], [0, 1]], "W_K": [[0, 1], [1, 0]],
                                "W_V": [[1, 2], [3, 4]], "num_heads": 2, "W_O": [[1, 0], [0, 1]], "mask": "causal"}))
    code = (
        "import sys, attntrace, numpy as np\n"
        f"t = attntrace.run({str(spec)!r})\n"
        "attntrace.run({'X': np.eye(3), 'W_Q': np.eye(3), 'W_K': np.eye(3), 'W_V': np.eye(3), 'b_O': [[1, 2, 3]], 'W_O': np.eye(3)})\n"
        "t.to_dict()\n"
        "from attntrace.cli import main\n"
        f"assert main(['run', {str(spec)!r}, '--format', 'json']) == 0\n"
        "bad = sorted(m for m in sys.modules if m == 'sympy' or m.startswith('sympy.'))\n"
        "sys.stderr.write('SYMPY:' + ','.join(bad[:5]))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = proc.stderr.rsplit("SYMPY:", 1)[1]
    assert imported == "", f"numeric mode imported SymPy: {imported}"


def test_class_bench_runs_and_its_students_are_graded_as_planted(bench, tmp_path):
    """bench_class at a tiny size (no wall time asserted), and its NumPy students: each
    planted mistake is the one the checker names, the right answers are right."""
    import attntrace

    r = bench.bench_class(n_answers=24, jobs=2, repeats=1, memory=False)
    assert r["serial_per_s"] > 0 and r["parallel_per_s"] > 0
    assert "answers/s" in bench.markdown({"machine": bench.machine(), "class": r})
    spec = bench.write_class(tmp_path, len(bench.CLASS_VARIANTS))
    rep = attntrace.check_class(str(spec), tmp_path / "answers")
    got = {s.name.split()[0]: s for s in rep.students if s.readable}
    for variant in ("missing_scale", "column_softmax", "skipped_softmax", "transposed_scores", "head_order"):
        assert got[variant].codes == (variant,), (variant, got[variant].codes)
    assert got["slip"].codes == ("arithmetic_slip",)
    assert all(got[v].ok and got[v].score == 1 for v in ("right-2", "right-3", "right-4", "extra_key"))
    assert got["extra_key"].ignored == ("date",) and got["partial"].ok and got["partial"].score < 1
    assert len(rep.unreadable) == 1


def test_html_bench_runs(bench):
    r = bench.bench_html(repeats=1)
    assert 10_000 < r["bytes"] < r["goal_bytes"]
    assert r["render_s"] is None or r["render_s"] > 0


def test_llama_bench_runs_and_its_numpy_reference_is_the_trace(bench):
    """The Llama-shaped layer at a tiny size: bench_llama asserts attntrace and its NumPy code
    agree (1e-8), and reports ratios and memory; no time is asserted."""
    import numpy as np

    import attntrace

    p = bench.llama_layer(d=64, heads=4, kv_heads=2, d_ff=96, n=5)
    np.testing.assert_allclose(attntrace.run(p).output, bench.numpy_llama(p), atol=1e-10)
    r = bench.bench_llama({"d": 64, "heads": 4, "kv_heads": 2, "d_ff": 96, "n": 5}, repeats=1)
    assert r["ratio"] > 0 and r["memory_all_ratio"] > 0 and r["memory_out_ratio"] > 0 and r["kept_id"] == "residual2"
    assert r["held_out_bytes"] < r["held_all_bytes"]
    assert "Llama-3-8B-shaped" in bench.markdown({"machine": bench.machine(), "llama": r})
