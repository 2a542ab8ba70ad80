"""Grouped-query and multi-query attention (`num_kv_heads`), against PyTorch and Hugging Face.

Numeric traces are compared at 1e-10 with SDPA's `enable_gqa=True` (tests/oracles.py `sdpa`,
`attention_weights`: SDPA's repeat_interleave grouping) and with a tiny random Hugging Face
Llama layer (GQA through its repeat_kv); exact and symbolic traces agree with numeric ones by
substitution, shape mode gives the same shapes, and bad `num_kv_heads` are one-line errors.
"""

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings, strategies as st

import attntrace
from attntrace.algebra.substitute import substitute
from attntrace.model.errors import AttntraceError, BadInput, Unsupported

import oracles  # noqa: E402 - tests/oracles.py, imports torch only inside its functions
from mathcheck import require_modules  # noqa: E402


def _heads(a, h):
    """(n, h*d) -> (h, n, d): the per-head blocks of a full-width matrix, head 1 first."""
    return a.reshape(a.shape[0], h, -1).transpose(1, 0, 2)


@st.composite
def gqa_problems(draw, kv=3, group=3, n=5, d=5, dk=3, dv=3):
    """(h, h_kv, n, d_model, d_k, d_v, biases?, mask, seed): h_kv key/value heads of `group` query heads each."""
    h_kv, g = draw(st.integers(1, kv)), draw(st.integers(1, group))
    sizes = [draw(st.integers(1, top)) for top in (n, d, dk, dv)]
    return (h_kv * g, h_kv, *sizes, draw(st.booleans()), draw(st.sampled_from([None, "causal"])), draw(st.integers(0, 2**32 - 1)))


def _spec(h, h_kv, n, d, dk, dv, bias, seed, ints=False):
    rng = np.random.default_rng(seed)
    draw = (lambda *s: rng.integers(-4, 5, size=s) / 2) if ints else (lambda *s: rng.normal(size=s))
    spec = {"X": draw(n, d), "W_Q": draw(d, h * dk), "W_K": draw(d, h_kv * dk), "W_V": draw(d, h_kv * dv),
            "num_heads": h, "num_kv_heads": h_kv}
    if bias:
        spec.update(b_Q=draw(1, h * dk), b_K=draw(1, h_kv * dk), b_V=draw(1, h_kv * dv))
    return spec


@settings(max_examples=40, deadline=None)
@given(gqa_problems())
def test_numeric_gqa_equals_sdpa_enable_gqa(problem):
    h, h_kv, n, d, dk, dv, bias, mask, seed = problem
    spec = _spec(h, h_kv, n, d, dk, dv, bias, seed)
    t = attntrace.run({**spec, **({"mask": mask} if mask else {})})
    X = spec["X"]
    q = _heads(X @ spec["W_Q"] + spec.get("b_Q", 0), h)  # (h, n, dk)
    k = _heads(X @ spec["W_K"] + spec.get("b_K", 0), h_kv)  # (h_kv, n, dk)
    v = _heads(X @ spec["W_V"] + spec.get("b_V", 0), h_kv)  # (h_kv, n, dv)
    causal = mask == "causal"
    weights = oracles.attention_weights(q, k, is_causal=causal, enable_gqa=True)  # (h, n, n)
    out = oracles.sdpa(q, k, v, is_causal=causal, enable_gqa=True)  # (h, n, dv)
    multi = h > 1
    for i in range(1, h + 1):
        hd = i if multi else None
        np.testing.assert_allclose(t.step("Q", hd).value, q[i - 1], atol=1e-10, rtol=0)
        np.testing.assert_allclose(t.step("weights", hd).value, weights[i - 1], atol=1e-10, rtol=0)
        np.testing.assert_allclose(t.step("Z", hd).value, out[i - 1], atol=1e-10, rtol=0)
    if multi:
        np.testing.assert_allclose(t.step("concat").value, out.transpose(1, 0, 2).reshape(n, -1), atol=1e-10, rtol=0)
        # K, V exist once per key/value head, and each query head names the one it reads
        assert [s.head for s in t.steps if s.id == "K"] == list(range(1, h_kv + 1))
        for i in range(1, h + 1):
            j = (i - 1) // (h // h_kv) + 1
            np.testing.assert_allclose(t.step("K", j).value, k[j - 1], atol=1e-10, rtol=0)
            if h_kv < h:
                assert t.step("scores", i).inputs == ("Q", f"K@{j}")
                assert t.step("Z", i).inputs == ("weights", f"V@{j}")


