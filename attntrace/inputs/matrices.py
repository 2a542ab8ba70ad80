"""Raw matrix input -> a matrix in one mode.

`to_matrix` accepts what a spec file or a Python caller writes for a matrix:

- a list of rows (lists/tuples) of numbers or entry strings; a flat list is ONE ROW
  (1, n), which is how bias row vectors are written;
- a numpy array (2-D, or 1-D meaning one row);
- a SymPy matrix;
- a symbol table ``{"symbol": "v", "shape": [2, 3]}`` ("symbol" optional, "shape" required).

and returns ``(value, shape, symbol)`` in the requested mode:

- numeric: read-only float64 ndarray; entries must be finite numbers (strings are parsed
  with the whitelist parser and must not contain symbols);
- exact / symbolic: ``sympy.ImmutableMatrix`` of exact values (floats become the rational
  of their shortest repr, 0.1 -> 1/10; strings may contain symbols); a symbol table becomes
  the matrix of its entry names ``v_{11}``, ``w^{Q(2)}_{1,1}`` (see `expr.entry_name`);
  at most 10,000 entries;
- shape: value None; only the dimensions are read (entries are not parsed).

`symbol` is the canonical base name of a symbol table (``w^Q`` -> ``w^{Q}``), WITHOUT the
head: the entries are ``entry_name(symbol, i, j, head=head)``. It is None for other inputs.

Every problem is a one-line `BadInput` naming the input ("W_Q of head 2", "X[2,1] of head
2"); a `name` that already ends in " of head 2" is not suffixed twice.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import sys
import weakref
from collections.abc import Mapping
from numbers import Integral, Rational as _PyRational, Real
from typing import TYPE_CHECKING, Any

import numpy as np

from attntrace.inputs import limits
from attntrace.model.errors import BadInput
from attntrace.inputs.safetext import check_sympy_entry
from attntrace.inputs.expr import entry_name, parse_expr, parse_symbol_base
from attntrace.model.trace import MODES

if TYPE_CHECKING:  # SymPy is imported only for exact/symbolic work: numeric mode never loads it
    import sympy

__all__ = ["MAX_SYMBOLIC_ENTRIES", "copies_in_one", "to_matrix"]

#: Largest matrix (in entries) built as a SymPy matrix in exact and symbolic mode by default
#: (`attntrace.inputs.limits`, exact_entries, sets the one in force).
MAX_SYMBOLIC_ENTRIES = limits.DEFAULTS["exact_entries"]

_TABLE_KEYS = ("symbol", "shape")
_SEQUENCES = (list, tuple)
_NESTED = (list, tuple, dict, set, np.ndarray)
_FAST_TYPES = frozenset({int, float, np.float64, np.float32, np.int64, np.int32})


def _loaded_sympy():
    """The sympy module if something already imported it, else None (then no value is SymPy's)."""
    return sys.modules.get("sympy")


def _is_sympy(v: Any, kind: str = "Basic") -> bool:
    sp = _loaded_sympy()
    return sp is not None and isinstance(v, getattr(sp, kind))


def _nested(v: Any) -> bool:
    return isinstance(v, _NESTED) or _is_sympy(v, "MatrixBase")


class _Label:
    """How errors name the input: "W_Q of head 2", "W_Q[1,2] of head 2"."""

    def __init__(self, name: str, head: int | None) -> None:
        suffix = f" of head {head}" if head is not None else ""
        if suffix and name.endswith(suffix):  # the caller already named the head
            name = name[: -len(suffix)]
        self.name = name
        self.suffix = suffix

    def __str__(self) -> str:
        return self.name + self.suffix

    def at(self, i: int, j: int) -> str:
        """Entry (i, j), 0-based in, 1-based out."""
        return f"{self.name}[{i + 1},{j + 1}]{self.suffix}"


def to_matrix(
    raw: Any,
    *,
    mode: str,
    name: str,
    default_symbol: str | None = None,
    head: int | None = None,
    copy: bool = True,
) -> tuple[Any, tuple[int, int], str | None]:
    """Convert one raw matrix input to (value, shape, symbol) in `mode` (see module docstring).

    copy=False: a writable float64 array is kept as a read-only view of the caller's memory
    (no copy), for a caller who promises not to change it while the trace lives."""
    if mode not in MODES:
        raise BadInput(f"unknown mode {mode!r} (choose one of {', '.join(MODES)})")
    label = _Label(name, head)
    if isinstance(raw, Mapping):
        return _from_table(raw, mode, label, default_symbol, head)
    if isinstance(raw, np.ndarray):
        return _from_array(raw, mode, label, copy)
    if _is_sympy(raw, "MatrixBase"):
        shape = tuple(int(k) for k in raw.shape)
        if 0 in shape:
            raise BadInput(f"{label} is empty ({shape[0]}x{shape[1]})")
        if mode == "shape":
            return None, shape, None
        return _convert_rows(raw.tolist(), shape, mode, label)
    if isinstance(raw, _SEQUENCES):
        rows, shape = _rows_of(raw, label)
        if mode == "shape":
            return None, shape, None
        return _convert_rows(rows, shape, mode, label)
    raise BadInput(
        f"{label} must be a list of rows, an array or a symbol table "
        f'{{"symbol": ..., "shape": [rows, cols]}}; got {type(raw).__name__}'
    )


# ---------------------------------------------------------------------------------------
# structure


def _rows_of(raw: list | tuple, label: _Label) -> tuple[list, tuple[int, int]]:
    """Validate 2-D nesting; return the rows (a flat list is one row) and the shape."""
    if len(raw) == 0:
        raise BadInput(f"{label} is empty")
    is_row = [isinstance(r, _SEQUENCES) or (isinstance(r, np.ndarray) and r.ndim == 1) for r in raw]
    if not any(is_row):
        rows = [raw]
    elif all(is_row):
        rows = [r.tolist() if isinstance(r, np.ndarray) else r for r in raw]
    else:
        r, k = is_row.index(True), is_row.index(False)
        raise BadInput(f"{label} is not 2-D: item {r + 1} is a row but item {k + 1} is {_brief(raw[k])}")
    width = len(rows[0])
    for i, row in enumerate(rows):
        if len(row) == 0:
            raise BadInput(f"{label} is empty: row {i + 1} has no entries")
        if len(row) != width:
            raise BadInput(f"{label} has ragged rows: row 1 has {width} entries, row {i + 1} has {len(row)}")
        if not _FAST_TYPES.issuperset(map(type, row)):
            for j, v in enumerate(row):
                if _nested(v):
                    raise BadInput(f"{label} nests deeper than 2-D: {label.at(i, j)} is a {type(v).__name__}")
    return rows, (len(rows), width)


def _brief(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 30 else text[:27] + "..."


def _check_size(shape: tuple[int, int], mode: str, label: _Label) -> None:
    n = shape[0] * shape[1]
    name = "numeric_entries" if mode == "numeric" else "exact_entries"
    if n > limits.get(name):
        how = "use --mode shape" if mode == "numeric" else "use --mode shape or numeric"
        raise limits.refuse(f"{label} is {shape[0]}x{shape[1]} ({n} entries): too large for {mode} mode; {how}", name)


def _check_int(v: int, where: str) -> None:
    digits = limits.get("digits")
    if abs(v).bit_length() > 3 * digits and len(str(abs(v))) > digits:
        raise limits.refuse(f"{where} has more than {digits} digits", "digits")


# ---------------------------------------------------------------------------------------
# symbol tables


def _from_table(raw: Mapping, mode: str, label: _Label, default_symbol: str | None, head: int | None):
    for key in raw:
        if key not in _TABLE_KEYS:
            raise BadInput(f'{label}: unknown key {key!r} in symbol table (allowed: "symbol", "shape")')
    if "shape" not in raw:
        raise BadInput(f'{label}: symbol table needs "shape": [rows, cols]')
    shape = raw["shape"]
    if (
        not isinstance(shape, (_SEQUENCES, np.ndarray))
        or len(shape) != 2
        or not all(isinstance(k, Integral) and not isinstance(k, (bool, np.bool_)) and k > 0 for k in shape)
    ):
        raise BadInput(
            f'{label}: symbol table "shape" must be two positive integers [rows, cols], got {_brief(shape)}'
        )
    shape = (int(shape[0]), int(shape[1]))
    if mode == "numeric":
        raise BadInput(
            f"{label} is a symbol table; numeric mode needs numbers — use --mode symbolic or shape"
        )
    symbol = raw.get("symbol", default_symbol)
    if symbol is None:
        raise BadInput(f'{label}: symbol table needs a "symbol" (a base name such as v or w^Q)')
    try:
        base = parse_symbol_base(symbol)
    except BadInput as exc:
        raise BadInput(f"{label}: {exc}") from None
    if mode == "shape":
        return None, shape, base
    _check_size(shape, mode, label)
    import sympy

    wide = max(shape) >= 10
    value = sympy.ImmutableMatrix(
        shape[0],
        shape[1],
        [sympy.Symbol(entry_name(base, i, j, head=head, wide=wide))
         for i in range(1, shape[0] + 1) for j in range(1, shape[1] + 1)],
    )  # fmt: skip
    return value, shape, base


# ---------------------------------------------------------------------------------------
# arrays and rows


def _from_array(raw: np.ndarray, mode: str, label: _Label, copy: bool = True):
    given = raw  # a 1-D row is reshaped below; its place in `copies_in_one` goes by the array given
    if raw.ndim == 1:
        raw = raw.reshape(1, -1)
    if raw.ndim != 2:
        raise BadInput(f"{label} must be 2-D (or 1-D for one row); got a {raw.ndim}-D array")
    if raw.size == 0:
        raise BadInput(f"{label} is empty ({raw.shape[0]}x{raw.shape[1]})")
    shape = (int(raw.shape[0]), int(raw.shape[1]))
    if mode == "shape":
        return None, shape, None
    kind = raw.dtype.kind
    if kind == "b":
        raise BadInput(f"{label} is a boolean array; entries must be numbers")
    if kind == "c":
        raise BadInput(f"{label} is a complex array; entries must be real numbers")
    if mode == "numeric" and kind in "iuf":
        # A writable array is copied (once, straight into float64) so that the trace cannot
        # change behind its back; an array that is already read-only float64 (frozen model
        # weights, another trace's values) is kept as it is: copying 19 MB of BERT weights
        # costs more than the whole attention. Being trusted not to change, it is also
        # checked for non-finite entries only once. copy=False: the caller's promise makes a
        # writable float64 array trusted too, kept as a read-only view (its own flag unchanged).
        if raw.dtype == np.float64 and (not raw.flags.writeable or not copy):
            if not raw.flags.writeable and _FINITE.get(id(raw), _dead)() is raw:
                return raw, shape, None
            value = raw if not raw.flags.writeable else raw.view()
            _check_finite_input(value, label)
            value.setflags(write=False)
            if not raw.flags.writeable:
                _FINITE[id(raw)] = weakref.ref(raw, lambda _, key=id(raw): _FINITE.pop(key, None))
            return value, shape, None
        return _copy_float64(raw, label, _reserved(given)), shape, None
    if kind not in "iufOUS":
        raise BadInput(f"{label} has unsupported array type {raw.dtype}")
    return _convert_rows(raw.tolist(), shape, mode, label)


#: Rows per slice of a checked copy: about 256 KB, so each slice is summed while still in cache.
_SLICE_BYTES = 1 << 18


def _copy_float64(raw: np.ndarray, label: _Label, into: np.ndarray | None = None) -> np.ndarray:
    """The one copy of a numeric input, in float64, read-only, its entries checked finite.
    Copied a slice of rows at a time and each slice summed while it is in cache, so the check
    costs no second pass over memory. A wider float (longdouble) goes through `_as_float64`.
    `into`: the place reserved for it (`copies_in_one`), raw.size float64 entries."""
    if raw.dtype.kind == "f" and raw.dtype.itemsize > 8:
        return _finish_numeric(_as_float64(raw, label), label)
    out = np.empty(raw.shape, dtype=np.float64) if into is None else into.reshape(raw.shape)
    step = max(1, _SLICE_BYTES // (8 * raw.shape[1]))
    total = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for r in range(0, raw.shape[0], step):
            part = out[r:r + step]
            np.copyto(part, raw[r:r + step], casting="unsafe")
            total += float(np.add.reduce(part, axis=None))
    if not math.isfinite(total):
        _check_finite_input(out, label)
    out.setflags(write=False)
    return out


def _check_finite_input(a: np.ndarray, label: _Label) -> None:
    """Refuse, naming the entry, an input with an infinite or NaN entry (one sum when all are finite)."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(np.add.reduce(a, axis=None))
    if math.isfinite(total):
        return
    finite = np.isfinite(a)
    if not finite.all():
        i, j = (int(k) for k in np.argwhere(~finite)[0])
        raise BadInput(f"{label.at(i, j)} is {a[i, j]}; inputs must be finite")


def _as_float64(raw: np.ndarray, label: _Label) -> np.ndarray:
    """A copy in float64. A wider float (longdouble) beyond float64's range is refused here,
    in one line naming the entry, instead of NumPy's RuntimeWarning and an "inf"."""
    if raw.dtype.kind != "f" or raw.dtype.itemsize <= 8:
        return np.array(raw, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        out = np.array(raw, dtype=np.float64)
    lost = np.isfinite(raw) & ~np.isfinite(out)
    if lost.any():
        i, j = (int(k) for k in np.argwhere(lost)[0])
        raise BadInput(f"{label.at(i, j)} is {str(raw[i, j])}, beyond the range of a 64-bit float; inputs must be finite")
    return out


# ---------------------------------------------------------------------------------------
# one allocation for the copies of a spec


def will_copy(a: Any, copy: bool = True) -> bool:
    """Whether numeric mode copies the array `a` (`_from_array`): a writable one, or one that is
    not float64 (converted); not a read-only float64 array, nor a writable one with copy=False."""
    return (isinstance(a, np.ndarray) and a.ndim in (1, 2) and a.size > 0 and a.dtype.kind in "iuf"
            and a.dtype.itemsize <= 8 and (a.dtype != np.float64 or (copy and a.flags.writeable)))


def _arrays_in(value: Any, copy: bool, found: list, depth: int = 0) -> None:
    """The arrays of a spec that numeric mode will copy: values of its tables, at any depth a
    spec nests them (heads, norm1, ffn, experts), and 2-D arrays in a list (Z); not the 1-D
    rows of a matrix written as a list (those are read as rows, never as arrays)."""
    if depth > 6:
        return
    if isinstance(value, np.ndarray):
        if will_copy(value, copy):
            found.append(value)
    elif isinstance(value, Mapping):
        for v in value.values():
            _arrays_in(v, copy, found, depth + 1)
    elif isinstance(value, _SEQUENCES) and value and isinstance(value[0], (Mapping, np.ndarray)):
        for v in value:
            if isinstance(v, Mapping) or (isinstance(v, np.ndarray) and v.ndim == 2):
                _arrays_in(v, copy, found, depth + 1)


class _Reserved:
    """One float64 allocation with a place for the copy of each array found (`copies_in_one`)."""

    __slots__ = ("_buffer", "_places")

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self._places: dict[int, tuple[int, int]] = {}
        total = 0
        for a in arrays:
            if id(a) not in self._places:  # the same array under two keys: copied twice, one place reserved
                self._places[id(a)] = (total, a.size)
                total += -(-a.size // 8) * 8  # each copy starts on a 64-byte boundary of the buffer
        self._buffer = np.empty(total, dtype=np.float64)

    def take(self, a: np.ndarray) -> np.ndarray | None:
        """The place reserved for `a` (given out once), or None."""
        place = self._places.pop(id(a), None)
        if place is None or place[1] != a.size:
            return None
        start, size = place
        return self._buffer[start:start + size]


_RESERVED: contextvars.ContextVar[_Reserved | None] = contextvars.ContextVar("attntrace_reserved_copies", default=None)

#: Below this many bytes of copies in all, each copy is an allocation of its own.
ONE_ALLOCATION_BYTES = 1 << 22


@contextlib.contextmanager
def copies_in_one(spec: Any, copy: bool = True):
    """While a spec is read in numeric mode, the copies of its arrays go into ONE allocation,
    reserved up front for the arrays the spec holds (when they add up to 4 MB or more).

    Why: a fresh array costs its page faults more than the copying. The four 768 x 768 weights
    of a BERT-base layer (19 MB) take 1.6 ms to copy into memory already mapped and 6.6 ms into
    four fresh arrays. One allocation is one mapping, which NumPy asks the kernel to back with
    huge pages (an array of 4 MB or more): 1.9 ms with its faults. The copies live as long as
    any of them (a trace holds all of its operands anyway)."""
    found: list[np.ndarray] = []
    _arrays_in(spec, copy, found)
    if len(found) < 2 or 8 * sum(a.size for a in found) < ONE_ALLOCATION_BYTES:
        yield
        return
    token = _RESERVED.set(_Reserved(found))
    try:
        yield
    finally:
        _RESERVED.reset(token)


def _reserved(a: np.ndarray) -> np.ndarray | None:
    reserved = _RESERVED.get()
    return None if reserved is None else reserved.take(a)


#: Read-only float64 arrays already found finite, by id (a weak reference each: an entry goes
#: when its array does, so a new array at the same address is checked again).
_FINITE: dict[int, "weakref.ref"] = {}


def _dead():
    return None


def _convert_rows(rows: list, shape: tuple[int, int], mode: str, label: _Label):
    if mode == "numeric":
        _check_size(shape, mode, label)
        if all(_FAST_TYPES.issuperset(map(type, row)) for row in rows):
            try:
                return _finish_numeric(np.array(rows, dtype=np.float64), label), shape, None
            except OverflowError:
                pass  # an int too large for a float: the slow path names the entry
        out = np.empty(shape, dtype=np.float64)
        for i, row in enumerate(rows):
            for j, v in enumerate(row):
                out[i, j] = _to_float(v, label, i, j)
        return _finish_numeric(out, label), shape, None
    import sympy

    _check_size(shape, mode, label)
    entries = [_to_exact(v, label, i, j) for i, row in enumerate(rows) for j, v in enumerate(row)]
    return sympy.ImmutableMatrix(shape[0], shape[1], entries), shape, None


def _finish_numeric(a: np.ndarray, label: _Label) -> np.ndarray:
    """A fresh float64 array (this module's own): checked finite, then made read-only."""
    _check_finite_input(a, label)
    a.setflags(write=False)
    return a


# ---------------------------------------------------------------------------------------
# entries


def _refuse_entry(v: Any, label: _Label, i: int, j: int) -> None:
    where = label.at(i, j)
    if isinstance(v, (bool, np.bool_)):
        raise BadInput(f"{where} is a boolean ({v}); entries must be numbers")
    if _nested(v):
        raise BadInput(f"{label} nests deeper than 2-D: {where} is a {type(v).__name__}")
    if v is None:
        raise BadInput(f"{where} is missing (None); entries must be numbers")
    raise BadInput(f"{where} has unsupported type {type(v).__name__} ({_brief(v)}); entries must be numbers")


def _to_float(v: Any, label: _Label, i: int, j: int) -> float:
    where = label.at(i, j)
    if isinstance(v, (bool, np.bool_)):
        _refuse_entry(v, label, i, j)
    if isinstance(v, (Real, np.integer, np.floating)) and not _is_sympy(v):
        try:
            f = float(v)
        except OverflowError:
            raise BadInput(f"{where} is too large for a float; inputs must be finite") from None
    elif isinstance(v, str):
        e = _parse_entry(v, where)
        if e.free_symbols:
            raise BadInput(
                f"{where} is {v.strip()!r}, which has symbols; numeric mode needs numbers — "
                "use --mode exact or symbolic"
            )
        f = _sympy_float(e, where)
    elif _is_sympy(v):
        if not _is_sympy(v, "Expr") or not v.is_number:
            raise BadInput(f"{where} is {_brief(v)}, not a number; numeric mode needs numbers")
        f = _sympy_float(v, where)
    else:
        _refuse_entry(v, label, i, j)
    if not math.isfinite(f):
        raise BadInput(f"{where} is {f}; inputs must be finite")
    return f


def _sympy_float(e: sympy.Expr, where: str) -> float:
    try:
        c = complex(e)
    except (TypeError, ValueError, OverflowError):
        raise BadInput(f"{where} is {_brief(e)}, not a real number") from None
    if c.imag != 0:
        raise BadInput(f"{where} is {_brief(e)}, not a real number")
    return c.real


def _parse_entry(text: str, where: str) -> sympy.Expr:
    try:
        return parse_expr(text)
    except BadInput as exc:
        raise BadInput(f"{where}: {exc}") from None


def _rational_of_float(f: float, where: str) -> sympy.Rational:
    if not math.isfinite(f):
        raise BadInput(f"{where} is {f}; inputs must be finite")
    from fractions import Fraction

    import sympy

    q = Fraction(repr(f))
    return sympy.Rational(q.numerator, q.denominator)


def _to_exact(v: Any, label: _Label, i: int, j: int) -> sympy.Expr:
    import sympy

    where = label.at(i, j)
    if isinstance(v, (bool, np.bool_)):
        _refuse_entry(v, label, i, j)
    if isinstance(v, (int, np.integer)):
        _check_int(int(v), where)
        return sympy.Integer(int(v))
    if isinstance(v, (float, np.floating)):
        return _rational_of_float(float(v), where)
    if isinstance(v, _PyRational) and not isinstance(v, sympy.Basic):  # fractions.Fraction
        _check_int(int(v.numerator), where)
        _check_int(int(v.denominator), where)
        return sympy.Rational(int(v.numerator), int(v.denominator))
    if isinstance(v, str):
        return _parse_entry(v, where)
    if isinstance(v, sympy.Basic):
        return _exact_sympy(v, where)
    _refuse_entry(v, label, i, j)


def _exact_sympy(v: sympy.Basic, where: str) -> sympy.Expr:
    import sympy

    if not isinstance(v, sympy.Expr) or isinstance(v, sympy.MatrixBase):
        raise BadInput(f"{where} is {_brief(v)}, not a number or expression")
    check_sympy_entry(v, where)  # from the Python API: only what a spec could have written (names, functions)
    if v.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
        raise BadInput(f"{where} is {_brief(v)}; inputs must be finite")
    if v.has(sympy.I):
        raise BadInput(f"{where} is {_brief(v)}, not a real number")
    floats = v.atoms(sympy.Float)
    if floats:  # exact mode: a float is the decimal it prints as
        v = v.xreplace({f: _rational_of_float(float(f), where) for f in floats})
    return v
