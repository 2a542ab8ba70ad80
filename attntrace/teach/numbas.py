"""Exercises as a Numbas exam with adaptive marking (error carried forward).

    >>> from attntrace.teach import lms, numbas
    >>> variants = lms.make_variants(n=2, d=4, heads=1, seed=7)
    >>> text = numbas.exam_text(variants, lang="en")   # `attntrace exercise --format numbas -o quiz.exam`

One question per variant, one matrix-entry part per step of the trace, in trace order. The
question's variables are the given matrices (JME matrix literals) and one variable per step:
the step's formula tree, the one its kind built and the reports print, gives the variable
(its left side: Q^(1) is Q1, W_Q^(1) is WQ1, the concatenation Z) and its definition (its
right side printed by `teach.jme`: ``Q1 = X * WQ1``, ``S1 = Q1 * transpose(K1)``, the
softmax row by row, ...). A later part names the earlier parts whose values it reads in
``variableReplacements``: Numbas then marks it against its formula evaluated on the
student's own answers to those parts, so one wrong Q does not fail every later step (the
checker's "carried forward"). A step whose formula JME cannot print, or whose rounding this
module cannot bound, has no part: the exam is refused with a one-line BadInput.

Tolerance per part: half a unit in the 4th decimal (the answers are asked rounded to 4
decimals) plus the rounding of its inputs carried through the step. The inputs the student
types are themselves rounded to 4 decimals (error at most d = 5e-5 an entry), and the part is
marked against the formula on those rounded inputs, while a careful student may have kept
more digits. The slack bounds that difference from the true values, with a factor 2 for
inputs that are not the true ones (a carried-forward answer). It follows from the formula's
node types, not from which step it is: an input of whole numbers, like a given matrix, was
typed exactly and adds nothing; a product C = A B gets sum_k (|A_ik| + |B_kj|) d (S = Q K^T;
O = Z W_O like a product with the exact W_O); a division by a number c gets d / |c| (the
scaling by sqrt(d_k)); the softmax d / 2 (a row of softmax moves at most half the largest
change of its inputs: sum_j |da_i/dt_j| = 2 a_i (1 - a_i) <= 1/2); a concatenation nothing
(it copies entries the student typed already rounded).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass

import numpy as np

from attntrace.inputs.safetext import clean_text, json_safe
from attntrace.model import formula as F
from attntrace.model.errors import BadInput, Unsupported
from attntrace.rendering.formulatext import plain
from attntrace.teach import jme
from attntrace.teach.jme import jme_decimal, jme_matrix

#: The first line of a .exam file that Numbas's compiler reads as JSON.
HEADER = "// Numbas version: exam_results_page_options"
DECIMALS = 4
ROUNDING = 0.5 * 10 ** -DECIMALS
#: slack for ties and float noise, as `attntrace check` allows
TIE_SLACK = 1e-9
CARRY_FACTOR = 2.0


def _integers(m: np.ndarray) -> bool:
    """True when every entry is a whole number: typed exactly, so nothing was rounded."""
    return bool(np.all(m == np.round(m)))


@dataclass(frozen=True)
class _Known:
    """A matrix (or number) a formula reads: its JME text, value and how far the value the
    question evaluates may be from the true one (ROUNDING for a part the student typed
    rounded, 0 for a given matrix, a number, or a part of whole numbers); `part`: an
    earlier part of the question, whose student answer Numbas substitutes."""

    jme: str
    value: object
    error: float
    part: bool


def _product(a, b) -> tuple[np.ndarray, float]:
    """C = A B: rounding A's entries by e_A moves c_ij by at most e_A sum_k |b_kj|, B's by
    e_B sum_k |a_ik| (first order)."""
    (va, ea), (vb, eb) = a, b
    if np.ndim(va) == 0 or np.ndim(vb) == 0:  # a number times a matrix
        return va * vb, float(np.max(np.abs(va) * eb + np.abs(vb) * ea))
    total = np.zeros((va.shape[0], vb.shape[1]))
    if ea:
        total += ea * np.abs(vb).sum(axis=0)[None, :]
    if eb:
        total += eb * np.abs(va).sum(axis=1)[:, None]
    return va @ vb, float(np.max(total))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


#: What a function of a formula computes and how far its result moves when its inputs move
#: by the given errors: a row of softmax at most half the largest change of its inputs
#: (sum_j |da_i/dt_j| = 2 a_i (1 - a_i) <= 1/2); a concatenation copies its inputs.
_FUNCTIONS = {
    "softmax": lambda values, errors: (_softmax(values[0]), errors[0] / 2),
    "Concat": lambda values, errors: (np.hstack(values), max(errors)),
}
#: Functions whose result is their inputs' entries, copied: marked against typed (already
#: rounded) entries, the copy is exactly what the student writes, so it needs no slack.
_COPIES = {"Concat"}


def _bound(x: F.Node, known: dict) -> tuple[object, float]:
    """(value, error) of formula `x` from what it reads: the error is how far the formula on
    the typed inputs may be from the formula on the true ones, by the node's type (a
    product, a division by a number, a function, a copy)."""
    if x in known:
        return known[x].value, known[x].error
    if isinstance(x, F.Transpose):
        value, error = _bound(x.of, known)
        return np.transpose(value), error
    if isinstance(x, F.Paren):
        return _bound(x.of, known)
    if isinstance(x, (F.Num, F.Value)):
        return float(x.value), 0.0
    if isinstance(x, F.Juxt):
        factors = [_bound(f, known) for f in x.factors if not isinstance(f, F.Space)]
        out = factors[0]
        for factor in factors[1:]:
            out = _product(out, factor)
        return out
    if isinstance(x, F.Frac):
        (num, e_num), (den, e_den) = _bound(x.num, known), _bound(x.den, known)
        if np.ndim(den) != 0 or e_den:
            raise Unsupported("a division by a matrix or by a typed number")
        return num / den, e_num / abs(float(den))
    if isinstance(x, F.Sqrt):
        value, error = _bound(x.of, known)
        if np.ndim(value) != 0 or error:
            raise Unsupported("a square root of a matrix or of a typed number")
        return np.sqrt(value), 0.0
    if isinstance(x, F.Func) and x.name in _FUNCTIONS and not x.params:
        items = [_bound(a, known) for arg in x.args for a in jme.items(arg)]
        return _FUNCTIONS[x.name]([v for v, _ in items], [e for _, e in items])
    raise Unsupported(f"no rounding bound for a {type(x).__name__}")


class _Step:
    """One part of the question: its variable, JME definition, parts it reads, tolerance."""

    def __init__(self, step, name: str, definition: str, reads: list[str], slack: float):
        self.step, self.name, self.definition, self.reads = step, name, definition, reads
        self.tolerance = ROUNDING + CARRY_FACTOR * slack + TIE_SLACK


def _plan(variant) -> tuple[dict[str, str], list[_Step]]:
    """(given variables, the steps in trace order) of one exercise: each step's variable is
    its formula's left side, defined by the JME of its right side."""
    trace = variant.trace
    given: dict[str, str] = {}
    steps: list[_Step] = []
    known: dict[F.Node, _Known] = {}  # every symbol a later formula may read
    for step in trace.steps:
        try:
            steps.append(_plan_step(trace, step, given, known))
        except (Unsupported, KeyError):
            raise BadInput(f"a Numbas exam has no part for step {step.key!r}") from None
    return given, steps