def test_mqa_one_kv_head_for_every_query_head():
    spec = _spec(4, 1, 3, 4, 2, 2, True, 7)
    t = attntrace.run(spec)
    X = spec["X"]
    q, k, v = (_heads(X @ spec[w] + spec[b], c) for w, b, c in (("W_Q", "b_Q", 4), ("W_K", "b_K", 1), ("W_V", "b_V", 1)))
    out = oracles.sdpa(q, k, v, enable_gqa=True)
    assert [s.key for s in t.steps if s.id in ("K", "V")] == ["K@1", "V@1"]
    assert t.step("K", 1).details["query_heads"] == (1, 2, 3, 4)
    for i in range(1, 5):
        assert t.step("scores", i).inputs == ("Q", "K@1")
        np.testing.assert_allclose(t.step("Z", i).value, out[i - 1], atol=1e-10, rtol=0)
    assert t.to_dict()["steps"][1]["query_heads"] == [1, 2, 3, 4]
    # the given matrices list each key/value head's weights once
    assert [(o.name, o.head) for o in t.operands].count(("W_K", 1)) == 1


def test_from_qkv_enable_gqa_equals_sdpa():
    require_modules("torch")
    import torch
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 6, 4, 3, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, 5, 3, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, 5, 2, generator=g, dtype=torch.float64)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)[0].numpy()  # (6, 4, 2)
    t = attntrace.from_qkv(q, k, v, enable_gqa=True)
    for i in range(1, 7):
        np.testing.assert_allclose(t.step("Z", i).value, ref[i - 1], atol=1e-10, rtol=0)
        assert t.step("scores", i).inputs == ("Q", f"K@{(i - 1) // 3 + 1}")
    np.testing.assert_allclose(t.step("concat").value, ref.transpose(1, 0, 2).reshape(4, -1), atol=1e-10, rtol=0)
    causal = attntrace.from_qkv(q[:, :, :, :], k[:, :, :4], v[:, :, :4], enable_gqa=True, is_causal=True)
    ref_c = oracles.sdpa(q[0].numpy(), k[0, :, :4].numpy(), v[0, :, :4].numpy(), is_causal=True, enable_gqa=True)
    for i in range(1, 7):
        np.testing.assert_allclose(causal.step("Z", i).value, ref_c[i - 1], atol=1e-10, rtol=0)
    with pytest.raises(Unsupported, match="enable_gqa=True"):
        attntrace.from_qkv(q, k, v)
    with pytest.raises(BadInput, match="not a multiple"):
        attntrace.from_qkv(q[:, :5], k, v, enable_gqa=True)


@pytest.mark.parametrize("seed", [0, 1])
def test_llama_layer_weights_and_output(seed):
    """A tiny random Hugging Face Llama layer (4 query heads, 2 KV heads, causal): q and k
    after its RoPE, v, and W_O, traced as grouped-query attention."""
    require_modules("transformers")
    ref = oracles.llama_attention_layer(seed)
    h, h_kv = ref["num_heads"], ref["num_kv_heads"]
    full = lambda a: a.transpose(1, 0, 2).reshape(a.shape[1], -1)  # noqa: E731
    t = attntrace.run({"Q": full(ref["q_rope"]), "K": full(ref["k_rope"]), "V": full(ref["v"]), "W_O": ref["W_O"],
                       "num_heads": h, "num_kv_heads": h_kv, "mask": "causal"})
    assert ref["keep"].tolist() == np.tril(np.ones_like(ref["keep"])).tolist()
    for i in range(1, h + 1):
        np.testing.assert_allclose(t.step("weights", i).value, ref["weights"][i - 1], atol=1e-10, rtol=0)
    np.testing.assert_allclose(t.step("output").value, ref["output"], atol=1e-10, rtol=0)


