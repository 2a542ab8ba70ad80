"""PyTorch -> attntrace: trace a `torch.nn.MultiheadAttention` call or an SDPA call.

torch is an optional extra (`pip install attntrace[torch]`); it is imported only here, and
only when one of these functions is called. Everything is converted to float64 NumPy in
attntrace's row-vector convention before tracing:

- torch's `nn.Linear` / `in_proj_weight` store (out, in) and compute x W^T + b; attntrace
  writes Q = X W_Q + b_Q with W_Q (d_model, d_k), so every weight is transposed.
- `nn.MultiheadAttention` masks: bool True = *masked* (the opposite of attntrace's 0/1 keep
  matrix, where 1 = kept); float masks are added to the scores: their -inf entries become
  the mask, their finite entries the spec's `attn_bias` (the step `bias`, T-hat = T + B).
- `scaled_dot_product_attention` masks: bool True = *kept* (the opposite of MHA!); float
  masks as above. Its `scale` multiplies the scores; attntrace's `scale` divides them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attntrace.model.errors import BadInput, Unsupported
from attntrace.model.trace import Trace


def require_torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - depends on the environment
        raise Unsupported("PyTorch is not installed: pip install 'attntrace[torch]'") from None
    return torch


def fresh_float64(t) -> np.ndarray:
    """A tensor's values as a C-contiguous float64 ndarray that shares no memory with it, copied
    once. `t` may be a transposed, permuted or sliced view of a weight: the conversion writes
    straight into C order, so a weight read as (in, out) is not converted and then copied again
    into the transposed layout. Only a tensor the conversion hands back as itself (float64, on
    the CPU, already C-contiguous) is copied."""
    torch = require_torch()
    t = t.detach()
    converted = t.to(device="cpu", dtype=torch.float64, memory_format=torch.contiguous_format)
    out = converted.numpy()
    shared = t.device.type == "cpu" and converted.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    return out.copy() if shared else out


def to_numpy(t, what: str) -> np.ndarray:
    """A tensor (or array-like) as a fresh float64 ndarray."""
    torch = require_torch()
    if isinstance(t, torch.Tensor):
        if t.is_nested:
            raise Unsupported(f"{what} is a nested tensor; give a plain tensor")
        if t.is_complex():
            raise Unsupported(f"{what} is complex; attntrace traces real attention")
        return fresh_float64(t)
    try:
        return np.array(t, dtype=np.float64)
    except (TypeError, ValueError):
        raise BadInput(f"{what} must be a tensor or an array of numbers, not {type(t).__name__}") from None


def to_numpy_T(weight, what: str) -> np.ndarray:
    """A torch linear layer's (out, in) weight as the (in, out) float64 matrix the spec takes
    (row vectors times W), copied once straight into that layout (`fresh_float64`)."""
    torch = require_torch()
    if isinstance(weight, torch.Tensor) and weight.ndim == 2:
        return to_numpy(weight.detach().T, what)
    return np.ascontiguousarray(to_numpy(weight, what).T)


# -- masks ---------------------------------------------------------------------------------
def _keep_from_mask(mask, *, what: str, bool_true_means_keep: bool) -> np.ndarray:
    """A torch-style mask (bool or additive float 0/-inf) as attntrace's keep matrix (True = kept)."""
    torch = require_torch()
    if isinstance(mask, torch.Tensor):
        is_bool = mask.dtype == torch.bool
        arr = mask.detach().cpu().numpy() if is_bool else to_numpy(mask, what)
    else:
        arr = np.asarray(mask)
        is_bool = arr.dtype == np.bool_
        if not is_bool:
            arr = to_numpy(arr, what)
    if is_bool:
        return arr.astype(bool) if bool_true_means_keep else ~arr.astype(bool)
    if np.isnan(arr).any() or np.isposinf(arr).any():
        raise BadInput(f"{what} contains NaN or +inf")
    zero, neg_inf = arr == 0, np.isneginf(arr)
    if not (zero | neg_inf).all():
        bad = arr[~(zero | neg_inf)].flat[0]
        raise Unsupported(f"{what} is a float mask with the entry {bad!r}; attntrace masks are 0 (keep) or -inf (mask) only, "
                          "not additive biases")
    return zero


