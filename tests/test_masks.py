"""Masks beyond the top-left causal one: bottom-right causal, sliding window, key padding.

Each is checked at 1e-10 in float64 against the oracles of tests/oracles.py, which build
their masks with PyTorch (`causal_lower_right`, SDPA) and Hugging Face
(`transformers.masking_utils`), never with attntrace code; over random shapes with
hypothesis. Exact and symbolic mode agree with numeric by substitution; shape mode gives
the same shapes. A row the mask empties is a one-line BadInput.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings, strategies as st

import attntrace
from attntrace.algebra.substitute import substitute
from mathcheck import require_modules

TOL = 1e-10


@pytest.fixture(scope="module", autouse=True)
def _oracle_libraries():
    require_modules("torch", "transformers")


def _oracles():
    import oracles

    return oracles


def _qkv(seed, L, S, d, dv):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((L, d)), rng.standard_normal((S, d)), rng.standard_normal((S, dv))


def _check_against(trace, keep, q, k, v):
    """The trace's mask, weights and output against the oracle keep matrix, through SDPA."""
    O = _oracles()
    np.testing.assert_array_equal(np.asarray(trace.step("masked").details["keep"]), keep)
    weights = O.attention_weights(q[None], k[None], mask=keep)[0]
    out = O.sdpa(q[None], k[None], v[None], mask=keep)[0]
    np.testing.assert_allclose(trace.step("weights").value, weights, atol=TOL, rtol=0)
    np.testing.assert_allclose(trace.step("Z").value, out, atol=TOL, rtol=0)
    masked = ~keep
    assert (trace.step("weights").value[masked] == 0).all()  # exact zeros, not 1e-9 noise


shapes = st.tuples(st.integers(1, 6), st.integers(1, 7), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2**32 - 1))


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_bottom_right_causal_matches_causal_lower_right(shape):
    L, S, d, dv, seed = shape
    O = _oracles()
    q, k, v = _qkv(seed, L, S, d, dv)
    keep = O.causal_lower_right_keep(L, S)
    spec = {"Q": q, "K": k, "V": v, "mask": "causal_bottom_right"}
    if not keep.any(axis=1).all():  # L > S: the first queries see no key at all
        with pytest.raises(attntrace.BadInput, match=r"^step masked: row 1 of the mask keeps no entry"):
            attntrace.run(spec)
        return
    t = attntrace.run(spec)
    _check_against(t, keep, q, k, v)
    np.testing.assert_allclose(t.step("Z").value, O.sdpa_causal_lower_right(q[None], k[None], v[None])[0], atol=TOL, rtol=0)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 7), st.integers(1, 8), st.integers(0, 4), st.integers(0, 2**32 - 1), st.booleans())
def test_sliding_window_matches_hugging_face(n, window, extra_keys, seed, bottom_right):
    """window = W keeps i - W < j <= i (HF's sliding_window_causal_mask_function); with the
    bottom-right alignment the queries are the last n of n + extra_keys positions (q_offset)."""
    O = _oracles()
    S = n + (extra_keys if bottom_right else 0)
    q, k, v = _qkv(seed, n, S, 3, 2)
    keep = O.sliding_window_keep(n, window, n_k=S, q_offset=S - n)
    spec = {"Q": q, "K": k, "V": v, "window": window}
    if bottom_right:
        spec["mask"] = "causal_bottom_right"
    _check_against(attntrace.run(spec), keep, q, k, v)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(0, 3), st.integers(0, 2**32 - 1))
def test_key_padding_with_causal_matches_hugging_face(n_q, extra_keys, seed):
    """key_padding (true = padding) with the causal mask = HF's causal mask with a 2-D
    attention_mask (1 = real token); the queries are the last n_q of the keys."""
    O = _oracles()
    S = n_q + extra_keys
    rng = np.random.default_rng(seed)
    padding = rng.random(S) < 0.3
    q, k, v = _qkv(seed, n_q, S, 2, 2)
    keep = O.causal_padding_keep((~padding).astype(int), n_q=n_q)
    spec = {"Q": q, "K": k, "V": v, "mask": "causal_bottom_right", "key_padding": padding.tolist()}
    if not keep.any(axis=1).all():
        with pytest.raises(attntrace.BadInput, match=r"^step masked: row \d+ of the mask keeps no entry, so its softmax is undefined$"):
            attntrace.run(spec)
        return
    _check_against(attntrace.run(spec), keep, q, k, v)


