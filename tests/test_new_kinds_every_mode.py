"""Every kind added for the attention of 2025-2026 models (sinks, soft-capping,
query_pre_attn_scalar, QK-norm, llama3 and YaRN RoPE scaling, sliding and global layers,
multi-head latent attention, mixture of experts, the sandwich block) on a small spec, in all
four modes: exact entries evaluated to 20 digits and the symbolic trace with the spec's numbers
substituted agree with the numeric trace at 1e-10 step by step; shape mode gives the same
shapes; each trace renders as md (every math span parsed by KaTeX), tex and text in en and zh.
The specs hold whole numbers and halves so that exact mode reads the very numbers numeric mode
does; a block whose attention is not uniform nests the softmax's exponentials at every later
step, so the block specs here keep attention uniform (W_Q = 0) or to one token.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import sympy as sp

import attntrace

from mathcheck import markdown_math_spans
from modesagree import assert_modes_agree, operand_values, symbolic_spec

TOL = 1e-10
QKV = {"Q": [[1, 0], [0, 1], [1, 1]], "K": [[1, 0], [0, 1], [1, -1]], "V": [[1, 2], [0, 1], [3, 1]]}
XW = {"X": [[1, 0, 1], [0, 1, "1/2"], [1, 1, 0]], "W_Q": [[1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 0, 1]],
      "W_K": [[0, 1, 1, 0], [1, 0, 0, 1], [0, 1, 1, 1]], "W_V": [[1, 0], [0, 1], [1, 1]]}
EXPERTS = [{"W_gate": [[1], [0]], "W_up": [[0], [1]], "W_down": [[1, 0]]},
           {"W_gate": [[0], [1]], "W_up": [[1], [1]], "W_down": [[0, 1]]},
           {"W_gate": [[1], [1]], "W_up": [[1], [0]], "W_down": [[1, 1]]}]
#: a llama block on two tokens whose attention is uniform (W_Q = 0: rational weights), so that
#: exact entries after it stay small: RMSNorms, a router, experts
LLAMA = {"X": [[1, 0], [0, 1]], "block": "llama", "mask": "causal", "W_Q": [[0, 0], [0, 0]], "W_K": [[1, 0], [0, 1]],
         "W_V": [[1, 0], [0, 1]], "W_O": [[1, 0], [0, 1]], "norm1": {"gain": [1, 1], "eps": 0}, "norm2": {"gain": [1, 1], "eps": 0}}

CASES = {
    "sinks": {**QKV, "mask": "causal", "sinks": ["1/2"]},
    "softcap": {**QKV, "softcap": "5/2"},
    "query_pre_attn_scalar": {**XW, "scale": 9},
    "qk_norm": {**QKV, "qk_norm": {"eps": "1/4", "g_q": [1, "1/2"], "g_k": [2, -1]}},
    "rope_llama3": {**XW, "rope": {"base": 100, "positions": [0, 20, 41], "scaling": {"type": "llama3", "factor": 8,
                    "original_max_position_embeddings": 16, "low_freq_factor": 1, "high_freq_factor": 4}}},
    "rope_yarn": {**XW, "rope": {"base": 100, "positions": [0, 5, 9], "scaling": {"type": "yarn", "factor": 4,
                  "original_max_position_embeddings": 32, "beta_fast": 32, "beta_slow": 1}}},
    "sliding_window": {**QKV, "mask": "causal", "window": 2},
    "mla": {"X": [[1, 0, 1], [0, 1, -1]], "W_O": [[1, 0, 1], [0, 1, 1]], "rope": {"layout": "interleaved"}, "mask": "causal",
            "mla": {"W_DKV": [[1, 0], [0, 1], [1, 1]], "W_UK": [[1], [0]], "W_UV": [[0, 1], [1, 0]], "W_KR": [[1, 0], [0, 1], [1, 0]],
                    "W_UQ": [[0], [1], [1]], "W_QR": [[1, 0], [0, 1], [0, 0]]}},
    "moe_mixtral": {**LLAMA, "moe": {"W_router": [[1, -1, 0], [0, 1, 2]], "top_k": 2, "experts": EXPERTS}},
    "moe_deepseek": {**LLAMA, "moe": {"router": "sigmoid", "W_router": [[1, -1, 0, 2], [0, 1, 2, -1]], "top_k": 2, "n_group": 2,
                                      "topk_group": 1, "scaling": "5/2", "bias": ["1/10", 0, "-1/5", 0],
                                      "experts": EXPERTS + EXPERTS[:1], "shared": EXPERTS[2]}},
    "moe_gpt_oss": {**LLAMA, "moe": {"W_router": [[1, -1, 0], [0, 1, 2]], "logit_bias": ["1/2", 0, "-1/2"], "top_k": 2,
                                     "activation": "clamped_swiglu", "alpha": 1.702, "limit": "1/2",
                                     "experts": [dict(e, b_gate=[1], b_up=["-1/2"], b_down=[0, 1]) for e in EXPERTS]}},
    "sandwich": {"X": [[2, 1]], "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [0, 1]], "W_V": [[1, 2], [0, 1]], "block": "sandwich",
                 "norm1": {"gain": [0, "1/2"], "gain_offset": 1, "eps": 0}, "norm2": {"gain": [1, 1], "eps": 0},
                 "norm3": {"gain": ["1/2", 0], "gain_offset": 1, "eps": 0}, "norm4": {"gain": [0, 1], "gain_offset": 1, "eps": 0},
                 "ffn": {"W_gate": [[1], [1]], "W_up": [[1], [-1]], "W_down": [[1, 2]], "activation": "gelu_tanh"}},
}


def _symbolic(spec: dict, numeric) -> dict:
    """The spec with its matrices as symbols; a mixture of experts takes numeric mode's choice."""
    out = symbolic_spec(spec)
    if "moe" in spec:
        out["moe"]["route"] = [[e + 1 for e in es] for es in numeric.step("router_gates").details["chosen"]]
    return out


@pytest.mark.parametrize("name", CASES)
def test_exact_symbolic_and_shape_agree_with_numeric(name):
    spec = CASES[name]
    numeric = attntrace.run(spec)
    exact = attntrace.run(spec, mode="exact")
    symbolic = attntrace.run(_symbolic(spec, numeric), mode="symbolic")
    shape = attntrace.run(spec, mode="shape")
    assert_modes_agree(numeric, symbolic=symbolic, values=operand_values(symbolic, numeric), exact=exact, shape=shape, atol=TOL)


@pytest.mark.parametrize("mode", ["numeric", "exact", "symbolic", "shape"])
@pytest.mark.parametrize("name", CASES)
def test_renders_in_every_format_and_language(name, mode, katex):
    spec = CASES[name]
    if mode == "symbolic":
        spec = _symbolic(spec, attntrace.run(spec))
    t = attntrace.run(spec, mode=mode)
    for lang in ("en", "zh"):
        md = attntrace.render(t, format="md", lang=lang)
        assert katex(markdown_math_spans(md)) == [], (name, mode, lang)
        assert attntrace.render(t, format="tex", lang=lang)
        text = attntrace.render(t, format="text", lang=lang)
        assert "\\" not in text, (name, mode, lang)
        assert re.search(r"\^\{[^{}]*\}\^", md) is None
    assert t.to_dict()["steps"]
