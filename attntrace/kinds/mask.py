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

from attntrace.kinds.base import Kind
from attntrace.model.errors import BadInput
from attntrace.model.formula import Cases, Infinity, Neg, sym

class Masked(Kind):
    pipeline, after = "head", ("bias",)
    id = "masked"
    reads, writes = ("S",), "S"
    starts = ("X", "QKV", "scores")
    letter, entry = sym("T", accent="tilde"), sym("t", accent="tilde")
    view, prose = "masks", "masked"
    symbols = (("M", "M", "mask", "step"),)
    mistakes = ("mask_ignored", "mask_wrong_triangle", "mask_not_infinite", "window_off_by_one", "causal_top_left_decoding")
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
        m = sym("M").head(head).at("i", "j")
        cases = Cases(((t.letter.head(head).at("i", "j"), m.eq(1)), (Neg(Infinity()), m.eq(0))))
        formula = self.letter.head(head).at("i", "j").eq(cases)
        return ctx.emit(self, head, [t.ref], formula, result, t.shape, details)

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
