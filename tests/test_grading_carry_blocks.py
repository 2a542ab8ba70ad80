"""Carried forward through the block's nonlinear steps: LayerNorm, RMSNorm, the FFN's products,
ReLU, GELU, SwiGLU, and the residuals after them.

Each student here is an independent NumPy computation (not attntrace's): they round a step to
a few decimals and go on from the rounded value, or make a mistake in one step and go on from
it. The checker must mark every step computed right from the student's own values `correct` or
`carried`, never `wrong`, and the one wrong step `wrong`. The right answer rounded at 2, 3 and
4 decimals (each step from the step before as the student wrote it) is never marked wrong,
over random blocks of every activation and norm.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import attntrace

ERF = np.vectorize(math.erf)


def _layer_norm(r, eps):
    c = r - r.mean(axis=1, keepdims=True)
    return c / np.sqrt((c * c).mean(axis=1, keepdims=True) + eps)


def _rms_norm(r, eps, gain):
    return r / np.sqrt((r * r).mean(axis=1, keepdims=True) + eps) * gain


def _act(h, name):
    if name == "relu":
        return np.maximum(h, 0)
    if name == "gelu":
        return 0.5 * h * (1 + ERF(h / math.sqrt(2)))
    if name == "gelu_tanh":
        return 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
    raise ValueError(name)


def _operand(trace, name):
    return np.asarray(next(o for o in trace.operands if o.name == name).value, dtype=float)


def _truth_key(trace, decimals):
    return {s.key: np.round(np.asarray(s.value, dtype=float), decimals) for s in trace.steps}


def _statuses(trace, answer):
    report = attntrace.check(trace, {k: np.asarray(v).tolist() for k, v in answer.items()})
    return {s.key: s.status for s in report.steps}


def post_ln_student(trace, start: dict, decimals: int, eps: float = 1e-5, act: str = "relu",
                    after_residual1=None) -> dict:
    """A post-LN student from residual1 on: each step rounded to `decimals`, the next from it.
    `start`: the attention part (rounded truth); `after_residual1`: changes their R first."""
    answer = dict(start)
    r1 = answer["residual1"]
    if after_residual1 is not None:
        r1 = np.round(after_residual1(r1), decimals)
        answer["residual1"] = r1
    n1 = np.round(_layer_norm(r1, eps), decimals)
    h = np.round(n1 @ _operand(trace, "W_1") + _operand(trace, "b_1"), decimals)
    g = np.round(_act(h, act), decimals)
    f = np.round(g @ _operand(trace, "W_2"), decimals)
    r2 = np.round(n1 + f, decimals)
    n2 = np.round(_layer_norm(r2, eps), decimals)
    answer.update(norm1=n1, ffn_hidden=h, ffn_act=g, ffn_out=f, residual2=r2, norm2=n2)
    return answer


@pytest.mark.parametrize("decimals", [2, 3, 4])
def test_encoder_block_rounded_answer_is_never_wrong(decimals):
    trace = attntrace.run("encoder-block-post-ln")
    start = _truth_key(trace, decimals)
    statuses = _statuses(trace, post_ln_student(trace, start, decimals))
    assert "wrong" not in statuses.values(), statuses


def test_norm_from_a_residual_rounded_to_2_decimals_is_carried():
    """The issue's case: R written with 2 decimals, everything after it with 4 from it."""
    trace = attntrace.run("encoder-block-post-ln")
    start = _truth_key(trace, 4)
    answer = post_ln_student(trace, start, 4, after_residual1=lambda r: np.round(r, 2))
    statuses = _statuses(trace, answer)
    assert "wrong" not in statuses.values(), statuses


@pytest.mark.parametrize("slip", ["forgot_residual", "scale_forgotten_before", "one_entry"])
def test_norm_and_ffn_after_a_wrong_residual_are_carried(slip):
    trace = attntrace.run("encoder-block-post-ln")
    start = _truth_key(trace, 4)
    output = start["output"]
    change = {"forgot_residual": lambda r: output,
              "scale_forgotten_before": lambda r: r * 1.7,
              "one_entry": lambda r: r + np.eye(*r.shape) * 0.5}[slip]
    statuses = _statuses(trace, post_ln_student(trace, start, 4, after_residual1=change))
    assert statuses["residual1"] == "wrong"
    after = ["norm1", "ffn_hidden", "ffn_act", "ffn_out", "residual2", "norm2"]
    assert all(statuses[k] == "carried" for k in after), statuses


