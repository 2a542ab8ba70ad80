"""The printing module: entry names, numbers, elision."""

import numpy as np
import sympy as sp

from attntrace.rendering import printing
from attntrace.rendering.printing import PlainOut, TexOut, latex_expr


def test_greek_entry_names_and_infinity():
    assert latex_expr(sp.Symbol("alpha_{11}")) == "\\alpha_{11}"
    assert latex_expr(sp.Symbol("w^{Q}_{11}")) == "w^{Q}_{11}"
    assert latex_expr(-sp.oo) == "-\\infty"
    a11, v11, a12, v21 = sp.symbols("a_{11} v_{11} a_{12} v_{21}")
    e = sp.Add(sp.Mul(a11, v11, evaluate=False), sp.Mul(a12, v21, evaluate=False), evaluate=False)
    assert latex_expr(e) == "a_{11} v_{11} + a_{12} v_{21}"


def test_entry_names_with_heads():
    assert printing.entry_name("w^{Q}", 1, 2, 2) == "w^{Q(2)}_{12}"
    assert printing.entry_name("z", 1, 10, 1) == "z^{(1)}_{1,10}"


def test_entry_names_made_once_still_refuse_what_the_parser_refuses():
    """entry_name keeps the names it made: a bool or float index equal to one it has seen is
    refused all the same, and each base, head and width gets its own name."""
    import pytest

    assert printing.entry_name("x", 1, 1) == "x_{11}"
    for bad in (True, 1.0):
        with pytest.raises(ValueError):
            printing.entry_name("x", bad, 1)
    assert printing.entry_name("x", 1, 10) == "x_{1,10}"
    assert printing.entry_name("x", 1, 1, 2) == "x^{(2)}_{11}"
    assert printing.entry_name("x", 1, 1, wide=True) == "x_{1,1}"
    assert printing.entry_name("alpha", 1, 1) == "\\alpha_{11}"


def test_numbers():
    # -1e-9 is not 0: it prints as 0.0000 (rounded), never as an exact 0 (issue 22)
    assert [printing.tex_number(x, 4) for x in (0.64565631, -0.0, -1e-9, 3.0, 2.5)] == ["0.6457", "0", "0.0000", "3", "2.5"]
    assert printing.tex_number(0.99995, 4) == "1.0000" and printing.tex_number(1.0, 4) == "1"
    assert printing.plain_number(float("-inf"), 4) == "-inf"


def test_elision_formats_only_shown_entries():
    big = np.arange(1000 * 1000, dtype=float).reshape(1000, 1000)
    printing.STATS["entries"] = 0
    tex = TexOut(4, 8).matrix(big, big.shape)
    assert printing.STATS["entries"] == 64
    assert "\\vdots" in tex and "\\cdots" in tex and "\\ddots" in tex and "999999" in tex
    assert "..." in PlainOut(4, 4).matrix(big, big.shape)
