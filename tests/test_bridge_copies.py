"""The bridges hand the tracer arrays of their own (converted once, `copy=False`): a traced
layer never shares memory with the module's parameters, so changing the module's weights after
tracing leaves the trace as it was. Checked against the module itself: its float64 parameters
seen through NumPy (`np.shares_memory`), and its weights changed in place after the trace.
"""

from __future__ import annotations

import numpy as np
import pytest

from mathcheck import require_modules


@pytest.fixture(scope="module", autouse=True)
def _libraries():
    require_modules("torch", "transformers")


def _arrays(trace):
    """Every ndarray the trace holds: its given operands and its steps' values."""
    out = [o.value for o in trace.operands if isinstance(o.value, np.ndarray)]
    return out + [s.value for s in trace.steps if isinstance(getattr(s, "value", None), np.ndarray)]


def _check_owns_its_memory(module, trace):
    import torch

    params = [p.detach().numpy() for p in module.parameters() if p.dtype == torch.float64 and p.device.type == "cpu"]
    assert params, "the check needs float64 parameters to compare against"
    held = _arrays(trace)
    assert not any(np.shares_memory(a, p) for a in held for p in params)
    before = [a.copy() for a in held]
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1.0)  # every weight, bias and gain changed in place
    assert all(np.array_equal(a, b) for a, b in zip(held, before))


def test_hf_llama_layer_owns_its_arrays():
    import oracles_block as ob
    from attntrace.bridges.blocks import from_hf_llama_layer

    model, x, y = ob.hf_llama_decoder_layer(seed=3, hidden=8, heads=2, kv_heads=1, n=4)
    t = from_hf_llama_layer(model, x, layer=0)
    np.testing.assert_allclose(t.steps[-1].value, y, rtol=0, atol=1e-10)
    _check_owns_its_memory(model, t)


@pytest.mark.parametrize("start", ["x", "qkv"])
def test_hf_llama_attention_owns_its_arrays(start):
    import torch
    import oracles_block as ob
    from attntrace.bridges.huggingface import from_hf_llama_attention

    model, x, _ = ob.hf_llama_decoder_layer(seed=4, hidden=8, heads=2, kv_heads=1, n=4)
    hidden = torch.tensor(x)[None]  # a float64 tensor: its conversion hands back the tensor itself
    t = from_hf_llama_attention(model, hidden, start=start)
    assert not any(np.shares_memory(a, hidden.numpy()) for a in _arrays(t))
    _check_owns_its_memory(model, t)


@pytest.mark.parametrize("norm_first", [False, True])
def test_torch_encoder_layer_owns_its_arrays(norm_first):
    import torch
    import oracles_block as ob
    from attntrace.bridges.blocks import from_torch_layer

    layer = ob.random_encoder_layer(8, 2, 16, "gelu", norm_first, seed=5)
    x = torch.tensor(np.random.default_rng(5).standard_normal((5, 8)))
    expected = ob.encoder_layer(layer, x.numpy())
    t = from_torch_layer(layer, x)
    np.testing.assert_allclose(t.steps[-1].value, expected, rtol=0, atol=1e-10)
    assert not any(np.shares_memory(a, x.numpy()) for a in _arrays(t))
    _check_owns_its_memory(layer, t)


def test_a_float32_layer_is_converted_into_the_transposed_layout():
    """A float32 weight is read once, straight into (in, out) float64: C-contiguous, equal to
    the weight's transpose, and the same trace as the float64 copy of the layer gives."""
    import copy

    import torch
    import oracles_block as ob
    from attntrace.bridges.blocks import from_torch_layer
    from attntrace.bridges.pytorch import to_numpy_T

    layer64 = ob.random_encoder_layer(8, 2, 16, "relu", False, seed=6)
    layer32 = copy.deepcopy(layer64).float()
    w = to_numpy_T(layer32.linear1.weight, "linear1.weight")
    assert w.dtype == np.float64 and w.flags.c_contiguous
    np.testing.assert_array_equal(w, layer32.linear1.weight.detach().double().numpy().T)
    x = np.random.default_rng(6).standard_normal((5, 8))
    t32 = from_torch_layer(layer32, x)
    t64 = from_torch_layer(layer64.float().double(), x)
    np.testing.assert_array_equal(t32.steps[-1].value, t64.steps[-1].value)


def test_a_float64_weight_whose_transpose_is_contiguous_is_still_copied():
    """A (1, d) or (d, 1) float64 weight: its transpose is already C-contiguous, so the
    conversion hands back the parameter's own memory, which is then copied."""
    import torch
    from attntrace.bridges.pytorch import to_numpy_T

    for shape in ((1, 4), (4, 1)):
        p = torch.nn.Parameter(torch.randn(*shape, dtype=torch.float64))
        w = to_numpy_T(p, "w")
        assert w.shape == shape[::-1] and not np.shares_memory(w, p.detach().numpy())
