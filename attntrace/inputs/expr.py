"""Whitelist parser for entry strings and symbol names.

Matrix entries and symbol names arrive as text (spec files, answer files, the command
line). They are read by the tokenizer and the recursive-descent grammar that user-text math
shares (`attntrace.inputs.tokens`, `attntrace.inputs.grammar`), with a back end here that
builds the result with SymPy constructors only; nothing is ever passed to `eval`, `sympify`,
`sympy.parse_expr` or `sympy.S(str)`, so a string can describe a number or a formula and
nothing else.

Grammar (whitespace between tokens is ignored)::

    expr  := term (("+" | "-") term)*
    term  := unary (("*" | "/") unary)*
    unary := ("+" | "-")* power
    power := atom (("^" | "**") unary)?          right-associative, binds tighter than
                                                 unary minus: -2^2 = -4, 2^-1 = 1/2
    atom  := number | name | "oo" | func "(" expr ")" | ("Max" | "Min") "(" expr ("," expr)* ")" | "(" expr ")"
    func  := "sqrt" | "exp" | "log" | "sin" | "cos" | "tanh" | "erf" | "acos"

- Numbers: 3, -0.25, .5, 1., 1e-3, 2.5E+4. Decimals become exact rationals (0.25 -> 1/4).
- Names: a single Latin letter or a Greek letter name (alpha ... omega, Alpha ... Omega),
  then an optional superscript and an optional subscript, written without spaces:
  ``w^Q``, ``w^{Q}``, ``z^{(1)}``, ``w^{Q(2)}``, ``v_1``, ``v_{11}``, ``v_{10,2}``,
  ``w^Q_{12}``. A superscript is one letter, or braces holding letters, digits,
  parentheses and commas (not digits alone: ``x^{2}`` is refused, write ``x^2``). A
  subscript is digits, or braces holding digits and commas. The canonical spelling
  braces both: ``w^Q_12`` is ``Symbol("w^{Q}_{12}")``, and ``str()`` of it parses back.
  So ``x^y`` (no spaces, one letter) is the *name* x^{y}; ``x ^ y``, ``x**y`` and
  ``x^(y)`` are powers.
- ``e`` and ``E`` are ordinary symbols, not Euler's number: write ``exp(1)``.
  ``pi`` is the symbol pi, not 3.14159... (the number is ``acos(-1)``).
- The names attntrace gives its own quantities read back too: a Greek letter in LaTeX
  (``\\mu_{1}``, ``\\varepsilon``) and a tilde, hat, bar or check over a letter (``\\tilde{q}_{11}``,
  ``\\tilde{k}^{(2)}_{11}``), so that every exported entry parses to the same expression
  (the functions above are those of the RoPE, norm, GELU and online-softmax kinds).
- Implicit multiplication is refused: ``2a`` and ``2(a+1)`` are errors; write ``2*a``.
- ``oo`` (infinity) is accepted only with ``allow_infinity=True``.

Limits keep every input cheap: at most 200 characters, nesting depth 20 (parentheses,
function calls and exponents), numeric exponents rational with |value| <= 100 and
denominator <= 1000, no integer power of a number larger than 100,000 bits, no root of a
number larger than 1024 bits, decimal exponents |e| <= 400, exp(a) of a number a only for
|a| <= 1000. Results must be real and defined (no division by zero, no square root of a
negative number, no oo - oo).

Every failure is a one-line `BadInput`, e.g.
``bad expression "2 +* 3": unexpected '*' at position 3`` (positions count from 0).
"""

from __future__ import annotations

import re
from functools import lru_cache
from numbers import Integral
from typing import TYPE_CHECKING

from attntrace.inputs import grammar, limits, tokens
from attntrace.model.errors import BadInput, Unsupported

if TYPE_CHECKING:  # SymPy is imported on first use: numeric mode never loads it
    import sympy

__all__ = [
    "GREEK",
    "MAX_DEPTH",
    "MAX_LENGTH",
    "entry_name",
    "entry_symbol",
    "parse_expr",
    "parse_symbol_base",
    "to_plain",
    "with_head",
]

MAX_LENGTH = 200
MAX_DEPTH = 20
MAX_EXPONENT = 100
MAX_EXPONENT_DENOMINATOR = 1000
MAX_POWER_BITS = 100_000
MAX_ROOT_BITS = 1024
MAX_DECIMAL_EXPONENT = 400
MAX_EXP_ARGUMENT = 1000

