"""Limits on input size and work, checked before anything is allocated or computed.

Every limit refuses in one line (`BadInput`, exit status 2) that names the limit and how to
raise it. Defaults keep every accepted job within a few seconds and well under 2 GB on a
small machine; raise them with the environment variable ATTNTRACE_LIMITS, a comma-separated
list of name=value pairs::

    ATTNTRACE_LIMITS="file_mb=100,depth=200,digits=2000,heads=20000" attntrace run big.toml

| name | default | what |
|---|---|---|
| file_mb | 20 | size of a spec or answer file, in MB (10^6 bytes) |
| depth | 64 | nesting of arrays and tables in a spec or answer file |
| digits | 1000 | digits of an integer (files, answers, exact values such as 10^1000) |
| heads | 512 | number of heads (and never more heads than columns to split) |
| numeric_entries | 5000000 | numeric mode: entries of one matrix written as a list, and of all a trace's steps together |
| exact_entries | 10000 | exact and symbolic mode: entries of one matrix |
| exact_cost | 8000 | exact mode: predicted work (operations of the entries times their count) |
| symbolic_cost | 200000 | symbolic mode, named entries: predicted work |
| expanded_cost | 15000 | symbolic mode with expand = "full": predicted work (terms of the expansion) |
| online_blocks | 500 | the online softmax: (query block, key block) pairs over all heads, four steps each |
"""

from __future__ import annotations

import os

from attntrace.model.errors import BadInput

__all__ = ["DEFAULTS", "ENV", "get", "refuse"]

ENV = "ATTNTRACE_LIMITS"

DEFAULTS: dict[str, int] = {
    "file_mb": 20,
    "depth": 64,
    "digits": 1000,
    "heads": 512,
    "numeric_entries": 5_000_000,
    "exact_entries": 10_000,
    "exact_cost": 8_000,
    "symbolic_cost": 200_000,
    "expanded_cost": 15_000,
    "online_blocks": 500,
}

#: digits cannot go higher: Python refuses to print integers of more than 4300 digits.
MAX_DIGITS = 4000

_cache: tuple[str, dict[str, int]] | None = None


def _parse(text: str) -> dict[str, int]:
    out = dict(DEFAULTS)
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip().replace("_", "")
        if not sep or name not in DEFAULTS:
            raise BadInput(f"{ENV}: cannot read {part[:40]!r}; write name=value pairs, names: {', '.join(DEFAULTS)}")
        try:
            number = float(value) if ("e" in value.lower() or "." in value) else int(value)
        except ValueError:
            raise BadInput(f"{ENV}: {name} must be a positive number, not {value[:40]!r}") from None
        if not number > 0 or number > 10**15:
            raise BadInput(f"{ENV}: {name} must be a positive number up to 10^15, not {value[:40]!r}")
        if name == "digits" and number > MAX_DIGITS:
            raise BadInput(f"{ENV}: digits can be at most {MAX_DIGITS} (Python prints integers of at most 4300 digits)")
        out[name] = int(number)
    return out


def get(name: str) -> int:
    """The current value of limit `name` (the default, or ATTNTRACE_LIMITS's)."""
    global _cache
    text = os.environ.get(ENV, "")
    if _cache is None or _cache[0] != text:
        _cache = (text, _parse(text))
    return _cache[1][name]


def refuse(message: str, name: str) -> BadInput:
    """A one-line BadInput for a request over limit `name`, saying how to raise it."""
    return BadInput(f"{message} (limit {name} = {get(name):,}; raise it with {ENV}={name}=N)")
