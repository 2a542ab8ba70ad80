"""Notes that do not mislead and one Chinese term for token (issue 22 items 3 and 8)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import attntrace
from attntrace.teach.examples import example_paths

NAMES = [p.stem for p in example_paths()]


def _saturated_rows(md: str, lang: str) -> list[int]:
    pattern = r"saturated in row (\d+)" if lang == "en" else r"第 (\d+) 行(?:（[^）]*）)?的 softmax 已饱和"
    return [int(x) for x in re.findall(pattern, md)]


@pytest.mark.parametrize("name", ["causal-mask", "alibi-causal", "llama-block-tiny", "sliding-window"])
def test_no_saturation_note_for_a_row_with_one_key(name):
    """Under a causal mask row 1 sees one key: its weight 1 is the mask's doing, not saturation."""
    trace = attntrace.run(name)
    one_key = {i + 1 for s in trace.steps if s.id == "masked"
               for i, row in enumerate(np.asarray(s.details["keep"])) if np.count_nonzero(row) == 1}
    assert one_key, name
    for lang in ("en", "zh"):
        md = attntrace.render(trace, format="md", lang=lang)
        assert not set(_saturated_rows(md, lang)) & one_key, (name, lang)


def test_a_saturated_row_is_still_said():
    for lang in ("en", "zh"):
        md = attntrace.render(attntrace.run("height-weight-raw"), format="md", lang=lang)
        assert _saturated_rows(md, lang) == [1], lang


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_kv_cache_gives_the_right_reason(lang):
    md = attntrace.render(attntrace.run("kv-cache-decoding"), format="md", lang=lang)
    if lang == "en":
        assert "depends only on its own token" not in md
        assert md.count("no earlier key or value depends on a later token") == 1  # said for the keys; the values refer to it
        assert "under the causal mask no earlier key or value depends on a later token" in md
    else:
        assert "只取决于它自己的词和位置" not in md
        assert md.count("前面的键和值都不依赖后面的词元") == 1


@pytest.mark.parametrize("name", NAMES)
def test_zh_glossary_token_is_ciyuan(name):
    """词元 for token in the prose; 样本 never (词 stays where an example's own text is about words)."""
    md = attntrace.render(attntrace.run(name), format="md", lang="zh")
    assert "样本" not in md
    assert "维度偏见" not in md and "增益 $\\gamma$ 按特征学习得到" not in md


def test_en_gain_agrees_with_its_verb():
    md = attntrace.render(attntrace.run("llama-block-tiny"), format="md")
    assert "gamma$ are learned" not in md and "the gain $\\gamma$ is learned per feature" in md


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_count_of_one_is_not_written_as_several(lang):
    """Text written for several items used for one: moe-tiny kept "the best 1 of 2 groups" (保留最好的 1 个)."""
    md = attntrace.render(attntrace.run("moe-tiny"), format="md", lang=lang)
    assert not re.search(r"\bbest 1 of\b|最好的 1 个", md)
    assert ("the better of 2 groups" if lang == "en" else "保留最好的一组") in md
    # tokens 1 and 2 sum the rows of the experts each chose (各自所选), not of those "it" chose (它所选)
    assert not re.search(r"[Tt]okens \d+ and \d+: [^.]*\bit chose|词元 \d+、\d+[^。]*它所选", md)
    assert ("the experts each chose" if lang == "en" else "词元 1、2：各自所选专家的行") in md


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("name, q, k", [("qk-norm-qwen3", "\\tilde{Q}", "\\tilde{K}"), ("llama-block-tiny", "\\tilde{Q}^{(1)}", "\\tilde{K}^{(1)}"),
                                        ("sentence-4x6", "Q", "K")])
def test_the_scores_sentence_names_what_the_scores_read(name, q, k, lang):
    """S = Q~ K~^T after RoPE (and QK-norm), but the sentence said "row i of Q with row j of K":
    it names the matrices the formula multiplies."""
    md = attntrace.render(attntrace.run(name), format="md", lang=lang)
    said = f"row $i$ of ${q}$ with row $j$ of ${k}$" if lang == "en" else f"${q}$ 的第 $i$ 行与 ${k}$ 的第 $j$ 行的点积"
    assert said in md


