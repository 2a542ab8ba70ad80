"""Exercises as a Numbas exam with adaptive marking (error carried forward).

    >>> from attntrace.teach import lms, numbas
    >>> variants = lms.make_variants(n=2, d=4, heads=1, seed=7)
    >>> text = numbas.exam_text(variants, lang="en")   # `attntrace exercise --format numbas -o quiz.exam`

One question per variant, one matrix-entry part per step of the trace, in trace order. The
question's variables are the given matrices (JME matrix literals) and one variable per step,
defined by the step's formula in JME from the variables it reads (``Q1 = X * WQ1``,
``S1 = Q1 * transpose(K1)``, the softmax row by row, ...). A later part names the earlier
parts whose values it reads in ``variableReplacements``: Numbas then marks it against its
formula evaluated on the student's own answers to those parts, so one wrong Q does not fail
every later step (the checker's "carried forward").

Tolerance per part: half a unit in the 4th decimal (the answers are asked rounded to 4
decimals) plus the rounding of its inputs carried through the step. The inputs the student
types are themselves rounded to 4 decimals (error at most d = 5e-5 an entry), and the part is
marked against the formula on those rounded inputs, while a careful student may have kept
more digits. The slack bounds that difference from the true values, with a factor 2 for
inputs that are not the true ones (a carried-forward answer): a product C = A B gets
sum_k (|A_ik| + |B_kj|) d (an input of whole numbers was typed exactly and adds nothing), the
scaling d / sqrt(d_k), the softmax d / 2 (a row of softmax moves at most half the largest
change of its inputs: sum_j |da_i/dt_j| = 2 a_i (1 - a_i) <= 1/2), the concatenation nothing
(it copies), the output projection like a product with the exact W_O.
"""

from __future__ import annotations

import html
import json

import numpy as np

from attntrace.inputs.safetext import clean_text, json_safe
from attntrace.model.errors import BadInput

#: The first line of a .exam file that Numbas's compiler reads as JSON.
HEADER = "// Numbas version: exam_results_page_options"
DECIMALS = 4
ROUNDING = 0.5 * 10 ** -DECIMALS
#: slack for ties and float noise, as `attntrace check` allows
TIE_SLACK = 1e-9
CARRY_FACTOR = 2.0


def _jme_number(x: float) -> str:
    """An entry of a given matrix (small integers in exercises) in plain decimals."""
    text = f"{float(x):.12f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "0", "") else text


def _jme_decimal(x: float) -> str:
    """A small positive number in plain decimals: JME has no scientific notation (it reads
    5e-05 as 5 times the constant e, minus 05)."""
    return f"{float(x):.12f}".rstrip("0")


def jme_matrix(m) -> str:
    """A JME matrix literal: matrix([1, 2], [3, 4])."""
    rows = ", ".join("[" + ", ".join(_jme_number(v) for v in row) + "]" for row in np.asarray(m, dtype=float))
    return f"matrix({rows})"


def _name(step_id: str, head) -> str:
    base = {"Q": "Q", "K": "K", "V": "V", "scores": "S", "scaled": "T", "weights": "A", "Z": "Z",
            "concat": "C", "output": "O"}[step_id]
    return f"{base}{head}" if head else base


def _softmax_jme(t: str) -> str:
    """The row softmax of matrix variable `t`, stable (each row shifted by its maximum)."""
    return (f"matrix(map(let(r, list({t}[i]), m, max(r), e, map(exp(x - m), x, r), map(y / sum(e), y, e)), "
            f"i, 0..numrows({t}) - 1))")


def _product_slack(a: np.ndarray, b: np.ndarray, a_rounded: bool = True, b_rounded: bool = True) -> float:
    """How far rounding the typed inputs to 4 decimals moves an entry of a b (first order):
    a's rounding moves c_ij by at most ROUNDING sum_k |b_kj|, b's by ROUNDING sum_k |a_ik|."""
    a, b = np.abs(np.asarray(a, dtype=float)), np.abs(np.asarray(b, dtype=float))
    total = np.zeros((a.shape[0], b.shape[1]))
    a_rounded = a_rounded and not _integers(a)
    b_rounded = b_rounded and not _integers(b)
    if a_rounded:
        total += b.sum(axis=0)[None, :]
    if b_rounded:
        total += a.sum(axis=1)[:, None]
    return float(np.max(total)) * ROUNDING


