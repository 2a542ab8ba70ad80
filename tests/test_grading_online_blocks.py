"""The checker judges every block of the online softmax and carries forward through each.

Each student here is an independent NumPy computation of FlashAttention-2's loop (Algorithm 1),
not attntrace's: they round every quantity (S, T, the weights, m, P-tilde, l and O of every
block, L, Z) to a few decimals and go on from the rounded value, or slip in one block and go on
from the slip. The checker must mark every block computed right from the student's own values
`correct` or `carried`, never `wrong`, and find a wrong block at that block, with its entry.
The answer key names every block, and checking it marks every block correct.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import attntrace
from attntrace.teach.answerkey import answer_key

BLOCK_IDS = ("online_max", "online_exp", "online_sum", "online_out")


def _problem(rng, mask: str | None):
    n, keys, d, dv = int(rng.integers(2, 5)), int(rng.integers(3, 7)), int(rng.integers(1, 4)), int(rng.integers(1, 3))
    bc, br = int(rng.integers(1, keys)), int(rng.integers(1, n + 1))
    q, k, v = (np.round(rng.normal(size=s) * 1.5, 2) for s in ((n, d), (keys, d), (keys, dv)))
    spec = {"Q": q.tolist(), "K": k.tolist(), "V": v.tolist(), "online": {"block_keys": bc, "block_queries": br}}
    keep = np.ones((n, keys), dtype=bool)
    if mask == "causal":
        keys = max(keys, n)
        spec["K"], spec["V"] = (np.round(rng.normal(size=(keys, x.shape[1])), 2).tolist() for x in (k, v))
        keep = np.tril(np.ones((n, keys), dtype=bool))
        spec["mask"] = "causal"
    elif mask == "random":
        keep = rng.random((n, keys)) < 0.5
        keep[np.arange(n), rng.integers(0, keys, size=n)] = True
        spec["mask"] = keep.astype(int).tolist()
    return spec, keep


def _address(step_id, qb, j, query_blocks):
    return f"{step_id}#{j}" if query_blocks == 1 else f"{step_id}#{qb}.{j}"


def online_student(spec, keep, decimals: int, slip=None) -> dict:
    """The whole answer, each step rounded to `decimals` and the next computed from it.
    slip = (step id, query block, key block, row, change): that entry changed where it is
    written, and every later quantity computed from the changed value."""
    r = lambda x: np.round(x, decimals)  # noqa: E731
    q, k, v = (np.asarray(spec[x], dtype=float) for x in "QKV")
    bc, br = spec["online"]["block_keys"], spec["online"]["block_queries"]
    n, keys = q.shape[0], k.shape[0]
    s = r(q @ k.T)
    t = r(s / math.sqrt(q.shape[1]))
    answer = {"scores": s, "scaled": t}
    if "mask" in spec:
        t = np.where(keep, t, -np.inf)
        answer["masked"] = t
    e = np.exp(t - t.max(axis=1, keepdims=True))
    answer["weights"] = r(e / e.sum(axis=1, keepdims=True))
    query_blocks = -(-n // br)
    ls, ms, os_ = [], [], []
    for qb, r0 in enumerate(range(0, n, br), start=1):
        rows = slice(r0, min(n, r0 + br))
        m, l_, o = None, None, None
        for j, c0 in enumerate(range(0, keys, bc), start=1):
            tb, vb = t[rows, c0:c0 + bc], v[c0:c0 + bc]

            def put(step_id, value):
                value = r(value)
                if slip is not None and slip[:3] == (step_id, qb, j):
                    value = value.copy()
                    value[slip[3], 0] += slip[4]
                answer[_address(step_id, qb, j, query_blocks)] = value
                return value

            m_new = put("online_max", tb.max(axis=1, keepdims=True) if m is None else np.maximum(m, tb.max(axis=1, keepdims=True)))
            safe = np.where(np.isneginf(m_new), 0.0, m_new)
            p = put("online_exp", np.where(np.isneginf(tb), 0.0, np.exp(tb - safe)))
            if m is None:
                l_, o = put("online_sum", p.sum(axis=1, keepdims=True)), put("online_out", p @ vb)
            else:
                alpha = np.where(np.isneginf(m), 0.0, np.exp(m - safe))
                l_ = put("online_sum", alpha * l_ + p.sum(axis=1, keepdims=True))
                o = put("online_out", alpha * o + p @ vb)
            m = m_new
        ms.append(m), ls.append(l_), os_.append(o)
    answer["lse"] = r(np.vstack(ms) + np.log(np.vstack(ls)))
    answer["Z"] = r(np.vstack(os_) / np.vstack(ls))
    return answer


def _check(spec, answer):
    return attntrace.check(spec, {key: np.asarray(val).tolist() for key, val in answer.items()})


@pytest.mark.parametrize("decimals", [2, 3, 4])
@pytest.mark.parametrize("mask", [None, "causal", "random"])
def test_rounded_right_answer_is_never_wrong_in_any_block(decimals, mask):
    rng = np.random.default_rng(1000 * decimals + hash(mask) % 97)
    for _ in range(12):
        spec, keep = _problem(rng, mask)
        answer = online_student(spec, keep, decimals)
        report = _check(spec, answer)
        statuses = {s.key: s.status for s in report.steps}
        assert set(statuses) == set(answer)  # every block is judged, under its own key
        assert "wrong" not in statuses.values(), (spec, statuses)


def test_every_block_is_checked_on_its_own():
    """A wrong block 1 is found even when block 2 is right: blocks do not share a key."""
    spec = {"Q": [[1, 0], [0, 2]], "K": [[1, 0], [0, 1], [2, 1], [-1, 1]], "V": [[1, 0], [0, 1], [2, 2], [1, -1]],
            "online": {"block_keys": 2, "block_queries": 2}}
    answer = online_student(spec, None, 4, slip=("online_exp", 1, 1, 0, 0.25))
    # the slip is in P^(1) (row 1); l^(1) and O^(1) computed from it, then block 2 from those
    report = _check(spec, answer)
    wrong = [s for s in report.steps if s.status == "wrong"]
    assert [s.key for s in wrong] == ["online_exp#1"]
    assert report.step("online_sum#1").status == "carried" and report.step("online_out#1").status == "carried"
    assert report.step("online_max#2").status == "correct"


@pytest.mark.parametrize("seed", range(6))
def test_slip_in_block_1_max_is_carried_into_block_2(seed):
    """m^(1) too large by 0.5 in row 1: P^(1), l^(1), O^(1) and the later blocks computed right
    from it are carried (the loop is right for any running maximum, so L and Z come out right)."""
    rng = np.random.default_rng(seed)
    while True:
        spec, keep = _problem(rng, None)
        n, keys, bc = len(spec["Q"]), len(spec["K"]), spec["online"]["block_keys"]
        if keys > bc:
            break
    spec["online"]["block_queries"] = n  # one query block: addresses online_max#j
    answer = online_student(spec, keep, 4, slip=("online_max", 1, 1, 0, 0.5))
    report = _check(spec, answer)
    statuses = {s.key: s.status for s in report.steps}
    assert statuses["online_max#1"] == "wrong" and report.first_wrong == "online_max#1"
    assert [k for k, st in statuses.items() if st == "wrong"] == ["online_max#1"], statuses
    for step_id in ("online_exp", "online_sum", "online_out"):
        assert statuses[f"{step_id}#1"] == "carried", statuses
    later = [st for k, st in statuses.items() if "#" in k and not k.endswith("#1")]
    assert later and "carried" in later and set(later) <= {"correct", "carried"}, statuses
    assert statuses["lse"] in ("correct", "carried") and statuses["Z"] in ("correct", "carried")


def test_wrong_block_2_is_found_at_block_2_with_its_entry():
    trace = attntrace.run("online-softmax-4-keys")
    spec = {"Q": [[1, 0], [0, 2]], "K": [[1, 0], [0, 1], [2, 1], [-1, 1]], "V": [[1, 0], [0, 1], [2, 2], [1, -1]],
            "online": {"block_keys": 2, "block_queries": 2}}
    answer = online_student(spec, None, 4, slip=("online_sum", 1, 2, 1, 0.3))  # l^(2), row 2
    report = attntrace.check(trace, {key: np.asarray(val).tolist() for key, val in answer.items()})
    assert report.first_wrong == "online_sum#2"
    bad = report.step("online_sum#2")
    assert [(e.row, e.col) for e in bad.wrong_entries] == [(2, 1)]
    assert bad.wrong_entries[0].expected == pytest.approx(float(trace.step("online_sum", block=2).value[1, 0]))
    for step_id in BLOCK_IDS:
        assert report.step(f"{step_id}#1").status == "correct"
    assert report.step("Z").status == "carried"  # Z from the student's own l^(2)


def test_dropped_rescaling_is_named_in_the_block_it_is_made():
    """online_no_rescale at block 2: O^(2) = O^(1) + P^(2) V_2 from the student's own O^(1)."""
    trace = attntrace.run("online-softmax-4-keys")
    answer = answer_key(trace)
    o1 = np.asarray(answer["online_out#1"])
    p2 = np.asarray(answer["online_exp#2"])
    v = np.asarray([[1, 0], [0, 1], [2, 2], [1, -1]], dtype=float)
    answer["online_out#2"] = np.round(o1 + p2 @ v[2:], 4).tolist()
    report = attntrace.check(trace, answer)
    assert report.first_wrong == "online_out#2"
    assert report.step("online_out#2").diagnosis.code == "online_no_rescale"


