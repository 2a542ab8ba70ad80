"""Multi-head latent attention (attntrace.kinds.mla) against a reference written from the
DeepSeek-V2 paper (tests/oracles_mla.py, NumPy) and against Hugging Face's DeepseekV3 attention
and decoder layer (tiny random float64 models)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import attntrace
from attntrace.model.errors import BadInput

import oracles_mla as om

TOL = 1e-10


@pytest.mark.parametrize("seed, h, q_lora, layout, n", [(0, 2, True, "interleaved", 4), (1, 3, False, "half", 5),
                                                        (2, 1, True, "half", 3), (3, 4, True, "interleaved", 6)])
def test_mla_equals_the_paper(seed, h, q_lora, layout, n):
    x, w = om.random_mla(seed, n=n, h=h, q_lora=q_lora, d_r=4)
    ref, scores = om.mla(x, w, h, layout=layout)
    t = attntrace.run(om.spec_of(x, w, h, rope={"layout": layout}))
    assert np.abs(ref).max() > 0.3
    np.testing.assert_allclose(t.output, ref, rtol=0, atol=TOL)
    for i in range(1, h + 1):
        head = i if h > 1 else None
        got = t.step("masked", head=head).value
        np.testing.assert_array_equal(np.isinf(got), np.isinf(scores[i - 1]))
        fin = np.isfinite(got)
        np.testing.assert_allclose(got[fin], scores[i - 1][fin], rtol=0, atol=TOL)
        # scaled by sqrt(d_nope + d_rope): the width of [q^C  q^R]
        assert t.step("scaled", head=head).details["d_k"] == w["W_UQ"].shape[1] // h + 4


def test_rope_only_on_the_decoupled_parts():
    """Positions move the scores only through q^R k^R: with W_QR and W_KR zero the scores are the
    same whatever the positions, and rotating the compressed keys too (the named mistake) differs."""
    x, w = om.random_mla(5, d_r=2)
    w0 = dict(w, W_QR=np.zeros_like(w["W_QR"]), W_KR=np.zeros_like(w["W_KR"]))
    a = attntrace.run(om.spec_of(x, w0, 2, rope={"layout": "interleaved", "positions": [0, 1, 2, 3]}))
    b = attntrace.run(om.spec_of(x, w0, 2, rope={"layout": "interleaved", "positions": [7, 9, 20, 21]}))
    np.testing.assert_allclose(a.step("scores", head=1).value, b.step("scores", head=1).value, rtol=0, atol=TOL)
    c = attntrace.run(om.spec_of(x, w, 2, rope={"layout": "interleaved", "positions": [7, 9, 20, 21]}))
    assert np.abs(a.step("scores", head=1).value - c.step("scores", head=1).value).max() > 1e-3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_absorbed_scores_are_the_scores(seed):
    x, w = om.random_mla(seed, d_r=2)
    t = attntrace.run(om.spec_of(x, w, 2))
    for i in (1, 2):
        s, a = t.step("scores", head=i).value, t.step("scores_absorbed", head=i).value
        np.testing.assert_allclose(a, s, rtol=0, atol=1e-12)
        assert t.step("scores_absorbed", head=i).details["gap"] == float(np.abs(a - s).max())
        # W^UQ W^UK^T, computed independently
        d = w["W_UQ"].shape[1] // 2
        uq, uk = w["W_UQ"][:, (i - 1) * d:i * d], w["W_UK"][:, (i - 1) * d:i * d]
        np.testing.assert_allclose(t.step("W_absorbed", head=i).value, uq @ uk.T, rtol=0, atol=TOL)


def test_absorption_is_exact_in_exact_mode():
    x, w = om.random_mla(4, n=3, d_model=4, d_cq=3, d_c=2, d_r=2, gains=False)
    w = {k: np.round(v * 2) for k, v in w.items()}
    t = attntrace.run(om.spec_of(np.round(x * 2), w, 2), mode="exact")
    assert all(t.step("scores_absorbed", head=i).details["gap"] == 0 for i in (1, 2))
    import sympy

    for i in (1, 2):
        d = sympy.Matrix(t.step("scores_absorbed", head=i).value) - sympy.Matrix(t.step("scores", head=i).value)
        assert all(sympy.simplify(e) == 0 for e in d)


def test_latent_cache_decoding_equals_the_full_sequence():
    """Decoding token n with the cache of c^KV and k^R of tokens 1..n-1 gives row n of the full
    causal trace; the cache holds d_c + d_rope numbers a token."""
    x, w = om.random_mla(6, n=5, d_r=4)
    full = attntrace.run(om.spec_of(x, w, 2))
    ckv = om.rms_norm(x[:4] @ w["W_DKV"], w["gamma_KV"])
    kr = om.rope(x[:4] @ w["W_KR"], range(4), layout="interleaved")
    spec = om.spec_of(x[4:], w, 2, rope={"layout": "interleaved", "positions": [4]}, mask=None)
    spec["mla"].update(c_KV_past=ckv, k_R_past=kr)
    t = attntrace.run(spec)
    np.testing.assert_allclose(t.output, full.output[4:], rtol=0, atol=TOL)
    assert t.step("C_KV_cache").shape == (5, 4) and t.step("K_R_cache").shape == (5, 4)
    ref, _ = om.mla(x[4:], w, 2, c_kv_past=ckv, k_r_past=kr)
    np.testing.assert_allclose(t.output, ref, rtol=0, atol=TOL)


@pytest.mark.parametrize("mode", ["numeric", "exact", "symbolic", "shape"])
def test_every_mode_renders_in_every_format_and_language(mode):
    x, w = om.random_mla(7, n=3, d_model=4, d_cq=3, d_c=2, d_r=2)
    if mode in ("exact", "symbolic"):
        x, w = np.round(x * 2), {k: np.round(v * 2) for k, v in w.items()}
    t = attntrace.run(om.spec_of(x, w, 2), mode=mode)
    for fmt in ("md", "tex", "text"):
        for lang in ("en", "zh"):
            out = attntrace.render(t, format=fmt, lang=lang)
            if mode != "shape":
                assert ("W^{UQ(1)}" in out or "W^UQ(1)" in out) and ("^{C(" in out or "^C(" in out)
                assert re.search(r"\^\{[^{}]*\}\^", out) is None  # one superscript per name: Q^{C(1)}, never Q^{C}^{(1)}
    assert t.to_dict()["steps"]


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update(W_Q=np.eye(8)), "drop W_Q"),
    (lambda s: s.pop("rope"), "decoupled RoPE key: give rope"),
    (lambda s: s["mla"].pop("W_UK"), "mla needs W_UK"),
    (lambda s: s["mla"].update(W_KR=np.ones((8, 3))), "must match"),
    (lambda s: s["mla"].update(W_UK=np.ones((4, 6))), "W_UK gives each head 3 columns but W_UQ 2"),
    (lambda s: s["mla"].update(W_DKV=np.ones((7, 4))), r"mla.W_DKV has shape \(7, 4\), expected \(8, ...\)"),
    (lambda s: s["mla"].update(c_KV_past=np.ones((2, 4))), "must be given together"),
    (lambda s: s["mla"].update(bogus=1), "unknown key 'bogus' in mla"),
    (lambda s: s["mla"].pop("W_DQ"), "q_norm normalises the compressed query"),
])
def test_bad_specs_one_line(change, message):
    x, w = om.random_mla(0)
    spec = om.spec_of(x, w, 2)
    change(spec)
    with pytest.raises(BadInput, match=message) as e:
        attntrace.run(spec)
    assert "\n" not in str(e.value)


# -- Hugging Face DeepseekV3 ---------------------------------------------------------------------------
@pytest.mark.parametrize("seed, heads, q_lora, interleave", [(1, 2, 6, True), (2, 3, None, True), (3, 2, 6, False)])
def test_hf_deepseek_attention_in_float64(seed, heads, q_lora, interleave):
    """DeepseekV3Attention (SDPA, its RMSNorms and rotary angles run in float64) at 1e-10, through
    the specific bridge and through from_torch."""
    from attntrace.bridges.deepseek import from_hf_mla_attention

    model = om.tiny_deepseek(seed, heads=heads, q_lora=q_lora, rope_dim=4, interleave=interleave)
    x, y = om.layer_io(model, 0, part="attn")
    assert np.abs(y).max() > 0.3
    t = from_hf_mla_attention(model.layers[0].self_attn, x)
    np.testing.assert_allclose(t.output, y, rtol=0, atol=TOL)
    np.testing.assert_allclose(attntrace.from_torch(model.layers[0].self_attn, x).output, y, rtol=0, atol=TOL)
    assert t.step("K_R_rope").details["layout"] == ("interleaved" if interleave else "half")


def test_hf_deepseek_dense_layer_through_from_hf_layer():
    """A whole DeepseekV3DecoderLayer with a dense MLP: llama block + latent attention, at 1e-10 with
    float64 internals, and at the stated 1e-6 unmodified (HF's float32 RMSNorm and rotary angles)."""
    from attntrace import from_hf_layer

    model = om.tiny_deepseek(4, rope_dim=4)
    x, y = om.layer_io(model, 0)
    t = from_hf_layer(model, x, layer=0)
    np.testing.assert_allclose(t.output, y, rtol=0, atol=TOL)
    assert {"norm1", "C_KV_norm", "K_R_rope", "ffn_up", "residual2"} <= {s.id for s in t.steps}
    raw = om.tiny_deepseek(4, rope_dim=4, float64_internals=False)
    x, y = om.layer_io(raw, 0)
    gap = np.abs(from_hf_layer(raw, x, layer=0).output - y).max()
    assert 1e-12 < gap < 1e-6
    assert np.abs(attntrace.from_torch(raw.layers[0], x).output - y).max() < 1e-6


# -- DeepSeek-V3's YaRN: the rotated parts' frequencies and factor, and the softmax scale's mscale^2 -------
def _yarn_deepseek(mscale, mscale_all_dim, float64_internals=True, seed=0):
    """A tiny DeepseekV3Model whose rope_parameters are YaRN (factor 40 over 4 original positions)."""
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": mscale, "mscale_all_dim": mscale_all_dim}
    return om.tiny_deepseek(seed, rope_dim=4, float64_internals=float64_internals, rope_parameters=yarn, max_positions=256)


@pytest.mark.parametrize("mscale, mscale_all_dim", [(1.0, 1.0), (1.0, 0.5), (0.707, 0.707)])
def test_hf_deepseek_yarn_applies_mscale_as_hf_does(mscale, mscale_all_dim):
    """HF's yarn_apply_mscale: softmax_scale = qk_head_dim^-1/2 mscale^2 with mscale = 0.1
    mscale_all_dim ln(factor) + 1; the rotated parts turn by YaRN's frequencies times
    g(mscale) / g(mscale_all_dim). At 1e-10 with float64 internals (measured 3e-15 to 5e-15),
    at 1e-5 unmodified (measured 3.3e-7 to 1.3e-6)."""
    for f64, tol in ((True, TOL), (False, 1e-5)):
        model = _yarn_deepseek(mscale, mscale_all_dim, f64)
        attn = model.layers[0].self_attn
        assert attn.scaling != pytest.approx(6 ** -0.5)  # HF applies the mscale
        x, y = om.layer_io(model, 0, n=6)
        t = attntrace.from_torch(model, x, layer=0)
        err = float(np.abs(t.output - y).max())
        print(f"mscale {mscale}/{mscale_all_dim}, float64 internals {f64}: {err:.1e}")
        assert err < tol, err
        assert t.step("scaled", head=1).details["factor"] == pytest.approx(attn.scaling ** -1, rel=1e-14)


@pytest.mark.parametrize("mscale, mscale_all_dim", [(1.0, 1.0), (1.0, 0.5)])
def test_deepseek_yarn_against_the_papers(mscale, mscale_all_dim):
    """The attention written from DeepSeek-V2's equations (oracles_mla.mla) with YaRN (arXiv
    2309.00071: NTK-by-parts frequencies and the temperature sqrt(1/t) = 0.1 ln s + 1 of section
    3.4, which DeepSeek takes as mscale^2 on the softmax scale of the whole head, the rotated
    parts' own factor being g(mscale) / g(mscale_all_dim)), from test_rope_scaling's references."""
    import math

    from test_rope_scaling import ref_inv_freq, ref_mu

    x, w = om.random_mla(7, n=5, d_r=4)
    yarn = {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4, "beta_fast": 32.0, "beta_slow": 1.0,
            "mscale": mscale, "mscale_all_dim": mscale_all_dim}
    m = 0.1 * mscale_all_dim * math.log(40.0) + 1
    want, _ = om.mla(x, w, 2, theta=ref_inv_freq(yarn, 10000.0, 4), mu=ref_mu(yarn), softmax_scale=m * m / math.sqrt(6))
    spec = om.spec_of(x, w, 2, scale=f"sqrt(6)/({mscale_all_dim!r}/10*log(40.0) + 1)^2")
    spec["rope"] = {"layout": "interleaved", "scaling": yarn}
    t = attntrace.run(spec)
    np.testing.assert_allclose(t.output, want, rtol=0, atol=TOL)
    assert t.step("K_R_rope").details["mu"] == pytest.approx(ref_mu(yarn))
    for trace in (t, attntrace.run(spec, mode="shape")):
        for fmt in ("md", "tex", "text"):
            for lang in ("en", "zh"):
                assert attntrace.render(trace, format=fmt, lang=lang)
    if mscale != mscale_all_dim:
        assert "\\mu" in attntrace.render(t, format="md")


# -- the checker: carried forward through the latents, and the named mistake ----------------------------
def _student(values: dict, keys) -> dict:
    return {k: [["-inf" if np.isneginf(x) else round(float(x), 4) for x in row] for row in values[k]] for k in keys}


def test_a_wrong_latent_is_carried_through_every_later_step():
    """The student's W^DKV entry is off, so their C^KV is wrong; everything after it, computed right
    from it (by the reference on the student's weights), is carried."""
    from attntrace.grading.diagnose import to_float

    x, w = om.random_mla(8, d_r=2)
    trace = attntrace.run(om.spec_of(x, w, 2))
    wrong = dict(w, W_DKV=w["W_DKV"] + np.eye(8, 4) * 0.5)
    mine = {s.key: to_float(s.value) for s in attntrace.run(om.spec_of(x, wrong, 2)).steps}
    report = attntrace.check(trace, _student(mine, [s.key for s in trace.steps]))
    statuses = {s.key: s.status for s in report.steps}
    assert report.first_wrong == "C_KV", statuses
    assert [k for k, v in statuses.items() if v == "wrong"] == ["C_KV"], statuses
    assert statuses["K_mla@1"] == "carried" and statuses["scores_absorbed@2"] == "carried" and statuses["output"] == "carried"


def test_rope_on_the_compressed_parts_is_named():
    """A student who rotates q^C and k^C as well (computed here in NumPy from the paper's
    equations, not by attntrace): the checker names mla_rope_on_compressed at Q_mla@1."""
    x, w = om.random_mla(9, n=4, d_nope=2, d_r=2)
    trace = attntrace.run(om.spec_of(x, w, 2))
    mine = {s.key: np.asarray(s.value, dtype=float) for s in trace.steps if s.id in ("C_Q", "C_Q_norm", "C_KV", "C_KV_norm", "K_R",
                                                                                    "K_R_rope", "Q_C", "Q_R", "Q_R_rope", "K_C", "V_C")}
    for i in (1, 2):
        rot = lambda a: om.rope(a, range(4), layout="interleaved")  # noqa: E731
        mine[f"Q_mla@{i}"] = np.hstack([rot(mine[f"Q_C@{i}"]), mine[f"Q_R_rope@{i}"]])
        mine[f"K_mla@{i}"] = np.hstack([rot(mine[f"K_C@{i}"]), mine["K_R_rope"]])
    for lang in ("en", "zh"):
        report = attntrace.check(trace, _student(mine, list(mine)), lang=lang)
        first = next(s for s in report.steps if s.key == report.first_wrong)
        assert report.first_wrong == "Q_mla@1"
        assert first.diagnosis.code == "mla_rope_on_compressed" or "mla_rope_on_compressed" in {a.code for a in first.diagnosis.alternatives}
        from attntrace.grading.reports import render_report

        for fmt in ("text", "md", "tex"):
            text = render_report(report, format=fmt, lang=lang)
            assert ("only the decoupled parts" if lang == "en" else "只旋转解耦的部分") in text


def test_own_rounded_numbers_are_accepted():
    x, w = om.random_mla(10, d_r=2)
    trace = attntrace.run(om.spec_of(x, w, 2))
    from attntrace.grading.diagnose import to_float

    report = attntrace.check(trace, _student({s.key: to_float(s.value) for s in trace.steps}, [s.key for s in trace.steps]))
    assert report.ok, report.first_wrong


def test_symbolic_yarn_latent_attention_runs_named_and_agrees_with_numeric():
    """The cost model knows that symbolic mode names the latents' entries (c^{KV}_{ij}, the
    norms' outputs), so the up-projections read one name each: the YaRN spec above runs in
    symbolic mode (it was refused at about 533,000 units of work), and with the numbers
    substituted it equals the numeric trace."""
    from modesagree import assert_modes_agree, operand_values, symbolic_spec

    x, w = om.random_mla(7, n=5, d_r=4)
    yarn = {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4, "beta_fast": 32.0, "beta_slow": 1.0,
            "mscale": 1.0, "mscale_all_dim": 0.5}
    spec = om.spec_of(x, w, 2, scale="sqrt(6)/(0.5/10*log(40.0) + 1)^2")
    spec["rope"] = {"layout": "interleaved", "scaling": yarn}
    numeric = attntrace.run(spec)
    symbolic = attntrace.run(symbolic_spec(spec), mode="symbolic")
    assert_modes_agree(numeric, symbolic=symbolic, values=operand_values(symbolic, numeric), atol=TOL)
    assert symbolic.step("C_KV").expansion is not None
