"""The built-in examples (the seed article's): listed, runnable, rendered in every format and language."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pytest

import attntrace
from attntrace.inputs.usertext import format_user_text
from attntrace import cli
from attntrace.teach.examples import example_path, example_paths, list_examples
from attntrace.rendering.renderer import render
from attntrace.resources import examples_dir
from mathcheck import markdown_math_spans

NAMES = [p.stem for p in example_paths()]
FORMATS = ("md", "tex", "text")
LANGS = ("en", "zh")
#: Rendered standalone and compiled with xelatex (a few, both languages; ~1 s each).
COMPILED = [("sentence-4x6", "en"), ("sentence-4x6", "zh"), ("multihead-output", "en"),
            ("height-weight-distance", "zh"), ("concat-two-heads", "en")]


def test_the_article_examples_are_all_there():
    expected = {
        "height-weight-raw", "height-weight-standardised", "height-weight-distance",
        "height-weight-3-raw", "height-weight-3-distance", "sentence-4x6", "scaling-dk6",
        "symbolic-weights-times-values", "concat-two-heads", "eight-heads-shapes",
        "cross-attention", "causal-mask", "multihead-output",
    }
    assert expected <= set(NAMES)
    assert not [n for n in NAMES if n.endswith(".answer")]


@pytest.mark.parametrize("name", NAMES)
def test_example_spec_is_well_formed(name):
    data = tomllib.loads(example_path(name).read_text(encoding="utf-8"))
    assert data.get("title"), f"{name} has no title"
    if name != "article_softmax_claim":
        assert data.get("description") and len(data["description"]) <= 500
    assert all(c.isalnum() or c in "-_" for c in name) and name == name.lower()


def test_list_examples_gives_names_and_titles():
    listed = dict(list_examples())
    assert sorted(listed) == sorted(NAMES)
    for name, title in listed.items():
        raw = tomllib.loads(example_path(name).read_text(encoding="utf-8"))["title"]
        assert "$" not in title  # the listing is plain text: math spans are printed, not shown as source
        assert title == format_user_text(raw, "text")
        if "$" not in raw:
            assert title == raw
    answers = [p.name for p in examples_dir().glob("*.answer.toml")]
    assert not set(n.removesuffix(".toml") for n in answers) & set(listed)


def test_cli_examples_lists_every_example(capsys):
    assert cli.main(["examples"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(NAMES)
    assert {line.split()[0] for line in lines} == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_cli_run_each_example(name, capsys):
    assert cli.main(["run", name, "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert out.strip()


@pytest.fixture(scope="module")
def traces():
    return {name: attntrace.run(name) for name in NAMES}


@pytest.fixture(scope="module")
def rendered(traces):
    """Every example in every format and language (rendered once for the module)."""
    return {(name, fmt, lang): render(t, format=fmt, lang=lang)
            for name, t in traces.items() for fmt in FORMATS for lang in LANGS}


@pytest.mark.parametrize("name", NAMES)
def test_every_format_and_language(name, traces, rendered):
    t = traces[name]
    for fmt in FORMATS:
        en, zh = rendered[(name, fmt, "en")], rendered[(name, fmt, "zh")]
        assert en.strip() and zh.strip()
        assert en != zh, f"{name} {fmt}: the Chinese report is the English one"
        assert any("\u4e00" <= ch <= "\u9fff" for ch in zh)
    data = json.loads(json.dumps(t.to_dict(), ensure_ascii=False))
    assert data


def test_markdown_math_parses_in_katex(rendered, katex):
    spans = []
    for (name, fmt, lang), text in rendered.items():
        if fmt == "md":
            spans += markdown_math_spans(text)
    assert spans
    errors = katex(spans)
    assert errors == [], errors[:5]


def test_tex_fragments_math_parses_in_katex(rendered, katex):
    """Every display math block of the LaTeX fragments goes through KaTeX too."""
    import re

    spans = []
    for (name, fmt, lang), text in rendered.items():
        if fmt == "tex":
            # a display is \[ ... \]; a matrix row break with space, \\[2pt], is not one
            spans += [(m, True) for m in re.findall(r"(?<!\\)\\\[(.*?)(?<!\\)\\\]", text, flags=re.S)]
    errors = katex(spans) if spans else []
    assert errors == [], errors[:5]


@pytest.mark.parametrize("name,lang", COMPILED)
def test_standalone_latex_compiles(name, lang, traces, xelatex):
    source = render(traces[name], format="tex", lang=lang, standalone=True)
    ok, log, pdf = xelatex(source)
    assert ok, log


# --------------------------------------------------------------------------- the article's claims


def _w(name):
    return attntrace.run(name).step("weights").value[0]


def test_raw_heights_put_all_weight_on_the_tallest():
    w = _w("height-weight-raw")
    assert w.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]  # saturated softmax: the 190 cm classmate
    assert attntrace.run("height-weight-raw").step("Z").value[0, 0] == 80.0


def test_standardised_heights_still_favour_the_tallest():
    w = _w("height-weight-standardised")
    assert np.all(np.diff(w) > 0)  # rises with height: alignment, not closeness
    assert w.max() < 0.35


def test_distance_scores_favour_the_closest_heights():
    w = _w("height-weight-distance")  # classmates 160, 170, 175, 180, 190; new student 178
    assert list(np.argsort(-w)[:2]) == [3, 2]  # 180 cm, then 175 cm
    assert np.round(w, 2).tolist() == [0.01, 0.2, 0.34, 0.36, 0.09]
    z = attntrace.run("height-weight-distance").step("Z").value[0, 0]
    assert round(z, 1) == 66.9


def test_three_features_distance_finds_the_similar_classmate():
    assert _w("height-weight-3-raw").tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]
    w = _w("height-weight-3-distance")
    assert w.argmax() == 2 and w[2] > 0.8
    X = np.array([[160, 80, 92], [170, 88, 98], [176, 86, 103], [180, 100, 104], [189, 96, 111.0]])
    q = np.array([178, 86, 104.0])
    z = ((X - X.mean(0)) / X.std(0)).round(1)
    zq = ((q - X.mean(0)) / X.std(0)).round(1)
    scores = -((z - zq) ** 2).sum(axis=1)
    assert np.allclose(scores, attntrace.run("height-weight-3-distance").operand("scores").value[0])


def test_sentence_scaling_and_shapes():
    t = attntrace.run("sentence-4x6")
    assert t.step("Q").shape == (4, 6) and t.step("weights").shape == (4, 4)
    assert round(t.step("scaled").details["factor"], 3) == 2.449
    assert len(set(t.step("weights").value.argmax(axis=1))) == 4  # each word attends most to a different word


def test_eight_heads_give_100_by_24():
    t = attntrace.run("eight-heads-shapes")
    assert t.num_heads == 8 and t.step("concat").shape == (100, 24)


def test_causal_mask_zeros_are_exact():
    w = attntrace.run("causal-mask").step("weights").value
    assert (w[np.triu_indices(3, 1)] == 0).all() and np.allclose(w.sum(axis=1), 1)


def test_cross_attention_weights_are_rectangular():
    assert attntrace.run("cross-attention").step("weights").shape == (2, 3)
