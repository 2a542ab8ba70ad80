"""An exercise's answer key as an answer file, and specs and answer files written as TOML.

`answer_key(trace)` is every step of a numeric trace rounded to 4 decimals, an answer file
that `attntrace check` accepts; `to_toml` writes it (or an exercise's spec) with tomli_w.
"""

from __future__ import annotations

import numpy as np
import tomli_w

from attntrace.model.errors import BadInput
from attntrace.model.trace import Trace, block_address


def _round(x: float) -> float:
    r = round(float(x), 4)
    return 0.0 if r == 0 else r  # no "-0.0" in answer files


def answer_name(step) -> str:
    """The key an answer file gives `step` under: weights, weights@2, or a block of the online
    softmax by its address (online_max#2, online_max#1.2@1), so that every block has its own."""
    name = block_address(step) or step.id
    return name if step.head is None else f"{name}@{step.head}"


def answer_key(trace: Trace) -> dict[str, list[list[float]]]:
    """Every step of a numeric trace as an answer file {"weights@2": [[...]], ...}, 4 decimals;
    each block of the online softmax under its address ("online_max#1", "online_max#2@1")."""
    if trace.mode != "numeric":
        raise BadInput(f"an answer key needs a numeric trace, not a {trace.mode} one")
    key = {}
    for step in trace.steps:
        value = np.asarray(step.value, dtype=float)
        key[answer_name(step)] = [[_round(v) if np.isfinite(v) else float(v) for v in row] for row in value]
    return key


def to_toml(data: dict) -> str:
    """A spec or answer dict (text, numbers, matrices) as TOML."""
    return tomli_w.dumps(data, indent=2)