def test_zh_notation_says_epsilon_in_chinese():
    """The zh notation row of the norm's epsilon read "归一化的 epsilon": the symbol stands beside it, the words are Chinese."""
    md = attntrace.render(attntrace.run("qk-norm-qwen3"), format="md", lang="zh")
    section = md.split("\n## 符号\n", 1)[1].split("\n## ", 1)[0]
    assert "的 epsilon" not in section and "归一化的小常数" in section


@pytest.mark.parametrize("name", NAMES)
def test_the_introduction_names_only_what_the_trace_computes(name):
    """article_softmax_claim starts from scores and ends at the weights, yet its introduction read
    softmax(QK^T)V: a trace that starts from scores names S, not Q K^T, and V only with a weighted sum."""
    from attntrace.rendering.viewmodel import intro_formula

    trace = attntrace.run(name)
    if trace.settings.get("start") != "scores":
        return
    formula = intro_formula(trace).text("plain")
    assert "S" in formula and not re.search(r"\b[QK]\b", formula), (name, formula)
    assert ("V" in formula) == any(s.id == "Z" for s in trace.steps), (name, formula)


def test_the_weight_gradient_writes_the_projection_the_trace_has():
    """backward-2x2 has no bias, yet dW_Q's note read Q = X W_Q + b; cross-attention's keys and
    values project X_kv, yet the note read K = X W_K."""
    for lang in ("en", "zh"):
        tex = attntrace.render(attntrace.run("backward-2x2"), format="tex", lang=lang)
        assert not re.search(r"W_[QKV] \+ b", tex) and all(f"{m} = X W_{m}\\)" in tex for m in "QKV"), lang
        cross = attntrace.render(attntrace.run("cross-attention", backward=True), format="tex", lang=lang)
        assert "K = X_{\\mathrm{kv}} W_K" in cross and "V = X_{\\mathrm{kv}} W_V" in cross and "Q = X W_Q" in cross, lang
    biased = {"X": [[1, 0], [2, 1]], "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [1, 1]], "W_V": [[1, 2], [0, -1]],
              "b_Q": [[1, 2]], "backward": {"loss": "sum_squares"}}
    tex = attntrace.render(attntrace.run(biased), format="tex")
    assert "Q = X W_Q + b_Q" in tex and "K = X W_K\\)" in tex


@pytest.mark.parametrize("name", NAMES)
def test_every_shapes_line_says_what_the_step_reads_and_makes(name):
    """The given gradient dZ printed "Shapes: (2 x 2)." under its own (2 x 2): a shapes line has an arrow."""
    md = attntrace.render(attntrace.run(name), format="md")
    lines = re.findall(r"Shapes: \$([^$]*)\$", md)
    assert all("\\to" in line for line in lines), (name, [line for line in lines if "\\to" not in line])


def test_a_note_is_set_as_the_step_paragraphs_are():
    """The saturation note was the one indented paragraph among the steps' unindented ones."""
    for lang in ("en", "zh"):
        tex = attntrace.render(attntrace.run("height-weight-raw"), format="tex", lang=lang)
        note = "The softmax is saturated" if lang == "en" else "softmax 已饱和"
        line = next(line for line in tex.splitlines() if note in line)
        assert line.startswith("\\noindent "), line


def test_a_rows_token_is_quoted():
    """"Row 1 (the):" read as if the row were the definite article: the token is quoted."""
    trace = attntrace.run("sentence-4x6")
    assert "Row 1 (“the”):" in attntrace.render(trace, format="md")
    assert "第 1 行（“the”）：" in attntrace.render(trace, format="md", lang="zh")


def test_the_article_softmax_example_says_the_result_in_both_languages():
    """The English description only repeated the article's claim; the Chinese one said what the softmax gives."""
    trace = attntrace.run("article_softmax_claim")
    a = np.asarray(next(s for s in trace.steps if s.id == "weights").value, dtype=float)
    for lang in ("en", "zh"):
        text = trace.localized("description", lang)
        for x in a.ravel():
            assert f"{x:.4f}" in text, (lang, x, text)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_one_head_output_projection_speaks_of_one_head(lang):
    """With one head there is no concatenation: its output projection multiplies that head's Z by
    W_O, and mixes no heads; with several heads the sentence still speaks of the concatenation."""
    many = ("The concatenated heads are multiplied", "拼接后的矩阵乘以")[lang == "zh"]
    one = ("The head's output is multiplied", "注意力头的输出乘以")[lang == "zh"]
    seen = set()
    for name in NAMES:
        trace = attntrace.run(name)
        if not any(s.id == "output" for s in trace.steps):
            continue
        md = attntrace.render(trace, format="md", lang=lang)
        single = trace.num_heads == 1
        assert (one in md, many in md) == (single, not single), (name, lang)
        seen.add(single)
    assert seen == {True, False}


