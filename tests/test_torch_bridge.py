"""attntrace.from_torch / from_qkv against the PyTorch modules and functions they mirror (float64, 1e-10)."""

import numpy as np
import pytest

import attntrace
from attntrace.model.errors import BadInput, Unsupported

ATOL = 1e-10


def _close(got, want, what=""):
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=what)


def _mha(torch, E, h, *, bias=True, batch_first=False, kdim=None, vdim=None, seed=0, **kw):
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(E, h, bias=bias, batch_first=batch_first, kdim=kdim, vdim=vdim,
                                    dtype=torch.float64, **kw)
    if bias:  # torch initialises the biases to 0; make them count
        with torch.no_grad():
            m.in_proj_bias.normal_()
            m.out_proj.bias.normal_()
    return m.eval()


def _check_module(torch, m, q, k, v, trace, **call):
    """The trace's output and per-head weights equal the module's own."""
    out, w = m(q, k, v, need_weights=True, average_attn_weights=False, **call)
    out, w = out.detach().numpy(), w.detach().numpy()
    if out.ndim == 3:  # a batch of one
        out = out[0] if m.batch_first else out[:, 0]
        w = w[0]
    _close(trace.step("output").value, out, "output")
    h = m.num_heads
    for i in range(h):
        head = None if h == 1 else i + 1
        _close(trace.step("weights", head).value, w[i], f"weights of head {i + 1}")
    return out, w


