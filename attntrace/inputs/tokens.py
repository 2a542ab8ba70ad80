"""One tokenizer for the two readers of math text: matrix entries and spans in user prose.

Entries (`attntrace.inputs.expr`) and ``$...$`` spans in titles (`attntrace.inputs.usertext`)
are written in one syntax: numbers, one-letter or Greek names with a superscript and a
subscript, functions, + - * / ^ ** and parentheses. They differ in a few words, so each
reader passes a `Lexicon`: its operators, functions and words for infinity, whether
relations (``=``, ``<=``, ``≈``) and attntrace's LaTeX names (``\\tilde{q}_{11}``) are
tokens, which subscripts a name may have (entries: digits; prose: ``d_k``, ``d_model``),
and how a token's value is built (a SymPy-ready name string, or its LaTeX and plain forms).
The scanning, the name rules and their errors live here once.

Every failure is a `TokenError` with a message and the position it starts at; the entry
reader turns it into a one-line BadInput, the prose reader into "not math, show as text".
Nothing is ever evaluated.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, NamedTuple

from attntrace.model.record import record

_GREEK_LOWER = (
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    "lamda", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi",
    "chi", "psi", "omega",
)
#: The Greek letter names a name may start with (alpha ... omega, Alpha ... Omega).
GREEK = frozenset(_GREEK_LOWER + tuple(g.capitalize() for g in _GREEK_LOWER))

#: A number: mantissa (group 1), optional decimal exponent (group 2).
NUMBER = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?", re.ASCII)
WORD = re.compile(r"[A-Za-z]+", re.ASCII)
# Patterns only some names need are strings, compiled by `re` (and cached there) on first use:
# a report whose names have no superscript letter or subscript list never compiles them.
_SUP_LETTER = r"(?a)\^([A-Za-z])(?![A-Za-z0-9])"
_SUP_CONTENT = re.compile(r"[A-Za-z0-9(),]+", re.ASCII)
_SUB_DIGITS = r"(?a)_([0-9]+)"
_SUB_DIGIT_LIST = r"(?a)[0-9]+(?:,[0-9]+)*"
_SUB_WORD = r"(?a)_([0-9]+|[A-Za-z][A-Za-z0-9]*)"
_SUB_WORD_LIST = r"(?a)[A-Za-z0-9]+(?:,[A-Za-z0-9]+)*"


class TokenError(Exception):
    """Text that is not a token sequence: a message, where it starts, and a hint."""

    def __init__(self, message: str = "not math", pos: int | None = None, hint: str = "") -> None:
        where = "" if pos is None else f" at position {pos}"
        super().__init__(message + where + (f" ({hint})" if hint else ""))


class Token(NamedTuple):
    kind: str  # "num", "name", "func", "inf", "rel", an operator character, or "end"
    value: Any
    pos: int


def show(text: str, limit: int = 60) -> str:
    """Quote user text for a one-line message (control characters escaped, long text cut)."""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return '"' + shown.replace('"', '\\"') + '"'


def balanced_parentheses(content: str) -> bool:
    level = 0
    for c in content:
        level += (c == "(") - (c == ")")
        if level < 0:
            return False
    return level == 0


@record
class Lexicon:
    """What one reader accepts; see the module docstring.

    name(base, sup, sub) -> the value of a name token (sup and sub None when absent);
    number(match, pos) -> the value of a number token (it may refuse the number);
    latex_base(text, pos) -> (base, end) for a backslash, or None: a backslash is refused;
    unknown_word(word, pos) -> the error for a word that is neither a name nor a function.
    """

    spaces: str
    operators: str
    functions: tuple[str, ...]
    infinity: tuple[str, ...]
    name: Callable[[str, str | None, str | None], Any]
    number: Callable[[re.Match, int], Any]
    unknown_word: Callable[[str, int], TokenError]
    relations: Mapping[str, Any] | None = None
    relation_pattern: re.Pattern | None = None
    letter_subscripts: bool = False
    latex_base: Callable[[str, int], tuple[str, int]] | None = None


def read_scripts(text: str, pos: int, base: str, letter_subscripts: bool) -> tuple[str | None, str | None, int]:
    """The superscript and subscript after a name base at text[pos:], and where they end.

    Either order, each at most once. A superscript is one letter (not followed by a letter or
    digit) or braces holding letters, digits, balanced parentheses and commas, not digits
    alone; a ``^`` that starts neither is a power. A subscript is digits or braces holding
    digits and commas; with `letter_subscripts` also a letter then letters and digits.
    """
    sup = sub = None
    while pos < len(text) and text[pos] in "^_":
        start = pos
        if text[pos] == "^":
            if pos + 1 < len(text) and text[pos + 1] == "{":
                close = text.find("}", pos + 2)
                if close < 0:
                    raise TokenError("unclosed '{' in superscript", pos + 1)
                content = text[pos + 2 : close]
                if not _SUP_CONTENT.fullmatch(content) or not balanced_parentheses(content):
                    raise TokenError(f"bad superscript {show('{' + content + '}')}", pos,
                                     "letters, digits, balanced parentheses and commas only")
                if content.isdigit():
                    raise TokenError(f"superscript {show('{' + content + '}')} is only digits", pos,
                                     f"write a power as {base}^{content} or {base}**{content}")
                end = close + 1
            else:
                m = re.compile(_SUP_LETTER).match(text, pos)
                if not m:
                    break  # a power operator, not a superscript
                content, end = m.group(1), m.end()
            if sup is not None:
                raise TokenError("a name has at most one superscript", start, "use ** for powers")
            sup = content
        else:
            if pos + 1 < len(text) and text[pos + 1] == "{":
                close = text.find("}", pos + 2)
                if close < 0:
                    raise TokenError("unclosed '{' in subscript", pos + 1)
                content = text[pos + 2 : close]
                if not re.compile(_SUB_WORD_LIST if letter_subscripts else _SUB_DIGIT_LIST).fullmatch(content):
                    raise TokenError(f"bad subscript {show('{' + content + '}')}", pos,
                                     "letters, digits and commas only" if letter_subscripts else "digits and commas only")
                end = close + 1
            else:
                m = re.compile(_SUB_WORD if letter_subscripts else _SUB_DIGITS).match(text, pos)
                if not m:
                    raise TokenError("bad subscript", pos, "write v_1 or v_{1,2}")
                content, end = m.group(1), m.end()
            if sub is not None:
                raise TokenError("a name has at most one subscript", start)
            sub = content
        pos = end
    return sup, sub, pos


def tokenize(text: str, lex: Lexicon) -> list[Token]:
    """The tokens of `text`, ending with an "end" token at len(text); TokenError otherwise."""
    toks: list[Token] = []
    pos, n = 0, len(text)
    while pos < n:
        c = text[pos]
        m = lex.relation_pattern.match(text, pos) if lex.relation_pattern is not None else None
        if c in lex.spaces:
            pos += 1
        elif m:
            toks.append(Token("rel", lex.relations[m.group(0)], pos))
            pos = m.end()
        elif c == "*" and text.startswith("**", pos):
            toks.append(Token("^", "**", pos))
            pos += 2
        elif c in lex.operators:
            toks.append(Token(c, c, pos))
            pos += 1
        elif c.isascii() and (c.isdigit() or c == "."):
            m = NUMBER.match(text, pos)
            if not m:
                raise TokenError(f"unexpected {c!r}", pos)
            toks.append(Token("num", lex.number(m, pos), pos))
            pos = m.end()
        elif c == "\\" and lex.latex_base is not None:
            base, end = lex.latex_base(text, pos)
            sup, sub, end = read_scripts(text, end, base, lex.letter_subscripts)
            toks.append(Token("name", lex.name(base, sup, sub), pos))
            pos = end
        elif c.isascii() and c.isalpha():
            word = WORD.match(text, pos).group(0)
            end = pos + len(word)
            if word in lex.functions:
                toks.append(Token("func", word, pos))
            elif word in lex.infinity:
                toks.append(Token("inf", word, pos))
            elif len(word) == 1 or word in GREEK:
                sup, sub, end = read_scripts(text, end, word, lex.letter_subscripts)
                toks.append(Token("name", lex.name(word, sup, sub), pos))
            else:
                raise lex.unknown_word(word, pos)
            pos = end
        else:
            raise TokenError(f"unexpected {c!r}", pos)
    toks.append(Token("end", "", n))
    return toks
