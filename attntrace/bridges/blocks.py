"""Whole Transformer layers as block specs: `torch.nn.TransformerEncoderLayer`, and a layer of
a Hugging Face BERT, GPT-2 or Llama-style model (`from_hf_layer`). Of a `TransformerDecoderLayer`
only the self-attention sublayer is traced (attntrace.bridges.decoder, block_part = "self_attention"):
its second, cross-attention sublayer is not a kind of the block.

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

from attntrace.bridges.pytorch import to_numpy, to_numpy_T, require_torch, multihead_spec
from attntrace.model.errors import Unsupported


def _activation(layer) -> str:
    torch = require_torch()
    act = layer.activation
    F = torch.nn.functional
    if act is F.relu or isinstance(act, torch.nn.ReLU):
        return "relu"
    if act is F.gelu:
        return "gelu"
    if isinstance(act, torch.nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    raise Unsupported(f"activation {getattr(act, '__name__', type(act).__name__)} is not relu or gelu")


def layer_norm_table(norm) -> dict[str, Any]:
    torch = require_torch()
    if not isinstance(norm, torch.nn.LayerNorm) or len(norm.normalized_shape) != 1:
        raise Unsupported(f"a layer norm over the last dimension is expected, not {norm!r}")
    table: dict[str, Any] = {"eps": float(norm.eps)}
    if norm.weight is not None:
        table["gain"] = to_numpy(norm.weight, "norm weight")[None, :]
    if norm.bias is not None:
        table["bias"] = to_numpy(norm.bias, "norm bias")[None, :]
    return table


def encoder_layer_spec(layer, x, *, src_mask=None, src_key_padding_mask=None, is_causal=False) -> dict:
    """The attntrace block spec equivalent to `layer(x, src_mask=..., src_key_padding_mask=...,
    is_causal=...)` in eval mode.

    x: (L, E), or a batch of one ((1, L, E) with batch_first, else (L, 1, E)).
    src_key_padding_mask: (L,) or (1, L), True = padding (torch's polarity): those keys are
    ignored by every query (the spec's key_padding); the padded rows are still computed, as torch does."""
    torch = require_torch()
    if not isinstance(layer, torch.nn.TransformerEncoderLayer):
        raise Unsupported(f"from_torch_layer traces torch.nn.TransformerEncoderLayer, not {type(layer).__name__}")
    if layer.training and (layer.dropout.p > 0 or layer.self_attn.dropout > 0):
        raise Unsupported("TransformerEncoderLayer in training mode applies dropout at random; call layer.eval() first")
    spec = multihead_spec(layer.self_attn, x, attn_mask=src_mask, is_causal=is_causal, key_padding_mask=src_key_padding_mask)
    ffn: dict[str, Any] = {"W_1": to_numpy_T(layer.linear1.weight, "linear1.weight"),
                           "W_2": to_numpy_T(layer.linear2.weight, "linear2.weight"),
                           "activation": _activation(layer)}
    if layer.linear1.bias is not None:
        ffn["b_1"] = to_numpy(layer.linear1.bias, "linear1.bias")[None, :]
    if layer.linear2.bias is not None:
        ffn["b_2"] = to_numpy(layer.linear2.bias, "linear2.bias")[None, :]
    spec.update(block="pre_ln" if layer.norm_first else "post_ln", ffn=ffn, norm1=layer_norm_table(layer.norm1), norm2=layer_norm_table(layer.norm2))
    return spec


def from_torch_layer(layer, x, *, src_mask=None, src_key_padding_mask=None, is_causal=False, **run_overrides):
    """Trace `torch.nn.TransformerEncoderLayer` on x (eval mode): attention, residuals, norms, FFN.

    src_mask, src_key_padding_mask and is_causal as the layer takes them (bool True = masked).
    `trace.output` equals `layer(x, ...)` at 1e-10 in float64 (tests/test_from_torch_api.py).
    Extra keyword arguments go to `attntrace.run` (title, mode, ...)."""
    from attntrace.tracer import trace_spec

    return trace_spec(encoder_layer_spec(layer, x, src_mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                                  is_causal=is_causal), **{"copy": False, **run_overrides})  # fresh arrays (to_numpy)


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
    """An RMSNorm's table: gain and eps, and `gain_offset = 1` when it multiplies by 1 + weight
    (Gemma's), which a probe on one row tells apart from Llama's weight alone."""
    torch = require_torch()
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if eps is None or getattr(norm, "bias", None) is not None:
        raise Unsupported(f"{what} is not an RMSNorm with a gain and no bias")
    w = to_numpy(norm.weight, f"{what}.weight")
    row = np.linspace(-1.0, 2.0, w.shape[0])
    with torch.no_grad():
        got = norm(torch.tensor(row[None, :], dtype=norm.weight.dtype)).double().numpy()[0]
    unit = row / np.sqrt(np.mean(row * row) + float(eps))
    table: dict[str, Any] = {"gain": w[None, :], "eps": float(eps)}
    if np.allclose(got, unit * (1.0 + w), rtol=1e-5, atol=1e-6) and not np.allclose(got, unit * w, rtol=1e-5, atol=1e-6):
        table["gain_offset"] = 1
    elif not np.allclose(got, unit * w, rtol=1e-5, atol=1e-6):
        raise Unsupported(f"{what} ({type(norm).__name__}) is not x / rms(x) times its weight or times 1 + its weight")
    return table


def _gate_activation(mlp) -> str:
    """A gated MLP's activation as the spec's ffn.activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)."""
    fn = getattr(mlp, "act_fn", None)
    name = type(fn).__name__
    if name in ("SiLUActivation", "SiLU") or fn is require_torch().nn.functional.silu:
        return "silu"
    if name in ("GELUTanh", "PytorchGELUTanh", "NewGELUActivation") or getattr(fn, "approximate", None) == "tanh":
        return "gelu_tanh"
    raise Unsupported(f"the MLP's activation is {name}; a gated MLP here is SwiGLU (silu) or GeGLU (tanh GELU)")


def _rope_float64_only(rope_float64: bool) -> None:
    if not rope_float64:
        raise Unsupported("rope_float64=False: a traced layer turns q and k with RoPE itself, in float64; HF's float32 angles "
                          "are taken by from_hf_llama_attention(..., start=\"qkv\", rope_float64=False)")


def llama_layer_spec(model_or_layer, hidden_states, *, layer: int = 0, position_ids=None, attention_mask=None) -> dict:
    """The attntrace block spec (block = "llama") of a Llama-style decoder layer on its input.

    hidden_states: (n, d_model) or (1, n, d_model), the decoder layer's input (before its
    input RMSNorm). Attention as `attntrace.bridges.huggingface.llama_attention_spec` reads it
    (RoPE in the half layout, grouped-query heads, causal mask), then the two RMSNorms'
    gains and eps and the SwiGLU MLP (gate, up, down; transposed from nn.Linear)."""
    from attntrace.bridges.huggingface import llama_attention_spec

    from attntrace.bridges.moe import is_moe, moe_table

    obj = getattr(model_or_layer, "model", model_or_layer)
    obj = obj.layers[layer] if hasattr(obj, "layers") and 0 <= layer < len(obj.layers) else model_or_layer
    if is_moe(getattr(obj, "mlp", None)):  # Mixtral: a mixture of experts in place of the MLP
        spec = llama_attention_spec(obj.self_attn, hidden_states, position_ids=position_ids, attention_mask=attention_mask)
        spec.update(block="llama", norm1=_rms(obj.input_layernorm, "input_layernorm"),
                    norm2=_rms(obj.post_attention_layernorm, "post_attention_layernorm"), moe=moe_table(obj.mlp))
        return spec
    dec = decoder_layer(model_or_layer, layer)
    act = _gate_activation(dec.mlp)
    if any(getattr(dec.mlp, p).bias is not None for p in ("gate_proj", "up_proj", "down_proj")):
        raise Unsupported("the MLP has biases (mlp_bias=True); a gated MLP here has none")
    spec = llama_attention_spec(dec.self_attn, hidden_states, position_ids=position_ids, attention_mask=attention_mask)
    w = lambda lin, what: to_numpy_T(lin.weight, what)  # noqa: E731 - (in, out)
    ffn = {"W_gate": w(dec.mlp.gate_proj, "gate_proj"), "W_up": w(dec.mlp.up_proj, "up_proj"), "W_down": w(dec.mlp.down_proj, "down_proj")}
    if act != "silu":
        ffn["activation"] = act
    if hasattr(dec, "pre_feedforward_layernorm"):  # Gemma 2's four norms: the sandwich block (attntrace.kinds.sandwich)
        spec.update(block="sandwich", norm1=_rms(dec.input_layernorm, "input_layernorm"),
                    norm3=_rms(dec.post_attention_layernorm, "post_attention_layernorm"),
                    norm2=_rms(dec.pre_feedforward_layernorm, "pre_feedforward_layernorm"),
                    norm4=_rms(dec.post_feedforward_layernorm, "post_feedforward_layernorm"), ffn=ffn)
        return spec
    spec.update(block="llama", norm1=_rms(dec.input_layernorm, "input_layernorm"), norm2=_rms(dec.post_attention_layernorm, "post_attention_layernorm"),
                ffn=ffn)
    return spec


def from_hf_llama_layer(model_or_layer, hidden_states, *, layer: int = 0, position_ids=None, attention_mask=None,
                        rope_float64: bool = True, **run_overrides):
    """Trace a whole Llama-style decoder layer of a Hugging Face model (a LlamaDecoderLayer, or a
    LlamaModel / LlamaForCausalLM and `layer`) on its input hidden states: RMSNorm, attention
    with RoPE and grouped-query heads, the residual, RMSNorm, SwiGLU, the residual. The last
    step, `trace.output`, equals the layer's output (float64 model, SDPA attention) at 1e-10 when
    HF's LlamaRMSNorm runs its forward in float64; the unmodified norm casts to float32 inside,
    and then they agree at 1e-6 (measured 8e-8 to 1.7e-7 on the tiny test models)."""
    from attntrace.tracer import trace_spec

    _rope_float64_only(rope_float64)
    return trace_spec(llama_layer_spec(model_or_layer, hidden_states, layer=layer, position_ids=position_ids,
                                attention_mask=attention_mask), **{"copy": False, **run_overrides})  # fresh arrays (to_numpy)


# -- Hugging Face: BERT and GPT-2 layers ------------------------------------------------------------
def _hf_seq(hidden_states, d_model: int) -> np.ndarray:
    x = to_numpy(hidden_states, "hidden_states")
    if x.ndim == 3 and x.shape[0] == 1:
        x = x[0]
    if x.ndim != 2 or x.shape[1] != d_model:
        from attntrace.model.errors import BadInput

        raise BadInput(f"hidden_states must be (n, {d_model}) or (1, n, {d_model}), not {tuple(x.shape)}")
    return x


def _act_name(fn) -> str:
    """Hugging Face's activation modules: GELUActivation (exact), NewGELUActivation / gelu_new
    and GELUTanh (tanh form), ReLU."""
    name = type(fn).__name__
    if name == "GELUActivation" or fn is require_torch().nn.functional.gelu:
        return "gelu"
    if name in ("NewGELUActivation", "GELUTanh", "PytorchGELUTanh") or getattr(fn, "approximate", None) == "tanh":
        return "gelu_tanh"
    if name == "ReLU" or fn is require_torch().relu:
        return "relu"
    raise Unsupported(f"activation {name} is not relu, gelu or a tanh GELU")


def _hf_padding(attention_mask, hidden_states) -> dict:
    """HF's 2-D attention_mask (1 = token, 0 = padding) as the spec's key_padding, or nothing."""
    if attention_mask is None:
        return {}
    from attntrace.bridges.huggingface import key_padding_of

    pad = key_padding_of(attention_mask, int(np.shape(hidden_states)[-2]))
    return {} if pad is None else {"key_padding": pad}


def _no_positions(position_ids, what: str, rope_float64: bool = True) -> None:
    if not rope_float64:
        from attntrace.model.errors import BadInput

        raise BadInput(f"a {what} has no rotary embedding: rope_float64 has no meaning for it")
    if position_ids is not None:
        from attntrace.model.errors import BadInput

        raise BadInput(f"a {what} takes no position_ids: its absolute positions are added to the embeddings before the first layer")


def bert_layer_spec(model_or_layer, hidden_states, *, layer: int = 0, attention_mask=None) -> dict:
    """A BertLayer (or `layer` of a BertModel / its `encoder`) on its input hidden states, as a
    post_ln block spec: self-attention with biases, output dense + LayerNorm(+ input), the
    intermediate dense + activation, the output dense + LayerNorm(+ attention output).
    Every token attends to every token, but with `attention_mask` (HF's 1 = token, 0 = padding)
    no token attends to a padding key (the spec's key_padding), as BERT's extended mask does."""
    obj = getattr(model_or_layer, "encoder", model_or_layer)
    if hasattr(obj, "layer"):
        from attntrace.model.errors import BadInput

        if not 0 <= layer < len(obj.layer):
            raise BadInput(f"layer = {layer}, but the model has {len(obj.layer)} layers (0 to {len(obj.layer) - 1})")
        obj = obj.layer[layer]
    if not all(hasattr(obj, p) for p in ("attention", "intermediate", "output")):
        raise Unsupported(f"{type(obj).__name__} is not a BERT layer (attention, intermediate, output)")
    sa, so = obj.attention.self, obj.attention.output
    d = sa.query.in_features
    w = lambda lin, what: to_numpy_T(lin.weight, what)  # noqa: E731 - (in, out)
    b = lambda lin, what: to_numpy(lin.bias, what)[None, :]  # noqa: E731
    spec: dict[str, Any] = {"X": _hf_seq(hidden_states, d), "block": "post_ln", **_hf_padding(attention_mask, hidden_states)}
    for name, lin in (("Q", sa.query), ("K", sa.key), ("V", sa.value)):
        spec[f"W_{name}"], spec[f"b_{name}"] = w(lin, name), b(lin, name)
    spec["W_O"], spec["b_O"] = w(so.dense, "attention.output.dense"), b(so.dense, "attention.output.dense")
    if sa.num_attention_heads > 1:
        spec["num_heads"] = sa.num_attention_heads
    spec["norm1"], spec["norm2"] = layer_norm_table(so.LayerNorm), layer_norm_table(obj.output.LayerNorm)
    spec["ffn"] = {"W_1": w(obj.intermediate.dense, "intermediate.dense"), "b_1": b(obj.intermediate.dense, "intermediate.dense"),
                   "W_2": w(obj.output.dense, "output.dense"), "b_2": b(obj.output.dense, "output.dense"),
                   "activation": _act_name(obj.intermediate.intermediate_act_fn)}
    return spec


def gpt2_block_spec(model_or_block, hidden_states, *, layer: int = 0, attention_mask=None) -> dict:
    """A GPT2Block (or block `layer` of a GPT2Model) on its input hidden states, as a pre_ln
    block spec: ln_1, causal self-attention (c_attn split into Q, K, V; Conv1D weights are
    already (in, out)), c_proj, the residual, ln_2, the MLP (c_fc, gelu_new = tanh GELU,
    c_proj), the residual. The model's final ln_f is not part of a block. attention_mask (1 =
    token, 0 = padding) adds key padding to the causal mask; a query row that then keeps no key
    (left padding's first rows) has no softmax and is refused."""
    obj = model_or_block
    base = getattr(obj, "transformer", obj)
    if hasattr(base, "h"):
        from attntrace.model.errors import BadInput

        if not 0 <= layer < len(base.h):
            raise BadInput(f"layer = {layer}, but the model has {len(base.h)} blocks (0 to {len(base.h) - 1})")
        obj = base.h[layer]
    if not all(hasattr(obj, p) for p in ("ln_1", "attn", "ln_2", "mlp")):
        raise Unsupported(f"{type(obj).__name__} is not a GPT-2 block (ln_1, attn, ln_2, mlp)")
    attn = obj.attn
    if getattr(attn, "scale_attn_by_inverse_layer_idx", False) or getattr(attn, "reorder_and_upcast_attn", False) or not getattr(attn, "scale_attn_weights", True):
        raise Unsupported("GPT-2 attention with scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn or without scale_attn_weights is not supported")
    d = attn.c_attn.weight.shape[0]
    spec: dict[str, Any] = {"X": _hf_seq(hidden_states, d), "block": "pre_ln", "mask": "causal", **_hf_padding(attention_mask, hidden_states)}
    for k, name in enumerate("QKV"):
        cols = slice(k * d, (k + 1) * d)  # Conv1D's weight is (in, out) already: each slice converted once
        spec[f"W_{name}"] = to_numpy(attn.c_attn.weight[:, cols], "c_attn.weight")
        spec[f"b_{name}"] = to_numpy(attn.c_attn.bias[cols], "c_attn.bias")[None, :]
    spec["W_O"], spec["b_O"] = to_numpy(attn.c_proj.weight, "c_proj.weight"), to_numpy(attn.c_proj.bias, "c_proj.bias")[None, :]
    if attn.num_heads > 1:
        spec["num_heads"] = attn.num_heads
    spec["norm1"], spec["norm2"] = layer_norm_table(obj.ln_1), layer_norm_table(obj.ln_2)
    mlp = obj.mlp
    spec["ffn"] = {"W_1": to_numpy(mlp.c_fc.weight, "c_fc.weight"), "b_1": to_numpy(mlp.c_fc.bias, "c_fc.bias")[None, :],
                   "W_2": to_numpy(mlp.c_proj.weight, "mlp.c_proj.weight"), "b_2": to_numpy(mlp.c_proj.bias, "mlp.c_proj.bias")[None, :],
                   "activation": _act_name(mlp.act)}
    return spec


def from_hf_layer(model_or_layer, hidden_states, *, layer: int = 0, attention_mask=None, position_ids=None, rope_float64: bool = True,
                  **run_overrides):
    """Trace one layer of a Hugging Face BERT, GPT-2 or Llama-style model (Llama, Mistral, Qwen3,
    Mixtral, gpt-oss; Gemma 2 as the sandwich block; DeepSeek-V3 with latent attention) on its input
    hidden states (eval mode): the model picks the spec (bert_layer_spec, gpt2_block_spec,
    llama_layer_spec, deepseek_layer_spec). attention_mask: HF's 1 = token, 0 = padding (padding keys are ignored);
    position_ids: the Llama-style layer's RoPE positions (BERT and GPT-2 layers take none).
    Agreement with the layer in float64: BERT and GPT-2 at 1e-10; a Llama-style layer at 1e-10
    when its RMSNorms and rotary angles run in float64 (tests/oracles_block.py), else at 1e-6
    (HF's float32 RMSNorm and angles; see from_hf_llama_layer; Gemma 2 and gpt-oss at 1e-5 as
    they are, tests/test_sandwich.py, tests/test_moe_gpt_oss.py). rope_float64=False is refused
    here (the layer's RoPE is traced in float64). Extra keyword arguments go to `attntrace.run`."""
    from attntrace.bridges.deepseek import deepseek_layer_spec, is_mla
    from attntrace.tracer import trace_spec

    obj = model_or_layer
    base = next((getattr(obj, a) for a in ("encoder", "transformer", "model") if hasattr(obj, a)), obj)
    stack = next((getattr(base, a) for a in ("layer", "h", "layers") if hasattr(base, a)), None)
    probe = stack[0] if stack is not None and len(stack) else obj
    if hasattr(probe, "intermediate"):
        _no_positions(position_ids, "BERT layer", rope_float64)
        spec = bert_layer_spec(base, hidden_states, layer=layer, attention_mask=attention_mask)
    elif hasattr(probe, "ln_1"):
        _no_positions(position_ids, "GPT-2 block", rope_float64)
        spec = gpt2_block_spec(base, hidden_states, layer=layer, attention_mask=attention_mask)
    elif is_mla(getattr(probe, "self_attn", probe)):  # DeepSeek-V2/V3: latent attention (attntrace.bridges.deepseek)
        _rope_float64_only(rope_float64)
        spec = deepseek_layer_spec(obj, hidden_states, layer=layer, position_ids=position_ids, attention_mask=attention_mask)
    else:
        _rope_float64_only(rope_float64)
        spec = llama_layer_spec(obj, hidden_states, layer=layer, position_ids=position_ids, attention_mask=attention_mask)
    return trace_spec(spec, **{"copy": False, **run_overrides})  # every array is the bridge's own (to_numpy): not copied again
