"""Formula trees (`attntrace.model.formula`) printed in JME, the expression language of Numbas.

A Numbas question defines each step's variable by its formula in JME (``S1 = Q1 *
transpose(K1)``), so the exam marks a later part against the formula evaluated on the
student's own earlier answers. The formula is the tree the step's kind built once, the tree
the TeX, plain and MathML printers of `attntrace.rendering.formulatext` print; this printer
is one more back end of the same dispatch (`_print_<Node>`), so no step id appears here.

JME has no notation of the reports: a matrix product is ``*`` (JME multiplies matrices with
it), a transpose is ``transpose(M)``, a concatenation of heads is ``combine_horizontally``,
and the softmax is spelt out row by row. Symbols are the question's variables: the caller
names every leaf (``names``: a matrix's variable, a scalar's number), and a leaf it did not
name, or a node JME has no form for here (a sum, a bias added row by row, an entry formula),
raises `Unsupported`: a kind whose formula this printer cannot print has no Numbas part.
"""

from __future__ import annotations

import re

import numpy as np

from attntrace.model import formula as F
from attntrace.model.errors import Unsupported
from attntrace.rendering.formulatext import Printer

#: Names a question variable may not take: Numbas's built-in constants (exam's builtin_constants).
RESERVED = frozenset({"e", "i", "pi"})
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def jme_number(x: float) -> str:
    """An entry of a given matrix (small integers in exercises) in plain decimals."""
    text = f"{float(x):.12f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "0", "") else text


def jme_decimal(x: float) -> str:
    """A small positive number in plain decimals: JME has no scientific notation (it reads
    5e-05 as 5 times the constant e, minus 05)."""
    return f"{float(x):.12f}".rstrip("0")


def jme_matrix(m) -> str:
    """A JME matrix literal: matrix([1, 2], [3, 4])."""
    rows = ", ".join("[" + ", ".join(jme_number(v) for v in row) + "]" for row in np.asarray(m, dtype=float))
    return f"matrix({rows})"


def softmax_jme(t: str) -> str:
    """The row softmax of matrix `t` (a variable or a parenthesised expression), stable (each
    row shifted by its maximum)."""
    return (f"matrix(map(let(r, list({t}[i]), m, max(r), e, map(exp(x - m), x, r), map(y / sum(e), y, e)), "
            f"i, 0..numrows({t}) - 1))")


def _concat_jme(items: list[str]) -> str:
    """Matrices side by side, the first one's columns first."""
    out = items[0]
    for item in items[1:]:
        out = f"combine_horizontally({out}, {item})"
    return out


#: JME of the functions a formula may apply, by the tree's function name: the printed arguments -> JME.
FUNCTIONS = {
    "softmax": lambda args: softmax_jme(args[0]),
    "Concat": _concat_jme,
}


def variable_name(leaf: F.Node) -> str:
    """The question variable of a matrix symbol: its letters, subscript, superscript and head
    run together (W_Q of head 2 is WQ2, Q^(1) is Q1, W_O is WO); `Unsupported` for anything
    that is not a symbol (an entry a_ij) or gives no JME identifier."""
    text = _letters(leaf)
    if not _IDENTIFIER.fullmatch(text) or text in RESERVED:
        raise Unsupported(f"no JME variable for the symbol {text!r}")
    return text


def _letters(x) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, F.Head):
        return _letters(x.of) + (str(x.head) if isinstance(x.head, int) else _letters(x.head))
    if isinstance(x, F.Sym):
        accent = x.accent or ""
        return "".join(_letters(p) for p in (x.name, x.sub, x.sup) if p is not None) + accent
    if isinstance(x, F.Word):
        return x.word
    if isinstance(x, F.Num) and isinstance(x.value, int):
        return str(x.value)
    raise Unsupported(f"no JME variable for a {type(x).__name__}")


def items(x: F.Node) -> tuple:
    """The items of a function's argument list, an elision written out: a list of heads
    Z^(1), Z^(2), ..., Z^(4) stands for every head from the one before the dots to the one
    after them (one symbol, whole heads); any other elision has no JME form."""
    if not isinstance(x, F.Seq):
        return (x,)
    out: list = []
    for k, item in enumerate(x.items):
        if not isinstance(item, F.Dots):
            out.append(item)
            continue
        before, after = out[-1] if out else None, x.items[k + 1] if k + 1 < len(x.items) else None
        if not (isinstance(before, F.Head) and isinstance(after, F.Head) and before.of == after.of
                and isinstance(before.head, int) and isinstance(after.head, int)):
            raise Unsupported("JME has no form for an elision here")
        out += [F.Head(before.of, h) for h in range(before.head + 1, after.head)]
    return tuple(out)


def is_leaf(x: F.Node) -> bool:
    """A symbol the caller names: a letter, possibly with a head (Q, W_Q^(2), d_k)."""
    return isinstance(x, F.Sym) or (isinstance(x, F.Head) and isinstance(x.of, F.Sym))


def leaves(tree: F.Node) -> list[F.Node]:
    """The symbols of a formula, left to right (each once)."""
    out: list[F.Node] = []

    def walk(x) -> None:
        if is_leaf(x):
            if x not in out:
                out.append(x)
        elif isinstance(x, F.Seq):
            walk(items(x))
        elif isinstance(x, tuple):
            for y in x:
                walk(y)
        elif isinstance(x, F.Node):
            for value in x.field_values():
                walk(value)

    walk(tree)
    return out


class JmePrinter(Printer):
    """JME of a formula's right side; `names` maps each leaf (symbol node) to its JME text."""

    default_settings = {"names": {}}

    def p(self, x) -> str:
        names = self.settings["names"]
        if isinstance(x, F.Node) and x in names:
            return names[x]
        if is_leaf(x):
            raise Unsupported(f"JME has no variable for the symbol {_letters(x)!r} here")
        method = getattr(self, f"_print_{type(x).__name__}", None)
        if method is None:
            raise Unsupported(f"JME has no form for a {type(x).__name__} here")
        return method(x)

    def _operand(self, x) -> str:
        text = self.p(x)
        return text if is_leaf(x) or isinstance(x, (F.Num, F.Value, F.Func, F.Sqrt, F.Transpose, F.Paren)) else f"({text})"

    def _print_Num(self, n: F.Num) -> str:
        return jme_number(n.value)

    def _print_Value(self, v: F.Value) -> str:
        return jme_number(float(v.value))

    def _print_Transpose(self, t: F.Transpose) -> str:
        return f"transpose({self.p(t.of)})"

    def _print_Juxt(self, j: F.Juxt) -> str:
        return " * ".join(self._operand(f) for f in j.factors if not isinstance(f, F.Space))

    def _print_Frac(self, f: F.Frac) -> str:
        return f"{self._operand(f.num)} / {self._operand(f.den)}"

    def _print_Sqrt(self, s: F.Sqrt) -> str:
        return f"sqrt({self.p(s.of)})"

    def _print_Paren(self, p: F.Paren) -> str:
        return f"({self.p(p.of)})"

    def _print_Func(self, f: F.Func) -> str:
        """A function by its name in FUNCTIONS; a list argument (Concat(Z1, ..., Z4)) spread out."""
        jme = FUNCTIONS.get(f.name)
        if jme is None or f.params:
            raise Unsupported(f"JME has no form for the function {f.name} here")
        return jme([self._operand(x) for a in f.args for x in items(a)])


def jme(tree: F.Node, names: dict) -> str:
    """The JME of `tree` with its leaves named by `names` (leaf node -> JME text)."""
    return JmePrinter(names=names)(tree)
