"""Gemma 2's sandwich block: an RMSNorm on each sublayer's output before its residual.

Gemma 2 (Gemma Team 2024, "Gemma 2: Improving Open Language Models at a Practical Size", 2.2:
"we use RMSNorm to normalize the input and output of each transformer sub-layer") puts four
norms in a layer, where Llama has two:

    N   = RMSNorm_1(X)          the attention's input (norm1, as in llama)
    Ô   = RMSNorm_3(O)          attention's output normalised        (post_attn_norm, here)
    R   = X + Ô
    N^f = RMSNorm_2(R)          the feed-forward network's input      (norm2, as in llama)
    F̂   = RMSNorm_4(F)          the network's output normalised       (post_ffn_norm, here)
    Y   = R + F̂

Gemma's RMSNorm multiplies by 1 + gamma (attntrace.kinds.norm, gain_offset); its network is
GeGLU (attntrace.kinds.ffn, activation "geglu"). Each norm here reads its sublayer's output and
writes it back under the same role (O, F), so the residual kinds add the normalised output.

Its mistake: `post_norm_skipped`, the sublayer's raw output added to the residual stream (a
llama layer's arrangement), which the checker plants as Ô = O (F̂ = F).
"""

from __future__ import annotations

import numpy as np

from attntrace.inputs.blockspec import BLOCK_OPERANDS
from attntrace.kinds.base import Mistake, place
from attntrace.kinds.norm import Norm
from attntrace.model.formula import sym

#: The kinds here run only for a problem with a Transformer block (`attntrace.kinds.registry` imports
#: this module only then).
RUNS_WITH = ("block",)

#: its norms' gains (norm3, norm4 of the block's spec, read with the other norms): their words are in its prose
OPERANDS = {k: BLOCK_OPERANDS[k] for k in ("gamma_3", "gamma_4")}


class OutputNorm(Norm):
    """RMSNorm of a sublayer's output (Gemma 2's post_attention_layernorm, post_feedforward_layernorm)."""

    prose = "sandwich"
    elementwise = "hadamard"  # its shapes line: (n x d) o (1 x d), the gain broadcast, not a product
    mistakes = (Mistake("post_norm_skipped", also=()),)

    def report_params(self, steps):
        return {}  # the report names the block's norm by its first two

    def carry(self, iv, step, args, mistake):
        """RMSNorm of the student's sublayer output (times 1 + gamma with Gemma's offset);
        post_norm_skipped: the output as it is."""
        if mistake == "post_norm_skipped":
            return args[0]
        d = step.details
        gain = args[1] if len(args) > 1 else None
        if gain is not None and d.get("offset"):
            gain = iv.add(gain, iv.point(np.full_like(gain.lo, float(d["offset"]))))
        return iv.norm(args[0], gain, None, float(d["eps"]), True)


POST_ATTN_NORM = place(OutputNorm("post_attn_norm", "O", "O", sym("O", accent="hat"), sym("o", accent="hat"), "\\hat{o}", 3),
                       "block_post", ("sandwich",), before=("residual1",), attention_sublayer=True)
POST_FFN_NORM = place(OutputNorm("post_ffn_norm", "F", "F", sym("F", accent="hat"), sym("f", accent="hat"), "\\hat{f}", 4),
                      "block_post", ("sandwich",), after=("ffn_out",), before=("residual2",))
