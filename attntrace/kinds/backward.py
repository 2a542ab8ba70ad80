"""The backward pass: the gradient of a loss with respect to every matrix of attention.

Each gradient is a step kind of its own, named `d` + the step (or input) it is the gradient
of: doutput, dW_O, db_O, dconcat, then per head dZ, dV, dweights, dscaled, dscores, dQ, dK
(and dW_Q, dW_K, dW_V, db_Q, ... per head when the heads were given one by one), then dW_Q,
... at full width for `num_heads` specs, dX and dX_kv. They run after the forward steps
(`attntrace.kinds.BACKWARD_COMBINE`, `BACKWARD_HEAD`, `BACKWARD_INPUTS`) and read the
forward values from the same per-head state (roles A, V, Q, K, Z); each writes its own id.

The chain rule is written out matrix by matrix, as the textbooks do (row vectors, so
Z = A V gives dV = A^T dZ and dA = dZ V^T). The softmax's backward is row by row,
dT_i = a_i o (dA_i - r_i), r_i = sum_j a_ij dA_ij, which is dA_i times the Jacobian
diag(a_i) - a_i^T a_i; a masked entry has weight exactly 0, so its gradient is exactly 0
(the mask is a constant). The scale follows as its own step, dS = dT / sqrt(d_k).

Weight gradients have attntrace's shapes: dW_Q is (d_model, d_k) like W_Q, the transpose of
PyTorch's `weight.grad` (nn.Linear and in_proj_weight store (out, in)). With `num_heads`
the full-width dW_Q (d_model, h d_k) is one step, comparable with PyTorch's gradient of the
full in_proj block; heads given one by one (`heads = [...]`) get one dW_Q per head.

In symbolic mode every gradient names its entries g^{V}_{ij} (g for gradient, the
superscript the matrix it belongs to) and defines them one level deep in terms of the
forward names and the previous gradient's names.
"""

from __future__ import annotations

from attntrace.inputs.expr import to_plain
from attntrace.inputs.options import SpecOption
from attntrace.inputs.stepoptions import parse_backward
import numpy as np

from attntrace.kinds.base import HEAD_INDEX, Flow, Kind, Mistake, Symbol
from attntrace.model.errors import BadInput
from attntrace.model.formula import ONES, Add, Diff, Dots, Frac, Hcat, Node, Op, Paren, Partial, Seq, Slice, Sqrt, Sum, Sym, Word, node, sym

#: The kinds here run only for a problem with a backward pass (`attntrace.kinds.registry` imports
#: this module only then).
RUNS_WITH = ("backward",)

#: The spec's `backward`: true, {loss = "sum_squares" | "sum"} or {dO = [[...]]} (Problem.extra["backward"]).
SPEC_OPTIONS = (SpecOption("backward", lambda value, reader: parse_backward(value, reader.mode, "g^{O}" if "W_O" in reader.data else "g^{Z}"), "true or {loss = ...} or {dO = [[...]]}"),)


def _find(ctx, step_id: str, head):
    """A forward step already recorded (the scaled step's factor, the concat's blocks)."""
    for s in ctx.steps:
        if s.id == step_id and s.head == head:
            return s
    return None


