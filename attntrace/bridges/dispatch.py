"""`attntrace.from_torch(module, x, ...)`: one entry point for every module attntrace can trace.

The module's type picks the bridge from `ROUTES`, a table read in order: PyTorch's own
modules by isinstance, Hugging Face's by their class names (transformers is never imported
here, so a torch-only install dispatches as well). The specific functions stay the long form,
with their own keyword arguments; `from_torch` passes its arguments on unchanged:

| module | bridge (the long form) |
|---|---|
| torch.nn.MultiheadAttention | `bridges.pytorch.from_torch` (query, key, value, attn_mask, ...) |
| torch.nn.TransformerEncoderLayer | `from_torch_layer` (src_mask, src_key_padding_mask, is_causal) |
| torch.nn.TransformerDecoderLayer | `from_torch_decoder_self_attention` (its self-attention sublayer) |
| a Hugging Face model (PreTrainedModel) + `layer=i` | `from_hf_layer` (the whole layer i) |
| a Hugging Face latent attention module (DeepSeek-V2/V3: kv_a_proj_with_mqa, kv_b_proj) | `bridges.deepseek.from_hf_mla_attention` |
| a Hugging Face attention module with q_proj, k_proj, v_proj, o_proj (Llama, Mistral, Qwen3, Gemma 2, gpt-oss) | `from_hf_llama_attention` |
| a Hugging Face layer (LlamaDecoderLayer and its kin: Mistral, Qwen3; BertLayer, GPT2Block) | `from_hf_layer` |

Anything else is refused with one line naming what can be traced.
"""

from __future__ import annotations

import re
from typing import Any, Callable, NamedTuple

from attntrace.model.errors import BadInput, Unsupported


class Route(NamedTuple):
    """One row of the dispatch table: what it traces (for the error), the test, the bridge."""

    name: str
    matches: Callable[[Any], bool]
    trace: Callable[..., Any]


def _torch_type(name: str) -> Callable[[Any], bool]:
    def matches(obj) -> bool:
        try:
            import torch
        except ImportError:  # pragma: no cover - depends on the environment
            raise Unsupported("PyTorch is not installed: pip install 'attntrace[torch]'") from None
        return isinstance(obj, getattr(torch.nn, name))

    return matches


def _hf(pattern: str, needs: tuple[str, ...] = ()) -> Callable[[Any], bool]:
    """A Hugging Face class: its module is transformers', its class name matches `pattern`, and
    it has the attributes the bridge reads."""
    rx = re.compile(pattern)

    def matches(obj) -> bool:
        cls = type(obj)
        return (cls.__module__.startswith("transformers.") and rx.search(cls.__name__) is not None
                and all(hasattr(obj, a) for a in needs))

    return matches


def _hf_model(obj) -> bool:
    return any(c.__name__ == "PreTrainedModel" for c in type(obj).__mro__)


def _mha(module, *args, **kwargs):
    from attntrace.bridges.pytorch import from_torch

    return from_torch(module, *args, **kwargs)


def _encoder_layer(module, *args, **kwargs):
    from attntrace.bridges.blocks import from_torch_layer

    return from_torch_layer(module, *args, **kwargs)


def _decoder_layer(module, *args, **kwargs):
    from attntrace.bridges.decoder import from_torch_decoder_self_attention

    return from_torch_decoder_self_attention(module, *args, **kwargs)


def _hf_model_layer(module, *args, layer: int | None = None, **kwargs):
    from attntrace.bridges.blocks import from_hf_layer

    if layer is None:
        raise BadInput(f"{type(module).__name__} is a whole model: give layer=i to trace its layer i "
                       "(or pass the attention module itself to trace attention alone)")
    return from_hf_layer(module, *args, layer=layer, **kwargs)


def _hf_attention(module, *args, **kwargs):
    from attntrace.bridges.huggingface import from_hf_llama_attention

    return from_hf_llama_attention(module, *args, **kwargs)


def _hf_mla_attention(module, *args, **kwargs):
    from attntrace.bridges.deepseek import from_hf_mla_attention

    return from_hf_mla_attention(module, *args, **kwargs)


def _hf_layer(module, *args, **kwargs):
    from attntrace.bridges.blocks import from_hf_layer

    return from_hf_layer(module, *args, **kwargs)


#: Read in order; the first route whose test holds traces the module.
ROUTES: tuple[Route, ...] = (
    Route("nn.MultiheadAttention", _torch_type("MultiheadAttention"), _mha),
    Route("nn.TransformerEncoderLayer", _torch_type("TransformerEncoderLayer"), _encoder_layer),
    Route("nn.TransformerDecoderLayer (its self-attention sublayer)", _torch_type("TransformerDecoderLayer"), _decoder_layer),
    Route("a Hugging Face model with layer=i (BERT, GPT-2, Llama-style)", _hf_model, _hf_model_layer),
    Route("a Hugging Face latent attention module (DeepSeek-V2/V3)", _hf(r"Attention$", ("kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "config")),
          _hf_mla_attention),
    Route("a Hugging Face Llama-style attention module (Llama, Mistral, Qwen3, Gemma 2, gpt-oss)", _hf(r"Attention$", ("q_proj", "k_proj", "v_proj", "o_proj", "config")), _hf_attention),
    Route("a Hugging Face layer (Llama-style decoder layer, BertLayer, GPT2Block)",
          lambda m: _hf(r"DecoderLayer$", ("self_attn", "mlp"))(m) or _hf(r"^BertLayer$")(m) or _hf(r"^GPT2Block$")(m), _hf_layer),
)


def from_torch(module, *args, **kwargs):
    """Trace `module` on its inputs with the bridge its type needs (see the module docstring)."""
    route = next((r for r in ROUTES if r.matches(module)), None)
    if route is None:
        raise Unsupported(f"from_torch cannot trace {type(module).__name__}; it traces " + ", ".join(r.name for r in ROUTES))
    return route.trace(module, *args, **kwargs)
