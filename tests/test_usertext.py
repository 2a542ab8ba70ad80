"""Math in titles and descriptions (issue 10): `$...$` spans parsed by a whitelist parser and
printed by attntrace, everything else escaped; user LaTeX never reaches the output."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from attntrace.teach.examples import example_paths
from attntrace.inputs.usertext import MAX_SPANS_PER_TEXT, format_user_text, heading_text, inline_math_for, render_math
from attntrace.inputs.textescape import escape_md, escape_tex, escape_text
from mathcheck import markdown_math_spans, stray_math_delimiters

ROOT = Path(__file__).resolve().parents[1]
ESC = {"md": escape_md, "tex": escape_tex, "text": escape_text}
FORMATS = ("md", "tex", "text")

# source -> (LaTeX for md and tex, plain for text)
CASES = {
    "sqrt(d_k)": (r"\sqrt{d_{k}}", "sqrt(d_k)"),
    "d_k = 6": ("d_{k} = 6", "d_k = 6"),
    "sqrt(6)": (r"\sqrt{6}", "sqrt(6)"),
    "sqrt(6) ≈ 2.449": (r"\sqrt{6} \approx 2.449", "sqrt(6) ~ 2.449"),
    "sqrt(6) ~ 2.449": (r"\sqrt{6} \approx 2.449", "sqrt(6) ~ 2.449"),
    "-(q - k)^2": (r"-\left(q - k\right)^{2}", "-(q - k)^2"),  # not expanded, not reordered
    "2*a + b": ("2 a + b", "2*a + b"),
    "b + 2*a": ("b + 2 a", "b + 2*a"),
    "q - k": ("q - k", "q - k"),
    "2*q*k - k^2": ("2 q k - k^{2}", "2*q*k - k^2"),
    "q*k = 178*h": ("q k = 178 h", "q*k = 178*h"),
    "z_11 = a_11*v_11 + a_12*v_21": ("z_{11} = a_{11} v_{11} + a_{12} v_{21}", "z_11 = a_11*v_11 + a_12*v_21"),
    "W_O": ("W_{O}", "W_O"),
    "W_Q": ("W_{Q}", "W_Q"),
    "X_kv": ("X_{\\mathrm{kv}}", "X_kv"),
    "d_ff": ("d_{\\text{ff}}", "d_ff"),
    "d_model": (r"d_{\text{model}}", "d_model"),
    "d_{model}": (r"d_{\text{model}}", "d_model"),
    "a_ij": ("a_{ij}", "a_ij"),
    "v_{i,j}": ("v_{i,j}", "v_i,j"),
    "w^Q_12": ("w^{Q}_{12}", "w^Q_12"),
    "z^{(2)}_{11}": ("z^{(2)}_{11}", "z^(2)_11"),
    "K^T": ("K^{T}", "K^T"),
    "alpha": (r"\alpha", "alpha"),
    "alpha_k": (r"\alpha_{k}", "alpha_k"),
    "Omega": (r"\Omega", "Omega"),
    "h*d_v": ("h d_{v}", "h*d_v"),
    "Q = X*W_Q": ("Q = X W_{Q}", "Q = X*W_Q"),
    "12/sqrt(6) = 4.899": (r"\frac{12}{\sqrt{6}} = 4.899", "12/sqrt(6) = 4.899"),
    "q*k/sqrt(d_k)": (r"\frac{q k}{\sqrt{d_{k}}}", "q*k/sqrt(d_k)"),
    "1/sqrt(6)": (r"\frac{1}{\sqrt{6}}", "1/sqrt(6)"),
    "(a + b)/(c + d)": (r"\frac{a + b}{c + d}", "(a + b)/(c + d)"),
    "(a + b)*(c - d)": (r"\left(a + b\right) \left(c - d\right)", "(a + b)*(c - d)"),
    "a - (b - c)": (r"a - \left(b - c\right)", "a - (b - c)"),
    "a*(-b)": (r"a \left(-b\right)", "a*(-b)"),
    "3 - -2": (r"3 - \left(-2\right)", "3 - (-2)"),
    "(-2)^2": (r"\left(-2\right)^{2}", "(-2)^2"),
    "-2^2": ("-2^{2}", "-2^2"),
    "2*3": (r"2 \cdot 3", "2*3"),
    "2^-1": ("2^{-1}", "2^(-1)"),
    "x^(1/2)": (r"x^{\frac{1}{2}}", "x^(1/2)"),
    "exp(-x^2)": ("e^{-x^{2}}", "exp(-x^2)"),
    "2**3": ("2^{3}", "2^3"),
    "0.25": ("0.25", "0.25"),  # numbers are quoted as written, not turned into fractions
    "2.50": ("2.50", "2.50"),
    ".5": ("0.5", "0.5"),
    "1e-3": (r"1 \times 10^{-3}", "1e-3"),
    "-oo": (r"-\infty", "-inf"),
    "-inf": (r"-\infty", "-inf"),
    "x -> 0": (r"x \to 0", "x -> 0"),
    "a <= b < c": (r"a \le b < c", "a <= b < c"),
    "a >= b > c": (r"a \ge b > c", "a >= b > c"),
    "a != b": (r"a \ne b", "a != b"),
    "√6": (r"\sqrt{6}", "sqrt(6)"),
    "h·d_v − 1": ("h d_{v} - 1", "h*d_v - 1"),
    "((((x))))": ("x", "x"),
    "  x  +  1 ": ("x + 1", "x + 1"),
}

NOT_MATH = [
    "", " ", "q k", "2a", "softmax(x)", "x^{2}", "x^y^z", "v_1x", "a = ", "= b", "(a", "a)", "sqrt 6", "x_{}",
    "\\input{x}", "<script>", "\\(x\\)", "x & y", "__import__('os')", "d_k = 4，", "(2, 3)", "1 2", "x" * 201,
    "(" * 21 + "x" + ")" * 21, "x" + "^x" * 30, "a\nb\\", "Ω", "x{y}",
]


@pytest.mark.parametrize("source", list(CASES))
def test_spans_print_in_every_format(source):
    tex, plain = CASES[source]
    assert render_math(source, "md") == tex
    assert render_math(source, "tex") == tex
    assert render_math(source, "text") == plain


@pytest.mark.parametrize("source", NOT_MATH)
def test_what_is_not_math_is_none(source):
    for fmt in FORMATS:
        assert render_math(source, fmt) is None


def test_format_user_text_in_all_three_formats():
    title = "Scaling by $sqrt(d_k)$ with $d_k = 6$"
    assert format_user_text(title, "md") == r"Scaling by $\sqrt{d_{k}}$ with $d_{k} = 6$"
    assert format_user_text(title, "tex") == r"Scaling by \(\sqrt{d_{k}}\) with \(d_{k} = 6\)"
    assert format_user_text(title, "text") == "Scaling by sqrt(d_k) with d_k = 6"
    brackets = inline_math_for("md", "brackets")
    assert format_user_text(title, "md", inline_math=brackets) == r"Scaling by \(\sqrt{d_{k}}\) with \(d_{k} = 6\)"
    # the prose around the math is escaped with the format's escaper
    text = "A *b* & c_1 $W_O$ 100% #1"
    assert format_user_text(text, "md") == escape_md("A *b* & c_1 ") + "$W_{O}$" + escape_md(" 100% #1")
    assert format_user_text(text, "tex") == escape_tex("A *b* & c_1 ") + r"\(W_{O}\)" + escape_tex(" 100% #1")
    assert format_user_text(text, "text") == "A *b* & c_1 W_O 100% #1"


@pytest.mark.parametrize("fmt", FORMATS)
def test_text_without_math_is_just_escaped(fmt):
    for text in ["", "plain title", "a_b^c & # % ~ {y} | *bold*", "原文的 softmax 例子", "x\ty\n z"]:
        assert format_user_text(text, fmt) == ESC[fmt](text)


def test_escaper_can_be_passed():
    assert format_user_text("a $x$ b", "md", escape=str.upper) == "A $x$ B"


def test_dollars_escaped_unmatched_and_empty():
    assert format_user_text(r"a \$5 bill and $x$", "md") == r"a \$5 bill and $x$"
    assert format_user_text(r"a \$5 bill and $x$", "text") == "a $5 bill and x"
    assert format_user_text("costs $5", "tex") == r"costs \$5"
    assert format_user_text("$$", "md") == r"\$\$"
    assert format_user_text("x $$y$$ z", "text") == "x $$y$$ z"  # no display math from a title
    assert format_user_text("x $$y$$ z", "md") == r"x \$\$y\$\$ z"
    # a failed span is literal text with its dollars; its closing dollar may open a span
    assert format_user_text("costs $5 or $x$", "md") == r"costs \$5 or $x$"
    assert format_user_text("$a b$ and $c$", "text") == "$a b$ and c"
    # two spans in a row stay two inline spans in Markdown
    assert format_user_text("$a$$b$", "md") == "$a$ $b$"
    assert format_user_text("$a$$b$", "tex") == r"\(a\)\(b\)"


HOSTILE = [
    r"$\input{/etc/passwd}$", "$<script>alert(1)</script>$", "$$", "$", "$" * 10_000, "$x" * 5_000,
    "$" + "(" * 5_000 + "$", "$" + "(" * 20 + "x" + ")" * 20 + "$" + "$" + "(" * 21 + "x" + ")" * 21 + "$",
    r"$\(x\)$ $\[y\]$ $\begin{x}$", "$x}$ ${x$ $\\$", "$" + "-" * 300 + "x$", "$`x`$ $[a](b)$ $*a*$",
    "$x$" + "\\" * 3 + "$", "$\x00x\x07$", "$x$\u202e$y$", "$ x\n= 1$", "$1e400000$", "$9" * 300 + "$",
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_text_is_escaped_and_never_raises(text):
    start = time.perf_counter()
    md = format_user_text(text, "md")
    tex = format_user_text(text, "tex")
    plain = format_user_text(text, "text")
    assert time.perf_counter() - start < 2
    assert "\\input" not in md.replace("\\\\input", "") and "<script>" not in md
    assert "\\input" not in tex and "\\begin" not in tex and "\\[" not in tex
    assert "\x00" not in plain and "\x07" not in plain
    assert not stray_math_delimiters(md)
    for span, display in markdown_math_spans(md):
        assert not display
        assert re.fullmatch(r"[A-Za-z0-9{}^_()\\ .,=<>+-]*", span), span
        assert "\\" not in span or re.fullmatch(r"(\\(left|right|sqrt|frac|text|infty|cdot|times|approx|le|ge|ne|to)|[^\\])*", span)


def test_a_span_that_fails_is_shown_whole():
    md = format_user_text(r"see $\input{x}$ here", "md")
    assert md == escape_md(r"see $\input{x}$ here")
    tex = format_user_text(r"see $\input{x}$ here", "tex")
    assert tex == escape_tex(r"see $\input{x}$ here") and r"\textbackslash{}input" in tex


def test_only_so_many_spans_are_parsed():
    text = "$x$ " * (MAX_SPANS_PER_TEXT + 5)
    out = format_user_text(text, "text")
    assert out.count("$") == 10 and out.startswith("x x ")


def test_cjk_and_inline_math_get_a_space():
    assert format_user_text("自注意力$x$的例子", "md") == "自注意力 $x$ 的例子"
    assert format_user_text("自注意力$x$的例子", "tex") == r"自注意力 \(x\) 的例子"
    assert format_user_text("自注意力$x$的例子", "text") == "自注意力 x 的例子"
    # full-width punctuation, existing spaces and Latin letters are left alone
    assert format_user_text("分数（$d_k = 4$，除以 $sqrt(2)$）", "md") == r"分数（$d_{k} = 4$，除以 $\sqrt{2}$）"
    assert format_user_text("按 $x$ 缩放", "md") == "按 $x$ 缩放"
    assert format_user_text("かな$x$한글", "md") == "かな $x$ 한글"
    assert format_user_text("a$x$b", "md") == "a$x$b"
    # a failed span glued to CJK stays as it was
    assert format_user_text("自注意力$x y$的", "text") == "自注意力$x y$的"


def test_greek_names_match_sympys_latex():
    sympy = pytest.importorskip("sympy")
    from attntrace.inputs.expr import GREEK
    from attntrace.rendering.printing import greek_name

    for name in sorted(GREEK):
        want = greek_name(name) if name == "epsilon" else sympy.latex(sympy.Symbol(name))  # attntrace: \varepsilon
        assert render_math(name, "md") == want, name
        assert render_math(name, "text") == name


def test_same_latex_as_the_entry_printer_where_sympy_keeps_the_form():
    """Where evaluation does not change the form, the span prints as attntrace's SymPy printer
    prints the parsed entry (spaces aside). Where it does, the span keeps the author's form:
    SymPy writes 2*a + b as b + 2 a, 2*q*k - k^2 as - k^{2} + 2 k q and 0.25 as 1/4."""
    from attntrace.inputs.expr import parse_expr
    from attntrace.rendering.printing import latex_expr

    for source in ["sqrt(6)", "a + 2*b", "a_11*v_11 + a_12*v_21", "x^2", "exp(x)", "w^Q_12", "alpha_1", "a/b",
                   "(a + b)*(c + d)", "-(q - k)^2", "sqrt(d)", "-x", "x^10"]:
        ours = render_math(source, "md")
        theirs = latex_expr(parse_expr(source))
        assert ours.replace(" ", "") == theirs.replace(" ", ""), (source, ours, theirs)


def test_usertext_never_imports_sympy():
    code = ("import sys\nfrom attntrace.inputs.usertext import format_user_text\n"
            "for f in ('md', 'tex', 'text'):\n"
            "    format_user_text('Scaling by $sqrt(d_k)$, $alpha_1 = -(q - k)^2/2$, $Omega$ $2.5e3$', f)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sympy')[:3])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def test_bad_format_is_refused():
    with pytest.raises(ValueError):
        format_user_text("x", "html")
    with pytest.raises(ValueError):
        inline_math_for("md", "parens")


# ----------------------------------------------------------------------------- examples

def _example_texts():
    for path in example_paths():
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        for key in ("title", "description", "title_zh", "description_zh"):
            if data.get(key):
                yield path.stem, key, data[key]


def test_every_math_span_of_the_examples_parses():
    spans = 0
    for name, key, text in _example_texts():
        assert "$" not in format_user_text(text, "text"), (name, key, text)
        spans += text.count("$") // 2
    assert spans >= 40


def test_math_in_markdown_parses_in_katex(katex):
    texts = [text for _, _, text in _example_texts()]
    texts += [f"x ${s}$ y" for s in CASES] + ["自注意力$x$的例子", r"$a$$b$ and \$ and $c$"] + HOSTILE[:4]
    spans = []
    for text in texts:
        md = format_user_text(text, "md")
        found = markdown_math_spans(md)
        assert len(found) == len(re.findall(r"(?<!\\)\$", md)) // 2, md  # every span is seen as math
        assert not stray_math_delimiters(md), md
        brackets = format_user_text(text, "md", inline_math=inline_math_for("md", "brackets"))
        assert markdown_math_spans(brackets) == found, brackets
        spans += found
    assert len(spans) > len(CASES) + 40
    assert katex(spans) == []


def test_titles_with_math_compile_with_xelatex(xelatex):
    lines = []
    for name, key, text in _example_texts():
        body = format_user_text(text, "tex")
        lines.append(f"\\section*{{{body}}}" if key.startswith("title") else body + "\n")
    lines += [format_user_text(f"case ${s}$ 例子${s}$的", "tex") + "\n" for s in CASES]
    lines += [format_user_text(t, "tex") + "\n" for t in HOSTILE if len(t) < 400 and "\u202e" not in t]  # no glyph
    doc = "\\documentclass{ctexart}\n\\usepackage{amsmath}\n\\begin{document}\n" + "\n".join(lines) + "\n\\end{document}\n"
    ok, log, pdf = xelatex(doc)
    assert ok, log
    assert "Missing character" not in pdf.with_suffix(".log").read_text(encoding="utf-8", errors="replace")


# ----------------------------------------------------------------------------- check reports

def test_check_report_titles_show_math():
    import attntrace
    from attntrace.grading.checker import render_report

    spec = {"scores": [[0.8, 0.2]], "scale": False, "title": r"Softmax of $-(q - k)^2$ <b> \input{x} $\input{y}$"}
    report = attntrace.check(spec, {"weights": [[0.8, 0.2]]})
    md = render_report(report, format="md").splitlines()[0]
    assert md.endswith(r"Softmax of $-\left(q - k\right)^{2}$ &lt;b&gt; \\input{x} \$\\input{y}\$")
    tex = render_report(report, format="tex")
    assert r"Softmax of \(-\left(q - k\right)^{2}\) \textless{}b\textgreater{} \textbackslash{}input\{x\}" in tex
    assert "\\input{x}" not in tex and "\\input{y}" not in tex
    assert render_report(report, format="text").splitlines()[0].endswith(r"Softmax of -(q - k)^2 <b> \input{x} $\input{y}$")
    assert r"\(-\left(q" in render_report(report, format="md", math_delimiters="brackets").splitlines()[0]


@pytest.mark.parametrize("fmt, title, heading", [
    ("md", "Scaling by $sqrt(d_k)$ with $d_k = 6$", "Scaling by √d\\_k with d\\_k = 6"),
    ("tex", "Scaling by $sqrt(d_k)$", "Scaling by \\ensuremath{\\surd}d\\textsubscript{k}"),
    ("tex", "projection $W_O$, $2*q*k$, $x ~ 2*3$, $sqrt(a + b)$", "projection W\\textsubscript{O}, 2qk, x \\ensuremath{\\approx} 2\\ensuremath{\\cdot}3, \\ensuremath{\\surd}(a + b)"),
    ("md", "按 $sqrt(d_k)$ 缩放", "按 √d\\_k 缩放"),
    ("tex", "costs $5 or $\\input{x}$", "costs \\$5 or \\$\\textbackslash{}input\\{x\\}\\$"),
])
def test_a_heading_sets_the_titles_math_as_text(fmt, title, heading):
    """A heading holds no math delimiters, and its math reads as math, not as the entry syntax
    (the heading read "Scaling by sqrt(d_k) with d_k = 6" and "W_O")."""
    out = heading_text(title, fmt)
    assert out == heading
    assert "\\(" not in out and "$" not in out.replace("\\$", "")


def test_tex_quotes_open_and_close():
    """TeX prints a bare " as a closing quote: "the cat sat" in a description must open with `` and close
    with ''; in code (\\texttt{"weights@2" = ...}) a quote stays a character."""
    assert format_user_text('processed "the cat sat" and ("x") $d_k = 4$ "y"', "tex").startswith(
        "processed ``the cat sat'' and (``x'') ")
    assert format_user_text('processed "the cat sat" and ("x") $d_k = 4$ "y"', "tex").endswith(" ``y''")
    assert escape_tex('"weights@2" = 1') == '"weights@2" = 1'


def test_relation_pattern_reads_each_relation_whole():
    """The relations' pattern (branches, for a cheap compile) takes every relation whole, the
    two-character ones before their first character, and nothing else."""
    from attntrace.inputs.usertext import _REL, _RELATIONS

    pattern = re.compile(_REL)
    for rel in _RELATIONS:
        assert pattern.match(rel + "x").group(0) == rel
    for text in ("x", "+", "-", "!", "a<=b", "≈≈"[1:] + "x", " ="):
        m = pattern.match(text)
        assert (m.group(0) if m else None) == next((r for r in sorted(_RELATIONS, key=len, reverse=True)
                                                   if text.startswith(r)), None)
    assert render_math("a ≤ b → c ≠ d", "text") == "a <= b -> c != d"
