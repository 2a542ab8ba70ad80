"""Scaling T = S / sqrt(d_k) (or by a given constant c)."""

from __future__ import annotations

import math

from attntrace.kinds.base import Kind, Mistake, Planting, Symbol, formula_once
from attntrace.model.errors import BadInput
from attntrace.model.formula import Frac, Sqrt, sym


def _by_sqrt_dk(steps) -> bool:
    """Whether the trace's (first) scaling divides by sqrt(d_k), so d_k can be mistaken."""
    return bool(steps[0].details.get("by_sqrt_dk") and steps[0].details.get("d_k"))


def _with_d_model(code: str):
    """A mistake that divides by a number made of d_model (the width of X): planted only when
    the scaling is by sqrt(d_k) and X is in the trace."""
    def plant(kind, trace) -> list[Planting]:
        steps = [s for s in trace.steps if s.id == kind.id]
        x = next((o for o in trace.operands if o.name == "X" and o.head is None), None)
        if not steps or not _by_sqrt_dk(steps) or x is None:
            return []
        return [Planting(code, kind.id, numbers={"d_model": x.value.shape[1]})]
    return plant


class Scaled(Kind):
    pipeline, after = "head", ("scores",)
    id = "scaled"
    reads, writes = ("S",), "S"
    starts = ("X", "QKV", "scores")
    letter, entry, symbol = "T", "t", "t"
    view, prose = "scaled", "scaled"
    mistakes = (Mistake("missing_scale"), Mistake("scaled_by_dk", when=_by_sqrt_dk),
                Mistake("wrong_dk", plant=_with_d_model("wrong_dk")), Mistake("scaled_by_dmodel", plant=_with_d_model("scaled_by_dmodel")))

    def report_params(self, steps):
        """Whether the scores are divided by sqrt(d_k) or by a number the spec gives (`scale_given`), and each head's d_k."""
        return {"scaled": True, "by_sqrt": any(s.details.get("by_sqrt_dk", True) for s in steps),
                "scale_given": any(s.details.get("by_sqrt_dk") is False for s in steps),
                "d_k": ", ".join(sorted({str(s.details["d_k"]) for s in steps if s.details.get("d_k") is not None}))}

    def carry(self, iv, step, args, mistake):
        """S / factor; missing_scale: 1; scaled_by_dk: d_k; wrong_dk: sqrt(d_model); scaled_by_dmodel: d_model."""
        factor = float(step.details["factor"])
        if mistake == "missing_scale":
            factor = 1.0
        elif mistake == "scaled_by_dk":
            factor = float(step.details.get("d_k"))
        elif mistake == "wrong_dk":
            factor = math.sqrt(mistake.numbers["d_model"] or 1)
        elif mistake == "scaled_by_dmodel":
            factor = float(mistake.numbers["d_model"])
        return iv.divide(args[0], factor)

    def trace_params(self, steps):
        """d_k, the factor and whether it is sqrt(d_k), which many sentences quote."""
        det = steps[0].details
        return {"d_k": det.get("d_k"), "factor": float(det["factor"]) if det.get("factor") is not None else None,
                "by_sqrt_dk": bool(det.get("by_sqrt_dk"))}

    def notation(self, step):
        return super().notation(step) + ([Symbol(sym("d", "k"), "d_k", "scalar")] if step.details.get("by_sqrt_dk") else [])

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
        formula = formula_once((self.id, head, s.letter, number is None),
                               lambda: sym("T").head(head).eq(s.letter.head(head) / (Sqrt(sym("d", "k")) if number is None else sym("c"))))
        return ctx.emit(self, head, [s.ref], formula, result, s.shape, details)

    def intro(self, term, steps):
        by_sqrt = any(s.details.get("by_sqrt_dk", True) for s in steps)
        return Frac(term, Sqrt(sym("d", "k")) if by_sqrt else sym("c"), inline=True)

    def overflow_how(self, inputs, details) -> str:
        return f"{inputs[0]} divided by {details['factor']:.6g}"


SCALED = Scaled()
