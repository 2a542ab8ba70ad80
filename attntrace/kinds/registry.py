"""Every registry of step kinds, derived from the kinds' own declarations (never edited by hand).

Each module of `attntrace.kinds` is imported once, in name order, and read:

- its `Kind` instances: `pipeline` ("head", "combine") with `after` / `before` say where a
  kind runs; `HEAD_PIPELINE` and `COMBINE_PIPELINE` are those constraints sorted (ties keep
  the order the kinds were found in), and a kind that names an unknown id is refused here;
  the Transformer block's kinds ("block_pre", "block_post") also say in which arrangements
  they run (`blocks`): `BLOCK_PIPELINES` holds each arrangement's (PRE, POST), sorted alike;
- its `SPEC_OPTIONS` (`attntrace.inputs.options.SpecOption`): the spec keys it reads, which
  the tracer passes to `inputs.spec.load_spec`;
- its kinds' `mistakes` that are `Mistake` declarations: `MISTAKES`, code -> (kind, mistake),
  which the checker's catalogue, planting and sentences read.

So a new kind is a module here (plus its prose templates); nothing else lists it.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from attntrace.inputs.blockspec import ARRANGEMENTS
from attntrace.inputs.options import SpecOption
from attntrace.kinds.base import Kind, Mistake

_SKIP = {"registry", "base", "context", "notation"}  # notation: collects what the kinds declare


def _modules() -> list[ModuleType]:
    """The kind modules of this package, in name order (stable on every install)."""
    package = importlib.import_module("attntrace.kinds")
    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name not in _SKIP)
    return [importlib.import_module(f"attntrace.kinds.{n}") for n in names]


def _declared(modules: list[ModuleType]) -> list[Kind]:
    """Every Kind instance the modules define, each once, in the order found."""
    seen: dict[int, Kind] = {}
    for module in modules:
        for value in vars(module).values():
            candidates = value if isinstance(value, tuple) else (value,)
            for k in candidates:
                if isinstance(k, Kind):
                    seen.setdefault(id(k), k)
    return list(seen.values())


def resolve_order(kinds: list[Kind], known: set[str]) -> tuple[Kind, ...]:
    """The kinds of one pipeline sorted so that each runs after its `after` ids and before its
    `before` ids (those in this pipeline); ties keep the given order. A cycle, a repeated id
    or an anchor that no kind has is a programming error, refused at import."""
    ids = [k.id for k in kinds]
    if len(set(ids)) != len(ids):
        raise RuntimeError(f"two kinds of one pipeline share an id: {sorted(i for i in ids if ids.count(i) > 1)}")
    edges: dict[str, set[str]] = {i: set() for i in ids}  # id -> ids that must come first
    for k in kinds:
        for anchor in k.after + k.before:
            if anchor not in known:
                raise RuntimeError(f"kind {k.id} is placed relative to {anchor!r}, which is no kind's id")
        edges[k.id].update(a for a in k.after if a in edges)
        for b in k.before:
            if b in edges:
                edges[b].add(k.id)
    order: list[Kind] = []
    placed: set[str] = set()
    while len(order) < len(kinds):
        ready = next((k for k in kinds if k.id not in placed and edges[k.id] <= placed), None)
        if ready is None:
            raise RuntimeError(f"the kinds {sorted(set(ids) - placed)} are placed in a cycle")
        order.append(ready)
        placed.add(ready.id)
    return tuple(order)


MODULES = _modules()
_ALL = _declared(MODULES)
_KNOWN = {k.id for k in _ALL}

HEAD_PIPELINE: tuple[Kind, ...] = resolve_order([k for k in _ALL if k.pipeline == "head"], _KNOWN)
COMBINE_PIPELINE: tuple[Kind, ...] = resolve_order([k for k in _ALL if k.pipeline == "combine"], _KNOWN)



def _block_pipeline(pipeline: str, arrangement: str | None) -> tuple[Kind, ...]:
    """The block kinds of one pipeline ("block_pre", "block_post") in one arrangement (None: no
    block, where only the kinds of every arrangement, the position encodings, run)."""
    return resolve_order([k for k in _ALL if k.pipeline == pipeline and (k.blocks is None or arrangement in k.blocks)], _KNOWN)


#: arrangement -> (PRE, POST): the kinds before attention and after the output projection.
BLOCK_PIPELINES: dict[str | None, tuple[tuple[Kind, ...], tuple[Kind, ...]]] = {
    a: (_block_pipeline("block_pre", a), _block_pipeline("block_post", a)) for a in (None,) + ARRANGEMENTS}
#: arrangement -> POST with block_part = "self_attention": the first sublayer's kinds only.
SELF_ATTENTION_POST: dict[str, tuple[Kind, ...]] = {
    a: tuple(k for k in BLOCK_PIPELINES[a][1] if k.attention_sublayer) for a in ARRANGEMENTS}
#: Every block kind (for KINDS; kinds of one id share their names, view and prose).
BLOCK_KINDS: tuple[Kind, ...] = tuple(dict.fromkeys(k for pre, post in BLOCK_PIPELINES.values() for k in pre + post))


def block_pipelines(problem) -> tuple[tuple[Kind, ...], tuple[Kind, ...]]:
    """(PRE, POST) for the problem's arrangement (no block: only position encodings, if any)."""
    block = problem.extra.get("block")
    pre, post = BLOCK_PIPELINES[block]
    if problem.extra.get("block_part") == "self_attention":
        post = SELF_ATTENTION_POST[block]
    return pre, post


#: Every spec key a kind declares, in module order.
SPEC_OPTIONS: tuple[SpecOption, ...] = tuple(o for m in MODULES for o in getattr(m, "SPEC_OPTIONS", ()))
if len({o.key for o in SPEC_OPTIONS}) != len(SPEC_OPTIONS):
    raise RuntimeError("two kind modules declare the same spec key")

#: code -> (the kind it changes first, its declaration), for the mistakes kinds declare as `Mistake`.
MISTAKES: dict[str, tuple[Kind, Mistake]] = {}
for _kind in HEAD_PIPELINE + COMBINE_PIPELINE + tuple(_ALL):
    for _m in _kind.mistakes:
        if isinstance(_m, Mistake):
            MISTAKES.setdefault(str(_m), (_kind, _m))


def all_kinds() -> list[Kind]:
    """Every kind instance the modules define (a kind of another pipeline included)."""
    return list(_ALL)
