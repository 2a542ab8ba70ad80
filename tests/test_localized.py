"""Chinese reports use the examples' Chinese titles and descriptions, and every glyph of every
example's report is in the fonts (xelatex logs no "Missing character")."""

import re

import pytest

import attntrace
from attntrace.teach.examples import example_paths
from attntrace.inputs.usertext import heading_text

EXAMPLES = [p.stem for p in example_paths()]


@pytest.mark.parametrize("name", EXAMPLES)
def test_zh_report_has_the_chinese_title(name):
    trace = attntrace.run(name)
    zh_title = trace.settings["title_zh"]
    assert re.search(r"[\u4e00-\u9fff]", zh_title)
    # the heading is the title's plain-text form (no math in headings: issue 22)
    assert attntrace.render(trace, format="md", lang="zh").splitlines()[0] == "# " + heading_text(zh_title, "md")
    assert attntrace.render(trace, format="md", lang="en").splitlines()[0] == "# " + heading_text(trace.title, "md")


#: the \text{...} a formula may hold in any language: subscripts of names (d_model, K_cache, beta_fast)
_NAME_WORDS = {"model", "cache", "past", "ff", "base", "nope", "rope", "fast", "slow", "gate", "up", "down", "kv"}


@pytest.mark.parametrize("name", EXAMPLES)
def test_zh_formulas_hold_no_english_words(name):
    """A formula's words are not translated, so a formula holds none: the router's cases and
    Llama 3's RoPE rule said "otherwise" in the zh report; they state the condition (j not in T_i),
    and a list elides with dots, not the text "..."."""
    md = attntrace.render(attntrace.run(name), format="md", lang="zh")
    words = set(re.findall(r"\\text\{([^{}]*)\}", md)) - _NAME_WORDS
    assert not words, f"{name}: {words}"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_example_compiles_without_missing_glyphs(xelatex, lang):
    for name in EXAMPLES:
        tex = attntrace.render(attntrace.run(name), format="tex", lang=lang, standalone=True)
        ok, log_tail, pdf = xelatex(tex)
        assert ok, (name, log_tail)
        log = pdf.with_suffix(".log").read_text(encoding="utf-8", errors="replace")
        assert "Missing character" not in log, (name, [l for l in log.splitlines() if "Missing character" in l][:3])


def test_unknown_localized_key_is_refused():
    with pytest.raises(attntrace.BadInput, match="title_fr"):
        attntrace.run({"scores": [[1]], "scale": False, "title_fr": "x"})


@pytest.mark.parametrize("name", ["sentence-4x6", "backward-2x2", "multihead-output"])
def test_the_chinese_notation_list_has_chinese_punctuation(name):
    """The run-in notation list of a Chinese report read "X 输入, 4×6; W_Q 查询权重, 6×6; ... ." with
    Western commas, semicolons and full stop between Chinese words."""
    tex = attntrace.render(attntrace.run(name), format="tex", lang="zh")
    listing = tex.split("\\subsection*{符号}", 1)[1].split("\\par}", 1)[0]
    words = re.sub(r"\\\(.*?\\\)", "", listing)  # the math between the words
    assert "；" in words and words.rstrip().endswith("。") and not re.search(r"[;,.]", words.replace("\\footnotesize", "")), words


def test_the_chinese_backward_and_d_k_read_as_chinese():
    """Literal translations a Chinese lecturer rewrites: "相遇于分数" (meets in the score), "乘开后"
    (multiplying out), "按...汇总..., 因此" (so ..., therefore); and d_k was "K 向量维度" in the
    conventions but "键宽度" in the notation: one term, 键向量维度."""
    tex = attntrace.render(attntrace.run("backward-2x2-symbolic"), format="tex", lang="zh")
    assert not re.search("相遇|乘开|汇总输出的梯度，因此|K 向量维度|键宽度", tex), re.findall(".{10}(?:相遇|乘开|K 向量维度|键宽度).{10}", tex)
    assert "单个头的键向量维度" in tex and "每个头的键向量维度" in tex
