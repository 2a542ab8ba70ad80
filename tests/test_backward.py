"""The backward pass against PyTorch's autograd, in float64 at 1e-10.

The oracle is PyTorch itself: the forward written with `scaled_dot_product_attention` (math
backend, float64) or `nn.MultiheadAttention`, differentiated by `torch.autograd.grad`, and
checked by `torch.autograd.gradcheck` (finite differences) so that the oracle is right too.
Symbolic and exact traces agree with the numeric one when numbers are substituted.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings, strategies as st

import attntrace
from attntrace.algebra.substitute import substitute
from attntrace.model.errors import BadInput

from mathcheck import in_ci  # noqa: E402

# under CI=true a missing torch fails the file instead of skipping it
torch = __import__("torch") if in_ci() else pytest.importorskip("torch")


def _t(a, grad=True):
    return torch.tensor(np.asarray(a, dtype=np.float64), dtype=torch.float64, requires_grad=grad)


def torch_attention(X, W, h, keep=None, Xkv=None, W_O=None, b=None, b_O=None, scale=None):
    """The forward in PyTorch: full-width projections, h heads of SDPA, concatenation, W_O."""
    import torch.nn.functional as F

    b = b or {}
    xkv = X if Xkv is None else Xkv
    q = X @ W["Q"] + (b["Q"] if "Q" in b else 0)
    k = xkv @ W["K"] + (b["K"] if "K" in b else 0)
    v = xkv @ W["V"] + (b["V"] if "V" in b else 0)
    n, m = q.shape[0], k.shape[0]
    split = lambda t: t.reshape(t.shape[0], h, -1).transpose(0, 1)  # noqa: E731 - (h, n, d)
    mask = None if keep is None else torch.from_numpy(np.asarray(keep, dtype=bool))
    z = F.scaled_dot_product_attention(split(q)[None], split(k)[None], split(v)[None], attn_mask=mask, scale=scale)[0]
    z = z.transpose(0, 1).reshape(n, -1)
    if W_O is None:
        return z
    return z @ W_O + (b_O if b_O is not None else 0)


@st.composite
def problems(draw):
    h = draw(st.integers(1, 3))
    n = draw(st.integers(1, 4))
    cross = draw(st.booleans())
    m = draw(st.integers(1, 4)) if cross else n
    d = draw(st.integers(1, 4))
    dk = draw(st.integers(1, 3))
    dv = draw(st.integers(1, 3))
    biases = draw(st.sets(st.sampled_from(["Q", "K", "V", "O"])))
    w_o = draw(st.booleans())
    mask = draw(st.sampled_from([None, "causal", "random"]))
    scale = draw(st.sampled_from([True, False, 0.7]))
    loss = draw(st.sampled_from(["dO", "sum_squares", "sum"]))
    seed = draw(st.integers(0, 2**32 - 1))
    return dict(h=h, n=n, m=m, cross=cross, d=d, dk=dk, dv=dv, biases=biases, w_o=w_o, mask=mask, scale=scale, loss=loss, seed=seed)


def _build(p):
    rng = np.random.default_rng(p["seed"])
    h, n, m, d, dk, dv = p["h"], p["n"], p["m"], p["d"], p["dk"], p["dv"]
    spec = {"X": rng.normal(size=(n, d)), "W_Q": rng.normal(size=(d, h * dk)), "W_K": rng.normal(size=(d, h * dk)),
            "W_V": rng.normal(size=(d, h * dv)), "num_heads": h, "scale": p["scale"]}
    if p["cross"]:
        spec["X_kv"] = rng.normal(size=(m, d))
    for w in "QKV":
        if w in p["biases"]:
            spec[f"b_{w}"] = rng.normal(size=(1, (dv if w == "V" else dk) * h))
    out_width = h * dv
    if p["w_o"]:
        spec["W_O"] = rng.normal(size=(h * dv, d))
        out_width = d
        if "O" in p["biases"]:
            spec["b_O"] = rng.normal(size=(1, d))
    keep = None
    if p["mask"] == "causal":
        spec["mask"] = "causal"
        keep = np.tril(np.ones((n, m), dtype=bool))
        if not keep.any(axis=1).all():
            keep = None
            del spec["mask"]
    elif p["mask"] == "random":
        keep = rng.random((n, m)) < 0.6
        keep[np.arange(n), rng.integers(0, m, size=n)] = True
        spec["mask"] = keep.astype(int).tolist()
    if p["loss"] == "dO":
        d_o = rng.normal(size=(n, out_width))
        spec["backward"] = {"dO": d_o.tolist()}
    else:
        spec["backward"] = {"loss": p["loss"]}
    return spec, keep


def _torch_grads(spec, keep, h):
    names = ["X", "W_Q", "W_K", "W_V"] + [k for k in ("X_kv", "b_Q", "b_K", "b_V", "W_O", "b_O") if k in spec]
    ts = {k: _t(spec[k]) for k in names}
    scale = spec["scale"]
    sdpa_scale = None if scale is True else (1.0 if scale is False else 1.0 / scale)
    out = torch_attention(ts["X"], {w: ts[f"W_{w}"] for w in "QKV"}, h, keep, ts.get("X_kv"), ts.get("W_O"),
                          {w: ts[f"b_{w}"] for w in "QKV" if f"b_{w}" in ts}, ts.get("b_O"), sdpa_scale)
    b = spec["backward"]
    if "dO" in b:
        grad_out = torch.tensor(b["dO"], dtype=torch.float64)
    elif b["loss"] == "sum":
        grad_out = torch.ones_like(out)
    else:
        grad_out = 2 * out.detach()
    grads = torch.autograd.grad(out, [ts[k] for k in names], grad_outputs=grad_out, allow_unused=True)
    return {k: (np.zeros(spec[k].shape if hasattr(spec[k], "shape") else np.shape(spec[k])) if g is None else g.numpy())
            for k, g in zip(names, grads)}, out.detach().numpy()


@settings(max_examples=60, deadline=None)
@given(problems())
def test_gradients_equal_torch_autograd(p):
    spec, keep = _build(p)
    trace = attntrace.run(spec)
    want, out = _torch_grads(spec, keep, p["h"])
    last = "output" if p["w_o"] else ("concat" if p["h"] > 1 else "Z")
    np.testing.assert_allclose(trace.step(last).value, out, atol=1e-10, rtol=0)
    for name, g in want.items():
        step = f"d{name}"
        if name == "X_kv":
            step = "dX_kv"
        np.testing.assert_allclose(trace.step(step).value, g, atol=1e-10, rtol=1e-10, err_msg=step)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 2), st.booleans(), st.integers(0, 2**32 - 1))
def test_gradients_equal_nn_multihead_attention(h, n, dk, causal, seed):
    """param.grad of nn.MultiheadAttention is (out, in): attntrace's dW_Q transposed."""
    rng = np.random.default_rng(seed)
    d = h * dk
    mha = torch.nn.MultiheadAttention(d, h, batch_first=True, dtype=torch.float64)
    x = torch.tensor(rng.normal(size=(1, n, d)), requires_grad=True)
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1) if causal else None  # True = not allowed
    out, _ = mha(x, x, x, attn_mask=mask, need_weights=False)
    d_o = rng.normal(size=(n, d))
    out.backward(torch.tensor(d_o[None]))
    w = mha.in_proj_weight.detach().numpy()
    bias = mha.in_proj_bias.detach().numpy()
    spec = {"X": x.detach().numpy()[0], "W_Q": w[:d].T, "W_K": w[d:2 * d].T, "W_V": w[2 * d:].T,
            "b_Q": bias[None, :d], "b_K": bias[None, d:2 * d], "b_V": bias[None, 2 * d:],
            "W_O": mha.out_proj.weight.detach().numpy().T, "b_O": mha.out_proj.bias.detach().numpy()[None],
            "num_heads": h, "backward": {"dO": d_o.tolist()}}
    if causal:
        spec["mask"] = "causal"
    t = attntrace.run(spec)
    g = mha.in_proj_weight.grad.numpy()
    gb = mha.in_proj_bias.grad.numpy()
    for i, w_ in enumerate("QKV"):
        np.testing.assert_allclose(t.step(f"dW_{w_}").value.T, g[i * d:(i + 1) * d], atol=1e-10, rtol=1e-10)
        np.testing.assert_allclose(t.step(f"db_{w_}").value[0], gb[i * d:(i + 1) * d], atol=1e-10, rtol=1e-10)
    np.testing.assert_allclose(t.step("dW_O").value.T, mha.out_proj.weight.grad.numpy(), atol=1e-10, rtol=1e-10)
    np.testing.assert_allclose(t.step("db_O").value[0], mha.out_proj.bias.grad.numpy(), atol=1e-10, rtol=1e-10)
    np.testing.assert_allclose(t.step("dX").value, x.grad.numpy()[0], atol=1e-10, rtol=1e-10)


