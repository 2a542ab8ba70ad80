"""RoPE scaling (rope.scaling: Llama 3.1's "llama3" rule and YaRN) against references and HF.

The references here are written from the descriptions, not from Hugging Face's code:
- llama3: Meta's Llama 3.1 `apply_scaling` rule as the Llama 3 model card describes it
  (wavelength 2 pi / theta; below L / high_freq_factor unchanged, above L / low_freq_factor
  divided by the factor, smoothly blended between);
- YaRN (arXiv 2309.00071, section 3.2 "NTK-by-parts" and 3.4): the pair index d ln(L / (2 pi r))
  / (2 ln b) at which a wavelength makes r turns in L tokens bounds a linear ramp between
  beta_fast and beta_slow turns (over the pair index, floored/ceiled, as the authors' code
  does); h(theta) = (1 - gamma) theta / s + gamma theta ... written below with gamma the share
  kept (extrapolated); and q, k both multiplied by sqrt(1/t) = 0.1 ln s + 1.
Both at 1e-10 in float64 (rotation, weights, output). Then HF's own rope init functions
(`transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`): at float32 precision as HF runs
them, and at 1e-12 when the same functions run with float64 in place of float32.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import sympy as sp

import attntrace
from mathcheck import markdown_math_spans
from modesagree import assert_modes_agree

TOL = 1e-10

LLAMA3 = {"type": "llama3", "factor": 8, "original_max_position_embeddings": 64, "low_freq_factor": 1, "high_freq_factor": 4}
YARN = {"type": "yarn", "factor": 16, "original_max_position_embeddings": 256, "beta_fast": 32, "beta_slow": 1}


# ------------------------------------------------------------------ references from the papers
def ref_inv_freq(scaling, base, d):
    """The frequencies each pair turns by, per the rules in the module docstring (float64 NumPy)."""
    i = np.arange(d // 2, dtype=np.float64)
    theta = base ** (-2.0 * i / d)
    s, L = float(scaling["factor"]), float(scaling["original_max_position_embeddings"])
    if scaling["type"] == "llama3":
        lo, hi = float(scaling.get("low_freq_factor", 1)), float(scaling.get("high_freq_factor", 4))
        wavelen = 2 * np.pi / theta
        kappa = (L / wavelen - lo) / (hi - lo)
        blended = (1 - kappa) * theta / s + kappa * theta
        return np.where(wavelen < L / hi, theta, np.where(wavelen > L / lo, theta / s, blended))
    turns_to_index = lambda r: d * math.log(L / (2 * math.pi * r)) / (2 * math.log(base))  # noqa: E731
    lo, hi = turns_to_index(scaling.get("beta_fast", 32)), turns_to_index(scaling.get("beta_slow", 1))
    if scaling.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if lo == hi:
        hi += 0.001
    interpolated = np.clip((i - lo) / (hi - lo), 0, 1)  # 0: the pair keeps theta, 1: theta / s
    return interpolated * theta / s + (1 - interpolated) * theta


def ref_mu(scaling):
    if scaling["type"] != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    s = float(scaling["factor"])
    g = lambda a: 1.0 if s <= 1 else 0.1 * a * math.log(s) + 1.0  # noqa: E731
    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return g(scaling["mscale"]) / g(scaling["mscale_all_dim"])
    return g(1.0)


def ref_rope_half(x, positions, inv_freq, mu):
    """x (n, d) turned in the half layout (column i with i + d/2) by positions * inv_freq, times mu."""
    d = x.shape[1]
    ang = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[:, : d // 2], x[:, d // 2:]
    return mu * np.hstack([a * c - b * s, a * s + b * c])


def _attention(q, k, v):
    t = q @ k.T / math.sqrt(q.shape[1])
    n = t.shape[0]
    t = np.where(np.tril(np.ones((n, n), dtype=bool)), t, -np.inf)
    e = np.exp(t - t.max(axis=1, keepdims=True))
    a = e / e.sum(axis=1, keepdims=True)
    return a, a @ v


CASES = [LLAMA3, {**LLAMA3, "low_freq_factor": 2, "high_freq_factor": 3, "factor": 4.5}, YARN,
         {**YARN, "truncate": False}, {**YARN, "factor": 40, "mscale": 1.0, "mscale_all_dim": 0.707},
         {**YARN, "attention_factor": 1.25}, {**YARN, "beta_fast": 8, "beta_slow": 2, "factor": 2}]


@pytest.mark.parametrize("scaling", CASES, ids=lambda s: f"{s['type']}-{s['factor']}")
@pytest.mark.parametrize("base, d", [(10000.0, 16), (500.0, 8), (150000.0, 32)])
def test_rotation_weights_and_output_match_the_paper_reference(scaling, base, d):
    rng = np.random.default_rng(d + int(base) % 97)
    n = 5
    X, Wq, Wk, Wv = (rng.standard_normal(s) for s in ((n, 6), (6, d), (6, d), (6, d)))
    positions = [3, 70, 200, 900, 4000]
    t = attntrace.run({"X": X, "W_Q": Wq, "W_K": Wk, "W_V": Wv, "mask": "causal",
                       "rope": {"base": base, "positions": positions, "scaling": scaling}})
    inv, mu = ref_inv_freq(scaling, base, d), ref_mu(scaling)
    q, k = ref_rope_half(X @ Wq, positions, inv, mu), ref_rope_half(X @ Wk, positions, inv, mu)
    np.testing.assert_allclose(t.step("Q_rope").value, q, rtol=0, atol=TOL)
    np.testing.assert_allclose(t.step("K_rope").value, k, rtol=0, atol=TOL)
    a, z = _attention(q, k, X @ Wv)
    np.testing.assert_allclose(t.step("weights").value, a, rtol=0, atol=TOL)
    np.testing.assert_allclose(t.output, z, rtol=0, atol=TOL)
    factors = np.array([float(c) for c in t.step("Q_rope").details["factors"]])
    np.testing.assert_allclose(factors * base ** (-2.0 * np.arange(d // 2) / d), inv, rtol=1e-13)


def test_the_rules_leave_fast_pairs_alone_and_interpolate_slow_ones():
    d, base = 32, 10000.0
    for scaling in (LLAMA3, YARN):
        from attntrace.kinds.ropescaling import frequency_factors

        c = np.array(frequency_factors({**{"low_freq_factor": 1, "high_freq_factor": 4, "beta_fast": 32, "beta_slow": 1,
                                           "truncate": True}, **scaling}, base, d))
        assert c[0] == 1 and c[-1] == pytest.approx(1 / scaling["factor"])
        assert np.all(np.diff(c) <= 1e-15)  # from 1 down to 1/s, never back up
        assert np.any((c < 1) & (c > 1 / scaling["factor"]))  # some pairs are blended


# ------------------------------------------------------------------ Hugging Face's rope init functions
def _hf_config(scaling, base, d):
    from transformers import LlamaConfig

    params = {"rope_type": scaling["type"], "rope_theta": base,
              **{k: v for k, v in scaling.items() if k not in ("type",) and v is not None}}
    return LlamaConfig(hidden_size=2 * d, num_attention_heads=2, head_dim=d, rope_parameters=params,
                       max_position_embeddings=4 * scaling["original_max_position_embeddings"])


class _Float64Torch(types.ModuleType):
    """torch, with float32 spelled float64: HF's rope init functions run in float64 unchanged."""

    def __init__(self, torch):
        super().__init__("torch")
        self._torch = torch
        self.float = self.float32 = torch.float64

    def __getattr__(self, name):
        return getattr(self._torch, name)


