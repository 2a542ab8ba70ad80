"""The position-wise feed-forward network, applied to each row (token) alone.

ReLU/GELU (Vaswani et al. 2017, 3.3; GPT-2 and BERT use GELU): H = N W_1 + b_1, H~ = act(H),
F = H~ W_2 + b_2. SwiGLU (Shazeer 2020, Llama): H = N W_gate, U = N W_up, H~ = SiLU(H) * U
entry by entry, F = H~ W_down (no biases); H~ is the role G of the block's state. GeGLU
(Shazeer 2020; Gemma with the tanh GELU): the same with GELU_tanh(H) in place of SiLU(H). Weights are (in, out), rows as vectors, like W_Q;
`nn.Linear.weight` is (out, in) and is transposed on import.
"""

from __future__ import annotations

import numpy as np

from attntrace.kinds.base import Kind, Mistake, place
from attntrace.model.formula import (Frac, Func, Juxt, Node, Num, Op, Paren, Parts, Power, Sqrt, Space, after_lhs, first_factor,
                                     node, substitute, sym)
from attntrace.inputs.blockspec import ARRANGEMENTS, BLOCK_OPERANDS
from attntrace.kinds.exactsize import check_exact_size
from attntrace.model.errors import BadInput

#: The kinds here run only for a problem with a Transformer block (`attntrace.kinds.registry` imports
#: this module only then).
RUNS_WITH = ("block",)

#: a gated network's activation -> the function of its gate
GATES = {"swiglu": "silu", "geglu": "gelu_tanh"}


def _swiglu(problem) -> bool:
    """A gated network (SwiGLU or GeGLU): W_gate, W_up, W_down, no biases."""
    return problem.extra.get("activation") in GATES


class Linear(Kind):
    """One of the FFN's matrix products, with its bias when given: laid out like Q = X W_Q + b_Q."""

    per_head = False
    view, prose = "product", "ffn"

    def __init__(self, id, reads, writes, letter, entry, weights: tuple[str, str], bias: str | None, swiglu_only=False):
        self.id, self.reads, self.writes = id, (reads,), writes
        self.letter, self.entry, self.symbol = node(letter), node(entry), entry
        self.weights, self.bias, self.swiglu_only = weights, bias, swiglu_only
        self.mistakes = ()

    def flow_line(self, trace, step):
        """The network's output in one line, F = act(N W_1 + b_1) W_2 + b_2 (or SwiGLU's), from the
        network's own formulas: it holds the hidden, up and activation steps (`folded_in_flow`)."""
        if self is not FFN_OUT:
            return super().flow_line(trace, step)
        steps = {s.id: s for s in trace.steps if s.id.startswith("ffn_")}
        hidden = after_lhs(steps[FFN_HIDDEN.id].expr)
        act = steps[FFN_ACT.id].details.get("activation")
        if act in ("swiglu", "geglu"):  # the gated networks: SiLU or GELU of the gate
            gate = "SiLU" if act == "swiglu" else "GELU"
            inner: Node = Paren(Op("hadamard", Func(gate, (hidden,)), after_lhs(steps[FFN_UP.id].expr)), sized=True)
        else:
            inner = Juxt((Func({"relu": "ReLU", "gelu": "GELU", "gelu_tanh": "GELU"}[act], (hidden,)), Space()))
        # the activation's matrix G in F = G W_2 + b_2 becomes the activation itself
        return substitute(step.expr, {first_factor(after_lhs(step.expr)): inner})

    def carry(self, iv, step, args, mistake):
        """N W (+ b) from the student's values."""
        return iv.linear(args[0], args[1], args[2] if len(args) > 2 else None)

    def enabled(self, problem) -> bool:
        return not self.swiglu_only or _swiglu(problem)

    def exact_size(self, problem, sizes):
        """A sum of d_in products: d_in times the input's operations (measured 2x for d_in = 2)."""
        w = problem.shared.get(self.weights[1] if _swiglu(problem) else self.weights[0])
        return None if w is None else w.shape[0] * sizes[self.reads[0]] + 1

    def compute(self, ctx, head, state):
        a = state[self.reads[0]]
        w_name = self.weights[1] if _swiglu(ctx.p) else self.weights[0]
        w = ctx.operand(ctx.p.shared[w_name])
        if a.shape[1] != w.shape[0]:
            raise BadInput(f"step {self.id}: cannot multiply {a.ref} {a.shape} by {w_name} {w.shape}: {a.shape[1]} != {w.shape[0]}")
        shape = (a.shape[0], w.shape[1])
        bias = None if _swiglu(ctx.p) or self.bias is None else ctx.p.shared.get(self.bias)
        if bias is not None and bias.shape != (1, shape[1]):
            raise BadInput(f"step {self.id}: bias {bias.name} has shape {bias.shape}, expected (1, {shape[1]})")
        result = ctx.alg.linear(a.value, w.value, None if bias is None else bias.value)
        check_exact_size(ctx, self.id, result)
        product = a.letter * BLOCK_OPERANDS[w_name][0]
        formula = self.letter.eq(product + BLOCK_OPERANDS[bias.name][0] if bias is not None else product)
        return ctx.emit(self, None, [a.ref, w_name] + ([bias.name] if bias is not None else []), formula, result, shape)


#: The activations gelu_relu_confused can swap (ReLU for GELU, GELU for ReLU).
_CONFUSED = ("relu", "gelu", "gelu_tanh")


