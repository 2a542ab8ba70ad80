"""Which module lays out which view (masks, ALiBi, RoPE, the block, gradients, online softmax,
KV cache, element-wise maps): each is imported when a report first needs it.

A kind whose `view` is not one of StepView's build_* methods is laid out by a function
registered with `attntrace.rendering.stepview.register_view` (and may give its shape line
through `viewparts.SHAPE_LINES`). `MODULES` says which module registers which view, so a
report imports only the views of the kinds it shows: start-up stays small as kinds are added.
Views are generic layouts shared by kinds (an element-wise map, a norm, a sum): a new kind
picks one and needs no entry here; only a new layout does.
"""

from __future__ import annotations

import importlib

#: view name -> the module (in attntrace.rendering) that registers it.
MODULES = {
    "masks": "maskview",            # the masked step (causal alignments, window, padding)
    "alibi": "alibiview", "bias": "alibiview",  # ALiBi's bias, a given bias
    "rotation": "ropeview",         # RoPE
    "sum": "blockview", "activation": "blockview", "norm": "blockview", "posenc": "blockview",  # the Transformer block
    "grad": "gradview",             # the backward pass
    "online": "onlineview", "online_z": "onlineview",  # the online softmax, and Z with or without it
    "cache": "cacheview",           # the KV-cache steps
    "sink": "sinkview",             # attention sinks: the sink logit appended to the scores
    "elementwise": "elementview",   # a map of each entry on its own (soft-capping, ...)
    "stack": "mlaview", "absorbed": "mlaview",  # multi-head latent attention's query, key and absorbed scores
    "routing": "moeview", "experts": "moeview", "moe_sum": "moeview",  # a mixture of experts
}


def load(view: str) -> None:
    """Import the module that registers `view` (nothing for a StepView build_* view)."""
    module = MODULES.get(view)
    if module is not None:
        importlib.import_module(f"attntrace.rendering.{module}")
