"""Exact mode's canonical forms: one simplified form per entry, one term order everywhere.

Every entry an exact trace stores is built here (through `algebra.ExactAlgebra`), so equal
entries always look the same and no entry is one fraction while its neighbour is two.

Numbers: Q, K, V, scores, scaled scores, the row max and the shifts t - m
    `canonical(x)` = `normal(x)` = expand(radsimp(x)) (nested square roots denested first):
    SymPy's evaluated sum of rational multiples of distinct monomials, no radical in a
    denominator, the rational term first: 51*sqrt(2)/2, -1 + sqrt(2) (= 1/(1 + sqrt(2))),
    1/2 + sqrt(3)/2, -11/4 + 9*sqrt(2)/8. For numbers built from rationals and square roots
    it is unique (sqrt(8) is 2*sqrt(2)), so equal numbers have equal forms and ties in a
    softmax row are found by comparing structures, never floats. It is idempotent. It is
    SymPy's own evaluated form on purpose: an unevaluated "(1 + sqrt(3))/2" is undone by
    SymPy whenever the number is negated or multiplied (the printers negate the terms of a
    sum, e^{x} times a coefficient rebuilds x), so one entry would show in two forms.

Softmax rows (`SoftmaxRow`)
    The row max m of the kept entries is decided exactly: a difference of normal forms is an
    exact zero or a number whose sign `sign` finds with SymPy's adaptive-precision evalf (30
    correct significant digits; the working precision is raised until they are correct), and
    a difference that evaluates to zero is proven zero (minimal polynomial) before it is
    treated as a tie. Ties keep the first column. A row with free symbols cannot be ordered:
    its max is None and it is not shifted (shifted = t).
    shifted u_k = t_k - m, exponentials e^{u_k} (1 for the max, 0 where masked), and
        S = sum_k e^{u_k}, grouped: equal exponents are one term with a count; the
        constant (the max and its ties) first, then the other exponents in the column order
        of their first entry: 1 + e^{-3} + e^{-2} + e^{-1} for t = (0, 3, 1, 2). This is
        the term order of the row, used by every sum below.
    weights a_j = 1 / sum_k e^{t_k - t_j}, the sum written the same way relative to column
        j (its own group, now the constant, first; then the others in column order). For
        the max entry it is 1/S, the very same S. Two keys: 1/(1 + e^{-5*sqrt(2)/2}) and
        1/(1 + e^{5*sqrt(2)/2}); ties: 1/(2 + e^{1/2}); one kept key: 1; masked: exactly 0.

Weighted sums Z = A V, and what is computed from them (concat, Z W_O + b_O)
    An entry is kept as a `Form`, plain + sum over row sums S of (sum_g c_g e^{g}) / S with
    exact coefficients c_g per exponent group g of S, so that A V, the concatenation and
    the output projection are linear algebra on coefficients. Each S gives ONE fraction:
      - numerator terms c_g e^{g} in S's term order (the max's coefficient first), over S
        itself; a common integer denominator q of the coefficients goes in front of S:
        z = (1 + 6 e^{-5*sqrt(2)/2}) / (2 (1 + e^{-5*sqrt(2)/2}))  [v = (1/2, 3)];
      - a single numerator term c e^{g} is divided out, written like a weight:
        z = 5 / (1 + e^{5*sqrt(2)/2})  [= 5 a_12];
      - a numerator proportional to S (equal values, or one kept key) is the ratio: z = v.
    Several fractions (one per head in the output projection) follow the plain part (the
    bias), in head order: o = 1/3 + (..)/(2 S^(1)) + (..)/S^(2).
"""

from __future__ import annotations

from functools import lru_cache
from math import lcm
from typing import Any, Iterable, Sequence

import sympy as sp

#: Significant digits of the numeric sign test, and the working-precision limits tried.
SIGN_DIGITS = 30
SIGN_MAXN = (110, 2000)

