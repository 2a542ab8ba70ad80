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
