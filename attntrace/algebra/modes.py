"""The four modes behind one interface, so the tracer has a single code path.

Each algebra works on the *values* of its mode (ndarray, SymPy matrix, or None for shape
mode); the tracer checks shapes before it calls them. `finish` turns a freshly computed
result into what a Step stores: in symbolic mode the result becomes the step's expansion
and the value becomes a matrix of new entry names, which is what keeps symbolic output
one level deep and its cost linear in the number of entries.
"""

from __future__ import annotations

from attntrace.algebra.numeric import NumericAlgebra, SoftmaxDetails

__all__ = ["NumericAlgebra", "SoftmaxDetails", "algebra_for"]


def algebra_for(mode: str, *, full_expansion: bool = False):
    """The algebra of a mode; the SymPy modes' modules are imported only when used, so a
    numeric run does not pay for them."""
    if mode == "numeric":
        return NumericAlgebra()
    if mode == "exact":
        from attntrace.algebra.exact import ExactAlgebra

        return ExactAlgebra()
    if mode == "symbolic":
        from attntrace.algebra.symbolic import SympyAlgebra

        return SympyAlgebra("symbolic", name_steps=not full_expansion)
    if mode == "shape":
        from attntrace.algebra.shape import ShapeAlgebra

        return ShapeAlgebra()
    raise ValueError(mode)
