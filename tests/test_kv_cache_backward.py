"""Issue 20 B, specs: a KV cache with `backward = true` from X (it failed with "cannot multiply
X (2, 1) by dK (3, 2)", and a raw ValueError with two heads).

K = [K_past; X W_K + b_K]: the gradient dK = dS^T Q covers every cached key, but only the new
rows depend on W_K, b_K and X. Every gradient is checked against torch.autograd through
scaled_dot_product_attention with the bottom-right causal mask, including the cache's own
gradients (the first P rows of dK and dV are K_past.grad and V_past.grad).
"""

from __future__ import annotations

import numpy as np
import pytest

import attntrace

torch = pytest.importorskip("torch")

CASES = [(p, n, d, h, bias) for p, n, d, h, bias in
         [(3, 1, 2, 1, False), (2, 2, 2, 1, True), (1, 3, 4, 2, False), (3, 2, 4, 2, True), (2, 1, 4, 2, True), (4, 3, 2, 1, True)]]


def _torch_grads(m: dict, h: int, past: int) -> dict:
    t = {k: torch.tensor(np.asarray(v, dtype=float), dtype=torch.float64, requires_grad=True) for k, v in m.items()}
    x = t["X"]
    q = x @ t["W_Q"] + t.get("b_Q", 0)
    k = torch.cat([t["K_past"], x @ t["W_K"] + t.get("b_K", 0)])
    v = torch.cat([t["V_past"], x @ t["W_V"] + t.get("b_V", 0)])
    n, s = q.shape[0], k.shape[0]
    keep = torch.arange(s)[None, :] <= torch.arange(n)[:, None] + past  # bottom-right causal
    split = lambda a: a.reshape(a.shape[0], h, -1).transpose(0, 1)  # noqa: E731 - (h, rows, d_k)
    out = torch.nn.functional.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=keep)
    out = out.transpose(0, 1).reshape(n, -1)  # the heads' columns side by side, head 1 first
    (out ** 2).sum().backward()
    return {k: a.grad.numpy() for k, a in t.items()}


@pytest.mark.parametrize("past, new, d, heads, bias", CASES)
def test_cache_gradients_match_torch_autograd(past, new, d, heads, bias):
    rng = np.random.default_rng(past * 100 + new * 10 + d + heads)
    m = {"X": rng.normal(size=(new, d)), "W_Q": rng.normal(size=(d, d)), "W_K": rng.normal(size=(d, d)),
         "W_V": rng.normal(size=(d, d)), "K_past": rng.normal(size=(past, d)), "V_past": rng.normal(size=(past, d))}
    if bias:
        m.update({"b_Q": rng.normal(size=(1, d)), "b_K": rng.normal(size=(1, d)), "b_V": rng.normal(size=(1, d))})
    spec = {k: v.tolist() for k, v in m.items()} | {"backward": True, "num_heads": heads}
    if new > 1:
        spec["mask"] = "causal_bottom_right"
    trace = attntrace.run(spec)
    want = _torch_grads(m, heads, past)
    for key in ["X", "W_Q", "W_K", "W_V"] + (["b_Q", "b_K", "b_V"] if bias else []):
        np.testing.assert_allclose(trace.step(f"d{key}").value, want[key], atol=1e-10, rtol=0, err_msg=key)
    dk = heads > 1 and d // heads
    for which in ("K", "V"):
        got = np.hstack([trace.step(f"d{which}", hd).value for hd in (range(1, heads + 1) if heads > 1 else [None])])
        assert got.shape == (past + new, d)
        np.testing.assert_allclose(got[:past], want[f"{which}_past"], atol=1e-10, rtol=0, err_msg=f"d{which} past rows")
    assert dk is False or dk == d // heads


@pytest.mark.parametrize("mode", ["exact", "symbolic", "shape"])
def test_cache_backward_in_every_mode_and_format(mode):
    """The other modes agree with numeric mode (exact evaluated, symbolic by shape) and render."""
    spec = {"X": [[1, 0], [0, 1]], "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 2], [0, 1]], "W_V": [[1, 0], [1, 1]],
            "K_past": [[1, 0]], "V_past": [[1, 2]], "mask": "causal_bottom_right", "backward": True}
    numeric = attntrace.run(spec)
    other = attntrace.run(spec, mode=mode)
    for step in numeric.steps:
        assert other.step(step.id, step.head).shape == step.shape, step.key
        if mode == "exact":
            value = np.array(other.step(step.id, step.head).value.evalf(30).tolist(), dtype=float)
            np.testing.assert_allclose(value, step.value, atol=1e-12, rtol=0, err_msg=step.key)
    assert other.step("dW_K").formula == "\\mathrm{d}W_K = X^{\\top} \\mathrm{d}K_{2{:}3,\\,:}"
    assert other.step("dW_K").plain == "dW_K = X^T dK[2..3, :]"
    for fmt in ("md", "tex", "text"):
        assert "past" in attntrace.render(other, format=fmt)
