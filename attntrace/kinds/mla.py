"""Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1; DeepSeek-V3).

With X (n, d_model) the rows of the tokens (row vectors, as everywhere in attntrace):

    C^Q  = X W^DQ,   Ĉ^Q  = RMSNorm(C^Q)          the query LoRA (eq. 12; V2/V3 norm c^Q)
    C^KV = X W^DKV,  Ĉ^KV = RMSNorm(C^KV)         the compressed latent (eq. 9), what is cached
    K^R  = X W^KR,   K̃^R  = RoPE(K^R)             the decoupled RoPE key, one for all heads (eq. 15)
    per head i:
    Q^C(i) = Ĉ^Q W^UQ(i),   Q^R(i) = Ĉ^Q W^QR(i),   Q̃^R(i) = RoPE(Q^R(i))     (eqs. 13, 14)
    K^C(i) = Ĉ^KV W^UK(i),  V^(i) = Ĉ^KV W^UV(i)                               (eqs. 10, 11)
    Q^(i) = [Q^C(i)  Q̃^R(i)],  K^(i) = [K^C(i)  K̃^R]                           (eqs. 16, 17)

and then the usual S = Q K^T scaled by sqrt(d_nope + d_rope) (the width of [q^C; q^R]),
mask, softmax, Z = A V, concat, W^O: the existing kinds. RoPE is applied only to the
decoupled parts: rotating K^C would put a position-dependent matrix between W^UQ and W^UK,
and W^UK could no longer be absorbed (the paper's reason for the decoupled key).

Absorption (section 2.1.2): Q^C K^C^T = Ĉ^Q W^UQ (Ĉ^KV W^UK)^T = Ĉ^Q (W^UQ W^UK^T) Ĉ^KV^T,
so a decoder keeps only Ĉ^KV and K̃^R per token (d_c + d_rope numbers instead of 2 h d_k)
and never builds K. The kinds W_absorbed, Q_absorbed, scores_C, scores_R, scores_absorbed
compute the scores that way and record how far they are from S (0 in exact mode).

A latent cache (`mla.c_KV_past`, `mla.k_R_past`) holds Ĉ^KV and K̃^R of earlier tokens; the
steps C_KV_cache and K_R_cache append the new tokens' rows, as Hugging Face's DeepseekV3
caches `kv_nope` (after its norm) and `k_rot` (after RoPE).

The layer-wide steps (head None) run once, in the first head's pipeline, and are kept in
`ctx.cache["mla"]` under their role for the heads to read.
"""

from __future__ import annotations


import numpy as np

from attntrace.inputs.mlaspec import MLA_OPERANDS as OPERANDS  # noqa: F401 - its matrices' names (attntrace.kinds.notation)
from attntrace.inputs.mlaspec import check_mla_rope, parse_mla
from attntrace.inputs.options import SpecOption
from attntrace.kinds.base import Flow, Kind, Mistake, base_sym
from attntrace.model.formula import Add, Frac, Func, Hcat, Neg, Num, Paren, Parts, Power, Sqrt, Stack, Word, sym
from attntrace.kinds.exactsize import check_exact_size
from attntrace.kinds.rope import rope_pairs, rope_positions
from attntrace.model.trace import Operand

#: The kinds here run only for a problem with multi-head latent attention (`attntrace.kinds.registry` imports
#: this module only then).
RUNS_WITH = ("mla",)


#: `mla = {...}` (attntrace.inputs.mlaspec): its projections make each head's Q, K and V from X.
SPEC_OPTIONS = (SpecOption("mla", parse_mla, "a table {W_DKV, W_UK, W_UV, W_KR, W_UQ, W_QR}", check=check_mla_rope, start="X"),)


def _on(problem) -> bool:
    return "mla" in problem.extra


def _memo(ctx) -> dict:
    return ctx.cache.setdefault("mla", {})


def _hs_unused(head) -> str:
    return "" if head is None else f"({head})"


