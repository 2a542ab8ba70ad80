"""Reference implementations of the Transformer block's parts, from PyTorch (float64).

Every function takes and returns float64 NumPy arrays and computes with torch's own modules
or functions, never with attntrace's code, so a test that compares the two compares two
independent implementations:

- layer_norm: torch.nn.LayerNorm (biased variance), weight/bias copied in, float64.
- rms_norm: torch.nn.RMSNorm (torch >= 2.4), float64.
- gelu / gelu_tanh / relu / silu: torch.nn.GELU(approximate="none" | "tanh"), torch.relu, F.silu.
- swiglu_ffn: F.silu(x W_gate) * (x W_up) W_down with torch.nn.Linear layers (Llama's MLP).
- sinusoidal: the Annotated Transformer's PositionalEncoding table, in float64 (it computes
  div_term = exp(2k * -(ln 10000 / d)), a different route to 1 / 10000^(2k/d)).
- encoder_layer: torch.nn.TransformerEncoderLayer in eval mode, float64.
- hf_llama_rms_norm / hf_llama_mlp: Hugging Face's LlamaRMSNorm and LlamaMLP. LlamaRMSNorm
  casts its input to float32 before the mean square ("hidden_states.to(torch.float32)") and
  back to the input dtype after, so on a float64 input it computes in float32; these helpers
  say so by returning the float32-precision result, and the tests compare them at 1e-6
  relative, not 1e-10. LlamaMLP has no cast: float64 throughout.
"""

from __future__ import annotations

import math

import numpy as np
import torch

torch.set_default_dtype(torch.float64)


def _t(a) -> torch.Tensor:
    return torch.tensor(np.array(a, dtype=np.float64))  # a copy: trace values are read-only


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).numpy()


def layer_norm(x, gain=None, bias=None, eps=1e-5) -> np.ndarray:
    x = _t(x)
    ln = torch.nn.LayerNorm(x.shape[-1], eps=eps, dtype=torch.float64)
    with torch.no_grad():
        if gain is not None:
            ln.weight.copy_(_t(gain).reshape(-1))
        if bias is not None:
            ln.bias.copy_(_t(bias).reshape(-1))
        return _np(ln(x))


def rms_norm(x, gain=None, eps=1e-5) -> np.ndarray:
    x = _t(x)
    rn = torch.nn.RMSNorm(x.shape[-1], eps=eps, dtype=torch.float64)
    with torch.no_grad():
        if gain is not None:
            rn.weight.copy_(_t(gain).reshape(-1))
        return _np(rn(x))


def gelu(x) -> np.ndarray:
    return _np(torch.nn.GELU(approximate="none")(_t(x)))


def gelu_tanh(x) -> np.ndarray:
    return _np(torch.nn.GELU(approximate="tanh")(_t(x)))


def relu(x) -> np.ndarray:
    return _np(torch.relu(_t(x)))


def silu(x) -> np.ndarray:
    return _np(torch.nn.functional.silu(_t(x)))


