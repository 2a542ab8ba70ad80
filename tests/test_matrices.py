"""Tests for attntrace.inputs.matrices.to_matrix: raw input -> matrix in one mode."""

from __future__ import annotations

import math
import time
from fractions import Fraction

import numpy as np
import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sympy import ImmutableMatrix, Integer, Rational, Symbol

from attntrace.model.errors import BadInput
from attntrace.inputs.expr import parse_expr
from attntrace.inputs.matrices import MAX_SYMBOLIC_ENTRIES, to_matrix

FAST = settings(max_examples=50, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def tm(raw, mode, **kw):
    kw.setdefault("name", "X")
    return to_matrix(raw, mode=mode, **kw)


# ---------------------------------------------------------------------------------------
# numeric


def test_numeric_lists():
    value, shape, symbol = tm([[1, 2.5], [3, -4]], "numeric")
    assert shape == (2, 2) and symbol is None
    assert value.dtype == np.float64
    np.testing.assert_array_equal(value, [[1, 2.5], [3, -4]])
    assert not value.flags.writeable
    with pytest.raises(ValueError):
        value[0, 0] = 9


def test_flat_list_is_one_row():
    value, shape, _ = tm([1, 2, 3], "numeric")
    assert shape == (1, 3)
    np.testing.assert_array_equal(value, [[1, 2, 3]])
    assert tm((4,), "numeric")[1] == (1, 1)
    assert tm([[1], [2]], "numeric")[1] == (2, 1)


def test_numeric_strings_and_mixed():
    value, shape, _ = tm([["1/4", "-0.5", "sqrt(4)"], [1, 2.0, "exp(0)"]], "numeric")
    np.testing.assert_array_equal(value, [[0.25, -0.5, 2.0], [1, 2, 1]])
    value, _, _ = tm([["sqrt(2)"]], "numeric")
    assert value[0, 0] == pytest.approx(math.sqrt(2))


def test_numeric_other_number_types():
    raw = [[np.float32(0.5), np.int64(3), Fraction(1, 4), Integer(2), Rational(1, 8), sympy.sqrt(4)]]
    value, _, _ = tm(raw, "numeric")
    np.testing.assert_array_equal(value, [[0.5, 3, 0.25, 2, 0.125, 2]])


def test_numeric_numpy_and_sympy():
    a = np.arange(6).reshape(2, 3)
    value, shape, _ = tm(a, "numeric")
    assert shape == (2, 3) and value.dtype == np.float64 and not value.flags.writeable
    assert a.flags.writeable  # the caller's array is not frozen
    value, shape, _ = tm(np.array([1.0, 2.0]), "numeric")
    assert shape == (1, 2)
    value, shape, _ = tm(sympy.Matrix([[1, Rational(1, 2)]]), "numeric")
    np.testing.assert_array_equal(value, [[1, 0.5]])
    value, _, _ = tm(np.array([["1/2", "3"]]), "numeric")
    np.testing.assert_array_equal(value, [[0.5, 3]])
    value, _, _ = tm([np.array([1, 2]), np.array([3, 4])], "numeric")
    np.testing.assert_array_equal(value, [[1, 2], [3, 4]])


def test_numeric_fast_path():
    rng = np.random.default_rng(0)
    raw = rng.standard_normal((768, 768)).tolist()
    start = time.perf_counter()
    value, shape, _ = tm(raw, "numeric")
    assert time.perf_counter() - start < 0.5
    assert shape == (768, 768)
    assert value[5, 7] == raw[5][7]
    start = time.perf_counter()
    assert tm(raw, "shape") == (None, (768, 768), None)
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize(
    "raw, message",
    [
        ([[1, float("nan")]], "X[1,2] is nan; inputs must be finite"),
        ([[1], [float("inf")]], "X[2,1] is inf; inputs must be finite"),
        ([[1], [-math.inf]], "X[2,1] is -inf; inputs must be finite"),
        (np.array([[1.0, np.nan]]), "X[1,2] is nan"),
        ([["1e400"]], "X[1,1] is inf"),
        ([[10**400]], "X[1,1] is too large"),
        ([[True, 1]], "X[1,1] is a boolean"),
        ([[1, np.bool_(False)]], "X[1,2] is a boolean"),
        (np.array([[True]]), "boolean array"),
        (np.array([[1j]]), "complex array"),
        ([[1, "x"]], "X[1,2] is 'x', which has symbols; numeric mode needs numbers"),
        ([[1, "2 +* 3"]], 'X[1,2]: bad expression "2 +* 3"'),
        ([["exp(" * 18 + "1" + ")" * 18]], "exp of a number larger than 1000"),
        ([["exp(710)"]], "X[1,1] is inf; inputs must be finite"),
        ([[1, None]], "X[1,2] is missing"),
        ([[1, {1}]], "nests deeper than 2-D"),
        ([[1, object()]], "X[1,2] has unsupported type object"),
        ([[Symbol("x")]], "not a number"),
        ({"symbol": "x", "shape": [2, 2]}, "X is a symbol table; numeric mode needs numbers — use --mode symbolic or shape"),
        (sympy.Matrix([[sympy.I]]), "not a real number"),
    ],
)
def test_numeric_errors(raw, message):
    with pytest.raises(BadInput) as info:
        tm(raw, "numeric")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@FAST
@given(
    st.integers(1, 5).flatmap(
        lambda cols: st.lists(
            st.lists(
                st.one_of(st.integers(-(10**6), 10**6), st.floats(allow_nan=False, allow_infinity=False, width=64)),
                min_size=cols,
                max_size=cols,
            ),
            min_size=1,
            max_size=5,
        )
    )
)
def test_numeric_matches_numpy(rows):
    value, shape, _ = tm(rows, "numeric")
    assert shape == (len(rows), len(rows[0]))
    np.testing.assert_array_equal(value, np.array(rows, dtype=np.float64))


# ---------------------------------------------------------------------------------------
# exact and symbolic


@pytest.mark.parametrize("mode", ["exact", "symbolic"])
def test_exact_values(mode):
    value, shape, symbol = tm([[1, 0.1, "1/3"], ["x^Q_1", -2.5, "sqrt(8)"]], mode)
    assert isinstance(value, ImmutableMatrix) and shape == (2, 3) and symbol is None
    assert value.tolist() == [
        [Integer(1), Rational(1, 10), Rational(1, 3)],
        [Symbol("x^{Q}_{1}"), Rational(-5, 2), 2 * sympy.sqrt(2)],
    ]
    assert not any(e.atoms(sympy.Float) for e in value)


def test_exact_other_inputs():
    value, _, _ = tm(np.array([[0.25, 1.5]]), "exact")
    assert value.tolist() == [[Rational(1, 4), Rational(3, 2)]]
    value, _, _ = tm(np.array([[2, 3]]), "exact")
    assert value.tolist() == [[2, 3]] and all(isinstance(e, Integer) for e in value)
    value, _, _ = tm([[Fraction(2, 3), np.int32(4), np.float64(0.5)]], "exact")
    assert value.tolist() == [[Rational(2, 3), 4, Rational(1, 2)]]
    m = sympy.Matrix([[Symbol("a") + sympy.Float(0.5), Rational(1, 7)]])
    value, _, _ = tm(m, "symbolic")
    assert value.tolist() == [[Symbol("a") + Rational(1, 2), Rational(1, 7)]]


@FAST
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=1, max_size=6))
def test_exact_floats_are_their_repr(row):
    value, shape, _ = tm(row, "exact")
    assert shape == (1, len(row))
    for f, e in zip(row, value):
        assert isinstance(e, Rational)
        assert float(e) == f
        assert e == Rational(Fraction(repr(f)).numerator, Fraction(repr(f)).denominator)


