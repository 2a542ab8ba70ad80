"""Attention sinks (gpt-oss): a learned logit per head that joins every softmax denominator.

Head h has one number s_h. It is appended to every row of the (masked) scores as one more
column, T-check = [T~ | s_h 1], and the softmax runs over that longer row; the sink's column is
then dropped, since it has no value to mix: a_ij = e^{t_ij} / (sum_k e^{t_ik} + e^{s_h}). A
query can so put weight on "nothing": its row of weights sums to 1 - pi_i, pi_i the sink's
share. That lets a head stay quiet without dumping its weight on the first token (the
"attention sink" Xiao et al. observed in StreamingLLM; gpt-oss learns it as a parameter, as
its model card describes). The row maximum of the stable softmax includes s_h.

Everything about the kind is here: its spec option `sinks = [s_1, ..., s_h]`, its place (after
the mask, before the weights), its computation (an algebra hstack), its formula, JSON field,
carry-forward rule (an exact copy of the student's scores with the logit appended) and its
mistake `sink_ignored` (the weights by the plain softmax of T~). The weights step
(attntrace.kinds.softmax) sees the extra column and keeps the first n_k columns of its
softmax; the checker's weights rule does the same (grading.mistakes).
"""

from __future__ import annotations

import numpy as np

from attntrace.inputs.numbers import real_number
from attntrace.inputs.options import SpecOption
from attntrace.kinds.base import Kind, Mistake
from attntrace.model.formula import Hcat, sym
from attntrace.model.errors import BadInput

#: The kinds here run only for a problem with attention sinks (`attntrace.kinds.registry` imports
#: this module only then).
RUNS_WITH = ("sinks",)


def _parse(value, reader):
    """`sinks = [s_1, ..., s_h]`: one finite logit per head (a single number for one head);
    exact strings ("1/2") stay exact. The online softmax and the backward pass are not traced
    with sinks."""
    items = value.tolist() if hasattr(value, "tolist") else value
    if not isinstance(items, (list, tuple)):
        items = [items]
    if len(items) != reader.num_heads:
        raise BadInput(f"sinks lists {len(items)} logits but there are {reader.num_heads} heads; give one per head")
    if reader.data.get("online") or reader.data.get("backward"):
        raise BadInput("sinks are traced in the forward pass with the whole softmax, not with online or backward")
    return tuple(real_number(x, "sinks", "a list of finite numbers, one per head", low=-1e300, high=1e300) for x in items)


SPEC_OPTIONS = (SpecOption("sinks", _parse, "one logit per head"),)


class Sink(Kind):
    id = "sink"
    pipeline, after, before = "head", ("masked",), ("weights",)
    reads, writes = ("S",), "S"
    starts = ("X", "QKV", "scores")
    letter, entry, symbol = sym("T", accent="check"), sym("t", accent="check"), None  # symbolic: keeps the t~ names and s
    symbols = ((sym("s"), "sink_logit", "scalar"),)
    view, prose = "sink", "sink"
    view_module = "sinkview"
    infinite_ok = True  # the masked scores it carries are -inf
    mistakes = (Mistake("sink_ignored", also=("weights",)),)

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and "sinks" in problem.extra

    def compute(self, ctx, head, state):
        t = state["S"]
        given = ctx.p.extra["sinks"][(head or 1) - 1]  # as the spec gave it (shape mode has no numbers)
        s = ctx.alg.number(given)
        rows, cols = t.shape
        result = ctx.alg.hstack([t.value, ctx.alg.constant((rows, 1), s)]) if t.value is not None else None
        formula = self.letter.head(head).eq(Hcat((t.letter.head(head), sym("s").head(head) * sym("1", style="bold"))))
        return ctx.emit(self, head, [t.ref], formula, result, (rows, cols + 1), {"sink": given, "logit": s, "keys": cols})

    def json_details(self, details):
        s = details["sink"]
        return {"sink": float(s) if isinstance(s, (int, float)) else str(s)}

    def overflow_how(self, inputs, details) -> str:
        return f"{inputs[0]} with the sink logit appended"

    # -- the checker ---------------------------------------------------------------------------
    def carry(self, iv, step, args, mistake):
        """[T~ | s 1]: the student's scores, exactly, with the logit appended. (sink_ignored
        changes the weights, whose rule then takes the softmax of T~ alone.)"""
        t = args[0]
        return iv.stack([t, iv.point(np.full((t.shape[0], 1), float(step.details["sink"])))], axis=1)

    def message_params(self, step) -> dict:
        return {"sink": float(step.details["sink"])}


SINK = Sink()
