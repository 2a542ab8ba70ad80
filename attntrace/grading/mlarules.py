"""Interval rules and the planted mistake of multi-head latent attention's steps (attntrace.kinds.mla).

Every MLA step is a product, a norm, a rotation, a stacking or a sum, so each has a valid
enclosure computed from the student's own earlier values: a mistake made in the latent is
carried through the up-projections, the RoPE parts, the stacked Q and K and the scores.

`mla_rope_on_compressed`: RoPE applied to the content parts as well (Q = [RoPE(Q^C)  Q̃^R],
K = [RoPE(K^C)  K̃^R]), the rotation of standard RoPE attention carried over to the latent
parts, which the paper's decoupled design avoids (a position-dependent rotation between W^UQ and
W^UK stops the absorption). Planted on the stacked query and key when d_nope is even.
"""

from __future__ import annotations

import numpy as np

from attntrace.grading import blockrules, intervals
from attntrace.grading.catalogue import Impossible, Mutation

#: code -> the step kinds it changes (the first is its catalogue kind).
STEPS = {"mla_rope_on_compressed": ("Q_mla", "K_mla")}


def mutations(code: str, world) -> list:
    """The mistake where it changes something: a stacked query or key whose content part has an even width."""
    steps = STEPS[code]
    present = [s for s in world.steps if s.id in steps]
    if not present or any(s.details["parts"][0] % 2 for s in present):
        return []
    return [Mutation(code, steps[0], steps=frozenset(steps))]


def _rope_details(world):
    return next(s.details for s in world.steps if s.id == "K_R_rope")


def _product(world, step, args, m, mutation):
    """A W, A B^T (details transposed): the latents, the up-projections, the absorbed products."""
    if len(args) != 2:
        raise Impossible()
    a, b = args[0], (args[1].T if step.details.get("transposed") else args[1])
    try:
        return blockrules.linear(a, b, None)
    except ValueError:
        raise Impossible() from None


def _stack(world, step, args, m, mutation):
    """[A  B] side by side; mla_rope_on_compressed: A rotated by the positions first."""
    a, b = args
    if a.shape[0] != b.shape[0]:
        raise Impossible()
    if m == "mla_rope_on_compressed":
        from attntrace.grading.kindrules import _rotated

        det = dict(_rope_details(world))
        d = a.shape[1]
        if d % 2:
            raise Impossible()
        a = _rotated(a, {**det, "d": d}, det["layout"], np.asarray([float(p) for p in det["positions"]][-a.shape[0]:]))
    return intervals.stack([a, b], axis=1)


def _sum(world, step, args, m, mutation):
    a, b = args
    if a.shape != b.shape:
        raise Impossible()
    return intervals.add(a, b)


def rules(norm, rope, cache) -> dict:
    """Step id -> rule; the norm, rotation and cache rules are kindrules' own (passed in)."""
    products = ("C_Q", "C_KV", "K_R", "Q_C", "Q_R", "K_C", "V_C", "W_absorbed", "Q_absorbed", "scores_C", "scores_R")
    return {**{p: _product for p in products}, "C_Q_norm": norm, "C_KV_norm": norm, "K_R_rope": rope, "Q_R_rope": rope,
            "C_KV_cache": cache, "K_R_cache": cache, "Q_mla": _stack, "K_mla": _stack, "scores_absorbed": _sum}
