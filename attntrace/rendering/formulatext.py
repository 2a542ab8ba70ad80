"""Printers of formula trees (`attntrace.model.formula`): LaTeX, plain math and MathML.

One method per node type, found by name (`_print_Frac`), as SymPy's `Printer` dispatches;
a printer's settings are declared in `default_settings` and unknown ones are refused. The
LaTeX printer writes what the reports and the JSON `formula` field hold (KaTeX-safe macros
only: `\\operatorname{softmax}`, never `\\softmax`); the plain printer writes what a terminal
shows (S = Q K^T, sqrt(d_k), a(2)_ij); the MathML printer writes MathML Core for the HTML
report, from the tree itself rather than from its LaTeX.
"""

from __future__ import annotations

from typing import Any

from attntrace.model import formula as F
from attntrace.model.errors import BadInput


def escape(text: str) -> str:
    """`html.escape`, imported on first use: only the MathML printer (HTML reports) calls it, so
    a Markdown or LaTeX report does not load `html` and its entity table."""
    from html import escape as html_escape

    return html_escape(text)

#: Greek letters by name: LaTeX command, plain spelling, Unicode character (MathML).
GREEK = {"ell": ("\\ell", "l", "ℓ"), "theta": ("\\theta", "theta", "θ"), "gamma": ("\\gamma", "gamma", "γ"),
         "beta": ("\\beta", "beta", "β"), "mu": ("\\mu", "mu", "μ"), "nu": ("\\nu", "nu", "ν"),
         "sigma": ("\\sigma", "sigma", "σ"), "varepsilon": ("\\varepsilon", "eps", "ε"), "pi": ("\\pi", "pi", "π"),
         "alpha": ("\\alpha", "alpha", "α"), "delta": ("\\delta", "delta", "δ")}
GREEK.update({name: (f"\\{name}", name, char) for name, char in (
    ("lambda", "λ"), ("eta", "η"), ("zeta", "ζ"), ("iota", "ι"), ("kappa", "κ"), ("xi", "ξ"), ("rho", "ρ"), ("tau", "τ"),
    ("phi", "φ"), ("chi", "χ"), ("psi", "ψ"), ("omega", "ω"), ("epsilon", "ϵ"), ("upsilon", "υ"))})
#: Plain-text spellings of calligraphic letters (sets): a terminal's fonts have no script T, and
#: a bare T would read as the scaled scores T, so the set of chosen experts is spelled TopK_i.
CALLIGRAPHIC = {"T": "TopK"}
#: Functions LaTeX knows by name (\max, \log); the others are \operatorname{...}.
TEX_FUNCTIONS = {"max", "min", "exp", "log", "ln", "sin", "cos", "tanh"}
#: Binary operators of `Op`: LaTeX, plain, MathML.
OPERATORS = {"mul": (" \\cdot ", " * ", "⋅"), "hadamard": (" \\odot ", " * ", "⊙"), "circ": (" \\circ ", " o ", "∘"), "in": (" \\in ", " in ", "∈"), "notin": (" \\notin ", " not in ", "∉"),
             "times": (" \\times ", " x ", "×"), "ntimes": ("{\\times}", " x ", "×"), "cdot": (" \\cdot ", "*", "⋅")}
#: Relations of `Rel`: LaTeX, plain, MathML.
RELATIONS = {"eq": (" = ", " = ", "="), "lt": (" < ", " < ", "<"), "gt": (" > ", " > ", ">"), "approx": (" \\approx ", " ~ ", "≈"), "to": (" \\to ", " -> ", "→"),
             "le": (" \\le ", " <= ", "≤")}
ACCENTS = {"tilde": ("\\tilde", "~", "~"), "hat": ("\\hat", "'", "^"), "bar": ("\\bar", "bar", "¯"), "check": ("\\check", "check", "ˇ")}


