"""The numbers of a spec's options, read by one pair of functions.

Every integer option (window, num_heads, num_kv_heads, d_k, the online softmax's block sizes,
RoPE positions) goes through `whole_number`, every real one (scale, rope.base, ALiBi slopes,
the norms' eps) through `real_number`. A TOML or JSON integer has no size limit and a Python
dict may hold NumPy scalars, so both check the type and the range *before* anything converts
the value to a float or a C integer: 2^63 or 10^400 is a one-line `BadInput`, never an
OverflowError from NumPy or `float()`. Bounds are stated in the message.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from attntrace.model.errors import BadInput

#: The largest a count or index may be (positions, windows): angles m * theta and index
#: arithmetic stay far inside float64's exact integers and int64.
MAX_INDEX = 10**9


def shown(value: Any) -> str:
    """A value for a one-line message: at most 40 characters, a long integer by its digits."""
    if isinstance(value, Integral) and not isinstance(value, bool):
        text = str(int(value))
        return text if len(text) <= 20 else f"{text[:12]}... ({len(text)} digits)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def bound(n: int) -> str:
    """10^9 for a power of ten past 1000, else the integer itself."""
    k = len(str(n)) - 1
    return f"10^{k}" if n >= 10_000 and n == 10**k else str(n)


def _is_integer(value: Any) -> bool:
    """Python and NumPy integers; not bool (True is an int), not a float that happens to be whole."""
    return isinstance(value, Integral) and not isinstance(value, bool) and type(value).__name__ != "bool_"


def whole_number(value: Any, key: str, *, low: int = 1, high: int | None = MAX_INDEX, what: str | None = None) -> int:
    """An integer in [low, high] as a Python int; anything else is one line naming `key`.
    `high = None`: no upper bound (a count checked later against what it counts).

    `what` completes "key must ...", e.g. "list integer positions from 0 to 10^9"."""
    must = what or ("be a positive integer" + (f" (at most {bound(high)})" if high is not None else "") if low == 1
                    else f"be an integer from {low} to {bound(high)}" if high is not None else f"be an integer from {low}")
    if not _is_integer(value):
        raise BadInput(f"{key} must {must}, not {shown(value)}")
    n = int(value)
    if n < low:
        raise BadInput(f"{key} must {must}, not {shown(n)}")
    if high is not None and n > high:
        raise BadInput(f"{key} = {shown(n)} is too large: it must {must}")
    return n


def real_number(value: Any, key: str, what: str, *, low: float = 0.0, low_closed: bool = False,
                high: float = math.inf, text: bool = True):
    """A finite number in (low, high) ([low, high) with `low_closed`), given as an int, a
    float or, with `text`, an exact string ("1/2", "2^-3", read by the whitelist parser).

    Returns the number as given (an int, a float or a SymPy number), so that exact mode keeps
    it exact; its size is checked on a float that saturates to infinity instead of overflowing.
    """
    from attntrace.inputs.expr import parse_expr  # the whitelist parser (never eval)

    allowed = (Real, str) if text else (Real,)
    if isinstance(value, bool) or type(value).__name__ == "bool_" or not isinstance(value, allowed):
        raise BadInput(f"{key} must be {what}, not {shown(value)}")
    try:
        number = parse_expr(value, allow_symbols=False) if isinstance(value, str) else value
    except BadInput as exc:
        raise BadInput(f"{key}: {exc}") from None
    try:
        size = float(number)
    except OverflowError:
        size = math.inf if number > 0 else -math.inf
    except (TypeError, ValueError):
        size = math.nan
    above = size >= low if low_closed else size > low
    if not (above and size < high and math.isfinite(size)):
        raise BadInput(f"{key} must be {what}, not {shown(value)}")
    return number


__all__ = ["MAX_INDEX", "bound", "real_number", "shown", "whole_number"]
