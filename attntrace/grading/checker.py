"""Check a hand calculation: first wrong step and entry, the likely mistake, errors carried forward.

    >>> report = attntrace.check("problem.toml", "answer.toml")   # or dicts, or a Trace
    >>> report.ok, report.first_wrong
    (False, 'weights')

Every step the student gives gets a status:

- `correct`: right against the truth (with the tolerance of how each number was written), or
  right against a recomputation from the student's own earlier values when all of those are
  correct (rounding carried along is not a mistake);
- `carried`: wrong against the truth but right when recomputed from the student's own earlier
  values, at least one of which is wrong (exam-style error carried forward);
- `wrong`: neither; `wrong_entries` lists (row, col, expected, given) 1-based and `diagnosis`
  names the usual mistake that reproduces the student's values (see `diagnose.CATALOGUE`), or
  `wrong_shape` / `unknown`.

`first_wrong` is the key ('weights', or 'weights@2' in a multi-head problem) of the earliest
wrong step in trace order; carried steps are never first wrong. The sentences a report says
live in templates/check/ (messages.en.j2, messages.zh.j2, report.{text,md,tex}.j2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from attntrace.grading.answer import AnswerMatrix, load_answer
from attntrace.grading.diagnose import UNKNOWN, WRONG_SHAPE, World, diagnosis_params
from attntrace.model.errors import BadInput
from attntrace.rendering.jinja_env import user_template_errors
from attntrace.rendering.printing import plain_number
from attntrace.model.trace import Trace
from attntrace.inputs.usertext import clean_text, format_user_text, inline_math_for
from attntrace.rendering.viewmodel import escape_md, escape_tex as tex_escape

LANGS = ("en", "zh")
FORMATS = ("text", "md", "tex")


@dataclass(frozen=True)
class WrongEntry:
    row: int  # 1-based
    col: int  # 1-based
    expected: float
    given: float
    given_text: str

    def to_dict(self) -> dict:
        return {"row": self.row, "col": self.col, "expected": _json_number(self.expected), "given": _json_number(self.given)}


@dataclass(frozen=True)
class Diagnosis:
    code: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def message(self, lang: str = "en", format: str = "text", template_dir: Path | None = None) -> str:
        return _messages(lang, template_dir, format).diagnosis(self.code, self.params).strip()


@dataclass(frozen=True)
class StepResult:
    id: str
    head: int | None
    status: str
    wrong_entries: tuple[WrongEntry, ...] = ()
    diagnosis: Diagnosis | None = None
    expected_shape: tuple[int, int] | None = None
    given_shape: tuple[int, int] | None = None

    @property
    def key(self) -> str:
        return self.id if self.head is None else f"{self.id}@{self.head}"

    def to_dict(self, lang: str = "en") -> dict:
        d = {"id": self.id, "head": self.head, "key": self.key, "status": self.status,
             "wrong_entries": [e.to_dict() for e in self.wrong_entries],
             "diagnosis": None if self.diagnosis is None else
             {"code": self.diagnosis.code, "message": self.diagnosis.message(lang)}}
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
        return {"ok": self.ok, "first_wrong": self.first_wrong, "steps": [s.to_dict(lang) for s in self.steps]}

    def render(self, format: str = "text", **options) -> str:
        options.setdefault("lang", self.lang)
        return render_report(self, format, **options)


def _json_number(x: float):
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    return x


# -- checking ------------------------------------------------------------------------------------
def checked_trace(spec_or_trace: Any, *, mode: str | None, atol: float | None, rtol: float | None, lang: str) -> Trace:
    """The options of a check validated, and the trace answers are checked against (numeric or exact)."""
    if lang not in LANGS:
        raise BadInput(f"unknown language {lang!r}; choose one of {', '.join(LANGS)}")
    for name, v in (("atol", atol), ("rtol", rtol)):
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
            raise BadInput(f"--{name} must be a number >= 0, not {v!r}")
    if isinstance(spec_or_trace, Trace):
        trace = spec_or_trace
        if mode is not None and mode != trace.mode:
            raise BadInput(f"the trace is in {trace.mode} mode; mode={mode!r} needs the spec, not a finished trace")
    else:
        from attntrace import run

        trace = run(spec_or_trace, mode=mode)
    if trace.mode not in ("numeric", "exact"):
        raise BadInput(f"checking needs numbers; this problem is in {trace.mode} mode (use mode numeric or exact)")
    return trace


def check(spec_or_trace: Any, answer: Any, *, mode: str | None = None, atol: float | None = None,
          rtol: float | None = None, lang: str = "en") -> Report:
    """Check `answer` (path or dict, see attntrace.grading.answer) against the trace of `spec_or_trace`."""
    trace = checked_trace(spec_or_trace, mode=mode, atol=atol, rtol=rtol, lang=lang)
    answers = load_answer(answer)
    _check_keys(trace, answers)

    world = World(trace)
    truth = world.truth
    given = {key: a.values for key, a in answers.items() if a.shape == tuple(truth[key].shape)}
    carried_world = world.recompute(given)
    mutated: list | None = None  # computed on the first wrong step only

    results: dict[tuple, StepResult] = {}
    for step in trace.steps:
        key = (step.id, step.head)
        if key not in answers:
            continue
        a = answers[key]
        expected = truth[key]
        shape = tuple(expected.shape)
        common = {"id": step.id, "head": step.head, "expected_shape": shape, "given_shape": a.shape}
        if a.shape == shape and a.matches(expected, atol, rtol):
            results[key] = StepResult(status="correct", **common)
            continue
        wrong_entries = () if a.shape != shape else tuple(
            WrongEntry(i + 1, j + 1, float(expected[i, j]), e.value, e.text) for i, j, e in a.mismatches(expected, atol, rtol))
        if a.shape == shape and a.matches(carried_world[key], atol, rtol):
            upstream = [results[k].status for k in world.ancestors(key) if k in results]
            if any(s in ("wrong", "carried") for s in upstream):
                results[key] = StepResult(status="carried", wrong_entries=wrong_entries, **common)
            else:  # the student's own correct (rounded) values, carried along: not a mistake
                results[key] = StepResult(status="correct", **common)
            continue
        if mutated is None:
            mutated = list(world.candidates(given))
        found = next((m for m, values in mutated if a.matches(values[key], atol, rtol)), None)
        if found is not None:
            code = found.code
        else:
            code = WRONG_SHAPE if a.shape != shape else UNKNOWN
        diagnosis = Diagnosis(code, diagnosis_params(world, step, found, given_shape=a.shape))
        results[key] = StepResult(status="wrong", wrong_entries=wrong_entries, diagnosis=diagnosis, **common)

    steps = tuple(results.values())
    first = next((s.key for s in steps if s.status == "wrong"), None)
    ok = all(s.status == "correct" for s in steps)
    tolerance = {"atol": atol, "rtol": rtol}
    return Report(ok=ok, first_wrong=first, steps=steps, trace=trace, lang=lang, tolerance=tolerance)


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


# -- reports -------------------------------------------------------------------------------------
class _Messages:
    """The phrases and diagnosis sentences of one language (templates/check/messages.<lang>.j2)."""

    def __init__(self, module: Any, format: str):
        self.module = module
        self.format = format

    def diagnosis(self, code: str, params: Mapping[str, Any]) -> str:
        macro = getattr(self.module, code, None) or getattr(self.module, UNKNOWN)
        return str(macro(_Params(params, self.format)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)


class _Params(dict):
    """Diagnosis numbers plus a helper writing math for the report's format."""

    def __init__(self, params: Mapping[str, Any], format: str):
        super().__init__(params)
        self.format = format

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def math(self, tex: str, plain: str) -> str:
        """`$tex$` in Markdown and LaTeX, `plain` in text."""
        return plain if self.format == "text" else f"${tex}$"

    def num(self, x: Any) -> str:
        return format_number(x, 4)

    def shape(self, s) -> str:
        return "" if s is None else f"{s[0]} × {s[1]}" if self.format == "text" else f"${s[0]} \\times {s[1]}$"


