"""Costs of reports that follow what is printed (issue 26), checked by what the code must do:

- `decimals_needed` counts many numbers in NumPy and must agree, number for number, with the
  decimals that Python's own formatting prints (an oracle written here from `format`);
- exact mode evaluates each distinct entry's approximation once per process (`evalf17`), however
  often a report prints it;
- an exact trace that would take long is refused before any work, in one line with its estimate.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import attntrace as at
from attntrace.rendering.printing import decimals_needed, evalf17


def _printed_decimals(x: float, p: int) -> int:
    """Decimals of x printed at p places with trailing zeros dropped, except that a value that is
    not whole keeps all p (it must not read as a whole number)."""
    if not math.isfinite(x) or x == 0:
        return 0
    s = format(x, f".{p}f")
    t = s.rstrip("0").rstrip(".") if "." in s else s
    if "." not in t:
        return p if x != int(x) else 0
    return len(t) - t.index(".") - 1


_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.integers(-10**6, 10**6).map(lambda k: k / 8),  # exact binary fractions: ties at some precisions
    st.integers(-10**7, 10**7).map(lambda k: k / 10**4),
    st.floats(min_value=-1e-3, max_value=1e-3),
)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(_floats, min_size=64, max_size=300), st.integers(0, 8))
def test_decimals_needed_agrees_with_printing(xs, p):
    assert decimals_needed(np.array(xs), p) == max((_printed_decimals(x, p) for x in xs), default=0)


def test_decimals_needed_on_typical_matrices():
    rng = np.random.default_rng(0)
    for p in range(0, 9):
        for a in (rng.normal(size=(40, 40)), np.round(rng.normal(size=(40, 40)), 2), 1 - rng.random((30, 30)) * 1e-6,
                  rng.normal(size=(30, 30)) * 1e7, (rng.integers(-99, 99, size=(20, 20)) + 0.5) / 100):
            assert decimals_needed(a, p) == max(_printed_decimals(float(x), p) for x in a.ravel())


def test_exact_reports_evaluate_each_entry_once():
    trace = at.run("sentence-4x6", mode="exact")
    evalf17.cache_clear()
    at.render(trace, "md")
    first = evalf17.cache_info()
    at.render(trace, "text")
    second = evalf17.cache_info()
    distinct = {e for s in trace.steps for e in s.value} | {e for o in trace.operands for e in o.value}
    assert first.misses <= len(distinct)
    assert second.misses == first.misses  # the second report evaluates nothing again
    assert second.hits > first.hits


def test_an_exact_trace_that_would_take_long_is_refused_up_front(tmp_path):
    def m(r, c, k):
        return [[((i * 3 + j * 5 + k) % 5) - 2 for j in range(c)] for i in range(r)]
    import json

    spec = tmp_path / "bw.json"
    spec.write_text(json.dumps({"mode": "exact", "X": m(4, 4, 1), "W_Q": m(4, 4, 2), "W_K": m(4, 4, 3), "W_V": m(4, 4, 4),
                                "W_O": m(4, 4, 5), "num_heads": 2, "backward": True}))
    proc = subprocess.run([sys.executable, "-m", "attntrace", "run", str(spec), "--format", "md"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "too large to finish in seconds" in lines[0] and "an estimated" in lines[0]


@pytest.mark.parametrize("cost, text", [(100, "an estimated 0 s to 0 s"), (200_000, "an estimated 40 s to 100 s"),
                                        (2_000_000, "an estimated 7 min to 17 min")])
def test_the_estimate_reads_in_seconds_or_minutes(cost, text):
    from attntrace.budget import _seconds

    assert _seconds(cost) == text


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), st.integers(0, 6), st.sampled_from(["", " "]),
       st.sampled_from(["", " "]))
def test_a_printed_number_is_measured_as_the_reader_measures_it(x, p, left, right):
    """texwidth's shortcut for a plain number (most matrix cells) gives the reader's width to the bit."""
    from attntrace.rendering import texwidth

    text = f"{left}{x:.{p}f}{right}"
    for text_style in (False, True):
        assert texwidth.width(text, text_style) == texwidth._sum(texwidth._Reader(text), text_style)


#: Fragments whose environments are unusual: nested, an array's column spec, row spacing, scripts
#: after the environment, an environment inside a group, and forms `texwidth._tokens` leaves to
#: the reader (a name after a space, an unmatched \end, an escaped backslash before "begin").
_TRICKY = [
    r"\begin{bmatrix}x_{11} & x_{12} \\ x_{21} & x_{22}\end{bmatrix}",
    r"A = \begin{bmatrix}w^{Q}_{11} & w^{Q}_{12} \\[2pt] w^{Q}_{21} & w^{Q}_{22}\end{bmatrix}^{\top} + 1",
    r"\left[\begin{array}{rr|r}1.5 & -2 & 0 \\ 3 & 4 & \phantom{.00}5\end{array}\right] \begin{bmatrix}a \\ b\end{bmatrix}",
    r"\frac{\begin{matrix}a & b\end{matrix}}{2} \begin{bmatrix}\begin{matrix}1 & 2 \\ 3 & 4\end{matrix} & x \\ y & \dfrac{e^{t_{11}}}{s}\end{bmatrix}",
    r"\begin{array}{r@{\,}l}a & b\end{array}",
    r"\begin{array} {rr}a & b\end{array}",
    r"\begin {bmatrix}a & b\end{bmatrix}",
    r"a \end{bmatrix} b",
    r"\begin{bmatrix}a & b",
    r"x \\begin{bmatrix}a\end{bmatrix}",
    r"\begin{bmatrix}[x\]y] a & b \\ \{ & \& \\\end{bmatrix}",
    r"\begin{cases}a & b \\ c & d\end{cases} \underbrace{\begin{aligned}x &= 1\end{aligned}}_{n}",
]


def _report_fragments() -> list[str]:
    """Every line of display math in a few reports (symbolic, numeric, exact; Markdown and LaTeX)."""
    from attntrace.resources import examples_dir

    out = []
    for name, mode in (("scaling-dk6", "symbolic"), ("causal-mask", "numeric"), ("causal-mask", "exact"),
                       ("rope-4-tokens-half", "numeric"), ("llama-block-tiny", "numeric"), ("backward-2x2-symbolic", "symbolic")):
        t = at.run(str(examples_dir() / f"{name}.toml"), mode=mode)
        for fmt in ("md", "tex"):
            out += [line for line in at.render(t, format=fmt).splitlines() if "\\begin" in line or "\\frac" in line]
    return out


def test_an_environment_is_measured_as_the_reader_measures_it():
    """`width` reads each outermost environment as one token (its body cut by `_split_top`); the
    reader going token by token (`_environment`) gives the same width, to the bit."""
    from attntrace.rendering import texwidth

    fragments = _TRICKY + _report_fragments()
    assert len(fragments) > 40
    for text in fragments:
        for text_style in (False, True):
            assert texwidth.width(text, text_style) == texwidth._sum(texwidth._Reader(text), text_style), text


def _split_by_characters(body: str, sep: str) -> list[str]:
    """`_split_top` written character by character: the oracle for its scan of marks."""
    parts, depth, env, start, i = [], 0, 0, 0, 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            if body.startswith("\\begin", i):
                env += 1
            elif body.startswith("\\end", i):
                env -= 1
            if sep == "\\\\" and body.startswith("\\\\", i) and depth == 0 and env == 0:
                parts.append(body[start:i])
                i += 2
                start = i
                continue
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == sep and depth == 0 and env == 0:
            parts.append(body[start:i])
            start = i + 1
        i += 1
    parts.append(body[start:])
    return parts


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(["{", "}", "&", "\\", "\\\\", "\\&", "\\{", "\\begin{m}", "\\end{m}", "x", " ", "[2pt]", "_"]),
                max_size=24).map("".join), st.sampled_from(["&", "\\\\"]))
def test_split_top_cuts_where_a_character_scan_does(body, sep):
    from attntrace.rendering import texwidth

    assert texwidth._split_top(body, sep) == _split_by_characters(body, sep)
