"""The explorable parts of an HTML page, as plain data read from a trace.

An *explorer* shows a step's result matrix next to the matrices it came from; the page's
script shows an entry's computation when it is clicked (the terms of its sum, or its row's
softmax) and highlights the row and column it came from on hover. Every number the script
shows is read here from the trace, formatted as the report formats it, and embedded as JSON:
the script lays numbers out, it never computes one.

A *heatmap* is the attention weights as an SVG drawn by the template from cells whose
colours are chosen here.

Only numeric traces get explorers and heatmaps (exact and symbolic entries are formulas; the
derivation shows them). Matrices larger than `MAX_SIDE` are left to the derivation.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from attntrace.kinds import kind_of
from attntrace.model.trace import Step, Trace
from attntrace.rendering.printing import plain_number

#: Result steps that are a product of their two inputs; True: the right one is transposed.
PRODUCTS = {"Q": False, "K": False, "V": False, "scores": True, "Z": False, "output": False}
MAX_SIDE = 12
_SYMBOL = re.compile(r"^([A-Za-z]+|\\[a-z]+)(?:\^\{(.*)\})?$")


def _name(base: str, sup: str = "") -> dict:
    return {"b": base.lstrip("\\"), "sup": sup}


def _symbol_of(trace: Trace, name: str, head: int | None) -> dict:
    """An entry's base letter and superscript as the report names it: q, w^Q, and for a
    matrix of one head q^(2), w^Q(2) (the head as a superscript, `printing.entry_name`)."""
    per_head = head is not None and (trace.has(name, head) or _has_operand(trace, name, head))
    mark = f"({head})" if per_head else ""
    sym = trace.step(name, head).symbol if trace.has(name, head) else None
    if sym:
        m = _SYMBOL.match(sym)
        if m:
            return _name(m.group(1), (m.group(2) or "") if "(" in (m.group(2) or "") else (m.group(2) or "") + mark)
    base, _, sup = name.partition("_")
    return _name(base.lower(), sup + mark)


def _has_operand(trace: Trace, name: str, head: int | None) -> bool:
    try:
        trace.operand(name, head)
        return True
    except KeyError:
        return False


def _matrix(trace: Trace, name: str, head: int | None):
    """The value of a step or operand by name (per head first, then shared), or None."""
    for h in (head, None):
        if trace.has(name, h):
            return np.asarray(trace.step(name, h).value, dtype=float)
        try:
            return np.asarray(trace.operand(name, h).value, dtype=float)
        except KeyError:
            continue
    return None


def _numbers(m, precision: int) -> list[list[str]]:
    return [[plain_number(float(x), precision, count=False) for x in row] for row in np.atleast_2d(m)]


def _labels(trace: Trace, n: int) -> list[str]:
    tokens = trace.settings.get("tokens") or ()
    return [str(t) for t in tokens][:n] if len(tokens) >= n else [str(i + 1) for i in range(n)]


def product_explorer(trace: Trace, step: Step, precision: int) -> dict | None:
    """Data of a product step's explorer, or None when the step is not a plain product."""
    if step.id not in PRODUCTS or len(step.inputs) != 2 or step.value is None:
        return None
    left, right = (_matrix(trace, n, step.head) for n in step.inputs)
    if left is None or right is None or left.ndim != 2 or right.ndim != 2:
        return None
    transposed = PRODUCTS[step.id]
    shown_right = right.T if transposed else right
    value = np.asarray(step.value, dtype=float)
    if left.shape[1] != shown_right.shape[0] or value.shape != (left.shape[0], shown_right.shape[1]):
        return None
    if max(value.shape + left.shape) > MAX_SIDE:
        return None
    lsym, rsym = (_symbol_of(trace, n, step.head) for n in step.inputs)
    rname = step.inputs[1] + ("^T" if transposed else "")
    return {
        "kind": "product", "key": step.key, "id": step.id, "head": step.head or 0,
        "result": _symbol_of(trace, step.id, step.head), "result_name": _display_name(step.id),
        "left": lsym, "right": rsym, "transposed": transposed,
        "left_name": _display_name(step.inputs[0]), "right_name": _display_name(rname),
        "L": _numbers(left, precision), "R": _numbers(shown_right, precision),
        "V": _numbers(value, precision), "row_labels": _labels(trace, value.shape[0]),
    }


