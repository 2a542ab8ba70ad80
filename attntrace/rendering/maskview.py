"""The masked step's view: StepView's matrices (the kept pattern M, then T-tilde), plus what
the prose needs to name the mask: its kind, the rule it keeps as math, the window, the
padding keys. The rule is written here (numbers filled in) so templates do no arithmetic."""

from __future__ import annotations

from attntrace.model import formula as F
from attntrace.rendering.stepview import register_view


def _shift(base: F.Node, k: int) -> F.Node:
    """i + 2, i - 1, i: the query's position shifted by k."""
    return base if k == 0 else base + k if k > 0 else base - (-k)


def _rules(o, d) -> dict:
    """The kept keys as math: causal j <= i + offset; window i + offset - W < j."""
    off, w = d.get("offset") or 0, d.get("window")
    i, j = F.sym("i"), F.sym("j")
    rules = {"causal_rule": o.math(F.Rel((j, _shift(i, off)), ("le",))), "offset": off}
    if w is not None:
        rules["window_rule"] = o.math(F.Rel((_shift(i, off - w), j, _shift(i, off)), ("lt", "le")))
        rules["window_general"] = o.math(F.Rel((i - F.sym("W"), j, i), ("lt", "le")))
        rules["window_before"] = w - 1
    return rules


@register_view("masks")
def build_masks(sv, vm) -> None:
    """The mask's matrices as before; its kind, rule, window and padding keys for the prose."""
    sv.build_masked(vm)
    d, o, extra = sv.s.details, sv.out, vm["extra"]
    extra["kind"] = d.get("kind") or ""
    extra.update(_rules(o, d))
    extra["window"] = d.get("window")
    pad = d.get("key_padding")
    if pad is not None:
        extra["padding"] = [j + 1 for j, p in enumerate(pad) if p]
    extra["square"] = vm["rows"] == vm["cols"]
