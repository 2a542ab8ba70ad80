"""attntrace.check: plant each usual mistake into a simulated student's hand calculation of
random problems (single- and multi-head, with and without a causal mask) and check the
verdict: the first wrong step, the diagnosis code, and the later steps carried forward.

The student is simulated here in plain NumPy, independently of attntrace: each step is
computed from the student's own *written* (rounded) earlier values, as on paper.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import attntrace
from attntrace.grading.answer import load_answer, parse_entry
from attntrace.grading.checker import check, render_report
from attntrace.model.errors import BadInput


# -- problems ----------------------------------------------------------------------------------
def problem(n=3, d_model=3, d_k=2, h=1, causal=False, seed=0, form="num_heads"):
    """A random problem whose scores are large enough that the mistakes differ at 2 decimals.

    d_model != d_k and d_model != d_k**2, so missing_scale, scaled_by_dk and wrong_dk differ.
    """
    assert d_model != d_k and d_model != d_k ** 2
    rng = np.random.default_rng(seed)
    X = rng.integers(-3, 4, size=(n, d_model)).astype(float)
    while np.linalg.matrix_rank(X) < min(n, d_model):
        X = rng.integers(-3, 4, size=(n, d_model)).astype(float)
    W = [[np.round(rng.uniform(-1, 1, size=(d_model, d_k)), 1) for _ in range(3)] for _ in range(h)]
    spec = {"X": X.tolist()}
    if h == 1:
        spec.update({"W_Q": W[0][0].tolist(), "W_K": W[0][1].tolist(), "W_V": W[0][2].tolist()})
    elif form == "num_heads":
        spec.update({"num_heads": h, **{name: np.hstack([w[i] for w in W]).tolist() for i, name in enumerate(("W_Q", "W_K", "W_V"))}})
    else:
        spec["heads"] = [{"W_Q": q.tolist(), "W_K": k.tolist(), "W_V": v.tolist()} for q, k, v in W]
    WO = None
    if h > 1:
        WO = np.round(rng.uniform(-1, 1, size=(h * d_k, d_model)), 1)
        spec["W_O"] = WO.tolist()
    if causal:
        spec["mask"] = "causal"
    return spec, {"X": X, "W": W, "WO": WO, "d_k": d_k, "d_model": d_model, "h": h, "causal": causal}


def _softmax(t, axis=1):
    m = t.max(axis=axis, keepdims=True)
    e = np.exp(t - m)
    return e / e.sum(axis=axis, keepdims=True)


def simulate(p, plant=None, plant_head=1, decimals=4):
    """The student's written steps {key: matrix of strings}, with `plant` made in head `plant_head`."""
    r = lambda a: np.round(a, decimals)  # noqa: E731 - what the student writes down
    h, multi = p["h"], p["h"] > 1
    out, zs = {}, []
    for i, (WQ, WK, WV) in enumerate(p["W"], start=1):
        mistake = plant if (i == plant_head or not multi) else None
        key = (lambda s: f"{s}@{i}") if multi else (lambda s: s)  # noqa: E731
        Q, K, V = r(p["X"] @ WQ), r(p["X"] @ WK), r(p["X"] @ WV)
        S = r(K @ Q.T if mistake == "transposed_scores" else Q @ K.T)
        factor = {"missing_scale": 1.0, "scaled_by_dk": p["d_k"], "wrong_dk": math.sqrt(p["d_model"])}.get(mistake, math.sqrt(p["d_k"]))
        T = r(S / factor)
        out.update({key("Q"): Q, key("K"): K, key("V"): V, key("scores"): S, key("scaled"): T})
        if p["causal"]:
            keep = np.tril(np.ones(T.shape, dtype=bool))
            T = T if mistake == "mask_ignored" else np.where(keep, T, -np.inf)
            out[key("masked")] = T
        if mistake == "skipped_softmax":
            A = T
        elif mistake == "column_softmax":
            A = _softmax(T, axis=0)
        else:
            A = _softmax(T)
        A = r(A)
        out[key("weights")] = A
        if np.isinf(A).any():  # weights with -inf (softmax skipped after a mask): no Z on paper
            zs = None
            continue
        Z = r(A @ V)
        out[key("Z")] = Z
        if zs is not None:
            zs.append(Z)
    if multi and zs is not None:
        if plant == "concat_rows":
            out["concat"] = r(np.vstack(zs))  # the output can no longer be computed
        else:
            C = r(np.hstack(zs[::-1] if plant == "head_order" else zs))
            out["concat"] = C
            out["output"] = r(C @ p["WO"])
    fmt = lambda x: "-inf" if x == -np.inf else f"{x:.{decimals}f}"  # noqa: E731
    return {k: [[fmt(x) for x in row] for row in v] for k, v in out.items()}


