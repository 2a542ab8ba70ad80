"""Interval rules and planted mistakes of the step kinds beyond the ten of `STEP_IDS`: RoPE, the
KV cache, ALiBi, the sliding window and the bottom-right causal mask, grouped-query attention,
the backward pass, the online softmax and the Transformer block.

Each rule computes a step from the student's world (`intervals.Box`), right or with one of
its mistakes; `mistakes.apply` looks them up in `RULES` next to its own rules for the ten `STEP_IDS`. A step kind
with a rule here carries a mistake made before it forward (a wrong Q gives a Q-tilde, scores,
... that are `carried`); the backward steps of a head (dV, dA, dT, dS, dQ, dK and a head's
dW_Q, dW_K, dW_V) have a rule here too; the block's norms, FFN products and activations
compute through `blockrules` (valid enclosures); every block of the online softmax (m, P, l,
O, then L) declares its rule in its kind (`kinds.online`, read by `kindcarry`). Kinds with no rule (the whole-input gradients) are
taken at their true value (`mistakes._at_truth`), so nothing is carried
through them.

Mistakes (catalogue.CATALOGUE; their sentences in templates/check/messages.*.j2; the kinds
that declare their own mistakes and rules, ALiBi, the given bias and the KV cache among them,
are read through `kindcarry`):

- `rope_wrong_layout`: the other pairing of the columns (half <-> interleaved);
- `rope_positions_from_1`: positions counted from 1 instead of 0;
- `window_off_by_one`: a sliding window that keeps W + 1 keys;
- `causal_top_left_decoding`: the top-left causal mask when the queries are the last L of S keys;
- `forgot_residual`: a residual step is the sublayer's output alone (the input not added back);
- `posenc_not_added`: the embedding E = X, the position table P not added;
- `softmax_backward_no_rowsum`: the softmax's backward dT = A o dA, the row term
  r_i = sum_k a_ik dA_ik dropped (step dscaled, or dscores when the scores are not scaled);
- `grad_scale_forgotten`: dS = dT, the 1/sqrt(d_k) of the scaling forgotten on the way back;
- `dV_missing_transpose`: dV = A dZ instead of A^T dZ;
- `dK_missing_transpose`: dK = dS Q instead of dS^T Q;
- `online_no_rescale`: the online softmax's O^(j) = O^(j-1) + P^(j) V_j, the factor
  e^(m^(j-1) - m^(j)) dropped (in every block j >= 2, from the student's own O^(j-1));
- `lse_without_max`: the log-sum-exp L = log l, the running maximum m not added back;
- `norm_unbiased_variance`: LayerNorm's variance divided by d - 1 instead of d;
- `norm_wrong_axis`: each column normalised over the tokens instead of each row over its features;
- `gelu_relu_confused`: ReLU where the FFN asks for GELU, or GELU where it asks for ReLU;
- `posenc_sin_cos_swapped`: the sinusoidal table with cos in the even columns and sin in the odd;
- `kv_head_mapping`: query head i reads key/value head ((i-1) mod h_kv) + 1 instead of
  floor((i-1) / (h/h_kv)) + 1 (only told apart when h_kv >= 2 and h/h_kv >= 2).
"""

from __future__ import annotations

import numpy as np

from attntrace.grading import blockrules, intervals
from attntrace.grading.catalogue import Impossible, Mutation, to_float
from attntrace.grading.intervals import Box
from attntrace.model.errors import BadInput

