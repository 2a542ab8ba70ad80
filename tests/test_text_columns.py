"""Plain-text tables line up in a terminal in Chinese too: a CJK character takes two cells."""
import unicodedata

import pytest

import attntrace
from attntrace.rendering.textcolumns import text_table


def _cells(text: str) -> int:
    # written here from Unicode's East Asian Width, independently of the module under test
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _notation_rows(report: str, heading: str) -> list[str]:
    lines = report.splitlines()
    start = lines.index(heading) + 3  # heading, rule, blank line
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(line)
    return rows


@pytest.mark.parametrize("name", ["sentence-4x6", "llama-block-tiny", "mla-tiny"])
@pytest.mark.parametrize("lang,heading", [("en", "Notation"), ("zh", "符号")])
def test_notation_columns_start_at_one_terminal_column(name, lang, heading):
    report = attntrace.render(attntrace.run(name), format="text", lang=lang)
    rows = _notation_rows(report, heading)
    assert len(rows) >= 4
    # the shape column is the last run of cells after two spaces: where does it start?
    starts = {_cells(row[:row.rstrip().rindex("  ") + 2]) for row in rows}
    assert len(starts) == 1, rows


def test_text_table_pads_by_display_width():
    out = text_table([["a", "键宽度", "x"], ["bb", "k", "y"]], indent="", gap=" ")
    first, second = out.splitlines()
    assert _cells(first[:first.index("x")]) == _cells(second[:second.index("y")])