PER_HEAD_TARGET = {"transposed_scores": "scores", "missing_scale": "scaled", "scaled_by_dk": "scaled",
                   "wrong_dk": "scaled", "mask_ignored": "masked", "skipped_softmax": "weights",
                   "column_softmax": "weights"}
ORDER = ["Q", "K", "V", "scores", "scaled", "masked", "weights", "Z"]


def expected_statuses(answer, plant, target_key, multi, plant_head):
    """correct before the planted step, wrong at it, carried after it (in its head and beyond)."""
    out = {}
    for key in answer:
        sid, _, h = key.partition("@")
        h = int(h) if h else None
        if key == target_key:
            out[key] = "wrong"
        elif sid in ("concat", "output"):
            out[key] = "carried" if (sid == "output" or plant in PER_HEAD_TARGET) else "wrong"
        elif multi and h != plant_head:
            out[key] = "correct"
        elif plant in PER_HEAD_TARGET and ORDER.index(sid) > ORDER.index(PER_HEAD_TARGET[plant]):
            out[key] = "carried"
        else:
            out[key] = "correct"
    return out


SINGLE = [dict(n=3, d_model=3, d_k=2, seed=1), dict(n=2, d_model=5, d_k=3, seed=2), dict(n=4, d_model=3, d_k=2, seed=3, causal=True)]
MULTI = [dict(n=3, d_model=6, d_k=2, h=2, seed=4), dict(n=2, d_model=5, d_k=2, h=3, seed=5, causal=True, form="heads")]
CASES = []
for i, kw in enumerate(SINGLE + MULTI):
    for code in PER_HEAD_TARGET:
        if code == "mask_ignored" and not kw.get("causal"):
            continue
        CASES.append((kw, code, 4 if (i + len(CASES)) % 3 else 2))
    if kw.get("h", 1) > 1:
        CASES += [(kw, "concat_rows", 3), (kw, "head_order", 4)]


def _status(result):
    """A step moved only by the student's own correct earlier rounding is carried with the remark
    early_rounding: no mistake, counted here as correct."""
    if result.status == "carried" and result.diagnosis is not None and result.diagnosis.code == "early_rounding":
        return "correct"
    return result.status


@pytest.mark.parametrize("kw,code,decimals", CASES,
                         ids=[f"{'h' + str(kw.get('h', 1))}-n{kw['n']}-{code}-{d}dp" for kw, code, d in CASES])
def test_planted_mistake_is_found(kw, code, decimals):
    spec, p = problem(**kw)
    multi = p["h"] > 1
    plant_head = 2 if multi else 1
    answer = simulate(p, plant=code, plant_head=plant_head, decimals=decimals)
    if code in PER_HEAD_TARGET:
        target = PER_HEAD_TARGET[code] + (f"@{plant_head}" if multi else "")
    else:
        target = "concat"
    report = check(spec, answer)
    got = {s.key: _status(s) for s in report.steps}
    assert got == expected_statuses(answer, code, target, multi, plant_head)
    assert report.ok is False and report.first_wrong == target
    wrong = [s for s in report.steps if s.status == "wrong"]
    assert [s.key for s in wrong] == [target]
    assert wrong[0].diagnosis.code == code, wrong[0].diagnosis
    assert wrong[0].diagnosis.message("en") and wrong[0].diagnosis.message("zh")
    for s in report.steps:
        assert (s.diagnosis is None or s.diagnosis.code == "early_rounding") == (s.status != "wrong")
    d = report.to_dict()
    assert d["first_wrong"] == target and d["steps"][0]["diagnosis"] is None


@pytest.mark.parametrize("decimals", [2, 3, 4])
@pytest.mark.parametrize("kw", SINGLE + MULTI, ids=lambda kw: f"h{kw.get('h', 1)}-n{kw['n']}-s{kw['seed']}")
def test_correct_answers_rounded_are_accepted(kw, decimals):
    spec, p = problem(**kw)
    chained = simulate(p, decimals=decimals)  # each step from the student's own rounded values
    report = check(spec, chained)
    assert report.ok, [(s.key, s.status, s.wrong_entries[:1]) for s in report.steps if s.status != "correct"]
    assert report.first_wrong is None and all(_status(s) == "correct" for s in report.steps)
    # the truth rounded step by step, written as numbers (decimals inferred from repr)
    trace = attntrace.run(spec)
    rounded = {s.key: np.round(s.value, decimals).tolist() for s in trace.steps}
    assert check(trace, rounded).ok


