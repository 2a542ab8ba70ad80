"""ALiBi (step biased) against the paper's slope function and Hugging Face's Bloom bias.

Oracles (tests/oracles.py): ``alibi_slopes_paper`` (the authors' get_slopes, copied),
``alibi_bias_matrix`` (-m_h (i - j) in float64) and ``alibi_bias_hf`` (transformers'
``build_alibi_tensor``, m_h j: the same weights, since a softmax row ignores a constant; HF
computes the slopes in float32, exact powers of 2 only up to 8 heads). The weights are
compared with torch's softmax(QK^T/sqrt(d) + bias) at 1e-10 in float64.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings, strategies as st

import attntrace
from attntrace.inputs.positional import paper_slopes
from mathcheck import markdown_math_spans, require_modules
from modesagree import assert_modes_agree

TOL = 1e-10


def _oracles():
    require_modules("torch", "transformers")
    import oracles

    return oracles


def _heads(t, step_id, h):
    return np.stack([t.step(step_id, i if h > 1 else None).value for i in range(1, h + 1)])


@pytest.mark.parametrize("h", list(range(1, 17)) + [24, 32, 48])
def test_slopes_are_the_papers(h):
    O = _oracles()
    q = np.ones((2, 2 * h))
    t = attntrace.run({"Q": q, "K": q, "V": q, "num_heads": h, "alibi": True})
    got = [float(t.step("biased", i if h > 1 else None).details["slope"]) for i in range(1, h + 1)]
    np.testing.assert_allclose(got, O.alibi_slopes_paper(h), atol=0, rtol=1e-14)  # the paper multiplies, we take 2^-r
    exact = attntrace.run({"Q": q.astype(int).tolist(), "K": q.astype(int).tolist(), "V": q.astype(int).tolist(),
                           "num_heads": h, "alibi": True}, mode="exact")
    for i, e in enumerate(paper_slopes(h)):
        assert exact.step("biased", i + 1 if h > 1 else None).details["slope"] == sp.Integer(2) ** sp.Rational(-e.numerator, e.denominator)


def test_paper_slopes_rule_for_12_heads_by_hand():
    """12 heads: the 8 slopes 2^-1 ... 2^-8, then every other slope of 16 heads: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5."""
    assert paper_slopes(12) == tuple(Fraction(k) for k in range(1, 9)) + (Fraction(1, 2), Fraction(3, 2), Fraction(5, 2), Fraction(7, 2))


@settings(max_examples=20, deadline=None)
@given(h=st.integers(1, 12), n=st.integers(1, 6), d=st.integers(1, 4), causal=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_weights_match_softmax_of_scores_plus_the_papers_bias(h, n, d, causal, seed):
    O = _oracles()
    import torch

    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((n, h * d)) for _ in range(3))
    spec = {"Q": q, "K": k, "V": v, "num_heads": h, "alibi": True}
    t = attntrace.run({**spec, "mask": "causal"} if causal else spec)
    bias = O.alibi_bias_matrix(h, n, n)
    np.testing.assert_allclose(_heads(t, "biased", h) - _heads(t, "scaled", h), bias, atol=TOL, rtol=0)
    qh, kh, vh = (x.reshape(n, h, d).transpose(1, 0, 2) for x in (q, k, v))
    mask = bias + (np.where(np.tril(np.ones((n, n), dtype=bool)), 0.0, -np.inf) if causal else 0.0)
    s = torch.tensor(qh @ kh.transpose(0, 2, 1) / np.sqrt(d) + mask, dtype=torch.float64)
    w = torch.softmax(s, dim=-1).numpy()
    np.testing.assert_allclose(_heads(t, "weights", h), w, atol=TOL, rtol=0)
    np.testing.assert_allclose(_heads(t, "Z", h), w @ vh, atol=TOL, rtol=0)


@pytest.mark.parametrize("h", [1, 2, 4, 8])
def test_weights_match_hugging_face_bloom_bias_under_a_causal_mask(h):
    """HF adds m_h j (not -m_h (i - j)): the rows differ by a constant, so the weights agree.
    Up to 8 heads HF's float32 slopes are exact powers of 2, so 1e-10 holds."""
    O = _oracles()
    rng = np.random.default_rng(h)
    n, d = 5, 3
    q, k, v = (rng.standard_normal((n, h * d)) for _ in range(3))
    t = attntrace.run({"Q": q, "K": k, "V": v, "num_heads": h, "alibi": True, "mask": "causal"})
    hf = O.alibi_bias_hf(h, n)  # (h, 1, n)
    qh, kh = (x.reshape(n, h, d).transpose(1, 0, 2) for x in (q, k))
    s = qh @ kh.transpose(0, 2, 1) / np.sqrt(d) + hf + np.where(np.tril(np.ones((n, n), dtype=bool)), 0.0, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(_heads(t, "weights", h), w, atol=TOL, rtol=0)


def test_with_a_kv_cache_the_new_query_sits_after_the_cached_keys():
    """The new token is at position 3 of 0..3: its bias is -m (3 - j), the last row of the full
    causal trace's bias (oracle alibi_bias_matrix with q_offset = 3), and so are its weights."""
    O = _oracles()
    rng = np.random.default_rng(4)
    X, Wq, Wk, Wv = rng.standard_normal((4, 4)), rng.standard_normal((4, 4)), rng.standard_normal((4, 4)), rng.standard_normal((4, 2))
    full = attntrace.run({"X": X, "W_Q": Wq, "W_K": Wk, "W_V": Wv, "num_heads": 2, "alibi": True, "mask": "causal"})
    step = attntrace.run({"X": X[3:], "W_Q": Wq, "W_K": Wk, "W_V": Wv, "num_heads": 2, "alibi": True,
                          "K_past": X[:3] @ Wk, "V_past": X[:3] @ Wv})
    np.testing.assert_allclose(_heads(step, "biased", 2) - _heads(step, "scaled", 2), O.alibi_bias_matrix(2, 1, 4, q_offset=3), atol=TOL, rtol=0)
    np.testing.assert_allclose(_heads(step, "biased", 2)[:, 0], _heads(full, "biased", 2)[:, 3], atol=TOL, rtol=0)
    np.testing.assert_allclose(_heads(step, "weights", 2)[:, 0], _heads(full, "weights", 2)[:, 3], atol=TOL, rtol=0)
    assert "(i + 3 - j)" in step.step("biased", 1).formula


@pytest.mark.parametrize("h", [12, 16])
def test_hugging_face_float32_slopes_agree_to_1e6_beyond_8_heads(h):
    """Above 8 heads HF computes the slopes in float32 (2^-0.5 is not a float32 power of 2):
    its weights differ from the paper's float64 ones by ~1e-8, within 1e-6 but not 1e-10."""
    O = _oracles()
    rng = np.random.default_rng(h)
    n, d = 6, 2
    q, k, v = (rng.standard_normal((n, h * d)) * 3 for _ in range(3))
    t = attntrace.run({"Q": q, "K": k, "V": v, "num_heads": h, "alibi": True, "mask": "causal"})
    qh, kh = (x.reshape(n, h, d).transpose(1, 0, 2) for x in (q, k))
    s = qh @ kh.transpose(0, 2, 1) / np.sqrt(d) + O.alibi_bias_hf(h, n) + np.where(np.tril(np.ones((n, n), dtype=bool)), 0.0, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    gap = np.abs(_heads(t, "weights", h) - w).max()
    assert 1e-12 < gap < 1e-6, gap


def test_given_slopes_and_start_from_scores():
    t = attntrace.run({"scores": [[1, 2, 3], [4, 5, 6], [7, 8, 9]], "scale": False, "alibi": {"slopes": [0.5]}})
    b = t.step("biased")
    assert b.inputs == ("scores",)
    np.testing.assert_allclose(b.value, [[1, 2.5, 4], [3.5, 5, 6.5], [6, 7.5, 9]], atol=0)
    assert t.step("weights").inputs == ("biased",)


@settings(max_examples=12, deadline=None)
@given(h=st.integers(1, 3), n=st.integers(1, 3), causal=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_symbolic_and_exact_agree_with_numeric(h, n, causal, seed):
    rng = np.random.default_rng(seed)
    nums = {k: rng.integers(-3, 4, (n, 2 * h)) / 2 for k in ("Q", "K", "V")}
    opts = {"num_heads": h, "alibi": True, **({"mask": "causal"} if causal else {})}
    numeric = attntrace.run({**nums, **opts})
    symbolic = attntrace.run({k: {"shape": [n, 2 * h]} for k in nums} | opts, mode="symbolic")
    exact = attntrace.run({k: [[str(sp.Rational(str(x))) for x in r] for r in v.tolist()] for k, v in nums.items()} | opts, mode="exact")
    shape = attntrace.run({**nums, **opts}, mode="shape")
    names = {"Q": "q", "K": "k", "V": "v"}  # num_heads splits the full-width matrices: q_13 is head 2's first column
    values = {sp.Symbol(f"{names[key]}_{{{i + 1}{j + 1}}}"): a[i, j] for key, a in nums.items() for i in range(n) for j in range(2 * h)}
    assert any(s.id == "biased" for s in numeric.steps)
    assert_modes_agree(numeric, symbolic=symbolic, values=values, exact=exact, shape=shape, atol=TOL)


def test_symbolic_bias_is_written_into_the_entries():
    t = attntrace.run({"Q": {"shape": [2, 2]}, "K": {"shape": [2, 2]}, "V": {"shape": [2, 1]}, "alibi": True}, mode="symbolic")
    b = t.step("biased").value
    assert sp.simplify(b[0, 0] - sp.Symbol("t_{11}")) == 0 and sp.simplify(b[1, 0] - (sp.Symbol("t_{21}") - sp.Rational(1, 256))) == 0
    assert {str(x) for x in b[1, 0].free_symbols} == {"t_{21}"}  # one level deep: the scaled score and a number


BASE = {"Q": [[1, 0], [0, 1]], "K": [[1, 1], [0, 1]], "V": [[1], [2]]}


@pytest.mark.parametrize("extra, message", [
    ({"alibi": {"slopes": [0.5, 0.25]}}, r"^alibi.slopes lists 2 slopes but there are 1 heads; give one per head$"),
    ({"alibi": {"slopes": [-0.5]}}, r"^alibi.slopes must be a list of positive numbers"),
    ({"alibi": {"slope": [0.5]}}, r"^unknown key 'slope' in alibi"),
    ({"alibi": "yes"}, r"^alibi must be true or a table"),
])
def test_bad_alibi_settings_are_one_line_errors(extra, message):
    with pytest.raises(attntrace.BadInput, match=message) as info:
        attntrace.run({**BASE, **extra})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("mode", ["numeric", "exact", "symbolic", "shape"])
def test_alibi_renders_everywhere_and_its_math_parses(mode, katex):
    spec = "alibi-causal" if mode != "symbolic" else {"Q": {"shape": [3, 2]}, "K": {"shape": [3, 2]}, "V": {"shape": [3, 1]},
                                                      "alibi": True, "mask": "causal"}
    t = attntrace.run(spec, mode=mode)
    for lang in ("en", "zh"):
        md = attntrace.render(t, format="md", lang=lang)
        assert katex(markdown_math_spans(md)) == []
        text = attntrace.render(t, format="text", lang=lang)
        assert "\\hat" not in text
        assert attntrace.render(t, format="tex", lang=lang)


def test_report_shows_slope_bias_and_sum():
    t = attntrace.run("alibi-causal")
    md = attntrace.render(t, format="md")
    assert "\\lambda^{(1)} = 2^{-4} = 0.0625" in md and "\\lambda^{(2)} = 2^{-8} \\approx 0.0039" in md
    assert "\\hat{T}^{(1)} = T^{(1)} + B^{(1)}" in md
    text = attntrace.render(t, format="text")
    assert "t'^(1)_41 = t^(1)_41 + b^(1)_41 = 2.1213 + (-0.1875) = 1.9338" in text  # 3/sqrt(2) - 3/16
    zh = attntrace.render(t, format="md", lang="zh")
    assert "距离偏置" in zh


def test_json_gives_the_slope():
    from attntrace.rendering.export import trace_to_dict

    d = trace_to_dict(attntrace.run("alibi-causal"))
    steps = [s for s in d["steps"] if s["id"] == "biased"]
    assert [s["alibi"] for s in steps] == [{"slope": 0.0625, "slope_exact": "2^(-4)"}, {"slope": 0.00390625, "slope_exact": "2^(-8)"}]
    assert [s["id"] for s in d["steps"] if s["head"] == 1][4:7] == ["scaled", "biased", "masked"]
