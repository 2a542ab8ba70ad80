"""Mixture-of-experts layers written from the papers, in NumPy, independent of attntrace and HF.

Mixtral (Jiang et al. 2024, arXiv 2401.04088, eq. 1-2): y = sum_i Softmax(Top2(x W_g))_i SwiGLU_i(x).
DeepSeek-V3 (arXiv 2412.19437, section 2.1.2, eqs. 12-16): h' = u + sum_shared FFN^s(u) +
sum_i g_i FFN^r_i(u), s_i = Sigmoid(u^T e_i), g'_i = s_i if s_i + b_i in TopK (within the best
topk_group groups, a group scored by the sum of its 2 highest s + b) else 0, g_i = g'_i / sum g'
(then times the routed scaling factor, as the released model does).
"""

from __future__ import annotations

import numpy as np


def silu(x):
    return x / (1.0 + np.exp(-x))


def swiglu(x, e):
    return (silu(x @ e["W_gate"]) * (x @ e["W_up"])) @ e["W_down"]


def mixtral(x, w_router, experts, top_k=2, b_router=None, expert=swiglu):
    """Mixtral's MoE MLP (NumPy): logits x W_r (+ b_r), the top-k per token, softmax over the chosen
    logits, and the gate-weighted sum of the chosen experts' outputs `expert(rows, e)`. Returns the
    output and each token's chosen experts, sorted."""
    logits = x @ w_router + (0.0 if b_router is None else b_router)
    out = np.zeros((x.shape[0], experts[0]["W_down"].shape[1]))
    chosen = []
    for i in range(x.shape[0]):
        top = np.argsort(-logits[i], kind="stable")[:top_k]
        g = np.exp(logits[i, top] - logits[i, top].max())
        g /= g.sum()
        chosen.append(sorted(top.tolist()))
        for gi, e in zip(g, top):
            out[i] += gi * expert(x[i:i + 1], experts[e])[0]
    return out, chosen


