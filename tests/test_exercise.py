"""Exercises: reproducible small-integer problems, worksheets that parse, keys that check."""

from __future__ import annotations

import re
import tomllib

import numpy as np
import pytest

from attntrace import BadInput, cli
from attntrace.grading.checker import check
from attntrace.teach.answerkey import answer_key, to_toml
from attntrace.teach.exercise import make_exercise
from attntrace.teach.worksheet import render_worksheet
from mathcheck import markdown_math_spans

CONFIGS = [(2, 4, 1), (3, 2, 2), (2, 1, 1), (3, 4, 2), (4, 6, 3)]


@pytest.mark.parametrize("seed", range(30))
def test_answer_keys_pass_the_checker(seed):
    for n, d, heads in CONFIGS:
        spec, trace = make_exercise(n, d, heads, seed)
        report = check(spec, answer_key(trace))
        assert report.ok, (seed, n, d, heads, report.to_dict())


def test_same_seed_same_exercise_and_seeds_differ():
    a, _ = make_exercise(3, 4, 1, seed=7)
    b, _ = make_exercise(3, 4, 1, seed=7)
    c, _ = make_exercise(3, 4, 1, seed=8)
    assert a == b and a != c


@pytest.mark.parametrize("seed", range(10))
def test_numbers_are_pleasant(seed):
    spec, trace = make_exercise(3, 4, 1, seed)
    assert set(np.ravel(spec["X"])) <= {-1, 0, 1, 2}
    for w in ("W_Q", "W_K", "W_V"):
        assert set(np.ravel(spec[w])) <= {-1, 0, 1}
    assert trace.step("scaled").details["factor"] == 2.0  # d_k = 4
    a = trace.step("weights").value
    assert a.max() < 0.95 and a.min() >= 0.001  # no saturated softmax row
    assert all(float(x).is_integer() for x in np.ravel(trace.step("scores").value))


def test_multi_head_split_and_output():
    spec, trace = make_exercise(2, 4, 2, seed=3)
    assert trace.num_heads == 2 and trace.step("Q", 1).shape == (2, 2)
    assert trace.step("concat").shape == (2, 4) and trace.step("output").shape == (2, 4)
    assert "weights@2" in answer_key(trace)


@pytest.mark.parametrize("kwargs,message", [
    ({"n": 0, "d": 2}, "n (sequence length)"),
    ({"n": 2, "d": 0}, "d (model width)"),
    ({"n": 2, "d": 4, "heads": 3}, "does not divide"),
    ({"n": 2, "d": 4, "heads": 0}, "heads"),
    ({"n": 2, "d": 4, "seed": -1}, "seed"),
    ({"n": 2.5, "d": 4}, "integer"),
    ({"n": 99, "d": 4}, "from 2 to"),
    ({"n": 1, "d": 4}, "from 2 to"),
])
def test_invalid_arguments_are_bad_input(kwargs, message):
    with pytest.raises(BadInput, match=re.escape(message)):
        make_exercise(**kwargs)


