"""The Hugging Face bridge: a tiny random Llama layer traced, checked against the layer itself.

The reference is tests/oracles.py `llama_attention_layer`: a `LlamaModel` from a tiny random
`LlamaConfig` (4 query heads, 2 key/value heads: grouped-query attention), run in float64
with forward hooks, its attention weights recomputed in float64 from the layer's own q/k
after RoPE (HF's float32 softmax is good to ~1e-7 only) and its output from SDPA. The bridge
builds the same model from the same seed (the weights are checked to be the same) and never
sees the oracle's numbers but the hidden states. Agreement at 1e-10.
"""

from __future__ import annotations

import numpy as np
import pytest

import attntrace
from mathcheck import require_modules

TOL = 1e-10


@pytest.fixture(scope="module", autouse=True)
def _libraries():
    require_modules("torch", "transformers")


def _model(seed, hidden_size=16, num_heads=4, num_kv_heads=2):
    """The oracle's model, rebuilt from the same config and seed."""
    import oracles
    import torch
    from transformers import LlamaModel

    cfg = oracles._tiny_llama_config(hidden_size, num_heads, num_kv_heads, 10000.0, layers=1, attn="eager")
    torch.manual_seed(seed)
    return LlamaModel(cfg).double().eval()


CASES = [(1, 16, 4, 2, 5), (2, 16, 4, 1, 4), (3, 12, 2, 2, 3)]  # GQA, MQA, plain multi-head


@pytest.fixture(scope="module", params=CASES, ids=["gqa", "mqa", "mha"])
def layer(request):
    import oracles

    seed, d, h, h_kv, n = request.param
    ref = oracles.llama_attention_layer(seed, hidden_size=d, num_heads=h, num_kv_heads=h_kv, n=n)
    model = _model(seed, d, h, h_kv)
    np.testing.assert_array_equal(model.layers[0].self_attn.q_proj.weight.detach().numpy().T, ref["W_Q"])
    return model, ref



@pytest.mark.parametrize("start", ["x", "qkv"])
def test_trace_matches_the_llama_layer(layer, start):
    """start="x": projections, RoPE (half layout) and GQA traced; start="qkv": from q and k
    after RoPE. Weights of every query head and the layer's output (after o_proj), at 1e-10."""
    model, ref = layer
    t = attntrace.from_hf_llama_attention(model, ref["x"], start=start)
    h = ref["num_heads"]
    for i in range(h):
        np.testing.assert_allclose(t.step("weights", i + 1).value, ref["weights"][i], atol=TOL, rtol=0)
    np.testing.assert_allclose(t.step("output").value, ref["output"], atol=TOL, rtol=0)
    # the tolerances from_hf_llama_attention's docstring and the README state against HF's eager
    # attention (float32 softmax): 1e-7 in the weights, 1e-6 in the output
    for i in range(h):
        np.testing.assert_allclose(t.step("weights", i + 1).value, ref["weights_eager"][i], atol=1e-7, rtol=0)
    np.testing.assert_allclose(t.output, ref["output_eager"], atol=1e-6, rtol=0)


def test_q_and_k_after_rope_are_exposed(layer):
    from attntrace.bridges.huggingface import llama_qkv

    model, ref = layer
    r = llama_qkv(model, ref["x"])
    np.testing.assert_allclose(r["q"], ref["q_rope"], atol=TOL, rtol=0)
    np.testing.assert_allclose(r["k"], ref["k_rope"], atol=TOL, rtol=0)
    np.testing.assert_allclose(r["v"], ref["v"], atol=TOL, rtol=0)
    assert (r["num_heads"], r["num_kv_heads"]) == (ref["num_heads"], ref["num_kv_heads"])
    # HF's own rotary module computes its angles in float32: close, not equal
    r32 = llama_qkv(model, ref["x"], rope_float64=False)
    assert 0 < np.abs(r32["q"] - ref["q_rope"]).max() < 1e-5


def test_padding_mask_matches_hugging_face_causal_padding_mask():
    """attention_mask (1 = token, 0 = padding) becomes key_padding; the weights equal SDPA's
    with HF's own causal + padding mask (masking_utils) on the layer's q, k after RoPE."""
    import oracles

    ref = oracles.llama_attention_layer(4, n=5)
    model = _model(4)
    am = [1, 0, 1, 1, 1]
    keep = oracles.causal_padding_keep(am)
    t = attntrace.from_hf_llama_attention(model, ref["x"], attention_mask=am)
    weights = oracles.attention_weights(ref["q_rope"], ref["k_rope"], mask=keep, scale=ref["scale"], enable_gqa=True)
    for i in range(4):
        np.testing.assert_allclose(t.step("weights", i + 1).value, weights[i], atol=TOL, rtol=0)
    assert t.step("masked", 1).details["key_padding"] == (False, True, False, False, False)


