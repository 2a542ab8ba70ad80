"""The Transformer block around attention: its norms and residual additions in each arrangement.

Four arrangements (the spec's `block`), each a pair (PRE, POST) of pipelines over one
layer state whose roles are X (the residual stream: the input, or X-tilde = X + P), attn_in (what
the projections read), O (attention's output: O, or Z without W_O), R1, ffn_in, H, U, G, F,
R2, Y:

- post_ln (Vaswani et al. 2017; BERT; nn.TransformerEncoderLayer with norm_first=False):
  R = E + Attn(E), N = LayerNorm(R), R^f = N + FFN(N), N^f = LayerNorm(R^f).
- pre_ln (GPT-2; norm_first=True): N = LayerNorm(E), R = E + Attn(N), N^f = LayerNorm(R),
  R^f = R + FFN(N^f) (GPT-2's final LayerNorm belongs to the model, after the last block).
- llama: pre_ln with RMSNorm and the SwiGLU feed-forward network (attntrace.kinds.ffn), or a
  kind that replaces the network's kinds (a mixture of experts).
- sandwich (Gemma 2): llama with an RMSNorm on each sublayer's output before its residual,
  R = X + RMSNorm_3(Attn(N)), Y = R + RMSNorm_4(FFN(N^f)) (attntrace.kinds.sandwich), and
  GeGLU or SwiGLU.

With `block_part = "self_attention"` (the spec's option) only the first sublayer runs:
post_ln R = E + Attn(E), N = LayerNorm(R); pre_ln and llama N = Norm(E), R = E + Attn(N)
(e.g. the self-attention sublayer of nn.TransformerDecoderLayer, attntrace.bridges.decoder).

The step ids say which sublayer a norm belongs to, as torch's norm1/norm2: norm1 the
attention's, norm2 the feed-forward network's, in either arrangement.

Every block kind declares its place (`pipeline` "block_pre" or "block_post", the arrangements
it is in, `after`/`before`, `attention_sublayer`); `attntrace.kinds.registry` derives each
arrangement's (PRE, POST) from those declarations (`block_pipelines`), so a kind of the block
(the feed-forward network, the sandwich's output norms, a mixture of experts) is declared in
its own module and nothing here lists it.
"""

from __future__ import annotations

from attntrace.inputs.blockspec import ARRANGEMENTS
from attntrace.kinds.base import place
from attntrace.kinds.norm import Norm
from attntrace.kinds.residual import Residual
from attntrace.model.formula import sym

#: The kinds here run only for a problem with a Transformer block (`attntrace.kinds.registry` imports
#: this module only then).
RUNS_WITH = ("block",)

#: The arrangements with a norm before each sublayer (pre-LN, and llama and sandwich with RMSNorm).
_PRE_NORM = ("pre_ln", "llama", "sandwich")

RESIDUAL1 = place(Residual("residual1", "X", "O", "R1", sym("R"), sym("r"), "r"), "block_post", ARRANGEMENTS, attention_sublayer=True)

# post-LN: the norms follow the residual additions
NORM1_POST = place(Norm("norm1", "R1", "ffn_in", sym("N"), sym("n"), "n", 1), "block_post", ("post_ln",),
                   after=("residual1",), before=("ffn_hidden",), attention_sublayer=True)
RESIDUAL2_POST = place(Residual("residual2", "ffn_in", "F", "R2", sym("R", sup="f"), sym("r", sup="f"), "r^{f}"), "block_post", ("post_ln",),
                       after=("ffn_out",))
NORM2_POST = place(Norm("norm2", "R2", "Y", sym("N", sup="f"), sym("n", sup="f"), "n^{f}", 2), "block_post", ("post_ln",),
                   after=("residual2",))
# pre-LN: the norms come first in each sublayer
NORM1_PRE = place(Norm("norm1", "X", "attn_in", sym("N"), sym("n"), "n", 1), "block_pre", _PRE_NORM, after=("embed",))
NORM2_PRE = place(Norm("norm2", "R1", "ffn_in", sym("N", sup="f"), sym("n", sup="f"), "n^{f}", 2), "block_post", _PRE_NORM,
                  after=("residual1",), before=("ffn_hidden",))
RESIDUAL2_PRE = place(Residual("residual2", "R1", "F", "Y", sym("R", sup="f"), sym("r", sup="f"), "r^{f}"), "block_post", _PRE_NORM,
                      after=("ffn_out",))