def test_key_padding_alone_matches_sdpa_boolean_mask_and_mha_key_padding_mask():
    """Padding alone: SDPA's bool attn_mask with True = attend is ~padding, and
    nn.MultiheadAttention's key_padding_mask with True = ignore is the padding itself."""
    import torch

    O = _oracles()
    q, k, v = _qkv(3, 3, 4, 2, 2)
    padding = [False, True, False, True]
    t = attntrace.run({"Q": q, "K": k, "V": v, "key_padding": padding})
    keep = np.broadcast_to(~np.array(padding), (3, 4))
    _check_against(t, keep, q, k, v)
    assert t.settings["mask"] == "padding"

    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(4, 1, batch_first=True).double().eval()
    x = torch.randn(1, 4, 4, dtype=torch.float64)
    pad = torch.tensor([padding])
    with torch.no_grad():
        out, w = mha(x, x, x, key_padding_mask=pad, need_weights=True)
    from attntrace.bridges.pytorch import multihead_spec

    spec = multihead_spec(mha, x, key_padding_mask=pad)
    assert spec["key_padding"] == padding and "mask" not in spec  # the same booleans, the same meaning
    traced = attntrace.from_torch(mha, x, key_padding_mask=pad)
    np.testing.assert_allclose(traced.step("weights").value, w[0].numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(traced.step("output").value, out[0].numpy(), atol=TOL, rtol=0)
    assert "Keys 2, 4 are padding" in attntrace.render(traced, format="md")


def test_top_left_causal_is_unchanged_when_queries_are_fewer():
    """mask = "causal" keeps j <= i whatever S is (PyTorch's is_causal), as before."""
    O = _oracles()
    q, k, v = _qkv(5, 2, 4, 2, 2)
    t = attntrace.run({"Q": q, "K": k, "V": v, "mask": "causal"})
    keep = np.tril(np.ones((2, 4), dtype=bool))
    _check_against(t, keep, q, k, v)
    np.testing.assert_allclose(t.step("Z").value, O.sdpa(q[None], k[None], v[None], is_causal=True)[0], atol=TOL, rtol=0)


# ------------------------------------------------------------------ the four modes agree

NAMES = {"X": "x", "W_Q": "w^{Q}", "W_K": "w^{K}", "W_V": "w^{V}"}


@st.composite
def masked_problems(draw):
    n = draw(st.integers(1, 4))
    d = draw(st.integers(1, 2))
    opts = draw(st.sampled_from([{"mask": "causal_bottom_right"}, {"window": 1}, {"window": 2}, {"mask": "causal", "window": 2},
                                 {"key_padding": "random"}, {"mask": "causal", "key_padding": "random"}]))
    opts = dict(opts)
    if "key_padding" in opts:
        pad = [draw(st.booleans()) for _ in range(n)]
        pad[0] = False  # key 1 is real: every causal row keeps something
        opts["key_padding"] = pad
    seed = draw(st.integers(0, 2**32 - 1))
    return {"X": (n, d), "W_Q": (d, 2), "W_K": (d, 2), "W_V": (d, 1)}, opts, seed


@settings(max_examples=20, deadline=None)
@given(masked_problems())
def test_exact_symbolic_and_shape_modes_agree_with_numeric(problem):
    shapes, opts, seed = problem
    rng = np.random.default_rng(seed)
    nums = {k: rng.integers(-3, 4, size=s) / 2 for k, s in shapes.items()}
    numeric = attntrace.run({**nums, **opts})
    exact = attntrace.run({k: [[str(sp.Rational(x)) for x in row] for row in v.tolist()] for k, v in nums.items()} | opts, mode="exact")
    shape = attntrace.run({**nums, **opts}, mode="shape")
    symbolic = attntrace.run({k: {"shape": list(s)} for k, s in shapes.items()} | opts, mode="symbolic")
    values = {sp.Symbol(f"{NAMES[k]}_{{{i + 1}{j + 1}}}"): a[i, j] for k, a in nums.items()
              for i in range(a.shape[0]) for j in range(a.shape[1])}
    got = substitute(symbolic, values)
    assert [s.key for s in symbolic.steps] == [s.key for s in numeric.steps] == [s.key for s in exact.steps]
    assert "masked" in [s.id for s in numeric.steps]
    for step in numeric.steps:
        ex = exact.step(step.id, step.head).value
        approx = np.array([[float(sp.N(e, 20)) if e != -sp.oo else -np.inf for e in ex.row(i)] for i in range(ex.rows)])
        np.testing.assert_allclose(approx, step.value, atol=TOL, rtol=0, err_msg=step.key)
        np.testing.assert_allclose(got[step.key], step.value, atol=TOL, rtol=0, err_msg=step.key)
        assert shape.step(step.id, step.head).shape == step.shape
    keep = np.asarray(numeric.step("masked").details["keep"])
    np.testing.assert_array_equal(np.asarray(exact.step("masked").details["keep"]), keep)
    w = exact.step("weights").value
    assert all(w[i, j] == 0 for i in range(w.rows) for j in range(w.cols) if not keep[i, j])


# ------------------------------------------------------------------ bad input, one line

BASE = {"Q": [[1, 0], [0, 1]], "K": [[1, 0], [0, 1], [1, 1]], "V": [[1], [2], [3]]}


@pytest.mark.parametrize("extra, message", [
    ({"window": 0}, r"^window must be a positive integer"),
    ({"window": True}, r"^window must be a positive integer"),
    ({"window": 2, "mask": [[1, 0, 0], [1, 1, 0]]}, r"^window works with mask = \"causal\" or \"causal_bottom_right\""),
    ({"key_padding": [0, 0, 1]}, r"^key_padding must be a list of true/false, one per key, true = padding"),
    ({"key_padding": []}, r"^key_padding must be a list of true/false"),
    ({"key_padding": [False, True]}, r"^step masked: key_padding lists 2 keys but there are 3 keys$"),
    ({"key_padding": [True, True, True]}, r"^step masked: row 1 of the mask keeps no entry"),
    ({"mask": "causal_top_left"}, r"^mask must be \"causal\", \"causal_bottom_right\" or a 0/1 matrix"),
    ({"mask": "causal_bottom_right", "Q": [[1, 0]] * 4}, r"^step masked: row 1 of the mask keeps no entry"),
])
def test_bad_mask_options_are_one_line_errors(extra, message):
    with pytest.raises(attntrace.BadInput, match=message) as info:
        attntrace.run({**BASE, **extra})
    assert "\n" not in str(info.value)


def test_cli_refuses_a_bad_window_with_exit_status_2(tmp_path):
    import subprocess
    import sys

    spec = tmp_path / "bad.toml"
    spec.write_text('Q = [[1, 0]]\nK = [[1, 0]]\nV = [[1]]\nwindow = -1\n')
    r = subprocess.run([sys.executable, "-m", "attntrace", "run", str(spec)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "window must be a positive integer" in r.stderr


# ------------------------------------------------------------------ what the report says

@pytest.mark.parametrize("spec, en, zh", [
    ({"mask": "causal_bottom_right"}, ["with a bottom-right causal mask", "aligned bottom-right", "j \\le i + 1"],
     ["右下角对齐的因果掩码", "j \\le i + 1"]),
    ({"mask": "causal"}, ["with a causal mask", "aligned top-left"], ["因果掩码", "左上角对齐"]),
    ({"window": 2, "mask": "causal_bottom_right"}, ["sliding-window mask", "W = 2", "i - 1 < j \\le i + 1"],
     ["滑动窗口掩码", "W = 2", "i - 1 < j \\le i + 1"]),
    ({"key_padding": [False, True, False]}, ["key-padding mask", "Key 2 is padding", "true means padding"],
     ["键填充掩码", "第 2 个键是填充", "true 表示填充"]),
])
def test_report_names_the_mask_and_shows_the_kept_pattern(spec, en, zh):
    t = attntrace.run({**BASE, **spec})
    keep = np.asarray(t.step("masked").details["keep"])
    for lang, phrases in (("en", en), ("zh", zh)):
        md = attntrace.render(t, format="md", lang=lang)
        for p in phrases:
            assert p in md, (lang, p)
        rows = [" & ".join("1" if x else "0" for x in r) for r in keep]
        assert "\\underset{(2 \\times 3)}{M} = \\begin{bmatrix}" + " \\\\ ".join(rows) + "\\end{bmatrix}" in md


def test_json_names_the_mask_and_its_keep_matrix():
    t = attntrace.run({**BASE, "window": 1, "mask": "causal_bottom_right", "key_padding": [False, False, False]})
    from attntrace.rendering.export import trace_to_dict

    step = next(s for s in trace_to_dict(t)["steps"] if s["id"] == "masked")
    assert step["mask"] == "causal_bottom_right" and step["window"] == 1 and step["key_padding"] == [False, False, False]
    assert step["keep"] == [[0, 1, 0], [0, 0, 1]]  # window 1: each query sees only its own position (i + 1)


# ------------------------------------------------------------------ the PyTorch bridge (SDPA)

def _sdpa_case(seed, h, L, S, d=3):
    import torch

    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, h, n, d, generator=g, dtype=torch.float64) for n in (L, S, S))


def _concat(out):
    """SDPA's (1, H, L, E) output as attntrace's concatenation (L, H E)."""
    return out[0].transpose(0, 1).reshape(out.shape[2], -1).numpy()


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(1, 5), st.integers(0, 3), st.integers(0, 2**32 - 1))
def test_from_qkv_takes_causal_lower_right(h, L, extra, seed):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    O = _oracles()
    S = L + extra
    q, k, v = _sdpa_case(seed % 2**31, h, L, S)
    bias = causal_lower_right(L, S)
    t = attntrace.from_qkv(q, k, v, attn_mask=bias)
    assert t.settings["mask"] == "causal_bottom_right"
    with torch.no_grad():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    z = t.step("concat").value if h > 1 else t.step("Z").value
    np.testing.assert_allclose(z, _concat(out), atol=TOL, rtol=0)
    weights = O.attention_weights(q[0].numpy(), k[0].numpy(), mask=O.causal_lower_right_keep(L, S))
    for i in range(h):
        np.testing.assert_allclose(t.step("weights", i + 1 if h > 1 else None).value, weights[i], atol=TOL, rtol=0)


