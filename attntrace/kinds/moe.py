"""A mixture of experts in place of the llama block's feed-forward network.

With N^f (n, d_model) the rows of the tokens after the block's second RMSNorm and E experts,
each a SwiGLU network E_xi(x) = (SiLU(x W_gate^(xi)) ⊙ x W_up^(xi)) W_down^(xi):

    L = N^f W_r                                   router logits (n, E)
    Mixtral (Jiang et al. 2024, eq. 2):  G_i = softmax over the top-k logits of row i; the
        others are masked to -inf and get weight exactly 0 (HF: softmax over all E, top-k,
        then divided by their sum: the same numbers).
    DeepSeek-V3 (arXiv 2412.19437, eqs. 12-16):  S^r = sigmoid(L); the experts are chosen by
        S^r + b (the bias steers the choice only), first topk_group of n_group groups (a group
        scores the sum of its two best), then the top k in those groups; the weights are the
        chosen sigmoid scores divided by their sum (normalize), times routed_scaling_factor.
    Y = [E_1(N^f) | ... | E_E(N^f)]                every expert on every token (a derivation shows
        the matrices whole; a model runs each expert only on its tokens, which the gates select)
    Y^s = E_s(N^f)                                 the shared expert (DeepSeek-V3), every token
    F = sum_xi G[:, xi] ⊙ Y^(xi) (+ Y^s)             each token's weighted sum of its experts

gpt-oss (its model card; HF's GptOssExperts): the router's logits have a bias, L = N W_r + b_r,
and each expert is a clamped SwiGLU with biases (moe.activation = "clamped_swiglu"):
H = min(N W_gate + b_gate, limit), U = clip(N W_up + b_up, -limit, limit),
E(N) = ((U + 1) ⊙ H ⊙ sigmoid(alpha H)) W_down + b_down, alpha = 1.702, limit = 7.

F takes the feed-forward network's role: residual2 adds it to R. The chosen experts need an
order on the scores: in symbolic mode the spec gives them (`moe.route`).
"""

from __future__ import annotations

import numpy as np

from attntrace.inputs.moespec import MOE_OPERANDS as OPERANDS  # noqa: F401 - its matrices' names (attntrace.kinds.notation)
from attntrace.inputs.moespec import check_route, parse_moe
from attntrace.inputs.options import SpecOption
from attntrace.kinds.base import Kind, Mistake, Symbol
from attntrace.model.formula import Cases, Dots, Frac, Func, Hcat, Neg, Op, Paren, Parts, Power, Sum, Value, Word, node, sym

#: The kinds here run only for a problem with a mixture of experts (`attntrace.kinds.registry` imports
#: this module only then).
RUNS_WITH = ("moe",)

#: The number of an expert: Y^{(xi)}, W_gate^{(xi)}, the sum over xi in T_i. GShard writes e, but e is
#: Euler's number in the router's own formulas (e^{l_ij}, 1 / (1 + e^{-x})); j is the column of G, and a superscript (j)
#: is the online softmax's block; every Latin letter free of those is some matrix's entries
#: (attntrace.kinds.base.HEAD_INDEX). xi, as eta numbers the heads: x for eXpert.
EXPERT_INDEX = sym("xi")
#: the experts token i chose: a set, calligraphic as the Switch Transformer and Shazeer et al. write
#: the top-k indices (a bare T_i is a row of the scaled scores T)
_T = sym("T", "i", style="calligraphic")
_WR = sym("W", "r")
from attntrace.kinds.exactsize import check_exact_size
from attntrace.model.errors import BadInput

_FFN = ("ffn_hidden", "ffn_up", "ffn_act", "ffn_out")

#: `moe = {...}` (attntrace.inputs.moespec), read with the block's keys in place of `ffn`.
SPEC_OPTIONS = (SpecOption("moe", parse_moe, "a table {router, W_router, top_k, experts}", check=check_route, instead_of="ffn"),)


def _moe(problem):
    return problem.extra.get("moe")