def _plan_step(trace, step, given: dict[str, str], known: dict) -> _Step:
    form = F.first_part(step.expr)  # the matrix form, not the entry formula beside it
    lhs, rhs = F.lhs(form), F.after_lhs(form)
    name = jme.variable_name(lhs)
    symbols = jme.leaves(rhs)
    # a number the step records under the symbol's name (d_k of the scaling)
    numbers = {leaf: step.details[plain(leaf)] for leaf in symbols
               if leaf not in known and isinstance(step.details.get(plain(leaf)), (int, float))}
    matrices = [leaf for leaf in symbols if leaf not in numbers]
    if len(matrices) != len(step.inputs):
        raise Unsupported(f"{len(matrices)} symbols for {len(step.inputs)} inputs")
    for leaf, source in zip(matrices, step.inputs):
        if leaf not in known:  # a given matrix
            variable = jme.variable_name(leaf)
            value = np.asarray(_operand(trace, source, step.head).value, dtype=float)
            if variable in given:
                raise Unsupported(f"two matrices named {variable}")
            given[variable] = jme_matrix(value)
            known[leaf] = _Known(variable, value, 0.0, part=False)
    reads = [known[leaf].jme for leaf in matrices if known[leaf].part]  # earlier parts, typed by the student
    here = {**known, **{leaf: _Known(jme.jme_number(v), float(v), 0.0, part=False) for leaf, v in numbers.items()}}
    if name in given or any(name == k.jme for k in known.values()):
        raise Unsupported(f"two matrices named {name}")
    definition = jme.jme(rhs, {leaf: k.jme for leaf, k in here.items()})
    _, error = _bound(rhs, here)
    copy = isinstance(rhs, F.Func) and rhs.name in _COPIES
    value = np.asarray(step.value, dtype=float)
    known[lhs] = _Known(name, value, 0.0 if _integers(value) else ROUNDING, part=True)
    return _Step(step, name, definition, reads, 0.0 if copy else error)


def _operand(trace, name: str, head):
    """The given matrix a step reads: its head's own (W_Q of head 2), else the one all heads share (X)."""
    try:
        return trace.operand(name, head)
    except KeyError:
        return trace.operand(name, None)


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
        "tolerance": jme_decimal(plan.tolerance),
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
