"""Every registry of step kinds, derived from the kinds' own declarations (never edited by hand),
and the kind modules imported only when a problem can use them.

What each kind module declares is read once, by importing every module, and written to
`attntrace.kinds.manifest` (`python scripts/write_kind_manifest.py` writes it;
tests/test_kind_manifest.py checks that it is what the modules declare today). A process reads the manifest and imports a
kind module only when it is needed: a numeric report of plain attention imports 13 kind modules,
not 30 (importing the tracer took 13.6 ms, now 8.5, on the bench machine).

What the modules declare:

- their `Kind` instances: `pipeline` ("head", "combine") with `after` / `before` say where a
  kind runs; the head and combine pipelines are those constraints sorted (ties keep the order
  the kinds were found in), and a kind that names an unknown id is refused; the Transformer
  block's kinds ("block_pre", "block_post") also say in which arrangements they run
  (`blocks`): each arrangement's (PRE, POST), sorted alike;
- `SPEC_OPTIONS` (`attntrace.inputs.options.SpecOption`): the spec keys a module reads, which
  the tracer passes to `inputs.spec.load_spec` (`spec_options`: only the modules of the keys a
  spec uses are imported);
- `RUNS_WITH`: the Problem.extra keys or operand names one of which a problem must have for
  any kind of the module to run (RoPE's kinds: "rope"); a module without it may run for any
  problem and is always imported. A kind of a module that is not imported is taken as not
  enabled: tests/test_kind_manifest.py traces every example with every module imported and
  with only those a problem runs with, and checks that no kind of another module is enabled;
- `OPERANDS`: the matrices a module brings (name -> formula symbol, entry base name);
- its kinds' `mistakes` that are `Mistake` declarations: `MISTAKES`, code -> (kind, mistake),
  which the checker's catalogue, planting and sentences read.

So a new kind is a module here (plus its prose templates and, after running the writer above,
its lines of the manifest); nothing else lists it.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from types import ModuleType
from typing import Iterable, Iterator, Mapping

from attntrace.inputs.blockspec import ARRANGEMENTS
from attntrace.inputs.options import DeclaredOptions, SpecOption
from attntrace.kinds import manifest
from attntrace.kinds.base import Kind, Mistake

#: Modules of this package that hold no kinds of their own.
_SKIP = {"registry", "base", "context", "notation", "manifest"}

#: A kind as the manifest names it: (module, its index among the module's Kind instances, its id).
Ref = tuple[str, int, str]


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"attntrace.kinds.{name}")


def _declared_in(module: ModuleType) -> list[Kind]:
    """Every Kind instance of the module's namespace (tuples of kinds opened), each once, in order."""
    seen: dict[int, Kind] = {}
    for value in vars(module).values():
        for k in value if isinstance(value, tuple) else (value,):
            if isinstance(k, Kind):
                seen.setdefault(id(k), k)
    return list(seen.values())


@functools.cache
def _instances(name: str) -> tuple[Kind, ...]:
    return tuple(_declared_in(_module(name)))


def kind_at(ref: Ref) -> Kind:
    """The kind the manifest names (`ref`), its module imported if it was not."""
    return _instances(ref[0])[ref[1]]


# -- which modules a problem needs ----------------------------------------------------------------
def features(problem) -> frozenset[str]:
    """What a module's `RUNS_WITH` is compared with: the problem's options (Problem.extra keys)
    and the names of its operands, shared and per head (a KV cache's K_past)."""
    names = set(problem.extra) | set(problem.shared)
    for ops in problem.heads:
        names.update(ops)
    return frozenset(names)


def modules_for(problem) -> frozenset[str]:
    """The kind modules whose kinds may run for `problem`: those without `RUNS_WITH` and those
    whose `RUNS_WITH` names something the problem has."""
    have = features(problem)
    return frozenset(name for name, m in manifest.MODULES.items() if m["runs_with"] is None or have & set(m["runs_with"]))


def pipeline_of(refs: Iterable[Ref], on: frozenset[str] | None = None) -> tuple[Kind, ...]:
    """The kinds `refs` names, those of the modules `on` only (None: every one)."""
    return tuple(kind_at(r) for r in refs if on is None or r[0] in on)


def head_kinds_with(ids) -> tuple[Kind, ...]:
    """The per-head kinds whose ids are in `ids` (a trace's steps), in pipeline order."""
    return tuple(kind_at(r) for r in manifest.PIPELINES["head"] if r[2] in ids)


def head_pipeline(problem) -> tuple[Kind, ...]:
    """The per-head kinds that may run for `problem`, in pipeline order (each still asks `enabled`)."""
    return pipeline_of(manifest.PIPELINES["head"], modules_for(problem))


def combine_pipeline(problem) -> tuple[Kind, ...]:
    """The kinds after the heads (the concatenation, the output projection) for `problem`."""
    return pipeline_of(manifest.PIPELINES["combine"], modules_for(problem))


