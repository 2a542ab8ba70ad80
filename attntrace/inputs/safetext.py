"""User text and user SymPy made safe (issues 16 and 20), apart from how reports typeset it.

Cleaning: no control or invisible formatting character of user text reaches an output
(`clean_text` at input, for every field; `clean_output` for a whole report; `one_line` for
terminal messages; `json_safe` for JSON). SymPy input: an expression built in Python holds only
what a spec entry could have written (`check_sympy_entry`).

What is removed is decided by the Unicode general category (`unicodedata`, in the Unicode
version of the running Python), not by a list of characters someone thought of:

- Cc, the C0 and C1 controls and DEL: ESC starts terminal escape sequences, CR rewrites the
  terminal line (``Student: \\r``), xelatex stops at them, 0x9b is an 8-bit CSI;
- Cf, the format characters: bidi embeddings, overrides, isolates and marks (Trojan Source:
  U+202E shows text in an order other than the one it is read in), and the invisible ones
  that hide text or split words: U+200B zero-width space, U+2060 word joiner, U+FEFF byte
  order mark, U+00AD soft hyphen, U+180E Mongolian vowel separator, the tag characters;
- Zl and Zp, U+2028 and U+2029: line breaks to JavaScript and some terminals;
- Co, private use: it means nothing without a private agreement, and fonts draw anything;
- Cs, lone surrogates: they cannot be encoded; each is replaced by U+FFFD, which shows
  where one was;
- the noncharacters (category Cn: U+FDD0..U+FDEF and the last two code points of every
  plane, U+FFFE and U+FFFF first): XML 1.0 forbids U+FFFE and U+FFFF, so one in a title made
  the Moodle and QTI exports unparseable;
- the whole Tags block U+E0000..U+E007F, its unassigned code points too.

Exceptions, and why:

- U+200C ZERO WIDTH NON-JOINER and U+200D ZERO WIDTH JOINER (Cf) are kept: Persian and the
  Indic scripts need them to spell words, emoji sequences to draw one picture.
- Whitespace controls (tab, LF, VT, FF, CR, the separators FS..US, NEL U+0085, U+2028,
  U+2029) become one space: every field is one line (title, description, tokens, student
  name, a template's prose sentence), and ``a\\nb`` reads as two words, not as ``ab``. A whole
  report (`clean_output`) keeps newline and tab, and its other line breaks become newlines.
- Other unassigned code points (Cn) are kept: a newer Unicode may give them a meaning (new
  emoji), and they are not controls.
"""

from __future__ import annotations

import re
from functools import lru_cache

from attntrace.inputs.expr import MAX_LENGTH


# ----------------------------------------------------------------------------- cleaning
_REMOVED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co"})
#: format characters that scripts need (see the module docstring)
_KEPT = frozenset("\u200c\u200d")
#: whitespace controls that break a line: a space in a field, a newline in a report
_LINE_BREAKS = frozenset("\n\r\x0b\x0c\x85\u2028\u2029")
#: whitespace controls that do not (str.split splits at FS..US too): a space in both
_SPACES = frozenset("\t\x1c\x1d\x1e\x1f")
_TAGS = range(0xE0000, 0xE0080)
#: runs of characters that may need a look (everything but printable ASCII); compiled (and cached) by
#: `re` when text is not all printable, which most text is
_SUSPECT = r"[^\x20-\x7e]+"
_SUSPECT_IN_LINES = r"[^\x20-\x7e\n]+"

KEEP, DROP, SPACE, BREAK, SURROGATE = "keep", "drop", "space", "break", "surrogate"


def is_noncharacter(c: str) -> bool:
    """U+FDD0..U+FDEF and U+xFFFE, U+xFFFF of every plane: never to be exchanged as text."""
    o = ord(c)
    return 0xFDD0 <= o <= 0xFDEF or (o & 0xFFFE) == 0xFFFE