class Printer:
    """Dispatch on the node's class name; settings validated against `default_settings`.
    Each printer class keeps the method it found for each node type (`_methods`): a small
    report prints ~650 nodes, and building a method's name and looking it up costs more than
    most of the methods themselves."""

    default_settings: dict[str, Any] = {}
    _methods: dict[type, Any] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._methods = {}

    def __init__(self, **settings):
        unknown = set(settings) - set(self.default_settings)
        if unknown:
            raise TypeError(f"unknown printer setting(s): {', '.join(sorted(unknown))}")
        self.settings = {**self.default_settings, **settings}

    def __call__(self, tree: F.Node) -> str:
        return self.p(tree)

    def p(self, x) -> str:
        method = self._methods.get(type(x))
        if method is not None:
            return method(self, x)
        if isinstance(x, str):
            return self._print_str(x)
        if isinstance(x, (int, float)):
            x = F.Num(x)
        method = getattr(type(self), f"_print_{type(x).__name__}", None)
        if method is None:
            raise TypeError(f"{type(self).__name__} cannot print {type(x).__name__}")
        if isinstance(x, F.Node):
            self._methods[type(x)] = method
        return method(self, x)

    def _print_str(self, s: str) -> str:
        return s

    def args(self, items) -> str:
        return ", ".join(self.p(a) for a in items)


def _value_text(x, tex: bool) -> str:
    """A user's number as given: 50 (not 50.0), 2.5, or an exact SymPy number (\\frac{1}{2}, 1/2)."""
    if isinstance(x, float) and x == int(x):
        return str(int(x))
    if isinstance(x, (int, float)):
        return repr(x)
    if not tex:
        return str(x)
    import sympy

    return sympy.latex(x)


def _atomic(x) -> bool:
    """A symbol, possibly with its head and index: no parentheses needed around it."""
    while isinstance(x, (F.Head, F.Index, F.Transpose)):
        x = x.of
    return isinstance(x, (F.Sym, F.Num, str, F.Diff))


def _differential(x) -> bool:
    """dS, dS^T, dQ^{(1)}: a factor after it gets a thin space, so that dS K does not read as d(SK)."""
    while isinstance(x, (F.Head, F.Index, F.Transpose)):
        x = x.of
    return isinstance(x, F.Diff)


def _coefficient(a, b) -> bool:
    """A number before parentheses, 2(i-1): no space between them."""
    return isinstance(a, F.Num) and isinstance(b, F.Paren)


