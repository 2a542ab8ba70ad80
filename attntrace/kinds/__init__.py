"""Step kinds: each kind is one unit (id, inputs, computation, formula, names, view, prose, mistakes).

`HEAD_PIPELINE` is the order in which the per-head kinds run; `COMBINE_PIPELINE` the kinds
that combine the heads. A kind runs when it is enabled for the problem (its start, scale,
mask, ... settings). To add a kind: write its module here, put it in a pipeline, add its
block (`templates/steps/{id}.j2`, else its view's, else the default) and its prose `templates/prose/{en,zh}/{prose}.j2`.
"""

from __future__ import annotations

from attntrace.kinds.base import Flow, Kind
from attntrace.kinds.cache import K_CACHE, V_CACHE
from attntrace.kinds.block import BLOCK_KINDS, BLOCK_PIPELINES, block_pipelines  # noqa: F401 - PRE/POST of the block
from attntrace.kinds.alibi import BIASED
from attntrace.kinds.bias import SCORE_BIAS
from attntrace.kinds.backward import BACKWARD_COMBINE, BACKWARD_HEAD, BACKWARD_INPUTS
from attntrace.kinds.heads import CONCAT, OUTPUT
from attntrace.kinds.mask import MASKED
from attntrace.kinds.projection import K, Q, V
from attntrace.kinds.rope import K_ROPE, Q_ROPE
from attntrace.kinds.scale import SCALED
from attntrace.kinds.scores import SCORES
from attntrace.kinds.softmax import WEIGHTS
from attntrace.kinds.online import ONLINE_KINDS, ONLINE_Z
from attntrace.kinds.mla import MLA_ABSORB_KINDS, MLA_KINDS

HEAD_PIPELINE: tuple[Kind, ...] = (Q, K, V, *MLA_KINDS, Q_ROPE, K_ROPE, K_CACHE, V_CACHE, SCORES, *MLA_ABSORB_KINDS, SCALED, BIASED, SCORE_BIAS, MASKED, WEIGHTS, ONLINE_Z)
COMBINE_PIPELINE: tuple[Kind, ...] = (CONCAT, OUTPUT)

#: The backward pass (spec key `backward`, `run --backward`), after the forward steps: the kinds
#: before the heads (from the output back to the concatenation), per head, then back to the inputs.
BACKWARD_PIPELINE: tuple[tuple[Kind, ...], ...] = (BACKWARD_COMBINE, BACKWARD_HEAD, BACKWARD_INPUTS)

#: Every kind by step id.
KINDS: dict[str, Kind] = {k.id: k for k in HEAD_PIPELINE + COMBINE_PIPELINE + BACKWARD_COMBINE + BACKWARD_HEAD + BACKWARD_INPUTS + BLOCK_KINDS + ONLINE_KINDS}


def kind_of(step_id: str) -> Kind:
    """The kind of a step id (KeyError for an unknown id)."""
    return KINDS[step_id]


__all__ = ["Flow", "Kind", "HEAD_PIPELINE", "COMBINE_PIPELINE", "BACKWARD_PIPELINE", "KINDS", "kind_of"]
