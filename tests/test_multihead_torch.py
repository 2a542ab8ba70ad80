"""Issue #3, PyTorch part: multi-head specs written by hand against torch.nn.MultiheadAttention.

The specs are built directly (not through attntrace.from_torch), in attntrace's row-vector
convention: W_Q = in_proj_weight[:E].T (torch stores (out, in)), b_Q = in_proj_bias[:E] full
width, W_O = out_proj.weight.T, b_O = out_proj.bias. float64 throughout; tolerance 1e-10.
"""

import copy

import numpy as np
import pytest

import attntrace

ATOL = 1e-10


def _module(torch, E, h, bias, seed):
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(E, h, bias=bias, dtype=torch.float64).eval()
    if bias:  # torch starts the biases at 0; make them matter
        with torch.no_grad():
            m.in_proj_bias.normal_()
            m.out_proj.bias.normal_()
    return m


def _weights(m):
    E = m.embed_dim
    W = m.in_proj_weight.detach().numpy()  # (3E, E) = (out, in)
    w = {"W_Q": W[:E].T, "W_K": W[E:2 * E].T, "W_V": W[2 * E:].T, "W_O": m.out_proj.weight.detach().numpy().T}
    if m.in_proj_bias is not None:
        b = m.in_proj_bias.detach().numpy()
        w.update(b_Q=b[None, :E], b_K=b[None, E:2 * E], b_V=b[None, 2 * E:], b_O=m.out_proj.bias.detach().numpy()[None, :])
    return w


def _num_heads_spec(m, X, Xkv, mask):
    spec = {"X": X, "num_heads": m.num_heads, **_weights(m)}
    if Xkv is not None:
        spec["X_kv"] = Xkv
    if mask:
        spec["mask"] = "causal"
    return spec