class Grad(Kind):
    """The gradient of one matrix; `writes` its own id into the state it runs in."""

    view, prose = "grad", "backward"
    view_module = "gradview"
    starts = ("X", "QKV", "scores", "weights", "Z")
    backward = True
    #: the forward matrix this is the gradient of
    of: Node = sym("")

    def __init__(self, id: str, of: Sym | str, symbol: str, per_head: bool = True):
        self.id = self.writes = id
        self.of = node(of)
        self.letter = Diff(self.of)
        self.symbol = self.entry = symbol
        self.per_head = per_head

    def enabled(self, problem) -> bool:
        return problem.extra.get("backward") is not None and problem.start in self.starts and self.runs(problem)

    # -- the checker ---------------------------------------------------------------------------
    def carry(self, iv, step, args, mistake):
        """The gradient from the student's values, by its rule: a product (dV = A^T dZ, dA = dZ V^T,
        dQ = dS K, dK = dS^T Q, dW_Q = X^T dQ, ...), the softmax's backward dT = A o (dA - r 1^T),
        the scale dS = dT / sqrt(d_k), the seed 2 O of the loss sum o^2, db_O (column sums of
        dO), a head's dZ (its columns of dconcat), dW_Q of full-width weights (X^T times the
        heads' dQ side by side) and dX (the sum over heads and projections of dP W_P^T). Any
        other rule (a seed given as a matrix, the loss sum o): its true value, which depends on
        nothing the student wrote. Mistakes: dV_missing_transpose, dK_missing_transpose (the
        first factor not transposed), softmax_backward_no_rowsum (r dropped), grad_scale_forgotten."""
        rule = step.details.get("rule")
        if rule == "product" and len(args) == 2:
            ta, tb = step.details.get("transposed", (False, False))
            if mistake in ("dV_missing_transpose", "dK_missing_transpose"):
                ta = False
            return iv.product(args[0].T if ta else args[0], args[1].T if tb else args[1])
        if rule == "softmax" and len(args) == 2:
            a, da = args
            if a.shape != da.shape or not (np.isfinite(a.lo).all() and np.isfinite(a.hi).all()):
                raise iv.Impossible()
            if mistake == "softmax_backward_no_rowsum":
                return iv.hadamard(a, da)
            ag = iv.hadamard(a, da)
            r = iv.Box(ag.lo.sum(axis=1, keepdims=True), ag.hi.sum(axis=1, keepdims=True))
            return iv.hadamard(a, iv.minus_row(da, r))
        if rule == "scale" and len(args) == 1:
            if mistake == "grad_scale_forgotten":
                return args[0]
            return iv.divide(args[0], float(step.details["factor"]))
        if rule == "sum_squares" and len(args) == 1:
            return iv.divide(args[0], 0.5)
        if rule == "colsum" and len(args) == 1:
            return iv.colsum(args[0])
        if rule == "block" and len(args) == 1:
            first, last = step.details["block"]
            if args[0].shape[1] < last:
                raise iv.Impossible()
            return iv.Box(args[0].lo[:, first - 1:last], args[0].hi[:, first - 1:last])
        if rule == "stack" and len(args) >= 2:
            parts = list(args[1:])
            if len({p.shape[0] for p in parts}) != 1 or args[0].shape[0] != parts[0].shape[0]:
                raise iv.Impossible()
            return iv.matmul(args[0].T, iv.stack(parts, axis=1))
        if rule == "paths" and len(args) >= 2 and len(args) % 2 == 0:
            total = None
            for dp, w in zip(args[0::2], args[1::2]):
                if dp.shape[1] != w.shape[1]:
                    raise iv.Impossible()
                term = iv.matmul(dp, w.T)
                if total is not None and total.shape != term.shape:
                    raise iv.Impossible()
                total = term if total is None else iv.add(total, term)
            return total
        return iv.point(iv.floats(step.value))

    def runs(self, problem) -> bool:
        return True

    def emit(self, ctx, head, inputs, rhs: Node, result, shape, rule: str, **details) -> Flow:
        return ctx.emit(self, head, inputs, self.letter.head(head).eq(rhs), result, shape, {"rule": rule, **details})

    def product(self, ctx, head, a: Flow, b: Flow, ta: bool, tb: bool, names: tuple[Node, Node]) -> Flow:
        """op(a) op(b) with op = transpose where asked: shape-checked, recorded with its factors."""
        sa, sb = (a.shape[::-1] if ta else a.shape), (b.shape[::-1] if tb else b.shape)
        if sa[1] != sb[0]:
            raise BadInput(f"step {self.id}: cannot multiply {a.ref} {sa} by {b.ref} {sb}: {sa[1]} != {sb[0]}")
        alg = ctx.alg
        av = alg.transpose(a.value) if ta else a.value
        bv = alg.transpose(b.value) if tb else b.value
        result = alg.grad_matmul(av, bv)
        return self.emit(ctx, head, [a.ref, b.ref], names[0] * names[1], result, (sa[0], sb[1]),
                         "product", transposed=(ta, tb), factor_shapes=(sa, sb))

    def seed(self, ctx, head, out: Flow) -> Flow:
        """The first gradient: dO given, or the loss's derivative at the last forward output."""
        b = ctx.p.extra["backward"]
        o = out.letter.head(head)
        partial = Partial(sym("L"), o)
        if "dO" in b:
            op = b["dO"]
            if op.shape != tuple(out.shape):
                raise BadInput(f"backward: dO has shape {op.shape} but the output {out.ref} it is the gradient of is {tuple(out.shape)}")
            return self.emit(ctx, head, [], partial, op.value, out.shape, "given")
        if b["loss"] == "sum":
            return self.emit(ctx, head, [out.ref], partial.eq(ONES), ctx.alg.constant(out.shape, 1),
                             out.shape, "sum")
        return self.emit(ctx, head, [out.ref], partial.eq(2 * o), ctx.alg.times(out.value, 2), out.shape,
                         "sum_squares")

    def notation(self, step):
        """dM with its entries g^{M}_{ij}; the loss L where the backward pass starts; r_i through the softmax."""
        rule = step.details.get("rule")
        extra = {"given": [Symbol(sym("L"), "loss", "scalar")], "sum": [Symbol(sym("L"), "loss", "scalar")],
                 "sum_squares": [Symbol(sym("L"), "loss", "scalar")],
                 "softmax": [Symbol(sym("r", "i"), "softmax_grad_mean", (step.shape[0], 1))]}.get(rule, [])
        return super().notation(step) + extra

    def json_details(self, details):
        out = {"rule": details.get("rule")}
        if "block" in details:
            out["block"] = details["block"]
        return out


