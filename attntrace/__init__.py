"""attntrace: Transformer attention, traced step by step and written out as a derivation.

    >>> import attntrace
    >>> t = attntrace.run({"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False})
    >>> t.step("weights").value.round(4).tolist()
    [[0.6457, 0.3543], [0.4013, 0.5987]]
"""

from __future__ import annotations

from attntrace.model.errors import AttntraceError, BadInput, Unsupported
from attntrace.model.formula import PRINTERS
from attntrace.model.trace import PRESENTERS, STEP_IDS, Operand, Step, Trace
from attntrace.version import __version__


def run(spec, *, copy: bool = True, **overrides) -> Trace:
    """Trace attention for `spec` (a dict, or a path to a TOML/JSON file, or an example name).

    Overrides replace spec keys: mode, scale, d_k, mask, title, expand, ...
    copy=False: NumPy float64 arrays that are writable are kept without a copy (as read-only
    views); the caller promises not to change them while the trace is used. Read-only float64
    arrays are never copied.
    """
    from attntrace.tracer import trace_spec

    return trace_spec(spec, copy=copy, **overrides)


def render(trace: Trace, format: str = "md", **options) -> str:
    """Render a trace as a Markdown, LaTeX or plain-text derivation."""
    from attntrace.rendering.formats import render as _render

    return _render(trace, format=format, **options)


def check(spec_or_trace, answer, **options):
    """Check a student's answer against the trace; returns a Report."""
    from attntrace.grading.checker import check as _check

    return _check(spec_or_trace, answer, **options)


def check_class(spec_or_trace, answers, **options):
    """Check and score a whole class (a folder or a list of answers); returns a ClassReport."""
    from attntrace.teach.classcheck import check_class as _check_class

    return _check_class(spec_or_trace, answers, **options)


def _trace_to_dict(trace: Trace) -> dict:
    from attntrace.rendering.export import trace_to_dict

    return trace_to_dict(trace)


def _trace_to_html_fragment(trace: Trace) -> str:
    from attntrace.rendering.html import render_html

    return render_html(trace, fragment=True)


def _print_formula(notation: str):
    def print_tree(tree) -> str:
        from attntrace.rendering.formulatext import PRINTER_OF

        return PRINTER_OF[notation](tree)
    return print_tree


# Trace.to_dict and its Jupyter hooks present a trace with the layers above the model;
# Step.formula and Step.plain are its formula tree printed by the rendering printers.
PRESENTERS.update(json=_trace_to_dict, render=render, html=_trace_to_html_fragment)
PRINTERS.update({notation: _print_formula(notation) for notation in ("tex", "plain", "mathml")})

__all__ = ["run", "render", "check", "check_class", "Trace", "Step", "Operand", "STEP_IDS", "AttntraceError", "BadInput", "Unsupported", "__version__"]


def from_torch(module, x, *args, **kwargs) -> Trace:
    """Trace a module on its input x, whichever attntrace can trace (needs attntrace[torch]):

    - `nn.MultiheadAttention`: from_torch(mha, query, key=None, value=None, attn_mask=..., ...)
    - `nn.TransformerEncoderLayer`: the whole layer, as `from_torch_layer`
    - `nn.TransformerDecoderLayer`: its self-attention sublayer, as `from_torch_decoder_self_attention`
    - a Hugging Face Llama-style attention module: as `from_hf_llama_attention`
    - a Hugging Face layer (LlamaDecoderLayer and kin, BertLayer, GPT2Block): as `from_hf_layer`
    - a Hugging Face model with layer=i: its layer i, as `from_hf_layer`

    Keyword arguments go to that function (masks, positions, then `attntrace.run`'s title,
    mode, ...). Anything else is refused with one line naming what can be traced.
    `trace.output` is the module's output (for one sequence: (n, d) where torch gives (1, n, d)).
    """
    from attntrace.bridges.dispatch import from_torch as _from_torch

    return _from_torch(module, x, *args, **kwargs)


def from_qkv(q, k, v, **kwargs) -> Trace:
    """Trace the tensors one would pass to `scaled_dot_product_attention` (needs attntrace[torch])."""
    from attntrace.bridges.pytorch import from_qkv as _from_qkv

    return _from_qkv(q, k, v, **kwargs)


__all__ += ["from_torch", "from_qkv"]


def from_hf_llama_attention(layer_or_model, hidden_states, **kwargs) -> Trace:
    """Trace the self-attention of a Hugging Face Llama-style layer (needs attntrace[hf])."""
    from attntrace.bridges.huggingface import from_hf_llama_attention as _from_hf

    return _from_hf(layer_or_model, hidden_states, **kwargs)


__all__ += ["from_hf_llama_attention"]


def from_torch_layer(layer, x, **kwargs) -> Trace:
    """Trace a whole `torch.nn.TransformerEncoderLayer` (eval mode) on x: attention, residuals,
    LayerNorms and the feed-forward network (needs attntrace[torch])."""
    from attntrace.bridges.blocks import from_torch_layer as _from_layer

    return _from_layer(layer, x, **kwargs)


def from_hf_llama_layer(model_or_layer, hidden_states, **kwargs) -> Trace:
    """Trace a whole Hugging Face Llama-style decoder layer on its input (needs attntrace[hf])."""
    from attntrace.bridges.blocks import from_hf_llama_layer as _from_hf_layer

    return _from_hf_layer(model_or_layer, hidden_states, **kwargs)


def from_hf_layer(model_or_layer, hidden_states, *, layer: int = 0, **kwargs) -> Trace:
    """Trace layer `layer` of a Hugging Face BERT, GPT-2 or Llama-style model on its input hidden
    states: the whole block (needs attntrace[hf])."""
    from attntrace.bridges.blocks import from_hf_layer as _from_hf_layer

    return _from_hf_layer(model_or_layer, hidden_states, layer=layer, **kwargs)


__all__ += ["from_torch_layer", "from_hf_llama_layer", "from_hf_layer"]


def from_torch_decoder_self_attention(layer, tgt, **kwargs) -> Trace:
    """Trace the self-attention sublayer of a `torch.nn.TransformerDecoderLayer` (eval mode) on
    tgt: attention with tgt_mask / tgt_is_causal and key padding, residual1 and norm1 (needs
    attntrace[torch])."""
    from attntrace.bridges.decoder import from_torch_decoder_self_attention as _from_dec

    return _from_dec(layer, tgt, **kwargs)


__all__ += ["from_torch_decoder_self_attention"]
