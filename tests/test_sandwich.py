"""Gemma 2's whole decoder layer: the sandwich block (four RMSNorms, Gemma's 1 + gamma) and GeGLU.

Checked against two references that are not attntrace:
- the unmodified Hugging Face Gemma2DecoderLayer of a tiny random float64 model
  (tests/oracles_families.py): at 1e-10 with its float32 internals (rotary angles, RMSNorms,
  eager softmax) run in float64, and at the README's 1e-5 as it is (measured 5.9e-7 to 7.2e-7);
- a layer written here from the Gemma 2 report (Gemma Team 2024, sections 2.1-2.2: RMSNorm of
  each sublayer's input and output, GeGLU with the tanh GELU, logit soft-capping, RoPE, GQA,
  local sliding window / global layers, query_pre_attn_scalar), reading the module's weights,
  at 1e-10.
Then the four modes, md/tex/text in en/zh (KaTeX parses the Markdown), the checker's carry
through the new norms and its named mistake `post_norm_skipped`, and one-line errors.
"""

from __future__ import annotations

import numpy as np
import pytest

import attntrace
from mathcheck import markdown_math_spans, require_modules

EXACT, STATED = 1e-10, 1e-5


def _gemma2(layer: int, exact: bool):
    """(model, x, y): a tiny Gemma 2 model and decoder layer `layer`'s input and output."""
    require_modules("torch", "transformers")
    import oracles_families as F

    model = F.tiny("gemma2", attn="eager")
    undo = F.float64_eager_softmax(model) if exact else (lambda: None)
    try:
        F.float64_norms(model)  # random gains (HF initialises Gemma's at 0) ...
        if exact:
            F.float64_rotary(model)
        else:  # ... with HF's own float32 forward
            for m in model.modules():
                if type(m).__name__.endswith("RMSNorm"):
                    del m.forward
        x, y = F.layer_io(model, layer, 6)
    finally:
        undo()
    return model, x, y


@pytest.mark.parametrize("layer", [0, 1], ids=["sliding", "full"])
@pytest.mark.parametrize("exact", [True, False], ids=["float64-internals", "unmodified"])
def test_gemma2_decoder_layer_matches(layer, exact):
    model, x, y = _gemma2(layer, exact)
    for t in (attntrace.from_torch(model, x, layer=layer), attntrace.from_hf_layer(model.layers[layer], x)):
        err = float(np.max(np.abs(t.output - y)))
        print(f"gemma2 layer {layer}: {err:.1e}")
        assert err < (EXACT if exact else STATED), err
    ids = [s.id for s in t.steps if s.head is None]
    assert ids[-9:] == ["post_attn_norm", "residual1", "norm2", "ffn_hidden", "ffn_up", "ffn_act", "ffn_out", "post_ffn_norm", "residual2"]
    assert t.step("ffn_act").details["activation"] == "geglu" and t.step("post_ffn_norm").details["offset"] == 1