class OutputGrad(Grad):
    """doutput: the gradient of the output projection's result (the first backward step)."""

    def runs(self, problem):
        return "W_O" in problem.shared

    def compute(self, ctx, head, top):
        return self.seed(ctx, None, top["O"]) if top.get("O") is not None else None


class OutputWeightGrad(Grad):
    """dW_O = Z^T dO (Z the concatenated heads), db_O = the column sums of dO."""

    def __init__(self, id, of, symbol, bias: bool):
        super().__init__(id, of, symbol, per_head=False)
        self.bias = bias

    def runs(self, problem):
        return ("b_O" if self.bias else "W_O") in problem.shared

    def compute(self, ctx, head, top):
        do = top.get("doutput")
        if do is None:
            return None
        if self.bias:
            return self.emit(ctx, None, ["doutput"], ONES.T() * Diff(sym("O")), ctx.alg.colsum(do.value),
                             (1, do.shape[1]), "colsum", factor_shapes=(do.shape,))
        return self.product(ctx, None, top["Z"], do, True, False, (sym("Z").T(), Diff(sym("O"))))


class ConcatGrad(Grad):
    """dconcat = dO W_O^T, or the seed when the concatenation is the last forward step."""

    def runs(self, problem):
        return len(problem.heads) > 1

    def compute(self, ctx, head, top):
        if top.get("Z") is None:
            return None
        do = top.get("doutput")
        if do is None:
            return self.seed(ctx, None, top["Z"])
        w = ctx.operand(ctx.p.shared["W_O"])
        return self.product(ctx, None, do, w, False, True, (Diff(sym("O")), sym("W", "O").T()))


class HeadOutputGrad(Grad):
    """dZ of a head: its column block of dconcat, or dO W_O^T (one head), or the seed."""

    def compute(self, ctx, head, state):
        top = state["top"]
        for key, what in (("num_kv_heads", "num_kv_heads (grouped-query attention)"), ("rope", "rope (rotary positions)")):
            if key in ctx.p.extra:
                raise BadInput(f"backward with {what} is not supported yet")
        if state.get("Z") is None:
            raise BadInput("backward needs the output: give V (the trace stops at the weights)")
        if top.get("dconcat") is not None:
            dc = top["dconcat"]
            blocks = _find(ctx, "concat", None).details["blocks"]
            _, first, last = blocks[head - 1]
            return self.emit(ctx, head, ["dconcat"], Slice(Diff(sym("Z")), None, (first, last)),
                             ctx.alg.columns(dc.value, first - 1, last), (dc.shape[0], last - first + 1), "block", block=(first, last))
        if top.get("doutput") is not None:
            w = ctx.operand(ctx.p.shared["W_O"])
            return self.product(ctx, head, top["doutput"], w, False, True, (Diff(sym("O")), sym("W", "O").T()))
        return self.seed(ctx, head, state["Z"])