class TexPrinter(Printer):
    """LaTeX math, as reports and the JSON export write it."""

    def _print_Sym(self, s: F.Sym) -> str:
        base = GREEK[s.name][0] if s.name in GREEK else s.name
        if s.style == "roman":
            base = f"\\mathrm{{{base}}}"
        elif s.style == "bold":
            base = f"\\mathbf{{{base}}}"
        elif s.style == "calligraphic":
            base = f"\\mathcal{{{base}}}"
        if s.accent:
            base = f"{ACCENTS[s.accent][0]}{{{base}}}"
        if s.sub is not None:
            sub = self.p(s.sub)
            base += f"_{sub}" if len(sub) == 1 else f"_{{{sub}}}"
        if s.sup is not None:
            base += f"^{{{self.p(s.sup)}}}"
        return base

    def _print_Word(self, w: F.Word) -> str:
        return f"\\mathrm{{{w.word}}}" if w.roman else f"\\text{{{w.word}}}"

    def _print_Diff(self, d: F.Diff) -> str:
        return f"\\mathrm{{d}}{self.p(d.of)}"

    def _print_Num(self, n: F.Num) -> str:
        return str(n.value)

    def _print_Value(self, v: F.Value) -> str:
        return _value_text(v.value, tex=True)

    def _sup(self, of: F.Node, extra: str) -> str:
        """`of` with `extra` in its superscript: one superscript, merged with a symbol's own
        (W^{UQ} of head 2 is W^{UQ(2)}, never W^{UQ}^{(2)})."""
        if isinstance(of, F.Sym) and of.sup is not None:
            return f"{self.p(of.replace(sup=None))}^{{{self.p(of.sup)}{extra}}}"
        return f"{self.p(of)}^{{{extra}}}"

    def _print_Head(self, h: F.Head) -> str:
        return self._sup(h.of, f"({self.p(h.head)})")

    def _print_Transpose(self, t: F.Transpose) -> str:
        if isinstance(t.of, F.Head):
            return self._sup(t.of.of, f"({self.p(t.of.head)})\\top")
        return self._sup(t.of, "\\top")

    def _print_Index(self, x: F.Index) -> str:
        parts = [self.p(i) for i in x.index]
        sep = "," if x.comma or any(len(p) > 1 for p in parts) else ""
        return f"{self.p(x.of)}_{{{sep.join(parts)}}}"

    def _range(self, r) -> str:
        return ":" if r is None else (f"{r[0]}" if r[0] == r[1] else f"{r[0]}{{:}}{r[1]}")

    def _print_Slice(self, s: F.Slice) -> str:
        return f"{self.p(s.of)}_{{{self._range(s.rows)},\\,{self._range(s.cols)}}}"

    def _print_Range(self, r: F.Range) -> str:
        return self._range((r.first, r.last))

    def _print_Add(self, a: F.Add) -> str:
        out, space = "", "" if a.tight else " "
        for k, t in enumerate(a.terms):
            if isinstance(t, F.Neg):
                out += ("-" if k == 0 else f"{space}-{space}") + self.p(t.of)
            else:
                out += ("" if k == 0 else f"{space}+{space}") + self.p(t)
        return out

    def _print_Neg(self, n: F.Neg) -> str:
        inner = self.p(n.of)
        return f"-({inner})" if isinstance(n.of, F.Add) else f"-{inner}"

    def _print_Juxt(self, j: F.Juxt) -> str:
        if j.thin or j.tight:
            return ("" if j.tight else "\\,").join(self.p(f) for f in j.factors)
        out = ""
        for k, f in enumerate(j.factors):
            before = j.factors[k - 1] if k else None
            gap = "" if k == 0 or isinstance(f, F.Space) or _coefficient(before, f) else "\\, " if _differential(before) else " "
            out += gap + self.p(f)
        return out

    def _print_Space(self, s: F.Space) -> str:
        return "\\,"

    def _print_Op(self, o: F.Op) -> str:
        return f"{self.p(o.left)}{OPERATORS[o.op][0]}{self.p(o.right)}"

    def _print_Shape(self, s: F.Shape) -> str:
        return f"({self.p(s.rows)}{OPERATORS['ntimes' if s.narrow else 'times'][0]}{self.p(s.cols)})"

    def _print_Frac(self, f: F.Frac) -> str:
        if f.inline:
            return f"{self.p(f.num)}{' / ' if f.spaced else '/'}{self.p(f.den)}"
        return f"\\{'t' if f.small else ''}frac{{{self.p(f.num)}}}{{{self.p(f.den)}}}"

    def _print_Partial(self, d: F.Partial) -> str:
        return f"\\frac{{\\partial {self.p(d.f)}}}{{\\partial {self.p(d.x)}}}"

    def _print_Power(self, pw: F.Power) -> str:
        e = self.p(pw.exp)
        bare = len(e) == 1 and isinstance(pw.base, (F.Sym, F.Index))  # sigma_i^2, h_{ij}^3; else (x)^{2}, 10000^{0}
        return f"{self.p(pw.base)}^{e}" if bare else f"{self.p(pw.base)}^{{{e}}}"

    def _print_Sqrt(self, s: F.Sqrt) -> str:
        return f"\\sqrt{{{self.p(s.of)}}}"

    def _print_Paren(self, p: F.Paren) -> str:
        return f"\\left({self.p(p.of)}\\right)" if p.sized else f"({self.p(p.of)})"

    def _print_Func(self, f: F.Func) -> str:
        name = (f"\\{f.name}" if f.name in TEX_FUNCTIONS else GREEK[f.name][0] if f.name in GREEK  # sigma(L): the logistic function
                else f"\\operatorname{{{f.name}}}")
        if not f.args:
            return name
        inner = self.args(f.args) + "".join((";\\ " if k == 0 else ", ") + self.p(x) for k, x in enumerate(f.params))
        if f.bare:
            return name + ("" if isinstance(f.args[0], F.Frac) else " ") + inner
        return f"{name}\\left({inner}\\right)" if f.sized else f"{name}({inner})"

    def _print_Sum(self, s: F.Sum) -> str:
        size = "\\textstyle" if s.small else ""
        return f"{size}\\{s.op}_{{{self.p(s.index)}}} {self.p(s.body)}"

    def _print_Dots(self, d: F.Dots) -> str:
        return "\\cdots" if d.centered else "\\ldots"

    def _print_Infinity(self, i: F.Infinity) -> str:
        return "\\infty"

    def _print_Seq(self, s: F.Seq) -> str:
        if s.sep != "comma":
            return ",\\ ".join(self.p(x) for x in s.items)
        return f"\\{{{self.args(s.items)}\\}}" if s.braces else self.args(s.items)

    def _print_Stack(self, s: F.Stack) -> str:
        if s.inline:
            return "\\bigl[" + ";\\ ".join(self.p(r) for r in s.rows) + "\\bigr]"
        return "\\begin{bmatrix} " + " \\\\ ".join(self.p(r) for r in s.rows) + " \\end{bmatrix}"

    def _print_Hcat(self, h: F.Hcat) -> str:
        if h.inline:
            return "\\bigl[" + "\\ \\ ".join(self.p(x) for x in h.items) + "\\bigr]"
        return f"\\left[{self.args(h.items)}\\right]"

    def _print_Cases(self, c: F.Cases) -> str:
        return "\\begin{cases} " + " \\\\ ".join(f"{self.p(v)} & {self.p(w)}" for v, w in c.cases) + " \\end{cases}"

    notation = 0  # the column of RELATIONS and OPERATORS

    def _print_Rel(self, r: F.Rel) -> str:
        ops = r.ops or ("eq",) * (len(r.sides) - 1)
        return self.p(r.sides[0]) + "".join(RELATIONS[op][self.notation] + self.p(s) for op, s in zip(ops, r.sides[1:]))

    def _print_Parts(self, p: F.Parts) -> str:
        return (",\\ " if p.narrow else ", \\quad ").join(self.p(x) for x in p.items)


