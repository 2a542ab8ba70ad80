"""What the usual mistakes produce in an exercise, with the checker's sentence for each: the
wrong-answer alternatives of a quiz (Moodle Cloze `~%0%value:tol#feedback`).

Every mistake of the checker's catalogue that can be made in the trace (`grading.diagnose.World`
plants it: no scaling, K Q^T, the softmax down the columns, V A, ...) is computed from the right
earlier steps, and gives the wrong matrix of the step it is made in. A quiz asks each step
on its own, from right earlier values, so the mistakes made in earlier steps are left out:
they do not change what a student computes from the given earlier values. The sentence is the checker's own
(templates/check/messages.<lang>.j2, plain text), so a quiz says what `attntrace check` says.
"""

from __future__ import annotations

import numpy as np

from attntrace.grading.diagnose import World, diagnosis_params
from attntrace.grading.messages import messages
from attntrace.model.trace import Trace

#: a wrong matrix this close to the truth everywhere is not a usable alternative
SAME = 1e-9


def mistake_values(trace: Trace, lang: str = "en", template_dir=None) -> dict[str, list[tuple[list[list[float]], str]]]:
    """{step key: [(the step's value under a usual mistake, the checker's sentence)]}, each
    step's mistakes in catalogue order, those giving the same matrix once (the first kept)."""
    world = World(trace)
    text = messages(lang, template_dir, "text")
    out: dict[str, list[tuple[list[list[float]], str]]] = {}
    for mutation in world.mutations:
        computed = world.recompute({}, mutation)
        for step in trace.steps:
            if not mutation.changes(step.id):
                continue
            box = computed.get(world.key(step))
            truth = world.truth[world.key(step)]
            if box is None or box.shape != truth.shape:
                continue
            wrong = box.mid
            if not np.all(np.isfinite(wrong)) or np.allclose(wrong, truth, rtol=0, atol=SAME):
                continue
            known = out.setdefault(step.key, [])
            if any(np.allclose(wrong, np.asarray(m), rtol=0, atol=SAME) for m, _ in known):
                continue
            sentence = text.diagnosis(mutation.code, diagnosis_params(world, step, mutation))
            known.append((wrong.tolist(), " ".join(sentence.split())))
    return out
