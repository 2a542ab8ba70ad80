"""Multi-head: per-head steps, concat layout, W_O; spec forms; shape mode sizes; bad input.
(PyTorch nn.MultiheadAttention comparisons live in test_multihead_torch.py.)"""

import numpy as np
import pytest
import sympy as sp

import attntrace
from attntrace.model.errors import BadInput


def _random(h=2, n=3, d=4, dk=2, dv=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), [(rng.normal(size=(d, dk)), rng.normal(size=(d, dk)), rng.normal(size=(d, dv))) for _ in range(h)]


def test_heads_and_num_heads_forms_give_identical_steps():
    X, ws = _random()
    heads = attntrace.run({"X": X, "heads": [{"W_Q": q, "W_K": k, "W_V": v} for q, k, v in ws]})
    full = attntrace.run({"X": X, "num_heads": 2, "W_Q": np.hstack([w[0] for w in ws]),
                          "W_K": np.hstack([w[1] for w in ws]), "W_V": np.hstack([w[2] for w in ws])})
    assert [s.key for s in heads.steps] == [s.key for s in full.steps]
    for a, b in zip(heads.steps, full.steps):
        assert a.shape == b.shape and np.array_equal(a.value, b.value), a.key
    concat = heads.step("concat")
    assert concat.shape == (3, 6) and concat.details["blocks"] == ((1, 1, 3), (2, 4, 6))
    # concat is head 1's columns, then head 2's: checked against plain numpy
    np.testing.assert_array_equal(concat.value, np.hstack([heads.step("Z", 1).value, heads.step("Z", 2).value]))


def test_one_head_is_the_single_head_trace():
    X, ws = _random(h=1)
    q, k, v = ws[0]
    single = attntrace.run({"X": X, "W_Q": q, "W_K": k, "W_V": v})
    one = attntrace.run({"X": X, "heads": [{"W_Q": q, "W_K": k, "W_V": v}]})
    assert [s.key for s in one.steps] == [s.key for s in single.steps]
    for a, b in zip(one.steps, single.steps):
        assert np.array_equal(a.value, b.value)


def test_per_head_scaling_uses_the_heads_dk():
    X, ws = _random(h=2, d=8, dk=2)
    t = attntrace.run({"X": X, "heads": [{"W_Q": q, "W_K": k, "W_V": v} for q, k, v in ws]})
    assert t.step("scaled", 1).details["factor"] == pytest.approx(np.sqrt(2))  # not sqrt(d_model) = sqrt(8)


def test_output_with_biases_matches_numpy():
    X, ws = _random(h=2, n=2, d=3, dk=2, dv=2)
    rng = np.random.default_rng(5)
    WO, bO = rng.normal(size=(4, 3)), rng.normal(size=(1, 3))
    bQ = rng.normal(size=(1, 4))
    t = attntrace.run({"X": X, "num_heads": 2, "W_Q": np.hstack([w[0] for w in ws]), "W_K": np.hstack([w[1] for w in ws]),
                       "W_V": np.hstack([w[2] for w in ws]), "b_Q": bQ, "W_O": WO, "b_O": bO[0].tolist()})
    np.testing.assert_allclose(t.step("Q", 2).value, X @ ws[1][0] + bQ[:, 2:], atol=1e-12)
    np.testing.assert_allclose(t.step("output").value, t.step("concat").value @ WO + bO, atol=1e-12)


def test_symbolic_concat_of_two_2x3_heads():
    t = attntrace.run({"Z": [{"shape": [2, 3]}, {"shape": [2, 3]}]}, mode="symbolic")
    c = t.step("concat")
    assert c.shape == (2, 6)
    assert c.value[0, 3] == sp.Symbol("z^{(2)}_{11}")  # head 2's z_11 in column 4
    assert c.value[1, 2] == sp.Symbol("z^{(1)}_{23}")


def test_symbolic_heads_keep_their_index():
    spec = {"X": {"shape": [2, 2]}, "num_heads": 2, "W_Q": {"shape": [2, 4]}, "W_K": {"shape": [2, 4]}, "W_V": {"shape": [2, 6]}}
    t = attntrace.run(spec, mode="symbolic")
    assert t.step("Z", 2).value[0, 0] == sp.Symbol("z^{(2)}_{11}")
    assert t.step("concat").value[0, 3] == sp.Symbol("z^{(2)}_{11}")


def test_article_100x3_with_8_heads_gives_100x24():
    spec = {"X": {"shape": [100, 3]}, "heads": [{"W_Q": {"shape": [3, 3]}, "W_K": {"shape": [3, 3]}, "W_V": {"shape": [3, 3]}}] * 8}
    t = attntrace.run(spec, mode="shape")
    assert t.step("concat").shape == (100, 24)
    assert t.step("weights", 8).shape == (100, 100)


def test_bert_base_shape():
    spec = {"X": {"shape": [128, 768]}, "num_heads": 12, "W_Q": {"shape": [768, 768]}, "W_K": {"shape": [768, 768]},
            "W_V": {"shape": [768, 768]}, "W_O": {"shape": [768, 768]}}
    t = attntrace.run(spec, mode="shape")
    assert t.step("Q", 12).shape == (128, 64) and t.step("concat").shape == (128, 768) and t.step("output").shape == (128, 768)


@pytest.mark.parametrize("spec,needle", [
    ({"X": [[1, 2]], "heads": [{"W_Q": [[1], [1]], "W_K": [[1], [1]], "W_V": [[1], [1]]},
                               {"W_Q": [[1, 1], [1, 1]], "W_K": [[1], [1]], "W_V": [[1], [1]]}]}, "W_Q of head 2 is (2, 2) but W_Q of head 1 is (2, 1)"),
    ({"X": [[1, 2]], "num_heads": 3, "W_Q": [[1, 1], [1, 1]], "W_K": [[1, 1], [1, 1]], "W_V": [[1, 1], [1, 1]]}, "does not divide"),
    ({"X": [[1, 2]], "num_heads": 2, "W_Q": [[1, 1], [1, 1]], "W_K": [[1, 1], [1, 1]], "W_V": [[1, 1], [1, 1]],
      "W_O": [[1, 1]]}, "W_O has 1 rows"),
    ({"Z": [[[1, 2]], [[1, 2], [3, 4]]]}, "Z of head 2 has 2 rows"),
    ({"X": [[1, 2]], "W_Q": [[1], [1]], "W_K": [[1], [1]], "W_V": [[1], [1]], "b_Q": [1, 2]}, "bias b_Q has shape (1, 2)"),
])
def test_multihead_bad_input(spec, needle):
    with pytest.raises(BadInput) as err:
        attntrace.run(spec)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_symbol_tables_among_the_head_outputs_mean_symbolic_mode():
    assert attntrace.run({"Z": [{"shape": [2, 3]}, {"shape": [2, 3]}]}).mode == "symbolic"
    assert attntrace.run({"Z": [[[1, 2]], [[3, 4]]]}).mode == "numeric"