#: code -> the step kinds it changes (the first is its catalogue kind).
STEPS = {
    "rope_wrong_layout": ("Q_rope", "K_rope"),
    "rope_positions_from_1": ("Q_rope", "K_rope"),
    "rope_rotated_values": ("Z",),
    "window_off_by_one": ("masked",),
    "causal_top_left_decoding": ("masked",),
    "kv_head_mapping": ("scores", "Z"),
    "forgot_residual": ("residual1", "residual2"),
    "posenc_not_added": ("embed",),
    "softmax_backward_no_rowsum": ("dscaled", "dscores"),
    "grad_scale_forgotten": ("dscores",),
    "dV_missing_transpose": ("dV",),
    "dK_missing_transpose": ("dK",),
    "online_no_rescale": ("online_out",),
    "lse_without_max": ("lse",),
    "norm_unbiased_variance": ("norm1", "norm2"),
    "norm_wrong_axis": ("norm1", "norm2"),
    "gelu_relu_confused": ("ffn_act",),
    "posenc_sin_cos_swapped": ("pos_enc",),
}


# -- which of these mistakes can be made in a trace ------------------------------------------------
def mutations(code: str, world) -> list:
    """The Mutations of `code` worth planting in this trace (none when it changes nothing)."""
    steps = STEPS[code]
    present = [s for s in world.steps if s.id in steps]
    if not present:
        return []
    mutation = Mutation(code, steps[0], steps=frozenset(steps))
    if code == "rope_positions_from_1":
        return [mutation] if any(list(s.details["positions"])[:1] == [0] for s in present) else []
    if code == "rope_rotated_values":  # only where the keys were rotated, so V has their positions
        return [mutation] if any(s.id == "K_rope" for s in world.steps) else []
    if code == "window_off_by_one":
        return [mutation] if any(s.details.get("window") is not None and s.details.get("kind") != "matrix" for s in present) else []
    if code == "causal_top_left_decoding":
        return [mutation] if any(s.details.get("kind") == "causal_bottom_right" and s.details.get("offset") for s in present) else []
    if code == "softmax_backward_no_rowsum":
        return [mutation] if any(s.details.get("rule") == "softmax" for s in present) else []
    if code == "grad_scale_forgotten":
        return [mutation] if any(s.details.get("rule") == "scale" for s in present) else []
    if code == "online_no_rescale":
        return [mutation] if any(s.details.get("block", 1) > 1 for s in present) else []
    if code == "norm_unbiased_variance":
        return [mutation] if any(s.details.get("norm") == "layer" for s in present) else []
    if code == "gelu_relu_confused":
        return [mutation] if any(s.details.get("activation") in ("relu", "gelu", "gelu_tanh") for s in present) else []
    if code == "kv_head_mapping":
        h, h_kv = world.trace.num_heads, kv_heads(world)
        if not h_kv or h_kv < 2 or h // h_kv < 2:
            return []
        return [Mutation(code, steps[0], tuple((i - 1) % h_kv + 1 for i in range(1, h + 1)), steps=frozenset(steps))]
    return [mutation]


def kv_heads(world) -> int | None:
    """The number of key/value heads of a grouped-query trace (scores@i read K@j), else None."""
    js = {ref.partition("@")[2] for s in world.steps if s.id == "scores" for ref in s.inputs if "@" in ref}
    return len(js) or None


def rewire(step, refs: tuple, mutation) -> tuple:
    """kv_head_mapping: the key/value head j of `K@j`, `V_cache@j`, ... read by query head i
    replaced by the wrong one, mutation.order[i - 1]."""
    if mutation is None or mutation.code != "kv_head_mapping" or not mutation.changes(step.id) or step.head is None:
        return refs
    wrong = mutation.order[step.head - 1]
    return tuple(f"{r.partition('@')[0]}@{wrong}" if "@" in r else r for r in refs)


# -- the rules ----------------------------------------------------------------------------------
def _rope(world, step, args, m, mutation):
    det = step.details
    layout = det["layout"]
    positions = np.asarray([float(p) for p in det["positions"]])
    if m == "rope_wrong_layout":
        layout = "half" if layout == "interleaved" else "interleaved"
    elif m == "rope_positions_from_1":
        positions = positions + 1
    return _rotated(args[0], det, layout, positions)