def test_cli_bad_arguments_one_line(capsys):
    assert cli.main(["exercise", "--d", "3", "--heads", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not divide" in err


def test_cli_writes_spec_and_answer_that_check(tmp_path, capsys):
    spec_file, answer_file = tmp_path / "exercise.toml", tmp_path / "answer.toml"
    assert cli.main(["exercise", "--n", "3", "--d", "4", "--heads", "2", "--seed", "5",
                     "--spec-out", str(spec_file), "--answer-out", str(answer_file)]) == 0
    worksheet = capsys.readouterr().out
    assert "\\boxed" in worksheet
    spec = tomllib.loads(spec_file.read_text(encoding="utf-8"))
    assert spec == make_exercise(3, 4, 2, 5)[0]
    assert tomllib.loads(answer_file.read_text(encoding="utf-8"))["weights@1"]
    assert cli.main(["check", str(spec_file), str(answer_file)]) == 0


def test_cli_key_is_the_derivation(capsys):
    assert cli.main(["exercise", "--seed", "2", "--key", "--lang", "zh"]) == 0
    key = capsys.readouterr().out
    assert "softmax" in key and any("\u4e00" <= ch <= "\u9fff" for ch in key)


def test_to_toml_round_trips():
    data = {"title": 'a "b"', "weights@2": [[0.5, -0.25]], "X": [[1, 2]], "num_heads": 2}
    assert tomllib.loads(to_toml(data)) == data


def test_to_toml_round_trips_newlines_and_control_characters():
    """A string with a newline, a tab, a backslash or a control character stays one valid TOML
    string (the hand-written writer it replaced wrote a raw newline into a basic string)."""
    data = {"title": "line one\nline two", "description": "tab\there, back\\slash, bell \x07, \u00e9",
            "weights@1": [[float("-inf"), 1.0]]}
    assert tomllib.loads(to_toml(data)) == data


@pytest.fixture(scope="module")
def worksheets():
    out = {}
    for seed, (n, d, heads) in enumerate([(2, 4, 1), (3, 4, 2), (2, 2, 1)]):
        spec, trace = make_exercise(n, d, heads, seed)
        for lang in ("en", "zh"):
            out[(seed, lang, "md")] = render_worksheet(spec, trace, format="md", lang=lang)
            out[(seed, lang, "tex")] = render_worksheet(spec, trace, format="tex", lang=lang, standalone=True)
    return out


def test_worksheet_markdown_math_parses(worksheets, katex):
    spans = [s for (seed, lang, fmt), text in worksheets.items() if fmt == "md" for s in markdown_math_spans(text)]
    assert len(spans) > 20
    assert katex(spans) == []


def test_worksheet_has_one_blank_per_step(worksheets):
    spec, trace = make_exercise(3, 4, 2, 1)
    text = render_worksheet(spec, trace, format="md")
    assert text.count("\\boxed{") == sum(s.shape[0] * s.shape[1] for s in trace.steps)
    assert "\\sqrt{2}" in text  # d_k = 2 per head
    assert "0." not in text.split("## Fill in every box")[1].split("---")[0].replace("0.000", "")  # no answers leak


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_worksheet_latex_compiles(lang, worksheets, xelatex):
    ok, log, _ = xelatex(worksheets[(1, lang, "tex")])
    assert ok, log


def test_key_latex_math_parses(katex):
    from attntrace.rendering.renderer import render

    _, trace = make_exercise(2, 4, 1, 0)
    spans = markdown_math_spans(render(trace, format="md", lang="zh"))
    assert katex(spans) == []


# --------------------------------------------------------------------------- sound exercises
#
# The property test draws hundreds of exercises for every option combination (without
# rendering or tracing) and checks them with its own NumPy code, independent of the
# generator's validation.

from attntrace.teach.exercise import exercise_spec  # noqa: E402
from attntrace.teach.exercisechecks import MAX_WEIGHT, MIN_WEIGHT, problems  # noqa: E402

GRID = [(n, d, h) for n in (2, 3, 4) for d in (2, 4, 8) for h in (1, 2, 4) if d % h == 0]
PROPERTY_SEEDS = 200


def _softmax(s):
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def soundness_failures(spec) -> list[str]:
    """Independent check of every promise (README, Teachers; exercise.py's docstring)."""
    bad = []
    x = np.array(spec["X"], dtype=float)
    n, d = x.shape
    heads = spec.get("num_heads", 1)
    d_k = d // heads
    if not set(np.ravel(spec["X"])) <= {-1, 0, 1, 2}:
        bad.append("X entries")
    if any(not set(np.ravel(spec[w])) <= {-1, 0, 1} for w in ("W_Q", "W_K", "W_V")):
        bad.append("W entries")
    if (np.abs(x).sum(axis=1) == 0).any():
        bad.append("zero row of X")
    for h in range(heads):
        c = slice(h * d_k, (h + 1) * d_k)
        w = {k: np.array(spec[k], dtype=float)[:, c] for k in ("W_Q", "W_K", "W_V")}
        for k, m in w.items():
            if np.linalg.matrix_rank(m) != d_k:
                bad.append(f"{k} block {h + 1} rank")
        q, k, v = x @ w["W_Q"], x @ w["W_K"], x @ w["W_V"]
        if np.all(q == q[0]):
            bad.append(f"head {h + 1}: Q rows equal")
        if not v.any():
            bad.append(f"head {h + 1}: V zero")
        s = q @ k.T
        for row in s:
            if len(np.unique(row)) != n:
                bad.append(f"head {h + 1}: equal scores in a row")
        a = _softmax(s / np.sqrt(d_k))
        if a.max() >= 0.95:
            bad.append(f"head {h + 1}: saturated")
        if a.min() < 0.001:
            bad.append(f"head {h + 1}: weight below the floor")
        if len(np.unique(np.round(a, 4), axis=0)) != n:
            bad.append(f"head {h + 1}: equal weight rows")
    if heads > 1:
        wo = np.array(spec["W_O"], dtype=float)
        if not set(np.ravel(spec["W_O"])) <= {0, 1} or np.linalg.matrix_rank(wo) != d:
            bad.append("W_O")
    elif "W_O" in spec:
        bad.append("W_O with one head")
    return bad


@pytest.mark.parametrize("n,d,heads", GRID)
def test_property_every_draw_is_sound(n, d, heads):
    for seed in range(PROPERTY_SEEDS):
        spec = exercise_spec(n, d, heads, seed)
        assert soundness_failures(spec) == [], (n, d, heads, seed)
        assert problems(spec) == []
    # the same seed gives the same exercise, redraws included
    for seed in (0, 1, PROPERTY_SEEDS - 1):
        assert exercise_spec(n, d, heads, seed) == exercise_spec(n, d, heads, seed)


def test_thresholds_are_the_documented_ones():
    assert (MAX_WEIGHT, MIN_WEIGHT) == (0.95, 0.001)


@pytest.mark.parametrize("heads,d", [(1, 4), (2, 8), (1, 1), (2, 2), (4, 4)])
def test_whole_sqrt_dk_for_one_two_and_four_heads(heads, d):
    """README: d = 4 (1 head), d = 8 (2 heads) give d_k = 4; d = heads gives d_k = 1."""
    spec, trace = make_exercise(3, d, heads, seed=11)
    factor = trace.step("scaled", 1 if heads > 1 else None).details["factor"]
    assert factor in (1.0, 2.0)


def test_known_bad_cases_from_issue_15_are_gone():
    spec = exercise_spec(3, 4, 2, 205)
    assert np.linalg.matrix_rank(np.array(spec["W_O"], dtype=float)) == 4
    for seed in range(300):
        assert np.linalg.matrix_rank(np.array(exercise_spec(2, 2, 2, seed)["W_O"], dtype=float)) == 2
    for seed in range(0, 300, 3):
        _, trace = make_exercise(4, 8, 2, seed)
        for h in (1, 2):
            assert trace.step("weights", h).value.max() < 0.95


def _degenerate(**changes):
    spec = exercise_spec(3, 4, 2, 0)
    spec.update(changes)
    return spec


@pytest.mark.parametrize("spec,reason", [
    (_degenerate(W_O=[[0] * 4] * 4), "W_O"),
    (_degenerate(W_O=[[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 0]]), "W_O"),
    (_degenerate(X=[[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]]), "X has two equal rows"),
    (_degenerate(X=[[1, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0]]), "zero row"),
    (_degenerate(W_Q=[[1, 0, 0, 0]] * 4), "head 1"),
    (_degenerate(W_Q=[[9, 9, 9, 9]] * 4, W_K=[[9, 0, 9, 0], [0, 9, 0, 9], [1, 1, 1, 1], [0, 0, 0, 0]]), "head"),
    (_degenerate(W_V=[[0, 0, 1, 0]] * 4), "head 1"),
])
def test_degenerate_draws_do_not_pass(spec, reason):
    found = problems(spec)
    assert found and any(reason in p for p in found), found
    assert soundness_failures(spec)


def test_no_valid_draw_is_one_line_bad_input(capsys):
    with pytest.raises(BadInput, match=r"--n 4 --d 1 --heads 1"):
        exercise_spec(4, 1, 1, 0)
    assert cli.main(["exercise", "--n", "4", "--d", "1", "--seed", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no exercise worth handing out" in err and "--n 4 --d 1" in err


# --------------------------------------------------------------------------- typography


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_worksheet_math_is_math(lang):
    spec, trace = make_exercise(3, 4, 2, 7)
    tex = render_worksheet(spec, trace, format="tex", lang=lang)
    md = render_worksheet(spec, trace, format="md", lang=lang)
    md_brackets = render_worksheet(spec, trace, format="md", lang=lang, math_delimiters="brackets")
    for text, (o, c) in ((tex, "$$"), (md, "$$"), (md_brackets, ("\\(", "\\)"))):
        for m in ("e^x", "W_Q", "(i-1)\\,d_k + 1", "i\\,d_k"):
            assert f"{o}{m}{c}" in text, (m, lang)
        assert f"n \\times d_{{\\text{{model}}}}{c}" in text
    assert "\\^{}" not in tex and "\\textasciicircum" not in tex
    assert "d\\_model" not in tex and "W\\_Q" not in tex and "d_model" not in md
    assert "\\texttt{attntrace check exercise.toml answer.toml}" in tex
    assert "`attntrace check exercise.toml answer.toml`" in md


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("n,d,heads,seed", [(4, 8, 2, 1), (4, 4, 4, 3), (3, 8, 1, 2)])
def test_worksheet_and_key_fit_the_page(lang, n, d, heads, seed, pagefit_latex):
    from attntrace.rendering.renderer import render

    spec, trace = make_exercise(n, d, heads, seed)
    for kind, src in (("worksheet", render_worksheet(spec, trace, format="tex", lang=lang, standalone=True)),
                      ("key", render(trace, format="tex", lang=lang, standalone=True))):
        result = pagefit_latex(src)
        assert result.ok, (kind, result.log[-2000:])
        assert result.overfull == [], (kind, result.overfull)
