"""Numeric mode's costs over bare NumPy (issue 26), checked by what they must do, never by time:

- inputs: a writable array is copied once, straight into float64 (no second conversion), a
  read-only float64 array is not copied, and copy=False keeps a writable float64 array as a
  read-only view of the caller's memory (the caller's own flag unchanged);
- overflow: NumPy's floating-point flags report an overflow of an entry-wise step (the scale,
  a residual), the tracer refuses it in one line as the per-step scan did;
- keep=: only the named steps are recorded, the others are listed (settings, JSON, reports), the
  reports render, and the memory a trace holds and its peak follow what is kept (tracemalloc,
  as ratios).

Values are compared with a NumPy reference written here, not with attntrace itself.
"""

from __future__ import annotations

import gc
import json
import math
import tracemalloc

import numpy as np
import pytest

import attntrace as at
from attntrace.model.errors import BadInput


def _layer(n=5, d=8, h=2, seed=0, frozen=False):
    rng = np.random.default_rng(seed)
    p = {"X": rng.normal(size=(n, d)), "num_heads": h,
         **{f"W_{k}": rng.normal(size=(d, d)) / math.sqrt(d) for k in "QKVO"}}
    if frozen:
        for k in ("W_Q", "W_K", "W_V", "W_O"):
            p[k].setflags(write=False)
    return p


def _numpy_output(p):
    """The layer in plain NumPy (full-width projections, per-head stable softmax, concat, W_O)."""
    X, h = p["X"], p["num_heads"]
    Q, K, V = X @ p["W_Q"], X @ p["W_K"], X @ p["W_V"]
    dk = Q.shape[1] // h
    zs = []
    for i in range(h):
        c = slice(i * dk, (i + 1) * dk)
        T = Q[:, c] @ K[:, c].T / math.sqrt(dk)
        E = np.exp(T - T.max(axis=1, keepdims=True))
        zs.append(E / E.sum(axis=1, keepdims=True) @ V[:, c])
    return np.hstack(zs) @ p["W_O"]


def _operand(trace, name):
    """The whole-matrix value an operand was made from (a per-head block is a view of it)."""
    op = next(o for o in trace.operands if o.name == name)
    return op.value.base if op.value.base is not None else op.value


def test_writable_inputs_are_copied_once_and_the_trace_does_not_follow_later_changes():
    p = _layer()
    x0 = p["X"].copy()
    trace = at.run(p)
    for name in ("X", "W_Q", "W_O"):
        assert not np.shares_memory(_operand(trace, name), p[name]), name
    before = trace.output.copy()
    assert np.allclose(before, _numpy_output(p), atol=1e-12)
    p["W_O"][0, 0] += 100.0
    p["X"][0, 0] += 100.0
    assert np.array_equal(trace.output, before)
    assert np.array_equal(next(o for o in trace.operands if o.name == "X").value, x0)


def test_other_dtypes_are_converted_once_to_float64():
    p = _layer()
    p32 = {k: v.astype(np.float32) if isinstance(v, np.ndarray) else v for k, v in p.items()}
    p32["W_O"] = (p["W_O"] * 4).round().astype(np.int64)
    trace = at.run(p32)
    for name in ("X", "W_Q", "W_O"):
        value = next(o for o in trace.operands if o.name == name).value
        assert value.dtype == np.float64 and not value.flags.writeable
        assert np.array_equal(value, np.asarray(p32[name], dtype=np.float64)) or name != "X"
    ref = {k: v.astype(np.float64) if isinstance(v, np.ndarray) else v for k, v in p32.items()}
    assert np.allclose(trace.output, _numpy_output(ref), atol=1e-9)


def test_read_only_float64_inputs_are_kept_without_a_copy():
    p = _layer(frozen=True)
    trace = at.run(p)
    assert _operand(trace, "W_Q") is p["W_Q"]
    assert np.shares_memory(_operand(trace, "W_O"), p["W_O"])
    assert not np.shares_memory(_operand(trace, "X"), p["X"])  # X is writable: copied


def test_copy_false_keeps_writable_float64_as_read_only_views():
    p = _layer()
    trace = at.run(p, copy=False)
    for name in ("X", "W_Q", "W_O"):
        value = _operand(trace, name)
        assert np.shares_memory(value, p[name]), name
        assert p[name].flags.writeable  # the caller's array is not touched
    assert all(not s.value.flags.writeable for s in trace.steps)
    assert np.allclose(trace.output, _numpy_output(p), atol=1e-12)
    # not float64: copy=False cannot keep it, so it is converted (copied) as always
    p32 = dict(p, W_V=p["W_V"].astype(np.float32))
    assert not np.shares_memory(_operand(at.run(p32, copy=False), "W_V"), p32["W_V"])


