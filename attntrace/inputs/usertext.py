"""User text with math: ``$...$`` spans in titles and descriptions.

A spec's title or description is prose with optional inline math written between dollars in
the entry syntax of `attntrace.inputs.expr` (``Scaling by $sqrt(d_k)$ with $d_k = 6$``). Each span
is parsed by a whitelist parser and printed by attntrace's own code; everything else is
escaped text. User LaTeX never reaches the output: from a span only what the printer writes
for a parsed expression comes out (names that match the name rules, numbers as digits, fixed
operators and macros), so ``$\\input{x}$`` is shown as the text it is.

    format_user_text(text, fmt, *, inline_math=None, escape=None) -> str
    heading_text(text, fmt) -> str                   a title for a heading: its math as text
    render_math(source, fmt) -> str | None         one span's content, without delimiters
    inline_math_for(fmt, delimiters="dollars")      the format's inline-math wrapper

Splitting. A ``$`` opens a span and the next ``$`` closes it; ``\\$`` is a literal dollar
sign; an unmatched ``$`` and an empty span (``$$``) are literal text. A span that does not
parse is shown as literal, escaped text *including its dollars*, and scanning goes on from
its closing ``$`` (which may open a span of its own: in ``costs $5 or $x$`` the span
``$5 or $`` fails, ``$x$`` is math). A title never stops a report: no exception for any
text, and a course author sees exactly what went wrong in the output. At most
`MAX_SPANS_PER_TEXT` spans of one text are parsed; later ones are literal text.

Grammar of a span (the entry grammar of `attntrace.inputs.expr`, plus relations and letter
subscripts)::

    span   := expr (REL expr)*          REL: = < > <= >= != -> ~  (also ≈ ≤ ≥ ≠ →)
    expr   := term (("+" | "-") term)*
    term   := unary (("*" | "/") unary)*
    unary  := ("+" | "-")* power
    power  := atom (("^" | "**") unary)?
    atom   := number | name | "oo" | "inf" | ("sqrt" | "exp") "(" expr ")" | "√" atom
              | "(" expr ")"

- Names: one Latin letter or a Greek letter name (`attntrace.inputs.expr.GREEK`), then an
  optional superscript (``^Q``, ``^{(2)}``) and subscript, as in `attntrace.inputs.expr`, except
  that a subscript may hold letters: ``d_k``, ``W_O``, ``X_kv``, ``a_ij``, ``d_model``,
  ``v_{i,j}``. Printed ``d_{k}``, ``W_{O}``, ``X_{\\mathrm{kv}}``, ``a_{ij}``; a subscript or
  superscript that is a word of three or more letters is upright: ``d_{\\text{model}}``, and so
  are the names ``kv`` and ``ff`` (``X_{\\mathrm{kv}}``, ``d_{\\text{ff}}``, as the derivations print
  them); other one- and two-letter ones are indices (``a_{ij}``). Greek
  names get their macro (``alpha`` -> ``\\alpha``, ``Omega`` -> ``\\Omega``).
- Products need ``*`` (``2*q*k``); LaTeX writes them by juxtaposition (``2 q k``, with
  ``\\cdot`` before a factor that starts with a digit), plain text keeps ``*``.
- Numbers are printed as written (``2.449`` stays 2.449, ``.5`` becomes 0.5, ``1e-3`` is
  ``1 \\times 10^{-3}``): a title quotes numbers, it does not compute them.
- ``oo``/``inf``/``∞`` is infinity; ``−``, ``×``, ``·`` are read as ``-``, ``*``, ``*``.
- Limits: a span of at most `attntrace.inputs.expr.MAX_LENGTH` (200) characters and nesting depth
  `attntrace.inputs.expr.MAX_DEPTH` (20), as for entries.

Why not `attntrace.inputs.expr.parse_expr` + SymPy's printer: that parser builds *evaluated* SymPy
objects in SymPy's canonical order (``2*q*k - k^2`` prints as ``- k^{2} + 2 k q``,
``2*a + b`` as ``b + 2 a``, ``2.449`` as 2449/1000), it refuses letter subscripts (they are
not entry names), and printing through SymPy would import SymPy into numeric reports, which must never load it (tested in
test_api/test_bench_smoke; about 0.5 s). So this module is a second, SymPy-free back
end of the same tokenizer and grammar (`attntrace.inputs.tokens`, `attntrace.inputs.grammar`) that keeps the author's form, and a printer that writes the
notation of `attntrace.rendering.printing` (``\\left(...\\right)``, ``\\frac``, ``\\sqrt{}``,
``e^{x}``, juxtaposed products, ``-\\infty``; plain: ``sqrt(6)``, ``a*b``, ``inf``). Powers
stay ``^`` in plain text (``-(q - k)^2``), as the author wrote them. Parentheses are
re-derived from precedence: redundant ones go (``(a*b)*c`` -> ``a b c``), needed ones
stay (``-(q - k)^2`` -> ``-\\left(q - k\\right)^{2}``); nothing is expanded or reordered.

CJK text: a space is put between a CJK character (Han, kana, Hangul; not the full-width
punctuation) and an adjacent math span in every format, as the Chinese prose templates do
(``自注意力$x$`` -> ``自注意力 $x$``): several Markdown renderers do not open math glued to
CJK characters, and xeCJK typesets the space as its usual CJK/Western gap.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable

from attntrace.inputs.expr import MAX_DEPTH, MAX_LENGTH
from attntrace.inputs.grammar import Parser
from attntrace.inputs.tokens import Lexicon, Token, TokenError, tokenize
from attntrace.inputs.textescape import escape_md, escape_tex, escape_tex_prose, escape_text
from attntrace.inputs.safetext import check_sympy_entry, clean_output, clean_text, has_unsafe_chars, json_safe, one_line  # noqa: F401  (re-exported)

__all__ = ["MAX_SPANS_PER_TEXT", "check_sympy_entry", "clean_output", "clean_text", "format_user_text", "has_unsafe_chars", "heading_text", "inline_math_for",
           "json_safe", "one_line", "render_math"]

#: Spans parsed per text at most; further spans are shown as literal text (10,000 dollars
#: cost no more than a few spans).
MAX_SPANS_PER_TEXT = 64

FORMATS = ("md", "tex", "text")

# ----------------------------------------------------------------------------- tokens

_RELATIONS = {  # token -> (LaTeX, plain)
    "<=": (r"\le", "<="), ">=": (r"\ge", ">="), "!=": (r"\ne", "!="), "->": (r"\to", "->"),
    "=": ("=", "="), "<": ("<", "<"), ">": (">", ">"), "~": (r"\approx", "~"),
    "≈": (r"\approx", "~"), "≤": (r"\le", "<="), "≥": (r"\ge", ">="), "≠": (r"\ne", "!="), "→": (r"\to", "->"),
}
#: The relations, compiled with the lexicon. The non-ASCII signs are branches of their own, not
#: members of one character class: a class holding them is compiled into a Unicode charset table
#: (0.24 ms at the first span of a process, against 0.07 ms this way); the matches are the same.
_REL = r"<=|>=|!=|->|[=<>~]|≈|≤|≥|≠|→"
_UNICODE_OPS = str.maketrans({"−": "-", "×": "*", "·": "*", "⋅": "*", "∞": " oo "})
_FUNCTIONS = ("sqrt", "exp")
_INFINITY = ("oo", "inf")
# as SymPy's LaTeX printer writes them (capitals without a glyph of their own are upright
# Latin letters), except epsilon, which attntrace.rendering.printing.greek_name writes \varepsilon
_GREEK_SPECIAL = {"epsilon": r"\varepsilon", "lamda": r"\lambda", "Lamda": r"\Lambda", "omicron": "o",
                  **{g: f"\\mathrm{{{c}}}" for g, c in (("Alpha", "A"), ("Beta", "B"), ("Epsilon", "E"), ("Zeta", "Z"),
                                                     ("Eta", "H"), ("Iota", "I"), ("Kappa", "K"), ("Mu", "M"), ("Nu", "N"),
                                                     ("Omicron", "O"), ("Rho", "P"), ("Tau", "T"), ("Chi", "X"))}}


#: A span that is not math (it is shown as text): a token error, or the parser's refusal.
_Fail = TokenError
_Tok = Token


def _greek_tex(base: str) -> str:
    """The LaTeX of a Greek letter name."""
    return _GREEK_SPECIAL.get(base, "\\" + base)


#: Two-letter subscripts that are names, not index pairs, spelled as the derivations print them:
#: X_kv (the key/value sequence) and d_ff (the feed-forward width).
_NAMED_SCRIPTS = {"kv": "\\mathrm{kv}", "ff": "\\text{ff}"}


def _script_tex(content: str) -> str:
    """A sub- or superscript: a word of three or more letters is upright text, and so are the
    two-letter names of `_NAMED_SCRIPTS`; other one- and two-letter scripts are indices (a_ij)."""
    if content in _NAMED_SCRIPTS:
        return _NAMED_SCRIPTS[content]
    return f"\\text{{{content}}}" if content.isalpha() and len(content) >= 3 else content


def _name(base: str, sup: str | None, sub: str | None) -> tuple[str, str]:
    """A name token's value: (LaTeX, plain)."""
    tex = _greek_tex(base) if len(base) > 1 else base
    plain = base
    if sup is not None:
        tex += f"^{{{_script_tex(sup)}}}"
        plain += f"^{sup}"
    if sub is not None:
        tex += f"_{{{_script_tex(sub)}}}"
        plain += f"_{sub}"
    return tex, plain