def test_a_wrong_norm_is_still_wrong():
    """The enclosure is not 'anything goes': a LayerNorm with the unbiased variance is wrong."""
    trace = attntrace.run("encoder-block-post-ln")
    answer = _truth_key(trace, 4)
    r1 = answer["residual1"]
    c = r1 - r1.mean(axis=1, keepdims=True)
    answer["norm1"] = np.round(c / np.sqrt((c * c).sum(axis=1, keepdims=True) / (r1.shape[1] - 1) + 1e-5), 4)
    statuses = _statuses(trace, answer)
    assert statuses["norm1"] == "wrong"


@pytest.mark.parametrize("decimals", [2, 3, 4])
def test_llama_block_rms_swiglu_rounded_answer_is_never_wrong(decimals):
    trace = attntrace.run("llama-block-tiny")
    answer = _truth_key(trace, decimals)
    r1 = np.round(answer["residual1"], decimals)
    eps = float(trace.step("norm2").details["eps"])
    n2 = np.round(_rms_norm(r1, eps, _operand(trace, "gamma_2")), decimals)
    h = np.round(n2 @ _operand(trace, "W_gate"), decimals)
    u = np.round(n2 @ _operand(trace, "W_up"), decimals)
    g = np.round(h / (1 + np.exp(-h)) * u, decimals)
    f = np.round(g @ _operand(trace, "W_down"), decimals)
    answer.update(norm2=n2, ffn_hidden=h, ffn_up=u, ffn_act=g, ffn_out=f, residual2=np.round(r1 + f, decimals))
    statuses = _statuses(trace, answer)
    assert "wrong" not in statuses.values(), statuses


def test_llama_ffn_after_a_wrong_norm_is_carried():
    trace = attntrace.run("llama-block-tiny")
    answer = _truth_key(trace, 4)
    n2 = answer["norm2"] * 1.3  # a wrong RMSNorm (the gain applied twice, say)
    h = np.round(n2 @ _operand(trace, "W_gate"), 4)
    u = np.round(n2 @ _operand(trace, "W_up"), 4)
    g = np.round(h / (1 + np.exp(-h)) * u, 4)
    f = np.round(g @ _operand(trace, "W_down"), 4)
    answer.update(norm2=np.round(n2, 4), ffn_hidden=h, ffn_up=u, ffn_act=g, ffn_out=f,
                  residual2=np.round(answer["residual1"] + f, 4))
    statuses = _statuses(trace, answer)
    assert statuses["norm2"] == "wrong"
    assert all(statuses[k] == "carried" for k in ("ffn_hidden", "ffn_up", "ffn_act", "ffn_out", "residual2")), statuses


def _random_block(seed: int, activation: str) -> dict:
    rng = np.random.default_rng(seed)
    n, d, d_ff = 3, 4, 6

    def m(rows, cols, scale=0.5):
        return np.round(rng.normal(size=(rows, cols)) * scale, 2).tolist()

    return {"title": f"random block {seed}", "mode": "numeric", "block": "post_ln",
            "X": m(n, d, 1.0), "W_Q": m(d, d), "W_K": m(d, d), "W_V": m(d, d), "W_O": m(d, d),
            "ffn": {"activation": activation, "W_1": m(d, d_ff), "b_1": m(1, d_ff)[0], "W_2": m(d_ff, d)}}


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("seed", range(4))
def test_random_post_ln_blocks_rounded_are_never_wrong(activation, seed):
    """Random post-LN blocks (LayerNorm, each activation): the right answer rounded at 2, 3 and 4
    decimals, each step from the student's own rounded one, is never marked wrong."""
    try:
        trace = attntrace.run(_random_block(seed, activation))
    except attntrace.BadInput as exc:  # the spec keys of a block, read from the examples
        pytest.fail(f"random block spec refused: {exc}")
    for decimals in (2, 3, 4):
        start = _truth_key(trace, decimals)
        eps = float(trace.step("norm1").details["eps"])
        answer = post_ln_student(trace, start, decimals, eps=eps, act=activation)
        statuses = _statuses(trace, answer)
        assert "wrong" not in statuses.values(), (decimals, statuses)