class ValueGrad(Grad):
    """dV = A^T dZ: value row j collects the output gradients of the queries that read it."""

    mistakes = (Mistake("dV_missing_transpose"),)

    def compute(self, ctx, head, state):
        dz, a = state.get("dZ"), state.get("A")
        if dz is None or a is None or state.get("V") is None:
            return None
        return self.product(ctx, head, a, dz, True, False, (sym("A").head(head).T(), Diff(sym("Z")).head(head)))


class WeightsGrad(Grad):
    """dA = dZ V^T: how the loss changes with each attention weight."""

    def compute(self, ctx, head, state):
        dz, v = state.get("dZ"), state.get("V")
        if dz is None or v is None:
            return None
        return self.product(ctx, head, dz, v, False, True, (Diff(sym("Z")).head(head), sym("V").head(head).T()))


class SoftmaxGrad(Grad):
    """The softmax backward, row by row: dT = A o (dA - rowsum(dA o A))."""

    starts = ("X", "QKV", "scores")

    def compute_softmax(self, ctx, head, state):
        da, a = state.get("dweights"), state.get("A")
        if da is None:
            return None
        result, details = ctx.alg.softmax_backward(a.value, da.value)
        jacobian = None if ctx.alg.mode == "shape" else ctx.alg.softmax_jacobian(a.value, 0)
        rhs = Op("circ", sym("A").head(head), Paren(Diff(sym("A")).head(head) - sym("r").head(head) * ONES.T(), sized=True))
        masked = _find(ctx, "masked", head) is not None
        return self.emit(ctx, head, [a.ref, da.ref], rhs, result, a.shape, "softmax", jacobian=jacobian, masked=masked, **details)

    def json_details(self, details):
        out = super().json_details(details)
        if details.get("rule") == "softmax":
            r = details.get("rowdot")  # numbers in numeric mode, SymPy's plain syntax (as step values) otherwise
            out["rowdot"] = None if r is None else [to_plain(x) if hasattr(x, "free_symbols") else float(x) for x in r]
        return out


class ScaledGrad(SoftmaxGrad):
    """dscaled: the gradient of the scaled (and masked) scores, through the softmax."""

    elementwise = "hadamard"  # P o (dP - D): the row means broadcast

    mistakes = (Mistake("softmax_backward_no_rowsum", also=("dscores",), when=lambda steps: any(s.details.get("rule") == "softmax" for s in steps)),)

    def runs(self, problem):
        return problem.scale is not False

    def compute(self, ctx, head, state):
        return self.compute_softmax(ctx, head, state)


class ScoresGrad(SoftmaxGrad):
    """dscores: dT / sqrt(d_k) after the scaling, else straight through the softmax."""

    mistakes = (ScaledGrad.mistakes[0], Mistake("grad_scale_forgotten", when=lambda steps: any(s.details.get("rule") == "scale" for s in steps)))

    def compute(self, ctx, head, state):
        dt = state.get("dscaled")
        if dt is None:
            return self.compute_softmax(ctx, head, state)
        scaled = _find(ctx, "scaled", head)
        factor = scaled.details["factor"]
        by_sqrt = scaled.details.get("by_sqrt_dk", True)
        divisor = Sqrt(sym("d", "k")) if by_sqrt else sym("c")
        return self.emit(ctx, head, ["dscaled"], Frac(Diff(sym("T")).head(head), divisor),
                         ctx.alg.grad_divide(dt.value, factor), dt.shape, "scale", factor=factor, d_k=scaled.details.get("d_k"),
                         by_sqrt_dk=by_sqrt)


class QueryKeyGrad(Grad):
    """dQ = dS K and dK = dS^T Q (dS already holds the 1/sqrt(d_k))."""

    starts = ("X", "QKV")

    def compute(self, ctx, head, state):
        ds = state.get("dscores")
        if ds is None:
            return None
        d_s = Diff(sym("S")).head(head)
        if self.id == "dQ":
            return self.product(ctx, head, ds, state["K"], False, False, (d_s, sym("K").head(head)))
        return self.product(ctx, head, ds, state["Q"], True, False, (d_s.T(), sym("Q").head(head)))


