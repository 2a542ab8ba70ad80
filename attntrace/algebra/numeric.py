"""Numeric mode: float64 NumPy, no per-entry Python objects, so tracing costs little over bare NumPy.

Part of the four modes behind one interface (attntrace.algebra.modes.algebra_for).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

#: erf on arrays (NumPy has none; math.erf is correctly rounded enough for 1e-10 against torch).
_ERF = np.vectorize(math.erf, otypes=[np.float64])


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


class NumericAlgebra:
    """float64 NumPy: no per-entry Python objects, so tracing costs little over bare NumPy."""

    mode = "numeric"

    def __init__(self) -> None:
        #: how many BLAS products ran: `kinds.context.Context` sums a step's value for overflow
        #: only after one (a BLAS worker thread's overflow sets no flag NumPy could report)
        self.products = 0

    def matmul(self, a, b):
        self.products += 1
        return a @ b

    def matmul_t(self, a, b):
        self.products += 1
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
        np.exp(buf, out=buf)
        row_sum = buf.sum(axis=1, keepdims=True)
        weights = np.divide(buf, row_sum, out=buf)
        return weights, SoftmaxDetails(t, _readonly(row_max[:, 0]), _readonly(row_sum[:, 0]))

    def hstack(self, parts):
        return np.hstack(parts)

    def vstack(self, parts):
        """Rows of the parts one under the other (a KV cache with the new token's row appended)."""
        return np.vstack(parts)

    # -- position-aware kinds (RoPE, ALiBi) ---------------------------------------------
    def rope_angles(self, positions, base, d: int, factors=None):
        """(n, d/2) angles m * theta_i, theta_i = base^(-2(i-1)/d), as Hugging Face computes them;
        with RoPE scaling, m * c_i * theta_i (factors c_i, attntrace.kinds.ropescaling)."""
        inv_freq = 1.0 / (float(base) ** (np.arange(0, d, 2, dtype=np.float64) / d))
        if factors is not None:
            inv_freq = inv_freq * np.asarray([float(c) for c in factors], dtype=np.float64)
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

    def tanh(self, a):
        """tanh of each entry (tanh(+-inf) = +-1)."""
        return np.tanh(a)

    def linear(self, a, w, bias):
        """a w (+ bias row): the feed-forward network's products."""
        self.products += 1
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
        if name == "sigmoid":
            return 1.0 / (1.0 + np.exp(-a))
        raise ValueError(name)

    def route_weights(self, s, chosen, normalize: bool, scaling):
        """A router's weights: g_ij = c s_ij / sum of s_ik over the chosen k (or c s_ij without
        `normalize`) for the chosen experts j of token i (0-based), 0 for the others."""
        g = np.zeros(s.shape)
        for i, es in enumerate(chosen):
            idx = list(es)
            w = s[i, idx]
            g[i, idx] = (w / w.sum() if normalize else w) * float(scaling)
        return g

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
        self.products += 1
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
        self.products += 1  # P V below
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

    def clamp(self, a, low, high):
        """Each entry limited to [low, high] (None: no limit on that side), as torch.clamp."""
        return np.clip(a, None if low is None else float(low), None if high is None else float(high))

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
    Immutable, so a Step keeps it as it is (`immutable`). Whether a t_ij - m_i overflowed
    (a row wider than the float range) NumPy's floating-point flags tell the tracer
    (`kinds.context.FloatWatch`): a masked -inf minus its row's maximum raises none."""

    immutable = True
    _KEYS = ("row_max", "shifted", "exp", "row_sum")

    def __init__(self, t, row_max, row_sum):
        self._t = t
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
