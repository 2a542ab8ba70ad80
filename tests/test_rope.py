"""RoPE (steps Q_rope, K_rope) against real implementations, across modes, and in reports.

Oracles (tests/oracles.py): Hugging Face Llama's ``apply_rotary_pos_emb`` (rotate_half, the
"half" layout) with cos/sin by LlamaRotaryEmbedding's formula in float64, and Meta's
complex-number code (``torch.polar`` / ``view_as_complex``, the "interleaved" layout); the
attention weights after RoPE from torch SDPA's math. All at 1e-10 in float64. Symbolic and
exact mode agree with numeric by substitution; exact mode shows that a score depends on the
position difference only: shifting every position leaves the exact scores unchanged.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings, strategies as st

import attntrace
from mathcheck import markdown_math_spans, require_modules
from modesagree import assert_modes_agree

TOL = 1e-10
LAYOUTS = ("half", "interleaved")


def _oracles():
    require_modules("torch", "transformers")
    import oracles

    return oracles


def _rotate(layout, x, positions, base):
    O = _oracles()
    f = O.rope_half_hf if layout == "half" else O.rope_interleaved_complex
    return f(x, positions, float(base))


def _heads(t, step_id, h):
    return np.stack([t.step(step_id, i if h > 1 else None).value for i in range(1, h + 1)])


# ------------------------------------------------------------------ numeric against the oracles

@settings(max_examples=25, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), n=st.integers(1, 6), half=st.integers(1, 4), h=st.integers(1, 3),
       base=st.sampled_from([10000, 500, 2.5]), start=st.integers(0, 50), seed=st.integers(0, 2**32 - 1))
def test_rotation_matches_hugging_face_and_meta(layout, n, half, h, base, start, seed):
    rng = np.random.default_rng(seed)
    d = 2 * half
    X, Wq, Wk, Wv = (rng.standard_normal(s) for s in ((n, 5), (5, h * d), (5, h * d), (5, h * d)))
    positions = sorted(rng.choice(np.arange(start, start + 3 * n), size=n, replace=False).tolist())
    t = attntrace.run({"X": X, "W_Q": Wq, "W_K": Wk, "W_V": Wv, "num_heads": h,
                       "rope": {"layout": layout, "base": base, "positions": positions}})
    for which in ("Q", "K"):
        want = _rotate(layout, _heads(t, which, h), positions, base)
        np.testing.assert_allclose(_heads(t, f"{which}_rope", h), want, atol=TOL, rtol=0)
    # V is never rotated, and the scores read the rotated matrices
    assert not any(s.id == "V_rope" for s in t.steps)
    scores = t.step("scores", 1 if h > 1 else None)
    assert scores.inputs == ("Q_rope", "K_rope")  # read per head: each head's own rotated Q and K


@pytest.mark.parametrize("layout", LAYOUTS)
def test_weights_and_output_match_sdpa_after_the_oracle_rotation(layout):
    O = _oracles()
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((5, 6)), rng.standard_normal((5, 6)), rng.standard_normal((5, 3))
    pos = [0, 1, 2, 3, 4]
    t = attntrace.run({"Q": q, "K": k, "V": v, "mask": "causal", "rope": {"layout": layout}})
    qr, kr = _rotate(layout, q[None], pos, 10000), _rotate(layout, k[None], pos, 10000)
    w = O.attention_weights(qr, kr, is_causal=True)[0]
    np.testing.assert_allclose(t.step("weights").value, w, atol=TOL, rtol=0)
    np.testing.assert_allclose(t.step("Z").value, O.sdpa(qr, kr, v[None], is_causal=True)[0], atol=TOL, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_grouped_query_attention_turns_each_key_head_once(layout):
    """4 query heads, 2 key/value heads: K_rope@1, K_rope@2 once each, read by their groups;
    the weights equal SDPA's with enable_gqa after the oracle's rotation."""
    O = _oracles()
    rng = np.random.default_rng(11)
    n, d = 4, 4
    X, Wq, Wk, Wv = rng.standard_normal((n, 6)), rng.standard_normal((6, 4 * d)), rng.standard_normal((6, 2 * d)), rng.standard_normal((6, 2 * d))
    t = attntrace.run({"X": X, "W_Q": Wq, "W_K": Wk, "W_V": Wv, "num_heads": 4, "num_kv_heads": 2, "mask": "causal",
                       "rope": {"layout": layout, "positions": [3, 4, 5, 6]}})
    assert [s.key for s in t.steps if s.id == "K_rope"] == ["K_rope@1", "K_rope@2"]
    assert [t.step("scores", i).inputs[1] for i in range(1, 5)] == ["K_rope@1", "K_rope@1", "K_rope@2", "K_rope@2"]
    q = (X @ Wq).reshape(n, 4, d).transpose(1, 0, 2)
    k = (X @ Wk).reshape(n, 2, d).transpose(1, 0, 2)
    qr, kr = _rotate(layout, q, [3, 4, 5, 6], 10000), _rotate(layout, k, [3, 4, 5, 6], 10000)
    np.testing.assert_allclose(_heads(t, "K_rope", 2), kr, atol=TOL, rtol=0)
    w = O.attention_weights(qr, kr, is_causal=True, enable_gqa=True)
    np.testing.assert_allclose(_heads(t, "weights", 4), w, atol=TOL, rtol=0)


def test_the_two_layouts_differ_by_a_column_permutation():
    """half pairs (i, i + d/2), interleaved (2i-1, 2i): permuting the columns maps one onto the other."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((4, 6))
    perm = [0, 3, 1, 4, 2, 5]  # interleaved column order of the half layout's pairs
    half = attntrace.run({"Q": q, "K": q, "V": q, "rope": {"layout": "half"}}).step("Q_rope").value
    inter = attntrace.run({"Q": q[:, perm], "K": q, "V": q, "rope": {"layout": "interleaved"}}).step("Q_rope").value
    np.testing.assert_allclose(inter, half[:, perm], atol=TOL, rtol=0)


