"""Step kinds: each kind is one unit (id, inputs, computation, formula, names, view, prose,
mistakes, spec options, pipeline position), declared in its own module.

`attntrace.kinds.registry` derives the registries from the modules' declarations (kept in
`attntrace.kinds.manifest`) and imports a kind module only when a problem can use it:
`head_pipeline(problem)` (the per-head kinds in the order their `after`/`before` declarations
give), `combine_pipeline(problem)` (the kinds that combine the heads), `block_pipelines(problem)`,
`KINDS` (every kind by step id, its module imported on lookup). A kind runs when it is enabled
for the problem (its start, scale, mask, ... settings). To add a kind: see "How to add a kind"
in docs/DESIGN.md.

The registries over every kind (`HEAD_PIPELINE`, `COMBINE_PIPELINE`, `BACKWARD_PIPELINE`,
`BLOCK_PIPELINES`, `BLOCK_KINDS`, `SPEC_OPTIONS`, `MISTAKES`) are attributes computed on first
use: reading one imports every kind module (the checker's catalogue, the tests).
"""

from __future__ import annotations

from attntrace.kinds.base import Flow, Kind, Mistake
from attntrace.kinds import registry
from attntrace.kinds.registry import KINDS, block_pipelines, combine_pipeline, head_pipeline  # noqa: F401


def kind_of(step_id: str) -> Kind:
    """The kind of a step id (KeyError for an unknown id)."""
    return KINDS[step_id]


def _every(name: str):
    """The registry `name` over every kind module (all imported)."""
    from attntrace.kinds import manifest

    if name in ("HEAD_PIPELINE", "COMBINE_PIPELINE"):
        return registry.pipeline_of(manifest.PIPELINES[name.split("_")[0].lower()], None)
    if name == "BLOCK_PIPELINES":  # arrangement -> (PRE, POST)
        return {a: (registry.pipeline_of(pre, None), registry.pipeline_of(manifest.PIPELINES["block_post"][a], None))
                for a, pre in manifest.PIPELINES["block_pre"].items()}
    if name == "BLOCK_KINDS":
        return tuple(dict.fromkeys(k for pre, post in _every("BLOCK_PIPELINES").values() for k in pre + post))
    if name == "BACKWARD_PIPELINE":  # the kinds before the heads (from the output back), per head, back to the inputs
        from attntrace.kinds import backward

        return (backward.BACKWARD_COMBINE, backward.BACKWARD_HEAD, backward.BACKWARD_INPUTS)
    if name == "SPEC_OPTIONS":
        return registry.all_spec_options()
    if name == "MISTAKES":
        return registry.mistakes()
    raise AttributeError(f"module 'attntrace.kinds' has no attribute {name!r}")


def __getattr__(name: str):
    value = _every(name)
    globals()[name] = value
    return value


__all__ = ["Flow", "Kind", "Mistake", "HEAD_PIPELINE", "COMBINE_PIPELINE", "BACKWARD_PIPELINE", "KINDS", "MISTAKES", "SPEC_OPTIONS",
           "kind_of", "head_pipeline", "combine_pipeline", "block_pipelines"]
