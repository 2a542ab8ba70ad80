"""gpt-oss's mixture of experts (moe.activation = "clamped_swiglu", expert biases, the router's
logit bias) and its whole decoder layer (attention with sinks, YaRN, the layer's window, then
the MoE MLP) through from_hf_layer / from_torch.

References that are not attntrace:
- a MoE MLP written here from the gpt-oss model card (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b
  Model Card", section 2.1: a router whose top-4 of 128 (here top-2 of 4) experts are weighted
  by the softmax over the chosen router projections; each expert a SwiGLU with the clamping and
  residual connection of the released code's formula: gate min(., limit), up clip(., -limit,
  limit), (up + 1) * gate * sigmoid(alpha gate), alpha = 1.702, limit = 7), at 1e-10;
- the Hugging Face GptOssDecoderLayer of a tiny random float64 model: at 1e-10 with its rotary
  angles and RMSNorms in float64, and at 1e-5 as it is (measured 2.8e-7 to 8.8e-7).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import attntrace
from attntrace.model.errors import BadInput
from mathcheck import markdown_math_spans, require_modules

import oracles_moe as om

EXACT, STATED = 1e-10, 1e-5


def card_expert(x, e, alpha, limit):
    """One expert on rows x, from the model card's formula (NumPy)."""
    gate = np.minimum(x @ e["W_gate"] + e["b_gate"], limit)
    up = np.clip(x @ e["W_up"] + e["b_up"], -limit, limit)
    glu = gate / (1.0 + np.exp(-alpha * gate))
    return ((up + 1.0) * glu) @ e["W_down"] + e["b_down"]


def card_moe(x, w_router, b_router, experts, top_k, alpha, limit):
    """The MoE MLP as the card writes it: Mixtral's routing (softmax over the top-k logits, router
    bias included) over the card's clamped experts."""
    return om.mixtral(x, w_router, experts, top_k, b_router=b_router,
                      expert=lambda rows, e: card_expert(rows, e, alpha, limit))


def _model(layer, exact, limit=7.0):
    require_modules("torch", "transformers")
    import oracles_families as F

    model = F.tiny("gpt_oss", attn="eager", swiglu_limit=limit)
    F.float64_norms(model)
    if exact:
        F.float64_rotary(model)
    else:
        for m in model.modules():
            if type(m).__name__.endswith("RMSNorm"):
                del m.forward
    return model


@pytest.mark.parametrize("layer", [0, 1], ids=["sliding", "full"])
@pytest.mark.parametrize("exact", [True, False], ids=["float64-internals", "unmodified"])
@pytest.mark.parametrize("limit", [7.0, 0.4], ids=["limit-7", "limit-0.4-clamps"])
def test_gpt_oss_decoder_layer_matches(layer, exact, limit):
    import oracles_families as F

    model = _model(layer, exact, limit)
    x, y = F.layer_io(model, layer, 6)
    t = attntrace.from_torch(model, x, layer=layer)
    err = float(np.max(np.abs(t.output - y)))
    print(f"gpt-oss layer {layer} limit {limit}: {err:.1e}")
    assert err < (EXACT if exact else STATED), err
    assert t.has("sink", 1) and t.step("experts").details["activation"] == "clamped_swiglu"
    assert (t.step("experts").details["clamped"] > 0) == (limit < 1)
    assert t.step("router_logits").inputs[-1] == "logit_bias"


@pytest.mark.parametrize("layer", [0, 1])
def test_gpt_oss_moe_against_the_model_card(layer):
    """The MLP's own input (a hook on layer.mlp), the card's MoE in NumPy from the module's
    parameters, against the trace's moe_out."""
    import oracles_families as F

    model = _model(layer, True, 0.5)
    mlp = model.layers[layer].mlp
    seen = F.module_io(model, mlp, 6)
    h = (seen["args"][0] if seen["args"] else seen["kwargs"]["hidden_states"])[0].numpy()
    ex = mlp.experts
    n = lambda p: p.detach().double().numpy()  # noqa: E731
    experts = [{"W_gate": n(ex.gate_up_proj[e])[:, 0::2], "W_up": n(ex.gate_up_proj[e])[:, 1::2], "W_down": n(ex.down_proj[e]),
                "b_gate": n(ex.gate_up_proj_bias[e])[0::2], "b_up": n(ex.gate_up_proj_bias[e])[1::2], "b_down": n(ex.down_proj_bias[e])}
               for e in range(ex.gate_up_proj.shape[0])]
    want, chosen = card_moe(h, n(mlp.router.weight).T, n(mlp.router.bias), experts, mlp.router.top_k, 1.702, 0.5)
    x, _ = F.layer_io(model, layer, 6)
    t = attntrace.from_torch(model, x, layer=layer)
    np.testing.assert_allclose(t.step("norm2").value, h, rtol=0, atol=EXACT)
    err = float(np.max(np.abs(t.step("moe_out").value - want)))
    print(f"model card reference, layer {layer}: {err:.1e}")
    assert err < EXACT, err
    assert [sorted(c) for c in t.step("router_gates").details["chosen"]] == chosen


