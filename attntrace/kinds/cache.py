"""KV-cache decoding: K_cache = [K_past; K], V_cache = [V_past; V].

When a decoder generates token t, the keys and values of tokens 1..t-1 do not change (under
the causal mask no earlier key or value depends on a later token), so they are kept: the spec gives them as
`K_past` and `V_past` (per head, after RoPE when the model uses it, as Hugging Face's
DynamicCache stores them). The new token's projections K and V (one row each, or a few for
a chunk) are appended below them, and attention proceeds unchanged with Q (the new token's
query) against every cached key: S = Q K_cache^T is 1 x t. These kinds run after the
projections (and RoPE) and before the scores; they replace the head's K and V in the state,
so the scores, the softmax and Z = A V_cache are the existing kinds, untouched.

The new token is the last position, so it sees every cached key: no mask is needed for one
token. A chunk of several new tokens needs the bottom-right causal mask (each new token sees
the cache and the new tokens up to itself); the top-left "causal" mask would hide the cache
from the new tokens (the classic decoding bug), so both are said in one line.

With grouped-query attention (`num_kv_heads`) the cache belongs to a key/value head: it is
appended once, in the first query head of its group, and the other heads of the group read it.
"""

from __future__ import annotations

from typing import Any

from attntrace.kinds.base import Kind, Mistake, label
from attntrace.kinds.projection import kv_head
from attntrace.model.errors import BadInput
from attntrace.model.formula import Stack, Word, sym

#: The kinds here run only for a problem with a KV cache (past keys or values: `attntrace.kinds.registry`
#: imports this module only then).
RUNS_WITH = ("K_past", "V_past")

#: The past keys and values a spec gives (notation: name -> symbol, base name of the entries).
OPERANDS = {"K_past": (sym("K", Word("past")), "k^{p}"), "V_past": (sym("V", Word("past")), "v^{p}")}


def has_cache(problem) -> bool:
    return any("K_past" in ops or "V_past" in ops for ops in problem.heads)


class CacheAppend(Kind):
    """K_cache or V_cache: the past rows, then the new token's row(s)."""

    per_head = True
    pipeline = "head"
    starts = ("X", "QKV")
    symbol = None  # keeps the stacked entries: the past ones and the new token's own names
    view, prose = "cache", "cache"
    view_module = "cacheview"

    def __init__(self, which: str):
        self.which = which
        self.id = f"{which}_cache"
        self.after = ("K_rope",) if which == "K" else ("K_cache",)
        #: the new token's K, V not appended: it attends to K_past / V_past only
        self.mistakes = (Mistake("cache_not_appended", also=("V_cache",)),) if which == "K" else ("cache_not_appended",)
        self.reads, self.writes = (which,), which
        self.letter = sym(which, Word("cache"))
        self.entry = sym(which.lower(), sup="c")

    def enabled(self, problem) -> bool:
        if not has_cache(problem):
            return False
        if problem.start not in self.starts:
            raise BadInput(f"K_past and V_past (a KV cache) need the new token's X or Q, K, V, not a trace that starts at {problem.start}")
        if "X_kv" in problem.shared:
            raise BadInput("a KV cache holds the keys and values of the same sequence; cross-attention (X_kv) has none")
        _check_rope_positions(problem)
        return True

    def compute(self, ctx, head, state):
        p, w = ctx.p, self.which
        past_name = f"{w}_past"
        past, new = state.get(past_name), state.get(w)
        if past is None or state.get(f"{'V' if w == 'K' else 'K'}_past") is None:
            raise BadInput("K_past and V_past (the KV cache) must be given together")
        if new is None:
            return None
        own = kv_head(p, head)
        memo = ctx.cache.setdefault("kv cache", {})  # what the tracer keeps across the heads
        if (self.id, own) in memo:  # grouped-query attention: this key/value head's cache is made
            return memo[(self.id, own)]
        old = ctx.operand(past)
        if w == "K":
            _check_chunk(p, head, state, old.shape[0])
        if old.shape[1] != new.shape[1]:
            raise BadInput(f"step {label(self.id, own)}: cannot append {new.ref} {new.shape} to {past_name} {old.shape}: "
                           f"{new.shape[1]} != {old.shape[1]} columns")
        if w == "V" and state.get("K") is not None and old.shape[0] != state["K"].shape[0] - new.shape[0]:
            raise BadInput(f"K_past has {state['K'].shape[0] - new.shape[0]} rows but V_past has {old.shape[0]}; "
                           "the cache holds one key and one value per past token")
        result = ctx.alg.vstack([old.value, new.value])
        shape = (old.shape[0] + new.shape[0], old.shape[1])
        formula = self.letter.head(own).eq(Stack((sym(w, Word("past")).head(own), new.letter.head(own))))
        details = {"past_rows": old.shape[0], "new_rows": new.shape[0]}
        shared_kv = (p.extra or {}).get("num_kv_heads") is not None and own is not None
        if shared_kv:  # the query heads that read it: the report shows it with the first of them
            details["query_heads"] = tuple(i for i in range(1, len(p.heads) + 1) if kv_head(p, i) == own)
        flow = ctx.emit(self, own, [past_name, new.ref], formula, result, shape, details)
        if shared_kv:
            flow.ref = f"{self.id}@{own}"  # read by a group of query heads: named with its head, as K@j
        memo[(self.id, own)] = flow
        return flow

    def json_details(self, details) -> dict[str, Any]:
        return {"past_rows": details.get("past_rows"), "new_rows": details.get("new_rows")}

    def carry(self, iv, step, args, mistake):
        """The past rows, then the student's new rows; cache_not_appended: the past rows alone."""
        past, new = args
        if mistake == "cache_not_appended":
            return past
        if past.shape[1] != new.shape[1]:
            raise iv.Impossible()
        return iv.stack([past, new], axis=0)


def _check_rope_positions(p) -> None:
    """With RoPE the new tokens sit after the cached ones: positions P, P + 1, ... must be
    given (the default 0, 1, ... would rotate the new token as if it were the first)."""
    rope = (p.extra or {}).get("rope")
    if not rope:
        return
    past = next((ops["K_past"].shape[0] for ops in p.heads if "K_past" in ops), 0)
    new = p.shared["X"].shape[0] if "X" in p.shared else p.heads[0]["Q"].shape[0]
    want = list(range(past, past + new))
    if list(rope.get("positions") or ()) != want:
        raise BadInput(f"with a KV cache of {past} tokens, RoPE needs the new tokens' positions: rope.positions = {want}")


def _check_chunk(p, head, state, past_rows: int) -> None:
    """One new token needs no mask; a chunk needs the bottom-right one (said in one line)."""
    from attntrace.kinds.mask import mask_kind

    kind = mask_kind(p.mask)
    new_rows = state["Q"].shape[0] if state.get("Q") is not None else 1
    if kind == "causal":
        raise BadInput("mask = \"causal\" (top-left) with a KV cache would hide the cached keys from the new token; "
                       "use mask = \"causal_bottom_right\" (or no mask for one new token)")
    if new_rows > 1 and kind is None:
        raise BadInput(f"{new_rows} new tokens with a KV cache of {past_rows}: give mask = \"causal_bottom_right\" "
                       "so that each new token sees the cache and the new tokens up to itself")


K_CACHE, V_CACHE = CacheAppend("K"), CacheAppend("V")
