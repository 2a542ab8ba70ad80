"""The test harness itself: the checkers must reject bad input, so that no test that
uses them can pass vacuously."""

from __future__ import annotations

import pytest

from mathcheck import (
    compile_latex,
    katex_check,
    katex_version,
    markdown_math_spans,
    pdf_to_png,
    require_tool,
    stray_math_delimiters,
)

BMATRIX = r"\begin{bmatrix} 1 & 2 \\ 3 & 4 \end{bmatrix}"


# --------------------------------------------------------------------------- KaTeX


def test_katex_is_the_pinned_version(katex):
    assert katex_version().startswith("0.19.")


def test_katex_accepts_good_math(katex):
    spans = [
        (r"\operatorname{softmax}(x)", False),
        (BMATRIX, True),
        (r"Q = X W^{Q}, \quad \frac{Q K^{\top}}{\sqrt{d_k}}", True),
        (r"\left[\begin{matrix}a_{11} & a_{12}\end{matrix}\right]", True),
        (r"\underbrace{a_{11} v_{11} + a_{12} v_{21}}_{z_{11}} \cdots", True),
        (r"\text{多头注意力}", False),
        (r"-\infty", False),
    ]
    assert katex(spans) == []


@pytest.mark.parametrize(
    "tex",
    [
        r"\softmax(x)",
        r"\frac{1}{2",
        r"a_{11}}",
        r"\begin{bmatrix} 1 & 2 \end{matrix}",
        r"\begin{bmatrix} 1 & 2",
        r"\left[ x",
    ],
)
@pytest.mark.parametrize("display", [False, True])
def test_katex_rejects_bad_math(katex, tex, display):
    errors = katex([(tex, display)])
    assert len(errors) == 1, errors
    assert "KaTeX parse error" in errors[0]


def test_katex_reports_each_bad_span_in_order(katex):
    spans = [("x", False), (r"\softmax", True), ("y", False), ("{", False)]
    errors = katex(spans)
    assert len(errors) == 2
    assert errors[0].startswith("span 1 (display)") and "softmax" in errors[0]
    assert errors[1].startswith("span 3 (inline)")


def test_katex_warnings_are_not_errors(katex):
    # Chinese in math mode only draws a strict-mode warning from KaTeX
    (result,) = katex_check([("注意力 = 1", False)])
    assert result["ok"] and result["warnings"]
    assert katex([]) == []


# --------------------------------------------------------------------------- LaTeX

AMSMATH_ARTICLE = r"""\documentclass{article}
\usepackage{amsmath}
\begin{document}
Attention:
\[ Q = X W^{Q} = \begin{bmatrix} 1 & 2 \\ 3 & 4 \end{bmatrix}, \quad
   \operatorname{softmax}\left(\frac{Q K^{\top}}{\sqrt{d_k}}\right) V \]
\end{document}
"""

CTEX_DOC = r"""\documentclass{ctexart}
\usepackage{amsmath}
\begin{document}
\section{多头注意力}
多头注意力把 $Q$ 按列分块：
\[ Z = \operatorname{softmax}\left(\frac{Q K^{\top}}{\sqrt{d_k}}\right) V,\quad
   W^{Q} = \begin{bmatrix} 1 & 0 \\ 0 & 1 \end{bmatrix} \]
\end{document}
"""

BROKEN_DOC = r"""\documentclass{article}
\usepackage{amsmath}
\begin{document}
$\softmax(x)$
\end{document}
"""


def test_xelatex_compiles_amsmath_bmatrix(xelatex):
    ok, log, pdf = xelatex(AMSMATH_ARTICLE)
    assert ok, log
    assert pdf.read_bytes().startswith(b"%PDF")


def test_xelatex_compiles_ctexart_with_chinese(xelatex, tmp_path):
    ok, log, pdf = xelatex(CTEX_DOC)
    assert ok, log
    full_log = (pdf.parent / "doc.log").read_text(encoding="utf-8", errors="replace")
    assert "Missing character" not in full_log  # every Chinese glyph was found (Fandol)
    require_tool("pdftoppm")
    png = pdf_to_png(pdf, tmp_path / "ctex.png", dpi=60)
    assert png.read_bytes().startswith(b"\x89PNG")


