"""A given additive bias on the scores, T-hat = T + B: PyTorch's float attention masks.

`nn.MultiheadAttention` and `scaled_dot_product_attention` take a float `attn_mask` that is
*added* to the scaled scores: -inf removes a key (attntrace's mask step) and any finite entry
is a bias per (query, key) pair, as relative-position schemes and T5's buckets use. The spec's
`attn_bias` gives that matrix B, (n_q, n_k) for every head or a list of one per head; the step
comes where ALiBi's does (after the scaling, before the mask) and is written the same way
(`attntrace.kinds.alibi` computes its B from slopes, this kind is given it). The bridges
split a torch float mask into its -inf entries (the mask) and the rest (this bias).
"""

from __future__ import annotations

from attntrace.kinds.base import Kind, label
from attntrace.model.errors import BadInput
from attntrace.model.formula import sym

#: The kinds here run only for a problem with an attn_bias (`attntrace.kinds.registry` imports
#: this module only then).
RUNS_WITH = ("attn_bias",)


class ScoreBias(Kind):
    pipeline, after = "head", ("biased",)
    id = "bias"
    reads, writes = ("S",), "S"
    starts = ("X", "QKV", "scores")
    letter, entry = sym("T", accent="hat"), sym("t", accent="hat")
    view, prose = "bias", "bias"
    view_module = "alibiview"
    meaning = "biased"
    symbols = ((sym("B"), "score_bias", "step"),)

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and "attn_bias" in problem.extra

    def compute(self, ctx, head, state):
        t = state["S"]
        given = ctx.p.extra["attn_bias"]  # Operands: one for every head, or one per head
        b = given[(head or 1) - 1] if len(given) > 1 else given[0]
        if tuple(b.shape) != tuple(t.shape):
            raise BadInput(f"step {label(self.id, head)}: attn_bias is {b.shape[0]} x {b.shape[1]} but the scores are "
                           f"{t.shape[0]} x {t.shape[1]}")
        result = ctx.alg.plus(t.value, b.value)
        formula = self.letter.head(head).eq(t.letter.head(head) + sym("B").head(head))
        return ctx.emit(self, head, [t.ref], formula, result, t.shape, {"bias": b.value})

    def intro(self, term, steps):
        return term + sym("B")

    def overflow_how(self, inputs, details) -> str:
        return f"{inputs[0]} plus the given bias"

    def carry(self, iv, step, args, mistake):
        """T + B from the student's T (B is given)."""
        bias = iv.floats(step.details["bias"])
        if bias.shape != args[0].shape:
            raise iv.Impossible()
        return iv.add(args[0], iv.point(bias))


SCORE_BIAS = ScoreBias()