class PlainPrinter(Printer):
    """Plain math for terminals: S = Q K^T, T = S / sqrt(d_k), a(2)_ij (the head in parentheses)."""

    def _print_Sym(self, s: F.Sym) -> str:
        base = GREEK[s.name][1] if s.name in GREEK else s.name
        if s.style == "calligraphic":
            base = CALLIGRAPHIC[base]
        if s.accent:
            base += ACCENTS[s.accent][1]
        if s.sub is not None:
            base += f"_{self.p(s.sub)}"
        if s.sup is not None:
            base += f"^{self.p(s.sup)}"
        return base

    def _print_Word(self, w: F.Word) -> str:
        return w.word

    def _print_Diff(self, d: F.Diff) -> str:
        return f"d{self.p(d.of)}"

    def _print_Num(self, n: F.Num) -> str:
        return str(n.value)

    def _print_Value(self, v: F.Value) -> str:
        return _value_text(v.value, tex=False)

    def _print_Head(self, h: F.Head) -> str:
        return f"{self.p(h.of)}({self.p(h.head)})"

    def _print_Transpose(self, t: F.Transpose) -> str:
        inner = self.p(t.of)
        return f"{inner}^T" if _atomic(t.of) else f"({inner})^T"

    def _print_Index(self, x: F.Index) -> str:
        parts = [self.p(i) for i in x.index]
        # an entry's head is a superscript, as SymPy's entry names print (t^(2)_11); a matrix's is not (T(2))
        of = f"{self.p(x.of.of)}^({self.p(x.of.head)})" if isinstance(x.of, F.Head) else self.p(x.of)
        return f"{of}_" + (f"({','.join(parts)})" if x.comma or any(len(p) > 1 for p in parts) else "".join(parts))

    def _range(self, r) -> str:
        return ":" if r is None else (f"{r[0]}" if r[0] == r[1] else f"{r[0]}..{r[1]}")

    def _print_Slice(self, s: F.Slice) -> str:
        return f"{self.p(s.of)}[{self._range(s.rows)}, {self._range(s.cols)}]"

    def _print_Range(self, r: F.Range) -> str:
        return self._range((r.first, r.last))

    _print_Add = TexPrinter._print_Add
    _print_Neg = TexPrinter._print_Neg

    def _print_Juxt(self, j: F.Juxt) -> str:
        factors = [f for f in j.factors if not isinstance(f, F.Space)]
        if j.tight:
            return "".join(self.p(f) for f in factors)
        return "".join(("" if k == 0 or _coefficient(factors[k - 1], f) else " ") + self.p(f) for k, f in enumerate(factors))

    def _print_Op(self, o: F.Op) -> str:
        return f"{self.p(o.left)}{OPERATORS[o.op][1]}{self.p(o.right)}"

    def _print_Shape(self, s: F.Shape) -> str:
        return f"({self.p(s.rows)} x {self.p(s.cols)})"

    def _operand(self, x) -> str:
        text = self.p(x)
        return f"({text})" if isinstance(x, (F.Add, F.Neg, F.Op)) else text

    def _print_Frac(self, f: F.Frac) -> str:
        if f.small or (f.inline and self.exponent):  # 2k/d, -2 (i - 1)/d_k: a slash without spaces binds to its neighbours
            num = f"({self.p(f.num)})" if isinstance(f.num, F.Add) else self.p(f.num)
            return f"{num}/{self._operand(f.den)}"
        return f"{self._operand(f.num)} / {self._operand(f.den)}"

    def _print_Partial(self, d: F.Partial) -> str:
        return f"d{self.p(d.f)}/d{self.p(d.x)}"

    exponent = 0  # inside an exponent: fractions without spaces

    def _print_Power(self, pw: F.Power) -> str:
        self.exponent += 1
        try:
            e = self.p(pw.exp)
        finally:
            self.exponent -= 1
        base = self.p(pw.base) if _atomic(pw.base) or isinstance(pw.base, (F.Func, F.Paren)) else f"({self.p(pw.base)})"
        return f"{base}^{e}" if e.isalnum() else f"{base}^({e})"

    def _print_Sqrt(self, s: F.Sqrt) -> str:
        return f"sqrt({self.p(s.of)})"

    def _print_Paren(self, p: F.Paren) -> str:
        return f"({self.p(p.of)})"

    def _print_Func(self, f: F.Func) -> str:
        if not f.args:
            return f.name
        inner = self.args(f.args) + "".join(("; " if k == 0 else ", ") + self.p(x) for k, x in enumerate(f.params))
        if f.bare and len(f.args) == 1 and _atomic(f.args[0]) and not isinstance(f.args[0], (F.Num, str)):
            return f"{f.name} {inner}"  # log l, not log(l); but cos(1.5)
        return f"{f.name}({inner})"

    def _print_Sum(self, s: F.Sum) -> str:
        index = self.p(s.index)
        return f"{s.op}_{index if _atomic(s.index) else f'({index})'} {self.p(s.body)}"

    def _print_Dots(self, d: F.Dots) -> str:
        return "..."

    def _print_Infinity(self, i: F.Infinity) -> str:
        return "inf"

    def _print_Seq(self, s: F.Seq) -> str:
        if s.sep != "comma":
            return ("; " if s.sep == "semi" else ", ").join(self.p(x) for x in s.items)
        return f"{{{self.args(s.items)}}}" if s.braces else self.args(s.items)

    def _print_Stack(self, s: F.Stack) -> str:
        return "[" + "; ".join(self.p(r) for r in s.rows) + "]"

    def _print_Hcat(self, h: F.Hcat) -> str:
        return f"[{('  ' if h.inline else ', ').join(self.p(x) for x in h.items)}]"

    def _print_Cases(self, c: F.Cases) -> str:
        return ", ".join(f"{self.p(v)} ({self.p(w)})" for v, w in c.cases)

    notation = 1
    _print_Rel = TexPrinter._print_Rel

    def _print_Parts(self, p: F.Parts) -> str:
        return ",  ".join(self.p(x) for x in p.items)