def test_cross_attention_keys_have_their_own_positions():
    rng = np.random.default_rng(5)
    X, Y = rng.standard_normal((2, 3)), rng.standard_normal((4, 3))
    W = [rng.standard_normal((3, 4)) for _ in range(3)]
    t = attntrace.run({"X": X, "X_kv": Y, "W_Q": W[0], "W_K": W[1], "W_V": W[2],
                       "rope": {"positions": [4, 5], "kv_positions": [0, 1, 2, 3]}})
    np.testing.assert_allclose(t.step("Q_rope").value, _rotate("half", (X @ W[0])[None], [4, 5], 10000)[0], atol=TOL, rtol=0)
    np.testing.assert_allclose(t.step("K_rope").value, _rotate("half", (Y @ W[1])[None], [0, 1, 2, 3], 10000)[0], atol=TOL, rtol=0)
    assert t.step("K_rope").details["positions"] == (0, 1, 2, 3)


def test_positions_default_to_0_and_position_0_is_no_rotation():
    q = np.arange(8.0).reshape(2, 4)
    t = attntrace.run({"Q": q, "K": q, "V": q, "rope": True})
    assert t.step("Q_rope").details["positions"] == (0, 1)
    np.testing.assert_array_equal(t.step("Q_rope").value[0], q[0])


# ------------------------------------------------------------------ modes agree

def _spec(n, half, layout, positions, nums=None):
    d = 2 * half
    if nums is None:
        mats = {k: {"shape": [n if k == "X" else 3, d if k != "X" else 3]} for k in ("X", "W_Q", "W_K", "W_V")}
    else:
        mats = nums
    return {**mats, "rope": {"layout": layout, "positions": positions}, "mask": "causal"}


@settings(max_examples=12, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), n=st.integers(1, 3), half=st.integers(1, 2), shift=st.integers(0, 5),
       seed=st.integers(0, 2**32 - 1))
