"""Exact mode: SymPy numbers computed through, each entry in exact_form's canonical form.

Part of the four modes behind one interface (attntrace.algebra.modes.algebra_for).
"""

from __future__ import annotations

from typing import Any

from attntrace.algebra.symbolic import SympyAlgebra


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
            return self._matrix(rows, cols, lambda i, j: self._trig(xf.canonical(sp.Add(*[a[i, k] * b[k, j] for k in range(inner)]))))
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

    def grad_matmul(self, a, b):
        """The backward pass keeps SymPy's own exact arithmetic, without the canonical form: a
        gradient through the softmax is a rational function of exponentials, whose normal form
        grows fast (and costs seconds per entry); evaluated, the value is exact all the same."""
        return self.sp.Matrix(a) * self.sp.Matrix(b)

    def grad_divide(self, a, factor):
        return a.applyfunc(lambda x: x / factor)

    def add_row(self, a, row):
        xf = self.xf
        fa = self._forms_of(a)
        if fa is None:
            return self._matrix(a.shape[0], a.shape[1], lambda i, j: xf.canonical(a[i, j] + row[0, j]))
        forms = [[xf.Form(xf.normal(f.plain + row[0, j]), f.parts) for j, f in enumerate(r)] for r in fa]
        return self._remember(self._matrix(a.shape[0], a.shape[1], lambda i, j: forms[i][j].present()), forms)

    def divide(self, a, factor):
        return a.applyfunc(lambda x: self.xf.canonical(x / factor))

    def _plain(self, x):
        """RoPE, ALiBi: entries in canonical form (expanded: q cos(1) - k sin(1))."""
        return self.xf.canonical(x)

    def _trig(self, e):
        """A product of RoPE-rotated rows, cos a cos b + sin a sin b + ..., as a sum over the angle
        differences (cos(a - b)): the exact scores then show that they depend on m - n only."""
        sp = self.sp
        if not e.has(sp.sin, sp.cos):
            return e
        return sp.expand(sp.expand(e.rewrite(sp.exp)).rewrite(sp.cos), trig=False)

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

    def gate_softmax(self, t, chosen):
        """A router's softmax over each row's chosen entries: g_ij = 1 / sum_k e^(t_ik - t_ij)
        for j chosen, exactly 0 otherwise, in SymPy's own arithmetic. Not `softmax`'s canonical
        form: logits after attention and a norm are nested radicals whose normal form (radsimp)
        takes minutes for a 2 x 2 block; 1/(1 + e^(-sqrt(2))) stays as SymPy writes it."""
        sp = self.sp

        def entry(i, j):
            if j not in chosen[i]:
                return sp.Integer(0)
            return 1 / sp.Add(*[sp.exp(t[i, k] - t[i, j]) for k in chosen[i]])

        return sp.Matrix(t.shape[0], t.shape[1], entry)

    def compare(self, a, b) -> int:
        """The exact sign of a - b (1, 0 or -1), to rank a router's scores or clamp an entry.

        `exact_form.sign` evaluates the difference to 30 correct significant digits (the working
        precision is raised until they are right, so a nonzero difference has a certain sign);
        a difference that evaluates to 0 is a tie only when proven zero: its minimal polynomial
        for an algebraic number, else SymPy's `equals`. The order is never read from floats, so
        ties are found exactly and a tie goes to the lower index, as in numeric mode.
        """
        sp = self.sp
        d = sp.sympify(a) - sp.sympify(b)
        s = self.xf.sign(d)
        if s is None and d.equals(0):
            s = 0
        if s is None:
            from attntrace.model.errors import BadInput

            raise BadInput(f"exact mode cannot order {sp.sstr(a)[:60]} and {sp.sstr(b)[:60]}: they agree to 30 digits "
                           "and are not provably equal; use --mode numeric")
        return s

    def clamp(self, a, low, high):
        """Each entry limited to [low, high] (None: no limit on that side), the comparison decided
        exactly (`compare`): the entry itself or the limit, never an unevaluated Min or Max."""
        sp = self.sp

        def one(x):
            if high is not None and self.compare(x, high) > 0:
                return sp.sympify(high)
            if low is not None and self.compare(x, low) < 0:
                return sp.sympify(low)
            return x

        return a.applyfunc(one)

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
