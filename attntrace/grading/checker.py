"""Check a hand calculation: every wrong step and entry, the likely mistake, errors carried forward.

    >>> report = attntrace.check("problem.toml", "answer.toml")   # or dicts, or a Trace
    >>> report.ok, report.first_wrong
    (False, 'weights')

Every step the student gives gets a status:

- `correct`: right against the truth, with the tolerance of how each number was written
  (`answer.Policy`: the true value correctly rounded to the decimals written) or the teacher's
  setting (decimals=N, atol/rtol);
- `carried`: not right against the truth but right when recomputed from the student's own
  earlier values *as written*: each written input anywhere within half a unit of its last
  decimal (they may have gone on with the rounded or the unrounded number), so rounding is
  never counted twice. When every earlier step was correct, the step was moved only by an
  earlier rounding that is right in itself: it gets the remark `early_rounding` and is no
  mistake;
- `wrong`: neither; `wrong_entries` lists (row, col, expected, given) 1-based and `diagnosis`
  names the usual mistake that reproduces the student's values (see `diagnose.CATALOGUE`),
  with `alternatives` when other mistakes give the same numbers, or `wrong_shape` / `unknown`.

`ok` is True when no step is wrong. `first_wrong` is the key ('weights', or 'weights@2') of
the earliest wrong step in trace order. The sentences live in templates/check/ and the reports
are written by `attntrace.grading.reports`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from attntrace.grading import intervals, mistakes
from attntrace.grading.answer import MAX_DECIMALS, AnswerMatrix, Answers, Policy, load_answer
from attntrace.grading.diagnose import EARLY_ROUNDING, UNKNOWN, WRONG_SHAPE, World, diagnosis_params
from attntrace.grading.messages import LANGS, messages
from attntrace.kinds import KINDS
from attntrace.model.errors import BadInput
from attntrace.model.trace import Trace


@dataclass(frozen=True)
class WrongEntry:
    row: int  # 1-based
    col: int  # 1-based
    expected: float
    given: float
    given_text: str

    def to_dict(self) -> dict:
        return {"row": self.row, "col": self.col, "expected": _json_number(self.expected), "given": _json_number(self.given)}


class WrongEntries(Sequence):
    """The wrong entries of a step, kept as arrays (an all-wrong 256 x 256 step is 65,536 of
    them): a sequence of `WrongEntry`, each made when it is read."""

    def __init__(self, answer: AnswerMatrix | None = None, expected: np.ndarray | None = None, cells: np.ndarray | None = None):
        self._answer, self._expected = answer, expected
        self._cells = np.zeros((0, 2), dtype=np.int64) if cells is None else cells

    def __len__(self) -> int:
        return len(self._cells)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return tuple(self[i] for i in range(*k.indices(len(self))))
        i, j = (int(x) for x in self._cells[k])
        return WrongEntry(i + 1, j + 1, float(self._expected[i, j]), float(self._answer.values[i, j]),
                          str(self._answer.texts[i, j]))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"WrongEntries({len(self)} entries)"


@dataclass(frozen=True)
class Diagnosis:
    """A mistake's code and the numbers its sentence mentions; `alternatives`: other mistakes
    that give the same numbers here, so that none of them can be told apart."""

    code: str
    params: Mapping[str, Any] = field(default_factory=dict)
    alternatives: tuple["Diagnosis", ...] = ()

    def message(self, lang: str = "en", format: str = "text", template_dir: Path | None = None) -> str:
        return messages(lang, template_dir, format).diagnosis(self.code, self.params).strip()

    def to_dict(self, lang: str = "en") -> dict:
        return {"code": self.code, "message": self.message(lang),
                "alternatives": [{"code": a.code, "message": a.message(lang)} for a in self.alternatives]}


@dataclass(frozen=True)
class StepResult:
    id: str
    head: int | None
    status: str
    wrong_entries: Sequence = ()  # of WrongEntry (a WrongEntries)
    diagnosis: Diagnosis | None = None  # on a wrong step; a remark (early_rounding, ...) on another
    expected_shape: tuple[int, int] | None = None
    given_shape: tuple[int, int] | None = None

    @property
    def key(self) -> str:
        return self.id if self.head is None else f"{self.id}@{self.head}"

    def to_dict(self, lang: str = "en") -> dict:
        d = {"id": self.id, "head": self.head, "key": self.key, "status": self.status,
             "wrong_entries": [e.to_dict() for e in self.wrong_entries],
             "diagnosis": None if self.diagnosis is None else self.diagnosis.to_dict(lang)}
        if self.given_shape != self.expected_shape:
            d["expected_shape"], d["given_shape"] = list(self.expected_shape), list(self.given_shape)
        return d


@dataclass(frozen=True)
class Report:
    """The checker's verdict. `to_dict()` is the JSON of `attntrace check --format json`."""

    ok: bool
    first_wrong: str | None
    steps: tuple[StepResult, ...]
    trace: Trace
    lang: str = "en"
    tolerance: Mapping[str, Any] = field(default_factory=dict)
    student: str | None = None
    policy: Policy = field(default_factory=Policy)
    ignored: tuple[str, ...] = ()  # keys of the answer that are not steps (date = "..."): not checked

    def step(self, id: str, head: int | None = None) -> StepResult:
        for s in self.steps:
            if s.id == id and s.head == head:
                return s
        raise KeyError(f"the answer gives no step {id!r}" + (f" for head {head}" if head else ""))

    @property
    def first_wrong_step(self) -> StepResult | None:
        return next((s for s in self.steps if s.status == "wrong"), None)

    def to_dict(self, lang: str | None = None) -> dict:
        lang = lang or self.lang
        d = {"ok": self.ok, "first_wrong": self.first_wrong, "student": self.student,
             "steps": [s.to_dict(lang) for s in self.steps]}
        if self.ignored:
            d["ignored_keys"] = list(self.ignored)
        return d

    def render(self, format: str = "text", **options) -> str:
        options.setdefault("lang", self.lang)
        return render_report(self, format, **options)