class Activation(Kind):
    id = "ffn_act"
    per_head = False
    reads, writes = ("H",), "G"
    letter, entry, symbol = sym("H", accent="tilde"), sym("h", accent="tilde"), "\\tilde{h}"
    view, prose = "activation", "ffn"
    folded_in_flow = True
    view_module = "blockview"
    elementwise = "hadamard"
    mistakes = (Mistake("gelu_relu_confused", when=lambda steps: any(s.details.get("activation") in _CONFUSED for s in steps)),)

    def exact_size(self, problem, sizes):
        """ReLU keeps its input (a Max); GELU's erf, tanh and SiLU's exponential repeat it about 3
        times (measured 224 -> 675 for SwiGLU), times the up projection for a gated network."""
        act = problem.extra.get("activation", "relu")
        if act == "relu":
            return sizes["H"]
        return 3 * sizes["H"] + (sizes.get("U", 0) if _swiglu(problem) else 0)

    def carry(self, iv, step, args, mistake):
        """The activation of the student's H (and U for SwiGLU), a valid enclosure;
        gelu_relu_confused: ReLU for GELU or GELU for ReLU, entry by entry over the student's
        H (its extremes and midpoint). An activation with no rule: its true value."""
        act = step.details.get("activation")
        if mistake != "gelu_relu_confused" or act not in _CONFUSED:
            if act == "swiglu" and len(args) == 2 and args[0].shape == args[1].shape:
                return iv.swiglu(args[0], args[1])
            if act == "geglu" and len(args) == 2 and args[0].shape == args[1].shape:  # GELU_tanh(H) * U
                return iv.times(iv.activation(args[0], "gelu_tanh"), args[1])
            if act in ("relu", "gelu", "gelu_tanh", "silu") and len(args) == 1:
                return iv.activation(args[0], act)
            return iv.point(iv.floats(step.value))
        from attntrace.algebra.numeric import NumericAlgebra

        wrong = "gelu" if act == "relu" else "relu"
        h = args[0]
        vals = [NumericAlgebra().activation(x, wrong) for x in (h.lo, h.mid, h.hi)]
        lo, hi = np.minimum.reduce(vals), np.maximum.reduce(vals)
        return iv.widen((lo + hi) / 2, (hi - lo) / 2, np.abs(hi) + np.abs(lo))

    def compute(self, ctx, head, state):
        h = state["H"]
        hij = sym("h").at("i", "j")
        act = ctx.p.extra.get("activation", "relu")
        if act in GATES:
            u = state["U"]
            result = ctx.alg.hadamard(ctx.alg.activation(h.value, GATES[act]), u.value)
            check_exact_size(ctx, self.id, result)
            gate = Op("hadamard", Func("SiLU" if act == "swiglu" else "GELU", (sym("H"),)), sym("U"))
            # GeGLU's entry names GELU (its tanh form is the prose's): written out, the line would not fit a page
            gate_entry = hij / (1 + Power(sym("e"), -hij)) if act == "swiglu" else Func("GELU", (hij,))
            uij = sym("u").at("i", "j")
            entry = gate_entry * Space() * uij if act == "swiglu" else Op("mul", gate_entry, uij)
            formula = Parts((sym("H", accent="tilde").eq(gate), sym("h", accent="tilde").at("i", "j").eq(entry)))
            return ctx.emit(self, None, [h.ref, u.ref], formula, result, h.shape, {"activation": act})
        result = ctx.alg.activation(h.value, act)
        check_exact_size(ctx, self.id, result)
        half = Frac(Num(1), Num(2), small=True)
        if act == "relu":
            entry = Func("max", (Num(0), hij))
        elif act == "gelu":
            entry = half * hij * Paren(1 + Func("erf", (hij / Sqrt(Num(2)),), bare=True), sized=True)
        else:
            entry = _gelu_tanh(hij)
        op = "GELU" if act.startswith("gelu") else "ReLU"
        formula = Parts((sym("H", accent="tilde").eq(Func(op, (sym("H"),))), sym("h", accent="tilde").at("i", "j").eq(entry)))
        return ctx.emit(self, None, [h.ref], formula, result, h.shape, {"activation": act})

    def json_details(self, details):
        return {"activation": details["activation"]}



def _gelu_tanh(hij):
    """The tanh form of GELU of one entry: h/2 (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))."""
    inner = Sqrt(Frac(Num(2), sym("pi"), inline=True)) * Space() * Paren(hij + Num(0.044715) * Space() * Power(hij, Num(3)))
    return Frac(Num(1), Num(2), small=True) * hij * Paren(1 + Func("tanh", (inner,), sized=True), sized=True)


# the network of every arrangement, after the norm (or residual) that feeds it, which places itself before ffn_hidden
FFN_HIDDEN = place(Linear("ffn_hidden", "ffn_in", "H", "H", "h", ("W_1", "W_gate"), "b_1"), "block_post", ARRANGEMENTS)
FFN_UP = place(Linear("ffn_up", "ffn_in", "U", "U", "u", ("W_up", "W_up"), None, swiglu_only=True), "block_post", ARRANGEMENTS,
               after=("ffn_hidden",))
FFN_ACT = place(Activation(), "block_post", ARRANGEMENTS, after=("ffn_up",))
FFN_OUT = place(Linear("ffn_out", "G", "F", "F", "f", ("W_2", "W_down"), "b_2"), "block_post", ARRANGEMENTS, after=("ffn_act",))
FFN_HIDDEN.folded_in_flow = FFN_UP.folded_in_flow = True  # F = act(N W_1 + b_1) W_2 + b_2 holds them