def block_pipelines(problem) -> tuple[tuple[Kind, ...], tuple[Kind, ...]]:
    """(PRE, POST) for the problem's arrangement (no block: only position encodings, if any);
    with block_part = "self_attention", POST holds only the first sublayer's kinds."""
    block = problem.extra.get("block")
    on = modules_for(problem)
    pre = pipeline_of(manifest.PIPELINES["block_pre"][block], on)
    post = pipeline_of(manifest.PIPELINES["block_post"][block], on)
    if problem.extra.get("block_part") == "self_attention":
        post = tuple(k for k in post if k.attention_sublayer)
    return pre, post


def spec_options(keys: Iterable[str]) -> tuple[SpecOption, ...]:
    """The `SpecOption`s of `keys` (spec keys some kind module declares), in module order: only
    the modules that declare them are imported."""
    keys = set(keys)
    return tuple(o for name, m in manifest.MODULES.items() if keys & set(m["spec_keys"])
                 for o in getattr(_module(name), "SPEC_OPTIONS", ()) if o.key in keys)


#: What the tracer passes to `inputs.spec.load_spec`: every declared key (for the unknown-key
#: check) and the loader of the options a spec uses.
DECLARED_OPTIONS = DeclaredOptions(frozenset(k for m in manifest.MODULES.values() for k in m["spec_keys"]), spec_options)


def operand_module(name: str) -> ModuleType | None:
    """The kind module that brings the operand `name` (its `OPERANDS`), imported; None if none does."""
    owner = manifest.OPERANDS.get(name)
    return None if owner is None else _module(owner)


class _Kinds(Mapping):
    """Every kind by step id (`attntrace.kinds.KINDS`): the ids are the manifest's; looking one
    up imports its module. Iterating the values imports every kind module."""

    def __getitem__(self, step_id: str) -> Kind:
        return kind_at(manifest.KINDS[step_id])

    def __iter__(self) -> Iterator[str]:
        return iter(manifest.KINDS)

    def __len__(self) -> int:
        return len(manifest.KINDS)

    def __contains__(self, step_id) -> bool:
        return step_id in manifest.KINDS


KINDS: Mapping[str, Kind] = _Kinds()
#: The ids of the Transformer block's kinds (before attention and after the output projection).
BLOCK_IDS: frozenset[str] = frozenset(manifest.BLOCK_IDS)
#: View -> the module of attntrace.rendering that lays it out (`Kind.view_module`), of every kind.
VIEW_MODULES: Mapping[str, str] = manifest.VIEWS
#: Meaning key -> the prose module whose `words` macro says it (`build_manifest`).
MEANING_PROSE: Mapping[str, str] = manifest.MEANINGS


# -- every module at once: the checker, the tests and the manifest's writer -------------------------
def module_names() -> list[str]:
    """The kind modules of this package, in name order (stable on every install)."""
    import pkgutil

    package = importlib.import_module("attntrace.kinds")
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.name not in _SKIP)


@functools.cache
def all_modules() -> tuple[ModuleType, ...]:
    return tuple(_module(n) for n in module_names())


def all_kinds() -> list[Kind]:
    """Every kind instance the modules define (a kind of another pipeline included), each once."""
    seen: dict[int, Kind] = {}
    for name in module_names():
        for k in _instances(name):
            seen.setdefault(id(k), k)
    return list(seen.values())


def all_spec_options() -> tuple[SpecOption, ...]:
    """Every spec key a kind declares, in module order."""
    return tuple(o for m in all_modules() for o in getattr(m, "SPEC_OPTIONS", ()))


@functools.cache
def mistakes() -> dict[str, tuple[Kind, Mistake]]:
    """code -> (the kind it changes first, its declaration), for the mistakes kinds declare as `Mistake`."""
    found: dict[str, tuple[Kind, Mistake]] = {}
    for code, ref in manifest.MISTAKES.items():
        kind = kind_at(ref)
        found[code] = (kind, next(m for m in kind.mistakes if isinstance(m, Mistake) and str(m) == code))
    return found


def resolve_order(kinds: list[Kind], known: set[str]) -> tuple[Kind, ...]:
    """The kinds of one pipeline sorted so that each runs after its `after` ids and before its
    `before` ids (those in this pipeline); ties keep the given order. A cycle, a repeated id
    or an anchor that no kind has is a programming error, refused when the manifest is built."""
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


