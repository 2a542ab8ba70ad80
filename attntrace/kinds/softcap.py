"""Logit soft-capping (Gemma 2): the scores squashed into (-c, c) by T-bar = c tanh(T / c).

Gemma 2 (Gemma Team 2024, "Gemma 2: Improving Open Language Models at a Practical Size",
section 2.2) caps the attention logits at c = 50: a score t becomes c tanh(t / c), which is
about t while |t| is small against c and never reaches +-c, so no single key can take all the
weight however large its score. Hugging Face's Gemma2Attention does it after the scaling and
before the mask (attn_weights / softcap, tanh, * softcap), which is where this kind runs; the
spec says `softcap = c`.

Everything about the kind is here: its spec option, its place (after the scaling, before the
ALiBi or given bias and the mask), its computation through the algebra's divide, tanh and
times (one body for the four modes), its formula and entry form (the element-wise view),
the report's one-line formula, its JSON field, its carry-forward rule (c tanh(x / c) is
increasing, so an interval maps to the interval of its end points) and its mistake,
`softcap_not_divided`: c tanh(T), the division by c inside the tanh forgotten.
"""

from __future__ import annotations

import numpy as np

from attntrace.inputs.options import SpecOption
from attntrace.inputs.positional import positive_number
from attntrace.kinds.base import Kind, Mistake
from attntrace.model.formula import Frac, Func, Node, Value, sym

#: The kinds here run only for a problem with a soft cap (`attntrace.kinds.registry` imports
#: this module only then).
RUNS_WITH = ("softcap",)


def _parse(value, reader):
    """`softcap = c`: a positive number (an int, a float or an exact string); false: off."""
    if value is False:
        return None
    return positive_number(value, "softcap", "a positive number c (Gemma 2 caps the attention logits at 50)")


SPEC_OPTIONS = (SpecOption("softcap", _parse, "a positive number c"),)


def _capped(x, c) -> Node:
    """c tanh(x / c): the map of one entry, or of the matrix (x its name or a number's text)."""
    return c * Func("tanh", (Frac(x, c, inline=True, spaced=True),), sized=True)


class SoftCap(Kind):
    id = "softcap"
    pipeline, after, before = "head", ("scaled",), ("biased", "bias", "masked")
    reads, writes = ("S",), "S"
    starts = ("X", "QKV", "scores")
    letter, entry, symbol = sym("T", accent="bar"), sym("t", accent="bar"), "\\bar{t}"
    view, prose = "elementwise", "softcap"
    view_module = "elementview"
    symbols = ((sym("c"), "softcap_cap", "scalar"),)
    mistakes = (Mistake("softcap_not_divided", when=lambda steps: any(float(s.details["cap"]) != 1 for s in steps)),)

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and "softcap" in problem.extra

    def compute(self, ctx, head, state):
        t = state["S"]
        c = ctx.p.extra["softcap"]
        number = ctx.alg.number(c)
        result = ctx.alg.times(ctx.alg.tanh(ctx.alg.divide(t.value, number)), number)
        formula = self.letter.head(head).eq(_capped(t.letter.head(head), sym("c")))
        return ctx.emit(self, head, [t.ref], formula, result, t.shape, {"cap": c})

    # -- the report ----------------------------------------------------------------------------
    def entry_form(self, x: str, details) -> Node:
        """One entry of the map: c tanh(x / c) with the cap written out (x: the entry's name or number)."""
        return _capped(x, Value(details["cap"]))

    def view_numbers(self, details) -> dict:
        return {"cap": float(details["cap"])}

    def intro(self, term, steps):
        return _capped(term, sym("c"))

    def exact_work(self, problem, dims, named):
        """Exact mode: each capped score c tanh(t / c) is a transcendental that nothing merges,
        and the softmax after it carries e^(c tanh(...)) terms; measured on this machine (4 x 4 to
        10 x 10 scores, d_k = 4) about 80 units of work per score, rendering included."""
        return (2 if named else 80) * dims["n"] * dims["m"]

    def json_details(self, details):
        c = details["cap"]
        return {"softcap": c if isinstance(c, (int, float)) else str(c)}

    def overflow_how(self, inputs, details) -> str:
        c = details["cap"]
        return f"{inputs[0]} soft-capped at {int(c) if isinstance(c, float) and c == int(c) else c}"

    # -- the checker ---------------------------------------------------------------------------
    def carry(self, iv, step, args, mistake):
        """c tanh(x / c), or c tanh(x) for softcap_not_divided: both increasing in x."""
        c = float(step.details["cap"])
        inner = 1.0 if mistake == "softcap_not_divided" else c
        return iv.monotone(args[0], lambda x: c * np.tanh(x / inner))

    def message_params(self, step) -> dict:
        return {"cap": float(step.details["cap"])}

    def trace_params(self, steps) -> dict:
        """The cap c, for the sentence of softcap_not_divided wherever it is diagnosed (the
        weights after the capped scores, when those were not written)."""
        return {"cap": float(steps[0].details["cap"])}


SOFTCAP = SoftCap()
