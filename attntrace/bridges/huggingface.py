"""Hugging Face -> attntrace: trace the self-attention of a Llama-style layer.

`from_hf_llama_attention(layer_or_model, hidden_states)` takes a `LlamaAttention` (or a
decoder layer, `LlamaModel` or `LlamaForCausalLM` and a layer index) and the attention
layer's input (the hidden states *after* the layer's input RMSNorm, as the attention module
receives them), and traces what the module computes: q/k/v projections (nn.Linear stores
(out, in): transposed here), RoPE in Hugging Face's rotate_half layout at the given
positions (with Llama 3.1's `llama3` or YaRN's rope scaling when the config names it),
grouped-query attention (`num_key_value_heads`), the causal mask (with a padding mask: HF's
attention_mask, 1 = token, 0 = padding; with the layer's own sliding window, from the config's
`layer_types` and `sliding_window`), softmax scaled by head_dim^-1/2 (or by the module's
`scaling`: Gemma 2's query_pre_attn_scalar^-1/2), gpt-oss's attention sinks (`sinks`, one
logit per head) and o_proj. The same reading serves the
Llama-style families: Llama, Mistral, and (with their extra steps) Qwen3, Gemma 2 and gpt-oss. transformers is needed only to read the module; torch and transformers are
imported only here, and only when called.

Two starts. start="x" traces from the hidden states with the `rope` and `num_kv_heads`
spec keys (every step, RoPE included). start="qkv" exposes the queries and keys *after*
RoPE (and the values), computed with Hugging Face's own `apply_rotary_pos_emb`, and traces
from them (scores onwards). Hugging Face computes the rotary angles in float32 (even in a
float64 model); attntrace's cos and sin are float64, so the two agree to ~1e-7 in the
angles; `rope_float64=False` (llama_qkv, and from_hf_llama_attention with start="qkv") uses
HF's float32-angle values instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attntrace.model.errors import BadInput, Unsupported
from attntrace.model.trace import Trace


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - depends on the environment
        raise Unsupported("PyTorch is not installed: pip install 'attntrace[hf]'") from None
    return torch


def attention_module(obj, layer: int = 0):
    """The Llama-style attention module of `obj` (itself, a decoder layer, a model, a CausalLM)."""
    base = getattr(obj, "model", obj)  # LlamaForCausalLM -> LlamaModel
    if hasattr(base, "layers"):
        layers = base.layers
        if not 0 <= layer < len(layers):
            raise BadInput(f"layer = {layer}, but the model has {len(layers)} layers (0 to {len(layers) - 1})")
        obj = layers[layer]
    obj = getattr(obj, "self_attn", obj)
    if not all(hasattr(obj, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj", "config")):
        raise Unsupported(f"{type(obj).__name__} is not a Llama-style attention layer (q_proj, k_proj, v_proj, o_proj, config)")
    return obj


def _weights(lin, what: str):
    """A linear layer's weight as (in, out) (row vectors times W) and its bias as a row, float64
    arrays of their own, each converted once straight into that layout (`fresh_float64`)."""
    from attntrace.bridges.pytorch import to_numpy, to_numpy_T

    w = to_numpy_T(lin.weight, f"{what}_proj.weight")
    b = None if lin.bias is None else to_numpy(lin.bias, f"{what}_proj.bias")[None, :]
    return w, b


#: Hugging Face rope_type -> the spec's rope.scaling type (attntrace.kinds.ropescaling).
_SCALED_ROPE = {"llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
                "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate",
                         "attention_factor", "mscale", "mscale_all_dim")}


def rope_settings(config) -> tuple[float, dict | None]:
    """The config's rotary base and, for Llama 3.1's `llama3` or `yarn` rope_type, the spec's
    rope.scaling table (Hugging Face's rope_parameters, same names). Other rope types (dynamic,
    longrope, linear) and partial rotation are refused."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    kind = params.get("rope_type", "default")
    if kind not in ("default", *_SCALED_ROPE):
        raise Unsupported(f"rope_type {kind!r} rescales the rotary frequencies in a way attntrace does not trace "
                          "(it traces the default RoPE, llama3 and yarn)")
    if getattr(config, "partial_rotary_factor", 1.0) not in (None, 1.0) or params.get("partial_rotary_factor", 1.0) != 1.0:
        raise Unsupported("partial_rotary_factor < 1 rotates part of each head; attntrace rotates whole heads")
    base = params.get("rope_theta", getattr(config, "rope_theta", None))
    if base is None:
        raise Unsupported("the config names no rope_theta")
    if kind == "default":
        return float(base), None
    scaling = {"type": kind, **{k: params[k] for k in _SCALED_ROPE[kind] if params.get(k) is not None}}
    if kind == "yarn":
        if scaling.get("factor") is None:  # DeepSeek-V3: the ratio of the context lengths
            scaling["factor"] = config.max_position_embeddings / scaling["original_max_position_embeddings"]
        scaling["truncate"] = bool(params.get("truncate", True))
    return float(base), scaling


