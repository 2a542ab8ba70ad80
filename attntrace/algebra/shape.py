"""Shape mode: no values at all, only the shapes the tracer already checks.

Part of the four modes behind one interface (attntrace.algebra.modes.algebra_for).
"""

from __future__ import annotations

import math
from typing import Any


class ShapeAlgebra:
    """No values at all: every operation returns None; the tracer already knows the shapes."""

    mode = "shape"

    def __getattr__(self, name: str) -> Any:
        if name in {"matmul", "matmul_t", "add_row", "columns", "divide", "mask", "hstack", "vstack",
                    "rope_angles", "rotate_pairs", "pow2", "number", "distance_bias", "plus", "linear", "hadamard", "tanh", "activation", "sinusoid",
                    "transpose", "grad_matmul", "grad_divide", "block", "times", "constant", "clamp", "colsum", "softmax_jacobian",
                    "route_weights"}:
            return lambda *args, **kw: None
        raise AttributeError(name)

    def factor(self, d_k, number):
        return math.sqrt(d_k) if number is None else float(number)

    def softmax(self, t):
        return None, {}

    def norm(self, a, gain, bias, eps, rms):
        return None, {}

    def softmax_backward(self, a, da):
        return None, {}

    def online_update(self, m_prev, l_prev, o_prev, t, v):
        return dict.fromkeys(("m", "alpha", "P", "l", "O"))

    def online_finish(self, m, l, o):
        return None, None

    def finish(self, result, *, symbol, head, shape):
        return None, None
