"""The spec key `mla`: multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1).

    X = [...]                        # (n, d_model): the attention's input
    num_heads = h
    rope = {base = 10000, layout = "interleaved", positions = [...]}    # the decoupled RoPE
    W_O = [...]                      # (h d_v, d_model)
    [mla]
    W_DQ = [...]    # (d_model, d_cq)     query down-projection (the query LoRA); optional
    q_norm = {gain = [...], eps = 1e-6}   # RMSNorm of c^Q (DeepSeek-V2/V3); only with W_DQ
    W_UQ = [...]    # (d_cq, h d_nope)    query up-projection, head i in column block i
    W_QR = [...]    # (d_cq, h d_rope)    the per-head RoPE queries
    W_DKV = [...]   # (d_model, d_c)      key/value down-projection: c^KV, what is cached
    kv_norm = {gain = [...], eps = 1e-6}  # RMSNorm of c^KV
    W_UK = [...]    # (d_c, h d_nope)     key up-projection
    W_UV = [...]    # (d_c, h d_v)        value up-projection
    W_KR = [...]    # (d_model, d_rope)   the RoPE key, one for all heads
    absorb = true       # also the scores through W^UQ W^UK^T, without K (default true)
    c_KV_past = [...]   # (P, d_c)  decoding: the cached (normed) latents of P earlier tokens
    k_R_past = [...]    # (P, d_rope)          and their rotated RoPE keys

Without W_DQ the queries project X itself (DeepSeek-V2-Lite, Hugging Face's q_proj). The
matrices become operands: the shared ones (W_DQ, W_DKV, W_KR, the gains, the past latents)
and per head the column blocks of W_UQ, W_QR, W_UK, W_UV. Options go to Problem.extra["mla"].
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from attntrace.inputs.numbers import real_number
from attntrace.inputs.options import OptionReader, split_columns
from attntrace.model.errors import BadInput
from attntrace.model.formula import Word, sym

#: operand name -> (its symbol in formulas, entry base in symbolic mode)
MLA_OPERANDS = {
    "W_DQ": (sym("W", sup="DQ"), "w^{DQ}"), "W_UQ": (sym("W", sup="UQ"), "w^{UQ}"), "W_QR": (sym("W", sup="QR"), "w^{QR}"),
    "W_DKV": (sym("W", sup="DKV"), "w^{DKV}"), "W_UK": (sym("W", sup="UK"), "w^{UK}"), "W_UV": (sym("W", sup="UV"), "w^{UV}"),
    "W_KR": (sym("W", sup="KR"), "w^{KR}"),
    "gamma_Q": (sym("gamma", sup="Q"), "g^{Q}"), "gamma_KV": (sym("gamma", sup="KV"), "g^{KV}"),
    "c_KV_past": (sym("C", Word("past"), "KV"), "c^{P}"), "k_R_past": (sym("K", Word("past"), "R"), "k^{P}"),
}
_SHARED = ("W_DQ", "W_DKV", "W_KR", "c_KV_past", "k_R_past")
_PER_HEAD = ("W_UQ", "W_QR", "W_UK", "W_UV")
_KEYS = set(_SHARED) | set(_PER_HEAD) | {"q_norm", "kv_norm", "absorb"}
#: top-level keys that MLA replaces: its own projections make Q, K and V
_REPLACED = ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "Q", "K", "V", "heads", "num_kv_heads", "scores", "weights", "Z", "X_kv",
             "K_past", "V_past", "alibi", "attn_bias", "backward", "online")


def _norm_table(table: Any, key: str, operand: Callable, mode: str, name: str, width: int) -> tuple[dict, float]:
    if not isinstance(table, Mapping):
        raise BadInput(f"mla.{key} must be a table {{gain = [...], eps = 1e-6}}")
    bad = sorted(set(table) - {"gain", "eps"})
    if bad:
        raise BadInput(f"unknown key {bad[0]!r} in mla.{key}; allowed: eps, gain (RMSNorm has no bias)")
    eps = float(real_number(table.get("eps", 1e-6), f"mla.{key}.eps", "a number in [0, 1)", low_closed=True, high=1, text=False))
    ops = {}
    if "gain" in table:
        raw = table["gain"]
        raw = [raw] if isinstance(raw, list) and raw and not isinstance(raw[0], (list, dict)) else raw
        ops[name] = operand(raw, name, mode, None, MLA_OPERANDS[name][1])
        if ops[name].shape != (1, width):
            raise BadInput(f"mla.{key}.gain has shape {ops[name].shape}, expected (1, {width}): one gain per latent feature")
    return ops, eps


def parse_mla(table: Any, reader: OptionReader) -> dict[str, Any]:
    """The spec's `mla` table -> Problem.extra["mla"]; its shared matrices become operands of the
    trace and the column blocks of W^UQ, W^QR, W^UK, W^UV each head's (`SpecOption.start`)."""
    data, mode, operand, h = reader.data, reader.mode, reader.operand, reader.num_heads
    if not isinstance(table, Mapping):
        raise BadInput("mla must be a table {W_DKV = ..., W_UK = ..., W_UV = ..., W_KR = ..., W_UQ = ..., W_QR = ...}")
    bad = sorted(set(table) - _KEYS)
    if bad:
        raise BadInput(f"unknown key {bad[0]!r} in mla; allowed: {', '.join(sorted(_KEYS))}")
    clash = [k for k in _REPLACED if data.get(k) is not None]
    if clash:
        raise BadInput(f"mla makes the queries, keys and values from X itself: drop {clash[0]}")
    if "X" not in data:
        raise BadInput("multi-head latent attention starts from X (with mla's W_DKV, W_UK, W_UV, W_KR, W_UQ, W_QR)")
    if not data.get("rope"):
        raise BadInput("multi-head latent attention carries position in its decoupled RoPE key: give rope (rope = true takes the defaults)")
    missing = sorted({"W_DKV", "W_UK", "W_UV", "W_KR", "W_UQ", "W_QR"} - set(table))
    if missing:
        raise BadInput(f"mla needs {', '.join(missing)}")
    if "q_norm" in table and "W_DQ" not in table:
        raise BadInput("mla.q_norm normalises the compressed query c^Q: it needs W_DQ")
    if ("c_KV_past" in table) != ("k_R_past" in table):
        raise BadInput("mla.c_KV_past and mla.k_R_past (the latent cache) must be given together")
    full = {k: operand(table[k], k, mode, None, MLA_OPERANDS[k][1]) for k in _SHARED + _PER_HEAD if k in table}
    d_model = operand(data["X"], "X", mode, None, "x").shape[1]
    d_c, d_r = full["W_DKV"].shape[1], full["W_KR"].shape[1]
    d_cq = full["W_DQ"].shape[1] if "W_DQ" in full else d_model
    want = {"W_DQ": (d_model, None), "W_DKV": (d_model, None), "W_KR": (d_model, None), "W_UQ": (d_cq, None), "W_QR": (d_cq, None),
            "W_UK": (d_c, None), "W_UV": (d_c, None), "c_KV_past": (None, d_c), "k_R_past": (None, d_r)}
    for k, (rows, cols) in want.items():
        if k in full and ((rows is not None and full[k].shape[0] != rows) or (cols is not None and full[k].shape[1] != cols)):
            need = f"({rows if rows is not None else 'P'}, {cols if cols is not None else '...'})"
            raise BadInput(f"mla.{k} has shape {full[k].shape}, expected {need}")
    for k in _PER_HEAD:
        if full[k].shape[1] % h:
            raise BadInput(f"num_heads = {h} does not divide the width of mla.{k} {full[k].shape}")
    d_nope, d_qr = full["W_UQ"].shape[1] // h, full["W_QR"].shape[1] // h
    if full["W_UK"].shape[1] // h != d_nope:
        raise BadInput(f"mla.W_UK gives each head {full['W_UK'].shape[1] // h} columns but W_UQ {d_nope}: the query and key parts must match")
    if d_qr != d_r:
        raise BadInput(f"mla.W_QR gives each head a RoPE query of {d_qr} columns but W_KR a RoPE key of {d_r}: they must match")
    if d_r % 2:
        raise BadInput(f"RoPE rotates pairs of columns, but the RoPE width d_rope = {d_r} is odd")
    if "c_KV_past" in full and full["c_KV_past"].shape[0] != full["k_R_past"].shape[0]:
        raise BadInput(f"mla.c_KV_past has {full['c_KV_past'].shape[0]} rows but k_R_past {full['k_R_past'].shape[0]}: one of each per past token")
    absorb = table.get("absorb", True)
    if not isinstance(absorb, bool):
        raise BadInput(f"mla.absorb must be true or false, not {absorb!r}"[:200])
    shared = {k: full[k] for k in _SHARED if k in full}
    extra: dict[str, Any] = {"d_nope": d_nope, "d_rope": d_r, "d_c": d_c, "d_v": full["W_UV"].shape[1] // h,
                             "q_lora": "W_DQ" in full, "absorb": absorb, "past": full["c_KV_past"].shape[0] if "c_KV_past" in full else 0}
    for key, name, width in (("q_norm", "gamma_Q", d_cq), ("kv_norm", "gamma_KV", d_c)):
        if key == "q_norm" and "W_DQ" not in full:
            continue
        ops, eps = _norm_table(table.get(key, {}), key, operand, mode, name, width)
        shared.update(ops)
        extra[f"{key}_eps"] = eps
    blocks = {k: split_columns(full[k], h, mode) if h > 1 else [full[k]] for k in _PER_HEAD}
    for op in shared.values():
        reader.share(op)
    reader.make_heads(tuple({k: blocks[k][i] for k in _PER_HEAD} for i in range(h)))
    return extra


def check_mla_rope(problem) -> None:
    """One RoPE position per new token; after a latent cache of P tokens they are P, P + 1, ..."""
    mla, rope = problem.extra["mla"], problem.extra["rope"]
    n = problem.shared["X"].shape[0]
    if rope["kv_positions"] is not None:
        raise BadInput("rope.kv_positions is for cross-attention; multi-head latent attention is self-attention")
    if rope["positions"] is not None and len(rope["positions"]) != n:
        raise BadInput(f"rope.positions lists {len(rope['positions'])} positions but there are {n} tokens; give one per token")
    past = mla["past"]
    if past and list(rope["positions"] or ()) != list(range(past, past + n)):
        raise BadInput(f"with a latent cache of {past} tokens, RoPE needs the new tokens' positions: rope.positions = {list(range(past, past + n))}")
