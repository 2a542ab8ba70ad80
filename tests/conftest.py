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
