"""QK-norm (steps Q_norm, K_norm: RMSNorm of each head's rows of Q and K) against PyTorch.

Oracle: torch float64 ops written from the RMSNorm paper (Zhang & Sennrich 2019) and Qwen3's
attention (q_norm/k_norm over head_dim, before RoPE): x * rsqrt(mean(x^2) + eps) * g per row
of each head, then Hugging Face's own RoPE (tests/oracles.rope_half_hf) when asked, then
softmax(Q K^T / sqrt(d_k)) V. Nothing of attntrace computes the expected values.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings, strategies as st

import attntrace
from mathcheck import markdown_math_spans, require_modules
from modesagree import assert_modes_agree

TOL = 1e-10


def _rms(torch, x, g, eps):
    """RMSNorm of each row (last axis): x * rsqrt(mean(x^2) + eps) * g."""
    y = x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps)
    return y if g is None else y * torch.tensor(g, dtype=torch.float64)


def _torch_qk_norm_attention(torch, x, wq, wk, wv, h, h_kv, eps, gq, gk, rope, causal):
    X, WQ, WK, WV = (torch.tensor(a, dtype=torch.float64) for a in (x, wq, wk, wv))
    n, dk, dv = X.shape[0], WQ.shape[1] // h, WV.shape[1] // h_kv
    q = (X @ WQ).view(n, h, dk).transpose(0, 1)                          # (h, n, d_k)
    k = (X @ WK).view(n, h_kv, dk).transpose(0, 1)                       # (h_kv, n, d_k)
    v = (X @ WV).view(n, h_kv, dv).transpose(0, 1)                       # (h_kv, n, d_v)
    qn, kn = _rms(torch, q, gq, eps), _rms(torch, k, gk, eps)            # (h, n, d_k), (h_kv, n, d_k)
    if rope:
        import oracles

        qr = torch.tensor(oracles.rope_half_hf(qn.numpy()), dtype=torch.float64)
        kr = torch.tensor(oracles.rope_half_hf(kn.numpy()), dtype=torch.float64)
    else:
        qr, kr = qn, kn
    group = h // h_kv
    kr_full, v_full = kr.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)  # (h, n, .)
    s = qr @ kr_full.transpose(-1, -2) / dk ** 0.5                       # (h, n, n)
    if causal:
        s = s.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool)), float("-inf"))
    a = torch.softmax(s, dim=-1)                                         # (h, n, n)
    return qn.numpy(), kn.numpy(), a.numpy(), (a @ v_full).numpy()


@settings(max_examples=25, deadline=None)
@given(heads=st.sampled_from([(1, 1), (2, 2), (2, 1), (4, 2)]), n=st.integers(1, 4), dk=st.sampled_from([2, 4]),
       eps=st.sampled_from([1e-6, 1e-5, 0.5]), gains=st.booleans(), rope=st.booleans(), causal=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_qk_norm_matches_pytorch(torch, heads, n, dk, eps, gains, rope, causal, seed):
    if rope:
        require_modules("transformers")
    h, h_kv = heads
    rng = np.random.default_rng(seed)
    d = 4
    x = rng.normal(size=(n, d)) * 3
    wq, wk = rng.normal(size=(d, h * dk)), rng.normal(size=(d, h_kv * dk))
    wv = rng.normal(size=(d, h_kv * 2))
    gq, gk = (rng.normal(size=dk).tolist(), rng.normal(size=dk).tolist()) if gains else (None, None)
    qk = {"eps": eps, **({"g_q": gq, "g_k": gk} if gains else {})}
    spec = {"X": x, "W_Q": wq, "W_K": wk, "W_V": wv, "num_heads": h, "num_kv_heads": h_kv, "qk_norm": qk,
            **({"rope": True} if rope else {}), **({"mask": "causal"} if causal else {})}
    t = attntrace.run(spec)
    qn, kn, a, z = _torch_qk_norm_attention(torch, x, wq, wk, wv, h, h_kv, eps, gq, gk, rope, causal)
    group = h // h_kv
    for i in range(h):
        head = i + 1 if h > 1 else None
        np.testing.assert_allclose(t.step("Q_norm", head).value, qn[i], atol=TOL, rtol=0)
        np.testing.assert_allclose(t.step("weights", head).value, a[i], atol=TOL, rtol=0)
        np.testing.assert_allclose(t.step("Z", head).value, z[i], atol=TOL, rtol=0)
    for j in range(h_kv):
        head = j + 1 if h > 1 else None
        np.testing.assert_allclose(t.step("K_norm", head).value, kn[j], atol=TOL, rtol=0)
    assert sum(1 for s in t.steps if s.id == "K_norm") == h_kv  # a shared key head is normalised once
    del group


def test_the_steps_sit_after_the_projections_and_before_rope():
    t = attntrace.run({"Q": [[1, 2], [3, 1]], "K": [[0, 1], [2, 2]], "V": [[1], [2]], "qk_norm": True, "rope": True})
    assert [s.id for s in t.steps] == ["Q_norm", "K_norm", "Q_rope", "K_rope", "scores", "scaled", "weights", "Z"]
    assert t.step("Q_rope").inputs == ("Q_norm",) and t.step("K_rope").inputs == ("K_norm",)
    assert t.step("Q_norm").details["eps"] == 1e-6
    u = attntrace.run({"Q": [[1, 2]], "K": [[0, 1]], "V": [[1]], "qk_norm": True})
    assert u.step("scores").inputs == ("Q_norm", "K_norm")
    # the hand computation: q = (1, 2), nu = 5/2, q-hat = q / sqrt(5/2 + 1e-6)
    np.testing.assert_allclose(u.step("Q_norm").value, [[1 / np.sqrt(2.5 + 1e-6), 2 / np.sqrt(2.5 + 1e-6)]], atol=1e-15)


@settings(max_examples=8, deadline=None)
@given(h=st.integers(1, 2), n=st.integers(1, 3), gains=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_symbolic_exact_and_shape_agree_with_numeric(h, n, gains, seed):
    rng = np.random.default_rng(seed)
    nums = {k: rng.integers(-3, 4, (n, 2 * h)) / 2 for k in ("Q", "K", "V")}
    for k in ("Q", "K"):
        nums[k][:, 0] = np.where(nums[k][:, 0] == 0, 1, nums[k][:, 0])  # no zero row: eps = 1/4 keeps it defined anyway
    g = {"g_q": [1, "1/2"], "g_k": [2, -1]} if gains else {}
    opts = {"num_heads": h, "qk_norm": {"eps": "1/4", **g}}
    num_opts = {"num_heads": h, "qk_norm": {"eps": 0.25, **({"g_q": [1, 0.5], "g_k": [2, -1]} if gains else {})}}
    numeric = attntrace.run({**nums, **num_opts})
    symbolic = attntrace.run({k: {"shape": [n, 2 * h]} for k in nums} | opts, mode="symbolic")
    exact = attntrace.run({k: [[str(sp.Rational(str(x))) for x in r] for r in v.tolist()] for k, v in nums.items()} | opts, mode="exact")
    shape = attntrace.run({**nums, **num_opts}, mode="shape")
    names = {"Q": "q", "K": "k", "V": "v"}
    values = {sp.Symbol(f"{names[key]}_{{{i + 1}{j + 1}}}"): a[i, j] for key, a in nums.items() for i in range(n) for j in range(2 * h)}
    values[sp.Symbol("\\varepsilon")] = 0.25
    assert_modes_agree(numeric, symbolic=symbolic, values=values, exact=exact, shape=shape, atol=TOL)


@pytest.mark.parametrize("mode", ["numeric", "exact", "symbolic", "shape"])
def test_renders_everywhere_and_its_math_parses(mode, katex):
    spec = "qk-norm-qwen3" if mode != "symbolic" else {"Q": {"shape": [3, 2]}, "K": {"shape": [3, 2]}, "V": {"shape": [3, 1]},
                                                       "qk_norm": True, "mask": "causal"}
    t = attntrace.run(spec, mode=mode)
    for lang in ("en", "zh"):
        md = attntrace.render(t, format="md", lang=lang)
        assert katex(markdown_math_spans(md)) == []
        assert "\\operatorname{RMSNorm}" in md
        text = attntrace.render(t, format="text", lang=lang)
        assert "\\hat" not in text and "Q' = RMSNorm(Q" in text
        assert attntrace.render(t, format="tex", lang=lang)


def test_standalone_latex_compiles(xelatex):
    t = attntrace.run("qk-norm-qwen3")
    for lang in ("en", "zh"):
        ok, log, _ = xelatex(attntrace.render(t, format="tex", lang=lang, standalone=True))
        assert ok, log


def test_report_and_json():
    t = attntrace.run("qk-norm-qwen3")
    text = attntrace.render(t, format="text")
    assert "softmax(Q~ K~^T / sqrt(d_k)) V" in text and "Normalising the queries (QK-norm)" in text
    d = t.to_dict()
    step = next(s for s in d["steps"] if s["id"] == "Q_norm")
    assert step["qk_norm"]["norm"] == "rms" and step["qk_norm"]["eps"] == 1e-6 and step["inputs"][1] == "g_q"
    assert [o["name"] for o in d["operands"]][-2:] == ["g_q", "g_k"]


@pytest.mark.parametrize("value, message", [
    ({"eps": -1}, r"^qk_norm.eps must be a number >= 0"),
    ({"g": [1]}, r"^unknown key 'g' in qk_norm; allowed: eps, g_q, g_k$"),
    ("yes", r"^qk_norm must be true, false or a table"),
    ({"g_q": [1, 2, 3]}, r"^qk_norm.g_q has 3 gains but a head's Q has d_k = 2 features$"),
    ({"g_k": [[1, 2], [3, 4]]}, r"^qk_norm.g_k must be one row of gains"),
])
def test_bad_qk_norm_is_a_one_line_error(value, message):
    with pytest.raises(attntrace.BadInput, match=message) as info:
        attntrace.run({"Q": [[1, 0]], "K": [[1, 1]], "V": [[1]], "qk_norm": value})
    assert "\n" not in str(info.value)


def test_a_zero_row_with_eps_0_is_refused():
    with pytest.raises(attntrace.BadInput, match=r"^step Q_norm: row 1 of Q is zero and qk_norm.eps = 0"):
        attntrace.run({"Q": [[0, 0]], "K": [[1, 1]], "V": [[1]], "qk_norm": {"eps": 0}})


# -- the checker ---------------------------------------------------------------------------------
SPEC = {"X": [[1, 0, 2], [0, 1, -1], [3, 1, 0]], "W_Q": [[1, 0], [0, 1], [2, 1]], "W_K": [[1, 1], [0, 2], [1, 0]],
        "W_V": [[1, 0], [0, 1], [1, 1]], "qk_norm": {"g_q": [1, 2]}, "mask": "causal"}


def _layer_norm(x, eps=1e-6):
    c = x - x.mean(axis=1, keepdims=True)
    return c / np.sqrt((c * c).mean(axis=1, keepdims=True) + eps)


def test_qk_norm_mean_subtracted_is_named_in_both_languages_and_carried():
    t = attntrace.run(SPEC)
    q = t.step("Q").value
    wrong = np.round(_layer_norm(q) * np.array([1, 2]), 3)  # LayerNorm instead of RMSNorm, computed here
    report = attntrace.check(SPEC, {"Q_norm": wrong.tolist()})
    step = next(s for s in report.steps if s.key == "Q_norm")
    assert step.status == "wrong" and step.diagnosis.code == "qk_norm_mean_subtracted"
    assert "LayerNorm" in step.diagnosis.message("en") and "LayerNorm" in step.diagnosis.message("zh")
    k_hat = np.round(t.step("K_norm").value, 3)
    scores = np.round(wrong @ k_hat.T, 3)  # right from the student's own wrong Q-hat
    report = attntrace.check(SPEC, {"Q_norm": wrong.tolist(), "K_norm": k_hat.tolist(), "scores": scores.tolist()})
    by_key = {s.key: s for s in report.steps}
    assert by_key["K_norm"].status == "correct" and by_key["scores"].status == "carried"


def test_a_wrong_q_is_carried_through_the_norm_and_rounded_answers_are_right():
    t = attntrace.run(SPEC)
    for decimals in (2, 3, 4):
        q = np.round(t.step("Q").value, decimals)
        report = attntrace.check(SPEC, {"Q": q.tolist(), "Q_norm": np.round(t.step("Q_norm").value, decimals).tolist()})
        assert all(s.status == "correct" for s in report.steps), decimals
    q = t.step("Q").value.copy()
    q[0, 0] += 1  # a slip in Q, then the norm computed right from it
    qn = q / np.sqrt((q * q).mean(axis=1, keepdims=True) + 1e-6) * np.array([1, 2])
    report = attntrace.check(SPEC, {"Q": q.tolist(), "Q_norm": np.round(qn, 4).tolist()})
    by_key = {s.key: s for s in report.steps}
    assert by_key["Q"].status == "wrong" and by_key["Q_norm"].status == "carried"
