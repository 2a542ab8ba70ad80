"""How each step is computed, right or with a usual mistake, and the mistakes read off a
student's numbers.

Two kinds of mistakes are recognised:

- *planted* (`mutations`, `apply`): a step kind computed the wrong way in the student's world
  (K Q^T, no scaling, softmax down columns, V A, ...). The checker recomputes the world with
  each one and names those that reproduce the student's values; when several do, none can be
  told apart from the others and the diagnosis lists them all;
- *read off* (`read_off`): mistakes with no single wrong computation to plant: entries off by
  about one unit of the last decimal (`rounding`), a few entries wrong and the rest right
  (`arithmetic_slip`), masked scores set to a finite number (`mask_not_infinite`), rows of
  weights that do not sum to 1 (`rows_not_normalised`). They are judged against what the
  student should have got from their own earlier values.

Every computation is over intervals (`intervals.Box`), one function per step family.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from attntrace.grading import intervals, kindcarry, kindrules
from attntrace.grading.answer import KIND_CODES, AnswerMatrix, Policy
from attntrace.grading.catalogue import ANY, CATALOGUE, Impossible, Mutation
from attntrace.grading.intervals import Box
from attntrace.kinds.online import carry_z

#: A masked score written as a finite number this far below the row's largest kept score
#: (e^-40 ~ 4e-18 of weight) gives the same weights as -inf: accepted, with a remark.
LARGE_NEGATIVE = 40.0
#: `rounding`: every wrong entry within this many units of its last written decimal.
ROUNDING_UNITS = 1.5
PROJECTIONS = ("Q", "K", "V")
#: Read-off mistakes listed as alternatives of a planted one that reproduces the numbers too.
SHOWN_ALONGSIDE = ("mask_not_infinite", "rows_not_normalised")


# -- the mistakes worth planting in this trace -------------------------------------------------
def mutations(world) -> list[Mutation]:
    """Every catalogued mistake that can be made in this trace, in catalogue order."""
    trace = world.trace
    kinds = [s.id for s in world.steps]
    names = {o.name for o in trace.operands}
    scaled = next((s for s in world.steps if s.id == "scaled"), None)
    by_sqrt = bool(scaled and scaled.details.get("by_sqrt_dk") and scaled.details.get("d_k"))
    masked = next((s for s in world.steps if s.id == "masked"), None)
    found: list[Mutation] = []
    for code, kind in CATALOGUE.items():
        if code == "same_weights":
            for s in PROJECTIONS:
                mine = f"W_{s}"
                found += [Mutation(code, s, swap=((mine, other),), steps=frozenset({s}))
                          for other in (f"W_{t}" for t in PROJECTIONS if t != s)
                          if s in kinds and mine in names and other in names]
        elif code == "kv_from_queries":
            if "X_kv" in names and "K" in kinds:
                found.append(Mutation(code, kind, swap=(("X_kv", "X"),), steps=frozenset({"K", "V"})))
        elif code == "transposed":
            found += [Mutation(code, k) for k in dict.fromkeys(kinds) if k != "scores"]
        elif code in kindrules.STEPS:
            found += kindrules.mutations(code, world)
        elif code in kindcarry.MISTAKES:
            found += kindcarry.mutations(code, world)
        elif kind == ANY or kind not in kinds or code == "rows_not_normalised":
            continue  # read off the student's numbers, or a step this trace does not have
        elif code in ("scaled_by_dk", "wrong_dk", "scaled_by_dmodel") and not by_sqrt:
            continue
        elif code in ("wrong_dk", "scaled_by_dmodel") and world.d_model is None:
            continue
        elif code == "mask_wrong_triangle":
            keep = np.asarray(masked.details["keep"], dtype=bool)
            if keep.shape[0] == keep.shape[1] and (keep != keep.T).any():
                found.append(Mutation(code, kind))
        elif code == "head_order":
            h = trace.num_heads
            orders = itertools.permutations(range(1, h + 1)) if h <= 4 else [tuple(range(h, 0, -1))]
            found += [Mutation(code, kind, tuple(o)) for o in orders if list(o) != sorted(o)]
        else:
            found.append(Mutation(code, kind))
    return found


# -- computing a step, right or with a planted mistake ---------------------------------------------
def apply(world, step, args: list[Box], mutation: Mutation | None) -> Box:
    """This step's value (an interval) from its inputs, computed right or with `mutation`."""
    m = mutation.code if mutation is not None and mutation.changes(step.id) else None
    rule = _STEP.get(step.id, _at_truth)
    result = rule(world, step, args, m, mutation)
    return result.T if m == "transposed" else result


def _matmul(a: Box, b: Box) -> Box:
    if a.shape[1] != b.shape[0]:
        raise Impossible
    return intervals.matmul(a, b)


def _projection(world, step, args, m, mutation):
    if m == "forgot_output_projection":
        return args[0]
    r = _matmul(args[0], args[1].T if m == "output_weights_transposed" else args[1])
    if len(args) > 2:
        if args[2].shape[1] != r.shape[1]:
            raise Impossible
        r = intervals.add(r, args[2])
    return r


def _scores(world, step, args, m, mutation):
    q, k = args
    if m == "transposed_scores":
        return _matmul(k, q.T)
    return _matmul(q, k) if m == "no_transpose" else _matmul(q, k.T)


