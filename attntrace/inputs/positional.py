"""Spec options of the position-aware kinds: `rope = {...}` (rotary embeddings) and `alibi`.

They are read here, with the other inputs, so that a bad setting is one line before anything
is traced, whatever the mode: an unknown layout, a base that is not a positive number,
positions that are not one per token, an odd head width (RoPE rotates pairs of columns), or
slopes that are not one positive number per head. The kinds (`attntrace.kinds.rope`,
`attntrace.kinds.alibi`) read the parsed settings from `Problem.extra`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from attntrace.inputs.numbers import MAX_INDEX, real_number, shown, whole_number
from attntrace.model.errors import BadInput

if TYPE_CHECKING:  # fractions is imported where a slope is made (ALiBi specs only)
    from fractions import Fraction

ROPE_LAYOUTS = ("half", "interleaved")
ROPE_KEYS = ("base", "layout", "positions", "kv_positions", "scaling")
#: RoPE scaling rules (attntrace.kinds.ropescaling) and their keys with defaults (None: required).
SCALING_TYPES = ("llama3", "yarn")
SCALING_KEYS = {
    "llama3": {"factor": None, "original_max_position_embeddings": None, "low_freq_factor": 1, "high_freq_factor": 4},
    "yarn": {"factor": None, "original_max_position_embeddings": None, "beta_fast": 32, "beta_slow": 1, "truncate": True,
             "attention_factor": None, "mscale": None, "mscale_all_dim": None},
}
ALIBI_KEYS = ("slopes",)
#: Largest position: angles m * theta stay well inside float64's exact integers.
MAX_POSITION = MAX_INDEX


def positive_number(value: Any, key: str, what: str):
    """A positive finite number given as an int, a float or an exact string ("1/2", "2^-3")."""
    return real_number(value, key, what)


def _positions(value: Any, key: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise BadInput(f"rope.{key} must be a non-empty list of token positions (integers from 0), not {shown(value)}")
    return tuple(whole_number(m, f"rope.{key}", low=0, high=MAX_POSITION, what="list integer positions from 0 to 10^9")
                 for m in value)


def parse_scaling(value: Any) -> dict | None:
    """`rope.scaling = {type = "llama3", factor = 8, original_max_position_embeddings = 8192,
    low_freq_factor = 1, high_freq_factor = 4}` or `{type = "yarn", factor = 32,
    original_max_position_embeddings = 4096, beta_fast = 32, beta_slow = 1, truncate = true,
    attention_factor = ..., mscale = ..., mscale_all_dim = ...}` (Hugging Face's rope_parameters
    names; `rope_type` is accepted for `type`)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise BadInput(f"rope.scaling must be a table with type = \"llama3\" or \"yarn\", not {shown(value)}")
    value = dict(value)
    kind = value.pop("type", value.pop("rope_type", None))
    if kind not in SCALING_TYPES:
        raise BadInput(f"rope.scaling.type must be \"llama3\" or \"yarn\", not {shown(kind)}")
    keys = SCALING_KEYS[kind]
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise BadInput(f"unknown key {unknown[0]!r} in rope.scaling ({kind}); allowed: type, {', '.join(keys)}")
    out: dict[str, Any] = {"type": kind}
    for key, default in keys.items():
        given = value.get(key, default)
        name = f"rope.scaling.{key}"
        if key == "truncate":
            if not isinstance(given, bool):
                raise BadInput(f"{name} must be true or false, not {shown(given)}")
        elif given is None:
            if key in ("factor", "original_max_position_embeddings"):
                raise BadInput(f"{name} is missing: {kind} scaling needs factor and original_max_position_embeddings")
        elif key == "original_max_position_embeddings":
            given = whole_number(given, name)
        else:
            given = positive_number(given, name, "a positive number")
        out[key] = given
    if kind == "llama3" and not float(out["high_freq_factor"]) > float(out["low_freq_factor"]):
        raise BadInput("rope.scaling.high_freq_factor must be larger than low_freq_factor (the blend lies between them)")
    return out


def parse_rope(value: Any) -> dict | None:
    """`rope = {base = 10000, layout = "half", positions = [0, 1, ...], kv_positions = [...],
    scaling = {...}}`; `rope = true` takes every default (base 10000, half layout, positions
    0..n-1, no scaling)."""
    if value is None or value is False:
        return None
    if value is True:
        value = {}
    if not isinstance(value, Mapping):
        raise BadInput(f"rope must be a table (base, layout, positions) or true, not {shown(value)}")
    unknown = sorted(set(value) - set(ROPE_KEYS))
    if unknown:
        raise BadInput(f"unknown key {unknown[0]!r} in rope; allowed: {', '.join(ROPE_KEYS)}")
    layout = value.get("layout", "half")
    if layout not in ROPE_LAYOUTS:
        raise BadInput(f"rope.layout must be \"half\" (Hugging Face rotate_half) or \"interleaved\" (adjacent pairs), not {shown(layout)}")
    base = positive_number(value.get("base", 10000), "rope.base", "a positive number")
    return {
        "base": base, "layout": layout,
        "positions": _positions(value["positions"], "positions") if "positions" in value else None,
        "kv_positions": _positions(value["kv_positions"], "kv_positions") if "kv_positions" in value else None,
        "scaling": parse_scaling(value.get("scaling")),
    }


