"""Residual connections: the sublayer's input added to its output, R = E + O around attention
and R^f = (its input) + F around the feed-forward network. Which input is the block's
arrangement (`attntrace.kinds.block`): the normalised one in post-LN, the stream in pre-LN."""

from __future__ import annotations

from attntrace.kinds.base import Kind, Mistake
from attntrace.kinds.exactsize import check_exact_size
from attntrace.model.errors import BadInput
from attntrace.model.formula import Sym


class Residual(Kind):
    per_head = False
    view, prose = "sum", "residual"
    view_module = "blockview"
    elementwise = "add"
    explained_by_prose = True
    one_of_many = True
    mistakes = (Mistake("forgot_residual", also=("residual2",)),)

    def report_params(self, steps):
        """The first residual names the block's arrangement; the second, that the feed-forward sublayer ran."""
        return {"block": steps[0].details.get("block") or ""} if self.attention_sublayer else {"ffn_sublayer": True}

    def carry(self, iv, step, args, mistake):
        """The input plus the sublayer's output; forgot_residual: the output alone."""
        a, b = args
        if mistake == "forgot_residual":
            return b
        return iv.sum_same_shape(a, b)

    def __init__(self, id: str, a: str, b: str, writes: str, letter: Sym, entry: Sym, symbol: str):
        self.id, self.reads, self.writes = id, (a, b), writes
        self.letter, self.entry, self.symbol = letter, entry, symbol

    def json_details(self, details):
        return {"block": details["block"]} if details.get("block") else {}

    def exact_size(self, problem, sizes):
        return sizes[self.reads[0]] + sizes[self.reads[1]]

    def compute(self, ctx, head, state):
        a, b = state[self.reads[0]], state[self.reads[1]]
        if a.shape != b.shape:
            raise BadInput(f"step {self.id}: cannot add {a.ref} {a.shape} and {b.ref} {b.shape}; the sublayer must give back "
                           f"d_model = {a.shape[1]} columns (give W_O of {b.shape[1]} x {a.shape[1]})"[:300])
        result = ctx.alg.plus(a.value, b.value)
        check_exact_size(ctx, self.id, result)
        return ctx.emit(self, None, [a.ref, b.ref], self.letter.eq(a.letter + b.letter), result, a.shape, {"block": ctx.p.extra.get("block")})