def _mask_and_bias(mask, L: int, S: int, *, what: str, heads: int, bool_true_means_keep: bool) -> tuple[np.ndarray | None, list | None]:
    """A torch attn_mask as (keep, bias): a bool mask is all keep; a float mask is added to the
    scores, so its -inf entries are the mask (keep = False there) and its finite entries a bias
    per (query, key) pair, the spec's attn_bias (None when every finite entry is 0): one (L, S)
    matrix for every head, or one per head when they differ."""
    torch = require_torch()
    is_bool = (mask.dtype == torch.bool) if isinstance(mask, torch.Tensor) else np.asarray(mask).dtype == np.bool_
    if is_bool:
        return _one_mask(_keep_from_mask(mask, what=what, bool_true_means_keep=bool_true_means_keep), L, S, what=what, heads=heads), None
    arr = to_numpy(mask, what)
    if np.isnan(arr).any() or np.isposinf(arr).any():
        raise BadInput(f"{what} contains NaN or +inf")
    keep = _one_mask(~np.isneginf(arr), L, S, what=what, heads=heads)
    finite = np.where(np.isneginf(arr), 0.0, arr)
    if not finite.any():
        return keep, None
    if finite.ndim < 2 or finite.ndim > 4 or finite.shape[-2:] != (L, S) and finite.shape[-2:] not in ((1, S), (L, 1)):
        raise BadInput(f"{what} has shape {tuple(finite.shape)}; expected (..., {L}, {S})")
    lead = finite.shape[:-2]
    if any(d not in (1, heads) for d in lead):
        raise Unsupported(f"{what} of shape {tuple(finite.shape)} is for a batch of more than one; attntrace traces one sequence")
    flat = np.broadcast_to(finite, lead + (L, S)).reshape(-1, L, S)
    if all(np.array_equal(flat[0], b) for b in flat[1:]):
        return keep, [np.ascontiguousarray(flat[0])]
    return keep, [np.ascontiguousarray(b) for b in np.broadcast_to(flat, (heads, L, S))]


def _one_mask(keep: np.ndarray, L: int, S: int, *, what: str, heads: int) -> np.ndarray:
    """Reduce a (L, S), (1|H, L, S) or (1, 1|H, L, S) keep matrix to one (L, S) matrix shared by all heads."""
    if keep.ndim < 2 or keep.ndim > 4:
        raise BadInput(f"{what} must be 2-, 3- or 4-dimensional, not of shape {keep.shape}")
    if keep.shape[-2:] != (L, S) and keep.shape[-2:] not in ((1, S), (L, 1)):
        raise BadInput(f"{what} has shape {tuple(keep.shape)}; expected (..., {L}, {S})")
    lead = keep.shape[:-2]
    if any(d not in (1, heads) for d in lead):
        raise Unsupported(f"{what} of shape {tuple(keep.shape)} is for a batch of more than one; attntrace traces one sequence")
    flat = np.broadcast_to(keep, lead + (L, S)).reshape(-1, L, S)
    if not all(np.array_equal(flat[0], m) for m in flat[1:]):
        raise Unsupported(f"{what} differs between heads; attntrace applies one mask to every head")
    return np.ascontiguousarray(flat[0])


def _combine_causal(keep: np.ndarray | None, is_causal: bool, L: int, S: int, *, what: str) -> Any:
    if not is_causal:
        return keep
    causal = np.tril(np.ones((L, S), dtype=bool))
    if keep is not None and not np.array_equal(keep, causal):
        raise BadInput(f"is_causal=True but {what} is not the causal mask; give one or the other")
    return "causal"


def _causal_bias(mask, L: int, S: int) -> str | None:
    """torch's CausalBias (`causal_lower_right(L, S)`, `causal_upper_left(L, S)`) as the spec
    names it: "causal_bottom_right" (query i keeps j <= i + S - L) or "causal" (j <= i)."""
    try:
        from torch.nn.attention.bias import CausalBias, CausalVariant
    except ImportError:  # pragma: no cover - an old torch has no CausalBias
        return None
    if not isinstance(mask, CausalBias):
        return None
    if (mask.seq_len_q, mask.seq_len_kv) != (L, S):
        raise BadInput(f"attn_mask is a causal bias for ({mask.seq_len_q}, {mask.seq_len_kv}) but q and k give ({L}, {S})")
    return "causal_bottom_right" if mask.variant == CausalVariant.LOWER_RIGHT else "causal"