class MlaKind(Kind):
    """What every MLA kind shares: it runs when the spec has `mla`, from X."""

    starts = ("X",)
    prose = "mla"
    explained_by_view = True  # C_Q and C_KV, their norms, the two rotations: said once each
    one_of_many = True
    pipeline = "head"
    layer = False  # True: computed once for all heads (head None)
    #: A further condition of the spec (the query LoRA's steps run only when it has one).
    _enabled = None

    def carry(self, iv, step, args, mistake):
        """A product A W or A B^T (details `transposed`) from the student's values."""
        if len(args) != 2:
            raise iv.Impossible()
        a, b = args[0], (args[1].T if step.details.get("transposed") else args[1])
        if a.shape[1] != b.shape[0]:
            raise iv.Impossible()
        return iv.matmul(a, b)

    def enabled(self, problem) -> bool:
        return _on(problem) and super().enabled(problem) and (self._enabled is None or self._enabled(problem))

    def flow_in(self, ctx, state, role: str) -> Flow:
        """A value the step reads: a layer role from the memo, else the head's state."""
        memo = _memo(ctx)
        if role == "input" or (role == "cq" and "cq" not in memo):  # no query LoRA: the queries project X
            return ctx.source("X")
        return memo[role] if role in memo else state[role]

    def put(self, ctx, state, flow: Flow):
        """A layer value goes to the memo (the tracer's head state would lose it); a head's to its state."""
        if self.layer:
            _memo(ctx)[self.writes] = flow
            return None
        return flow

    def done(self, ctx) -> bool:
        return self.layer and self.id in _memo(ctx).setdefault("made", set())

    def made(self, ctx) -> None:
        if self.layer:
            _memo(ctx)["made"].add(self.id)


class MlaProduct(MlaKind):
    """A product A W (W an operand, shared or the head's block): C^KV = X W^DKV, Q^C(i) = Ĉ^Q W^UQ(i), ..."""

    view = "product"

    def __init__(self, id, reads, weight, writes, letter, entry, layer=False, enabled=None):
        self.id, self.reads, self.writes, self.weight = id, (reads,), writes, weight
        self.letter, self.entry, self.symbol, self.layer = letter, base_sym(entry), entry, layer
        self.per_head = not layer
        self._enabled = enabled

    def compute(self, ctx, head, state):
        if self.done(ctx):
            return None
        a = self.flow_in(ctx, state, self.reads[0])
        w_op = ctx.p.shared[self.weight] if self.layer else state[self.weight]
        w = ctx.operand(w_op)
        result, shape = ctx.product(self.id, head, a, w)
        check_exact_size(ctx, self.id, result)
        h = None if self.layer else head
        from attntrace.inputs.mlaspec import MLA_OPERANDS

        formula = self.letter.head(h).eq(a.letter * MLA_OPERANDS[self.weight][0].head(h))  # what it reads is the layer's
        flow = ctx.emit(self, h, [a.ref, self.weight], formula, result, shape)
        self.made(ctx)
        return self.put(ctx, state, flow)


class MlaNorm(MlaKind):
    """Ĉ = RMSNorm(C): DeepSeek-V2/V3 normalise the compressed query and latent (q_a_layernorm, kv_a_layernorm)."""

    view = "norm"
    view_module = "blockview"
    elementwise = "hadamard"
    per_head = False
    layer = True

    def __init__(self, id, reads, writes, letter, entry, which, enabled=None):
        self.id, self.reads, self.writes, self.which = id, (reads,), writes, which
        self.letter, self.entry, self.symbol = letter, base_sym(entry), entry
        self._enabled = enabled

    def compute(self, ctx, head, state):
        if self.done(ctx):
            return None
        r = self.flow_in(ctx, state, self.reads[0])
        key = "q_norm" if self.which == "Q" else "kv_norm"
        eps = ctx.p.extra["mla"][f"{key}_eps"]
        gain = ctx.p.shared.get(f"gamma_{self.which}")
        result, details = ctx.alg.norm(r.value, None if gain is None else gain.value, None, _eps(ctx, eps), True)
        check_exact_size(ctx, self.id, result)
        entry = r.entry.at("i", "j") / Sqrt(sym("nu", "i") + sym("varepsilon"))
        gsym = sym("gamma", sup=self.which)
        if gain is not None:
            entry = sym("gamma", "j") * entry
        function = Func("RMSNorm", (r.letter,), params=(gsym,) if gain is not None else ())
        formula = Parts((self.letter.eq(function), self.entry.at("i", "j").eq(entry)))
        inputs = [r.ref] + ([gain.name] if gain is not None else [])
        details = {**details, "norm": "rms", "eps": eps, "which": self.which}
        flow = ctx.emit(self, None, inputs, formula, result, r.shape, details)
        self.made(ctx)
        return self.put(ctx, state, flow)

    def carry(self, iv, step, args, mistake):
        gain = args[1] if len(args) > 1 else None
        return iv.norm(args[0], gain, None, float(step.details["eps"]), True)

    def json_details(self, details):
        return {"norm": "rms", "eps": details["eps"], "mean_square": [float(x) if not hasattr(x, "free_symbols") else str(x)
                                                                        for x in details.get("mean_square", ())]}


