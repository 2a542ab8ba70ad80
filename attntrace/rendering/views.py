"""Which module lays out which view (masks, ALiBi, RoPE, the block, gradients, online softmax,
KV cache, element-wise maps): each is imported when a report first needs it.

A kind whose `view` is not one of StepView's build_* methods is laid out by a function
registered with `attntrace.rendering.stepview.register_view` (and may give its shape line
through `viewparts.SHAPE_LINES`), in the module its `Kind.view_module` names. `modules()`
collects those declarations, so a report imports only the views of the kinds it shows and a
new kind, or a new layout, needs no entry here.
"""

from __future__ import annotations

import importlib
from typing import Mapping

from attntrace.kinds.registry import VIEW_MODULES


def modules() -> Mapping[str, str]:
    """View name -> the module (in attntrace.rendering) that registers it, as the kinds declare
    (`Kind.view_module`, collected in the kinds' manifest: no kind module is imported)."""
    return VIEW_MODULES


def load(view: str) -> None:
    """Import the module that registers `view` (nothing for a StepView build_* view)."""
    module = modules().get(view)
    if module is not None:
        importlib.import_module(f"attntrace.rendering.{module}")