def test_answer_key_names_every_block_and_is_all_correct():
    spec = {"Q": [[1, 0], [0, 2], [1, 1]], "K": [[1, 0], [0, 1], [2, 1], [-1, 1], [0, 0]],
            "V": [[1, 0], [0, 1], [2, 2], [1, -1], [3, 1]], "num_heads": 1,
            "online": {"block_keys": 2, "block_queries": 2}}
    trace = attntrace.run(spec)
    key = answer_key(trace)
    blocks = [k for k in key if k.partition("#")[0] in BLOCK_IDS]
    # 2 query blocks x 3 key blocks x 4 quantities, each under its own address
    assert len(blocks) == 24 and len(set(blocks)) == 24
    assert "online_max#2.3" in key and "online_max" not in key
    np.testing.assert_allclose(key["online_sum#1.2"], np.round(trace.step("online_sum", query_block=1, block=2).value, 4))
    report = attntrace.check(trace, key)
    assert report.ok and len(report.steps) == len(trace.steps)
    assert all(s.status == "correct" for s in report.steps)


def test_two_heads_answer_key_names_blocks_per_head():
    rng = np.random.default_rng(3)
    spec = {"Q": rng.normal(size=(3, 4)).round(2).tolist(), "K": rng.normal(size=(4, 4)).round(2).tolist(),
            "V": rng.normal(size=(4, 4)).round(2).tolist(), "num_heads": 2, "online": {"block_keys": 2}}
    trace = attntrace.run(spec)
    key = answer_key(trace)
    assert {"online_out#1@1", "online_out#2@1", "online_out#1@2", "online_out#2@2"} <= set(key)
    report = attntrace.check(trace, key)
    assert report.ok and len(report.steps) == len(trace.steps)