class MlaRope(MlaKind):
    """K̃^R = RoPE(K^R) once for all heads; Q̃^R(i) = RoPE(Q^R(i)) per head: only the decoupled parts turn."""

    view = "rotation"
    view_module = "ropeview"

    def __init__(self, id, reads, writes, letter, entry, layer):
        self.id, self.reads, self.writes, self.layer = id, (reads,), writes, layer
        self.letter, self.entry, self.symbol = letter, base_sym(entry), entry
        self.per_head = not layer

    def compute(self, ctx, head, state):
        if self.done(ctx):
            return None
        x = self.flow_in(ctx, state, self.reads[0])
        rope = ctx.p.extra["rope"]
        rows, d = x.shape
        positions = rope_positions(ctx.p, "Q", rows)
        pairs = rope_pairs(rope["layout"], d)
        scaling = rope.get("scaling")
        factors = mu = None
        if scaling is not None:  # DeepSeek-V3's YaRN on the decoupled parts: pair r turns by p c_r theta_r, times mu
            from attntrace.kinds.ropescaling import attention_factor, frequency_factors

            exact = ctx.alg.mode in ("exact", "symbolic")
            factors, mu = frequency_factors(scaling, rope["base"], d, exact), attention_factor(scaling, exact)
        angles = ctx.alg.rope_angles(positions, rope["base"], d, factors)
        result = ctx.alg.rotate_pairs(x.value, pairs, angles)
        if mu is not None and mu != 1:
            result = ctx.alg.times(result, mu)
        h = None if self.layer else head
        base = rope["base"]
        from attntrace.kinds.rope import base_text

        angle = Power(Num(base_text(base)), Frac(-(Num(2) * Paren(Add((sym("r"), Neg(Num(1))), tight=True))), sym("d", "k"), inline=True))
        rotated = Func("RoPE", (x.letter.head(h),))
        formula = Parts((self.letter.head(h).eq(sym("mu") * rotated if mu is not None and mu != 1 else rotated), sym("theta", "r").eq(angle)))
        details = {"layout": rope["layout"], "base": base, "positions": positions, "pairs": pairs, "angles": angles, "d": d}
        if scaling is not None:
            details.update(scaling=scaling, factors=factors, mu=mu)
        flow = ctx.emit(self, h, [x.ref], formula, result, x.shape, details)
        self.made(ctx)
        return self.put(ctx, state, flow)

    def carry(self, iv, step, args, mistake):
        det = step.details
        factors = None if det.get("factors") is None else [float(c) for c in det["factors"]]
        out = rotate_box(iv, args[0], det["layout"], [float(p) for p in det["positions"]], float(det["base"]), factors)
        mu = det.get("mu")
        return out if mu is None or mu == 1 else iv.monotone(out, lambda v: float(mu) * v)

    def json_details(self, details):
        base = details["base"]
        out = {"layout": details["layout"], "base": base if isinstance(base, (int, float)) else str(base),
               "positions": list(details["positions"]), "pairs": [[j + 1, k + 1] for j, k in details["pairs"]]}
        if details.get("scaling") is not None:
            plain = lambda v: v if isinstance(v, (bool, int, float)) or v is None else str(v)  # noqa: E731
            out.update(scaling={k: plain(v) for k, v in details["scaling"].items()}, factors=[plain(c) for c in details["factors"]],
                       attention_factor=plain(details["mu"]))
        return {"rope": out}