class MoeKind(Kind):
    per_head = False
    prose = "moe"
    replaces = _FFN
    #: in the llama block after norm2, in the feed-forward network's place (after its kinds,
    #: which do not run: `replaces`), before residual2; each kind after the one before it
    pipeline, blocks = "block_post", ("llama",)

    def enabled(self, problem) -> bool:
        return _moe(problem) is not None and super().enabled(problem)

    def message_params(self, step):
        return {"router": step.details.get("router", "")}


def _op(ctx, key):
    return ctx.operand(ctx.p.shared[key])


def _matmul(iv, a, b):
    if a.shape[1] != b.shape[0]:
        raise iv.Impossible()
    return iv.matmul(a, b)


class RouterLogits(MoeKind):
    id = "router_logits"

    def exact_size(self, problem, sizes):
        """A sum of d products, as the feed-forward network's (kinds.ffn.Linear), plus the bias."""
        return problem.shared["X"].shape[1] * sizes["ffn_in"] + 1 + ("logit_bias" in problem.shared)

    def carry(self, iv, step, args, mistake):
        out = _matmul(iv, args[0], args[1])
        return iv.add(out, args[2]) if len(args) > 2 else out

    reads, writes = ("ffn_in",), "router_L"
    letter, entry, symbol = sym("L"), sym("l"), "l"
    view = "product"

    def compute(self, ctx, head, state):
        n = state["ffn_in"]
        w = _op(ctx, "W_router")
        if n.shape[1] != w.shape[0]:
            raise BadInput(f"step {self.id}: cannot multiply {n.ref} {n.shape} by W_router {w.shape}: {n.shape[1]} != {w.shape[0]}")
        shape = (n.shape[0], w.shape[1])
        bias = ctx.p.shared.get("logit_bias")  # gpt-oss's router bias
        result = ctx.alg.linear(n.value, w.value, None if bias is None else bias.value)  # as the feed-forward network's products
        check_exact_size(ctx, self.id, result)
        product = n.letter * _WR
        formula = self.letter.eq(product + sym("b", sup="r") if bias is not None else product)
        return ctx.emit(self, None, [n.ref, "W_router"] + (["logit_bias"] if bias is not None else []), formula, result, shape)


class RouterScores(MoeKind):
    """DeepSeek-V3's affinities: the sigmoid of each logit."""

    id = "router_scores"
    reads, writes = ("router_L",), "router_S"
    letter, entry, symbol = sym("S", sup="r"), sym("s", sup="r"), "s^{r}"
    view = "elementwise"
    view_module = "elementview"

    def exact_size(self, problem, sizes):
        """1 / (1 + e^(-l)): the logit and three operations."""
        return sizes["router_L"] + 3

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and _moe(problem)["router"] == "sigmoid"

    def compute(self, ctx, head, state):
        lg = state["router_L"]
        result = ctx.alg.activation(lg.value, "sigmoid")
        check_exact_size(ctx, self.id, result)
        formula = self.letter.eq(Func("sigma", (lg.letter,)))
        return ctx.emit(self, None, [lg.ref], formula, result, lg.shape, {"activation": "sigmoid"})

    def entry_form(self, x, details):
        """One entry of the sigmoid: 1 / (1 + e^(-x))."""
        return Frac(node(1), node(1) + Power(sym("e"), Neg(node(x))))

    def view_numbers(self, details):
        return {}

    def carry(self, iv, step, args, mistake):
        return iv.monotone(args[0], lambda x: 1.0 / (1.0 + np.exp(-x)))  # increasing

    def json_details(self, details):
        return {"activation": "sigmoid"}


def _numbers(ctx, value) -> np.ndarray:
    """A matrix's entries to rank: floats in numeric mode; in exact mode the exact entries
    themselves (an object array), which `choose` orders with the algebra's exact `compare`."""
    if ctx.numeric:
        return np.asarray(value, dtype=float)
    return np.array(value.tolist(), dtype=object)


