"""The checker on traces with the new step kinds (RoPE, KV cache, ALiBi, online softmax,
backward, block steps, GQA): it never crashes, accepts the trace's own numbers, and finds a
wrong entry planted in a new-kind step in every format and language."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import attntrace
from attntrace.grading.diagnose import to_float
from attntrace.model.errors import BadInput
from attntrace.model.trace import STEP_IDS
from attntrace.teach.examples import example_path, list_examples


def _numeric_traces():
    out = []
    for name, _ in list_examples():
        try:
            out.append((name, attntrace.run(str(example_path(name)), mode="numeric")))
        except BadInput:  # a symbolic or shape-only example
            continue
    return out


TRACES = _numeric_traces()
NEW = [(n, t) for n, t in TRACES if any(s.id not in STEP_IDS for s in t.steps)]


def _entry(x: float):
    return "-inf" if np.isneginf(x) else round(float(x), 4)


def own_answer(trace) -> dict:
    return {s.key: [[_entry(x) for x in row] for row in to_float(s.value)] for s in trace.steps}


def test_enough_examples_are_checked():
    assert len(TRACES) >= 20 and len(NEW) >= 8, (len(TRACES), len(NEW))


@pytest.mark.parametrize("name,trace", TRACES, ids=[n for n, _ in TRACES])
def test_own_numbers_are_accepted(name, trace):
    report = attntrace.check(trace, own_answer(trace))
    assert report.ok, (name, report.first_wrong)
    assert {s.key for s in report.steps} == {s.key for s in trace.steps}


@pytest.mark.parametrize("name,trace", NEW, ids=[n for n, _ in NEW])
def test_a_planted_entry_in_a_new_step_is_found(name, trace):
    answer = own_answer(trace)
    step = next(s for s in trace.steps if s.id not in STEP_IDS and np.isfinite(to_float(s.value)[0, 0]))
    answer[step.key][0][0] = round(float(to_float(step.value)[0, 0]) + 0.5, 4)
    for lang in ("en", "zh"):
        report = attntrace.check(trace, answer, lang=lang)
        assert not report.ok and report.first_wrong == step.key, (name, report.first_wrong)
        diagnosis = report.first_wrong_step.diagnosis
        assert diagnosis is not None and diagnosis.code in ("arithmetic_slip", "unknown", "rounding", "transposed")
        for fmt in ("text", "md", "tex"):
            out = report.render(fmt)
            assert step.id in out.replace("\\_", "_"), (fmt, lang)
        data = json.loads(json.dumps(report.to_dict()))
        assert data["first_wrong"] == step.key
        message = data["steps"][[s["key"] for s in data["steps"]].index(step.key)]["diagnosis"]["message"]
        if lang == "zh":
            assert re.search(r"[\u4e00-\u9fff]", message)
            assert not re.search(r"\b(the|wrong|recompute|entry|entries|mistake)\b", message, re.I), message


def test_answer_names_the_trace_steps_for_an_id_it_lacks():
    name, trace = next((n, t) for n, t in TRACES if n == "causal-mask")
    with pytest.raises(BadInput) as e:
        attntrace.check(trace, {"Q_rope": [[1.0]]})
    assert "\n" not in str(e.value) and "Q_rope" in str(e.value) and "scores" in str(e.value)
    with pytest.raises(BadInput) as e:
        attntrace.check(trace, {"Qrope": [[1.0]]})
    assert "unknown step 'Qrope'" in str(e.value) and "masked" in str(e.value)


def test_a_per_head_new_step_is_given_in_a_head_table():
    name, trace = next((n, t) for n, t in TRACES if n == "alibi-causal")
    answer = own_answer(trace)
    per_head = {"head": {"1": {"biased": answer.pop("biased@1")}}}
    answer.update(per_head)
    assert attntrace.check(trace, answer).ok


# -- carried forward through the linear new kinds, and their planted mistakes -------------------------
def _rand_spec(rng, n=3, d_model=4, d_k=2, h=1, n_kv=0, **extra) -> dict:
    w = lambda cols: np.round(rng.uniform(-1, 1, size=(d_model, cols)), 1).tolist()  # noqa: E731
    spec = {"X": rng.integers(-3, 4, size=(n, d_model)).astype(float).tolist()}
    if n_kv:
        spec["X_kv"] = rng.integers(-3, 4, size=(n_kv, d_model)).astype(float).tolist()
    h_kv = extra.get("num_kv_heads") or h
    spec.update({"W_Q": w(h * d_k), "W_K": w(h_kv * d_k), "W_V": w(h_kv * d_k)})
    if h > 1:
        spec["num_heads"] = h
        spec["W_O"] = np.round(rng.uniform(-1, 1, size=(h * d_k, d_model)), 1).tolist()
    spec.update(extra)
    return spec


def _values(trace) -> dict:
    return {s.key: to_float(s.value) for s in trace.steps}


def _named(step, code) -> bool:
    d = step.diagnosis
    return d is not None and (d.code == code or code in {a.code for a in d.alternatives})


def _answer(values: dict, keys) -> dict:
    return {k: [[_entry(x) for x in row] for row in values[k]] for k in keys}


def test_a_wrong_projection_is_carried_through_rope_alibi_and_the_cache():
    """The student's W_Q (or W_K) entry is off, so their Q (or K) is wrong; every later step is
    computed right from it (by the tracer on the student's weights): those steps are carried."""
    rng = np.random.default_rng(1)
    cases = [("W_Q", _rand_spec(rng, d_k=4, rope={"layout": "half"})),
             ("W_K", _rand_spec(rng, d_k=4, rope={"layout": "interleaved"})),
             ("W_Q", _rand_spec(rng, h=2, alibi=True, mask="causal")),
             ("W_K", {**_rand_spec(rng, n=1), "K_past": rng.integers(-2, 3, size=(2, 2)).tolist(),
                      "V_past": rng.integers(-2, 3, size=(2, 2)).tolist()})]
    for weight, spec in cases:
        spec["X"][0][0] = 2.0
        trace = attntrace.run(spec, mode="numeric")
        wrong = {**spec, weight: [[x + (1.0 if (i, j) == (0, 0) else 0.0) for j, x in enumerate(row)]
                                  for i, row in enumerate(spec[weight])]}
        mine = _values(attntrace.run(wrong, mode="numeric"))
        report = attntrace.check(trace, _answer(mine, [s.key for s in trace.steps]))
        first = weight[-1] + ("@1" if trace.num_heads > 1 else "")
        assert report.first_wrong == first, (spec, report.first_wrong)
        statuses = {s.key: s.status for s in report.steps}
        new = [k for k in statuses if k.split("@")[0] in ("Q_rope", "K_rope", "K_cache", "biased")]
        assert any(statuses[k] == "carried" for k in new), statuses
        assert all(statuses[k] in ("carried", "correct") for k in new), statuses
        assert [k for k, v in statuses.items() if v == "wrong"] == [first], statuses


def _spec_variant(code, rng):
    """(true spec, the student's spec that makes `code`) for a random problem with the feature."""
    if code == "rope_wrong_layout":
        layout = rng.choice(["half", "interleaved"])
        spec = _rand_spec(rng, n=int(rng.integers(2, 5)), d_k=4, h=int(rng.integers(1, 3)), rope={"layout": str(layout)})
        return spec, {**spec, "rope": {"layout": "half" if layout == "interleaved" else "interleaved"}}
    if code == "rope_positions_from_1":
        n = int(rng.integers(2, 5))
        spec = _rand_spec(rng, n=n, d_k=int(rng.choice([2, 4])), rope={"layout": "half"})
        return spec, {**spec, "rope": {"layout": "half", "positions": list(range(1, n + 1))}}
    if code == "window_off_by_one":
        n = int(rng.integers(3, 6))
        spec = _rand_spec(rng, n=n, window=int(rng.integers(1, n - 1)))
        return spec, {**spec, "window": spec["window"] + 1}
    if code == "causal_top_left_decoding":
        spec = _rand_spec(rng, n=2, n_kv=int(rng.integers(3, 5)), mask="causal_bottom_right")
        return spec, {**spec, "mask": "causal"}
    raise AssertionError(code)


def _numpy_student(code, rng):
    """(true trace, the student's answer) for the mistakes a spec cannot express, computed in NumPy."""
    if code == "alibi_slope_sign":
        h = int(rng.choice([1, 2, 4]))
        trace = attntrace.run(_rand_spec(rng, n=int(rng.integers(2, 5)), h=h, alibi=True), mode="numeric")
        v = _values(trace)
        head = f"@{h}" if h > 1 else ""
        answer = _answer(v, [s.key for s in trace.steps if s.id in ("Q", "K", "V", "scores", "scaled")])
        wrong = 2 * v["scaled" + head] - v["biased" + head]  # T - B instead of T + B
        answer["biased" + head] = [[_entry(x) for x in row] for row in wrong]
        return trace, answer, "biased" + head
    if code == "rope_rotated_values":
        # V turned too: by Hugging Face's rotate_half (tests/oracles.py), the keys' rotation
        import oracles

        n, h = int(rng.integers(2, 5)), int(rng.choice([1, 2]))
        trace = attntrace.run(_rand_spec(rng, n=n, d_k=4, h=h, rope={"layout": "half"}), mode="numeric")
        v = _values(trace)
        head = f"@{h}" if h > 1 else ""
        keys = [s.key for s in trace.steps]
        answer = _answer(v, keys[:keys.index("Z" + head)])
        wrong = v["weights" + head] @ oracles.rope_half_hf(v["V" + head][None], positions=list(range(n)))[0]
        answer["Z" + head] = [[_entry(x) for x in row] for row in wrong]
        return trace, answer, "Z" + head
    if code == "cache_not_appended":
        past = int(rng.integers(1, 4))
        spec = {**_rand_spec(rng, n=1), "K_past": rng.integers(-2, 3, size=(past, 2)).tolist(),
                "V_past": rng.integers(-2, 3, size=(past, 2)).tolist()}
        trace = attntrace.run(spec, mode="numeric")
        v = _values(trace)
        answer = _answer(v, ["Q", "K", "V"])
        k_past, v_past = np.asarray(spec["K_past"], float), np.asarray(spec["V_past"], float)
        scores = v["Q"] @ k_past.T
        for key, value in (("K_cache", k_past), ("V_cache", v_past), ("scores", scores)):
            answer[key] = [[_entry(x) for x in row] for row in value]
        return trace, answer, "K_cache"
    if code == "kv_head_mapping":
        h, h_kv = [(4, 2), (6, 2), (6, 3)][int(rng.integers(0, 3))]
        trace = attntrace.run(_rand_spec(rng, n=int(rng.integers(2, 4)), h=h, num_kv_heads=h_kv), mode="numeric")
        v = _values(trace)
        answer = _answer(v, [s.key for s in trace.steps if s.id in ("Q", "K", "V")])
        for i in range(1, h + 1):
            j = (i - 1) % h_kv + 1
            answer[f"scores@{i}"] = [[_entry(x) for x in row] for row in v[f"Q@{i}"] @ v[f"K@{j}"].T]
        first = next(f"scores@{i}" for i in range(1, h + 1) if (i - 1) % h_kv != (i - 1) // (h // h_kv))
        return trace, answer, first
    if code in ("forgot_residual", "posenc_not_added"):
        return _block_student(code, rng)
    if code in BACKWARD_CODES:
        return _backward_student(code, rng)
    if code in ONLINE_CODES:
        return _online_student(code, rng)
    if code in BLOCK_CODES:
        return _block_mistake_student(code, rng)
    trace_spec, student_spec = _spec_variant(code, rng)
    trace = attntrace.run(trace_spec, mode="numeric")
    mine = _values(attntrace.run(student_spec, mode="numeric"))
    truth = _values(trace)
    answer = _answer(mine, [s.key for s in trace.steps])
    first = next(s.key for s in trace.steps
                 if mine[s.key].shape != truth[s.key].shape or (np.isfinite(mine[s.key]) != np.isfinite(truth[s.key])).any()
                 or np.abs(np.where(np.isfinite(truth[s.key]), mine[s.key], 0) - np.where(np.isfinite(truth[s.key]), truth[s.key], 0)).max() > 1e-3)
    return trace, answer, first


def _block_student(code, rng):
    """An encoder block (the post-LN example with a random X): residual1 = the attention output
    alone, or E = X; the steps before it right."""
    import tomllib

    spec = tomllib.loads(example_path("encoder-block-post-ln").read_text())
    spec["X"] = rng.integers(-2, 3, size=np.asarray(spec["X"]).shape).astype(float).tolist()
    trace = attntrace.run(spec, mode="numeric")
    v = _values(trace)
    target, wrong = ("residual1", v["output"]) if code == "forgot_residual" else ("embed", np.asarray(spec["X"]))
    keys = [s.key for s in trace.steps]
    answer = _answer(v, keys[:keys.index(target)])
    answer[target] = [[_entry(x) for x in row] for row in wrong]
    return trace, answer, target


BACKWARD_CODES = ("softmax_backward_no_rowsum", "grad_scale_forgotten", "dV_missing_transpose", "dK_missing_transpose")


def _backward_student(code, rng):
    """A random self-attention with a backward pass (1 or 2 heads, a random dO or the loss sum
    of squares, scaled or not): every step right up to the one the mistake changes (of head 1),
    that one computed the wrong way in NumPy from the true values before it. A problem where the
    mistake cannot show (a zero gradient: dO = 0, or weights rounding to one-hot) is drawn again."""
    while True:
        trace, answer, target, wrong = _backward_draw(code, rng)
        if np.abs(wrong - _values(trace)[target]).max() > 0.01:
            return trace, answer, target


def _backward_draw(code, rng):
    n = int(rng.integers(2, 5))
    h = int(rng.integers(1, 3))
    extra = {}
    if code == "softmax_backward_no_rowsum" and rng.integers(0, 2):
        extra["scale"] = False
    spec = _rand_spec(rng, n=n, h=h, **extra)
    if rng.integers(0, 2):
        spec["backward"] = {"loss": "sum_squares"}
    else:
        width = 4 if h > 1 else 2  # the output (n x d_model) after W_O, else Z (n x d_k)
        spec["backward"] = {"dO": rng.integers(-2, 3, size=(n, width)).astype(float).tolist()}
    trace = attntrace.run(spec, mode="numeric")
    v = _values(trace)
    hd = "@1" if h > 1 else ""
    a = v["weights" + hd]
    if code == "softmax_backward_no_rowsum":
        target = ("dscaled" if "scale" not in extra else "dscores") + hd
        wrong = a * v["dweights" + hd]
    elif code == "grad_scale_forgotten":
        target, wrong = "dscores" + hd, v["dscaled" + hd]
    elif code == "dV_missing_transpose":
        target, wrong = "dV" + hd, a @ v["dZ" + hd]
    else:
        target, wrong = "dK" + hd, v["dscores" + hd] @ v["Q" + hd]
    keys = [s.key for s in trace.steps]
    answer = _answer(v, keys[:keys.index(target)])
    answer[target] = [[_entry(x) for x in row] for row in wrong]
    return trace, answer, target, wrong


ONLINE_CODES = ("online_no_rescale", "lse_without_max")


def _online_student(code, rng):
    """A random online softmax (3 to 6 keys in blocks of 1 to 3, one or two query blocks, 1 or
    2 heads), checked as answers give it today: one value per step id, the last block's (the
    steps of one id share a key). Every step right up to online_out (the last block's O, the
    rescaling dropped, from NumPy's own running maximum over the true scaled scores) or lse
    (log l); a problem where the maximum never moves (nothing to rescale) is drawn again."""
    while True:
        keys, h = int(rng.integers(3, 7)), int(rng.integers(1, 3))
        online = {"block_keys": int(rng.integers(1, 4))}
        if keys < online["block_keys"] + 1:
            continue
        n = int(rng.integers(2, 5))
        if rng.integers(0, 2):
            online["block_queries"] = int(rng.integers(1, n))
        spec = _rand_spec(rng, n=n, n_kv=keys, h=h, online=online)
        trace = attntrace.run(spec, mode="numeric")
        v = _values(trace)
        hd = "@1" if h > 1 else ""
        t, vv = v["scaled" + hd], v["V" + hd]
        bc, br = online["block_keys"], online.get("block_queries", n)
        r0 = (n - 1) // br * br  # the last query block's rows
        m = np.full((n - r0, 1), -np.inf)
        o_wrong = np.zeros((n - r0, vv.shape[1]))
        l_ = np.zeros((n - r0, 1))
        for c0 in range(0, keys, bc):
            tb = t[r0:, c0:c0 + bc]
            m_new = np.maximum(m, tb.max(axis=1, keepdims=True))
            p = np.exp(tb - m_new)
            l_ = np.exp(m - m_new) * l_ + p.sum(axis=1, keepdims=True)
            o_wrong = o_wrong + p @ vv[c0:c0 + bc]
            m = m_new
        if code == "online_no_rescale":
            target, wrong = "online_out" + hd, o_wrong
        else:
            rows = [t[i:i + br] for i in range(0, n, br)]
            target = "lse" + hd
            wrong = np.vstack([np.log(np.exp(r - r.max(axis=1, keepdims=True)).sum(axis=1, keepdims=True)) for r in rows])
        if np.abs(wrong - v[target]).max() > 0.01:
            break
    keys_ = [s.key for s in trace.steps]
    answer = _answer(v, keys_[:keys_.index(target)])
    answer[target] = [[_entry(x) for x in row] for row in wrong]
    return trace, answer, target


BLOCK_CODES = ("norm_unbiased_variance", "norm_wrong_axis", "gelu_relu_confused", "posenc_sin_cos_swapped")


def _block_mistake_student(code, rng):
    """An encoder block (the post-LN example with a random X, a ReLU or a GELU FFN): every step
    right up to norm1 or norm2 (normalised over d - 1, or down the columns), ffn_act (the other
    activation) or pos_enc (cos and sin swapped), that one computed in NumPy from the true values."""
    import math
    import tomllib

    spec = tomllib.loads(example_path("encoder-block-post-ln").read_text())
    spec["X"] = rng.integers(-2, 3, size=np.asarray(spec["X"]).shape).astype(float).tolist()
    act = str(rng.choice(["relu", "gelu"]))
    spec["ffn"]["activation"] = act
    trace = attntrace.run(spec, mode="numeric")
    v = _values(trace)
    if code in ("norm_unbiased_variance", "norm_wrong_axis"):
        which = int(rng.integers(1, 3))
        target, r = f"norm{which}", v[f"residual{which}"]
        axis = 0 if code == "norm_wrong_axis" else 1
        c = r - r.mean(axis=axis, keepdims=True)
        wrong = c / np.sqrt(np.var(r, axis=axis, ddof=1 if code == "norm_unbiased_variance" else 0, keepdims=True) + 1e-5)
    elif code == "gelu_relu_confused":
        h = v["ffn_hidden"]
        gelu = np.vectorize(lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2))))
        target, wrong = "ffn_act", (gelu(h) if act == "relu" else np.maximum(h, 0.0))
    else:
        n, d = v["pos_enc"].shape
        target = "pos_enc"
        wrong = np.array([[(math.cos if j % 2 == 0 else math.sin)(i / 10000 ** ((j - j % 2) / d)) for j in range(d)] for i in range(n)])
    keys = [s.key for s in trace.steps]
    answer = _answer(v, keys[:keys.index(target)])
    answer[target] = [[_entry(x) for x in row] for row in wrong]
    return trace, answer, target


