"""The weighted sum Z = A V: each output row mixes the rows of V with that row's weights."""

from __future__ import annotations

from attntrace.kinds.base import Kind, Mistake, Planting, formula_once
from attntrace.kinds.projection import kv_head
from attntrace.model.formula import sym


def _rotated_values(kind, trace) -> list[Planting]:
    """rope_rotated_values, where the keys were rotated (so V has their positions): the
    rotation of each key/value head's K_rope is what V would have been turned by."""
    if not any(s.id == "Z" for s in trace.steps):
        return []
    turns = {s.head: s.details for s in trace.steps if s.id == "K_rope"}
    return [Planting("rope_rotated_values", "Z", steps=frozenset({"Z"}), numbers={"K_rope": turns})] if turns else []


class WeightedSum(Kind):
    id = "Z"
    reads, writes = ("A", "V"), "Z"
    starts = ("X", "QKV", "scores", "weights")
    letter, entry, symbol = "Z", "z", "z"
    view, prose = "product", "attention"
    attends = True
    full_width_answer = True
    mistakes = (Mistake("values_first"), "kv_head_mapping", Mistake("rope_rotated_values", plant=_rotated_values))

    def carry(self, iv, step, args, mistake):
        """A V; values_first: V A; rope_rotated_values: V turned as the keys it belongs to were
        (K_rope of the same key/value head: its positions, layout and base), which RoPE never does."""
        a, v = args
        if mistake == "rope_rotated_values":
            ref = step.inputs[1] if len(step.inputs) > 1 else "V"
            head = int(ref.partition("@")[2]) if "@" in ref else step.head
            det = mistake.numbers["K_rope"].get(head)
            if det is None:
                raise iv.Impossible()
            from attntrace.kinds.rope import rotate_rows  # the checker, after a trace with RoPE

            v = rotate_rows(iv, v, det, det["layout"], [float(p) for p in det["positions"]])
        return iv.product(v, a) if mistake == "values_first" else iv.product(a, v)

    def compute(self, ctx, head, state):
        a, v = state["A"], state.get("V")
        if v is None:  # a problem that stops at the weights
            return None
        result, shape = ctx.product(self.id, head, a, v)
        j = kv_head(ctx.p, head)  # grouped-query attention: the value head this query head shares
        formula = formula_once((self.id, head, j, v.letter), lambda: sym("Z").head(head).eq(sym("A").head(head) * v.letter.head(j)))
        return ctx.emit(self, head, [a.ref, v.ref], formula, result, shape)


WEIGHTED_SUM = WeightedSum()
