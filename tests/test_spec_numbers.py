"""Issue 20 B, specs: every integer or real option of a spec is read by one shared parser
(attntrace.inputs.numbers), so a huge value (2^63, 10^400, an infinite float, a NumPy scalar)
is a one-line BadInput (CLI exit 2), never an OverflowError (exit 3).

A window of at least the number of keys is accepted and is the causal mask: checked against
PyTorch's own causal SDPA.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import attntrace
from attntrace.model.errors import BadInput

X = {"X": [[1, 0], [0, 1], [1, 1]], "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [0, 1]], "W_V": [[1, 0], [0, 1]]}
QKV = {"Q": [[1, 0], [0, 1], [1, 1]], "K": [[1, 0], [0, 1], [1, 1]], "V": [[1, 2], [3, 4], [5, 6]]}
FFN = {"W_1": [[1, 0, 1], [0, 1, 1]], "W_2": [[1, 0], [0, 1], [1, 1]]}
BLOCK = {**X, "block": "post_ln", "ffn": FFN}
HUGE = 10**400

CASES = [
    ("window 2^63", {**QKV, "window": 2**63}, "window"),
    ("window 10^400", {**QKV, "window": HUGE}, "window"),
    ("window int64 max", {**QKV, "window": np.int64(2**63 - 1)}, "window"),
    ("window uint64", {**QKV, "window": np.uint64(2**64 - 1)}, "window"),
    ("window float", {**QKV, "window": 2.0}, "window"),
    ("window numpy bool", {**QKV, "window": np.bool_(True)}, "window"),
    ("eps 10^400", {**BLOCK, "norm1": {"eps": HUGE}}, "norm1.eps"),
    ("eps -10^400", {**BLOCK, "norm2": {"eps": -HUGE}}, "norm2.eps"),
    ("eps inf", {**BLOCK, "norm1": {"eps": float("inf")}}, "norm1.eps"),
    ("eps nan", {**BLOCK, "norm1": {"eps": np.float64("nan")}}, "norm1.eps"),
    ("rope base 10^400", {**X, "rope": {"base": HUGE}}, "rope.base"),
    ("rope base text 10^400", {**X, "rope": {"base": "10^400"}}, "rope.base"),
    ("rope base -10^400", {**X, "rope": {"base": -HUGE}}, "rope.base"),
    ("rope position 2^63", {**X, "rope": {"positions": [0, 1, 2**63]}}, "rope.positions"),
    ("rope position 10^400", {**X, "rope": {"positions": [HUGE, 1, 2]}}, "rope.positions"),
    ("alibi slope 10^400", {**X, "alibi": {"slopes": [HUGE]}}, "alibi.slopes"),
    ("alibi slope -inf", {**X, "alibi": {"slopes": [float("-inf")]}}, "alibi.slopes"),
    ("scale 10^400", {**QKV, "scale": HUGE}, "scale"),
    ("scale text", {**QKV, "scale": "2^(10^400)"}, "scale"),
    ("online block_keys 2^63", {**QKV, "online": {"block_keys": 2**63}}, "online block_keys"),
    ("online block_queries 10^400", {**QKV, "online": {"block_keys": 1, "block_queries": HUGE}}, "online block_queries"),
    ("num_heads 2^63", {**X, "num_heads": 2**63}, "num_heads"),
    ("num_heads float", {**X, "num_heads": 2.0}, "num_heads"),
    ("num_kv_heads 10^400", {**X, "num_kv_heads": HUGE}, "num_kv_heads"),
    ("d_k 2^63", {**QKV, "d_k": 2**63}, "d_k"),
]


@pytest.mark.parametrize("spec, key", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_huge_or_odd_numbers_are_one_line_errors(spec, key):
    with pytest.raises(BadInput) as info:
        attntrace.run(spec)
    message = str(info.value)
    assert "\n" not in message and message.startswith(key) and len(message) < 200, message


@pytest.mark.parametrize("text, key", [
    ('window = 9223372036854775808\n', "window"),
    ('window = 100000000000000000000000000000000000000000000000000000000000\n', "window"),
    ('online = {block_keys = 9223372036854775808}\n', "online block_keys"),
    ('rope = {positions = [0, 1, 9223372036854775808]}\n', "rope.positions"),
    ('rope = {base = 1e400}\n', "rope.base"),
])
def test_cli_exits_2_with_one_line(tmp_path, text, key):
    spec = tmp_path / "s.toml"
    spec.write_text("Q = [[1, 0], [0, 1], [1, 1]]\nK = [[1, 0], [0, 1], [1, 1]]\nV = [[1], [2], [3]]\n" + text)
    r = subprocess.run([sys.executable, "-m", "attntrace", "run", str(spec)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"attntrace: error: {key}"), r.stderr


def test_cli_eps_10_to_the_400_exits_2(tmp_path):
    spec = tmp_path / "s.json"
    spec.write_text('{"block": "post_ln", "X": [[1, 0], [0, 1]], "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [0, 1]], '
                    '"W_V": [[1, 0], [0, 1]], "ffn": {"W_1": [[1, 0], [0, 1]], "W_2": [[1, 0], [0, 1]]}, '
                    '"norm1": {"eps": 1' + "0" * 400 + "}}")
    r = subprocess.run([sys.executable, "-m", "attntrace", "run", str(spec)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "norm1.eps must be a number in [0, 1)" in r.stderr, r.stderr


@pytest.mark.parametrize("window", [3, 4, 1000, 10**9, np.int64(10**9)])
def test_a_window_at_least_the_keys_is_the_causal_mask(window):
    """Checked against PyTorch's causal SDPA, not against attntrace's own causal mask."""
    torch = pytest.importorskip("torch")
    got = attntrace.run({**QKV, "window": window}).step("Z").value
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in QKV.items()}
    want = torch.nn.functional.scaled_dot_product_attention(t["Q"], t["K"], t["V"], is_causal=True).numpy()
    np.testing.assert_allclose(got, want, atol=1e-12, rtol=0)


def test_numbers_at_their_bound_are_accepted():
    assert attntrace.run({**QKV, "rope": {"positions": [0, 1, 10**9]}}).step("Q_rope") is not None
    assert attntrace.run({**QKV, "online": {"block_keys": 10**6}}).step("Z") is not None
    assert attntrace.run({**BLOCK, "norm1": {"eps": np.float32(0.5)}}).step("norm1") is not None


# ------------------------------------------------------------------ the cost model (issue 20 B, specs)

def _online(n: int, mode: str = "numeric", **blocks) -> dict:
    if mode == "shape":
        return {"mode": "shape", **{k: {"shape": [n, 2]} for k in "QKV"}, "online": blocks}
    rng = np.random.default_rng(0)
    q = rng.normal(size=(n, 2)).round(2).tolist()
    return {"Q": q, "K": q, "V": q, "online": blocks}


@pytest.mark.parametrize("spec, blocks", [
    (_online(300, block_keys=1, block_queries=1), "90,000 blocks"),
    (_online(100_000, "shape", block_keys=1, block_queries=1), "10,000,000,000 blocks"),
    (_online(2000, block_keys=1), "2,000 blocks"),
])
def test_online_blocks_are_counted_before_any_work(spec, blocks, monkeypatch):
    """1 x 1 blocks on 300 tokens are 360,000 steps; shape mode with 10^5 rows grew past 2 GB:
    refused in one line naming the count, before the tracer builds anything."""
    from attntrace import tracer

    monkeypatch.setattr(tracer, "Context", None)  # any work at all would fail on this
    with pytest.raises(BadInput) as info:
        attntrace.run(spec)
    message = str(info.value)
    assert blocks in message and "online_blocks" in message and "\n" not in message


def test_online_blocks_limit_can_be_raised(monkeypatch):
    monkeypatch.setenv("ATTNTRACE_LIMITS", "online_blocks=1000")
    t = attntrace.run(_online(30, block_keys=1, block_queries=1))
    assert sum(s.id == "online_out" for s in t.steps) == 900


def _backward(n: int, d: int, heads: int) -> dict:
    rng = np.random.default_rng(n * 10 + d)
    mats = {k: rng.integers(-2, 3, size=s).tolist() for k, s in
            {"X": (n, d), "W_Q": (d, d), "W_K": (d, d), "W_V": (d, d)}.items()}
    return {**mats, "num_heads": heads, "backward": True}


@pytest.mark.parametrize("n, d, heads", [(4, 4, 2), (4, 4, 1), (3, 3, 1), (4, 2, 1)])
def test_exact_backward_is_in_the_exact_cost_model(n, d, heads, monkeypatch):
    """Exact backward on a 4 x 4 with 2 heads ran over 60 s: now refused with the estimate,
    before the tracer builds anything; numeric mode still traces it."""
    from attntrace import tracer

    assert attntrace.run(_backward(n, d, heads)).step("dX") is not None
    monkeypatch.setattr(tracer, "Context", None)
    with pytest.raises(BadInput, match=r"this exact trace is too large .* units of work.*exact_cost"):
        attntrace.run(_backward(n, d, heads), mode="exact")


def test_the_backward_estimate_follows_sympy_node_counts(monkeypatch):
    """The model predicts the gradients' sizes: within a factor 3 of the nodes SymPy builds
    (it may predict more, never far fewer), on traces small enough to run. The nodes are what is
    compared, so the limit on units (time) is raised for the two-head case."""
    monkeypatch.setenv("ATTNTRACE_LIMITS", "exact_cost=100000")
    import sympy

    from attntrace.budget import BACKWARD_NODES_PER_UNIT, _dims, work_estimate
    from attntrace.tracer import load_problem as load_spec  # the spec keys the kinds declare (backward) included

    for n, d, heads in [(2, 2, 1), (3, 2, 1), (2, 4, 1), (3, 2, 2)]:
        spec = _backward(n, d, heads)
        with_grad = load_spec(spec, mode="exact")
        without = load_spec({**spec, "backward": None}, mode="exact")
        predicted = BACKWARD_NODES_PER_UNIT * (work_estimate(with_grad, [_dims(o, with_grad.shared) for o in with_grad.heads])[0]
                         - work_estimate(without, [_dims(o, without.shared) for o in without.heads])[0])
        t = attntrace.run(spec, mode="exact")
        nodes = sum(sum(1 for _ in sympy.preorder_traversal(e)) for s in t.steps if s.id.startswith("d") for e in s.value)
        assert nodes / 3 < predicted < nodes * 3, (n, d, heads, nodes, predicted)


@pytest.mark.parametrize("n, blocks", [(16, {"block_keys": 1, "block_queries": 1}), (16, {"block_keys": 1})])
def test_exact_online_softmax_is_in_the_exact_cost_model(n, blocks, monkeypatch):
    from attntrace import tracer

    monkeypatch.setattr(tracer, "Context", None)
    spec = _online(n, **blocks)
    spec = {**spec, **{k: np.round(np.asarray(spec[k]) * 2).astype(int).tolist() for k in "QKV"}}
    with pytest.raises(BadInput, match="this exact trace is too large"):
        attntrace.run(spec, mode="exact")


def test_the_built_in_backward_examples_stay_within_the_limits():
    for name in ("backward-2x2", "backward-2x2-symbolic"):
        for mode in ("exact", "symbolic"):
            assert attntrace.run(name, mode=mode).step("dQ") is not None


@pytest.mark.parametrize("extra, n, d", [({"rope": True}, 8, 4), ({"rope": True}, 6, 6), ({"position": "sinusoidal"}, 4, 4)])
def test_exact_position_kinds_are_in_the_exact_cost_model(extra, n, d, monkeypatch):
    """RoPE over 6 tokens with d_k = 6 took 50 s in exact mode, sinusoidal positions on 4 x 4
    17 s: refused up front with the estimate; numeric mode traces them."""
    from attntrace import tracer

    rng = np.random.default_rng(n + d)
    w = rng.integers(-1, 2, size=(d, d)).tolist()
    spec = {"X": rng.integers(-2, 3, size=(n, d)).tolist(), "W_Q": w, "W_K": w, "W_V": w, **extra}
    assert attntrace.run(spec).step("Z") is not None
    monkeypatch.setattr(tracer, "Context", None)
    with pytest.raises(BadInput, match=r"this exact trace is too large .* units of work"):
        attntrace.run(spec, mode="exact")