def paper_slopes(h: int) -> tuple[Fraction, ...]:
    """The ALiBi paper's slopes for h heads, as exponents r of 2^-r.

    h a power of 2: the geometric sequence 2^(-8/h), 2^(-16/h), ..., 2^(-8). Otherwise the
    slopes of the largest power of 2 below h, p, then every other slope of 2p (its odd
    ones, 2^(-4/p), 2^(-12/p), ...) until there are h. Exponents stay exact, so that exact
    mode gets 2^(-1/2) and numeric mode the float of the same power.
    """
    from fractions import Fraction

    p = 1 << (h.bit_length() - 1)
    first = [Fraction(8 * k, p) for k in range(1, p + 1)]
    rest = [Fraction(8 * k, 2 * p) for k in range(1, 2 * p + 1, 2)][: h - p]
    return tuple(first + rest)


def parse_alibi(value: Any) -> dict | None:
    """`alibi = true` (the paper's slopes) or `alibi = {slopes = [...]}` (one per head)."""
    if value is None or value is False:
        return None
    if value is True:
        return {"slopes": None}
    if not isinstance(value, Mapping):
        raise BadInput(f"alibi must be true or a table {{slopes = [...]}}, not {shown(value)}")
    unknown = sorted(set(value) - set(ALIBI_KEYS))
    if unknown:
        raise BadInput(f"unknown key {unknown[0]!r} in alibi; allowed: {', '.join(ALIBI_KEYS)}")
    slopes = value.get("slopes")
    if slopes is None:
        return {"slopes": None}
    if not isinstance(slopes, (list, tuple)) or not slopes:
        raise BadInput(f"alibi.slopes must be a non-empty list of positive numbers, one per head, not {shown(slopes)}")
    return {"slopes": tuple(positive_number(s, "alibi.slopes", "a list of positive numbers") for s in slopes)}


def positional_options(data: Mapping[str, Any]) -> dict:
    """The parsed rope and alibi settings of a spec, for `Problem.extra` (only those given)."""
    out = {}
    rope = parse_rope(data.get("rope"))
    if rope is not None:
        out["rope"] = rope
    alibi = parse_alibi(data.get("alibi"))
    if alibi is not None:
        out["alibi"] = alibi
    return out


def check_positional(opts: Mapping[str, Any], start: str, heads, shared) -> None:
    """What the settings need from the problem: RoPE rotates Q and K (start X or Q/K/V), one
    position per query and per key, an even head width; ALiBi one slope per head."""
    rope, alibi = opts.get("rope"), opts.get("alibi")
    if rope is not None:
        if start not in ("X", "QKV"):
            raise BadInput("rope rotates the queries and keys: give X with W_Q, W_K, W_V, or Q and K, not a later step")
        h0 = heads[0]
        if start == "X" and "W_Q" not in h0:
            return  # no projections: the kind that makes Q and K checks its own RoPE (multi-head latent attention)
        if start == "X":
            x = shared["X"]
            n, m = x.shape[0], shared.get("X_kv", x).shape[0]
            d = h0["W_Q"].shape[1]
        else:
            if "Q" not in h0 or "K" not in h0:
                raise BadInput("rope rotates the queries and keys: give both Q and K")
            n, m, d = h0["Q"].shape[0], h0["K"].shape[0], h0["Q"].shape[1]
        if d % 2:
            raise BadInput(f"rope rotates pairs of columns, but the head width d_k = {d} is odd")
        cross = "X_kv" in shared
        if rope["positions"] is not None and len(rope["positions"]) != n:
            raise BadInput(f"rope.positions lists {len(rope['positions'])} positions but there are {n} queries; give one per token")
        if rope["kv_positions"] is not None:
            if len(rope["kv_positions"]) != m:
                raise BadInput(f"rope.kv_positions lists {len(rope['kv_positions'])} positions but there are {m} keys; give one per key")
        elif m != n and not cross and rope["positions"] is not None:
            raise BadInput(f"rope.positions covers {n} queries but there are {m} keys; give rope.kv_positions for the keys")
        if rope["kv_positions"] is not None and not cross and start == "X":
            raise BadInput("rope.kv_positions is for cross-attention (X_kv) or given Q and K; in self-attention the keys share rope.positions")
    if alibi is not None:
        if start not in ("X", "QKV", "scores"):
            raise BadInput("alibi biases the scores: give X, Q/K/V or scores, not a later step")
        h = len(heads)
        if alibi["slopes"] is not None and len(alibi["slopes"]) != h:
            raise BadInput(f"alibi.slopes lists {len(alibi['slopes'])} slopes but there are {h} heads; give one per head")


__all__ = ["parse_rope", "parse_scaling", "SCALING_TYPES", "parse_alibi", "paper_slopes", "positional_options", "check_positional", "ROPE_LAYOUTS"]