class MlaCache(MlaKind):
    """C^KV_cache = [C^KV_past; Ĉ^KV], K^R_cache = [K^R_past; K̃^R]: the latent cache, d_c + d_rope numbers a token."""

    view = "cache"
    view_module = "cacheview"
    per_head = False
    layer = True
    symbol = None  # keeps the past entries' and the new rows' own names

    def __init__(self, id, reads, past, writes, letter, entry):
        self.id, self.reads, self.past, self.writes = id, (reads,), past, writes
        self.letter, self.entry = letter, base_sym(entry)

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and problem.extra["mla"]["past"] > 0

    def compute(self, ctx, head, state):
        if self.done(ctx):
            return None
        from attntrace.inputs.mlaspec import MLA_OPERANDS

        new = self.flow_in(ctx, state, self.reads[0])
        old = ctx.operand(ctx.p.shared[self.past])
        result = ctx.alg.vstack([old.value, new.value])
        shape = (old.shape[0] + new.shape[0], old.shape[1])
        formula = self.letter.eq(Stack((MLA_OPERANDS[self.past][0], new.letter)))
        details = {"past_rows": old.shape[0], "new_rows": new.shape[0]}
        flow = ctx.emit(self, None, [self.past, new.ref], formula, result, shape, details)
        self.made(ctx)
        return self.put(ctx, state, flow)

    def carry(self, iv, step, args, mistake):
        past, new = args
        if past.shape[1] != new.shape[1]:
            raise iv.Impossible()
        return iv.stack([past, new], axis=0)

    def json_details(self, details):
        return {"past_rows": details["past_rows"], "new_rows": details["new_rows"]}


class MlaConcat(MlaKind):
    """Q^(i) = [Q^C(i)  Q̃^R(i)], K^(i) = [K^C(i)  K̃^R]: a head's query and key, d_nope + d_rope wide."""

    view = "stack"
    view_module = "mlaview"
    #: RoPE on the content parts too: Q = [RoPE(Q^C)  Q̃^R], K = [RoPE(K^C)  K̃^R] (only told
    #: apart when d_nope is even, so that the content part has pairs to turn)
    mistakes = (Mistake("mla_rope_on_compressed", also=("K_mla",), when=lambda steps: all(s.details["parts"][0] % 2 == 0 for s in steps)),)
    symbol = None  # the entries are the parts' own names, side by side

    def __init__(self, id, parts, writes, letter, entry):
        self.id, self.reads, self.writes = id, parts, writes
        self.letter, self.entry = letter, base_sym(entry)

    def compute(self, ctx, head, state):
        a, b = (self.flow_in(ctx, state, r) for r in self.reads)
        result = ctx.alg.hstack([a.value, b.value])
        shape = (a.shape[0], a.shape[1] + b.shape[1])
        hb = None if self.reads[1] in ("kr",) else head
        formula = self.letter.head(head).eq(Hcat((a.letter.head(head), b.letter.head(hb))))
        rope = ctx.p.extra["rope"]
        details = {"parts": (a.shape[1], b.shape[1]), "layout": rope["layout"], "base": rope["base"],
                   "positions": rope_positions(ctx.p, "Q", a.shape[0])}  # what the checker's planted mistake turns by
        flow = ctx.emit(self, head, [a.ref, b.ref], formula, result, shape, details)
        return flow

    def carry(self, iv, step, args, mistake):
        a, b = args
        if a.shape[0] != b.shape[0]:
            raise iv.Impossible()
        if mistake == "mla_rope_on_compressed":
            det = step.details
            if a.shape[1] % 2:
                raise iv.Impossible()
            a = rotate_box(iv, a, det["layout"], [float(p) for p in det["positions"]], float(det["base"]))
        return iv.stack([a, b], axis=1)

    def json_details(self, details):
        return {"parts": list(details["parts"])}


class MlaAbsorbProduct(MlaKind):
    """One product of the absorbed scores: W^QK(i) = W^UQ(i) W^UK(i)^T, Q^L(i) = Ĉ^Q W^QK(i),
    S^C(i) = Q^L(i) Ĉ^KV^T, S^R(i) = Q̃^R(i) K̃^R^T. `transposed`: the second factor is."""

    view = "product"

    def __init__(self, id, a, b, transposed, letter, entry, rhs):
        self.id, self.reads, self.writes, self.transposed = id, (a, b), id, transposed
        self.letter, self.entry, self.symbol = letter, base_sym(entry), entry
        self.rhs = rhs  # head -> the right side, a formula

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and problem.extra["mla"].get("absorb", True)

    def _operand(self, ctx, state, role):
        given = state.get(role)
        return ctx.operand(given) if isinstance(given, Operand) else self.flow_in(ctx, state, role)

    def compute(self, ctx, head, state):
        a, b = (self._operand(ctx, state, r) for r in self.reads)
        result, shape = ctx.product(self.id, head, a, b, b_transposed=self.transposed)
        check_exact_size(ctx, self.id, result)
        formula = self.letter.head(head).eq(self.rhs(head))
        return ctx.emit(self, head, [a.ref, b.ref], formula, result, shape, {"transposed": self.transposed})


