"""Multi-head latent attention written from the DeepSeek-V2 paper (arXiv 2405.04434, section 2.1,
eqs. 9-19), in NumPy, independent of attntrace and of Hugging Face's code.

Row vectors (tokens are rows). RoPE in the RoFormer paper's form: pair i = columns (2i-1, 2i)
of the token at position m turned by m * base^(-2(i-1)/d) (interleaved), or columns (i, i + d/2)
(half, the layout of rotate_half); the scores do not depend on which, as long as q and k agree.
"""

from __future__ import annotations

import numpy as np


def rms_norm(x, gain=None, eps=1e-6):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if gain is None else y * np.asarray(gain).reshape(1, -1)


def rope(x, positions, base=10000.0, layout="interleaved", theta=None, mu=1.0):
    """theta: the pairs' frequencies (default base^(-2i/d)); mu: YaRN's factor on the result."""
    n, d = x.shape
    theta = base ** (-np.arange(d // 2) * 2.0 / d) if theta is None else np.asarray(theta, dtype=np.float64)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * theta[None, :]
    if layout == "interleaved":
        a, b = x[:, 0::2], x[:, 1::2]
    else:
        a, b = x[:, : d // 2], x[:, d // 2:]
    ra, rb = a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)
    out = np.empty_like(x)
    if layout == "interleaved":
        out[:, 0::2], out[:, 1::2] = ra, rb
    else:
        out[:, : d // 2], out[:, d // 2:] = ra, rb
    return mu * out


def mla(x, w, h, *, positions=None, base=10000.0, layout="interleaved", causal=True, q_eps=1e-6, kv_eps=1e-6,
        c_kv_past=None, k_r_past=None, theta=None, mu=1.0, softmax_scale=None):
    """The attention output (n, d_model) and per-head scores, from the paper's equations.

    w: W_DQ (optional), gamma_Q, W_UQ, W_QR, W_DKV, gamma_KV, W_UK, W_UV, W_KR, W_O (row-vector form).
    theta, mu: YaRN's frequencies and factor of the decoupled RoPE parts; softmax_scale: the
    scores' factor (default 1/sqrt(d_nope + d_rope))."""
    n = x.shape[0]
    past = 0 if c_kv_past is None else c_kv_past.shape[0]
    positions = list(range(past, past + n)) if positions is None else positions
    c_q = rms_norm(x @ w["W_DQ"], w.get("gamma_Q"), q_eps) if "W_DQ" in w else x      # eq. 12
    c_kv = rms_norm(x @ w["W_DKV"], w.get("gamma_KV"), kv_eps)                          # eq. 9
    k_r = rope(x @ w["W_KR"], positions, base, layout, theta, mu)                       # eq. 15
    if past:
        c_kv, k_r = np.vstack([c_kv_past, c_kv]), np.vstack([k_r_past, k_r])           # the latent cache
    d_nope, d_r = w["W_UQ"].shape[1] // h, w["W_KR"].shape[1]
    d_v = w["W_UV"].shape[1] // h
    heads, scores = [], []
    for i in range(h):
        q_c = c_q @ w["W_UQ"][:, i * d_nope:(i + 1) * d_nope]                           # eq. 13
        q_r = rope(c_q @ w["W_QR"][:, i * d_r:(i + 1) * d_r], positions, base, layout, theta, mu)  # eq. 14
        k_c = c_kv @ w["W_UK"][:, i * d_nope:(i + 1) * d_nope]                          # eq. 10
        v = c_kv @ w["W_UV"][:, i * d_v:(i + 1) * d_v]                                  # eq. 11
        scale = 1 / np.sqrt(d_nope + d_r) if softmax_scale is None else softmax_scale
        s = (np.hstack([q_c, q_r]) @ np.hstack([k_c, k_r]).T) * scale                   # eqs. 16-18
        m = s.shape[1]
        if causal:
            keep = np.arange(m)[None, :] <= (np.arange(n)[:, None] + m - n)            # bottom-right
            s = np.where(keep, s, -np.inf)
        a = np.exp(s - s.max(axis=1, keepdims=True))
        a /= a.sum(axis=1, keepdims=True)
        scores.append(s)
        heads.append(a @ v)
    return np.hstack(heads) @ w["W_O"], scores


def random_mla(seed=0, n=4, d_model=8, h=2, d_cq=6, d_c=4, d_nope=2, d_r=2, d_v=3, q_lora=True, gains=True):
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.normal(size=s) * 0.6  # noqa: E731
    w = {"W_UQ": r(d_cq if q_lora else d_model, h * d_nope), "W_QR": r(d_cq if q_lora else d_model, h * d_r),
         "W_DKV": r(d_model, d_c), "W_UK": r(d_c, h * d_nope), "W_UV": r(d_c, h * d_v), "W_KR": r(d_model, d_r),
         "W_O": r(h * d_v, d_model)}
    if q_lora:
        w["W_DQ"] = r(d_model, d_cq)
        if gains:
            w["gamma_Q"] = 1 + 0.2 * r(d_cq)
    if gains:
        w["gamma_KV"] = 1 + 0.2 * r(d_c)
    return r(n, d_model), w


def spec_of(x, w, h, **extra):
    """The attntrace spec of the same layer."""
    mla = {k: w[k] for k in ("W_DQ", "W_UQ", "W_QR", "W_DKV", "W_UK", "W_UV", "W_KR") if k in w}
    if "gamma_Q" in w:
        mla["q_norm"] = {"gain": w["gamma_Q"].tolist(), "eps": 1e-6}
    if "gamma_KV" in w:
        mla["kv_norm"] = {"gain": w["gamma_KV"].tolist(), "eps": 1e-6}
    spec = {"X": x, "W_O": w["W_O"], "mla": mla, "rope": {"layout": "interleaved"}, "mask": "causal"}
    if h > 1:
        spec["num_heads"] = h
    spec.update(extra)
    return spec


# -- Hugging Face DeepseekV3 (tiny random float64 models) -------------------------------------------
def _float64_rms(norm):
    """DeepseekV3RMSNorm.forward with its float32 cast made a float64 one (HF's own code, exec'd)."""
    import inspect
    import textwrap
    import types

    import torch

    ns = {"torch": types.SimpleNamespace(float32=torch.float64, rsqrt=torch.rsqrt, Tensor=torch.Tensor)}
    exec(textwrap.dedent(inspect.getsource(type(norm).forward)), ns)
    return types.MethodType(ns["forward"], norm)


def _float64_rotary(rot, dim: int, base: float):
    import types

    import torch

    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)

    rot.forward = types.MethodType(forward, rot)


def tiny_deepseek(seed=0, *, hidden=8, heads=2, q_lora=6, kv_lora=4, nope=2, rope_dim=2, v=3, interleave=True,
                  float64_internals=True, moe_layers=0, layers=1, rope_parameters=None, max_positions=64):
    """A tiny random DeepseekV3Model in float64 (SDPA attention: HF's eager path takes its softmax in float32). With float64_internals its
    RMSNorms and rotary angles (float32 in HF) run in float64. rope_parameters (e.g. YaRN's) replace the default
    rotary; their angles then come from HF's own init function, run in float64."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3Model

    torch.manual_seed(seed)
    cfg = DeepseekV3Config(vocab_size=32, hidden_size=hidden, intermediate_size=12, moe_intermediate_size=4,
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                           q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_nope_head_dim=nope, qk_rope_head_dim=rope_dim,
                           v_head_dim=v, rope_interleave=interleave, first_k_dense_replace=layers - moe_layers,
                           n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
                           routed_scaling_factor=2.5, max_position_embeddings=max_positions, attn_implementation="sdpa",
                           **({"rope_parameters": rope_parameters} if rope_parameters else {}))
    model = DeepseekV3Model(cfg).double().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.normal_(0.0, 0.5)
            if type(m).__name__ == "DeepseekV3RMSNorm":
                m.weight.normal_(1.0, 0.3)
                if float64_internals:
                    m.forward = _float64_rms(m)
            if type(m).__name__ == "DeepseekV3TopkRouter" or hasattr(m, "e_score_correction_bias"):
                if hasattr(m, "e_score_correction_bias"):
                    m.e_score_correction_bias.normal_(0.0, 0.1)
    if float64_internals and rope_parameters:
        from oracles_families import float64_rotary

        float64_rotary(model)
    elif float64_internals:
        _float64_rotary(model.rotary_emb, rope_dim, cfg.rope_parameters["rope_theta"])
    return model


def layer_io(model, layer: int, n=4, seed=0, part="layer"):
    """(x, y) of decoder layer `layer` (part="layer") or of its attention (part="attn") on a
    random input of n tokens, captured with forward hooks (`oracles_families.hidden_in_out`)."""
    from oracles_families import hidden_in_out

    mod = model.layers[layer] if part == "layer" else model.layers[layer].self_attn
    return hidden_in_out(model, mod, n, seed)