def test_llama_layer_from_x_with_rope():
    """The same layer from its input x and W_Q, W_K, W_V, W_O, when the RoPE kind is there."""
    require_modules("transformers")
    ref = oracles.llama_attention_layer(2)
    spec = {"X": ref["x"], "W_Q": ref["W_Q"], "W_K": ref["W_K"], "W_V": ref["W_V"], "W_O": ref["W_O"],
            "num_heads": ref["num_heads"], "num_kv_heads": ref["num_kv_heads"], "mask": "causal",
            "rope": {"base": 10000, "layout": "half"}}
    t = attntrace.run(spec)  # RoPE is a kind: a refusal here is a failure, not a skip
    for i in range(1, ref["num_heads"] + 1):
        np.testing.assert_allclose(t.step("weights", i).value, ref["weights"][i - 1], atol=1e-10, rtol=0)
    np.testing.assert_allclose(t.step("output").value, ref["output"], atol=1e-10, rtol=0)


@settings(max_examples=15, deadline=None)
@given(gqa_problems(kv=2, group=2, n=3, d=3, dk=2, dv=2))
def test_symbolic_substituted_and_exact_equal_numeric_and_shapes(problem):
    h, h_kv, n, d, dk, dv, bias, _, seed = problem
    spec = _spec(h, h_kv, n, d, dk, dv, bias, seed, ints=True)
    numeric = attntrace.run(spec)
    mats = [k for k in spec if k not in ("num_heads", "num_kv_heads")]
    symbolic = attntrace.run({**{k: {"shape": list(spec[k].shape)} for k in mats}, "num_heads": h, "num_kv_heads": h_kv},
                             mode="symbolic")
    names = {"X": "x", "W_Q": "w^{Q}", "W_K": "w^{K}", "W_V": "w^{V}", "b_Q": "b^{Q}", "b_K": "b^{K}", "b_V": "b^{V}"}
    values = {}
    for k in mats:
        arr = spec[k]
        wide = max(arr.shape) >= 10
        for i in range(arr.shape[0]):
            for j in range(arr.shape[1]):
                sub = f"{i + 1},{j + 1}" if wide else f"{i + 1}{j + 1}"
                values[sp.Symbol(f"{names[k]}_{{{sub}}}")] = arr[i, j]
    got = substitute(symbolic, values)
    exact = attntrace.run({**{k: [[str(sp.Rational(x)) for x in row] for row in spec[k].tolist()] for k in mats},
                           "num_heads": h, "num_kv_heads": h_kv}, mode="exact")
    shape = attntrace.run(spec, mode="shape")
    keys = [s.key for s in numeric.steps]
    assert [s.key for s in symbolic.steps] == [s.key for s in exact.steps] == [s.key for s in shape.steps] == keys
    for step in numeric.steps:
        np.testing.assert_allclose(got[step.key], step.value, atol=1e-10, rtol=0, err_msg=step.key)
        ex = exact.step(step.id, step.head).value
        approx = np.array([[float(sp.N(e, 20)) for e in ex.row(i)] for i in range(ex.rows)])
        np.testing.assert_allclose(approx, step.value, atol=1e-10, rtol=0, err_msg=step.key)
        assert shape.step(step.id, step.head).shape == step.shape == ex.shape
        assert symbolic.step(step.id, step.head).inputs == exact.step(step.id, step.head).inputs == step.inputs


