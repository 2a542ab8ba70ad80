"""Every bad input: a one-line error naming what is wrong, exit status 2, no traceback,
and nothing executed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attntrace.cli import main

W = [[1, 0], [0, 1]]


def run_cli(tmp_path, text, *args, suffix=".toml"):
    spec = tmp_path / f"spec{suffix}"
    spec.write_text(text, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "attntrace", "run", str(spec), *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    return proc


BAD = [
    ("ragged rows", {"X": [[1, 2], [3]], "W_Q": W, "W_K": W, "W_V": W}, "ragged"),
    ("empty matrix", {"scores": [], "scale": False}, "empty"),
    ("text in numeric mode", {"scores": [["x", 1]], "scale": False}, "numeric mode needs numbers"),
    ("unknown name", {"scores": [["abc", 1]], "scale": False}, 'unknown name "abc"'),
    ("non-conforming shapes", {"X": [[1, 2, 3]], "W_Q": W, "W_K": W, "W_V": W}, "(1, 3) by W_Q (2, 2)"),
    ("fully masked row", {"scores": [[1, 2], [3, 4]], "scale": False, "mask": [[1, 0], [0, 0]]}, "row 2"),
    ("unknown key", {"scores": [[1]], "colour": "red"}, "unknown key 'colour'"),
    ("unknown mode", {"scores": [[1]], "mode": "fuzzy"}, "unknown mode"),
    ("scores scaled without d_k", {"scores": [[1, 2]]}, "d_k"),
    ("code in an expression", {"scores": [["__import__('os').system('touch PWNED')", 1]], "scale": False}, "PWNED"),
    ("symbolic too large", {"X": {"shape": [100, 100]}, "W_Q": {"shape": [100, 100]}, "W_K": {"shape": [100, 100]},
                            "W_V": {"shape": [100, 100]}, "mode": "symbolic"}, "--mode shape"),
    ("wrong mask shape", {"scores": [[1, 2]], "scale": False, "mask": [[1, 1], [1, 1]]}, "mask has shape (2, 2)"),
    ("symbol table in numeric mode", {"scores": {"shape": [2, 2]}, "mode": "numeric", "scale": False}, "symbol"),
]


@pytest.mark.parametrize("name,spec,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_spec_is_one_line_exit_2(tmp_path, name, spec, needle):
    proc = run_cli(tmp_path, json.dumps(spec), suffix=".json")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attntrace: error:"), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert needle.lower() in lines[0].lower()
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_inputs_are_refused(tmp_path, value):
    proc = run_cli(tmp_path, json.dumps({"scores": [[1.0, value]], "scale": False}).replace(f'"{value}"', {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[value]), suffix=".json")
    assert proc.returncode == 2 and "finite" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    toml_proc = run_cli(tmp_path, f"scores = [[1.0, {value}]]\nscale = false\n")
    assert toml_proc.returncode == 2 and "finite" in toml_proc.stderr


def test_toml_syntax_error(tmp_path):
    proc = run_cli(tmp_path, "scores = [[1, 2]\n")
    assert proc.returncode == 2 and "TOML syntax error" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_json_syntax_error(tmp_path):
    proc = run_cli(tmp_path, '{"scores": [[1, 2]],}', suffix=".json")
    assert proc.returncode == 2 and "JSON syntax error" in proc.stderr and "line 1" in proc.stderr


def test_missing_file_and_bad_option(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.toml")]) == 2
    assert main(["run", "x", "--mode", "fuzzy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("attntrace: error:") for line in err)


def test_json_output_round_trips(tmp_path):
    proc = run_cli(tmp_path, 'scores = [[0.8, 0.2], [0.3, 0.7]]\nscale = false\n', "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["mode"] == "numeric" and [s["id"] for s in data["steps"]] == ["weights"]
    assert round(data["steps"][0]["value"][0][0], 4) == 0.6457


def test_json_exact_entries_parse_back(tmp_path):
    from attntrace.inputs.expr import parse_expr

    proc = run_cli(tmp_path, 'mode = "exact"\nscores = [["4/5", "1/5"]]\nd_k = 4\nmask = [[1, 0]]\n', "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    steps = {s["id"]: s for s in data["steps"]}
    assert steps["scaled"]["value"] == [["2/5", "1/10"]]
    assert steps["masked"]["approx"] == [[0.4, "-inf"]]
    assert steps["weights"]["value"][0][1] == "0"
    for row in steps["weights"]["value"]:
        for entry in row:
            parse_expr(entry)


def test_unknown_example_name_is_one_line_exit_2(capsys):
    assert main(["run", "no-such-example"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["attntrace: error: no example named 'no-such-example'; run `attntrace examples` for the list"]
