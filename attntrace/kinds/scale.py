"""Scaling T = S / sqrt(d_k) (or by a given constant c)."""

from __future__ import annotations

from attntrace.kinds.base import Kind, plain_sup, sup
from attntrace.model.errors import BadInput


class Scaled(Kind):
    pipeline, after = "head", ("scores",)
    id = "scaled"
    reads, writes = ("S",), "S"
    starts = ("X", "QKV", "scores")
    letter, entry, symbol = "T", "t", "t"
    view, prose = "scaled", "scaled"
    mistakes = ("missing_scale", "scaled_by_dk", "wrong_dk", "scaled_by_dmodel")

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
        h, ph = sup(head), plain_sup(head)
        divisor, plain_divisor = ("\\sqrt{d_k}", "sqrt(d_k)") if number is None else ("c", "c")
        return ctx.emit(self, head, [s.ref], f"T{h} = \\frac{{{s.letter}{h}}}{{{divisor}}}",
                        f"T{ph} = {s.letter}{ph} / {plain_divisor}", result, s.shape, details)

    def intro(self, tex, plain, steps):
        if any(s.details.get("by_sqrt_dk", True) for s in steps):
            return tex + "/\\sqrt{d_k}", plain + " / sqrt(d_k)"
        return tex + "/c", plain + " / c"

    def overflow_how(self, inputs, details) -> str:
        return f"{inputs[0]} divided by {details['factor']:.6g}"


SCALED = Scaled()
