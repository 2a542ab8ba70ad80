"""Layer normalisation of each row (token) over its d_model features.

LayerNorm (Ba et al. 2016, as torch.nn.LayerNorm): n_ij = gamma_j (r_ij - mu_i) / sqrt(sigma_i^2 + eps)
+ beta_j with the row mean mu_i and the *biased* variance sigma_i^2 = (1/d) sum_k (r_ik - mu_i)^2.
RMSNorm (Zhang & Sennrich 2019, as torch.nn.RMSNorm and Llama): n_ij = gamma_j r_ij / sqrt(nu_i + eps)
with the mean square nu_i = (1/d) sum_k r_ik^2, no centring and no bias. The gain and bias are
the spec's norm1/norm2 tables (operands gamma_1, beta_1, gamma_2, beta_2, written gamma, beta, gamma^f,
beta^f as N and N^f are; a sandwich block's norm3/norm4 too, attntrace.kinds.sandwich); without them the gain
is 1 and the bias 0, and the formula leaves them out. Gemma's RMSNorm multiplies by 1 + gamma
(its weights start at 0): the table's `gain_offset = 1`, written (1 + gamma_j) in the formula.
"""

from __future__ import annotations

import numpy as np

from attntrace.inputs.blockspec import BLOCK_OPERANDS
from attntrace.kinds.base import Kind, Mistake, Symbol
from attntrace.kinds.exactsize import check_exact_size
from attntrace.model.errors import BadInput
from attntrace.model.formula import Func, Num, Paren, Parts, Power, Sqrt, Sym, sym


