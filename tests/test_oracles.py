"""The oracles of tests/oracles.py checked against each other and against hand-computed cases.

An oracle that is wrong would make attntrace's tests pass for wrong code, so each one is
pinned here by a second, independent route: plain numpy formulas, tiny cases worked out
by hand (in the docstrings), or another library function. torch and transformers are
required: a missing one skips these tests, but fails them under CI=true.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mathcheck import require_modules

TOL = 1e-12


@pytest.fixture(scope="module", autouse=True)
def _torch_and_transformers():
    require_modules("torch", "transformers")


@pytest.fixture(scope="module")
def O():  # noqa: N802 - the oracles module
    import oracles

    return oracles


def close(a, b, tol=TOL):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.isfinite(a).all() and np.isfinite(b).all()
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    assert err <= tol, f"max abs difference {err:.3e} > {tol:.0e}"


def np_softmax(s):
    s = s - np.max(s, axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def rng(seed=0):
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------- SDPA


def test_sdpa_hand_case(O):
    """q = (1, 0), keys (1, 0) and (0, 1), values (1, 2) and (3, 4), scale 1:
    scores (1, 0), weights (e, 1)/(e + 1), output ((e + 3)/(e + 1), (2e + 4)/(e + 1))."""
    q = np.array([[[1.0, 0.0]]])
    k = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    v = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    e = math.e
    close(O.attention_weights(q, k, scale=1.0), [[[e / (e + 1), 1 / (e + 1)]]])
    close(O.sdpa(q, k, v, scale=1.0), [[[(e + 3) / (e + 1), (2 * e + 4) / (e + 1)]]])
    # default scale 1/sqrt(2): weights (e^a, 1)/(e^a + 1) with a = 1/sqrt(2)
    a = math.exp(1 / math.sqrt(2))
    close(O.attention_weights(q, k), [[[a / (a + 1), 1 / (a + 1)]]])


@pytest.mark.parametrize("case", ["plain", "causal", "bool", "float", "scale", "gqa", "gqa-causal", "mqa-bool"])
def test_attention_weights_times_v_is_sdpa_and_matches_numpy(O, case):
    r = rng(1)
    h, h_kv, n_q, n_k, d, d_v = 4, 4, 5, 5, 3, 2
    kw = {}
    if case.startswith("gqa"):
        h_kv = 2
    if case.startswith("mqa"):
        h_kv = 1
    if "gqa" in case or "mqa" in case:
        kw["enable_gqa"] = True
    q, k, v = r.normal(size=(h, n_q, d)), r.normal(size=(h_kv, n_k, d)), r.normal(size=(h_kv, n_k, d_v))
    keep = np.ones((n_q, n_k), dtype=bool)
    if "causal" in case:
        kw["is_causal"] = True
        keep = np.tril(keep)
    if "bool" in case:
        keep = r.random((n_q, n_k)) < 0.6
        keep[np.arange(n_q), np.arange(n_q)] = True  # no empty row
        kw["mask"] = keep
    bias = np.zeros((h, n_q, n_k))
    if case == "float":
        bias = r.normal(size=(h, n_q, n_k))
        kw["mask"] = bias
    scale = 1 / math.sqrt(d)
    if case == "scale":
        scale = kw["scale"] = 0.37
    w = O.attention_weights(q, k, **kw)
    out = O.sdpa(q, k, v, **kw)
    g = h // h_kv
    kk, vv = np.repeat(k, g, axis=0), np.repeat(v, g, axis=0)  # head i -> kv head i // g
    close(w @ vv, out)
    scores = np.where(keep, np.einsum("hid,hjd->hij", q, kk) * scale + bias, -np.inf)
    close(w, np_softmax(scores))


def test_sdpa_enable_gqa_is_repeat_interleave_and_hf_repeat_kv(O):
    import torch
    from transformers.models.llama.modeling_llama import repeat_kv

    r = rng(2)
    q, k, v = r.normal(size=(6, 4, 3)), r.normal(size=(2, 4, 3)), r.normal(size=(2, 4, 3))
    ki = torch.from_numpy(k).repeat_interleave(3, dim=0).numpy()
    vi = torch.from_numpy(v).repeat_interleave(3, dim=0).numpy()
    close(ki, repeat_kv(torch.from_numpy(k)[None], 3)[0].numpy(), 0.0)
    close(O.sdpa(q, k, v, enable_gqa=True, is_causal=True), O.sdpa(q, ki, vi, is_causal=True))
    close(O.attention_weights(q, k, enable_gqa=True), O.attention_weights(q, ki))


@pytest.mark.parametrize("L,S", [(1, 1), (1, 5), (3, 5), (5, 5), (2, 7)])
def test_causal_lower_right(O, L, S):
    keep = O.causal_lower_right_keep(L, S)
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    assert keep.dtype == bool and (keep == (j <= i + S - L)).all()
    if L == S:
        assert (keep == np.tril(np.ones((L, S), dtype=bool))).all()
    r = rng(3)
    q, k, v = r.normal(size=(2, L, 4)), r.normal(size=(2, S, 4)), r.normal(size=(2, S, 3))
    out = O.sdpa_causal_lower_right(q, k, v)
    close(out, O.sdpa(q, k, v, mask=keep))
    close(out, O.attention_weights(q, k, mask=keep) @ v)
    if L < S:  # top-left is_causal is a different mask here
        assert not np.allclose(out, O.sdpa(q, k, v, is_causal=True))


# --------------------------------------------------------------------------- HF masks


@pytest.mark.parametrize("n,window", [(6, 1), (6, 2), (6, 3), (5, 5), (4, 9)])
def test_sliding_window_keep_is_i_minus_w_lt_j_le_i(O, n, window):
    keep = O.sliding_window_keep(n, window)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    assert keep.dtype == bool and (keep == ((i - window < j) & (j <= i))).all()
    assert keep.sum(axis=1).max() == min(window, n)


def test_sliding_window_keep_decoding_offset(O):
    keep = O.sliding_window_keep(2, 3, q_offset=4)  # queries at positions 4 and 5 over 6 keys
    assert keep.tolist() == [[False, False, True, True, True, False], [False, False, False, True, True, True]]


def test_sliding_window_keep_matches_mistral_mask_and_eager_weights(O):
    """create_sliding_window_causal_mask for a MistralConfig, and the zero pattern of a
    tiny random Mistral's eager attention weights, both give the same keep matrix."""
    import torch
    from transformers import MistralConfig, MistralModel
    from transformers.masking_utils import create_sliding_window_causal_mask

    n, window = 6, 3
    cfg = MistralConfig(
        hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4, intermediate_size=32,
        num_hidden_layers=1, vocab_size=50, sliding_window=window, attn_implementation="eager",
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    model = MistralModel(cfg).double().eval()
    x = torch.randn(1, n, 16, dtype=torch.float64)
    with torch.no_grad():
        out = model(inputs_embeds=x, output_attentions=True, use_cache=False)
    mask = create_sliding_window_causal_mask(
        config=cfg, inputs_embeds=x, attention_mask=None, cache=None, position_ids=torch.arange(n)[None]
    )
    keep = O.sliding_window_keep(n, window)
    assert ((mask[0, 0] == 0).numpy() == keep).all()
    for head in out.attentions[0][0]:
        assert ((head != 0).numpy() == keep).all()


def test_causal_padding_keep(O):
    """attention_mask (0, 1, 1, 0, 1): key 0 and key 3 are padding; causal j <= i."""
    keep = O.causal_padding_keep([0, 1, 1, 0, 1])
    expected = np.tril(np.ones((5, 5), dtype=bool)) & np.array([0, 1, 1, 0, 1], dtype=bool)[None, :]
    assert (keep == expected).all() and not keep[0].any()
    last = O.causal_padding_keep([1, 1, 0, 1], n_q=1)  # one decoding query at position 3
    assert last.tolist() == [[True, True, False, True]]


# --------------------------------------------------------------------------- RoPE


def test_rope_two_dims_by_hand(O):
    """d = 2: one pair, frequency base^0 = 1 whatever the base, so position m rotates
    (x0, x1) by angle m: (x0 cos m - x1 sin m, x1 cos m + x0 sin m). For x = (1, 2):
    m = 0 -> (1, 2); m = 1 -> (cos 1 - 2 sin 1, 2 cos 1 + sin 1) = (-1.1426396637..., 1.9220755965...);
    m = 3 -> (cos 3 - 2 sin 3, 2 cos 3 + sin 3). Both layouts agree for d = 2."""
    x = np.array([[[1.0, 2.0]] * 3])  # (1, 3, 2)
    pos = [0, 1, 3]
    c, s = math.cos, math.sin
    expected = [[[1.0, 2.0], [c(1) - 2 * s(1), 2 * c(1) + s(1)], [c(3) - 2 * s(3), 2 * c(3) + s(3)]]]
    assert abs(expected[0][1][0] - (-1.1426396637476532)) < 1e-15
    assert abs(expected[0][1][1] - 1.922075596544176) < 1e-15
    for base in (10000.0, 500.0):
        close(O.rope_half_hf(x, pos, base), expected)
        close(O.rope_interleaved_complex(x, pos, base), expected)


def test_rope_half_hf_direct_formula(O):
    """Half layout, d = 8: pair (x_i, x_{i+4}) rotates by m * base^(-2i/8), i = 0..3."""
    r = rng(4)
    x, pos, base, d = r.normal(size=(2, 5, 8)), np.array([0, 1, 2, 7, 30]), 10000.0, 8
    theta = base ** (-2.0 * np.arange(d // 2) / d)
    ang = pos[:, None] * theta[None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    expected = np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)
    close(O.rope_half_hf(x, pos, base), expected)


def test_rope_interleaved_direct_formula(O):
    """Interleaved layout, d = 6: pair (x_2i, x_2i+1) rotates by m * base^(-2i/6)."""
    r = rng(5)
    x, pos, base, d = r.normal(size=(3, 4, 6)), np.array([0, 1, 5, 2]), 500.0, 6
    theta = base ** (-2.0 * np.arange(d // 2) / d)
    ang = pos[:, None] * theta[None, :]
    xe, xo = x[..., 0::2], x[..., 1::2]
    expected = np.empty_like(x)
    expected[..., 0::2] = xe * np.cos(ang) - xo * np.sin(ang)
    expected[..., 1::2] = xo * np.cos(ang) + xe * np.sin(ang)
    close(O.rope_interleaved_complex(x, pos, base), expected)


def test_rope_layouts_are_a_permutation_of_each_other(O):
    """Half layout on (x0, x2, x4, ..., x1, x3, ...) = interleaved layout on x, permuted alike."""
    r = rng(6)
    d = 8
    x = r.normal(size=(3, 6, d))
    perm = np.r_[np.arange(0, d, 2), np.arange(1, d, 2)]
    close(O.rope_half_hf(x[..., perm])[..., np.argsort(perm)], O.rope_interleaved_complex(x))


def test_rope_relative_position_and_norm(O):
    """<R_m q, R_n k> depends on m - n only, and RoPE keeps vector lengths (both layouts)."""
    r = rng(7)
    q, k = r.normal(size=(1, 1, 8)), r.normal(size=(1, 1, 8))
    for rope in (O.rope_half_hf, O.rope_interleaved_complex):
        dots = [float(rope(q, [m + s])[0, 0] @ rope(k, [n + s])[0, 0]) for m, n in ((5, 2),) for s in (0, 4, 11)]
        assert max(dots) - min(dots) < 1e-12
        close(np.linalg.norm(rope(q, [9])), np.linalg.norm(q))


def test_rope_cos_sin_float64_formula_vs_hf_module(O):
    """The real LlamaRotaryEmbedding agrees with its float64 formula to float32 precision only."""
    pos = np.arange(12)
    for base in (10000.0, 500.0):
        cos, sin = O.rope_cos_sin_f64(pos, 8, base)
        cos32, sin32 = O.rope_cos_sin_hf_module(pos, 8, base)
        close(cos32, cos, 1e-6)
        close(sin32, sin, 1e-6)
        ang = pos[:, None] * base ** (-np.arange(0, 8, 2) / 8.0)[None, :]
        close(cos, np.cos(np.concatenate([ang, ang], 1)))
        close(sin, np.sin(np.concatenate([ang, ang], 1)))


# --------------------------------------------------------------------------- ALiBi


def test_alibi_slopes_paper_by_hand(O):
    """2^(-8/n) geometric for n a power of 2; n = 6: slopes of 4 heads (1/4, 1/16, 1/64,
    1/256) then every other slope of 8 heads (1/2, 1/8)."""
    close(O.alibi_slopes_paper(8), [2.0**-i for i in range(1, 9)], 0.0)
    close(O.alibi_slopes_paper(4), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8], 0.0)
    close(O.alibi_slopes_paper(2), [2.0**-4, 2.0**-8], 0.0)
    close(O.alibi_slopes_paper(6), [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8], 0.0)
    close(O.alibi_slopes_paper(16), [2.0 ** (-0.5 * i) for i in range(1, 17)], 1e-15)


@pytest.mark.parametrize("h", [1, 2, 3, 4, 6, 8, 12, 16, 24])
def test_alibi_slopes_paper_vs_hf(O, h):
    import torch
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    hf = _get_alibi_slopes(h, torch.device("cpu")).double().numpy()
    paper = O.alibi_slopes_paper(h)
    if h <= 8:  # powers of two: exact even in HF's float32
        close(hf, paper, 0.0)
    else:  # HF raises a float32 base to powers up to h: ~h * 2^-24 relative error
        assert np.max(np.abs(hf / paper - 1)) < 1e-6


def test_alibi_bias_hf_is_slope_times_key_position(O):
    h, n = 4, 5
    bias = O.alibi_bias_hf(h, n)
    assert bias.shape == (h, 1, n)
    close(bias, O.alibi_slopes_paper(h)[:, None, None] * np.arange(n)[None, None, :], 0.0)


def test_alibi_bias_hf_with_padding_counts_real_keys(O):
    """attention_mask (1, 1, 0, 1): HF's positions are (cumsum - 1) * mask = (0, 1, 0, 2)."""
    bias = O.alibi_bias_hf(2, 4, key_keep=[1, 1, 0, 1])
    close(bias[:, 0], O.alibi_slopes_paper(2)[:, None] * np.array([0, 1, 0, 2])[None, :], 0.0)


def test_alibi_bias_matrix_by_hand(O):
    """2 heads: slopes 1/16, 1/256; bias -m (i - j): head 0, row 2 = (-2/16, -1/16, 0)."""
    b = O.alibi_bias_matrix(2, 3, 3)
    close(b[0, 2], [-2 / 16, -1 / 16, 0.0], 0.0)
    close(b[1, 1], [-1 / 256, 0.0, 1 / 256], 0.0)
    close(O.alibi_bias_matrix(2, 1, 3, q_offset=2)[:, 0], b[:, 2], 0.0)


@pytest.mark.parametrize("h", [4, 6, 8])
def test_alibi_hf_bias_and_paper_matrix_give_the_same_weights(O, h):
    """softmax is row-shift invariant: m j and -m (i - j) differ by m i per row."""
    r = rng(8)
    n = 6
    q, k = r.normal(size=(h, n, 4)), r.normal(size=(h, n, 4))
    keep = np.tril(np.ones((n, n), dtype=bool))
    neg = np.where(keep, 0.0, -np.inf)
    w_hf = O.attention_weights(q, k, mask=O.alibi_bias_hf(h, n) + neg)
    w_paper = O.attention_weights(q, k, mask=O.alibi_bias_matrix(h, n, n) + neg)
    close(w_hf, w_paper)
    assert not np.allclose(w_paper, O.attention_weights(q, k, mask=keep))  # the bias matters


# --------------------------------------------------------------------------- Llama layer


def _expected_output(weights, v, W_O, h, h_kv):
    """concat over heads of weights_h @ v_{h // (h / h_kv)}, times W_O (plain numpy)."""
    g = h // h_kv
    heads = [weights[i] @ v[i // g] for i in range(h)]
    return np.concatenate(heads, axis=-1) @ W_O


@pytest.fixture(scope="module")
def llama(O):
    return O.llama_attention_layer(0)


def test_llama_layer_projections_and_rope(O, llama):
    L = llama
    n, h, h_kv, d = 5, 4, 2, 4
    assert L["x"].shape == (n, 16) and L["W_Q"].shape == (16, h * d) and L["W_K"].shape == (16, h_kv * d)
    assert L["W_O"].shape == (h * d, 16) and L["weights"].shape == (h, n, n)
    close(L["q"][1], (L["x"] @ L["W_Q"])[:, d : 2 * d], 0.0)  # head 1 = columns d..2d of X W_Q
    close(L["q_rope"], O.rope_half_hf(L["q"], L["positions"]))
    close(L["k_rope"], O.rope_half_hf(L["k"], L["positions"]))
    close(L["cos"], O.rope_cos_sin_f64(L["positions"], d)[0])


def test_llama_layer_weights_and_output(O, llama):
    L = llama
    keep = np.tril(np.ones((5, 5), dtype=bool))
    assert (L["keep"] == keep).all()
    assert (L["mask"][~keep] <= -1e300).all() and (L["mask"][keep] == 0).all()
    close(L["weights"].sum(-1), np.ones((4, 5)))
    assert (L["weights"][:, ~keep] == 0).all()
    scores = np.einsum("hid,hjd->hij", L["q_rope"], np.repeat(L["k_rope"], 2, axis=0)) * L["scale"]
    close(L["weights"], np_softmax(np.where(keep, scores, -np.inf)))
    close(L["output"], _expected_output(L["weights"], L["v"], L["W_O"], 4, 2))
    # HF eager takes the softmax in float32
    close(L["weights_eager"], L["weights"], 1e-6)
    close(L["output_eager"], L["output"], 1e-6)


@pytest.mark.parametrize("kv_heads", [4, 1])
def test_llama_layer_mha_and_mqa(O, kv_heads):
    L = O.llama_attention_layer(3, num_kv_heads=kv_heads, n=4, rope_theta=500.0)
    assert L["k"].shape == (kv_heads, 4, 4)
    close(L["q_rope"], O.rope_half_hf(L["q"], L["positions"], 500.0))
    close(L["output"], _expected_output(L["weights"], L["v"], L["W_O"], 4, kv_heads))
    close(L["weights_eager"], L["weights"], 1e-6)


def test_llama_layer_with_hf_float32_rope(O, llama):
    L32 = O.llama_attention_layer(0, rope_float64=False)
    close(L32["x"], llama["x"], 0.0)
    close(L32["q_rope"], llama["q_rope"], 1e-6)
    assert np.max(np.abs(L32["q_rope"] - llama["q_rope"])) > 0  # really HF's float32 angles
    close(L32["output"], _expected_output(L32["weights"], L32["v"], L32["W_O"], 4, 2))


# --------------------------------------------------------------------------- KV cache


@pytest.fixture(scope="module")
def kv(O):
    return O.llama_kv_cache_step(1, prefix_len=4)


def test_kv_cache_contents(O, kv):
    P, h_kv = 4, 2
    close(kv["k_cache_after"][:, :P], kv["k_cache_before"], 0.0)
    close(kv["v_cache_after"][:, :P], kv["v_cache_before"], 0.0)
    close(kv["x_new"], kv["x_full"][P])
    close(kv["k_cache_after"], kv["k_rope_full"])
    v_full = (kv["x_full"] @ kv["W_V"]).reshape(P + 1, h_kv, -1).transpose(1, 0, 2)
    close(kv["v_cache_after"], v_full)
    q = (kv["x_new"] @ kv["W_Q"]).reshape(4, 1, -1)
    close(kv["q_new"], O.rope_half_hf(q, [P])[:, 0])
    close(kv["cos_new"], O.rope_cos_sin_f64([P], 4)[0][0])


def test_kv_cache_step_is_last_row_of_full_causal_attention(O, kv):
    close(kv["weights_new"], kv["weights_full"][:, -1])
    close(kv["output_new"], kv["output_full"][-1])
    close(kv["output_new"], _expected_output(kv["weights_new"][:, None, :], kv["v_cache_after"], kv["W_O"], 4, 2)[0])
    # the one-query step is SDPA with a bottom-right causal mask (L = 1 keeps every key)
    k_rep, v_rep = np.repeat(kv["k_cache_after"], 2, 0), np.repeat(kv["v_cache_after"], 2, 0)
    step = O.sdpa_causal_lower_right(kv["q_new"][:, None, :], k_rep, v_rep)
    close(step[:, 0], np.einsum("hj,hjd->hd", kv["weights_new"], v_rep))
    close(kv["logits_step"], kv["logits_full_last"], 1e-10)


def test_generate_with_cache_matches_no_cache_greedy(kv):
    assert kv["generate_tokens"].tolist() == kv["nocache_tokens"].tolist()
    close(kv["generate_logits"], kv["nocache_logits"], 1e-6)  # generate casts logits to float32
