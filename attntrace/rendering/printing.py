"""Every math fragment of a report, built on SymPy's printer; no prose lives here.

Two outputs share one code path: `TexOut` writes LaTeX math (for Markdown and LaTeX reports,
KaTeX-safe macros only) and `PlainOut` writes plain math for the terminal. Both format only
the entries they show: a matrix larger than `max_size` is elided with dots, and
`STATS["entries"]` counts every number or expression formatted, so that tests can check that
the cost of a report follows what it shows, not the size of the matrices.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
import re
from typing import Any, Sequence

from functools import lru_cache

import numpy as np

from attntrace.model.formula import Node
from attntrace.rendering.formulatext import RELATIONS, plain, tex

#: How many entries (numbers or expressions) have been formatted; tests read and reset it.
STATS = {"entries": 0}

_NAME = re.compile(r"([A-Za-z]+)(.*)$", re.S)

#: An entry of a float matrix at most this fraction of the matrix's largest |entry| away from an
#: integer is float noise and prints as that integer (most often 0): float64 keeps ~16 significant
#: digits, and a sum of products that is 0 in exact arithmetic (latent attention's S^C of a latent
#: orthogonal to the query: -9.3e-17 beside entries near 1) ends a few ulps of its terms (about
#: 1e-16 of them) away from 0, one that is 4 a few ulps away from 4. 1e-12 leaves four
#: orders of magnitude for those ulps and for terms larger than the result, and is far below
#: anything the reports' 4 to 6 decimals could show. Only the printed copy changes: the trace
#: keeps its floats. Matrices with a `true_log10` (softmax weights, whose tiny entries are true
#: exponentials such as e^-40, never a cancellation) are printed as they are.
NOISE = 1e-12
#: ... and never further than this from the integer: beside entries of 5e11 the relative rule
#: alone would allow 0.5 and print a true 0.3 as 0. 1e-9 is below any decimal a report prints
#: and above the few ulps a sum of products leaves at entries up to about 1e6 (float64's ulp of
#: 1e6 is 1.2e-10); beyond that an entry near an integer prints with its decimals.
NOISE_CAP = 1e-9


def noise_tolerance(scale: float) -> float:
    """How far from an integer an entry of a matrix whose largest |entry| is `scale` may lie and
    still be float noise (`NOISE`, `NOISE_CAP`)."""
    return min(NOISE * scale, NOISE_CAP)


def without_noise(value: np.ndarray) -> np.ndarray:
    """`value` with each entry within float noise (`noise_tolerance`) of an integer set to that integer;
    `value` itself when it has none. 0 is one such integer (-9.3e-17 prints as 0); any other is
    the same cancellation around a whole number (RoPE's score 3.9999999999999996, an attention
    output 0.9999999999999999), so that the whole-number rules (`fixed`: a matrix of whole
    numbers prints integers) see the integer, not a float that would print as 4.0000."""
    finite = np.abs(value[np.isfinite(value)])
    if not finite.size:
        return value
    with np.errstate(invalid="ignore"):
        whole = np.rint(value)
        noise = (np.abs(value - whole) <= noise_tolerance(float(finite.max()))) & (value != whole)
    return np.where(noise, whole, value) if noise.any() else value


def within_rounding(gap: float, value) -> bool:
    """A nonzero difference `gap` between two computations of `value` that is float noise
    (`NOISE` of value's largest |entry|, at least of 1): float64 rounding, said in words in the
    prose (MLA's absorbed scores, the online softmax's Z), not printed as 4.4e-16."""
    return 0 < gap <= NOISE * max(float(np.max(np.abs(np.asarray(value, dtype=float)))), 1.0)


def whole_within_noise(x: float, scale: float) -> float:
    """x, or the integer it lies within float noise of (`noise_tolerance` of `scale`, the largest
    |entry| of its matrix), as `without_noise` prints it in the matrix: one entry of a worked line."""
    if math.isfinite(x):
        r = round(x)
        if x != r and abs(x - r) <= noise_tolerance(scale):
            return float(r)
    return x


def first_entries(value) -> tuple[np.ndarray, float]:
    """A matrix's first 4096 entries (through .flat: never a copy of a transposed weight) without
    float noise, and their largest finite |entry|: what a step's worked lines count decimals on and
    measure noise against, at a cost that does not grow with the matrix."""
    head = np.asarray(value.flat[:4096] if isinstance(value, np.ndarray) else value, dtype=np.float64).ravel()
    finite = np.abs(head[np.isfinite(head)])
    return without_noise(head), float(finite.max()) if finite.size else 0.0


class ShownRows:
    """`value[i, j]` for the shown rows i of an elided matrix, without float noise (`NOISE`); the
    scale is the largest |entry| of those rows. Printing an elided matrix then costs what is
    printed, not passes over a model's gigabytes of weights (a Llama-3-8B-shaped layer's
    Markdown report spent 3.8 s of 6 s in full passes)."""

    __slots__ = ("position", "rows")

    def __init__(self, value: np.ndarray, rows: list[int]):
        self.position = {i: k for k, i in enumerate(rows)}
        self.rows = without_noise(value[rows])

    def __getitem__(self, index: tuple[int, int]):
        i, j = index
        return self.rows[self.position[i], j]


@lru_cache(maxsize=None)
def printer_classes() -> tuple[type, type]:
    """SymPy's LaTeX and str printers with attntrace's entry names and number format.

    Built on first use, so that numeric reports never import SymPy. Entry names are already
    LaTeX from the whitelist parser (`w^{Q}_{11}`); a Greek base name (`alpha_{11}`) gets its
    backslash. Floats print with `precision` decimal places, trailing zeros trimmed. Settings
    are validated by SymPy's Printer (unknown ones raise).
    """
    from sympy.printing.latex import LatexPrinter
    from sympy.printing.str import StrPrinter

    class AttnLatexPrinter(LatexPrinter):
        _default_settings = {**LatexPrinter._default_settings, "order": "none", "precision": 4}

        def _print_Symbol(self, expr, style="plain"):
            return greek_name(expr.name)

        def _print_Float(self, expr):
            return tex_number(float(expr), self._settings["precision"], count=False)

        def _print_exp(self, expr, exp=None):
            """e, not e^{1}; a fraction in an exponent as a/b (e^{-1/2}): a \\frac there is set
            at script size, and at script-script size inside a fraction."""
            from sympy import Rational

            arg = expr.args[0]
            if arg == 1:
                body = "e"
            elif isinstance(arg, Rational) and arg.q != 1:
                body = f"e^{{{'-' if arg < 0 else ''}{abs(arg.p)}/{arg.q}}}"
            else:
                body = f"e^{{{self._print(arg)}}}"
            return body if exp is None else f"\\left({body}\\right)^{{{exp}}}"

        def _print_Add(self, expr, order=None):
            """x_{11} w_{11} + x_{12} w_{21} + ...: a sum of products of symbols (a symbolic
            step's entries) joined as SymPy joins it; SymPy's own asks each term
            could_extract_minus_sign, which negates it (an evaluated product: ~0.4 ms a sum),
            never true of a product of symbols."""
            from sympy import Mul, Symbol

            if (order or self.order) == "none" and all(type(t) is Mul and all(type(a) is Symbol for a in t.args) for t in expr.args):
                return " + ".join(self._print(t) for t in expr.args)
            return super()._print_Add(expr, order=order)

        def _print_Mul(self, expr):
            """2 e^{-x}, not SymPy's \\frac{2}{e^{x}}: exact weights and Z keep their exponentials
            upstairs, as the canonical forms of attntrace.algebra.exact_form write them."""
            from sympy import Mul, Symbol, exp

            if all(type(a) is Symbol for a in expr.args):  # x_{11} w_{11}: the bulk of a symbolic report
                return " ".join(self._print(a) for a in expr.args)
            if any(isinstance(a, exp) for a in expr.args) and not any(a.is_Pow and a.exp.is_negative for a in expr.args):
                c, rest = expr.as_coeff_Mul()
                body = " ".join(f"\\left({self._print(f)}\\right)" if f.is_Add else self._print(f) for f in Mul.make_args(rest))
                return body if c == 1 else ("- " + body if c == -1 else self._print(c) + " " + body)
            return super()._print_Mul(expr)

    class AttnStrPrinter(StrPrinter):
        _default_settings = {**StrPrinter._default_settings, "order": "none", "precision": 4}

        def _print_Symbol(self, expr):
            return plain_name(expr.name)

        def _print_Float(self, expr):
            return plain_number(float(expr), self._settings["precision"], count=False)

        def _print_Exp1(self, expr):
            return "e"

    return AttnLatexPrinter, AttnStrPrinter


def _is_infinite(x: Any) -> bool:
    """x is SymPy's oo or -oo (only SymPy values reach here, so SymPy is loaded already)."""
    import sympy

    return x in (sympy.oo, -sympy.oo)


def greek_name(name: str) -> str:
    m = _NAME.match(name)
    if not m or len(m.group(1)) == 1:  # a one-letter base is never a Greek name
        return name
    from sympy.printing.latex import greek_letters_set, tex_greek_dictionary

    if m.group(1) in greek_letters_set:
        base = m.group(1)
        return tex_greek_dictionary.get(base, "\\" + ("varepsilon" if base == "epsilon" else base)) + m.group(2)
    return name


#: How an accent over a letter is written in plain text, after the letter: T~, T', Tbar.
PLAIN_ACCENTS = {"tilde": "~", "hat": "'", "bar": "bar", "check": "check"}
_ACCENTED = r"\\(" + "|".join(PLAIN_ACCENTS) + r")\{(\w)\}"  # compiled by `re` on first use


def plain_accents(name: str) -> str:
    """Each accented letter of a LaTeX name in plain text: \\tilde{q}_{11} -> q~_{11}."""
    return re.sub(_ACCENTED, lambda m: m.group(2) + PLAIN_ACCENTS[m.group(1)], name)


def plain_name(name: str) -> str:
    """w^{Q(2)}_{11} -> w^Q(2)_11, \\alpha_{11} -> alpha_11 (braces and backslashes dropped);
    an accent follows its letter: \\tilde{q}_{11} -> q~_11, \\hat{t}_{11} -> t'_11."""
    return re.sub(r"[{}\\]", "", plain_accents(name))


@lru_cache(maxsize=8192)
def evalf17(x):
    """A SymPy entry's value to 17 digits (its real part), None when it has symbols. Cached per
    entry: a report prints an entry's approximation in its matrix, its entry line and the next
    step's substitution, and an exact GELU or softmax entry takes milliseconds to evaluate."""
    if getattr(x, "free_symbols", None) or not getattr(x, "is_number", False):
        return None
    f = x.evalf(17)
    if f.is_real is False:  # a complex value cannot come from real inputs; its real part
        f = f.as_real_imag()[0]
    return f


def _trim(x: float, precision: int) -> str:
    """x at `precision` decimals, trailing zeros trimmed; a value that is not a whole number keeps
    its zeros when it would print as one (cos 0.01 is 1.0000, not 1: a reader must not take it
    for an exact 1), and a nonzero value that rounds to zero prints as 0.0000, not 0."""
    s = f"{x:.{precision}f}"
    if "." in s:
        t = s.rstrip("0").rstrip(".")
        if "." not in t and math.isfinite(x) and x != int(x):
            return s.lstrip("-") if float(s) == 0 else s
        s = t
    return "0" if s in ("-0", "", "-") else s


def _padded(s: str, x: float, d: int) -> str:
    """A printed decimal `s` of x with its trailing zeros back up to d decimals (6.364 -> 6.3640
    when its matrix prints 4); a whole number, an exact 0 and an infinity as printed."""
    if "." not in s or not math.isfinite(x):
        return s
    return s + "0" * (d - (len(s) - s.index(".") - 1))


def tex_number(x: float, precision: int, count: bool = True) -> str:
    if count:
        STATS["entries"] += 1
    if math.isnan(x):
        return r"\mathrm{NaN}"
    if math.isinf(x):
        return r"\infty" if x > 0 else r"-\infty"
    return _trim(x, precision)


def plain_number(x: float, precision: int, count: bool = True) -> str:
    if count:
        STATS["entries"] += 1
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return _trim(x, precision)


def decimals_needed(xs, precision: int) -> int:
    """The decimals the longest of these numbers (a list or an array) needs at `precision`
    (trailing zeros trimmed), as `_trim` prints them.

    Many numbers are counted in NumPy: x 10^p rounded to an integer m, its trailing zeros
    counted; m is exact and rounds as the decimal printing does whenever x 10^p < 2^31 and is
    not within 1e-6 of a half (float error there is below 2.4e-7), and the few numbers that
    are not are printed one by one. So a report's layout costs O(entries) in C, not a string
    per entry."""
    if isinstance(xs, list) and len(xs) < 64:
        return _decimals_printed(xs, precision)
    a = np.asarray(xs, dtype=np.float64).ravel()
    a = a[np.isfinite(a) & (a != 0)]
    if a.size < 64:
        return _decimals_printed(a.tolist(), precision)
    scale = 10.0 ** precision
    with np.errstate(over="ignore", invalid="ignore"):  # 1e300 * 10^p: inf, which is unsure (printed)
        y = np.abs(a) * scale
        unsure = (y >= 2.0 ** 31) | (np.abs(y - np.floor(y) - 0.5) < 1e-6)
    d = _decimals_printed(a[unsure].tolist(), precision) if unsure.any() else 0
    a, m = a[~unsure], np.rint(y[~unsure])
    if a.size == 0:
        return d
    zeros = np.zeros(m.shape, dtype=np.int64)  # trailing decimal zeros of m, at most `precision`
    for k in range(1, precision + 1):
        zeros += np.mod(m, 10.0 ** k) == 0
    need = precision - zeros
    # a value that is not whole never prints as one: 0.99995 is 1.0000, 1e-9 is 0.0000
    need[(zeros == precision) & (a != np.trunc(a))] = precision
    return max(d, int(need.max()))


def _decimals_printed(xs: list[float], precision: int) -> int:
    d = 0
    for x in xs:
        if math.isfinite(x) and x != 0:
            t = _trim(x, precision)
            if "." in t:
                d = max(d, len(t) - t.index(".") - 1)
    return d


def reproducing_precision(precision: int, terms: list[tuple[float, ...]], result: str, most: int = 6) -> int:
    """The decimals (at least `precision`, at most `precision + most`) at which the printed
    operands of a substituted line, sum over terms of the product of each term's factors,
    reproduce its printed `result` at the result's own decimals; `precision` when none does.

    Why: RoPE's cos 0.01 printed as 1.0000 gives 2 * 1.0000 - 1 * 0.0100 = 1.99, which does not
    round to the printed 1.9899; at 5 decimals 2 * 0.99995 - 1 * 0.01 does."""
    sizes = [len(factors) for factors in terms]

    def sum_of_products(xs: list[float]) -> float:
        total, k = 0.0, 0
        for n in sizes:
            prod = 1.0
            for x in xs[k:k + n]:
                prod *= x
            total, k = total + prod, k + n
        return total

    return reproducing_digits(precision, [x for factors in terms for x in factors], sum_of_products, result, most)


def reproducing_digits(precision: int, operands: list[float], compute, result: str, most: int = 6) -> int:
    """The decimals (at least `precision`, at most `precision + most`) at which `compute` of the
    operands, each rounded as printed, gives the printed `result` at the result's own decimals
    (a norm's (0.0551 - 1) / sqrt(1.2774 + 10^-5), a score over sqrt(d_k)); `precision` when
    none does."""
    try:
        target = float(result)
    except ValueError:
        return precision
    d = len(result.split(".")[1]) if "." in result else 0
    for p in range(precision, precision + most + 1):
        try:
            got = compute([float(f"{x:.{p}f}") for x in operands])
        except (ValueError, ZeroDivisionError, OverflowError):
            return precision
        if abs(got - target) <= 0.5 * 10 ** -d + 1e-9 * max(1.0, abs(target)):
            return p
    return precision


def scientific(x: float) -> tuple[str, int]:
    """x = m * 10^e with two significant digits."""
    m, e = f"{x:.1e}".split("e")
    return m, int(e)


#: A number as an approximation prints it: sign and whole part, then the decimals (trailing zeros trimmed).
_DECIMAL = re.compile(r"(-?\d+)(?:\.(\d+))?")


def pick(n: int, limit: int) -> list[int | None]:
    """Indices shown out of n: all when n <= limit, else the first limit-1, a gap (None), the last."""
    if n <= limit:
        return list(range(n))
    return list(range(max(1, limit - 1))) + [None, n - 1]


@lru_cache(maxsize=4096, typed=True)
def entry_name(base: str, i: int, j: int, head: int | None = None, wide: bool = False) -> str:
    """The LaTeX name of entry (i, j) (1-based): x_{11}, w^{Q(2)}_{11}, q^{(2)}_{1,10}.

    Made once per name: a report names an entry in its matrix's expansion, in the products
    that read it and in their substituted lines (a 4x6 sentence report asks 251 times for 141
    names, 2.6 us each). Typed, so 1.0 or True is not taken for 1 (the parser refuses them)."""
    from attntrace.inputs.expr import entry_name as canonical

    return greek_name(canonical(base, i, j, head=head, wide=wide or i >= 10 or j >= 10))


class _Out:
    """What both outputs share: choosing entries, counting them, laying out matrices."""

    #: A change every formula tree gets before it is printed (a copy of an output that writes
    #: head 1's formulas for every head: `viewmodel.shape_rows`); None: printed as built.
    rewrite = None

    def __init__(self, precision: int = 4, max_size: int = 8, limit: float = 34.0):
        self.precision = precision
        self.matrix_precision = precision  # the matrices' precision; `digits` raises only `precision`
        self.max_size = max_size
        self.limit = limit  # the width a display line may take, in em (plain: characters / 2)
        self._printer = None
        self._printed: dict = {}  # SymPy expression -> its printed text (see printed)
        self._decimals: dict = {}  # id(array) -> (array, the decimals its matrix prints, its noise scale)

    # -- entries -------------------------------------------------------------
    def printed(self, e: Any) -> str:
        """A SymPy entry through this output's SymPy printer (`printer_classes()[plain]`), once:
        a matrix is laid out at a few column counts before one fits (`widest`), and an entry
        recurs in later steps (SymPy's == tells 1 from 1.0, so equal keys print alike)."""
        out = self._printed.get(e)
        if out is None:
            if self._printer is None:
                self._printer = printer_classes()[int(self.plain)]({"precision": self.precision})
            out = self._printed[e] = self._printer.doprint(e)
        return out

    def entry(self, value: Any, i: int, j: int) -> str:
        """One entry of a numeric or SymPy matrix. A numeric entry keeps the decimals its matrix
        prints (6.3640 beside a matrix of 6.3640, not 6.364), and more where a substituted line
        needs them (`digits`)."""
        if isinstance(value, np.ndarray):
            d, scale = self._first(value)
            x = whole_within_noise(float(value[i, j]), scale)
            return _padded(self.num(x), x, d)
        STATS["entries"] += 1
        return self.expr(value[i, j])

    def matrix_decimals(self, value: np.ndarray) -> int:
        """The decimals a numeric matrix's entries print with, counted as a step's results count
        them (`StepView.entry_result`: its first 4096 entries, never a copy of a
        transposed weight), once per array."""
        return self._first(value)[0]

    def _first(self, value: np.ndarray) -> tuple[int, float]:
        """(the decimals the matrix prints, the scale its float noise is measured against), counted
        on its first 4096 entries without noise (`first_entries`), once per array."""
        got = self._decimals.get(id(value))
        if got is None or got[0] is not value:
            head, scale = first_entries(value)
            got = self._decimals[id(value)] = (value, decimals_needed(head, self.matrix_precision), scale)
        return got[1], got[2]

    def is_negative(self, value: Any, i: int, j: int) -> bool:
        x = value[i, j]
        if isinstance(value, np.ndarray):
            return float(x) < 0 and _trim(float(x), self.precision) != "0"
        return bool(x.is_Add) or bool(getattr(x, "could_extract_minus_sign", lambda: False)())

    def factor(self, value: Any, i: int, j: int) -> str:
        """An entry as a factor of a product: parenthesized when negative or a sum (and in
        plain text when it is a fraction: 1/(1 + e)*3 would read ambiguously)."""
        s = self.entry(value, i, j)
        if self.is_negative(value, i, j) or (self.plain and "/" in s and not (s.startswith("(") and s.endswith(")"))):
            return self.paren(s)
        return s

    def approx_entry(self, value: Any, i: int, j: int) -> str | None:
        """The float value of a SymPy entry, or None when it is symbolic."""
        x = value[i, j]
        if _is_infinite(x):
            return self.num(float(x))
        f = evalf17(x)
        if f is None:
            return None
        if f == 0 or x == 0:
            return self.num(0.0)
        if abs(f) < 0.5 * 10 ** -self.precision:  # e^{-161/3} ~ 1e-23 (even 1e-5000): tiny, never 0
            import sympy

            lg = float(sympy.log(abs(f), 10).evalf(17))
            return ("-" if f < 0 else "") + self.power_of_ten(lg)
        return self.num(float(f))

    def matrix_of(self, rows: int, cols: int, cell, budget: float | None = None) -> str:
        """A matrix of shown cells: cell(i, j) for shown indices, dots for the gaps.

        With a `budget` (em), columns are elided further until the matrix fits it."""
        ri = pick(rows, self.max_size)

        def build(limit: int) -> tuple[str, int]:
            ci = pick(cols, limit)
            body = [[self.dots(i, j) if i is None or j is None else cell(i, j) for j in ci] for i in ri]
            return self.layout(body), sum(c is not None for c in ci)

        return self.widest(build, budget)[0]

    def widest(self, build, budget: float | None):
        """build(limit) -> (text, shown columns, ...) with the most columns, up to max_size, whose
        text fits `budget` (em); two columns (the first, dots, the last) when none fits.

        Widths grow with the columns, so the limit is found by doubling from 2 and then
        bisecting: O(log) texts, none much wider than the one returned, so the cost follows
        what is printed (a 300 x 300 matrix with max_size 1000 is not laid out 300 times)."""
        if budget is None:
            return build(self.max_size)
        lo, hi = 2, self.max_size  # the limit known to be taken (2 always is), the largest one left to try
        fits = {}  # limit -> its build, for the limits that fit
        probe = min(4, hi)
        while True:
            got = build(probe)
            ok = self.measure(got[0]) <= budget
            if got[1] < probe or probe == hi:  # every column shown, or max_size reached: the full text
                if ok or got[1] <= 2:
                    return got
                hi = got[1] - 1
                break
            if not ok:
                hi = probe - 1
                break
            lo, fits[probe], probe = probe, got, min(probe * 2, hi)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            got = build(mid)
            if self.measure(got[0]) <= budget:
                lo, fits[mid] = mid, got
            else:
                hi = mid - 1
        return fits.get(lo) or build(lo)

    def whole_matrix(self, value: Any, shape: tuple[int, int], budget: float) -> str | None:
        """The matrix with every column up to max_size when it fits `budget` (em), else None; in
        plain text always (its matrices span lines, never a line's width). A symbolic step's
        expansions seldom fit: its first row is printed and measured first (`wider_than`), as
        printing and measuring every entry to find that out would cost a third of a symbolic report."""
        if self.plain:
            return self.matrix(value, shape)
        if not isinstance(value, np.ndarray) and self.wider_than(value, shape, budget):
            return None
        text = self.matrix(value, shape)
        return text if self.measure(text) <= budget else None

    def wider_than(self, value: Any, shape: tuple[int, int], budget: float) -> bool:
        """Whether the matrix of `value` is surely wider than `budget`: its first row alone is."""
        return False

    def matrix(self, value: Any, shape: tuple[int, int], budget: float | None = None) -> str:
        if isinstance(value, np.ndarray):
            return self.numeric_matrix(value, shape, budget)
        return self.matrix_of(shape[0], shape[1], lambda i, j: self.entry(value, i, j), budget)

    def numeric_matrix(self, value: np.ndarray, shape: tuple[int, int], budget: float | None = None, true_log10=None) -> str:
        """One decimal layout for the whole matrix, so that its columns line up.

        Every entry gets as many decimals as the longest shown entry needs (at most
        `precision`); an exact zero prints as 0 and a nonzero entry that would round to 0
        in scientific notation, so the two never look alike. `true_log10(i, j)` gives, for
        an entry whose float is not its true value (an exponential that underflowed to 0,
        a weight of 1 - 1e-30), log10 of the true value, else None. Float noise prints as 0 (`NOISE`)."""
        ri = pick(shape[0], self.max_size)
        if true_log10 is None and value.dtype.kind == "f":
            elided = None in ri
            value = ShownRows(value, [i for i in ri if i is not None]) if elided else without_noise(value)
        memo: dict = {}  # (i, j, decimals, padded) -> the cell: `widest` builds several column counts

        def build(limit: int) -> tuple[str, int, int]:
            ci = pick(shape[1], limit)
            cells = [(i, j) for i in ri if i is not None for j in ci if j is not None]
            text, n = self._numeric_cells(value, ri, ci, cells, true_log10, pad=True, memo=memo)
            return text, sum(c is not None for c in ci), n

        text, _, n = self.widest(build, budget)
        STATS["entries"] += n
        return text

    def _numeric_cells(self, value, ri, ci, cells, true_log10, pad: bool, memo: dict | None = None):
        shown = [float(value[i, j]) for i, j in cells]
        inexact = {(i, j): true_log10(i, j) for i, j in cells} if true_log10 else {}
        if memo is None:
            d = decimals_needed(shown, self.precision)
        else:  # each entry's decimals counted once across the column counts `widest` tries
            d = 0
            for (i, j), x in zip(cells, shown):
                key = ("d", i, j)
                if key not in memo:
                    memo[key] = _decimals_printed([x], self.precision)
                d = max(d, memo[key])
        if any(v is not None and float(value[i, j]) != 0 for (i, j), v in inexact.items()):
            d = self.precision  # a rounded 1.0000 must not read as an exact 1
        # a column of exact zeros (a masked key, an unused feature) needs no phantom decimals
        zero_cols = {j for j in ci if j is not None and all(float(value[i, j]) == 0 and inexact.get((i, j)) is None
                                                              for i in ri if i is not None)}

        def cell(i, j):  # noqa: E306
            x, lg = float(value[i, j]), inexact.get((i, j))
            if lg is None:
                padded = pad and j not in zero_cols
                if memo is None:
                    return self.fixed(x, d, padded)
                key = (i, j, d, padded)
                if key not in memo:
                    memo[key] = self.fixed(x, d, padded)
                return memo[key]
            if x == 0:
                return self.power_of_ten(lg)
            if x == int(x):  # a float that rounded to a whole number (1 - 1e-20): show the rounding
                return f"{x:.{d}f}"
            return self.fixed(x, d, pad)
        body = [[self.dots(i, j) if i is None or j is None else cell(i, j) for j in ci] for i in ri]
        return (self.layout_numeric(body, d) if pad else body[0]), len(shown)

    def vector(self, xs: list[float | None], true_log10: list[float | None] | None = None) -> list[str]:
        """A row of numbers with one decimal layout (None = a gap shown as dots)."""
        cols = [None if x is None else k for k, x in enumerate(xs)]
        row = np.array([[0.0 if x is None else x for x in xs]])
        if not true_log10:  # float noise prints as the matrix prints it (`NOISE`, the row's scale)
            row = without_noise(row)
        lg = (lambda i, j: true_log10[j]) if true_log10 else None
        body, n = self._numeric_cells(row, [0], cols, [(0, k) for k in cols if k is not None], lg, pad=False)
        STATS["entries"] += n
        return body

    def approx_matrix(self, value: Any, shape: tuple[int, int], budget: float | None = None) -> str | None:
        """The float approximation of an exact matrix (None when an entry is symbolic, or when every
        entry is an integer or a fraction: then the approximation would only repeat the matrix)."""
        rows, cols = shape
        cells, plain = {}, True
        for i in pick(rows, self.max_size):
            for j in pick(cols, self.max_size):
                if i is None or j is None:
                    continue
                a = self.approx_entry(value, i, j)
                if a is None:
                    return None
                x = value[i, j]
                # a fraction reads as well as its decimal: only irrational entries (sqrt, e^x) need one
                plain = plain and (x.is_Rational or _is_infinite(x) or x.is_Float)
                cells[i, j] = a
        if plain:
            return None
        # one decimal layout, as a numeric matrix has (1.076 beside 1.0321 read as two precisions)
        decimals = {k: m for k, c in cells.items() if (m := _DECIMAL.fullmatch(c))}
        d = max((len(m.group(2) or "") for m in decimals.values()), default=0)
        for k, m in decimals.items():
            if cells[k] != "0" and len(m.group(2) or "") < d:
                cells[k] = f"{m.group(1)}.{(m.group(2) or '').ljust(d, '0')}"
        return self.matrix_of(rows, cols, lambda i, j: cells[i, j], budget)

    @contextmanager
    def digits(self, precision: int):
        """Operands printed at more decimals for one substituted line (reproducing_precision)."""
        old, self.precision = self.precision, precision
        try:
            yield self
        finally:
            self.precision = old

    def fixed(self, x: float, d: int, pad: bool = True) -> str:
        """x with d decimals; a whole number (exact 0 above all) without them, padded to the
        column's decimals in a matrix; a nonzero value that would print as 0 in scientific
        notation, so that it never looks like an exact 0."""
        if math.isfinite(x) and x == 0:
            return "0" + (self.pad(d) if d and pad else "")  # an exact zero stays 0 (masked weights)
        if math.isfinite(x) and x == int(x) and abs(x) < 1e15:
            # a whole number among decimals gets the same decimals (no 1 next to 1.0000);
            # a matrix of whole numbers prints as integers (d = 0)
            return f"{x:.{d}f}" if d and pad else str(int(x))
        if math.isinf(x) or math.isnan(x):
            return self.special(x)
        if abs(x) < 0.5 * 10 ** -d:
            return self.sci(*scientific(x))
        return f"{x:.{d}f}"

    def power_of_ten(self, lg: float) -> str:
        """10^lg in scientific notation (a value far below what a float holds)."""
        e = math.floor(lg)
        m = 10 ** (lg - e)
        if round(m, 1) >= 10:
            m, e = m / 10, e + 1
        return self.sci(f"{m:.1f}", e)

    def negated(self, term: str) -> bool:
        """A term that starts with its own minus sign, written as a subtraction in a sum."""
        return term.startswith("-")

    def add(self, terms: list[str]) -> str:
        out = terms[0]
        for t in terms[1:]:
            out += f" - {t[1:]}" if self.negated(t) else f" + {t}"
        return out

    def sum_terms(self, n: int, term) -> str:
        """term(k) for k in 0..n-1, joined by +, eliding the middle when n > 4."""
        ks = list(range(n)) if n <= 4 else [0, 1, None, n - 1]
        return self.add([self.ellipsis_term() if k is None else term(k) for k in ks])


def _fraction_entry(cell: str) -> bool:
    """A matrix entry that is a fraction: 1/2, 1/(1 + e^{1/2}), s_{11}/sqrt(2)."""
    return cell.lstrip("- ").startswith("\\frac{")


def _display_fraction(cell: str) -> str:
    """The entry's leading \\frac set in display style (full-size numerator and denominator)."""
    if not _fraction_entry(cell):
        return cell
    k = cell.index("\\frac{")
    return cell[:k] + "\\dfrac{" + cell[k + len("\\frac{"):]


class TexOut(_Out):
    """LaTeX math (KaTeX-safe)."""

    plain = False

    def num(self, x: float) -> str:
        return tex_number(x, self.precision)

    def expr(self, e: Any) -> str:
        return self.printed(e)

    def paren(self, s: str) -> str:
        return f"\\left({s}\\right)"

    def dots(self, i, j) -> str:
        return r"\ddots" if i is None and j is None else (r"\vdots" if i is None else r"\cdots")

    def ellipsis_term(self) -> str:
        return r"\cdots"

    def layout(self, body: list[list[str]]) -> str:
        # a fraction of exponentials (exact softmax weights) in text style sets its e^{...} at
        # script-script size, and fractions of adjacent rows touch: \dfrac, and air between rows
        if any(_fraction_entry(c) for row in body for c in row):
            body = [[_display_fraction(c) for c in row] for row in body]
            return "\\begin{bmatrix}" + " \\\\[6pt] ".join(" & ".join(row) for row in body) + "\\end{bmatrix}"
        # scripts on both rows (w^{Q(2)}_{11} under a^{(2)}_{11}) collide without a little air
        sep = " \\\\[2pt] " if any("^" in c for c in body[-1]) and len(body) > 1 else " \\\\ "
        return "\\begin{bmatrix}" + sep.join(" & ".join(row) for row in body) + "\\end{bmatrix}"

    def layout_numeric(self, body: list[list[str]], decimals: int) -> str:
        """Right-aligned columns: with one decimal layout the decimal points line up."""
        cols = "r" * len(body[0])
        return "\\left[\\begin{array}{" + cols + "}" + " \\\\ ".join(" & ".join(row) for row in body) + "\\end{array}\\right]"

    def pad(self, d: int) -> str:
        return f"\\phantom{{.{'0' * d}}}"

    def sci(self, m: str, e: int) -> str:
        return f"{m} \\cdot 10^{{{e}}}"

    def special(self, x: float) -> str:
        return tex_number(x, 0, count=False)

    def measure(self, tex: str) -> float:
        from attntrace.rendering.texwidth import width

        return width(tex)

    def wider_than(self, value: Any, shape: tuple[int, int], budget: float) -> bool:
        from attntrace.rendering.texwidth import matrix_width

        # the cells as `layout` writes them (a row with a fraction makes every fraction \dfrac);
        # the first few columns are often wider than the line already
        row: list[str] = []
        for j in pick(shape[1], self.max_size):
            row.append(self.dots(0, j) if j is None else _display_fraction(self.entry(value, 0, j)))
            if matrix_width([row]) > budget:
                return True
        return False

    def shape(self, shape: Sequence[int]) -> str:
        return f"{shape[0]} \\times {shape[1]}"

    def named(self, name: str, shape: Sequence[int]) -> str:
        return f"\\underset{{({self.shape(shape)})}}{{{name}}}"

    def mul(self, a: str, b: str) -> str:
        return f"{a} \\cdot {b}"

    def juxt(self, a: str, b: str) -> str:
        return f"{a} {b}"

    def negated(self, term: str) -> bool:
        return term.startswith("-") and not term.startswith("-\\")  # -\infty stays a term

    def frac(self, a: str, b: str) -> str:
        return f"\\frac{{{a}}}{{{b}}}"

    def sqrt(self, a: str) -> str:
        return f"\\sqrt{{{a}}}"

    def exp(self, a: str) -> str:
        return f"e^{{{a}}}"

    def sub(self, a: str, b: str) -> str:
        return f"{a} - {b}"

    def row(self, items: list[str]) -> str:
        return "\\left(" + ",\\ ".join(items) + "\\right)"

    def eq(self, *parts: str) -> str:
        return " = ".join(p for p in parts if p)

    def approx(self, a: str, b: str) -> str:
        return f"{a} \\approx {b}"

    def neg_inf(self) -> str:
        return r"-\infty"

    def max_row(self, i: int) -> str:
        return f"m_{{{i}}}"

    def block(self, inner: str, label: str) -> str:
        return f"\\underbrace{{{inner}}}_{{{label}}}"

    def inner_matrix(self, body: list[list[str]], numeric: bool = False) -> str:
        if numeric:  # right-aligned: one decimal layout lines the points up
            return "\\begin{array}{" + "r" * len(body[0]) + "}" + " \\\\ ".join(" & ".join(r) for r in body) + "\\end{array}"
        return "\\begin{matrix}" + " \\\\ ".join(" & ".join(r) for r in body) + "\\end{matrix}"

    def brackets(self, parts: list[str]) -> str:
        return "\\left[\\;" + " \\quad ".join(parts) + "\\;\\right]"

    def math(self, tree: Node) -> str:
        """A formula tree (`attntrace.model.formula`) in this output's notation."""
        return tex(tree if self.rewrite is None else self.rewrite(tree))

    def rule_after(self, matrix: str, col: int) -> str:
        """A printed matrix with a vertical rule after column `col` (when no column is elided):
        the parts of a block matrix [A | B]."""
        m = re.match(r"^\\left\[\\begin\{array\}\{r+\}(.*)\\end\{array\}\\right\]$", matrix, re.S)
        if m is None or "dots" in matrix:
            return matrix
        body = m.group(1)
        cols = body.split(" \\\\")[0].count("&") + 1
        if not 0 < col < cols:
            return matrix
        spec = "r" * col + "|" + "r" * (cols - col)
        return f"\\left[\\begin{{array}}{{{spec}}}{body}\\end{{array}}\\right]"

    def rule_before(self, matrix: str, row: int) -> str:
        """A printed matrix with \\hline before row `row` (0-based): a cache's new rows under its past ones."""
        parts = matrix.split(" \\\\ ")
        if not 0 < row < len(parts):
            return matrix
        return " \\\\ ".join(parts[:row]) + " \\\\ \\hline " + " \\\\ ".join(parts[row:])

    def rel(self, name: str) -> str:
        """A relation sign for a side of a laid-out chain: \\approx, \\to, ..."""
        return RELATIONS[name][0].strip()

    #: Parentheses around a sum that a line may break inside (fixed size: \\left \\right cannot break).
    big_open, big_close = "\\bigl(", "\\bigr)"

    def head_name(self, letter: str, head: int | None, transpose: bool = False) -> str:
        """K^{(2)\\top}: one superscript holding both the head and the transpose."""
        sup = ("" if head is None else f"({head})") + ("\\top" if transpose else "")
        if sup and re.search(_ENDS_IN_SUP, letter):  # Q^{C} -> Q^{C(2)}: one superscript, never two
            return f"{letter[:-1]}{sup}}}"
        return f"{letter}^{{{sup}}}" if sup else letter


class PlainOut(_Out):
    """Plain math for a terminal: matrices as aligned rows in brackets."""

    plain = True

    def num(self, x: float) -> str:
        return plain_number(x, self.precision)

    def expr(self, e: Any) -> str:
        if _is_infinite(e):
            return "-inf" if e < 0 else "inf"
        return self.printed(e)

    def paren(self, s: str) -> str:
        return f"({s})"

    def dots(self, i, j) -> str:
        return "..."

    def ellipsis_term(self) -> str:
        return "..."

    def layout_numeric(self, body: list[list[str]], decimals: int) -> str:
        return self.layout(body)

    def pad(self, d: int) -> str:
        return " " * (d + 1)

    def sci(self, m: str, e: int) -> str:
        return f"{m}e{e}"

    def special(self, x: float) -> str:
        return plain_number(x, 0, count=False)

    def measure(self, text: str) -> float:
        return max((len(line) for line in text.splitlines()), default=0) * 0.5

    def layout(self, body: list[list[str]]) -> str:
        widths = [max(len(r[c]) for r in body) for c in range(len(body[0]))]
        lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in body]
        return "\n".join(f"[ {line} ]" for line in lines)

    def shape(self, shape: Sequence[int]) -> str:
        return f"{shape[0]} x {shape[1]}"

    def named(self, name: str, shape: Sequence[int]) -> str:
        return f"{name} ({self.shape(shape)})"

    def mul(self, a: str, b: str) -> str:
        return f"{a}*{b}"

    def juxt(self, a: str, b: str) -> str:
        return f"{a}*{b}"


    def frac(self, a: str, b: str) -> str:
        wrap = lambda x: f"({x})" if re.search(r"[ +]|.-", x) and not (x.startswith("(") and x.endswith(")")) else x
        return f"{wrap(a)} / {wrap(b)}"

    def sqrt(self, a: str) -> str:
        return f"sqrt({a})"

    def exp(self, a: str) -> str:
        return f"e^({a})"

    def sub(self, a: str, b: str) -> str:
        return f"{a} - {b}"

    def row(self, items: list[str]) -> str:
        return "(" + ", ".join(items) + ")"

    def eq(self, *parts: str) -> str:
        parts = [p for p in parts if p]
        out = parts[0]
        for p in parts[1:]:
            out += (" =\n" if "\n" in p else " = ") + p
        return out

    def approx(self, a: str, b: str) -> str:
        return f"{a} ~\n{b}" if "\n" in b else f"{a} ~ {b}"

    def neg_inf(self) -> str:
        return "-inf"

    def max_row(self, i: int) -> str:
        return f"m_{i}"

    def block(self, inner: str, label: str) -> str:
        return f"{label}"

    def inner_matrix(self, body: list[list[str]], numeric: bool = False) -> str:
        return "; ".join(" ".join(r) for r in body)

    def brackets(self, parts: list[str]) -> str:
        return "[ " + " | ".join(parts) + " ]"

    def math(self, tree: Node) -> str:
        return plain(tree if self.rewrite is None else self.rewrite(tree))

    def rule_after(self, matrix: str, col: int) -> str:
        return matrix  # text columns have no rules

    def rule_before(self, matrix: str, row: int) -> str:
        return matrix

    def rel(self, name: str) -> str:
        return RELATIONS[name][1].strip()

    big_open, big_close = "(", ")"

    def head_name(self, letter: str, head: int | None, transpose: bool = False) -> str:
        return (letter if head is None else f"{letter}({head})") + ("^T" if transpose else "")



#: A name that ends in a superscript group without nested braces (Q^{C}, \\tilde{Q}^{R}).
_ENDS_IN_SUP = r"\^\{[^{}]*\}$"  # compiled by `re` on first use


def latex_expr(e: Any, precision: int = 4) -> str:
    """One SymPy expression as LaTeX in attntrace's style (term order kept)."""
    return printer_classes()[0]({"precision": precision}).doprint(e)
