"""The symbolic report's fast paths print exactly what SymPy's own LaTeX printer prints."""
import random

import pytest

sympy = pytest.importorskip("sympy")

from attntrace.rendering.printing import TexOut, printer_classes  # noqa: E402

NAMES = ["x_{11}", "w^{Q}_{12}", "alpha_{1}", "a_{ij}", "v_{21}", "g^{Z}_{11}", "beta", "e_{1}", "x", "W_{ab}", "theta_{2}"]


def test_a_product_of_symbols_prints_as_sympys_print_mul():
    from sympy.printing.latex import LatexPrinter

    printer = printer_classes()[0]({"precision": 4})
    symbols = [sympy.Symbol(n) for n in NAMES]
    rng = random.Random(7)
    for _ in range(500):
        e = sympy.Mul(*rng.sample(symbols, rng.randint(2, 5)))
        assert printer.doprint(e) == LatexPrinter._print_Mul(printer, e), e


def test_remembered_entries_tell_1_from_1_0():
    # the memo is keyed by SymPy expressions, whose == tells Integer 1 from Float 1.0
    out = TexOut(precision=4)
    x = sympy.Symbol("x")
    exprs = [x + 1, x + sympy.Float(1.0), x + sympy.Float(1.5), x * 2, x * sympy.Float(2.0), x + 1]
    fresh = [printer_classes()[0]({"precision": 4}).doprint(e) for e in exprs]
    assert [out.expr(e) for e in exprs] == fresh


def test_a_named_product_is_what_sympys_unevaluated_constructors_build():
    """Symbolic mode builds each entry of a product with Mul/Add._from_args: the same terms, order
    and commutativity as Mul(x, y, evaluate=False) and Add(*terms, evaluate=False), zeros left out."""
    from attntrace.algebra.symbolic import SympyAlgebra

    t, n = sympy.Symbol("t"), sympy.Symbol("n", commutative=False)
    pool = [sympy.Symbol(s) for s in NAMES] + [sympy.Integer(0), sympy.Integer(2), sympy.Rational(1, 2), sympy.Float(0.0),
                                                 sympy.exp(t) / 3, sympy.sqrt(6), -t, n]
    rng = random.Random(11)

    def reference(row, col):
        terms = [sympy.Mul(x, y, evaluate=False) for x, y in zip(row, col) if not (x == 0 or y == 0)] or [sympy.Integer(0)]
        return terms[0] if len(terms) == 1 else sympy.Add(*terms, evaluate=False)

    alg = SympyAlgebra("symbolic", name_steps=True)
    for _ in range(200):
        rows, inner, cols = rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 3)
        a = sympy.Matrix(rows, inner, [rng.choice(pool) for _ in range(rows * inner)])
        b = sympy.Matrix(inner, cols, [rng.choice(pool) for _ in range(inner * cols)])
        got = alg.matmul(a, b)
        want = sympy.Matrix(rows, cols, lambda i, j: reference(list(a.row(i)), list(b.col(j))))
        for g, w in zip(got, want):
            assert (type(g), g.args, g.is_commutative) == (type(w), w.args, w.is_commutative), (g, w)


def test_a_sum_of_products_of_symbols_prints_as_sympys_print_add():
    from sympy.printing.latex import LatexPrinter

    printer = printer_classes()[0]({"precision": 4})
    symbols = [sympy.Symbol(n) for n in NAMES]
    rng = random.Random(13)
    for _ in range(300):
        terms = [sympy.Mul(*rng.sample(symbols, rng.randint(2, 4)), evaluate=False) for _ in range(rng.randint(2, 7))]
        e = sympy.Add(*terms, evaluate=False)
        assert printer.doprint(e) == LatexPrinter._print_Add(printer, e), e
    # sums the shortcut leaves to SymPy: a negative term, a number, an exponential
    x, y = sympy.Symbol("x_{11}"), sympy.Symbol("y_{11}")
    for e in (sympy.Add(sympy.Mul(x, y, evaluate=False), sympy.Mul(-1, x, y, evaluate=False), evaluate=False),
              sympy.Add(sympy.Mul(x, y, evaluate=False), sympy.Integer(2), evaluate=False),
              sympy.Add(sympy.exp(x), sympy.exp(y), evaluate=False)):
        assert printer.doprint(e) == LatexPrinter._print_Add(printer, e), e
