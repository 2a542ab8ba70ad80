"""Shared test setup: puts tests/tools on sys.path and offers tool fixtures.

Fixtures (each skips when its tool is missing, and fails instead under CI=true):
- ``katex``: the function ``katex_errors(spans) -> list[str]`` (``[]`` = all parse).
- ``xelatex``: ``compile(tex_source, engine="xelatex") -> (ok, log_tail, pdf_path)``,
  compiling in a fresh folder under the test's tmp_path.
- ``torch``: the torch module.
- ``pagefit_latex``: ``compile(tex_source) -> pagefit.LatexResult`` (ok, the FULL log,
  pages, textwidth, overfull boxes), compiling with xelatex in a fresh folder under one
  session tmp dir; safe to call from several threads.
- ``pagefit_browser``: ``pagefit.markdown_equation_widths(docs, column_px=760)``: KaTeX in
  one headless Chromium run measures every display equation of many Markdown documents,
  with the fonts the page names (``pagefit.PAGE_FONTS``, required like a tool).

Hypothesis: under CI=true the profile ``ci`` is loaded (`HYPOTHESIS_CI`): derandomized (the
examples follow from each test's code, not from a random seed), no example database (a failure
found on one run is not replayed on another), a fixed ``max_examples`` for tests that set
none, and no deadline (a deadline is a wall-time assertion). A failing case hypothesis finds
is kept in its test as an explicit ``@example``.

Helpers for direct use: ``from mathcheck import markdown_math_spans, pdf_to_png, ...``.
Install the tools with ``bash scripts/install-test-deps.sh``.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

TOOLS_DIR = Path(__file__).resolve().parent / "tools"
if str(TOOLS_DIR) not in sys.path:
    sys.path.insert(0, str(TOOLS_DIR))

import mathcheck  # noqa: E402
import pagefit  # noqa: E402
from hypothesis import settings  # noqa: E402

#: The profile of CI runs (loaded here, before any test module builds its @settings, which
#: take their unset fields from the profile loaded at that time).
HYPOTHESIS_CI = "ci"
settings.register_profile(HYPOTHESIS_CI, derandomize=True, database=None, max_examples=50, deadline=None, print_blob=True)
if mathcheck.in_ci():
    settings.load_profile(HYPOTHESIS_CI)


@pytest.fixture(scope="session")
def katex():
    mathcheck.require_tool("katex")
    return mathcheck.katex_errors


@pytest.fixture
def xelatex(tmp_path):
    mathcheck.require_tool("xelatex")
    return functools.partial(mathcheck.compile_latex, workdir=tmp_path)


@pytest.fixture(scope="session")
def torch():
    mathcheck.require_tool("torch")
    import torch as torch_module

    return torch_module


@pytest.fixture(scope="session")
def pagefit_latex(tmp_path_factory):
    mathcheck.require_tool("xelatex")
    workdir = tmp_path_factory.mktemp("pagefit-latex")
    return functools.partial(pagefit.compile_latex_full, workdir=workdir)


@pytest.fixture(scope="session")
def pagefit_browser():
    mathcheck.require_tool("chromium")
    mathcheck.require_tool("katex")
    mathcheck.require_tool("page-fonts")
    return pagefit.markdown_equation_widths