def test_symbol_table_symbolic():
    value, shape, symbol = tm({"symbol": "w^Q", "shape": [2, 3]}, "symbolic", name="W_Q")
    assert shape == (2, 3) and symbol == "w^{Q}"
    assert value[1, 2] == Symbol("w^{Q}_{23}")
    value, shape, symbol = tm({"shape": [1, 2]}, "exact", default_symbol="v")
    assert value.tolist() == [[Symbol("v_{11}"), Symbol("v_{12}")]] and symbol == "v"


def test_symbol_table_heads_and_wide():
    value, _, symbol = tm({"symbol": "w^{Q}", "shape": (2, 2)}, "symbolic", head=2)
    assert symbol == "w^{Q}" and value[0, 1] == Symbol("w^{Q(2)}_{12}")  # symbol: base without head
    value, shape, symbol = tm({"shape": [12, 2]}, "symbolic", default_symbol="z", head=3)
    assert shape == (12, 2) and symbol == "z"
    assert value[0, 0] == Symbol("z^{(3)}_{1,1}") and value[11, 1] == Symbol("z^{(3)}_{12,2}")
    for e in value:  # every name parses back to itself
        assert parse_expr(str(e)) == e


def test_symbol_table_shape_mode():
    assert tm({"symbol": "x", "shape": [100, 3]}, "shape") == (None, (100, 3), "x")
    assert tm({"shape": [10**6, 10**6]}, "shape", default_symbol="x") == (None, (10**6, 10**6), "x")


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"symbol": "x", "shape": [2, 2], "values": 1}, "X: unknown key 'values' in symbol table"),
        ({"symbol": "x"}, 'needs "shape"'),
        ({"symbol": "x", "shape": [2]}, '"shape" must be two positive integers'),
        ({"symbol": "x", "shape": [2, 0]}, "two positive integers"),
        ({"symbol": "x", "shape": [2, -1]}, "two positive integers"),
        ({"symbol": "x", "shape": [2, 1.5]}, "two positive integers"),
        ({"symbol": "x", "shape": [True, 2]}, "two positive integers"),
        ({"symbol": "x", "shape": "2x2"}, "two positive integers"),
        ({"shape": [2, 2]}, 'needs a "symbol"'),
        ({"symbol": "x_1", "shape": [2, 2]}, 'X: bad symbol name "x_1"'),
        ({"symbol": "__import__('os')", "shape": [2, 2]}, "bad symbol name"),
        ({"symbol": 3, "shape": [2, 2]}, "must be text"),
        ({"symbol": "v", "shape": [200, 100]}, "X is 200x100 (20000 entries): too large for symbolic mode"),
    ],
)
def test_symbol_table_errors(raw, message):
    with pytest.raises(BadInput) as info:
        tm(raw, "symbolic")
    assert message in str(info.value)


