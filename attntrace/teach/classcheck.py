"""Grade a whole class: every student's answer checked against one problem, scored, summarised.

    >>> report = attntrace.check_class("problem.toml", "answers/")   # or a list of paths / dicts
    >>> [(s.name, s.score) for s in report.students]
    [('Alice', 1.0), ('Bob', 0.714...), ...]
    >>> print(report.render("md"))                                     # the class summary

Each answer is checked by `attntrace.check` exactly as a single answer is (same statuses, same
diagnoses); this module only collects, scores and summarises. The answers are a list of paths
and dicts, or one directory whose ``*.toml`` and ``*.json`` files are the answers (sorted by
name; a directory inside the list is expanded the same way). A student's name is the answer's
``student`` text, else the file name without its suffix (``#3`` for the third answer given as a
dict without one). A file that cannot be read, parsed or matched to the problem is *unreadable*:
it is listed with its one-line reason, gets no score, and never stops the others.

Scoring (error carried forward, as STACK's and Numbas's "adaptive marking" do):

- every step of the problem is graded, each head's steps separately in a multi-head problem
  (``weights@1``, ``weights@2``); each has a weight, 1 unless ``weights`` says otherwise:
  ``{"weights": 2, "Z@2": 0.5}`` (a step id sets every head's step of that id, a key ``id@h``
  one head and wins over the id; weight 0 leaves a step out of the score);
- a step earns its full weight when it is ``correct`` **or** ``carried`` (wrong against the
  truth only because the student used an earlier wrong value correctly: full credit, so each
  mistake is paid for once, where it was made; or moved only by the student's own correct
  earlier rounding, which is no mistake), and nothing when ``wrong`` or not given
  (``missing``);
- ``points`` = the weights earned, ``max_points`` = the sum of the weights, ``score`` =
  points / max_points, from 0 to 1 (an unreadable answer has no score: None).

`ClassReport.ok` is True when every answer was read and every step given is correct (the
single check's verdict for each student); a student who left steps out can be ok and still
score below 1.
"""

from __future__ import annotations

import csv
import io
import math
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from attntrace.model.errors import AttntraceError, BadInput
from attntrace.model.trace import Trace

#: The suffixes of answer files taken from a directory.
ANSWER_SUFFIXES = (".toml", ".json")
#: A step's status in the class summary: the checker's three, plus a step not given.
STATUSES = ("correct", "carried", "wrong", "missing")
FORMATS = ("text", "md", "tex", "json", "csv")


@dataclass(frozen=True)
class StudentResult:
    """One student's answer: the checker's `report` (None when unreadable) and the score."""

    name: str
    source: str | None  # the file name, None for an answer given as a dict
    report: Any = field(default=None, repr=False)  # checker.Report
    reason: str | None = None  # why the answer is unreadable
    statuses: Mapping[str, str] = field(default_factory=dict)  # graded step key -> STATUSES
    points: float | None = None
    max_points: float = 0.0

    @property
    def readable(self) -> bool:
        return self.report is not None

    @property
    def ok(self) -> bool:
        return self.report is not None and self.report.ok

    @property
    def score(self) -> float | None:
        if self.points is None or not self.max_points:
            return None
        return self.points / self.max_points

    @property
    def first_wrong(self) -> str | None:
        return None if self.report is None else self.report.first_wrong

    @property
    def codes(self) -> tuple[str, ...]:
        """The diagnosis codes of the wrong steps, each once, in trace order."""
        if self.report is None:
            return ()
        out: list[str] = []
        for s in self.report.steps:
            if s.status == "wrong" and s.diagnosis is not None and s.diagnosis.code not in out:
                out.append(s.diagnosis.code)
        return tuple(out)

    def to_dict(self) -> dict:
        return {"student": self.name, "file": self.source,
                "status": "unreadable" if not self.readable else "ok" if self.ok else "wrong",
                "score": self.score, "points": self.points, "max_points": self.max_points,
                "first_wrong": self.first_wrong, "mistakes": list(self.codes),
                "steps": dict(self.statuses), "reason": self.reason}


