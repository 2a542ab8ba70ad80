"""The layout step: its width estimate against real xelatex, and how it breaks equations.

The estimate (attntrace.rendering.layout.width) decides every line break of every report, so it is
checked here against the typesetter itself: each display line of several real reports is set
in an \\hbox by xelatex and its width read back (one compile for all of them). The estimate
must never fall short by more than a little (a short estimate is an overfull line) and must
not be wildly wide (a wide one wastes the page). Random specs at random widths are then
compiled whole: no line may stick out.
"""

from __future__ import annotations

import re
import statistics

import numpy as np
import pytest

import attntrace
from attntrace.model.errors import BadInput
from attntrace.rendering.layout import Seq, fit_chain, join_sum, parse_width
from attntrace.rendering.texwidth import width
from pagefit import compile_latex_full

SPECS = {
    "sentence": "sentence-4x6",
    "masked": "causal-mask",
    "heads": "multihead-output",
    "symbolic": {"mode": "symbolic", "X": {"shape": [2, 3]}, "W_Q": {"shape": [3, 2]}, "W_K": {"shape": [3, 2]},
                 "W_V": {"shape": [3, 2]}, "mask": "causal"},
    "exact": {"mode": "exact", "X": [["1", "2"], ["0", "1"]], "W_Q": [["1/2", "0"], ["0", "sqrt(2)"]],
              "W_K": [["1", "1/3"], ["0", "1"]], "W_V": [["2", "0"], ["1", "1/2"]]},
    "wide": {"X": np.random.default_rng(3).normal(size=(12, 12)).round(4), "W_Q": np.eye(12), "W_K": np.eye(12),
             "W_V": np.eye(12), "num_heads": 2},
}


def _display_lines(tex: str) -> list[str]:
    """Every line of every display of a LaTeX report, alignment marks and breaks removed."""
    lines = []
    for m in re.finditer(r"\\\[\n(.*?)\n\\\]|\\begin\{align\*\}\n(.*?)\n\\end\{align\*\}", tex, re.S):
        body = m.group(1) or m.group(2)
        for line in re.split(r" \\\\\*?\n", body):  # a line break, or one the page may not break at
            lines.append(line.replace("&", "", 1) if m.group(2) else line)
    return lines


def _strip_alignment(line: str) -> str:
    # the first & of an align* line is the alignment point; matrices keep theirs (inside environments)
    return line


@pytest.fixture(scope="module")
def measured(request):
    import mathcheck

    mathcheck.require_tool("xelatex")
    samples = []
    for spec in SPECS.values():
        tex = attntrace.render(attntrace.run(spec), format="tex")
        samples += _display_lines(tex)
    samples = sorted(set(samples))
    body = [f"\\sbox0{{$\\displaystyle {s}$}}\\typeout{{W{i}:\\the\\wd0}}" for i, s in enumerate(samples)]
    doc = "\\documentclass{article}\n\\usepackage{amsmath}\n\\setcounter{MaxMatrixCols}{40}\n\\begin{document}\n" + "\n".join(body) + "\n\\mbox{}\n\\end{document}\n"
    result = compile_latex_full(doc, workdir=request.config._tmp_path_factory.mktemp("widths"), probe_textwidth=False)
    assert result.ok, result.error_summary()
    real = {int(i): float(w) / 10.0 for i, w in re.findall(r"W(\d+):([\d.]+)pt", result.log)}
    assert len(real) == len(samples), "every sample must be measured"
    return [(s, width(s), real[i]) for i, s in enumerate(samples)]


def test_estimate_is_close_to_xelatex_and_errs_wide(measured):
    """Over a few hundred real display lines: never more than 4% short, median within 0-10% wide."""
    assert len(measured) > 150
    ratios = [est / real for _, est, real in measured if real > 1.0]
    short = [(s[:80], round(est, 2), round(real, 2)) for s, est, real in measured if real > 1.0 and est < 0.96 * real]
    assert not short, short[:5]
    assert 1.0 <= statistics.median(ratios) <= 1.10, statistics.median(ratios)
    assert max(ratios) < 1.5