@pytest.mark.parametrize("scaling", CASES, ids=lambda s: f"{s['type']}-{s['factor']}")
def test_frequencies_and_attention_factor_match_hugging_face(scaling, monkeypatch):
    import torch
    from transformers import modeling_rope_utils as mru

    base, d = 10000.0, 16
    n, X = 4, np.random.default_rng(0).standard_normal((4, 6))
    Wq = np.random.default_rng(1).standard_normal((6, d))
    t = attntrace.run({"X": X, "W_Q": Wq, "W_K": Wq, "W_V": Wq, "rope": {"base": base, "scaling": scaling}})
    det = t.step("Q_rope").details
    ours = np.array([float(c) for c in det["factors"]]) * base ** (-2.0 * np.arange(d // 2) / d)
    init = mru.ROPE_INIT_FUNCTIONS[scaling["type"]]
    inv32, mu32 = init(_hf_config(scaling, base, d), "cpu")
    assert inv32.dtype == torch.float32
    np.testing.assert_allclose(ours, inv32.double().numpy(), rtol=2e-6)  # HF's float32 frequencies
    assert float(det["mu"]) == pytest.approx(mu32, rel=1e-15)
    monkeypatch.setattr(mru, "torch", _Float64Torch(torch))
    inv64, _ = init(_hf_config(scaling, base, d), "cpu")
    assert inv64.dtype == torch.float64
    np.testing.assert_allclose(ours, inv64.numpy(), rtol=1e-12)
    assert n == t.step("Q_rope").value.shape[0]


# ------------------------------------------------------------------ modes, reports, grading
@pytest.mark.parametrize("scaling", [LLAMA3, {**YARN, "factor": 4, "original_max_position_embeddings": 32}])
def test_exact_and_symbolic_agree_with_numeric(scaling):
    rng = np.random.default_rng(5)
    nums = {"X": rng.integers(-3, 4, (3, 3)) / 2, "W_Q": rng.integers(-2, 3, (3, 4)), "W_K": rng.integers(-2, 3, (3, 4)),
            "W_V": rng.integers(-2, 3, (3, 4))}
    rope = {"base": 100, "positions": [0, 20, 41], "scaling": scaling}
    numeric = attntrace.run({**nums, "rope": rope})
    shapes = {k: {"shape": list(v.shape)} for k, v in nums.items()}
    symbolic = attntrace.run({**shapes, "rope": rope}, mode="symbolic")
    names = {"X": "x", "W_Q": "w^{Q}", "W_K": "w^{K}", "W_V": "w^{V}"}
    values = {sp.Symbol(f"{names[k]}_{{{i + 1}{j + 1}}}"): a[i, j] for k, a in nums.items() for i in range(a.shape[0]) for j in range(a.shape[1])}
    exact = attntrace.run({**{k: [[str(sp.Rational(str(x))) for x in r] for r in v.tolist()] for k, v in nums.items()}, "rope": rope},
                          mode="exact")
    shape = attntrace.run({**nums, "rope": rope}, mode="shape")
    assert_modes_agree(numeric, symbolic=symbolic, values=values, exact=exact, shape=shape, atol=TOL)
    c = exact.step("Q_rope").details["factors"]
    assert all(isinstance(x, sp.Basic) for x in c) and c[0] == 1  # exact factors (pi and logs stay exact)


@pytest.mark.parametrize("mode", ["numeric", "exact", "symbolic", "shape"])
@pytest.mark.parametrize("scaling", [{**LLAMA3, "original_max_position_embeddings": 16}, {**YARN, "factor": 4, "original_max_position_embeddings": 32}],
                         ids=["llama3", "yarn"])
def test_scaled_rope_renders_everywhere_with_its_factors(mode, scaling, katex):
    spec = {"Q": [[1, 0, 2, 1], [0, 1, 1, 0], [2, 1, 0, 1]], "K": [[1, 1, 0, 2], [0, 2, 1, 1], [1, 0, 1, 0]], "V": [[1], [0], [2]],
            "rope": {"base": 100, "positions": [0, 5, 9], "scaling": scaling}}
    if mode == "symbolic":
        spec.update(Q={"shape": [3, 4]}, K={"shape": [3, 4]}, V={"shape": [3, 1]})
    t = attntrace.run(spec, mode=mode)
    for lang in ("en", "zh"):
        md = attntrace.render(t, format="md", lang=lang)
        assert katex(markdown_math_spans(md)) == []
        assert attntrace.render(t, format="tex", lang=lang)
        text = attntrace.render(t, format="text", lang=lang)
        assert "\\" not in text
        if mode != "shape":
            assert "c_{1}" in md and "c_1" in text
            assert ("\\mu" in md) == (scaling["type"] == "yarn")
    en = attntrace.render(t, format="md")
    assert mode == "shape" or ("Llama 3.1" in en) == (scaling["type"] == "llama3")
    if mode == "numeric":
        want = "0.125" if scaling["type"] == "llama3" else "0.25"
        assert want in en  # the slowest pair's c_i = 1/s
        d = attntrace.trace_to_dict(t) if hasattr(attntrace, "trace_to_dict") else t.to_dict()
        rope = next(s for s in d["steps"] if s["id"] == "Q_rope")["rope"]
        assert rope["scaling"]["type"] == scaling["type"] and len(rope["factors"]) == 2


def test_a_rounded_answer_is_never_wrong_and_a_wrong_q_is_carried():
    rng = np.random.default_rng(3)
    spec = {"X": rng.integers(-3, 4, (3, 4)).astype(float).tolist(),
            **{w: np.round(rng.uniform(-1, 1, (4, 4)), 1).tolist() for w in ("W_Q", "W_K", "W_V")},
            "mask": "causal", "rope": {"base": 100, "positions": [0, 7, 30], "scaling": {**YARN, "factor": 4, "original_max_position_embeddings": 32}}}
    trace = attntrace.run(spec)
    for dec in (2, 3, 4):
        answer = {s.key: np.round(np.asarray(s.value, dtype=float), dec).tolist() for s in trace.steps}
        assert attntrace.check(trace, answer).ok
    wrong = {**spec, "W_Q": [[x + (1.0 if (i, j) == (0, 0) else 0.0) for j, x in enumerate(r)] for i, r in enumerate(spec["W_Q"])]}
    mine = attntrace.run(wrong)
    report = attntrace.check(trace, {s.key: np.round(np.asarray(s.value, dtype=float), 4).tolist() for s in mine.steps})
    statuses = {s.key: s.status for s in report.steps}
    assert statuses["Q"] == "wrong" and statuses["Q_rope"] == "carried", statuses


@pytest.mark.parametrize("scaling, message", [
    ({"type": "dynamic", "factor": 2}, r"^rope.scaling.type must be \"llama3\" or \"yarn\""),
    ({"type": "llama3", "factor": 8}, r"^rope.scaling.original_max_position_embeddings is missing"),
    ({**LLAMA3, "beta_fast": 3}, r"^unknown key 'beta_fast' in rope.scaling \(llama3\)"),
    ({**LLAMA3, "factor": -2}, r"^rope.scaling.factor must be a positive number"),
    ({**LLAMA3, "low_freq_factor": 4, "high_freq_factor": 1}, r"^rope.scaling.high_freq_factor must be larger"),
    ({**YARN, "truncate": "yes"}, r"^rope.scaling.truncate must be true or false"),
    ({**YARN, "original_max_position_embeddings": 1.5}, r"^rope.scaling.original_max_position_embeddings must be a positive integer"),
    ("yarn", r"^rope.scaling must be a table"),
])
def test_bad_scaling_is_a_one_line_error(scaling, message):
    with pytest.raises(attntrace.BadInput, match=message) as info:
        attntrace.run({"Q": [[1, 0, 1, 0]], "K": [[1, 0, 0, 1]], "V": [[1]], "rope": {"scaling": scaling}})
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------ the built-in example
def test_the_yarn_example_matches_the_paper_and_hugging_face(monkeypatch):
    """examples/rope-yarn-long-context: its three pairs are extrapolated (c = 1), blended (c = 5/8) and
    interpolated (c = 1/4), since pair 1 makes 163 turns in the 1024 trained tokens (more than
    beta_fast = 32), pair 2 about 7.6 and pair 3 0.35 (fewer than beta_slow = 1); every step equals the
    reference above (the papers' rule, float64 NumPy) and HF's yarn init run in float64 at 1e-10."""
    import tomllib

    import torch
    from transformers import modeling_rope_utils as mru
    from attntrace.teach.examples import example_path

    spec = tomllib.loads(example_path("rope-yarn-long-context").read_text(encoding="utf-8"))
    rope = spec["rope"]
    Q, K, V = (np.array(spec[m], dtype=np.float64) for m in "QKV")
    scaling = {"beta_fast": 32, "beta_slow": 1, **rope["scaling"]}
    base, positions, d = float(rope["base"]), rope["positions"], Q.shape[1]
    L = scaling["original_max_position_embeddings"]
    theta = base ** (-2.0 * np.arange(d // 2) / d)
    turns = L * theta / (2 * math.pi)
    assert turns[0] > scaling["beta_fast"] and scaling["beta_slow"] < turns[1] < scaling["beta_fast"] and turns[2] < scaling["beta_slow"]
    assert min(positions) > L and min(np.diff(positions)) > L  # positions and distances the model never saw
    assert max(positions) < scaling["factor"] * L
    t = attntrace.run("rope-yarn-long-context")
    inv, mu = ref_inv_freq(scaling, base, d), ref_mu(scaling)
    np.testing.assert_allclose(inv / theta, [1.0, 0.625, 0.25], rtol=0, atol=TOL)
    assert mu == pytest.approx(0.1 * math.log(4) + 1, abs=1e-15)
    np.testing.assert_allclose([float(c) for c in t.step("Q_rope").details["factors"]], inv / theta, rtol=0, atol=TOL)
    assert float(t.step("Q_rope").details["mu"]) == pytest.approx(mu, abs=TOL)
    q, k = ref_rope_half(Q, positions, inv, mu), ref_rope_half(K, positions, inv, mu)
    np.testing.assert_allclose(t.step("Q_rope").details["angles"], np.outer(positions, inv), rtol=0, atol=TOL)
    np.testing.assert_allclose(t.step("Q_rope").value, q, rtol=0, atol=TOL)
    np.testing.assert_allclose(t.step("K_rope").value, k, rtol=0, atol=TOL)
    np.testing.assert_allclose(t.step("scores").value, q @ k.T, rtol=0, atol=TOL)
    a, z = _attention(q, k, V)
    np.testing.assert_allclose(t.step("weights").value, a, rtol=0, atol=TOL)
    np.testing.assert_allclose(t.output, z, rtol=0, atol=TOL)
    monkeypatch.setattr(mru, "torch", _Float64Torch(torch))  # HF's own rule, its float32 run in float64
    inv64, mu64 = mru.ROPE_INIT_FUNCTIONS["yarn"](_hf_config({**scaling, "truncate": True}, base, d), "cpu")
    np.testing.assert_allclose(inv64.numpy(), inv, rtol=0, atol=TOL)
    assert mu64 == pytest.approx(mu, abs=TOL)


@pytest.mark.parametrize("mode", ["numeric", "exact"])
def test_a_ramp_one_pair_wide_is_written_without_over_1(mode):
    """d_k = 4 trained on 64 tokens: the pairs make beta_slow = 1 turn at index 0.50, rounded
    outward the ramp runs from 0 to 1, so rho_r = min(1, max(0, r - 1)), not (r - 1) / 1; the
    example's ramp from 0 to 2 keeps its (r - 1) / 2. The factors still follow the paper's rule."""
    import tomllib

    from attntrace.teach.examples import example_path

    spec = tomllib.loads(example_path("rope-yarn-long-context").read_text(encoding="utf-8"))
    ramp = lambda t: [line.strip() for line in attntrace.render(t, format="text").splitlines() if "rho_r = min" in line]  # noqa: E731
    assert ramp(attntrace.run(spec)) == ["c_r = rho_r / 4 + (1 - rho_r),  rho_r = min(1, max(0, (r - 1) / 2))"]
    spec["rope"] = {**spec["rope"], "positions": [1, 2, 3],
                    "scaling": {**spec["rope"]["scaling"], "original_max_position_embeddings": 64}}
    spec["Q"], spec["K"], spec["mode"] = [r[:4] for r in spec["Q"]], [r[:4] for r in spec["K"]], mode
    t = attntrace.run(spec)
    assert ramp(t) == ["c_r = rho_r / 4 + (1 - rho_r),  rho_r = min(1, max(0, r - 1))"]
    scaling = {"beta_fast": 32, "beta_slow": 1, **spec["rope"]["scaling"]}
    np.testing.assert_allclose([float(c) for c in t.step("Q_rope").details["factors"]],
                               ref_inv_freq(scaling, 10000.0, 4) / 10000.0 ** (-np.arange(2) / 2), rtol=0, atol=TOL)
    md = attntrace.render(t, format="md")
    assert "\\max\\left(0, r - 1\\right)" in md and "\\frac{r - 1}{1}" not in md
