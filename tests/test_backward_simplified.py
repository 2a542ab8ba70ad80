"""The symbolic softmax backward, simplified as a lecturer writes it (issue 22 item 6):
g^T_ij = a_ij sum_{k != j} a_ik (g^A_ij - g^A_ik), two keys a_11 a_12 (g^A_11 - g^A_12).

The simplified entries are checked against the numeric trace (itself checked against torch
autograd in test_backward.py): the numeric weights and weight gradients substituted into the
symbolic expressions give the numeric dT, with and without a causal mask, for 2 and 3 keys.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy

import attntrace
from attntrace.rendering.gradview import softmax_grad_simplified

SPECS = {
    "2 keys": {"X": [[1, 0], [2, 1]], "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [1, 1]], "W_V": [[1, 2], [0, -1]],
               "backward": {"loss": "sum_squares"}},
    "3 keys, causal": {"X": [[1, 0, 2], [0, 1, -1], [1, 1, 0]], "W_Q": [[1, 0, 1], [0, 1, 0], [1, -1, 0]],
                       "W_K": [[0, 1, 0], [1, 0, 1], [1, 1, 0]], "W_V": [[1, 0, 0], [0, 2, 1], [1, 0, -1]],
                       "mask": "causal", "backward": {"loss": "sum_squares"}},
}


def _step(trace, step_id):
    return next(s for s in trace.steps if s.id == step_id)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_simplified_entries_give_the_numeric_gradient(name):
    spec = SPECS[name]
    num = attntrace.run(dict(spec))
    sym = attntrace.run(dict(spec), mode="symbolic")
    a_sym, g_sym = _step(sym, "weights").value, _step(sym, "dweights").value
    a_num, g_num = np.asarray(_step(num, "weights").value), np.asarray(_step(num, "dweights").value)
    dt_num = np.asarray(_step(num, "dscaled").value)
    subs = {a_sym[i, j]: a_num[i, j] for i in range(a_num.shape[0]) for j in range(a_num.shape[1]) if a_sym[i, j] != 0}
    subs.update({g_sym[i, j]: g_num[i, j] for i in range(g_num.shape[0]) for j in range(g_num.shape[1])})
    for i in range(dt_num.shape[0]):
        for j in range(dt_num.shape[1]):
            e = softmax_grad_simplified(a_sym, g_sym, i, j)
            assert float(sympy.sympify(e).xreplace(subs)) == pytest.approx(dt_num[i, j], abs=1e-12), (name, i, j, e)


def test_the_unsimplified_expansion_differs_without_the_row_sum():
    """The simplification uses sum_k a_ik = 1: with weights that do not sum to 1 the two forms
    differ (so the test above would notice a simplification that ignored the softmax)."""
    sym = attntrace.run(dict(SPECS["2 keys"]), mode="symbolic")
    a, g = _step(sym, "weights").value, _step(sym, "dweights").value
    long = _step(sym, "dscaled").expansion[0, 0]
    short = softmax_grad_simplified(a, g, 0, 0)
    assert sympy.simplify(long - short) != 0
    assert sympy.simplify((long - short).subs(a[0, 1], 1 - a[0, 0])) == 0


def test_the_report_shows_the_simplified_form_and_no_circular_row():
    tex = attntrace.render(attntrace.run("backward-2x2-symbolic"), format="tex")
    assert "a_{11} a_{12} \\left(g^{A}_{11} - g^{A}_{12}\\right)" in tex
    assert "a_{11} \\left(g^{A}_{11} - \\left(a_{11} g^{A}_{11}" not in tex
    row = next(line for line in tex.splitlines() if line.startswith(("\\mathrm{d}T_{1,:}", "\\mathrm{d}T_{1,\\,:}")))
    assert "g^{T}_{11}" not in row and "a_{11} a_{12}" in row
