"""RoPE scaling: the per-frequency factors c_r of Llama 3.1's rule and of YaRN, and YaRN's mu.

A model trained with contexts of L tokens (original_max_position_embeddings) stretches its
rotary frequencies to read s times longer contexts (s = factor). Both rules leave the fast
pairs alone (their wavelength is far below L: they never saw all their angles anyway), divide
the slow pairs' frequencies by s (position interpolation: a position s L turns them as far as
L did), and blend in between. The angle of pair r at position p becomes p c_r theta_r
(r numbers the pairs: i is the reports' row).

- llama3 (Meta's Llama 3.1 reference code, `apply_scaling`): the wavelength of pair r is
  lambda_r = 2 pi / theta_r. lambda_r < L / high_freq_factor: c_r = 1; lambda_r > L /
  low_freq_factor: c_r = 1 / s; else, with kappa_r = (L / lambda_r - low) / (high - low),
  c_r = (1 - kappa_r) / s + kappa_r.
- yarn (Peng et al., YaRN, arXiv 2309.00071, "NTK-by-parts"; the ramp as in the authors'
  code, which the models were trained with): the pair index at which a wavelength makes beta
  turns in L tokens is d ln(L / (2 pi beta)) / (2 ln b); the indices of beta_fast and beta_slow
  turns (floored and ceiled unless truncate = false, kept within 0..d-1) bound a ramp
  rho_r = clamp((r - lo) / (hi - lo), 0, 1) over the 0-based pair index r, and c_r =
  rho_r / s + (1 - rho_r) (the paper's gamma(r): gamma is the norms' gain in the same blocks). YaRN also sharpens the softmax: q and k are multiplied by the
  attention factor mu = 0.1 ln s + 1 (the paper's sqrt(1/t)), so the scores get mu^2; with
  mscale and mscale_all_dim (DeepSeek) mu = g(s, mscale) / g(s, mscale_all_dim), g(s, a) =
  0.1 a ln s + 1; an explicit attention_factor wins.

The same body runs on floats (numeric mode: math) and on SymPy numbers (exact and symbolic
modes: pi, logarithms and floors stay exact).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from attntrace.model.formula import sym

#: YaRN's ramp over the pairs, rho_r: the paper's gamma(r), but gamma is RMSNorm's gain in the blocks that use YaRN
YARN_RAMP = sym("rho", "r")

def _ops(exact: bool):
    if not exact:
        return SimpleNamespace(num=float, pi=math.pi, log=math.log, floor=math.floor, ceil=math.ceil)
    import sympy as sp

    def num(x):
        if isinstance(x, sp.Basic):
            return x
        return sp.Rational(str(x)) if isinstance(x, float) else sp.Integer(x)

    return SimpleNamespace(num=num, pi=sp.pi, log=sp.log, floor=sp.floor, ceil=sp.ceiling)


def frequency_factors(scaling: dict, base, d: int, exact: bool = False) -> tuple:
    """c_r for the d/2 pairs (index r - 1 = 0..d/2-1): the angle of pair r at position p is p c_r theta_r."""
    o = _ops(exact)
    b, s, L = o.num(base), o.num(scaling["factor"]), o.num(scaling["original_max_position_embeddings"])
    half = d // 2
    theta = [b ** (o.num(-2 * i) / d) for i in range(half)]
    if scaling["type"] == "llama3":
        low, high = o.num(scaling["low_freq_factor"]), o.num(scaling["high_freq_factor"])
        out = []
        for t in theta:
            wavelen = 2 * o.pi / t
            if bool(wavelen < L / high):
                out.append(o.num(1))
            elif bool(wavelen > L / low):
                out.append(1 / s)
            else:
                kappa = (L / wavelen - low) / (high - low)
                out.append((1 - kappa) / s + kappa)
        return tuple(out)
    lo, hi = yarn_range(scaling, base, d, exact)
    out = []
    for i in range(half):
        ramp = (o.num(i) - lo) / (hi - lo)
        gamma = o.num(0) if bool(ramp < 0) else o.num(1) if bool(ramp > 1) else ramp
        out.append(gamma / s + (1 - gamma))
    return tuple(out)


def yarn_range(scaling: dict, base, d: int, exact: bool = False) -> tuple:
    """(lo, hi): the pair indices where the ramp from extrapolation to interpolation starts and ends."""
    o = _ops(exact)
    b, L = o.num(base), o.num(scaling["original_max_position_embeddings"])
    index = lambda turns: o.num(d) * o.log(L / (o.num(turns) * 2 * o.pi)) / (2 * o.log(b))  # noqa: E731
    lo, hi = index(scaling["beta_fast"]), index(scaling["beta_slow"])
    if scaling["truncate"]:
        lo, hi = o.floor(lo), o.ceil(hi)
    lo = o.num(0) if bool(lo < 0) else lo
    hi = o.num(d - 1) if bool(hi > d - 1) else hi
    if bool(lo == hi):
        hi = hi + o.num(1) / 1000  # the authors' code: no division by zero
    return lo, hi


def attention_factor(scaling: dict, exact: bool = False):
    """YaRN's mu, the factor q and k are multiplied by (1 for llama3)."""
    o = _ops(exact)
    if scaling["type"] != "yarn":
        return o.num(1)
    if scaling.get("attention_factor") is not None:
        return o.num(scaling["attention_factor"])
    s = o.num(scaling["factor"])

    def g(a):
        return o.num(1) if bool(s <= 1) else o.num(1) / 10 * o.num(a) * o.log(s) + 1

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return g(scaling["mscale"]) / g(scaling["mscale_all_dim"])
    return g(1)


__all__ = ["frequency_factors", "yarn_range", "attention_factor"]