def softmax_explorer(trace: Trace, step: Step, precision: int) -> dict | None:
    """Data of the weights step's explorer: each row's scores, maximum, exponentials, sum."""
    d = step.details
    if kind_of(step.id).view != "softmax" or step.value is None or not {"row_max", "exp", "row_sum"} <= set(d):
        return None
    value = np.asarray(step.value, dtype=float)
    source = _matrix(trace, step.inputs[0], step.head)
    if source is None or source.shape != value.shape or max(value.shape) > MAX_SIDE:
        return None
    return {
        "kind": "softmax", "key": step.key, "id": step.id, "head": step.head or 0,
        "result": _symbol_of(trace, step.id, step.head), "result_name": _display_name(step.id),
        # the softmax reads the scaled scores t, or the masked ones t-tilde (the report's names)
        "left": _name("t\u0303" if step.inputs[0] == "masked" else "t", "(%d)" % step.head if step.head else ""),
        "left_name": _display_name(step.inputs[0]),
        "L": _numbers(source, precision), "M": _numbers([d["row_max"]], precision)[0],
        "E": _numbers(d["exp"], precision), "S": _numbers([d["row_sum"]], precision)[0],
        "V": _numbers(value, precision), "row_labels": _labels(trace, value.shape[0]),
    }


_DISPLAY = {"scores": "S", "scaled": "T", "masked": "T\u0303", "weights": "A", "output": "O", "concat": "C"}


def _display_name(name: str) -> str:
    """A matrix's name as the page shows it, as HTML: S, A, K<sup>T</sup>, W<sub>Q</sub>
    (names are the trace's step and operand ids: letters, digits and underscores only)."""
    base, t, _ = name.partition("^T")
    base = _DISPLAY.get(base, base)
    letter, _, sub = base.partition("_")
    text = re.sub(r"[^A-Za-z0-9\u0303]", "", letter) + (f"<sub>{re.sub(r'[^A-Za-z0-9]', '', sub)}</sub>" if sub else "")
    return text + ("<sup>T</sup>" if t else "")


def explorers(trace: Trace, precision: int) -> list[dict]:
    """Every explorer of a numeric trace, in step order."""
    if trace.mode != "numeric":
        return []
    out = []
    for step in trace.steps:
        ex = product_explorer(trace, step, precision) or softmax_explorer(trace, step, precision)
        if ex is not None:
            ex["index"] = len(out)
            out.append(ex)
    return out


def _colour(w: float) -> str:
    """White (0) to a deep blue (1), the heatmap's one scale."""
    w = min(max(w, 0.0), 1.0) if np.isfinite(w) else 0.0
    r, g, b = (int(round(255 + (c - 255) * w)) for c in (31, 78, 160))
    return f"rgb({r},{g},{b})"


def heatmaps(trace: Trace, precision: int, cell: int = 44) -> list[dict]:
    """One SVG heatmap per weights step: cells (x, y, fill, text, text colour) and labels."""
    if trace.mode != "numeric":
        return []
    out = []
    for step in trace.steps:
        if kind_of(step.id).view != "softmax" or step.value is None:
            continue
        a = np.asarray(step.value, dtype=float)
        if a.ndim != 2 or max(a.shape) > MAX_SIDE:
            continue
        rows, cols = a.shape
        rl, cl = _labels(trace, rows), _kv_labels(trace, cols)
        pad = 8 + 7 * max(len(s) for s in rl + ["00"])
        top = 8 + 7 * max(len(s) for s in cl + ["00"])
        cells = [{"x": pad + j * cell, "y": top + i * cell, "fill": _colour(a[i, j]),
                  "text": plain_number(float(a[i, j]), 2, count=False),
                  "ink": "#fff" if a[i, j] > 0.55 else "#000", "tx": pad + j * cell + cell / 2,
                  "ty": top + i * cell + cell / 2 + 4} for i in range(rows) for j in range(cols)]
        out.append({"key": step.key, "head": step.head or 0, "cells": cells, "cell": cell,
                    "width": pad + cols * cell + 4, "height": top + rows * cell + 4,
                    "rows": [{"text": s, "x": pad - 4, "y": top + i * cell + cell / 2 + 4} for i, s in enumerate(rl)],
                    "cols": [{"text": s, "x": pad + j * cell + cell / 2, "y": top - 6} for j, s in enumerate(cl)],
                    "n": rows, "m": cols, "index": len(out) + 1,
                    "top": [{"row": rl[i], "key": cl[int(np.argmax(a[i]))],
                             "w": plain_number(float(np.max(a[i])), 2, count=False)} for i in range(rows)]})
    return out


def _kv_labels(trace: Trace, n: int) -> list[str]:
    tokens = trace.settings.get("kv_tokens") or trace.settings.get("tokens") or ()
    return [str(t) for t in tokens][:n] if len(tokens) >= n else [str(i + 1) for i in range(n)]


def data_json(value: Any) -> str:
    """JSON for an HTML attribute or a <script> element (escaped by the template)."""
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
