"""Problem -> Trace: the step kinds of `attntrace.kinds`, composed for one problem.

The tracer knows no step kind by name. For each head it runs the per-head pipeline over
a small state (the head's operands, then each kind's result under its role: Q, K, V, S,
A, Z), then the kinds that combine the heads. `Context` (`attntrace.kinds.context`) is what a
kind computes with: the problem, the mode's algebra, shape-checked products and `emit`, which
records the Step.
Shapes are checked before any arithmetic, so that numeric, exact, symbolic and shape mode
fail (or succeed) identically, with a one-line message naming the step and both shapes.
"""

from __future__ import annotations

import numpy as np

from attntrace.budget import check_budget
from attntrace.inputs.spec import Problem, load_spec
from attntrace.kinds import BACKWARD_PIPELINE, COMBINE_PIPELINE, HEAD_PIPELINE
from attntrace.kinds.block import block_pipelines
from attntrace.kinds.context import Context
from attntrace.kinds.projection import kv_groups
from attntrace.kinds.mask import mask_setting
from attntrace.model.errors import BadInput
from attntrace.model.trace import Operand, Trace
from attntrace.resources import resolve_spec

#: What an operand named like a step stands in for when the trace starts mid-way.
_OPERAND_ROLES = {"Q": "Q", "K": "K", "V": "V", "scores": "S", "weights": "A", "Z": "Z"}
def _head_state(ctx: Context, ops: dict[str, Operand]) -> dict:
    """A head's starting state: its operands, the given ones standing in for their steps."""
    state: dict = dict(ops)
    for name, role in _OPERAND_ROLES.items():
        if name in ops:
            state[role] = ctx.operand(ops[name])
            if name in ("K", "V") and "num_kv_heads" in ctx.p.extra:  # shared by a group of query heads
                state[role].ref = f"{name}@{ops[name].head}"
    state["d_k"] = ctx.p.d_k
    return state


def _run_head(ctx: Context, head, ops) -> dict:
    """A head's forward pipeline; returns its state (Z, and what the backward pass reads)."""
    p = ctx.p
    state = _head_state(ctx, ops)
    replaced = {r for kind in HEAD_PIPELINE if kind.enabled(p) for r in kind.replaces}
    for kind in HEAD_PIPELINE:
        if kind.id in replaced or not kind.enabled(p):
            continue
        flow = kind.compute(ctx, head, state)
        if flow is not None:
            state[kind.writes] = flow
    return state


def _run_backward(ctx: Context, heads, states: list[dict], top: dict) -> None:
    """The backward pass (`kinds.BACKWARD_PIPELINE`): the kinds before the heads on the combined
    state, each head's kinds on its own forward state (which sees the combined one as "top"), then
    the kinds after the heads, which see every head's state as "states"."""
    before, per_head, after = BACKWARD_PIPELINE
    for st in states:
        st["top"] = top
    top["states"] = states
    for kinds, places in ((before, [(None, top)]), (per_head, list(zip(heads, states))), (after, [(None, top)])):
        for head, state in places:
            for kind in kinds:
                if kind.enabled(ctx.p):
                    flow = kind.compute(ctx, head, state)
                    if flow is not None:
                        state[kind.writes] = flow


def _run_layer(ctx: Context, kinds, state: dict) -> dict:
    """Run per-layer kinds (the block's PRE or POST pipeline) over the layer state."""
    replaced = {r for kind in kinds if kind.enabled(ctx.p) for r in kind.replaces}
    for kind in kinds:
        if kind.id not in replaced and kind.enabled(ctx.p):
            flow = kind.compute(ctx, None, state)
            if flow is not None:
                state[kind.writes] = flow
    return state


def _run(ctx: Context) -> Trace:
    p = ctx.p
    multi = len(p.heads) > 1
    block_pre, block_post = block_pipelines(p)
    layer = _run_layer(ctx, block_pre, {"X": ctx.operand(p.shared["X"])} if block_pre and "X" in p.shared else {})
    attn_in = layer.get("attn_in") or layer.get("X")
    if attn_in is not None and attn_in.ref != "X":
        ctx.sources["X"] = attn_in
    heads = list(range(1, len(p.heads) + 1)) if multi else [None]
    states = [_run_head(ctx, h, ops) for h, ops in zip(heads, p.heads)]
    zs = [s.get("Z") for s in states]
    state = {"heads": zs, "Z": zs[0]}
    for kind in COMBINE_PIPELINE:
        if kind.enabled(p):
            flow = kind.compute(ctx, None, state)
            if flow is not None:
                state[kind.writes] = flow
    if block_post:
        _run_layer(ctx, block_post, {**layer, "O": state.get("O") or state.get("Z")})
    if p.start == "Z" and not multi and "W_O" not in p.shared:
        raise BadInput("a single Z needs W_O or more heads to trace anything")
    forward_steps = len(ctx.steps)  # Trace.output: the last of these, never a gradient
    if p.extra.get("backward") is not None:
        _run_backward(ctx, heads, states, state)
    # the report's "Given" order: the inputs, then each head's matrices, then W_O and b_O
    first = tuple(p.shared[k] for k in ("X", "X_kv") if k in p.shared)
    last = tuple(op for k, op in p.shared.items() if k not in ("X", "X_kv"))
    # a key/value head's matrices are listed once, though a group of query heads shares them
    operands = first + tuple({id(op): op for ops in p.heads for op in ops.values()}.values()) + last
    settings = {
        "start": p.start, "scale": p.scale, "d_k": p.d_k, "mask": mask_setting(p),
        "cross": "X_kv" in p.shared, "full_expansion": p.full_expansion, "description": p.description,
        "tokens": p.tokens, "kv_tokens": p.kv_tokens, "source": p.source, "forward_steps": forward_steps, **p.localized,
        **({"kv_groups": kv_groups(p)} if "num_kv_heads" in p.extra else {}),
    }
    return Trace(mode=p.mode, steps=tuple(ctx.steps), operands=operands, title=p.title, num_heads=len(p.heads), settings=settings)


def trace(problem: Problem) -> Trace:
    """Run the problem and record every step."""
    check_budget(problem)
    ctx = Context(problem)
    if not ctx.numeric:
        return _run(ctx)
    with np.errstate(all="ignore"):  # overflow is reported per step by check_finite, not as warnings
        return _run(ctx)


def trace_spec(spec, mode: str | None = None, **overrides) -> Trace:
    """Trace `spec` (a dict, a path to a TOML/JSON file, or the name of a built-in example);
    overrides replace spec keys (scale, d_k, mask, title, expand, ...). `attntrace.run`."""
    return trace(load_spec(resolve_spec(spec), mode=mode, **overrides))
