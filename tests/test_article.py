"""The seed article's examples: numbers checked by hand and against numpy/torch-free math."""

import math

import numpy as np
import sympy as sp

import attntrace


def test_softmax_of_the_article_scores_is_not_the_scores():
    # Hand check: e^0.8/(e^0.8+e^0.2) = 1/(1+e^-0.6) = 0.645656...; 1/(1+e^0.4) = 0.401312...
    t = attntrace.run({"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False})
    w = t.step("weights").value
    assert w.round(4).tolist() == [[0.6457, 0.3543], [0.4013, 0.5987]]
    assert abs(w[0, 0] - 1 / (1 + math.exp(-0.6))) < 1e-15
    assert not np.allclose(w, [[0.8, 0.2], [0.3, 0.7]], atol=1e-3)


def test_scaling_by_sqrt_6():
    t = attntrace.run({"scores": [[6.0]], "d_k": 6})
    assert round(t.step("scaled").details["factor"], 3) == 2.449
    e = attntrace.run({"scores": [["6"]], "d_k": 6, "mode": "exact"})
    assert e.step("scaled").details["factor"] == sp.sqrt(6)
    assert e.step("scaled").value[0, 0] == sp.sqrt(6)  # 6 / sqrt(6)


def test_sentence_4x6_shapes():
    spec = {"X": {"shape": [4, 6]}, "W_Q": {"shape": [6, 6]}, "W_K": {"shape": [6, 6]}, "W_V": {"shape": [6, 6]}}
    t = attntrace.run(spec, mode="shape")
    assert t.step("Q").shape == (4, 6) and t.step("scores").shape == (4, 4) and t.step("Z").shape == (4, 6)
    assert all(s.value is None for s in t.steps)


def test_expanded_2x2_by_2x3_product_in_article_order():
    t = attntrace.run({"weights": {"symbol": "a", "shape": [2, 2]}, "V": {"symbol": "v", "shape": [2, 3]}})
    z = t.step("Z")
    assert z.shape == (2, 3)
    assert sp.latex(z.expansion[0, 0], order="none") == "a_{11} v_{11} + a_{12} v_{21}"
    assert sp.latex(z.expansion[1, 2], order="none") == "a_{21} v_{13} + a_{22} v_{23}"
    assert str(z.value[0, 0]) == "z_{11}"
