"""Mixture of experts in the llama block (attntrace.kinds.moe) against references written from the
Mixtral and DeepSeek-V3 papers (tests/oracles_moe.py, NumPy) and Hugging Face's Mixtral and
DeepseekV3 layers (tiny random float64 models)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import attntrace
from attntrace.model.errors import BadInput

import oracles_mla as oml
import oracles_moe as om

TOL = 1e-10
DEEPSEEK = {"router": "sigmoid", "top_k": 2, "n_group": 2, "topk_group": 1, "scaling": 2.5, "bias": [0.1, -0.2, 0.3, 0.0]}


@pytest.mark.parametrize("seed, n_exp, top_k", [(0, 4, 2), (1, 6, 1), (2, 3, 3), (3, 8, 2)])
def test_mixtral_routing_equals_the_paper(seed, n_exp, top_k):
    x, wr, ex, _ = om.random_moe(seed, n_exp=n_exp)
    t = attntrace.run(om.block_spec(x, wr, ex, {"top_k": top_k}, seed=seed))
    ref, chosen = om.mixtral(t.step("norm2").value, wr, ex, top_k)
    np.testing.assert_allclose(t.step("moe_out").value, ref, rtol=0, atol=TOL)
    assert [sorted(c) for c in t.step("router_gates").details["chosen"]] == chosen
    g = t.step("router_gates").value
    np.testing.assert_allclose(g.sum(axis=1), 1.0, rtol=0, atol=1e-14)
    assert ((g > 0).sum(axis=1) == top_k).all()


@pytest.mark.parametrize("seed, extra", [(0, DEEPSEEK), (1, dict(DEEPSEEK, n_group=1, topk_group=1, bias=[0, 0, 0, 0])),
                                         (2, dict(DEEPSEEK, normalize=False, scaling=1.0)), (3, dict(DEEPSEEK, n_group=2, topk_group=2))])
def test_deepseek_routing_equals_the_paper(seed, extra):
    x, wr, ex, sh = om.random_moe(seed, shared=True)
    t = attntrace.run(om.block_spec(x, wr, ex, extra, shared=sh, seed=seed))
    kw = {k: extra[k] for k in ("top_k", "bias", "n_group", "topk_group", "scaling") if k in extra}
    ref, chosen = om.deepseek(t.step("norm2").value, wr, ex, normalize=extra.get("normalize", True), shared=sh, **kw)
    np.testing.assert_allclose(t.step("moe_out").value, ref, rtol=0, atol=TOL)
    assert [sorted(c) for c in t.step("router_gates").details["chosen"]] == chosen
    np.testing.assert_allclose(t.output, t.step("residual1").value + ref, rtol=0, atol=TOL)


def test_the_bias_steers_the_choice_not_the_weights():
    x, wr, ex, _ = om.random_moe(5)
    base = dict(DEEPSEEK, n_group=1, topk_group=1)
    a = attntrace.run(om.block_spec(x, wr, ex, dict(base, bias=[0.0, 0.0, 0.0, 0.0])))
    b = attntrace.run(om.block_spec(x, wr, ex, dict(base, bias=[5.0, 5.0, 0.0, 0.0])))  # experts 1 and 2 for everyone
    assert all(sorted(c) == [0, 1] for c in b.step("router_gates").details["chosen"])
    s = b.step("router_scores").value
    np.testing.assert_allclose(b.step("router_gates").value[:, :2], 2.5 * s[:, :2] / s[:, :2].sum(axis=1, keepdims=True), rtol=0, atol=TOL)
    assert a.step("router_gates").details["chosen"] != b.step("router_gates").details["chosen"]


@pytest.mark.parametrize("mode", ["numeric", "symbolic", "shape"])
@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
def test_modes_formats_languages(mode, router):
    x, wr, ex, sh = om.random_moe(0, n=3, d=4, d_ff=3, shared=True)
    extra = DEEPSEEK if router == "sigmoid" else {}
    if mode == "symbolic":
        r = lambda a: np.round(a * 2)  # noqa: E731
        x, wr, ex, sh = r(x), r(wr), [{k: r(v) for k, v in e.items()} for e in ex], {k: r(v) for k, v in sh.items()}
        extra = dict(extra, route=[[1, 2], [2, 3], [1, 4]])
    t = attntrace.run(om.block_spec(x, wr, ex, extra, shared=sh if router == "sigmoid" else None), mode=mode)
    for fmt in ("md", "tex", "text"):
        for lang in ("en", "zh"):
            out = attntrace.render(t, format=fmt, lang=lang)
            assert re.search(r"\^\{[^{}]*\}\^", out) is None
            if mode != "shape":
                # the chosen experts are a set, calligraphic (a bare T_1 is a row of the scaled scores T)
                assert ("\\mathcal{T}_{1}" in out or "TopK_1 =" in out)
                assert "\\in T_" not in out and "in T_" not in out
    assert t.to_dict()["steps"]


#: a llama block on two tokens with uniform attention (W_Q = 0: rational weights), so that exact
#: entries stay small; experts 1 and 2 have equal router columns: every token's logits tie
TIED = {"X": [[1, 0], [0, 1]], "block": "llama", "mask": "causal", "W_Q": [[0, 0], [0, 0]], "W_K": [[1, 0], [0, 1]],
        "W_V": [[1, 0], [0, 1]], "W_O": [[1, 0], [0, 1]], "norm1": {"gain": [1, 1], "eps": 0}, "norm2": {"gain": [1, 1], "eps": 0},
        "moe": {"W_router": [[1, 1, -1], [2, 2, 0]], "top_k": 1,
                "experts": [{"W_gate": [[1], [0]], "W_up": [[0], [1]], "W_down": [[1, 0]]},
                            {"W_gate": [[0], [1]], "W_up": [[1], [1]], "W_down": [[0, 1]]},
                            {"W_gate": [[1], [1]], "W_up": [[1], [0]], "W_down": [[1, 1]]}]}}


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
def test_exact_mode_breaks_ties_as_numeric_mode_and_torch_topk(router):
    """Tied logits are found exactly (equal numbers, not floats that happen to agree) and go to
    the lower index, in exact mode as in numeric mode; torch.topk picks the same expert here."""
    import torch

    spec = dict(TIED, moe=dict(TIED["moe"], **({"router": "sigmoid", "normalize": False} if router == "sigmoid" else {})))
    numeric, exact = attntrace.run(spec), attntrace.run(spec, mode="exact")
    assert numeric.step("router_gates").details["chosen"] == exact.step("router_gates").details["chosen"] == ((0,), (0,))
    logits = exact.step("router_logits").value
    assert all(logits[i, 0] == logits[i, 1] for i in range(2))
    assert torch.topk(torch.tensor(numeric.step("router_logits").value), 1).indices.tolist() == [[0], [0]]
    np.testing.assert_allclose(np.array(exact.step("moe_out").value.evalf(30).tolist(), dtype=float), numeric.step("moe_out").value,
                               rtol=0, atol=TOL)


def test_exact_order_proves_ties_it_cannot_see_structurally():
    """compare: a tie SymPy does not see ((1 + sqrt 2)^2 against 3 + 2 sqrt 2, also under a
    sigmoid) is a proven tie; a difference beyond 30 digits still has a sign."""
    import sympy as sp

    from attntrace.algebra.exact import ExactAlgebra
    from attntrace.kinds.moe import choose

    alg = ExactAlgebra()
    a, b = sp.Pow(1 + sp.sqrt(2), 2, evaluate=False), 3 + 2 * sp.sqrt(2)
    assert a != b and alg.compare(a, b) == 0
    sig = lambda x: 1 / (1 + sp.exp(-x))  # noqa: E731
    assert alg.compare(sig(a), sig(b)) == 0
    assert alg.compare(b + sp.Rational(1, 10**40), b) == 1
    rows = np.array([[sig(b), sig(a), sig(sp.Integer(1))]], dtype=object)
    assert choose({"router": "softmax", "top_k": 2}, rows, compare=alg.compare)[0] == ((0, 1),)


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update(block="pre_ln"), "give block = \"llama\""),
    (lambda s: s.update(ffn={"W_gate": [[1]]}), "give ffn or moe, not both"),
    (lambda s: s["moe"].update(router="relu"), "moe.router must be"),
    (lambda s: s["moe"].update(top_k=9), "moe.top_k"),
    (lambda s: s["moe"].update(W_router=np.ones((6, 3))), r"expected \(6, 4\)"),
    (lambda s: s["moe"]["experts"][1].pop("W_up"), r"moe.experts\[2\] needs W_up"),
    (lambda s: s["moe"].update(router="sigmoid", n_group=3), "does not divide the 4 experts"),
    (lambda s: s["moe"].update(bias=[1, 2, 3, 4]), "belongs to the sigmoid router"),
    (lambda s: s["moe"].update(route=[[1, 1], [1, 2], [1, 2], [1, 2]]), "2 different experts"),
])
def test_bad_specs_one_line(change, message):
    x, wr, ex, _ = om.random_moe(0)
    spec = om.block_spec(x, wr, ex)
    change(spec)
    with pytest.raises(BadInput, match=message) as e:
        attntrace.run(spec)
    assert "\n" not in str(e.value)


# -- the checker ---------------------------------------------------------------------------------------
def _student(values: dict, keys) -> dict:
    return {k: [["-inf" if np.isneginf(x) else round(float(x), 4) for x in row] for row in values[k]] for k in keys}


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
def test_weights_not_renormalised_is_named(router):
    """The student's gates without the renormalisation, computed here in NumPy: Mixtral's softmax
    over all experts kept at the top k; DeepSeek-V3's chosen sigmoid scores times the scaling."""
    from attntrace.grading.diagnose import to_float

    x, wr, ex, sh = om.random_moe(6, shared=True)
    extra = dict(DEEPSEEK, n_group=1, topk_group=1) if router == "sigmoid" else {}
    trace = attntrace.run(om.block_spec(x, wr, ex, extra, shared=sh if router == "sigmoid" else None))
    mine = {s.key: to_float(s.value) for s in trace.steps}
    chosen = trace.step("router_gates").details["chosen"]
    lg = mine["router_logits"]
    wrong = np.zeros_like(lg)
    for i, es in enumerate(chosen):
        es = list(es)
        if router == "softmax":
            p = np.exp(lg[i] - lg[i].max())
            wrong[i, es] = (p / p.sum())[es]
        else:
            wrong[i, es] = 2.5 / (1 + np.exp(-lg[i, es]))
    mine["router_gates"] = wrong
    keys = [s.key for s in trace.steps if s.id in ("router_logits", "router_scores", "router_gates")]
    for lang in ("en", "zh"):
        report = attntrace.check(trace, _student(mine, keys), lang=lang)
        first = next(s for s in report.steps if s.key == report.first_wrong)
        assert report.first_wrong == "router_gates"
        codes = {first.diagnosis.code} | {a.code for a in first.diagnosis.alternatives}
        assert "moe_weights_not_renormalised" in codes, codes
        from attntrace.grading.reports import render_report

        assert ("not renormalised" if lang == "en" else "没有重新归一化") in render_report(report, format="text", lang=lang)