def _unknown_word(word: str, pos: int) -> TokenError:
    return TokenError("multi-letter words (softmax, model) are prose, not math", pos)


@lru_cache(maxsize=1)
def _lexicon() -> Lexicon:
    """Spans: spaces, the operators with √, relations, sqrt and exp, oo and inf, letter subscripts;
    a number is kept as written (mantissa, exponent); no LaTeX names (user LaTeX is text). Made
    at the first span: most titles and notes hold none, and compiling the relations' pattern
    (non-ASCII characters) takes 0.07 ms."""
    return Lexicon(spaces=" ", operators="+-*/^()√", functions=_FUNCTIONS, infinity=_INFINITY, name=_name,
                   number=lambda m, pos: (m.group(1), m.group(2)), unknown_word=_unknown_word,
                   relations=_RELATIONS, relation_pattern=re.compile(_REL), letter_subscripts=True)


def _tokenize(text: str) -> list[Token]:
    return tokenize(text, _lexicon())


# ----------------------------------------------------------------------------- parser
# Nodes are tuples: ("num", int_part_or_mantissa, exponent), ("name", tex, plain), ("inf",),
# ("neg", x), ("add", [(sign, x), ...]), ("term", [(op, x), ...]), ("pow", base, exp),
# ("func", "sqrt" | "exp", x).


