"""Issue 20 B, options: `--max-size 1000` on 300 tokens ran over 5 minutes inside the width
estimator: a matrix too wide for the page lost one column at a time, and each time every
shown cell was formatted and the whole matrix measured again (quadratic in the columns).

Checked structurally, never in seconds (bench/bench.py `bench_layout` reports the times): the
text handed to the width estimator grows in proportion to the report, and with max_size 8 it
does not grow with the sequence at all. Before the fix the ratio grew with n.
"""

from __future__ import annotations

import numpy as np
import pytest

import attntrace
from attntrace.rendering import printing


def _spec(n: int) -> dict:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 4)).round(2)
    return {"X": rng.normal(size=(n, 4)).round(2), "W_Q": w, "W_K": w, "W_V": w}


def _measured(n: int, fmt: str, max_size: int, monkeypatch) -> tuple[int, int]:
    """(characters of text measured for width, characters of the report)."""
    seen = []
    for cls in (printing.TexOut, printing.PlainOut):
        original = cls.measure

        def measure(self, text, _original=original):
            seen.append(len(text))
            return _original(self, text)
        monkeypatch.setattr(cls, "measure", measure)
    out = attntrace.render(attntrace.run(_spec(n)), fmt, max_size=max_size)
    monkeypatch.undo()
    return sum(seen), len(out)


@pytest.mark.parametrize("fmt", ["md", "text"])
def test_width_estimation_grows_with_what_is_printed(fmt, monkeypatch):
    small, small_out = _measured(30, fmt, 1000, monkeypatch)
    big, big_out = _measured(120, fmt, 1000, monkeypatch)
    # four times the tokens: the report is about four times longer (every row printed, columns cut
    # to the page); the measured text may grow a little faster (log of the columns tried), not 4x more
    assert big / big_out < 2.5 * small / small_out, (small, small_out, big, big_out)


def test_max_size_8_costs_what_is_printed(monkeypatch):
    a, a_out = _measured(40, "md", 8, monkeypatch)
    b, b_out = _measured(240, "md", 8, monkeypatch)
    assert b < 1.5 * a and b_out < 1.5 * a_out, (a, b, a_out, b_out)


def test_the_widest_fitting_matrix_is_the_one_column_by_column_search_finds():
    """The doubling-and-bisecting search returns what dropping one column at a time returned."""
    out = printing.TexOut(precision=4, max_size=1000, limit=34.0)
    rng = np.random.default_rng(1)
    for cols in (1, 2, 3, 5, 9, 17, 40):
        value = rng.normal(size=(3, cols)) * 10 ** rng.integers(0, 4, size=(3, cols))
        for budget in (5.0, 12.0, 20.0, 34.0, 200.0):
            got = out.numeric_matrix(value, value.shape, budget)
            ri, limit = printing.pick(3, out.max_size), out.max_size
            while True:  # the old loop: one column fewer at a time
                ci = printing.pick(cols, limit)
                cells = [(i, j) for i in ri if i is not None for j in ci if j is not None]
                want, _ = out._numeric_cells(value, ri, ci, cells, None, pad=True)
                real = sum(c is not None for c in ci)
                if real <= 2 or out.measure(want) <= budget:
                    break
                limit = real - 1
            assert got == want, (cols, budget)
