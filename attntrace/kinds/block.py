"""The Transformer block around attention: which kinds run before it and after it.

Three arrangements (the spec's `block`), each a pair (PRE, POST) of pipelines over one
layer state whose roles are X (the residual stream: the input, or E = X + P), attn_in (what
the projections read), O (attention's output: O, or Z without W_O), R1, ffn_in, H, U, G, F,
R2, Y:

- post_ln (Vaswani et al. 2017; BERT; nn.TransformerEncoderLayer with norm_first=False):
  R = E + Attn(E), N = LayerNorm(R), R^f = N + FFN(N), N^f = LayerNorm(R^f).
- pre_ln (GPT-2; norm_first=True): N = LayerNorm(E), R = E + Attn(N), N^f = LayerNorm(R),
  R^f = R + FFN(N^f) (GPT-2's final LayerNorm belongs to the model, after the last block).
- llama: pre_ln with RMSNorm and the SwiGLU feed-forward network, or a mixture of experts in
  its place (the spec's moe: attntrace.kinds.moe, whose kinds replace the network's).
- sandwich (Gemma 2): llama with an RMSNorm on each sublayer's output before its residual,
  R = X + RMSNorm_3(Attn(N)), Y = R + RMSNorm_4(FFN(N^f)) (attntrace.kinds.sandwich), and
  GeGLU or SwiGLU.

With `block_part = "self_attention"` (the spec's option) only the first sublayer runs:
post_ln R = E + Attn(E), N = LayerNorm(R); pre_ln and llama N = Norm(E), R = E + Attn(N)
(e.g. the self-attention sublayer of nn.TransformerDecoderLayer, attntrace.bridges.decoder).

The step ids say which sublayer a norm belongs to, as torch's norm1/norm2: norm1 the
attention's, norm2 the feed-forward network's, in either arrangement.
"""

from __future__ import annotations

from attntrace.kinds.base import Kind
from attntrace.kinds.ffn import FFN_ACT, Linear
from attntrace.kinds.moe import MOE_KINDS
from attntrace.kinds.norm import Norm
from attntrace.kinds.position import EMBED, POS_ENC
from attntrace.kinds.residual import Residual
from attntrace.kinds.sandwich import POST_ATTN_NORM, POST_FFN_NORM
from attntrace.model.formula import sym

ARRANGEMENTS = ("post_ln", "pre_ln", "llama", "sandwich")

RESIDUAL1 = Residual("residual1", "X", "O", "R1", sym("R"), sym("r"), "r")
FFN_HIDDEN = Linear("ffn_hidden", "ffn_in", "H", "H", "h", ("W_1", "W_gate"), "b_1")
FFN_UP = Linear("ffn_up", "ffn_in", "U", "U", "u", ("W_up", "W_up"), None, swiglu_only=True)
FFN_OUT = Linear("ffn_out", "G", "F", "F", "f", ("W_2", "W_down"), "b_2")
FFN = (FFN_HIDDEN, FFN_UP, FFN_ACT, FFN_OUT)

# post-LN: the norms follow the residual additions
NORM1_POST = Norm("norm1", "R1", "ffn_in", sym("N"), sym("n"), "n", 1)
RESIDUAL2_POST = Residual("residual2", "ffn_in", "F", "R2", sym("R", sup="f"), sym("r", sup="f"), "r^{f}")
NORM2_POST = Norm("norm2", "R2", "Y", sym("N", sup="f"), sym("n", sup="f"), "n^{f}", 2)
# pre-LN: the norms come first in each sublayer
NORM1_PRE = Norm("norm1", "X", "attn_in", sym("N"), sym("n"), "n", 1)
NORM2_PRE = Norm("norm2", "R1", "ffn_in", sym("N", sup="f"), sym("n", sup="f"), "n^{f}", 2)
RESIDUAL2_PRE = Residual("residual2", "R1", "F", "Y", sym("R", sup="f"), sym("r", sup="f"), "r^{f}")

POSITION: tuple[Kind, ...] = (POS_ENC, EMBED)
#: arrangement -> (PRE, POST): the kinds before attention and after the output projection.
BLOCK_PIPELINES: dict[str | None, tuple[tuple[Kind, ...], tuple[Kind, ...]]] = {
    None: (POSITION, ()),
    "post_ln": (POSITION, (RESIDUAL1, NORM1_POST) + FFN + (RESIDUAL2_POST, NORM2_POST)),
    "pre_ln": (POSITION + (NORM1_PRE,), (RESIDUAL1, NORM2_PRE) + FFN + (RESIDUAL2_PRE,)),
    "llama": (POSITION + (NORM1_PRE,), (RESIDUAL1, NORM2_PRE) + FFN + MOE_KINDS + (RESIDUAL2_PRE,)),
    "sandwich": (POSITION + (NORM1_PRE,), (POST_ATTN_NORM, RESIDUAL1, NORM2_PRE) + FFN + (POST_FFN_NORM, RESIDUAL2_PRE)),
}
#: Every block kind (for KINDS; kinds of one id share their names, view and prose).
BLOCK_KINDS: tuple[Kind, ...] = tuple(dict.fromkeys(k for pre, post in BLOCK_PIPELINES.values() for k in pre + post))


#: arrangement -> POST with block_part = "self_attention": the first sublayer's kinds only.
SELF_ATTENTION_POST: dict[str, tuple[Kind, ...]] = {"post_ln": (RESIDUAL1, NORM1_POST), "pre_ln": (RESIDUAL1,), "llama": (RESIDUAL1,),
                                                     "sandwich": (POST_ATTN_NORM, RESIDUAL1)}


def block_pipelines(problem) -> tuple[tuple[Kind, ...], tuple[Kind, ...]]:
    """(PRE, POST) for the problem's arrangement (no block: only position encodings, if any)."""
    block = problem.extra.get("block")
    pre, post = BLOCK_PIPELINES[block]
    if problem.extra.get("block_part") == "self_attention":
        post = SELF_ATTENTION_POST[block]
    return pre, post