NEW_CODES = ("rope_wrong_layout", "rope_positions_from_1", "rope_rotated_values", "window_off_by_one", "causal_top_left_decoding",
             "alibi_slope_sign", "cache_not_appended", "kv_head_mapping", "forgot_residual", "posenc_not_added") + BACKWARD_CODES + ONLINE_CODES + BLOCK_CODES
SWEEP = 12


@pytest.mark.parametrize("code", NEW_CODES)
def test_each_new_mistake_is_named_where_it_is_made(code):
    rng = np.random.default_rng(sum(map(ord, code)))
    named = 0
    for _ in range(SWEEP):
        trace, answer, first = _numpy_student(code, rng)
        report = attntrace.check(trace, answer)
        assert report.first_wrong == first, (code, report.first_wrong, first)
        wrong = [s for s in report.steps if s.status == "wrong"]
        assert _named(wrong[0], code), (code, wrong[0].diagnosis)
        named += 1
        for lang in ("en", "zh"):
            message = wrong[0].diagnosis.message(lang)
            assert message and "\n" not in message.strip()
            if lang == "zh":
                assert re.search(r"[\u4e00-\u9fff]", message) and not re.search(r"\b(the|Recompute)\b", message)
    assert named == SWEEP


def test_every_new_code_has_both_messages():
    from attntrace.grading.diagnose import CATALOGUE
    from attntrace.resources import templates_dir

    from attntrace.kinds import MISTAKES

    for code in NEW_CODES:
        assert code in CATALOGUE
        for lang in ("en", "zh"):
            # a mistake its kind declares has its sentence in the kind's prose, the others in check/messages
            where = [f"prose/{lang}/{p}.j2" for p in MISTAKES[code][0].sentence_prose] if code in MISTAKES else [f"check/messages.{lang}.j2"]
            assert any(f"macro {code}(d)" in (templates_dir() / w).read_text() for w in where), (code, where)