def rotated_values(world, step, v: Box) -> Box:
    """rope_rotated_values: V turned as the keys it belongs to were (K_rope of the same
    key/value head: its positions, layout and base), which RoPE never does."""
    ref = step.inputs[1] if len(step.inputs) > 1 else "V"
    head = int(ref.partition("@")[2]) if "@" in ref else step.head
    k_rope = next((s for s in world.steps if s.id == "K_rope" and s.head == head), None)
    if k_rope is None:
        raise Impossible()
    det = k_rope.details
    return _rotated(v, det, det["layout"], np.asarray([float(p) for p in det["positions"]]))


def _rotated(x: Box, det, layout: str, positions) -> Box:
    """Each row of x turned pair by pair by its position's angles (RoPE's rotation, intervals)."""
    d = int(det["d"])
    if x.shape != (len(positions), d):
        raise Impossible()
    from attntrace.kinds.rope import rope_pairs

    inv_freq = 1.0 / (float(det["base"]) ** (np.arange(0, d, 2, dtype=np.float64) / d))
    angles = np.outer(positions, inv_freq)
    rows = []
    for r in range(x.shape[0]):
        rot = np.zeros((d, d))
        for p, (j, k) in enumerate(rope_pairs(layout, d)):
            c, s = np.cos(angles[r, p]), np.sin(angles[r, p])
            rot[j, j], rot[k, j], rot[j, k], rot[k, k] = c, -s, s, c
        rows.append(intervals.matmul(Box(x.lo[r:r + 1], x.hi[r:r + 1]), intervals.point(rot)))
    return intervals.stack(rows, axis=0)


def _sum(world, step, args, m, mutation):
    """E = X + P and the residual connections: a sum of two matrices of one shape."""
    a, b = args
    if m == "forgot_residual":
        return b
    if m == "posenc_not_added":
        return a
    if a.shape != b.shape:
        raise Impossible()
    return intervals.add(a, b)


def _times(a: Box, b: Box) -> Box:
    """a o b entry by entry: |xy - mx my| <= |mx| ry + rx |my| + rx ry."""
    ma, ra, mb, rb = a.mid, a.rad, b.mid, b.rad
    with np.errstate(invalid="ignore", over="ignore"):
        return intervals._widen(ma * mb, np.abs(ma) * rb + ra * np.abs(mb) + ra * rb, np.abs(ma * mb))