#: Greek letter names usable as symbol bases (SymPy's spellings, lower and capitalised).
GREEK = tokens.GREEK
_FUNCTIONS = ("sqrt", "exp", "log", "sin", "cos", "tanh", "erf", "acos", "Max", "Min")
#: LaTeX spellings of names attntrace writes itself: \mu, \varepsilon, \tilde{q} (never a command of any other kind).
_LATEX_GREEK = frozenset(GREEK | {"varepsilon", "vartheta", "varphi", "varrho", "varsigma"})
_ACCENTS = ("tilde", "hat", "bar", "check")
_SPACE = " \t"


#: Quote user text for a one-line message; the failure of a parse (TokenError's message form).
_show = tokens.show
_Fail = tokens.TokenError
balanced_parentheses = tokens.balanced_parentheses


# ---------------------------------------------------------------------------------------
# names and tokens (attntrace.inputs.tokens, with this reader's words)


def _name(base: str, sup: str | None, sub: str | None) -> str:
    """The canonical spelling of a name: base^{sup}_{sub}."""
    return base + ("" if sup is None else "^{" + sup + "}") + ("" if sub is None else "_{" + sub + "}")


def _read_name(text: str, pos: int, base: str) -> tuple[str, int]:
    """Read the superscript/subscript after a name base at text[pos:]; return (canonical, end).

    Superscript and subscript may come in either order, each at most once; the canonical
    form is base^{sup}_{sub}.
    """
    sup, sub, end = tokens.read_scripts(text, pos, base, letter_subscripts=False)
    return _name(base, sup, sub), end


def _number(m: re.Match, pos: int) -> str:
    if m.group(2) is not None and abs(int(m.group(2))) > MAX_DECIMAL_EXPONENT:
        raise _Fail(f"number {m.group(0)} is out of range", pos, f"decimal exponent at most {MAX_DECIMAL_EXPONENT}")
    return m.group(0)


def _unknown_word(word: str, pos: int) -> _Fail:
    return _Fail(f"unknown name {_show(word)}", pos,
                 "names are one letter or a Greek letter name; write products as a*b; functions: " + ", ".join(_FUNCTIONS))


_Tok = tokens.Token


def _tokenize(text: str) -> list[_Tok]:
    return tokens.tokenize(text, _LEXICON)


def _latex_base(text: str, pos: int) -> tuple[str, int]:
    """A name base in attntrace's LaTeX spelling at text[pos] (a backslash): \\nu or \\tilde{q}."""
    m = tokens.WORD.match(text, pos + 1)
    word = m.group(0) if m else ""
    end = pos + 1 + len(word)
    if word in _LATEX_GREEK:
        return "\\" + word, end
    if word in _ACCENTS and text.startswith("{", end):
        close = text.find("}", end + 1)
        inner = text[end + 1 : close] if close > 0 else ""
        if len(inner) == 1 and inner.isascii() and inner.isalpha() or inner[:1] == "\\" and inner[1:] in _LATEX_GREEK:
            return f"\\{word}{{{inner}}}", close + 1
    raise _Fail(f"unknown name {_show(text[pos:end + 3])}", pos, "after a backslash: a Greek letter, or tilde, hat, bar or check over a letter")


#: Entries: spaces and tabs, the operators and functions above, oo, attntrace's LaTeX names.
_LEXICON = tokens.Lexicon(spaces=_SPACE, operators="+-*/^(),", functions=_FUNCTIONS, infinity=("oo",), name=_name,
                          number=_number, unknown_word=_unknown_word, latex_base=_latex_base)


_describe = grammar.describe


# ---------------------------------------------------------------------------------------
# parser

def _bits_of_digits(digits: int) -> int:
    """Bits of the largest integer with `digits` decimal digits (rounded up)."""
    return int(digits * 3.3219280948873626) + 1


def _max_bits(expr: sympy.Expr) -> int:
    import sympy

    bits = 0
    for r in expr.atoms(sympy.Rational):
        bits = max(bits, abs(r.p).bit_length(), r.q.bit_length())
    return bits


def _total_bits(expr: sympy.Expr) -> int:
    import sympy

    return sum(abs(r.p).bit_length() + r.q.bit_length() for r in expr.atoms(sympy.Rational))