def deepseek(x, w_router, experts, *, top_k=2, bias=None, n_group=1, topk_group=1, normalize=True, scaling=1.0, shared=None):
    s = 1.0 / (1.0 + np.exp(-(x @ w_router)))
    choice = s + (0.0 if bias is None else np.asarray(bias).reshape(1, -1))
    n_exp = s.shape[1]
    size = n_exp // n_group
    out = np.zeros((x.shape[0], experts[0]["W_down"].shape[1]))
    chosen = []
    for i in range(x.shape[0]):
        allowed = np.ones(n_exp, dtype=bool)
        if n_group > 1:
            gs = np.array([np.sort(choice[i, q * size:(q + 1) * size])[::-1][:2].sum() for q in range(n_group)])
            keep = np.argsort(-gs, kind="stable")[:topk_group]
            allowed = np.isin(np.arange(n_exp) // size, keep)
        c = np.where(allowed, choice[i], -np.inf)
        top = np.argsort(-c, kind="stable")[:top_k]
        g = s[i, top] / (s[i, top].sum() if normalize else 1.0) * scaling
        chosen.append(sorted(top.tolist()))
        for gi, e in zip(g, top):
            out[i] += gi * swiglu(x[i:i + 1], experts[e])[0]
        if shared is not None:
            out[i] += swiglu(x[i:i + 1], shared)[0]
    return out, chosen


def random_moe(seed=0, n=4, d=6, d_ff=5, n_exp=4, shared=False):
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.normal(size=s) * 0.7  # noqa: E731
    experts = [{"W_gate": r(d, d_ff), "W_up": r(d, d_ff), "W_down": r(d_ff, d)} for _ in range(n_exp)]
    sh = {"W_gate": r(d, d_ff), "W_up": r(d, d_ff), "W_down": r(d_ff, d)} if shared else None
    return r(n, d), r(d, n_exp), experts, sh


def block_spec(x, w_router, experts, moe_extra=None, shared=None, seed=0):
    """A llama block (identity attention weights scaled small) whose FFN is the mixture: the
    test compares the moe step's output F with the reference on the block's own N^f."""
    d = x.shape[1]
    rng = np.random.default_rng(seed + 100)
    spec = {"X": x, "block": "llama", "mask": "causal", "W_Q": rng.normal(size=(d, d)) * 0.5, "W_K": rng.normal(size=(d, d)) * 0.5,
            "W_V": rng.normal(size=(d, d)) * 0.5, "W_O": rng.normal(size=(d, d)) * 0.5,
            "moe": {"W_router": w_router, "experts": experts, **(moe_extra or {})}}
    if shared is not None:
        spec["moe"]["shared"] = shared
    return spec


# -- Hugging Face Mixtral and DeepSeek-V3 layers (tiny random float64 models) ---------------------------
class _Float64Torch:
    """torch, with torch.float32 meaning float64: HF's own forward code, exec'd against it,
    runs its float32 casts (norms, routers) in float64."""

    def __getattr__(self, name):
        import torch

        return torch.float64 if name == "float32" else getattr(torch, name)


def float64_forward(module):
    """module.forward (HF's source) with its float32 casts (`torch.float32`, `.float()`) in float64."""
    import inspect
    import sys
    import textwrap
    import types

    src = textwrap.dedent(inspect.getsource(type(module).forward)).replace(".float()", ".double()")
    ns = dict(vars(sys.modules[type(module).__module__]))
    ns["torch"] = _Float64Torch()
    exec(src, ns)
    return types.MethodType(ns["forward"], module)


def tiny_mixtral(seed=0, *, hidden=8, heads=2, kv_heads=1, experts=4, top_k=2, float64_internals=True):
    import torch
    from transformers import MixtralConfig, MixtralModel

    from oracles_mla import _float64_rotary

    torch.manual_seed(seed)
    cfg = MixtralConfig(vocab_size=32, hidden_size=hidden, intermediate_size=6, num_hidden_layers=1, num_attention_heads=heads,
                        num_key_value_heads=kv_heads, num_local_experts=experts, num_experts_per_tok=top_k,
                        max_position_embeddings=64, attn_implementation="sdpa")
    cfg._experts_implementation = "eager"
    model = MixtralModel(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.3)
            else:
                p.normal_(0.0, 0.5)
        if float64_internals:
            for m in model.modules():
                if type(m).__name__ in ("MixtralRMSNorm", "MixtralTopKRouter"):
                    m.forward = float64_forward(m)
            _float64_rotary(model.rotary_emb, hidden // heads, cfg.rope_parameters["rope_theta"])
    return model


def tiny_deepseek_moe(seed=0, *, float64_internals=True, n_group=2, topk_group=1):
    """A DeepseekV3Model whose layer 0 is a mixture of experts (4 routed, 1 shared, 2 groups)."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3Model

    from oracles_mla import _float64_rms, _float64_rotary

    torch.manual_seed(seed)
    cfg = DeepseekV3Config(vocab_size=32, hidden_size=8, intermediate_size=12, moe_intermediate_size=4, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=2, q_lora_rank=6, kv_lora_rank=4, qk_nope_head_dim=2,
                           qk_rope_head_dim=2, v_head_dim=3, first_k_dense_replace=0, n_routed_experts=4, num_experts_per_tok=2,
                           n_group=n_group, topk_group=topk_group, n_shared_experts=1, routed_scaling_factor=2.5,
                           max_position_embeddings=64, attn_implementation="sdpa")
    cfg._experts_implementation = "eager"  # the grouped_mm kernel takes no float64
    model = DeepseekV3Model(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0, 0.3) if "norm" in name else p.normal_(0.0, 0.5)
        for m in model.modules():
            if hasattr(m, "e_score_correction_bias"):
                m.e_score_correction_bias.normal_(0.0, 0.1)
            if float64_internals and type(m).__name__ == "DeepseekV3RMSNorm":
                m.forward = _float64_rms(m)
            if float64_internals and type(m).__name__ == "DeepseekV3TopkRouter":
                m.forward = float64_forward(m)
    if float64_internals:
        _float64_rotary(model.rotary_emb, 2, cfg.rope_parameters["rope_theta"])
    return model