_ZERO = sp.Integer(0)
_ONE = sp.Integer(1)


# ---------------------------------------------------------------------------------------
# numbers


def _needs_radsimp(x: sp.Expr) -> tuple[bool, bool]:
    """(a root nested in a root, a root in a denominator): the only work radsimp/sqrtdenest do."""
    nested = denominator = False
    for p in x.atoms(sp.Pow):
        if p.base.is_Rational:
            continue
        has_root = any(not q.exp.is_integer for q in p.base.atoms(sp.Pow))
        nested = nested or (has_root and not p.exp.is_integer)
        denominator = denominator or (has_root and p.exp.is_negative)
    return nested, denominator


@lru_cache(maxsize=8192)
def normal(x: sp.Expr) -> sp.Expr:
    """Expanded sum of rational multiples of distinct monomials, no radical in a denominator."""
    x = sp.sympify(x)
    if x.is_Rational or x.is_infinite:
        return x
    nested, denominator = _needs_radsimp(x)
    if nested:
        x = sp.sqrtdenest(x)
    if nested or denominator:
        x = sp.radsimp(x, symbolic=False)
    return sp.expand(x)


def _denominator(x: sp.Expr) -> int:
    """Least common denominator of the rational coefficients of a normal form's terms."""
    q = 1
    for term in sp.Add.make_args(x):
        c = term.as_coeff_Mul()[0]
        if c.is_Rational:
            q = lcm(q, int(c.q))
    return q


def canonical(x: Any) -> sp.Expr:
    """The one form in which exact mode stores and prints a number: its normal form."""
    x = sp.sympify(x)
    return x if x.is_infinite else normal(x)


def sign(d: sp.Expr) -> int | None:
    """The exact sign of a number in normal form: 1, -1, 0, or None when undecidable.

    A structural zero is 0; a rational is compared directly; anything else is evaluated to
    SIGN_DIGITS significant digits (SymPy's evalf raises the working precision until the
    digits are right, so the sign of a nonzero number is certain). When that precision runs
    out the number may be zero: an algebraic number is then settled by its minimal
    polynomial, a transcendental one is left undecided. Numbers with symbols: None.
    """
    if d == 0:
        return 0
    if d.is_Rational:
        return 1 if d > 0 else -1
    if d.free_symbols:
        return None
    for maxn in SIGN_MAXN:
        try:
            v = d.evalf(SIGN_DIGITS, maxn=maxn, strict=True)
        except sp.core.evalf.PrecisionExhausted:
            continue
        if v.is_Number and v != 0:
            return 1 if v > 0 else -1
    if is_zero(d):
        return 0
    return None


def is_zero(d: sp.Expr) -> bool:
    """Proven zero: structurally, or an algebraic number whose minimal polynomial is x."""
    if d == 0:
        return True
    if d.free_symbols or d.has(sp.exp, sp.E) or not d.is_algebraic:
        return False
    x = sp.Dummy("x")
    try:
        return sp.minimal_polynomial(d, x) == x
    except (NotImplementedError, sp.polys.polyerrors.NotAlgebraic):
        return False


def _surds_only(d: sp.Expr) -> bool:
    """d is built from rationals and square roots of rationals, where normal forms are unique."""
    return not d.free_symbols and all(p.base.is_Rational and p.exp == sp.S.Half for p in d.atoms(sp.Pow)) \
        and not d.atoms(sp.Function) and not d.has(sp.E)


def difference(a: sp.Expr, b: sp.Expr) -> sp.Expr:
    """normal(a - b) for normal forms a, b; exactly 0 when the difference is provably 0.

    A difference of two normal forms is a normal form already (SymPy's Add collects equal
    monomials); for numbers of square roots a nonzero normal form is a nonzero number, so
    only other numbers (nested or higher roots, exp) near zero need a proof of zero.
    """
    d = a - b
    if d == 0 or d.is_Rational or d.free_symbols or _surds_only(d):
        return d
    if abs(complex(d.evalf(20)).real) < 1e-12 and is_zero(d):
        return _ZERO
    return d


