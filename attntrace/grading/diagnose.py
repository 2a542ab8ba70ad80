"""The mistake catalogue and the student's world.

The checker needs two recomputations besides the truth:

- the *student's world*: every step recomputed from the student's own earlier values (their
  value where they gave one of the right shape, else recomputed), so that a step that is wrong
  only because an earlier step was wrong is recognised as carried forward;
- the same world with one *usual mistake* planted (a `Mutation`): a step kind computed the
  wrong way (no scaling, column softmax, K Q^T, ...). A wrong step whose values equal a mutated
  world's values at that step is diagnosed with that mistake's code. A mistake planted in a step
  the student did not write propagates to the later steps (weights computed from unscaled
  scores are diagnosed `missing_scale` even when the scaled scores were not written down).

All recomputation is numeric float64 through `algebra.NumericAlgebra` (exact traces are
converted to floats); the sentences for each code live in templates/check/messages.*.j2.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from attntrace.algebra.modes import NumericAlgebra
from attntrace.model.trace import STEP_IDS, Step, Trace

#: code -> the step kind the mistake changes, in the order they are tried.
CATALOGUE = {
    "transposed_scores": "scores",    # K Q^T instead of Q K^T
    "missing_scale": "scaled",        # no division by sqrt(d_k)
    "scaled_by_dk": "scaled",         # divided by d_k instead of sqrt(d_k)
    "wrong_dk": "scaled",             # divided by sqrt(d_model) instead of the head's sqrt(d_k)
    "mask_ignored": "masked",         # the mask was not applied
    "skipped_softmax": "weights",     # the weights are the softmax's input, unchanged (the article's example)
    "column_softmax": "weights",      # softmax down each column instead of along each row
    "concat_rows": "concat",          # head outputs stacked as rows
    "head_order": "concat",           # heads concatenated in another order
}
#: Codes that are not a recomputed mistake.
WRONG_SHAPE = "wrong_shape"
UNKNOWN = "unknown"
CODES = tuple(CATALOGUE) + (WRONG_SHAPE, UNKNOWN)

Key = tuple  # (step id or operand name, head or None)


@dataclass(frozen=True)
class Mutation:
    code: str
    kind: str
    order: tuple[int, ...] | None = None  # head_order: the heads' order (1-based)


class _Impossible(Exception):
    """A mutated computation that cannot run (shapes do not fit)."""


def to_float(value: Any) -> np.ndarray | None:
    """A step or operand value (ndarray or SymPy matrix) -> float64 ndarray (-oo -> -inf)."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return value.astype(np.float64, copy=False)
    import sympy

    rows, cols = value.shape
    out = np.empty((rows, cols), dtype=np.float64)
    for i in range(rows):
        for j in range(cols):
            x = value[i, j]
            out[i, j] = -math.inf if x == -sympy.oo else float(sympy.N(x, 20))
    return out


