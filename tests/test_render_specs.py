"""Specs shared by the render tests: a broad set of traces (every start point, mode, mask, heads)."""

import numpy as np

_rng = np.random.default_rng(7)


def _m(r, c, lo=-3, hi=4):
    return _rng.integers(lo, hi, size=(r, c)).tolist()


X = _m(3, 4)
W = {k: _m(4, 2) for k in ("W_Q", "W_K", "W_V")}
HEADS2 = [{k: _m(4, 2) for k in ("W_Q", "W_K", "W_V")} for _ in range(2)]

SPECS = {
    "numeric": {"X": X, **W, "title": "Numeric single head"},
    "exact": {"X": [[str(x) for x in row] for row in X], **{k: [["1/2" if x == 1 else str(x) for x in row] for row in v] for k, v in W.items()},
              "mode": "exact"},
    "symbolic": {"X": {"shape": [2, 3]}, "W_Q": {"shape": [3, 2]}, "W_K": {"shape": [3, 2]}, "W_V": {"shape": [3, 2]}, "mode": "symbolic"},
    "shape": {"X": {"shape": [4, 6]}, "W_Q": {"shape": [6, 6]}, "W_K": {"shape": [6, 6]}, "W_V": {"shape": [6, 6]}, "mode": "shape"},
    "masked": {"X": X, **W, "mask": "causal", "tokens": ["I", "love", "cats"]},
    "masked_exact": {"scores": [["1", "2", "0"], ["1/2", "1", "3"], ["0", "0", "1"]], "d_k": 4, "mask": "causal", "mode": "exact"},
    "cross": {"X": _m(2, 4), "X_kv": _m(3, 4), **W},
    "multihead": {"X": X, "heads": HEADS2, "W_O": _m(4, 4)},
    "num_heads": {"X": X, "W_Q": _m(4, 4), "W_K": _m(4, 4), "W_V": _m(4, 4), "num_heads": 2, "W_O": _m(4, 4)},
    "bias": {"X": X, **W, "b_Q": [[1, 0]], "b_K": [[0, -1]], "b_V": [[0.5, 0.5]]},
    "scores": {"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False},
    "scores_dk": {"scores": [[6.0, 3.0], [1.0, -2.0]], "d_k": 6},
    "weights_symbolic": {"weights": {"symbol": "a", "shape": [2, 2]}, "V": {"symbol": "v", "shape": [2, 3]}},
    "weights_numeric": {"weights": [[0.6, 0.4], [0.1, 0.9]], "V": [[1, 2, 3], [4, 5, 6]]},
    "concat_symbolic": {"Z": [{"shape": [2, 3]}, {"shape": [2, 3]}], "mode": "symbolic"},
    "concat_numeric": {"Z": [[[1, 2], [3, 4]], [[5, 6], [7, 8]], [[0, 1], [1, 0]]], "W_O": _m(6, 3)},
    "large": {"X": _rng.normal(size=(12, 20)).round(3).tolist(), "W_Q": _rng.normal(size=(20, 10)).round(3).tolist(),
              "W_K": _rng.normal(size=(20, 10)).round(3).tolist(), "W_V": _rng.normal(size=(20, 10)).round(3).tolist(),
              "mask": "causal"},
    "symbolic_multihead": {"X": {"shape": [2, 2]}, "heads": [{k: {"shape": [2, 1]} for k in ("W_Q", "W_K", "W_V")} for _ in range(2)],
                           "W_O": {"shape": [2, 2]}, "mode": "symbolic"},
    "greek": {"weights": {"symbol": "alpha", "shape": [2, 2]}, "V": {"symbol": "v", "shape": [2, 2]}},
}