def test_the_oracle_passes_gradcheck():
    """torch.autograd.gradcheck (finite differences) on the oracle functions: SDPA with heads, a mask,
    biases and W_O, and nn.MultiheadAttention."""
    rng = np.random.default_rng(3)
    X, WQ, WK, WV, WO = (_t(rng.normal(size=s)) for s in [(3, 4), (4, 4), (4, 4), (4, 4), (4, 4)])
    bq = _t(rng.normal(size=(1, 4)))
    keep = np.array([[1, 0, 1], [1, 1, 0], [0, 1, 1]], dtype=bool)
    f = lambda x, a, b_, c, o, bias: torch_attention(x, {"Q": a, "K": b_, "V": c}, 2, keep, W_O=o, b={"Q": bias})  # noqa: E731
    assert torch.autograd.gradcheck(f, (X, WQ, WK, WV, WO, bq))
    mha = torch.nn.MultiheadAttention(4, 2, batch_first=True, dtype=torch.float64)
    mask = torch.triu(torch.ones(3, 3, dtype=torch.bool), 1)
    assert torch.autograd.gradcheck(lambda x: mha(x, x, x, attn_mask=mask, need_weights=False)[0], (X[None],))


def _values(nums, names):
    return {sp.Symbol(f"{names[k]}_{{{i + 1}{j + 1}}}"): arr[i, j] for k, arr in nums.items()
            for i in range(arr.shape[0]) for j in range(arr.shape[1])}


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 3), st.integers(1, 2), st.integers(1, 2), st.sampled_from([None, "causal"]), st.booleans(),
       st.sampled_from(["sum", "sum_squares", "dO"]), st.integers(0, 2**32 - 1))
