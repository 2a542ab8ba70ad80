"""The mistake catalogue: every mistake the checker can name, the step kind it changes, and
the records a diagnosis is built from (`Mutation`, the float64 view of a value).

`diagnose` recomputes the student's world with each mistake; `mistakes` and `kindrules`
compute the steps, right or wrong; the sentences for each code live in
templates/check/messages.*.j2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from attntrace.kinds import MISTAKES

#: code -> the step kind the mistake changes, in the order they are tried. ANY: the mistake
#: can be made in any step (`transposed` is planted in each step kind in turn; `rounding` and
#: `arithmetic_slip` are read off the student's own numbers). `same_weights` is planted in Q,
#: K and V (each computed with another projection's weights), `kv_from_queries` in K and V.
ANY = "*"
CATALOGUE = {
    "same_weights": "K",              # K (or V, or Q) computed with another projection's weights
    "kv_from_queries": "K",           # cross-attention: K and V from X instead of X_kv
    "transposed_scores": "scores",    # K Q^T instead of Q K^T
    "no_transpose": "scores",         # Q K instead of Q K^T
    "missing_scale": "scaled",        # no division by sqrt(d_k)
    "scaled_by_dk": "scaled",         # divided by d_k instead of sqrt(d_k)
    "wrong_dk": "scaled",             # divided by sqrt(d_model) instead of the head's sqrt(d_k)
    "scaled_by_dmodel": "scaled",     # divided by d_model
    "mask_ignored": "masked",         # the mask was not applied
    "mask_wrong_triangle": "masked",  # the other triangle masked
    "mask_not_infinite": "masked",    # masked entries set to 0 (or another finite number), so they keep weight
    "skipped_softmax": "weights",     # the weights are the softmax's input, unchanged (the article's example)
    "column_softmax": "weights",      # softmax down each column instead of along each row
    "softmax_without_exp": "weights",  # each row divided by its sum, no exponentials
    "rows_not_normalised": "weights",  # a row of weights does not sum to 1
    "values_first": "Z",              # V A instead of A V
    "concat_rows": "concat",          # head outputs stacked as rows
    "head_order": "concat",           # heads concatenated in another order
    "forgot_output_projection": "output",   # output = concat, W_O never applied
    "output_weights_transposed": "output",  # concat W_O^T
    "rope_wrong_layout": "Q_rope",    # RoPE's other column pairing (half <-> interleaved)
    "rope_positions_from_1": "Q_rope",  # RoPE positions counted from 1, not 0
    "rope_rotated_values": "Z",       # RoPE applied to V too: Z = A rot(V)
    "window_off_by_one": "masked",    # a sliding window keeping W + 1 keys
    "causal_top_left_decoding": "masked",  # top-left causal mask when the queries are the last L of S keys
    "kv_head_mapping": "scores",      # GQA: query head i reads KV head ((i-1) mod h_kv) + 1
    "forgot_residual": "residual1",   # a residual step is the sublayer's output alone (also residual2)
    "posenc_not_added": "embed",      # E = X: the positions never added
    "softmax_backward_no_rowsum": "dscaled",  # dT = A o dA, the row term r_i forgotten (dscores when unscaled)
    "grad_scale_forgotten": "dscores",  # dS = dT: the 1/sqrt(d_k) forgotten on the way back
    "dV_missing_transpose": "dV",     # dV = A dZ instead of A^T dZ
    "dK_missing_transpose": "dK",     # dK = dS Q instead of dS^T Q
    "online_no_rescale": "online_out",  # O^(j) = O^(j-1) + P^(j) V_j: e^(m^(j-1) - m^(j)) dropped
    "lse_without_max": "lse",         # L = log l: the running maximum m not added back
    "norm_unbiased_variance": "norm1",  # LayerNorm's variance divided by d - 1 (also norm2)
    "norm_wrong_axis": "norm1",       # each column normalised over the tokens (also norm2)
    "gelu_relu_confused": "ffn_act",  # ReLU where GELU is asked, or the reverse
    "posenc_sin_cos_swapped": "pos_enc",  # cos in the even columns, sin in the odd
    # the mistakes step kinds declare in their own modules (`attntrace.kinds.base.Mistake`)
    **{code: kind.id for code, (kind, _) in MISTAKES.items()},
    "transposed": ANY,                # the transpose of the right matrix (scores: transposed_scores)
    "rounding": ANY,                  # entries off by about one unit of the last decimal written
    "arithmetic_slip": ANY,           # one or a few entries wrong, the rest right
}
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


@dataclass(frozen=True)
class Mutation:
    """One catalogued mistake planted in the student's world.

    steps: the step ids it changes (kv_from_queries: K and V); swap: input references replaced
    ((("W_K", "W_Q"),) computes K with W_Q); order: head_order's order of the heads (1-based).
    """

    code: str
    kind: str
    order: tuple[int, ...] | None = None
    swap: tuple[tuple[str, str], ...] = ()
    steps: frozenset = frozenset()

    def changes(self, step_id: str) -> bool:
        return step_id in self.steps if self.steps else step_id == self.kind


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