def _softmax_rows(t: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        return NumericAlgebra().softmax(t)[0]


class World:
    """The trace's numbers and the machinery to recompute it from a student's values."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.alg = NumericAlgebra()
        self.steps: tuple[Step, ...] = trace.steps
        self.truth: dict[Key, np.ndarray] = {(s.id, s.head): to_float(s.value) for s in trace.steps}
        self.operands: dict[Key, np.ndarray] = {(o.name, o.head): to_float(o.value) for o in trace.operands}
        x = self.operands.get(("X", None))
        self.d_model = None if x is None else x.shape[1]
        self.mutations = self._mutations()

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
        step = self.trace.step(*key)
        out: set[Key] = set()
        for ref in step.inputs:
            k = self.key_of(ref, step.head, self.truth)
            if k in self.truth and k not in out:
                out.add(k)
                out |= self.ancestors(k)
        return out

    def _mutations(self) -> list[Mutation]:
        kinds = {s.id for s in self.steps}
        found = []
        scaled = next((s for s in self.steps if s.id == "scaled"), None)
        for code, kind in CATALOGUE.items():
            if kind not in kinds:
                continue
            if code in ("scaled_by_dk", "wrong_dk") and not (scaled and scaled.details.get("by_sqrt_dk") and scaled.details.get("d_k")):
                continue
            if code == "wrong_dk" and self.d_model is None:
                continue
            if code == "head_order":
                h = self.trace.num_heads
                orders = itertools.permutations(range(1, h + 1)) if h <= 4 else [tuple(range(h, 0, -1))]
                found += [Mutation(code, kind, tuple(o)) for o in orders if list(o) != sorted(o)]
                continue
            found.append(Mutation(code, kind))
        return found

    # -- arithmetic ----------------------------------------------------------------------------
    def apply(self, step: Step, args: list[np.ndarray], mutation: Mutation | None) -> np.ndarray:
        """This step's value from its inputs, computed right or with `mutation` (if it applies)."""
        m = mutation.code if mutation is not None and mutation.kind == step.id else None
        alg, kind = self.alg, step.id
        if kind in ("Q", "K", "V", "output"):
            r = self._matmul(args[0], args[1])
            if len(args) > 2:
                r = alg.add_row(r, args[2])
            return r
        if kind == "scores":
            q, k = args
            return self._matmul(k, q.T) if m == "transposed_scores" else self._matmul(q, k.T)
        if kind == "scaled":
            s = args[0]
            d_k = step.details.get("d_k")
            if m == "missing_scale":
                return s
            if m == "scaled_by_dk":
                return s / d_k
            if m == "wrong_dk":
                return s / math.sqrt(self.d_model)
            return s / float(step.details["factor"])
        if kind == "masked":
            t = args[0]
            keep = np.asarray(step.details["keep"], dtype=bool)
            if m == "mask_ignored":
                return t
            if keep.shape != t.shape:
                raise _Impossible
            return alg.mask(t, keep)
        if kind == "weights":
            t = args[0]
            if m == "skipped_softmax":
                return t
            if m == "column_softmax":
                return _softmax_rows(t.T).T
            return _softmax_rows(t)
        if kind == "Z":
            return self._matmul(args[0], args[1])
        if kind == "concat":
            zs = list(args)
            if m == "concat_rows":
                if len({z.shape[1] for z in zs}) != 1:
                    raise _Impossible
                return np.vstack(zs)
            if m == "head_order":
                zs = [zs[i - 1] for i in mutation.order]
            if len({z.shape[0] for z in zs}) != 1:
                raise _Impossible
            return np.hstack(zs)
        raise ValueError(kind)  # pragma: no cover - STEP_IDS is fixed

    @staticmethod
    def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if a.shape[1] != b.shape[0]:
            raise _Impossible
        with np.errstate(invalid="ignore", over="ignore"):
            return a @ b

    def recompute(self, given: dict[Key, np.ndarray], mutation: Mutation | None = None) -> dict[Key, np.ndarray | None]:
        """Each step computed from the student's world before it (their value where given).

        Returns {step key: computed value, or None when it cannot be computed}.
        """
        values: dict[Key, Any] = dict(self.operands)
        computed: dict[Key, np.ndarray | None] = {}
        for step in self.steps:
            key = (step.id, step.head)
            args = [values.get(self.key_of(ref, step.head, values)) for ref in step.inputs]
            try:
                result = None if any(a is None for a in args) else self.apply(step, args, mutation)
            except _Impossible:
                result = None
            computed[key] = result
            values[key] = given[key] if key in given else result
        return computed

    def candidates(self, given: dict[Key, np.ndarray]) -> Iterable[tuple[Mutation, dict[Key, np.ndarray | None]]]:
        """Each catalogued mistake with the world it produces (computed lazily, in order)."""
        for mutation in self.mutations:
            yield mutation, self.recompute(given, mutation)


def diagnosis_params(world: World, step: Step, mutation: Mutation | None, *, given_shape=None) -> dict:
    """Numbers the diagnosis sentence may mention (d_k, the factor, d_model, shapes, order)."""
    scaled = next((s for s in world.steps if s.id == "scaled" and s.head == step.head), None) or \
        next((s for s in world.steps if s.id == "scaled"), None)
    params: dict[str, Any] = {"step": step.id, "head": step.head, "key": step.key,
                              "expected_shape": tuple(step.shape), "given_shape": given_shape,
                              "d_model": world.d_model, "d_k": None, "factor": None, "num_heads": world.trace.num_heads}
    if scaled is not None:
        params["d_k"] = scaled.details.get("d_k")
        params["factor"] = float(scaled.details["factor"]) if scaled.details.get("factor") is not None else None
        params["by_sqrt_dk"] = bool(scaled.details.get("by_sqrt_dk"))
    if mutation is not None and mutation.order:
        params["order"] = mutation.order
    return params


__all__ = ["CATALOGUE", "CODES", "WRONG_SHAPE", "UNKNOWN", "Mutation", "World", "to_float", "diagnosis_params", "STEP_IDS"]