def _radicand_bits(expr: sympy.Expr) -> int:
    """Bits of the numbers under numeric roots (SymPy merges and re-factors them in products)."""
    import sympy

    return sum(
        _total_bits(p.base)
        for p in expr.atoms(sympy.Pow)
        if p.base.is_Rational and not p.exp.is_integer
    )


class _Parser(grammar.Parser):
    """The grammar of `attntrace.inputs.grammar` with SymPy values, each result checked as it is built."""

    def __init__(self, text: str, allow_symbols: bool, allow_infinity: bool, max_exp: float = MAX_EXP_ARGUMENT) -> None:
        super().__init__(_tokenize(text), MAX_DEPTH)
        self.text = text
        self.max_exp = max_exp
        self.allow_symbols = allow_symbols
        self.allow_infinity = allow_infinity

    def check(self, result: sympy.Expr, pos: int) -> sympy.Expr:
        """Refuse undefined results and exp of huge numbers.

        Bounding every numeric exp argument keeps all values below e^1000 in size, so the
        sign and zero tests SymPy runs numerically (evalf) stay cheap: exp(exp(exp(exp(9))))
        would otherwise make them run for hours. Inner exps were checked when they were built,
        so evaluating an argument here is itself cheap.
        """
        import sympy

        if result.has(sympy.nan, sympy.zoo):
            raise _Fail("undefined result (division by zero, 0*oo or oo-oo)", pos)
        digits = limits.get("digits")
        if _max_bits(result) > _bits_of_digits(digits):
            raise _Fail(f"a number with more than {digits} digits", pos,
                        f"limit digits = {digits:,}; raise it with {limits.ENV}=digits=N")
        for node in result.atoms(sympy.exp, sympy.sin, sympy.cos, sympy.tanh, sympy.erf, sympy.log):
            arg = node.args[0]
            if arg.free_symbols or arg.has(sympy.oo, -sympy.oo):
                continue
            size = arg.evalf(5)
            if not size.is_Number or abs(size) > self.max_exp:
                raise _Fail(f"{type(node).__name__} of a number larger than {self.max_exp}", pos)
        return result

    # -- grammar
    def parse(self) -> sympy.Expr:
        import sympy

        result = self.expr()
        tok = self.peek()
        if tok.kind != "end":
            raise _Fail(f"unexpected {_describe(tok)}", tok.pos)
        if result.has(sympy.I):
            raise _Fail("not a real number")
        return result

    def sum_add(self, left: sympy.Expr, op: _Tok, right: sympy.Expr) -> sympy.Expr:
        import sympy

        if op.kind == "-":
            right = sympy.Mul(sympy.S.NegativeOne, right)
        return self.check(sympy.Add(left, right), op.pos)

    def product_add(self, left: sympy.Expr, op: _Tok, right: sympy.Expr) -> sympy.Expr:
        import sympy

        if op.kind == "/":
            if right.is_zero:
                raise _Fail("division by zero", op.pos)
            right = sympy.Pow(right, sympy.S.NegativeOne)
        if _radicand_bits(left) and _radicand_bits(left) + _radicand_bits(right) > MAX_ROOT_BITS:
            raise _Fail(f"product of roots of more than {MAX_ROOT_BITS} bits", op.pos)
        return self.check(sympy.Mul(left, right), op.pos)

    def negate(self, operand: sympy.Expr, pos: int) -> sympy.Expr:
        import sympy

        return self.check(sympy.Mul(sympy.S.NegativeOne, operand), pos)

    def raise_to(self, base: sympy.Expr, exponent: sympy.Expr, pos: int) -> sympy.Expr:
        return self.pow(base, exponent, pos)

    def pow(self, base: sympy.Expr, exponent: sympy.Expr, pos: int) -> sympy.Expr:
        import sympy

        if exponent.is_number and not exponent.is_Rational and self.max_exp > MAX_EXP_ARGUMENT:
            # exported text only: SymPy writes exp(x ln 2) as 2**x (YaRN's mu^2 = (1 + ln(4)/10)^2 in a
            # softmax weight); a positive rational base, bounded like exp(x ln b)
            if not (base.is_Rational and base.is_positive) or _total_bits(base) > MAX_ROOT_BITS:
                raise _Fail("a numeric exponent must be a rational number", pos)
            size = (exponent * sympy.log(base)).evalf(5)
            if not size.is_Number or abs(size) > self.max_exp:
                raise _Fail(f"power of a number larger than e^{self.max_exp}", pos)
            return self.check(sympy.Pow(base, exponent), pos)
        if exponent.is_number:
            if not exponent.is_Rational:
                raise _Fail("a numeric exponent must be a rational number", pos)
            if abs(exponent) > MAX_EXPONENT or exponent.q > MAX_EXPONENT_DENOMINATOR:
                raise _Fail(
                    f"exponent {exponent} is too large",
                    pos,
                    f"at most {MAX_EXPONENT} in size, denominator at most {MAX_EXPONENT_DENOMINATOR}",
                )
            if exponent.is_integer:
                digits = limits.get("digits")
                if _max_bits(base) * abs(int(exponent)) > min(MAX_POWER_BITS, _bits_of_digits(digits)):
                    raise _Fail(f"power too large (a number with more than {digits} digits)", pos,
                                f"limit digits = {digits:,}; raise it with {limits.ENV}=digits=N")
            else:
                if _total_bits(base) > MAX_ROOT_BITS:
                    raise _Fail(f"root of numbers with more than {MAX_ROOT_BITS} bits", pos)
                if base.is_number and base.is_negative:
                    raise _Fail("not a real number (fractional power of a negative number)", pos)
            if base.is_zero and exponent.is_negative:
                raise _Fail("division by zero (0 to a negative power)", pos)
        elif _max_bits(base) > MAX_ROOT_BITS:
            raise _Fail(f"symbolic power of a number with more than {MAX_ROOT_BITS} bits", pos)
        return self.check(sympy.Pow(base, exponent), pos)

    def atom(self) -> sympy.Expr:
        import sympy

        tok = self.take()
        if tok.kind == "num":
            from fractions import Fraction  # exact and symbolic input only: not on every start

            f = Fraction(tok.value)
            return sympy.Rational(f.numerator, f.denominator)
        if tok.kind == "name":
            if not self.allow_symbols:
                hint = "write exp(1) for Euler's number" if tok.value in ("e", "E") else ""
                raise _Fail(f"{_show(tok.value)} is not a number", tok.pos, hint)
            return sympy.Symbol(tok.value)
        if tok.kind == "inf":
            if not self.allow_infinity:
                raise _Fail("infinity (oo) is not allowed here", tok.pos)
            return sympy.oo
        if tok.kind == "func":
            self.expect("(", f"'(' after {tok.value}")
            self.enter(tok.pos)
            args = [self.expr()]
            while self.peek().kind == ",":
                comma = self.take()
                if tok.value not in ("Max", "Min"):
                    raise _Fail("unexpected ','", comma.pos, f"{tok.value} takes one argument")
                args.append(self.expr())
            self.expect(")", f"')' closing {tok.value}(")
            self.leave()
            arg = args[0]
            if tok.value == "sqrt":
                if arg.is_number and arg.is_negative:
                    raise _Fail("not a real number (square root of a negative number)", tok.pos)
                if _total_bits(arg) > MAX_ROOT_BITS:
                    raise _Fail(f"root of numbers with more than {MAX_ROOT_BITS} bits", tok.pos)
            if tok.value in ("log", "acos") and arg.is_number and (arg <= 0 if tok.value == "log" else abs(arg) > 1):
                raise _Fail(f"not a real number ({tok.value} of {arg})", tok.pos)
            functions = {"sqrt": sympy.sqrt, "exp": sympy.exp, "log": sympy.log, "sin": sympy.sin, "cos": sympy.cos,
                         "tanh": sympy.tanh, "erf": sympy.erf, "acos": sympy.acos}
            if tok.value in ("Max", "Min"):
                return self.check((sympy.Max if tok.value == "Max" else sympy.Min)(*args), tok.pos)
            return self.check(functions[tok.value](arg), tok.pos)
        if tok.kind == "(":
            self.enter(tok.pos)
            inner = self.expr()
            self.expect(")", "')'")
            self.leave()
            return inner
        raise _Fail(f"unexpected {_describe(tok)}", tok.pos)