def build_manifest() -> dict[str, object]:
    """What every kind module declares, as the manifest holds it (every module imported)."""
    names = module_names()
    owner: dict[int, Ref] = {}  # a kind -> the first module (in name order) that holds it
    found: list[Kind] = []
    for name in names:
        for i, k in enumerate(_instances(name)):
            if id(k) not in owner:
                owner[id(k)] = (name, i, k.id)
                found.append(k)
    known = {k.id for k in found}

    def refs(kinds) -> tuple[Ref, ...]:
        return tuple(owner[id(k)] for k in kinds)

    def block(pipeline: str, arrangement: str | None) -> tuple[Kind, ...]:
        return resolve_order([k for k in found if k.pipeline == pipeline and (k.blocks is None or arrangement in k.blocks)], known)

    head = resolve_order([k for k in found if k.pipeline == "head"], known)
    combine = resolve_order([k for k in found if k.pipeline == "combine"], known)
    blocks = {a: (block("block_pre", a), block("block_post", a)) for a in (None,) + ARRANGEMENTS}
    block_kinds = tuple(dict.fromkeys(k for pre, post in blocks.values() for k in pre + post))
    backward, online = _module("backward"), _module("online")
    # of the kinds that share an id, the one its pipeline runs last wins; then any other kind
    by_id: dict[str, Kind] = {k.id: k for k in head + combine + backward.BACKWARD_COMBINE + backward.BACKWARD_HEAD
                              + backward.BACKWARD_INPUTS + block_kinds + online.ONLINE_KINDS}
    for k in found:
        by_id.setdefault(k.id, k)
    options = [(name, o) for name in names for o in getattr(_module(name), "SPEC_OPTIONS", ())]
    if len({o.key for _, o in options}) != len(options):
        raise RuntimeError("two kind modules declare the same spec key")
    mistakes: dict[str, Ref] = {}
    for k in head + combine + tuple(found):
        for m in k.mistakes:
            if isinstance(m, Mistake):
                mistakes.setdefault(str(m), owner[id(k)])
    views: dict[str, str] = {}
    for k in by_id.values():
        if k.view_module is not None and views.setdefault(k.view, k.view_module) != k.view_module:
            raise RuntimeError(f"view {k.view!r} is laid out by {views[k.view]!r} and {k.view_module!r}: give it one module")
    operands: dict[str, str] = {}
    for name in names:
        for op in getattr(_module(name), "OPERANDS", {}):
            operands.setdefault(op, name)
    return {
        "MODULES": {name: {"runs_with": getattr(_module(name), "RUNS_WITH", None),
                           "spec_keys": tuple(o.key for n, o in options if n == name)} for name in names},
        "PIPELINES": {"head": refs(head), "combine": refs(combine),
                      "block_pre": {a: refs(pre) for a, (pre, _) in blocks.items()},
                      "block_post": {a: refs(post) for a, (_, post) in blocks.items()}},
        "BLOCK_IDS": tuple(dict.fromkeys(k.id for k in block_kinds)),
        "KINDS": {i: owner[id(k)] for i, k in by_id.items()},
        "MISTAKES": mistakes,
        "VIEWS": views,
        "OPERANDS": operands,
        "MEANINGS": _meaning_prose(list(by_id.values()), operands),
    }


def _meaning_prose(kinds: list[Kind], operands: Mapping[str, str]) -> dict[str, str]:
    """Meaning key -> the prose module of the kind that makes it (its matrix, or a symbol of its
    formula, or a key its `notation` adds: `added_meanings`), where the notation table looks for
    the key's words (macro `words`) before the table of shared words in
    templates/prose/{lang}/notation.j2; an operand a module brings (its OPERANDS) takes the prose
    of that module's kinds. The first kind to declare a key keeps it."""
    found: dict[str, str] = {}
    for kind in kinds:
        if kind.prose:
            found.setdefault(kind.meaning or kind.id, kind.prose)
            for key in [key for _, key, _ in kind.symbols] + list(kind.added_meanings):
                found.setdefault(key, kind.prose)
    for op, name in operands.items():
        module = _module(name)
        prose = next((v.prose for v in vars(module).values()
                      if isinstance(v, Kind) and type(v).__module__ == module.__name__ and v.prose), None)
        if prose:
            found.setdefault(op, prose)
    return found


_HEADER = '''"""What every kind module declares, read without importing them (`attntrace.kinds.registry`).

Written by `python scripts/write_kind_manifest.py` from the kind modules; do not edit by hand
(tests/test_kind_manifest.py checks that it matches the modules). A kind is named by
(module, index among the module's Kind instances).
"""

# fmt: off
'''


def manifest_text(data: dict[str, object] | None = None) -> str:
    """The manifest module's source for `data` (default: what the modules declare now)."""
    import pprint

    data = build_manifest() if data is None else data
    parts = [_HEADER]
    for key, value in data.items():
        parts.append(f"{key} = {pprint.pformat(value, width=120, sort_dicts=False)}\n")
    return "\n".join(parts)


def write_manifest() -> Path:
    path = Path(__file__).with_name("manifest.py")
    path.write_text(manifest_text(), encoding="utf-8")
    return path