class _Parser(Parser):
    """The grammar of `attntrace.inputs.grammar` building the tree above, as the author wrote it."""

    ATOM_STARTS = (*Parser.ATOM_STARTS, "√")

    def __init__(self, text: str) -> None:
        super().__init__(_tokenize(text), MAX_DEPTH)

    def span(self) -> list:
        """[expr, rel, expr, rel, ...]"""
        parts = [self.expr()]
        while self.peek().kind == "rel":
            parts.append(self.take().value)
            parts.append(self.expr())
        if self.peek().kind != "end":
            raise _Fail
        return parts

    def sum_start(self, first):
        return [("+", first)]

    def sum_add(self, items, op, right):
        items.append((op.kind, right))
        return items

    def sum_end(self, items):
        return items[0][1] if len(items) == 1 else ("add", items)

    def product_start(self, first):
        return [("*", first)]

    def product_add(self, items, op, right):
        items.append((op.kind, right))
        return items

    def product_end(self, items):
        if len(items) == 1:
            return items[0][1]
        flat = []  # a parenthesized product multiplied in: (a*b)*c = a*b*c, a*(b/c) = a*b/c
        for op, x in items:
            flat.extend(x[1] if op == "*" and x[0] == "term" else [(op, x)])
        return ("term", flat)

    def negate(self, x, pos):
        return ("neg", x)

    def raise_to(self, base, exponent, pos):
        return ("pow", base, exponent)

    def atom(self):
        tok = self.take()
        if tok.kind == "num":
            return ("num", *tok.value)
        if tok.kind == "name":
            return ("name", *tok.value)
        if tok.kind == "inf":
            return ("inf",)
        if tok.kind in ("func", "√"):
            self.enter(tok.pos)
            if tok.kind == "func":
                self.expect("(", "'('")
                arg = self.expr()
                self.expect(")", "')'")
            else:
                arg = self.atom()
            self.leave()
            return ("func", "sqrt" if tok.kind == "√" else tok.value, arg)
        if tok.kind == "(":
            self.enter(tok.pos)
            inner = self.expr()
            self.expect(")", "')'")
            self.leave()
            return inner
        raise _Fail


