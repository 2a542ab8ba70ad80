"""Projections Q = X W_Q + b_Q, K = X W_K (+ b_K), V = X W_V (+ b_V).

In cross-attention the keys and values project the second sequence X_kv.

Full width, then heads (as PyTorch's `in_proj` and Hugging Face's `q_proj`): when the spec
gives W_Q at full width (d_model, h d_k) with `num_heads`, Q = X W_Q + b_Q is computed ONCE,
and the step Q@i is column block i of it (a view in numeric mode, no copy). One BLAS product
instead of h products of strided slices; the value of each block is the same as the per-head
product X W_Q^(i) + b_Q^(i), and the trace records only the per-head steps Q@i, K@i, V@i (the
JSON contract): the full-width product has no step of its own, since every one of its columns
is shown in exactly one head's step. Heads given one by one (`heads = [...]`) are projected
one by one.

Grouped-query attention (`num_kv_heads = h_kv`, MQA when 1): W_K and W_V are (d_model,
h_kv d_k); query head i (1-based) uses key/value head j = floor((i - 1) / (h / h_kv)) + 1, the
order of `repeat_interleave` in SDPA's enable_gqa and Hugging Face's repeat_kv. K@j and V@j
are computed once, in the pipeline of the first query head that uses them, and carry
head = j; the later query heads of the group reuse them. In such a trace the steps that read
them name them with their head: scores@i has inputs ("Q", "K@j") and Z@i ("weights", "V@j").
"""

from __future__ import annotations

import math

import numpy as np

from attntrace.kinds.base import Flow, Kind, Mistake, Planting, formula_once, label
from attntrace.kinds.context import check_finite, sum_finite
from attntrace.model.formula import Word, sym


def kv_head(problem, head: int | None) -> int | None:
    """The key/value head that query head `head` reads (repeat_interleave order); `head` itself
    without grouped-query attention, None in a single-head trace."""
    h_kv = problem.extra.get("num_kv_heads")
    if head is None or h_kv is None:
        return head
    return (head - 1) // (len(problem.heads) // h_kv) + 1


def kv_groups(problem) -> tuple[int, ...] | None:
    """Grouped-query attention: the key/value head of each query head, (1, 1, 2, 2); else None."""
    if problem.extra.get("num_kv_heads") is None:
        return None
    return tuple(kv_head(problem, i) for i in range(1, len(problem.heads) + 1))


def kv_ref(problem, name: str, head: int | None) -> str:
    """How a step reading the keys or values of query head `head` names them: K, or K@j when
    the heads share keys and values (grouped-query attention)."""
    if problem.extra.get("num_kv_heads") is None or head is None:
        return name
    return f"{name}@{kv_head(problem, head)}"


def _same_weights(kind, trace) -> list[Planting]:
    """same_weights: Q, K or V computed with another projection's weights, each pair in turn."""
    ids, names = {s.id for s in trace.steps}, {o.name for o in trace.operands}
    return [Planting("same_weights", s, swap=((f"W_{s}", other),), steps=frozenset({s}))
            for s in ("Q", "K", "V") for other in (f"W_{t}" for t in ("Q", "K", "V") if t != s)
            if s in ids and f"W_{s}" in names and other in names]


def _kv_from_queries(kind, trace) -> list[Planting]:
    """kv_from_queries: cross-attention's K and V projected from X instead of X_kv."""
    if any(o.name == "X_kv" for o in trace.operands) and any(s.id == "K" for s in trace.steps):
        return [Planting("kv_from_queries", "K", swap=(("X_kv", "X"),), steps=frozenset({"K", "V"}))]
    return []


SAME_WEIGHTS = Mistake("same_weights", also=("K", "V"), plant=_same_weights)
KV_FROM_QUERIES = Mistake("kv_from_queries", also=("V",), plant=_kv_from_queries)


def project(iv, x, w, bias=None):
    """X W (+ b) over intervals (the checker's rule of a projection; Impossible when the shapes do not fit)."""
    r = iv.product(x, w)
    if bias is not None:
        if bias.shape[1] != r.shape[1]:
            raise iv.Impossible()
        r = iv.add(r, bias)
    return r


