"""KV-cache decoding: K_cache = [K_past; K], V_cache = [V_past; V], then attention as usual.

Checked against two independent references at 1e-10 in float64: attntrace's own full
causal trace of the whole sequence (the new token's row of it; a different computation:
no cache, a causal mask over all tokens), and Hugging Face's `LlamaForCausalLM` decoding
one token with a `DynamicCache` (tests/oracles.py `llama_kv_cache_step`: the cached K after
RoPE, the new token's q after RoPE, its weights over all cached positions, the layer's
output). Exact and symbolic mode agree with numeric by substitution.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings, strategies as st

import attntrace
from attntrace.algebra.substitute import substitute
from attntrace.rendering.export import trace_to_dict
from mathcheck import require_modules

TOL = 1e-10


# --------------------------------------------------------------- against full causal attention

@settings(max_examples=30, deadline=None)
@given(st.integers(2, 7), st.integers(1, 3), st.integers(1, 4), st.sampled_from([1, 2, 3]), st.integers(0, 2**32 - 1))
def test_one_step_equals_the_last_row_of_full_causal_attention(n, new, d_model, heads, seed):
    """Cache of n - new tokens (their K, V = rows of X W_K, X W_V), the last `new` tokens
    projected alone: every step's rows equal the last rows of the full causal trace."""
    new = min(new, n - 1)
    rng = np.random.default_rng(seed)
    d_k = 2
    X = rng.standard_normal((n, d_model))
    W = {k: rng.standard_normal((d_model, heads * d_k)) for k in ("W_Q", "W_K", "W_V")}
    W_O = rng.standard_normal((heads * d_k, d_model))
    full = attntrace.run({"X": X, **W, "W_O": W_O, "num_heads": heads, "mask": "causal"})
    spec = {"X": X[-new:], **W, "W_O": W_O, "num_heads": heads,
            "K_past": X[:-new] @ W["W_K"], "V_past": X[:-new] @ W["W_V"]}
    if new > 1:
        spec["mask"] = "causal_bottom_right"
    step = attntrace.run(spec)
    hs = [None] if heads == 1 else range(1, heads + 1)
    for h in hs:
        np.testing.assert_allclose(step.step("weights", h).value, full.step("weights", h).value[-new:], atol=TOL, rtol=0)
        np.testing.assert_allclose(step.step("Z", h).value, full.step("Z", h).value[-new:], atol=TOL, rtol=0)
        np.testing.assert_allclose(step.step("K_cache", h).value, full.step("K", h).value, atol=TOL, rtol=0)
        np.testing.assert_allclose(step.step("V_cache", h).value, full.step("V", h).value, atol=TOL, rtol=0)
        assert step.step("scores", h).shape == (new, n)
    np.testing.assert_allclose(step.step("output").value, full.step("output").value[-new:], atol=TOL, rtol=0)


def test_top_left_causal_with_a_cache_is_refused_since_it_hides_the_cache():
    """The classic decoding bug, said in one line instead of traced: with top-left causal the
    new token (row 1 of a 1 x t score matrix) would see only key 1."""
    spec = {"Q": [[1.0, 0.0]], "K": [[0.0, 1.0]], "V": [[1.0]], "K_past": [[1.0, 1.0]], "V_past": [[2.0]], "mask": "causal"}
    with pytest.raises(attntrace.BadInput, match=r"^mask = \"causal\" \(top-left\) with a KV cache would hide the cached keys"):
        attntrace.run(spec)
    spec["mask"] = "causal_bottom_right"  # for one token: keeps everything, as no mask does
    a = attntrace.run(spec).step("weights").value
    b = attntrace.run({k: v for k, v in spec.items() if k != "mask"}).step("weights").value
    np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------- against Hugging Face decoding

@pytest.fixture(scope="module")
def hf_step():
    require_modules("torch", "transformers")
    import oracles

    return oracles.llama_kv_cache_step(seed=3, hidden_size=16, num_heads=4, num_kv_heads=2, prefix_len=3)