def layer_window(attn) -> int | None:
    """The sliding window of this attention layer, or None for full attention: the config's
    `layer_types[layer_idx]` ("sliding_attention" or "full_attention": Gemma 2/3, gpt-oss,
    Qwen3, ...) picks between the config's sliding_window and none; without layer_types, the
    config's sliding_window holds for every layer (Mistral)."""
    cfg = attn.config
    types = getattr(cfg, "layer_types", None)
    idx = getattr(attn, "layer_idx", None)
    if types is not None and idx is not None:
        if not 0 <= idx < len(types):
            raise BadInput(f"layer_idx {idx} is outside the config's layer_types ({len(types)} layers)")
        kind = types[idx]
        if kind not in ("sliding_attention", "full_attention"):
            raise Unsupported(f"layer type {kind!r}: attntrace traces sliding_attention and full_attention layers")
        if kind == "full_attention":
            return None
    window = getattr(cfg, "sliding_window", None)
    if types is not None and idx is None:
        window = getattr(attn, "sliding_window", None)
    return None if window is None else int(window)


def score_scale(attn, d: int):
    """The spec's `scale` (what the scores are divided by) for the module's `scaling` (what HF
    multiplies them by): True for head_dim^-1/2; sqrt(query_pre_attn_scalar), exact, for Gemma 2;
    else 1 / scaling."""
    scaling = getattr(attn, "scaling", d ** -0.5)
    if abs(scaling - d ** -0.5) <= 1e-15:
        return True
    qpas = getattr(attn.config, "query_pre_attn_scalar", None)
    if qpas is not None and abs(scaling - qpas ** -0.5) <= 1e-15 * qpas ** -0.5:
        return f"sqrt({int(qpas)})" if float(qpas).is_integer() else float(qpas) ** 0.5
    return 1.0 / float(scaling)


def _hidden(hidden_states, d_model: int) -> np.ndarray:
    torch = _torch()
    a = hidden_states
    if isinstance(a, torch.Tensor):
        from attntrace.bridges.pytorch import fresh_float64

        a = fresh_float64(a)  # one copy, in float64
    else:
        a = np.array(a, dtype=np.float64)
    if a.ndim == 3:
        if a.shape[0] != 1:
            raise Unsupported(f"hidden_states {a.shape} is a batch of {a.shape[0]}; attntrace traces one sequence")
        a = a[0]
    if a.ndim != 2 or a.shape[1] != d_model:
        raise BadInput(f"hidden_states must be (n, {d_model}) or (1, n, {d_model}), not of shape {a.shape}")
    return np.ascontiguousarray(a)


def _positions(position_ids, n: int) -> list[int]:
    if position_ids is None:
        return list(range(n))
    pos = np.asarray(position_ids.detach().cpu().numpy() if hasattr(position_ids, "detach") else position_ids).reshape(-1)
    if pos.shape != (n,):
        raise BadInput(f"position_ids has {pos.size} positions but there are {n} tokens")
    return [int(p) for p in pos]


def key_padding_of(attention_mask, n: int) -> list[bool] | None:
    """HF's 2-D attention_mask (1 = token, 0 = padding) as the spec's key_padding (true = padding)."""
    if attention_mask is None:
        return None
    m = np.asarray(attention_mask.detach().cpu().numpy() if hasattr(attention_mask, "detach") else attention_mask).reshape(-1)
    if m.shape != (n,) or not np.isin(m, (0, 1)).all():
        raise BadInput(f"attention_mask must be {n} entries of 1 (token) or 0 (padding), as a tokenizer gives it")
    return [not bool(x) for x in m] if not m.all() else None


