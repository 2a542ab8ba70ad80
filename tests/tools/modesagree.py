"""One check for the tests of new step kinds: a symbolic trace with numbers substituted, an
exact trace evaluated to 20 digits and a shape-mode trace agree with the numeric trace, step
by step (same keys, values at 1e-10, same shapes). Import: ``from modesagree import assert_modes_agree``.
"""

from __future__ import annotations

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