# --------------------------------------------------------------------------- the enclosures themselves

from attntrace.algebra.numeric import NumericAlgebra  # noqa: E402
from attntrace.grading import blockrules  # noqa: E402
from attntrace.grading.intervals import Box  # noqa: E402


def _random_box(rng, shape, radius):
    mid = rng.normal(size=shape) * 2
    rad = rng.uniform(0, radius, size=shape)
    return Box(mid - rad, mid + rad)


def _samples(rng, box, k):
    for _ in range(k):
        yield box.lo + (box.hi - box.lo) * rng.uniform(size=box.lo.shape)
    yield box.lo
    yield box.hi


@pytest.mark.parametrize("radius", [5e-5, 5e-3, 0.3])
def test_norm_enclosures_hold_every_point(radius):
    rng = np.random.default_rng(7)
    for _ in range(30):
        r = _random_box(rng, (3, 5), radius)
        gain = Box(*(np.full((1, 5), g) for g in (0.7, 0.7)))
        for rms in (False, True):
            box = blockrules.norm(r, gain if rms else None, None, 1e-5, rms)
            for x in _samples(rng, r, 40):
                y = _rms_norm(x, 1e-5, 0.7) if rms else _layer_norm(x, 1e-5)
                assert np.all(box.lo <= y) and np.all(y <= box.hi)


@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh", "silu"])
def test_activation_enclosures_hold_every_point(name):
    rng = np.random.default_rng(11)
    f = NumericAlgebra().activation
    for radius in (5e-5, 0.05, 1.0):
        h = _random_box(rng, (4, 6), radius)
        h = Box(h.lo - 0.5, h.hi - 0.5)  # around the minima of GELU and SiLU
        box = blockrules.activation(h, name, f)
        for x in _samples(rng, h, 60):
            y = _act(x, name) if name != "silu" else x / (1 + np.exp(-x))
            assert np.all(box.lo <= y) and np.all(y <= box.hi)
        # and they are tight enough to tell a mistake: the radius grows at most like the input's
        assert np.all(box.hi - box.lo <= 2.2 * (h.hi - h.lo) + 1e-12)


# --------------------------------------------------------------------------- every backward step


def _backward_student(spec: dict, decimals: int, slip=None) -> dict:
    """A student's backward pass of one head (loss sum o^2) in NumPy, each step rounded and the
    next from it; `slip` changes their Z first (every gradient after it follows from it)."""
    x = np.array(spec["X"], dtype=float)
    wq, wk, wv = (np.array(spec[k], dtype=float) for k in ("W_Q", "W_K", "W_V"))
    r = lambda a: np.round(a, decimals)  # noqa: E731
    q, k, v = r(x @ wq), r(x @ wk), r(x @ wv)
    s = r(q @ k.T)
    t = r(s / math.sqrt(q.shape[1]))
    e = np.exp(t - t.max(axis=1, keepdims=True))
    a = r(e / e.sum(axis=1, keepdims=True))
    z = r(a @ v)
    if slip is not None:
        z = r(slip(z))
    dz = r(2 * z)
    dv = r(a.T @ dz)
    da = r(dz @ v.T)
    dt = r(a * (da - (a * da).sum(axis=1, keepdims=True)))
    ds = r(dt / math.sqrt(q.shape[1]))
    dq, dk = r(ds @ k), r(ds.T @ q)
    return {"Q": q, "K": k, "V": v, "scores": s, "scaled": t, "weights": a, "Z": z, "dZ": dz, "dV": dv,
            "dweights": da, "dscaled": dt, "dscores": ds, "dQ": dq, "dK": dk,
            "dW_Q": r(x.T @ dq), "dW_K": r(x.T @ dk), "dW_V": r(x.T @ dv),
            "dX": r(dq @ wq.T + dk @ wk.T + dv @ wv.T)}


