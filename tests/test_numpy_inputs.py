"""Issue 20, Python API: NumPy and torch values are read as what they are.

- `check(problem, {"Q": float32 array})` marked a right answer wrong: the float32 -1.8 was read
  as the float64 -1.7999999523162842, 16 decimals, so the tolerance was 16 decimals too. A
  float32/float16/bfloat16 (NumPy or torch) value is read at its own precision: the decimals of
  the shortest decimal that is that value in its own type.
- `render(trace, rows=np.array([1, 2]))` raised a bare ValueError (the truth value of an array).
- a longdouble of 1e4000 printed NumPy's RuntimeWarning before its one-line error.

The oracle of the right answers is NumPy's own product of the problem's matrices, rounded.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import attntrace
from attntrace.grading.checker import check
from attntrace.model.errors import BadInput

X = np.array([[1.0, 0.0, 0.0], [0.5, 1.0, -1.5], [2.0, -0.5, 1.0]])
W_Q = np.array([[-1.8, 0.5, 0.3], [0.25, 1.0, -0.7], [0.1, -2.2, 1.3]])
EYE = np.eye(3)
PROBLEM = {"X": X.tolist(), "W_Q": W_Q.tolist(), "W_K": EYE.tolist(), "W_V": EYE.tolist()}


def _numpy_dtypes():
    return [np.float32, np.float16, np.longdouble]


def _torch_dtypes(torch):
    return [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def _right_and_wrong(decimals: int = 2):
    """Q = X W_Q by NumPy, rounded to `decimals`, as the decimal texts a student types (every
    float type here holds these values to that many decimals: bfloat16 only to 1), and a copy
    with one entry wrong."""
    right = np.round(X @ W_Q, decimals)
    assert -1.8 in right  # the value: float32(-1.8) widened is -1.7999999523162842
    wrong = right.copy()
    wrong[1, 2] += 0.2
    return [[f"{x:.{decimals}f}" for x in row] for row in right], [[f"{x:.{decimals}f}" for x in row] for row in wrong]


@pytest.mark.parametrize("dtype", _numpy_dtypes(), ids=lambda d: np.dtype(d).name)
def test_a_numpy_answer_is_read_at_its_own_precision(dtype):
    right, wrong = _right_and_wrong()
    trace = attntrace.run(PROBLEM)
    report = check(trace, {"Q": np.array(right, dtype=dtype)})  # NumPy reads the texts in the type
    assert report.ok, [(e.given_text, e.expected) for s in report.steps for e in s.wrong_entries]
    assert not check(trace, {"Q": np.array(wrong, dtype=dtype)}).ok  # a wrong entry is still wrong
    scalars = [[dtype(x) for x in row] for row in right]  # NumPy scalars in lists too
    assert check(trace, {"Q": scalars}).ok


def test_a_torch_answer_is_read_at_its_own_precision(torch):
    trace = attntrace.run(PROBLEM)
    for dtype in _torch_dtypes(torch):
        right, wrong = _right_and_wrong(1 if dtype == torch.bfloat16 else 2)
        right, wrong = ([[float(x) for x in row] for row in m] for m in (right, wrong))  # rounded to the type by torch
        report = check(trace, {"Q": torch.tensor(right, dtype=dtype)})
        assert report.ok, (dtype, [(e.given_text, e.expected) for s in report.steps for e in s.wrong_entries])
        assert not check(trace, {"Q": torch.tensor(wrong, dtype=dtype)}).ok, dtype
        rows = [[torch.tensor(x, dtype=dtype) for x in row] for row in right]  # 0-d tensors
        assert check(trace, {"Q": rows}).ok, dtype


def test_the_decimals_are_those_of_the_own_type():
    from attntrace.grading.answer import load_answer

    answers = load_answer({"Q": np.array([[-1.8, 0.1, 1e-7]], dtype=np.float32)})
    (matrix,) = answers.values()
    assert [e.text for e in matrix.entries[0]] == ["-1.8", "0.1", "1e-07"]
    assert [e.decimals for e in matrix.entries[0]] == [1, 1, 7]


def test_render_takes_rows_as_a_numpy_array():
    trace = attntrace.run(PROBLEM)
    want = attntrace.render(trace, rows=[1, 2])
    assert attntrace.render(trace, rows=np.array([1, 2])) == want
    assert attntrace.render(trace, rows=[np.int64(2), np.int32(1)]) == want
    assert attntrace.render(trace, rows=np.int64(1)) == attntrace.render(trace, rows=[1])
    for bad in (np.array([0, 1]), np.array([[1, 2]]), np.array([1.5]), np.array([], dtype=int)):
        with pytest.raises(BadInput) as info:
            attntrace.render(trace, rows=bad)
        assert "\n" not in str(info.value) and str(info.value).startswith("rows must be")


def test_a_longdouble_beyond_float64_is_one_line_without_a_warning():
    huge = np.longdouble("1e4000")
    if not np.isfinite(huge):
        pytest.skip("this platform's longdouble is float64")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would fail here
        with pytest.raises(BadInput) as info:
            attntrace.run({"scores": np.array([[1, huge], [1, 2]], dtype=np.longdouble), "scale": False})
        assert str(info.value) == "scores[1,2] is 1e+4000, beyond the range of a 64-bit float; inputs must be finite"
        with pytest.raises(BadInput, match=r"^answer Q, row 1, column 2: '1e\+4000' is too large$"):
            check(attntrace.run(PROBLEM), {"Q": np.array([[1, huge, 1]] * 3, dtype=np.longdouble)})
        # a longdouble within float64's range is read as usual
        assert attntrace.run({"scores": np.array([[1, 2], [3, 4]], dtype=np.longdouble), "scale": False}).steps