def test_naming_one_block_twice_is_refused():
    trace = attntrace.run("online-softmax-4-keys")
    key = answer_key(trace)
    key["online_max"] = key["online_max#2"]  # the plain id is the last block
    with pytest.raises(attntrace.BadInput, match="online_max#2.*give it once"):
        attntrace.check(trace, key)


def _box(rng, shape, scale=2.0, width=0.05):
    from attntrace.grading.intervals import Box

    mid = rng.normal(size=shape) * scale
    rad = rng.random(shape) * width
    return Box(mid - rad, mid + rad)


def _sample(rng, box):
    return box.lo + (box.hi - box.lo) * rng.random(box.lo.shape)


def test_block_enclosures_hold_every_point_of_the_boxes():
    """Each rule's bound contains the NumPy computation at points drawn inside the boxes (and
    at their corners): a valid enclosure, not a first-order guess."""
    from types import SimpleNamespace

    from attntrace.grading.kindcarry import TOOLKIT as iv
    from attntrace.kinds.online import carry_block

    rng = np.random.default_rng(7)
    for _ in range(300):
        rows, cols, dv = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 3))
        t, v = _box(rng, (rows, cols), 3.0), _box(rng, (cols, dv))
        m_prev, m_new = _box(rng, (rows, 1), 3.0), _box(rng, (rows, 1), 3.0)
        l_prev, o_prev = _box(rng, (rows, 1), 2.0), _box(rng, (rows, dv))
        p = _box(rng, (rows, cols), 1.0)
        det = {"rows": (1, rows), "cols": (1, cols), "block": 2, "query_block": 1, "query_blocks": 1}
        mx = carry_block(iv, SimpleNamespace(details=det, id="online_max"), [t, m_prev], None)
        ex = carry_block(iv, SimpleNamespace(details=det, id="online_exp"), [t, m_new], None)
        sm = carry_block(iv, SimpleNamespace(details=det, id="online_sum"), [p, l_prev, m_prev, m_new], None)
        out = carry_block(iv, SimpleNamespace(details=det, id="online_out"), [p, v, o_prev, m_prev, m_new], None)
        for k in range(20):
            pick = (lambda b: b.lo) if k == 0 else (lambda b: b.hi) if k == 1 else (lambda b: _sample(rng, b))  # noqa: E731
            tt, mp, mn, ll, oo, pp, vv = (pick(b) for b in (t, m_prev, m_new, l_prev, o_prev, p, v))
            alpha = np.exp(mp - mn)
            for box, x in ((mx, np.maximum(mp, tt.max(axis=1, keepdims=True))), (ex, np.exp(tt - mn)),
                           (sm, alpha * ll + pp.sum(axis=1, keepdims=True)), (out, alpha * oo + pp @ vv)):
                assert np.all(box.lo <= x) and np.all(x <= box.hi)


def test_class_scores_every_block():
    """A class grades each block as a step of its own: the full key scores every block; a slip
    in m^(1) carried on loses that one step; a plain online_max counts as the last block."""
    from attntrace.teach.classcheck import check_class

    spec = {"Q": [[1, 0], [0, 2]], "K": [[1, 0], [0, 1], [2, 1], [-1, 1]], "V": [[1, 0], [0, 1], [2, 2], [1, -1]],
            "online": {"block_keys": 2, "block_queries": 2}}
    trace = attntrace.run(spec)
    full = answer_key(trace)
    slip = {k: np.asarray(v).tolist() for k, v in online_student(spec, None, 4, slip=("online_max", 1, 1, 0, 0.5)).items()}
    plain = {"online_max": full["online_max#2"], "student": "plain"}
    result = check_class(trace, [{**full, "student": "key"}, {**slip, "student": "slip"}, plain])
    key, slipped, last = result.students
    assert len(key.statuses) == len(trace.steps) and key.points == key.max_points == len(trace.steps)
    assert slipped.points == slipped.max_points - 1 and slipped.statuses["online_max#1"] == "wrong"
    assert last.statuses["online_max#2"] == "correct" and last.points == 1