# ----------------------------------------------------------------------------- printer

def _number(mantissa: str, exponent: str | None, plain: bool) -> str:
    whole, _, frac = mantissa.partition(".")
    text = str(int(whole or "0")) + ("." + frac if frac else "")
    if exponent is None:
        return text
    e = int(exponent)
    return f"{text}e{e}" if plain else f"{text} \\times 10^{{{e}}}"


def _prec(x) -> int:
    """4 atoms, 3 powers, 2 products and negations, 1 sums."""
    kind = x[0]
    if kind == "num":
        return 2 if x[2] is not None else 4
    if kind in ("name", "inf"):
        return 4
    if kind == "func":
        return 3 if x[1] == "exp" else 4
    return {"pow": 3, "neg": 2, "term": 2, "add": 1}[kind]


def _leads_with_minus(x) -> bool:
    return x[0] == "neg" or (x[0] == "term" and _leads_with_minus(x[1][0][1]))


class _Printer:
    def __init__(self, plain: bool) -> None:
        self.plain = plain

    def paren(self, s: str) -> str:
        return f"({s})" if self.plain else f"\\left({s}\\right)"

    def __call__(self, x) -> str:
        return getattr(self, "p_" + x[0])(x)

    def p_num(self, x) -> str:
        return _number(x[1], x[2], self.plain)

    def p_name(self, x) -> str:
        return x[2] if self.plain else x[1]

    def p_inf(self, x) -> str:
        return "inf" if self.plain else r"\infty"

    def p_func(self, x) -> str:
        arg = self(x[2])
        if self.plain:
            return f"{x[1]}({arg})"
        return f"\\sqrt{{{arg}}}" if x[1] == "sqrt" else f"e^{{{arg}}}"

    def p_pow(self, x) -> str:
        base, exponent = x[1], x[2]
        b = self(base)
        if _prec(base) < 4 or (base[0] == "func" and base[1] == "sqrt") or (base[0] == "name" and "^" in b):
            b = self.paren(b)
        e = self(exponent)
        if self.plain:
            return f"{b}^{self.paren(e) if _prec(exponent) < 4 else e}"
        return f"{b}^{{{e}}}"

    def p_neg(self, x) -> str:
        inner = x[1]
        s = self(inner)
        return "-" + (self.paren(s) if inner[0] == "add" or _leads_with_minus(inner) else s)

    def p_add(self, x) -> str:
        out = ""
        for k, (sign, t) in enumerate(x[1]):
            s = self(t)
            if k == 0:
                out = s
                continue
            if t[0] == "add" or _leads_with_minus(t):
                s = self.paren(s)
            out += f" {sign} {s}"
        return out

    def factor(self, t, first: bool, alone: bool) -> str:
        s = self(t)
        if (t[0] == "add" and not alone) or (not first and _leads_with_minus(t)):
            return self.paren(s)
        return s

    def product(self, factors: list, alone_ok: bool) -> str:
        out = ""
        for k, t in enumerate(factors):
            s = self.factor(t, k == 0, alone_ok and len(factors) == 1)
            if k == 0:
                out = s
            elif self.plain:
                out += "*" + s
            else:
                out += (" \\cdot " if s[:1].isdigit() or s[:1] == "." else " ") + s
        return out

    def p_term(self, x) -> str:
        items = x[1]
        if self.plain:  # as written, left to right
            out = self.factor(items[0][1], True, False)
            for op, t in items[1:]:
                s = self(t)
                if t[0] == "add" or _leads_with_minus(t) or (op == "/" and t[0] == "term"):
                    s = self.paren(s)
                out += op + s
            return out
        num = [t for op, t in items if op == "*"]
        den = [t for op, t in items if op == "/"]
        if not den:
            return self.product(num, False)
        num = [t for t in num if t != ("num", "1", None)]  # 1/x: the numerator is the 1 written
        top = self.product(num, True) if num else "1"
        return f"\\frac{{{top}}}{{{self.product(den, True)}}}"