def test_one_line_when_it_fits_and_aligned_lines_when_not():
    assert fit_chain("x", ["a + b", "c"], 30) == ["x = a + b = c"]
    assert fit_chain("x", ["a + b", "c"], 30, align=True) == ["x &= a + b = c"]
    lines = fit_chain("x", ["a + b + c + d", "e + f + g + h"], 8)
    assert lines == ["x &= a + b + c + d", "&= e + f + g + h"]


def test_long_sum_breaks_after_a_plus_and_continues_indented():
    terms = [f"x_{{1{k}}} w_{{{k}1}}" for k in range(1, 10)]
    lines = fit_chain("q_{11}", [join_sum(terms)], 20)
    assert len(lines) > 1
    assert all(line.endswith("+ {}") for line in lines[:-1])  # TeX keeps the binary spacing
    assert all(line.startswith("&\\qquad ") for line in lines[1:])
    assert all(width(line.replace("&", "")) <= 20 + 0.5 for line in lines)


def test_a_row_vector_breaks_after_its_comma_with_plain_parentheses():
    items = tuple(f"0.{k}234" for k in range(1, 10))
    vec = Seq(items, joiner=",\\ ", tail=",", open="(", close=")", open_one="\\left(", close_one="\\right)")
    one = fit_chain("a", [vec], 100)
    assert one[0].startswith("a = \\left(0.1234")  # on one line the parentheses may grow
    lines = fit_chain("a", [vec], 15)
    assert len(lines) > 1 and all(line.endswith(",") for line in lines[:-1])
    assert "\\left(" not in "".join(lines)  # a \left( cannot end on another line
    assert lines[-1].endswith(")")


def test_width_option():
    assert parse_width(None, "tex", "en").pt == 345
    assert parse_width("12cm", "tex", "en").pt == pytest.approx(341.4, abs=0.1)
    assert parse_width("760px", "md", "en").em == pytest.approx(760 / 19.36)
    for bad in ("wide", "12", "-3pt", "1e9pt", "5pt", "12 parsecs"):
        with pytest.raises(BadInput):
            parse_width(bad, "tex", "en")
    with pytest.raises(BadInput):
        attntrace.render(attntrace.run("scaling-dk6"), format="md", rows="two")
    with pytest.raises(BadInput):
        attntrace.render(attntrace.run("scaling-dk6"), format="md", rows=[0])


def test_rows_option_expands_the_rows_asked_for():
    t = attntrace.run("sentence-4x6")
    md = attntrace.render(t, format="md", rows="2,4")
    assert "q_{21} &=" in md and "q_{41} &=" in md and "q_{11} &=" not in md
    assert "Entry by entry (rows 2, 4)" in md
    every = attntrace.render(t, format="md", rows="all")
    assert all(f"q_{{{i}6}} &=" in every for i in range(1, 5))


@pytest.mark.parametrize("seed", range(4))
def test_random_specs_at_random_widths_fit_in_xelatex(tmp_path, seed):
    """Random shapes, heads, masks, modes and page widths from 200pt to 500pt: the compiled
    document has no line wider than the page (xelatex is the judge, not the estimate)."""
    import mathcheck

    mathcheck.require_tool("xelatex")
    rng = np.random.default_rng(100 + seed)
    n, heads = int(rng.integers(1, 7)), int(rng.integers(1, 3))
    d = heads * int(rng.integers(1, 5))
    scale = float(rng.choice([0.1, 1, 30]))
    spec = {"X": (rng.normal(size=(n, d)) * scale).round(int(rng.integers(0, 5))),
            **{w: rng.normal(size=(d, d)).round(3) for w in ("W_Q", "W_K", "W_V")}, "num_heads": heads}
    if rng.random() < 0.5:
        spec["mask"] = "causal"
    if heads > 1 and rng.random() < 0.5:
        spec["W_O"] = rng.normal(size=(d, d)).round(2)
    page = f"{int(rng.integers(200, 500))}pt"
    lang = ("en", "zh")[seed % 2]
    tex = attntrace.render(attntrace.run(spec), format="tex", standalone=True, width=page, lang=lang)
    result = compile_latex_full(tex, workdir=tmp_path)
    assert result.ok, result.error_summary()
    assert result.textwidth == pytest.approx(float(page[:-2]), abs=0.05)
    assert [w for w in result.overfull if w > 1.0] == [], (page, spec.keys(), result.overfull_details()[:3])


