"""Attention sinks (gpt-oss): a learned logit per head that joins every softmax denominator.

Head h has one number s_h. It is appended to every row of the (masked) scores as one more
column, T-bar = [T~ | s_h 1] (plain text: T+), and the softmax runs over that longer row; the sink's column is
then dropped, since it has no value to mix: a_ij = e^{t_ij} / (sum_k e^{t_ik} + e^{s_h}). A
query can so put weight on "nothing": its row of weights sums to 1 - pi_i, pi_i the sink's
share. That lets a head stay quiet without dumping its weight on the first token (the
"attention sink" Xiao et al. observed in StreamingLLM; gpt-oss learns it as a parameter, as
its model card describes). The row maximum of the stable softmax includes s_h.

This kind is the `sink` step (T+); the weights step (attntrace.kinds.softmax) sees the extra
column and keeps the first n_k columns of its softmax. Spec: `sinks = [s_1, ..., s_h]`.
"""

from __future__ import annotations

from attntrace.kinds.base import Kind, plain_math, plain_sup, sup


class Sink(Kind):
    id = "sink"
    reads, writes = ("S",), "S"
    starts = ("X", "QKV", "scores")
    letter, plain_letter, entry = "\\bar{T}", "T+", "\\bar{t}"
    view, prose = "sink", "sink"
    infinite_ok = True  # the masked scores it carries are -inf

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and "sinks" in problem.extra

    def compute(self, ctx, head, state):
        t = state["S"]
        s = ctx.alg.number(ctx.p.extra["sinks"][(head or 1) - 1])
        rows, cols = t.shape
        result = ctx.alg.hstack([t.value, ctx.alg.constant((rows, 1), s)]) if t.value is not None else None
        h, ph = sup(head), plain_sup(head)
        formula = f"\\bar{{T}}{h} = \\begin{{bmatrix}} {t.letter}{h} & s{h}\\mathbf{{1}} \\end{{bmatrix}}"
        plain = f"T+{ph} = [{plain_math(t.letter)}{ph} | s{ph} 1]"
        return ctx.emit(self, head, [t.ref], formula, plain, result, (rows, cols + 1), {"sink": s, "keys": cols})

    def json_details(self, details):
        s = details["sink"]
        return {"sink": float(s) if isinstance(s, (int, float)) or getattr(s, "is_number", False) else str(s)}

    def overflow_how(self, inputs, details) -> str:
        return f"{inputs[0]} with the sink logit appended"


SINK = Sink()