def _named_mask(mask, L: int, S: int) -> dict:
    """The spec's mask keys: a 0/1 matrix that is a causal mask (either alignment), with or
    without a sliding window, by its name (the report then says which), else the matrix."""
    if mask is None or isinstance(mask, str):
        return {} if mask is None else {"mask": mask}
    from attntrace.kinds.mask import keep_matrix

    keep = np.asarray(mask, dtype=bool)
    width = int(keep[-1].sum())  # a window keeps W keys in its last row (all of them are kept)
    for name in ("causal", "causal_bottom_right"):
        for window in (None, width):
            try:
                if np.array_equal(keep_matrix(name, (L, S), window=window), keep):
                    return {"mask": name, **({"window": window} if window else {})}
            except BadInput:  # that alignment empties a row: not this mask
                break
    return {"mask": mask}


def _mask_spec(keep) -> Any:
    if keep is None or isinstance(keep, str):
        return keep
    if keep.all():
        return None
    return keep.astype(int).tolist()  # 0/1 rows, the form every spec reader accepts


# -- nn.MultiheadAttention -------------------------------------------------------------------
def _sequence(x, what: str, batch_first: bool) -> np.ndarray:
    """(L, E), or a batch of one: (1, L, E) if batch_first else (L, 1, E) -> (L, E) float64."""
    torch = require_torch()
    a = x if isinstance(x, torch.Tensor) else to_numpy(x, what)
    if a.ndim == 2:
        return to_numpy(a, what) if a is x else a
    if a.ndim == 3:
        batch_axis = 0 if batch_first else 1
        if a.shape[batch_axis] != 1:
            layout = "(N, L, E)" if batch_first else "(L, N, E)"
            raise Unsupported(f"{what} {tuple(a.shape)} is a batch of {a.shape[batch_axis]} {layout}; attntrace traces one sequence: pass a batch of one")
        one = a[0] if batch_first else a[:, 0]
        return to_numpy(one, what) if a is x else np.ascontiguousarray(one)  # a tensor's slice: converted once, into C order
    raise BadInput(f"{what} must be (L, E) or a batch of one, not of shape {tuple(a.shape)}")


def _same(a, b) -> bool:
    return a is b or (a.shape == b.shape and np.array_equal(a, b))


