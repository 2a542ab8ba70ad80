"""The views of newer step kinds, each in a module of its own, imported here so they register.

A kind whose `view` is not one of StepView's build_* methods is laid out by a function
registered with `attntrace.rendering.stepview.register_view`; add its module's import below.
"""

from __future__ import annotations

from attntrace.rendering import maskview  # noqa: E402,F401 - the masked step (causal alignments, window, padding)
from attntrace.rendering import alibiview, ropeview  # noqa: E402,F401 - each registers its view
from attntrace.rendering import blockview  # noqa: E402,F401 - the Transformer block (sums, norms, activations, positions)
from attntrace.rendering import gradview  # noqa: E402,F401 - the backward pass (attntrace.kinds.backward)
from attntrace.rendering import onlineview  # noqa: E402,F401 - the online softmax (attntrace.kinds.online)
from attntrace.rendering import cacheview  # noqa: E402,F401 - the KV-cache steps (K_cache, V_cache)
