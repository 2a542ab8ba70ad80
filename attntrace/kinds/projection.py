"""Projections Q = X W_Q + b_Q, K = X W_K (+ b_K), V = X W_V (+ b_V).

In cross-attention the keys and values project the second sequence X_kv.
"""

from __future__ import annotations

from attntrace.kinds.base import Flow, Kind, plain_sup, sup


class Projection(Kind):
    view = "product"
    prose = "projection"
    mistakes = ("same_weights", "kv_from_queries")
    starts = ("X",)

    def __init__(self, which: str):
        self.which = which
        self.id = self.letter = self.writes = which
        self.entry = self.symbol = which.lower()
        self.reads = ("X", f"W_{which}")

    def source(self, ctx) -> str:
        return "X_kv" if self.which in ("K", "V") and "X_kv" in ctx.p.shared else "X"

    def compute(self, ctx, head, state):
        w_name, b_name = f"W_{self.which}", f"b_{self.which}"
        src = self.source(ctx)
        x, w = ctx.operand(ctx.p.shared[src]), ctx.operand(state[w_name])
        result, shape = ctx.product(self.id, head, x, w)
        bias = state.get(b_name)
        result = ctx.add_bias(self.id, head, result, shape, bias)
        inputs = [src, w_name] + ([b_name] if bias else [])
        h, ph = sup(head), plain_sup(head)
        src_tex = "X_{kv}" if src == "X_kv" else "X"
        formula = f"{self.which}{h} = {src_tex} W_{self.which}{h}" + (f" + b_{self.which}{h}" if bias else "")
        plain = f"{self.which}{ph} = {src} W_{self.which}{ph}" + (f" + b_{self.which}{ph}" if bias else "")
        return ctx.emit(self, head, inputs, formula, plain, result, shape, {"bias": bias.name} if bias else None)


Q, K, V = Projection("Q"), Projection("K"), Projection("V")