def _integers(m: np.ndarray) -> bool:
    """True when every entry is a whole number: typed exactly, so nothing was rounded."""
    return bool(np.all(m == np.round(m)))


class _Step:
    """One part of the question: its variable, JME definition, parts it reads, tolerance."""

    def __init__(self, step, name: str, definition: str, reads: list[str], slack: float):
        self.step, self.name, self.definition, self.reads = step, name, definition, reads
        self.tolerance = ROUNDING + CARRY_FACTOR * slack + TIE_SLACK


def _plan(variant) -> tuple[dict[str, str], list[_Step]]:
    """(given variables, the steps in trace order) of one exercise."""
    spec, trace = variant.spec, variant.trace
    heads = trace.num_heads
    x = np.asarray(spec["X"], dtype=float)
    given = {"X": jme_matrix(x)}
    steps: list[_Step] = []
    values = {}
    d_k = None
    for step in trace.steps:
        h = step.head if heads > 1 else None
        name = _name(step.id, h)
        value = np.asarray(step.value, dtype=float)
        values[name] = value
        suffix = str(h) if h else ""
        if step.id in ("Q", "K", "V"):
            w_name = "W" + step.id + suffix
            full = np.asarray(spec["W_" + step.id], dtype=float)
            width = full.shape[1] // heads
            block = full[:, (step.head - 1) * width: step.head * width] if h else full
            given[w_name] = jme_matrix(block)
            d_k = d_k or width
            steps.append(_Step(step, name, f"X * {w_name}", [], 0.0))
        elif step.id == "scores":
            q, k = "Q" + suffix, "K" + suffix
            steps.append(_Step(step, name, f"{q} * transpose({k})", [q, k],
                               _product_slack(values[q], values[k].T)))
        elif step.id == "scaled":
            s = "S" + suffix
            slack = 0.0 if _integers(values[s]) else ROUNDING / np.sqrt(d_k)
            steps.append(_Step(step, name, f"{s} / sqrt({d_k})", [s], slack))
        elif step.id == "weights":
            t = "T" + suffix
            steps.append(_Step(step, name, _softmax_jme(t), [t], ROUNDING / 2))
        elif step.id == "Z":
            a, v = "A" + suffix, "V" + suffix
            steps.append(_Step(step, name, f"{a} * {v}", [a, v], _product_slack(values[a], values[v])))
        elif step.id == "concat":
            zs = [f"Z{i}" for i in range(1, heads + 1)]
            definition = zs[0]
            for z in zs[1:]:
                definition = f"combine_horizontally({definition}, {z})"
            steps.append(_Step(step, name, definition, zs, 0.0))  # copied, not computed
        elif step.id == "output":
            given["WO"] = jme_matrix(spec["W_O"])
            steps.append(_Step(step, name, "C * WO", ["C"],
                               _product_slack(values["C"], spec["W_O"], b_rounded=False)))
        else:
            raise BadInput(f"a Numbas exam has no part for step {step.key!r}")
    return given, steps


def _part(plan: _Step, index: dict[str, int], prompt: str) -> dict:
    rows, cols = plan.step.shape
    part = {
        "type": "matrix",
        "useCustomName": True,
        "customName": plan.step.key,
        "marks": rows * cols,
        "prompt": prompt,
        "correctAnswer": plan.name,
        "numRows": str(rows),
        "numColumns": str(cols),
        "allowResize": False,
        "tolerance": _jme_decimal(plan.tolerance),
        "markPerCell": True,
        "allowFractions": False,
        "precisionType": "none",
        "showCorrectAnswer": True,
        "showFeedbackIcon": True,
        "variableReplacementStrategy": "originalfirst",
        "adaptiveMarkingPenalty": 0,
        # Numbas's runtime evaluates this even when no condition is wanted; empty is not a boolean
        "adaptiveMarkingUseCondition": "true",
        "variableReplacements": [{"variable": name, "part": f"p{index[name]}", "must_go_first": False}
                                 for name in plan.reads],
    }
    return part