class MlaAbsorbed(MlaKind):
    """S^A(i) = S^C(i) + S^R(i): the scores without K, and how far they are from S = Q K^T."""

    view = "absorbed"
    view_module = "mlaview"
    elementwise = "add"
    reads, writes = ("scores_C", "scores_R"), "scores_absorbed"
    letter, entry, symbol = sym("S", sup="A"), sym("s", sup="A"), "s^{A}"
    id = "scores_absorbed"

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and problem.extra["mla"].get("absorb", True)

    def compute(self, ctx, head, state):
        c, r, s = state["scores_C"], state["scores_R"], state["S"]
        result = ctx.alg.plus(c.value, r.value)
        formula = self.letter.head(head).eq(c.letter.head(head) + r.letter.head(head))
        gap = _gap(ctx, result, s.value)
        return ctx.emit(self, head, [c.ref, r.ref], formula, result, s.shape, {"gap": gap, "scores": s.ref})

    def carry(self, iv, step, args, mistake):
        if args[0].shape != args[1].shape:
            raise iv.Impossible()
        return iv.add(args[0], args[1])

    def json_details(self, details):
        return {"gap_to_scores": details["gap"]}


def _gap(ctx, absorbed, scores):
    """max |S^A - S|: a float (numeric), 0 when exact arithmetic gives S itself, None in
    symbolic and shape mode (the steps hold entry names there, not what they stand for)."""
    if ctx.numeric:
        import numpy as np

        return float(np.max(np.abs(absorbed - scores))) if absorbed.size else 0.0
    if ctx.p.mode == "exact":
        import sympy

        diff = (sympy.Matrix(absorbed) - sympy.Matrix(scores)).applyfunc(sympy.nsimplify)
        return 0 if all(sympy.simplify(x) == 0 for x in diff) else float(max(abs(sympy.N(x)) for x in diff))
    return None


def rotate_box(iv, x, layout: str, positions, base: float, factors=None):
    """Each row of the interval matrix x turned pair by pair by its position's angles (RoPE over
    intervals: a row times a fixed rotation, an interval product); `factors`: RoPE scaling's c_i."""
    rows, d = x.shape
    if rows != len(positions) or d % 2:
        raise iv.Impossible()
    inv_freq = 1.0 / (base ** (np.arange(0, d, 2, dtype=np.float64) / d))
    if factors is not None:
        inv_freq = inv_freq * np.asarray(factors, dtype=np.float64)
    out = []
    for r in range(rows):
        rot = np.zeros((d, d))
        for p, (j, k) in enumerate(rope_pairs(layout, d)):
            c, s = np.cos(positions[r] * inv_freq[p]), np.sin(positions[r] * inv_freq[p])
            rot[j, j], rot[k, j], rot[j, k], rot[k, k] = c, -s, s, c
        out.append(iv.matmul(iv.Box(x.lo[r:r + 1], x.hi[r:r + 1]), iv.point(rot)))
    return iv.stack(out, axis=0)


def _eps(ctx, eps: float):
    """eps in the algebra's numbers: float64, or the exact rational of its decimal text."""
    if ctx.numeric or ctx.p.mode == "shape":
        return float(eps)
    import sympy

    return sympy.Rational(repr(float(eps)))


def _q_lora(problem) -> bool:
    return problem.extra["mla"]["q_lora"]


def _past(problem) -> bool:
    return problem.extra["mla"]["past"] > 0


