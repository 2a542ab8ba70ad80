"""Layers of the newer Hugging Face families through `from_hf_layer` and `from_torch`.

Tiny random models built offline from their configs (tests/oracles_families.py), float64.
Each decoder layer's output is compared twice:
- at 1e-10 with the layer's float32 internals (rotary angles, RMSNorms) run in float64, as
  tests/oracles.py does for Llama: the same computation;
- at 1e-5 with the unmodified layer (HF's float32 angles and norms, eager attention with its
  float32 softmax where the family has one), the tolerance the README states.
Families: Mistral (sliding window on every layer), Llama with Llama 3.1's `llama3` rope
scaling and with YaRN, and alternating sliding/full layers from `layer_types`.
"""

from __future__ import annotations

import numpy as np
import pytest

from mathcheck import require_modules

require_modules("torch", "transformers")

import attntrace  # noqa: E402
import oracles_families as F  # noqa: E402

EXACT, STATED = 1e-10, 1e-5


def _both(model_factory, layer, n, **call):
    """(|trace - layer| with float64 internals, |trace - layer| unmodified) for decoder layer `layer`."""
    out = []
    for exact in (True, False):
        model = model_factory()
        if exact:
            F.float64_rotary(model)
            F.float64_norms(model)
        else:
            F.float64_norms(model)  # the same gains ...
            for m in model.modules():  # ... but HF's own float32 forward
                if type(m).__name__.endswith("RMSNorm"):
                    del m.forward
        x, y = F.layer_io(model, layer, n)
        t = attntrace.from_torch(model, x, layer=layer, **call)
        out.append(float(np.max(np.abs(t.output - y))))
    return out


LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 32.0,
        "beta_slow": 1.0}


@pytest.mark.parametrize("family, overrides, n", [
    ("mistral", {"sliding_window": 3}, 7),
    ("mistral", {"sliding_window": None}, 5),
    ("llama", {"rope_parameters": LLAMA3}, 6),
    ("llama", {"rope_parameters": YARN, "max_position_embeddings": 128}, 6),
    ("llama", {"rope_parameters": {**YARN, "truncate": False, "attention_factor": 1.3}, "max_position_embeddings": 128}, 6),
], ids=["mistral-window", "mistral-full", "llama3-rope", "yarn-rope", "yarn-untruncated"])
@pytest.mark.parametrize("layer", [0, 1])
def test_layer_output_matches(family, overrides, n, layer):
    exact, stated = _both(lambda: F.tiny(family, attn="sdpa", **overrides), layer, n)
    assert exact < EXACT, exact
    print(f"measured {exact:.1e} (float64 internals), {stated:.1e} (unmodified)")
    assert stated < STATED, stated


def test_mistral_attention_has_the_window_and_rope_scaling_shows_its_factors():
    model = F.tiny("mistral", sliding_window=3)
    x, _ = F.layer_io(model, 0, 6)
    t = attntrace.from_torch(model.layers[0].self_attn, x)
    keep = t.step("masked", head=1).details["keep"]
    assert keep.sum(axis=1).tolist() == [1, 2, 3, 3, 3, 3]
    model = F.tiny("llama", rope_parameters=YARN)
    t = attntrace.from_torch(model.layers[0], F.layer_io(model, 0, 4)[0])
    det = t.step("Q_rope", head=1).details
    assert det["scaling"]["type"] == "yarn" and float(det["mu"]) == pytest.approx(0.1 * np.log(4) + 1)
    assert "c_{1}" in attntrace.render(t, format="md")


@pytest.mark.parametrize("types, windows", [
    (["sliding_attention", "full_attention"], [3, None]),
    (["full_attention", "sliding_attention"], [None, 3]),
])
def test_layer_types_pick_each_layers_window(types, windows):
    from attntrace.bridges.huggingface import layer_window

    model = F.tiny("mistral", sliding_window=3, layer_types=types)
    assert [layer_window(m.self_attn) for m in model.layers] == windows


