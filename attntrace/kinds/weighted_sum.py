"""The weighted sum Z = A V: each output row mixes the rows of V with that row's weights."""

from __future__ import annotations

from attntrace.kinds.base import Kind
from attntrace.kinds.projection import kv_head
from attntrace.model.formula import sym


class WeightedSum(Kind):
    id = "Z"
    reads, writes = ("A", "V"), "Z"
    starts = ("X", "QKV", "scores", "weights")
    letter, entry, symbol = "Z", "z", "z"
    view, prose = "product", "weighted_sum"
    mistakes = ("values_first", "kv_head_mapping", "rope_rotated_values")

    def compute(self, ctx, head, state):
        a, v = state["A"], state.get("V")
        if v is None:  # a problem that stops at the weights
            return None
        result, shape = ctx.product(self.id, head, a, v)
        j = kv_head(ctx.p, head)  # grouped-query attention: the value head this query head shares
        formula = sym("Z").head(head).eq(sym("A").head(head) * v.letter.head(j))
        return ctx.emit(self, head, [a.ref, v.ref], formula, result, shape)


WEIGHTED_SUM = WeightedSum()
