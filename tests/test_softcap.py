"""Logit soft-capping (step softcap, Gemma 2) against PyTorch, in every mode, output and language.

Oracle: torch float64 ops written from the Gemma 2 report (and Hugging Face Gemma2Attention's
order): S = Q K^T * d_k^-1/2, then c * tanh(S / c), then the mask (-inf), softmax, A V. Nothing
of attntrace is used to compute the expected values.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings, strategies as st

import attntrace
from mathcheck import markdown_math_spans
from modesagree import assert_modes_agree

TOL = 1e-10


def _torch_softcap_attention(torch, x, wq, wk, wv, h, cap, causal):
    """Per head: softcap(Q K^T / sqrt(d_k)), masked, softmax, times V (float64)."""
    X, WQ, WK, WV = (torch.tensor(a, dtype=torch.float64) for a in (x, wq, wk, wv))
    n, dk, dv = X.shape[0], WQ.shape[1] // h, WV.shape[1] // h
    q = (X @ WQ).view(n, h, dk).transpose(0, 1)                          # (h, n, d_k)
    k = (X @ WK).view(n, h, dk).transpose(0, 1)                          # (h, n, d_k)
    v = (X @ WV).view(n, h, dv).transpose(0, 1)                          # (h, n, d_v)
    s = q @ k.transpose(-1, -2) / dk ** 0.5                              # (h, n, n)
    capped = cap * torch.tanh(s / cap)                                   # (h, n, n)
    if causal:
        keep = torch.tril(torch.ones(n, n, dtype=torch.bool))
        capped_masked = capped.masked_fill(~keep, float("-inf"))
    else:
        capped_masked = capped
    a = torch.softmax(capped_masked, dim=-1)                             # (h, n, n)
    z = a @ v                                                            # (h, n, d_v)
    return capped.numpy(), a.numpy(), z.numpy()


@settings(max_examples=25, deadline=None)
@given(h=st.integers(1, 3), n=st.integers(1, 5), dk=st.integers(1, 3), cap=st.sampled_from([0.5, 1, 2, 30, 50]),
       causal=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_softcap_matches_pytorch(torch, h, n, dk, cap, causal, seed):
    rng = np.random.default_rng(seed)
    d = 3
    x = rng.normal(size=(n, d)) * 3
    wq, wk, wv = (rng.normal(size=(d, h * dk)) * 2 for _ in range(3))
    spec = {"X": x, "W_Q": wq, "W_K": wk, "W_V": wv, "num_heads": h, "softcap": cap, **({"mask": "causal"} if causal else {})}
    t = attntrace.run(spec)
    capped, a, z = _torch_softcap_attention(torch, x, wq, wk, wv, h, cap, causal)
    for i in range(h):
        head = i + 1 if h > 1 else None
        np.testing.assert_allclose(t.step("softcap", head).value, capped[i], atol=TOL, rtol=0)
        np.testing.assert_allclose(t.step("weights", head).value, a[i], atol=TOL, rtol=0)
        np.testing.assert_allclose(t.step("Z", head).value, z[i], atol=TOL, rtol=0)


def test_the_step_sits_after_the_scaling_and_before_the_mask():
    t = attntrace.run("softcap-gemma2")
    ids = [s.id for s in t.steps]
    assert ids.index("scaled") + 1 == ids.index("softcap") and ids.index("softcap") + 1 == ids.index("masked")
    assert t.step("softcap").inputs == ("scaled",) and t.step("masked").inputs == ("softcap",)
    # without the scaling it reads the scores; with ALiBi the bias comes after it
    u = attntrace.run({"Q": [[1, 2]], "K": [[3, 4]], "V": [[1]], "scale": False, "softcap": 5, "alibi": True})
    assert [s.id for s in u.steps] == ["scores", "softcap", "biased", "weights", "Z"]
    assert u.step("softcap").inputs == ("scores",)
    np.testing.assert_allclose(u.step("softcap").value, [[5 * np.tanh(11 / 5)]], atol=1e-15)


@settings(max_examples=10, deadline=None)
@given(h=st.integers(1, 2), n=st.integers(1, 3), causal=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_symbolic_exact_and_shape_agree_with_numeric(h, n, causal, seed):
    rng = np.random.default_rng(seed)
    nums = {k: rng.integers(-3, 4, (n, 2 * h)) / 2 for k in ("Q", "K", "V")}
    opts = {"num_heads": h, "softcap": "5/2", **({"mask": "causal"} if causal else {})}
    numeric = attntrace.run({**nums, **opts})
    symbolic = attntrace.run({k: {"shape": [n, 2 * h]} for k in nums} | opts, mode="symbolic")
    exact = attntrace.run({k: [[str(sp.Rational(str(x))) for x in r] for r in v.tolist()] for k, v in nums.items()} | opts, mode="exact")
    shape = attntrace.run({**nums, **opts}, mode="shape")
    names = {"Q": "q", "K": "k", "V": "v"}
    values = {sp.Symbol(f"{names[key]}_{{{i + 1}{j + 1}}}"): a[i, j] for key, a in nums.items() for i in range(n) for j in range(2 * h)}
    assert any(s.id == "softcap" for s in numeric.steps)
    assert_modes_agree(numeric, symbolic=symbolic, values=values, exact=exact, shape=shape, atol=TOL)


def test_symbolic_entries_are_one_level_deep():
    t = attntrace.run({"Q": {"shape": [2, 2]}, "K": {"shape": [2, 2]}, "V": {"shape": [2, 1]}, "softcap": 30}, mode="symbolic")
    e = t.step("softcap").expansion[1, 0]
    assert {str(x) for x in e.free_symbols} == {"t_{21}"}
    assert sp.simplify(e - 30 * sp.tanh(sp.Symbol("t_{21}") / 30)) == 0
    assert str(t.step("softcap").value[1, 0]) == "\\bar{t}_{21}"


@pytest.mark.parametrize("mode", ["numeric", "exact", "symbolic", "shape"])
def test_renders_everywhere_and_its_math_parses(mode, katex):
    spec = "softcap-gemma2" if mode != "symbolic" else {"Q": {"shape": [3, 2]}, "K": {"shape": [3, 2]}, "V": {"shape": [3, 1]},
                                                        "softcap": 50, "mask": "causal"}
    t = attntrace.run(spec, mode=mode)
    for lang in ("en", "zh"):
        md = attntrace.render(t, format="md", lang=lang)
        assert katex(markdown_math_spans(md)) == []
        assert "c \\tanh" in md
        text = attntrace.render(t, format="text", lang=lang)
        assert "\\bar" not in text and "\\tanh" not in text and "Tbar" in text
        assert attntrace.render(t, format="tex", lang=lang)


def test_report_writes_the_entries_with_the_cap():
    t = attntrace.run("softcap-gemma2")
    text = attntrace.render(t, format="text")
    assert "softmax(c tanh(Q K^T / sqrt(d_k) / c)) V" in text
    assert "tbar_11 = 2 tanh(t_11 / 2) = 2 tanh(4.2426 / 2) = 1.9433" in text  # t_11 = 6/sqrt(2)
    assert abs(6 / np.sqrt(2) - 4.2426) < 5e-5 and abs(2 * np.tanh(6 / np.sqrt(2) / 2) - 1.9433) < 5e-5
    md = attntrace.render(t, format="md")
    assert "{\\bar{T}} = c \\tanh\\left(T / c\\right)" in md and "c = 2" in md
    assert "软截断" in attntrace.render(t, format="md", lang="zh")


def test_standalone_latex_compiles(xelatex):
    t = attntrace.run("softcap-gemma2")
    for lang in ("en", "zh"):
        ok, log, _ = xelatex(attntrace.render(t, format="tex", lang=lang, standalone=True))
        assert ok, log


def test_json_gives_the_id_and_the_cap():
    d = attntrace.run("softcap-gemma2").to_dict()
    step = next(s for s in d["steps"] if s["id"] == "softcap")
    assert step["softcap"] == 2 and step["inputs"] == ["scaled"]
    exact = attntrace.run({"Q": [[1]], "K": [[1]], "V": [[1]], "softcap": "5/2"}, mode="exact").to_dict()
    assert next(s for s in exact["steps"] if s["id"] == "softcap")["softcap"] == "5/2"


@pytest.mark.parametrize("value, message", [
    (-1, r"^softcap must be a positive number c"),
    (0, r"^softcap must be a positive number c"),
    ("abc", r"^softcap"),
    (True, r"^softcap must be a positive number c"),
    ([1, 2], r"^softcap must be a positive number c"),
])
def test_bad_softcap_is_a_one_line_error(value, message):
    with pytest.raises(attntrace.BadInput, match=message) as info:
        attntrace.run({"Q": [[1, 0]], "K": [[1, 1]], "V": [[1]], "softcap": value})
    assert "\n" not in str(info.value)


def test_softcap_false_is_off():
    t = attntrace.run({"Q": [[1, 0]], "K": [[1, 1]], "V": [[1]], "softcap": False})
    assert "softcap" not in [s.id for s in t.steps]


# -- the checker ---------------------------------------------------------------------------------
SPEC = {"X": [[1, 0, 2], [0, 1, -1], [3, 1, 0]], "W_Q": [[1, 0], [0, 1], [2, 1]], "W_K": [[1, 1], [0, 2], [1, 0]],
        "W_V": [[1, 0], [0, 1], [1, 1]], "softcap": 5, "mask": "causal"}


def _answer(t, **steps):
    out = {}
    for sid, value in steps.items():
        out[sid] = np.round(value, 3).tolist()
    return out


def test_softcap_not_divided_is_named_in_both_languages():
    t = attntrace.run(SPEC)
    scaled = np.round(t.step("scaled").value, 3)
    wrong = 5 * np.tanh(scaled)  # c tanh(T): the division by c forgotten (computed here, from the paper's form)
    report = attntrace.check(SPEC, _answer(t, scaled=scaled, softcap=wrong))
    step = next(s for s in report.steps if s.key == "softcap")
    assert step.status == "wrong" and step.diagnosis.code == "softcap_not_divided"
    assert "c tanh(t)" in step.diagnosis.message("en") and "c = 5" in step.diagnosis.message("en")
    assert "截断" in step.diagnosis.message("zh")
    # and it is carried into the weights computed from the wrong capped scores
    keep = np.tril(np.ones((3, 3), dtype=bool))
    w = np.exp(np.where(keep, np.round(wrong, 3), -np.inf))
    w = w / w.sum(axis=1, keepdims=True)
    report = attntrace.check(SPEC, _answer(t, scaled=scaled, softcap=wrong, weights=w))
    by_key = {s.key: s for s in report.steps}
    assert by_key["softcap"].diagnosis.code == "softcap_not_divided" and by_key["weights"].status == "carried"


def test_a_rounded_right_answer_is_never_wrong_and_a_wrong_scaling_is_carried_through_the_cap():
    t = attntrace.run(SPEC)
    for decimals in (2, 3, 4):
        scaled = np.round(t.step("scaled").value, decimals)
        capped = np.round(5 * np.tanh(scaled / 5), decimals)
        report = attntrace.check(SPEC, {"scaled": scaled.tolist(), "softcap": capped.tolist()})
        assert all(s.status in ("correct", "carried") for s in report.steps), decimals
    scaled = np.round(t.step("scores").value, 3)  # forgot the scaling
    capped = np.round(5 * np.tanh(scaled / 5), 3)
    report = attntrace.check(SPEC, {"scaled": scaled.tolist(), "softcap": capped.tolist()})
    by_key = {s.key: s for s in report.steps}
    assert by_key["scaled"].status == "wrong" and by_key["softcap"].status == "carried"


def test_the_carry_rule_encloses_every_point_of_its_box():
    """c tanh(x / c) over random boxes: the enclosure holds the function at sampled points."""
    from attntrace.grading.kindcarry import TOOLKIT
    from attntrace.grading.intervals import Box
    from attntrace.kinds import KINDS

    rng = np.random.default_rng(0)
    kind = KINDS["softcap"]
    step = attntrace.run({"Q": [[1]], "K": [[1]], "V": [[1]], "softcap": 3}).step("softcap")
    for mistake in (None, "softcap_not_divided"):
        lo = rng.normal(size=(4, 4)) * 10
        hi = lo + rng.random((4, 4)) * 5
        box = kind.carry(TOOLKIT, step, [Box(lo, hi)], mistake)
        for _ in range(200):
            x = lo + rng.random((4, 4)) * (hi - lo)
            y = 3 * np.tanh(x / (1 if mistake else 3))
            assert (box.lo <= y).all() and (y <= box.hi).all()