def format_number(x: Any, precision: int = 4) -> str:
    return "" if x is None else plain_number(float(x), precision, count=False)


class _Formatted(str):
    """User text already formatted for its output (math printed, the rest escaped): the
    escaping filters pass it through unchanged."""


def _escaper(escape):
    return lambda text: text if isinstance(text, _Formatted) else escape(text)


def _title(trace: Trace, format: str, lang: str, delimiters: str) -> _Formatted | None:
    """The spec's title for a report: `$...$` spans as math, the rest escaped (usertext)."""
    title = trace.localized("title", lang)
    if not title:
        return None
    return _Formatted(format_user_text(title, format, inline_math=inline_math_for(format, delimiters)))


def _environment(template_dir: Path | str | None):
    """Jinja2 environment for the check templates (a user folder first, then templates/)."""
    from attntrace.rendering.renderer import environment

    env = environment(template_dir)
    env.filters["tex_escape"] = _escaper(tex_escape)
    env.filters["md_escape"] = _escaper(escape_md)
    env.filters["num"] = format_number
    return env


def _messages(lang: str, template_dir, format: str) -> _Messages:
    if lang not in LANGS:
        raise BadInput(f"unknown language {lang!r}; choose one of {', '.join(LANGS)}")
    env = _environment(template_dir)
    return _Messages(env.get_template(f"check/messages.{lang}.j2").make_module({"format": format}), format)