def test_model_layer_and_decoder_layer_are_accepted(layer):
    from attntrace.bridges.huggingface import attention_module

    model, _ = layer
    attn = model.layers[0].self_attn
    assert attention_module(model) is attn and attention_module(model.layers[0]) is attn and attention_module(attn) is attn


@pytest.mark.parametrize("call, error, message", [
    (lambda m, x: attntrace.from_hf_llama_attention(__import__("torch").nn.Linear(2, 2), x), attntrace.Unsupported,
     r"^Linear is not a Llama-style attention layer"),
    (lambda m, x: attntrace.from_hf_llama_attention(m, x[:, :3]), attntrace.BadInput, r"^hidden_states must be \(n, 16\)"),
    (lambda m, x: attntrace.from_hf_llama_attention(m, x, layer=3), attntrace.BadInput, r"^layer = 3, but the model has 1 layers"),
    (lambda m, x: attntrace.from_hf_llama_attention(m, x, position_ids=[0, 1]), attntrace.BadInput, r"^position_ids has 2 positions"),
    (lambda m, x: attntrace.from_hf_llama_attention(m, x, attention_mask=[1, 2, 1, 1]), attntrace.BadInput,
     r"^attention_mask must be 4 entries of 1 \(token\) or 0 \(padding\)"),
    (lambda m, x: attntrace.from_hf_llama_attention(m, x, start="q"), attntrace.BadInput, r"^start must be \"x\""),
    (lambda m, x: attntrace.from_hf_llama_attention(m, x, cache=(np.zeros((3, 2, 4)), np.zeros((3, 2, 4)))), attntrace.BadInput,
     r"^cached keys must be \(2, P, 4\) \(one block per key/value head\), not \(3, 2, 4\)$"),
    (lambda m, x: attntrace.from_hf_llama_attention(m, x, cache="past"), attntrace.BadInput, r"^cache must be a DynamicCache or"),
])
def test_bad_calls_are_one_line_errors(call, error, message):
    model = _model(0)
    x = np.random.default_rng(0).standard_normal((4, 16))
    with pytest.raises(error, match=message) as info:
        call(model, x)
    assert "\n" not in str(info.value)


def test_a_rope_scaling_it_does_not_trace_is_refused():
    """llama3 and yarn are traced (tests/test_hf_families.py); dynamic NTK scaling is not."""
    model = _model(0)
    model.layers[0].self_attn.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 8.0}
    with pytest.raises(attntrace.Unsupported, match=r"^rope_type 'dynamic' rescales the rotary frequencies"):
        attntrace.from_hf_llama_attention(model, np.zeros((2, 16)))


@pytest.mark.parametrize("start", ["x", "qkv"])
@pytest.mark.parametrize("as_arrays", [False, True], ids=["DynamicCache", "arrays"])
def test_one_decoding_step_with_the_models_cache(start, as_arrays):
    """`cache=` a DynamicCache after the prefix (or its keys and values as arrays): the new
    token's weights over every cached position and the layer's output equal Hugging Face's
    decoding step (oracle `llama_kv_cache_step`, same seed, float64 RoPE) at 1e-10."""
    import oracles
    import torch
    from transformers import LlamaForCausalLM

    P, seed = 3, 5
    ref = oracles.llama_kv_cache_step(seed, prefix_len=P)
    cfg = oracles._tiny_llama_config(16, 4, 2, 10000.0, layers=2, attn="sdpa")
    torch.manual_seed(seed)  # the oracle's model and token ids, rebuilt
    model = LlamaForCausalLM(cfg).double().eval()
    oracles._use_float64_rope(model)
    ids = torch.randint(0, cfg.vocab_size, (1, P + 1))
    np.testing.assert_array_equal(ids[0].numpy(), ref["input_ids"])
    with torch.no_grad():
        cache = model(ids[:, :P], use_cache=True).cache
    np.testing.assert_array_equal(cache.layers[0].keys[0].numpy(), ref["k_cache_before"])
    given = (ref["k_cache_before"], ref["v_cache_before"]) if as_arrays else cache
    t = attntrace.from_hf_llama_attention(model, ref["x_new"][None], cache=given, start=start)
    for i in range(4):
        np.testing.assert_allclose(t.step("weights", i + 1).value[0], ref["weights_new"][i], atol=TOL, rtol=0)
    np.testing.assert_allclose(t.step("output").value[0], ref["output_new"], atol=TOL, rtol=0)
    np.testing.assert_allclose(t.step("K_cache", 2).value, ref["k_cache_after"][1], atol=TOL, rtol=0)
    assert not t.has("masked", 1)  # one new token sees every cached key: no mask