# ------------------------------------------------------------------ what a reader sees

def test_chinese_markdown_never_glues_inline_math_to_hanzi():
    """Several Markdown renderers do not open `自注意力$x$` as math: a space must separate them."""
    from attntrace.teach.examples import list_examples

    for name, _ in list_examples():
        md = attntrace.render(attntrace.run(name), format="md", lang="zh")
        glued = [line for line in md.splitlines() if not line.startswith("$$")
                 and re.search(r"[\u4e00-\u9fff]\$|(?<!\\)\$[\u4e00-\u9fff]", line)]
        assert not glued, (name, glued[:2])


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_saturated_softmax_is_said_and_tiny_weights_are_not_zeros(lang):
    """Raw heights: scores 28480..33820, so e^(28480-33820) = e^-5340 ~ 10^-2319.1 underflows to a
    float 0; the report must still show it as nonzero (7.4 * 10^-2320) and say the row saturates."""
    md = attntrace.render(attntrace.run("height-weight-raw"), format="md", lang=lang)
    assert "7.4 \\cdot 10^{-2320}" in md  # 10^(-5340 / ln 10) = 10^-2319.13 = 7.4e-2320
    assert "1.0000" in md  # the largest weight is 1 - 1e-773, not exactly 1
    assert ("saturated in row 1" in md) if lang == "en" else ("softmax 已饱和" in md)
    masked = attntrace.render(attntrace.run("causal-mask"), format="md", lang=lang)
    assert "0\\phantom{.0000}" in masked  # an exactly masked weight stays a plain 0


def test_conventions_state_only_what_applies():
    scores_only = attntrace.render(attntrace.run("article_softmax_claim"), format="md")
    conventions = scores_only.split("## Conventions")[1].split("##")[0]
    assert "Row vectors" not in conventions and "Masked" not in conventions and "concatenated" not in conventions
    assert "\\sqrt{d_k}" not in scores_only.split("## Conventions")[0]  # no scaling: the intro does not promise one
    masked = attntrace.render(attntrace.run("causal-mask"), format="md")
    assert "Masked entries" in masked and "Heads are concatenated" not in masked
    heads = attntrace.render(attntrace.run("multihead-output"), format="md")
    assert "Heads are concatenated" in heads and "W_O" in heads.split("## Given")[0]


def test_exact_matrices_of_fractions_are_not_listed_twice():
    spec = {"mode": "exact", "X": [["1", "2"], ["0", "1"]], "W_Q": [["1/2", "0"], ["0", "sqrt(2)"]],
            "W_K": [["1", "1/3"], ["0", "1"]], "W_V": [["2", "0"], ["1", "1/2"]]}
    given = attntrace.render(attntrace.run(spec), format="md").split("## Given")[1].split("## Steps")[0]
    equations = [eq for line in given.splitlines() for eq in line.split("\\qquad")]  # packed side by side
    w_k = next(eq for eq in equations if "{W_K}" in eq)
    w_v = next(eq for eq in equations if "{W_V}" in eq)
    assert "\\approx" not in w_k and "\\approx" not in w_v  # 1/3 reads as well as 0.3333
    assert "\\approx" in next(eq for eq in equations if "{W_Q}" in eq)  # sqrt(2) needs its 1.4142


def test_shape_mode_is_one_table():
    md = attntrace.render(attntrace.run("eight-heads-shapes"), format="md")
    steps = md.split("## Steps", 1)[1]  # the Notation table above lists the symbols, not the steps
    assert steps.count("| queries |") == 1 and steps.count("\n| ") == 9  # one row per step kind, 8 heads collapsed
    assert "Q^{(\\eta)} = X W_Q^{(\\eta)}" in md and "(100{\\times}3)" in md and "(100{\\times}24)" in md


def test_title_math_is_typeset_not_escaped():
    md = attntrace.render(attntrace.run("scaling-dk6"), format="md")
    # headings hold no math (issue 22): the title's spans are parsed and set as text, the root as its sign
    # (the heading read "sqrt(d_k)"), a subscript as a text subscript in LaTeX
    assert md.splitlines()[0] == "# Scaling by √d\\_k with d\\_k = 6"
    tex = attntrace.render(attntrace.run("scaling-dk6"), format="tex")
    assert "\\section*{Scaling by \\ensuremath{\\surd}d\\textsubscript{k} with d\\textsubscript{k} = 6}" in tex
    assert "\\section*{Two heads with an output projection W\\textsubscript{O}}" in attntrace.render(attntrace.run("multihead-output"), format="tex")