def _seq(torch, L, E, batched, batch_first, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(L, E, dtype=torch.float64, generator=g)
    if not batched:
        return x
    return x[None] if batch_first else x[:, None]


@pytest.mark.parametrize("h", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_first,batched", [(False, False), (False, True), (True, True), (True, False)])
def test_self_attention_matches_module(torch, h, bias, batch_first, batched):
    E = 6
    m = _mha(torch, E, h, bias=bias, batch_first=batch_first, seed=h)
    x = _seq(torch, 5, E, batched, batch_first, seed=10 + h)
    t = attntrace.from_torch(m, x)
    _check_module(torch, m, x, x, x, t)
    assert t.num_heads == h
    assert not t.settings["cross"]
    assert t.has("concat") == (h > 1)
    assert (t.operand("b_O") is not None) if bias else not any(o.name == "b_O" for o in t.operands)
    # explicit key=value=query is the same trace
    t2 = attntrace.from_torch(m, x, x, x)
    assert all(np.array_equal(a.value, b.value) for a, b in zip(t.steps, t2.steps))


@pytest.mark.parametrize("h", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_first", [False, True])
def test_cross_attention_matches_module(torch, h, bias, batch_first):
    E = 4
    m = _mha(torch, E, h, bias=bias, batch_first=batch_first, seed=3)
    q = _seq(torch, 3, E, True, batch_first, seed=1)
    mem = _seq(torch, 5, E, True, batch_first, seed=2)
    t = attntrace.from_torch(m, q, mem, mem)
    _check_module(torch, m, q, mem, mem, t)
    assert t.settings["cross"]
    assert t.step("weights", None if h == 1 else 1).shape == (3, 5)
    # value defaults to key
    t2 = attntrace.from_torch(m, q, mem)
    assert np.array_equal(t.step("output").value, t2.step("output").value)


def test_separate_projection_weights_kdim_vdim(torch):
    E, kd = 4, 3
    m = _mha(torch, E, 2, kdim=kd, vdim=kd, seed=5)
    assert not m._qkv_same_embed_dim
    with torch.no_grad():
        m.in_proj_bias.normal_()
    q = torch.randn(2, E, dtype=torch.float64)
    mem = torch.randn(4, kd, dtype=torch.float64)
    t = attntrace.from_torch(m, q, mem, mem)
    _check_module(torch, m, q, mem, mem, t)
    assert t.operand("W_K", 1).shape == (kd, 2)


def _random_keep(rng, L, S):
    keep = rng.random((L, S)) < 0.5
    keep[np.arange(L), rng.integers(0, S, L)] = True  # no fully masked row
    return keep


@pytest.mark.parametrize("kind", ["bool", "float", "bool3d", "float3d"])
@pytest.mark.parametrize("cross", [False, True])
def test_attn_mask_matches_module(torch, kind, cross):
    E, h, L = 6, 3, 4
    S = 5 if cross else L
    m = _mha(torch, E, h, seed=7)
    x = torch.randn(L, E, dtype=torch.float64)
    mem = torch.randn(S, E, dtype=torch.float64) if cross else x
    keep = _random_keep(np.random.default_rng(1), L, S)
    masked = torch.tensor(~keep)  # torch MHA: True = masked
    mask = masked if kind.startswith("bool") else torch.zeros(L, S, dtype=torch.float64).masked_fill(masked, float("-inf"))
    if kind.endswith("3d"):
        mask = mask.expand(h, L, S)
    t = attntrace.from_torch(m, x, mem, mem, attn_mask=mask)
    _check_module(torch, m, x, mem, mem, t, attn_mask=mask)
    assert np.array_equal(t.step("masked", 1).details["keep"], keep)
    for i in range(1, h + 1):
        assert (t.step("weights", i).value[~keep] == 0.0).all()


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("h", [1, 2])
def test_is_causal_matches_module(torch, batch_first, h):
    E, L = 4, 5
    m = _mha(torch, E, h, batch_first=batch_first, seed=11)
    x = _seq(torch, L, E, True, batch_first, seed=4)
    causal_bool = torch.ones(L, L, dtype=torch.bool).triu(1)  # True above the diagonal = masked
    causal_float = torch.nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)
    # torch's MHA needs attn_mask with the is_causal hint; attntrace accepts is_causal alone too
    with pytest.raises(RuntimeError):
        m(x, x, x, is_causal=True)
    alone = attntrace.from_torch(m, x, is_causal=True)
    for mask in (causal_bool, causal_float):
        t = attntrace.from_torch(m, x, attn_mask=mask, is_causal=True)
        _check_module(torch, m, x, x, x, t, attn_mask=mask, is_causal=True)
        assert t.settings["mask"] == "causal"
        assert all(np.array_equal(a.value, b.value) for a, b in zip(t.steps, alone.steps))
        plain = attntrace.from_torch(m, x, attn_mask=mask)  # the same mask without the hint
        _check_module(torch, m, x, x, x, plain, attn_mask=mask)


def test_is_causal_with_a_different_mask_is_refused(torch):
    m = _mha(torch, 4, 2)
    x = torch.randn(3, 4, dtype=torch.float64)
    with pytest.raises(BadInput, match="not the causal mask"):
        attntrace.from_torch(m, x, attn_mask=torch.zeros(3, 3, dtype=torch.bool), is_causal=True)


def test_key_padding_mask_matches_module(torch):
    E, L, S = 4, 3, 5
    m = _mha(torch, E, 2, batch_first=True, seed=2)
    q, mem = torch.randn(1, L, E, dtype=torch.float64), torch.randn(1, S, E, dtype=torch.float64)
    kpm = torch.tensor([[False, True, False, False, True]])
    t = attntrace.from_torch(m, q, mem, mem, key_padding_mask=kpm)
    _check_module(torch, m, q, mem, mem, t, key_padding_mask=kpm)
    assert (t.step("weights", 2).value[:, [1, 4]] == 0).all()


def test_float32_module_is_traced_in_float64(torch):
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(4, 2).eval()  # float32
    x = torch.randn(3, 4)
    t = attntrace.from_torch(m, x)
    out = m(x, x, x)[0].detach().numpy()
    assert t.step("output").value.dtype == np.float64
    np.testing.assert_allclose(t.step("output").value, out, atol=1e-5)


# -- refusals --------------------------------------------------------------------------------
def test_unsupported_module_features(torch):
    x = torch.randn(3, 4, dtype=torch.float64)
    for kw, words in [({"add_bias_kv": True}, "add_bias_kv"), ({"add_zero_attn": True}, "add_zero_attn")]:
        m = torch.nn.MultiheadAttention(4, 2, dtype=torch.float64, **kw).eval()
        with pytest.raises(Unsupported, match=words):
            attntrace.from_torch(m, x)
    m = torch.nn.MultiheadAttention(4, 2, dropout=0.1, dtype=torch.float64)  # training mode
    with pytest.raises(Unsupported, match="eval"):
        attntrace.from_torch(m, x)
    attntrace.from_torch(m.eval(), x)  # fine in eval mode
    m = torch.nn.MultiheadAttention(4, 2, kdim=3, vdim=5, dtype=torch.float64).eval()
    with pytest.raises(Unsupported, match="kdim"):
        attntrace.from_torch(m, x, torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64))
    with pytest.raises(Unsupported, match="MultiheadAttention"):
        attntrace.from_torch(torch.nn.Linear(4, 4), x)


def test_bad_inputs_are_one_line_errors(torch):
    m = _mha(torch, 4, 2)
    x = torch.randn(3, 4, dtype=torch.float64)
    cases = [
        (lambda: attntrace.from_torch(m, torch.randn(3, 2, 4, dtype=torch.float64)), Unsupported, "batch of 2"),
        (lambda: attntrace.from_torch(m, x, torch.randn(2, 4), torch.randn(2, 4)), Unsupported, "key and value"),
            # a float mask's finite entries are a bias now (issue 23, tests/test_from_torch_api.py); +inf is not
            (lambda: attntrace.from_torch(m, x, attn_mask=torch.full((3, 3), float("inf"))), BadInput, r"NaN or \+inf"),
        (lambda: attntrace.from_torch(m, x, attn_mask=torch.rand(2, 3, 3) < 0.5), Unsupported, "differs between heads"),
        (lambda: attntrace.from_torch(m, x, attn_mask=torch.zeros(2, 2, dtype=torch.bool)), BadInput, "shape"),
        (lambda: attntrace.from_torch(m, torch.randn(3, 5)), BadInput, "embed_dim"),
        (lambda: attntrace.from_torch(m, x, attn_mask=torch.ones(3, 3, dtype=torch.bool)), BadInput, "keeps no entry"),
    ]
    for call, exc, words in cases:
        with pytest.raises(exc, match=words) as info:
            call()
        assert "\n" not in str(info.value)


# -- scaled_dot_product_attention ----------------------------------------------------------------
def _sdpa(torch, q, k, v, **kw):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw).numpy()


