"""The checker's reading of the kinds' own declarations: their `carry` rules and `Mistake`s.

A kind declares, in its module, how a step is recomputed from the student's values (`carry`,
written against the interval toolkit below, so the kind never imports the checker) and its
mistakes (`Mistake`: code, the other steps it changes, when it can be made). This module turns
them into what `mistakes` needs: `RULES` (step id -> rule) and `mutations(code, world)`. The
catalogue lists the declared codes (`catalogue.CATALOGUE`), and a code's sentence is the macro
of that name in the kind's prose templates (`messages`).
"""

from __future__ import annotations

import numpy as np

from attntrace.grading import blockrules, intervals
from attntrace.grading.catalogue import Impossible, Mutation, to_float
from attntrace.grading.intervals import Box
from attntrace.kinds import KINDS, MISTAKES


class Toolkit:
    """The interval operations a kind's `carry` rule computes with (valid enclosures: each
    contains every value the computation can give on its input intervals)."""

    Impossible = Impossible
    Box = Box
    point = staticmethod(intervals.point)
    add = staticmethod(intervals.add)
    matmul = staticmethod(intervals.matmul)
    divide = staticmethod(intervals.divide)
    stack = staticmethod(intervals.stack)
    floats = staticmethod(to_float)  # a step's value or detail (ndarray or SymPy matrix) as float64

    @staticmethod
    def monotone(x: Box, f) -> Box:
        """f over each entry's interval, f increasing (tanh, exp, a positive scale): [f(lo), f(hi)],
        widened by a few ulps for float rounding."""
        with np.errstate(over="ignore", invalid="ignore"):
            lo, hi = f(x.lo), f(x.hi)
        return intervals._widen((lo + hi) / 2, (hi - lo) / 2, np.abs(lo) + np.abs(hi))

    exp_diff = staticmethod(intervals.exp_diff)
    plus = staticmethod(intervals.plus)
    rowsum = staticmethod(intervals.rowsum)
    row_max = staticmethod(intervals.row_max)
    maximum = staticmethod(intervals.maximum)
    log = staticmethod(intervals.log)
    block = staticmethod(intervals.block)

    @staticmethod
    def times(a: Box, b: Box) -> Box:
        """a o b entry by entry (b may broadcast): the extremes of the end points' products."""
        return blockrules._padded(blockrules._times(a, b))

    @staticmethod
    def quotient(num: Box, den: Box) -> Box:
        """num / den entry by entry for den > 0 (den may broadcast): the end points' quotients."""
        if (den.lo <= 0).any():
            raise Impossible()
        return blockrules._padded(blockrules._quotient(num, den))

    @staticmethod
    def norm(r: Box, gain: Box | None, bias: Box | None, eps: float, rms: bool) -> Box:
        """LayerNorm (rms=False, biased variance) or RMSNorm of each row (`blockrules.norm`)."""
        try:
            return blockrules.norm(r, gain, bias, eps, rms)
        except ValueError:
            raise Impossible() from None

    @staticmethod
    def swiglu(gate: Box, up: Box) -> Box:
        """SiLU(gate) ⊙ up (`blockrules.swiglu`: SiLU's minimum handled, an interval product)."""
        from attntrace.algebra.numeric import NumericAlgebra

        if gate.shape != up.shape:
            raise Impossible()
        return blockrules.swiglu(gate, up, NumericAlgebra().activation)


TOOLKIT = Toolkit()


def _rule(kind):
    def rule(world, step, args, m, mutation):
        return kind.carry(TOOLKIT, step, args, m)
    return rule


#: step id -> its rule, for every kind that declares `carry`.
RULES = {k.id: _rule(k) for k in KINDS.values() if k.carry is not None}


def mutations(code: str, world) -> list[Mutation]:
    """The declared mistake `code` planted in this trace, when its kind's steps are here and its
    `when` (if any) says it can be made."""
    kind, mistake = MISTAKES[code]
    steps = (kind.id,) + mistake.also
    present = [s for s in world.steps if s.id in steps]
    if not present or (mistake.when is not None and not mistake.when(present)):
        return []
    return [Mutation(code, kind.id, steps=frozenset(steps))]


def message_kind(code: str):
    """The kind whose prose templates hold the sentence of a declared mistake, or None."""
    found = MISTAKES.get(code)
    return None if found is None else found[0]