def multihead_spec(module, query, key=None, value=None, *, attn_mask=None, is_causal=False, key_padding_mask=None) -> dict:
    """The attntrace spec (a dict of float64 arrays) equivalent to `module(query, key, value, ...)`."""
    torch = require_torch()
    if not isinstance(module, torch.nn.MultiheadAttention):
        raise Unsupported(f"from_torch traces torch.nn.MultiheadAttention, not {type(module).__name__}")
    m = module
    if m.bias_k is not None or m.bias_v is not None:
        raise Unsupported("MultiheadAttention with add_bias_kv=True is not supported (its extra key/value row has no attntrace step)")
    if m.add_zero_attn:
        raise Unsupported("MultiheadAttention with add_zero_attn=True is not supported (its zero key/value row has no attntrace step)")
    if m.training and m.dropout > 0:
        raise Unsupported(f"MultiheadAttention in training mode with dropout={m.dropout} is random; call module.eval() first")

    if m.kdim != m.vdim:
        raise Unsupported(f"kdim={m.kdim} differs from vdim={m.vdim}; attntrace computes K and V from the same X_kv")

    key = query if key is None else key
    value = key if value is None else value
    batch_first = bool(m.batch_first)
    X = _sequence(query, "query", batch_first)
    Y = _sequence(key, "key", batch_first)
    Yv = Y if value is key else _sequence(value, "value", batch_first)
    if not _same(Y, Yv):
        raise Unsupported("key and value are different tensors; attntrace computes K and V from the same X_kv")
    E, h = m.embed_dim, m.num_heads
    if X.shape[1] != E:
        raise BadInput(f"query has width {X.shape[1]} but the module's embed_dim is {E}")

    if m._qkv_same_embed_dim:
        W = m.in_proj_weight  # (3E, E), torch's (out, in): each block converted once, into (in, out)
        WQ, WK, WV = (to_numpy_T(W[s], "in_proj_weight") for s in (slice(0, E), slice(E, 2 * E), slice(2 * E, None)))
    else:
        WQ = to_numpy_T(m.q_proj_weight, "q_proj_weight")  # (E, E)
        WK = to_numpy_T(m.k_proj_weight, "k_proj_weight")  # (kdim, E)
        WV = to_numpy_T(m.v_proj_weight, "v_proj_weight")  # (vdim, E)
    if Y.shape[1] != WK.shape[0]:
        raise BadInput(f"key has width {Y.shape[1]} but the module expects {WK.shape[0]}")

    spec: dict[str, Any] = {"X": X, "W_Q": WQ, "W_K": WK, "W_V": WV}
    if m.in_proj_bias is not None:
        b = to_numpy(m.in_proj_bias, "in_proj_bias")  # (3E,)
        spec.update(b_Q=b[None, :E], b_K=b[None, E:2 * E], b_V=b[None, 2 * E:])
    spec["W_O"] = to_numpy_T(m.out_proj.weight, "out_proj.weight")  # (E, E)
    if m.out_proj.bias is not None:
        spec["b_O"] = to_numpy(m.out_proj.bias, "out_proj.bias")[None, :]
    cross = query is not key and not _same(X, Y)
    if cross:
        spec["X_kv"] = Y
    if h > 1:
        spec["num_heads"] = h

    L, S = X.shape[0], Y.shape[0]
    keep = None
    if attn_mask is not None:
        keep, bias = _mask_and_bias(attn_mask, L, S, what="attn_mask", heads=h, bool_true_means_keep=False)
        if bias is not None:  # finite entries of a float mask: added to the scores (attntrace.kinds.bias)
            spec["attn_bias"] = bias[0] if len(bias) == 1 else bias
    if key_padding_mask is not None:
        pad = _keep_from_mask(key_padding_mask, what="key_padding_mask", bool_true_means_keep=False)
        if pad.ndim == 2 and pad.shape[0] == 1:
            pad = pad[0]
        if pad.shape != (S,):
            raise BadInput(f"key_padding_mask has shape {tuple(pad.shape)}; expected ({S},) or (1, {S})")
        if not pad.all():  # the spec's key_padding has MHA's polarity: true = padding (ignored)
            spec["key_padding"] = [not bool(x) for x in pad]
    # torch's MHA insists on attn_mask with is_causal (a hint); here is_causal alone is enough.
    mask = _mask_spec(_combine_causal(keep, is_causal and key_padding_mask is None, L, S, what="attn_mask"))
    spec.update(_named_mask(mask, L, S))
    return spec


def from_torch(module, query, key=None, value=None, *, attn_mask=None, is_causal=False, key_padding_mask=None,
               **run_overrides) -> Trace:
    """Trace `module(query, key, value, attn_mask=..., is_causal=...)` for a `torch.nn.MultiheadAttention`.

    query/key/value: (L, E) or a batch of one ((1, L, E) with batch_first, else (L, 1, E)).
    key defaults to query (self-attention), value to key. attn_mask follows torch: bool True =
    masked, or a float mask added to the scores (-inf: masked; other entries: the `bias` step);
    (L, S) or (num_heads, L, S), the -inf entries the same for every head.
    The trace's output and per-head weights equal the module's (need_weights=True,
    average_attn_weights=False). Extra keyword arguments go to `attntrace.run` (title, mode, ...).
    """
    from attntrace.tracer import trace_spec

    spec = multihead_spec(module, query, key, value, attn_mask=attn_mask, is_causal=is_causal,
                          key_padding_mask=key_padding_mask)
    # every array of the spec is a fresh float64 copy (to_numpy) that nothing else holds: not copied again
    return trace_spec(spec, **{"copy": False, **run_overrides})


