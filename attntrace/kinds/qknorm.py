"""QK-norm: RMSNorm of each head's rows of Q and K before RoPE and the scores (Q-hat, K-hat).

Qwen3, Gemma 3 and OLMo 2 normalise the queries and keys of every head before the rotary
embedding: each row q_i (one token, the head's d_k features) becomes
q-hat_ij = g_j q_ij / sqrt(nu_i + eps), nu_i = (1/d_k) sum_k q_ik^2, RMSNorm (Zhang & Sennrich
2019, as torch.nn.RMSNorm and Hugging Face's Qwen3RMSNorm applied to q_proj(x).view(..., head_dim)),
and the same for K with its own gain. The dot products of the scores are then at most
d_k g^2 in size whatever the projections' scale, which keeps the logits from growing in training.
The spec says `qk_norm = true` (eps 1e-6, no gain) or `qk_norm = {eps = 1e-6, g_q = [...],
g_k = [...]}` (one gain per feature of a head, shared by the heads, as the models do).

Everything about the kinds is here: the spec option, their place (after the projections,
before RoPE), the computation (the algebra's RMSNorm, one body for four modes), formulas, the
JSON fields, the cost in exact mode, the carry-forward rule (the RMSNorm enclosure of
`iv.norm`) and the mistake `qk_norm_mean_subtracted`: LayerNorm instead of RMSNorm (each row's
mean taken off, the variance instead of the mean square).
"""

from __future__ import annotations

from attntrace.inputs.numbers import real_number
from attntrace.inputs.options import SpecOption, table
from attntrace.kinds.base import Kind, Mistake
from attntrace.kinds.exactsize import check_exact_size
from attntrace.kinds.projection import kv_head
from attntrace.model.errors import BadInput
from attntrace.model.formula import Func, Parts, Sqrt, sym

#: The kinds here run only for a problem with QK-norm (`attntrace.kinds.registry` imports
#: this module only then).
RUNS_WITH = ("qk_norm",)

#: The gains (notation): gamma as every gain, q and k as the heads' rows they scale.
OPERANDS = {"g_q": (sym("gamma", sup="q"), "\\gamma^{q}"), "g_k": (sym("gamma", sup="k"), "\\gamma^{k}")}

GAINS = {"Q": "g_q", "K": "g_k"}


def _parse(value, reader):
    """`qk_norm = true`, or a table {eps, g_q, g_k}; false: off."""
    if value is False:
        return None
    settings = table({} if value is True else value, "qk_norm", ("eps", "g_q", "g_k"))
    eps = real_number(settings.get("eps", 1e-6), "qk_norm.eps", "a number >= 0 (the models use 1e-6)", low_closed=True, high=1.0)
    for key in GAINS.values():
        if key in settings:
            raw = settings[key]
            row = [raw] if isinstance(raw, (list, tuple)) and raw and not isinstance(raw[0], (list, tuple, dict)) else raw
            op = reader.share(reader.matrix(row, key, f"\\gamma^{{{key[-1]}}}"))
            if op.shape[0] != 1:
                raise BadInput(f"qk_norm.{key} must be one row of gains, one per feature of a head (d_k), not {op.shape[0]} rows")
    return {"eps": eps}


SPEC_OPTIONS = (SpecOption("qk_norm", _parse, "true or {eps = 1e-6, g_q = [...], g_k = [...]}"),)


def _eps(ctx, eps):
    """eps in the algebra's numbers: float64, or the exact rational of its decimal text."""
    if ctx.numeric or ctx.p.mode == "shape":
        return float(eps)
    import sympy

    return eps if isinstance(eps, sympy.Basic) else sympy.Rational(repr(float(eps)) if isinstance(eps, float) else eps)


