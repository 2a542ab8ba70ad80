"""A formula as data: a small expression tree, written once and printed in several notations.

A kind builds its general formula (S = Q K^T, the softmax of a row, ...) from these nodes, and
views build their lines from them; `attntrace.rendering.formulatext` prints a tree as LaTeX
(reports, JSON), as plain math (text reports) and as MathML. The tree holds no notation of any
printer: symbols by name (Greek letters by their English names), operators, indices, heads,
transposes, fractions and functions. Nodes are frozen records compared by their fields, so a
formula is a value.

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

from dataclasses import FrozenInstanceError
from functools import lru_cache
from typing import Callable, Union

#: Printers by notation ("tex", "plain", "mathml"): tree -> str, filled by attntrace/__init__.py.
PRINTERS: dict[str, Callable[["Node"], str]] = {}


class Node:
    """Base of every formula node. Operators build trees: a + b, a - b, a * b (juxtaposition), a / b.

    A node type declares its fields as annotations, with defaults as class attributes, the way a
    frozen dataclass does, and behaves as one: positional or keyword construction, equality and
    hash by the tuple of its fields, a repr naming them, no assignment. Why not @dataclass: it
    compiles six methods per class with exec, 0.6-0.9 ms a class, and the ~35 node types made
    this module the largest import of every report; here the methods are written once and
    `__init_subclass__` only reads each type's annotations. Each type of this module writes its
    constructor out, storing each field directly and keeping the tuple of them (`_key`): a
    report builds hundreds of nodes, and such a constructor takes a quarter of the time of the
    generic one below; written out, it costs nothing at import (generated from the
    annotations, they would be compiled in every process: ~1 ms). `__init_subclass__` checks
    that a constructor's parameters and defaults are the type's fields; tests/test_formula.py
    that it stores them.
    """

    __slots__ = ()
    #: The type's field names in declaration order; how many come first without a default; the
    #: defaults of the others, in order.
    _fields: tuple[str, ...] = ()
    _required = 0
    _defaults: tuple = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        fields = cls._fields + tuple(f for f in cls.__dict__.get("__annotations__", {}) if f not in cls._fields)
        known = dict(zip(cls._fields[cls._required:], cls._defaults))
        known.update((f, cls.__dict__[f]) for f in fields if f in cls.__dict__)
        required = next((i for i, f in enumerate(fields) if f in known), len(fields))
        late = [f for f in fields[required:] if f not in known]
        if late:
            raise TypeError(f"non-default field {late[0]!r} follows a default field in {cls.__name__}")
        cls._fields, cls._required, cls._defaults = fields, required, tuple(known[f] for f in fields[required:])
        init = cls.__dict__.get("__init__")
        if init is not None:
            code = init.__code__
            if code.co_varnames[1:code.co_argcount] != fields or (init.__defaults__ or ()) != cls._defaults:
                raise TypeError(f"{cls.__name__}.__init__ does not take the fields {', '.join(fields)} with their defaults")

    def __init__(self, *args, **kwargs):
        """The constructor of a node type without its own (the types of this module have one)."""
        if kwargs or not self._required <= len(args) <= len(self._fields):
            args = self._arguments(args, kwargs)
        elif len(args) < len(self._fields):
            args += self._defaults[len(args) - self._required:]
        d = self.__dict__
        d.update(zip(self._fields, args))
        d["_key"] = args

    def _arguments(self, args: tuple, kwargs: dict) -> tuple:
        """Positional and keyword arguments as the full tuple of field values (defaults filled)."""
        fields, name = self._fields, type(self).__name__
        if len(args) > len(fields):
            raise TypeError(f"{name}() takes {len(fields)} fields but {len(args)} were given")
        values = list(args)
        for i in range(len(args), len(fields)):
            f = fields[i]
            if f in kwargs:
                values.append(kwargs.pop(f))
            elif i >= self._required:
                values.append(self._defaults[i - self._required])
            else:
                raise TypeError(f"{name}() missing required argument: {f!r}")
        if kwargs:
            extra = next(iter(kwargs))
            raise TypeError(f"{name}() got {'multiple values for' if extra in fields else 'an unexpected keyword'} argument {extra!r}")
        return tuple(values)

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return self._key == other._key
        return NotImplemented

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return f"{type(self).__qualname__}({', '.join(f'{f}={v!r}' for f, v in zip(self._fields, self._key))})"

    def __setattr__(self, name, value):
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self):
        return (type(self), self._key)

    def field_values(self) -> tuple:
        """The node's field values in declaration order (a tree walker's children)."""
        return self._key

    def replace(self, **changes) -> "Node":
        """The same node with the named fields changed (as dataclasses.replace)."""
        return type(self)(**{**dict(zip(self._fields, self._key)), **changes})

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


class Sym(Node):
    """A letter or a name: T, d_k (sub "k"), R^f (sup "f"), gamma_1, K_cache (sub a Word).

    name: Latin letters, or a Greek letter's name (ell, theta, gamma, mu, nu, sigma, varepsilon, pi).
    accent: "tilde" or "hat"; style: "roman" (an upright name such as the differential d),
    "bold" (the ones vector) or "calligraphic" (a set: the chosen experts \\mathcal{T}_i, as the
    Switch Transformer writes them; plain text spells it as a word, `formulatext.CALLIGRAPHIC`)."""

    name: str
    sub: Node | str | None = None
    sup: Node | str | None = None
    accent: str | None = None
    style: str | None = None

    def __init__(self, name, sub=None, sup=None, accent=None, style=None):
        d = self.__dict__
        d["name"], d["sub"], d["sup"], d["accent"], d["style"] = d["_key"] = (name, sub, sup, accent, style)


class Word(Node):
    """An upright word inside a formula, as a subscript (K_cache, W_gate): `roman` for the
    \\mathrm spelling, else text."""

    word: str
    roman: bool = False

    def __init__(self, word, roman=False):
        d = self.__dict__
        d["word"], d["roman"] = d["_key"] = (word, roman)


class Num(Node):
    value: int | float | str

    def __init__(self, value):
        d = self.__dict__
        d["value"] = value
        d["_key"] = (value,)


class Value(Node):
    """A number given by the user, printed as given: 50, 2.5, or an exact SymPy number (1/2)."""

    value: object

    def __init__(self, value):
        d = self.__dict__
        d["value"] = value
        d["_key"] = (value,)


class Head(Node):
    """The head superscript: Q^{(2)}, plain Q(2)."""

    of: Node
    head: int | Node

    def __init__(self, of, head):
        d = self.__dict__
        d["of"], d["head"] = d["_key"] = (of, head)


class Transpose(Node):
    """of^T; a head superscript and the transpose share one superscript: K^{(2)T}."""

    of: Node

    def __init__(self, of):
        d = self.__dict__
        d["of"] = of
        d["_key"] = (of,)


class Index(Node):
    """An entry index or a block number: a_{ij}, m_{2}; `comma` separates the index by commas
    even when every part is one character (x_{r,i} beside x_{r,i+2})."""

    of: Node
    index: tuple[Node, ...]
    comma: bool = False

    def __init__(self, of, index, comma=False):
        d = self.__dict__
        d["of"], d["index"], d["comma"] = d["_key"] = (of, index, comma)


class Slice(Node):
    """A block of a matrix: rows and columns as (first, last) 1-based, or None for all."""

    of: Node
    rows: tuple[int, int] | None
    cols: tuple[int, int] | None

    def __init__(self, of, rows, cols):
        d = self.__dict__
        d["of"], d["rows"], d["cols"] = d["_key"] = (of, rows, cols)


class Add(Node):
    """A sum; a Neg term prints as a subtraction; `tight` without spaces (an index in an
    exponent: 2(i-1)/d_k)."""

    terms: tuple[Node, ...]
    tight: bool = False

    def __init__(self, terms, tight=False):
        d = self.__dict__
        d["terms"], d["tight"] = d["_key"] = (terms, tight)


class Neg(Node):
    of: Node

    def __init__(self, of):
        d = self.__dict__
        d["of"] = of
        d["_key"] = (of,)


class Juxt(Node):
    """A product written side by side (matrix products, coefficients): Q K^T, 2 O; `thin`
    sets the factors a thin space apart instead ((4 x 3)(3 x 2), shapes of a product); `tight`
    writes them together (2i in an index: p_{r,2i})."""

    factors: tuple[Node, ...]
    thin: bool = False
    tight: bool = False

    def __init__(self, factors, thin=False, tight=False):
        d = self.__dict__
        d["factors"], d["thin"], d["tight"] = d["_key"] = (factors, thin, tight)


class Shape(Node):
    """A matrix shape, (rows x cols); `narrow` sets the sign without its spaces (a table's
    narrow column: (100x3))."""

    rows: Node | int
    cols: Node | int
    narrow: bool = False

    def __init__(self, rows, cols, narrow=False):
        d = self.__dict__
        d["rows"], d["cols"], d["narrow"] = d["_key"] = (rows, cols, narrow)


class Space(Node):
    """A thin space between factors (-m \\, (i - j)): nothing in plain math."""

    def __init__(self):
        self.__dict__["_key"] = ()


class Op(Node):
    """A binary operator between two operands: "hadamard" (entrywise product), "circ"
    (a column times each row), "in" (membership), "times" (h copies of a shape; "ntimes"
    without the spaces, for a narrow table column: 4x3), "cdot" (a product of two numbers)."""

    op: str
    left: Node
    right: Node

    def __init__(self, op, left, right):
        d = self.__dict__
        d["op"], d["left"], d["right"] = d["_key"] = (op, left, right)


class Frac(Node):
    """num / den; `small` is a textstyle fraction (1/2 beside a symbol); `inline` keeps
    the slash in every notation (2k/d in an exponent)."""

    num: Node
    den: Node
    small: bool = False
    inline: bool = False
    spaced: bool = False  # an inline slash with spaces around it (c tanh(T / c))

    def __init__(self, num, den, small=False, inline=False, spaced=False):
        d = self.__dict__
        d["num"], d["den"], d["small"], d["inline"], d["spaced"] = d["_key"] = (num, den, small, inline, spaced)


class Partial(Node):
    """The derivative of f by x: df/dx."""

    f: Node
    x: Node

    def __init__(self, f, x):
        d = self.__dict__
        d["f"], d["x"] = d["_key"] = (f, x)


class Power(Node):
    """base^exp (e^{t}, sigma^2, 10000^{2k/d})."""

    base: Node
    exp: Node

    def __init__(self, base, exp):
        d = self.__dict__
        d["base"], d["exp"] = d["_key"] = (base, exp)


class Sqrt(Node):
    of: Node

    def __init__(self, of):
        d = self.__dict__
        d["of"] = of
        d["_key"] = (of,)


class Paren(Node):
    """Parentheses the reader needs: (i - j); `sized` grows them with their content."""

    of: Node
    sized: bool = False

    def __init__(self, of, sized=False):
        d = self.__dict__
        d["of"], d["sized"] = d["_key"] = (of, sized)


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

    def __init__(self, name, args, sized=False, bare=False, params=()):
        d = self.__dict__
        d["name"], d["args"], d["sized"], d["bare"], d["params"] = d["_key"] = (name, args, sized, bare, params)


class Sum(Node):
    """sum over `index` of body (sum_k e^{t_ik}); `op` "max" is the maximum over the index
    (max_j t_1j); `small` keeps a text-size sign inside a fraction."""

    index: Node
    body: Node
    op: str = "sum"
    small: bool = False

    def __init__(self, index, body, op='sum', small=False):
        d = self.__dict__
        d["index"], d["body"], d["op"], d["small"] = d["_key"] = (index, body, op, small)


class Dots(Node):
    """An elision in a list (Z^(1), ..., Z^(h)); `centered` between operators or blocks."""

    centered: bool = False

    def __init__(self, centered=False):
        d = self.__dict__
        d["centered"] = centered
        d["_key"] = (centered,)


class Infinity(Node):
    pass

    def __init__(self):
        self.__dict__["_key"] = ()


class Range(Node):
    """first..last of an index (dZ_{:, 3..4}); a single number when first == last."""

    first: int
    last: int

    def __init__(self, first, last):
        d = self.__dict__
        d["first"], d["last"] = d["_key"] = (first, last)


class Seq(Node):
    """Items separated by commas (function arguments, a set {Q, K, V})."""

    items: tuple[Node, ...]
    braces: bool = False
    #: "comma"; "wide" (a wider gap where items hold commas themselves: (1, 2),  (3, 4));
    #: "semi" (the same in typeset math, a semicolon in plain: shapes of blocks)
    sep: str = "comma"

    def __init__(self, items, braces=False, sep='comma'):
        d = self.__dict__
        d["items"], d["braces"], d["sep"] = d["_key"] = (items, braces, sep)


class Stack(Node):
    """Matrices stacked vertically: [A; B]; `inline` on one line (shapes of the blocks)."""

    rows: tuple[Node, ...]
    inline: bool = False

    def __init__(self, rows, inline=False):
        d = self.__dict__
        d["rows"], d["inline"] = d["_key"] = (rows, inline)


class Hcat(Node):
    """Matrices side by side: [A, B]; `inline` on one line with a wide gap instead of commas
    (shapes of the blocks: [(3 x 2)  (3 x 1)])."""

    items: tuple[Node, ...]
    inline: bool = False

    def __init__(self, items, inline=False):
        d = self.__dict__
        d["items"], d["inline"] = d["_key"] = (items, inline)


class Cases(Node):
    """A definition by cases: ((value, condition), ...)."""

    cases: tuple[tuple[Node, Node], ...]

    def __init__(self, cases):
        d = self.__dict__
        d["cases"] = cases
        d["_key"] = (cases,)


class Rel(Node):
    """A chain of sides: a = b = c; `ops` names each relation ("eq", "approx", "to", "le", "lt", "gt"),
    all "eq" when not given."""

    sides: tuple[Node, ...]
    ops: tuple[str, ...] = ()

    def __init__(self, sides, ops=()):
        d = self.__dict__
        d["sides"], d["ops"] = d["_key"] = (sides, ops)


class Parts(Node):
    """Several formulas on one line (A = softmax(T), a_ij = ...): a wide gap between them, or a
    narrow one (`narrow`) between two cases of one definition."""

    items: tuple[Node, ...]
    narrow: bool = False

    def __init__(self, items, narrow=False):
        d = self.__dict__
        d["items"], d["narrow"] = d["_key"] = (items, narrow)


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


class Diff(Node):
    """The differential of a matrix, dO (an upright d before it)."""

    of: Node

    def __init__(self, of):
        d = self.__dict__
        d["of"] = of
        d["_key"] = (of,)


ONES = Sym("1", style="bold")


def substitute(tree: Node, mapping: dict) -> Node:
    """The tree with every subtree equal to a key of `mapping` replaced by its value (a node,
    or a string already printed for one output): the general entry formula g_ij = max(0, h_ij)
    becomes the line of entry (2, 3), g_23 = max(0, -1.2)."""
    if tree in mapping:
        return mapping[tree]
    if not isinstance(tree, Node):
        return tree
    changes = {}
    for name, value in zip(tree._fields, tree._key):
        if isinstance(value, Node):
            new = substitute(value, mapping)
        elif isinstance(value, tuple) and any(isinstance(x, (Node, tuple)) for x in value):
            new = tuple(substitute(x, mapping) if isinstance(x, Node) else
                        tuple(substitute(y, mapping) for y in x) if isinstance(x, tuple) else x for x in value)
        else:
            continue
        if new != value:
            changes[name] = new
    return tree.replace(**changes) if changes else tree


def nodes(tree: Node):
    """Every node of a tree, the tree first (a walk that finds the subtrees to `substitute`)."""
    yield tree
    for value in tree.field_values():
        for x in (value if isinstance(value, tuple) else (value,)):
            for y in (x if isinstance(x, tuple) else (x,)):
                if isinstance(y, Node):
                    yield from nodes(y)


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


def first_factor(product: Node) -> Node:
    """X of X W_Q + b_Q (or of X W_Q)."""
    product = product.terms[0] if isinstance(product, Add) else product
    return product.factors[0] if isinstance(product, Juxt) else product
