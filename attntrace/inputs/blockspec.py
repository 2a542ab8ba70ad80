"""The spec keys of the Transformer block around attention -> operands and options.

    block = "post_ln" | "pre_ln" | "llama" | "sandwich"  # the arrangement (attntrace.kinds.block)
    position = "sinusoidal"                     # or a learned table: P = [[...], ...] (n, d_model)
    norm1 = {gain = [...], bias = [...], eps = 1e-5}   # the attention sublayer's norm
    norm2 = {gain = [...], bias = [...], eps = 1e-5}   # the feed-forward sublayer's norm
    ffn = {W_1 = ..., b_1 = ..., W_2 = ..., b_2 = ..., activation = "relu" | "gelu" | "gelu_tanh"}
    ffn = {W_gate = ..., W_up = ..., W_down = ...}     # llama, sandwich: SwiGLU, no biases
    ffn = {W_gate = ..., W_up = ..., W_down = ..., activation = "gelu_tanh"}  # GeGLU (Gemma)
    norm3 = {gain = [...], eps = 1e-6, gain_offset = 1}  # sandwich: the norm of attention's output,
    norm4 = {gain = [...], eps = 1e-6, gain_offset = 1}  #   and of the FFN's, before each residual
                                                # gain_offset = 1 (RMSNorm tables): Gemma's 1 + gain
                                                # a kind's option may take ffn's place (SpecOption.instead_of:
                                                #   a mixture of experts, attntrace.inputs.moespec)
    block_part = "self_attention"               # only the first sublayer: attention, residual1, norm1
                                                # (no norm2, no ffn; e.g. a TransformerDecoderLayer's self-attention)

post_ln and pre_ln use LayerNorm, llama and sandwich RMSNorm (no bias: a norm table's bias is
refused). A gated FFN (llama, sandwich) is SwiGLU (extra activation "swiglu") or, with
activation = "gelu_tanh", GeGLU (extra activation "geglu").
The matrices become shared operands (P, gamma_1, beta_1, gamma_2, beta_2, W_1, b_1, ...),
listed in the report's Given section; the options go to Problem.extra.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from attntrace.inputs.numbers import real_number
from attntrace.inputs.options import OptionReader, SpecOption
from attntrace.model.errors import BadInput
from attntrace.model.formula import Word, sym

BLOCK_KEYS = {"block", "block_part", "position", "P", "norm1", "norm2", "norm3", "norm4", "ffn"}
ARRANGEMENTS = ("post_ln", "pre_ln", "llama", "sandwich")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh")
#: a gated FFN's activation key -> its extra["activation"]: SwiGLU (Shazeer 2020), GeGLU with tanh GELU (Gemma)
GATED = {"silu": "swiglu", "gelu_tanh": "geglu"}
PARTS = ("self_attention",)
#: operand name -> (its symbol in formulas, entry base in symbolic mode)
BLOCK_OPERANDS = {
    "P": (sym("P"), "p"),
    # the norms' gains and biases are named as the norms are (N, N^f): gamma, beta and gamma^f, beta^f
    "gamma_1": (sym("gamma"), "\\gamma"), "beta_1": (sym("beta"), "\\beta"),
    "gamma_2": (sym("gamma", sup="f"), "\\gamma^{f}"), "beta_2": (sym("beta", sup="f"), "\\beta^{f}"),
    # a sandwich block's norms of the sublayers' outputs (O-hat, F-hat)
    "gamma_3": (sym("gamma", sup="o"), "\\gamma^{o}"), "gamma_4": (sym("gamma", sup="F"), "\\gamma^{F}"),
    "W_1": (sym("W", "1"), "w^{h}"), "b_1": (sym("b", "1"), "b^{h}"), "W_2": (sym("W", "2"), "w^{f}"), "b_2": (sym("b", "2"), "b^{f}"),
    "W_gate": (sym("W", Word("gate", roman=True)), "w^{g}"), "W_up": (sym("W", Word("up", roman=True)), "w^{u}"),
    "W_down": (sym("W", Word("down", roman=True)), "w^{d}"),
}
_FFN_KEYS = {"W_1", "b_1", "W_2", "b_2", "activation"}
_SWIGLU_KEYS = {"W_gate", "W_up", "W_down"}
_GATED_KEYS = _SWIGLU_KEYS | {"activation"}


def _vector(raw: Any) -> Any:
    """A gain or bias may be written as a flat list: one row."""
    if isinstance(raw, list) and raw and not isinstance(raw[0], (list, dict)):
        return [raw]
    return raw


def _eps(value: Any, key: str) -> float:
    return float(real_number(value, f"{key}.eps", "a number in [0, 1)", low_closed=True, high=1, text=False))


def _instead_of_ffn(options: tuple[SpecOption, ...]) -> tuple[SpecOption, ...]:
    """The kinds' options that take the place of the feed-forward network (a mixture of experts)."""
    return tuple(o for o in options if o.instead_of == "ffn")


