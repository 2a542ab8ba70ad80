"""How each step is computed, right or with a usual mistake, and the mistakes read off a
student's numbers.

Two kinds of mistakes are recognised:

- *planted* (`mutations`, `apply`): a step kind computed the wrong way in the student's world
  (K Q^T, no scaling, softmax down columns, V A, ...). The checker recomputes the world with
  each one and names those that reproduce the student's values; when several do, none can be
  told apart from the others and the diagnosis lists them all;
- *read off* (`read_off`): mistakes with no single wrong computation to plant: entries off by
  about one unit of the last decimal (`rounding`), a few entries wrong and the rest right
  (`arithmetic_slip`), and those a kind reads off its own numbers (masked scores set to a
  finite number, rows of weights that do not sum to 1). They are judged against what the
  student should have got from their own earlier values.

Every computation is over intervals (`intervals.Box`), by the step's kind (`Kind.carry`);
each mistake is declared by the kind of the step it changes (`attntrace.kinds.base.Mistake`).
"""

from __future__ import annotations

import numpy as np

from attntrace.grading import intervals
from attntrace.grading.answer import KIND_CODES, AnswerMatrix, Policy
from attntrace.grading.catalogue import TRANSPOSED, Mutation
from attntrace.grading.intervals import Box
from attntrace.grading.kindcarry import TOOLKIT, rule_of
from attntrace.kinds import KINDS, MISTAKES

#: `rounding`: every wrong entry within this many units of its last written decimal.
ROUNDING_UNITS = 1.5


# -- the mistakes worth planting in this trace -------------------------------------------------
def mutations(world) -> list[Mutation]:
    """Every catalogued mistake that can be made in this trace, in catalogue order: each kind's
    declared mistakes, then `transposed` in each step kind that can be transposed."""
    trace = world.trace
    found: list[Mutation] = []
    for kind, mistake in MISTAKES.values():
        found += mistake.plantings(kind, trace)
    for step_id in dict.fromkeys(s.id for s in world.steps):
        kind = KINDS.get(step_id)
        if kind is None or kind.transposable:
            found.append(Mutation(TRANSPOSED, step_id))
    return found


# -- computing a step, right or with a planted mistake ---------------------------------------------
def apply(world, step, args: list[Box], mutation: Mutation | None) -> Box:
    """This step's value (an interval) from its inputs, computed right or with `mutation`, by
    its kind's `carry`; a kind with none (the bias gradients, dX_kv) at its true value: the
    checker still judges it (correct, or wrong with a read-off diagnosis), but a mistake made
    before it is not carried through it."""
    m = mutation if mutation is not None and mutation.changes(step.id) else None
    kind = rule_of(step.id)
    if kind is None:
        result = intervals.point(world.truth[world.key(step)])
    else:
        result = kind.carry(TOOLKIT, step, args, m)
    return result.T if m == TRANSPOSED else result


# -- mistakes read off the student's numbers -------------------------------------------------------
def accepted(step, answer: AnswerMatrix, truth: np.ndarray, policy: Policy) -> str | None:
    """A remark code when the kind accepts these wrong-looking values (`Kind.accepts`), else None."""
    kind = KINDS.get(step.id)
    if kind is None or answer.shape != tuple(truth.shape):
        return None
    return kind.accepts(step, answer.values, truth, lambda: answer.ok_mask(truth, truth, policy))


def _read_offs(step_id: str) -> tuple:
    """The mistakes the kind of `step_id` reads off the student's numbers: (those that explain
    the wrong entries, the others)."""
    found = _READ_OFFS.get(step_id)
    if found is None:
        kind = KINDS.get(step_id)
        declared = [m for m in getattr(kind, "mistakes", ()) if getattr(m, "read_off", None) is not None]
        found = _READ_OFFS[step_id] = (tuple(m for m in declared if m.explains), tuple(m for m in declared if not m.explains))
    return found


_READ_OFFS: dict[str, tuple] = {}


#: ROUNDING_UNITS units of the d-th decimal, d = 0..400 (Python's numbers, looked up).
_ROUNDING_SLACK = np.array([ROUNDING_UNITS * 10.0 ** -d for d in range(401)], dtype=np.float64)


def read_off(step, answer: AnswerMatrix, reference: Box, policy: Policy) -> list[tuple[str, dict]]:
    """The mistakes the student's numbers show against `reference` (what they should have got
    from their own earlier values), most specific first: each (code, its numbers): `rounding`,
    then the kind's read-off mistakes that explain the wrong entries, else `arithmetic_slip`,
    then the kind's others (a symptom seen next to the cause: rows not summing to 1)."""
    if answer.shape != reference.shape:
        return []
    bad = ~answer.ok_mask(reference.lo, reference.hi, policy)
    n_wrong = int(bad.sum())
    if not n_wrong:
        return []
    found = []
    wrong = np.argwhere(bad)
    cells = lambda: [(int(i) + 1, int(j) + 1) for i, j in wrong]  # noqa: E731 - only when named
    decimal = answer.kinds == KIND_CODES["decimal"]
    if decimal[bad].all():
        slack = _ROUNDING_SLACK[np.minimum(answer.decimals, 400)]
        # within ROUNDING_UNITS units of the last decimal written: Policy(atol=...) entry by entry
        lo, hi, v = reference.lo, reference.hi, answer.values
        with np.errstate(invalid="ignore", over="ignore"):
            nearest = np.minimum(np.maximum(v, lo), hi)
            near = np.abs(v - nearest) <= slack * (1 + 1e-12)
        near &= ~(np.isnan(lo) | np.isnan(hi)) & ~(np.isinf(lo) | np.isinf(hi))
        if near[bad].all():
            found.append(("rounding", {"cells": cells(), "decimals": int(answer.decimals[bad].max())}))
    explaining, others = _read_offs(step.id)
    allowed = lambda: answer.allowed(np.abs(answer.values), policy)  # noqa: E731 - only when asked
    for mistake in explaining:
        numbers = mistake.read_off(step, answer, reference, bad, allowed)
        if numbers is not None:
            found.append((str(mistake), numbers))
    size = answer.shape[0] * answer.shape[1]
    if not found and n_wrong < size and n_wrong <= max(1, size // 4):
        found.append(("arithmetic_slip", {"cells": cells()}))
    for mistake in others:
        numbers = mistake.read_off(step, answer, reference, bad, allowed)
        if numbers is not None:
            found.append((str(mistake), numbers))
    return found


#: Read-off mistakes listed as alternatives of a planted one that reproduces the numbers too:
#: every mistake a kind reads off its numbers (finite masked scores, rows not summing to 1).
SHOWN_ALONGSIDE = frozenset(code for code, (_, mistake) in MISTAKES.items() if mistake.read_off is not None)