# ---------------------------------------------------------------------------------------
# softmax rows


class RowSum:
    """S = sum_g n_g e^{g} of one softmax row: its distinct exponents and their counts.

    keys are normal forms in column order (the order of each group's first entry); S is
    written relative to its constant group: the group with exponent 0 (the max and its
    ties) first, then the others in column order. Equal RowSums are the same number.
    """

    __slots__ = ("keys", "counts", "expr", "surds", "_hash")

    def __init__(self, keys: tuple, counts: tuple):
        self.keys, self.counts = keys, counts
        self._hash = hash((keys, counts))
        #: every key is built from rationals and square roots: differences need no zero proof
        self.surds = all(k.is_Rational or _surds_only(k) for k in keys)
        self.expr = _exp_sum((counts[i], keys[i]) for i in self.order())

    def order(self) -> list[int]:
        """Indices of keys in S's term order: the constant group first, then column order.

        (A row with symbols has no constant group unless an entry is 0: column order.)
        """
        lead = self.keys.index(_ZERO) if _ZERO in self.keys else 0
        return [lead] + [i for i in range(len(self.keys)) if i != lead]

    def __eq__(self, other) -> bool:
        return isinstance(other, RowSum) and self.keys == other.keys and self.counts == other.counts

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"RowSum({self.expr})"


def _exp_term(coeff: sp.Expr, exponent: sp.Expr) -> sp.Expr:
    """coeff * e^{exponent}, evaluated (robust: negating or scaling it keeps the exponent); coeff when the exponent is 0."""
    if exponent == 0:
        return coeff
    e = sp.exp(exponent, evaluate=False)  # exp.eval only finds nothing, slowly (evalf)
    return e if coeff == 1 else sp.Mul(coeff, e)


def _exp_sum(pairs: Iterable[tuple[sp.Expr, sp.Expr]]) -> sp.Expr:
    """sum of coeff * e^{exponent} in the given order, unevaluated (SymPy would reorder it)."""
    terms = [_exp_term(sp.sympify(c), g) for c, g in pairs]
    return terms[0] if len(terms) == 1 else sp.Add(*terms, evaluate=False)


@lru_cache(maxsize=4096)
def relative_sum(s: RowSum, g: sp.Expr) -> sp.Expr:
    """sum_h n_h e^{h - g}: S divided by e^{g}, group g (now the constant) first, then column order."""
    first = s.keys.index(g)
    order = [first] + [i for i in range(len(s.keys)) if i != first]
    sub = (lambda a, b: a - b) if s.surds else difference
    return _exp_sum((s.counts[i], sub(s.keys[i], g)) for i in order)


class SoftmaxRow:
    """One row of an exact softmax: max, shifts, exponentials, sum and weights, all canonical."""

    __slots__ = ("max", "shifted", "exps", "sum", "weights", "forms")

    def __init__(self, t: Sequence[sp.Expr]):
        kept = [k for k, x in enumerate(t) if x != -sp.oo]
        if not kept:
            raise ValueError("a softmax row needs a kept entry")
        tn = {k: normal(t[k]) for k in kept}
        best, ordered = kept[0], True
        for k in kept[1:]:
            s = sign(difference(tn[k], tn[best]))
            if s is None and (tn[k].free_symbols or tn[best].free_symbols):
                ordered = False
                break
            if s == 1:
                best = k
        m = tn[best] if ordered else None
        u = {k: (difference(tn[k], m) if ordered else tn[k]) for k in kept}
        # groups of equal exponents, in the column order of their first entry
        keys: list[sp.Expr] = []
        counts: list[int] = []
        surds = all(x.is_Rational or _surds_only(x) for x in u.values())
        for k in kept:
            same = [i for i, key in enumerate(keys) if key == u[k] or (not surds and difference(u[k], key) == 0)]
            if same:
                counts[same[0]] += 1
                u[k] = keys[same[0]]
            else:
                keys.append(u[k])
                counts.append(1)
        self.sum = RowSum(tuple(keys), tuple(counts))
        n = len(t)
        self.max = m
        self.shifted = [u[k] if k in u else -sp.oo for k in range(n)]
        self.exps = [_exp_term(_ONE, u[k]) if k in u else _ZERO for k in range(n)]
        self.forms = [Form(parts={self.sum: {u[k]: _ONE}}) if k in u else Form() for k in range(n)]
        self.weights = [f.present() for f in self.forms]


