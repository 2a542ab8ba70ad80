"""The mistake catalogue: every mistake the checker can name, the step kind it changes, and
the records a diagnosis is built from (`Mutation`, the float64 view of a value).

The catalogue is derived from the kinds' declarations (`attntrace.kinds.MISTAKES`, each
`Mistake` in the module of the kind it changes, in pipeline order), followed by the mistakes
of any step. `diagnose` recomputes the student's world with each mistake, by the kinds'
`carry` rules (`mistakes`); a declared mistake's sentence is the macro of its code in its
kind's prose templates (templates/prose/{lang}/{prose}.j2), the others' in
templates/check/messages.*.j2.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attntrace.kinds import MISTAKES
from attntrace.kinds.base import Planting

#: The mistakes of any step: `transposed` is planted in each step kind in turn (not the
#: scores, whose transpose is `transposed_scores`); `rounding` and `arithmetic_slip` are read
#: off the student's own numbers.
ANY = "*"
TRANSPOSED = "transposed"
ANY_STEP = (TRANSPOSED, "rounding", "arithmetic_slip")
#: code -> the step kind the mistake changes (its first, when it changes several), in the
#: order they are tried; ANY for the mistakes of any step.
CATALOGUE = {**{code: kind.id for code, (kind, _) in MISTAKES.items()}, **dict.fromkeys(ANY_STEP, ANY)}
#: Codes that are not a recomputed mistake.
WRONG_SHAPE = "wrong_shape"
UNKNOWN = "unknown"
#: Remarks on a step that is not wrong: carried only because an earlier, correct rounding moved
#: it; masked scores written as a huge negative number instead of -inf (same weights).
EARLY_ROUNDING = "early_rounding"
MASK_LARGE_NEGATIVE = "mask_large_negative"
REMARKS = (EARLY_ROUNDING, MASK_LARGE_NEGATIVE)
CODES = tuple(CATALOGUE) + (WRONG_SHAPE, UNKNOWN)

Key = tuple  # (step id or operand name, head or None)


#: One catalogued mistake planted in the student's world (`attntrace.kinds.base.Planting`:
#: its code, the steps it changes, the inputs it swaps, a head order, numbers for its rule).
Mutation = Planting


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


class Impossible(Exception):
    """A computation that cannot run (shapes do not fit)."""
