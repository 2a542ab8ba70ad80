"""Classes of any size and hostile class folders (issue 20 "Class folders", issue 24 items 2-3).

- a folder is read as regular files only: a FIFO is skipped (never opened), a symlink out of
  the folder is skipped, both with a line in the report;
- two answers naming one student are both shown with their files and flagged;
- weights whose sum overflows are refused in one line (no inf/nan, no invalid JSON);
- keys that are not steps are ignored with a line (check and class), near misses are errors;
- --jobs N gives exactly the results of --jobs 1; csv and json stream out as graded;
- the bulk paths (answers read in bulk, entries judged as arrays, a planted mistake recomputing
  only what it changes) agree with the per-entry / full-recomputation code they replace.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import attntrace
from attntrace.cli import main
from attntrace.grading.answer import AnswerMatrix, Policy, load_answer, parse_entry
from attntrace.grading.diagnose import World
from attntrace.model.errors import BadInput
from attntrace.teach.classcheck import _progress, check_class
from test_classcheck import P, SPEC, toml_answer
from test_grading_sweep import simulate

ROOT = Path(__file__).resolve().parent.parent


def _spec(tmp_path: Path) -> Path:
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(SPEC), encoding="utf-8")
    return path


def _folder(tmp_path: Path, answers: dict[str, str]) -> Path:
    d = tmp_path / "answers"
    d.mkdir()
    for name, text in answers.items():
        (d / name).write_text(text, encoding="utf-8")
    return d


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "attntrace", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


# -- folders ------------------------------------------------------------------------------------
def test_fifo_in_the_folder_is_skipped_not_read(tmp_path):
    spec = _spec(tmp_path)
    d = _folder(tmp_path, {"amy.toml": toml_answer(simulate(P), "Amy")})
    os.mkfifo(d / "zed.toml")  # opening it for reading would block forever
    proc = _run("check", str(spec), str(d), "--summary-only", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Skipped folder entries:" in proc.stdout and "zed.toml: not a regular file" in proc.stdout
    proc = _run("check", str(spec), str(d), "--format", "csv", timeout=120)
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [(r["file"], r["status"]) for r in rows] == [("amy.toml", "ok"), ("zed.toml", "skipped")]
    rep = check_class(SPEC, d)
    assert [s.source for s in rep.students] == ["amy.toml"] and rep.skipped[0][0] == "zed.toml"
    assert rep.to_dict()["skipped"][0]["file"] == "zed.toml"


def test_symlink_out_of_the_folder_is_not_graded(tmp_path):
    outside = tmp_path / "elsewhere.toml"
    outside.write_text(toml_answer(simulate(P), "Mallory"), encoding="utf-8")
    d = _folder(tmp_path, {"amy.toml": toml_answer(simulate(P), "Amy")})
    (d / "mallory.toml").symlink_to(outside)
    (d / "inside.toml").symlink_to(d / "amy.toml")  # a link inside the folder is an answer
    rep = check_class(SPEC, d)
    assert [s.source for s in rep.students] == ["amy.toml", "inside.toml"]
    assert rep.skipped == (("mallory.toml", "a symbolic link to a file outside the folder: not graded"),)
    text = rep.render("text")
    assert "mallory.toml: a symbolic link to a file outside the folder" in text and "Mallory" not in text


def test_duplicate_students_both_shown_with_their_files(tmp_path, capsys):
    d = _folder(tmp_path, {"a.toml": toml_answer(simulate(P), "Alice"),
                           "b.toml": toml_answer(simulate(P, plant="missing_scale", plant_head=1), "Alice"),
                           "c.toml": toml_answer(simulate(P), "Carol")})
    rep = check_class(SPEC, d)
    assert [(s.source, s.duplicate) for s in rep.students] == [("a.toml", True), ("b.toml", True), ("c.toml", False)]
    text = rep.render("text")
    assert "Alice (a.toml, duplicate)" in text and "Alice (b.toml, duplicate)" in text
    assert "Answers naming the same student:\n  Alice: a.toml, b.toml" in text
    md = rep.render("md", lang="zh")
    assert "Alice (a.toml, 重复)" in md and "Alice (b.toml, 重复)" in md
    assert rep.to_dict()["duplicates"] == [{"student": "Alice", "files": ["a.toml", "b.toml"]}]
    spec = _spec(tmp_path)
    assert main(["check", str(spec), str(d), "--format", "json", "--jobs", "1"]) == 1
    assert json.loads(capsys.readouterr().out)["duplicates"] == [{"student": "Alice", "files": ["a.toml", "b.toml"]}]
    assert main(["check", str(spec), str(d), "--format", "csv", "--jobs", "1"]) == 1
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["file"] for r in rows] == ["a.toml", "b.toml", "c.toml"] and "duplicate" in rows[1]["reason"]


@pytest.mark.parametrize("weights", ["Q=1e308,K=1e308", "weights=1e308,Z=1e308", "Q=inf", "Q=nan"])
def test_weights_that_overflow_are_one_line_errors(tmp_path, capsys, weights):
    spec = _spec(tmp_path)
    d = _folder(tmp_path, {"a.toml": toml_answer(simulate(P), "A")})
    for fmt in ("json", "text", "csv"):
        assert main(["check", str(spec), str(d), "--weights", weights, "--format", fmt]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1 and "weight" in captured.err
    with pytest.raises(BadInput, match="finite|>= 0"):
        check_class(SPEC, d, weights={"Q": 1e308, "K": 1e308})
    big = check_class(SPEC, d, weights={"Q": 1e300})  # large but finite: a valid summary
    json.loads(json.dumps(big.to_dict(), allow_nan=False))


# -- tolerant answer files ----------------------------------------------------------------------
def test_keys_that_are_not_steps_are_ignored_with_a_line(tmp_path, capsys):
    spec = _spec(tmp_path)
    answer = tmp_path / "a.toml"
    answer.write_text('date = "2026-11-30"\n' + toml_answer(simulate(P), "Ann"), encoding="utf-8")
    rep = attntrace.check(SPEC, answer)
    assert rep.ok and rep.ignored == ("date",)
    assert main(["check", str(spec), str(answer)]) == 0
    assert "Ignored key 'date': not a step, so not checked." in capsys.readouterr().out
    assert main(["check", str(spec), str(answer), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["ignored_keys"] == ["date"]
    assert "已忽略“date”" in rep.render("text", lang="zh")
    for fmt in ("md", "tex"):
        assert "Ignored key" in rep.render(fmt)
    # a near miss is still an error, with the step it resembles
    for wrong, meant in (("scors", "scores"), ("weight", "weights")):
        bad = tmp_path / f"{wrong}.toml"
        bad.write_text(f"{wrong} = [[1, 2]]\n" + toml_answer(simulate(P)), encoding="utf-8")
        with pytest.raises(BadInput, match=f"did you mean '{meant}'"):
            attntrace.check(SPEC, bad)
        assert main(["check", str(spec), str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"did you mean '{meant}'" in err


def test_class_counts_ignored_keys(tmp_path):
    d = _folder(tmp_path, {"a.toml": 'date = "x"\nnotes = "y"\n' + toml_answer(simulate(P), "A"),
                           "b.toml": 'date = "z"\n' + toml_answer(simulate(P), "B"),
                           "c.toml": toml_answer(simulate(P), "C"),
                           "d.toml": "scors = [[1]]\n" + toml_answer(simulate(P), "D")})
    rep = check_class(SPEC, d)
    assert [s.ok for s in rep.students] == [True, True, True, False]
    assert "did you mean 'scores'" in rep.students[3].reason
    counts = rep.to_dict()["counts"]
    assert counts["ignored_keys"] == 3 and counts["answers_with_ignored_keys"] == 2
    text = rep.render("text")
    assert "2 answers had keys that are not steps, so they were not checked: 'date' (2 answers), 'notes' (1 answer)." in text
    assert rep.students[0].to_dict()["ignored_keys"] == ["date", "notes"]


# -- parallel and streamed ----------------------------------------------------------------------
def _mixed_class(tmp_path: Path) -> Path:
    files = {}
    codes = ["missing_scale", "column_softmax", "transposed_scores", "skipped_softmax", "head_order", None]
    for i in range(36):
        code = codes[i % len(codes)]
        files[f"s{i:02d}.toml"] = toml_answer(simulate(P, plant=code, plant_head=1 + i % 2, decimals=2 + i % 3), f"S{i}")
    files["bad.toml"] = "weights@1 = [[0.5\n"
    files["extra.toml"] = 'date = "today"\n' + toml_answer(simulate(P), "Extra")
    return _folder(tmp_path, files)


def test_parallel_grading_gives_exactly_the_serial_results(tmp_path, capsys):
    d = _mixed_class(tmp_path)
    serial, parallel = check_class(SPEC, d, jobs=1), check_class(SPEC, d, jobs=2)
    assert serial.to_dict() == parallel.to_dict() and serial.to_csv() == parallel.to_csv()
    assert serial.render("text") == parallel.render("text")
    spec = _spec(tmp_path)
    outputs = {}
    for jobs in ("1", "2", "3"):
        for fmt in ("csv", "json", "text", "md"):
            code = main(["check", str(spec), str(d), "--format", fmt, "--jobs", jobs])
            outputs[jobs, fmt] = (code, capsys.readouterr().out)
    for fmt in ("csv", "json", "text", "md"):
        assert outputs["1", fmt] == outputs["2", fmt] == outputs["3", fmt], fmt
    # the streamed outputs are the class report's
    assert outputs["1", "csv"][1] == serial.to_csv()
    assert json.loads(outputs["2", "json"][1]) == json.loads(json.dumps(serial.to_dict()))
    assert outputs["2", "text"][1] == serial.render("text", summary_only=False)
    assert main(["check", str(spec), str(d), "--jobs", "0"]) == 2


def test_progress_only_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty, pipe = Tty(), io.StringIO()
    assert list(_progress(iter(range(60)), 60, tty)) == list(range(60))
    assert "graded 60 of 60 answers" in tty.getvalue()
    list(_progress(iter(range(60)), 60, pipe))
    assert pipe.getvalue() == ""


# -- the bulk paths agree with the per-entry code -------------------------------------------------
def _random_texts(rng: random.Random, n: int) -> list:
    out = []
    for _ in range(n):
        kind = rng.randrange(8)
        x = rng.uniform(-50, 50)
        if kind == 0:
            out.append(str(rng.randint(-99, 99)))
        elif kind == 1:
            out.append(rng.randint(-10 ** 6, 10 ** 6))
        elif kind == 2:
            out.append(f"{x:.{rng.randrange(0, 7)}e}")
        elif kind == 3:
            out.append("-inf")
        elif kind == 4:
            out.append(rng.choice(["1/3", "sqrt(2)/2", " 0.25 ", "+.5", "5.", "-0.000", "1E-3"]))
        else:
            out.append(f"{x:.{rng.randrange(0, 9)}f}")
    return out


def test_bulk_reading_and_judging_match_the_entry_by_entry_code():
    rng = random.Random(7)
    for _ in range(20):
        rows, cols = rng.randint(1, 6), rng.randint(1, 6)
        raw = [_random_texts(rng, cols) for _ in range(rows)]
        a = load_answer({"scores": raw})[("scores", None)]
        one = [[parse_entry(x, "x") for x in row] for row in raw]
        assert [[(e.value, e.text, e.kind, e.decimals) for e in row] for row in a.entries] == \
            [[(e.value, e.text, e.kind, e.decimals) for e in row] for row in one]
        truth = np.array([[e.value for e in row] for row in one]) + np.array(
            [[rng.choice([0.0, 1e-3, 4e-5, 0.5, -2e-9]) for _ in range(cols)] for _ in range(rows)])
        truth[truth == -np.inf] = rng.choice([-np.inf, 0.0])
        lo, hi = truth - rng.choice([0, 1e-4]), truth + rng.choice([0, 1e-4])
        for policy in (Policy(), Policy(decimals=2), Policy(atol=1e-3, rtol=1e-2)):
            expected = [(i, j) for i, row in enumerate(one) for j, e in enumerate(row)
                        if not e.within(float(lo[i, j]), float(hi[i, j]), policy)]
            assert [(i, j) for i, j, _ in a.misfits(lo, hi, policy)] == expected
            assert a.fits(lo, hi, policy) == (not expected)


def test_a_planted_mistake_recomputes_only_what_it_changes():
    """World.recompute with base (the student's world) equals the full recomputation, for
    every catalogued mistake and several students (right, wrong, partial)."""
    from attntrace.grading.checker import _written, split_full_width

    trace = attntrace.run(SPEC)
    world = World(trace)
    steps = tuple(dict.fromkeys(s.id for s in trace.steps))
    students = [simulate(P), simulate(P, plant="missing_scale", plant_head=2, decimals=2),
                {k: v for k, v in simulate(P, plant="transposed_scores").items() if k.startswith(("weights", "Z", "output"))},
                simulate(P, plant="head_order", decimals=3)]
    for answer in students:
        given = _written(world, split_full_width(trace, load_answer(answer, steps)))
        base = world.recompute(given)
        for mutation in world.mutations:
            full, fast = world.recompute(given, mutation), world.recompute(given, mutation, base)
            assert full.keys() == fast.keys()
            for key in full:
                if full[key] is None:
                    assert fast[key] is None, (mutation.code, key)
                else:
                    np.testing.assert_array_equal(full[key].lo, fast[key].lo, err_msg=f"{mutation.code} {key}")
                    np.testing.assert_array_equal(full[key].hi, fast[key].hi, err_msg=f"{mutation.code} {key}")


@pytest.mark.parametrize("example", ["encoder-block-post-ln", "llama-block-tiny", "backward-2x2", "rope-4-tokens-half",
                                     "gqa-4-query-2-kv", "kv-cache-decoding", "online-softmax-4-keys", "alibi-causal"])
def test_incremental_mutated_worlds_in_every_kind(example):
    """The same equality over the built-in examples of the newer kinds (blocks, backward, RoPE,
    GQA, the cache, the online softmax, ALiBi), for students who rounded every step to 2
    decimals and who left every other step out."""
    from attntrace.grading.checker import _written
    from attntrace.grading.diagnose import to_float

    trace = attntrace.run(example, mode="numeric")
    world = World(trace)
    for keep in (lambda i: True, lambda i: i % 2 == 0):
        answer = {s.key: np.round(to_float(s.value), 2).tolist() for i, s in enumerate(trace.steps)
                  if keep(i) and s.value is not None}
        answers = load_answer(answer, tuple(dict.fromkeys(s.id for s in trace.steps)))
        given = _written(world, answers)
        base = world.recompute(given)
        for mutation in world.mutations:
            full, fast = world.recompute(given, mutation), world.recompute(given, mutation, base)
            for key in full:
                assert (full[key] is None) == (fast[key] is None), (mutation.code, key)
                if full[key] is not None:
                    np.testing.assert_array_equal(full[key].lo, fast[key].lo, err_msg=f"{mutation.code} {key}")
                    np.testing.assert_array_equal(full[key].hi, fast[key].hi, err_msg=f"{mutation.code} {key}")
                    assert key in world._reach[world.mutations.index(mutation)] or full[key] is base[key] or (
                        np.array_equal(full[key].lo, base[key].lo) and np.array_equal(full[key].hi, base[key].hi)), (mutation.code, key)