@lru_cache(maxsize=4096)
def char_kind(c: str) -> str:
    """What cleaning does with the character `c`: KEEP, DROP, SPACE (a space), BREAK (a
    space in a field, a newline in a report) or SURROGATE (U+FFFD)."""
    if c in _LINE_BREAKS:
        return BREAK
    if c in _SPACES:
        return SPACE
    if c in _KEPT:
        return KEEP
    import unicodedata  # a C extension of 3M instructions to load: only text with a suspect character needs it

    category = unicodedata.category(c)
    if category == "Cs":
        return SURROGATE
    if category in _REMOVED_CATEGORIES or ord(c) in _TAGS or is_noncharacter(c):
        return DROP
    return KEEP


def _clean_run(run: str, lines: bool) -> str:
    if run.isprintable():  # CJK, Greek, math signs, emoji: the common case, in C
        return run
    out = []
    for c in run:
        kind = char_kind(c)
        if kind == KEEP:
            out.append(c)
        elif kind == SPACE:
            out.append("\t" if lines and c == "\t" else " ")
        elif kind == BREAK:
            out.append("\n" if lines else " ")
        elif kind == SURROGATE:
            out.append("\ufffd")
    return "".join(out)


def clean_text(text) -> str:
    """User text (a title, description, token, name) made safe for every output: control,
    format, private-use and noncharacters removed, whitespace controls made spaces, a lone
    surrogate replaced by U+FFFD (see the module docstring). Idempotent; never raises."""
    text = "" if text is None else str(text)
    if text.isprintable():
        return text  # the common case, fast (every character that is cleaned is unprintable)
    return re.sub(_SUSPECT, lambda m: _clean_run(m.group(0), False), text)


def _is_clean(text: str, tabs: bool) -> bool:
    """True when a long text (a whole report, JSON) has nothing to clean: only printable
    characters, newlines and (with `tabs`) tabs. At C speed: str.isprintable and regular
    expressions look at every character in Python's Unicode tables (about 50 ns each), which
    a 40 MB JSON export would feel; ASCII text is checked as bytes."""
    if text.isascii():
        return not text.encode("ascii").translate(None, _ASCII_OK_WITH_TABS if tabs else _ASCII_OK)
    return all(line.isprintable() for line in (text.split("\n") if not tabs else text.replace("\t", " ").split("\n")))


_ASCII_OK = bytes(range(0x20, 0x7F)) + b"\n"
_ASCII_OK_WITH_TABS = _ASCII_OK + b"\t"


def clean_output(text: str) -> str:
    """A whole report before it is written: the same characters removed, but newlines and
    tabs kept (CR LF, CR and the other line breaks become newlines). A last line of defence:
    the fields were cleaned at input and the escapers have cleaned the text again."""
    if _is_clean(text, tabs=True):
        return text
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    return re.sub(_SUSPECT_IN_LINES, lambda m: _clean_run(m.group(0), True), text)


def has_unsafe_chars(text: str) -> bool:
    """True when `text` holds a character `clean_output` removes or replaces."""
    return clean_output(text) != text


def _visible(c: str) -> str:
    if c == "\n":
        return "\\n"
    if c == "\t":
        return "\\t"
    if c == "\r":
        return "\\r"
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def _show_run(run: str) -> str:
    if run.isprintable():
        return run
    return "".join(c if char_kind(c) == KEEP else _visible(c) for c in run)


def one_line(text) -> str:
    """A message for a terminal: on one line, with every character `clean_text` would change
    shown as an escape (a file name holding a newline reads ``a\\nb.toml``)."""
    text = "" if text is None else str(text)
    if text.isprintable():
        return text
    return re.sub(_SUSPECT, lambda m: _show_run(m.group(0)), text)


def _json_escape(c: str) -> str:
    o = ord(c)
    if o < 0x10000:
        return f"\\u{o:04x}"
    o -= 0x10000  # a UTF-16 surrogate pair, as JSON writes characters outside the BMP
    return f"\\u{0xD800 + (o >> 10):04x}\\u{0xDC00 + (o & 0x3FF):04x}"


