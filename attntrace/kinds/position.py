"""Position encodings before attention: the sinusoidal table P (Vaswani et al. 2017, 3.5) and
the embedded input X-tilde = X + P (P sinusoidal, or a learned table given as the spec's `P`).

Row i of X is the token at position i - 1 (positions count from 0, as in the paper's
formula), so the first row of the sinusoidal table is sin 0 = 0, cos 0 = 1.
"""

from __future__ import annotations

import numpy as np

from attntrace.kinds.base import Kind, Mistake, place
from attntrace.model.errors import BadInput
from attntrace.model.formula import Add, Frac, Func, Neg, Num, Paren, Parts, Power, sym

#: The kinds here run only for a problem with position encodings (`attntrace.kinds.registry` imports
#: this module only then).
RUNS_WITH = ("position",)


class PosEnc(Kind):
    id = "pos_enc"
    per_head = False
    reads, writes = ("X",), "P"
    letter, entry, symbol = "P", "p", None  # constants: symbolic mode keeps sin(...) and cos(...)
    view, prose = "posenc", "position"
    folded_in_flow = True
    view_module = "blockview"
    mistakes = (Mistake("posenc_sin_cos_swapped"),)

    def report_params(self, steps):
        return {"position": "sinusoidal"}

    def carry(self, iv, step, args, mistake):
        """The table at its true value (it depends on nothing the student wrote);
        posenc_sin_cos_swapped: cos in the even columns (1st, 3rd, ... counting from 1), sin in the odd."""
        if mistake != "posenc_sin_cos_swapped":
            return iv.point(iv.floats(step.value))
        n, d = step.shape
        pos = np.arange(n, dtype=np.float64)[:, None]
        col = np.arange(d)[None, :]
        angle = pos / float(step.details.get("base", 10000)) ** ((2 * (col // 2)) / d)
        return iv.point(np.where(col % 2 == 0, np.cos(angle), np.sin(angle)))

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and problem.extra.get("position") == "sinusoidal"

    def compute(self, ctx, head, state):
        x = state["X"]
        n, d = x.shape
        base = ctx.p.extra.get("position_base", 10000)
        result = ctx.alg.sinusoid(n, d, base)
        b = Num(f"{base:g}" if isinstance(base, float) else str(base))
        # rows and columns both count from 1, as the entries p_{21} do: row i is position i - 1,
        # columns 2k - 1 and 2k (k = 1, ..., d/2) share the frequency 1 / base^{2(k-1)/d}
        exponent = Frac(Num(2) * Paren(Add((sym("k"), Neg(Num(1))), tight=True)), sym("d"), inline=True)
        angle = (sym("i") - 1) / Power(b, exponent)
        p = sym("p")
        formula = Parts((sym("P").eq(Func("PE", ())),
                         Parts((p.at("i", "2k-1").eq(Func("sin", (angle,), bare=True)),
                                p.at("i", "2k").eq(Func("cos", (angle,), bare=True))), narrow=True)))
        return ctx.emit(self, None, [x.ref], formula, result, (n, d), {"base": base, "d": d})

    def json_details(self, details):
        return {"base": details["base"]}


class Embed(Kind):
    id = "embed"
    per_head = False
    reads, writes = ("X", "P"), "X"
    # X-tilde, the input with its positions (a tilde marks a matrix changed in place, as Q-tilde): E with
    # entries e_ij would read as Euler's number beside the softmax's e^{t_ij}
    letter, entry, symbol = sym("X", accent="tilde"), sym("x", accent="tilde"), "\\tilde{x}"
    view, prose = "sum", "position"
    view_module = "blockview"
    elementwise = "add"  # X + P
    mistakes = (Mistake("posenc_not_added"),)

    def report_params(self, steps):
        return {"position": "learned"}

    def carry(self, iv, step, args, mistake):
        """X-tilde = X + P; posenc_not_added: X alone."""
        a, b = args
        if mistake == "posenc_not_added":
            return a
        return iv.sum_same_shape(a, b)

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and problem.extra.get("position") in ("sinusoidal", "learned")

    def compute(self, ctx, head, state):
        x = state["X"]
        p = state.get("P") or ctx.operand(ctx.p.shared["P"])
        if p.shape != x.shape:
            raise BadInput(f"step embed: the position table P is {p.shape} but X is {x.shape}; give one row per token, d_model columns")
        result = ctx.alg.plus(x.value, p.value)
        return ctx.emit(self, None, [x.ref, p.ref], sym("X", accent="tilde").eq(sym("X") + sym("P")), result, x.shape)


# before attention in every arrangement, and in a trace without a block
POS_ENC = place(PosEnc(), "block_pre")
EMBED = place(Embed(), "block_pre", after=("pos_enc",))
