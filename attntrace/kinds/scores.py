"""Relevance scores S = Q K^T: every query against every key."""

from __future__ import annotations

from attntrace.kinds.base import Kind, Mistake, Planting, formula_once, label
from attntrace.kinds.projection import kv_head
from attntrace.model.errors import BadInput
from attntrace.model.formula import sym


def _kv_heads(trace) -> int | None:
    """The number of key/value heads of a grouped-query trace (scores@i read K@j), else None."""
    js = {ref.partition("@")[2] for s in trace.steps if s.id == "scores" for ref in s.inputs if "@" in ref}
    return len(js) or None


def _kv_head_mapping(kind, trace) -> list[Planting]:
    """kv_head_mapping: query head i reads key/value head ((i-1) mod h_kv) + 1 instead of
    floor((i-1) / (h/h_kv)) + 1 (only told apart when h_kv >= 2 and h/h_kv >= 2)."""
    if not any(s.id in ("scores", "Z") for s in trace.steps):
        return []
    h, h_kv = trace.num_heads, _kv_heads(trace)
    if not h_kv or h_kv < 2 or h // h_kv < 2:
        return []
    return [Planting("kv_head_mapping", "scores", tuple((i - 1) % h_kv + 1 for i in range(1, h + 1)), steps=frozenset({"scores", "Z"}))]


def _rewire_kv(step, refs: tuple, planting) -> tuple:
    """kv_head_mapping: the key/value head j of `K@j`, `V_cache@j`, ... read by query head i
    replaced by the wrong one, planting.order[i - 1]."""
    if not planting.changes(step.id) or step.head is None:
        return refs
    wrong = planting.order[step.head - 1]
    return tuple(f"{r.partition('@')[0]}@{wrong}" if "@" in r else r for r in refs)


class Scores(Kind):
    pipeline, after = "head", ("V_cache",)
    id = "scores"
    reads, writes = ("Q", "K"), "S"
    starts = ("X", "QKV")
    letter, entry, symbol = "S", "s", "s"
    view, prose = "product", "attention"
    transposes_second = True
    attends = True
    mistakes = (Mistake("transposed_scores"), Mistake("no_transpose"),
                Mistake("kv_head_mapping", also=("Z",), plant=_kv_head_mapping, rewire=_rewire_kv))
    transposable = False  # the transposed scores are transposed_scores

    def carry(self, iv, step, args, mistake):
        """Q K^T; transposed_scores: K Q^T; no_transpose: Q K."""
        q, k = args
        if mistake == "transposed_scores":
            return iv.product(k, q.T)
        return iv.product(q, k) if mistake == "no_transpose" else iv.product(q, k.T)

    def compute(self, ctx, head, state):
        q, k = state["Q"], state["K"]
        result, shape = ctx.product(self.id, head, q, k, b_transposed=True)
        d_k = q.shape[1]  # the key width of this head: what sqrt(d_k) scales by
        if ctx.p.d_k is not None and ctx.p.d_k != d_k and ctx.p.scale is True:
            raise BadInput(f"d_k = {ctx.p.d_k} but the keys of {label('K', head)} are {d_k} wide")
        state["d_k"] = d_k
        j = kv_head(ctx.p, head)  # grouped-query attention: the key head this query head shares
        formula = formula_once((self.id, head, j, q.letter, k.letter), lambda: sym("S").head(head).eq(q.letter.head(head) * k.letter.head(j).T()))
        return ctx.emit(self, head, [q.ref, k.ref], formula, result, shape)


SCORES = Scores()