@pytest.mark.parametrize("copy", [True, False])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_inputs_are_refused_naming_the_entry(copy, bad):
    p = _layer()
    p["W_K"][2, 3] = bad
    with pytest.raises(BadInput) as err:
        at.run(p, copy=copy)
    assert str(err.value).startswith("W_K[3,4] is ") and "inputs must be finite" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_large_input_is_checked_in_every_slice_of_its_copy():
    x = np.ones((3000, 40))
    x[2999, 39] = np.nan  # in the last slice of the copy
    with pytest.raises(BadInput, match=r"X\[3000,40\] is nan"):
        at.run({"X": x, "W_Q": np.eye(40), "W_K": np.eye(40), "W_V": np.eye(40)})


def test_an_entry_wise_overflow_is_refused_from_numpys_flags():
    # scale = 1e-300: the products are finite, the division overflows (no BLAS product in the step)
    p = {"X": [[1e10, 0], [0, 1]], "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [0, 1]], "W_V": [[1, 0], [0, 1]], "scale": 1e-300}
    with pytest.raises(BadInput, match=r"^step scaled: entry \(1, 1\) overflows float64"):
        at.run(p)
    # the same overflow with the scores given (no product at all before the step)
    with pytest.raises(BadInput, match=r"^step scaled: entry \(1, 1\) overflows float64"):
        at.run({"scores": [[1e10, 1.0], [1.0, 1.0]], "scale": 1e-300})


def test_no_error_flag_leaks_from_one_step_to_the_next():
    # masked scores are -inf on purpose (no flag); every step after them is finite and recorded
    trace = at.run("causal-mask")
    assert np.isneginf(trace.step("masked").value).any()
    assert all(np.isfinite(s.value).all() for s in trace.steps if s.id != "masked")


# -- keep= -------------------------------------------------------------------------------------
def test_keep_records_only_the_named_steps_and_lists_the_others():
    p = _layer(h=2)
    full = at.run(p)
    kept = at.run(p, keep=["weights", "output"])
    assert [s.key for s in kept.steps] == ["weights@1", "weights@2", "output"]
    for s in kept.steps:
        assert np.array_equal(s.value, full.step(s.id, s.head).value)
    missing = [s.key for s in full.steps if s.id not in ("weights", "output")]
    assert list(kept.settings["not_kept"]) == missing
    assert np.array_equal(kept.output, full.output)
    data = json.loads(json.dumps(kept.to_dict()))
    assert data["not_kept"] == missing and data["output"] == "output"
    assert "not_kept" not in full.to_dict()
    # a key keeps one head's step; the forward result not kept: trace.output says so
    one = at.run(p, keep="weights@2")
    assert [s.key for s in one.steps] == ["weights@2"]
    assert one.to_dict()["output"] is None
    with pytest.raises(KeyError, match="not kept"):
        one.output


def test_keep_refuses_a_name_that_is_not_a_step():
    with pytest.raises(BadInput, match=r"^keep names 'weight', which is not a step of this trace \(its steps: Q, K, V"):
        at.run(_layer(), keep=["weight"])
    with pytest.raises(BadInput, match="keep is a list"):
        at.run(_layer(), keep=[1, 2])


@pytest.mark.parametrize("fmt", ["md", "text", "tex"])
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_reports_of_a_kept_trace_say_what_was_not_kept(fmt, lang):
    trace = at.run("multihead-output", keep=["weights", "output"])
    text = at.render(trace, fmt, lang=lang)
    assert ("Traced with keep" if lang == "en" else "keep") in text
    assert "scores" in text and "0.2483" in text  # the kept weights are printed


def test_cli_keep(tmp_path):
    from attntrace.cli import main

    out = tmp_path / "t.json"
    assert main(["run", "multihead-output", "--keep", "weights@1,output", "--format", "json", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [s["id"] for s in data["steps"]] == ["weights", "output"] and "Q@1" in data["not_kept"]


def _traced_bytes(fn):
    """(peak, held) bytes that NumPy allocated while `fn` ran and that its result still holds."""
    gc.collect()
    tracemalloc.start()
    try:
        result = fn()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, held, result


def test_keep_bounds_memory():
    """The heads' n x n steps are most of a long sequence's trace: kept, every one is held;
    not kept, each is freed when the next step no longer reads it. Read-only weights are not
    copied, so the trace's own memory is what tracemalloc sees."""
    rng = np.random.default_rng(1)
    n, d, h = 256, 32, 8
    p = {"X": rng.normal(size=(n, d)), "num_heads": h, **{f"W_{k}": rng.normal(size=(d, d)) / math.sqrt(d) for k in "QKVO"}}
    for v in p.values():
        if isinstance(v, np.ndarray):
            v.setflags(write=False)
    at.run(p)  # imports and first-sight checks outside the measured runs
    peak_all, held_all, full = _traced_bytes(lambda: at.run(p))
    peak_out, held_out, kept = _traced_bytes(lambda: at.run(p, keep=["output"]))
    out_bytes = kept.output.nbytes
    kept_steps = sum(s.value.nbytes for s in full.steps)
    assert held_all >= kept_steps  # the full trace holds every step
    assert held_out <= 1.1 * out_bytes + 256 * 1024  # the output and bookkeeping only
    # the peak: the output plus one head's n x n work at a time, against every head's
    nn = n * n * 8
    assert peak_out <= out_bytes + 6 * nn + 2 * n * d * 8 * 3
    assert peak_out < peak_all / 4


def test_the_torch_bridge_copies_once_and_still_owns_its_arrays():
    """from_torch converts each tensor to a fresh float64 array and traces it without a second
    copy; the trace must still not follow later changes of the module or the input."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    trace = at.from_torch(mha, x)
    before = trace.output.copy()
    with torch.no_grad():
        x.mul_(3.0)
        mha.in_proj_weight.mul_(2.0)
        mha.out_proj.weight.add_(1.0)
    assert np.array_equal(trace.output, before)
    assert all(not o.value.flags.writeable for o in trace.operands if isinstance(o.value, np.ndarray))
    assert all(not s.value.flags.writeable for s in trace.steps)


def test_the_copies_of_a_large_spec_go_into_one_allocation():
    """A spec whose copies add up to 4 MB or more has them carved out of one allocation
    (`matrices.copies_in_one`: one mapping, huge pages, instead of a page fault per 4 KB of
    each fresh copy); each is still its own read-only matrix equal to its input, the 1-D bias
    read as one row, and the trace does not follow later changes of the inputs."""
    p = _layer(n=64, d=384, h=4)  # four 384 x 384 weights: 4.7 MB
    p["b_Q"] = np.linspace(-1, 1, 384)  # 1-D: one row
    p["W_V"] = p["W_V"].astype(np.float32)  # converted into its place
    given = {k: v.copy() for k, v in p.items() if isinstance(v, np.ndarray)}
    trace = at.run(p)
    bases = {id(_operand(trace, k)) for k in ("X", "W_Q", "W_K", "W_V", "W_O", "b_Q")}
    assert len(bases) == 1
    for name, value in given.items():
        blocks = [o.value for o in sorted((o for o in trace.operands if o.name == name), key=lambda o: o.head or 0)]
        whole = np.hstack(blocks)  # the heads' column blocks, side by side
        assert all(b.dtype == np.float64 and not b.flags.writeable and not np.shares_memory(b, p[name]) for b in blocks)
        assert np.array_equal(whole, np.asarray(value, dtype=np.float64).reshape(whole.shape)), name
    before = trace.output.copy()
    for v in p.values():
        if isinstance(v, np.ndarray):
            v += 1
    assert np.array_equal(trace.output, before)
    ref = {k: np.asarray(v, dtype=np.float64) for k, v in given.items()}
    X, h = ref["X"], 4
    Q = X @ ref["W_Q"] + ref["b_Q"]
    K, V = X @ ref["W_K"], X @ ref["W_V"]
    zs = []
    for i in range(h):
        c = slice(i * 96, (i + 1) * 96)
        T = Q[:, c] @ K[:, c].T / math.sqrt(96)
        E = np.exp(T - T.max(axis=1, keepdims=True))
        zs.append(E / E.sum(axis=1, keepdims=True) @ V[:, c])
    out = np.hstack(zs) @ ref["W_O"]
    assert np.allclose(trace.output, out, atol=1e-12)


def test_a_small_spec_and_a_non_finite_input_in_one_allocation():
    # below 4 MB in all: each copy is its own array
    trace = at.run(_layer())
    assert len({id(_operand(trace, k)) for k in ("W_Q", "W_K")}) == 2
    # the entry of a large spec that is not finite is still named
    p = _layer(n=64, d=384, h=4)
    p["W_O"][383, 0] = np.inf
    with pytest.raises(BadInput, match=r"^W_O\[384,1\] is inf; inputs must be finite"):
        at.run(p)


def test_products_bounded_by_their_factors_are_not_scanned(monkeypatch):
    """The scores and Z of a head whose factors carry norm bounds (a block of a full-width
    projection; attention weights, rows summing to 1) cannot overflow: emit does not sum them.
    The concatenated heads carry no bound, so the output product is still summed once."""
    from attntrace.kinds import context

    calls = []
    real = context.sum_finite
    monkeypatch.setattr(context, "sum_finite", lambda a: calls.append(a.shape) or real(a))
    p = _layer(n=6, d=8, h=4)
    trace = at.run(p)
    assert calls == [(6, 8)]  # the output, not the 4 heads' scores (6x6) and Z (6x2)
    assert np.allclose(trace.output, _numpy_output(p), atol=1e-12)


def test_an_overflow_of_the_scores_is_caught_when_the_projections_have_no_bound():
    # Q's entry of 1e160: its square overflows, so the projection gives no bound, and the scores
    # (1e320) are scanned and refused, naming the head
    x = np.eye(4)
    x[0, 0] = 1e160
    p = {"X": x, "W_Q": np.eye(4), "W_K": np.eye(4), "W_V": np.eye(4), "num_heads": 2}
    with pytest.raises(BadInput, match=r"^step scores \(head 1\): entry \(1, 1\) overflows float64"):
        at.run(p)
    # 1e150: squares 1e300 are finite, the bound 1e300 is not below SAFE_PRODUCT: scanned, finite, traced
    x[0, 0] = 1e150
    assert np.isfinite(at.run(p).step("scores", 1).value).all()
