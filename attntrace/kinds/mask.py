"""Masking: T-tilde_ij = T_ij where the mask keeps (i, j), -inf where it does not.

The masked scores get a name of their own (T-tilde): they are not T changed in place.
A mask is built from up to three parts, all combined with "and":

- `mask`: "causal" (query i sees keys j <= i, top-left aligned as PyTorch's `is_causal`),
  "causal_bottom_right" (query i of L sees keys j <= i + S - L: the queries are the *last*
  L positions of the S keys, as when decoding with a KV cache; PyTorch's
  `causal_lower_right`), or a 0/1 matrix of the scores' shape;
- `window = W`: a sliding window, keys with i - W < j <= i (shifted by S - L with the
  bottom-right alignment): a query sees itself and at most W - 1 keys before it. A window
  is always causal: without `mask` it means "causal_bottom_right" (the same as "causal" when
  there are as many queries as keys; Hugging Face's sliding window when decoding);
- `key_padding = [false, false, true]`: which keys are padding, true = padding (ignored),
  the polarity of nn.MultiheadAttention's key_padding_mask (SDPA's boolean attn_mask and
  Hugging Face's attention_mask are the other way round, which is why the spec takes only
  booleans, never 0/1).

A row that keeps nothing has no softmax and is refused in one line.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from attntrace.kinds.base import Kind, Mistake
from attntrace.model.errors import BadInput
from attntrace.model.formula import Cases, Infinity, Neg, sym

#: A masked score written as a finite number this far below the row's largest kept score
#: (e^-40 ~ 4e-18 of weight) gives the same weights as -inf: accepted, with a remark.
LARGE_NEGATIVE = 40.0


def _other_triangle(steps) -> bool:
    """mask_wrong_triangle tells apart only a square mask that is not symmetric."""
    keep = np.asarray(steps[0].details["keep"], dtype=bool)
    return keep.shape[0] == keep.shape[1] and bool((keep != keep.T).any())


def _finite_masked(step, answer, reference, bad, allowed):
    """mask_not_infinite read off the numbers: every wrong entry is a masked one, written finite."""
    hidden = np.isneginf(reference.lo)
    finite = hidden & np.isfinite(answer.values)
    if finite.any() and hidden[bad].all():
        return {"cells": [(int(i) + 1, int(j) + 1) for i, j in np.argwhere(finite)],
                "written": sorted({str(t) for t in answer.texts[bad]})}
    return None


class Masked(Kind):
    pipeline, after = "head", ("bias",)
    id = "masked"
    reads, writes = ("S",), "S"
    starts = ("X", "QKV", "scores")
    letter, entry = sym("T", accent="tilde"), sym("t", accent="tilde")
    view, prose = "masks", "masked"
    view_module = "maskview"
    symbols = ((sym("M"), "mask", "step"),)
    mistakes = (Mistake("mask_ignored"), Mistake("mask_wrong_triangle", when=_other_triangle),
                Mistake("mask_not_infinite", read_off=_finite_masked, explains=True),
                Mistake("window_off_by_one", when=lambda steps: any(
                    s.details.get("window") is not None and s.details.get("kind") != "matrix" for s in steps)),
                Mistake("causal_top_left_decoding", when=lambda steps: any(
                    s.details.get("kind") == "causal_bottom_right" and s.details.get("offset") for s in steps)))
    infinite_ok = True

    def enabled(self, problem) -> bool:
        return super().enabled(problem) and (problem.mask is not None or bool(_options(problem)))

    def compute(self, ctx, head, state):
        t = state["S"]
        opts = _options(ctx.p)
        keep = keep_matrix(ctx.p.mask, t.shape, window=opts.get("window"), padding=opts.get("key_padding"))
        result = ctx.alg.mask(t.value, keep)
        details = {"keep": keep, "kind": mask_kind(ctx.p.mask), "window": opts.get("window"),
                   "key_padding": opts.get("key_padding"), "offset": offset(ctx.p.mask, t.shape)}
        m = sym("M").at("i", "j")  # one mask for every head (it depends on positions only), as the table lists it
        cases = Cases(((t.letter.head(head).at("i", "j"), m.eq(1)), (Neg(Infinity()), m.eq(0))))
        formula = self.letter.head(head).at("i", "j").eq(cases)
        return ctx.emit(self, head, [t.ref], formula, result, t.shape, details)

    # -- the checker ---------------------------------------------------------------------------
    def report_params(self, steps):
        return {"masked": True}

    def carry(self, iv, step, args, mistake):
        """T where the mask keeps, -inf elsewhere; mask_ignored: T; mask_wrong_triangle: the
        transposed mask; mask_not_infinite: 0 instead of -inf; window_off_by_one: a window of
        W + 1; causal_top_left_decoding: the top-left causal mask."""
        t = args[0]
        keep = np.asarray(step.details["keep"], dtype=bool)
        if mistake == "mask_ignored":
            return t
        if mistake == "mask_wrong_triangle":
            keep = keep.T
        elif mistake in ("window_off_by_one", "causal_top_left_decoding"):
            keep = _planted_keep(iv, step, mistake)
        if keep.shape != t.shape:
            raise iv.Impossible()
        return iv.fill_where(t, keep, 0.0 if mistake == "mask_not_infinite" else -np.inf)

    def accepts(self, step, values, truth, right):
        """Masked scores written as a finite number so far below the row's kept scores that the
        weights are those of -inf (kept entries right, `right()`): mask_large_negative."""
        keep = np.isfinite(truth)
        finite_masked = ~keep & np.isfinite(values)
        if not finite_masked.any() or (keep & ~right()).any():
            return None
        kept_max = np.where(keep, values, -np.inf).max(axis=1, keepdims=True)
        return "mask_large_negative" if bool(np.all(np.where(finite_masked, values - kept_max, -np.inf) <= -LARGE_NEGATIVE)) else None

    def json_details(self, details) -> dict[str, Any]:
        keep = details.get("keep")
        out: dict[str, Any] = {"mask": details.get("kind")}
        if keep is not None:
            out["keep"] = np.asarray(keep, dtype=int).tolist()
        if details.get("window") is not None:
            out["window"] = details["window"]
        if details.get("key_padding") is not None:
            out["key_padding"] = list(details["key_padding"])
        return out


def _planted_keep(iv, step, mistake) -> np.ndarray:
    """The kept entries under window_off_by_one (W + 1) or causal_top_left_decoding."""
    det = step.details
    kind, window = det.get("kind"), det.get("window")
    shape = tuple(np.asarray(det["keep"]).shape)
    if mistake == "window_off_by_one":
        if window is None:
            raise iv.Impossible()
        window += 1
    else:
        kind = "causal"
    try:
        return keep_matrix(kind, shape, window=window, padding=det.get("key_padding"))
    except BadInput:  # a row that keeps nothing
        raise iv.Impossible() from None


def _options(problem) -> Mapping[str, Any]:
    extra = problem.extra or {}
    return {k: extra[k] for k in ("window", "key_padding") if extra.get(k) is not None}


def mask_kind(mask) -> str | None:
    """"causal", "causal_bottom_right", "matrix", or None (only a window or padding)."""
    if mask is None:
        return None
    return mask if isinstance(mask, str) else "matrix"


def offset(mask, shape) -> int:
    """How far the causal diagonal is shifted: S - L for the bottom-right alignment, else 0."""
    return shape[1] - shape[0] if isinstance(mask, str) and mask == "causal_bottom_right" else 0


def keep_matrix(mask, shape, *, window: int | None = None, padding=None) -> np.ndarray:
    """The read-only boolean matrix of kept entries (True = kept) for the scores' shape (L, S)."""
    L, S = shape
    if isinstance(mask, str) or (mask is None and window is not None):
        i = np.arange(L)[:, None] + offset(mask, shape)  # the query's position among the keys
        j = np.arange(S)[None, :]
        keep = j <= i
        if window is not None:
            keep = keep & (j > i - window)
    elif mask is not None:
        keep = mask
        if keep.shape != tuple(shape):
            raise BadInput(f"step masked: mask has shape {keep.shape} but the scores are {tuple(shape)}")
    else:
        keep = np.ones(shape, dtype=bool)
    if padding is not None:
        if len(padding) != S:
            raise BadInput(f"step masked: key_padding lists {len(padding)} keys but there are {S} keys")
        keep = keep & ~np.asarray(padding, dtype=bool)[None, :]
    empty = np.flatnonzero(~keep.any(axis=1))
    if empty.size:
        raise BadInput(f"step masked: row {empty[0] + 1} of the mask keeps no entry, so its softmax is undefined")
    keep = np.array(keep, dtype=bool)
    keep.setflags(write=False)
    return keep


def mask_setting(problem) -> str | None:
    """The report's one word for the mask: "window" (a sliding window), else its kind
    ("causal", "causal_bottom_right", "matrix"), else "padding" (key padding alone), or None."""
    opts = _options(problem)
    if "window" in opts:
        return "window"
    kind = mask_kind(problem.mask)
    return kind if kind is not None else "padding" if "key_padding" in opts else None


MASKED = Masked()