class Norm(Kind):
    per_head = False
    view, prose = "norm", "norm"
    view_module = "blockview"
    elementwise = "hadamard"  # the gain multiplies each row
    explained_by_prose = True
    mistakes = (Mistake("norm_unbiased_variance", also=("norm2",), when=lambda steps: any(s.details.get("norm") == "layer" for s in steps)),
                Mistake("norm_wrong_axis", also=("norm2",)))

    def report_params(self, steps):
        return {"norm_kind": steps[0].details.get("norm")}

    def carry(self, iv, step, args, mistake):
        """LayerNorm / RMSNorm of the student's rows (`iv.norm`, a valid enclosure); its mistakes
        likewise: the variance over d - 1 (norm_unbiased_variance) or each column over the tokens
        (norm_wrong_axis), bounded to first order (they only name a mistake)."""
        det = step.details
        rms, eps = det.get("norm") == "rms", float(det.get("eps", 1e-5))
        named = dict(zip(step.inputs[1:], args[1:]))
        if mistake not in ("norm_unbiased_variance", "norm_wrong_axis"):
            gain_box = next((b for n, b in named.items() if n.startswith("gamma")), None)
            bias_box = next((b for n, b in named.items() if n.startswith("beta")), None)
            if gain_box is not None and det.get("offset"):  # Gemma: 1 + gamma
                gain_box = iv.add(gain_box, iv.point(np.full_like(gain_box.lo, float(det["offset"]))))
            return iv.norm(args[0], gain_box, bias_box, eps, rms)
        gain = next((b.mid + float(det.get("offset", 0)) for n, b in named.items() if n.startswith("gamma")), None)
        bias = next((b.mid for n, b in named.items() if n.startswith("beta")), None)
        axis = 0 if mistake == "norm_wrong_axis" else 1
        if any(v is not None and v.shape[1] != args[0].shape[1] for v in (gain, bias)):
            raise iv.Impossible()  # an input of another shape (a transposed earlier step)

        def f(r):
            if rms:
                y = r / np.sqrt((r * r).mean(axis=axis, keepdims=True) + eps)
            else:
                c = r - r.mean(axis=axis, keepdims=True)
                count = r.shape[axis] - (1 if mistake == "norm_unbiased_variance" else 0)
                y = c / np.sqrt((c * c).sum(axis=axis, keepdims=True) / max(count, 1) + eps)
            return y * (1.0 if gain is None else gain) + (0.0 if bias is None else bias)

        if not (np.isfinite(args[0].lo).all() and np.isfinite(args[0].hi).all()):
            raise iv.Impossible()
        return iv.first_order(f, args[0])

    def __init__(self, id: str, reads: str, writes: str, letter: Sym, entry: Sym, symbol: str, which: int):
        self.id, self.reads, self.writes = id, (reads,), writes
        self.letter, self.entry, self.symbol = letter, entry, symbol
        self.which = which  # 1 to 4: gamma_1/beta_1 ..., eps1 ... of the spec's norm1 ... norm4

    def exact_size(self, problem, sizes):
        """The mean and the variance each hold the d entries of the row, under a square root:
        measured (2 x 2 blocks, attention not uniform) 3 to 6 times the input's operations for
        d = 2, so 3 d."""
        return 3 * problem.shared["X"].shape[1] * sizes[self.reads[0]]

    def compute(self, ctx, head, state):
        r = state[self.reads[0]]
        p = ctx.p
        rms = p.extra.get("norm") == "rms"
        eps = p.extra.get(f"eps{self.which}", 1e-5)
        gain = p.shared.get(f"gamma_{self.which}")
        bias = p.shared.get(f"beta_{self.which}")
        for op in (gain, bias):
            if op is not None and op.shape != (1, r.shape[1]):
                raise BadInput(f"step {self.id}: {op.name} has shape {op.shape}, expected (1, {r.shape[1]}), one entry per feature of {r.ref}")
        offset = p.extra.get(f"offset{self.which}", 0)
        gain_value = None if gain is None else gain.value
        if offset and gain is not None:  # Gemma: the row times 1 + gamma
            gain_value = ctx.alg.plus(ctx.alg.constant(gain.shape, offset), gain.value)
        value = ctx.alg.norm(r.value, gain_value, None if bias is None else bias.value, _eps(ctx, eps), rms)
        result, details = value
        _check_spread(self.id, r, details, eps, rms)
        check_exact_size(ctx, self.id, result)
        e = (r.entry or sym("x")).at("i", "j")
        eps_ = sym("varepsilon")
        if rms:
            entry = e / Sqrt(sym("nu", "i") + eps_)
        else:
            entry = (e - sym("mu", "i")) / Sqrt(Power(sym("sigma", "i"), 2) + eps_)
        # the gain and bias go by their operands' names: gamma, beta for norm 1, gamma^f, beta^f for norm 2
        gl, bl = BLOCK_OPERANDS[f"gamma_{self.which}"][0], BLOCK_OPERANDS.get(f"beta_{self.which}", (None,))[0]
        if gain is not None:
            g = gl.replace(sub="j")
            entry = (Paren(Num(offset) + g) if offset else g) * entry
        if bias is not None:
            entry = entry + bl.replace(sub="j")
        params = tuple(s for s, op in ((gl, gain), (bl, bias)) if op is not None)
        function = Func("RMSNorm" if rms else "LayerNorm", (r.letter,), params=params)
        formula = Parts((self.letter.eq(function), self.entry.at("i", "j").eq(entry)))
        inputs = [r.ref] + [op.name for op in (gain, bias) if op is not None]
        details = {**details, "norm": "rms" if rms else "layer", "eps": eps, "which": self.which}
        if offset and gain is not None:
            details["offset"] = offset
        return ctx.emit(self, None, inputs, formula, result, r.shape, details)

    def notation(self, step):
        """N, n_ij, and the row statistics and eps its formula names."""
        rows = (step.shape[0], 1)
        stats = ([Symbol.of(sym("nu", "i"), "mean_square", rows)] if step.details["norm"] == "rms"
                 else [Symbol.of(sym("mu", "i"), "row_mean", rows), Symbol.of(Power(sym("sigma", "i"), Num(2)), "row_variance", rows)])
        return super().notation(step) + stats + [Symbol.of(sym("varepsilon"), "norm_eps", "scalar")]

    def json_details(self, details):
        out = {"norm": details["norm"], "eps": details["eps"]}
        if details.get("offset"):
            out["gain_offset"] = details["offset"]
        for key in ("mean", "var", "mean_square"):
            if key in details:
                out[key] = [_json_number(x) for x in details[key]]
        return out


def _check_spread(step: str, r, details, eps: float, rms: bool) -> None:
    """With eps = 0 a constant row (LayerNorm) or a zero row (RMSNorm) divides 0 by 0."""
    if eps:
        return
    spread = details.get("mean_square" if rms else "var")
    for i, v in enumerate(spread if spread is not None else ()):
        if v is not None and not getattr(v, "free_symbols", None) and v == 0:
            what = "is zero" if rms else "is constant (variance 0)"
            raise BadInput(f"step {step}: row {i + 1} of {r.ref} {what} and eps = 0, so the norm divides 0 by 0; give norm eps > 0")


def _eps(ctx, eps: float):
    """eps in the algebra's numbers: float64, or the exact rational of its decimal text."""
    if ctx.numeric or ctx.p.mode == "shape":
        return float(eps)
    import sympy

    return sympy.Rational(repr(float(eps)))


def _json_number(x):
    from attntrace.inputs.expr import to_plain

    return float(x) if not hasattr(x, "free_symbols") else to_plain(x)
