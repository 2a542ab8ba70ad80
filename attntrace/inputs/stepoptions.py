"""The spec options of the mask, the backward pass, the online softmax and the score bias, parsed and validated.

`inputs.spec.load_spec` puts what they return into the Problem (`mask`, `Problem.extra`); the
kinds that read them are `attntrace.kinds.mask`, `attntrace.kinds.backward`,
`attntrace.kinds.online` and `attntrace.kinds.bias` (backward and online reach the loader as
the `SpecOption`s those kinds declare). Every problem is one line of `BadInput`.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from attntrace.inputs.matrices import to_matrix
from attntrace.inputs.numbers import MAX_INDEX, whole_number
from attntrace.model.errors import BadInput
from attntrace.model.trace import Operand

#: The spellings of `mask` the spec accepts besides a 0/1 matrix.
MASK_NAMES = ("causal", "causal_bottom_right")


def parse_mask_options(data: Mapping[str, Any]) -> dict[str, Any]:
    """The spec's `window` and `key_padding`, validated (they go to Problem.extra)."""
    out: dict[str, Any] = {}
    if data.get("window") is not None:
        w = whole_number(data["window"], "window", high=MAX_INDEX,
                         what="be a positive integer (keys i - W < j <= i; at most 10^9)")
        if not (data.get("mask") is None or data.get("mask") in MASK_NAMES):
            raise BadInput("window works with mask = \"causal\" or \"causal_bottom_right\", not a mask matrix; "
                           "write the window into the matrix instead")
        out["window"] = w
    if data.get("key_padding") is not None:
        pad = data["key_padding"]
        items = pad.tolist() if isinstance(pad, np.ndarray) else pad
        if not isinstance(items, (list, tuple)) or not items or not all(isinstance(b, bool) for b in items):
            raise BadInput("key_padding must be a list of true/false, one per key, true = padding (ignored); "
                           "booleans only, since 0/1 attention masks use 1 for real tokens")
        out["key_padding"] = tuple(bool(b) for b in items)
    return out


#: Losses a spec may name instead of giving dO: L = sum of o_ij^2 (dO = 2 O), L = sum of o_ij (dO = 1).
LOSSES = ("sum_squares", "sum")


def parse_backward(value, mode: str, entry: str = "g^{O}"):
    """The spec's `backward`: true (the loss sum_squares), {loss = "..."} or {dO = [[...]]}.

    `entry`: the name of the given gradient's entries in symbolic mode, the one the gradient of
    the output goes by (g^{O} after an output projection, else g^{Z}), so they have one name.

    Returns {"loss": name} or {"dO": Operand}; None when absent or false."""
    if value is None or value is False:
        return None
    if value is True:
        return {"loss": "sum_squares"}
    if not isinstance(value, dict):
        raise BadInput("backward must be true or a table: {loss = \"sum_squares\"} or {dO = [[...]]}")
    unknown = sorted(set(value) - {"loss", "dO"})
    if unknown:
        raise BadInput(f"unknown key {unknown[0]!r} in backward; allowed: dO, loss")
    if ("loss" in value) == ("dO" in value):
        raise BadInput("backward needs exactly one of dO (the upstream gradient) and loss (\"sum_squares\" or \"sum\")")
    if "loss" in value:
        if value["loss"] not in LOSSES:
            raise BadInput(f"backward loss must be \"sum_squares\" or \"sum\", not {str(value['loss'])[:40]!r}")
        return {"loss": value["loss"]}
    m, shape, symbol = to_matrix(value["dO"], mode=mode, name="backward dO", default_symbol=entry)
    return {"dO": Operand("dO", None, m, shape, symbol)}


def parse_online(value) -> dict | None:
    """The spec's `online`: {block_keys = Bc, block_queries = Br} (Br optional: all rows)."""
    if value is None or value is False:
        return None
    if not isinstance(value, dict):
        raise BadInput("online must be a table: {block_keys = 2, block_queries = 2}")
    unknown = sorted(set(value) - {"block_keys", "block_queries"})
    if unknown:
        raise BadInput(f"unknown key {unknown[0]!r} in online; allowed: block_keys, block_queries")
    if "block_keys" not in value:
        raise BadInput("online needs block_keys (the number of keys per block, Bc)")
    out = {}
    for key in ("block_keys", "block_queries"):
        if key in value:
            out[key] = whole_number(value[key], f"online {key}", high=10**6)
    return out


def parse_attn_bias(value, heads: int, mode: str, operand) -> dict:
    """The spec's `attn_bias`: one matrix, or a list of `heads` matrices (one per head); read by
    `operand(raw, key, mode, head, symbol)` (the spec's own matrix reader), finite numbers."""
    import numpy as np

    if value is None:
        return {}
    def matrix(x) -> bool:  # a 2-D table: an array, or a list of rows
        return np.ndim(x) == 2 if hasattr(x, "ndim") else isinstance(x, list) and bool(x) and isinstance(x[0], list)

    per_head = np.ndim(value) == 3 if hasattr(value, "ndim") else isinstance(value, list) and bool(value) and matrix(value[0])
    tables = list(value) if per_head else [value]
    if per_head and len(tables) != heads:
        raise BadInput(f"attn_bias lists {len(tables)} matrices but there are {heads} heads; give one per head, or one for all")
    ops = tuple(operand(raw, "attn_bias", mode, i if per_head and heads > 1 else None, "b") for i, raw in enumerate(tables, start=1))
    for op in ops:
        if isinstance(op.value, np.ndarray) and not np.isfinite(op.value).all():
            raise BadInput("attn_bias must be finite numbers: a key removed with -inf is the mask's job (mask = [[...]])")
    return {"attn_bias": ops}
