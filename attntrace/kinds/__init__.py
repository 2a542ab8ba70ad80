"""Step kinds: each kind is one unit (id, inputs, computation, formula, names, view, prose,
mistakes, spec options, pipeline position), declared in its own module.

`attntrace.kinds.registry` reads the modules and derives the registries: `HEAD_PIPELINE` (the
per-head kinds in the order their `after`/`before` declarations give), `COMBINE_PIPELINE`
(the kinds that combine the heads), the spec options and the mistakes. A kind runs when it is
enabled for the problem (its start, scale, mask, ... settings). To add a kind: see "How to add a
kind" in docs/DESIGN.md.
"""

from __future__ import annotations

from attntrace.kinds.base import Flow, Kind, Mistake
from attntrace.kinds.backward import BACKWARD_COMBINE, BACKWARD_HEAD, BACKWARD_INPUTS
from attntrace.kinds.online import ONLINE_KINDS
from attntrace.kinds.registry import BLOCK_KINDS, BLOCK_PIPELINES, block_pipelines  # noqa: F401 - PRE/POST of the block
from attntrace.kinds.registry import COMBINE_PIPELINE, HEAD_PIPELINE, MISTAKES, SPEC_OPTIONS, all_kinds

#: The backward pass (spec key `backward`, `run --backward`), after the forward steps: the kinds
#: before the heads (from the output back to the concatenation), per head, then back to the inputs.
BACKWARD_PIPELINE: tuple[tuple[Kind, ...], ...] = (BACKWARD_COMBINE, BACKWARD_HEAD, BACKWARD_INPUTS)

#: Every kind by step id (of the kinds that share an id, the one its pipeline runs last wins).
KINDS: dict[str, Kind] = {k.id: k for k in HEAD_PIPELINE + COMBINE_PIPELINE + BACKWARD_COMBINE + BACKWARD_HEAD + BACKWARD_INPUTS + BLOCK_KINDS + ONLINE_KINDS}
for _k in all_kinds():
    KINDS.setdefault(_k.id, _k)


def kind_of(step_id: str) -> Kind:
    """The kind of a step id (KeyError for an unknown id)."""
    return KINDS[step_id]


__all__ = ["Flow", "Kind", "Mistake", "HEAD_PIPELINE", "COMBINE_PIPELINE", "BACKWARD_PIPELINE", "KINDS", "MISTAKES", "SPEC_OPTIONS",
           "kind_of"]
