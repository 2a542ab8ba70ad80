"""Whole Transformer layers from PyTorch: `torch.nn.TransformerEncoderLayer` (and the
self-attention block of a `TransformerDecoderLayer` is not imported: it has a second,
cross-attention sublayer that attntrace does not chain).

`encoder_layer_spec(layer, x)` reads the layer's weights (float64, transposed from torch's
(out, in) to attntrace's row-vector (in, out)) into a block spec: its self_attn through
`multihead_spec`, norm1/norm2 (LayerNorm gain, bias, eps), linear1/linear2 and the
activation; `norm_first` picks pre_ln (True) or post_ln (False). `from_torch_layer` traces it.
The trace's last step equals `layer(x)` in eval mode (tests/test_block.py, 1e-10).

One torch quirk: under no_grad in eval mode torch may run a fused kernel that knows only
"relu" and "gelu" and treats any nn.GELU module as exact GELU, so a layer built with
nn.GELU(approximate="tanh") gives exact-GELU outputs there but tanh-GELU outputs with
gradients on. The trace follows the module the layer declares (tanh), as the Python path does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attntrace.bridges.pytorch import _np, _torch, multihead_spec
from attntrace.model.errors import Unsupported


def _activation(layer) -> str:
    torch = _torch()
    act = layer.activation
    F = torch.nn.functional
    if act is F.relu or isinstance(act, torch.nn.ReLU):
        return "relu"
    if act is F.gelu:
        return "gelu"
    if isinstance(act, torch.nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    raise Unsupported(f"activation {getattr(act, '__name__', type(act).__name__)} is not relu or gelu")


def _norm(norm) -> dict[str, Any]:
    torch = _torch()
    if not isinstance(norm, torch.nn.LayerNorm) or len(norm.normalized_shape) != 1:
        raise Unsupported(f"a layer norm over the last dimension is expected, not {norm!r}")
    table: dict[str, Any] = {"eps": float(norm.eps)}
    if norm.weight is not None:
        table["gain"] = _np(norm.weight, "norm weight")[None, :]
    if norm.bias is not None:
        table["bias"] = _np(norm.bias, "norm bias")[None, :]
    return table


def encoder_layer_spec(layer, x, *, src_mask=None, is_causal=False) -> dict:
    """The attntrace block spec equivalent to `layer(x, src_mask=..., is_causal=...)` in eval mode.

    x: (L, E), or a batch of one ((1, L, E) with batch_first, else (L, 1, E))."""
    torch = _torch()
    if not isinstance(layer, torch.nn.TransformerEncoderLayer):
        raise Unsupported(f"from_torch_layer traces torch.nn.TransformerEncoderLayer, not {type(layer).__name__}")
    if layer.training and (layer.dropout.p > 0 or layer.self_attn.dropout > 0):
        raise Unsupported("TransformerEncoderLayer in training mode applies dropout at random; call layer.eval() first")
    spec = multihead_spec(layer.self_attn, x, attn_mask=src_mask, is_causal=is_causal)
    ffn: dict[str, Any] = {"W_1": np.ascontiguousarray(_np(layer.linear1.weight, "linear1.weight").T),
                           "W_2": np.ascontiguousarray(_np(layer.linear2.weight, "linear2.weight").T),
                           "activation": _activation(layer)}
    if layer.linear1.bias is not None:
        ffn["b_1"] = _np(layer.linear1.bias, "linear1.bias")[None, :]
    if layer.linear2.bias is not None:
        ffn["b_2"] = _np(layer.linear2.bias, "linear2.bias")[None, :]
    spec.update(block="pre_ln" if layer.norm_first else "post_ln", ffn=ffn, norm1=_norm(layer.norm1), norm2=_norm(layer.norm2))
    return spec


def from_torch_layer(layer, x, *, src_mask=None, is_causal=False, **run_overrides):
    """Trace `torch.nn.TransformerEncoderLayer` on x (eval mode): attention, residuals, norms, FFN.

    Extra keyword arguments go to `attntrace.run` (title, mode, ...)."""
    from attntrace import run

    return run(encoder_layer_spec(layer, x, src_mask=src_mask, is_causal=is_causal), **run_overrides)


# -- Hugging Face: a whole Llama-style decoder layer -------------------------------------------------
def decoder_layer(obj, layer: int = 0):
    """The decoder layer of `obj`: itself, or `layer` of a LlamaModel / LlamaForCausalLM."""
    from attntrace.model.errors import BadInput

    base = getattr(obj, "model", obj)
    if hasattr(base, "layers"):
        if not 0 <= layer < len(base.layers):
            raise BadInput(f"layer = {layer}, but the model has {len(base.layers)} layers (0 to {len(base.layers) - 1})")
        obj = base.layers[layer]
    need = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
    if not all(hasattr(obj, p) for p in need) or not all(hasattr(obj.mlp, p) for p in ("gate_proj", "up_proj", "down_proj")):
        raise Unsupported(f"{type(obj).__name__} is not a Llama-style decoder layer ({', '.join(need)}; mlp gate/up/down_proj)")
    return obj


def _rms(norm, what: str) -> dict[str, Any]:
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if eps is None or getattr(norm, "bias", None) is not None:
        raise Unsupported(f"{what} is not an RMSNorm with a gain and no bias")
    return {"gain": _np(norm.weight, f"{what}.weight")[None, :], "eps": float(eps)}


def llama_layer_spec(model_or_layer, hidden_states, *, layer: int = 0, position_ids=None, attention_mask=None) -> dict:
    """The attntrace block spec (block = "llama") of a Llama-style decoder layer on its input.

    hidden_states: (n, d_model) or (1, n, d_model), the decoder layer's input (before its
    input RMSNorm). Attention as `attntrace.bridges.huggingface.llama_attention_spec` reads it
    (RoPE in the half layout, grouped-query heads, causal mask), then the two RMSNorms'
    gains and eps and the SwiGLU MLP (gate, up, down; transposed from nn.Linear)."""
    from attntrace.bridges.huggingface import llama_attention_spec

    dec = decoder_layer(model_or_layer, layer)
    act = getattr(dec.mlp.config, "hidden_act", "silu") if hasattr(dec.mlp, "config") else "silu"
    if act != "silu":
        raise Unsupported(f"the MLP's activation is {act!r}; a llama block's SwiGLU uses silu")
    if any(getattr(dec.mlp, p).bias is not None for p in ("gate_proj", "up_proj", "down_proj")):
        raise Unsupported("the MLP has biases (mlp_bias=True); a llama block's SwiGLU has none")
    spec = llama_attention_spec(dec.self_attn, hidden_states, position_ids=position_ids, attention_mask=attention_mask)
    w = lambda lin, what: np.ascontiguousarray(_np(lin.weight, what).T)  # noqa: E731 - (in, out)
    spec.update(block="llama", norm1=_rms(dec.input_layernorm, "input_layernorm"), norm2=_rms(dec.post_attention_layernorm, "post_attention_layernorm"),
                ffn={"W_gate": w(dec.mlp.gate_proj, "gate_proj"), "W_up": w(dec.mlp.up_proj, "up_proj"), "W_down": w(dec.mlp.down_proj, "down_proj")})
    return spec


def from_hf_llama_layer(model_or_layer, hidden_states, *, layer: int = 0, position_ids=None, attention_mask=None, **run_overrides):
    """Trace a whole Llama-style decoder layer of a Hugging Face model (a LlamaDecoderLayer, or a
    LlamaModel / LlamaForCausalLM and `layer`) on its input hidden states: RMSNorm, attention
    with RoPE and grouped-query heads, the residual, RMSNorm, SwiGLU, the residual. The last
    step equals the layer's output (float64 model, SDPA attention; HF's LlamaRMSNorm casts to
    float32 inside, so compare at 1e-6, or at 1e-10 with its forward run in float64)."""
    from attntrace import run

    return run(llama_layer_spec(model_or_layer, hidden_states, layer=layer, position_ids=position_ids,
                                attention_mask=attention_mask), **run_overrides)
