"""Plain-text columns that line up in a terminal, Chinese included.

A CJK character takes two terminal cells (Unicode East Asian Width W or F) and a combining mark
none, so padding by `len` shifts every column after a Chinese word; these count display cells.
"""

from __future__ import annotations

from typing import Any, Iterable


def display_width(text: str) -> int:
    """Terminal cells `text` takes: wide CJK characters 2, combining marks 0, the rest 1."""
    if text.isascii():  # one cell a character; unicodedata (a C extension to load) only for other text
        return len(text)
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else 0 if unicodedata.combining(c) else 1 for c in text)


def text_table(rows: Iterable[Iterable[Any]], indent: str = "  ", gap: str = "  ") -> str:
    """Rows of cells -> aligned plain-text lines, each column as wide as its widest cell."""
    rows = [[str(c) for c in row] for row in rows]
    if not rows:
        return ""
    widths = [max(display_width(r[i]) for r in rows if i < len(r)) for i in range(max(len(r) for r in rows))]
    lines = []
    for r in rows:
        cells = [c + " " * (widths[i] - display_width(c)) for i, c in enumerate(r)]
        lines.append((indent + gap.join(cells)).rstrip())
    return "\n".join(lines)
