"""One check for the tests of new step kinds: a symbolic trace with numbers substituted, an
exact trace evaluated to 20 digits and a shape-mode trace agree with the numeric trace, step
by step (same keys, values at 1e-10, same shapes). Import: ``from modesagree import assert_modes_agree``.
"""

from __future__ import annotations

import re

import numpy as np


def exact_values(matrix) -> np.ndarray:
    """An exact (SymPy) matrix as float64, -oo as -inf."""
    import sympy as sp

    return np.array([[float(sp.N(e, 20)) if e != -sp.oo else -np.inf for e in matrix.row(i)] for i in range(matrix.rows)])


def assert_modes_agree(numeric, *, symbolic=None, values=None, exact=None, shape=None, atol: float = 1e-10) -> None:
    """`values` ({Symbol: number}) are substituted into `symbolic`; any of the three may be left out."""
    from attntrace.algebra.substitute import substitute

    got = substitute(symbolic, values) if symbolic is not None else None
    for other in (symbolic, exact, shape):
        if other is not None:
            assert [s.key for s in other.steps] == [s.key for s in numeric.steps]
    for step in numeric.steps:
        if got is not None:
            np.testing.assert_allclose(got[step.key], step.value, atol=atol, rtol=0, err_msg=step.key)
        if exact is not None:
            np.testing.assert_allclose(exact_values(exact.step(step.id, step.head).value), step.value, atol=atol, rtol=0, err_msg=step.key)
        if shape is not None:
            assert shape.step(step.id, step.head).shape == step.shape, step.key


#: spec keys whose lists are input matrices (or vectors) that symbolic mode takes as symbols
_MATRIX_KEY = re.compile(r"^(X|X_kv|Q|K|V|W_\w+|b_\w+|bias|logit_bias)$")


def symbolic_spec(spec):
    """`spec` with every input matrix (X, W_*, b_*, biases, the experts' weights) given by its
    shape only, so that symbolic mode names its entries; other keys kept."""
    if isinstance(spec, dict):
        out = {}
        for k, v in spec.items():
            if _MATRIX_KEY.match(k) and isinstance(v, (list, np.ndarray)):
                a = np.asarray(v, dtype=object)
                out[k] = {"shape": list(a.shape) if a.ndim == 2 else [1, a.shape[0]]}
            else:
                out[k] = symbolic_spec(v)
        return out
    if isinstance(spec, list) and spec and isinstance(spec[0], dict):
        return [symbolic_spec(v) for v in spec]
    return spec


def operand_values(symbolic, numeric) -> dict:
    """{symbol: number}: each entry of the symbolic trace's operands paired with the numeric
    trace's operand of the same name and head, and a norm's epsilon (its step's details)."""
    import sympy as sp

    nums = {(o.name, o.head): np.asarray(o.value, dtype=float) for o in numeric.operands}
    values = {}
    for o in symbolic.operands:
        v = nums.get((o.name, o.head))
        if v is None or o.value is None:
            continue
        m = sp.Matrix(o.value)
        v = v.reshape(m.shape)
        for i in range(m.rows):
            for j in range(m.cols):
                if isinstance(m[i, j], sp.Symbol):
                    values[m[i, j]] = float(v[i, j])
    eps = {float(s.details["eps"]) for s in numeric.steps if s.details.get("eps") is not None}
    if eps:
        assert len(eps) == 1, f"norms with different epsilons share the symbol: {eps}"
        values[sp.Symbol("\\varepsilon")] = eps.pop()
    return values
