"""Spec options that step kinds declare: the key, its parser and what it stores in the Problem.

A kind's module says which spec keys it reads (`SpecOption`); `attntrace.kinds.registry`
collects them and the tracer hands them to `inputs.spec.load_spec`, so the spec loader (a
lower layer) learns the options from the kinds without importing them. A parser gets the raw
value and an `OptionReader` (the mode, the whole spec for cross-checks, the matrix reader)
and returns what `Problem.extra[key]` holds, or None for "absent". Every problem it finds is
one line of `BadInput`.

Two kinds of option take the place of a part of the spec and are read where that part would
be: one that makes each head's operands itself (`start`: multi-head latent attention's
projections make Q, K and V from X) is read before the heads, and one that takes the place of
a block key (`instead_of`: a mixture of experts in place of the block's `ffn`) is read with the
block's keys.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from attntrace.inputs.matrices import to_matrix
from attntrace.model.errors import BadInput
from attntrace.model.record import record
from attntrace.model.trace import Operand


@record
class SpecOption:
    """One spec key a kind reads: `parse(value, reader)` -> the value kept in Problem.extra[key]
    (None: the option is off). `what` says in a few words what the key takes, for messages.
    `check(problem)`, when given, runs on the finished Problem when the option is on: what the
    setting needs from the rest of the spec (the start point, the heads, the widths).

    start: the start point of a trace when the option makes each head's operands itself
    (`reader.make_heads`), read before the heads in place of the spec's own start keys;
    instead_of: the Transformer block key it takes the place of (read with the block's keys,
    only in a block), its check run with the block's own."""

    key: str
    parse: Callable[[Any, "OptionReader"], Any]
    what: str = ""
    check: Callable[[Any], None] | None = None
    start: str | None = None
    instead_of: str | None = None


@record
class DeclaredOptions:
    """The spec keys the step kinds declare, without their parsers: `keys` (every key, for the
    unknown-key check) and `load(keys)`, the `SpecOption`s of the keys a spec uses, in the
    kinds' order. The kinds' registry gives it, so that reading a spec imports only the kind
    modules of the keys it has."""

    keys: frozenset[str]
    load: Callable[[frozenset[str]], tuple[SpecOption, ...]]


class OptionReader:
    """What an option parser may use: the trace's mode, the spec's other keys (read only), the
    number of heads, and `matrix(raw, name)`, the spec's own matrix reader (never evaluates
    text). `share(op)` lists a parsed matrix among the trace's given operands (shown in
    reports, read by steps through their `inputs`). An option read in place of a part of the
    spec also has `operand(raw, name, mode, head, symbol)`, the reader of the spec's own
    matrices (named per head in messages), and `make_heads(tables)` gives each head's operands."""

    def __init__(self, mode: str, data: Mapping[str, Any], num_heads: int, operand: Callable[..., Operand] | None = None):
        # a plain class, not a dataclass: @dataclass compiles its methods in every process (start-up)
        self.mode, self.data, self.num_heads, self.operand = mode, data, num_heads, operand
        self.shared: dict[str, Operand] = {}
        self.heads: tuple[Mapping[str, Operand], ...] | None = None

    def matrix(self, raw: Any, name: str, symbol: str) -> Operand:
        value, shape, sym = to_matrix(raw, mode=self.mode, name=name, default_symbol=symbol)
        # the entry names go by `symbol` in every mode (reports name \gamma^{q}_{1j}, not a default x_{1j})
        return Operand(name=name, head=None, value=value, shape=shape, symbol=sym or symbol)

    def share(self, op: Operand, key: str | None = None) -> Operand:
        """List `op` among the given operands, under its name (or `key`: an expert's E_gate@2)."""
        key = op.name if key is None else key
        if key in self.shared:
            raise BadInput(f"{key} is given twice")
        self.shared[key] = op
        return op

    def make_heads(self, tables: tuple[Mapping[str, Operand], ...]) -> None:
        self.heads = tuple(tables)


def split_columns(op: Operand, h: int, mode: str) -> list[Operand]:
    """A matrix cut into h column blocks, one per head (block i is head i + 1's operand)."""
    rows, cols = op.shape
    if cols % h:
        raise BadInput(f"num_heads = {h} does not divide the width of {op.name} {op.shape}")
    w = cols // h
    parts = []
    for i in range(h):
        block = None if op.value is None else op.value[:, i * w:(i + 1) * w]
        if block is not None and mode == "numeric":
            block.setflags(write=False)
        parts.append(Operand(op.name, i + 1, block, (rows, w), op.symbol))
    return parts


def table(value: Any, key: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    """A spec option given as a table: its keys checked against `allowed` (one-line errors)."""
    if not isinstance(value, Mapping):
        raise BadInput(f"{key} must be true, false or a table with keys {', '.join(allowed)}")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise BadInput(f"unknown key {str(unknown[0])[:40]!r} in {key}; allowed: {', '.join(allowed)}")
    return value
