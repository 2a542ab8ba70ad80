"""The four modes behind one interface, so the tracer has a single code path.

Each algebra works on the *values* of its mode (ndarray, SymPy matrix, or None for shape
mode); the tracer checks shapes before it calls them. `finish` turns a freshly computed
result into what a Step stores: in symbolic mode the result becomes the step's expansion
and the value becomes a matrix of new entry names, which is what keeps symbolic output
one level deep and its cost linear in the number of entries.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attntrace.inputs.expr import entry_name


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


class NumericAlgebra:
    """float64 NumPy: no per-entry Python objects, so tracing costs little over bare NumPy."""

    mode = "numeric"

    def matmul(self, a, b):
        return a @ b

    def matmul_t(self, a, b):
        return a @ b.T

    def add_row(self, a, row):
        return a + row

    def factor(self, d_k: int | None, number) -> float:
        return math.sqrt(d_k) if number is None else float(number)

    def divide(self, a, factor):
        return a / factor

    def mask(self, a, keep: np.ndarray):
        return np.where(keep, a, -np.inf)

    def softmax(self, t):
        """Row-wise stable softmax; -inf entries get weight exactly 0.

        details (read-only float64): row_max m_i (n,), shifted t_ij - m_i (n, n; -inf where
        masked), exp e^{t_ij - m_i} (n, n; 0 where masked), row_sum sum_j e^{t_ij - m_i} (n,).
        """
        row_max = t.max(axis=1, keepdims=True)
        shifted = t - row_max
        e = np.exp(shifted)
        row_sum = e.sum(axis=1, keepdims=True)
        weights = e / row_sum
        details = {"row_max": _readonly(row_max[:, 0]), "shifted": _readonly(shifted), "exp": _readonly(e),
                   "row_sum": _readonly(row_sum[:, 0])}
        return weights, details

    def hstack(self, parts):
        return np.hstack(parts)

    def vstack(self, parts):
        """Rows of the parts one under the other (a KV cache with the new token's row appended)."""
        return np.vstack(parts)

    def finish(self, result, *, symbol, head, shape):
        return _readonly(np.ascontiguousarray(result, dtype=np.float64)), None


class SympyAlgebra:
    """Exact (SymPy numbers) and symbolic (SymPy symbols) modes.

    With `name_steps`, every step's value is a fresh matrix of entry names and the computed
    result is kept as its expansion; products are unevaluated sums in the textbook's term
    order (a_11 v_11 + a_12 v_21). Without it (exact mode, or the full expansion option)
    values are computed through.
    """

    def __init__(self, mode: str, name_steps: bool):
        import sympy

        self.sp = sympy
        self.mode = mode
        self.name_steps = name_steps

    def _dot(self, row, col):
        sp = self.sp
        terms = [x * y if not self.name_steps else sp.Mul(x, y, evaluate=False) for x, y in zip(row, col)]
        if self.name_steps:
            terms = [t for t, x, y in zip(terms, row, col) if not (x == 0 or y == 0)] or [sp.Integer(0)]
            return terms[0] if len(terms) == 1 else sp.Add(*terms, evaluate=False)
        return sp.Add(*terms)

    def matmul(self, a, b):
        sp = self.sp
        rows, inner, cols = a.shape[0], a.shape[1], b.shape[1]
        return sp.Matrix(rows, cols, lambda i, j: self._dot([a[i, k] for k in range(inner)], [b[k, j] for k in range(inner)]))

    def matmul_t(self, a, b):
        return self.matmul(a, b.T)

    def add_row(self, a, row):
        sp = self.sp
        join = (lambda x, y: sp.Add(x, y, evaluate=False)) if self.name_steps else (lambda x, y: x + y)
        return sp.Matrix(a.shape[0], a.shape[1], lambda i, j: join(a[i, j], row[0, j]))

    def factor(self, d_k: int | None, number):
        sp = self.sp
        if number is None:
            return sp.sqrt(d_k)
        if isinstance(number, sp.Basic):  # already parsed by the whitelist parser
            return number
        return sp.Rational(str(number)) if isinstance(number, float) else sp.Integer(number)

    def divide(self, a, factor):
        sp = self.sp
        if self.name_steps:
            inv = sp.Pow(factor, -1, evaluate=False)
            return a.applyfunc(lambda x: sp.Mul(x, inv, evaluate=False))
        return a.applyfunc(lambda x: x / factor)

    def mask(self, a, keep):
        sp = self.sp
        return sp.Matrix(a.shape[0], a.shape[1], lambda i, j: a[i, j] if keep[i, j] else -sp.oo)

    def softmax(self, t):
        """a_ij = e^{t_ij} / sum_k e^{t_ik} over the kept entries; masked weights are exactly 0."""
        sp = self.sp
        rows, cols = t.shape
        exps = sp.Matrix(rows, cols, lambda i, j: sp.Integer(0) if t[i, j] == -sp.oo else sp.exp(t[i, j]))
        sums = [sp.Add(*[exps[i, j] for j in range(cols) if t[i, j] != -sp.oo], evaluate=not self.name_steps) for i in range(rows)]
        weights = sp.Matrix(rows, cols, lambda i, j: sp.Integer(0) if t[i, j] == -sp.oo else exps[i, j] / sums[i])
        return weights, {"exp": sp.ImmutableMatrix(exps), "row_sum": tuple(sums)}

    def hstack(self, parts):
        return self.sp.Matrix.hstack(*parts)

    def vstack(self, parts):
        return self.sp.Matrix.vstack(*parts)

    def finish(self, result, *, symbol, head, shape):
        sp = self.sp
        result = sp.ImmutableMatrix(result)
        if not self.name_steps or symbol is None:
            return result, None
        rows, cols = shape
        wide = max(rows, cols) >= 10
        names = sp.ImmutableMatrix(rows, cols, lambda i, j: sp.Integer(0) if result[i, j] == 0 else sp.Symbol(entry_name(symbol, int(i) + 1, int(j) + 1, head=head, wide=wide)))
        return names, result


class ExactAlgebra(SympyAlgebra):
    """Exact mode: every entry computed through, then written in `exact_form`'s canonical form.

    Products, bias rows and scaling give canonical numbers (51*sqrt(2)/2, -1/4 + sqrt(3)/3);
    the softmax gives weights 1/(1 + e^{-5*sqrt(2)/2}) and its details in the numeric
    meaning (row_max, shifted, exp, row_sum). The weights, and every matrix computed from
    them (Z, the concatenation, the output projection), also keep their entries as
    `exact_form.Form`s, coefficients over the softmax rows' sums, which is how Z = A V gets
    one fraction per entry in the weights' term order. The forms live in this algebra only
    (one per trace), looked up by the identity of the value they belong to.
    """

    def __init__(self):
        super().__init__("exact", name_steps=False)
        from attntrace.algebra import exact_form

        self.xf = exact_form
        self._forms: dict[int, tuple[Any, list]] = {}

    # -- forms of softmax-derived matrices ----------------------------------------
    def _remember(self, m, forms):
        if forms is not None:
            self._forms[id(m)] = (m, forms)
        return m

    def _forms_of(self, m):
        hit = self._forms.get(id(m))
        return hit[1] if hit is not None and hit[0] is m else None

    def _matrix(self, rows, cols, entry):
        return self.sp.Matrix(rows, cols, lambda i, j: entry(int(i), int(j)))

    # -- operations ------------------------------------------------------------------
    def matmul(self, a, b):
        sp, xf = self.sp, self.xf
        rows, inner, cols = a.shape[0], a.shape[1], b.shape[1]
        fa = self._forms_of(a)
        if fa is None or self._forms_of(b) is not None:
            return self._matrix(rows, cols, lambda i, j: xf.canonical(sp.Add(*[a[i, k] * b[k, j] for k in range(inner)])))
        bn = [[xf.normal(b[k, j]) for j in range(cols)] for k in range(inner)]
        forms = []
        for i in range(rows):
            row = []
            for j in range(cols):
                acc = xf.Form()
                for k in range(inner):
                    fa[i][k].scaled(bn[k][j]).add_to(acc)
                row.append(acc)
            forms.append(row)
        return self._remember(self._matrix(rows, cols, lambda i, j: forms[i][j].present()), forms)

    def matmul_t(self, a, b):
        return self.matmul(a, b.T)

    def add_row(self, a, row):
        xf = self.xf
        fa = self._forms_of(a)
        if fa is None:
            return self._matrix(a.shape[0], a.shape[1], lambda i, j: xf.canonical(a[i, j] + row[0, j]))
        forms = [[xf.Form(xf.normal(f.plain + row[0, j]), f.parts) for j, f in enumerate(r)] for r in fa]
        return self._remember(self._matrix(a.shape[0], a.shape[1], lambda i, j: forms[i][j].present()), forms)

    def divide(self, a, factor):
        return a.applyfunc(lambda x: self.xf.canonical(x / factor))

    def softmax(self, t):
        """Row by row, `exact_form.SoftmaxRow`: weights, and details with the numeric keys.

        details: row_max (tuple; an entry is None for a row with symbols, which is then not
        shifted), shifted t_ij - m_i (ImmutableMatrix, -oo where masked), exp e^{t_ij - m_i}
        (ImmutableMatrix, 0 where masked), row_sum (tuple, S_i grouped in the row's term
        order: the max's constant first, then the other exponents in column order).
        """
        sp = self.sp
        rows, cols = t.shape
        sm = [self.xf.SoftmaxRow([t[i, j] for j in range(cols)]) for i in range(rows)]
        weights = sp.ImmutableMatrix(rows, cols, lambda i, j: sm[i].weights[j])
        details = {
            "row_max": tuple(r.max for r in sm),
            "shifted": sp.ImmutableMatrix(rows, cols, lambda i, j: sm[i].shifted[j]),
            "exp": sp.ImmutableMatrix(rows, cols, lambda i, j: sm[i].exps[j]),
            "row_sum": tuple(r.sum.expr for r in sm),
        }
        return self._remember(weights, [r.forms for r in sm]), details

    def hstack(self, parts):
        xf = self.xf
        result = self.sp.Matrix.hstack(*parts)
        found = [self._forms_of(p) for p in parts]
        if all(f is None for f in found):
            return result
        forms = [[] for _ in range(result.shape[0])]
        for p, f in zip(parts, found):
            for i in range(p.shape[0]):
                forms[i].extend(f[i] if f is not None else [xf.Form.number(p[i, j]) for j in range(p.shape[1])])
        return self._remember(result, forms)

    def finish(self, result, *, symbol, head, shape):
        forms = self._forms_of(result)
        value = result if isinstance(result, self.sp.ImmutableMatrix) else self.sp.ImmutableMatrix(result)
        return self._remember(value, forms), None


class ShapeAlgebra:
    """No values at all: every operation returns None; the tracer already knows the shapes."""

    mode = "shape"

    def __getattr__(self, name: str) -> Any:
        if name in {"matmul", "matmul_t", "add_row", "divide", "mask", "hstack", "vstack"}:
            return lambda *args, **kw: None
        raise AttributeError(name)

    def factor(self, d_k, number):
        return math.sqrt(d_k) if number is None else float(number)

    def softmax(self, t):
        return None, {}

    def finish(self, result, *, symbol, head, shape):
        return None, None


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