def test_a_wrong_gradient_is_carried_through_the_backward_steps_of_a_head():
    """The student's dZ has one entry off (they misread dO); dV, dA, dT, dS, dQ, dK and dW_Q,
    dW_K, dW_V computed right from it (by the tracer on their dO) are all carried."""
    rng = np.random.default_rng(7)
    for _ in range(4):
        spec = _rand_spec(rng, n=3)
        spec["backward"] = {"dO": rng.integers(-2, 3, size=(3, 2)).astype(float).tolist()}
        trace = attntrace.run(spec, mode="numeric")
        mine_do = [row[:] for row in spec["backward"]["dO"]]
        mine_do[0][0] += 1.0
        mine = _values(attntrace.run({**spec, "backward": {"dO": mine_do}}, mode="numeric"))
        report = attntrace.check(trace, _answer(mine, [s.key for s in trace.steps if s.id != "dX"]))
        statuses = {s.key: s.status for s in report.steps}
        assert report.first_wrong == "dZ", statuses
        later = ("dV", "dweights", "dscaled", "dscores", "dQ", "dK", "dW_Q", "dW_K", "dW_V")
        assert all(statuses[k] in ("carried", "correct") for k in later), statuses
        assert any(statuses[k] == "carried" for k in later), statuses


def test_a_wrong_running_sum_is_carried_into_the_log_sum_exp():
    """The student's last l is off by 0.5 in row 1; their L = m + log l from it is carried."""
    trace = attntrace.run(str(example_path("online-softmax-4-keys")), mode="numeric")
    v = _values(trace)
    keys = [s.key for s in trace.steps]
    answer = _answer(v, keys[:keys.index("lse")])
    l_ = v["online_sum"].copy()
    l_[0, 0] += 0.5
    answer["online_sum"] = [[_entry(x) for x in row] for row in l_]
    answer["lse"] = [[_entry(x) for x in row] for row in v["online_max"] + np.log(l_)]
    report = attntrace.check(trace, answer)
    assert report.first_wrong == "online_sum"
    assert report.step("lse").status == "carried"