def qk_norm_table(attn) -> dict | None:
    """Qwen3's (and Gemma 3's, OLMo 2's) RMSNorm of each head's q and k rows, as the spec's
    qk_norm: eps and the gains (Gemma's norms scale by 1 + weight)."""
    qn, kn = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    if qn is None or kn is None:
        return None
    out: dict[str, Any] = {}
    for norm, key in ((qn, "g_q"), (kn, "g_k")):
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        w = getattr(norm, "weight", None)
        if eps is None or w is None or getattr(norm, "bias", None) is not None:
            raise Unsupported(f"{type(norm).__name__} is not an RMSNorm with a gain and no bias")
        gain = w.detach().to(device="cpu", dtype=_torch().float64).numpy()  # read into a list below
        if type(norm).__name__.startswith("Gemma"):  # Gemma's RMSNorm: x / rms(x) * (1 + weight)
            gain = 1.0 + gain
        out[key], out["eps"] = gain.tolist(), float(eps)
    return out


def _layout(attn):
    cfg = attn.config
    h = cfg.num_attention_heads
    h_kv = getattr(cfg, "num_key_value_heads", None) or h
    d = getattr(attn, "head_dim", None) or cfg.hidden_size // h
    if attn.training and float(getattr(attn, "attention_dropout", 0.0) or 0.0) > 0:
        raise Unsupported("the layer is in training mode with attention dropout; call model.eval() first")
    return h, h_kv, d


def rope_cos_sin64(config, d: int, pos) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (n, d) in the half layout, float64, by the rotary rule of the config (default,
    llama3 or yarn: attntrace.kinds.ropescaling), YaRN's attention factor folded in as HF does."""
    from attntrace.kinds.ropescaling import attention_factor, frequency_factors

    base, scaling = rope_settings(config)
    inv_freq = 1.0 / (base ** (np.arange(0, d, 2, dtype=np.float64) / d))
    mu = 1.0
    if scaling is not None:
        inv_freq = inv_freq * np.asarray(frequency_factors(scaling, base, d), dtype=np.float64)
        mu = float(attention_factor(scaling))
    emb = np.concatenate([np.outer(pos, inv_freq)] * 2, axis=1)
    return np.cos(emb) * mu, np.sin(emb) * mu


def llama_qkv(layer_or_model, hidden_states, *, position_ids=None, layer: int = 0, rope_float64: bool = True) -> dict[str, Any]:
    """The layer's queries and keys after RoPE, and its values, per head, float64 NumPy.

    Returns q (h, n, d), k and v (h_kv, n, d), positions, num_heads, num_kv_heads, head_dim.
    RoPE through transformers' `apply_rotary_pos_emb` (rotate_half layout), with cos and sin
    by `LlamaRotaryEmbedding`'s formula in float64 (`rope_float64`), or from the layer's
    model's rotary module as HF runs it (float32 angles; pass the model, not the layer)."""
    torch = _torch()
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    attn = attention_module(layer_or_model, layer)
    h, h_kv, d = _layout(attn)
    x = _hidden(hidden_states, attn.q_proj.in_features)
    n = x.shape[0]
    pos = _positions(position_ids, n)
    proj = {}
    for name in ("q", "k", "v"):
        w, b = _weights(getattr(attn, f"{name}_proj"), name)
        a = x @ w + (0 if b is None else b)
        proj[name] = a.reshape(n, -1, d).transpose(1, 0, 2)  # (heads, n, d)
    if rope_float64:
        cos, sin = (torch.from_numpy(a)[None] for a in rope_cos_sin64(attn.config, d, pos))
    else:
        rot = getattr(getattr(layer_or_model, "model", layer_or_model), "rotary_emb", None) or _rotary_module(attn)
        with torch.no_grad():
            cos, sin = rot(torch.zeros(1, dtype=torch.float64), torch.tensor([pos]))
        cos, sin = cos.to(torch.float64), sin.to(torch.float64)
    with torch.no_grad():
        q, k = apply_rotary_pos_emb(torch.from_numpy(proj["q"])[None], torch.from_numpy(proj["k"])[None], cos, sin)
    return {"q": q[0].numpy(), "k": k[0].numpy(), "v": proj["v"], "positions": pos,  # computed here: nothing else holds them
            "num_heads": h, "num_kv_heads": h_kv, "head_dim": d}


def _rotary_module(attn):
    """The rotary module Hugging Face builds for this attention's model (LlamaRotaryEmbedding, or
    its kin in the attention's own modeling module), from the attention's config: its float32
    angles, as the model computes them, for an attention module given alone."""
    import sys

    mod = sys.modules.get(type(attn).__module__)
    cls = next((getattr(mod, n) for n in dir(mod) if n.endswith("RotaryEmbedding")), None) if mod else None
    if cls is None:
        raise Unsupported(f"rope_float64=False: no rotary module found next to {type(attn).__name__}; pass the model")
    return cls(config=attn.config)