def test_cache_step_matches_hugging_face_llama_decoding(hf_step):
    """QKV start, one table per query head (its K/V head's cache, repeat_interleave grouping):
    weights over all cached positions and the layer's output after o_proj, at 1e-10."""
    r = hf_step
    h, h_kv, P = r["num_heads"], r["num_kv_heads"], r["k_cache_before"].shape[1]
    group = h // h_kv
    tables = []
    for i in range(h):
        j = i // group
        tables.append({"Q": r["q_new"][i][None], "K": r["k_cache_after"][j, P:], "V": r["v_cache_after"][j, P:],
                       "K_past": r["k_cache_before"][j], "V_past": r["v_cache_before"][j]})
    t = attntrace.run({"heads": tables, "W_O": r["W_O"]})
    for i in range(h):
        np.testing.assert_allclose(t.step("weights", i + 1).value[0], r["weights_new"][i], atol=TOL, rtol=0)
        np.testing.assert_allclose(t.step("K_cache", i + 1).value, r["k_cache_after"][i // group], atol=TOL, rtol=0)
        np.testing.assert_allclose(t.step("V_cache", i + 1).value, r["v_cache_after"][i // group], atol=TOL, rtol=0)
    np.testing.assert_allclose(t.step("output").value[0], r["output_new"], atol=TOL, rtol=0)



def test_cache_step_from_x_with_rope_and_gqa_matches_hugging_face(hf_step):
    """From the new token's x: projections at full width, RoPE at position P (half layout),
    grouped-query attention with num_kv_heads, the cache appended per key/value head."""
    r = hf_step
    h, h_kv, P = r["num_heads"], r["num_kv_heads"], r["k_cache_before"].shape[1]
    flat = lambda a: np.hstack(list(a))  # (h_kv, P, d) -> (P, h_kv d): head j in column block j  # noqa: E731
    spec = {"X": r["x_new"][None], "W_Q": r["W_Q"], "W_K": r["W_K"], "W_V": r["W_V"], "W_O": r["W_O"],
            "num_heads": h, "num_kv_heads": h_kv, "rope": {"base": 10000, "layout": "half", "positions": [P]},
            "K_past": flat(r["k_cache_before"]), "V_past": flat(r["v_cache_before"])}
    t = attntrace.run(spec)
    for i in range(h):
        np.testing.assert_allclose(t.step("weights", i + 1).value[0], r["weights_new"][i], atol=TOL, rtol=0)
    for j in range(h_kv):
        np.testing.assert_allclose(t.step("K_cache", j + 1).value, r["k_cache_after"][j], atol=TOL, rtol=0)
    assert [s.head for s in t.steps if s.id == "K_cache"] == list(range(1, h_kv + 1))  # once per K/V head
    np.testing.assert_allclose(t.step("output").value[0], r["output_new"], atol=TOL, rtol=0)
    assert [s.inputs[1] for s in t.steps if s.id == "scores"] == [f"K_cache@{i // (h // h_kv) + 1}" for i in range(h)]
    md = attntrace.render(t, format="md")  # every query head finds its group's cache
    # the cache is explained once; each later key/value head's cache is shown, with its stacking formula, in the
    # section of the first query head that reads it (not of the query head with its number)
    assert md.count("Appending the new key to the KV cache") == 1
    for j in range(2, h_kv + 1):
        first = (j - 1) * (h // h_kv) + 1
        section = md[md.index(f"## Head {first}\n"):md.index(f"## Head {first + 1}\n") if first < h else None]
        assert f"{{K_{{\\text{{cache}}}}^{{({j})}}}} = \\begin{{bmatrix}} K_{{\\text{{past}}}}^{{({j})}}" in section, (j, first)
    assert "S^{(4)}} = \\tilde{Q}^{(4)} K_{\\text{cache}}^{(2)\\top}" in md  # scores of head 4 read K/V head 2
    for fmt in ("tex", "text"):
        for lang in ("en", "zh"):
            assert attntrace.render(t, format=fmt, lang=lang)


# --------------------------------------------------------------- the four modes agree

@settings(max_examples=15, deadline=None)
@given(st.integers(1, 3), st.integers(1, 2), st.integers(0, 2**32 - 1))
def test_exact_symbolic_and_shape_modes_agree_with_numeric(past, d, seed):
    rng = np.random.default_rng(seed)
    shapes = {"X": (1, d), "W_Q": (d, 2), "W_K": (d, 2), "W_V": (d, 1), "K_past": (past, 2), "V_past": (past, 1)}
    nums = {k: rng.integers(-3, 4, size=s) / 2 for k, s in shapes.items()}
    names = {"X": "x", "W_Q": "w^{Q}", "W_K": "w^{K}", "W_V": "w^{V}", "K_past": "k^{p}", "V_past": "v^{p}"}
    numeric = attntrace.run(nums)
    exact = attntrace.run({k: [[str(sp.Rational(x)) for x in row] for row in v.tolist()] for k, v in nums.items()}, mode="exact")
    shape = attntrace.run(nums, mode="shape")
    symbolic = attntrace.run({k: {"shape": list(s)} for k, s in shapes.items()}, mode="symbolic")
    values = {sp.Symbol(f"{names[k]}_{{{i + 1}{j + 1}}}"): a[i, j] for k, a in nums.items()
              for i in range(a.shape[0]) for j in range(a.shape[1])}
    got = substitute(symbolic, values)
    keys = [s.key for s in numeric.steps]
    assert keys == [s.key for s in exact.steps] == [s.key for s in symbolic.steps] == [s.key for s in shape.steps]
    assert keys[:5] == ["Q", "K", "V", "K_cache", "V_cache"]
    for step in numeric.steps:
        ex = exact.step(step.id, step.head).value
        approx = np.array([[float(sp.N(e, 20)) for e in ex.row(i)] for i in range(ex.rows)])
        np.testing.assert_allclose(approx, step.value, atol=TOL, rtol=0, err_msg=step.key)
        np.testing.assert_allclose(got[step.key], step.value, atol=TOL, rtol=0, err_msg=step.key)
        assert shape.step(step.id, step.head).shape == step.shape


# --------------------------------------------------------------- bad input, one line

BASE = {"Q": [[1, 0]], "K": [[0, 1]], "V": [[1]], "K_past": [[1, 1], [0, 2]], "V_past": [[2], [1]]}


@pytest.mark.parametrize("change, message", [
    ({"V_past": None}, r"^K_past and V_past \(the KV cache\) must be given together$"),
    ({"K_past": [[1, 1, 1]]}, r"^step K_cache: cannot append K \(1, 2\) to K_past \(1, 3\): 2 != 3 columns$"),
    ({"V_past": [[1]]}, r"^K_past has 2 rows but V_past has 1; the cache holds one key and one value per past token$"),
    ({"Q": [[1, 0], [0, 1]], "K": [[0, 1], [1, 1]], "V": [[1], [2]]}, r"^2 new tokens with a KV cache of 2: give mask = \"causal_bottom_right\""),
    ({"Q": None, "K": None, "V": None, "scores": [[1, 2]]}, r"^K_past and V_past \(a KV cache\) need the new token's X or Q, K, V"),
])
def test_bad_caches_are_one_line_errors(change, message):
    spec = {**BASE, **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    with pytest.raises(attntrace.BadInput, match=message) as info:
        attntrace.run(spec)
    assert "\n" not in str(info.value)


def test_cross_attention_has_no_cache():
    spec = {"X": [[1, 0]], "X_kv": [[0, 1]], "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [0, 1]], "W_V": [[1], [0]],
            "K_past": [[1, 1]], "V_past": [[1]]}
    with pytest.raises(attntrace.BadInput, match=r"^a KV cache holds the keys and values of the same sequence"):
        attntrace.run(spec)


def test_kv_tokens_count_the_cached_keys():
    with pytest.raises(attntrace.BadInput, match=r"^kv_tokens lists 2 labels but there are 3 keys"):
        attntrace.run({**BASE, "kv_tokens": ["a", "b"]})
    assert attntrace.run({**BASE, "kv_tokens": ["a", "b", "c"]})


# --------------------------------------------------------------- what the report shows

def test_report_shows_the_cache_growing_and_the_row_t_claim():
    t = attntrace.run("kv-cache-decoding")
    assert [s.key for s in t.steps][:5] == ["Q", "K", "V", "K_cache", "V_cache"]
    tex = attntrace.render(t, format="tex", lang="en")
    # the cache's values with the new token's row below a rule: rows 1-3 cached, row 4 = K
    k = t.step("K_cache").value
    assert np.array_equal(k[3], t.step("K").value[0])
    assert "\\hline 1 & 1 & 2 & 0" in tex
    assert "K_{\\text{cache}} = \\begin{bmatrix} K_{\\text{past}} \\\\ K \\end{bmatrix}" in t.step("K_cache").formula
    assert "appended as row 4 (below the line)" in tex
    assert "equals row 4 of full causal attention over all 4 tokens" in tex
    zh = attntrace.render(t, format="md", lang="zh")
    assert "作为第 4 行追加在下面（横线以下）" in zh and "等于对全部 4 个词元做完整因果注意力时的第 4 行" in zh
    text = attntrace.render(t, format="text")
    assert "K_cache (4 x 4) = [K_past; K] =" in text and "below the line" not in text  # no rule in plain text


def test_json_names_the_cache_rows():
    steps = {s["id"]: s for s in trace_to_dict(attntrace.run("kv-cache-decoding"))["steps"]}
    assert steps["K_cache"]["past_rows"] == 3 and steps["K_cache"]["new_rows"] == 1
    assert steps["K_cache"]["inputs"] == ["K_past", "K"] and steps["scores"]["inputs"] == ["Q", "K_cache"]
    assert np.array(steps["scores"]["value"]).shape == (1, 4)


def test_rope_with_a_cache_needs_the_new_tokens_positions():
    """Position 0 for the new token (the default) would rotate it as if it came first."""
    spec = {"X": [[1.0, 0.0]], "W_Q": [[1.0, 0.0], [0.0, 1.0]], "W_K": [[1.0, 0.0], [0.0, 1.0]], "W_V": [[1.0], [0.0]],
            "K_past": [[1.0, 1.0], [0.0, 2.0]], "V_past": [[2.0], [1.0]]}
    for rope in ({"positions": [0]}, True):
        with pytest.raises(attntrace.BadInput, match=r"^with a KV cache of 2 tokens, RoPE needs the new tokens' positions: "
                                                     r"rope.positions = \[2\]$"):
            attntrace.run({**spec, "rope": rope})
    assert attntrace.run({**spec, "rope": {"positions": [2]}}).step("K_cache").shape == (3, 2)
