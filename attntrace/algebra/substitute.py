"""Numbers substituted into a symbolic trace, evaluated step by step.

A symbolic trace names each step's entries and defines them one level deep, so evaluating
it is a walk along the steps: substitute the known numbers into each expansion, then bind
that step's names to the results. The cost is linear in the entries, never exponential.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np


def substitute(trace, values: Mapping) -> dict[str, np.ndarray]:
    """Evaluate every step of a symbolic (or exact) trace with `values` {Symbol: number}.

    Returns {step.key: float64 array}. Raises ValueError if a symbol stays free.
    """
    import sympy as sp

    known = {sp.Symbol(str(k)) if not isinstance(k, sp.Symbol) else k: sp.Float(v, 30) for k, v in values.items()}
    out = {}
    for step in trace.steps:
        for sym, definition in step.details.get("defs", ()):  # a step's own intermediate symbols (a norm's mu_i, sigma_i^2)
            known[sym] = sp.Float(sp.N(definition.xreplace(known), 30), 30)
        source = step.expansion if step.expansion is not None else step.value
        rows, cols = step.shape
        result = np.empty((rows, cols))
        for i in range(rows):
            for j in range(cols):
                e = source[i, j]
                if e == -sp.oo:
                    result[i, j] = -np.inf
                    continue
                v = e.xreplace(known)
                v = sp.N(v, 30)
                if v.free_symbols:
                    raise ValueError(f"step {step.key} entry ({i + 1}, {j + 1}) still has {sorted(map(str, v.free_symbols))}")
                result[i, j] = float(v)
                if step.expansion is not None:
                    known[step.value[i, j]] = sp.Float(v, 30)
        out[step.key] = result
    return out