@pytest.mark.parametrize("spec, message", [
    ({"num_heads": 4, "num_kv_heads": 3}, "num_kv_heads = 3 does not divide num_heads = 4"),
    ({"num_heads": 4, "num_kv_heads": 0}, "num_kv_heads must be a positive integer, not 0"),
    ({"num_heads": 4, "num_kv_heads": "2"}, "num_kv_heads must be a positive integer"),
    ({"num_heads": 2, "num_kv_heads": 4}, "num_kv_heads = 4 does not divide num_heads = 2"),
    ({"num_heads": 4, "num_kv_heads": 2, "W_K": np.ones((3, 8))}, "W_K (3, 8) has 8 columns but 2 key head(s) of d_k = 2"),
    ({"num_heads": 4, "num_kv_heads": 2, "W_V": np.ones((3, 5))}, "num_kv_heads = 2 does not divide the width of W_V (3, 5)"),
])
def test_bad_num_kv_heads_is_one_line(spec, message):
    base = {"X": np.ones((2, 3)), "W_Q": np.ones((3, 8)), "W_K": np.ones((3, 4)), "W_V": np.ones((3, 4))}
    with pytest.raises(BadInput) as err:
        attntrace.run({**base, **spec})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_num_kv_heads_needs_full_width_matrices():
    with pytest.raises(BadInput, match="num_kv_heads splits full-width"):
        attntrace.run({"X": [[1, 2]], "heads": [{"W_Q": [[1], [0]], "W_K": [[1], [0]], "W_V": [[1], [0]]}] * 2,
                       "num_kv_heads": 1, "num_heads": 2})


def test_bad_num_kv_heads_on_the_command_line(tmp_path):
    import subprocess
    import sys

    spec = tmp_path / "gqa.toml"
    spec.write_text("X = [[1, 2]]\nW_Q = [[1, 0], [0, 1]]\nW_K = [[1, 0], [0, 1]]\nW_V = [[1, 0], [0, 1]]\n"
                    "num_heads = 2\nnum_kv_heads = 3\n")
    proc = subprocess.run([sys.executable, "-m", "attntrace", "run", str(spec)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "num_kv_heads = 3" in proc.stderr
    assert issubclass(BadInput, AttntraceError)


@pytest.mark.parametrize("lang, says", [("en", "query heads 3–4 use"), ("zh", "查询头 3–4 使用")])
def test_reports_say_which_query_heads_share_which_kv_head(lang, says):
    t = attntrace.run("examples/gqa-4-query-2-kv.toml")
    for fmt in ("md", "tex", "text"):
        text = attntrace.render(t, format=fmt, lang=lang)
        assert says in text
        # K^(2) is shown with head 3, the first query head that reads it, with its formula, in the one
        # paragraph of head 3's results (not a paragraph "Keys: As in head 1." of its own)
        heads = [text.index(h) for h in (("Head 3", "Head 4") if lang == "en" else ("第 3 个头", "第 4 个头"))]
        name = {"md": "{K^{(2)}} = X W_K^{(2)}", "tex": "{K^{(2)}} = X W_K^{(2)}", "text": "K(2) (3 x 2) = X W_K(2)"}[fmt]
        assert heads[0] < text.index(name, heads[0]) < heads[1]
        head3 = text[heads[0]:heads[1]]
        assert ("As in head" not in head3 and "Keys" not in head3) if lang == "en" else ("键矩阵" not in head3)
    shapes = attntrace.render(attntrace.run("examples/gqa-4-query-2-kv.toml", mode="shape"), format="text", lang=lang)
    # a query head is eta, a key/value head g (i and j number rows and columns)
    assert "K(g) = X W_K(g)" in shapes and "S(eta) = Q(eta) K(g)^T" in shapes and "Z(eta) = A(eta) V(g)" in shapes
    assert "W_K(g): 2 x 2" in shapes and "floor((eta - 1) / 2) + 1" in shapes


def test_mqa_report_names_one_shared_head():
    spec = _spec(3, 1, 2, 2, 1, 1, False, 1, ints=True)
    text = attntrace.render(attntrace.run(spec), format="text")
    assert "Multi-query attention: all 3 query heads share one key/value head, K(1) and V(1)" in text