def test_only_later_steps_given_still_diagnosed():
    """Weights from unscaled scores, without writing the scaled step: missing_scale."""
    spec, p = problem(n=3, d_model=3, d_k=2, seed=7)
    full = simulate(p, plant="missing_scale")
    report = check(spec, {"scores": full["scores"], "weights": full["weights"], "Z": full["Z"]})
    assert report.first_wrong == "weights"
    assert report.step("weights").diagnosis.code == "missing_scale"
    assert report.step("Z").status == "carried" and report.step("scores").status == "correct"
    # nothing but Z: the mistake is still named
    z_only = check(spec, {"Z": full["Z"]})
    assert z_only.step("Z").diagnosis.code == "missing_scale"


def test_article_softmax_claim_is_skipped_softmax():
    spec = {"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False}
    report = check(spec, {"weights": [[0.8, 0.2], [0.3, 0.7]]})
    assert not report.ok and report.first_wrong == "weights"
    s = report.step("weights")
    assert s.diagnosis.code == "skipped_softmax"
    # written with 1 decimal, 0.3 and 0.7 are not 0.4013 and 0.5987 rounded (0.4, 0.6): every entry is off
    assert [(e.row, e.col) for e in s.wrong_entries] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert s.wrong_entries[0].expected == pytest.approx(0.645656, abs=1e-6) and s.wrong_entries[0].given == 0.8
    assert check(spec, {"weights": [[0.65, 0.35], [0.40, 0.60]]}).ok
    assert check(spec, {"weights": [["0.6457", "0.3543"], ["0.4013", "0.5987"]]}).ok


def test_tolerance_follows_how_numbers_are_written():
    spec = {"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False}  # weights 0.645656.., 0.354344.., 0.401312.., 0.598688..
    ok = lambda w, **kw: check(spec, {"weights": w}, **kw).ok  # noqa: E731
    assert ok([[0.65, 0.35], [0.4, 0.6]])
    assert not ok([[0.66, 0.34], [0.39, 0.61]])      # one unit in the last place: not the true value rounded
    assert check(spec, {"weights": [[0.66, 0.34], [0.39, 0.61]]}).step("weights").diagnosis.code == "rounding"
    assert not ok([[0.67, 0.33], [0.40, 0.60]])      # two units
    assert ok([["0.646", "0.354"], ["0.401", "0.599"]])
    assert not ok([["0.650", "0.350"], ["0.400", "0.600"]])  # 3 decimals written: 0.650 is 4 units off
    assert not ok([[1, 0], [0, 1]])                  # integers must be exact
    assert ok([[0.7, 0.3], [0.4, 0.6]], atol=0.06)   # --atol overrides
    assert not ok([[0.65, 0.35], [0.40, 0.60]], atol=1e-4)
    assert parse_entry(0.65, "x").decimals == 2 and parse_entry("0.650", "x").decimals == 3
    assert parse_entry("1.5e-3", "x").decimals == 4 and parse_entry(3, "x").kind == "exact"


def test_raw_text_of_toml_and_json_numbers_is_kept(tmp_path):
    spec = {"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False}
    toml = tmp_path / "a.toml"
    toml.write_text("weights = [[0.650, 0.350], [0.400, 0.600]]\n", encoding="utf-8")
    assert not check(spec, toml).ok  # 0.650 has 3 decimals: too far from 0.6457
    toml.write_text("weights = [[0.65, 0.35], [0.40, 0.60]]\n", encoding="utf-8")
    assert check(spec, toml).ok
    js = tmp_path / "a.json"
    js.write_text('{"weights": [[0.650, 0.350], [0.400, 0.600]]}', encoding="utf-8")
    assert not check(spec, js).ok


def test_exact_forms_and_masked_entries():
    spec = {"Q": [[1, 0], [0, 1]], "K": [[1, 1], [0, 1]], "V": [[1, 0], [0, 1]], "mask": "causal"}
    exact = check(spec, {"scaled": [["sqrt(2)/2", 0], ["sqrt(2)/2", "sqrt(2)/2"]],
                         "masked": [["sqrt(2)/2", "-inf"], ["1/sqrt(2)", "sqrt(2)/2"]],
                         "weights": [[1, 0], ["1/2", "1/2"]]}, mode="exact")
    assert exact.ok, exact.to_dict()
    decimals = check(spec, {"masked": [[0.7071, "-inf"], [0.7071, 0.7071]], "weights": [[1, 0], [0.5, 0.5]]})
    assert decimals.ok
    ignored = check(spec, {"masked": [[0.7071, 0], [0.7071, 0.7071]]})
    assert ignored.step("masked").diagnosis.code == "mask_ignored"
    assert [(e.row, e.col, e.expected) for e in ignored.step("masked").wrong_entries] == [(1, 2, -math.inf)]
    assert ignored.to_dict()["steps"][0]["wrong_entries"][0]["expected"] == "-inf"


def test_wrong_shape_is_reported_not_raised():
    spec = {"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False}
    report = check(spec, {"weights": [[0.6457, 0.3543, 0.1]]})
    s = report.step("weights")
    assert s.status == "wrong" and s.diagnosis.code == "wrong_shape" and s.wrong_entries == ()
    assert report.to_dict()["steps"][0]["given_shape"] == [1, 3]
    assert "1 × 3" in render_report(report, "text")


def test_unknown_mistake_is_said():
    report = check({"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False}, {"weights": [[0.9, 0.1], [0.5, 0.5]]})
    assert report.step("weights").diagnosis.code == "unknown"


def test_head_table_and_key_forms_are_the_same(tmp_path):
    spec, p = problem(n=3, d_model=6, d_k=2, h=2, seed=4)
    answer = simulate(p, plant="column_softmax", plant_head=2)
    toml = tmp_path / "answer.toml"
    toml.write_text('[head.1]\nweights = %s\n\n[head.2]\nweights = %s\n' % (answer["weights@1"], answer["weights@2"]), encoding="utf-8")
    report = check(spec, toml)
    assert report.first_wrong == "weights@2" and report.step("weights", 2).diagnosis.code == "column_softmax"
    assert report.step("weights", 1).status == "correct"
    keyed = check(spec, {"weights@1": answer["weights@1"], "weights@2": answer["weights@2"]})
    assert keyed.to_dict() == report.to_dict()
    with pytest.raises(BadInput, match="twice"):
        load_answer({"weights@2": answer["weights@2"], "head": {"2": {"weights": answer["weights@2"]}}})


@pytest.mark.parametrize("answer,needle", [
    ({"weights": [[1, 2], [3]]}, "ragged"),
    ({"weight": [[1]]}, "unknown step 'weight'"),
    ({"weights": [["abc", 1], [1, 2]]}, "row 1, column 1"),
    ({"weights": [["__import__('os')", 1], [1, 2]]}, "row 1, column 1"),
    ({"weights": [[True, 1], [1, 2]]}, "not a number"),
    ({"weights": [["inf", 1], [1, 2]]}, "only -inf"),
    ({"weights@2": [[1, 0], [0, 1]]}, "single head"),
    ({"masked": [[1, 0], [0, 1]]}, "no step masked"),
    ({"scores": [[1, 0], [0, 1]]}, "given in the problem"),
    ({}, "no steps"),
    ({"head": {"x": {"weights": [[1]]}}}, "numbered"),
])
def test_bad_answers_raise_one_line_bad_input(answer, needle):
    with pytest.raises(BadInput) as err:
        check({"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False}, answer)
    assert needle.lower() in str(err.value).lower() and "\n" not in str(err.value)


@pytest.mark.parametrize("fmt", ["text", "md", "tex"])
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_reports_speak_to_the_student(fmt, lang):
    spec, p = problem(n=3, d_model=3, d_k=2, seed=1)
    report = check(spec, simulate(p, plant="scaled_by_dk"), lang=lang)
    text = render_report(report, fmt, lang=lang)
    assert ("scaled\\_by\\_dk" if fmt == "tex" else "scaled_by_dk") in text
    if lang == "zh":
        assert "第一个出错的步骤" in text and "沿用前错" in text and "误差传递" not in text
    else:
        assert "The first wrong step is" in text and "carried forward" in text.lower()
    ok = render_report(check(spec, simulate(p)), fmt, lang=lang)
    assert ("正确" in ok) if lang == "zh" else ("Every step you gave is correct" in ok)


def test_markdown_report_math_parses(katex):
    from mathcheck import markdown_math_spans

    spec, p = problem(n=3, d_model=6, d_k=2, h=2, seed=4, causal=True)
    spans = []
    for code in ("wrong_dk", "mask_ignored", "skipped_softmax", "head_order", "concat_rows", "transposed_scores"):
        report = check(spec, simulate(p, plant=code, plant_head=2))
        for lang in ("en", "zh"):
            found = markdown_math_spans(render_report(report, "md", lang=lang))
            assert found, (code, lang)
            spans += found
    assert katex(spans) == []  # one KaTeX run for every span


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_standalone_tex_report_compiles(xelatex, lang):
    spec, p = problem(n=3, d_model=6, d_k=2, h=2, seed=4, causal=True)
    report = check(spec, simulate(p, plant="missing_scale", plant_head=2))
    tex = render_report(report, "tex", lang=lang, standalone=True)
    ok, log, _ = xelatex(tex)
    assert ok, log


def test_exercise_answer_key_checks_as_correct(tmp_path):
    """The answer file `attntrace exercise --answer-out` writes is an answer this checker reads."""
    from attntrace.teach import answerkey
    spec, p = problem(n=3, d_model=6, d_k=2, h=2, seed=4, causal=True)
    trace = attntrace.run(spec)
    path = tmp_path / "key.toml"
    path.write_text(answerkey.to_toml(answerkey.answer_key(trace)), encoding="utf-8")
    assert check(trace, path).ok
