"""Reference implementations ("oracles") of modern attention variants, for the tests.

Every function here takes and returns numpy float64 arrays and computes its answer with
PyTorch or Hugging Face transformers (imported inside the function, so that importing
this module needs neither). None of them uses attntrace code: they are what attntrace's
own computations are tested against, at 1e-10 in float64. ``tests/test_oracles.py``
checks the oracles against each other and against hand-computed cases.

Conventions (attntrace's): row vectors; X is (n, d_model); Q = X W_Q with W_Q of shape
(d_model, h*d_k) (nn.Linear stores (out, in): the weights here are transposed from it);
per-head arrays are (h, n, d); positions are 0, 1, ... unless given; a boolean "keep"
matrix is True where query i may attend to key j.

Precision notes (transformers 5.x), which decide what can be compared at 1e-10:

- ``LlamaRotaryEmbedding.forward`` computes its angles in float32 (``position_ids.float()
  * inv_freq.float()``, and ``inv_freq`` itself comes from a float32 ``arange``), even in a
  ``.double()`` model: its cos/sin are good to ~1e-7 only. The oracles therefore use HF's
  own layout functions (``apply_rotary_pos_emb`` / ``rotate_half``) with cos/sin built by
  HF's formula in float64, and the Llama oracles replace the model's rotary module's
  ``forward`` with that float64 formula (``rope_float64=True``, the default). The real
  float32 module is kept for a ~1e-6 cross-check (``rope_cos_sin_hf_module``).
- HF's ``eager_attention_forward`` takes the softmax in float32 (``softmax(...,
  dtype=torch.float32)``): its attention weights are good to ~1e-7 only. The Llama oracles
  run the layer with ``attn_implementation="sdpa"`` (torch SDPA, float64 throughout) for
  the output, compute float64 weights with torch ops from the layer's own q/k, and keep
  the eager weights/output as ``weights_eager`` / ``output_eager`` for a ~1e-6 check.
- ``LlamaRMSNorm`` normalises in float32; the Llama oracles return the attention layer's
  actual input (after the norm), so this does not matter for attention checks.
"""

from __future__ import annotations

import math
import types

import numpy as np

# --------------------------------------------------------------------------- helpers


def _t(a):
    """numpy -> torch float64 (bool arrays stay bool)."""
    import torch

    a = np.asarray(a)
    if a.dtype == np.bool_:
        return torch.from_numpy(a.copy())
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


def _np(t):
    """torch -> numpy (floating tensors as float64, others keep their dtype)."""
    a = t.detach().cpu().numpy()
    return a.astype(np.float64) if t.is_floating_point() else a


def _keep_to_additive(keep):
    """Boolean keep matrix -> additive mask (0 where kept, -inf elsewhere)."""
    keep = np.asarray(keep, dtype=bool)
    return np.where(keep, 0.0, -np.inf)


# --------------------------------------------------------------------------- SDPA


def sdpa(q, k, v, *, mask=None, is_causal=False, scale=None, enable_gqa=False):
    """Attention output from ``torch.nn.functional.scaled_dot_product_attention`` in float64.

    q: (h, n_q, d), k: (h_kv, n_k, d), v: (h_kv, n_k, d_v); with ``enable_gqa=True`` h may
    be a multiple of h_kv (query head i uses kv head ``i // (h // h_kv)``, SDPA's
    ``repeat_interleave`` grouping). ``mask``: a boolean keep matrix (True = attend, SDPA's
    convention) or an additive float bias, shape (n_q, n_k) or (h, n_q, n_k).
    ``is_causal``: SDPA's top-left causal mask (j <= i). ``scale`` defaults to 1/sqrt(d).
    Returns (h, n_q, d_v).
    """
    import torch
    import torch.nn.functional as F

    attn_mask = None if mask is None else _t(mask)
    with torch.no_grad():
        out = F.scaled_dot_product_attention(
            _t(q), _t(k), _t(v), attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )
    return _np(out)