def test_xelatex_fails_on_undefined_control_sequence(xelatex):
    ok, log, pdf = xelatex(BROKEN_DOC)
    assert not ok and pdf is None
    assert "Undefined control sequence" in log


def test_compile_latex_keeps_each_document_apart(xelatex, tmp_path):
    _, _, first = xelatex(AMSMATH_ARTICLE)
    _, _, second = xelatex(AMSMATH_ARTICLE)
    assert first != second and first.parent.parent == tmp_path


# ------------------------------------------------------------------------ Markdown

SAMPLE_MD = r"""# Attention

Inline $q_{11} = x_{11} w^{Q}_{11}$ and \(d_k = 2\) and $$a = 1$$ inside a line.

$$
\begin{bmatrix} 1 & 2 \\ 3 & 4 \end{bmatrix}
$$

\[
Z = A V
\]

$$x = 1$$ (eq1)

A price of \$5 is not math, nor is `$code$`:

```
$fenced$
```
"""


def test_markdown_spans_both_delimiter_styles():
    spans = markdown_math_spans(SAMPLE_MD)
    assert spans == [
        (r"q_{11} = x_{11} w^{Q}_{11}", False),
        (r"d_k = 2", False),
        ("a = 1", True),
        (BMATRIX, True),
        ("Z = A V", True),
        ("x = 1", True),
    ]
    assert stray_math_delimiters(SAMPLE_MD) == []


def test_markdown_stray_dollar_is_reported():
    text = "Broken: $a + b and more text\n"
    assert markdown_math_spans(text) == []
    assert stray_math_delimiters(text) == ["Broken: $a + b and more text"]


def test_markdown_spans_feed_katex(katex):
    spans = markdown_math_spans(SAMPLE_MD + "\nBad: $\\softmax(x)$\n")
    errors = katex(spans)
    assert len(errors) == 1 and "softmax" in errors[0]


# --------------------------------------------------------------------------- tools


def test_require_tool_fails_under_ci(monkeypatch):
    import mathcheck

    monkeypatch.setitem(mathcheck._TOOLS, "nothing", lambda: "nothing is not installed")
    mathcheck.missing_tool.cache_clear()
    try:
        monkeypatch.setenv("CI", "true")
        with pytest.raises(pytest.fail.Exception):
            require_tool("nothing")
        monkeypatch.delenv("CI")
        with pytest.raises(pytest.skip.Exception):
            require_tool("nothing")
    finally:
        mathcheck.missing_tool.cache_clear()


def test_compile_latex_needs_the_engine():
    import mathcheck

    with pytest.raises(mathcheck.ToolMissing):
        compile_latex("x", engine="no-such-latex-engine")


def test_torch_is_installed(torch):
    assert torch.__version__.startswith("2.13.0")


# --------------------------------------------------------------------------- hypothesis


def test_hypothesis_is_deterministic_under_ci():
    """CI=true loads the profile of tests/conftest.py: derandomized, no database, a fixed number
    of examples; a test's own @settings (max_examples=...) keeps the other fields."""
    from hypothesis import given, settings, strategies as st

    import conftest
    from mathcheck import in_ci

    profile = settings.get_profile(conftest.HYPOTHESIS_CI)
    assert profile.derandomize and profile.database is None and profile.max_examples == 50 and profile.deadline is None
    if not in_ci():
        pytest.skip("CI is not set: hypothesis runs with its default, random profile")
    assert settings.default.derandomize and settings.default.database is None
    assert settings(max_examples=7).derandomize  # what the tests' decorators build

    seen: list[list[int]] = []

    @settings(max_examples=20)
    @given(st.lists(st.integers()))
    def draw(xs):
        seen[-1].append(hash(tuple(xs)))

    for _ in range(2):
        seen.append([])
        draw()
    assert seen[0] == seen[1] and len(seen[0]) == 20  # the same examples on every run