def small_spec(limit=0.8, route=None):
    """A llama block with a clamped-SwiGLU mixture of three experts (halves and wholes)."""
    rng = np.random.default_rng(1)
    r = lambda *s: (np.round(rng.uniform(-2, 2, s) * 2) / 2).tolist()  # noqa: E731
    moe = {"router": "softmax", "W_router": r(4, 3), "logit_bias": [0.5, 0, -0.5], "top_k": 2, "activation": "clamped_swiglu",
           "alpha": 1.702, "limit": limit,
           "experts": [{"W_gate": r(4, 2), "W_up": r(4, 2), "W_down": r(2, 4), "b_gate": r(2), "b_up": r(2), "b_down": r(4)} for _ in range(3)]}
    if route:
        moe["route"] = route
    return {"X": r(3, 4), "W_Q": r(4, 2), "W_K": r(4, 2), "W_V": r(4, 4), "mask": "causal", "block": "llama", "moe": moe}


def test_small_spec_equals_the_card():
    spec = small_spec()
    t = attntrace.run(spec)
    m = spec["moe"]
    ex = [{k: np.asarray(v, float) for k, v in e.items()} for e in m["experts"]]
    want, chosen = card_moe(t.step("norm2").value, np.asarray(m["W_router"]), np.asarray(m["logit_bias"]), ex, 2, 1.702, 0.8)
    np.testing.assert_allclose(t.step("moe_out").value, want, rtol=0, atol=EXACT)
    assert t.step("experts").details["clamped"] > 0


@pytest.mark.parametrize("mode", ["numeric", "symbolic", "shape"])
def test_modes_formats_languages(mode, katex):
    t = attntrace.run(small_spec(route=[[1, 2], [2, 3], [1, 3]] if mode == "symbolic" else None), mode=mode)
    for lang, words in (("en", "clamped SwiGLU"), ("zh", "截断 SwiGLU")):
        md = attntrace.render(t, format="md", lang=lang)
        assert katex(markdown_math_spans(md)) == []
        if mode != "shape":
            assert words in md and "\\operatorname{min}" in md or "\\min" in md
        assert attntrace.render(t, format="tex", lang=lang)
        text = attntrace.render(t, format="text", lang=lang)
        assert "\\" not in text and re.search(r"\^\{[^{}]*\}\^", md) is None
    d = next(s for s in t.to_dict()["steps"] if s["id"] == "experts")
    assert d["activation"] == "clamped_swiglu" and d["limit"] == 0.8


def test_exact_mode_after_attention_that_is_not_uniform_is_refused_up_front_in_one_line():
    """The mixture's kinds are in the exact cost model (Kind.exact_size): the budget check
    refuses this block before any step is computed (a small block with uniform attention runs
    in exact mode: tests/test_new_kinds_every_mode.py)."""
    from attntrace.budget import check_budget
    from attntrace.tracer import load_problem

    with pytest.raises(BadInput, match=r"^step (experts|moe_out|router_\w+): exact entries would grow to about") as e:
        check_budget(load_problem(small_spec(), mode="exact"))
    assert "\n" not in str(e.value)


def _answer(trace):
    return {s.key: [["-inf" if np.isneginf(x) else round(float(x), 4) for x in row] for row in np.asarray(s.value, float)]
            for s in trace.steps}


def test_checker_carries_through_the_clamped_experts_and_names_moe_clamp_ignored():
    spec = small_spec()
    trace = attntrace.run(spec)
    assert attntrace.check(trace, _answer(trace)).ok
    unclamped = attntrace.run({**spec, "moe": {**spec["moe"], "limit": 1e6}})
    answer = _answer(trace)
    answer["experts"] = _answer(unclamped)["experts"]
    report = attntrace.check(trace, answer)
    step = next(s for s in report.steps if s.key == "experts")
    assert step.status == "wrong" and step.diagnosis.code == "moe_clamp_ignored", (step.status, step.diagnosis)
    from attntrace.grading.reports import render_report

    for lang, words in (("en", "clamps were left out"), ("zh", "漏掉了专家的截断")):
        assert words in render_report(attntrace.check(trace, answer, lang=lang), format="text", lang=lang)


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(activation="gelu"), r"^moe.activation must be \"swiglu\" or \"clamped_swiglu\""),
    (lambda m: (m.pop("activation"), m.pop("alpha")), r"^moe.limit belongs to activation = \"clamped_swiglu\""),
    (lambda m: m["experts"][0].pop("b_up"), r"^expert biases: give every expert all three"),
    (lambda m: m.update(logit_bias=[1, 2]), r"^moe.logit_bias has shape \(1, 2\), expected \(1, 3\)"),
    (lambda m: m.update(router="sigmoid"), r"^moe.logit_bias belongs to the softmax router"),
])
def test_bad_specs_one_line(change, message):
    spec = small_spec()
    change(spec["moe"])
    with pytest.raises(BadInput, match=message) as e:
        attntrace.run(spec)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("lang, given", [("en", "given"), ("zh", "给定")])
def test_the_notation_section_names_every_symbol_of_the_mixture(lang, given):
    """Every operand of the mixture (router weights and bias, each expert's weights and biases)
    and every symbol of its formulas (the expert index xi, Y^(xi), and the clamped rule's H^(xi), U^(xi)) has a row with
    its own words (moe.j2's `words`), in en and zh: none falls back to "given"."""
    from attntrace.kinds.notation import notation_of

    t = attntrace.run(small_spec())
    rows = {r.plain: r.meaning for r in notation_of(t).rows}
    assert {"xi", "Y(xi)", "H(xi)", "U(xi)", "W_r", "b^r", "W_gate", "b_gate"} <= set(rows), rows
    text = attntrace.render(t, format="text", lang=lang)
    section = text.split("Notation" if lang == "en" else "符号", 1)[1].split("\n\n")[1]
    assert given not in section, section
    assert ("output of one expert" if lang == "en" else "一个专家的输出") in section