def question(variant, prose) -> dict:
    """One Numbas question: the variant's given matrices, one matrix part per step."""
    from attntrace.teach.lms import given_html, step_html

    given, plans = _plan(variant)
    variables = {name: {"name": name, "definition": definition, "description": "", "templateType": "anything",
                        "group": "Ungrouped variables", "can_override": False}
                 for name, definition in [*given.items(), *((p.name, p.definition) for p in plans)]}
    index = {p.name: i for i, p in enumerate(plans)}
    parts = [_part(p, index, step_html(variant, prose, number, p.step))
             for number, p in enumerate(plans, start=1)]
    return {
        "name": clean_text(html.unescape(variant.spec["title"])),
        "tags": ["attntrace"],
        "metadata": {"description": "", "licence": "None specified"},
        "statement": given_html(variant, prose),
        "advice": "",
        "rulesets": {},
        "extensions": [],
        "builtin_constants": {"e": True, "pi,\u03c0": True, "i": True},
        "constants": [],
        "variables": variables,
        "variablesTest": {"condition": "", "maxRuns": 100},
        "ungrouped_variables": list(variables),
        "variable_groups": [],
        "functions": {},
        "preamble": {"js": "", "css": ""},
        "parts": parts,
        "partsMode": "all",
        "maxMarks": 0,
        "objectives": [],
        "penalties": [],
        "objectiveVisibility": "always",
        "penaltyVisibility": "always",
    }


def exam(variants, lang: str = "en", template_dir=None) -> dict:
    """The Numbas exam: one question per variant, all in order."""
    from attntrace.teach.lms import Prose

    prose = Prose(lang, template_dir)
    first = variants[0]
    n, d, heads = len(first.spec["X"]), len(first.spec["X"][0]), first.trace.num_heads
    return {
        "name": f"attntrace exercise n = {n}, d = {d}, heads = {heads}",
        "metadata": {"description": "", "licence": "None specified"},
        "duration": 0,
        "percentPass": 0,
        "showQuestionGroupNames": False,
        "shuffleQuestionGroups": False,
        "showstudentname": True,
        "question_groups": [{"name": "", "pickingStrategy": "all-ordered", "pickQuestions": 1,
                             "questionNames": [""] * len(variants),
                             "questions": [question(v, prose) for v in variants]}],
        "navigation": {"allowregen": False, "reverse": True, "browse": True, "allowsteps": True,
                       "showfrontpage": False, "preventleave": False, "navigatemode": "sequence",
                       "onleave": {"action": "none", "message": ""}},
        "timing": {"allowPause": True, "timeout": {"action": "none", "message": ""},
                   "timedwarning": {"action": "none", "message": ""}},
        "feedback": {"showactualmark": True, "showtotalmark": True, "showanswerstate": True,
                     "allowrevealanswer": True, "advicethreshold": 0, "intro": "", "end_message": "",
                     "reviewshowscore": True, "reviewshowfeedback": True, "reviewshowexpectedanswer": True,
                     "reviewshowadvice": True, "feedbackmessages": []},
        "diagnostic": {"knowledge_graph": {"topics": [], "learning_objectives": []}, "script": "diagnosys",
                       "customScript": ""},
        "contributors": [],
        "extensions": [],
        "custom_part_types": [],
        "resources": [],
    }


def exam_text(variants, lang: str = "en", template_dir=None) -> str:
    """The .exam file: Numbas's version line, then the exam as JSON."""
    return HEADER + "\n" + json_safe(json.dumps(exam(variants, lang, template_dir), ensure_ascii=False, indent=1)) + "\n"