def _linear(w_in_out, bias=None) -> torch.nn.Linear:
    """An nn.Linear computing x @ w (+ b): torch stores the weight as (out, in)."""
    w = _t(w_in_out)
    lin = torch.nn.Linear(w.shape[0], w.shape[1], bias=bias is not None, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(w.T)
        if bias is not None:
            lin.bias.copy_(_t(bias).reshape(-1))
    return lin


def ffn(x, w1, b1, w2, b2, activation="relu") -> np.ndarray:
    act = {"relu": torch.relu, "gelu": torch.nn.GELU(), "gelu_tanh": torch.nn.GELU(approximate="tanh")}[activation]
    with torch.no_grad():
        return _np(_linear(w2, b2)(act(_linear(w1, b1)(_t(x)))))


def swiglu_ffn(x, w_gate, w_up, w_down) -> np.ndarray:
    with torch.no_grad():
        x = _t(x)
        g = torch.nn.functional.silu(_linear(w_gate)(x))
        return _np(_linear(w_down)(g * _linear(w_up)(x)))


def sinusoidal(n: int, d: int) -> np.ndarray:
    """The Annotated Transformer's PositionalEncoding (even d), float64."""
    pe = torch.zeros(n, d, dtype=torch.float64)
    position = torch.arange(0, n, dtype=torch.float64).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * -(math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)[:, : d // 2]
    return _np(pe)


def random_encoder_layer(d_model=8, nhead=2, d_ff=16, activation="relu", norm_first=False, seed=0):
    """A TransformerEncoderLayer in eval mode, float64, every parameter drawn N(0, 1)
    (the default init leaves norms at gain 1, bias 0, which would hide a swapped gain)."""
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=d_ff, dropout=0.1, activation=activation,
                                             norm_first=norm_first, batch_first=True, dtype=torch.float64).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    return layer


def encoder_layer(layer, x) -> np.ndarray:
    with torch.no_grad():
        return _np(layer(_t(x)[None])[0])


def hf_llama_parts(hidden=8, intermediate=12, eps=1e-6, seed=0):
    """Hugging Face's LlamaRMSNorm and LlamaMLP from a tiny random config, float64, eval."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=2, num_key_value_heads=2,
                      rms_norm_eps=eps, hidden_act="silu")
    norm = LlamaRMSNorm(hidden, eps=eps).double().eval()
    mlp = LlamaMLP(cfg).double().eval()
    with torch.no_grad():
        norm.weight.normal_()
        for p in mlp.parameters():
            p.normal_(std=0.5)
    return norm, mlp


def hf_module(module, x) -> np.ndarray:
    with torch.no_grad():
        return _np(module(_t(x)[None])[0])


def _float64_rms_forward(norm):
    """HF LlamaRMSNorm.forward with its float32 cast made a float64 one (HF's own code, exec'd)."""
    import inspect
    import textwrap
    import types

    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    ns = {"torch": types.SimpleNamespace(float32=torch.float64, rsqrt=torch.rsqrt, Tensor=torch.Tensor)}
    exec(textwrap.dedent(inspect.getsource(LlamaRMSNorm.forward)), ns)
    return types.MethodType(ns["forward"], norm)


def hf_llama_decoder_layer(seed=0, hidden=8, heads=2, kv_heads=1, n=4, *, float64_norms=True):
    """Layer 0 of a tiny random HF LlamaModel (float64, SDPA, float64 rotary angles as
    tests/oracles.py does): (model, x, y) with x the decoder layer's input hidden states
    and y its output, captured with forward hooks on a run with position_ids 0..n-1.
    With float64_norms every LlamaRMSNorm runs its own forward in float64 (see the module
    docstring); without, HF's float32 cast is kept."""
    from oracles import _tiny_llama_config, _use_float64_rope
    from transformers import LlamaModel

    torch.manual_seed(seed)
    cfg = _tiny_llama_config(hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads, layers=1, attn="sdpa")
    model = LlamaModel(cfg).double().eval()
    _use_float64_rope(model)
    with torch.no_grad():
        for m in model.modules():
            if type(m).__name__ == "LlamaRMSNorm":
                m.weight.normal_(1.0, 0.3)
                if float64_norms:
                    m.forward = _float64_rms_forward(m)
    seen = {}
    layer = model.layers[0]
    def pre(mod, args, kwargs):
        seen["x"] = (args[0] if args else kwargs["hidden_states"]).clone()

    def post(mod, args, out):
        seen["y"] = (out[0] if isinstance(out, tuple) else out).clone()

    h1 = layer.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = layer.register_forward_hook(post)
    x0 = torch.randn(1, n, hidden, dtype=torch.float64)
    with torch.no_grad():
        model(inputs_embeds=x0, position_ids=torch.arange(n)[None])
    h1.remove()
    h2.remove()
    return model, _np(seen["x"][0]), _np(seen["y"][0])


def hf_layer_io(layer, run):
    """(x, y): what a Hugging Face layer module received as hidden_states and what it returned
    while `run()` ran the whole model (forward hooks)."""
    seen = {}

    def pre(mod, args, kwargs):
        seen["x"] = (args[0] if args else kwargs["hidden_states"]).clone()

    def post(mod, args, out):
        seen["y"] = (out[0] if isinstance(out, tuple) else out).clone()

    h1, h2 = layer.register_forward_pre_hook(pre, with_kwargs=True), layer.register_forward_hook(post)
    with torch.no_grad():
        run()
    h1.remove()
    h2.remove()
    return _np(seen["x"][0]), _np(seen["y"][0])


def tiny_bert(seed=0, impl="eager", layers=2):
    """A random BertModel (hidden 8, 2 heads, intermediate 12, exact GELU), float64, eval; weights
    N(0, 0.5) so that attention is far from uniform and the GELU's negative side is used."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(hidden_size=8, num_attention_heads=2, intermediate_size=12, num_hidden_layers=layers, vocab_size=20,
                     max_position_embeddings=16, initializer_range=0.5, attn_implementation=impl)
    return BertModel(cfg).double().eval()


def tiny_gpt2(seed=0, impl="eager", layers=2):
    """A random GPT2Model (n_embd 8, 2 heads, gelu_new), float64, eval, weights N(0, 0.5)."""
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(seed)
    cfg = GPT2Config(n_embd=8, n_head=2, n_layer=layers, vocab_size=20, n_positions=16, initializer_range=0.5,
                     attn_implementation=impl, bos_token_id=None, eos_token_id=None)
    return GPT2Model(cfg).double().eval()
