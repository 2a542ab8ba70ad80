"""Combining the heads: Z = Concat(Z^(1), ..., Z^(h)), then the output projection O = Z W_O (+ b_O)."""

from __future__ import annotations

import itertools

from attntrace.kinds.base import Kind, Mistake, Planting
from attntrace.kinds.projection import project
from attntrace.model.errors import BadInput
from attntrace.model.formula import Dots, Func, Seq, Word, sym


def _head_orders(kind, trace) -> list[Planting]:
    """head_order: every other order of up to 4 heads, else the heads reversed."""
    if not any(s.id == kind.id for s in trace.steps):
        return []
    h = trace.num_heads
    orders = itertools.permutations(range(1, h + 1)) if h <= 4 else [tuple(range(h, 0, -1))]
    return [Planting("head_order", kind.id, tuple(o)) for o in orders if list(o) != sorted(o)]


class Concat(Kind):
    pipeline = "combine"
    id = "concat"
    per_head = False
    reads, writes = ("Z",), "Z"
    starts = ("X", "QKV", "scores", "weights", "Z")
    letter, entry = "Z", "z"
    answer_letter = sym("Z", Word("concat"))
    view, prose = "concat", "heads"
    joins_heads = True
    mistakes = (Mistake("concat_rows"), Mistake("head_order", plant=_head_orders))

    def report_params(self, steps):
        return {"has_concat": True}

    def carry(self, iv, step, args, mistake):
        """The heads' Z side by side; concat_rows: stacked as rows; head_order: in the planted order."""
        zs = list(args)
        if mistake == "concat_rows":
            if len({z.shape[1] for z in zs}) != 1:
                raise iv.Impossible()
            return iv.stack(zs, axis=0)
        if mistake == "head_order":
            zs = [zs[i - 1] for i in mistake.order]
        if len({z.shape[0] for z in zs}) != 1:
            raise iv.Impossible()
        return iv.stack(zs, axis=1)

    def enabled(self, problem) -> bool:
        return len(problem.heads) > 1

    def compute(self, ctx, head, state):
        """state["heads"]: every head's Z (Flows), head 1 first; nothing to do when a head has none."""
        zs = state["heads"]
        if any(z is None for z in zs):
            return None
        rows = zs[0].shape[0]
        for i, z in enumerate(zs[1:], start=2):
            if z.shape[0] != rows:
                raise BadInput(f"step concat: Z of head {i} has {z.shape[0]} rows but Z of head 1 has {rows}")
        blocks, col = [], 1
        for i, z in enumerate(zs, start=1):
            blocks.append((i, col, col + z.shape[1] - 1))
            col += z.shape[1]
        n = len(zs)
        z = sym("Z")
        heads = [z.head(i) for i in range(1, n + 1)] if n <= 3 else [z.head(1), z.head(2), Dots(), z.head(n)]
        formula = z.eq(Func("Concat", (Seq(tuple(heads)),), sized=True))
        result = ctx.alg.hstack([z.value for z in zs])
        return ctx.emit(self, None, [f"Z@{i}" for i in range(1, n + 1)], formula, result, (rows, col - 1),
                        {"blocks": tuple(blocks)})

    def json_details(self, details):
        return {"blocks": [list(b) for b in details["blocks"]]}


class Output(Kind):
    pipeline, after = "combine", ("concat",)
    id = "output"
    per_head = False
    reads, writes = ("Z", "W_O"), "O"
    starts = ("X", "QKV", "scores", "weights", "Z")
    letter, entry, symbol = "O", "o", "o"
    view, prose = "product", "heads"
    mistakes = (Mistake("forgot_output_projection"), Mistake("output_weights_transposed"))

    def report_params(self, steps):
        return {"has_output": True}

    def carry(self, iv, step, args, mistake):
        """Z W_O (+ b_O); forgot_output_projection: Z; output_weights_transposed: Z W_O^T."""
        if mistake == "forgot_output_projection":
            return args[0]
        return project(iv, args[0], args[1].T if mistake == "output_weights_transposed" else args[1],
                       args[2] if len(args) > 2 else None)

    def enabled(self, problem) -> bool:
        return "W_O" in problem.shared

    def compute(self, ctx, head, state):
        z = state["Z"]
        if z is None:
            raise BadInput("W_O needs the head outputs Z: give V")
        w = ctx.operand(ctx.p.shared["W_O"])
        if w.shape[0] != z.shape[1]:
            raise BadInput(f"step output: W_O has {w.shape[0]} rows but the concatenated heads are {z.shape} (need h*d_v = {z.shape[1]} rows)")
        result, shape = ctx.product(self.id, None, z, w)
        bias = ctx.p.shared.get("b_O")
        result = ctx.add_bias(self.id, None, result, shape, bias)
        inputs = [z.ref, "W_O"] + (["b_O"] if bias else [])
        product = sym("Z") * sym("W", "O")
        formula = sym("O").eq(product + sym("b", "O") if bias else product)
        return ctx.emit(self, None, inputs, formula, result, shape)


CONCAT, OUTPUT = Concat(), Output()