def test_a_blocks_given_matrices_come_in_order_of_use():
    """llama-block-tiny's Given listed the gains after W_O, so W_gate stood alone on a line (issue
    22): in order of use each gain stands beside its sublayer's weights and no line holds one matrix."""
    tex = attntrace.render(attntrace.run("llama-block-tiny"), format="tex")
    given = tex.split("\\subsection*{Given}", 1)[1].split("\\subsection*", 1)[0]
    displays = re.findall(r"\\\[(.*?)\\\]", given, re.S)
    names = [re.findall(r"\\underset\{\([^)]*\)\}\{(.*?)\} =", d) for d in displays]
    assert all(len(n) >= 2 for n in names), names
    flat = [n for line in names for n in line]
    assert flat.index("\\gamma") < flat.index("W_Q^{(1)}") and flat.index("\\gamma^{f}") + 1 == flat.index("W_{\\mathrm{gate}}"), flat


@pytest.mark.parametrize("name", ["llama-block-tiny", "gemma2-block-tiny"])
def test_a_projection_given_per_head_stands_with_its_other_heads(name):
    """W_Q^(2) stood after W_K^(1) and W_V^(1), on a line with W_O (issue 22): the heads' blocks of
    one projection come one after the other in Given, W_Q^(2) on W_Q^(1)'s line."""
    tex = attntrace.render(attntrace.run(name), format="tex")
    given = tex.split("\\subsection*{Given}", 1)[1].split("\\subsection*", 1)[0]
    lines = [re.findall(r"\\underset\{\([^)]*\)\}\{(.*?)\} =", d) for d in re.findall(r"\\\[(.*?)\\\]", given, re.S)]
    flat = [n for line in lines for n in line]
    assert flat.index("W_Q^{(2)}") == flat.index("W_Q^{(1)}") + 1, flat
    assert any("W_Q^{(1)}" in line and "W_Q^{(2)}" in line for line in lines), lines


@pytest.mark.parametrize("name, first", [("height-weight-distance", "S"), ("height-weight-3-distance", "S"),
                                         ("symbolic-weights-times-values", "A")])
def test_given_scores_or_weights_come_before_the_values(name, first):
    """softmax(S) V and A V gave V first and S or A after it (the trace's order), as if the values were read first."""
    tex = attntrace.render(attntrace.run(name), format="tex")
    given = tex.split("\\subsection*{Given}", 1)[1].split("\\subsection*", 1)[0]
    names = re.findall(r"\\underset\{\([^)]*\)\}\{(.*?)\} =", given)
    assert names == [first, "V"], names


def test_a_shape_tables_formulas_keep_fractions_on_the_line():
    """The shape table's scaling row set T = \\frac{S}{\\sqrt{d_k}} in script size inside its row: S / sqrt(d_k) on the line."""
    for fmt in ("md", "tex"):
        out = attntrace.render(attntrace.run("eight-heads-shapes"), format=fmt)
        row = next(line for line in out.splitlines() if line.lstrip("| ").startswith("scaling"))
        assert "\\frac" not in row and "S^{(\\eta)}/\\sqrt{d_k}" in row, row


def test_a_short_chain_is_not_broken_across_pages_but_an_entry_list_may_be():
    """multihead-output's O = Z W_O stood alone at the foot of page 4, its matrices and result on
    page 5: a chain of up to three lines is kept on one page (\\\\*), an entry list still breaks."""
    tex = attntrace.render(attntrace.run("multihead-output"), format="tex")
    assert "{O} &= Z W_O \\\\*\n" in tex
    entries = tex.split("o_{11} &= ", 1)[1].split("\\end{align*}", 1)[0]
    assert "\\\\*" not in entries or entries.count("\\\\") == entries.count("\\\\*")  # one chain of two lines
    q = attntrace.render(attntrace.run("sentence-4x6"), format="tex").split("q_{11} &= ", 1)[1].split("\\end{align*}", 1)[0]
    assert "\\\\*" not in q  # the entry list of Q breaks between its lines if it must
