"""Symbolic mode (SymPy symbols, each step naming its entries) and the SymPy base of exact mode.

Part of the four modes behind one interface (attntrace.algebra.modes.algebra_for).
"""

from __future__ import annotations

from attntrace.inputs.expr import entry_symbol


def _is_zero(x) -> bool:
    """x == 0 for a SymPy entry, asked only of numbers: no other SymPy object equals 0, and
    == sympifies the 0 first (a report's traced products ask it of every factor)."""
    return x.is_Number and x == 0


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
        if self.name_steps:
            # Mul(x, y, evaluate=False) and Add(*terms, evaluate=False) as their _from_args build
            # them: without the cache lookup, argument checks and constructor post-processors of
            # AssocOp.__new__ (none applies to entries: only matrix, tensor, vector and quantum
            # expressions register one), which would be most of a 16x16 trace; commutative factors
            # make a commutative product and sum (else _from_args works it out, as __new__ would)
            mul, terms, commutative = sp.Mul._from_args, [], True
            for x, y in zip(row, col):
                if not (_is_zero(x) or _is_zero(y)):
                    c = x.is_commutative is True and y.is_commutative is True
                    terms.append(mul((x, y), True if c else None))
                    commutative = commutative and c
            if not terms:
                return sp.Integer(0)
            return terms[0] if len(terms) == 1 else sp.Add._from_args(terms, True if commutative else None)
        return sp.Add(*[x * y for x, y in zip(row, col)])

    def matmul(self, a, b):
        # the rows and columns read once, as lists: SymPy's a[i, k] costs more than the product
        rows, cols = a.tolist(), [list(c) for c in zip(*b.tolist())] if b.shape[0] else [[] for _ in range(b.shape[1])]
        return self.sp.Matrix(len(rows), len(cols), [self._dot(r, c) for r in rows for c in cols])

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

    # -- position-aware kinds (RoPE, ALiBi) ---------------------------------------------
    def rope_angles(self, positions, base, d: int, factors=None):
        """(n, d/2) exact angles m * base^(-2(i-1)/d): 1, 1/100, 10^(2/3)/100 (cos and sin stay symbolic);
        with RoPE scaling, m * c_i * base^(-2(i-1)/d) (exact factors c_i)."""
        sp = self.sp
        b = self.number(base)
        c = [sp.Integer(1)] * (d // 2) if factors is None else [self.number(f) for f in factors]
        return sp.Matrix(len(positions), d // 2, lambda r, i: sp.Integer(positions[int(r)]) * c[int(i)] * b ** sp.Rational(-2 * int(i), d))

    def rotate_pairs(self, a, pairs, angles):
        """Column pair p = (j, k) of row r turned by angles[r, p]: (x cos - y sin, x sin + y cos).

        Named steps keep the textbook's term order (q cos - q' sin); position 0 is no rotation."""
        sp = self.sp
        out = sp.Matrix(a)
        for r in range(a.shape[0]):
            for p, (j, k) in enumerate(pairs):
                x, y, phi = a[r, j], a[r, k], angles[r, p]
                if phi == 0:
                    out[r, j], out[r, k] = x, y
                    continue
                c, s = sp.cos(phi), sp.sin(phi)
                if self.name_steps:
                    out[r, j] = self._terms([(x, c), (-1, y, s)])
                    out[r, k] = self._terms([(x, s), (y, c)])
                else:
                    out[r, j], out[r, k] = self._plain(x * c - y * s), self._plain(x * s + y * c)
        return out

    def _terms(self, products):
        """An unevaluated sum of unevaluated products, zero terms left out."""
        sp = self.sp
        terms = [sp.Mul(*f, evaluate=False) for f in products if all(x != 0 for x in f)]
        return sp.Integer(0) if not terms else terms[0] if len(terms) == 1 else sp.Add(*terms, evaluate=False)

    def _plain(self, x):
        return x

    def pow2(self, r):
        return self.sp.Integer(2) ** self.sp.Rational(-r.numerator, r.denominator)

    def number(self, x):
        sp = self.sp
        if isinstance(x, sp.Basic):  # already parsed by the whitelist parser
            return x
        return sp.Rational(str(x)) if isinstance(x, float) else sp.Integer(x)

    def distance_bias(self, slope, rows: int, cols: int, offset: int = 0):
        sp = self.sp
        return sp.Matrix(rows, cols, lambda i, j: self._plain(-slope * (int(i) + offset - int(j))))

    def hstack(self, parts):
        return self.sp.Matrix.hstack(*parts)

    def vstack(self, parts):
        return self.sp.Matrix.vstack(*parts)

    # -- the Transformer block --------------------------------------------------------
    def plus(self, a, b):
        """a + b entry by entry; named steps keep the sum unevaluated (e_11 + o_11). Exact mode
        adds as SymPy does, without exact_form's canonical form: after a softmax and a norm an
        entry is a tree of exponentials under square roots, and expanding it (radsimp,
        expand) takes minutes for a 2 x 2 block; SymPy's own form stays linear in size."""
        sp = self.sp
        if self.name_steps:
            return self._each(a, b, lambda x, y: sp.Add(x, y, evaluate=False))
        return self._each(a, b, lambda x, y: x + y)

    def linear(self, a, w, bias):
        """a w (+ bias row), the feed-forward network's products: SymPy's own sums (see plus)."""
        result = self.matmul(a, w) if self.name_steps else self.sp.Matrix(a) * self.sp.Matrix(w)
        if bias is None:
            return result
        return self.add_row(result, bias) if self.name_steps else self._each(result, self.sp.Matrix(result.shape[0], result.shape[1], lambda i, j: bias[0, j]), lambda x, y: x + y)

    def _each(self, a, b, op):
        return self.sp.Matrix(a.shape[0], a.shape[1], lambda i, j: op(a[i, j], b[i, j]))

    def hadamard(self, a, b):
        sp = self.sp
        return self._each(a, b, (lambda x, y: sp.Mul(x, y, evaluate=False)) if self.name_steps else (lambda x, y: x * y))

    def tanh(self, a):
        """tanh of each entry, a SymPy function (exact numbers stay tanh(1/2))."""
        return a.applyfunc(self.sp.tanh)

    def activation(self, a, name: str):
        """The activations as SymPy functions: max(0, x), x/2 (1 + erf(x/sqrt 2)), the tanh form, x/(1 + e^-x)."""
        sp = self.sp
        fns = {
            "relu": self._relu,
            "gelu": lambda x: x * (1 + sp.erf(x / sp.sqrt(2))) / 2,
            "gelu_tanh": lambda x: x * (1 + sp.tanh(sp.sqrt(2 / sp.pi) * (x + sp.Rational(44715, 1000000) * x ** 3))) / 2,
            "silu": lambda x: x / (1 + sp.exp(-x)),
            "sigmoid": lambda x: 1 / (1 + sp.exp(-x)),
        }
        return a.applyfunc(fns[name])

    def route_weights(self, s, chosen, normalize: bool, scaling):
        """A router's weights (see NumericAlgebra.route_weights), the sum kept as a sum."""
        sp = self.sp
        ev = not self.name_steps
        c = sp.Rational(repr(scaling)) if isinstance(scaling, float) else sp.sympify(scaling)  # 2.5 -> 5/2, exact

        def entry(i, j):
            if j not in chosen[i]:
                return sp.Integer(0)
            w = s[i, j] / sp.Add(*[s[i, k] for k in chosen[i]], evaluate=ev) if normalize else s[i, j]
            return w if c == 1 else sp.Mul(c, w, evaluate=ev)

        return sp.Matrix(s.shape[0], s.shape[1], entry)

    def _relu(self, x):
        """max(0, x). An exact number's sign is read from 30 significant digits (SymPy's own
        Max proves it symbolically, which takes seconds on a LayerNorm'd entry); a value
        within 1e-25 of 0, or a symbol, is left to Max."""
        sp = self.sp
        if not self.name_steps and getattr(x, "is_number", False):
            for digits, tiny in ((30, "1e-25"), (120, "1e-110")):
                v = x.evalf(digits)
                if v.is_real and abs(v) > sp.Float(tiny):
                    return x if v > 0 else sp.Integer(0)
            if x.equals(0):  # a zero SymPy does not see (sums of surds that cancel): max(0, 0) = 0
                return sp.Integer(0)
            from attntrace.model.errors import BadInput

            raise BadInput("exact mode cannot decide the sign of a ReLU input within 1e-110 of 0; use --mode numeric or symbolic")
        return sp.Max(0, x)

    def norm(self, a, gain, bias, eps, rms: bool):
        """LayerNorm / RMSNorm row by row. With named steps (symbolic) an entry is written with
        the row's statistics as symbols, mu_i and sigma_i^2 (nu_i, the mean square, for RMSNorm)
        and epsilon, and details["defs"] says what each symbol stands for, one level deep:
        ((symbol, definition), ...), in the order they are computed. Otherwise computed through
        (eps a SymPy number); details give mean and var (or mean_square) per row."""
        sp = self.sp
        rows, d = a.shape
        row = lambda i: [a[i, k] for k in range(d)]  # noqa: E731
        named = self.name_steps
        e = sp.Symbol("\\varepsilon") if named else eps
        defs, stats = [], []
        for i in range(rows):
            if rms:
                ms = sp.Add(*[x ** 2 for x in row(i)], evaluate=not named) / d
                if named:
                    nu = sp.Symbol(f"\\nu_{{{i + 1}}}")
                    defs.append((nu, ms))
                    ms = nu
                stats.append((None, ms))
            else:
                mean = sp.Add(*row(i), evaluate=not named) / d
                if named:
                    mu = sp.Symbol(f"\\mu_{{{i + 1}}}")
                    defs.append((mu, mean))
                    mean = mu
                var = sp.Add(*[(x - mean) ** 2 for x in row(i)], evaluate=not named) / d
                if named:
                    sigma = sp.Symbol(f"\\sigma_{{{i + 1}}}")
                    defs.append((sigma ** 2, var))
                    var = sigma ** 2
                stats.append((mean, var))

        def entry(i, j):
            mean, spread = stats[i]
            centred = a[i, j] if mean is None else a[i, j] - mean
            y = centred / sp.sqrt(spread + e)
            if gain is not None:
                y = gain[0, j] * y
            if bias is not None:
                y = y + bias[0, j]
            return y

        result = sp.Matrix(rows, d, entry)
        if named:
            return result, {"defs": tuple(defs), "eps": eps}
        if rms:
            return result, {"mean_square": tuple(s[1] for s in stats)}
        return result, {"mean": tuple(s[0] for s in stats), "var": tuple(s[1] for s in stats)}

    def sinusoid(self, n: int, d: int, base):
        """Exact angles: sin(i / base^(2k/d)) stays sin(...) (sin 0 = 0, cos 0 = 1)."""
        sp = self.sp
        base = sp.Integer(base) if float(base).is_integer() else sp.Rational(str(base))
        angle = lambda i, j: sp.Integer(i) / base ** sp.Rational(2 * (j // 2), d)  # noqa: E731
        return sp.Matrix(n, d, lambda i, j: (sp.sin if j % 2 == 0 else sp.cos)(angle(int(i), int(j))))

    # -- the backward pass: unevaluated sums and products when steps are named -------
    def transpose(self, a):
        return a.T

    def grad_matmul(self, a, b):
        """A product of the backward pass: named (symbolic) as the forward's; see ExactAlgebra."""
        return self.matmul(a, b)

    def grad_divide(self, a, factor):
        return self.divide(a, factor)

    # -- the online softmax (exact mode; symbolic maxima cannot be compared) -------------
    def block(self, a, r0, r1, c0, c1):
        return a[r0:r1, c0:c1]

    def online_update(self, m_prev, l_prev, o_prev, t, v):
        """As NumericAlgebra.online_update, with exact numbers (Max of exact numbers is decided)."""
        sp = self.sp
        rows, cols = t.shape
        m = sp.Matrix(rows, 1, lambda i, _: sp.Max(*([m_prev[i, 0]] if m_prev is not None else []), *[t[i, j] for j in range(cols)]))
        fin = lambda x: x not in (-sp.oo,)  # noqa: E731
        p = sp.Matrix(rows, cols, lambda i, j: sp.exp(t[i, j] - m[i, 0]) if fin(t[i, j]) else sp.Integer(0))
        sums = sp.Matrix(rows, 1, lambda i, _: sp.Add(*[p[i, j] for j in range(cols)]))
        if m_prev is None:
            return {"m": m, "alpha": sp.zeros(rows, 1), "P": p, "l": sums, "O": p * v}
        alpha = sp.Matrix(rows, 1, lambda i, _: sp.exp(m_prev[i, 0] - m[i, 0]) if fin(m_prev[i, 0]) else sp.Integer(0))
        scale = sp.diag(*alpha)
        return {"m": m, "alpha": alpha, "P": p, "l": scale * l_prev + sums, "O": scale * o_prev + p * v}

    def online_finish(self, m, l, o):
        sp = self.sp
        return (sp.Matrix(o.shape[0], o.shape[1], lambda i, j: o[i, j] / l[i, 0]),
                sp.Matrix(m.shape[0], 1, lambda i, _: m[i, 0] + sp.log(l[i, 0])))

    def times(self, a, c):
        sp = self.sp
        return a.applyfunc(lambda x: sp.Mul(c, x, evaluate=False) if self.name_steps else c * x)

    def constant(self, shape, c):
        return self.sp.Matrix(shape[0], shape[1], lambda i, j: self.sp.sympify(c))

    def clamp(self, a, low, high):
        """Each entry limited to [low, high] (None: no limit on that side): SymPy's Min and Max."""
        sp = self.sp
        f = lambda x: x if high is None else sp.Min(x, sp.sympify(high))  # noqa: E731
        return a.applyfunc(lambda x: f(x) if low is None else sp.Max(f(x), sp.sympify(low)))

    def colsum(self, a):
        sp = self.sp
        ev = not self.name_steps
        return sp.Matrix(1, a.shape[1], lambda i, j: sp.Add(*[a[k, j] for k in range(a.shape[0])], evaluate=ev))

    def softmax_backward(self, a, da):
        """t-bar_ij = a_ij (g_ij - r_i), r_i = sum_j a_ij g_ij over the kept entries (a masked
        weight is exactly 0, and so is its gradient). details: rowdot (tuple of r_i)."""
        sp = self.sp
        ev = not self.name_steps
        rows, cols = a.shape
        r = [sp.Add(*[sp.Mul(a[i, j], da[i, j], evaluate=ev) for j in range(cols) if a[i, j] != 0], evaluate=ev) for i in range(rows)]

        def entry(i, j):
            if a[i, j] == 0:
                return sp.Integer(0)
            return sp.Mul(a[i, j], sp.Add(da[i, j], sp.Mul(-1, r[i], evaluate=ev), evaluate=ev), evaluate=ev)
        return sp.Matrix(rows, cols, entry), {"rowdot": tuple(r)}

    def softmax_jacobian(self, a, i):
        """The Jacobian of row i of the softmax: a_ij (1 - a_ij) on the diagonal, -a_ij a_ik off it."""
        sp = self.sp
        n, ev = a.shape[1], not self.name_steps
        return sp.ImmutableMatrix(n, n, lambda j, k: sp.Mul(a[i, j], sp.Add(1, -a[i, j], evaluate=ev), evaluate=ev) if j == k
                                  else sp.Mul(-1, a[i, min(j, k)], a[i, max(j, k)], evaluate=ev))

    def columns(self, a, first: int, stop: int):
        """Columns first..stop-1 (plain entries: never a softmax-derived matrix with forms)."""
        return a[:, first:stop]

    def finish(self, result, *, symbol, head, shape):
        sp = self.sp
        result = sp.ImmutableMatrix(result)
        if not self.name_steps or symbol is None:
            return result, None
        rows, cols = shape
        wide = max(rows, cols) >= 10
        names = [sp.Integer(0) if _is_zero(x) else sp.Symbol(entry_symbol(symbol, i + 1, j + 1, head, wide))
                 for i, row in enumerate(result.tolist()) for j, x in enumerate(row)]
        return sp.ImmutableMatrix(rows, cols, names), result