def test_a_wrong_norm_is_carried_through_the_router_and_the_experts():
    from attntrace.grading.diagnose import to_float

    x, wr, ex, sh = om.random_moe(7, shared=True)
    spec = om.block_spec(x, wr, ex, DEEPSEEK, shared=sh)
    trace = attntrace.run(spec)
    wrong = dict(spec, norm2={"gain": [1.0, 1.03, 1.0, 1.0, 1.0, 1.0], "eps": 1e-5})
    mine = {s.key: to_float(s.value) for s in attntrace.run(wrong).steps}
    # a small slip: the same experts are chosen, so everything after the norm is carried
    assert attntrace.run(wrong).step("router_gates").details["chosen"] == trace.step("router_gates").details["chosen"]
    report = attntrace.check(trace, _student(mine, [s.key for s in trace.steps]))
    statuses = {s.key: s.status for s in report.steps}
    assert report.first_wrong == "norm2", statuses
    assert all(statuses[k] == "carried" for k in ("router_logits", "router_scores", "router_gates", "experts", "shared_expert",
                                                   "moe_out", "residual2")), statuses


def test_own_rounded_numbers_are_accepted():
    from attntrace.grading.diagnose import to_float

    x, wr, ex, sh = om.random_moe(8, shared=True)
    trace = attntrace.run(om.block_spec(x, wr, ex, DEEPSEEK, shared=sh))
    report = attntrace.check(trace, _student({s.key: to_float(s.value) for s in trace.steps}, [s.key for s in trace.steps]))
    assert report.ok, report.first_wrong


