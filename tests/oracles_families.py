"""Tiny random Hugging Face models of the newer families (Mistral, Llama 3.1 / YaRN rope,
Qwen3, Gemma 2, gpt-oss), float64, and the input and output of one decoder layer.

"float64 internals": Hugging Face computes its rotary angles and its RMSNorms in float32 even in
a float64 model. As tests/oracles.py does for Llama, `float64_rotary` replaces the rotary
module's forward by its own formula in float64, with the frequencies from HF's own rope init
function (transformers.modeling_rope_utils, llama3 / yarn) run with float64 where it says
float32; `float64_norms` runs each RMSNorm's own forward with float64 for its float32 cast.
Everything else is the unmodified module.
"""

from __future__ import annotations

import inspect
import textwrap
import types

import numpy as np
import torch


class Float64Torch(types.ModuleType):
    """torch, with float32 spelled float64: a function of HF's written for float32 runs in float64."""

    def __init__(self):
        super().__init__("torch")
        self.float = self.float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


def float64_rotary(model):
    """The model's rotary_emb computes cos and sin in float64 (HF's init function and forward
    formula, float64 throughout)."""
    from transformers import modeling_rope_utils as mru

    base = getattr(model, "model", model)
    rot = base.rotary_emb
    kind = rot.config.rope_parameters.get("rope_type", "default")
    if kind == "default":
        d = getattr(rot.config, "head_dim", None) or rot.config.hidden_size // rot.config.num_attention_heads
        theta = rot.config.rope_parameters["rope_theta"]
        inv_freq, scaling = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)), 1.0
    else:
        saved = mru.torch
        mru.torch = Float64Torch()
        try:
            inv_freq, scaling = mru.ROPE_INIT_FUNCTIONS[kind](rot.config, "cpu")
        finally:
            mru.torch = saved
        assert inv_freq.dtype == torch.float64

    halves = type(rot).__name__ == "GptOssRotaryEmbedding"  # gpt-oss turns (first half, second half) with d/2 angles

    def forward(self, x, position_ids, layer_type=None):
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = freqs if halves else torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)

    rot.forward = types.MethodType(forward, rot)


def float64_eager_softmax(model):
    """The eager attention of the model's modeling module with its float32 softmax taken in
    float64 (HF's own function, float64 for float32), for the models whose eager attention
    upcasts to float32 (Gemma 2). Returns a function that undoes it."""
    mod = inspect.getmodule(type(model))
    saved = mod.eager_attention_forward
    ns = dict(vars(mod))
    ns["torch"] = Float64Torch()
    exec(textwrap.dedent(inspect.getsource(saved)), ns)
    mod.eager_attention_forward = ns["eager_attention_forward"]
    return lambda: setattr(mod, "eager_attention_forward", saved)


def float64_norms(model, jitter: float = 0.3, seed: int = 0):
    """Every RMSNorm of the model: a random gain near its default, and (HF's own forward with
    float64 for float32) its computation in float64."""
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        name = type(m).__name__
        if not name.endswith("RMSNorm"):
            continue
        with torch.no_grad():
            m.weight.add_(jitter * torch.randn(m.weight.shape, generator=gen, dtype=m.weight.dtype))
        src = textwrap.dedent(inspect.getsource(type(m).forward)).replace(".float()", ".to(torch.float64)")
        ns = dict(vars(inspect.getmodule(type(m))))
        ns["torch"] = Float64Torch()
        exec(src, ns)
        m.forward = types.MethodType(ns["forward"], m)


def module_io(model, module, n: int, seed: int = 0):
    """(args, kwargs, out) of `module` (e.g. a layer's self_attn) on a run of the whole model."""
    base = getattr(model, "model", model)
    seen = {}

    def pre(mod, args, kwargs):
        seen["args"], seen["kwargs"] = args, dict(kwargs)

    def post(mod, args, out):
        seen["out"] = out

    h1, h2 = module.register_forward_pre_hook(pre, with_kwargs=True), module.register_forward_hook(post)
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.randn(1, n, base.config.hidden_size, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        base(inputs_embeds=x0, position_ids=torch.arange(n)[None])
    h1.remove()
    h2.remove()
    return seen


def layer_io(model, layer: int, n: int, seed: int = 0):
    """(x, y): the input hidden states of decoder layer `layer` and its output, on random input
    embeddings at positions 0..n-1 (forward hooks on a run of the whole model, `module_io`)."""
    x, y = hidden_in_out(model, getattr(model, "model", model).layers[layer], n, seed)
    return x.copy(), y.copy()


def hidden_in_out(model, module, n: int, seed: int = 0):
    """(x, y) as arrays: the hidden states `module` reads and what it returns (`module_io`)."""
    seen = module_io(model, module, n, seed)
    args, out = seen["args"], seen["out"]
    x = args[0] if args else seen["kwargs"]["hidden_states"]
    y = out[0] if isinstance(out, tuple) else out
    return x[0].numpy(), y[0].numpy()


def tiny(family: str, *, attn: str = "eager", seed: int = 0, **overrides):
    """A tiny random float64 model of `family` in eval mode (built offline from its config)."""
    import transformers as tf

    common = dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4, intermediate_size=24,
                  num_hidden_layers=2, vocab_size=50, max_position_embeddings=256, initializer_range=0.3,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation=attn)
    cls = {"llama": (tf.LlamaConfig, tf.LlamaModel), "mistral": (tf.MistralConfig, tf.MistralModel),
           "gpt_oss": (tf.GptOssConfig, tf.GptOssModel), "qwen3": (tf.Qwen3Config, tf.Qwen3Model),
           "gemma2": (tf.Gemma2Config, tf.Gemma2Model)}[family]
    if family == "gemma2":
        common.update(query_pre_attn_scalar=9, attn_logit_softcapping=2.5, final_logit_softcapping=None, sliding_window=3,
                      layer_types=["sliding_attention", "full_attention"], hidden_activation="gelu_pytorch_tanh")
    if family == "qwen3":
        common.update(use_sliding_window=True, sliding_window=3, max_window_layers=1,
                      layer_types=["full_attention", "sliding_attention"])
    if family == "gpt_oss":
        common.update(num_local_experts=4, num_experts_per_tok=2, sliding_window=3, attention_bias=True, experts_implementation="eager",
                      layer_types=["sliding_attention", "full_attention"],
                      rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                                       "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64})
    torch.manual_seed(seed)
    cfg = cls[0](**{**common, **overrides})
    model = cls[1](cfg).double().eval()
    with torch.no_grad():  # parameters HF leaves uninitialised or at zero: random, so that they matter
        for name, p in model.named_parameters():
            if name.endswith("sinks") or (name.endswith(".bias") and "proj" in name):
                p.normal_(0.0, 1.0 if name.endswith("sinks") else 0.3)
    return model


__all__ = ["Float64Torch", "float64_rotary", "float64_norms", "layer_io", "tiny", "np"]