class MathMLPrinter(Printer):
    """MathML Core (presentation) of a formula, for the HTML report: <mi>, <mo>, <mfrac>, ...

    `display`: wrap in <math display="block">, else the bare inner row."""

    default_settings = {"display": False}

    def __call__(self, tree: F.Node) -> str:
        inner = self.p(tree)
        return f'<math display="block">{inner}</math>' if self.settings["display"] else inner

    @staticmethod
    def mi(text: str, upright: bool = False) -> str:
        v = ' mathvariant="normal"' if upright and len(text) == 1 else ""
        return f"<mi{v}>{escape(text)}</mi>"

    @staticmethod
    def mo(text: str) -> str:
        return f"<mo>{escape(text)}</mo>"

    @staticmethod
    def row(*parts: str) -> str:
        return "<mrow>" + "".join(parts) + "</mrow>"

    def _print_str(self, s: str) -> str:
        return "<mn>" + escape(s) + "</mn>" if s.isdigit() else self.mi(s)

    def _print_Sym(self, s: F.Sym) -> str:
        text = GREEK[s.name][2] if s.name in GREEK else s.name
        if s.style in ("bold", "calligraphic"):
            base = f'<mi mathvariant="{ {"bold": "bold", "calligraphic": "script"}[s.style]}">{escape(text)}</mi>'
        else:
            base = self.mi(text, s.style == "roman")
        if s.name.isdigit():
            base = f"<mn>{text}</mn>" if s.style != "bold" else f'<mn mathvariant="bold">{text}</mn>'
        if s.accent:
            base = f'<mover accent="true">{base}<mo>{ACCENTS[s.accent][2]}</mo></mover>'
        if s.sub is not None and s.sup is not None:
            return f"<msubsup>{base}{self.p(s.sub)}{self.p(s.sup)}</msubsup>"
        if s.sub is not None:
            return f"<msub>{base}{self.p(s.sub)}</msub>"
        if s.sup is not None:
            return f"<msup>{base}{self.p(s.sup)}</msup>"
        return base

    def _print_Word(self, w: F.Word) -> str:
        return f"<mtext>{escape(w.word)}</mtext>"

    def _print_Diff(self, d: F.Diff) -> str:
        return self.row(self.mi("d", upright=True), self.p(d.of))

    def _print_Num(self, n: F.Num) -> str:
        return f"<mn>{escape(str(n.value))}</mn>"

    def _print_Value(self, v: F.Value) -> str:
        return f"<mn>{escape(_value_text(v.value, tex=False))}</mn>"

    def _head(self, h) -> str:
        return self.row(self.mo("("), self.p(h), self.mo(")"))

    def _print_Head(self, h: F.Head) -> str:
        return f"<msup>{self.p(h.of)}{self._head(h.head)}</msup>"

    def _print_Transpose(self, t: F.Transpose) -> str:
        if isinstance(t.of, F.Head):
            return f"<msup>{self.p(t.of.of)}{self.row(self._head(t.of.head), self.mo('⊤'))}</msup>"
        return f"<msup>{self.p(t.of)}{self.mo('⊤')}</msup>"

    def _print_Index(self, x: F.Index) -> str:
        sep = self.mo(",") if x.comma or any(len(TexPrinter().p(i)) > 1 for i in x.index) else ""
        return f"<msub>{self.p(x.of)}{self.row(sep.join(self.p(i) for i in x.index))}</msub>"

    def _range(self, r) -> str:
        if r is None:
            return self.mo(":")
        return f"<mn>{r[0]}</mn>" if r[0] == r[1] else f"<mn>{r[0]}</mn>{self.mo(':')}<mn>{r[1]}</mn>"

    def _print_Slice(self, s: F.Slice) -> str:
        return f"<msub>{self.p(s.of)}{self.row(self._range(s.rows), self.mo(','), self._range(s.cols))}</msub>"

    def _print_Range(self, r: F.Range) -> str:
        return self.row(self._range((r.first, r.last)))

    def _print_Add(self, a: F.Add) -> str:
        out = []
        for k, t in enumerate(a.terms):
            if isinstance(t, F.Neg):
                out += [self.mo("−"), self.p(t.of)]
            else:
                out += ([] if k == 0 else [self.mo("+")]) + [self.p(t)]
        return self.row(*out)

    def _print_Neg(self, n: F.Neg) -> str:
        inner = self.p(n.of)
        if isinstance(n.of, F.Add):
            inner = self.row(self.mo("("), inner, self.mo(")"))
        return self.row(self.mo("−"), inner)

    def _print_Juxt(self, j: F.Juxt) -> str:
        return self.row(*[self.p(f) for f in j.factors])

    def _print_Shape(self, s: F.Shape) -> str:
        return self.row(self.mo("("), self.p(s.rows), self.mo("×"), self.p(s.cols), self.mo(")"))

    def _print_Space(self, s: F.Space) -> str:
        return '<mspace width="0.1667em"></mspace>'

    def _print_Op(self, o: F.Op) -> str:
        return self.row(self.p(o.left), self.mo(OPERATORS[o.op][2]), self.p(o.right))

    def _print_Frac(self, f: F.Frac) -> str:
        if f.inline:
            return self.row(self.p(f.num), self.mo("/"), self.p(f.den))
        return f"<mfrac>{self.p(f.num)}{self.p(f.den)}</mfrac>"

    def _print_Partial(self, d: F.Partial) -> str:
        return f"<mfrac>{self.row(self.mo('∂'), self.p(d.f))}{self.row(self.mo('∂'), self.p(d.x))}</mfrac>"

    def _print_Power(self, pw: F.Power) -> str:
        return f"<msup>{self.p(pw.base)}{self.row(self.p(pw.exp))}</msup>"

    def _print_Sqrt(self, s: F.Sqrt) -> str:
        return f"<msqrt>{self.p(s.of)}</msqrt>"

    def _print_Paren(self, p: F.Paren) -> str:
        return self.row(self.mo("("), self.p(p.of), self.mo(")"))

    def _print_Func(self, f: F.Func) -> str:
        name = self.mi(GREEK[f.name][2]) if f.name in GREEK else self.mi(f.name, upright=True)
        if not f.args:
            return name
        inner = [self.p(a) if k == 0 else self.mo(",") + self.p(a) for k, a in enumerate(f.args)]
        inner += [(self.mo(";") if k == 0 else self.mo(",")) + self.p(x) for k, x in enumerate(f.params)]
        return self.row(name, self.mo("\u2061"), self.mo("("), *inner, self.mo(")"))

    def _print_Sum(self, s: F.Sum) -> str:
        sign = self.mo("∑") if s.op == "sum" else self.mi(s.op, upright=True)
        return self.row(f"<munder>{sign}{self.p(s.index)}</munder>", self.p(s.body))

    def _print_Dots(self, d: F.Dots) -> str:
        return self.mo("⋯" if d.centered else "…")

    def _print_Infinity(self, i: F.Infinity) -> str:
        return self.mi("∞")

    def _print_Seq(self, s: F.Seq) -> str:
        items = [self.p(x) if k == 0 else self.mo(",") + self.p(x) for k, x in enumerate(s.items)]
        return self.row(*([self.mo("{")] + items + [self.mo("}")] if s.braces else items))

    def _print_Stack(self, s: F.Stack) -> str:
        rows = "".join(f"<mtr><mtd>{self.p(r)}</mtd></mtr>" for r in s.rows)
        return self.row(self.mo("["), f"<mtable>{rows}</mtable>", self.mo("]"))

    def _print_Hcat(self, h: F.Hcat) -> str:
        gap = '<mspace width="0.5em"></mspace>' if h.inline else self.mo(",")
        return self.row(self.mo("["), *[self.p(x) if k == 0 else gap + self.p(x) for k, x in enumerate(h.items)], self.mo("]"))

    def _print_Cases(self, c: F.Cases) -> str:
        rows = "".join(f"<mtr><mtd>{self.p(v)}</mtd><mtd>{self.p(w)}</mtd></mtr>" for v, w in c.cases)
        return self.row(self.mo("{"), f"<mtable>{rows}</mtable>")

    def _print_Rel(self, r: F.Rel) -> str:
        ops = r.ops or ("eq",) * (len(r.sides) - 1)
        return self.row(self.p(r.sides[0]), *[self.mo(RELATIONS[op][2]) + self.p(s) for op, s in zip(ops, r.sides[1:])])

    def _print_Parts(self, p: F.Parts) -> str:
        gap = '<mspace width="0.1667em"></mspace>' if p.narrow else '<mspace width="1em"></mspace>'
        return self.row(*[self.p(x) if k == 0 else self.mo(",") + gap + self.p(x) for k, x in enumerate(p.items)])