def _minus_row(a: Box, r: Box) -> Box:
    """a - r 1^T (r a column, one number a row)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return intervals._widen(a.mid - r.mid, a.rad + r.rad, np.abs(a.mid) + np.abs(r.mid))


def _grad(world, step, args, m, mutation):
    """The backward steps of one head that are products (dV = A^T dZ, dA = dZ V^T, dQ = dS K,
    dK = dS^T Q, dW_Q = X^T dQ, ...), the softmax's backward dT = A o (dA - r 1^T) and the
    scale dS = dT / sqrt(d_k); any other rule (a seed, a block of dconcat) at its true value."""
    rule = step.details.get("rule")
    if rule == "product" and len(args) == 2:
        ta, tb = step.details.get("transposed", (False, False))
        if m in ("dV_missing_transpose", "dK_missing_transpose"):
            ta = False
        a, b = (args[0].T if ta else args[0]), (args[1].T if tb else args[1])
        if a.shape[1] != b.shape[0]:
            raise Impossible()
        return intervals.matmul(a, b)
    if rule == "softmax" and len(args) == 2:
        a, da = args
        if a.shape != da.shape or not (np.isfinite(a.lo).all() and np.isfinite(a.hi).all()):
            raise Impossible()
        if m == "softmax_backward_no_rowsum":
            return _times(a, da)
        ag = _times(a, da)
        r = intervals.Box(ag.lo.sum(axis=1, keepdims=True), ag.hi.sum(axis=1, keepdims=True))
        return _times(a, _minus_row(da, r))
    if rule == "scale" and len(args) == 1:
        if m == "grad_scale_forgotten":
            return args[0]
        return intervals.divide(args[0], float(step.details["factor"]))
    return _grad_plumbing(world, step, args, rule)


def _grad_plumbing(world, step, args, rule):
    """The other backward steps from the student's values: the seed 2 O of the loss sum o^2,
    db_O (column sums of dO), a head's dZ (its columns of dconcat), dW_Q of full-width
    weights (X^T times the heads' dQ side by side) and dX (the sum over heads and projections
    of dP W_P^T). A seed given as a matrix or the loss sum o (dL/dO = 1) depends on nothing the
    student wrote: its true value."""
    if rule == "sum_squares" and len(args) == 1:
        return intervals.divide(args[0], 0.5)
    if rule == "colsum" and len(args) == 1:
        a = args[0]
        return intervals._widen((a.lo.sum(axis=0, keepdims=True) + a.hi.sum(axis=0, keepdims=True)) / 2,
                                (a.hi - a.lo).sum(axis=0, keepdims=True) / 2, np.abs(a.mid).sum(axis=0, keepdims=True))
    if rule == "block" and len(args) == 1:
        first, last = step.details["block"]
        if args[0].shape[1] < last:
            raise Impossible()
        return intervals.Box(args[0].lo[:, first - 1:last], args[0].hi[:, first - 1:last])
    if rule == "stack" and len(args) >= 2:
        parts = list(args[1:])
        if len({p.shape[0] for p in parts}) != 1 or args[0].shape[0] != parts[0].shape[0]:
            raise Impossible()
        return intervals.matmul(args[0].T, intervals.stack(parts, axis=1))
    if rule == "paths" and len(args) >= 2 and len(args) % 2 == 0:
        total = None
        for dp, w in zip(args[0::2], args[1::2]):
            if dp.shape[1] != w.shape[1]:
                raise Impossible()
            term = intervals.matmul(dp, w.T)
            if total is not None and total.shape != term.shape:
                raise Impossible()
            total = term if total is None else intervals.add(total, term)
        return total
    return intervals.point(world.truth[world.key(step)])


def _first_order(f, x: Box) -> Box:
    """f (a smooth map of matrices) over the box x, bounded to first order: f(mid) and the
    finite-difference Jacobian times the radii (a mistake's computation, used only to name it)."""
    mid = f(x.mid)
    rad = np.zeros_like(mid)
    flat_rad = x.rad.ravel()
    for k in np.flatnonzero(flat_rad):
        h = max(1e-7, 1e-7 * abs(x.mid.flat[k]))
        bumped = x.mid.copy()
        bumped.flat[k] += h
        rad += np.abs((f(bumped) - mid) / h) * flat_rad[k]
    return intervals._widen(mid, rad * 1.01, np.abs(mid) + 1.0)


def _norm(world, step, args, m, mutation):
    """LayerNorm / RMSNorm from the student's input (`blockrules.norm`, a valid enclosure); its
    mistakes likewise: the variance over d - 1 (norm_unbiased_variance) or each column over the
    tokens (norm_wrong_axis), bounded to first order (they only name a mistake)."""
    det = step.details
    rms, eps = det.get("norm") == "rms", float(det.get("eps", 1e-5))
    named = dict(zip(step.inputs[1:], args[1:]))
    if m not in ("norm_unbiased_variance", "norm_wrong_axis"):
        gain_box = next((b for n, b in named.items() if n.startswith("gamma")), None)
        bias_box = next((b for n, b in named.items() if n.startswith("beta")), None)
        try:
            return blockrules.norm(args[0], gain_box, bias_box, eps, rms)
        except ValueError:
            raise Impossible() from None
    gain = next((b.mid for n, b in named.items() if n.startswith("gamma")), None)
    bias = next((b.mid for n, b in named.items() if n.startswith("beta")), None)
    axis = 0 if m == "norm_wrong_axis" else 1

    def f(r):
        if rms:
            y = r / np.sqrt((r * r).mean(axis=axis, keepdims=True) + eps)
        else:
            c = r - r.mean(axis=axis, keepdims=True)
            count = r.shape[axis] - (1 if m == "norm_unbiased_variance" else 0)
            y = c / np.sqrt((c * c).sum(axis=axis, keepdims=True) / max(count, 1) + eps)
        return y * (1.0 if gain is None else gain) + (0.0 if bias is None else bias)

    if not (np.isfinite(args[0].lo).all() and np.isfinite(args[0].hi).all()):
        raise Impossible()
    return _first_order(f, args[0])


def _activation(world, step, args, m, mutation):
    """The FFN's activation from the student's H (and U for SwiGLU), a valid enclosure
    (`blockrules`); gelu_relu_confused: ReLU for GELU or GELU for ReLU, entry by entry over
    the student's H (its extremes and midpoint)."""
    from attntrace.algebra.numeric import NumericAlgebra

    act = step.details.get("activation")
    f = NumericAlgebra().activation
    if m != "gelu_relu_confused" or act not in ("relu", "gelu", "gelu_tanh"):
        if act == "swiglu" and len(args) == 2 and args[0].shape == args[1].shape:
            return blockrules.swiglu(args[0], args[1], f)
        if act in ("relu", "gelu", "gelu_tanh", "silu") and len(args) == 1:
            return blockrules.activation(args[0], act, f)
        return intervals.point(to_float(step.value))

    wrong = "gelu" if act == "relu" else "relu"
    h = args[0]
    vals = [NumericAlgebra().activation(x, wrong) for x in (h.lo, h.mid, h.hi)]
    lo, hi = np.minimum.reduce(vals), np.maximum.reduce(vals)
    return intervals._widen((lo + hi) / 2, (hi - lo) / 2, np.abs(hi) + np.abs(lo))


def _pos_enc(world, step, args, m, mutation):
    """The sinusoidal table at its true value; posenc_sin_cos_swapped: cos in the even columns
    (0-based: columns 1, 3, ... counting from 1), sin in the odd."""
    if m != "posenc_sin_cos_swapped":
        return intervals.point(to_float(step.value))
    n, d = step.shape
    pos = np.arange(n, dtype=np.float64)[:, None]
    col = np.arange(d)[None, :]
    angle = pos / float(step.details.get("base", 10000)) ** ((2 * (col // 2)) / d)
    return intervals.point(np.where(col % 2 == 0, np.cos(angle), np.sin(angle)))


def _ffn_linear(world, step, args, m, mutation):
    """The FFN's products H = N W_1 + b_1, U = N W_up, F = G W_2 + b_2 from the student's values."""
    try:
        return blockrules.linear(args[0], args[1], args[2] if len(args) > 2 else None)
    except ValueError:
        raise Impossible() from None


def masked_keep(step, m) -> np.ndarray | None:
    """The kept entries under a planted mask mistake (window W + 1, top-left causal), or None."""
    if m not in ("window_off_by_one", "causal_top_left_decoding"):
        return None
    from attntrace.kinds.mask import keep_matrix

    det = step.details
    kind, window = det.get("kind"), det.get("window")
    shape = tuple(np.asarray(det["keep"]).shape)
    if m == "window_off_by_one":
        if window is None:
            raise Impossible()
        window += 1
    else:
        kind = "causal"
    try:
        return keep_matrix(kind, shape, window=window, padding=det.get("key_padding"))
    except BadInput:  # a row that keeps nothing
        raise Impossible() from None


RULES = {"Q_rope": _rope, "K_rope": _rope,
         "embed": _sum, "residual1": _sum, "residual2": _sum,
         "norm1": _norm, "norm2": _norm, "ffn_act": _activation,
         "pos_enc": _pos_enc, "ffn_hidden": _ffn_linear, "ffn_up": _ffn_linear, "ffn_out": _ffn_linear,
         **{g: _grad for g in ("dV", "dweights", "dscaled", "dscores", "dQ", "dK", "dW_Q", "dW_K", "dW_V",
                               "doutput", "dW_O", "db_O", "dconcat", "dZ", "dX")}}