def test_symbolic_and_exact_gradients_agree_with_numeric(n, d, h, mask, w_o, loss, seed):
    rng = np.random.default_rng(seed)
    shapes = {"X": (n, d), "W_Q": (d, h), "W_K": (d, h), "W_V": (d, h)}
    if w_o:
        shapes["W_O"] = (h, d)
    nums = {k: rng.integers(-3, 4, size=s) / 2 for k, s in shapes.items()}
    out_cols = d if w_o else h
    opts = {"num_heads": h, **({"mask": mask} if mask else {})}
    if loss == "dO":
        nums["dO"] = rng.integers(-3, 4, size=(n, out_cols)) / 2
        back = lambda m: {"dO": m}  # noqa: E731
    else:
        back = lambda m: {"loss": loss}  # noqa: E731
    numeric = attntrace.run({k: v for k, v in nums.items() if k != "dO"} | opts | {"backward": back(nums.get("dO"))})
    # the given gradient's entries go by the name of the output's gradient (one notation per trace)
    names = {"X": "x", "W_Q": "w^{Q}", "W_K": "w^{K}", "W_V": "w^{V}", "W_O": "w^{O}", "dO": "g^{O}" if w_o else "g^{Z}"}
    sym_spec = {k: {"shape": list(s)} for k, s in shapes.items()} | opts
    symbolic = attntrace.run(sym_spec | {"backward": back({"shape": [n, out_cols]})}, mode="symbolic")
    got = substitute(symbolic, _values(nums, names))
    assert [s.key for s in symbolic.steps] == [s.key for s in numeric.steps]
    for step in numeric.steps:
        np.testing.assert_allclose(got[step.key], step.value, atol=1e-10, rtol=0, err_msg=step.key)
    exact = attntrace.run({k: v for k, v in nums.items() if k != "dO"} | opts | {"backward": back(nums.get("dO"))}, mode="exact")
    for step in exact.steps:
        if step.id.startswith("d"):
            value = np.array(step.value.evalf(30).tolist(), dtype=float)
            np.testing.assert_allclose(value, numeric.step(step.id, step.head).value, atol=1e-10, rtol=0, err_msg=step.key)


