"""Attention sinks (spec `sinks`, steps sink and weights) against a reference written from the
gpt-oss model card: "each attention head has a learned bias in the denominator of the softmax,
similar to off-by-one attention and attention sinks, which enables the attention mechanism to
pay no attention to any tokens". The reference below (PyTorch, float64) writes exactly that:
a_ij = exp(t_ij) / (sum_k exp(t_ik) + exp(s_h)), masked keys contributing 0, computed stably
with the row maximum over the scores and s_h. At 1e-10 in every numeric case; exact and
symbolic agree with numeric; reports in every mode, format and language (KaTeX parses the
Markdown); the checker carries a mistake forward through the sink and names `sink_ignored`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp

import attntrace
from mathcheck import markdown_math_spans, require_modules
from modesagree import assert_modes_agree

TOL = 1e-10


def reference(q, k, v, sinks, *, causal=True, window=None):
    """Per head (h, n, d) q/k/v and (h,) sink logits -> (weights (h, n, n), output (h, n, d_v))."""
    require_modules("torch")
    import torch

    q, k, v = (torch.as_tensor(a, dtype=torch.float64) for a in (q, k, v))
    s = torch.as_tensor(np.asarray(sinks, dtype=np.float64))[:, None, None]  # (h, 1, 1)
    t = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n, m = t.shape[-2:]
    i, j = torch.arange(n)[:, None], torch.arange(m)[None, :]
    keep = torch.ones(n, m, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if window is not None:
        keep &= j > i - window
    t = t.masked_fill(~keep, float("-inf"))
    big = torch.maximum(t.amax(dim=-1, keepdim=True), s)  # the stable shift includes the sink
    e = torch.exp(t - big)
    denom = e.sum(dim=-1, keepdim=True) + torch.exp(s - big)
    a = e / denom
    return a.numpy(), (a @ v).numpy()


def _heads(t, step, h):
    return np.stack([t.step(step, head=i if h > 1 else None).value for i in range(1, h + 1)])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("h, window", [(1, None), (2, None), (3, 2)])
def test_weights_and_output_match_the_reference(seed, h, window):
    rng = np.random.default_rng(seed)
    n, d = 5, 4
    X, Wq, Wk, Wv = (rng.standard_normal(s) for s in ((n, 6), (6, h * d), (6, h * d), (6, h * d)))
    Wo = rng.standard_normal((h * d, 6))
    sinks = (rng.standard_normal(h) * 2).tolist()
    spec = {"X": X, "W_Q": Wq, "W_K": Wk, "W_V": Wv, "mask": "causal", "sinks": sinks}
    if h > 1:
        spec.update(num_heads=h, W_O=Wo)
    if window:
        spec["window"] = window
    t = attntrace.run(spec)
    split = lambda a: (X @ a).reshape(n, h, d).transpose(1, 0, 2)  # noqa: E731
    a, z = reference(split(Wq), split(Wk), split(Wv), sinks, window=window)
    np.testing.assert_allclose(_heads(t, "weights", h), a, rtol=0, atol=TOL)
    np.testing.assert_allclose(_heads(t, "Z", h), z, rtol=0, atol=TOL)
    want = z.transpose(1, 0, 2).reshape(n, h * d) @ Wo if h > 1 else z[0]
    np.testing.assert_allclose(t.output, want, rtol=0, atol=TOL)
    sums = _heads(t, "weights", h).sum(axis=-1)
    assert np.all(sums < 1) and np.all(sums > 0)  # the sink takes its share of every row


def test_a_huge_sink_takes_everything_and_a_very_negative_one_nothing():
    spec = {"Q": [[1000, 0], [0, 1]], "K": [[1, 0], [0, 1]], "V": [[1, 2], [3, 4]], "scale": False}
    plain = attntrace.run(spec).step("weights").value
    np.testing.assert_allclose(attntrace.run({**spec, "sinks": [-1e6]}).step("weights").value, plain, atol=1e-300)
    w = attntrace.run({**spec, "sinks": [1e4]}).step("weights").value
    assert np.all(np.isfinite(w)) and np.all(w < 1e-300)


def test_exact_and_symbolic_agree_with_numeric():
    rng = np.random.default_rng(4)
    nums = {"Q": rng.integers(-2, 3, (3, 2)), "K": rng.integers(-2, 3, (3, 2)), "V": rng.integers(-2, 3, (3, 2))}
    opts = {"mask": "causal", "sinks": ["1/2"]}
    numeric = attntrace.run({**nums, **opts})
    symbolic = attntrace.run({**{k: {"shape": [3, 2]} for k in nums}, **opts}, mode="symbolic")
    values = {sp.Symbol(f"{k.lower()}_{{{i + 1}{j + 1}}}"): a[i, j] for k, a in nums.items() for i in range(3) for j in range(2)}
    exact = attntrace.run({**{k: v.tolist() for k, v in nums.items()}, **opts}, mode="exact")
    shape = attntrace.run({**nums, **opts}, mode="shape")
    assert_modes_agree(numeric, symbolic=symbolic, values=values, exact=exact, shape=shape, atol=TOL)
    s = exact.step("sink")
    assert s.value[:, 3] == sp.Matrix([sp.Rational(1, 2)] * 3) and s.shape == (3, 4)
    assert exact.step("weights").shape == (3, 3)


@pytest.mark.parametrize("mode", ["numeric", "exact", "symbolic", "shape"])
def test_sinks_render_everywhere_with_the_extra_denominator_term(mode, katex):
    spec = {"Q": [[1, 0], [0, 1], [1, 1]], "K": [[1, 0], [0, 1], [1, -1]], "V": [[1, 2], [0, 1], [3, 1]], "mask": "causal",
            "sinks": [0.5]}
    if mode == "symbolic":
        spec.update(Q={"shape": [3, 2]}, K={"shape": [3, 2]}, V={"shape": [3, 2]})
    t = attntrace.run(spec, mode=mode)
    for lang in ("en", "zh"):
        md = attntrace.render(t, format="md", lang=lang)
        assert katex(markdown_math_spans(md)) == []
        assert attntrace.render(t, format="tex", lang=lang)
        text = attntrace.render(t, format="text", lang=lang)
        assert "\\" not in text
        if mode != "shape":
            assert "+ e^{s}" in md and "+ e^s)" in text  # the sink's term in every denominator (the sink step)
            assert "\\sum_{k \\le 3} e^{\\check{t}_{ik}} + e^{\\check{t}_{i4}}}" in md  # ... and the weights' formula
            assert "sum_(k <= 3) e^(tcheck_ik) + e^(tcheck_i4))" in text
            assert ("attention sink" in md) == (lang == "en") and ("汇聚" in md) == (lang == "zh")
    if mode == "numeric":
        md = attntrace.render(t, format="md")
        assert "e^{\\check{t}_{1j} - m_{1}} &= \\left(1,\\ 0,\\ 0,\\ 0.8129\\right)" in md  # e^(0.5 - 0.7071), the sink's exponential
        d = t.to_dict()
        assert next(s for s in d["steps"] if s["id"] == "sink")["sink"] == 0.5


def test_checker_carries_a_wrong_score_through_the_sink_and_names_sink_ignored():
    rng = np.random.default_rng(2)
    spec = {"X": rng.integers(-3, 4, (3, 4)).astype(float).tolist(),
            **{w: np.round(rng.uniform(-1, 1, (4, 2)), 1).tolist() for w in ("W_Q", "W_K", "W_V")},
            "mask": "causal", "sinks": [0.3]}
    trace = attntrace.run(spec)
    for dec in (2, 3, 4):
        assert attntrace.check(trace, {s.key: np.round(np.asarray(s.value, float), dec).tolist() for s in trace.steps}).ok
    wrong = {**spec, "W_K": [[x + (1.0 if (i, j) == (0, 0) else 0.0) for j, x in enumerate(r)] for i, r in enumerate(spec["W_K"])]}
    mine = attntrace.run(wrong)
    report = attntrace.check(trace, {s.key: np.round(np.asarray(s.value, float), 4).tolist() for s in mine.steps})
    statuses = {s.key: s.status for s in report.steps}
    assert statuses["K"] == "wrong" and statuses["sink"] == "carried" and statuses["weights"] == "carried", statuses
    plain = attntrace.run({k: v for k, v in spec.items() if k != "sinks"})  # the student forgot the sink
    answer = {s.key: np.round(np.asarray(s.value, float), 4).tolist() for s in trace.steps}
    answer["weights"] = np.round(plain.step("weights").value, 4).tolist()
    report = attntrace.check(trace, answer)
    step = next(s for s in report.steps if s.key == "weights")
    assert step.status == "wrong" and step.diagnosis.code == "sink_ignored"
    from attntrace.grading.reports import render_report

    for lang, words in (("en", "attention sink was left out"), ("zh", "漏掉了注意力汇聚")):
        assert words in render_report(attntrace.check(trace, answer, lang=lang), format="text", lang=lang)


@pytest.mark.parametrize("extra, message", [
    ({"sinks": [0.1, 0.2]}, r"^sinks lists 2 logits but there are 1 heads; give one per head$"),
    ({"sinks": ["x"]}, r"^sinks"),
    ({"sinks": [float("inf")]}, r"^sinks must be a list of finite numbers"),
    ({"sinks": [0.1], "online": {"block_keys": 1}}, r"^sinks are traced in the forward pass"),
])
def test_bad_sinks_are_one_line_errors(extra, message):
    with pytest.raises(attntrace.BadInput, match=message) as info:
        attntrace.run({"Q": [[1, 0]], "K": [[1, 0]], "V": [[1]], **extra})
    assert "\n" not in str(info.value)