# -- Hugging Face Mixtral and DeepSeek-V3 --------------------------------------------------------------
@pytest.mark.parametrize("family, seed", [("mixtral", 1), ("mixtral", 3), ("deepseek", 2), ("deepseek", 4)])
def test_hf_moe_layers_through_from_hf_layer(family, seed):
    """MixtralDecoderLayer and a DeepseekV3DecoderLayer with its MoE: at 1e-10 with HF's float32
    internals (RMSNorm, router, rotary angles) run in float64, and at 5e-6 unmodified (measured
    4.7e-7 to 5.9e-7 on these tiny models); through from_hf_layer and from_torch."""
    from attntrace import from_hf_layer

    make = om.tiny_mixtral if family == "mixtral" else om.tiny_deepseek_moe
    model = make(seed)
    x, y = oml.layer_io(model, 0)
    assert np.abs(y).max() > 1.0
    t = from_hf_layer(model, x, layer=0)
    np.testing.assert_allclose(t.output, y, rtol=0, atol=TOL)
    assert "moe_out" in {s.id for s in t.steps}
    np.testing.assert_allclose(attntrace.from_torch(model.layers[0], x).output, y, rtol=0, atol=TOL)
    raw = make(seed, float64_internals=False)
    x, y = oml.layer_io(raw, 0)
    gap = np.abs(from_hf_layer(raw, x, layer=0).output - y).max()
    assert 1e-12 < gap < 5e-6
