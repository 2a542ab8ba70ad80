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


from attntrace.budget import check_budget
from attntrace.inputs.spec import KV_KEYS, Problem, load_spec
from attntrace.kinds.registry import DECLARED_OPTIONS, block_pipelines, combine_pipeline, head_pipeline
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
            if name in KV_KEYS and "num_kv_heads" in ctx.p.extra:  # K, V: shared by a group of query heads
                state[role].ref = f"{name}@{ops[name].head}"
    state["d_k"] = ctx.p.d_k
    return state


def _head_kinds(p: Problem) -> list:
    """The head kinds that run for this problem, in pipeline order: the enabled ones, less those
    an enabled kind replaces. A kind's `enabled` reads only the problem, so this is asked once
    per trace, not once per head (a BERT layer has 12 heads and the pipeline 40 kinds)."""
    on = [kind for kind in head_pipeline(p) if kind.enabled(p)]
    replaced = {r for kind in on for r in kind.replaces}
    return [kind for kind in on if kind.id not in replaced]


def _run_head(ctx: Context, head, ops, kinds: list) -> dict:
    """A head's forward pipeline (`kinds`, from `_head_kinds`); returns its state (Z, and what
    the backward pass reads)."""
    state = _head_state(ctx, ops)
    for kind in kinds:
        flow = kind.compute(ctx, head, state)
        if flow is not None:
            state[kind.writes] = flow
    return state


def _run_backward(ctx: Context, heads, states: list[dict], top: dict) -> None:
    """The backward pass (`kinds.backward`): the kinds before the heads on the combined state,
    each head's kinds on its own forward state (which sees the combined one as "top"), then
    the kinds after the heads, which see every head's state as "states"."""
    from attntrace.kinds.backward import BACKWARD_COMBINE as before, BACKWARD_HEAD as per_head, BACKWARD_INPUTS as after

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
    layer = _run_layer(ctx, block_pre, {"X": ctx.operand(p.shared["X"])} if "X" in p.shared else {})
    attn_in = layer.get("attn_in") or layer.get("X")
    if attn_in is not None and attn_in.ref != "X":
        ctx.sources["X"] = attn_in
    heads = list(range(1, len(p.heads) + 1)) if multi else [None]
    backward = p.extra.get("backward") is not None
    # without a backward pass a finished head leaves only its Z: its other values are freed
    # unless recorded (what keep= bounds)
    kinds = _head_kinds(p)
    states = [st if backward else {"Z": st.get("Z")} for st in (_run_head(ctx, h, ops, kinds) for h, ops in zip(heads, p.heads))]
    zs = [s.get("Z") for s in states]
    state = {"heads": zs, "Z": zs[0]}
    for kind in combine_pipeline(p):
        if kind.enabled(p):
            flow = kind.compute(ctx, None, state)
            if flow is not None:
                state[kind.writes] = flow
    if block_post:
        _run_layer(ctx, block_post, {**layer, "O": state.get("O") or state.get("Z")})
    if p.start == "Z" and not multi and "W_O" not in p.shared:
        raise BadInput("a single Z needs W_O or more heads to trace anything")
    # Trace.output: the last of these, never a gradient (0: the forward result was not kept)
    forward_steps = len(ctx.steps) if ctx.last_kept else 0
    if backward:
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
        **({"not_kept": tuple(ctx.not_kept), "not_kept_shapes": tuple(ctx.not_kept_shapes)} if ctx.keep is not None else {}),
    }
    return Trace(mode=p.mode, steps=tuple(ctx.steps), operands=operands, title=p.title, num_heads=len(p.heads), settings=settings)


def trace(problem: Problem, keep=None) -> Trace:
    """Run the problem and record every step, or with `keep` (step ids such as "weights", or
    keys such as "weights@2") only those: the others are computed, their values freed as soon
    as no later step reads them, and their keys listed in settings["not_kept"]."""
    keep = _keep_names(keep)
    check_budget(problem, keep)
    ctx = Context(problem, keep)
    if not ctx.numeric:
        return _run(ctx)
    with ctx.watch.errstate():  # overflow is noted as it happens and refused per step by emit, not warned
        out = _run(ctx)
    _check_kept(ctx, out)
    return out


def _keep_names(keep) -> frozenset[str] | None:
    """keep= as given (a list of names, or one string "a,b") -> a set of step ids and keys."""
    if keep is None:
        return None
    names = keep.split(",") if isinstance(keep, str) else keep
    if not isinstance(names, (list, tuple, set, frozenset)) or not all(isinstance(k, str) for k in names):
        raise BadInput("keep is a list of step ids or keys, e.g. [\"weights\", \"output\"]")
    names = frozenset(k.strip() for k in names if k.strip())
    if not names:
        raise BadInput("keep names no step; give step ids such as weights,output")
    return names


def _check_kept(ctx: Context, out: Trace) -> None:
    """Every name in keep must be a step of this trace: a misspelt id would silently keep nothing."""
    if ctx.keep is None:
        return
    seen = {s.id for s in out.steps} | {s.key for s in out.steps}
    for key in ctx.not_kept:
        seen.update((key, key.partition("@")[0]))
    unknown = sorted(ctx.keep - seen)
    if unknown:
        ids = ", ".join(dict.fromkeys([s.id for s in out.steps] + list(ctx.ids_not_kept)))
        raise BadInput(f"keep names {unknown[0]!r}, which is not a step of this trace (its steps: {ids})"[:400])


def trace_spec(spec, mode: str | None = None, *, copy: bool = True, keep=None, **overrides) -> Trace:
    """Trace `spec` (a dict, a path to a TOML/JSON file, or the name of a built-in example);
    overrides replace spec keys (scale, d_k, mask, title, expand, ...). `attntrace.run`.
    copy=False: writable float64 arrays are not copied (the caller will not change them);
    keep: record only these steps (`trace`)."""
    return trace(load_problem(resolve_spec(spec), mode=mode, copy=copy, **overrides), keep=keep)


def load_problem(spec, mode: str | None = None, *, copy: bool = True, **overrides) -> Problem:
    """A spec -> its Problem, with the spec keys every step kind declares (read from the kinds'
    manifest; the modules of the keys the spec uses are imported)."""
    return load_spec(spec, mode=mode, options=DECLARED_OPTIONS, copy=copy, **overrides)