def test_d2l_identity_keys_equal_values_gradient_is_covariance():
    """d2l: with keys = values, d z / d q = Cov_a(k) = sum_j a_j k_j k_j^T - z z^T (one query, scale 1),
    exactly. Row c of the Jacobian is the gradient dq for dO = e_c."""
    keys = [["1", "0"], ["0", "2"], ["1", "1"]]
    q = [["1/2", "-1"]]
    rows = []
    for c in range(2):
        d_o = [[1 if j == c else 0 for j in range(2)]]
        t = attntrace.run({"Q": q, "K": keys, "V": keys, "scale": False, "backward": {"dO": d_o}}, mode="exact")
        rows.append([t.step("dQ").value[0, j] for j in range(2)])
    jac = sp.Matrix(rows)
    a = t.step("weights").value
    k = sp.Matrix([[sp.Rational(x) for x in r] for r in keys])
    z = (a * k)
    cov = sum((a[0, j] * k[j, :].T * k[j, :] for j in range(3)), sp.zeros(2, 2)) - z.T * z
    assert sp.simplify(jac - cov) == sp.zeros(2, 2)
    assert (jac - jac.T).applyfunc(sp.simplify) == sp.zeros(2, 2)


def test_masked_entries_get_exactly_zero_gradient():
    t = attntrace.run({"Q": [[1, 2], [0, 1]], "K": [[1, 0], [2, 1]], "V": [[1, 2], [3, 4]], "mask": "causal", "backward": True})
    assert t.step("dscaled").value[0, 1] == 0.0 and t.step("dscores").value[0, 1] == 0.0
    e = attntrace.run({"Q": [[1, 2], [0, 1]], "K": [[1, 0], [2, 1]], "V": [[1, 2], [3, 4]], "mask": "causal", "backward": True},
                      mode="exact")
    assert e.step("dscaled").value[0, 1] == 0


def test_cli_flag_and_spec_keys(tmp_path):
    from attntrace.cli import main

    spec = tmp_path / "s.toml"
    spec.write_text('Q = [[1, 2]]\nK = [[1, 0], [0, 1]]\nV = [[1, 2], [3, 4]]\n')
    out = tmp_path / "o.json"
    assert main(["run", str(spec), "--backward", "--format", "json", "-o", str(out)]) == 0
    import json

    ids = [s["id"] for s in json.loads(out.read_text())["steps"]]
    assert ids[-6:] == ["dZ", "dV", "dweights", "dscaled", "dscores", "dQ"][-6:] or "dK" in ids
    assert ids[ids.index("dZ"):] == ["dZ", "dV", "dweights", "dscaled", "dscores", "dQ", "dK"]
    assert "dZ" not in [s.id for s in attntrace.run(str(spec)).steps]