def test_unknown_rope_type_is_refused_in_one_line():
    model = F.tiny("llama", rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(attntrace.Unsupported, match=r"^rope_type 'dynamic' rescales the rotary frequencies") as info:
        attntrace.from_torch(model, np.zeros((2, 16)), layer=0)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------ gpt-oss: sinks, YaRN, alternating windows
@pytest.mark.parametrize("layer", [0, 1], ids=["sliding", "full"])
@pytest.mark.parametrize("exact", [True, False], ids=["float64-angles", "unmodified"])
def test_gpt_oss_attention_matches(layer, exact):
    """gpt-oss's attention (its MoE block is traced by the mixture-of-experts bridge): q/k/v/o
    with biases, YaRN rope (truncate = false, mu), the layer's window from layer_types, sinks.
    The eager attention of gpt-oss takes its softmax in the model's dtype (float64 here), so only
    the rotary angles are float32 in the unmodified model."""
    model = F.tiny("gpt_oss", attn="eager")
    if exact:
        F.float64_rotary(model)
    attn = model.layers[layer].self_attn
    seen = F.module_io(model, attn, 6)
    x = seen["args"][0] if seen["args"] else seen["kwargs"]["hidden_states"]
    want = seen["out"][0][0].numpy()
    t = attntrace.from_torch(attn, x)
    err = float(np.max(np.abs(t.output - want)))
    print(f"gpt-oss layer {layer}: {err:.1e}")
    assert err < (EXACT if exact else STATED), err
    assert t.step("sink", head=1).details["sink"] == pytest.approx(float(attn.sinks[0].detach()))
    keep = t.step("masked", head=1).details["keep"]
    assert keep.sum(axis=1).tolist() == ([1, 2, 3, 3, 3, 3] if layer == 0 else [1, 2, 3, 4, 5, 6])
    weights = np.stack([t.step("weights", head=h).value for h in range(1, 5)])
    np.testing.assert_allclose(weights, seen["out"][1][0].numpy(), rtol=0, atol=EXACT if exact else STATED)


# ------------------------------------------------------------------ Qwen3 (QK-norm) and Gemma 2 (soft-capping, query_pre_attn_scalar)
@pytest.mark.parametrize("layer", [0, 1], ids=["full", "sliding"])
def test_qwen3_layer_matches(layer):
    """Qwen3: the llama layer with RMSNorm of each head's q and k (qk_norm) before RoPE; its
    second layer here slides (use_sliding_window, max_window_layers = 1, layer_types)."""
    exact, stated = _both(lambda: F.tiny("qwen3", attn="sdpa"), layer, 6)
    print(f"qwen3 layer {layer}: {exact:.1e} (float64 internals), {stated:.1e} (unmodified)")
    assert exact < EXACT and stated < STATED, (exact, stated)
    model = F.tiny("qwen3")
    t = attntrace.from_torch(model, F.layer_io(model, layer, 5)[0], layer=layer)
    assert t.has("Q_norm", 1) and t.has("K_norm", 1)
    keep = t.step("masked", head=1).details["keep"]
    assert keep.sum(axis=1).tolist() == ([1, 2, 3, 4, 5] if layer == 0 else [1, 2, 3, 3, 3])


@pytest.mark.parametrize("layer", [0, 1], ids=["sliding", "full"])
@pytest.mark.parametrize("exact", [True, False], ids=["float64-internals", "unmodified"])
def test_gemma2_attention_matches(layer, exact):
    """Gemma 2's attention: scores scaled by query_pre_attn_scalar^-1/2 (sqrt(9) = 3 here, not
    sqrt(head_dim) = 2), soft-capped at 2.5, the layer's own window. Its eager softmax is float32
    even in a float64 model: run in float64 (HF's own function) for the 1e-10 comparison."""
    model = F.tiny("gemma2", attn="eager")
    undo = F.float64_eager_softmax(model) if exact else (lambda: None)
    try:
        if exact:
            F.float64_rotary(model)
        attn = model.layers[layer].self_attn
        seen = F.module_io(model, attn, 6)
    finally:
        undo()
    x = seen["args"][0] if seen["args"] else seen["kwargs"]["hidden_states"]
    t = attntrace.from_torch(attn, x)
    err = float(np.max(np.abs(t.output - seen["out"][0][0].numpy())))
    print(f"gemma2 layer {layer}: {err:.1e}")
    assert err < (EXACT if exact else STATED), err
    assert t.step("scaled", head=1).details["factor"] == 3.0 and t.has("softcap", 1)
    keep = t.step("masked", head=1).details["keep"]
    assert keep.sum(axis=1).tolist() == ([1, 2, 3, 3, 3, 3] if layer == 0 else [1, 2, 3, 4, 5, 6])
    # the whole layer (four norms, GeGLU) is the sandwich block: tests/test_sandwich.py


def test_query_pre_attn_scalar_is_an_exact_scale():
    from attntrace.bridges.huggingface import score_scale

    model = F.tiny("gemma2", query_pre_attn_scalar=256)
    assert score_scale(model.layers[0].self_attn, 4) == "sqrt(256)"
    t = attntrace.run({"Q": [[1, 2]], "K": [[3, 4]], "V": [[1]], "scale": "sqrt(256)"}, mode="exact")
    assert t.step("scaled").value[0, 0] == sp_rational(11, 16)


def sp_rational(a, b):
    import sympy

    return sympy.Rational(a, b)


def test_a_sliding_layers_cache_that_dropped_tokens_is_refused():
    """A sliding layer's cache keeps only the last W - 1 keys (DynamicSlidingWindowLayer); its
    positions no longer follow the kept rows, so it is refused in one line (a cache that still
    holds every earlier token is traced as in tests/test_hf_bridge.py)."""
    import torch
    from transformers import DynamicCache

    model = F.tiny("mistral", attn="sdpa", sliding_window=3)
    n = 6
    x0 = torch.randn(1, n + 1, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(inputs_embeds=x0[:, :n], position_ids=torch.arange(n)[None], cache=cache, use_cache=True)
    assert cache.layers[0].keys.shape[-2] == 2  # W - 1 kept of 6
    with pytest.raises(attntrace.Unsupported, match=r"^this sliding layer's cache keeps the last 2 of its 6 earlier tokens") as info:
        attntrace.from_torch(model.layers[0].self_attn, x0[0, n:], cache=cache)
    assert "\n" not in str(info.value)
