"""Issue 16, input side: hostile inputs written as the attacker wrote them.

Each one must end, fast and in bounded memory, with exit status 2 and ONE line on standard
error that names the limit (or the step that overflowed), never "internal error" and never
a NumPy warning. Memory-heavy cases run under RLIMIT_AS = 2 GB; every case has a generous
subprocess timeout (no wall-time assertions otherwise).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import attntrace
from attntrace.inputs import limits
from attntrace.model.errors import BadInput

ROOT = Path(__file__).resolve().parent.parent
TWO_GB = 2 * 1024**3


def _limit_memory():  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_AS, (TWO_GB, TWO_GB))


def cli(*args, env_limits: str | None = None, timeout: float = 60):
    env = {k: v for k, v in os.environ.items() if k != limits.ENV}
    if env_limits is not None:
        env[limits.ENV] = env_limits
    return subprocess.run([sys.executable, "-m", "attntrace", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env, preexec_fn=_limit_memory)


def refused(proc, *words):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "internal error" not in proc.stderr and "Warning" not in proc.stderr
    assert lines[0].startswith("attntrace: error: ")
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# -- integers with more than 4300 digits ---------------------------------------------------
def test_json_integer_with_5000_digits(tmp_path):
    p = write(tmp_path, "big.json", '{"Q":[[1,2]],"K":[[1,2]],"V":[[%s,1]]}' % ("9" * 5000))
    refused(cli("run", p), "digits", limits.ENV)


def test_toml_integer_with_5000_digits(tmp_path):
    p = write(tmp_path, "big.toml", "Q = [[1, 2]]\nK = [[1, 2]]\nV = [[%s, 1]]\n" % ("9" * 5000))
    refused(cli("run", p), "digits", "line 3")


def test_toml_integer_with_2000_digits_in_exact_mode(tmp_path):
    p = write(tmp_path, "big.toml", 'mode = "exact"\nQ = [[1, 2]]\nK = [[1, 2]]\nV = [[%s, 1]]\n' % ("7" * 2000))
    refused(cli("run", p), "digits")


def test_answer_integer_with_5000_digits(tmp_path):
    spec = write(tmp_path, "p.toml", "scores = [[1, 2], [3, 4]]\nscale = false\n")
    answer = write(tmp_path, "a.toml", "scores = [[%s, 2], [3, 4]]\n" % ("9" * 5000))
    refused(cli("check", spec, answer), "digits")


@pytest.mark.parametrize("entry", ["(10^100)^100", "(10^100)^10*(10^100)^10*(10^100)^10*(10^100)^10*(10^100)^10",
                                   "10^100000", "(10^100)^9*(10^100)^9/7"])
def test_huge_powers_in_exact_mode(tmp_path, entry):
    p = write(tmp_path, "pow.toml", f'mode = "exact"\nQ = [["{entry}", 1]]\nK = [[1, 2]]\nV = [[1], [2]]\n')
    refused(cli("run", p))


def test_huge_python_integers_through_the_api():
    with pytest.raises(BadInput, match="digits"):
        attntrace.run({"mode": "exact", "Q": [[10**2000, 1]], "K": [[1, 2]]})
    with pytest.raises(BadInput, match="too large"):
        attntrace.check({"scores": [[1.0]], "scale": False}, {"scores": [[10**400]]})


# -- nesting -------------------------------------------------------------------------------------
def test_json_arrays_nested_100000_deep(tmp_path):
    p = write(tmp_path, "deep.json", '{"Q":' + "[" * 100_000 + "]" * 100_000 + "}")
    refused(cli("run", p), "nested", "depth")


def test_toml_arrays_nested_10000_deep(tmp_path):
    p = write(tmp_path, "deep.toml", "Q = " + "[" * 10_000 + "]" * 10_000 + "\n")
    refused(cli("run", p), "nested", "depth")


def test_toml_dotted_key_with_100000_parts(tmp_path):
    p = write(tmp_path, "dotted.toml", "a" + ".a" * 100_000 + " = 1\n")
    refused(cli("run", p), "dotted key", "depth")


def test_brackets_inside_strings_do_not_count(tmp_path):
    title = "[" * 100 + "{" * 100
    p = write(tmp_path, "s.toml", f'title = "{title}" # {"[" * 300}\nscores = [[1, 2]]\nscale = false\n')
    proc = cli("run", p, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    p = write(tmp_path, "s.json", json.dumps({"title": "[" * 100 + '"\\' + "[" * 100, "scores": [[1, 2]], "scale": False}))
    assert cli("run", p, "--format", "json").returncode == 0


def test_depth_limit_can_be_raised_and_recursion_never_escapes(tmp_path):
    p = write(tmp_path, "deep.json", '{"Q":' + "[" * 100 + "1" + "]" * 100 + "}")
    refused(cli("run", p), "depth")
    refused(cli("run", p, env_limits="depth=200"), "2-D")  # read, then refused as a matrix
    deep = write(tmp_path, "deeper.json", '{"Q":' + "[" * 100_000 + "]" * 100_000 + "}")
    refused(cli("run", deep, env_limits="depth=1000000"), "depth")  # RecursionError caught


# -- file size ----------------------------------------------------------------------------------
def test_dev_zero_is_not_read_without_limit():
    refused(cli("run", "/dev/zero"), "file_mb", "larger than 20 MB")


def test_dev_zero_as_answer(tmp_path):
    spec = write(tmp_path, "p.toml", "scores = [[1, 2]]\nscale = false\n")
    refused(cli("check", spec, "/dev/zero"), "file_mb")


def test_file_size_limit_is_configurable(tmp_path):
    p = write(tmp_path, "p.toml", "scores = [[1, 2]]\nscale = false\n" + "# padding\n" * 120_000)
    refused(cli("run", p, env_limits="file_mb=1"), "file_mb = 1")
    assert cli("run", p, "--format", "json").returncode == 0


def test_bad_limits_variable_is_one_line(tmp_path):
    refused(cli("run", "sentence-4x6", env_limits="heads"), limits.ENV)
    refused(cli("run", "sentence-4x6", env_limits="heads=-3"), limits.ENV)
    refused(cli("run", "sentence-4x6", env_limits="digits=100000"), "4300")


# -- heads -------------------------------------------------------------------------------------
def test_num_heads_ten_to_the_eighteen(tmp_path):
    p = write(tmp_path, "h.json", '{"Q":[[1,2,3,4]],"K":[[1,2,3,4]],"num_heads":1000000000000000000}')
    refused(cli("run", p, timeout=30), "num_heads", "does not divide")


def test_num_heads_ten_to_the_nine(tmp_path):
    p = write(tmp_path, "h.json", '{"Q":[[1,2,3,4]],"K":[[1,2,3,4]],"num_heads":1000000000}')
    refused(cli("run", p, timeout=30), "num_heads")


def test_shape_mode_width_and_heads_of_a_million(tmp_path):
    p = write(tmp_path, "s.toml", 'mode = "shape"\nnum_heads = 1000000\nX = { shape = [4, 1000000] }\n'
                                  'W_Q = { shape = [1000000, 1000000] }\nW_K = { shape = [1000000, 1000000] }\n'
                                  'W_V = { shape = [1000000, 1000000] }\n')
    refused(cli("run", p, timeout=30), "heads", limits.ENV)


def test_twenty_thousand_tiny_heads(tmp_path):
    h = 20_000
    p = write(tmp_path, "h.json", json.dumps({"Q": [[1] * h], "K": [[1] * h], "V": [[1] * h], "num_heads": h}))
    refused(cli("run", p, timeout=30), "heads")


def test_heads_limit_can_be_raised():
    spec = {"Q": [[1.0] * 8], "K": [[1.0] * 8], "V": [[1.0] * 8], "num_heads": 8}
    os.environ[limits.ENV] = "heads=4"
    try:
        with pytest.raises(BadInput, match="heads"):
            attntrace.run(spec)
        os.environ[limits.ENV] = "heads=8"
        assert attntrace.run(spec).num_heads == 8
    finally:
        del os.environ[limits.ENV]


# -- steps indexed by (id, head) ---------------------------------------------------------------
def test_trace_index_is_right_and_the_trace_stays_immutable():
    h = 300
    tr = attntrace.run({"Q": [[1.0] * h, [2.0] * h], "K": [[1.0] * h, [0.0] * h], "V": [[1.0] * h, [3.0] * h], "num_heads": h})
    assert len(tr.steps) == 4 * h + 1  # scores, scaled, weights, Z per head; concat
    for head in (1, 150, 300):
        s = tr.step("weights", head)
        assert (s.id, s.head) == ("weights", head) and tr.has("Z", head) and not tr.has("Z", None)
        assert tr.operand("Q", head).head == head
    assert tr.step("concat").id == "concat"
    with pytest.raises(KeyError, match="no step 'output'"):
        tr.step("output")
    with pytest.raises(KeyError):
        tr.step("weights", 301)
    with pytest.raises(KeyError):
        tr.operand("X")
    assert not tr.has("weights", [1])  # unhashable: just absent
    with pytest.raises(dataclasses.FrozenInstanceError):
        tr.steps = ()
    short = dataclasses.replace(tr, steps=tr.steps[:3])
    assert short.has("scores", 1) and not short.has("weights", 300) and short == short
    assert dataclasses.replace(tr) == tr


# -- NaN and inf from finite inputs --------------------------------------------------------------
def test_scores_near_the_float_limit_with_scale_one_half(tmp_path):
    p = write(tmp_path, "s.json", '{"scores": [[1e308, 1e308], [1, 2]], "scale": 0.5}')
    line = refused(cli("run", p), "step scaled", "overflows float64", "(1, 1)")
    assert "nan" not in line.lower()


def test_scale_1e_minus_320(tmp_path):
    p = write(tmp_path, "s.toml", "scores = [[1, 2], [3, 4]]\nscale = 1e-320\n")
    refused(cli("run", p), "step scaled", "overflows float64")


def test_inputs_of_1e200_overflow_q(tmp_path):
    big = [[1e200, 1e200], [1e200, 1e200]]
    p = write(tmp_path, "x.json", json.dumps({"X": [[1e200, 1e200]], "W_Q": big, "W_K": big, "W_V": big}))
    refused(cli("run", p), "step Q: entry (1, 1) overflows float64", "scale the inputs down")


def test_row_spanning_the_float_range(tmp_path):
    p = write(tmp_path, "x.json", '{"scores": [[1e308, -1e308], [1, 2]], "scale": false}')
    refused(cli("run", p), "step weights", "overflows")


def test_overflow_in_check_is_one_line(tmp_path):
    spec = write(tmp_path, "s.json", '{"scores": [[1e308, 1e308], [1, 2]], "scale": 0.5}')
    answer = write(tmp_path, "a.toml", "scores = [[1, 2], [3, 4]]\n")
    refused(cli("check", spec, answer), "overflows")


def test_large_finite_inputs_still_work_without_warnings(tmp_path):
    p = write(tmp_path, "s.json", '{"scores": [[1e300, 1e300], [1, 2]], "scale": 2, "V": [[1e308], [1.7e308]]}')
    proc = cli("run", p, "--format", "json")
    assert proc.returncode == 0 and proc.stderr == ""
    assert "NaN" not in proc.stdout and "Infinity" not in proc.stdout


# -- work that would take minutes ----------------------------------------------------------------
def _symbolic_spec(n, d, dk, expand):
    return (f'mode = "symbolic"\nexpand = "{expand}"\nX = {{ symbol = "x", shape = [{n}, {d}] }}\n'
            f'W_Q = {{ symbol = "a", shape = [{d}, {dk}] }}\nW_K = {{ symbol = "b", shape = [{d}, {dk}] }}\n'
            f'W_V = {{ symbol = "c", shape = [{d}, {dk}] }}\n')


def test_full_expansion_10x10(tmp_path):
    p = write(tmp_path, "f.toml", _symbolic_spec(10, 10, 10, "full"))
    refused(cli("run", p, "--format", "md", timeout=30), "expanded_cost", "named")


def test_full_expansion_4x12x12(tmp_path):
    p = write(tmp_path, "f.toml", _symbolic_spec(4, 12, 12, "full"))
    refused(cli("run", p, "--format", "md", timeout=30), "expanded_cost")


def test_exact_10x10_sqrt_entries(tmp_path):
    def mat(off):
        return json.dumps([[f"sqrt({(i * 10 + j + off) % 97 + 2})" for j in range(10)] for i in range(10)])

    p = write(tmp_path, "e.toml", f'mode = "exact"\nX = {mat(0)}\nW_Q = {mat(1)}\nW_K = {mat(2)}\nW_V = {mat(3)}\n')
    refused(cli("run", p, "--format", "md", timeout=30), "exact_cost", "numeric")


def test_exact_4x4_sqrt_entries_refused_but_integers_accepted():
    def spec(kind, n):
        e = (lambda i, j: f"sqrt({i + j + 2})") if kind == "sqrt" else (lambda i, j: (i * 3 + j) % 5 - 2)
        m = [[e(i, j) for j in range(n)] for i in range(n)]
        return {"mode": "exact", "X": m, "W_Q": m, "W_K": m, "W_V": m}

    with pytest.raises(BadInput, match="exact_cost"):
        attntrace.run(spec("sqrt", 4))
    assert attntrace.run(spec("int", 4)).mode == "exact"  # the same size with integers is cheap


def test_symbolic_named_40x40_refused(tmp_path):
    p = write(tmp_path, "s.toml", _symbolic_spec(40, 40, 40, "named"))
    refused(cli("run", p, timeout=30), "symbolic_cost")


def test_numeric_scores_too_large_refused_before_allocation():
    import numpy as np

    x = np.zeros((20_000, 4))
    w = np.eye(4)
    with pytest.raises(BadInput, match="numeric_entries"):
        attntrace.run({"X": x, "W_Q": w, "W_K": w, "W_V": w})


def test_exact_entries_limit():
    with pytest.raises(BadInput, match="exact_entries"):
        attntrace.run({"mode": "symbolic", "weights": {"symbol": "a", "shape": [200, 200]}, "V": {"symbol": "v", "shape": [200, 1]}})


# -- other numbers and counts in a spec ------------------------------------------------------------
def test_d_k_with_900_digits(tmp_path):
    p = write(tmp_path, "d.toml", "scores = [[1, 2]]\nd_k = 1" + "0" * 900 + "\n")
    refused(cli("run", p, "--format", "md"), "d_k", "too large")


def test_num_heads_with_900_digits_is_shown_short(tmp_path):
    p = write(tmp_path, "h.toml", "Q = [[1, 2]]\nK = [[1, 2]]\nnum_heads = 1" + "0" * 900 + "\n")
    line = refused(cli("run", p), "num_heads", "901 digits")
    assert len(line) < 200


def test_tokens_counted_against_rows(tmp_path):
    p = write(tmp_path, "t.toml", 'scores = [[1, 2], [3, 4]]\nscale = false\ntokens = ["a", "b", "c"]\n')
    refused(cli("run", p), "tokens lists 3 labels", "2 queries")
    p = write(tmp_path, "k.toml", 'scores = [[1, 2, 3]]\nscale = false\ntokens = ["a"]\nkv_tokens = ["x", "y"]\n')
    refused(cli("run", p), "kv_tokens lists 2 labels", "3 keys")
    p = write(tmp_path, "ok.toml", 'scores = [[1, 2, 3]]\nscale = false\ntokens = ["a"]\nkv_tokens = ["x", "y", "z"]\n')
    assert cli("run", p).returncode == 0


def test_file_name_with_a_newline_is_one_line(tmp_path):
    refused(cli("run", str(tmp_path / "no\nsuch.toml")), "cannot read", "\\n")