@pytest.mark.parametrize("bad, message", [
    ({"loss": "mse"}, "backward loss must be"),
    ({"dO": [[1, 2]], "loss": "sum"}, "exactly one of dO"),
    ({"dX": [[1]]}, "unknown key 'dX' in backward"),
    ("yes", "backward must be true or a table"),
    ({"dO": [[1, 2, 3]]}, "dO has shape (1, 3) but the output Z"),
])
def test_bad_backward_is_one_line(bad, message):
    with pytest.raises(BadInput) as e:
        attntrace.run({"Q": [[1, 2]], "K": [[1, 0], [0, 1]], "V": [[1, 2], [3, 4]], "backward": bad})
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("mode", ["numeric", "exact", "symbolic", "shape"])
def test_backward_reports_render_in_every_format_and_language(mode):
    """Multi-head with W_O, b_O, biases, cross-attention and a mask: every backward step has its
    block, prose and shape line in md, tex and text, English and Chinese."""
    spec = {"X": [[1, 0], [0, 1]], "X_kv": [[1, 1], [0, 1], [1, 0]], "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 1], [0, 1]],
            "W_V": [[1, 0], [1, 1]], "b_Q": [[1, 0]], "num_heads": 2, "W_O": [[1, 0], [0, 1]], "b_O": [[0, 1]],
            "mask": [[1, 0, 1], [1, 1, 0]], "backward": True}
    t = attntrace.run(spec, mode=mode)
    ids = {s.id for s in t.steps}
    assert {"doutput", "dW_O", "db_O", "dconcat", "dZ", "dV", "dweights", "dscaled", "dscores", "dQ", "dK", "dW_Q", "dW_K",
            "dW_V", "db_Q", "dX", "dX_kv"} <= ids
    for fmt in ("md", "tex", "text"):
        for lang in ("en", "zh"):
            out = attntrace.render(t, format=fmt, lang=lang)
            assert ("Backward pass" if lang == "en" else "反向传播") in out or mode == "shape"


def test_backward_without_values_is_one_line():
    with pytest.raises(BadInput, match="backward needs the output: give V"):
        attntrace.run({"scores": [[1, 2], [3, 4]], "d_k": 2, "backward": True})


def test_json_names_the_rule_and_the_row_sums():
    spec = {"Q": [[1, 2]], "K": [[1, 0], [0, 1]], "V": [[1, 2], [3, 4]], "backward": {"dO": [[1, -1]]}}
    steps = {s["id"]: s for s in attntrace.run(spec).to_dict()["steps"]}
    assert steps["dZ"]["rule"] == "given" and steps["dV"]["rule"] == "product" and steps["dscores"]["rule"] == "scale"
    a, da = np.array(steps["weights"]["value"]), np.array(steps["dweights"]["value"])
    assert steps["dscaled"]["rowdot"] == pytest.approx((a * da).sum(axis=1).tolist(), abs=1e-15)
    exact = {s["id"]: s for s in attntrace.run(spec, mode="exact").to_dict()["steps"]}
    from attntrace.inputs.expr import parse_expr

    assert float(parse_expr(exact["dscaled"]["rowdot"][0], allow_symbols=False)) == pytest.approx(steps["dscaled"]["rowdot"][0], abs=1e-12)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_exact_mode_with_a_symbolic_do_renders(katex, lang):
    """backward-2x2-symbolic in exact mode: dO is a table of symbols, so the softmax backward's
    r_i has no float approximation; every format renders (it exited 3 on a float() of a symbol)."""
    from mathcheck import markdown_math_spans

    trace = attntrace.run("backward-2x2-symbolic", mode="exact")
    r = trace.step("dscaled").details["rowdot"]
    assert not all(getattr(x, "is_number", False) for x in r)
    for fmt in ("md", "tex", "text"):
        assert attntrace.render(trace, format=fmt, lang=lang)
    assert katex(markdown_math_spans(attntrace.render(trace, format="md", lang=lang))) == []


def test_exact_backward_on_4x4_with_two_heads_is_refused_before_tracing_with_its_estimate():
    """The backward pass is in the exact cost model (budget._backward_work): 4 x 4 with two
    heads (traced and rendered it took 91 s) is refused by the budget check, before any step
    is computed, in one line with its estimate; the 2 x 2 example still runs."""
    import time

    from attntrace.budget import check_budget
    from attntrace.tracer import load_problem

    rng = np.random.default_rng(5)
    spec = {k: rng.integers(-2, 3, (4, 4)).tolist() for k in ("X", "W_Q", "W_K", "W_V")} | {"num_heads": 2, "backward": True}
    problem = load_problem(spec, mode="exact")
    start = time.perf_counter()
    with pytest.raises(BadInput, match=r"^this exact trace is too large to finish in seconds \(about [\d,]+ units of work .*an estimated "
                                       r"\d+ s to \d+ (s|min)\); use --mode numeric or shape") as info:
        check_budget(problem)
    assert time.perf_counter() - start < 0.5 and "\n" not in str(info.value)
    check_budget(load_problem("examples/backward-2x2.toml", mode="exact"))
