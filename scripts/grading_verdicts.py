"""A differential check of the checker: many planted answers for every numeric example and every
mistake the checker can plant there, their verdicts saved, and later compared.

    python scripts/grading_verdicts.py save  OUT.json   # plant, check, save answers + verdicts
    python scripts/grading_verdicts.py check OUT.json   # check the saved answers again, compare

`save` plants each of a trace's mutations (`World.mutations`) in a world computed from the
true values and writes every step the mistake leaves computable, at 4 and at 2 decimals, and
once without the steps the mistake changes (so it shows only in later steps); also the clean
answer and one slip (+0.5 in one entry) per step. The answers are stored with the verdicts,
so `check` does not depend on how the planting is implemented: a refactor of the grading must
leave every verdict (status, codes, alternatives, the sentence in en and zh) unchanged.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import attntrace
from attntrace.grading.diagnose import World, to_float
from attntrace.model.errors import BadInput
from attntrace.teach.examples import example_path, list_examples
from attntrace.teach.exercise import make_exercise


def traces():
    out = []
    for name, _ in list_examples():
        try:
            out.append((name, attntrace.run(str(example_path(name)), mode="numeric")))
        except BadInput:  # a symbolic or shape-only example
            continue
    for n, d, heads, seed in ((2, 4, 1, 0), (3, 4, 2, 1), (3, 6, 3, 2), (2, 4, 2, 5)):
        out.append((f"exercise-{n}-{d}-{heads}-{seed}", make_exercise(n, d, heads, seed)[1]))
    return out


def _name(key) -> str:
    return key[0] if key[1] is None else f"{key[0]}@{key[1]}"


def _entry(x: float, decimals: int):
    if np.isneginf(x):
        return "-inf"
    if np.isposinf(x):
        return "inf"
    return round(float(x), decimals)


def _matrix(a: np.ndarray, decimals: int):
    return [[_entry(x, decimals) for x in row] for row in a]


def answers_for(name, trace):
    """[(label, answer dict)] planted in this trace."""
    world = World(trace)
    out = [("clean", {_name(k): _matrix(world.truth[k], 4) for k in world.keys})]
    for k in world.keys:
        t = world.truth[k]
        if t.size and np.isfinite(t.flat[0]):
            a = {_name(j): _matrix(world.truth[j], 4) for j in world.keys}
            a[_name(k)][0][0] = round(float(t.flat[0]) + 0.5, 4)
            out.append((f"slip:{_name(k)}", a))
    for i, m in enumerate(world.mutations):
        try:
            vals = world.recompute({}, m)
        except Exception as exc:  # a planting that crashes is noted, not written
            out.append((f"plant-error:{m.code}:{m.kind}:{i}:{type(exc).__name__}", {}))
            continue
        for decimals, skip in ((4, False), (2, False), (4, True)):
            a = {}
            for k, step in zip(world.keys, world.steps):
                box = vals.get(k)
                if box is None or np.isnan(box.mid).any():
                    continue
                if skip and m.changes(step.id):
                    continue
                a[_name(k)] = _matrix(box.mid, decimals)
            if a:
                out.append((f"plant:{m.code}:{m.kind}:{i}:{decimals}:{'skip' if skip else 'all'}", a))
    return out


def _message(d, lang: str) -> str:
    try:
        return d.message(lang)
    except Exception as exc:  # a sentence that cannot be rendered is a verdict too
        return f"{type(exc).__name__}: {exc}"


def verdict(trace, answer) -> dict:
    try:
        report = attntrace.check(trace, answer)
    except Exception as exc:  # a crash is a verdict too: it must stay the same
        return {"error": f"{type(exc).__name__}: {exc}"}
    steps = []
    for s in report.steps:
        d = s.diagnosis
        row = [s.key, s.status]
        if d is not None:
            row += [d.code, [a.code for a in d.alternatives], _message(d, "en")]
            if s.status == "wrong":
                row.append(_message(d, "zh"))
        steps.append(row)
    return {"ok": report.ok, "first_wrong": report.first_wrong, "steps": steps}


def main(argv):
    what, path = argv[1], argv[2]
    start = time.perf_counter()
    if what == "save":
        cases = []
        for name, trace in traces():
            for label, answer in answers_for(name, trace):
                cases.append({"trace": name, "label": label, "answer": answer, "verdict": verdict(trace, answer)})
        with open(path, "w") as f:
            json.dump(cases, f)
        print(f"saved {len(cases)} answers in {time.perf_counter() - start:.1f}s")
        return 0
    with open(path) as f:
        cases = json.load(f)
    by_name = dict(traces())
    differ = 0
    for case in cases:
        got = json.loads(json.dumps(verdict(by_name[case["trace"]], case["answer"])))
        if got != case["verdict"]:
            differ += 1
            if differ <= 10:
                print("DIFFERS", case["trace"], case["label"], "\n  was", case["verdict"], "\n  now", got)
    print(f"{len(cases) - differ} of {len(cases)} verdicts identical ({time.perf_counter() - start:.1f}s)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