# ---------------------------------------------------------------------------------------
# linear forms over row sums: weights, Z, concat, output


class Form:
    """plain + sum over row sums S of (sum_g c_g e^{g}) / S, with normal-form coefficients."""

    __slots__ = ("plain", "parts")

    def __init__(self, plain: sp.Expr = _ZERO, parts: dict | None = None):
        self.plain = plain
        self.parts = parts or {}

    @classmethod
    def number(cls, x: sp.Expr) -> "Form":
        return cls(plain=normal(x))

    def scaled(self, v: sp.Expr) -> "Form":
        """self * v for a normal-form number v."""
        if v == 0:
            return Form()
        if v == 1:
            return self
        return Form(normal(self.plain * v), {s: {g: normal(c * v) for g, c in cs.items()} for s, cs in self.parts.items()})

    def add_to(self, acc: "Form") -> None:
        """acc += self (acc is modified in place; self is left alone)."""
        acc.plain = normal(acc.plain + self.plain) if self.plain != 0 else acc.plain
        for s, cs in self.parts.items():
            into = acc.parts.setdefault(s, {})
            for g, c in cs.items():
                into[g] = normal(into[g] + c) if g in into else c

    def present(self) -> sp.Expr:
        plain = self.plain
        fractions = []
        for s, cs in self.parts.items():
            cs = {g: c for g, c in cs.items() if c != 0}
            if not cs:
                continue
            if len(cs) == len(s.keys):  # proportional to S: the ratio itself
                r = normal(cs[s.keys[0]] / s.counts[0])
                if all(cs[g] == normal(r * n) for g, n in zip(s.keys, s.counts)):
                    plain = normal(plain + r)
                    continue
            fractions.append(_fraction(s, cs))
        terms = (list(sp.Add.make_args(plain)) if plain != 0 else []) + fractions
        if not terms:
            return _ZERO
        return terms[0] if len(terms) == 1 else sp.Add(*terms, evaluate=False)


def _fraction(s: RowSum, cs: dict) -> sp.Expr:
    """One fraction over S (see the module docstring); q = common integer denominator of the c_g."""
    q = 1
    for c in cs.values():
        q = lcm(q, _denominator(c))
    if len(cs) == 1:  # c e^{g} / S = c / (S e^{-g}): written like a weight
        (g, c), = cs.items()
        denom = relative_sum(s, g)
        if c.is_Add:  # (1 + sqrt(3)) / (2 D), not (1/2 + sqrt(3)/2) / D
            numer = normal(q * c)
        else:  # 13/(2 D) is SymPy's own form of 13/2 * 1/D
            numer, q = c, 1
    else:
        numer = _exp_sum((normal(q * cs[s.keys[i]]), s.keys[i]) for i in s.order() if s.keys[i] in cs)
        denom = s.expr
    # evaluated products: SymPy keeps 1/q, the numerator sum and 1/S as three factors (it only
    # distributes a number over a sum when they are the only two factors)
    return sp.Mul(numer, sp.Pow(denom, -1)) if q == 1 else sp.Mul(sp.Rational(1, q), numer, sp.Pow(denom, -1))


def clear_caches() -> None:
    """Forget the memoized normal forms and sums (benchmarks measure cold runs with this)."""
    for f in (normal, relative_sum):
        f.cache_clear()
