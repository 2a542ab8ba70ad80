"""The masked step's view: StepView's matrices (the kept pattern M, then T-tilde), plus what
the prose needs to name the mask: its kind, the rule it keeps as math, the window, the
padding keys. The rule is written here (numbers filled in) so templates do no arithmetic."""

from __future__ import annotations

from attntrace.rendering.stepview import register_view


def _shift(o, base: str, k: int) -> str:
    """i + 2, i - 1, i: the query's position shifted by k, in TeX or plain."""
    if k == 0:
        return base
    return f"{base} + {k}" if k > 0 else f"{base} - {-k}"


def _rules(o, d) -> dict:
    """The kept keys as math: causal j <= i + offset; window i + offset - W < j."""
    off, w = d.get("offset") or 0, d.get("window")
    le = " <= " if o.plain else " \\le "
    rules = {"causal_rule": f"j{le}{_shift(o, 'i', off)}", "offset": off}
    if w is not None:
        rules["window_rule"] = f"{_shift(o, 'i', off - w)} < j{le}{_shift(o, 'i', off)}"
        rules["window_general"] = f"i - W < j{le}i"
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
