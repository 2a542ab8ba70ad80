"""Hugging Face mixture-of-experts layers -> the spec key `moe` (attntrace.inputs.moespec).

- Mixtral (`MixtralSparseMoeBlock`): gate.weight (E, d) -> W_router (d, E); experts.gate_up_proj
  (E, 2 d_ff, d) -> each expert's W_gate and W_up (its first and second d_ff rows, transposed),
  experts.down_proj (E, d, d_ff) -> W_down; router "softmax" with top_k = num_experts_per_tok.
- DeepSeek-V3 (`DeepseekV3MoE`): the same experts; gate.weight -> W_router, router "sigmoid",
  gate.e_score_correction_bias -> bias, n_group, topk_group, norm_topk_prob -> normalize,
  routed_scaling_factor -> scaling; shared_experts (a SwiGLU MLP) -> shared.

- gpt-oss (`GptOssMLP`): router.weight -> W_router, router.bias -> logit_bias, router "softmax"
  over the top-k logits; experts.gate_up_proj (E, d, 2 d_ff), already (in, out), its even
  columns the gate and odd ones the up projection, with gate_up_proj_bias split the same way;
  down_proj (E, d_ff, d) and down_proj_bias; activation "clamped_swiglu" with experts.alpha
  and experts.limit.

`moe_table(mlp)` reads any of them; the decoder layers around them are llama blocks
(attntrace.bridges.blocks: Mixtral's attention is Llama's; DeepSeek-V3's is latent attention,
attntrace.bridges.deepseek). What agrees at what tolerance: tests/test_moe.py.
"""

from __future__ import annotations

from typing import Any


from attntrace.bridges.pytorch import to_numpy, to_numpy_T
from attntrace.model.errors import Unsupported


def is_moe(mlp) -> bool:
    return (hasattr(mlp, "gate") or hasattr(mlp, "router")) and hasattr(mlp, "experts") and hasattr(mlp.experts, "gate_up_proj")


def _gpt_oss(mlp) -> dict[str, Any]:
    """gpt-oss's router (with its bias) and clamped SwiGLU experts (with theirs)."""
    ex, router = mlp.experts, mlp.router
    gate_up = ex.gate_up_proj.detach()  # (E, d, 2 d_ff): gate, up interleaved; each slice converted once (to_numpy)
    gate_up_b = to_numpy(ex.gate_up_proj_bias, "experts.gate_up_proj_bias")  # (E, 2 d_ff)
    down, down_b = ex.down_proj.detach(), to_numpy(ex.down_proj_bias, "experts.down_proj_bias")
    w = "experts.gate_up_proj"
    experts = [{"W_gate": to_numpy(gate_up[e][:, ::2], w), "W_up": to_numpy(gate_up[e][:, 1::2], w), "W_down": to_numpy(down[e], "experts.down_proj"),
                "b_gate": gate_up_b[e][::2].tolist(), "b_up": gate_up_b[e][1::2].tolist(), "b_down": down_b[e].tolist()}
               for e in range(gate_up.shape[0])]
    return {"router": "softmax", "W_router": to_numpy_T(router.weight, "router.weight"), "logit_bias": to_numpy(router.bias, "router.bias").tolist(),
            "top_k": int(router.top_k), "experts": experts, "activation": "clamped_swiglu", "alpha": float(ex.alpha), "limit": float(ex.limit)}


def _experts(experts) -> list[dict[str, Any]]:
    gate_up = experts.gate_up_proj.detach()  # (E, 2 d_ff, d): each expert's block converted once, into (in, out)
    down = experts.down_proj.detach()  # (E, d, d_ff)
    if getattr(experts, "has_bias", False) or getattr(experts, "gate_up_proj_bias", None) is not None:
        raise Unsupported("the experts have biases (gpt-oss); attntrace's SwiGLU experts have none")
    act = getattr(getattr(experts, "act_fn", None), "__class__", type(None)).__name__
    if act not in ("SiLUActivation", "SiLU"):
        raise Unsupported(f"the experts' activation is {act}; attntrace's experts are SwiGLU (SiLU)")
    d_ff = gate_up.shape[1] // 2
    w, wd = "experts.gate_up_proj", "experts.down_proj"
    return [{"W_gate": to_numpy_T(gate_up[e, :d_ff], w), "W_up": to_numpy_T(gate_up[e, d_ff:], w),
             "W_down": to_numpy_T(down[e], wd)} for e in range(gate_up.shape[0])]


def _mlp(mlp, what: str) -> dict[str, Any]:
    w = lambda lin, name: to_numpy_T(lin.weight, f"{what}.{name}")  # noqa: E731 - (in, out)
    return {"W_gate": w(mlp.gate_proj, "gate_proj"), "W_up": w(mlp.up_proj, "up_proj"), "W_down": w(mlp.down_proj, "down_proj")}


def moe_table(mlp) -> dict[str, Any]:
    """The spec's `moe` table of a Mixtral or DeepSeek-V3 mixture-of-experts block."""
    if not is_moe(mlp):
        raise Unsupported(f"{type(mlp).__name__} is not a Mixtral, DeepSeek-V3 or gpt-oss mixture of experts (gate or router, experts.gate_up_proj)")
    if hasattr(mlp, "router") and hasattr(mlp.experts, "gate_up_proj_bias"):
        return _gpt_oss(mlp)
    if getattr(mlp, "training", False) and float(getattr(mlp, "jitter_noise", 0.0) or 0.0) > 0:
        raise Unsupported("the router adds jitter noise in training mode; call model.eval() first")
    gate = mlp.gate
    table: dict[str, Any] = {"W_router": to_numpy_T(gate.weight, "gate.weight"), "top_k": int(gate.top_k),
                             "experts": _experts(mlp.experts)}
    if hasattr(gate, "e_score_correction_bias"):  # DeepSeek-V3's sigmoid router
        table.update(router="sigmoid", bias=to_numpy(gate.e_score_correction_bias, "gate.e_score_correction_bias").tolist(),
                     n_group=int(gate.num_group), topk_group=int(gate.topk_group), normalize=bool(gate.norm_topk_prob),
                     scaling=float(gate.routed_scaling_factor))
        if getattr(mlp, "shared_experts", None) is not None:
            table["shared"] = _mlp(mlp.shared_experts, "shared_experts")
    else:
        table["router"] = "softmax"
    return table
