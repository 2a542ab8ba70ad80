"""Trace -> plain dict (JSON-ready), with stable step ids.

Numeric values are numbers (non-finite ones as the strings "inf", "-inf", "nan"); exact and
symbolic entries are strings in SymPy's plain syntax, which `expr.parse_expr` reads back,
plus an `approx` matrix when every entry evaluates to a number.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attntrace.version import __version__
from attntrace.inputs.expr import to_plain
from attntrace.kinds import kind_of
from attntrace.kinds.notation import notation_of
from attntrace.model.trace import block_address


def _number(x: float) -> Any:
    x = float(x)
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _numeric(a: np.ndarray) -> list:
    if np.isfinite(a).all():
        return a.tolist()
    return [[_number(x) for x in row] for row in a]


def approx_matrix(m) -> list | None:
    """Float approximations of a SymPy matrix, or None when some entry is not a number."""
    import sympy as sp

    rows = []
    for i in range(m.rows):
        row = []
        for j in range(m.cols):
            e = m[i, j]
            if e in (sp.oo, -sp.oo):
                row.append(_number(float(e)))
                continue
            if e.free_symbols:
                return None
            row.append(_number(complex(sp.N(e, 17)).real))
        rows.append(row)
    return rows


def value_to_json(value: Any, mode: str) -> dict:
    if value is None:
        return {"value": None}
    if isinstance(value, np.ndarray):
        return {"value": _numeric(value)}
    out = {"value": [[to_plain(value[i, j]) for j in range(value.cols)] for i in range(value.rows)]}
    approx = approx_matrix(value)
    if approx is not None and mode != "numeric":
        out["approx"] = approx
    return out


def trace_to_dict(trace) -> dict:
    steps = []
    for s in trace.steps:
        entry = {"id": s.id, "head": s.head, "shape": list(s.shape), "inputs": list(s.inputs), "formula": s.formula}
        entry.update(value_to_json(s.value, trace.mode))
        if s.expansion is not None:
            entry["expansion"] = value_to_json(s.expansion, trace.mode)["value"]
        entry.update(kind_of(s.id).json_details(s.details))
        address = block_address(s)
        if address is not None:  # an online-softmax block: trace.step(address) and answer files name it so
            entry["address"] = address
        steps.append(entry)
    operands = []
    for o in trace.operands:
        entry = {"name": o.name, "head": o.head, "shape": list(o.shape)}
        entry.update(value_to_json(o.value, trace.mode))
        operands.append(entry)
    # "output": the key of the step holding the forward result (Trace.output_step), never a gradient
    kept_output = bool(trace.steps) and trace.settings.get("forward_steps", 1) != 0
    out = {"attntrace": __version__, "mode": trace.mode, "title": trace.title, "num_heads": trace.num_heads,
           "output": trace.output_step.key if kept_output else None, "steps": steps, "operands": operands,
           # one notation per trace: symbol, plain, meaning (a key), shape, entry (attntrace.kinds.notation)
           "notation": notation_of(trace).to_list()}
    if "not_kept" in trace.settings:  # traced with keep=: the steps computed but not recorded
        out["not_kept"] = list(trace.settings["not_kept"])
    return out