#: Exported text (`parse_expr(..., exported=True)`): entries attntrace wrote itself, e.g. a
#: softmax of raw scores in the thousands, e^(1785) in a weight: longer and larger, still bounded.
EXPORTED_LENGTH = 1_000_000
EXPORTED_EXP_ARGUMENT = 100_000


def parse_expr(text: str, *, allow_symbols: bool = True, allow_infinity: bool = False,
               exported: bool = False) -> sympy.Expr:
    """Parse an entry string into a SymPy expression (see the module docstring for the grammar).

    allow_symbols=False refuses every name ("x is not a number"); allow_infinity=True
    accepts ``oo`` (and so ``-oo``). `exported`: text of a trace's JSON (`to_plain`), which
    may be longer than a hand-written answer's 200 characters and hold exponentials of
    numbers beyond 1000 (EXPORTED_LENGTH, EXPORTED_EXP_ARGUMENT). Raises BadInput with a
    one-line message.
    """
    max_length = EXPORTED_LENGTH if exported else MAX_LENGTH
    if not isinstance(text, str):
        raise BadInput(f"expected an expression as text, got {type(text).__name__}")
    if len(text) > max_length:
        raise BadInput(f"bad expression {_show(text)}: too long ({len(text)} characters, at most {max_length})")
    if not text.strip(_SPACE):
        raise BadInput("bad expression: empty")
    try:
        return _Parser(text, allow_symbols, allow_infinity, EXPORTED_EXP_ARGUMENT if exported else MAX_EXP_ARGUMENT).parse()
    except _Fail as exc:
        raise BadInput(f"bad expression {_show(text)}: {exc}") from None
    except (ArithmeticError, ValueError, TypeError, RecursionError) as exc:
        # SymPy gave up deciding something about a huge number (e.g. exp(exp(exp(...))) vs 0)
        reason = " ".join(str(exc).split())[:80] or type(exc).__name__
        raise BadInput(f"bad expression {_show(text)}: cannot evaluate ({reason})") from None


