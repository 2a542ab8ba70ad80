"""Exercises: reproducible small-integer problems, worksheets that parse, keys that check."""

from __future__ import annotations

import re
import tomllib

import numpy as np
import pytest

from attntrace import BadInput, cli
from attntrace.checker import check
from attntrace.exercise import answer_key, make_exercise, render_worksheet, to_toml
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
    t = trace.step("scaled").value
    assert (t.max(axis=1) - t.min(axis=1)).max() <= 3.0  # no near one-hot softmax row
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
    ({"n": 99, "d": 4}, "from 1 to"),
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
    from attntrace.renderer import render

    _, trace = make_exercise(2, 4, 1, 0)
    spans = markdown_math_spans(render(trace, format="md", lang="zh"))
    assert katex(spans) == []