def _json_number(x: float):
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    return x


# -- checking ------------------------------------------------------------------------------------
def checked_trace(spec_or_trace: Any, *, mode: str | None, atol: float | None, rtol: float | None, lang: str,
                  decimals: int | None = None) -> Trace:
    """The options of a check validated, and the trace answers are checked against (numeric or exact)."""
    if lang not in LANGS:
        raise BadInput(f"unknown language {lang!r}; choose one of {', '.join(LANGS)}")
    for name, v in (("atol", atol), ("rtol", rtol)):
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
            raise BadInput(f"--{name} must be a number >= 0, not {v!r}")
    if decimals is not None:
        if isinstance(decimals, bool) or not isinstance(decimals, int) or not 0 <= decimals <= MAX_DECIMALS:
            raise BadInput(f"--decimals must be an integer from 0 to {MAX_DECIMALS}, not {decimals!r}")
        if atol is not None or rtol is not None:
            raise BadInput("give --decimals or --atol/--rtol, not both")
    if isinstance(spec_or_trace, Trace):
        trace = spec_or_trace
        if mode is not None and mode != trace.mode:
            raise BadInput(f"the trace is in {trace.mode} mode; mode={mode!r} needs the spec, not a finished trace")
    else:
        from attntrace.tracer import trace_spec

        trace = trace_spec(spec_or_trace, mode=mode)
    if trace.mode not in ("numeric", "exact"):
        raise BadInput(f"checking needs numbers; this problem is in {trace.mode} mode (use mode numeric or exact)")
    if trace.settings.get("not_kept"):
        # carrying a student's numbers forward recomputes every step from its inputs: a trace
        # that dropped some (keep=) cannot say which wrong value was carried from which
        dropped = ", ".join(trace.settings["not_kept"][:6])
        raise BadInput(f"checking needs every step, but this trace was made with keep= and dropped {dropped}"
                       f"{', ...' if len(trace.settings['not_kept']) > 6 else ''}: trace it without keep=")
    return trace


