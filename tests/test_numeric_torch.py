"""Numeric traces against PyTorch: SDPA for the result, a step-by-step torch run for each step."""

import math
import numpy as np
import pytest

import attntrace


def _torch_steps(torch, X, Xkv, WQ, WK, WV, keep=None, causal=False):
    t = lambda a: torch.tensor(a, dtype=torch.float64)
    X, Xkv, WQ, WK, WV = map(t, (X, Xkv, WQ, WK, WV))
    Q, K, V = X @ WQ, Xkv @ WK, Xkv @ WV  # (n,dk) (m,dk) (m,dv)
    S = Q @ K.T  # (n, m)
    T = S / math.sqrt(Q.shape[1])
    if causal:
        keep = torch.ones(S.shape, dtype=torch.bool).tril()
    elif keep is not None:
        keep = torch.tensor(keep, dtype=torch.bool)
    M = T.masked_fill(~keep, float("-inf")) if keep is not None else T
    A = torch.softmax(M, dim=-1)
    Z = A @ V
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        Q[None], K[None], V[None], attn_mask=None if (keep is None or causal) else keep[None], is_causal=causal)[0]
    return {"Q": Q, "K": K, "V": V, "scores": S, "scaled": T, "masked": M, "weights": A, "Z": Z, "sdpa": sdpa}


CASES = [
    # (n, m, d_model, d_k, d_v, cross, mask, scale_of_inputs)
    (4, 4, 6, 6, 6, False, None, 1.0),
    (3, 3, 5, 2, 4, False, "causal", 1.0),
    (2, 5, 3, 4, 3, True, None, 1.0),
    (5, 3, 4, 3, 2, True, "causal", 1.0),
    (4, 6, 3, 2, 5, True, "random", 1.0),
    (3, 3, 2, 2, 2, False, "random", 1.0),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", range(5))
def test_numeric_matches_torch_step_by_step(torch, case, seed):
    n, m, d, dk, dv, cross, mask, amp = case
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * amp
    Xkv = rng.normal(size=(m, d)) if cross else X
    m = Xkv.shape[0]
    WQ, WK, WV = rng.normal(size=(d, dk)), rng.normal(size=(d, dk)), rng.normal(size=(d, dv))
    spec = {"X": X, "W_Q": WQ, "W_K": WK, "W_V": WV}
    keep = None
    if cross:
        spec["X_kv"] = Xkv
    if mask == "causal":
        spec["mask"] = "causal"
    elif mask == "random":
        keep = rng.random((n, m)) < 0.6
        keep[np.arange(n), rng.integers(0, m, n)] = True  # no fully masked row
        spec["mask"] = keep.astype(int).tolist()
    trace = attntrace.run(spec)
    ref = _torch_steps(torch, X, Xkv, WQ, WK, WV, keep=keep, causal=mask == "causal")
    for sid in ("Q", "K", "V", "scores", "scaled", "weights", "Z"):
        np.testing.assert_allclose(trace.step(sid).value, ref[sid].numpy(), rtol=0, atol=1e-10, err_msg=sid)
    if mask:
        got = trace.step("masked").value
        want = ref["masked"].numpy()
        assert np.array_equal(np.isneginf(got), np.isneginf(want))
        w = trace.step("weights").value
        assert (w[np.isneginf(got)] == 0.0).all(), "masked weights must be exactly 0"
    np.testing.assert_allclose(trace.step("Z").value, ref["sdpa"].numpy(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("amp", [1000.0, -1000.0, 1e6])
def test_huge_scores_are_stable(torch, amp):
    rng = np.random.default_rng(7)
    S = rng.normal(size=(3, 4)) * amp
    V = rng.normal(size=(4, 2))
    trace = attntrace.run({"scores": S, "V": V, "d_k": 4})
    w = trace.step("weights").value
    assert np.isfinite(w).all()
    want = torch.softmax(torch.tensor(S / 2.0, dtype=torch.float64), dim=-1).numpy()
    np.testing.assert_allclose(w, want, atol=1e-10, rtol=0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)
    d = trace.step("weights").details
    np.testing.assert_allclose(d["row_max"], (S / 2.0).max(axis=1))


def test_start_points_agree():
    rng = np.random.default_rng(3)
    X, WQ, WK, WV = rng.normal(size=(3, 4)), rng.normal(size=(4, 2)), rng.normal(size=(4, 2)), rng.normal(size=(4, 3))
    full = attntrace.run({"X": X, "W_Q": WQ, "W_K": WK, "W_V": WV})
    Q, K, V = (full.step(s).value for s in "QKV")
    from_qkv = attntrace.run({"Q": Q, "K": K, "V": V})
    from_scores = attntrace.run({"scores": full.step("scores").value, "V": V, "d_k": 2})
    from_weights = attntrace.run({"weights": full.step("weights").value, "V": V})
    for t in (from_qkv, from_scores, from_weights):
        np.testing.assert_allclose(t.step("Z").value, full.step("Z").value, atol=1e-12)
    assert [s.id for s in from_qkv.steps] == ["scores", "scaled", "weights", "Z"]
    assert [s.id for s in from_weights.steps] == ["Z"]


def test_values_are_read_only_and_trace_is_frozen():
    t = attntrace.run({"scores": [[1, 2], [3, 4]], "scale": False})
    with pytest.raises(ValueError):
        t.step("weights").value[0, 0] = 5
    with pytest.raises(Exception):
        t.steps[0].id = "x"
