"""Relevance scores S = Q K^T: every query against every key."""

from __future__ import annotations

from attntrace.kinds.base import Kind, label, plain_math, plain_sup, sup
from attntrace.kinds.projection import kv_head
from attntrace.model.errors import BadInput


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
        h = sup(head)
        j = kv_head(ctx.p, head)  # grouped-query attention: the key head this query head shares
        inner = "" if j is None else f"({j})"
        ph = plain_sup(head)
        return ctx.emit(self, head, [q.ref, k.ref], f"S{h} = {q.letter}{h} {k.letter}^{{{inner}\\top}}", f"S{ph} = {plain_math(q.letter)}{ph} {plain_math(k.letter)}{plain_sup(j)}^T", result, shape)


SCORES = Scores()