# ---------------------------------------------------------------------------------------
# symbol names


def parse_symbol_base(text: str) -> str:
    """Validate a symbol-table base name (no subscript) and return its canonical form.

    ``v`` -> ``v``, ``w^Q`` -> ``w^{Q}``, ``z^{(1)}`` -> ``z^{(1)}``, ``alpha`` -> ``alpha``.
    """
    if not isinstance(text, str):
        raise BadInput(f"a symbol name must be text, got {type(text).__name__}")
    return _symbol_base(str(text))


@lru_cache(maxsize=1024)
def _symbol_base(text: str) -> str:
    stripped = text.strip(_SPACE)
    try:
        m = tokens.WORD.match(stripped)
        if not m:
            raise _Fail("a symbol name starts with a letter")
        word = m.group(0)
        if len(word) != 1 and word not in GREEK:
            raise _Fail(f"{_show(word)} is not one letter or a Greek letter name")
        name, end = _read_name(stripped, m.end(), word)
        if end != len(stripped):
            raise _Fail(f"unexpected {stripped[end]!r}", end)
        if "_" in name:
            raise _Fail("a base name has no subscript (indices are added per entry)")
    except _Fail as exc:
        raise BadInput(f"bad symbol name {_show(text)}: {exc}") from None
    return name


def with_head(base: str, head: int | None) -> str:
    """The base name with the head index as superscript: z -> z^{(2)}, w^{Q} -> w^{Q(2)}."""
    base = parse_symbol_base(base)
    if head is None:
        return base
    if isinstance(head, bool) or not isinstance(head, Integral) or head < 1:
        raise ValueError(f"head must be a positive integer, got {head!r}")
    if base.endswith("}"):
        return f"{base[:-1]}({int(head)})}}"
    return f"{base}^{{({int(head)})}}"


def accented_with_head(base: str, head: int | None) -> str:
    """An accented base (\\tilde{q}, \\tilde{q}^{R}) with the head as superscript, merged into
    its own superscript when it has one: \\tilde{q}^{(2)}, \\tilde{q}^{R(2)}."""
    if head is None:
        return base
    if re.search(r"\^\{[^{}]*\}$", base):
        return f"{base[:-1]}({int(head)})}}"
    return f"{base}^{{({int(head)})}}"


def entry_name(base: str, i: int, j: int, *, head: int | None = None, wide: bool = False) -> str:
    """The canonical name of entry (i, j) (1-based): s_{11}; wide -> s_{1,1}; head -> z^{(2)}_{11}.

    Pass wide=True for every entry of a matrix with a dimension >= 10 (indices >= 10 with
    wide=False would be ambiguous and raise ValueError).
    """
    for k in (i, j):
        if isinstance(k, bool) or not isinstance(k, Integral) or k < 1:
            raise ValueError(f"entry indices are positive integers, got {k!r}")
    if not wide and (i >= 10 or j >= 10):
        raise ValueError(f"index ({i}, {j}) needs wide=True (comma-separated subscript)")
    sub = f"{int(i)},{int(j)}" if wide else f"{int(i)}{int(j)}"
    return f"{with_head(base, head)}_{{{sub}}}"