def test_from_qkv_is_causal_with_fewer_queries_is_top_left_and_says_so():
    import torch
    import torch.nn.functional as F

    q, k, v = _sdpa_case(7, 1, 2, 4)
    t = attntrace.from_qkv(q, k, v, is_causal=True)
    with torch.no_grad():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(t.step("Z").value, _concat(out), atol=TOL, rtol=0)
    np.testing.assert_array_equal(np.asarray(t.step("masked").details["keep"]), [[1, 0, 0, 0], [1, 1, 0, 0]])
    assert "aligned top-left, as PyTorch's" in attntrace.render(t, format="md")
    assert "左上角对齐" in attntrace.render(t, format="md", lang="zh")


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 6), st.integers(1, 7), st.integers(0, 3), st.integers(0, 2**32 - 1))
def test_from_qkv_names_a_windowed_boolean_mask(n, window, extra, seed):
    """A boolean SDPA mask built by HF's sliding-window function becomes window = W (and the
    causal alignment); weights and output equal SDPA's."""
    import torch
    import torch.nn.functional as F

    O = _oracles()
    S = n + extra
    keep = O.sliding_window_keep(n, window, n_k=S, q_offset=extra)
    q, k, v = _sdpa_case(seed % 2**31, 2, n, S)
    t = attntrace.from_qkv(q, k, v, attn_mask=torch.from_numpy(keep))
    with torch.no_grad():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.from_numpy(keep))
    np.testing.assert_allclose(t.step("concat").value, _concat(out), atol=TOL, rtol=0)
    if keep.all():
        assert not t.has("masked", 1)  # nothing masked: no mask step
        return
    np.testing.assert_array_equal(np.asarray(t.step("masked", 1).details["keep"]), keep)
    d = t.step("masked", 1).details
    assert d["kind"] in ("causal", "causal_bottom_right")  # named, not a bare 0/1 matrix
    if d["window"] is not None:
        assert 1 <= d["window"] <= window  # a window wider than the causal reach keeps what causal keeps


def test_from_qkv_refuses_a_causal_bias_of_other_lengths():
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = _sdpa_case(1, 1, 2, 3)
    with pytest.raises(attntrace.BadInput, match=r"^attn_mask is a causal bias for \(3, 4\) but q and k give \(2, 3\)$"):
        attntrace.from_qkv(q, k, v, attn_mask=causal_lower_right(3, 4))