# -- scaled_dot_product_attention ---------------------------------------------------------------
def _heads(x, what: str) -> np.ndarray:
    """(L, E), (1, L, E) or (1, H, L, E) -> (H, L, E) float64."""
    a = to_numpy(x, what)
    if a.ndim == 2:
        return a[None]
    if a.ndim in (3, 4):
        if a.shape[0] != 1:
            raise Unsupported(f"{what} {tuple(a.shape)} has a batch of {a.shape[0]}; attntrace traces one sequence: pass a batch of one")
        return a[0][None] if a.ndim == 3 else a[0]
    raise BadInput(f"{what} must be (L, E), (1, L, E) or (1, H, L, E), not of shape {tuple(a.shape)}")


def qkv_spec(q, k, v, *, attn_mask=None, is_causal=False, scale=None, enable_gqa=False) -> dict:
    """The attntrace spec equivalent to `F.scaled_dot_product_attention(q, k, v, ...)`.

    With `enable_gqa` and k, v having h_kv heads (h_kv dividing q's h), the spec is
    grouped-query attention: Q, K, V at full width (each head's columns side by side, head 1
    first) with num_heads = h and num_kv_heads = h_kv, so query head i reads key/value head
    floor((i - 1) / (h / h_kv)) + 1, SDPA's repeat_interleave order."""
    Q, K, V = _heads(q, "q"), _heads(k, "k"), _heads(v, "v")
    h, h_kv = Q.shape[0], K.shape[0]
    if V.shape[0] != h_kv:
        raise BadInput(f"k has {h_kv} heads but v has {V.shape[0]}; they must have the same number")
    if h_kv != h and not enable_gqa:
        raise Unsupported(f"q has {h} heads but k and v have {h_kv}: grouped-query attention needs enable_gqa=True (as SDPA)")
    if h % h_kv:
        raise BadInput(f"q has {h} heads, not a multiple of the {h_kv} heads of k and v (grouped-query attention needs one)")
    L, S = Q.shape[1], K.shape[1]
    if attn_mask is not None and is_causal:
        raise BadInput("give attn_mask or is_causal=True, not both (as scaled_dot_product_attention)")
    keep = _causal_bias(attn_mask, L, S)  # torch.nn.attention.bias.causal_lower_right / causal_upper_left
    bias = None
    if keep is None and attn_mask is not None:
        keep, bias = _mask_and_bias(attn_mask, L, S, what="attn_mask", heads=h, bool_true_means_keep=True)
    mask = _mask_spec("causal" if is_causal else keep)
    if h_kv != h:
        full = lambda a: np.ascontiguousarray(a.transpose(1, 0, 2).reshape(a.shape[1], -1))  # noqa: E731 - (H, L, E) -> (L, H*E)
        spec: dict[str, Any] = {"Q": full(Q), "K": full(K), "V": full(V), "num_heads": h, "num_kv_heads": h_kv}
    else:
        tables = [{"Q": Q[i], "K": K[i], "V": V[i]} for i in range(h)]
        spec = {"heads": tables} if h > 1 else dict(tables[0])
    if scale is not None:
        scale = float(scale)
        if not scale > 0 or math.isinf(scale):
            raise Unsupported(f"scale={scale!r}: attntrace divides the scores by a positive number, so the SDPA scale must be positive")
        spec["scale"] = 1.0 / scale  # SDPA multiplies by scale; attntrace divides by its factor
    if bias is not None:  # finite entries of a float mask: added to the scores (attntrace.kinds.bias)
        spec["attn_bias"] = bias[0] if len(bias) == 1 else bias
    spec.update(_named_mask(mask, L, S))
    return spec


def from_qkv(q, k, v, *, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, **run_overrides) -> Trace:
    """Trace `torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=..., scale=..., enable_gqa=...)`.

    q, k, v: (L, E), (1, L, E) or (1, H, L, E); H > 1 gives a multi-head trace (one head per
    slice; its concat step is SDPA's output transposed to (L, H*E); no W_O, SDPA has none). attn_mask follows SDPA: bool
    True = kept, or a float mask added to the scores (-inf: masked; other entries: the `bias`
    step, per head when they differ). Tensors or NumPy arrays. With `enable_gqa`, k and
    v may have fewer heads than q (grouped-query attention; one head: multi-query).
    """
    from attntrace.tracer import trace_spec

    spec = qkv_spec(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    return trace_spec(spec, **{"copy": False, **run_overrides})  # fresh copies (to_numpy): not copied again