def test_symbolic_size_limit():
    side = int(MAX_SYMBOLIC_ENTRIES**0.5)
    tm({"symbol": "v", "shape": [side, side]}, "symbolic")  # exactly at the limit
    with pytest.raises(BadInput, match="use --mode shape or numeric"):
        tm([[0] * 101] * 100, "exact")
    with pytest.raises(BadInput, match="too large"):
        tm(np.zeros((101, 100)), "symbolic")
    assert tm(np.zeros((101, 100)), "numeric")[1] == (101, 100)


@pytest.mark.parametrize(
    "raw, message",
    [
        ([[1, 2], [3, sympy.nan]], "X[2,2]"),
        ([[sympy.oo]], "inputs must be finite"),
        ([["oo"]], "infinity"),
        ([[float("nan")]], "X[1,1] is nan"),
        ([[sympy.I]], "not a real number"),
        ([[sympy.true]], "not a number"),
        ([[True]], "boolean"),
        ([["2a"]], 'X[1,1]: bad expression "2a"'),
    ],
)
def test_exact_errors(raw, message):
    with pytest.raises(BadInput) as info:
        tm(raw, "exact")
    assert message in str(info.value)


# ---------------------------------------------------------------------------------------
# shape mode


def test_shape_mode():
    assert tm([[1, 2, 3], [4, 5, 6]], "shape") == (None, (2, 3), None)
    assert tm([["not parsed", "??"]], "shape") == (None, (1, 2), None)
    assert tm([1, 2], "shape") == (None, (1, 2), None)
    assert tm(np.zeros((4, 5)), "shape") == (None, (4, 5), None)
    assert tm(np.zeros(5), "shape") == (None, (1, 5), None)
    assert tm(sympy.zeros(3, 2), "shape") == (None, (3, 2), None)


# ---------------------------------------------------------------------------------------
# structural errors (all modes)