def _heads_spec(m, X, Xkv, mask):
    """The same problem with per-head matrices: head i takes column block i of W_Q, W_K, W_V, b_*."""
    w, h = _weights(m), m.num_heads
    dk = m.embed_dim // h
    heads = [{k: np.ascontiguousarray(w[k][:, i * dk:(i + 1) * dk]) for k in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V") if k in w}
             for i in range(h)]
    spec = {"X": X, "heads": heads, **{k: w[k] for k in ("W_O", "b_O") if k in w}}
    if Xkv is not None:
        spec["X_kv"] = Xkv
    if mask:
        spec["mask"] = "causal"
    return spec


def _torch_reference(torch, m, X, Xkv, causal):
    """Module output, per-head weights (h, L, S) and the concatenated heads (through an identity out_proj)."""
    x = torch.tensor(X)
    y = torch.tensor(Xkv) if Xkv is not None else x
    mask = torch.ones(x.shape[0], y.shape[0], dtype=torch.bool).triu(1) if causal else None  # True = masked
    out, w = m(x, y, y, attn_mask=mask, need_weights=True, average_attn_weights=False)
    ident = copy.deepcopy(m)
    with torch.no_grad():
        ident.out_proj.weight.copy_(torch.eye(m.embed_dim, dtype=torch.float64))
        if ident.out_proj.bias is not None:
            ident.out_proj.bias.zero_()
    concat = ident(x, y, y, attn_mask=mask, need_weights=False)[0]
    return out.detach().numpy(), w.detach().numpy(), concat.detach().numpy()


def _assert_identical(a, b):
    """The same trace: the same steps, inputs, shapes and details, and the same values up to the
    last bit or two. Not bit for bit: a head's column block of W_K is a strided view in the
    num_heads form and its own contiguous matrix in the heads=[...] form, and OpenBLAS may pick
    another kernel for another leading dimension (seen here with OPENBLAS_CORETYPE=Haswell:
    1 ulp in K, 4.4e-16 in the scores)."""
    assert [s.key for s in a.steps] == [s.key for s in b.steps]
    for x, y in zip(a.steps, b.steps):
        assert x.shape == y.shape and x.inputs == y.inputs, x.key
        np.testing.assert_allclose(x.value, y.value, rtol=1e-14, atol=1e-14, err_msg=f"{x.key} differs")
        assert set(x.details) == set(y.details), x.key
        for k in x.details:
            dx, dy = x.details[k], y.details[k]
            if isinstance(dx, np.ndarray) and dx.dtype.kind == "f":
                np.testing.assert_allclose(dx, dy, rtol=1e-14, atol=1e-14, err_msg=f"{x.key}.{k}")
            else:
                assert np.array_equal(dx, dy) if isinstance(dx, np.ndarray) else dx == dy, f"{x.key}.{k}"


CASES = [  # (E, h, L, S, bias, cross, causal)
    (6, 2, 4, 4, True, False, False),
    (6, 2, 4, 4, False, False, False),
    (6, 3, 5, 5, True, False, True),
    (8, 4, 3, 5, True, True, False),
    (8, 2, 3, 6, False, True, False),
    (4, 2, 5, 5, False, False, True),
    (12, 3, 4, 4, True, True, True),  # cross with a causal (L, S) lower-triangle mask, S = L
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"E{c[0]}h{c[1]}L{c[2]}S{c[3]}{'-bias' if c[4] else ''}{'-cross' if c[5] else ''}{'-causal' if c[6] else ''}")
@pytest.mark.parametrize("seed", range(3))
def test_multihead_matches_torch(torch, case, seed):
    E, h, L, S, bias, cross, causal = case
    m = _module(torch, E, h, bias, seed)
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(L, E))
    Xkv = rng.normal(size=(S, E)) if cross else None
    t = attntrace.run(_num_heads_spec(m, X, Xkv, causal))
    out, w, concat = _torch_reference(torch, m, X, Xkv, causal)

    assert t.num_heads == h
    np.testing.assert_allclose(t.step("concat").value, concat, rtol=0, atol=ATOL, err_msg="concat")
    np.testing.assert_allclose(t.step("output").value, out, rtol=0, atol=ATOL, err_msg="output")
    for i in range(h):
        np.testing.assert_allclose(t.step("weights", i + 1).value, w[i], rtol=0, atol=ATOL, err_msg=f"weights@{i + 1}")
        assert t.step("scaled", i + 1).details["d_k"] == E // h  # sqrt of the head's width, as torch
    if causal:
        upper = ~np.tril(np.ones((L, S), dtype=bool))
        assert all((t.step("weights", i + 1).value[upper] == 0.0).all() for i in range(h))

    # the heads=[...] form is the same trace (to the last bit or two: see _assert_identical)
    _assert_identical(attntrace.run(_heads_spec(m, X, Xkv, causal)), t)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("cross", [False, True])
def test_one_head_is_the_single_head_trace(torch, bias, cross):
    E, L, S = 4, 3, 5 if cross else 3
    m = _module(torch, E, 1, bias, seed=1)
    rng = np.random.default_rng(9)
    X = rng.normal(size=(L, E))
    Xkv = rng.normal(size=(S, E)) if cross else None
    single = {"X": X, **_weights(m)}
    if cross:
        single["X_kv"] = Xkv
    t_single = attntrace.run(single)
    t_num = attntrace.run(_num_heads_spec(m, X, Xkv, False))
    t_heads = attntrace.run(_heads_spec(m, X, Xkv, False))
    assert t_single.num_heads == 1 and not t_single.has("concat")
    assert all(s.head is None for s in t_single.steps)
    _assert_identical(t_num, t_single)
    _assert_identical(t_heads, t_single)
    out, w, _ = _torch_reference(torch, m, X, Xkv, False)
    np.testing.assert_allclose(t_single.step("output").value, out, rtol=0, atol=ATOL)
    np.testing.assert_allclose(t_single.step("weights").value, w[0], rtol=0, atol=ATOL)


def test_from_torch_agrees_with_the_hand_built_spec(torch):
    m = _module(torch, 6, 3, True, seed=4)
    X = np.random.default_rng(2).normal(size=(4, 6))
    by_hand = attntrace.run(_num_heads_spec(m, X, None, True))
    bridged = attntrace.from_torch(m, torch.tensor(X), is_causal=True)
    _assert_identical(bridged, by_hand)