# ---------------------------------------------------------------------------------------
# printing


@lru_cache(maxsize=1)
def _plain_printer():
    """SymPy's str printer, except Euler's number is exp(1) (E would read back as a symbol)."""
    import sympy
    from sympy.printing.str import StrPrinter

    class PlainPrinter(StrPrinter):
        def _print_Exp1(self, expr) -> str:  # noqa: N802 - SymPy printer protocol
            return "exp(1)"

        def _print_Pi(self, expr) -> str:  # noqa: N802 - pi would read back as the symbol pi
            return "acos(-1)"

        def _print_Mul(self, expr) -> str:  # noqa: N802
            # SymPy prints 2*(x + 1)*y/(3*(z + 1)); read back, 2*(x + 1) and 3*(z + 1) are
            # two-factor products that SymPy distributes (2*x + 2), a different expression.
            # When a number would meet a sum that way, print the number last: (x+1)*y/(z+1)*2/3.
            c, rest = expr.as_coeff_Mul()
            if c.is_Rational and c != 1 and rest is not sympy.S.One:
                factors = sympy.Mul.make_args(rest)
                in_numerator = any(f.is_Add for f in factors)
                in_denominator = c.q != 1 and any(f.is_Pow and f.exp == -1 and f.base.is_Add for f in factors)
                if in_numerator or in_denominator:
                    head = self.parenthesize(rest, 50, strict=True)  # PRECEDENCE["Mul"]
                    if c < 0:
                        return f"{head}*({c})"
                    return head + (f"*{c.p}" if c.p != 1 else "") + (f"/{c.q}" if c.q != 1 else "")
            return super()._print_Mul(expr)

    return PlainPrinter()


@lru_cache(maxsize=4096)
def _valid_name(name: str) -> bool:
    import sympy

    try:
        return parse_expr(name) == sympy.Symbol(name)
    except BadInput:
        return False


def to_plain(expr) -> str:
    """Plain text for an expression that `parse_expr` reads back to the same expression.

    Supported: integers, rationals, symbols with valid names (attntrace's LaTeX names such as
    \\tilde{q}_{11} included), + - * / **, sqrt, exp, log, sin, cos, tanh, erf, Max, Min, E
    (printed exp(1)), pi (printed acos(-1)), oo and -oo (read back with allow_infinity=True).
    Anything else (floats, I, other functions) raises Unsupported. Long results may exceed
    parse_expr's 200-character limit: read them with `exported=True`.
    """
    import sympy

    plain_types = (sympy.Integer, sympy.Rational, sympy.core.numbers.Infinity,
                   sympy.core.numbers.NegativeInfinity, sympy.core.numbers.Exp1, sympy.core.numbers.Pi,
                   sympy.Add, sympy.Mul, sympy.Pow, sympy.exp, sympy.log, sympy.sin, sympy.cos, sympy.tanh,
                   sympy.erf, sympy.Max, sympy.Min)  # fmt: skip
    if isinstance(expr, int) and not isinstance(expr, bool):
        expr = sympy.Integer(expr)
    if not isinstance(expr, sympy.Expr):
        raise Unsupported(f"cannot write {type(expr).__name__} as a plain expression")
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Symbol):
            if type(node) is not sympy.Symbol or node.assumptions0 != sympy.Symbol("x").assumptions0 \
                    or not _valid_name(node.name):
                raise Unsupported(f"cannot write symbol {node.name!r} as plain text")
        elif not isinstance(node, plain_types):
            raise Unsupported(f"cannot write {node} ({type(node).__name__}) as plain text")
    return _plain_printer().doprint(expr)


def entry_symbol(base: str, i: int, j: int, head, wide: bool) -> str:
    """An entry's name; an accented base (\\tilde{q}, the rotated queries) is no parser name,
    so it is written out here, as the reports write it (attntrace.rendering.viewparts.Ref)."""
    if not base.startswith("\\"):
        return entry_name(base, i, j, head=head, wide=wide)
    return f"{accented_with_head(base, head)}_{{{f'{i},{j}' if wide else f'{i}{j}'}}}"