def test_symbolic_and_exact_agree_with_numeric(layout, n, half, shift, seed):
    rng = np.random.default_rng(seed)
    d = 2 * half
    nums = {"X": rng.integers(-3, 4, (n, 3)) / 2, "W_Q": rng.integers(-2, 3, (3, d)), "W_K": rng.integers(-2, 3, (3, d)),
            "W_V": rng.integers(-2, 3, (3, d))}
    positions = [shift + i for i in range(n)]
    numeric = attntrace.run(_spec(n, half, layout, positions, nums))
    symbolic = attntrace.run(_spec(n, half, layout, positions), mode="symbolic")
    names = {"X": "x", "W_Q": "w^{Q}", "W_K": "w^{K}", "W_V": "w^{V}"}
    values = {sp.Symbol(f"{names[k]}_{{{i + 1}{j + 1}}}"): a[i, j] for k, a in nums.items() for i in range(a.shape[0]) for j in range(a.shape[1])}
    exact = attntrace.run(_spec(n, half, layout, positions, {k: [[str(sp.Rational(str(x))) for x in r] for r in v.tolist()] for k, v in nums.items()}),
                          mode="exact")
    shape = attntrace.run(_spec(n, half, layout, positions, nums), mode="shape")
    assert any(s.id == "Q_rope" for s in numeric.steps)
    assert_modes_agree(numeric, symbolic=symbolic, values=values, exact=exact, shape=shape, atol=TOL)


def test_symbolic_names_each_rotated_entry_one_level_deep():
    t = attntrace.run({"Q": {"shape": [2, 4]}, "K": {"shape": [2, 4]}, "V": {"shape": [2, 1]}, "rope": True}, mode="symbolic")
    s = t.step("Q_rope")
    assert str(s.value[1, 0]) == "\\tilde{q}_{21}"
    e = s.expansion[1, 0]  # q_21 cos(1) - q_23 sin(1): the pair (1, 3) of row 2, position 1
    assert {str(x) for x in e.free_symbols} == {"q_{21}", "q_{23}"}
    assert sp.simplify(e - (sp.Symbol("q_{21}") * sp.cos(1) - sp.Symbol("q_{23}") * sp.sin(1))) == 0
    assert {str(x) for x in t.step("scores").expansion[1, 0].free_symbols} == {f"\\tilde{{{c}}}_{{{r}{j}}}" for c, r in (("q", 2), ("k", 1)) for j in range(1, 5)}


@settings(max_examples=10, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), shift=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_exact_scores_depend_on_the_position_difference_only(layout, shift, seed):
    """Shifting every position by a constant leaves the exact scores unchanged, entry by entry as
    expressions (they are written over the angle differences) and by value at 30 digits."""
    rng = np.random.default_rng(seed)
    q, k = rng.integers(-3, 4, (3, 4)).tolist(), rng.integers(-3, 4, (3, 4)).tolist()
    spec = {"Q": q, "K": k, "V": [[1], [2], [3]], "scale": False}
    base = attntrace.run({**spec, "rope": {"layout": layout, "positions": [0, 1, 2]}}, mode="exact").step("scores").value
    moved = attntrace.run({**spec, "rope": {"layout": layout, "positions": [shift, shift + 1, shift + 2]}}, mode="exact").step("scores").value
    assert base == moved
    for a, b in zip(base, moved):
        assert abs(sp.N(a - b, 30)) < 1e-25
    assert any(e.has(sp.cos) for e in base)  # the rotation is really there


def test_exact_mode_keeps_cos_and_sin_symbolic_and_is_quick():
    t0 = time.perf_counter()
    t = attntrace.run("rope-4-tokens-half", mode="exact")
    elapsed = time.perf_counter() - t0
    q = t.step("Q_rope").value
    assert q[1, 0] == -sp.sin(1) and q[1, 1] == -sp.sin(sp.Rational(1, 100)) + 2 * sp.cos(sp.Rational(1, 100))
    assert elapsed < 10, elapsed  # measured 1.5 s on the 2-core test machine


# ------------------------------------------------------------------ bad settings

BASE = {"Q": [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]], "K": [[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 1, 1]], "V": [[1], [0], [2]]}