def _json_run(run: str) -> str:
    if run.isprintable():
        return run
    return "".join(c if char_kind(c) == KEEP else _json_escape(c) for c in run)


def json_safe(text: str) -> str:
    """JSON text (from json.dumps, ensure_ascii=False) with every character `clean_text` would
    change that json leaves raw (DEL, C1 controls, format characters, U+2028/9, private use,
    noncharacters, lone surrogates) written as a \\u escape. They can only occur inside
    strings (json escapes the C0 controls there itself), so the result is the same JSON value."""
    if _is_clean(text, tabs=False):
        return text
    return re.sub(_SUSPECT_IN_LINES, lambda m: _json_run(m.group(0)), text)


# ----------------------------------------------------------------------------- SymPy input

@lru_cache(maxsize=4096)
def _symbol_name_ok(name: str) -> bool:
    """A symbol name a spec could write: `attntrace.inputs.expr` reads it back as this very symbol."""
    import sympy

    from attntrace.inputs.expr import parse_expr
    from attntrace.model.errors import AttntraceError

    if not isinstance(name, str) or not name or len(name) > MAX_LENGTH:
        return False
    try:
        return parse_expr(name) == sympy.Symbol(name)
    except (AttntraceError, ValueError, TypeError, RecursionError):
        return False


def _quote(text: str, limit: int = 60) -> str:
    text = str(text)
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def check_sympy_entry(value, where: str = "an entry") -> None:
    """Refuse a SymPy expression from the Python API that a spec could not have written.

    A spec's entries and symbol names go through the whitelist parser of `attntrace.inputs.expr`;
    an expression built in Python (``attntrace.run({"scores": [[Symbol("x"), 1]]})``) does
    not, and its names reach the LaTeX as they are: ``Symbol("x\\input{/etc/hostname}")``
    would make the document read that file. So an expression from Python may hold only what
    an entry string can produce: numbers (SymPy's own number classes; infinities and the like
    are refused later with their own message), the constants pi and E, symbols (plain
    `sympy.Symbol`) whose names the parser reads back (``x``, ``w^{Q}_{12}``, ``alpha``),
    sums, products, powers, and SymPy's own functions (exp, sqrt, log, ...). Undefined
    functions (``Function("f")``), MatrixSymbol entries, Dummy/Wild symbols, subclasses of
    these classes (which may print anything) and other objects are refused.

    Raises BadInput (one line) naming `where` and the offending part.
    """
    import sympy
    from sympy.core.function import AppliedUndef

    from attntrace.model.errors import BadInput

    if not isinstance(value, sympy.Basic):
        return
    allowed_ops = (sympy.Add, sympy.Mul, sympy.Pow)
    for node in sympy.preorder_traversal(value):
        kind = type(node)
        if kind is sympy.Symbol:
            if not _symbol_name_ok(node.name):
                raise BadInput(f"{where} holds the symbol {_quote(node.name)}, which is not a symbol name attntrace "
                               f"reads (write names as in a spec: x, w^{{Q}}_{{12}}, alpha)")
        elif kind in allowed_ops:
            continue
        elif kind.__module__ == "sympy.core.numbers" and isinstance(node, (sympy.Number, sympy.NumberSymbol)) \
                or kind.__module__ == "sympy.core.numbers" and node.is_Atom:
            continue
        elif isinstance(node, sympy.Function) and not isinstance(node, AppliedUndef) \
                and (kind.__module__ or "").startswith("sympy.functions."):
            continue
        else:
            if isinstance(node, AppliedUndef):
                shown = f"the undefined function {_quote(kind.__name__)}"
            elif isinstance(node, sympy.Symbol):
                shown = f"the symbol {_quote(node.name)} of class {_quote(kind.__name__)}"
            else:
                shown = f"an object of type {_quote(kind.__name__)}"
            raise BadInput(f"{where} holds {shown}; an expression from Python may hold numbers, "
                           f"symbols named as in a spec, +, *, ** and SymPy's functions (exp, sqrt, ...)")