TEX, PLAIN, MATHML = TexPrinter(), PlainPrinter(), MathMLPrinter()


def tex(tree: F.Node) -> str:
    return TEX(tree)


def plain(tree: F.Node) -> str:
    return PLAIN(tree)


def mathml(tree: F.Node, display: bool = False) -> str:
    return MathMLPrinter(display=display)(tree)


#: The printer of each notation, as `attntrace.model.formula.PRINTERS` names them.
PRINTER_OF = {"tex": tex, "plain": plain, "mathml": mathml}


def headed(name: str, head: int | None, notation: str = "tex") -> str:
    """The template filter `head`: a name of one head, `name` with the head's superscript, printed
    from its tree in `notation` ("tex" or "plain"): "Q" | head(2) is Q^{(2)}, Q(2) in plain; a
    head of 0 or None (a single-head step) leaves the name bare. A name is a letter or a Greek
    one (\\lambda), perhaps with a subscript of letters (W_Q), as the prose glues a head to."""
    base, _, sub = name.removeprefix("\\").partition("_")
    if notation not in ("tex", "plain") or not base.isalpha() or not (sub == "" or sub.isalpha()) or (
            head is not None and (isinstance(head, bool) or not isinstance(head, int) or head < 0)):
        raise BadInput(f"head: expected a letter name (Q, W_Q, \\lambda), a head number and tex or plain, "
                       f"not {name!r}, {head!r}, {notation!r}")
    return PRINTER_OF[notation](F.sym(base, sub or None).head(head or None))
