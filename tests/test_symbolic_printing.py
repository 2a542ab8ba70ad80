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
