"""Golden reports for the seed article's examples, each checked by hand against the article.

Regenerate only on purpose: ATTNTRACE_REGEN_GOLDEN=1 pytest tests/test_render_golden.py,
then re-check the numbers below by hand before committing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import attntrace
from attntrace.rendering.renderer import render

GOLDEN = Path(__file__).resolve().parent / "golden"
REGEN = os.environ.get("ATTNTRACE_REGEN_GOLDEN") == "1"

ARTICLE = {
    "softmax_article": {"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False},
    "scaling_dk6": {"scores": [[6.0, 3.0], [1.0, -2.0]], "d_k": 6},
    "weighted_sum_symbolic": {"weights": {"symbol": "a", "shape": [2, 2]}, "V": {"symbol": "v", "shape": [2, 3]}},
    "concat_symbolic": {"Z": [{"shape": [2, 3]}, {"shape": [2, 3]}], "mode": "symbolic"},
}


def _golden(name: str, fmt: str, lang: str) -> str:
    text = render(attntrace.run(ARTICLE[name]), format=fmt, lang=lang)
    path = GOLDEN / f"{name}.{lang}.{fmt}"
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"missing golden {path.name}; regenerate with ATTNTRACE_REGEN_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8"), f"{path.name} changed; diff it, re-check by hand, regenerate on purpose"
    return text


@pytest.mark.parametrize("fmt", ["md", "tex", "text"])
@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("name", sorted(ARTICLE))
def test_golden(name, fmt, lang):
    _golden(name, fmt, lang)


def test_softmax_of_article_scores():
    """Checked by hand: row 1 max 0.8, shifted (0, -0.6); e^-0.6 = 0.5488; sum 1.5488;
    0.6457 = e^0.8/(e^0.8+e^0.2) = 1/1.5488, 0.3543 = 0.5488/1.5488. Row 2 max 0.7, shifted
    (-0.4, 0); e^-0.4 = 0.6703; 0.4013 = 0.6703/1.6703, 0.5987 = 1/1.6703. (The article says the
    weights stay 0.8/0.2 and 0.3/0.7: they do not; softmax of [0.8, 0.2] is [0.6457, 0.3543].)"""
    md = _golden("softmax_article", "md", "en")
    assert "m_{1} &= \\max_{j} s_{1j} = 0.8" in md and "s_{1j} - m_{1} &= \\left(0,\\ -0.6\\right)" in md
    assert "e^{s_{1j} - m_{1}} &= \\left(1,\\ 0.5488\\right)" in md and "e^{s_{1k} - m_{1}} &= 1.5488" in md
    assert "s_{2j} - m_{2} &= \\left(-0.4,\\ 0\\right)" in md and "e^{s_{2j} - m_{2}} &= \\left(0.6703,\\ 1\\right)" in md
    assert "\\left(0.6457,\\ 0.3543\\right)" in md and "\\left(0.4013,\\ 0.5987\\right)" in md


def test_scaling_by_sqrt_6():
    """Checked by hand: sqrt(6) = 2.44949 (the article: about 2.45); 6/sqrt(6) = sqrt(6) = 2.4495,
    3/sqrt(6) = 1.2247, 1/sqrt(6) = 0.4082, -2/sqrt(6) = -0.8165."""
    md = _golden("scaling_dk6", "md", "en")
    assert "\\sqrt{6} \\approx 2.4495" in md
    # row 1 at once: (6, 3) / sqrt(6) = (2.4495, 1.2247)
    assert ("t_{1j} &= \\frac{s_{1j}}{\\sqrt{6}} = \\frac{1}{\\sqrt{6}}\\left(6,\\ 3\\right) = "
            "\\left(2.4495,\\ 1.2247\\right)") in md
    assert "-0.8165" in md


def test_weighted_sum_2x2_by_2x3_in_article_order():
    """Checked by hand against the article's product: entry (1,1) is a_11 v_11 + a_12 v_21,
    entry (1,3) is a_11 v_13 + a_12 v_23, entry (2,1) is a_21 v_11 + a_22 v_21, all six in the
    article's term order."""
    md = _golden("weighted_sum_symbolic", "md", "en")
    assert ("\\begin{bmatrix}a_{11} v_{11} + a_{12} v_{21} & a_{11} v_{12} + a_{12} v_{22} & a_{11} v_{13} + a_{12} v_{23} \\\\ "
            "a_{21} v_{11} + a_{22} v_{21} & a_{21} v_{12} + a_{22} v_{22} & a_{21} v_{13} + a_{22} v_{23}\\end{bmatrix}") in md


def test_two_heads_concatenated_to_2_by_3h():
    """Checked by hand against the article's 3.3: two (2,3) heads give (2,6) = (2,3h) with h = 2;
    head 1 is columns 1-3 and head 2 columns 4-6 (the article's z_11..z_16 | z_21..z_26 layout,
    here named z^(1)_ij and z^(2)_ij)."""
    md = _golden("concat_symbolic", "md", "zh")
    assert "2 \\times (2 \\times 3) \\to (2 \\times 3 \\cdot 2) = (2 \\times 6)" in md
    # one display: the formula, then the entries with each head's block named under it
    assert "\\operatorname{Concat}\\left(Z^{(1)}, Z^{(2)}\\right) = \\left[\\;\\underbrace{" in md
    assert "}_{Z^{(1)}} \\quad \\underbrace{" in md and "}_{Z^{(2)}}\\;\\right]" in md
    assert "第 1 个头占第 1 到第 3 列。第 2 个头占第 4 到第 6 列。" in md
