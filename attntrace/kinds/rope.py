"""Rotary position embeddings: Q-tilde and K-tilde, the queries and keys turned by their positions.

RoPE (Su et al., RoFormer) splits a head's d_k columns into d_k/2 pairs and turns pair r of
the token at position p by the angle p theta_r, theta_r = base^(-2(r-1)/d_k), r = 1..d_k/2.
The paper writes theta_i; here i is the row index of every step (q_{ij}) and the imaginary unit
of the complex form, so the pair is r. Which columns pair up is the layout: "interleaved" pairs
adjacent columns (2r-1, 2r), as the
paper and Meta's reference code (complex numbers); "half" pairs column r with r + d_k/2, as
Hugging Face Llama's rotate_half. Both give the same scores up to a fixed permutation of the
columns. A rotation preserves lengths, and q_p . k_p' after rotation depends on p - p' only:
that is why RoPE encodes relative positions. V is never rotated.

The kinds run after the projections (or from given Q and K) and write the rotated matrices
under the roles Q and K, so the scores read them: scores' inputs name Q_rope and K_rope.
"""

from __future__ import annotations

import numpy as np

from attntrace.inputs.options import SpecOption
from attntrace.inputs.positional import check_positional, parse_rope
from attntrace.kinds.base import Kind, Mistake, Symbol
from attntrace.model.formula import Add, Frac, Func, Neg, Num, Paren, Parts, Power, sym
from attntrace.kinds.projection import kv_head
from attntrace.kinds.ropescaling import YARN_RAMP, attention_factor, frequency_factors

#: The kinds here run only for a problem with RoPE (`attntrace.kinds.registry` imports
#: this module only then).
RUNS_WITH = ("rope",)

#: `rope = true` or {base, layout, positions, kv_positions} (attntrace.inputs.positional), checked
#: against the problem: Q and K to turn, one position per token, an even head width.
SPEC_OPTIONS = (SpecOption("rope", lambda value, reader: parse_rope(value), "true or {base, layout, positions, kv_positions, scaling}",
                           check=lambda p: check_positional({"rope": p.extra["rope"]}, p.start, p.heads, p.shared)),)


def rope_pairs(layout: str, d: int) -> tuple[tuple[int, int], ...]:
    """The 0-based column pairs (j, k) that turn together, pair i at index i - 1."""
    half = d // 2
    if layout == "interleaved":
        return tuple((2 * i, 2 * i + 1) for i in range(half))
    return tuple((i, i + half) for i in range(half))


def rope_positions(problem, which: str, rows: int) -> tuple[int, ...]:
    """The positions of the queries (Q) or keys (K): given, or 0, 1, ..., rows - 1.

    The keys of cross-attention (X_kv) have positions of their own (kv_positions); in
    self-attention they share the queries'. With a KV cache the positions must be given
    (attntrace.kinds.cache checks that they follow the cached ones)."""
    rope = problem.extra["rope"]
    if which == "K" and rope["kv_positions"] is not None:
        return rope["kv_positions"]
    if rope["positions"] is not None and (which == "Q" or "X_kv" not in problem.shared):
        if len(rope["positions"]) == rows:
            return rope["positions"]
    return tuple(range(rows))