def _split(problem) -> bool:
    """The heads come from full-width matrices split by num_heads: weight gradients at full width."""
    return bool(problem.extra.get("full_width")) and len(problem.heads) > 1


def _source(ctx, which: str) -> str:
    return "X_kv" if which in ("K", "V") and "X_kv" in ctx.p.shared else "X"


def new_rows(ctx, which: str, d: Flow, head) -> tuple[Flow, Node]:
    """(the rows of dK or dV that the projection made, their name in formulas).

    With a KV cache, K is [K_past; X W_K]: dK = dS^T Q is the gradient of every cached key,
    but only the last rows (the new tokens') depend on W_K and X; the past rows are given
    numbers. Without a cache, dK itself."""
    name = Diff(sym(which)).head(head)
    rows = ctx.p.shared[_source(ctx, which)].shape[0]
    past = d.shape[0] - rows
    if which == "Q" or past <= 0:
        return d, name
    value = ctx.alg.block(d.value, past, d.shape[0], 0, d.shape[1])
    return Flow(value, (rows, d.shape[1]), d.ref, d.letter, d.entry), Slice(name, (past + 1, past + rows), None)


class ProjectionGrad(Grad):
    """dW_Q = X^T dQ and db_Q = 1^T dQ (the same for K, V; X_kv for K and V in cross-attention).

    `full`: the num_heads split's full-width gradient, X^T [dQ^(1) ... dQ^(h)], after the heads."""

    starts = ("X",)

    def __init__(self, which: str, bias: bool, full: bool):
        kind = "b" if bias else "W"
        super().__init__(f"d{kind}_{which}", sym(kind, which), f"g^{{{kind}{which}}}", per_head=not full)
        self.which, self.bias, self.full = which, bias, full
        if bias:
            self.carry = None  # db_Q, ... are checked at their true value: nothing is carried through them

    def runs(self, problem):
        if _split(problem) != self.full:
            return False
        return not self.bias or any(f"b_{self.which}" in ops for ops in problem.heads)

    def compute(self, ctx, head, state):
        g = f"d{self.which}"
        src = _source(ctx, self.which)
        x_t = (sym("X", Word("kv", roman=True)) if src == "X_kv" else sym("X")).T()
        if self.full:
            flows = [s.get(g) for s in state["states"]]
            if any(f is None for f in flows):
                return None
            flows = [new_rows(ctx, self.which, f, i)[0] for i, f in enumerate(flows, start=1)]
            n = len(flows)
            stacked = ctx.alg.hstack([f.value for f in flows])
            grad = Diff(sym(self.which))
            parts = Hcat((grad.head(1), Dots(), grad.head(n)) if n > 2 else tuple(grad.head(i) for i in range(1, n + 1)))
            inputs = [src] + [f"{g}@{i}" for i in range(1, n + 1)]
            shape = (flows[0].shape[0], sum(f.shape[1] for f in flows))
            if self.bias:
                return self.emit(ctx, None, inputs[1:], ONES.T() * parts,
                                 ctx.alg.colsum(stacked), (1, shape[1]), "colsum", factor_shapes=(shape,))
            x = ctx.operand(ctx.p.shared[src])
            return self.emit(ctx, None, inputs, x_t * parts,
                             ctx.alg.grad_matmul(ctx.alg.transpose(x.value), stacked), (x.shape[1], shape[1]), "stack",
                             factor_shapes=(x.shape[::-1], shape))
        d = state.get(g)
        if d is None:
            return None
        d, name = new_rows(ctx, self.which, d, head)
        if self.bias:
            return self.emit(ctx, head, [d.ref], ONES.T() * name,
                             ctx.alg.colsum(d.value), (1, d.shape[1]), "colsum", factor_shapes=(d.shape,))
        x = ctx.operand(ctx.p.shared[src])
        return self.product(ctx, head, x, d, True, False, (x_t, name))


