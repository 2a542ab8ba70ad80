"""Relevance scores S = Q K^T: every query against every key."""

from __future__ import annotations

from attntrace.kinds.base import Kind, label
from attntrace.kinds.projection import kv_head
from attntrace.model.errors import BadInput
from attntrace.model.formula import sym


class Scores(Kind):
    pipeline, after = "head", ("V_cache",)
    id = "scores"
    reads, writes = ("Q", "K"), "S"
    starts = ("X", "QKV")
    letter, entry, symbol = "S", "s", "s"
    view, prose = "product", "scores"
    mistakes = ("transposed_scores", "no_transpose", "kv_head_mapping")

    def compute(self, ctx, head, state):
        q, k = state["Q"], state["K"]
        result, shape = ctx.product(self.id, head, q, k, b_transposed=True)
        d_k = q.shape[1]  # the key width of this head: what sqrt(d_k) scales by
        if ctx.p.d_k is not None and ctx.p.d_k != d_k and ctx.p.scale is True:
            raise BadInput(f"d_k = {ctx.p.d_k} but the keys of {label('K', head)} are {d_k} wide")
        state["d_k"] = d_k
        j = kv_head(ctx.p, head)  # grouped-query attention: the key head this query head shares
        formula = sym("S").head(head).eq(q.letter.head(head) * k.letter.head(j).T())
        return ctx.emit(self, head, [q.ref, k.ref], formula, result, shape)


SCORES = Scores()
