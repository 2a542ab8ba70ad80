"""ALiBi (Press et al., "Train Short, Test Long"): a linear bias by distance, T-hat = T + B.

Head h adds b_ij = -lambda_h (i - j) to its (scaled) scores: each step back in the sequence costs
lambda_h, so the head prefers near keys, more strongly the larger its slope. The slopes are the
paper's geometric sequence 2^(-8/H), 2^(-16/H), ..., 2^(-8) for H heads (a power of 2), with
the paper's rule for other head counts (`attntrace.inputs.positional.paper_slopes`), or given
one per head. The bias comes after the scaling and before the mask: the entries j > i that it
makes positive are the ones a causal mask removes. Bloom's variant adds lambda_h j instead, which
differs per row by the constant lambda_h i and so gives the same weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attntrace.inputs.options import SpecOption
from attntrace.inputs.positional import check_positional, paper_slopes, parse_alibi
from attntrace.model.errors import BadInput
from attntrace.kinds.base import Kind, Mistake
from attntrace.model.formula import Paren, Parts, Space, sym

#: The kinds here run only for a problem with the spec's alibi (`attntrace.kinds.registry` imports
#: this module only then).
RUNS_WITH = ("alibi",)

if TYPE_CHECKING:  # fractions is imported where a slope is made (ALiBi specs only)
    from fractions import Fraction


def _check(problem) -> None:
    """One slope per head, a step that has scores, and no second bias (attn_bias)."""
    if "attn_bias" in problem.extra:
        raise BadInput("give alibi or attn_bias, not both: each adds its own B to the scores")
    check_positional({"alibi": problem.extra["alibi"]}, problem.start, problem.heads, problem.shared)


#: `alibi = true` (the paper's slopes) or {slopes = [...]}, one per head.
SPEC_OPTIONS = (SpecOption("alibi", lambda value, reader: parse_alibi(value), "true or {slopes = [...]}", check=_check),)


class Biased(Kind):
    pipeline, after = "head", ("scaled",)
    id = "biased"
    reads, writes = ("S",), "S"
    starts = ("X", "QKV", "scores")
    letter, entry = sym("T", accent="hat"), sym("t", accent="hat")
    view, prose = "alibi", "alibi"
    view_module = "alibiview"
    #: the bias +m (i - j) instead of -m (i - j): keys further back scored higher
    mistakes = (Mistake("alibi_slope_sign"),)
    meaning = "biased"
    symbols = ((sym("lambda"), "alibi_slope", "scalar"), (sym("B"), "score_bias", "step"))

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and "alibi" in problem.extra

    def compute(self, ctx, head, state):
        t = state["S"]
        given = ctx.p.extra["alibi"]["slopes"]
        k = (head or 1) - 1
        if given is None:
            exponent = paper_slopes(len(ctx.p.heads))[k]
            slope = ctx.alg.pow2(exponent)
        else:
            exponent, slope = None, ctx.alg.number(given[k])
        rows, cols = t.shape
        offset = query_offset(ctx.p, rows, cols)
        bias = ctx.alg.distance_bias(slope, rows, cols, offset)
        result = ctx.alg.plus(t.value, bias)
        details = {"slope": slope, "exponent": exponent, "bias": bias, "heads": len(ctx.p.heads), "head_index": k + 1, "offset": offset}
        i = sym("i") + offset if offset else sym("i")
        slope = -sym("lambda").head(head)
        formula = Parts((self.letter.head(head).eq(t.letter.head(head) + sym("B").head(head)),
                         sym("b").head(head).at("i", "j").eq(slope * Space() * Paren(i - sym("j")))))
        return ctx.emit(self, head, [t.ref], formula, result, t.shape, details)

    def json_details(self, details):
        slope = details["slope"]
        out = {"slope": None if slope is None else float(slope)}
        if details.get("exponent") is not None:
            e: Fraction = details["exponent"]
            out["slope_exact"] = f"2^(-{e.numerator}/{e.denominator})" if e.denominator != 1 else f"2^(-{e.numerator})"
        return {"alibi": out}

    def intro(self, term, steps):
        return term + sym("B")

    def overflow_how(self, inputs, details) -> str:
        return f"{inputs[0]} plus the ALiBi bias"

    def report_params(self, steps):
        return {"alibi": True}

    def carry(self, iv, step, args, mistake):
        """T + B from the student's T (B depends on nothing they wrote); alibi_slope_sign: T - B."""
        bias = iv.floats(step.details["bias"])
        if mistake == "alibi_slope_sign":
            bias = -bias
        if bias.shape != args[0].shape:
            raise iv.Impossible()
        return iv.add(args[0], iv.point(bias))


def query_offset(problem, rows: int, cols: int) -> int:
    """Where the queries sit among the keys: 0 (query i at position i), or S - L when the L
    queries are the last of S positions (a KV cache, or the bottom-right causal mask). The
    weights do not depend on it (it shifts a row by a constant); the biased scores do."""
    from attntrace.kinds.cache import has_cache

    bottom_right = isinstance(problem.mask, str) and problem.mask == "causal_bottom_right"
    return cols - rows if cols > rows and (bottom_right or has_cache(problem)) else 0


BIASED = Biased()