@pytest.mark.parametrize("extra, message", [
    ({"rope": {"layout": "paired"}}, r"^rope.layout must be \"half\""),
    ({"rope": {"base": -10000}}, r"^rope.base must be a positive number, not -10000$"),
    ({"rope": {"base": 0}}, r"^rope.base must be a positive number"),
    ({"rope": {"positions": [0, 1]}}, r"^rope.positions lists 2 positions but there are 3 queries"),
    ({"rope": {"positions": [0, -1, 2]}}, r"^rope.positions must list integer positions from 0"),
    ({"rope": {"positions": [0, 1.5, 2]}}, r"^rope.positions must list integer positions"),
    ({"rope": {"kv_positions": [0, 1]}}, r"^rope.kv_positions lists 2 positions but there are 3 keys"),
    ({"rope": {"theta": 3}}, r"^unknown key 'theta' in rope"),
    ({"rope": "half"}, r"^rope must be a table"),
    ({"rope": True, "Q": [[1, 0, 1]] * 3, "K": [[1, 0, 1]] * 3}, r"^rope rotates pairs of columns, but the head width d_k = 3 is odd$"),
])
def test_bad_rope_settings_are_one_line_errors(extra, message):
    with pytest.raises(attntrace.BadInput, match=message) as info:
        attntrace.run({**BASE, **extra})
    assert "\n" not in str(info.value)


def test_rope_needs_queries_and_keys():
    with pytest.raises(attntrace.BadInput, match="rope rotates the queries and keys"):
        attntrace.run({"scores": [[1, 2], [3, 4]], "rope": True})


def test_cli_refuses_an_odd_head_width_with_exit_status_2(tmp_path):
    spec = tmp_path / "bad.toml"
    spec.write_text('Q = [[1, 0, 1]]\nK = [[1, 0, 1]]\nV = [[1]]\nrope = {layout = "half"}\n')
    r = subprocess.run([sys.executable, "-m", "attntrace", "run", str(spec)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "d_k = 3 is odd" in r.stderr


# ------------------------------------------------------------------ reports

@pytest.mark.parametrize("mode", ["numeric", "exact", "symbolic", "shape"])
def test_rope_renders_everywhere_and_its_math_parses(mode, katex):
    spec = "rope-4-tokens-interleaved" if mode != "symbolic" else {
        "Q": {"shape": [2, 4]}, "K": {"shape": [2, 4]}, "V": {"shape": [2, 1]}, "rope": {"layout": "interleaved"}}
    t = attntrace.run(spec, mode=mode)
    for lang in ("en", "zh"):
        md = attntrace.render(t, format="md", lang=lang)
        assert katex(markdown_math_spans(md)) == []
        text = attntrace.render(t, format="text", lang=lang)
        assert "tilde" not in text and "\\" not in text.replace("\\n", "")
        assert attntrace.render(t, format="tex", lang=lang)
    if mode != "shape":
        assert "\\theta_r = 10000^{-2(r-1)/4}" in md  # pair r: i is the row (q_{ij}) and the imaginary unit
        assert "(1, 2),\\ (3, 4)" in attntrace.render(t, format="md")


def test_report_shows_the_rotation_of_a_pair_with_numbers():
    md = attntrace.render(attntrace.run("rope-4-tokens-half"), format="md")
    # row 2 (position 1), pair (1, 3): the 2x2 rotation by angle 1, cos 1 = 0.5403, sin 1 = 0.8415
    assert "\\begin{bmatrix}\\cos 1 & -\\sin 1 \\\\ \\sin 1 & \\cos 1\\end{bmatrix}" in md
    assert "0.5403" in md and "-0.8415" in md
    assert "= \\tilde{Q} \\tilde{K}^{\\top}" in md  # the scores name the rotated matrices
    zh = attntrace.render(attntrace.run("rope-4-tokens-half"), format="md", lang="zh")
    assert "旋转位置编码" in zh and "rotate\\_half" in zh


def test_json_names_the_layout_positions_and_pairs():
    from attntrace.rendering.export import trace_to_dict

    d = trace_to_dict(attntrace.run("rope-4-tokens-interleaved"))
    step = next(s for s in d["steps"] if s["id"] == "K_rope")
    assert step["rope"] == {"layout": "interleaved", "base": 10000, "positions": [0, 1, 2, 3], "pairs": [[1, 2], [3, 4]]}
    assert next(s for s in d["steps"] if s["id"] == "scores")["inputs"] == ["Q_rope", "K_rope"]
