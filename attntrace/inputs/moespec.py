"""The spec key `moe`: a mixture of experts in place of a llama block's feed-forward network.

    block = "llama"
    [moe]
    router = "softmax"          # Mixtral (Jiang et al. 2024): G = softmax over the top-k logits
           | "sigmoid"          # DeepSeek-V3 (arXiv 2412.19437, eqs. 12-16): sigmoid scores, group-limited top-k
    W_router = [...]            # (d_model, E): logits L = N W_router
    top_k = 2
    experts = [{W_gate = ..., W_up = ..., W_down = ...}, ...]   # E SwiGLU experts
                                # (each may add b_gate, b_up, b_down: gpt-oss's expert biases)
    activation = "swiglu"       # or "clamped_swiglu" (gpt-oss): gate min(., limit), up clip(., -limit, limit),
    alpha = 1.702               #   (up + 1) * gate * sigmoid(alpha * gate)
    limit = 7.0
    logit_bias = [...]          # (E): added to the logits (gpt-oss's router bias; softmax router)
    shared = {W_gate = ..., W_up = ..., W_down = ...}          # optional: a shared expert every token uses
    # router = "sigmoid" only:
    bias = [...]                # (E): added to the scores to choose (DeepSeek-V3's bias), not to weigh
    n_group = 1                 # experts in n_group groups; each token picks topk_group groups first,
    topk_group = 1              #   by the sum of each group's two best scores
    normalize = true            # the chosen scores divided by their sum (norm_topk_prob)
    scaling = 1.0               # then times routed_scaling_factor
    route = [[1, 2], ...]       # the chosen experts of each token (1-based); needed in symbolic mode

Expert e's matrices are operands E_gate, E_up, E_down of index e (shown W_gate^(e), ...), its
biases Eb_gate, Eb_up, Eb_down; the shared expert's are S_gate, S_up, S_down. The options go to Problem.extra["moe"].
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from attntrace.inputs.numbers import real_number, whole_number
from attntrace.inputs.options import OptionReader
from attntrace.model.errors import BadInput
from attntrace.model.formula import Word, sym

#: operand name -> (its symbol in formulas, entry base in symbolic mode)
MOE_OPERANDS = {
    "W_router": (sym("W", "r"), "w^{r}"), "router_bias": (sym("b", sup="r"), "b^{r}"),
    "E_gate": (sym("W", Word("gate", roman=True)), "w^{g}"), "E_up": (sym("W", Word("up", roman=True)), "w^{u}"),
    "E_down": (sym("W", Word("down", roman=True)), "w^{d}"),
    "S_gate": (sym("W", Word("gate", roman=True), "s"), "w^{sg}"), "S_up": (sym("W", Word("up", roman=True), "s"), "w^{su}"),
    "S_down": (sym("W", Word("down", roman=True), "s"), "w^{sd}"),
    "Eb_gate": (sym("b", Word("gate", roman=True)), "b^{g}"), "Eb_up": (sym("b", Word("up", roman=True)), "b^{u}"),
    "Eb_down": (sym("b", Word("down", roman=True)), "b^{d}"), "logit_bias": (sym("b", sup="r"), "b^{r}"),  # the softmax router's (router_bias is the sigmoid router's)
}
ACTIVATIONS = ("swiglu", "clamped_swiglu")
ROUTERS = ("softmax", "sigmoid")
_KEYS = {"router", "W_router", "top_k", "experts", "shared", "bias", "n_group", "topk_group", "normalize", "scaling", "route",
         "activation", "alpha", "limit", "logit_bias"}
_EXPERT = ("W_gate", "W_up", "W_down")
_BIASES = ("b_gate", "b_up", "b_down")
MAX_EXPERTS = 64


def _expert(table: Any, what: str, prefix: str, index, mode: str, operand: Callable, biases: bool = False) -> dict:
    if not isinstance(table, Mapping):
        raise BadInput(f"{what} must be a table {{W_gate = ..., W_up = ..., W_down = ...}}")
    bad = sorted(set(table) - set(_EXPERT) - (set(_BIASES) if biases else set()))
    if bad:
        raise BadInput(f"unknown key {bad[0]!r} in {what}; an expert is a SwiGLU network: W_gate, W_up, W_down"
                       + (", and its biases b_gate, b_up, b_down" if biases else ""))
    missing = [k for k in _EXPERT if k not in table]
    if missing:
        raise BadInput(f"{what} needs {', '.join(missing)}")
    out = {}
    for k in _EXPERT:
        name = f"{prefix}_{k[2:]}"
        out[name] = operand(table[k], name, mode, index, MOE_OPERANDS[name][1])
    for k in (b for b in _BIASES if b in table):
        name = f"{prefix}b_{k[2:]}"
        out[name] = operand(_as_row(table[k]), name, mode, index, MOE_OPERANDS[name][1])
    return out


def _as_row(raw: Any) -> Any:
    """A bias written as a flat list ([0.1, -0.2]) is one row."""
    return [raw] if isinstance(raw, list) and raw and not isinstance(raw[0], (list, dict)) else raw


def _per_expert(table: Mapping, key: str, name: str, n_exp: int, mode: str, operand: Callable):
    """moe.<key>: one number per expert, a (1, n_exp) row."""
    op = operand(_as_row(table[key]), name, mode, None, MOE_OPERANDS[name][1])
    if op.shape != (1, n_exp):
        raise BadInput(f"moe.{key} has shape {op.shape}, expected (1, {n_exp}): one per expert")
    return op


def parse_moe(table: Any, reader: OptionReader) -> dict[str, Any]:
    """The spec's `moe` table -> Problem.extra["moe"]; its matrices become operands of the trace
    (keyed uniquely: expert e's E_gate@e). Read with the block's keys, in place of `ffn`."""
    ops, extra = _moe_options(table, reader.data, reader.mode, reader.operand)
    for key, op in ops.items():
        reader.share(op, key)
    return extra


def _moe_options(table: Any, data: Mapping[str, Any], mode: str, operand: Callable) -> tuple[dict, dict]:
    """(operands keyed uniquely, extra) of the spec's `moe` table."""
    if not isinstance(table, Mapping):
        raise BadInput("moe must be a table {router = ..., W_router = ..., top_k = ..., experts = [...]}")
    bad = sorted(set(table) - _KEYS)
    if bad:
        raise BadInput(f"unknown key {bad[0]!r} in moe; allowed: {', '.join(sorted(_KEYS))}")
    if data.get("block") != "llama":
        raise BadInput("moe replaces the SwiGLU feed-forward network of a llama block: give block = \"llama\"")
    if "ffn" in data:
        raise BadInput("give ffn or moe, not both: the mixture of experts replaces the feed-forward network")
    router = table.get("router", "softmax")
    if router not in ROUTERS:
        raise BadInput(f"moe.router must be \"softmax\" (Mixtral) or \"sigmoid\" (DeepSeek-V3), not {router!r}"[:200])
    experts = table.get("experts")
    if not isinstance(experts, list) or not experts:
        raise BadInput("moe.experts must be a non-empty list of tables {W_gate = ..., W_up = ..., W_down = ...}")
    if len(experts) > MAX_EXPERTS:
        raise BadInput(f"moe.experts lists {len(experts)} experts; at most {MAX_EXPERTS}")
    n_exp = len(experts)
    if "W_router" not in table:
        raise BadInput("moe needs W_router (d_model, number of experts)")
    ops: dict = {"W_router": operand(table["W_router"], "W_router", mode, None, MOE_OPERANDS["W_router"][1])}
    d_model = operand(data["X"], "X", mode, None, "x").shape[1] if "X" in data else None
    if ops["W_router"].shape != (d_model, n_exp):
        raise BadInput(f"moe.W_router has shape {ops['W_router'].shape}, expected ({d_model}, {n_exp}): one column per expert")
    biased = [any(b in t for b in _BIASES) if isinstance(t, Mapping) else False for t in experts]
    if any(biased) and not all(all(b in t for b in _BIASES) for t in experts):
        raise BadInput("expert biases: give every expert all three of b_gate, b_up, b_down, or none")
    for e, t in enumerate(experts, start=1):
        for name, op in _expert(t, f"moe.experts[{e}]", "E", e, mode, operand, biases=True).items():
            ops[f"{name}@{e}"] = op
    if "shared" in table:
        ops.update(_expert(table["shared"], "moe.shared", "S", None, mode, operand))
    for key, op in ops.items():
        if key.startswith(("E_", "S_")):
            _check_expert_shape(key, op, d_model, ops)
        if key.startswith("Eb_"):
            width = ops[key.replace("Eb_", "E_")].shape[1]
            if op.shape != (1, width):
                raise BadInput(f"moe {key.replace('@', ' of expert ')} has shape {op.shape}, expected (1, {width}): one per column of its W")
    top_k = whole_number(table.get("top_k", 2), "moe.top_k", low=1, high=n_exp, what=f"be a whole number from 1 to {n_exp} (the experts)")
    extra: dict[str, Any] = {"router": router, "top_k": top_k, "experts": n_exp, "shared": "shared" in table, "biases": all(biased)}
    activation = table.get("activation", "swiglu")
    if activation not in ACTIVATIONS:
        raise BadInput(f"moe.activation must be \"swiglu\" or \"clamped_swiglu\" (gpt-oss), not {activation!r}"[:200])
    extra["activation"] = activation
    if activation == "clamped_swiglu":
        extra["alpha"] = real_number(table.get("alpha", 1.702), "moe.alpha", "a positive number")
        extra["limit"] = real_number(table.get("limit", 7.0), "moe.limit", "a positive number")
    else:
        for key in ("alpha", "limit"):
            if key in table:
                raise BadInput(f"moe.{key} belongs to activation = \"clamped_swiglu\" (gpt-oss's experts)")
    if router == "sigmoid":
        if "logit_bias" in table:
            raise BadInput("moe.logit_bias belongs to the softmax router (gpt-oss); the sigmoid router's bias steers the choice: moe.bias")
        n_group = whole_number(table.get("n_group", 1), "moe.n_group", low=1, high=n_exp, what="be a whole number that divides the experts")
        topk_group = whole_number(table.get("topk_group", n_group), "moe.topk_group", low=1, high=n_group, what=f"be from 1 to n_group = {n_group}")
        if n_exp % n_group:
            raise BadInput(f"moe.n_group = {n_group} does not divide the {n_exp} experts")
        if n_group > 1 and n_exp // n_group < 2:
            raise BadInput("a group ranks by the sum of its two best scores: each group needs at least 2 experts")
        if top_k > topk_group * (n_exp // n_group):
            raise BadInput(f"moe.top_k = {top_k} but the {topk_group} chosen group(s) hold only {topk_group * (n_exp // n_group)} experts")
        normalize = table.get("normalize", True)
        if not isinstance(normalize, bool):
            raise BadInput("moe.normalize must be true or false")
        scaling = real_number(table.get("scaling", 1.0), "moe.scaling", "a positive number")
        extra.update(n_group=n_group, topk_group=topk_group, normalize=normalize, scaling=scaling)
        if "bias" in table:
            ops["router_bias"] = _per_expert(table, "bias", "router_bias", n_exp, mode, operand)
    else:
        if "logit_bias" in table:
            ops["logit_bias"] = _per_expert(table, "logit_bias", "logit_bias", n_exp, mode, operand)
        for key in ("bias", "n_group", "topk_group", "normalize", "scaling"):
            if key in table:
                raise BadInput(f"moe.{key} belongs to the sigmoid router (DeepSeek-V3); the softmax router (Mixtral) renormalises over its top-k")
    if "route" in table:
        extra["route"] = _route(table["route"], top_k, n_exp)
    elif mode == "symbolic":
        raise BadInput("symbols have no order, so the router cannot choose experts in symbolic mode: give moe.route = [[1, 2], ...] (each token's experts)")
    return ops, extra


def _route(raw: Any, top_k: int, n_exp: int) -> tuple[tuple[int, ...], ...]:
    if not isinstance(raw, list) or not all(isinstance(r, list) for r in raw):
        raise BadInput("moe.route must list each token's chosen experts: [[1, 2], [2, 3], ...]")
    out = []
    for i, row in enumerate(raw, start=1):
        es = tuple(whole_number(e, f"moe.route[{i}]", low=1, high=n_exp, what=f"list experts from 1 to {n_exp}") for e in row)
        if len(es) != top_k or len(set(es)) != top_k:
            raise BadInput(f"moe.route[{i}] must list {top_k} different experts (top_k = {top_k})")
        out.append(es)
    return tuple(out)


def _check_expert_shape(key: str, op, d_model, ops) -> None:
    part = key.split("@")[0]
    if part.endswith(("gate", "up")) and op.shape[0] != d_model:
        raise BadInput(f"moe {key.replace('@', ' of expert ')} has {op.shape[0]} rows; it reads rows of width d_model = {d_model}")
    if part.endswith("down"):
        gate = ops[key.replace("down", "gate")]
        if op.shape != (gate.shape[1], d_model):
            raise BadInput(f"moe {key.replace('@', ' of expert ')} has shape {op.shape}, expected ({gate.shape[1]}, {d_model})")
    if part.endswith("up") and op.shape != ops[key.replace("up", "gate")].shape:
        raise BadInput(f"moe {key.replace('@', ' of expert ')} has shape {op.shape}, but W_gate {ops[key.replace('up', 'gate')].shape}")


def check_route(problem) -> None:
    route = problem.extra["moe"].get("route")
    n = problem.shared["X"].shape[0]
    if route is not None and len(route) != n:
        raise BadInput(f"moe.route lists {len(route)} tokens but there are {n}")
