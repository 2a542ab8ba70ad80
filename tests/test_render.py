"""Reports render everywhere: every Markdown math span parses in real KaTeX, every standalone
LaTeX document compiles with xelatex, user text is escaped, and cost follows what is shown."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from mathcheck import markdown_math_spans, stray_math_delimiters
from test_render_specs import SPECS

import attntrace
from attntrace.rendering import printing
from attntrace.model.errors import BadInput
from attntrace.rendering.renderer import environment, render, render_step

TRACES = {name: attntrace.run(spec) for name, spec in SPECS.items()}


def test_katex_parses_every_span(katex):
    spans, stray = [], []
    for name, t in TRACES.items():
        for lang in ("en", "zh"):
            for delims in ("dollars", "brackets"):
                md = render(t, format="md", lang=lang, math_delimiters=delims)
                found = markdown_math_spans(md)
                assert found, name
                spans += found
                stray += [(name, lang, delims, s) for s in stray_math_delimiters(md)]
    assert not stray
    assert katex(spans) == []
    assert len(spans) > 1000


def test_display_math_on_own_lines():
    md = render(TRACES["numeric"], format="md")
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if "$$" in line:
            assert line == "$$"
    opens = [i for i, line in enumerate(lines) if line == "$$"][::2]
    assert all(lines[i - 1] == "" for i in opens)
    md = render(TRACES["numeric"], format="md", math_delimiters="brackets")
    assert "$$" not in md and "\\[" in md


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_standalone_latex_compiles(xelatex, name, lang):
    tex = render(TRACES[name], format="tex", lang=lang, standalone=True)
    assert ("ctexart" in tex) == (lang == "zh")
    ok, log, _ = xelatex(tex)
    assert ok, log


def test_fragment_compiles_in_minimal_document(xelatex):
    frag = render(TRACES["multihead"], format="tex")
    assert frag.startswith("% attntrace") and "amsmath" in frag.splitlines()[0]
    assert "\\documentclass" not in frag
    ok, log, _ = xelatex("\\documentclass{article}\n\\usepackage{amsmath}\n\\begin{document}\n" + frag + "\\end{document}\n")
    assert ok, log


EVIL = ["\\input{/etc/passwd}", "<script>alert(1)</script>", "a_b^c $x$ & # % ~ {y} | *bold* [l](u) `c`"]


@pytest.mark.parametrize("title", EVIL)
def test_markdown_escapes_user_text(title):
    t = attntrace.run({**SPECS["scores"], "title": title, "description": title, "tokens": [title, "b"]})
    md = render(t, format="md")
    assert "<script>" not in md and "&lt;script&gt;" in md or "script" not in title
    assert not stray_math_delimiters(md)
    for tex, _ in markdown_math_spans(md):
        assert "passwd" not in tex and "script" not in tex and "bold" not in tex


def test_latex_escapes_user_text_and_never_reads_files(xelatex):
    title = "\\input{/etc/passwd} <script>alert(1)</script> $x$ & # % ~ _ ^"
    t = attntrace.run({**SPECS["scores"], "title": title, "tokens": ["\\input{/etc/passwd}", "b"]})
    tex = render(t, format="tex", standalone=True)
    assert "\\input{/etc/passwd}" not in tex
    assert "\\textbackslash{}input\\{/etc/passwd\\}" in tex
    ok, log, pdf = xelatex(tex)
    assert ok, log
    if subprocess.run(["which", "pdftotext"], capture_output=True).returncode == 0:
        text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True).stdout
        assert "\\input{/etc/passwd}" in text.replace("\n", " ")
        assert "root:" not in text
    assert b"root:x:" not in pdf.read_bytes()


def test_unknown_and_bad_options_are_bad_input():
    t = TRACES["scores"]
    with pytest.raises(BadInput):
        render(t, format="md", colour="red")
    with pytest.raises(BadInput):
        render(t, format="docx")  # (html is a format since issue 25: tests/test_html.py)
    with pytest.raises(BadInput):
        render(t, format="md", lang="fr")
    with pytest.raises(BadInput):
        render(t, format="md", precision=-1)
    with pytest.raises(BadInput):
        render(t, format="md", max_size=1)


def test_jupyter_and_package_entry_points():
    t = TRACES["scores"]
    assert t._repr_markdown_().startswith("# ")
    assert "\\section*" in t._repr_latex_()
    assert attntrace.render(t, format="text") == render(t, format="text")


def test_render_step_and_environment(tmp_path):
    t = TRACES["scores"]
    block = render_step(t, t.step("weights"), format="md")
    assert "0.6457" in block and block.startswith("\n### ") or block.startswith("### ")
    assert render_step(t, "weights", format="text", lang="zh").strip()
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "weights.j2").write_text("CUSTOM {{ vm.name }}\n", encoding="utf-8")
    assert render_step(t, "weights", format="md", template_dir=tmp_path).strip() == "CUSTOM A"
    assert "CUSTOM A" in render(t, format="md", template_dir=tmp_path)
    env = environment()
    with pytest.raises(Exception):
        env.from_string("{{ missing }}").render()


def test_precision_and_negative_zero():
    assert printing.tex_number(-0.00001, 4) == "0.0000"  # rounds to zero, is not zero; no "-0.0000"
    assert printing.tex_number(1.5, 4) == "1.5"
    assert printing.tex_number(2.0, 4) == "2"
    assert printing.tex_number(float("-inf"), 4) == "-\\infty"
    t = attntrace.run({"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False})
    assert "0.65" in render(t, format="md", precision=2) and "0.6457" not in render(t, format="md", precision=2)


def test_masked_weights_are_exact_zero_and_shown_as_minus_infinity():
    md = render(TRACES["masked"], format="md", rows=[1, 2])  # row 1 asked for: by default a one-key row is not written out
    assert "-\\infty" in md  # the masked scores, and their shifted values in the softmax rows
    # row 1 of a causal mask keeps one key: its shifted scores are (0, -inf, -inf), the weights exactly (1, 0, 0)
    assert "\\left(0,\\ -\\infty,\\ -\\infty\\right)" in md and "\\left(1,\\ 0,\\ 0\\right)" in md
    # row 2 keeps two keys 45.25 apart: e^-45.25 is tiny but not 0 and is shown so, unlike the masked 0
    assert "\\left(1,\\ 2.2 \\cdot 10^{-20},\\ 0\\right)" in md
    # by default the softmax rows are rows with more than one key: rows 2 and 3, not row 1
    default = render(TRACES["masked"], format="md")
    assert "m_{2}" in default and "m_{3}" in default and "m_{1}" not in default


def test_text_format_is_plain():
    text = render(TRACES["multihead"], format="text")
    assert "$" not in text and "\\begin" not in text and "Concat(" in text


def test_cost_follows_what_is_shown():
    """A 128 x 768, 12-head numeric trace formats about as many entries as a 32 x 96 one:
    every matrix is elided to what fits the page, so the cost cannot grow with the size. (Not
    exactly as many: how many columns fit depends on how many digits the numbers have.)"""
    rng = np.random.default_rng(0)

    def counted(n, d):
        spec = {"X": rng.normal(size=(n, d)), "W_Q": rng.normal(size=(d, d)), "W_K": rng.normal(size=(d, d)),
                "W_V": rng.normal(size=(d, d)), "W_O": rng.normal(size=(d, d)), "num_heads": 12}
        t = attntrace.run(spec)
        printing.STATS["entries"] = 0
        md = render(t, format="md")
        return printing.STATS["entries"], md

    big, md = counted(128, 768)
    small, _ = counted(32, 96)
    assert 0.8 * small <= big <= 1.25 * small
    assert big < 12 * 2000  # a few hundred entries per head, never 128*768
    assert "128 \\times 768" in md and "\\cdots" in md and "\\ddots" in md
