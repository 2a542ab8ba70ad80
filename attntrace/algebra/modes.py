"""The four modes behind one interface, so the tracer has a single code path.

Each algebra works on the *values* of its mode (ndarray, SymPy matrix, or None for shape
mode); the tracer checks shapes before it calls them. `finish` turns a freshly computed
result into what a Step stores: in symbolic mode the result becomes the step's expansion
and the value becomes a matrix of new entry names, which is what keeps symbolic output
one level deep and its cost linear in the number of entries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from attntrace.inputs.expr import entry_name


def _entry_symbol(base: str, i: int, j: int, head, wide: bool) -> str:
    """An entry's name; an accented base (\\tilde{q}, the rotated queries) is no parser name,
    so it is written out here, as the reports write it (attntrace.rendering.viewparts.Ref)."""
    if not base.startswith("\\"):
        return entry_name(base, i, j, head=head, wide=wide)
    sup = "" if head is None else f"^{{({head})}}"
    return f"{base}{sup}_{{{f'{i},{j}' if wide else f'{i}{j}'}}}"


#: erf on arrays (NumPy has none; math.erf is correctly rounded enough for 1e-10 against torch).
_ERF = np.vectorize(math.erf, otypes=[np.float64])


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
        if a.flags.writeable and a.flags.owndata:  # a fresh product, not a step's value: in place
            a += row
            return a
        return a + row

    def columns(self, a, first: int, stop: int):
        """Columns first..stop-1: a view, as PyTorch's per-head split of the full-width projection."""
        return a[:, first:stop]

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
        One (n, n) buffer becomes the shift, then its exponentials, then the weights (in place);
        `shifted` and `exp` are recomputed from t and m_i, bit for bit, only when a report
        reads them (`SoftmaxDetails`): a trace does not keep two more (n, n) matrices per head.
        """
        row_max = t.max(axis=1, keepdims=True)
        buf = np.subtract(t, row_max)
        shift_finite = bool(np.isfinite(np.add.reduce(buf, axis=None)))  # under trace's errstate
        np.exp(buf, out=buf)
        row_sum = buf.sum(axis=1, keepdims=True)
        weights = np.divide(buf, row_sum, out=buf)
        return weights, SoftmaxDetails(t, _readonly(row_max[:, 0]), _readonly(row_sum[:, 0]), shift_finite)

    def hstack(self, parts):
        return np.hstack(parts)

    def vstack(self, parts):
        """Rows of the parts one under the other (a KV cache with the new token's row appended)."""
        return np.vstack(parts)

    # -- position-aware kinds (RoPE, ALiBi) ---------------------------------------------
    def rope_angles(self, positions, base, d: int):
        """(n, d/2) angles m * theta_i, theta_i = base^(-2(i-1)/d), as Hugging Face computes them."""
        inv_freq = 1.0 / (float(base) ** (np.arange(0, d, 2, dtype=np.float64) / d))
        return np.outer(np.asarray(positions, dtype=np.float64), inv_freq)

    def rotate_pairs(self, a, pairs, angles):
        """Column pair p = (j, k) of row r turned by angles[r, p]: (x cos - y sin, x sin + y cos)."""
        first, second = [j for j, _ in pairs], [k for _, k in pairs]
        c, s = np.cos(angles), np.sin(angles)
        out = np.empty(a.shape)
        out[:, first] = a[:, first] * c - a[:, second] * s
        out[:, second] = a[:, first] * s + a[:, second] * c
        return out

    def pow2(self, r) -> float:
        """2^(-r) for a Fraction r (the ALiBi paper's slopes)."""
        return 2.0 ** -float(r)

    def number(self, x) -> float:
        return float(x)

    def distance_bias(self, slope, rows: int, cols: int, offset: int = 0):
        """b_ij = -slope * (i + offset - j), the ALiBi bias of query i (at position i + offset) and key j."""
        return -slope * (np.arange(rows, dtype=np.float64)[:, None] + offset - np.arange(cols, dtype=np.float64)[None, :])

    # -- the Transformer block (attntrace.kinds.position/residual/norm/ffn) --------------
    def plus(self, a, b):
        """a + b entry by entry (residual connections, X + P)."""
        return a + b

    def hadamard(self, a, b):
        return a * b

    def linear(self, a, w, bias):
        """a w (+ bias row): the feed-forward network's products."""
        return a @ w if bias is None else a @ w + bias

    def activation(self, a, name: str):
        """relu, gelu (exact, with erf), gelu_tanh (the tanh approximation), silu: as torch defines them."""
        if name == "relu":
            return np.maximum(a, 0.0)
        if name == "gelu":
            return 0.5 * a * (1.0 + _ERF(a / math.sqrt(2.0)))
        if name == "gelu_tanh":
            return 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a ** 3)))
        if name == "silu":
            return a / (1.0 + np.exp(-a))
        raise ValueError(name)

    def norm(self, a, gain, bias, eps: float, rms: bool):
        """LayerNorm (biased variance, as nn.LayerNorm) or RMSNorm of each row, then gain and bias.

        details (float64, one entry per row): LayerNorm mean, var; RMSNorm mean_square.
        """
        if rms:
            ms = (a * a).mean(axis=1, keepdims=True)
            y, details = a / np.sqrt(ms + eps), {"mean_square": _readonly(ms[:, 0].copy())}
        else:
            mean = a.mean(axis=1, keepdims=True)
            c = a - mean
            var = (c * c).mean(axis=1, keepdims=True)
            y, details = c / np.sqrt(var + eps), {"mean": _readonly(mean[:, 0].copy()), "var": _readonly(var[:, 0].copy())}
        if gain is not None:
            y = y * gain
        if bias is not None:
            y = y + bias
        return y, details

    def sinusoid(self, n: int, d: int, base):
        """p[i, 2k] = sin(i / base^(2k/d)), p[i, 2k+1] = cos(i / base^(2k/d)), positions i = 0..n-1."""
        pos = np.arange(n, dtype=np.float64)[:, None]
        col = np.arange(d)[None, :]
        angle = pos / float(base) ** ((2 * (col // 2)) / d)
        return np.where(col % 2 == 0, np.sin(angle), np.cos(angle))

    # -- the backward pass (attntrace.kinds.backward) -------------------------------
    def transpose(self, a):
        return a.T

    def grad_matmul(self, a, b):
        return a @ b

    def grad_divide(self, a, factor):
        return a / factor

    # -- the online softmax (attntrace.kinds.online) -----------------------------------
    def block(self, a, r0, r1, c0, c1):
        return a[r0:r1, c0:c1]

    def online_update(self, m_prev, l_prev, o_prev, t, v):
        """One key block of FlashAttention-2's loop for the rows of a query block: m = max(m_prev,
        rowmax t), alpha = e^(m_prev - m), P = e^(t - m), l = alpha l_prev + rowsum P,
        O = diag(alpha) O_prev + P V. Before the first block m_prev = -inf, l_prev = 0, O_prev = 0
        (pass None). A masked score (-inf) gives P = 0, also while a row has seen only masked keys
        (m = -inf), where alpha is taken as 0: there is nothing yet to rescale."""
        m = t.max(axis=1, keepdims=True) if m_prev is None else np.maximum(m_prev, t.max(axis=1, keepdims=True))
        safe_m = np.where(np.isneginf(m), 0.0, m)
        p = np.where(np.isneginf(t), 0.0, np.exp(t - safe_m))
        if m_prev is None:
            alpha = np.zeros_like(m)
            return {"m": m, "alpha": alpha, "P": p, "l": p.sum(axis=1, keepdims=True), "O": p @ v}
        alpha = np.where(np.isneginf(m_prev), 0.0, np.exp(m_prev - safe_m))
        return {"m": m, "alpha": alpha, "P": p, "l": alpha * l_prev + p.sum(axis=1, keepdims=True), "O": alpha * o_prev + p @ v}

    def online_finish(self, m, l, o):
        """O = diag(l)^-1 O and the log-sum-exp L = m + log l."""
        return o / l, m + np.log(l)

    def times(self, a, c):
        return a * float(c)

    def constant(self, shape, c):
        return np.full(shape, float(c))

    def colsum(self, a):
        return a.sum(axis=0, keepdims=True)

    def softmax_backward(self, a, da):
        """dT = A o (dA - r 1^T), r_i = sum_j a_ij da_ij: the softmax's vector-Jacobian product
        row by row; a masked entry (weight exactly 0) gets exactly 0. details: rowdot r (n,)."""
        r = (da * a).sum(axis=1, keepdims=True)
        return a * (da - r), {"rowdot": _readonly(r[:, 0].copy())}

    def softmax_jacobian(self, a, i):
        """The Jacobian of row i of the softmax, diag(a_i) - a_i^T a_i."""
        row = a[i]
        return np.diag(row) - np.outer(row, row)

    def finish(self, result, *, symbol, head, shape):
        # No copy: a head's column block stays a view of the full-width product (BLAS takes
        # the row stride as it is), and a fresh result is already float64.
        return _readonly(result if result.dtype == np.float64 else result.astype(np.float64)), None


class SoftmaxDetails(Mapping):
    """The numeric softmax's details: row_max and row_sum kept, shifted and exp computed on
    first read (the same NumPy operations as the softmax, so the same bits) and then kept.
    Immutable, so a Step keeps it as it is (`immutable`). `shift_finite` says whether every
    t_ij - m_i was finite (else a masked -inf, or a row wider than the float range)."""

    immutable = True
    _KEYS = ("row_max", "shifted", "exp", "row_sum")

    def __init__(self, t, row_max, row_sum, shift_finite: bool):
        self._t, self.shift_finite = t, shift_finite
        self._have = {"row_max": row_max, "row_sum": row_sum}

    def __getitem__(self, key):
        if key not in self._have:
            if key == "shifted":
                self._have[key] = _readonly(self._t - self._have["row_max"][:, None])
            elif key == "exp":
                self._have[key] = _readonly(np.exp(self["shifted"]))
            else:
                raise KeyError(key)
        return self._have[key]

    def __iter__(self):
        return iter(self._KEYS)

    def __len__(self):
        return len(self._KEYS)


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

    # -- position-aware kinds (RoPE, ALiBi) ---------------------------------------------
    def rope_angles(self, positions, base, d: int):
        """(n, d/2) exact angles m * base^(-2(i-1)/d): 1, 1/100, 10^(2/3)/100 (cos and sin stay symbolic)."""
        sp = self.sp
        b = self.number(base)
        return sp.Matrix(len(positions), d // 2, lambda r, i: sp.Integer(positions[int(r)]) * b ** sp.Rational(-2 * int(i), d))

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

    def activation(self, a, name: str):
        """The activations as SymPy functions: max(0, x), x/2 (1 + erf(x/sqrt 2)), the tanh form, x/(1 + e^-x)."""
        sp = self.sp
        fns = {
            "relu": self._relu,
            "gelu": lambda x: x * (1 + sp.erf(x / sp.sqrt(2))) / 2,
            "gelu_tanh": lambda x: x * (1 + sp.tanh(sp.sqrt(2 / sp.pi) * (x + sp.Rational(44715, 1000000) * x ** 3))) / 2,
            "silu": lambda x: x / (1 + sp.exp(-x)),
        }
        return a.applyfunc(fns[name])

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
        names = sp.ImmutableMatrix(rows, cols, lambda i, j: sp.Integer(0) if result[i, j] == 0 else sp.Symbol(_entry_symbol(symbol, int(i) + 1, int(j) + 1, head, wide)))
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
        if name in {"matmul", "matmul_t", "add_row", "columns", "divide", "mask", "hstack", "vstack",
                    "rope_angles", "rotate_pairs", "pow2", "number", "distance_bias", "plus", "linear", "hadamard", "activation", "sinusoid",
                    "transpose", "grad_matmul", "grad_divide", "block", "times", "constant", "colsum", "softmax_jacobian"}:
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
