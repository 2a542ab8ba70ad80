"""Spec options that step kinds declare: the key, its parser and what it stores in the Problem.

A kind's module says which spec keys it reads (`SpecOption`); `attntrace.kinds.registry`
collects them and the tracer hands them to `inputs.spec.load_spec`, so the spec loader (a
lower layer) learns the options from the kinds without importing them. A parser gets the raw
value and an `OptionReader` (the mode, the whole spec for cross-checks, the matrix reader)
and returns what `Problem.extra[key]` holds, or None for "absent". Every problem it finds is
one line of `BadInput`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from attntrace.inputs.matrices import to_matrix
from attntrace.model.errors import BadInput
from attntrace.model.trace import Operand


@dataclass(frozen=True)
class SpecOption:
    """One spec key a kind reads: `parse(value, reader)` -> the value kept in Problem.extra[key]
    (None: the option is off). `what` says in a few words what the key takes, for messages.
    `check(problem)`, when given, runs on the finished Problem when the option is on: what the
    setting needs from the rest of the spec (the start point, the heads, the widths)."""

    key: str
    parse: Callable[[Any, "OptionReader"], Any]
    what: str = ""
    check: Callable[[Any], None] | None = None


@dataclass
class OptionReader:
    """What an option parser may use: the trace's mode, the spec's other keys (read only), the
    number of heads, and `matrix(raw, name)`, the spec's own matrix reader (never evaluates
    text). `share(op)` lists a parsed matrix among the trace's given operands (shown in
    reports, read by steps through their `inputs`)."""

    mode: str
    data: Mapping[str, Any]
    num_heads: int
    shared: dict[str, Operand] = field(default_factory=dict)

    def matrix(self, raw: Any, name: str, symbol: str) -> Operand:
        value, shape, sym = to_matrix(raw, mode=self.mode, name=name, default_symbol=symbol)
        # the entry names go by `symbol` in every mode (reports name \gamma^{q}_{1j}, not a default x_{1j})
        return Operand(name=name, head=None, value=value, shape=shape, symbol=sym or symbol)

    def share(self, op: Operand) -> Operand:
        if op.name in self.shared:
            raise BadInput(f"{op.name} is given twice")
        self.shared[op.name] = op
        return op


def table(value: Any, key: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    """A spec option given as a table: its keys checked against `allowed` (one-line errors)."""
    if not isinstance(value, Mapping):
        raise BadInput(f"{key} must be true, false or a table with keys {', '.join(allowed)}")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise BadInput(f"unknown key {str(unknown[0])[:40]!r} in {key}; allowed: {', '.join(allowed)}")
    return value
