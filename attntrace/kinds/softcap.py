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
from attntrace.kinds.base import Kind, Mistake, plain_math, plain_sup, sup


def _parse(value, reader):
    """`softcap = c`: a positive number (an int, a float or an exact string); false: off."""
    if value is False:
        return None
    return positive_number(value, "softcap", "a positive number c (Gemma 2 caps the attention logits at 50)")


SPEC_OPTIONS = (SpecOption("softcap", _parse, "a positive number c"),)


def _number_text(c, plain: bool) -> str:
    """The cap as the spec gave it: 50, 2.5, 1/2 (an exact string's SymPy number)."""
    if isinstance(c, float) and c == int(c):
        return str(int(c))
    if isinstance(c, (int, float)):
        return repr(c)
    if plain:
        return str(c)
    import sympy

    return sympy.latex(c)


class SoftCap(Kind):
    id = "softcap"
    pipeline, after, before = "head", ("scaled",), ("biased", "bias", "masked")
    reads, writes = ("S",), "S"
    starts = ("X", "QKV", "scores")
    letter, plain_letter, entry, symbol = "\\bar{T}", "Tbar", "\\bar{t}", "\\bar{t}"
    view, prose = "elementwise", "softcap"
    mistakes = (Mistake("softcap_not_divided", when=lambda steps: any(float(s.details["cap"]) != 1 for s in steps)),)

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and "softcap" in problem.extra

    def compute(self, ctx, head, state):
        t = state["S"]
        c = ctx.p.extra["softcap"]
        number = ctx.alg.number(c)
        result = ctx.alg.times(ctx.alg.tanh(ctx.alg.divide(t.value, number)), number)
        h, ph = sup(head), plain_sup(head)
        formula = f"\\bar{{T}}{h} = c \\tanh\\left({t.letter}{h} / c\\right)"
        plain = f"Tbar{ph} = c tanh({plain_math(t.letter)}{ph} / c)"
        details = {"cap": c, "cap_tex": _number_text(c, False), "cap_plain": _number_text(c, True)}
        return ctx.emit(self, head, [t.ref], formula, plain, result, t.shape, details)

    # -- the report ----------------------------------------------------------------------------
    def entry_form(self, x: str, details, plain: bool) -> str:
        """One entry of the map: c tanh(x / c) with the cap written out."""
        if plain:
            c = details["cap_plain"]
            return f"{c} tanh({x} / {c})"
        c = details["cap_tex"]
        return f"{c} \\tanh\\left({x} / {c}\\right)"

    def view_numbers(self, details) -> dict:
        return {"cap": float(details["cap"])}

    def intro(self, tex, plain, steps):
        return f"c \\tanh\\left({tex} / c\\right)", f"c tanh({plain} / c)"

    def exact_work(self, problem, dims, named):
        """Exact mode: each capped score c tanh(t / c) is a transcendental that nothing merges,
        and the softmax after it carries e^(c tanh(...)) terms; measured on this machine (4 x 4 to
        10 x 10 scores, d_k = 4) about 80 units of work per score, rendering included."""
        return (2 if named else 80) * dims["n"] * dims["m"]

    def json_details(self, details):
        c = details["cap"]
        return {"softcap": c if isinstance(c, (int, float)) else str(c)}

    def overflow_how(self, inputs, details) -> str:
        return f"{inputs[0]} soft-capped at {details['cap_plain']}"

    # -- the checker ---------------------------------------------------------------------------
    def carry(self, iv, step, args, mistake):
        """c tanh(x / c), or c tanh(x) for softcap_not_divided: both increasing in x."""
        c = float(step.details["cap"])
        inner = 1.0 if mistake == "softcap_not_divided" else c
        return iv.monotone(args[0], lambda x: c * np.tanh(x / inner))

    def message_params(self, step) -> dict:
        return {"cap": float(step.details["cap"])}


SOFTCAP = SoftCap()