def render_report(report: Report, format: str = "text", lang: str = "en", **options: Any) -> str:
    """The report a student reads: verdict, each step's status, the first wrong step's wrong
    entries and likely mistake, and the correct computation of that step (render.render_step).

    options: precision, max_size, math_delimiters, template_dir, standalone (tex); others
    (figures, output_path) are accepted and ignored.
    """
    if format == "json":
        import json

        return json.dumps(report.to_dict(lang), ensure_ascii=False, indent=1)
    if format not in FORMATS:
        raise BadInput(f"unknown report format {format!r}; choose one of text, md, tex, json")
    precision = options.get("precision")
    precision = 4 if precision is None else precision  # 0 is a precision: whole numbers
    if isinstance(precision, bool) or not isinstance(precision, int) or not 0 <= precision <= 15:
        raise BadInput(f"precision must be an integer from 0 to 15, not {precision!r}")
    template_dir = options.get("template_dir")
    env = _environment(template_dir)
    with user_template_errors(env, template_dir):
        return _render_report(report, format, lang, precision, template_dir, env, options)


def _render_report(report: Report, format: str, lang: str, precision: int, template_dir, env, options: Mapping[str, Any]) -> str:
    msgs = _messages(lang, template_dir, format)
    first = report.first_wrong_step
    derivation = None
    if first is not None:
        derivation = _correct_computation(report.trace, first, format, lang, options)
    rows = []
    for s in report.steps:
        rows.append({
            "key": s.key, "id": s.id, "head": s.head, "status": s.status,
            "code": s.diagnosis.code if s.diagnosis else None,
            "message": s.diagnosis.message(lang, format, template_dir) if s.diagnosis else None,
            "entries": [{"row": e.row, "col": e.col, "expected": format_number(e.expected, precision),
                         "given": clean_text(e.given_text)} for e in s.wrong_entries],
            "expected_shape": s.expected_shape, "given_shape": s.given_shape,
        })
    first_row = next((r for r in rows if r["status"] == "wrong"), None)
    text = env.get_template(f"check/report.{format}.j2").render(
        m=msgs, lang=lang, report=report, rows=rows, first=first_row, derivation=derivation,
        title=_title(report.trace, format, lang, options.get("math_delimiters") or "dollars"),
        standalone=bool(options.get("standalone")), math_delimiters=options.get("math_delimiters") or "dollars",
        n_wrong=sum(r["status"] == "wrong" for r in rows), n_carried=sum(r["status"] == "carried" for r in rows),
        max_entries=options.get("max_size") or 8,
    )
    return text.rstrip("\n") + "\n"


def _correct_computation(trace: Trace, result: StepResult, format: str, lang: str, options: Mapping[str, Any]) -> str:
    """The derivation of one step, from the renderer; a plain matrix until render.py exists."""
    step = trace.step(result.id, result.head)
    try:
        from attntrace.rendering.renderer import render_step
    except ImportError:
        render_step = None
    if render_step is not None:
        kwargs = {k: options[k] for k in ("precision", "max_size", "math_delimiters", "template_dir", "width", "rows")
                  if options.get(k) is not None}
        return render_step(trace, step, format=format, lang=lang, **kwargs).strip("\n")
    from attntrace.grading.diagnose import to_float

    precision = 4 if options.get("precision") is None else options["precision"]
    value = to_float(step.value)
    cells = [[format_number(x, precision) for x in row] for row in value]
    if format == "text":
        width = max(len(c) for row in cells for c in row)
        return "\n".join("  [ " + "  ".join(c.rjust(width) for c in row) + " ]" for row in cells)
    body = r" \\ ".join(" & ".join(c.replace("-inf", r"-\infty") for c in row) for row in cells)
    matrix = r"\begin{bmatrix} " + body + r" \end{bmatrix}"
    if format == "md":
        return f"\\[{matrix}\\]" if options.get("math_delimiters") == "brackets" else f"$${matrix}$$"
    return f"\\[{matrix}\\]"