def _print_span(source: str, printer: Callable, relation: Callable[[tuple], str]) -> str | None:
    """One span parsed (None when it does not parse or is too long) and printed: its sides by
    `printer`, each relation between them by `relation` (the parsed token: its LaTeX, its text)."""
    text = " ".join(source.translate(_UNICODE_OPS).split())
    if not text or len(source) > MAX_LENGTH:
        return None
    try:
        parts = _Parser(text).span()
    except (_Fail, RecursionError):
        return None
    out = printer(parts[0])
    for k in range(1, len(parts), 2):
        out += f" {relation(parts[k])} {printer(parts[k + 1])}"
    return out


@lru_cache(maxsize=512)
def _render(source: str, plain: bool) -> str | None:
    return _print_span(source, _Printer(plain), lambda rel: rel[1] if plain else rel[0])


def render_math(source: str, fmt: str) -> str | None:
    """One span's content printed for `fmt` (LaTeX for md/tex, plain for text), no delimiters.

    None when the span is not math in the grammar above (the caller shows it as text).
    """
    _check_format(fmt)
    if not isinstance(source, str):
        return None
    return _render(source, fmt == "text")


# ----------------------------------------------------------------------------- headings
# A heading holds no math (navigation, tables of contents and <title> show it raw), so a title's
# spans are set as text there: d_k with a text subscript in LaTeX (d\textsubscript{k}), sqrt(d_k)
# as the root sign (√d_k), products side by side (2qk), relations as their signs (≈, →).

_NAME = re.compile(r"^([A-Za-z]+)(?:\^([^_]+))?(?:_(.+))?$")
_HEADING_RELATIONS = {"~": "≈", "->": "→", "<=": "≤", ">=": "≥", "!=": "≠"}


class _HeadingPrinter(_Printer):
    """The plain printer with text sub- and superscripts: LaTeX's \\textsubscript (tex), d_k (md, text)."""

    def __init__(self, tex: bool) -> None:
        super().__init__(plain=True)
        self.tex = tex
        self.esc = escape_tex if tex else (lambda t: t)

    def script(self, base: str, sup: str | None, sub: str | None) -> str:
        if not self.tex:
            return base + (f"^{sup}" if sup else "") + (f"_{sub}" if sub else "")
        return (self.esc(base) + (f"\\textsuperscript{{{self.esc(sup)}}}" if sup else "")
                + (f"\\textsubscript{{{self.esc(sub)}}}" if sub else ""))

    def p_name(self, x) -> str:
        m = _NAME.match(x[2])
        if m is None or len(m.group(1)) > 1:  # a Greek name: its LaTeX letter (tex), its name (md, text)
            return f"\\ensuremath{{{x[1]}}}" if self.tex else x[2]
        return self.script(*m.groups())

    def p_num(self, x) -> str:
        return self.esc(_number(x[1], x[2], True))

    def p_inf(self, x) -> str:
        return self.esc("∞")

    def p_func(self, x) -> str:
        arg = self(x[2])
        if x[1] == "exp":
            return self.script("e", arg, None) if self.tex else f"e^({arg})"
        return self.esc("√") + (arg if _prec(x[2]) == 4 else f"({arg})")

    def p_pow(self, x) -> str:
        b, e = self(x[1]), self(x[2])
        if _prec(x[1]) < 4:
            b = f"({b})"
        return b + (f"\\textsuperscript{{{e}}}" if self.tex else "^" + (e if _prec(x[2]) == 4 else f"({e})"))

    def p_term(self, x) -> str:
        out = ""
        for k, (op, t) in enumerate(x[1]):
            s = self(t)
            if t[0] == "add" or (k and _leads_with_minus(t)) or (op == "/" and t[0] == "term"):
                s = f"({s})"
            if k == 0:
                out = s
            elif op == "/":
                out += "/" + s
            else:  # side by side; a middle dot between two numbers
                out += (self.esc("·") if s[:1].isdigit() and out[-1:].isdigit() else "") + s
        return out


@lru_cache(maxsize=512)
def _heading(source: str, tex: bool) -> str | None:
    def relation(rel: tuple) -> str:
        sign = _HEADING_RELATIONS.get(rel[1], rel[1])
        return escape_tex(sign) if tex else sign

    return _print_span(source, _HeadingPrinter(tex), relation)