def _sdpa_weights(torch, q, k, keep=None, causal=False, scale=None):
    s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1).numpy()


@pytest.mark.parametrize("layout", ["2d", "3d", "4d1", "4d3"])
@pytest.mark.parametrize("mask", [None, "causal", "bool", "float"])
@pytest.mark.parametrize("cross", [False, True])
def test_from_qkv_matches_sdpa(torch, layout, mask, cross):
    L, S, E, Ev = 4, (6 if cross else 4), 3, 5
    H = 3 if layout == "4d3" else 1
    lead = {"2d": (), "3d": (1,), "4d1": (1, 1), "4d3": (1, 3)}[layout]
    g = torch.Generator().manual_seed(hash((layout, mask, cross)) % 1000)
    q = torch.randn(*lead, L, E, dtype=torch.float64, generator=g)
    k = torch.randn(*lead, S, E, dtype=torch.float64, generator=g)
    v = torch.randn(*lead, S, Ev, dtype=torch.float64, generator=g)
    kw, keep = {}, None
    if mask == "causal":
        kw["is_causal"] = True
    elif mask is not None:
        keep = torch.tensor(_random_keep(np.random.default_rng(0), L, S))  # SDPA: True = kept
        kw["attn_mask"] = keep if mask == "bool" else torch.zeros(L, S, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    t = attntrace.from_qkv(q, k, v, **kw)
    want = _sdpa(torch, q, k, v, **kw).reshape(H, L, Ev)
    a = _sdpa_weights(torch, q, k, keep, causal=mask == "causal").reshape(H, L, S)
    for i in range(H):
        head = None if H == 1 else i + 1
        _close(t.step("Z", head).value, want[i], f"Z of head {i + 1}")
        _close(t.step("weights", head).value, a[i], f"weights of head {i + 1}")
    if H > 1:  # concat = SDPA's (1, H, L, Ev) output as (L, H*Ev)
        _close(t.step("concat").value, want.transpose(1, 0, 2).reshape(L, H * Ev), "concat")


def test_from_qkv_scale_and_numpy_inputs(torch):
    rng = np.random.default_rng(4)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    tq, tk, tv = (torch.tensor(a) for a in (q, k, v))
    for scale in (None, 0.3, 2.0):
        t = attntrace.from_qkv(q, k, v, scale=scale)
        _close(t.step("Z").value, _sdpa(torch, tq, tk, tv, scale=scale), f"scale={scale}")
        _close(t.step("weights").value, _sdpa_weights(torch, tq, tk, scale=scale))
    # per-head masks that agree are fine; (1, 1, L, S) broadcasts
    m = torch.tensor(_random_keep(rng, 3, 5))
    t = attntrace.from_qkv(tq[None, None], tk[None, None], tv[None, None], attn_mask=m[None, None])
    _close(t.step("Z").value, _sdpa(torch, tq, tk, tv, attn_mask=m))


def test_from_qkv_refusals(torch):
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    with pytest.raises(Unsupported, match="batch"):
        attntrace.from_qkv(torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 4))
    with pytest.raises(Unsupported, match="grouped-query"):
        attntrace.from_qkv(q, torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4))
    with pytest.raises(BadInput, match="not both"):
        attntrace.from_qkv(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.bool), is_causal=True)
    with pytest.raises(Unsupported, match="positive"):
        attntrace.from_qkv(q, q, q, scale=-1.0)
    with pytest.raises(BadInput, match=r"NaN or \+inf"):  # finite float entries are a bias now (issue 23)
        attntrace.from_qkv(q, q, q, attn_mask=torch.full((3, 3), float("nan")))


@pytest.mark.parametrize("make", [
    lambda torch: torch.arange(12.0, dtype=torch.float32).reshape(3, 4),
    lambda torch: torch.arange(12.0, dtype=torch.float64).reshape(3, 4),
    lambda torch: torch.arange(12.0, dtype=torch.float64).reshape(4, 3).T,
    lambda torch: torch.arange(12.0, dtype=torch.float64).reshape(3, 4)[1:],
], ids=["float32", "float64", "float64-transposed", "float64-slice"])
def test_to_numpy_copies_once_and_never_shares_the_tensors_memory(torch, make):
    # the bridges pass copy=False to the tracer on the promise that their arrays are their own
    from attntrace.bridges.pytorch import to_numpy

    t = make(torch)
    before = t.clone()
    out = to_numpy(t, "X")
    assert out.dtype == np.float64 and out.flags.writeable
    np.testing.assert_array_equal(out, before.double().numpy())
    out[...] = -1.0
    assert torch.equal(t, before)
