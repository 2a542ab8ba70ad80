"""Scaling T = S / sqrt(d_k) (or by a given constant c)."""

from __future__ import annotations

from attntrace.kinds.base import Kind, Symbol
from attntrace.model.errors import BadInput
from attntrace.model.formula import Frac, Sqrt, sym


class Scaled(Kind):
    pipeline, after = "head", ("scores",)
    id = "scaled"
    reads, writes = ("S",), "S"
    starts = ("X", "QKV", "scores")
    letter, entry, symbol = "T", "t", "t"
    view, prose = "scaled", "scaled"
    mistakes = ("missing_scale", "scaled_by_dk", "wrong_dk", "scaled_by_dmodel")

    def notation(self, step):
        return super().notation(step) + ([Symbol("d_k", "d_k", "d_k", "scalar")] if step.details.get("by_sqrt_dk") else [])

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and problem.scale is not False

    def compute(self, ctx, head, state):
        s = state["S"]
        d_k = state["d_k"]
        number = None if ctx.p.scale is True else ctx.p.scale
        if number is None and d_k is None:
            raise BadInput("scale is on but d_k is unknown: give d_k (the key width) or set scale = false")
        factor = ctx.alg.factor(d_k, number)
        result = ctx.alg.divide(s.value, factor)
        details = {"d_k": d_k, "factor": factor, "by_sqrt_dk": number is None}
        divisor = Sqrt(sym("d", "k")) if number is None else sym("c")
        formula = sym("T").head(head).eq(s.letter.head(head) / divisor)
        return ctx.emit(self, head, [s.ref], formula, result, s.shape, details)

    def intro(self, term, steps):
        by_sqrt = any(s.details.get("by_sqrt_dk", True) for s in steps)
        return Frac(term, Sqrt(sym("d", "k")) if by_sqrt else sym("c"), inline=True)

    def overflow_how(self, inputs, details) -> str:
        return f"{inputs[0]} divided by {details['factor']:.6g}"


SCALED = Scaled()