class QKNorm(Kind):
    pipeline = "head"
    starts = ("X", "QKV")
    view, prose = "norm", "qk_norm"
    view_module = "blockview"
    elementwise = "hadamard"  # the gain multiplies each row
    explained_by_prose = True
    symbols = ((sym("nu", "i"), "mean_square", "rows"), (sym("varepsilon"), "norm_eps", "scalar"))

    def __init__(self, which: str):
        self.which = which
        self.id = f"{which}_norm"
        self.after, self.before = ("V",) if which == "Q" else ("Q_norm",), ("Q_rope",)
        self.reads, self.writes = (which,), which
        self.letter, self.entry = sym(which, accent="hat"), sym(which.lower(), accent="hat")
        self.symbol = f"\\hat{{{which.lower()}}}"  # SymPy's name of its entries
        self.gain = GAINS[which]
        self.mistakes = (Mistake("qk_norm_mean_subtracted", also=("K_norm",)),) if which == "Q" else ("qk_norm_mean_subtracted",)

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and "qk_norm" in problem.extra

    def compute(self, ctx, head, state):
        # grouped-query attention: a key head shared by a group of query heads is normalised once
        own = kv_head(ctx.p, head) if self.which == "K" else head
        memo = ctx.cache.setdefault("qk_norm", {})
        if (self.id, own) in memo:
            return memo[(self.id, own)]
        x = state[self.which]
        eps = ctx.p.extra["qk_norm"]["eps"]
        gain = ctx.p.shared.get(self.gain)
        if gain is not None and gain.shape != (1, x.shape[1]):
            raise BadInput(f"qk_norm.{self.gain} has {gain.shape[1]} gains but a head's {self.which} has d_k = {x.shape[1]} features")
        result, details = ctx.alg.norm(x.value, None if gain is None else gain.value, None, _eps(ctx, eps), True)
        if float(eps) == 0:
            spread = details.get("mean_square")
            for i, v in enumerate(() if spread is None else spread):
                if v is not None and not getattr(v, "free_symbols", None) and v == 0:
                    raise BadInput(f"step {self.id}: row {i + 1} of {x.ref} is zero and qk_norm.eps = 0, so RMSNorm divides 0 by 0; give eps > 0")
        check_exact_size(ctx, self.id, result)
        e = self.which.lower()
        entry = sym(e).at("i", "j") / Sqrt(sym("nu", "i") + sym("varepsilon"))
        if gain is not None:
            entry = sym("gamma", sup=e).at("j") * entry
        formula = Parts((self.letter.head(own).eq(Func("RMSNorm", (x.letter.head(own),))), self.entry.at("i", "j").eq(entry)))
        details = {**details, "norm": "rms", "eps": eps, "gain_operand": self.gain if gain is not None else None}
        grouped = self.which == "K" and ctx.p.extra.get("num_kv_heads") is not None and own is not None
        if grouped:  # the report shows it with the first query head of its group
            details["query_heads"] = tuple(i for i in range(1, len(ctx.p.heads) + 1) if kv_head(ctx.p, i) == own)
        inputs = [x.ref] + ([self.gain] if gain is not None else [])
        flow = ctx.emit(self, own, inputs, formula, result, x.shape, details)
        if grouped:
            flow.ref = f"{self.id}@{own}"  # read by every query head of the group, as K@j
        memo[(self.id, own)] = flow
        return flow

    def intro(self, term, steps):
        return sym("Q", accent="hat") * sym("K", accent="hat").T() if self.which == "Q" else term

    def json_details(self, details):
        out = {"norm": "rms", "eps": float(details["eps"])}
        if details.get("mean_square") is not None:
            out["mean_square"] = [float(x) if not getattr(x, "free_symbols", None) else str(x) for x in details["mean_square"]]
        return {"qk_norm": out}

    def overflow_how(self, inputs, details) -> str:
        return f"RMSNorm of the rows of {inputs[0]}"

    def exact_work(self, problem, dims, named):
        """Exact mode: each entry is q / sqrt(nu + eps), a surd per row, and the scores multiply
        two of them: about 40 units per query-key pair per feature, measured on this machine."""
        return 0 if named else 40 * dims["n"] * dims["m"] * dims["dk"]

    # -- the checker ---------------------------------------------------------------------------
    def carry(self, iv, step, args, mistake):
        """RMSNorm of the student's rows (LayerNorm for qk_norm_mean_subtracted), enclosed."""
        gain = args[1] if len(args) > 1 else None
        return iv.norm(args[0], gain, None, float(step.details["eps"]), mistake != "qk_norm_mean_subtracted")


Q_NORM, K_NORM = QKNorm("Q"), QKNorm("K")