def check(spec_or_trace: Any, answer: Any, *, mode: str | None = None, atol: float | None = None,
          rtol: float | None = None, decimals: int | None = None, lang: str = "en") -> Report:
    """Check `answer` (path or dict, see attntrace.grading.answer) against the trace of `spec_or_trace`.

    decimals: every entry must be right to this many decimals; atol/rtol: |given - true| <=
    atol + rtol |true|. Without them, each number is judged by the decimals it is written with.
    """
    trace = checked_trace(spec_or_trace, mode=mode, atol=atol, rtol=rtol, lang=lang, decimals=decimals)
    answers = split_full_width(trace, load_answer(answer, tuple(dict.fromkeys(s.id for s in trace.steps))))
    _check_keys(trace, answers)
    policy = Policy(decimals=decimals, atol=atol, rtol=rtol)

    world = World.of(trace)
    mine_of = _by_world_key(trace, world, answers)  # world key -> the answer's key (online_max, online_max#2)
    lazy: dict = {}  # the student's world, computed at the first step that is not simply right

    def student_world() -> tuple[dict, dict]:
        if not lazy:
            lazy["given"] = _written(world, {k: answers[a] for k, a in mine_of.items()})
            lazy["carried"] = world.recompute(lazy["given"])
        return lazy["given"], lazy["carried"]

    mutated: dict = {}  # the mutated worlds, each computed when a wrong step it can reach needs it

    results: dict[tuple, StepResult] = {}
    for step, key in zip(trace.steps, world.keys):
        if key not in mine_of:
            continue
        named = mine_of[key]  # as the answer names it: a block's address, or the plain id (the last block)
        a = answers[named]
        expected = world.truth[key]
        shape = tuple(expected.shape)
        common = {"id": named[0], "head": step.head, "expected_shape": shape, "given_shape": a.shape}
        if a.fits(expected, expected, policy):
            results[named] = StepResult(status="correct", **common)
            continue
        remark = mistakes.accepted(step, a, expected, policy)
        if remark is not None:
            results[named] = StepResult(status="correct", diagnosis=_diagnosis(world, step, remark), **common)
            continue
        wrong_entries = WrongEntries() if a.shape != shape else WrongEntries(a, expected, a.misfit_cells(expected, expected, policy))
        given, carried_world = student_world()
        mine = carried_world[key]
        if mine is not None and a.fits(mine.lo, mine.hi, policy):
            upstream = [results[mine_of[k]].status for k in world.ancestors(key) if k in mine_of and mine_of[k] in results]
            remark = None if "wrong" in upstream else _diagnosis(world, step, EARLY_ROUNDING)
            results[named] = StepResult(status="carried", wrong_entries=wrong_entries, diagnosis=remark, **common)
            continue
        diagnosis = _diagnose(world, step, a, world.candidates_at(key, given, carried_world, mutated), mine, policy)
        results[named] = StepResult(status="wrong", wrong_entries=wrong_entries, diagnosis=diagnosis, **common)

    steps = tuple(results.values())
    first = next((s.key for s in steps if s.status == "wrong"), None)
    return Report(ok=first is None, first_wrong=first, steps=steps, trace=trace, lang=lang,
                  tolerance=policy.to_dict(), student=answers.student, policy=policy,
                  ignored=tuple(getattr(answers, "ignored", ())))


def _by_world_key(trace: Trace, world: World, answers: Answers) -> dict:
    """{world key: the answer's key}: a block of the online softmax named by its address
    (online_max#2, online_max#1.2) or by its plain id (the last block, as `Trace.step` reads
    it) is that block's step; naming one block twice is refused."""
    out: dict = {}
    for k in answers:
        wk = world.key(trace.step(*k))
        if wk in out:
            raise BadInput(f"answer gives {_spelled(out[wk])} and {_spelled(k)}, the same block ({_spelled(wk)}): give it once")
        out[wk] = k
    return out


def _spelled(key: tuple) -> str:
    return key[0] if key[1] is None else f"{key[0]}@{key[1]}"


def _written(world: World, answers: Mapping[tuple, AnswerMatrix]) -> dict:
    """The student's values as intervals: half a unit of the last decimal either side, since
    they may have gone on with the unrounded number. A step whose every entry is exactly the
    true value, with every written step before it exact too, is taken as exact (its width 0):
    the student had that number, so a later truncation is not hidden by a rounding they never made."""
    exact: set = set()
    out = {}
    for key in world.keys:
        if key not in answers:
            continue
        a, truth = answers[key], world.truth[key]
        with np.errstate(invalid="ignore"):  # -inf - -inf: equal, caught by ==
            same = a.shape == tuple(truth.shape) and bool(np.all((a.values == truth) | (np.abs(a.values - truth) <= 1e-12 * np.maximum(1.0, np.abs(truth)))))
        if same and all(k in exact for k in world.ancestors(key) if k in answers):
            exact.add(key)
            out[key] = intervals.point(a.values)
        else:
            out[key] = intervals.around(a.values, a.radii)
    return out