class InputGrad(Grad):
    """dX = sum over heads of dQ W_Q^T (+ dK W_K^T + dV W_V^T in self-attention); dX_kv the rest."""

    starts = ("X",)

    def __init__(self, id, of, symbol, kv: bool):
        super().__init__(id, of, symbol, per_head=False)
        self.kv = kv
        if kv:
            self.carry = None  # dX_kv is checked at its true value: nothing is carried through it

    def runs(self, problem):
        return not self.kv or "X_kv" in problem.shared

    def compute(self, ctx, head, top):
        cross = "X_kv" in ctx.p.shared
        which = ("K", "V") if self.kv else (("Q",) if cross else ("Q", "K", "V"))
        states = top["states"]
        multi = len(states) > 1
        grads, weights, inputs = [], [], []
        for i, st in enumerate(states, start=1):
            hd = i if multi else None
            for w in which:
                d = st.get(f"d{w}")
                if d is None:
                    return None
                d = new_rows(ctx, w, d, hd)[0]
                grads.append(d.value)
                weights.append(ctx.operand(st[f"W_{w}"]).value)
                inputs += [d.ref if hd is None else f"{d.ref}@{hd}", f"W_{w}" if hd is None else f"W_{w}@{hd}"]
        # one product: [dQ dK dV ...] times [W_Q W_K W_V ...]^T sums every path's contribution
        alg = ctx.alg
        total = alg.grad_matmul(alg.hstack(grads), alg.transpose(alg.hstack(weights))) if alg.mode != "shape" else None
        if multi:  # every head, each projection the input feeds written out (an index letter M would be the mask's)
            i = HEAD_INDEX
            rhs: Node = Sum(i, Paren(Add(tuple(Diff(sym(w)).head(i) * sym("W", w).head(i).T() for w in which)), sized=True))
        else:
            terms = [Diff(sym(w)) * sym("W", w).T() for w in which]
            rhs = terms[0] if len(terms) == 1 else Add(tuple(terms))
        x = ctx.p.shared["X_kv" if self.kv else "X"]
        d_first = new_rows(ctx, which[0], states[0][f"d{which[0]}"], None)[0].shape  # the shapes of one term of the sum
        return self.emit(ctx, None, inputs, rhs, total, x.shape, "paths", heads=len(states), projections=which,
                         factor_shapes=(d_first, (d_first[1], x.shape[1])))


DOUTPUT = OutputGrad("doutput", "O", "g^{O}", per_head=False)
DW_O = OutputWeightGrad("dW_O", sym("W", "O"), "g^{WO}", bias=False)
DB_O = OutputWeightGrad("db_O", sym("b", "O"), "g^{bO}", bias=True)
DCONCAT = ConcatGrad("dconcat", "Z", "g^{Z}", per_head=False)
DZ = HeadOutputGrad("dZ", "Z", "g^{Z}")
DV = ValueGrad("dV", "V", "g^{V}")
DWEIGHTS = WeightsGrad("dweights", "A", "g^{A}")
DSCALED = ScaledGrad("dscaled", "T", "g^{T}")
DSCORES = ScoresGrad("dscores", "S", "g^{S}")
DQ = QueryKeyGrad("dQ", "Q", "g^{Q}")
DK = QueryKeyGrad("dK", "K", "g^{K}")
DK.mistakes = (Mistake("dK_missing_transpose"),)  # dQ = dS K has no transpose to miss
HEAD_PARAMS = tuple(ProjectionGrad(w, b, full=False) for b in (False, True) for w in "QKV")
FULL_PARAMS = tuple(ProjectionGrad(w, b, full=True) for b in (False, True) for w in "QKV")
DX = InputGrad("dX", "X", "g^{X}", kv=False)
DX_KV = InputGrad("dX_kv", sym("X", Word("kv", roman=True)), "g^{Y}", kv=True)

#: Before the heads (the output projection and the concatenation), per head, after the heads.
BACKWARD_COMBINE: tuple[Kind, ...] = (DOUTPUT, DW_O, DB_O, DCONCAT)
BACKWARD_HEAD: tuple[Kind, ...] = (DZ, DV, DWEIGHTS, DSCALED, DSCORES, DQ, DK) + HEAD_PARAMS
BACKWARD_INPUTS: tuple[Kind, ...] = FULL_PARAMS + (DX, DX_KV)