def _past(cache, layer: int, h_kv: int, d: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A DynamicCache's (or a (keys, values) pair's) cached keys and values of `layer`, each
    (P, h_kv d): key/value head j in column block j, as the spec's K_past and V_past."""
    if cache is None:
        return None
    torch = _torch()
    if hasattr(cache, "layers"):  # transformers' DynamicCache
        if not cache.layers or all(getattr(c, "keys", None) is None for c in cache.layers):
            return None  # empty (the first decoding step: DynamicCache() or one whose layers hold nothing yet): P = 0
        if not 0 <= layer < len(cache.layers):
            raise BadInput(f"the cache holds {len(cache.layers)} layers, not layer {layer}")
        cache = (cache.layers[layer].keys, cache.layers[layer].values)
        if cache[0] is None or cache[1] is None:
            return None
    if not isinstance(cache, (tuple, list)) or len(cache) != 2:
        raise BadInput("cache must be a DynamicCache or a (keys, values) pair of (h_kv, P, head_dim) arrays")
    out = []
    from attntrace.bridges.pytorch import fresh_float64

    for a, what in zip(cache, ("keys", "values")):
        is_tensor = isinstance(a, torch.Tensor)
        a = a if is_tensor else np.asarray(a, dtype=np.float64)
        if a.ndim == 4 and a.shape[0] == 1:
            a = a[0]
        if a.ndim != 3 or a.shape[0] != h_kv or a.shape[2] != d:
            raise BadInput(f"cached {what} must be ({h_kv}, P, {d}) (one block per key/value head), not {tuple(a.shape)}")
        # (h_kv, P, d) -> (P, h_kv d): a tensor is converted once, straight into that layout
        blocks = fresh_float64(a.permute(1, 0, 2)) if is_tensor else np.ascontiguousarray(a.transpose(1, 0, 2))
        out.append(blocks.reshape(a.shape[1], h_kv * d))
    if out[0].shape[0] != out[1].shape[0]:
        raise BadInput(f"the cache holds {out[0].shape[0]} keys but {out[1].shape[0]} values; one of each per past token")
    return None if out[0].shape[0] == 0 else (out[0], out[1])  # P = 0: no cache


def _seen(cache, layer: int, held: int) -> int:
    """How many tokens came before the new ones: the cache's count, which a sliding layer's
    cache (transformers' DynamicSlidingWindowLayer, only W - 1 keys kept) holds as cumulative_length."""
    layers = getattr(cache, "layers", None)
    if layers and 0 <= layer < len(layers):
        return max(held, int(getattr(layers[layer], "cumulative_length", held) or held))
    return held


