"""Named width presets (`--width article|beamer|mkdocs|sphinx|jupyter|github`, issue 22 item 9).

The Markdown sites typeset with MathJax, so their equations are measured with MathJax itself
(tests/tools/mathjax_width.js: MathJax 4, TeX input, SVG output, errors thrown): a display is
width_ex * font px * x-height px wide on the page, and must fit the preset's column. The LaTeX
presets are compiled with xelatex at their text width, and no line may be overfull.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import attntrace
from attntrace.model.errors import BadInput
from attntrace.rendering.layout import PRESETS, parse_width

#: examples with the widest equations: a 6-wide block, GQA, RoPE, the backward pass, SwiGLU
EXAMPLES = ["sentence-4x6", "encoder-block-post-ln", "gqa-4-query-2-kv", "rope-4-tokens-half", "backward-2x2", "llama-block-tiny"]
MATHJAX_PRESETS = [n for n, p in PRESETS.items() if p.engine == "mathjax"]


def test_every_preset_is_a_width():
    for name in PRESETS:
        for fmt in ("md", "tex", "text"):
            w = parse_width(name, fmt, "en")
            assert 20 < w.em < 60, (name, w)
    assert parse_width("article", "tex", "en").pt == pytest.approx(345.0)
    assert parse_width("MkDocs", "md", "en") == parse_width("mkdocs", "md", "en")
    # MkDocs Material's 688px column is narrower than the 760px KaTeX default
    assert parse_width("mkdocs", "md", "en").em < parse_width("760px", "md", "en").em


def test_an_unknown_preset_says_which_exist():
    with pytest.raises(BadInput, match="mkdocs, sphinx"):
        parse_width("docusaurus", "md", "en")


def test_the_cli_takes_a_preset_and_rejects_a_bad_one():
    ok = subprocess.run([sys.executable, "-m", "attntrace.cli", "run", "scaling-dk6", "--format", "md", "--width", "sphinx"],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "$$" in ok.stdout, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "attntrace.cli", "run", "scaling-dk6", "--width", "wide"], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "beamer" in bad.stderr


@pytest.fixture(scope="module")
def traces():
    return {name: attntrace.run(name) for name in EXAMPLES}


@pytest.mark.parametrize("preset", MATHJAX_PRESETS)
def test_no_equation_overflows_a_mathjax_site(preset, traces):
    import mathcheck

    mathcheck.require_tool("mathjax")
    p = PRESETS[preset]
    column = float(p.column[:-2])
    spans, where = [], []
    for name, t in traces.items():
        for lang in ("en", "zh"):
            md = attntrace.render(t, format="md", lang=lang, width=preset)
            for tex, display in mathcheck.markdown_math_spans(md):
                if display:
                    spans.append((tex, True))
                    where.append(f"{name} {lang}")
    measured = mathcheck.mathjax_widths(spans)
    assert len(measured) == len(spans) > 300
    errors = [(w, m["error"]) for w, m in zip(where, measured) if m["error"]]
    assert not errors, errors[:5]
    px = [m["width_ex"] * p.font * p.x_height for m in measured]
    over = [(w, round(x), tex[:80]) for w, x, (tex, _) in zip(where, px, spans) if x > column]
    assert not over, f"{preset}: {len(over)} of {len(spans)} displays wider than {column:.0f}px: {over[:3]}"
    # the check sees wide equations: the widest uses most of the column
    assert max(px) > 0.6 * column


def test_the_mathjax_measure_is_real():
    import mathcheck

    mathcheck.require_tool("mathjax")
    ten, broken = mathcheck.mathjax_widths([("\\hspace{10em}", True), ("\\frac{a}{b", True)])
    assert ten["width_ex"] == pytest.approx(22.624, abs=0.01)  # MathJax 4's em in ex (layout.MATHJAX_EX_PER_EM)
    assert broken["error"] and broken["width_ex"] is None


@pytest.mark.parametrize("preset", ["article", "beamer"])
def test_latex_presets_have_no_overfull_line(preset, tmp_path):
    import mathcheck

    mathcheck.require_tool("xelatex")
    for name in ("encoder-block-post-ln", "gqa-4-query-2-kv"):
        tex = attntrace.render(attntrace.run(name), format="tex", standalone=True, width=preset)
        used = float(re.search(r"textwidth=([0-9.]+)pt", tex).group(1))
        assert used == pytest.approx(float(PRESETS[preset].column[:-2]), abs=0.1)
        ok, log_tail, pdf = mathcheck.compile_latex(tex, workdir=tmp_path)
        assert ok, log_tail
        log = pdf.with_suffix(".log").read_text(encoding="utf-8", errors="replace")
        assert not re.findall(r"Overfull \\hbox \((\d+\.\d+)pt too wide\)", log), (preset, name)
