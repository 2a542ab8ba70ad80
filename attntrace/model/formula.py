"""A formula as data: a small expression tree, written once and printed in several notations.

A kind builds its general formula (S = Q K^T, the softmax of a row, ...) from these nodes, and
views build their lines from them; `attntrace.rendering.formulatext` prints a tree as LaTeX
(reports, JSON), as plain math (text reports) and as MathML. The tree holds no notation of any
printer: symbols by name (Greek letters by their English names), operators, indices, heads,
transposes, fractions and functions. Nodes are frozen dataclasses, so a formula is a value.

Why a dedicated tree and not SymPy expressions: SymPy's printers reorder and simplify (S = Q K^T
would print as a MatMul with its own spacing and transpose sign, `e^{t}/sum` as a Mul with a
negative power), and they know neither the head superscript `Q^{(2)}` merged with the transpose
`K^{(2)\\top}`, nor a block slice `T_{:, 1:2}`, nor `cases`; the reports' notation (the 2017
paper's) would be distorted or need a printer subclass per node anyway. The tree is ~20 node
types; each printer is one `_print_<Node>` method per type, SymPy's dispatch (printer.py).

`Step.formula` and `Step.plain` are the printed tree (`PRINTERS`, filled by
attntrace/__init__.py with the rendering printers, as `trace.PRESENTERS`: this layer imports
nothing above it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Union

#: Printers by notation ("tex", "plain", "mathml"): tree -> str, filled by attntrace/__init__.py.
PRINTERS: dict[str, Callable[["Node"], str]] = {}


class Node:
    """Base of every formula node. Operators build trees: a + b, a - b, a * b (juxtaposition), a / b."""

    __slots__ = ()

    def __add__(self, other): return Add(_terms(self) + (node(other),))  # noqa: E704
    def __sub__(self, other): return Add(_terms(self) + (Neg(node(other)),))  # noqa: E704
    def __mul__(self, other): return Juxt(_factors(self) + (node(other),))  # noqa: E704
    def __rmul__(self, other): return Juxt((node(other),) + _factors(self))  # noqa: E704
    def __truediv__(self, other): return Frac(self, node(other))  # noqa: E704
    def __radd__(self, other): return Add((node(other),) + _terms(self))  # noqa: E704
    def __rsub__(self, other): return Add((node(other), Neg(self)))  # noqa: E704
    def __neg__(self): return Neg(self)  # noqa: E704

    def eq(self, *sides) -> "Rel":
        return Rel((self,) + tuple(node(s) for s in sides))

    def T(self) -> "Transpose":  # noqa: N802
        return Transpose(self)

    def head(self, h: int | None) -> "Node":
        return self if h is None else Head(self, h)

    def at(self, *index) -> "Index":
        """An entry: a_{ij}, p_{i,2k}; the index is symbols (or numbers) shown side by side, or
        separated by commas when any of them is more than one character."""
        return Index(self, tuple(node(i) for i in index))

    def text(self, notation: str = "tex") -> str:
        return PRINTERS[notation](self)


Expr = Union[Node, str, int]


def _terms(x: Node) -> tuple:
    return x.terms if isinstance(x, Add) else (x,)


def _factors(x: Node) -> tuple:
    return x.factors if isinstance(x, Juxt) else (x,)


def node(x: Expr) -> Node:
    """Numbers become Num, a one-word string a Sym."""
    if isinstance(x, Node):
        return x
    if isinstance(x, bool):
        raise TypeError("a formula has no booleans")
    if isinstance(x, (int, float)):
        return Num(x)
    return _named(x)


@lru_cache(maxsize=4096)
def _named(name: str) -> "Sym":
    """The Sym of a one-word name, made once: nodes are frozen values, so one instance serves
    every formula (a numeric trace names its matrices in every step it records)."""
    return Sym(name)


@dataclass(frozen=True, eq=True)
class Sym(Node):
    """A letter or a name: T, d_k (sub "k"), R^f (sup "f"), gamma_1, K_cache (sub a Word).

    name: Latin letters, or a Greek letter's name (ell, theta, gamma, mu, nu, sigma, varepsilon, pi).
    accent: "tilde" or "hat"; style: "roman" (an upright name such as the differential d)
    or "bold" (the ones vector)."""

    name: str
    sub: Node | str | None = None
    sup: Node | str | None = None
    accent: str | None = None
    style: str | None = None


@dataclass(frozen=True)
class Word(Node):
    """An upright word inside a formula, as a subscript (K_cache, W_gate): `roman` for the
    \\mathrm spelling, else text."""

    word: str
    roman: bool = False


@dataclass(frozen=True)
class Num(Node):
    value: int | float | str


@dataclass(frozen=True)
class Value(Node):
    """A number given by the user, printed as given: 50, 2.5, or an exact SymPy number (1/2)."""

    value: object


@dataclass(frozen=True)
class Head(Node):
    """The head superscript: Q^{(2)}, plain Q(2)."""

    of: Node
    head: int | Node


@dataclass(frozen=True)
class Transpose(Node):
    """of^T; a head superscript and the transpose share one superscript: K^{(2)T}."""

    of: Node


@dataclass(frozen=True)
class Index(Node):
    """An entry index or a block number: a_{ij}, m_{2}; `comma` separates the index by commas
    even when every part is one character (x_{r,i} beside x_{r,i+2})."""

    of: Node
    index: tuple[Node, ...]
    comma: bool = False


@dataclass(frozen=True)
class Slice(Node):
    """A block of a matrix: rows and columns as (first, last) 1-based, or None for all."""

    of: Node
    rows: tuple[int, int] | None
    cols: tuple[int, int] | None


@dataclass(frozen=True)
class Add(Node):
    """A sum; a Neg term prints as a subtraction; `tight` without spaces (an index in an
    exponent: 2(i-1)/d_k)."""

    terms: tuple[Node, ...]
    tight: bool = False


@dataclass(frozen=True)
class Neg(Node):
    of: Node


@dataclass(frozen=True)
class Juxt(Node):
    """A product written side by side (matrix products, coefficients): Q K^T, 2 O; `thin`
    sets the factors a thin space apart instead ((4 x 3)(3 x 2), shapes of a product); `tight`
    writes them together (2i in an index: p_{r,2i})."""

    factors: tuple[Node, ...]
    thin: bool = False
    tight: bool = False


@dataclass(frozen=True)
class Shape(Node):
    """A matrix shape, (rows x cols)."""

    rows: Node | int
    cols: Node | int


@dataclass(frozen=True)
class Space(Node):
    """A thin space between factors (-m \\, (i - j)): nothing in plain math."""


@dataclass(frozen=True)
class Op(Node):
    """A binary operator between two operands: "hadamard" (entrywise product), "circ"
    (a column times each row), "in" (membership), "times" (h copies of a shape), "cdot"
    (a product of two numbers)."""

    op: str
    left: Node
    right: Node


@dataclass(frozen=True)
class Frac(Node):
    """num / den; `small` is a textstyle fraction (1/2 beside a symbol); `inline` keeps
    the slash in every notation (2k/d in an exponent)."""

    num: Node
    den: Node
    small: bool = False
    inline: bool = False
    spaced: bool = False  # an inline slash with spaces around it (c tanh(T / c))


@dataclass(frozen=True)
class Partial(Node):
    """The derivative of f by x: df/dx."""

    f: Node
    x: Node


@dataclass(frozen=True)
class Power(Node):
    """base^exp (e^{t}, sigma^2, 10000^{2k/d})."""

    base: Node
    exp: Node


@dataclass(frozen=True)
class Sqrt(Node):
    of: Node


@dataclass(frozen=True)
class Paren(Node):
    """Parentheses the reader needs: (i - j); `sized` grows them with their content."""

    of: Node
    sized: bool = False


@dataclass(frozen=True)
class Func(Node):
    """A named function: softmax, RoPE, max, exp, log, sin, erf, diag, rowmax, ...

    `sized`: parentheses that grow with their argument; `bare`: no parentheses where the
    argument is a fraction or a single symbol (log l, sin (i-1)/b) in typeset math, where plain
    math still needs them unless the argument is a single symbol; `sep`: ";" puts the parameters
    after a semicolon (LayerNorm(R; gamma, beta))."""

    name: str
    args: tuple[Node, ...]
    sized: bool = False
    bare: bool = False
    params: tuple[Node, ...] = ()


@dataclass(frozen=True)
class Sum(Node):
    """sum over `index` of body (sum_k e^{t_ik}); `op` "max" is the maximum over the index
    (max_j t_1j); `small` keeps a text-size sign inside a fraction."""

    index: Node
    body: Node
    op: str = "sum"
    small: bool = False


@dataclass(frozen=True)
class Dots(Node):
    """An elision in a list (Z^(1), ..., Z^(h)); `centered` between operators or blocks."""

    centered: bool = False


@dataclass(frozen=True)
class Infinity(Node):
    pass


@dataclass(frozen=True)
class Range(Node):
    """first..last of an index (dZ_{:, 3..4}); a single number when first == last."""

    first: int
    last: int


@dataclass(frozen=True)
class Seq(Node):
    """Items separated by commas (function arguments, a set {Q, K, V})."""

    items: tuple[Node, ...]
    braces: bool = False
    #: "comma"; "wide" (a wider gap where items hold commas themselves: (1, 2),  (3, 4));
    #: "semi" (the same in typeset math, a semicolon in plain: shapes of blocks)
    sep: str = "comma"


@dataclass(frozen=True)
class Stack(Node):
    """Matrices stacked vertically: [A; B]; `inline` on one line (shapes of the blocks)."""

    rows: tuple[Node, ...]
    inline: bool = False


@dataclass(frozen=True)
class Hcat(Node):
    """Matrices side by side: [A, B]; `inline` on one line with a wide gap instead of commas
    (shapes of the blocks: [(3 x 2)  (3 x 1)])."""

    items: tuple[Node, ...]
    inline: bool = False


@dataclass(frozen=True)
class Cases(Node):
    """A definition by cases: ((value, condition), ...)."""

    cases: tuple[tuple[Node, Node], ...]


@dataclass(frozen=True)
class Rel(Node):
    """A chain of sides: a = b = c; `ops` names each relation ("eq", "approx", "to", "le", "lt", "gt"),
    all "eq" when not given."""

    sides: tuple[Node, ...]
    ops: tuple[str, ...] = ()


@dataclass(frozen=True)
class Parts(Node):
    """Several formulas on one line (A = softmax(T), a_ij = ...): a wide gap between them, or a
    narrow one (`narrow`) between two cases of one definition."""

    items: tuple[Node, ...]
    narrow: bool = False


def to(*sides: Expr) -> Rel:
    """a -> b: what a step reads and what it makes."""
    return Rel(tuple(node(s) for s in sides), ("to",) * (len(sides) - 1))


def sym(name: str, sub: Expr | None = None, sup: Expr | None = None, *, accent: str | None = None,
        style: str | None = None) -> Sym:
    """A symbol; sub and sup may be strings (a letter, "kv") or nodes."""
    if (sub is None or type(sub) is str) and (sup is None or type(sup) is str):
        return _plain_sym(name, sub, sup, accent, style)  # the common case, made once
    return Sym(name, sub, sup, accent, style)


@lru_cache(maxsize=4096)
def _plain_sym(name: str, sub: str | None, sup: str | None, accent: str | None, style: str | None) -> Sym:
    return Sym(name, sub, sup, accent, style)


@dataclass(frozen=True)
class Diff(Node):
    """The differential of a matrix, dO (an upright d before it)."""

    of: Node


ONES = Sym("1", style="bold")


def substitute(tree: Node, mapping: dict) -> Node:
    """The tree with every subtree equal to a key of `mapping` replaced by its value (a node,
    or a string already printed for one output): the general entry formula g_ij = max(0, h_ij)
    becomes the line of entry (2, 3), g_23 = max(0, -1.2)."""
    if tree in mapping:
        return mapping[tree]
    if not isinstance(tree, Node) or not dataclasses.is_dataclass(tree):
        return tree
    changes = {}
    for f in dataclasses.fields(tree):
        value = getattr(tree, f.name)
        if isinstance(value, Node):
            new = substitute(value, mapping)
        elif isinstance(value, tuple) and any(isinstance(x, (Node, tuple)) for x in value):
            new = tuple(substitute(x, mapping) if isinstance(x, Node) else
                        tuple(substitute(y, mapping) for y in x) if isinstance(x, tuple) else x for x in value)
        else:
            continue
        if new != value:
            changes[f.name] = new
    return dataclasses.replace(tree, **changes) if changes else tree


def lhs(formula: Node) -> Node:
    """The left side of a formula (its first relation's first side)."""
    first = formula.items[0] if isinstance(formula, Parts) else formula
    return first.sides[0] if isinstance(first, Rel) else first


def after_lhs(formula: Node) -> Node:
    """What follows a formula's left side and its first relation (its further parts kept):
    Q K^T of S = Q K^T; softmax(T), a_ij = ... of A = softmax(T), a_ij = ...; the formula
    itself when it has no relation."""
    if isinstance(formula, Parts):
        return Parts((after_lhs(formula.items[0]),) + formula.items[1:], formula.narrow)
    if isinstance(formula, Rel) and len(formula.sides) > 1:
        return formula.sides[1] if len(formula.sides) == 2 else Rel(formula.sides[1:], formula.ops[1:])
    return formula


def first_part(formula: Node) -> Node:
    """The matrix form of a formula with entry-wise parts (A = softmax(T) of A = softmax(T), a_ij = ...)."""
    return formula.items[0] if isinstance(formula, Parts) else formula