def attention_weights(q, k, *, mask=None, is_causal=False, scale=None, enable_gqa=False):
    """The softmax weights that ``sdpa`` applies to V (SDPA itself does not return them).

    Computed with torch ops the way SDPA's math reference does: K (and the grouping) is
    ``k.repeat_interleave(h // h_kv, dim=-3)`` when ``enable_gqa``; scores = q k^T * scale
    (scale = 1/sqrt(d) by default); a boolean mask sets dropped scores to -inf, a float
    mask is added; ``is_causal`` keeps j <= i; ``torch.softmax`` over keys in float64.
    Returns (h, n_q, n_k). ``test_oracles`` checks weights @ V == ``sdpa`` output.
    """
    import torch

    qt, kt = _t(q), _t(k)
    if enable_gqa and kt.shape[-3] != qt.shape[-3]:
        kt = kt.repeat_interleave(qt.shape[-3] // kt.shape[-3], dim=-3)
    if scale is None:
        scale = 1.0 / math.sqrt(qt.shape[-1])
    scores = (qt @ kt.transpose(-2, -1)) * scale
    n_q, n_k = scores.shape[-2:]
    if is_causal:
        keep = torch.ones(n_q, n_k, dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        m = _t(mask)
        if m.dtype == torch.bool:
            scores = scores.masked_fill(~m, float("-inf"))
        else:
            scores = scores + m
    return _np(torch.softmax(scores, dim=-1))


def causal_lower_right_keep(L, S):
    """Boolean (L, S) keep matrix of ``torch.nn.attention.bias.causal_lower_right(L, S)``.

    Materialised from torch's ``CausalBias`` object (``._materialize()``, the private
    method torch itself uses for the math fallback). Documented behaviour: the diagonal is
    aligned to the bottom-right corner, i.e. keep j <= i + S - L (rows with i + S - L < 0
    keep nothing).
    """
    from torch.nn.attention.bias import causal_lower_right

    return _np(causal_lower_right(L, S)._materialize()).astype(bool)


def sdpa_causal_lower_right(q, k, v, *, scale=None):
    """SDPA with ``attn_mask=torch.nn.attention.bias.causal_lower_right(L, S)``.

    q: (h, L, d), k/v: (h, S, d) (same head count: the CausalBias path has no GQA).
    The bottom-right causal mask used for decoding with a KV cache / chunked prefill: query
    i sits at absolute position i + S - L. Returns (h, L, d_v).
    """
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    qt, kt, vt = _t(q), _t(k), _t(v)
    bias = causal_lower_right(qt.shape[-2], kt.shape[-2])
    with torch.no_grad():
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias, scale=scale)
    return _np(out)


# --------------------------------------------------------------------------- HF masks


def sliding_window_keep(n, window, *, n_k=None, q_offset=0):
    """Boolean (n, n_k) keep matrix of Hugging Face's sliding-window causal mask.

    From ``transformers.masking_utils``: ``sdpa_mask(mask_function=
    sliding_window_causal_mask_function(window))``, the function behind
    ``create_sliding_window_causal_mask`` (Mistral, Gemma, ...). Keep key j for query i
    (absolute position i + q_offset) when i - window < j <= i: the query itself and the
    window - 1 keys before it. ``n_k`` defaults to n + q_offset.
    """
    from transformers.masking_utils import sdpa_mask, sliding_window_causal_mask_function

    n_k = n + q_offset if n_k is None else n_k
    m = sdpa_mask(
        batch_size=1,
        q_length=n,
        kv_length=n_k,
        q_offset=q_offset,
        mask_function=sliding_window_causal_mask_function(window),
        allow_is_causal_skip=False,
    )
    return _np(m[0, 0]).astype(bool)


def causal_padding_keep(key_keep, *, n_q=None, q_offset=None):
    """Boolean (n_q, n_k) keep matrix of HF's causal mask with a 2-D padding mask.

    ``key_keep``: length-n_k 0/1 (or bool) attention_mask as a tokenizer gives it (0 =
    padding). From ``transformers.masking_utils.sdpa_mask(attention_mask=...)`` with the
    default ``causal_mask_function``: keep j when j <= i + q_offset and key j is not
    padding. By default the queries are the last n_q positions (q_offset = n_k - n_q),
    and n_q = n_k. A query whose keys are all padding gets an all-False row.
    """
    import torch
    from transformers.masking_utils import sdpa_mask

    key_keep = np.asarray(key_keep).astype(bool)
    n_k = key_keep.shape[-1]
    n_q = n_k if n_q is None else n_q
    q_offset = n_k - n_q if q_offset is None else q_offset
    m = sdpa_mask(
        batch_size=1,
        q_length=n_q,
        kv_length=n_k,
        q_offset=q_offset,
        attention_mask=torch.from_numpy(key_keep.copy())[None, :],
        allow_is_causal_skip=False,
    )
    return _np(m[0, 0]).astype(bool)


# --------------------------------------------------------------------------- RoPE


def rope_cos_sin_f64(positions, dim, base=10000.0):
    """cos, sin (n, dim) of HF Llama's default RoPE, by ``LlamaRotaryEmbedding``'s formula in float64.

    inv_freq = 1 / base^(arange(0, dim, 2) / dim); freqs = outer(positions, inv_freq);
    emb = cat(freqs, freqs); cos(emb), sin(emb) (``compute_default_rope_parameters`` and
    ``forward`` of transformers' LlamaRotaryEmbedding, with float64 for float32).
    """
    import torch

    pos = torch.as_tensor(np.asarray(positions), dtype=torch.float64)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return _np(emb.cos()), _np(emb.sin())


def rope_cos_sin_hf_module(positions, dim, base=10000.0):
    """cos, sin (n, dim) from transformers' real ``LlamaRotaryEmbedding`` module (float32 angles).

    Good to ~1e-7 only (see the module docstring); used to check ``rope_cos_sin_f64``.
    """
    import torch
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = _tiny_llama_config(hidden_size=dim, num_heads=1, num_kv_heads=1, rope_theta=base)  # head_dim = dim
    rot = LlamaRotaryEmbedding(cfg).double()
    pos = torch.as_tensor(np.asarray(positions), dtype=torch.long)[None, :]
    with torch.no_grad():
        cos, sin = rot(torch.zeros(1, dtype=torch.float64), pos)
    return _np(cos[0]), _np(sin[0])


def rope_half_hf(x, positions=None, base=10000.0):
    """RoPE in Hugging Face Llama's rotate_half layout: pairs (x_i, x_{i+d/2}).

    ``x``: (h, n, d) float64 (d even); ``positions``: length n (default 0..n-1). Applies
    ``transformers.models.llama.modeling_llama.apply_rotary_pos_emb`` (x*cos +
    rotate_half(x)*sin, rotate_half(x) = cat(-x2, x1)) with cos/sin from
    ``rope_cos_sin_f64`` (LlamaRotaryEmbedding's formula in float64: the module itself
    computes in float32). Pair i (i < d/2) is rotated by angle m * base^(-2i/d).
    """
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    x = np.asarray(x, dtype=np.float64)
    h, n, d = x.shape
    positions = np.arange(n) if positions is None else np.asarray(positions)
    cos, sin = rope_cos_sin_f64(positions, d, base)
    xt = _t(x)[None]  # (1, h, n, d): HF's (batch, heads, seq, head_dim)
    with torch.no_grad():
        out, _ = apply_rotary_pos_emb(xt, xt, _t(cos)[None], _t(sin)[None])  # unsqueeze_dim=1 -> heads
    return _np(out[0])


def rope_interleaved_complex(x, positions=None, base=10000.0):
    """RoPE in the paper's / Meta llama reference layout: adjacent pairs (x0,x1), (x2,x3), ...

    As Meta's ``precompute_freqs_cis`` + ``apply_rotary_emb`` (facebookresearch/llama,
    llama/model.py), in float64/complex128: freqs = 1 / base^(arange(0, d, 2)/d),
    freqs_cis = torch.polar(1, outer(positions, freqs)); x viewed as complex pairs with
    ``torch.view_as_complex``, multiplied by freqs_cis, back with ``view_as_real``.
    ``x``: (h, n, d); returns (h, n, d). Independent of HF and of attntrace.
    """
    import torch

    x = np.asarray(x, dtype=np.float64)
    h, n, d = x.shape
    positions = np.arange(n) if positions is None else np.asarray(positions)
    freqs = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64)[: d // 2] / d))
    t = torch.as_tensor(positions, dtype=torch.float64)
    angles = torch.outer(t, freqs)
    freqs_cis = torch.polar(torch.ones_like(angles), angles)  # (n, d/2) complex128
    x_ = torch.view_as_complex(_t(x).reshape(h, n, d // 2, 2).contiguous())
    out = torch.view_as_real(x_ * freqs_cis[None]).flatten(-2)
    return _np(out)


# --------------------------------------------------------------------------- ALiBi


def alibi_slopes_paper(num_heads):
    """ALiBi head slopes m_h, copied from the paper authors' ``get_slopes``.

    Source: ofirpress/attention_with_linear_biases, fairseq/models/transformer.py. For n a
    power of 2: the geometric sequence starting at 2^(-8/n) with ratio 2^(-8/n). Otherwise
    the slopes of the closest lower power of 2, then every other slope of 2x that power.
    Returns (num_heads,) float64.
    """

    def get_slopes(n):
        def get_slopes_power_of_2(n):
            start = 2 ** (-(2 ** -(math.log2(n) - 3)))
            ratio = start
            return [start * ratio**i for i in range(n)]

        if math.log2(n).is_integer():
            return get_slopes_power_of_2(n)  # In the paper, we only train models that have 2^a heads for some a. This function has
        else:  # some good properties that only occur when the input is a power of 2. To maintain that even
            closest_power_of_2 = 2 ** math.floor(math.log2(n))  # when the number of heads is not a power of 2, we use this workaround.
            return (
                get_slopes_power_of_2(closest_power_of_2)
                + get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
            )

    return np.array(get_slopes(num_heads), dtype=np.float64)


def alibi_bias_hf(num_heads, n_keys, *, key_keep=None):
    """transformers' Bloom ``build_alibi_tensor``: bias m_h * j, shape (num_heads, 1, n_keys).

    From ``transformers.models.bloom.modeling_bloom.build_alibi_tensor`` (attention_mask
    all ones unless ``key_keep`` is given; then j counts non-padding keys). It depends on
    the key position j only: per query row i it differs from the paper's -m_h (i - j) by
    the constant m_h * i, and softmax is invariant to adding a constant to a row, so under
    any mask the weights equal softmax(scores + ``alibi_bias_matrix``). The slopes are
    computed in float32 by HF (``torch.pow`` of a float32 base): exact powers of 2 for
    num_heads <= 8; above that they are off by up to ~3e-7 relative (for 16 heads HF's
    slope 2^-1 is 0.49999997), so use ``alibi_bias_matrix`` for 1e-10 comparisons and
    this one with num_heads <= 8 (or a ~1e-6 tolerance).
    """
    import torch
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    am = torch.ones(1, n_keys, dtype=torch.long) if key_keep is None else torch.as_tensor(np.asarray(key_keep))[None]
    alibi = build_alibi_tensor(am, num_heads, torch.float64)  # (batch*heads, 1, n_keys)
    return _np(alibi)


def alibi_bias_matrix(num_heads, n_q, n_k, *, q_offset=0):
    """The paper's ALiBi bias -m_h * (i - j), shape (num_heads, n_q, n_k), float64.

    Query row r is at position i = r + q_offset, key j at position j; slopes from
    ``alibi_slopes_paper``. Entries with j > i are positive (a causal mask removes them).
    """
    m = alibi_slopes_paper(num_heads)
    i = np.arange(n_q)[:, None] + q_offset
    j = np.arange(n_k)[None, :]
    return -m[:, None, None] * (i - j)[None, :, :]


# --------------------------------------------------------------------------- Llama


def _tiny_llama_config(hidden_size=16, num_heads=4, num_kv_heads=2, rope_theta=10000.0, layers=1, attn="eager"):
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=hidden_size,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        vocab_size=50,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": float(rope_theta)},
        initializer_range=0.3,  # O(1) scores: attention far from uniform
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attn_implementation=attn,
    )


def _use_float64_rope(model):
    """Replace the model's ``rotary_emb.forward`` with LlamaRotaryEmbedding's formula in float64."""
    import torch

    rot = model.model.rotary_emb if hasattr(model, "model") else model.rotary_emb
    cfg = rot.config
    dim = cfg.head_dim
    base = cfg.rope_parameters["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)

    rot.forward = types.MethodType(forward, rot)


def _capture(module):
    """Forward pre/post hooks on ``module`` recording its kwargs and output; returns (store, remove)."""
    store = {}

    def pre(mod, args, kwargs):
        store["kwargs"] = dict(kwargs)
        store["args"] = args

    def post(mod, args, kwargs, out):
        store["out"] = out

    h1 = module.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = module.register_forward_hook(post, with_kwargs=True)
    return store, lambda: (h1.remove(), h2.remove())


def _attn_weights_np(attn):
    """(W_Q, W_K, W_V, W_O) of an HF attention module in attntrace's (in, out) convention."""
    return tuple(_np(p.weight.T) for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj))


def _heads(a, n_heads):
    """(n, n_heads*d) -> (n_heads, n, d)."""
    n = a.shape[0]
    return a.reshape(n, n_heads, -1).transpose(1, 0, 2)


def _rope_from_layer(q, k, cos, sin):
    """Apply HF's own apply_rotary_pos_emb with the cos/sin the layer received."""
    import torch
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    with torch.no_grad():
        qr, kr = apply_rotary_pos_emb(_t(q)[None], _t(k)[None], _t(cos)[None], _t(sin)[None])
    return _np(qr[0]), _np(kr[0])


def llama_attention_layer(
    seed, hidden_size=16, num_heads=4, num_kv_heads=2, n=5, rope_theta=10000.0, *, rope_float64=True
):
    """Layer-0 self-attention of a tiny random HF ``LlamaModel`` (float64), with its inputs and outputs.

    Builds ``LlamaModel(LlamaConfig(hidden_size, num_heads, num_kv_heads, 1 layer, ...))``
    under ``torch.manual_seed(seed)``, ``.double()``, runs it on random inputs_embeds with
    position_ids 0..n-1 and captures what ``LlamaAttention.forward`` of layer 0 receives
    (hidden_states after the input RMSNorm, position_embeddings = (cos, sin) from
    ``model.rotary_emb``, attention_mask from ``create_causal_mask``) with forward hooks.
    The layer is run with ``attn_implementation="eager"`` (HF weights, float32 softmax) and
    again with ``"sdpa"`` (float64 output). With ``rope_float64`` the rotary module computes
    in float64 (see the module docstring); without, q_rope/k_rope are HF's float32-angle ones.

    Returns a dict (numpy float64 unless said):
      x (n, d_model) the attention layer's input; W_Q (d_model, h*d_k), W_K, W_V
      (d_model, h_kv*d_k), W_O (h*d_k, d_model): transposed from nn.Linear, no biases;
      positions (n,) int; cos, sin (n, d_k) as the layer received them;
      q (h, n, d_k), k, v (h_kv, n, d_k) before RoPE; q_rope, k_rope after RoPE (HF's
      apply_rotary_pos_emb; k_rope is also checked against the DynamicCache contents);
      keep (n, n) bool and mask (n, n) the additive eager mask (0 / finfo.min) as used;
      scale = d_k^-0.5; weights (h, n, n): float64 softmax of the layer's scores
      (``attention_weights`` with GQA grouping = HF's repeat_kv); output (n, d_model):
      the layer's output (after o_proj) with SDPA; weights_eager, output_eager: HF eager;
      num_heads, num_kv_heads, head_dim (ints).
    """
    import torch
    from transformers import LlamaModel

    cfg = _tiny_llama_config(hidden_size, num_heads, num_kv_heads, rope_theta, layers=1, attn="eager")
    torch.manual_seed(seed)
    model = LlamaModel(cfg).double().eval()
    if rope_float64:
        _use_float64_rope(model)
    attn = model.layers[0].self_attn
    embeds = torch.randn(1, n, hidden_size, dtype=torch.float64)
    position_ids = torch.arange(n)[None]

    store, remove = _capture(attn)
    try:
        with torch.no_grad():
            out = model(inputs_embeds=embeds, position_ids=position_ids, output_attentions=True, use_cache=True)
    finally:
        remove()
    kw = store["kwargs"]
    hidden = kw["hidden_states"]
    cos_t, sin_t = kw["position_embeddings"]
    mask_t = kw["attention_mask"]
    output_eager, weights_eager = store["out"]
    assert out.attentions[0] is not None

    # the same layer, same inputs, through torch SDPA (float64 end to end)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        output_sdpa, _ = attn(hidden_states=hidden, position_embeddings=(cos_t, sin_t), attention_mask=mask_t)

    W_Q, W_K, W_V, W_O = _attn_weights_np(attn)
    x = _np(hidden[0])
    cos, sin = _np(cos_t[0]), _np(sin_t[0])
    q, k, v = _heads(x @ W_Q, num_heads), _heads(x @ W_K, num_kv_heads), _heads(x @ W_V, num_kv_heads)
    q_rope, k_rope = _rope_from_layer(q, k, cos, sin)
    cache_k = _np(out.cache.layers[0].keys[0])
    cache_v = _np(out.cache.layers[0].values[0])
    if not (np.allclose(cache_k, k_rope, rtol=0, atol=1e-12) and np.allclose(cache_v, v, rtol=0, atol=1e-12)):
        raise AssertionError("recomputed k_rope / v differ from the layer's DynamicCache")
    mask = _np(mask_t[0, 0])
    keep = mask == 0
    head_dim = hidden_size // num_heads
    scale = head_dim**-0.5
    weights = attention_weights(q_rope, k_rope, mask=keep, scale=scale, enable_gqa=True)
    return {
        "x": x,
        "W_Q": W_Q,
        "W_K": W_K,
        "W_V": W_V,
        "W_O": W_O,
        "positions": np.arange(n),
        "cos": cos,
        "sin": sin,
        "q": q,
        "k": k,
        "v": v,
        "q_rope": q_rope,
        "k_rope": k_rope,
        "keep": keep,
        "mask": mask,
        "scale": scale,
        "weights": weights,
        "output": _np(output_sdpa[0]),
        "weights_eager": _np(weights_eager[0]),
        "output_eager": _np(output_eager[0]),
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
    }


def llama_kv_cache_step(
    seed, hidden_size=16, num_heads=4, num_kv_heads=2, prefix_len=4, rope_theta=10000.0, *, rope_float64=True
):
    """One KV-cache decoding step of a tiny random HF ``LlamaForCausalLM`` (2 layers, float64, SDPA).

    Runs the prefix (``prefix_len`` random token ids) with ``use_cache=True``, then the next
    token alone with the returned ``DynamicCache`` (``cache=``; transformers 5.x renamed
    ``past_key_values`` to ``cache`` and still accepts the old name with a deprecation),
    position_ids defaulting to prefix_len, as ``generate`` does. Layer 0 is captured with
    hooks. Also runs the full prefix+token without cache, and greedy ``model.generate(
    max_new_tokens=2, do_sample=False, use_cache=True)`` against a no-cache greedy loop.

    Returns a dict (numpy float64 unless said):
      input_ids (P+1,) int; W_Q, W_K, W_V, W_O (attntrace convention, layer 0);
      k_cache_before, v_cache_before (h_kv, P, d_k): layer-0 cache after the prefix (K
      after RoPE); k_cache_after, v_cache_after (h_kv, P+1, d_k); x_new (d_model,) the
      layer-0 attention input of the new token; q_new (h, d_k) its query after RoPE;
      cos_new, sin_new (d_k,); weights_new (h, P+1) float64 softmax over all cached
      positions (scale d_k^-0.5, GQA); output_new (d_model,) layer-0 attention output
      (after o_proj); x_full (P+1, d_model), weights_full (h, P+1, P+1), output_full
      (P+1, d_model), k_rope_full (h_kv, P+1, d_k): the no-cache run's layer 0;
      logits_step (vocab,), logits_full_last (vocab,);
      generate_tokens, nocache_tokens (2,) int; generate_logits, nocache_logits (2, vocab).
    """
    import torch
    from transformers import LlamaForCausalLM

    P = prefix_len
    cfg = _tiny_llama_config(hidden_size, num_heads, num_kv_heads, rope_theta, layers=2, attn="sdpa")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).double().eval()
    if rope_float64:
        _use_float64_rope(model)
    attn = model.model.layers[0].self_attn
    ids = torch.randint(0, cfg.vocab_size, (1, P + 1))
    W_Q, W_K, W_V, W_O = _attn_weights_np(attn)
    head_dim = hidden_size // num_heads
    scale = head_dim**-0.5

    with torch.no_grad():
        pre = model(ids[:, :P], use_cache=True)
        cache = pre.cache
        k_before = _np(cache.layers[0].keys[0]).copy()
        v_before = _np(cache.layers[0].values[0]).copy()
        store, remove = _capture(attn)
        try:
            step = model(ids[:, P:], cache=cache, use_cache=True)
        finally:
            remove()
        k_after = _np(step.cache.layers[0].keys[0])
        v_after = _np(step.cache.layers[0].values[0])

        full_store, remove = _capture(attn)
        try:
            full = model(ids, use_cache=False)
        finally:
            remove()

    kw = store["kwargs"]
    x_new = _np(kw["hidden_states"][0])  # (1, d_model)
    cos_t, sin_t = kw["position_embeddings"]
    cos_new, sin_new = _np(cos_t[0]), _np(sin_t[0])  # (1, d_k)
    q_new, k_new = _rope_from_layer(_heads(x_new @ W_Q, num_heads), _heads(x_new @ W_K, num_kv_heads), cos_new, sin_new)
    if not np.allclose(k_new[:, 0], k_after[:, P], rtol=0, atol=1e-12):
        raise AssertionError("the new token's recomputed k_rope differs from the cache")
    step_mask = kw["attention_mask"]  # None with SDPA when decoding one token without padding
    if step_mask is not None:
        step_keep = step_mask if step_mask.dtype == torch.bool else step_mask == 0
        if not bool(step_keep.all()):
            raise AssertionError("the one-token decoding step masked some cached key")
    weights_new = attention_weights(q_new, k_after, scale=scale, enable_gqa=True)[:, 0, :]

    fkw = full_store["kwargs"]
    x_full = _np(fkw["hidden_states"][0])
    fcos, fsin = (_np(t[0]) for t in fkw["position_embeddings"])
    q_full, k_full = _rope_from_layer(
        _heads(x_full @ W_Q, num_heads), _heads(x_full @ W_K, num_kv_heads), fcos, fsin
    )
    weights_full = attention_weights(q_full, k_full, is_causal=True, scale=scale, enable_gqa=True)

    # generate (cache) vs a greedy loop without cache
    with torch.no_grad():
        gen = model.generate(
            ids[:, :P], max_new_tokens=2, do_sample=False, use_cache=True,
            return_dict_in_generate=True, output_logits=True, pad_token_id=0,
        )
        seq = ids[:, :P]
        nocache_tokens, nocache_logits = [], []
        for _ in range(2):
            logits = model(seq, use_cache=False).logits[0, -1]
            tok = int(torch.argmax(logits))
            nocache_tokens.append(tok)
            nocache_logits.append(_np(logits))
            seq = torch.cat([seq, torch.tensor([[tok]])], dim=1)

    return {
        "input_ids": ids[0].numpy().copy(),
        "W_Q": W_Q,
        "W_K": W_K,
        "W_V": W_V,
        "W_O": W_O,
        "scale": scale,
        "k_cache_before": k_before,
        "v_cache_before": v_before,
        "k_cache_after": k_after,
        "v_cache_after": v_after,
        "x_new": x_new[0],
        "q_new": q_new[:, 0, :],
        "cos_new": cos_new[0],
        "sin_new": sin_new[0],
        "weights_new": weights_new,
        "output_new": _np(store["out"][0][0, 0]),
        "x_full": x_full,
        "k_rope_full": k_full,
        "weights_full": weights_full,
        "output_full": _np(full_store["out"][0][0]),
        "logits_step": _np(step.logits[0, -1]),
        "logits_full_last": _np(full.logits[0, -1]),
        "generate_tokens": gen.sequences[0, P:].numpy().copy(),
        "nocache_tokens": np.array(nocache_tokens),
        "generate_logits": np.stack([_np(lg[0]) for lg in gen.logits]),
        "nocache_logits": np.stack(nocache_logits),
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
    }