class Rope(Kind):
    pipeline = "head"
    view, prose = "rotation", "rope"
    view_module = "ropeview"
    explained_by_prose = True
    starts = ("X", "QKV")
    mistakes = (Mistake("rope_wrong_layout", also=("K_rope",)),
                Mistake("rope_positions_from_1", also=("K_rope",), when=lambda steps: any(list(s.details["positions"])[:1] == [0] for s in steps)))
    symbols = ((sym("theta", "r"), "rope_frequency", "pairs"), (sym("p"), "position", "scalar"))
    added_meanings = ("rope_factor", "yarn_ramp", "yarn_mu")  # with RoPE scaling (`notation`)

    def __init__(self, which: str):
        self.which = which
        self.id = f"{which}_rope"
        self.after = ("V",) if which == "Q" else ("Q_rope",)
        self.reads, self.writes = (which,), which
        self.letter, self.entry = sym(which, accent="tilde"), sym(which.lower(), accent="tilde")
        self.symbol = f"\\tilde{{{which.lower()}}}"  # SymPy's name of its entries

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and "rope" in problem.extra

    def compute(self, ctx, head, state):
        # grouped-query attention: a key head shared by a group of query heads turns once
        own = kv_head(ctx.p, head) if self.which == "K" else head
        memo = ctx.cache.setdefault("rope", {})
        if (self.id, own) in memo:
            return memo[(self.id, own)]
        x = state[self.which]
        rope = ctx.p.extra["rope"]
        rows, d = x.shape
        positions = rope_positions(ctx.p, self.which, rows)
        pairs = rope_pairs(rope["layout"], d)
        scaling = rope.get("scaling")
        factors = mu = None
        if scaling is not None:  # Llama 3.1 / YaRN: pair i turns by p c_i theta_i; YaRN multiplies by mu
            exact = ctx.alg.mode in ("exact", "symbolic")
            factors, mu = frequency_factors(scaling, rope["base"], d, exact), attention_factor(scaling, exact)
        angles = ctx.alg.rope_angles(positions, rope["base"], d, factors)  # (rows, d/2): p_r c_i theta_i
        result = ctx.alg.rotate_pairs(x.value, pairs, angles)
        if mu is not None and mu != 1:
            result = ctx.alg.times(result, mu)
        details = {"layout": rope["layout"], "base": rope["base"], "positions": positions, "pairs": pairs, "angles": angles, "d": d}
        if scaling is not None:
            details.update(scaling=scaling, factors=factors, mu=mu)
        grouped = self.which == "K" and ctx.p.extra.get("num_kv_heads") is not None and own is not None
        if grouped:  # the report shows it with the first query head of its group, as K
            details["query_heads"] = tuple(i for i in range(1, len(ctx.p.heads) + 1) if kv_head(ctx.p, i) == own)
        angle = Power(Num(base_text(rope["base"])), Frac(-(Num(2) * Paren(Add((sym("r"), Neg(Num(1))), tight=True))), sym("d", "k"), inline=True))
        rotated = Func("RoPE", (x.letter.head(own),))
        if mu is not None and mu != 1:  # YaRN's attention factor
            rotated = sym("mu") * rotated
        formula = Parts((self.letter.head(own).eq(rotated), sym("theta", "r").eq(angle)))
        flow = ctx.emit(self, own, [x.ref], formula, result, x.shape, details)
        if grouped:
            flow.ref = f"{self.id}@{own}"  # read by every query head of the group, as K@j
        memo[(self.id, own)] = flow
        return flow

    def notation(self, step):
        """With RoPE scaling also the factors c_r and, for YaRN, its ramp rho_r and attention factor mu.
        The paper writes the ramp gamma(r); gamma is a norm's gain in the blocks that use YaRN (RMSNorm)."""
        out = super().notation(step)
        if step.details.get("factors") is not None:
            out.append(Symbol(sym("c", "r"), "rope_factor", (1, step.shape[1] // 2)))
            if step.details["scaling"]["type"] == "yarn":
                out.append(Symbol(YARN_RAMP, "yarn_ramp", (1, step.shape[1] // 2)))
            mu = step.details.get("mu")
            if mu is not None and mu != 1:
                out.append(Symbol(sym("mu"), "yarn_mu", "scalar"))
        return out

    def report_params(self, steps):
        return {"rope_layout": steps[0].details["layout"]}

    def intro(self, term, steps):
        """The scores read the rotated Q-tilde and K-tilde."""
        return sym("Q", accent="tilde") * sym("K", accent="tilde").T() if self.which == "Q" else term

    def json_details(self, details):
        base = details["base"]
        out = {"layout": details["layout"], "base": base if isinstance(base, (int, float)) else str(base),
               "positions": list(details["positions"]), "pairs": [[j + 1, k + 1] for j, k in details["pairs"]]}
        if details.get("scaling") is not None:
            plain = lambda v: v if isinstance(v, (bool, int, float)) or v is None else str(v)  # noqa: E731
            out["scaling"] = {k: plain(v) for k, v in details["scaling"].items()}
            out["factors"] = [plain(c) for c in details["factors"]]
            out["attention_factor"] = plain(details["mu"])
        return {"rope": out}

    def overflow_how(self, inputs, details) -> str:
        return f"{inputs[0]} rotated by its positions"

    # -- the checker ---------------------------------------------------------------------------
    def carry(self, iv, step, args, mistake):
        """The student's Q or K turned by the positions' angles; rope_wrong_layout: the other
        pairing of the columns (half <-> interleaved); rope_positions_from_1: positions + 1."""
        det = step.details
        layout = det["layout"]
        positions = [float(p) for p in det["positions"]]
        if mistake == "rope_wrong_layout":
            layout = "half" if layout == "interleaved" else "interleaved"
        elif mistake == "rope_positions_from_1":
            positions = [p + 1 for p in positions]
        return rotate_rows(iv, args[0], det, layout, positions)

    def trace_params(self, steps):
        return {"rope_layout": steps[0].details.get("layout")}


def rotate_rows(iv, x, det, layout: str, positions):
    """Each row of the interval matrix x turned pair by pair by its position's angles (RoPE's
    rotation with the step details `det`: d, base, RoPE scaling's factors and mu), over intervals."""
    d = int(det["d"])
    positions = np.asarray(positions, dtype=np.float64)
    if x.shape != (len(positions), d):
        raise iv.Impossible()
    inv_freq = 1.0 / (float(det["base"]) ** (np.arange(0, d, 2, dtype=np.float64) / d))
    if det.get("factors") is not None:  # RoPE scaling: pair i turns by m c_i theta_i, then times mu
        inv_freq = inv_freq * np.asarray([float(c) for c in det["factors"]])
    mu = float(det["mu"]) if det.get("mu") is not None else 1.0
    angles = np.outer(positions, inv_freq)
    rows = []
    for r in range(x.shape[0]):
        rot = np.zeros((d, d))
        for p, (j, k) in enumerate(rope_pairs(layout, d)):
            c, s = np.cos(angles[r, p]), np.sin(angles[r, p])
            rot[j, j], rot[k, j], rot[j, k], rot[k, k] = mu * c, -mu * s, mu * s, mu * c
        rows.append(iv.matmul(iv.Box(x.lo[r:r + 1], x.hi[r:r + 1]), iv.point(rot)))
    return iv.stack(rows, axis=0)


def base_text(base) -> str:
    """The RoPE base as formulas write it: 10000, not 10000.0."""
    return str(int(base)) if isinstance(base, float) and base == int(base) else str(base)


Q_ROPE, K_ROPE = Rope("Q"), Rope("K")
