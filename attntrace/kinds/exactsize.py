"""A bound on exact mode inside the Transformer block.

After a softmax, a LayerNorm puts exponentials under a square root, and every later step
(products, GELU's erf, the second norm) nests that tree again: for a 2 x 2 block with
attention that is not uniform, evaluating one entry of the second norm to 20 digits takes
minutes. Exact mode therefore stops, in one line naming the step, when an entry of a block
step grows beyond EXACT_OPS operations (SymPy's count_ops), and says which modes work.
"""

from __future__ import annotations

from attntrace.model.errors import BadInput

#: Operations an exact entry of a block step may have: evaluating an entry of 800 (the second
#: norm of a 2 x 2 post-LN block with GELU) to 20 digits takes 6 s; one of 140 takes 0.25 s.
EXACT_OPS = 500


def check_exact_size(ctx, step_id: str, result) -> None:
    """Refuse an exact result whose entries are too large to evaluate or print."""
    if ctx.p.mode != "exact" or result is None:
        return
    import sympy

    for i in range(result.shape[0]):
        for j in range(result.shape[1]):
            ops = sympy.count_ops(result[i, j])
            if ops > EXACT_OPS:
                raise BadInput(f"step {step_id}: exact entry ({i + 1}, {j + 1}) has {ops} operations (more than {EXACT_OPS}): "
                               f"after a softmax, exact entries grow at every step of the block; use mode numeric or symbolic")