@pytest.mark.parametrize("decimals", [2, 3, 4])
def test_backward_rounded_from_own_values_is_never_wrong(decimals):
    import tomllib
    from pathlib import Path

    spec = tomllib.loads((Path(__file__).resolve().parents[1] / "examples" / "backward-2x2.toml").read_text())
    trace = attntrace.run(spec)
    statuses = _statuses(trace, _backward_student(spec, decimals))
    assert "wrong" not in statuses.values(), statuses


def test_every_backward_step_after_a_wrong_z_is_carried():
    import tomllib
    from pathlib import Path

    spec = tomllib.loads((Path(__file__).resolve().parents[1] / "examples" / "backward-2x2.toml").read_text())
    trace = attntrace.run(spec)
    statuses = _statuses(trace, _backward_student(spec, 4, slip=lambda z: z + 0.25))
    assert statuses["Z"] == "wrong"
    later = ["dZ", "dV", "dweights", "dscaled", "dscores", "dQ", "dK", "dW_Q", "dW_K", "dW_V", "dX"]
    assert all(statuses[k] == "carried" for k in later), statuses


def test_multihead_backward_through_w_o_is_carried():
    """Two heads with W_O, loss sum o^2: a wrong concat carries into doutput, dW_O, dconcat,
    each head's dZ and every gradient after it, down to dW_Q (full width) and dX."""
    import tomllib
    from pathlib import Path

    spec = tomllib.loads((Path(__file__).resolve().parents[1] / "examples" / "multihead-output.toml").read_text())
    spec["backward"] = {"loss": "sum_squares"}
    trace = attntrace.run(spec)
    h = trace.num_heads
    x = np.array(spec["X"], dtype=float)
    w = {p: np.array(spec["W_" + p], dtype=float) for p in ("Q", "K", "V", "O")}
    d_k = w["Q"].shape[1] // h
    r = lambda a: np.round(a, 4)  # noqa: E731
    ans, heads = {}, []
    for i in range(1, h + 1):
        cols = slice((i - 1) * d_k, i * d_k)
        q, k, v = r(x @ w["Q"][:, cols]), r(x @ w["K"][:, cols]), r(x @ w["V"][:, cols])
        s = r(q @ k.T)
        t = r(s / math.sqrt(d_k))
        e = np.exp(t - t.max(axis=1, keepdims=True))
        a = r(e / e.sum(axis=1, keepdims=True))
        z = r(a @ v)
        ans.update({f"Q@{i}": q, f"K@{i}": k, f"V@{i}": v, f"scores@{i}": s, f"scaled@{i}": t,
                    f"weights@{i}": a, f"Z@{i}": z})
        heads.append((q, k, v, a))
    c = r(np.hstack([ans[f"Z@{i}"] for i in range(1, h + 1)]) + 0.3)  # the slip
    o = r(c @ w["O"])
    do = r(2 * o)
    dc = r(do @ w["O"].T)
    ans.update(concat=c, output=o, doutput=do, dW_O=r(c.T @ do), dconcat=dc)
    dqs, dks, dvs, dx = [], [], [], 0
    for i, (q, k, v, a) in enumerate(heads, start=1):
        dz = dc[:, (i - 1) * d_k: i * d_k]
        dv, da = r(a.T @ dz), r(dz @ v.T)
        dt = r(a * (da - (a * da).sum(axis=1, keepdims=True)))
        ds = r(dt / math.sqrt(d_k))
        dq, dk = r(ds @ k), r(ds.T @ q)
        ans.update({f"dZ@{i}": dz, f"dV@{i}": dv, f"dweights@{i}": da, f"dscaled@{i}": dt, f"dscores@{i}": ds,
                    f"dQ@{i}": dq, f"dK@{i}": dk})
        dqs.append(dq), dks.append(dk), dvs.append(dv)
    ans.update(dW_Q=r(x.T @ np.hstack(dqs)), dW_K=r(x.T @ np.hstack(dks)), dW_V=r(x.T @ np.hstack(dvs)))
    statuses = _statuses(trace, {k: v for k, v in ans.items() if k in {s.key for s in trace.steps}})
    assert statuses["concat"] == "wrong"
    later = [s.key for s in trace.steps if s.id.startswith("d") and s.key in ans]
    assert len(later) >= 10
    assert all(statuses[k] == "carried" for k in later), statuses