def llama_attention_spec(layer_or_model, hidden_states, *, position_ids=None, attention_mask=None, layer: int = 0,
                         start: str = "x", cache=None, rope_float64: bool = True) -> dict:
    """The attntrace spec of the layer's self-attention on `hidden_states` (see the module docstring).

    With `cache` (a DynamicCache after the earlier tokens, or a (keys, values) pair of
    (h_kv, P, head_dim) arrays, keys after RoPE as HF stores them) the hidden states are the
    new tokens': the spec holds K_past and V_past (steps K_cache, V_cache), the new tokens'
    positions default to P, P + 1, ..., and several new tokens get the bottom-right causal mask.
    An empty cache (the first decoding step: a fresh DynamicCache, or arrays with P = 0) is no
    cache: the prompt's causal self-attention from position 0. rope_float64=False (start="qkv"
    only) takes q and k turned with HF's own float32 angles."""
    if start not in ("x", "qkv"):
        raise BadInput(f"start must be \"x\" (from the hidden states, RoPE traced) or \"qkv\" (from q, k after RoPE), not {start!r}")
    if not rope_float64 and start != "qkv":
        raise BadInput("rope_float64=False takes HF's float32 rotary angles, which only start=\"qkv\" can use "
                       "(start=\"x\" traces RoPE itself, in float64)")
    attn = attention_module(layer_or_model, layer)
    h, h_kv, d = _layout(attn)
    x = _hidden(hidden_states, attn.q_proj.in_features)
    n = x.shape[0]
    past = _past(cache, layer, h_kv, d)
    P = 0 if past is None else past[0].shape[0]
    if _seen(cache, layer, P) > P:
        raise Unsupported(f"this sliding layer's cache keeps the last {P} of its {_seen(cache, layer, P)} earlier tokens; attntrace's "
                          "KV cache holds every earlier token: trace the layer on the whole sequence instead")
    pos = _positions(position_ids, n) if position_ids is not None else list(range(P, P + n))
    w_o, b_o = _weights(attn.o_proj, "o")
    spec: dict[str, Any] = {"W_O": w_o}
    if past is None:
        spec["mask"] = "causal"
    else:
        spec.update(K_past=past[0], V_past=past[1])
        if n > 1:
            spec["mask"] = "causal_bottom_right"
    if b_o is not None:
        spec["b_O"] = b_o
    window = layer_window(attn)
    if window is not None:  # HF's sliding window: keys i - W < j <= i, as the spec's window
        spec["window"] = window
    scale = score_scale(attn, d)
    if scale is not True:
        spec["scale"] = scale
    cap = getattr(attn, "attn_logit_softcapping", None)
    if cap is not None:  # Gemma 2: c tanh(T / c) after the scaling, before the mask
        spec["softcap"] = float(cap)
    norms = qk_norm_table(attn)
    if norms is not None:
        if start != "x":
            raise Unsupported("the layer normalises q and k (QK-norm) before RoPE; trace it with start=\"x\"")
        spec["qk_norm"] = norms
    sinks = getattr(attn, "sinks", None)
    if sinks is not None:  # gpt-oss: one learned logit per head in every softmax denominator
        spec["sinks"] = _torch().as_tensor(sinks).detach().to(device="cpu", dtype=_torch().float64).reshape(-1).tolist()
    if start == "x":
        spec["X"] = x
        for name in ("Q", "K", "V"):
            w, b = _weights(getattr(attn, f"{name.lower()}_proj"), name)
            spec[f"W_{name}"] = w
            if b is not None:
                spec[f"b_{name}"] = b
        base, scaling = rope_settings(attn.config)
        spec["rope"] = {"base": base, "layout": "half", "positions": pos}
        if scaling is not None:
            spec["rope"]["scaling"] = scaling
    else:
        r = llama_qkv(attn if rope_float64 else layer_or_model, x, position_ids=pos, layer=layer, rope_float64=rope_float64)
        full = lambda a: np.ascontiguousarray(a.transpose(1, 0, 2).reshape(n, -1))  # noqa: E731 - (H, n, d) -> (n, H d)
        spec.update(Q=full(r["q"]), K=full(r["k"]), V=full(r["v"]))
    if h > 1:
        spec["num_heads"] = h
    if h_kv != h:
        spec["num_kv_heads"] = h_kv
    pad = key_padding_of(attention_mask, P + n)
    if pad is not None:
        spec["key_padding"] = pad
    return spec


def from_hf_llama_attention(layer_or_model, hidden_states, *, position_ids=None, attention_mask=None, layer: int = 0,
                            start: str = "x", cache=None, rope_float64: bool = True, **run_overrides) -> Trace:
    """Trace the self-attention of a Llama-style layer of a Hugging Face model.

    layer_or_model: a LlamaAttention, a decoder layer, a LlamaModel or LlamaForCausalLM
    (then `layer` picks the layer). hidden_states: (n, d_model) or (1, n, d_model), the
    attention module's input (after the input RMSNorm). position_ids: n positions (default
    0..n-1). attention_mask: HF's 1 = token, 0 = padding (becomes key_padding, true =
    padding). start: "x" (projections and RoPE traced) or "qkv" (from q and k after RoPE).
    cache: a DynamicCache (or (keys, values) arrays) of the earlier tokens: one decoding step,
    hidden_states then being the new token's, traced with the KV-cache steps.
    rope_float64: True (default) turns q and k with float64 angles; False (with start="qkv")
    with HF's own float32 angles (the model's rotary_emb, or one built from the layer's config).

    What agrees at what tolerance (float64 model, transformers 5.24; tests/test_hf_bridge.py):
    - at 1e-10: the weights and `trace.output` against the layer run with SDPA attention and
      its rotary module computing the angles in float64 (HF computes them in float32 even in a
      float64 model), which is the same computation;
    - at 1e-7 in the weights and 1e-6 in `trace.output` against the unmodified layer: HF's
      eager attention takes its softmax in float32 and its rotary angles are float32 (measured
      on the tiny test models: 2.9e-8 to 6.7e-8 in the weights, 5e-8 to 1.8e-7 in the output).
    Extra keyword arguments go to `attntrace.run` (title, mode, ...).
    """
    from attntrace.tracer import trace_spec

    spec = llama_attention_spec(layer_or_model, hidden_states, position_ids=position_ids, attention_mask=attention_mask,
                                layer=layer, start=start, cache=cache, rope_float64=rope_float64)
    return trace_spec(spec, **{"copy": False, **run_overrides})  # every array is the bridge's own: not copied again
