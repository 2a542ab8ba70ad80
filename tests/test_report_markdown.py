"""Generated Markdown as real sites read it (issue 22 item 9): MkDocs, Sphinx/MyST, nbconvert and
mystmd all parse CommonMark with GFM tables. Every example in en and zh, in every math mode
the examples use, is parsed with markdown-it-py (tables enabled, dollar math as a plugin):

- every table is a table with all its rows (a blank line after ``|---|`` ends the table, and the
  renderer shows a header-only table followed by a paragraph of pipes);
- no heading holds math (raw ``\\(Q\\)`` would end up in the navigation, the table of contents
  and ``<title>``), in Markdown and in the LaTeX headings alike.
"""

from __future__ import annotations

import re

import pytest
from markdown_it import MarkdownIt
from mdit_py_plugins.dollarmath import dollarmath_plugin

import attntrace
from attntrace.rendering.renderer import render
from attntrace.teach.examples import example_paths

NAMES = [p.stem for p in example_paths()]
LANGS = ("en", "zh")


def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("table").use(dollarmath_plugin, double_inline=True)


@pytest.fixture(scope="module")
def traces():
    return {name: attntrace.run(name) for name in NAMES}


def _table_source_rows(text: str) -> list[list[str]]:
    """The runs of consecutive lines starting with '|' in the source: what the author meant as tables."""
    runs, run = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            run.append(line)
        elif run:
            runs.append(run)
            run = []
    return runs


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", NAMES)
def test_markdown_tables_parse_with_all_rows(name, lang, traces):
    text = render(traces[name], format="md", lang=lang)
    tokens = _parser().parse(text)
    tables = [i for i, t in enumerate(tokens) if t.type == "table_open"]
    runs = _table_source_rows(text)
    assert len(tables) == len(runs), f"{name} {lang}: {len(runs)} runs of table lines, {len(tables)} tables"
    for start, run in zip(tables, runs):
        end = next(i for i in range(start, len(tokens)) if tokens[i].type == "table_close")
        rows = sum(1 for t in tokens[start:end] if t.type == "tr_open")
        assert rows == len(run) - 1, f"{name} {lang}: a table of {len(run) - 1} rows parses with {rows}"
    # no stray paragraph of pipes after a table
    paragraphs = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "paragraph_open"]
    assert not [p for p in paragraphs if p.lstrip().startswith("|")], name


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", NAMES)
def test_no_heading_holds_math(name, lang, traces):
    md = render(traces[name], format="md", lang=lang)
    tokens = _parser().parse(md)
    headings = [tokens[i + 1] for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings
    for h in headings:
        kinds = {c.type for c in h.children or []}
        assert not kinds & {"math_inline", "math_inline_double"}, f"{name} {lang}: math in heading {h.content!r}"
        assert "\\(" not in h.content and "$" not in h.content, h.content
    brackets = render(traces[name], format="md", lang=lang, math_delimiters="brackets")
    for line in brackets.splitlines():
        if line.startswith("#"):
            assert "\\(" not in line, line
    tex = render(traces[name], format="tex", lang=lang)
    for heading in re.findall(r"\\(?:sub)*section\*\{(.*)\}", tex):
        assert "\\(" not in heading and "$" not in heading, heading