@dataclass(frozen=True)
class ClassReport:
    """The class: each student's result and the summary (`render`, `to_dict`, `to_csv`)."""

    trace: Trace = field(repr=False)
    students: tuple[StudentResult, ...]
    weights: Mapping[str, float]  # graded step key -> weight (> 0), in trace order
    lang: str = "en"

    @property
    def ok(self) -> bool:
        return bool(self.students) and all(s.ok for s in self.students)

    @property
    def readable(self) -> tuple[StudentResult, ...]:
        return tuple(s for s in self.students if s.readable)

    @property
    def unreadable(self) -> tuple[StudentResult, ...]:
        return tuple(s for s in self.students if not s.readable)

    @property
    def mean_score(self) -> float | None:
        scores = [s.score for s in self.readable if s.score is not None]
        return sum(scores) / len(scores) if scores else None

    def step_counts(self) -> dict[str, dict[str, int]]:
        """Per graded step, how many readable answers have it correct / carried / wrong / missing."""
        counts = {key: dict.fromkeys(STATUSES, 0) for key in self.weights}
        for s in self.readable:
            for key, status in s.statuses.items():
                counts[key][status] += 1
        return counts

    def mistakes(self) -> list[dict]:
        """The mistake codes, most common first: how many students made each (a student who
        made it in two heads counts once), the steps where it was seen, and one example student."""
        found: dict[str, dict] = {}
        for s in self.readable:
            for code in s.codes:
                found.setdefault(code, {"code": code, "count": 0, "example": s.name, "steps": []})["count"] += 1
            for step in s.report.steps:
                if step.status == "wrong" and step.diagnosis is not None:
                    steps = found[step.diagnosis.code]["steps"]
                    if step.key not in steps:
                        steps.append(step.key)
        order = {key: i for i, key in enumerate(st.key for st in self.trace.steps)}
        for e in found.values():
            e["steps"].sort(key=order.get)
        from attntrace.grading.diagnose import CODES

        rank = {code: i for i, code in enumerate(CODES)}
        return sorted(found.values(), key=lambda e: (-e["count"], rank.get(e["code"], len(rank))))

    def to_dict(self) -> dict:
        """The summary as JSON data (what `attntrace check ... --format json` prints for a class)."""
        return {"ok": self.ok, "title": self.trace.title,
                "students": [s.to_dict() for s in self.students],
                "weights": dict(self.weights),
                "steps": [{"key": k, "weight": w, **self.step_counts()[k]} for k, w in self.weights.items()],
                "mistakes": self.mistakes(),
                "mean_score": self.mean_score,
                "counts": {"students": len(self.students), "ok": sum(s.ok for s in self.students),
                           "unreadable": len(self.unreadable)}}

    def to_csv(self) -> str:
        """One row per student, for a gradebook: student, file, status, score (percent), points,
        max_points, first_wrong, mistakes (space separated), one column per graded step, reason."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        keys = list(self.weights)
        w.writerow(["student", "file", "status", "score", "points", "max_points", "first_wrong", "mistakes", *keys, "reason"])
        for s in self.students:
            d = s.to_dict()
            w.writerow([_csv_text(s.name), _csv_text(s.source or ""), d["status"],
                        "" if s.score is None else _trim(100 * s.score, 2),
                        "" if s.points is None else _trim(s.points, 4), _trim(s.max_points, 4),
                        s.first_wrong or "", " ".join(s.codes), *[s.statuses.get(k, "") for k in keys],
                        _csv_text(s.reason or "")])
        return buf.getvalue()

    def render(self, format: str = "text", **options: Any) -> str:
        """The class summary (options as `render_class`; summary_only defaults to True here)."""
        options.setdefault("lang", self.lang)
        options.setdefault("summary_only", True)
        return render_class(self, format, **options)


# -- checking --------------------------------------------------------------------------------------
def check_class(spec_or_trace: Any, answers: Any, *, weights: Mapping[str, float] | None = None,
                mode: str | None = None, atol: float | None = None, rtol: float | None = None,
                decimals: int | None = None, lang: str = "en") -> ClassReport:
    """Check every answer in `answers` (a directory, or a list of paths, directories and dicts)
    against the problem `spec_or_trace` and score it (see the module's docstring).

    A bad problem, bad options or no answers at all raise BadInput; a bad answer never does.
    """
    from attntrace.grading.checker import check, checked_trace

    trace = checked_trace(spec_or_trace, mode=mode, atol=atol, rtol=rtol, lang=lang, decimals=decimals)
    graded = step_weights(trace, weights)
    total = sum(graded.values())

    students = []
    for i, answer in enumerate(answer_list(answers), start=1):
        source = Path(answer).name if isinstance(answer, (str, Path)) else None
        fallback = Path(answer).stem if source is not None else f"#{i}"
        name = fallback
        try:
            data = _read(answer)
            name = _clean_name(data.get("student")) or fallback
            report = check(trace, data, atol=atol, rtol=rtol, decimals=decimals, lang=lang)
        except (AttntraceError, RecursionError, MemoryError, Exception) as exc:  # noqa: BLE001 - one answer never stops the class
            students.append(StudentResult(name, source, reason=_reason(exc), max_points=total))
            continue
        given = {s.key: s.status for s in report.steps}
        statuses = {key: given.get(key, "missing") for key in graded}
        points = sum(w for key, w in graded.items() if statuses[key] in ("correct", "carried"))
        students.append(StudentResult(name, source, report=report, statuses=statuses, points=points, max_points=total))
    return ClassReport(trace=trace, students=tuple(students), weights=graded, lang=lang)


def answer_list(answers: Any) -> list:
    """A directory, a path, a dict, or a list of them -> the answers in order (directories
    expanded to their .toml/.json files sorted by name). No answers at all is BadInput."""
    items = list(answers) if isinstance(answers, (list, tuple)) else [answers]
    out: list = []
    for a in items:
        if isinstance(a, (str, Path)) and Path(a).is_dir():
            try:
                files = sorted((p for p in Path(a).iterdir() if p.suffix.lower() in ANSWER_SUFFIXES and not p.is_dir()),
                               key=lambda p: p.name)
            except OSError as exc:
                raise BadInput(f"cannot list the answers folder {str(a)!r}: {exc.strerror or exc}") from None
            if not files:
                raise BadInput(f"the folder {str(a)!r} holds no answer files (*.toml, *.json)")
            out += files
        elif isinstance(a, (str, Path, Mapping)):
            out.append(a)
        else:
            raise BadInput(f"an answer is a path or a dict, not {type(a).__name__}")
    if not out:
        raise BadInput("no answers to check")
    return out


def step_weights(trace: Trace, weights: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Every graded step key of `trace` -> its weight (see the module's docstring)."""
    keys = [s.key for s in trace.steps]
    ids = {s.id for s in trace.steps}
    out = dict.fromkeys(keys, 1.0)
    if weights:
        if not isinstance(weights, Mapping):
            raise BadInput("weights must be a table of step -> weight, e.g. {\"weights\": 2}")
        items = sorted(weights.items(), key=lambda kv: "@" in str(kv[0]))  # ids first, then id@head
        for name, w in items:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise BadInput(f"the weight of {name} must be a number >= 0, not {w!r}")
            name = str(name)
            if name in keys:
                out[name] = float(w)
            elif "@" not in name and name in ids:
                for s in trace.steps:
                    if s.id == name:
                        out[s.key] = float(w)
            else:
                raise BadInput(f"weights: this problem has no step {name!r} (steps: {', '.join(keys)})")
    graded = {k: w for k, w in out.items() if w > 0}
    if not graded:
        raise BadInput("the weights leave no step to grade (every weight is 0)")
    return graded


def parse_weights(text: str | None) -> dict[str, float] | None:
    """`--weights "weights=2,Z=1,Q=0"` -> {"weights": 2.0, "Z": 1.0, "Q": 0.0}."""
    if text is None:
        return None
    out: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        try:
            w = float(value)
        except ValueError:
            w = None
        if not sep or not name.strip() or w is None:
            raise BadInput(f"--weights: write step=weight pairs separated by commas (weights=2,Z=1), not {part.strip()!r}")
        out[name.strip()] = w
    return out


def _read(answer: Any) -> Mapping:
    """A path -> its table (floats keep their raw text, as the checker reads them); a dict as is."""
    if isinstance(answer, Mapping):
        return answer
    from attntrace.grading.answer import read_answer_file

    return read_answer_file(answer)


def _reason(exc: BaseException) -> str:
    """Why an answer is unreadable, in one line (an unexpected error is named as such)."""
    from attntrace.inputs.safetext import one_line

    text = one_line(" ".join(str(exc).split()))
    if isinstance(exc, AttntraceError):
        return text or type(exc).__name__
    if isinstance(exc, RecursionError):
        return "the answer is nested too deeply"
    if isinstance(exc, MemoryError):
        return "out of memory: the answer is too large for this machine's memory limit"
    return f"internal error ({type(exc).__name__}): {text}; please report it"


def _without_prefix(reason: str | None, source: str | None) -> str | None:
    """A reason shown next to its file name need not start with it again."""
    if reason and source and reason.startswith(source + ": "):
        return reason[len(source) + 2:]
    return reason


def _clean_name(name: Any) -> str | None:
    if not isinstance(name, str):
        return None
    from attntrace.inputs.safetext import clean_text

    text = " ".join(clean_text(name).split())
    return text[:80] or None


def _csv_text(text: str) -> str:
    """A cell a spreadsheet will not run as a formula (=, +, -, @ first: quoted with ')."""
    from attntrace.inputs.safetext import clean_text

    text = clean_text(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _trim(x: float, decimals: int) -> str:
    text = f"{x:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


# -- reports ---------------------------------------------------------------------------------------
def percent(score: float | None) -> str:
    """0.8333 -> '83.3' (at most one decimal; 100, not 100.0)."""
    return "" if score is None else _trim(100 * score, 1)


def display_width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else 0 if unicodedata.combining(c) else 1 for c in text)


def text_table(rows: Iterable[Iterable[Any]], indent: str = "  ", gap: str = "  ") -> str:
    """Rows of cells -> aligned plain-text lines (wide CJK characters count twice)."""
    rows = [[str(c) for c in row] for row in rows]
    if not rows:
        return ""
    widths = [max(display_width(r[i]) for r in rows if i < len(r)) for i in range(max(len(r) for r in rows))]
    lines = []
    for r in rows:
        cells = [c + " " * (widths[i] - display_width(c)) for i, c in enumerate(r)]
        lines.append((indent + gap.join(cells)).rstrip())
    return "\n".join(lines)


def tex_breakable(text: Any) -> str:
    """User text for LaTeX (escaped) in which a long word may break anywhere (a long file
    name in a narrow table column must not run into the margin)."""
    from attntrace.rendering.viewmodel import escape_tex

    words = []
    for word in " ".join(str(text).split()).split(" "):
        if len(word) <= 12:
            words.append(escape_tex(word))
        else:
            words.append(r"\allowbreak{}".join(escape_tex(ch) for ch in word))
    return " ".join(words)


def render_class(report: ClassReport, format: str = "text", *, summary_only: bool = False, **options: Any) -> str:
    """Each student's report (`checker.render_report`, headed by the student's name and score)
    followed by the class summary; `summary_only` gives the summary alone. json and csv are
    always the summary alone (`to_dict`, `to_csv`).

    options: lang, standalone (tex: one complete document), and the options of render_report
    (precision, max_size, math_delimiters, template_dir, width, rows).
    """
    lang = options.pop("lang", None) or report.lang
    if format == "json":
        import json

        return json.dumps(report.to_dict(), ensure_ascii=False, indent=1)
    if format == "csv":
        return report.to_csv()
    from attntrace.grading.checker import FORMATS as CHECK_FORMATS, LANGS
    from attntrace.grading.reports import _environment, _title, messages as _messages, render_report
    from attntrace.rendering.jinja_env import user_template_errors
    from attntrace.rendering.plaindata import to_plain

    if format not in CHECK_FORMATS:
        raise BadInput(f"unknown report format {format!r}; choose one of {', '.join(FORMATS)}")
    if lang not in LANGS:
        raise BadInput(f"unknown language {lang!r}; choose one of {', '.join(LANGS)}")
    standalone = bool(options.pop("standalone", False))
    template_dir = options.get("template_dir")
    students = []
    for s in report.students:
        text = None
        if not summary_only and s.report is not None:
            text = render_report(s.report, format, lang=lang, standalone=False, **options).rstrip("\n")
        students.append({"name": s.name, "source": s.source, "readable": s.readable, "ok": s.ok,
                         "score": percent(s.score), "points": "" if s.points is None else _trim(s.points, 2),
                         "max_points": _trim(s.max_points, 2), "first_wrong": s.first_wrong, "codes": list(s.codes),
                         "reason": _without_prefix(s.reason, s.source), "report": text})
    counts = report.step_counts()
    steps = [{"key": k, "weight": _trim(w, 2), **counts[k]} for k, w in report.weights.items()]
    env = _environment(template_dir)
    env.filters["text_table"] = text_table
    env.filters["tex_breakable"] = tex_breakable
    with user_template_errors(env, template_dir):
        m = _messages(lang, template_dir, format)
        c = env.get_template(f"check/class_messages.{lang}.j2").make_module({"format": format})
        text = env.get_template(f"check/class.{format}.j2").render(
            m=m.module, c=c, lang=lang, students=to_plain(students), steps=to_plain(steps), mistakes=to_plain(report.mistakes()),
            n_students=len(report.students), n_ok=sum(s.ok for s in report.students),
            n_unreadable=len(report.unreadable), n_readable=len(report.readable),
            mean=percent(report.mean_score), summary_only=summary_only, standalone=standalone,
            equal_weights=len(set(report.weights.values())) == 1,
            title=_title(report.trace, format, lang, options.get("math_delimiters") or "dollars"),
        )
    return text.rstrip("\n") + "\n"


def wants_class(args) -> bool:
    """`attntrace check`: grade a class when given several answers, a folder, csv, a
    summary or weights; one answer file alone is the single check, unchanged."""
    return (len(args.answer) > 1 or Path(args.answer[0]).is_dir() or args.format == "csv"
            or args.summary_only or args.weights is not None)


def class_command(args, render_options: Mapping[str, Any], to_json) -> tuple[str, bool]:
    """`attntrace check SPEC ANSWER... | DIR`: (the text to print, every answer right?): each
    student's report and the class summary (only the summary with --summary-only, csv or json)."""
    report = check_class(args.spec, args.answer, weights=parse_weights(args.weights), mode=args.mode,
                         atol=args.atol, rtol=args.rtol, decimals=getattr(args, "decimals", None), lang=args.lang)
    if args.format == "json":
        text = to_json(report.to_dict())
    elif args.format == "csv":
        text = report.to_csv()
    else:
        text = render_class(report, args.format, summary_only=args.summary_only, **render_options)
    return text, report.ok


__all__ = ["check_class", "ClassReport", "StudentResult", "render_class", "step_weights", "parse_weights", "STATUSES"]
