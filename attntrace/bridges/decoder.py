"""The self-attention sublayer of `torch.nn.TransformerDecoderLayer`, as a block-like trace.

A decoder layer is three sublayers: masked self-attention over the target (norm1), cross-
attention over the encoder's `memory` (norm2), the feed-forward network (norm3). attntrace
traces the first: the block spec with `block_part = "self_attention"` (post_ln: attention,
residual1, norm1 after it; pre_ln: norm1, attention, residual1). As torch's forward:

    norm_first=False:  norm1(tgt + _sa_block(tgt, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
    norm_first=True:   tgt + _sa_block(norm1(tgt), tgt_mask, tgt_key_padding_mask, tgt_is_causal)

The second sublayer (cross-attention over memory) and the third (FFN, norm3) are not traced:
the sublayer's output is what the cross-attention sublayer reads (tests/test_block_decoder.py).
"""

from __future__ import annotations

import numpy as np

from attntrace.bridges.blocks import layer_norm_table
from attntrace.bridges.pytorch import require_torch, multihead_spec
from attntrace.model.errors import BadInput, Unsupported


def decoder_self_attention_spec(layer, tgt, *, tgt_mask=None, tgt_is_causal=False, tgt_key_padding_mask=None) -> dict:
    """The block spec (block = post_ln or pre_ln, block_part = "self_attention") equivalent to
    the first sublayer of `layer` on `tgt` in eval mode.

    tgt: (T, E), or a batch of one ((1, T, E) with batch_first, else (T, 1, E)). tgt_mask as
    torch (bool True = masked, or a float mask of 0 / -inf, (T, T)); tgt_is_causal=True alone
    means the causal mask, as nn.TransformerDecoder builds it. tgt_key_padding_mask: (T,) or
    (1, T), True = padding."""
    torch = require_torch()
    if not isinstance(layer, torch.nn.TransformerDecoderLayer):
        raise BadInput(f"from_torch_decoder_self_attention traces torch.nn.TransformerDecoderLayer, not {type(layer).__name__}")
    if layer.training and (layer.dropout1.p > 0 or layer.self_attn.dropout > 0):
        raise Unsupported("TransformerDecoderLayer in training mode applies dropout at random; call layer.eval() first")
    d_model = layer.self_attn.embed_dim
    shape = tuple(np.shape(tgt))
    batch_first = bool(layer.self_attn.batch_first)
    if len(shape) not in (2, 3) or shape[-1] != d_model or (len(shape) == 3 and shape[0 if batch_first else 1] != 1):
        layout = f"(1, T, {d_model})" if batch_first else f"(T, 1, {d_model})"
        raise BadInput(f"tgt must be (T, {d_model}) or a batch of one {layout}, not of shape {shape}")
    T = shape[0] if len(shape) == 2 else shape[1 if batch_first else 0]
    if tgt_mask is not None and tuple(tgt_mask.shape) != (T, T):
        raise BadInput(f"tgt_mask has shape {tuple(tgt_mask.shape)}; expected ({T}, {T}) for {T} target tokens")
    if tgt_is_causal and tgt_mask is None:
        tgt_mask = torch.ones(T, T, dtype=torch.bool).triu(1)  # True = masked: the keys after the query
    spec = multihead_spec(layer.self_attn, tgt, attn_mask=tgt_mask, is_causal=bool(tgt_is_causal),
                          key_padding_mask=tgt_key_padding_mask)
    spec.update(block="pre_ln" if layer.norm_first else "post_ln", block_part="self_attention", norm1=layer_norm_table(layer.norm1))
    return spec


def from_torch_decoder_self_attention(layer, tgt, *, tgt_mask=None, tgt_is_causal=False, tgt_key_padding_mask=None,
                                      **run_overrides):
    """Trace the self-attention sublayer of a `torch.nn.TransformerDecoderLayer` (eval mode) on
    `tgt`: projections, heads, scaled scores, the mask, softmax, Z, concat, W_O, residual1 and
    norm1 (post-LN: the trace ends at norm1; pre-LN: it starts with norm1 and ends at
    residual1). Extra keyword arguments go to `attntrace.run` (title, mode, ...)."""
    from attntrace.tracer import trace_spec

    spec = decoder_self_attention_spec(layer, tgt, tgt_mask=tgt_mask, tgt_is_causal=tgt_is_causal,
                                       tgt_key_padding_mask=tgt_key_padding_mask)
    # no title of its own: the report's default one names the sublayer and the arrangement in either language
    return trace_spec(spec, **{"copy": False, **run_overrides})  # fresh arrays (to_numpy): not copied again