def heading_text(text: str, fmt: str) -> str:
    """A title for a heading in `fmt`, escaped, its ``$...$`` spans set as text (no math
    delimiters): ``Scaling by $sqrt(d_k)$`` -> ``Scaling by √d\\_k`` (md),
    ``Scaling by \\ensuremath{\\surd}d\\textsubscript{k}`` (tex), ``Scaling by √d_k`` (text)."""
    _check_format(fmt)
    escape = {"md": escape_md, "tex": escape_tex, "text": escape_text}[fmt]
    tex = fmt == "tex"
    return format_user_text(text, fmt, inline_math=lambda s: s, escape=escape,
                            _math=lambda source: (lambda h: None if h is None else h if tex else escape(h))(_heading(source, tex)))


# ----------------------------------------------------------------------------- text

def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")


def inline_math_for(fmt: str, delimiters: str = "dollars") -> Callable[[str], str]:
    """The inline-math wrapper of a format: md ``$x$`` (or ``\\(x\\)`` with delimiters=
    "brackets", as the md templates' ``m`` macro), tex ``\\(x\\)``, text: unchanged."""
    _check_format(fmt)
    if delimiters not in ("dollars", "brackets"):
        raise ValueError(f"delimiters must be dollars or brackets, not {delimiters!r}")
    if fmt == "text":
        return lambda s: s
    if fmt == "md" and delimiters == "dollars":
        return lambda s: f"${s}$"
    return lambda s: f"\\({s}\\)"


def _is_cjk(c: str) -> bool:
    o = ord(c)
    return (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2FFFF or 0xF900 <= o <= 0xFAFF
            or 0x3040 <= o <= 0x30FF or 0xAC00 <= o <= 0xD7AF or 0x1100 <= o <= 0x11FF)


def _dollars(text: str) -> list[int]:
    """Positions of the unescaped dollars."""
    return [i for i, c in enumerate(text) if c == "$" and (i == 0 or text[i - 1] != "\\")]


def format_user_text(text: str, fmt: str, *, inline_math: Callable[[str], str] | None = None,
                     escape: Callable[[str], str] | None = None, _math: Callable[[str], str | None] | None = None) -> str:
    """A title or description for a report in `fmt` (md, tex or text): ``$...$`` spans as math,
    the rest escaped (see the module docstring for the rules). Never raises on any text.

    inline_math wraps a span's LaTeX in the format's inline delimiters (default:
    ``inline_math_for(fmt)``, i.e. dollars in md; pass ``inline_math_for("md", "brackets")``
    for ``\\(...\\)``); it is not used for text. escape is the format's text escaper
    (default: `attntrace.inputs.textescape`'s escape_md / escape_tex_prose / escape_text).
    """
    _check_format(fmt)
    if escape is None:
        escape = {"md": escape_md, "tex": escape_tex_prose, "text": escape_text}[fmt]
    if inline_math is None:
        inline_math = inline_math_for(fmt)
    text = clean_text(text)
    if "$" not in text:
        return escape(text)

    # pieces: (literal text, None) or (source, printed math)
    pieces: list[tuple[str, str | None]] = []
    dollars = _dollars(text)
    literal_from = 0  # start of the pending literal text
    k, tries = 0, 0
    while k + 1 < len(dollars):
        start, end = dollars[k], dollars[k + 1]
        source = text[start + 1:end]
        if not source.strip():
            k += 2  # "$$" (or "$ $") is literal text, both dollars
            continue
        printed = None
        if tries < MAX_SPANS_PER_TEXT:
            tries += 1
            printed = render_math(source, fmt) if _math is None else _math(source)
        if printed is None:
            k += 1  # this dollar is literal; the closing one may open a span
            continue
        pieces.append((text[literal_from:start], None))
        pieces.append((source, printed))
        literal_from = end + 1
        k += 2
    pieces.append((text[literal_from:], None))

    out = []
    for n, (chunk, printed) in enumerate(pieces):
        if printed is None:
            out.append(escape(chunk.replace("\\$", "$")) if chunk else "")
            continue
        math = printed if fmt == "text" and _math is None else inline_math(printed)
        before, after = pieces[n - 1][0], pieces[n + 1][0]
        if before and _is_cjk(before[-1]):
            math = " " + math
        if after and _is_cjk(after[0]):
            math += " "
        elif not after and n + 2 < len(pieces) and fmt == "md":
            math += " "  # two spans in a row: "$a$$b$" would read as display math
        out.append(math)
    return "".join(out)