@pytest.mark.parametrize(
    "raw, message",
    [
        ([[1, 2, 3], [4, 5]], "X has ragged rows: row 1 has 3 entries, row 2 has 2"),
        ([[1], [2], [3, 4]], "row 1 has 1 entries, row 3 has 2"),
        ([], "X is empty"),
        ([[]], "X is empty: row 1 has no entries"),
        ([[1], []], "row 2 has no entries"),
        (np.zeros((0, 3)), "X is empty"),
        (np.zeros(0), "X is empty"),
        (sympy.zeros(0, 2), "X is empty"),
        ([1, [2]], "X is not 2-D: item 2 is a row but item 1 is 1"),
        ([[1], 2], "item 1 is a row but item 2 is 2"),
        ([[[1, 2]]], "X nests deeper than 2-D: X[1,1] is a list"),
        ([[1, (2,)]], "X[1,2] is a tuple"),
        ([{"shape": [1, 1]}], "X[1,1] is a dict"),
        (np.zeros((2, 2, 2)), "must be 2-D"),
        (3, "X must be a list of rows"),
        ("[[1, 2]]", "got str"),
        (None, "got NoneType"),
    ],
)
def test_structure_errors(raw, message):
    for mode in ("numeric", "exact", "symbolic", "shape"):
        with pytest.raises(BadInput) as info:
            tm(raw, mode)
        assert message in str(info.value), mode
        assert "\n" not in str(info.value)


def test_head_in_messages():
    with pytest.raises(BadInput, match=r"^W_Q of head 2 has ragged rows"):
        to_matrix([[1, 2], [3]], mode="numeric", name="W_Q", head=2)
    with pytest.raises(BadInput, match=r"^W_Q of head 2 has ragged rows"):  # not "of head 2 of head 2"
        to_matrix([[1, 2], [3]], mode="numeric", name="W_Q of head 2", head=2)
    with pytest.raises(BadInput, match=r"^W_Q\[1,2\] of head 2 is nan"):
        to_matrix([[1, float("nan")]], mode="numeric", name="W_Q", head=2)


def test_unknown_mode():
    with pytest.raises(BadInput, match="unknown mode 'fast'"):
        tm([[1]], "fast")


def test_injection_in_entries(tmp_path):
    marker = tmp_path / "pwned"
    evil = f"__import__('os').system('touch {marker}')"
    for mode in ("numeric", "exact", "symbolic"):
        with pytest.raises(BadInput):
            tm([[evil]], mode)
        with pytest.raises(BadInput):
            tm({"symbol": evil, "shape": [1, 1]}, mode)
    assert tm([[evil]], "shape") == (None, (1, 1), None)  # shape mode never reads entries
    assert not marker.exists()


def test_numeric_and_shape_modes_do_not_import_sympy():
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, numpy as np\n"
        "from attntrace.inputs.matrices import to_matrix\n"
        "from attntrace.inputs.expr import entry_name, parse_symbol_base\n"
        "to_matrix([[1, 2.5]], mode='numeric', name='X')\n"
        "to_matrix(np.eye(2), mode='numeric', name='X')\n"
        "to_matrix({'shape': [2, 2]}, mode='shape', name='X', default_symbol='v')\n"
        "for bad in ([[1, None]], [[1], [2, 3]], {'shape': [1, 1]}):\n"
        "    try: to_matrix(bad, mode='numeric', name='X')\n"
        "    except ValueError: pass\n"
        "assert entry_name(parse_symbol_base('w^Q'), 1, 2, head=2) == 'w^{Q(2)}_{12}'\n"
        "assert 'sympy' not in sys.modules, 'sympy was imported'\n"
    )
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_read_only_float64_arrays_are_kept_writable_ones_copied():
    """Frozen weights are trusted as they are (no 19 MB copy per BERT layer); a writable
    array is copied, so changing it later cannot change the trace."""
    import attntrace

    frozen = np.eye(2)
    frozen.setflags(write=False)
    live = np.array([[1.0, 2.0], [3.0, 4.0]])
    t = attntrace.run({"Q": live, "K": frozen, "V": frozen})
    live[0, 0] = 99.0
    assert t.operand("Q").value[0, 0] == 1.0
    assert t.operand("K").value is frozen
    huge = np.full((2, 2), 1e308)  # the sum overflows, every entry is finite
    assert to_matrix(huge, mode="numeric", name="X")[0][0, 0] == 1e308
