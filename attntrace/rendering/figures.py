"""Heatmaps of the attention weights, one per head, as SVG / PNG / PDF files.

matplotlib is an optional extra (`pip install attntrace[figures]`); it is imported only when
a figure is drawn, never at `import attntrace`. Drawing uses matplotlib's object API
(`matplotlib.figure.Figure`), which needs no pyplot, no GUI and no global backend switch:
the raster/vector backends (Agg, SVG, PDF) are chosen by the file format.

Numeric traces plot the weights as they are; exact traces plot their float approximations;
symbolic and shape traces hold no numbers to plot and are refused with BadInput.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from attntrace.model.errors import BadInput
from attntrace.model.trace import Trace
from attntrace.inputs.safetext import clean_text

FORMATS = ("svg", "png", "pdf")
#: Above this many rows or columns the cells are too small for their numbers.
MAX_ANNOTATED = 12


#: Whether matplotlib's Text can switch mathtext off (matplotlib >= 3.5); set on import.
_HAS_PARSE_MATH = True


def _matplotlib():
    global _HAS_PARSE_MATH
    try:
        import matplotlib  # noqa: F401
        from matplotlib.figure import Figure
        from matplotlib.text import Text
    except ImportError:
        raise BadInput("heatmaps need matplotlib: pip install 'attntrace[figures]'") from None
    _HAS_PARSE_MATH = hasattr(Text, "set_parse_math")
    return Figure


def weight_matrices(trace: Trace) -> list[tuple[int | None, np.ndarray]]:
    """[(head, weights as a float ndarray)] for every head; BadInput when there is nothing to plot."""
    if not isinstance(trace, Trace):
        raise BadInput(f"heatmaps need a Trace (from attntrace.run), not {type(trace).__name__}")
    if trace.mode in ("symbolic", "shape"):
        raise BadInput(f"a {trace.mode} trace has no numbers to plot; run it in numeric or exact mode for heatmaps")
    out = []
    for head in trace.heads():
        if trace.has("weights", head):
            value = trace.step("weights", head).value
        else:
            try:
                value = trace.operand("weights", head).value
            except KeyError:
                continue
        if value is None:
            continue
        try:
            matrix = np.array(value.evalf() if hasattr(value, "evalf") else value, dtype=float)
        except (TypeError, ValueError):
            raise BadInput("the attention weights are not numbers; heatmaps need a numeric or exact trace") from None
        out.append((head, matrix))
    if not out:
        raise BadInput("this trace has no attention weights to plot (it starts after the softmax)")
    return out


#: A tick label longer than this is cut (with an ellipsis): a label is a word, not a paragraph.
MAX_LABEL = 24


def label_text(token) -> str:
    """A token as a tick label: control and bidi characters removed (safetext.clean_text),
    whitespace collapsed, cut to `MAX_LABEL` characters. Dollars and backslashes are kept as
    they are: labels are drawn with matplotlib's mathtext switched off (`_TEXT_PROPS`), so
    ``$\\frac{$`` is the text it is (escaped instead on a matplotlib without that switch)."""
    text = " ".join(clean_text(token).split()) or " "
    if len(text) > MAX_LABEL:
        text = text[: MAX_LABEL - 1] + "\u2026"
    if not _HAS_PARSE_MATH:
        text = text.replace("$", "\\$")  # mathtext: \$ is a literal dollar
    return text


def _labels(trace: Trace, rows: int, cols: int) -> tuple[list[str] | None, list[str] | None]:
    tokens = trace.settings.get("tokens")
    kv_tokens = trace.settings.get("kv_tokens")
    tokens = [label_text(t) for t in tokens] if tokens else tokens
    kv_tokens = [label_text(t) for t in kv_tokens] if kv_tokens else kv_tokens
    row_labels = list(tokens) if tokens and len(tokens) == rows else None
    if kv_tokens and len(kv_tokens) == cols:
        col_labels = list(kv_tokens)
    elif tokens and len(tokens) == cols and not trace.settings.get("cross"):
        col_labels = list(tokens)
    else:
        col_labels = None
    return row_labels, col_labels


def _stem(trace: Trace) -> str:
    source = trace.settings.get("source")
    base = Path(str(source)).stem if source else "attention"
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", base).strip("-") or "attention"
    return f"{base}-weights"


def _draw(Figure, matrix: np.ndarray, head: int | None, row_labels, col_labels, precision: int):
    rows, cols = matrix.shape
    cell = 0.55 if max(rows, cols) <= MAX_ANNOTATED else max(0.05, 6.0 / max(rows, cols))
    width = min(12.0, 2.6 + cell * cols + 1.0)
    height = min(12.0, 1.4 + cell * rows)
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    image = ax.imshow(matrix, cmap="Blues", vmin=0.0, vmax=1.0, aspect="equal", interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if max(rows, cols) <= MAX_ANNOTATED:
        for i in range(rows):
            for j in range(cols):
                v = matrix[i, j]
                text = "0" if v == 0 else f"{v:.{precision}f}".rstrip("0").rstrip(".")
                ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if v > 0.6 else "black")
    ax.set_xticks(range(cols) if cols <= 40 else [])
    ax.set_yticks(range(rows) if rows <= 40 else [])
    props = {"parse_math": False} if _HAS_PARSE_MATH else {}
    if cols <= 40:
        ax.set_xticklabels(col_labels if col_labels else [str(j + 1) for j in range(cols)], **props)
    if rows <= 40:
        ax.set_yticklabels(row_labels if row_labels else [str(i + 1) for i in range(rows)], **props)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("keys")
    ax.set_ylabel("queries")
    fig.suptitle("attention weights" + (f", head {head}" if head else ""), fontsize=10)
    return fig


def write_heatmaps(trace: Trace, directory, formats: Iterable[str] = ("svg",), precision: int = 2) -> list[dict[str, Any]]:
    """Write one heatmap of the attention weights per head into `directory`.

    Returns [{"path": Path of the first format's file, "head": head or None,
    "paths": {format: Path}}], in head order. File names come from the spec's file name
    (`sentence-4x6-weights.svg`, `...-weights-head2.svg`); the folder is created if needed.
    """
    formats = tuple(formats) if not isinstance(formats, str) else (formats,)
    if not formats:
        raise BadInput("give at least one figure format (svg, png, pdf)")
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise BadInput(f"unknown figure format {bad[0]!r}; choose from {', '.join(FORMATS)}")
    matrices = weight_matrices(trace)
    Figure = _matplotlib()
    import matplotlib

    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"cannot create the figures folder {str(directory)!r}: {exc.strerror or type(exc).__name__}") from None
    stem = _stem(trace)
    written = []
    for head, matrix in matrices:
        row_labels, col_labels = _labels(trace, *matrix.shape)
        paths = {}
        # matplotlib warns (several lines on stderr) about glyphs its font lacks (CJK tokens)
        # and layouts it cannot fit: a figure is drawn all the same, so they are not shown
        # text.usetex off whatever the user's matplotlibrc says: with it, labels would be
        # typeset by a LaTeX run (a token \input{...} would be read as a command)
        with warnings.catch_warnings(), matplotlib.rc_context({"text.usetex": False}):
            warnings.filterwarnings("ignore", category=UserWarning, module=r"matplotlib(\.|$)")
            warnings.filterwarnings("ignore", message=r"Glyph .* missing from")
            fig = _draw(Figure, matrix, head, row_labels, col_labels, precision)
            for fmt in formats:
                path = directory / (f"{stem}-head{head}.{fmt}" if head else f"{stem}.{fmt}")
                # fixed ids and no dates: the same trace gives byte-identical SVG/PDF files
                with matplotlib.rc_context({"svg.hashsalt": "attntrace", "svg.fonttype": "none", "text.usetex": False}):
                    try:
                        fig.savefig(path, format=fmt, metadata={"Date": None} if fmt in ("svg", "pdf") else None,
                                    dpi=150 if fmt == "png" else None)
                    except OSError as exc:
                        raise BadInput(f"cannot write {str(path)!r}: {exc.strerror or type(exc).__name__}") from None
                paths[fmt] = path
        written.append({"path": paths[formats[0]], "head": head, "paths": paths})
    return written
