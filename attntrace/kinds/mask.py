"""Masking: T-tilde_ij = T_ij where the mask keeps (i, j), -inf where it does not.

The masked scores get a name of their own (T-tilde): they are not T changed in place.
A mask is "causal" (query i sees keys j <= i, top-left aligned as PyTorch's is_causal) or a
0/1 matrix of the scores' shape; a row that keeps nothing has no softmax and is refused.
"""

from __future__ import annotations

import numpy as np

from attntrace.kinds.base import Kind, plain_sup, sup
from attntrace.model.errors import BadInput


class Masked(Kind):
    id = "masked"
    reads, writes = ("S",), "S"
    starts = ("X", "QKV", "scores")
    letter, plain_letter, entry = "\\tilde{T}", "T~", "\\tilde{t}"
    view, prose = "masked", "masked"
    mistakes = ("mask_ignored", "mask_wrong_triangle", "mask_not_infinite")
    infinite_ok = True

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and problem.mask is not None

    def compute(self, ctx, head, state):
        t = state["S"]
        keep = keep_matrix(ctx.p.mask, t.shape)
        result = ctx.alg.mask(t.value, keep)
        details = {"keep": keep, "kind": "causal" if isinstance(ctx.p.mask, str) else "matrix"}
        h, ph = sup(head), plain_sup(head)
        m = t.letter
        formula = (f"\\tilde{{T}}{h}_{{ij}} = \\begin{{cases}} {m}{h}_{{ij}} & M{h}_{{ij}} = 1 \\\\ "
                   f"-\\infty & M{h}_{{ij}} = 0 \\end{{cases}}")
        plain = f"T~{ph}_ij = {t.letter}{ph}_ij (M_ij = 1), -inf (M_ij = 0)"
        return ctx.emit(self, head, [t.ref], formula, plain, result, t.shape, details)


def keep_matrix(mask, shape) -> np.ndarray:
    """The read-only boolean matrix of kept entries for `mask` ("causal" or a 0/1 matrix)."""
    if isinstance(mask, str):  # causal: query i sees keys j <= i (top-left aligned, as PyTorch)
        keep = np.tril(np.ones(shape, dtype=bool))
    else:
        keep = mask
        if keep.shape != tuple(shape):
            raise BadInput(f"step masked: mask has shape {keep.shape} but the scores are {tuple(shape)}")
    empty = np.flatnonzero(~keep.any(axis=1))
    if empty.size:
        raise BadInput(f"step masked: row {empty[0] + 1} of the mask keeps no entry, so its softmax is undefined")
    keep = keep.copy()
    keep.setflags(write=False)
    return keep


MASKED = Masked()
