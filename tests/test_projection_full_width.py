"""Projections at full width, then heads: one product X W_Q + b_Q, each head's Q a column
block of it (a view, as PyTorch's in_proj then view(n, h, d_k)), no input copied needlessly,
and the numeric softmax keeping one (n, n) matrix per head, its details computed when read."""

import numpy as np
import pytest

import attntrace
from attntrace.model.errors import BadInput

from mathcheck import in_ci  # noqa: E402

# under CI=true a missing torch fails the file instead of skipping it
torch = __import__("torch") if in_ci() else pytest.importorskip("torch")


def _layer(n=5, d=8, h=4, seed=0, frozen=False):
    rng = np.random.default_rng(seed)
    spec = {"X": rng.normal(size=(n, d)), "num_heads": h,
            **{f"W_{k}": rng.normal(size=(d, d)) for k in "QKVO"}, **{f"b_{k}": rng.normal(size=(1, d)) for k in "QKVO"}}
    if frozen:
        for k, v in spec.items():
            if k != "X" and isinstance(v, np.ndarray):
                v.setflags(write=False)
    return spec


def test_heads_are_column_blocks_of_one_product_equal_to_torch_in_proj():
    spec = _layer()
    t = attntrace.run(spec)
    x = torch.from_numpy(spec["X"])
    for which in "QKV":
        # torch's nn.Linear: y = x W^T + b, then the heads as view(n, h, d_k)
        lin = torch.nn.functional.linear(x, torch.from_numpy(spec[f"W_{which}"].T.copy()), torch.from_numpy(spec[f"b_{which}"][0]))
        per_head = lin.view(5, 4, 2).transpose(0, 1).numpy()
        values = [t.step(which, i).value for i in range(1, 5)]
        for i, v in enumerate(values):
            np.testing.assert_allclose(v, per_head[i], atol=1e-12, rtol=0)
            assert not v.flags.writeable
        # one full-width product: every head's block shares its memory, no copy per head
        assert all(np.shares_memory(values[0].base, v) for v in values)
        assert values[1].base is values[0].base and values[0].base.shape == (5, 8)


def test_reports_and_json_name_only_the_per_head_steps():
    t = attntrace.run(_layer())
    keys = [s.key for s in t.steps]
    assert keys[:3] == ["Q@1", "K@1", "V@1"] and "Q" not in keys
    assert {s.id for s in t.steps} <= {"Q", "K", "V", "scores", "scaled", "weights", "Z", "concat", "output"}
    assert t.step("Q", 2).inputs == ("X", "W_Q", "b_Q") and t.step("Q", 2).formula == "Q^{(2)} = X W_Q^{(2)} + b_Q^{(2)}"


def test_heads_given_one_by_one_are_projected_one_by_one():
    spec = _layer(h=2)
    w = {k: spec[k] for k in ("W_Q", "W_K", "W_V")}
    tables = [{k: v[:, i * 4:(i + 1) * 4] for k, v in w.items()} for i in range(2)]
    t = attntrace.run({"X": spec["X"], "heads": tables})
    full = attntrace.run({"X": spec["X"], **w, "num_heads": 2})
    for s in full.steps:
        np.testing.assert_allclose(t.step(s.id, s.head).value, s.value, atol=1e-12, rtol=0)


def test_frozen_inputs_are_not_copied_and_head_weights_are_views():
    spec = _layer(frozen=True)
    t = attntrace.run(spec)
    for i in (1, 4):
        w = t.operand("W_Q", i).value
        assert np.shares_memory(w, spec["W_Q"]) and not w.flags.writeable
    assert t.operand("W_O").value is spec["W_O"]
    live = _layer()
    t2 = attntrace.run(live)
    live["W_Q"][0, 0] += 1.0  # a writable input is copied: the trace does not change with it
    assert t2.operand("W_Q", 1).value[0, 0] == live["W_Q"][0, 0] - 1.0


def test_overflow_names_the_head_and_the_entry_of_its_block():
    spec = _layer(frozen=False)
    spec["W_K"][:, 5] = 1e308  # column 6 = column 2 of head 3
    spec["X"][0] = 10.0  # row 1: 80 * 1e308 overflows
    with pytest.raises(BadInput) as err:
        attntrace.run(spec)
    assert str(err.value).startswith("step K (head 3): entry (1, 2) overflows float64 (computed from X, W_K, b_K)")


def test_softmax_keeps_one_matrix_and_its_details_equal_torch():
    spec = _layer(n=6)
    t = attntrace.run(spec)
    s = t.step("weights", 2)
    scaled = t.step("scaled", 2).value
    ref = torch.softmax(torch.from_numpy(scaled.copy()), dim=-1).numpy()
    np.testing.assert_allclose(s.value, ref, atol=1e-15, rtol=0)
    d = s.details
    assert set(d) == {"row_max", "shifted", "exp", "row_sum"}
    np.testing.assert_array_equal(d["row_max"], scaled.max(axis=1))
    np.testing.assert_array_equal(d["shifted"], scaled - scaled.max(axis=1, keepdims=True))  # bit for bit
    np.testing.assert_array_equal(d["exp"], np.exp(scaled - scaled.max(axis=1, keepdims=True)))
    np.testing.assert_allclose(d["row_sum"], d["exp"].sum(axis=1), rtol=1e-15)
    assert all(not d[k].flags.writeable and d[k].dtype == np.float64 for k in d)
    assert d["exp"] is d["exp"]  # computed once when first read


def test_masked_rows_still_refuse_a_shift_that_overflows():
    with pytest.raises(BadInput, match="minus its row maximum overflows"):
        attntrace.run({"scores": [[1e308, -1e308]], "scale": False})
    t = attntrace.run({"scores": [[1.0, 2.0], [3.0, 0.0]], "scale": False, "mask": "causal"})
    assert t.step("weights").value[0, 1] == 0.0 and np.isneginf(t.step("weights").details["shifted"][0, 1])


def test_frozen_arrays_are_checked_once_and_never_trusted_when_not_finite():
    import gc

    from attntrace.inputs import matrices

    w = np.eye(3)
    w.setflags(write=False)
    for _ in range(2):
        assert attntrace.run({"Q": w, "K": w, "V": w}).operand("K").value is w
    assert matrices._FINITE[id(w)]() is w
    del w
    gc.collect()
    assert all(ref() is not None for ref in matrices._FINITE.values())  # the entry went with its array
    bad = np.array([[1.0, np.nan]])
    bad.setflags(write=False)
    for _ in range(2):
        with pytest.raises(BadInput, match="inputs must be finite"):
            attntrace.run({"Q": bad, "K": bad, "V": bad})
