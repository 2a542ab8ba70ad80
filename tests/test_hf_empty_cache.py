"""Issue 20 B, specs: an empty Hugging Face DynamicCache (the first decoding step) gave "cached
keys must be (1, P, 4)..., not ()". An empty cache is no cache (P = 0): the prompt's causal
self-attention, checked against the tiny random Llama layer of tests/oracles.py (no downloads)
at 1e-10, as tests/test_hf_bridge.py checks the bridge without a cache.
"""

from __future__ import annotations

import numpy as np
import pytest

import attntrace
from mathcheck import require_modules

TOL = 1e-10


@pytest.fixture(scope="module")
def layer():
    require_modules("torch", "transformers")
    import oracles
    import torch
    from transformers import LlamaModel

    seed, d, h, h_kv, n = 1, 16, 4, 2, 5
    ref = oracles.llama_attention_layer(seed, hidden_size=d, num_heads=h, num_kv_heads=h_kv, n=n)
    cfg = oracles._tiny_llama_config(d, h, h_kv, 10000.0, layers=1, attn="eager")
    torch.manual_seed(seed)
    model = LlamaModel(cfg).double().eval()
    np.testing.assert_array_equal(model.layers[0].self_attn.q_proj.weight.detach().numpy().T, ref["W_Q"])
    return model, ref


def _empty_caches(model):
    from transformers import DynamicCache

    return {
        "DynamicCache()": DynamicCache(),
        "DynamicCache(config)": DynamicCache(config=model.config),  # its layers exist but hold nothing yet
        "arrays with P = 0": (np.zeros((2, 0, 4)), np.zeros((2, 0, 4))),
    }


@pytest.mark.parametrize("which", ["DynamicCache()", "DynamicCache(config)", "arrays with P = 0"])
@pytest.mark.parametrize("start", ["x", "qkv"])
def test_an_empty_cache_is_no_cache(layer, which, start):
    model, ref = layer
    cache = _empty_caches(model)[which]
    t = attntrace.from_hf_llama_attention(model, ref["x"], cache=cache, start=start)
    assert not t.has("K_cache", 1)
    for i in range(ref["num_heads"]):
        np.testing.assert_allclose(t.step("weights", i + 1).value, ref["weights"][i], atol=TOL, rtol=0)
    np.testing.assert_allclose(t.step("output").value, ref["output"], atol=TOL, rtol=0)


def test_the_cache_hugging_face_fills_on_its_first_step_is_read_after_it(layer):
    """The first step's DynamicCache, passed to the model, is filled by it: the bridge then reads
    the prompt's keys (P = 5), so the same object works for the next step."""
    import torch
    from transformers import DynamicCache

    model, ref = layer
    cache = DynamicCache(config=model.config)
    assert attntrace.from_hf_llama_attention(model, ref["x"], cache=cache).step("output").shape == (5, 16)
    with torch.no_grad():
        model(inputs_embeds=torch.from_numpy(np.asarray(ref["x"]))[None], cache=cache, use_cache=True)
    t = attntrace.from_hf_llama_attention(model, np.zeros((1, 16)), cache=cache)
    assert t.step("K_cache", 1).shape[0] == 6