def _rms(x, w, eps):
    """Gemma's RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def paper_layer(layer, cfg, x: np.ndarray, window) -> np.ndarray:
    """One Gemma 2 decoder layer from the report's description, in NumPy float64 (not HF code).

    attention: h query heads, h_kv key/value heads (GQA), RoPE with theta_i = base^(-2i/d) on
    (first half, second half) pairs, scores q.k / sqrt(query_pre_attn_scalar), soft-capped
    c tanh(s / c), causal (and the local layer's window), softmax, concat, W_O."""
    p = lambda m: m.weight.detach().double().numpy()  # noqa: E731
    a = layer.self_attn
    h, hk, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    n = x.shape[0]
    eps = cfg.rms_norm_eps
    xn = _rms(x, p(layer.input_layernorm), eps)
    q = (xn @ p(a.q_proj).T).reshape(n, h, d)
    k = (xn @ p(a.k_proj).T).reshape(n, hk, d)
    v = (xn @ p(a.v_proj).T).reshape(n, hk, d)
    theta = cfg.rope_parameters["rope_theta"] ** (-np.arange(0, d, 2) / d)
    ang = np.arange(n)[:, None] * theta[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(t):
        t1, t2 = t[..., : d // 2], t[..., d // 2:]
        return np.concatenate([t1 * cos - t2 * sin, t2 * cos + t1 * sin], axis=-1)

    q, k = rope(q), rope(k)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    keep = (j <= i) & ((i - j < window) if window else True)
    heads = []
    for hh in range(h):
        g = hh // (h // hk)
        s = q[:, hh] @ k[:, g].T / np.sqrt(cfg.query_pre_attn_scalar)
        c = cfg.attn_logit_softcapping
        s = c * np.tanh(s / c)
        s = np.where(keep, s, -np.inf)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        heads.append((e / e.sum(axis=1, keepdims=True)) @ v[:, g])
    o = np.concatenate(heads, axis=1) @ p(a.o_proj).T
    r = x + _rms(o, p(layer.post_attention_layernorm), eps)
    m = layer.mlp
    nf = _rms(r, p(layer.pre_feedforward_layernorm), eps)
    f = (_gelu_tanh(nf @ p(m.gate_proj).T) * (nf @ p(m.up_proj).T)) @ p(m.down_proj).T
    return r + _rms(f, p(layer.post_feedforward_layernorm), eps)


@pytest.mark.parametrize("layer", [0, 1], ids=["sliding", "full"])
def test_gemma2_layer_against_the_report(layer):
    model, x, _ = _gemma2(layer, True)
    cfg = model.config
    window = cfg.sliding_window if cfg.layer_types[layer] == "sliding_attention" else None
    want = paper_layer(model.layers[layer], cfg, np.asarray(x, float), window)
    err = float(np.max(np.abs(attntrace.from_torch(model, x, layer=layer).output - want)))
    print(f"report reference, layer {layer}: {err:.1e}")
    assert err < EXACT, err


#: one token and eps = 0, so that the exact entries stay small enough to compare
SMALL = {"X": [[2, 1]], "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [0, 1]], "W_V": [[1, 2], [0, 1]], "block": "sandwich",
         "norm1": {"gain": [0, "1/2"], "gain_offset": 1, "eps": 0}, "norm2": {"gain": [1, 1], "eps": 0},
         "norm3": {"gain": ["1/2", 0], "gain_offset": 1, "eps": 0}, "norm4": {"gain": [0, 1], "gain_offset": 1, "eps": 0},
         "ffn": {"W_gate": [[1], [1]], "W_up": [[1], [-1]], "W_down": [[1, 2]], "activation": "gelu_tanh"}}


def test_exact_and_shape_agree_with_numeric_and_a_large_exact_block_is_refused_in_one_line():
    import sympy as sp

    numeric = attntrace.run(SMALL)
    exact = attntrace.run(SMALL, mode="exact")
    for s in numeric.steps:
        e = exact.step(s.id, s.head)
        np.testing.assert_allclose(np.array(sp.N(e.value, 30).tolist(), dtype=float), s.value, rtol=0, atol=EXACT)
    shape = attntrace.run(SMALL, mode="shape")
    assert [(s.id, s.shape) for s in shape.steps] == [(s.id, s.shape) for s in numeric.steps]
    with pytest.raises(attntrace.BadInput, match=r"^step \w+: exact entr(y \(\d, \d\) has [\d,]+ operations \(more than 500\)|ies would grow "
                       r"to about [\d,]+ operations each, more than the 500)") as info:
        attntrace.run("examples/gemma2-block-tiny.toml", mode="exact")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("mode", ["numeric", "symbolic", "shape", "exact"])
def test_the_sandwich_renders_in_every_mode_format_and_language(mode, katex):
    t = attntrace.run(SMALL if mode == "exact" else "examples/gemma2-block-tiny.toml", mode=mode)
    for lang, words in (("en", "RMSNorm of the attention output"), ("zh", "注意力输出的 RMSNorm")):
        md = attntrace.render(t, format="md", lang=lang)
        assert katex(markdown_math_spans(md)) == []
        if mode == "shape":  # the shape table: each step's short name
            words = "norm of attention's output" if lang == "en" else "注意力输出的归一化"
        assert words in md and "R = X + \\hat{O}" in md.replace("&", ""), lang
        assert attntrace.render(t, format="tex", lang=lang)
        text = attntrace.render(t, format="text", lang=lang)
        assert "\\" not in text
        if mode == "numeric":
            # the later norms' entry formula is the first's: the prose names their own gains
            assert "1 + \\gamma^{o}_j" in md and "\\gamma^{o})" in md
    assert {"post_attn_norm", "post_ffn_norm"} <= {s["id"] for s in t.to_dict()["steps"]}


def _answer(trace, dec=4):
    return {s.key: np.round(np.asarray(s.value, float), dec).tolist() for s in trace.steps}


def test_checker_carries_through_the_output_norms_and_names_post_norm_skipped():
    trace = attntrace.run("examples/gemma2-block-tiny.toml")
    assert attntrace.check(trace, _answer(trace)).ok
    answer = _answer(trace)
    o = np.asarray(trace.step("output").value)
    answer["post_attn_norm"] = np.round(o, 4).tolist()  # the norm left out, and the rest worked on from it
    answer["residual1"] = np.round(_x(trace) + o, 4).tolist()
    report = attntrace.check(trace, answer)
    statuses = {s.key: s.status for s in report.steps}
    step = next(s for s in report.steps if s.key == "post_attn_norm")
    assert step.status == "wrong" and step.diagnosis.code == "post_norm_skipped", (statuses, step.diagnosis)
    assert statuses["residual1"] == "carried", statuses
    from attntrace.grading.reports import render_report

    for lang, words in (("en", "without its own RMSNorm"), ("zh", "没有经过它自己的 RMSNorm")):
        assert words in render_report(attntrace.check(trace, answer, lang=lang), format="text", lang=lang)


def _x(trace):
    import tomllib

    with open("examples/gemma2-block-tiny.toml", "rb") as f:
        return np.asarray(tomllib.load(f)["X"], float)


@pytest.mark.parametrize("change, message", [
    ({"block": "llama"}, r"^norm3 norms a sublayer's output before its residual: it belongs to block = \"sandwich\""),
    ({"norm3": {"gain_offset": 2}}, r"^norm3.gain_offset must be 0 or 1"),
    ({"ffn": {**SMALL["ffn"], "activation": "relu"}}, r"^a gated ffn.activation must be \"silu\" \(SwiGLU\) or \"gelu_tanh\" \(GeGLU\)"),
    ({"norm3": {"bias": [0, 0]}}, r"^unknown key 'bias' in norm3"),
])
def test_bad_sandwich_specs_are_one_line_errors(change, message):
    with pytest.raises(attntrace.BadInput, match=message) as info:
        attntrace.run({**SMALL, **change})
    assert "\n" not in str(info.value)