def _diagnosis(world: World, step, code: str, mutation=None, shape=None, **extra) -> Diagnosis:
    return Diagnosis(code, {**diagnosis_params(world, step, mutation, given_shape=shape), **extra})


def _diagnose(world: World, step, a: AnswerMatrix, mutated: Iterable, mine, policy: Policy) -> Diagnosis:
    """Every planted mistake that reproduces the student's values (the first named, the others
    its alternatives), else a mistake read off their numbers, else wrong_shape / unknown."""
    key = world.key(step)
    found: dict[str, Diagnosis] = {}
    for mutation, values in mutated:
        box = values[key]
        if mutation.code not in found and box is not None and a.fits(box.lo, box.hi, policy):
            found[mutation.code] = _diagnosis(world, step, mutation.code, mutation, a.shape)
    truth = world.truth[key]
    reference = mine if mine is not None and mine.shape == a.shape else intervals.point(truth)
    read = [_diagnosis(world, step, code, shape=a.shape, **numbers) for code, numbers in mistakes.read_off(step, a, reference, policy)]
    if found:  # what the numbers show (rows not summing to 1, finite masked scores) fits too
        first, *others = found.values()
        others += [d for d in read if d.code in mistakes.SHOWN_ALONGSIDE and d.code not in found]
        return Diagnosis(first.code, first.params, tuple(others))
    if read:
        return Diagnosis(read[0].code, read[0].params, tuple(read[1:]))
    return _diagnosis(world, step, WRONG_SHAPE if a.shape != tuple(truth.shape) else UNKNOWN, shape=a.shape)


def split_full_width(trace: Trace, answers: Answers) -> Answers:
    """Q, K, V or Z given full width, (n, h*d_k), in a multi-head problem -> one matrix per
    head, head 1's columns first (the spec's num_heads and each head's width)."""
    if trace.num_heads < 2:
        return answers
    out = Answers()
    out.meta = answers.meta
    out.ignored = answers.ignored
    for (step_id, head), a in answers.items():
        kind = KINDS.get(step_id)
        if head is not None or kind is None or not kind.full_width_answer or trace.has(step_id, None) or not trace.has(step_id, 1):
            out[(step_id, head)] = a
            continue
        widths = [trace.step(step_id, h).shape[1] for h in range(1, trace.num_heads + 1)]
        rows = trace.step(step_id, 1).shape[0]
        if a.shape != (rows, sum(widths)):
            raise BadInput(f"answer: {step_id} is {a.shape[0]} x {a.shape[1]}, but this problem has {trace.num_heads} heads: "
                           f"give {step_id} full width ({rows} x {sum(widths)}, head 1's columns first) or per head ({step_id}@1, ...)")
        first = 0
        for h, width in enumerate(widths, start=1):
            if (step_id, h) in answers:
                raise BadInput(f"answer gives {step_id}@{h} twice (full width as {step_id} and per head)")
            out[(step_id, h)] = a.columns(first, first + width, h)
            first += width
    return out


def _check_keys(trace: Trace, answers: Mapping[tuple, AnswerMatrix]) -> None:
    for (step_id, head), a in answers.items():
        if trace.has(step_id, head):
            continue
        have = ", ".join(s.key for s in trace.steps)
        if head is None and trace.has(step_id, 1):
            raise BadInput(f"answer: this problem has {trace.num_heads} heads; give {step_id} per head "
                           f"({step_id}@1 or a [head.1] table)")
        if head is not None and trace.has(step_id, None):
            raise BadInput(f"answer: this problem has a single head; write {step_id}, not {a.key}")
        if any(o.name == step_id for o in trace.operands):
            raise BadInput(f"answer: {a.key} is given in the problem itself, not computed (steps to check: {have})")
        raise BadInput(f"answer: this problem has no step {a.key} (steps to check: {have})")


def render_report(report: Report, format: str = "text", lang: str = "en", **options: Any) -> str:
    """The report a student reads (see `attntrace.grading.reports.render_report`)."""
    from attntrace.grading.reports import render_report as render

    return render(report, format, lang, **options)

