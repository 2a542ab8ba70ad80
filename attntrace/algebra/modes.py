"""The four modes behind one interface, so the tracer has a single code path.

Each algebra works on the *values* of its mode (ndarray, SymPy matrix, or None for shape
mode); the tracer checks shapes before it calls them. `finish` turns a freshly computed
result into what a Step stores: in symbolic mode the result becomes the step's expansion
and the value becomes a matrix of new entry names, which is what keeps symbolic output
one level deep and its cost linear in the number of entries.
"""

from __future__ import annotations

from attntrace.algebra.exact import ExactAlgebra
from attntrace.algebra.numeric import NumericAlgebra, SoftmaxDetails
from attntrace.algebra.shape import ShapeAlgebra
from attntrace.algebra.symbolic import SympyAlgebra

__all__ = ["NumericAlgebra", "SoftmaxDetails", "SympyAlgebra", "ExactAlgebra", "ShapeAlgebra", "algebra_for"]


def algebra_for(mode: str, *, full_expansion: bool = False):
    if mode == "numeric":
        return NumericAlgebra()
    if mode == "exact":
        return ExactAlgebra()
    if mode == "symbolic":
        return SympyAlgebra("symbolic", name_steps=not full_expansion)
    if mode == "shape":
        return ShapeAlgebra()
    raise ValueError(mode)
