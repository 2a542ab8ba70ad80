"""The student's world: the trace recomputed from a student's values, with or without a mistake.

The checker needs two recomputations besides the truth:

- the *student's world*: every step recomputed from the student's own earlier values (their
  written value where they gave one, as the interval of what it may have been before they
  rounded it, else recomputed), so that a step that is wrong only because an earlier step was
  wrong, or moved by an earlier rounding, is recognised as carried forward;
- the same world with one *usual mistake* planted (a `Mutation`): a step kind computed the
  wrong way (no scaling, column softmax, K Q^T, ...). A wrong step whose values equal a mutated
  world's values at that step is diagnosed with that mistake's code. A mistake planted in a step
  the student did not write propagates to the later steps (weights computed from unscaled
  scores are diagnosed `missing_scale` even when the scaled scores were not written down).

All recomputation is numeric float64 over intervals (`intervals.Box`; exact traces are
converted to floats); the mistakes are listed in `catalogue`; each step is computed, right
or wrong, by its kind's `carry` (`mistakes`); a code's sentence is in its kind's prose
templates, or templates/check/messages.*.j2 for the mistakes of any step.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from attntrace.grading import intervals, mistakes
from attntrace.grading.catalogue import (  # noqa: F401 - the catalogue's names are public here too
    ANY, CATALOGUE, CODES, EARLY_ROUNDING, MASK_LARGE_NEGATIVE, REMARKS, UNKNOWN, WRONG_SHAPE, Impossible, Key, Mutation,
    to_float)
from attntrace.grading.intervals import Box
from attntrace.kinds import KINDS, MISTAKES
from attntrace.kinds.base import Kind
from attntrace.model.trace import STEP_IDS, Step, Trace, block_address

#: code -> how a step reads its inputs under that mistake (`Mistake.rewire`: kv_head_mapping).
_REWIRE = {code: mistake.rewire for code, (_, mistake) in MISTAKES.items() if mistake.rewire is not None}

#: `World.of`'s cache: the world of the last trace checked.
_LAST_WORLD: dict = {}


def step_key(step: Step) -> Key:
    """A step's key in the world and in an answer: (id, head), or (address, head) for a block of
    the online softmax (online_max#2, online_max#1.2), so that every block is a step of its own."""
    return (block_address(step) or step.id, step.head)


class World:
    """The trace's numbers and the machinery to recompute it from a student's values."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.steps: tuple[Step, ...] = trace.steps
        # One key per step: (id, head), or (address, head) for a block of the online softmax
        # (online_max#2), so that every block is a step of the world and of an answer.
        self.keys: tuple[Key, ...] = tuple(step_key(s) for s in trace.steps)
        self._index = {k: i for i, k in enumerate(self.keys)}
        self.truth: dict[Key, np.ndarray] = {k: to_float(s.value) for k, s in zip(self.keys, trace.steps)}
        self.operands: dict[Key, np.ndarray] = {(o.name, o.head): to_float(o.value) for o in trace.operands}
        x = self.operands.get(("X", None))
        self.d_model = None if x is None else x.shape[1]
        self.mutations = mistakes.mutations(self)
        # the kinds whose steps give every sentence numbers (`Kind.trace_params`), with their steps
        self.quoted = [(KINDS[i], [s for s in trace.steps if s.id == i]) for i in dict.fromkeys(s.id for s in trace.steps)
                       if i in KINDS and type(KINDS[i]).trace_params is not Kind.trace_params]
        # Where each step's inputs point, with no mistake planted (the same for every answer).
        present: dict[Key, None] = dict.fromkeys(self.operands)
        self._keys: list[tuple[Key, ...]] = []
        for key, step in zip(self.keys, self.steps):  # a block reads the blocks it names by address
            self._keys.append(tuple(self.key_of(ref, step.head, present) for ref in step.inputs))
            present[key] = None
        self._points = {k: intervals.point(v) for k, v in self.operands.items()}
        self._ancestors: dict[Key, set[Key]] = {}
        self._reach = [self._reached_by(m) for m in self.mutations]

    def key(self, step: Step) -> Key:
        """The world's key of a step of the trace: (id, head), or (address, head) for a block."""
        return step_key(step)

    def _reached_by(self, mutation: Mutation) -> frozenset:
        """The steps whose value `mutation` may change, whatever the student gave: the steps it
        changes and every step after them that reads one (a superset of the dirty steps of
        `recompute(given, mutation, base)`; a step outside it keeps base's value)."""
        reached: set[Key] = set()
        for index, step in enumerate(self.steps):
            if mutation.changes(step.id) or any(k in reached for k in self._keys[index]):
                reached.add(self.keys[index])
        return frozenset(reached)

    def reaches(self, index: int, key: Key) -> bool:
        """Can the index-th mutation change step `key`?"""
        return key in self._reach[index]

    @classmethod
    def of(cls, trace: Trace) -> "World":
        """The world of `trace`, built once per trace (a class's answers share it: the truth
        as floats, the operands and the catalogue's mutations do not depend on the answer)."""
        cached = _LAST_WORLD.get("world")
        if cached is None or cached.trace is not trace:
            cached = _LAST_WORLD["world"] = cls(trace)
        return cached

    # -- structure ---------------------------------------------------------------------------
    def key_of(self, ref: str, head: int | None, values: dict[Key, Any]) -> Key:
        """Where a step's input reference points: a step (same head) or an operand."""
        if "@" in ref:
            name, _, h = ref.partition("@")
            return (name, int(h))
        for key in ((ref, head), (ref, None)):
            if key in values:
                return key
        return (ref, head)

    def ancestors(self, key: Key) -> set[Key]:
        """Every step key this step depends on, transitively."""
        if key in self._ancestors:
            return self._ancestors[key]
        out: set[Key] = set()
        for k in self._keys[self._index[key]]:
            if k in self.truth and k not in out and k != key:
                out.add(k)
                out |= self.ancestors(k)
        self._ancestors[key] = out
        return out

    # -- recomputation -------------------------------------------------------------------------
    def recompute(self, given: dict[Key, Box], mutation: Mutation | None = None,
                  base: dict[Key, Box | None] | None = None) -> dict[Key, Box | None]:
        """Each step computed from the student's world before it: their written value (as an
        interval, half a unit either side) where they gave one, else the recomputed one.

        A given value of the wrong shape is used when the next step can be computed from it
        (K and V from X instead of X_kv: every later step follows), else the recomputed value
        stands in for it. Returns {step key: interval, or None when it cannot be computed}.

        base: this world without `mutation` (`recompute(given)`). Then only the steps the
        mutation changes, and the steps that read one of them, are computed again; the others
        are base's (the same numbers: a step's rule reads the mutation only where it changes it).
        """
        values: dict[Key, Any] = dict(self._points)
        computed: dict[Key, Box | None] = {}
        dirty: set[Key] = set()
        for index, step in enumerate(self.steps):
            key = self.keys[index]
            changes = mutation is not None and mutation.changes(step.id)
            if base is not None and not changes and not any(
                    k in dirty and (k not in given or given[k].shape != self.truth[k].shape) for k in self._keys[index]):
                computed[key] = base[key]
                values[key] = given[key] if key in given else base[key]
                continue
            refs = step.inputs
            if changes and mutation.swap:
                refs = tuple(dict(mutation.swap).get(r, r) for r in refs)
            if changes and mutation.code in _REWIRE:
                refs = _REWIRE[mutation.code](step, refs, mutation)
            keys = self._keys[index] if refs == step.inputs else [self.key_of(ref, step.head, values) for ref in refs]
            result = self._compute(step, [values.get(k) if k in values else self._later(k, given) for k in keys], mutation)
            if result is None:  # a wrong-shaped given input: the recomputed one instead
                alt = [computed.get(k) if k in given and k in self.truth and given[k].shape != self.truth[k].shape
                       else values.get(k) for k in keys]
                result = self._compute(step, alt, mutation)
            computed[key] = result
            dirty.add(key)
            values[key] = given[key] if key in given else result
        return computed

    def _later(self, key: Key, given: dict[Key, Box]) -> Box | None:
        """A step read before it is computed (kv_head_mapping: head 2 reads K@2, made with
        head 3): the student's value, else the true one."""
        if key in given:
            return given[key]
        return intervals.point(self.truth[key]) if key in self.truth else None

    def _compute(self, step: Step, args: list, mutation: Mutation | None) -> Box | None:
        if any(a is None for a in args):
            return None
        try:
            return mistakes.apply(self, step, args, mutation)
        except Impossible:
            return None

    def candidates(self, given: dict[Key, Box], base: dict[Key, Box | None] | None = None
                   ) -> Iterable[tuple[Mutation, dict[Key, Box | None]]]:
        """Each catalogued mistake with the world it produces (computed lazily, in order);
        base: `recompute(given)`, so that only what a mistake changes is computed again."""
        for mutation in self.mutations:
            yield mutation, self.recompute(given, mutation, base)

    def candidates_at(self, key: Key, given: dict[Key, Box], base: dict[Key, Box | None], cache: dict
                      ) -> Iterable[tuple[Mutation, dict[Key, Box | None]]]:
        """The catalogued mistakes that can change step `key`, in order, with their worlds
        (each computed once per answer, kept in `cache`): a mistake that cannot reach `key`
        leaves base's value there, which the student's value has already failed to fit."""
        for index, mutation in enumerate(self.mutations):
            if key not in self._reach[index]:
                continue
            if index not in cache:
                cache[index] = self.recompute(given, mutation, base)
            yield mutation, cache[index]


def diagnosis_params(world: World, step: Step, mutation: Mutation | None, *, given_shape=None) -> dict:
    """Numbers the diagnosis sentence may mention (d_k, the factor, d_model, shapes, order)."""
    params: dict[str, Any] = {"step": step.id, "head": step.head, "key": step.key,
                              "expected_shape": tuple(step.shape), "given_shape": given_shape,
                              "d_model": world.d_model, "d_k": None, "factor": None, "num_heads": world.trace.num_heads}
    for kind, steps in world.quoted:  # the step's own head first (its d_k)
        params.update(kind.trace_params(sorted(steps, key=lambda s: s.head != step.head)))
    params.update(KINDS[step.id].message_params(step) if step.id in KINDS else {})
    if mutation is not None and mutation.order:
        params["order"] = mutation.order
    if mutation is not None and mutation.swap:
        params["used"], params["instead_of"] = mutation.swap[0][1], mutation.swap[0][0]
        params["changed"] = sorted(mutation.steps or {mutation.kind}, key=STEP_IDS.index)
    return params


__all__ = ["CATALOGUE", "ANY", "CODES", "WRONG_SHAPE", "UNKNOWN", "EARLY_ROUNDING", "MASK_LARGE_NEGATIVE", "Mutation", "World", "to_float", "diagnosis_params", "STEP_IDS"]