def _top(values, k: int, allowed=None, compare=None) -> tuple[int, ...]:
    """The k largest entries' indices, largest first; a tie goes to the lower index (numeric and
    exact mode alike; torch.topk on these rows gives the same sets). compare(a, b): the sign of
    a - b, decided exactly (exact mode); None: the floats' own order."""
    idx = [j for j in range(len(values)) if allowed is None or allowed[j]]
    if compare is None:
        order = sorted(idx, key=lambda j: (-values[j], j))
    else:
        from functools import cmp_to_key

        order = sorted(idx, key=cmp_to_key(lambda a, b: compare(values[b], values[a]) or a - b))
    return tuple(order[:k])


def choose(moe, logits, scores=None, bias=None, compare=None):
    """Each token's chosen experts (0-based, best first) and, for grouped routing, its groups.
    compare: exact mode's order of two entries (see `_top`)."""
    k = moe["top_k"]
    if moe["router"] == "softmax":
        return tuple(_top(row, k, compare=compare) for row in logits), None
    if compare is None:
        choice = scores + (0.0 if bias is None else bias)
    else:
        choice = scores if bias is None else np.array([[s + b for s, b in zip(row, bias[0])] for row in scores], dtype=object)
    g, tg = moe["n_group"], moe["topk_group"]
    size = choice.shape[1] // g
    chosen, groups = [], []
    for row in choice:
        if compare is None:
            group_score = [sum(sorted(row[q * size:(q + 1) * size], reverse=True)[:2]) if g > 1 else 0.0 for q in range(g)]
        else:  # the sum of each group's two best, exact
            group_score = [sum(row[q * size + j] for j in _top(row[q * size:(q + 1) * size], 2, compare=compare)) if g > 1 else 0
                           for q in range(g)]
        keep_groups = _top(group_score, tg, compare=compare) if g > 1 else tuple(range(g))
        allowed = [j // size in keep_groups for j in range(len(row))]
        chosen.append(_top(row, k, allowed, compare))
        groups.append(tuple(sorted(keep_groups)))
    return tuple(chosen), tuple(groups)


class RouterGates(MoeKind):
    """G: each token's weight for each expert, 0 for the experts it does not use."""

    id = "router_gates"
    reads, writes = ("router_L",), "router_G"
    letter, entry, symbol = sym("G"), sym("g", sup="r"), "g^{r}"  # g alone is a gradient's entry
    view = "routing"
    view_module = "moeview"
    symbols = ((_T, "moe_chosen", "index_set"),)
    #: the chosen weights not divided by their sum: Mixtral's softmax over all E experts kept at
    #: the top k, DeepSeek-V3's sigmoid scores as they are (times the scaling)
    mistakes = (Mistake("moe_weights_not_renormalised",
                        when=lambda steps: all(s.details["chosen"] is not None and s.details.get("normalize", True) for s in steps)),)

    def exact_size(self, problem, sizes):
        """Softmax: 1 / (1 + e^(l_k - l_j) + ...), k - 1 exponentials of a difference, which SymPy
        merges to about one logit's size each (measured 1.0 to 1.02 times L for k = 2, 2 x 2
        blocks of halves); a normalised sigmoid score holds the k chosen scores and its own
        (measured 2.5 times S, predicted 3)."""
        moe = _moe(problem)
        k = moe["top_k"]
        if moe["router"] == "softmax":
            return max(k - 1, 1) * sizes["router_L"] + k + 1
        s = sizes["router_S"]
        return ((k + 1) * s + k if moe["normalize"] else s) + 1

    def carry(self, iv, step, args, mistake):
        """The gates from the student's logits (softmax) or scores (sigmoid), the experts chosen
        as in the true trace; the softmax of the chosen logits and the normalised scores are
        monotone in each entry's own value and antitone in the others', so the enclosure takes
        each weight's end points from the opposite ends of the others."""
        d = step.details
        src = args[0]
        chosen = d["chosen"]
        if chosen is None or src.shape[0] != len(chosen):
            raise iv.Impossible()
        lo, hi = np.zeros(src.shape), np.zeros(src.shape)
        for i, es in enumerate(chosen):
            es = list(es)
            if d["router"] == "softmax":
                f = np.exp
                others = list(range(src.shape[1])) if mistake == "moe_weights_not_renormalised" else es
            else:
                f = lambda x: x  # noqa: E731 - the sigmoid scores themselves
                others = es
            c = float(d.get("scaling", 1)) if d["router"] == "sigmoid" else 1.0
            for j in es:
                rest = [k for k in others if k != j]
                if d["router"] == "sigmoid" and mistake == "moe_weights_not_renormalised":
                    lo[i, j], hi[i, j] = c * src.lo[i, j], c * src.hi[i, j]
                    continue
                top_lo, top_hi = f(src.lo[i, j]), f(src.hi[i, j])
                rest_lo, rest_hi = sum(f(src.lo[i, k]) for k in rest), sum(f(src.hi[i, k]) for k in rest)
                lo[i, j] = c * top_lo / (top_lo + rest_hi)
                hi[i, j] = c * top_hi / (top_hi + rest_lo)
        mid, rad = (lo + hi) / 2, (hi - lo) / 2
        return iv.Box(mid - rad - 1e-15 * (np.abs(mid) + 1), mid + rad + 1e-15 * (np.abs(mid) + 1))

    def compute(self, ctx, head, state):
        moe = _moe(ctx.p)
        lg = state["router_L"]
        sig = moe["router"] == "sigmoid"
        s = state.get("router_S") if sig else None
        shape = lg.shape
        bias = ctx.p.shared.get("router_bias")
        if "route" in moe:
            chosen = tuple(tuple(e - 1 for e in es) for es in moe["route"])
            groups = None
        elif ctx.p.mode == "shape":
            chosen, groups = None, None
        else:
            chosen, groups = choose(moe, _numbers(ctx, lg.value), _numbers(ctx, s.value) if sig else None,
                                    None if bias is None else _numbers(ctx, bias.value), None if ctx.numeric else ctx.alg.compare)
        if chosen is not None and len(chosen) != shape[0]:
            raise BadInput(f"moe.route lists {len(chosen)} tokens but there are {shape[0]}")
        details = {"router": moe["router"], "top_k": moe["top_k"], "chosen": chosen, "groups": groups}
        if chosen is None:
            result = None
        elif sig:
            result = ctx.alg.route_weights(s.value, chosen, moe["normalize"], moe["scaling"])
            details.update(normalize=moe["normalize"], scaling=moe["scaling"], n_group=moe["n_group"], topk_group=moe["topk_group"],
                           bias=bias is not None)
        else:
            keep = np.zeros(shape, dtype=bool)
            for i, es in enumerate(chosen):
                keep[i, list(es)] = True
            if ctx.p.mode == "exact":  # SymPy's own arithmetic, not the attention softmax's canonical form
                result = ctx.alg.gate_softmax(lg.value, chosen)
            else:
                result, soft = ctx.alg.softmax(ctx.alg.mask(lg.value, keep))
            details["keep"] = keep
        check_exact_size(ctx, self.id, result)
        g, k = sym("g", sup="r").at("i", "j"), sym("k")
        if sig:
            s_ij, s_ik = sym("s", sup="r").at("i", "j"), sym("s", sup="r").at("i", "k")
            w = Frac(s_ij, Sum(Op("in", k, _T), s_ik)) if moe["normalize"] else s_ij
            c = moe["scaling"]
            w = w if c == 1 else (node(c) if isinstance(c, (int, float)) else Value(c)) * w  # an exact "5/2" printed as given
            inputs = [s.ref, lg.ref] + (["router_bias"] if bias is not None else [])
        else:
            w = Frac(Power(sym("e"), sym("l").at("i", "j")), Sum(Op("in", k, _T), Power(sym("e"), sym("l").at("i", "k"))))
            inputs = [lg.ref]
        # the condition, not the word "otherwise": a formula's words are not translated (the zh report's too)
        formula = g.eq(Cases(((w, Op("in", sym("j"), _T)), (node(0), Op("notin", sym("j"), _T)))))
        return ctx.emit(self, None, inputs, formula, result, shape, details)

    def json_details(self, details):
        out = {"router": details["router"], "top_k": details["top_k"],
               "chosen": None if details["chosen"] is None else [[e + 1 for e in es] for es in details["chosen"]]}
        if details.get("groups") is not None:
            out["groups"] = [[q + 1 for q in gs] for gs in details["groups"]]
        if details["router"] == "sigmoid":
            out.update(normalize=details.get("normalize"), scaling=float(details.get("scaling", 1)))
        return out


def _swiglu(ctx, step, x, gate, up, down, biases=(None, None, None), clamp=None):
    """(SiLU(x W_gate) ⊙ x W_up) W_down, or with clamp = (alpha, limit) gpt-oss's
    ((clip(x W_up + b_up) + 1) ⊙ H ⊙ sigmoid(alpha H)) W_down + b_down, H = min(x W_gate + b_gate,
    limit); each product's exact size checked before the next."""
    alg = ctx.alg
    h = alg.linear(x, gate, biases[0])
    check_exact_size(ctx, step, h)
    u = alg.linear(x, up, biases[1])
    if clamp is None:
        a = alg.hadamard(alg.activation(h, "silu"), u)
    elif u is None:  # shape mode
        a = None
    else:
        alpha, limit = clamp
        g = alg.clamp(h, None, limit)
        glu = alg.hadamard(g, alg.activation(alg.times(g, alpha), "sigmoid"))
        a = alg.hadamard(alg.plus(alg.clamp(u, -limit, limit), alg.constant(tuple(u.shape), 1)), glu)
    check_exact_size(ctx, step, a)
    return alg.linear(a, down, biases[2])


def _number(ctx, x):
    """alpha or limit in the algebra's numbers: float64, or the exact rational of its decimal text."""
    if ctx.numeric or ctx.p.mode == "shape":
        return float(x)
    import sympy

    return x if isinstance(x, sympy.Basic) else sympy.Rational(repr(float(x)))


def _clamped(h, u, limit) -> int:
    """How many of an expert's gate entries exceed the limit or up entries leave [-limit, limit]."""
    return int(np.sum(np.asarray(h, float) > limit) + np.sum(np.abs(np.asarray(u, float)) > limit))


def _check(ctx, step, x, w_gate):
    if x.shape[1] != w_gate.shape[0]:
        raise BadInput(f"step {step}: cannot multiply {x.ref} {x.shape} by W_gate {w_gate.shape}: {x.shape[1]} != {w_gate.shape[0]}")


class Experts(MoeKind):
    """Y = [E_1(N) | ... | E_E(N)]: every expert's SwiGLU (or clamped SwiGLU) output for every token."""

    id = "experts"
    reads, writes = ("ffn_in",), "moe_Y"
    letter, entry, symbol = sym("Y"), sym("y"), "y"
    view = "experts"
    view_module = "moeview"
    #: gpt-oss's clamps left out: the gate not limited above, the up projection not clipped
    mistakes = (Mistake("moe_clamp_ignored", when=lambda steps: any(s.details.get("clamped") for s in steps)),)
    #: the symbols of its formula (`notation` gives their shapes): an expert's output, and gpt-oss's clamped gate and up projection
    added_meanings = ("expert_index",)  # `notation`: the expert index xi
    symbols = ((sym("Y").head(EXPERT_INDEX), "moe_expert_out", "expert"), (sym("H").head(EXPERT_INDEX), "moe_gate_clamped", "hidden"),
               (sym("U").head(EXPERT_INDEX), "moe_up_clamped", "hidden"))

    def notation(self, step):
        """Y with its entries, Y^(xi) (n, d), and with the clamped rule H^(xi) and U^(xi) (n, d_ff)."""
        rows = super().notation(step)[:1]
        n, d = step.shape[0], step.details["width"]
        shapes = {"expert": (n, d), "hidden": (n, step.details.get("hidden", d))}
        clamped = step.details.get("activation") == "clamped_swiglu"
        return (rows + [Symbol.of(EXPERT_INDEX, "expert_index", "index")]
                + [Symbol.of(s, key, shapes[shape]) for s, key, shape in self.symbols if clamped or shape == "expert"])

    def exact_size(self, problem, sizes):
        """Each expert's entry (`_expert_size`); the experts are alike."""
        return _expert_size(problem, sizes["ffn_in"], "E_gate@1")

    def compute(self, ctx, head, state):
        x = state["ffn_in"]
        moe = _moe(ctx.p)
        n_exp = moe["experts"]
        clamp = (_number(ctx, moe["alpha"]), _number(ctx, moe["limit"])) if moe.get("activation") == "clamped_swiglu" else None
        parts, inputs, clamped = [], [x.ref], 0
        for e in range(1, n_exp + 1):
            names = [f"E_{w}@{e}" for w in ("gate", "up", "down")] + ([f"Eb_{w}@{e}" for w in ("gate", "up", "down")] if moe.get("biases") else [])
            ops = [ctx.p.shared[n] for n in names]
            _check(ctx, self.id, x, ops[0])
            biases = tuple(o.value for o in ops[3:]) or (None, None, None)
            parts.append(_swiglu(ctx, self.id, x.value, *(o.value for o in ops[:3]), biases, clamp))
            if clamp is not None and ctx.numeric:
                clamped += _clamped(ctx.alg.linear(x.value, ops[0].value, biases[0]), ctx.alg.linear(x.value, ops[1].value, biases[1]), clamp[1])
            inputs += names
        result = None if parts[0] is None else ctx.alg.hstack(parts)
        check_exact_size(ctx, self.id, result)
        d = x.shape[1]
        formula = Parts((self.letter.eq(Hcat((sym("Y", sup="(1)"), Dots(), sym("Y", sup=f"({n_exp})")))),) + _expert_rules(x.letter, clamp, moe.get("biases")))
        details = {"experts": n_exp, "width": d, "biases": bool(moe.get("biases")), "activation": moe.get("activation", "swiglu"),
                   "hidden": ctx.p.shared["E_gate@1"].shape[1]}
        if clamp is not None:
            details.update(alpha=moe["alpha"], limit=moe["limit"], clamped=clamped if ctx.numeric else None)
        return ctx.emit(self, None, inputs, formula, result, (x.shape[0], n_exp * d), details)

    def carry(self, iv, step, args, mistake):
        d = step.details
        x, ws = args[0], args[1:]
        k = 6 if d.get("biases") else 3
        if len(ws) % k:
            raise iv.Impossible()
        clamp = None
        if d.get("activation") == "clamped_swiglu":
            clamp = (float(d["alpha"]), float(d["limit"]), mistake == "moe_clamp_ignored")
        return iv.stack([_swiglu_box(iv, x, *ws[j:j + 3], ws[j + 3:j + k], clamp) for j in range(0, len(ws), k)], axis=1)

    def message_params(self, step):
        return {"limit": step.details.get("limit", 7)}

    def json_details(self, details):
        out = {"experts": details["experts"], "width": details["width"]}
        if details.get("activation") == "clamped_swiglu":
            out.update(activation="clamped_swiglu", alpha=float(details["alpha"]), limit=float(details["limit"]))
        return out


def _expert_size(problem, x: int, gate: str) -> int:
    """Predicted operations of an expert's output entry from its input's x (Kind.exact_size):
    H and U sums of d products, SiLU(H) U (or the clamped rule), a sum of d_ff of those;
    measured 3.7 to 5.1 times the input's operations for d = 2, d_ff = 1 (SwiGLU and clamped):
    5 d / 2 per column of the hidden layer."""
    d, d_ff = problem.shared[gate].shape
    return d_ff * (5 * d * x // 2 + 4) + 1


def _expert_rules(x, clamp, biases) -> tuple:
    """Y^(xi) = (SiLU(X W_gate) ⊙ X W_up) W_down, or gpt-oss's clamped rule in three lines."""
    w = lambda part: sym("W", Word(part, roman=True)).head(EXPERT_INDEX)  # noqa: E731
    b = lambda part: sym("b", Word(part, roman=True)).head(EXPERT_INDEX)  # noqa: E731
    lin = lambda part: x * w(part) + b(part) if biases else x * w(part)  # noqa: E731
    y_e = sym("Y").head(EXPERT_INDEX)
    if clamp is None:
        out = Paren(Op("hadamard", Func("SiLU", (lin("gate"),)), lin("up"))) * w("down")
        return (y_e.eq(out + b("down") if biases else out),)
    alpha, limit = (node(int(float(c)) if float(c).is_integer() else float(c)) for c in clamp)
    h, u = sym("H").head(EXPERT_INDEX), sym("U").head(EXPERT_INDEX)
    glu = Op("hadamard", Op("hadamard", Paren(u + 1), h), sym("sigma") * Paren(alpha * h))
    out = Paren(glu, sized=True) * w("down")
    return (h.eq(Func("min", (lin("gate"), limit))), u.eq(Func("max", (Func("min", (lin("up"), limit)), Neg(limit)))),
            y_e.eq(out + b("down") if biases else out))


def _swiglu_box(iv, x, gate, up, down, biases=(), clamp=None):
    """An expert over intervals from the student's x: (SiLU(x W_gate) ⊙ x W_up) W_down, or the
    clamped rule, ((U + 1) ⊙ H ⊙ sigmoid(alpha H)) = SiLU(alpha H) ⊙ (U + 1) / alpha, its clamps
    monotone (clamp[2]: left out, the mistake moe_clamp_ignored)."""
    h, u = _matmul(iv, x, gate), _matmul(iv, x, up)
    if biases:
        h, u = iv.add(h, biases[0]), iv.add(u, biases[1])
    if clamp is None:
        a = iv.swiglu(h, u)
    else:
        alpha, limit, ignored = clamp
        if not ignored:
            h = iv.monotone(h, lambda v: np.minimum(v, limit))
            u = iv.monotone(u, lambda v: np.clip(v, -limit, limit))
        a = iv.swiglu(iv.monotone(h, lambda v: alpha * v), iv.monotone(u, lambda v: (v + 1.0) / alpha))
    out = _matmul(iv, a, down)
    return iv.add(out, biases[2]) if biases else out


class SharedExpert(MoeKind):
    """Y^s = E_s(N): the shared expert every token uses (DeepSeek-V3)."""

    id = "shared_expert"
    reads, writes = ("ffn_in",), "moe_Ys"
    letter, entry, symbol = sym("Y", sup="s"), sym("y", sup="s"), "y^{s}"
    view = "experts"
    view_module = "moeview"

    def exact_size(self, problem, sizes):
        return _expert_size(problem, sizes["ffn_in"], "S_gate")

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and _moe(problem)["shared"]

    def compute(self, ctx, head, state):
        x = state["ffn_in"]
        ops = [ctx.p.shared[f"S_{w}"] for w in ("gate", "up", "down")]
        _check(ctx, self.id, x, ops[0])
        result = _swiglu(ctx, self.id, x.value, *(o.value for o in ops))
        check_exact_size(ctx, self.id, result)
        w = lambda part: sym("W", Word(part, roman=True), "s")  # noqa: E731
        formula = self.letter.eq(Paren(Op("hadamard", Func("SiLU", (x.letter * w("gate"),)), x.letter * w("up"))) * w("down"))
        return ctx.emit(self, None, [x.ref, "S_gate", "S_up", "S_down"], formula, result, x.shape,
                        {"experts": 1, "width": x.shape[1]})

    def carry(self, iv, step, args, mistake):
        return _swiglu_box(iv, *args[:4])

    def json_details(self, details):
        return {"experts": 1, "width": details["width"]}


class MoeOut(MoeKind):
    """F = sum_xi G[:, xi] ⊙ Y^(xi) (+ Y^s): each token's weighted sum of its experts' outputs."""

    id = "moe_out"
    reads, writes = ("router_G", "moe_Y"), "F"
    letter, entry, symbol = sym("F"), sym("f"), "f"
    view = "moe_sum"
    view_module = "moeview"

    def exact_size(self, problem, sizes):
        """k products of a gate and an expert's entry, plus the shared expert's: SymPy merges
        their common parts (measured 0.9 to 1.6 times G + Y for k = 2), so (k + 1) / 2 of them."""
        k = _moe(problem)["top_k"]
        return (k + 1) * (sizes["router_G"] + sizes["moe_Y"] + 2) // 2 + sizes.get("moe_Ys", 0)

    def compute(self, ctx, head, state):
        g, y = state["router_G"], state["moe_Y"]
        ys = state.get("moe_Ys")
        n_exp, d = _moe(ctx.p)["experts"], y.shape[1] // _moe(ctx.p)["experts"]
        alg = ctx.alg
        total = None
        if g.value is not None:
            for e in range(n_exp):
                col = alg.columns(g.value, e, e + 1)
                term = alg.hadamard(alg.hstack([col] * d), alg.columns(y.value, e * d, (e + 1) * d))
                total = term if total is None else alg.plus(total, term)
            if ys is not None:
                total = alg.plus(total, ys.value)
        check_exact_size(ctx, self.id, total)
        row = Sum(Op("in", EXPERT_INDEX, _T), sym("g", sup="r").at("i", EXPERT_INDEX) * sym("y").head(EXPERT_INDEX).at("i"))
        if ys is not None:
            row = row + sym("y", sup="s").at("i")
        formula = sym("f").at("i").eq(row)
        inputs = [g.ref, y.ref] + ([ys.ref] if ys is not None else [])
        gates = next(s for s in reversed(ctx.steps) if s.id == "router_gates")
        return ctx.emit(self, None, inputs, formula, total, (g.shape[0], d),
                        {"chosen": gates.details["chosen"], "experts": n_exp, "width": d, "shared": ys is not None})

    def carry(self, iv, step, args, mistake):
        """sum_xi G[:, xi] ⊙ Y^(xi) (+ Y^s) from the student's gates and expert outputs."""
        g, y = args[0], args[1]
        n_exp, d = details_of(step)
        if y.shape != (g.shape[0], n_exp * d) or g.shape[1] != n_exp:
            raise iv.Impossible()
        total = None
        for e in range(n_exp):
            col = iv.Box(np.repeat(g.lo[:, e:e + 1], d, axis=1), np.repeat(g.hi[:, e:e + 1], d, axis=1))
            term = iv.times(col, iv.Box(y.lo[:, e * d:(e + 1) * d], y.hi[:, e * d:(e + 1) * d]))
            total = term if total is None else iv.add(total, term)
        return iv.add(total, args[2]) if len(args) > 2 else total

    def json_details(self, details):
        return {"experts": details["experts"], "shared": details["shared"]}


def details_of(step):
    return step.details["experts"], step.details["width"]


ROUTER_LOGITS, ROUTER_SCORES, ROUTER_GATES = RouterLogits(), RouterScores(), RouterGates()
EXPERTS, SHARED_EXPERT, MOE_OUT = Experts(), SharedExpert(), MoeOut()
_chain = ("ffn_out",)
for _k in (ROUTER_LOGITS, ROUTER_SCORES, ROUTER_GATES, EXPERTS, SHARED_EXPERT, MOE_OUT):
    _k.after, _chain = _chain, (_k.id,)
MOE_OUT.before = ("residual2",)