@pytest.mark.parametrize("name", ["alibi-causal", "attention-sinks"])
def test_one_mask_for_every_head_is_printed_once(name):
    """Every head uses the same mask M: it is printed with head 1's masked scores, not again with head 2's."""
    trace = attntrace.run(name)
    assert len({s.head for s in trace.steps if s.id == "masked"}) > 1, name
    for fmt, shown in (("tex", "{M} = "), ("text", "    M (4 x 4) =")):
        out = attntrace.render(trace, format=fmt)
        assert out.count(shown) == 1, (name, fmt, out.count(shown))


def _titles_said_twice(text: str) -> list[tuple[str, str]]:
    """(section, paragraph title) for each title said a second time within one section of a text report."""
    lines, section, seen, twice = text.splitlines(), "", set(), []
    for title, rule in zip(lines, lines[1:]):
        if rule.startswith("----") and title.strip():
            section, seen = title, set()
        elif rule.startswith("~~~~") and title.strip():
            if title in seen:
                twice.append((section, title))
            seen.add(title)
    return twice


@pytest.mark.parametrize("name", NAMES)
def test_no_paragraph_title_twice_in_a_section(name):
    """A head's results split by a paragraph of its own (ALiBi's bias, a sink) go on as "Head 2's results,
    continued", not a second "Head 2's results"."""
    trace = attntrace.run(name)
    for lang in ("en", "zh"):
        assert not _titles_said_twice(attntrace.render(trace, format="text", lang=lang)), (name, lang)


def test_the_title_check_sees_a_repeat():
    assert _titles_said_twice("Head 2\n------\n\nA\n~~~~\n\nx\n\nB\n~~~~\n\nA\n~~~~\n") == [("Head 2", "A")]


@pytest.mark.parametrize("lang, says", [("en", "As in head 1, with this head's sink logit $s^{(2)} = -1$."),
                                        ("zh", "同第 1 个头，这个头的汇聚 logit 为 $s^{(2)} = -1$。")])
def test_a_later_heads_sink_says_its_logit(lang, says):
    """Head 2's sink differs from head 1's: its paragraph names it, not only "As in head 1."."""
    assert says in attntrace.render(attntrace.run("attention-sinks"), format="md", lang=lang)


@pytest.mark.parametrize("name, key, value", [("kv-cache-decoding", "K_{\\text{cache}}", "V_{\\text{cache}}"),
                                              ("rope-4-tokens-half", "\\tilde{K}", "V")])
def test_the_scores_prose_names_the_keys_they_read(name, key, value):
    """S = Q K_cache^T is the dot product of row i of Q with row j of K_cache, not of "K" (the new key alone)."""
    for lang, scores, weighted in (("en", "with row $j$ of ${}$", "the rows of ${}$"), ("zh", "与 ${}$ 的第 $j$ 行", "对 ${}$ 的各行")):
        md = attntrace.render(attntrace.run(name), format="md", lang=lang)
        assert scores.format(key) in md and weighted.format(value) in md, (name, lang)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_norm_with_epsilon_zero_substitutes_no_plus_zero(lang):
    """moe-tiny's RMSNorm has epsilon = 0 (so a lecturer's numbers are whole): its lines read
    1/sqrt(0.5), not 1/sqrt(0.5 + 0); a norm with an epsilon keeps it (llama-block-tiny: + 10^-6)."""
    zero = attntrace.render(attntrace.run("moe-tiny"), format="md", lang=lang)
    assert r"\frac{1}{\sqrt{0.5}}" in zero and not re.search(r"\\sqrt\{[0-9.]+ \+ 0\}", zero)
    kept = attntrace.render(attntrace.run("llama-block-tiny"), format="md", lang=lang)
    assert r"\sqrt{0.5 + 10^{-6}}" in kept
