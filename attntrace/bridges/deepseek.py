"""Hugging Face DeepSeek-V3 (and V2-style) attention -> attntrace's multi-head latent attention.

`mla_attention_spec(attn, hidden_states)` reads a `DeepseekV3Attention` (nn.Linear stores
(out, in): transposed here) into the spec key `mla` (attntrace.inputs.mlaspec):

- q_a_proj -> W_DQ, q_a_layernorm -> q_norm, q_b_proj -> W_UQ and W_QR: HF's q_b_proj gives
  each head [q_nope (d_nope) | q_rot (d_rope)] in turn, so its columns are regrouped into the
  heads' nope blocks (W_UQ) and rope blocks (W_QR). Without a query LoRA (q_lora_rank None)
  q_proj is split the same way and the queries project X.
- kv_a_proj_with_mqa -> [W_DKV | W_KR] (the latent, then the shared RoPE key), kv_a_layernorm
  -> kv_norm, kv_b_proj -> per head [k_nope | value] regrouped into W_UK and W_UV.
- RoPE: `rope_interleave` (DeepSeek's default) rotates adjacent pairs, the interleaved layout;
  HF then stores the rotated pairs de-interleaved, one fixed permutation of q's and k's columns
  alike, which leaves every score unchanged. Otherwise the half layout (rotate_half).
- scaling qk_head_dim^-1/2 = 1/sqrt(d_nope + d_rope); with YaRN (DeepSeek-V3's rope_parameters)
  the rotated parts turn by YaRN's per-pair factors times its attention factor, and with
  mscale_all_dim the scores are scaled by qk_head_dim^-1/2 mscale^2 (`score_scale`), as HF's
  yarn_apply_mscale does.

`deepseek_layer_spec` adds the decoder layer around it (block = "llama": input_layernorm,
post_attention_layernorm, a dense SwiGLU MLP or, from first_k_dense_replace on, the mixture of
experts: attntrace.bridges.moe).

What agrees at what tolerance (float64 model, transformers 5.24, tests/test_mla.py): at 1e-10
the attention output (and the dense layer's output) when HF's RMSNorm forwards and rotary
angles run in float64, as tests/oracles_block.py does for Llama; unmodified, HF computes its
RMSNorms and rotary angles in float32: agreement at 1e-6.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attntrace.bridges.pytorch import require_torch, to_numpy, to_numpy_T
from attntrace.model.errors import BadInput, Unsupported


def is_mla(module) -> bool:
    return all(hasattr(module, a) for a in ("kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "config"))


def mla_module(obj, layer: int = 0):
    """The latent attention of `obj`: itself, a decoder layer, a model (with `layer`)."""
    base = getattr(obj, "model", obj)
    if hasattr(base, "layers"):
        if not 0 <= layer < len(base.layers):
            raise BadInput(f"layer = {layer}, but the model has {len(base.layers)} layers (0 to {len(base.layers) - 1})")
        obj = base.layers[layer]
    obj = getattr(obj, "self_attn", obj)
    if not is_mla(obj):
        raise Unsupported(f"{type(obj).__name__} is not a DeepSeek latent attention layer (kv_a_proj_with_mqa, kv_b_proj, o_proj)")
    return obj


def _w(lin, what: str) -> np.ndarray:
    return to_numpy_T(lin.weight, what)


def _heads(w: np.ndarray, h: int, widths: tuple[int, ...]) -> list[np.ndarray]:
    """Columns grouped per head as [part 1 | part 2 | ...] -> one matrix per part, heads in order."""
    per = sum(widths)
    if w.shape[1] != h * per:
        raise Unsupported(f"a projection of {w.shape[1]} columns does not split into {h} heads of {per}")
    blocks = w.reshape(w.shape[0], h, per)
    out, start = [], 0
    for width in widths:
        out.append(np.ascontiguousarray(blocks[:, :, start:start + width].reshape(w.shape[0], h * width)))
        start += width
    return out


def _rms_table(norm, what: str) -> dict[str, Any]:
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if eps is None:
        raise Unsupported(f"{what} is not an RMSNorm")
    return {"gain": to_numpy(norm.weight, f"{what}.weight").tolist(), "eps": float(eps)}


def _hidden(hidden_states, d_model: int) -> np.ndarray:
    """The attention's or layer's input as (n, d_model) float64 (a batch of one is unwrapped)."""
    a = to_numpy(hidden_states, "hidden_states")
    a = a[0] if a.ndim == 3 and a.shape[0] == 1 else a
    if a.ndim != 2 or a.shape[1] != d_model:
        raise BadInput(f"hidden_states must be (n, {d_model}) or (1, n, {d_model}), not of shape {a.shape}")
    return np.ascontiguousarray(a)


def _positions(position_ids, n: int) -> list[int]:
    if position_ids is None:
        return list(range(n))
    pos = to_numpy(position_ids, "position_ids").reshape(-1)
    if pos.shape != (n,):
        raise BadInput(f"position_ids has {pos.size} positions but there are {n} tokens")
    return [int(p) for p in pos]


def _rope(cfg, positions) -> dict[str, Any]:
    """The spec's rope: the base, DeepSeek's layout, and YaRN's scaling (`rope_settings`: the
    per-pair factors and the attention factor g(s, mscale) / g(s, mscale_all_dim) of the rotated
    parts); llama3 is refused (DeepSeek uses YaRN)."""
    from attntrace.bridges.huggingface import rope_settings

    base, scaling = rope_settings(cfg)
    if scaling is not None and scaling["type"] != "yarn":
        raise Unsupported(f"rope_type {scaling['type']!r} on latent attention: attntrace traces its default RoPE and YaRN")
    out = {"base": float(base), "layout": "interleaved" if getattr(cfg, "rope_interleave", True) else "half", "positions": list(positions)}
    if scaling is not None:
        out["scaling"] = scaling
    return out


def score_scale(cfg, width: int) -> str | None:
    """The divisor of the scores, written exactly: None for sqrt(d_nope + d_rope); with YaRN and
    mscale_all_dim (DeepSeek-V3), softmax_scale = width^-1/2 mscale^2, mscale = 0.1 mscale_all_dim
    ln(factor) + 1 (YaRN's temperature sqrt(1/t) on the whole head, not only the rotated part),
    so the divisor is sqrt(width) / mscale^2."""
    params = getattr(cfg, "rope_parameters", None) or {}
    if params.get("rope_type", "default") == "default" or not params.get("mscale_all_dim"):
        return None
    factor = params.get("factor") or cfg.max_position_embeddings / params["original_max_position_embeddings"]
    if factor <= 1:
        return None
    return f"sqrt({width})/({params['mscale_all_dim']!r}/10*log({factor!r}) + 1)^2"


def mla_attention_spec(layer_or_model, hidden_states, *, layer: int = 0, position_ids=None, attention_mask=None) -> dict:
    """The spec of the latent attention on `hidden_states` (the attention's input, after the
    layer's input RMSNorm): causal self-attention from position 0 (or position_ids)."""
    from attntrace.bridges.huggingface import key_padding_of

    attn = mla_module(layer_or_model, layer)
    cfg = attn.config
    if attn.training and float(getattr(attn, "attention_dropout", 0.0) or 0.0) > 0:
        raise Unsupported("the layer is in training mode with attention dropout; call model.eval() first")
    h = cfg.num_attention_heads
    d_nope, d_rope, d_v, d_c = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    scale = score_scale(cfg, d_nope + d_rope)
    if scale is None and abs(attn.scaling - (d_nope + d_rope) ** -0.5) > 1e-15:
        raise Unsupported(f"the layer scales the scores by {attn.scaling}, not (d_nope + d_rope)^-1/2")
    x = _hidden(hidden_states, cfg.hidden_size)
    n = x.shape[0]
    mla: dict[str, Any] = {}
    if attn.q_lora_rank is not None:
        mla["W_DQ"] = _w(attn.q_a_proj, "q_a_proj")
        mla["q_norm"] = _rms_table(attn.q_a_layernorm, "q_a_layernorm")
        q_b = _w(attn.q_b_proj, "q_b_proj")
    else:
        q_b = _w(attn.q_proj, "q_proj")
    mla["W_UQ"], mla["W_QR"] = _heads(q_b, h, (d_nope, d_rope))
    kv_a = _w(attn.kv_a_proj_with_mqa, "kv_a_proj_with_mqa")
    mla["W_DKV"], mla["W_KR"] = np.ascontiguousarray(kv_a[:, :d_c]), np.ascontiguousarray(kv_a[:, d_c:])
    mla["kv_norm"] = _rms_table(attn.kv_a_layernorm, "kv_a_layernorm")
    mla["W_UK"], mla["W_UV"] = _heads(_w(attn.kv_b_proj, "kv_b_proj"), h, (d_nope, d_v))
    for lin, what in ((getattr(attn, "q_a_proj", None), "q_a_proj"), (attn.kv_a_proj_with_mqa, "kv_a_proj_with_mqa"),
                      (attn.o_proj, "o_proj")):
        if lin is not None and lin.bias is not None:
            raise Unsupported(f"{what} has a bias (attention_bias=True); attntrace's latent attention has none")
    spec: dict[str, Any] = {"X": x, "W_O": _w(attn.o_proj, "o_proj"), "mla": mla, "mask": "causal",
                            "rope": _rope(cfg, _positions(position_ids, n))}
    if h > 1:
        spec["num_heads"] = h
    if scale is not None:
        spec["scale"] = scale
    pad = key_padding_of(attention_mask, n)
    if pad is not None:
        spec["key_padding"] = pad
    return spec


def deepseek_layer_spec(model_or_layer, hidden_states, *, layer: int = 0, position_ids=None, attention_mask=None) -> dict:
    """A DeepseekV3DecoderLayer with a dense MLP (the first `first_k_dense_replace` layers) as a
    llama block whose attention is latent attention. hidden_states: the layer's input."""
    base = getattr(model_or_layer, "model", model_or_layer)
    dec = base.layers[layer] if hasattr(base, "layers") else model_or_layer
    if hasattr(base, "layers") and not 0 <= layer < len(base.layers):
        raise BadInput(f"layer = {layer}, but the model has {len(base.layers)} layers (0 to {len(base.layers) - 1})")
    from attntrace.bridges.moe import is_moe, moe_table

    mlp = dec.mlp
    if not is_moe(mlp) and not all(hasattr(mlp, p) for p in ("gate_proj", "up_proj", "down_proj")):
        raise Unsupported(f"layer {layer}'s MLP is a {type(mlp).__name__}, neither a SwiGLU MLP nor a mixture of experts")
    norm1 = _rms_table(dec.input_layernorm, "input_layernorm")
    torch = require_torch()
    x = to_numpy(hidden_states, "hidden_states") if isinstance(hidden_states, torch.Tensor) else np.asarray(hidden_states, dtype=np.float64)
    x = x[0] if x.ndim == 3 and x.shape[0] == 1 else x
    # the attention's own reading needs its input only for the shapes: the block starts from X
    spec = mla_attention_spec(dec.self_attn, x, position_ids=position_ids, attention_mask=attention_mask)
    spec.update(block="llama", norm1=norm1, norm2=_rms_table(dec.post_attention_layernorm, "post_attention_layernorm"))
    if is_moe(mlp):  # layers from first_k_dense_replace on: a mixture of experts (attntrace.bridges.moe)
        spec["moe"] = moe_table(mlp)
    else:
        spec["ffn"] = {"W_gate": _w(mlp.gate_proj, "gate_proj"), "W_up": _w(mlp.up_proj, "up_proj"), "W_down": _w(mlp.down_proj, "down_proj")}
    return spec


def from_hf_mla_attention(layer_or_model, hidden_states, *, layer: int = 0, position_ids=None, attention_mask=None, **run_overrides):
    """Trace a DeepSeek latent attention module (or the attention of `layer` of a model) on the
    attention's input. Extra keyword arguments go to `attntrace.run`."""
    from attntrace.tracer import trace_spec

    return trace_spec(mla_attention_spec(layer_or_model, hidden_states, layer=layer, position_ids=position_ids,
                                         attention_mask=attention_mask), **{"copy": False, **run_overrides})  # fresh arrays