class Projection(Kind):
    pipeline = "head"
    view = "product"
    prose = "projection"
    explained_by_prose = True
    starts = ("X",)
    full_width_answer = True

    def __init__(self, which: str):
        self.which = which
        self.id = self.letter = self.writes = which
        self.entry = self.symbol = which.lower()
        self.reads = ("X", f"W_{which}")
        self.after = {"Q": (), "K": ("Q",), "V": ("K",)}[which]
        self.mistakes = {"Q": (SAME_WEIGHTS,), "K": (SAME_WEIGHTS, KV_FROM_QUERIES), "V": (SAME_WEIGHTS, "kv_from_queries")}[which]

    def report_params(self, steps):
        return {"has_projections": True}

    def carry(self, iv, step, args, mistake):
        """X W (+ b) from the student's values (same_weights, kv_from_queries: the checker
        reads the other input, `Planting.swap`)."""
        return project(iv, args[0], args[1], args[2] if len(args) > 2 else None)

    def source(self, ctx) -> str:
        return "X_kv" if self.which in ("K", "V") and "X_kv" in ctx.p.shared else "X"

    def compute(self, ctx, head, state):
        w_name, b_name = f"W_{self.which}", f"b_{self.which}"
        shared_kv = self.which in ("K", "V") and "num_kv_heads" in ctx.p.extra
        own = kv_head(ctx.p, head) if self.which in ("K", "V") else head  # the head this step belongs to
        made = ctx.cache.setdefault(f"projection {self.which}", {})
        if own in made:  # a key/value head shared by several query heads: computed once
            return made[own]
        src = self.source(ctx)
        x = ctx.source(src)  # the operand, or the block's X-tilde = X + P / pre-LN norm (attntrace.kinds.block)
        w_op, bias = state[w_name], state.get(b_name)
        full = ctx.p.extra.get("full_width") or {}
        checked = w_name in full
        if checked:
            result, shape = self._block(ctx, head, own, x, full[w_name], full.get(b_name), w_op.shape[1], made)
        else:
            result, shape = ctx.product(self.id, head, x, ctx.operand(w_op))
            result = ctx.add_bias(self.id, head, result, shape, bias)
        inputs = [x.ref, w_name] + ([b_name] if bias else [])
        formula = formula_once((self.id, own, x.letter, src, bias is not None),
                               lambda: self._formula(own, x.letter, src == "X_kv", bias is not None))
        details = {"bias": bias.name} if bias else {}
        if shared_kv:
            details["query_heads"] = tuple(i for i in range(1, len(ctx.p.heads) + 1) if kv_head(ctx.p, i) == own)
        flow = ctx.emit(self, own, inputs, formula, result, shape, details or None, checked=checked)
        if shared_kv:
            flow.ref = f"{self.which}@{own}"
        if checked:  # a block of the full-width product: bounded by the product's norm
            flow.norm = made.get("norm")
        made[own] = flow
        return flow

    def _formula(self, own, letter, kv: bool, bias: bool):
        """Q^(i) = X W_Q^(i) (+ b_Q^(i)); X_kv for the keys and values of cross-attention."""
        product = (sym("X", Word("kv", roman=True)) if kv else letter) * sym("W", self.which).head(own)
        return sym(self.which).head(own).eq(product + sym("b", self.which).head(own) if bias else product)

    def _block(self, ctx, head, own, x: Flow, w_full, b_full, width: int, made: dict):
        """Block `own` (1-based) of the full-width product X W (+ b), computed on first use."""
        if "full" not in made:
            w = ctx.operand(w_full)
            result, shape = ctx.product(self.id, head, x, w)
            made["full"] = ctx.add_bias(self.id, head, result, shape, b_full)
            if ctx.numeric:
                how = self.overflow_how([x.ref, w_full.name] + ([b_full.name] if b_full else []), {})
                made["norm"] = _check_blocks(made["full"], width, self.id, how)
        first = (own - 1) * width
        return ctx.alg.columns(made["full"], first, first + width), (x.shape[0], width)

    def json_details(self, details):
        """Grouped-query attention: the query heads that read this key/value head."""
        return {"query_heads": list(details["query_heads"])} if "query_heads" in details else {}


def _check_blocks(full, width: int, step: str, how: str) -> float | None:
    """Overflow of a full-width product, checked in one pass over it: the sum of its squares
    (a BLAS dot), finite only when every entry is. Returns the product's Frobenius norm, which
    bounds every head's block (`Flow.norm`), or None when the squares overflow (entries beyond
    1e154): then the sum decides, and when it overflowed, the message names the first head
    (key/value head in grouped-query attention) whose block did, and the entry within that
    block, as a per-head product would have."""
    squares = float(np.vdot(full, full))
    if math.isfinite(squares):
        return math.sqrt(squares)
    if sum_finite(full):
        return None
    for i in range(full.shape[1] // width):
        check_finite(full[:, i * width:(i + 1) * width], label(step, i + 1), how)
    return None


Q, K, V = Projection("Q"), Projection("K"), Projection("V")
