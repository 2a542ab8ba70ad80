"""User text and user SymPy made safe (issue 16), apart from how reports typeset it.

Cleaning: control characters, bidi formatting and lone surrogates never reach an output
(`clean_text` at input, `clean_output` for a whole report, `one_line` for terminal messages,
`json_safe` for JSON). SymPy input: an expression built in Python holds only what a spec
entry could have written (`check_sympy_entry`).
"""

from __future__ import annotations

import re
from functools import lru_cache

from attntrace.inputs.expr import MAX_LENGTH


# ----------------------------------------------------------------------------- cleaning
# Characters user text never needs and an attacker can use (issue 16): C0 controls other than
# tab, newline and carriage return (which the escapers collapse to spaces), DEL and the C1
# controls (ESC starts terminal escape sequences, xelatex stops at them, 0x9b is an 8-bit CSI),
# and the bidi embeddings, overrides, isolates and marks (Trojan Source: U+202E shows text in
# an order other than the one it is read in). Lone surrogates cannot be encoded at all.
_UNSAFE_CHARS = "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[{_UNSAFE_CHARS}]")
_SURROGATE = re.compile("[\ud800-\udfff]")
#: everything that must not reach an output: the above plus tab, newline and carriage return
_UNSAFE_LINE = re.compile(f"[{_UNSAFE_CHARS}\t\n\r\ud800-\udfff]")
#: what must not reach any output (a whole report): the unsafe characters and lone surrogates
_UNSAFE_OUTPUT = re.compile(f"[{_UNSAFE_CHARS}\ud800-\udfff]")


def clean_text(text) -> str:
    """User text (a title, description, token, name) made safe for every output: control and
    bidi formatting characters removed, a lone surrogate replaced by U+FFFD. Whitespace
    (tab, newline) is kept for the escapers, which collapse it. Idempotent; never raises."""
    text = "" if text is None else str(text)
    if text.isprintable() and text.isascii():
        return text  # the common case, fast
    return _SURROGATE.sub("\ufffd", _CONTROL.sub("", text))


def has_unsafe_chars(text: str) -> bool:
    """True when `text` holds a character `clean_text` removes or replaces."""
    return bool(_UNSAFE_OUTPUT.search(text))


def clean_output(text: str) -> str:
    """A whole report before it is written: unsafe characters removed (lines kept). A last
    line of defence: the escapers have already cleaned user text."""
    if not _UNSAFE_OUTPUT.search(text):
        return text
    return _SURROGATE.sub("\ufffd", _CONTROL.sub("", text))


def _visible(c: str) -> str:
    if c == "\n":
        return "\\n"
    if c == "\t":
        return "\\t"
    if c == "\r":
        return "\\r"
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def one_line(text) -> str:
    """A message for a terminal: on one line, with every control, bidi or surrogate character
    shown as an escape (a file name holding a newline reads ``a\\nb.toml``)."""
    text = "" if text is None else str(text)
    return _UNSAFE_LINE.sub(lambda m: _visible(m.group(0)), text)


def json_safe(text: str) -> str:
    """JSON text (from json.dumps, ensure_ascii=False) with the unsafe characters that json
    leaves raw (DEL, C1 controls, bidi formatting, lone surrogates) written as \\u escapes.
    They can only occur inside strings, so the result is the same JSON value."""
    return _UNSAFE_OUTPUT.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


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