def block_options(data: Mapping[str, Any], mode: str, operand: Callable, options: tuple[SpecOption, ...] = ()) -> tuple[dict, dict]:
    """(operands, extra) of the block keys in `data`; `operand(raw, name, mode, head, symbol)` makes one;
    `options`: the kinds' spec options, of which those `instead_of` a block key are read here."""
    replacing = _instead_of_ffn(options)
    ops: dict = {}
    extra: dict = {}
    position = data.get("position")
    if "P" in data:
        if position not in (None, "learned"):
            raise BadInput("give position = \"sinusoidal\" or a learned table P, not both")
        position = "learned"
    if position is not None:
        if position not in ("sinusoidal", "learned"):
            raise BadInput(f"position must be \"sinusoidal\" (or give a learned table P), not {position!r}"[:200])
        if position == "learned" and "P" not in data:
            raise BadInput("position = \"learned\" needs the table P (one row per token, d_model columns)")
        extra["position"] = position
    if "P" in data:
        ops["P"] = operand(data["P"], "P", mode, None, "p")
    block = data.get("block")
    if block is None:
        for key in ("norm1", "norm2", "norm3", "norm4", "ffn") + tuple(o.key for o in replacing) + ("block_part",):
            if key in data:
                raise BadInput(f"{key} belongs to a Transformer block: give block = \"post_ln\", \"pre_ln\", \"llama\" or \"sandwich\" as well")
        return ops, extra
    if block not in ARRANGEMENTS:
        raise BadInput(f"block must be one of {', '.join(ARRANGEMENTS)}, not {block!r}"[:200])
    if "X" not in data:
        raise BadInput("a Transformer block starts from X (with W_Q, W_K, W_V)")
    if data.get("backward") is not None:
        raise BadInput("backward differentiates attention alone; it does not go through the block's norms and feed-forward network (drop block or backward)")
    extra["block"] = block
    part = data.get("block_part")
    if part is not None:
        if part not in PARTS:
            raise BadInput(f"block_part must be \"self_attention\" (or left out for the whole block), not {part!r}"[:200])
        for key in ("norm2", "ffn"):
            if key in data:
                raise BadInput(f"block_part = \"self_attention\" stops after attention's residual and norm1: drop {key}")
        extra["block_part"] = part
    llama = block in ("llama", "sandwich")  # RMSNorm and a gated FFN
    sandwich = block == "sandwich"
    extra["norm"] = "rms" if llama else "layer"
    for key in ("norm3", "norm4"):
        if key in data and not sandwich:
            raise BadInput(f"{key} norms a sublayer's output before its residual: it belongs to block = \"sandwich\" (Gemma 2)")
    norms = (1, 3) if part and sandwich else (1,) if part else (1, 2, 3, 4) if sandwich else (1, 2)
    if part and "norm4" in data:
        raise BadInput("block_part = \"self_attention\" stops after attention's residual: drop norm4")
    for i in norms:
        table = data.get(f"norm{i}", {})
        if not isinstance(table, Mapping):
            raise BadInput(f"norm{i} must be a table {{gain = [...], bias = [...], eps = 1e-5}}")
        allowed = {"gain", "eps"} | ({"gain_offset"} if llama else {"bias"})
        bad = sorted(set(table) - allowed)
        if bad:
            raise BadInput(f"unknown key {bad[0]!r} in norm{i}; allowed: {', '.join(sorted(allowed))}"
                           + (" (RMSNorm has no bias)" if llama and bad[0] == "bias" else ""))
        extra[f"eps{i}"] = _eps(table.get("eps", 1e-5), f"norm{i}")
        if table.get("gain_offset", 0) not in (0, 1) or isinstance(table.get("gain_offset"), bool):
            raise BadInput(f"norm{i}.gain_offset must be 0 or 1 (1: the gain is 1 + gain, as Gemma's RMSNorm)")
        if table.get("gain_offset"):
            extra[f"offset{i}"] = 1
        for key, name in (("gain", f"gamma_{i}"), ("bias", f"beta_{i}")):
            if key in table:
                ops[name] = operand(_vector(table[key]), name, mode, None, BLOCK_OPERANDS[name][1])
    if part:
        for option in replacing:
            if option.key in data:
                raise BadInput(f"block_part = \"self_attention\" stops after attention's residual and norm1: drop {option.key}")
        return ops, extra
    for option in replacing:  # e.g. a mixture of experts in place of the feed-forward network
        if option.key in data:
            reader = OptionReader(mode, data, 1, operand=operand)
            extra[option.key] = option.parse(data[option.key], reader)
            ops.update(reader.shared)
            return ops, extra
    ffn = data.get("ffn")
    if not isinstance(ffn, Mapping):
        raise BadInput("a block needs its feed-forward network: ffn = {W_1 = ..., W_2 = ...}" if not llama
                       else f"a {block} block needs its feed-forward network: ffn = {{W_gate = ..., W_up = ..., W_down = ...}}")
    need, allowed = (_SWIGLU_KEYS, _GATED_KEYS) if llama else ({"W_1", "W_2"}, _FFN_KEYS)
    bad = sorted(set(ffn) - allowed)
    if bad:
        raise BadInput(f"unknown key {bad[0]!r} in ffn; allowed: {', '.join(sorted(allowed))}"
                       + (f" (a {block} block's FFN is gated: SwiGLU or GeGLU)" if llama else ""))
    missing = sorted(need - set(ffn))
    if missing:
        raise BadInput(f"ffn needs {', '.join(missing)}")
    if llama:
        if ffn.get("activation", "silu") not in GATED:
            raise BadInput(f"a gated ffn.activation must be \"silu\" (SwiGLU) or \"gelu_tanh\" (GeGLU), not {ffn.get('activation')!r}"[:200])
        activation = GATED[ffn.get("activation", "silu")]
    else:
        activation = ffn.get("activation", "relu")
    if activation not in ACTIVATIONS + tuple(GATED.values()):
        raise BadInput(f"ffn.activation must be one of {', '.join(ACTIVATIONS)}, not {activation!r}"[:200])
    extra["activation"] = activation
    for key in [k for k in ("W_1", "b_1", "W_2", "b_2", "W_gate", "W_up", "W_down") if k in ffn]:  # the order they act in
        raw = _vector(ffn[key]) if key.startswith("b_") else ffn[key]
        ops[key] = operand(raw, key, mode, None, BLOCK_OPERANDS[key][1])
    return ops, extra