def _scaled(world, step, args, m, mutation):
    d_k = step.details.get("d_k")
    factor = {"missing_scale": 1.0, "scaled_by_dk": d_k, "wrong_dk": math.sqrt(world.d_model or 1),
              "scaled_by_dmodel": world.d_model}.get(m, float(step.details["factor"]))
    return intervals.divide(args[0], float(factor))


def _masked(world, step, args, m, mutation):
    t = args[0]
    keep = np.asarray(step.details["keep"], dtype=bool)
    if m == "mask_ignored":
        return t
    if m == "mask_wrong_triangle":
        keep = keep.T
    planted = kindrules.masked_keep(step, m)  # window_off_by_one, causal_top_left_decoding
    if planted is not None:
        keep = planted
    if keep.shape != t.shape:
        raise Impossible
    return intervals.fill_where(t, keep, 0.0 if m == "mask_not_infinite" else -math.inf)


def _weights(world, step, args, m, mutation):
    t = args[0]
    if m == "skipped_softmax":
        return t
    if m == "column_softmax":
        return intervals.softmax_rows(t.T).T
    if m == "softmax_without_exp":
        return intervals.divide_by_row_sum(t)
    return intervals.softmax_rows(t)


def _z(world, step, args, m, mutation):
    if step.details.get("online"):  # Z = diag(l)^-1 O from the last blocks of the online softmax
        return carry_z(kindcarry.TOOLKIT, step, args)
    a, v = args
    if m == "rope_rotated_values":
        v = kindrules.rotated_values(world, step, v)
    return _matmul(v, a) if m == "values_first" else _matmul(a, v)


def _concat(world, step, args, m, mutation):
    zs = list(args)
    if m == "concat_rows":
        if len({z.shape[1] for z in zs}) != 1:
            raise Impossible
        return intervals.stack(zs, axis=0)
    if m == "head_order":
        zs = [zs[i - 1] for i in mutation.order]
    if len({z.shape[0] for z in zs}) != 1:
        raise Impossible
    return intervals.stack(zs, axis=1)


def _at_truth(world, step, args, m, mutation):
    """A step kind with no interval rule (the whole-input gradients, the position table): its true
    value, a point interval, whatever the student wrote before it. The checker still judges
    it (correct, or wrong with a read-off diagnosis), but a mistake made before it is not
    carried through it: a later step computed from a wrong earlier one shows as wrong."""
    return intervals.point(world.truth[world.key(step)])


_STEP = {"Q": _projection, "K": _projection, "V": _projection, "output": _projection, "scores": _scores,
         "scaled": _scaled, "masked": _masked, "weights": _weights, "Z": _z, "concat": _concat, **kindrules.RULES,
         **kindcarry.RULES}


# -- mistakes read off the student's numbers -------------------------------------------------------
def large_negative_mask(step, answer: AnswerMatrix, truth: np.ndarray, policy: Policy) -> bool:
    """Masked scores written as a finite number so far below the row's kept scores that the
    weights are those of -inf (kept entries right): accepted, with a remark."""
    if step.id != "masked" or answer.shape != tuple(truth.shape):
        return False
    keep = np.isfinite(truth)
    values = answer.values
    finite_masked = ~keep & np.isfinite(values)
    if not finite_masked.any() or (keep & ~answer.ok_mask(truth, truth, policy)).any():
        return False
    kept_max = np.where(keep, values, -np.inf).max(axis=1, keepdims=True)
    return bool(np.all(np.where(finite_masked, values - kept_max, -np.inf) <= -LARGE_NEGATIVE))


#: ROUNDING_UNITS units of the d-th decimal, d = 0..400 (Python's numbers, looked up).
_ROUNDING_SLACK = np.array([ROUNDING_UNITS * 10.0 ** -d for d in range(401)], dtype=np.float64)


def read_off(step, answer: AnswerMatrix, reference: Box, policy: Policy) -> list[tuple[str, dict]]:
    """The mistakes the student's numbers show against `reference` (what they should have got
    from their own earlier values), most specific first: each (code, its numbers)."""
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
    values = answer.values
    if step.id == "masked":
        hidden = np.isneginf(reference.lo)
        finite = hidden & np.isfinite(values)
        if finite.any() and hidden[bad].all():
            found.append(("mask_not_infinite", {"cells": [(int(i) + 1, int(j) + 1) for i, j in np.argwhere(finite)],
                                                "written": sorted({str(t) for t in answer.texts[bad]})}))
    size = answer.shape[0] * answer.shape[1]
    if not found and n_wrong < size and n_wrong <= max(1, size // 4):
        found.append(("arithmetic_slip", {"cells": cells()}))
    if step.id == "weights":
        sums = np.where(np.isfinite(values), values, 0.0).sum(axis=1)
        rows = [i + 1 for i, s in enumerate(sums) if abs(s - 1.0) > _allowed_sum(answer, i, policy) + 1e-9]
        if rows:
            found.append(("rows_not_normalised", {"rows": rows, "sums": [float(sums[i - 1]) for i in rows]}))
    return found


def _allowed_sum(answer: AnswerMatrix, i: int, policy: Policy) -> float:
    """How far a row of correctly rounded weights may sum from 1 under the policy."""
    with np.errstate(invalid="ignore"):
        return sum(answer.allowed(np.abs(answer.values), policy)[i].tolist())