# -- the layer: the query LoRA, the latent, the shared RoPE key --------------------------------------
C_Q = MlaProduct("C_Q", "input", "W_DQ", "cq_raw", sym("C", sup="Q"), "c^{Q}", layer=True, enabled=_q_lora)
C_Q_NORM = MlaNorm("C_Q_norm", "cq_raw", "cq", sym("C", sup="Q", accent="hat"), "\\hat{c}^{Q}", "Q", enabled=_q_lora)
C_KV = MlaProduct("C_KV", "input", "W_DKV", "ckv_raw", sym("C", sup="KV"), "c^{KV}", layer=True)
C_KV_NORM = MlaNorm("C_KV_norm", "ckv_raw", "ckv", sym("C", sup="KV", accent="hat"), "\\hat{c}^{KV}", "KV")
K_R = MlaProduct("K_R", "input", "W_KR", "kr_raw", sym("K", sup="R"), "k^{R}", layer=True)
K_R_ROPE = MlaRope("K_R_rope", "kr_raw", "kr", sym("K", sup="R", accent="tilde"), "\\tilde{k}^{R}", layer=True)
C_KV_CACHE = MlaCache("C_KV_cache", "ckv", "c_KV_past", "ckv", sym("C", Word("cache"), sup="KV"), "c^{KV}")
K_R_CACHE = MlaCache("K_R_cache", "kr", "k_R_past", "kr", sym("K", Word("cache"), sup="R"), "k^{R}")
# -- per head: the up-projections, the head's RoPE query, the stacked query and key --------------------
Q_C = MlaProduct("Q_C", "cq", "W_UQ", "QC", sym("Q", sup="C"), "q^{C}")
Q_R = MlaProduct("Q_R", "cq", "W_QR", "QR_raw", sym("Q", sup="R"), "q^{R}")
Q_R_ROPE = MlaRope("Q_R_rope", "QR_raw", "QR", sym("Q", sup="R", accent="tilde"), "\\tilde{q}^{R}", layer=False)
K_C = MlaProduct("K_C", "ckv", "W_UK", "KC", sym("K", sup="C"), "k^{C}")
V_C = MlaProduct("V_C", "ckv", "W_UV", "V", sym("V"), "v")
Q_MLA = MlaConcat("Q_mla", ("QC", "QR"), "Q", sym("Q"), "q")
K_MLA = MlaConcat("K_mla", ("KC", "kr"), "K", sym("K"), "k")
# they make the head's Q, K, V: the projections and the RoPE of Q and K do not run
Q_MLA.replaces, K_MLA.replaces, V_C.replaces = ("Q", "Q_rope"), ("K", "K_rope"), ("V",)

# -- absorption, after the scores: the same scores from the latents, K never built ---------------
_UQ, _UK, _QK = sym("W", sup="UQ"), sym("W", sup="UK"), sym("W", sup="QK")
W_ABSORBED = MlaAbsorbProduct("W_absorbed", "W_UQ", "W_UK", True, sym("W", sup="QK"), "w^{QK}", lambda h: _UQ.head(h) * _UK.head(h).T())
Q_ABSORBED = MlaAbsorbProduct("Q_absorbed", "cq", "W_absorbed", False, sym("Q", sup="L"), "q^{L}",
                              lambda h: sym("C", sup="Q", accent="hat") * _QK.head(h))
SCORES_C = MlaAbsorbProduct("scores_C", "Q_absorbed", "ckv", True, sym("S", sup="C"), "s^{C}",
                            lambda h: sym("Q", sup="L").head(h) * sym("C", sup="KV", accent="hat").T())
SCORES_R = MlaAbsorbProduct("scores_R", "QR", "kr", True, sym("S", sup="R"), "s^{R}",
                            lambda h: sym("Q", sup="R", accent="tilde").head(h) * sym("K", sup="R", accent="tilde").T())
SCORES_ABSORBED = MlaAbsorbed()
#: After the scores (they read S to compare).
MLA_ABSORB_KINDS: tuple[Kind, ...] = (W_ABSORBED, Q_ABSORBED, SCORES_C, SCORES_R, SCORES_ABSORBED)

#: In the head pipeline after the (disabled) Q, K, V projections and before the scores.
MLA_KINDS: tuple[Kind, ...] = (C_Q, C_Q_NORM, C_KV, C_KV_NORM, K_R, K_R_ROPE, C_KV_CACHE, K_R_CACHE,
                               Q_C, Q_R, Q_R_ROPE, K_C, V_C, Q_MLA, K_MLA)

# where they run: after the (then disabled) projections, before RoPE of Q and K; the absorbed
# scores after the scores, before the scaling
_chain = ("V",)
for _k in MLA_KINDS:
    _k.after, _chain = _chain, (_k.id,)
K_MLA.before = ("Q_rope",)
_chain = ("scores",)
for _k in MLA_ABSORB_KINDS:
    _k.after, _chain = _chain, (_k.id,)
SCORES_ABSORBED.before = ("scaled",)
del _k, _chain