def check_ffn_shapes(problem, d_model: int) -> None:
    """Refuse FFN weights that cannot chain: (d_model, d_ff) then (d_ff, d_model)."""
    names = ("W_gate", "W_up", "W_down") if problem.extra.get("activation") in GATED.values() else ("W_1", "W_2")
    shapes = {n: problem.shared[n].shape for n in names}
    first, last = shapes[names[0]], shapes[names[-1]]
    if first[0] != d_model or last[1] != d_model or last[0] != first[1] or (len(names) == 3 and shapes["W_up"] != first):
        shown = ", ".join(f"{n} {s}" for n, s in shapes.items())
        raise BadInput(f"ffn weights do not chain for d_model = {d_model}: {shown}; need (d_model, d_ff) then (d_ff, d_model)")


def check_block(problem, options: tuple[SpecOption, ...] = ()) -> None:
    """Shapes that must agree before anything is computed (one line each); `options`: the kinds'
    spec options, whose checks run here for those given in place of the feed-forward network."""
    if problem.extra.get("block") is None:
        return
    d_model = problem.shared["X"].shape[1]
    replacing = [o for o in _instead_of_ffn(options) if o.key in problem.extra]
    for option in replacing:
        if option.check is not None:
            option.check(problem)
    if not replacing and problem.extra.get("block_part") is None:
        check_ffn_shapes(problem, d_model)
    for name in ("gamma_1", "beta_1", "gamma_2", "beta_2", "gamma_3", "gamma_4", "b_1", "b_2"):
        op = problem.shared.get(name)
        if op is None:
            continue
        width = problem.shared["W_1"].shape[1] if name == "b_1" else d_model
        if op.shape != (1, width):
            raise BadInput(f"{name} has shape {op.shape}, expected (1, {width})")
