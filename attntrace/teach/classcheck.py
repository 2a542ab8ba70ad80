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

import collections
import csv
import io
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from attntrace.model.errors import BadInput
from attntrace.model.trace import Trace
from attntrace.rendering.textcolumns import text_table
from attntrace.teach.answerkey import answer_name
from attntrace.teach.classgrade import (ANSWER_SUFFIXES, Grading, StudentResult, collect, default_jobs, mark_duplicates,
                                        results)

#: A step's status in the class summary: the checker's three, plus a step not given.
STATUSES = ("correct", "carried", "wrong", "missing")
FORMATS = ("text", "md", "tex", "json", "csv")


class Tally:
    """The class summary's numbers, added up one student at a time (nothing else is kept
    unless `keep_rows`: the light rows a text summary's student table lists)."""

    def __init__(self, trace: Trace, weights: Mapping[str, float], keep_rows: bool = True):
        self.trace, self.weights, self.keep_rows = trace, weights, keep_rows
        self.n = self.n_ok = self.n_unreadable = 0
        self.score_sum, self.n_scored = 0.0, 0
        self.counts = {key: dict.fromkeys(STATUSES, 0) for key in weights}
        self.found: dict[str, dict] = {}
        self.ignored: collections.Counter = collections.Counter()  # ignored key -> answers that had it
        self.n_ignoring = 0
        self.names: dict[str, list[str]] = {}  # student name -> the files (or #i) that name them
        self.rows: list[StudentResult] = []

    def add(self, s: StudentResult) -> None:
        self.n += 1
        self.n_ok += s.ok
        if self.keep_rows:
            self.rows.append(s)
        if not s.readable:
            self.n_unreadable += 1
            return
        if s.score is not None:
            self.score_sum += s.score
            self.n_scored += 1
        for key, status in s.statuses.items():
            self.counts[key][status] += 1
        for code in s.codes:
            self.found.setdefault(code, {"code": code, "count": 0, "example": s.name, "steps": []})["count"] += 1
        for code, key in s.mistake_steps:
            if key not in self.found[code]["steps"]:
                self.found[code]["steps"].append(key)
        if s.ignored:
            self.n_ignoring += 1
            self.ignored.update(set(s.ignored))
        self.names.setdefault(s.name, []).append(s.source or s.name)

    @property
    def mean_score(self) -> float | None:
        return self.score_sum / self.n_scored if self.n_scored else None

    def mistakes(self) -> list[dict]:
        order = {key: i for i, key in enumerate(answer_name(st) for st in self.trace.steps)}
        found = [{**e, "steps": sorted(e["steps"], key=order.get)} for e in self.found.values()]
        from attntrace.grading.diagnose import CODES

        rank = {code: i for i, code in enumerate(CODES)}
        return sorted(found, key=lambda e: (-e["count"], rank.get(e["code"], len(rank))))

    def duplicates(self) -> list[dict]:
        """Student names given by more than one readable answer, with their files."""
        return [{"student": name, "files": files} for name, files in self.names.items() if len(files) > 1]

    def summary(self) -> dict:
        counts = {"students": self.n, "ok": self.n_ok, "unreadable": self.n_unreadable}
        if self.n_ignoring:
            counts["ignored_keys"] = sum(self.ignored.values())
            counts["answers_with_ignored_keys"] = self.n_ignoring
        return {"weights": dict(self.weights),
                "steps": [{"key": k, "weight": w, **self.counts[k]} for k, w in self.weights.items()],
                "mistakes": self.mistakes(), "mean_score": self.mean_score, "counts": counts}


@dataclass(frozen=True)
class ClassReport:
    """The class: each student's result and the summary (`render`, `to_dict`, `to_csv`)."""

    trace: Trace
    students: tuple[StudentResult, ...]
    weights: Mapping[str, float]  # graded step key -> weight (> 0), in trace order
    lang: str = "en"
    skipped: tuple[tuple[str, str], ...] = ()  # folder entries not read: (file name, reason)

    def __repr__(self) -> str:
        return f"ClassReport({len(self.students)} students, ok={self.ok})"

    def tally(self) -> Tally:
        t = Tally(self.trace, self.weights, keep_rows=False)
        for s in self.students:
            t.add(s)
        return t

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
        return self.tally().mean_score

    def step_counts(self) -> dict[str, dict[str, int]]:
        """Per graded step, how many readable answers have it correct / carried / wrong / missing."""
        return self.tally().counts

    def mistakes(self) -> list[dict]:
        """The mistake codes, most common first: how many students made each (a student who
        made it in two heads counts once), the steps where it was seen, and one example student."""
        return self.tally().mistakes()

    def to_dict(self) -> dict:
        """The summary as JSON data (what `attntrace check ... --format json` prints for a class)."""
        return class_dict(self.trace, self.students, self.tally(), self.skipped)

    def to_csv(self) -> str:
        """One row per student, for a gradebook: student, file, status, score (percent), points,
        max_points, first_wrong, mistakes (space separated), one column per graded step, reason."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(csv_header(self.weights))
        for s in self.students:
            w.writerow(csv_row(s, self.weights))
        for name, why in self.skipped:
            w.writerow(skipped_row(name, why, self.weights))
        return buf.getvalue()

    def render(self, format: str = "text", **options: Any) -> str:
        """The class summary (options as `render_class`; summary_only defaults to True here)."""
        options.setdefault("lang", self.lang)
        options.setdefault("summary_only", True)
        return render_class(self, format, **options)


def class_dict(trace: Trace, students: Iterable[StudentResult], tally: Tally, skipped) -> dict:
    d = {"ok": tally.n > 0 and tally.n_ok == tally.n, "title": trace.title,
         "students": [s.to_dict() for s in students], **tally.summary()}
    if skipped:
        d["skipped"] = [{"file": name, "reason": why} for name, why in skipped]
    dups = tally.duplicates()
    if dups:
        d["duplicates"] = dups
    return d


def csv_header(weights: Mapping[str, float]) -> list[str]:
    return ["student", "file", "status", "score", "points", "max_points", "first_wrong", "mistakes", *weights, "reason"]


def csv_row(s: StudentResult, weights: Mapping[str, float]) -> list[str]:
    status = "unreadable" if not s.readable else "ok" if s.ok else "wrong"
    why = s.reason or ""
    if s.readable and s.duplicate:
        why = "duplicate: another answer names the same student"
    if s.readable and s.ignored:
        why = "; ".join(x for x in (why, "ignored " + ", ".join(repr(k) for k in s.ignored)) if x)
    return [_csv_text(s.name), _csv_text(s.source or ""), status,
            "" if s.score is None else _trim(100 * s.score, 2),
            "" if s.points is None else _trim(s.points, 4), _trim(s.max_points, 4),
            s.first_wrong or "", " ".join(s.codes), *[s.statuses.get(k, "") for k in weights], _csv_text(why)]


def skipped_row(name: str, why: str, weights: Mapping[str, float]) -> list[str]:
    return ["", _csv_text(name), "skipped", "", "", "", "", "", *["" for _ in weights], _csv_text(why)]


# -- checking --------------------------------------------------------------------------------------
def check_class(spec_or_trace: Any, answers: Any, *, weights: Mapping[str, float] | None = None,
                mode: str | None = None, atol: float | None = None, rtol: float | None = None,
                decimals: int | None = None, lang: str = "en", jobs: int = 1) -> ClassReport:
    """Check every answer in `answers` (a directory, or a list of paths, directories and dicts)
    against the problem `spec_or_trace` and score it (see the module's docstring).

    jobs: worker processes (jobs > 1: the same results, in the same order; each student's
    checker `report` is then not kept). A bad problem, bad options or no answers at all raise
    BadInput; a bad answer never does.
    """
    g, items, skipped = prepare(spec_or_trace, answers, weights=weights, mode=mode, atol=atol, rtol=rtol,
                                decimals=decimals, lang=lang, keep_reports=_jobs(jobs) <= 1)
    students = mark_duplicates(results(g, items, _jobs(jobs)))
    return ClassReport(trace=g.trace, students=students, weights=g.weights, lang=lang, skipped=tuple(skipped))


def prepare(spec_or_trace: Any, answers: Any, *, weights, mode, atol, rtol, decimals, lang, keep_reports=False,
            render_format=None, render_options=None) -> tuple[Grading, list, list]:
    """The problem traced once, the weights and the answers checked: (Grading, answers, skipped)."""
    from attntrace.grading.checker import checked_trace

    trace = checked_trace(spec_or_trace, mode=mode, atol=atol, rtol=rtol, lang=lang, decimals=decimals)
    graded = step_weights(trace, weights)
    items, skipped = collect(answers)
    return Grading(trace, graded, atol, rtol, decimals, lang, keep_reports, render_format, dict(render_options or {})), items, skipped


def _jobs(jobs: Any) -> int:
    if jobs is None:
        return default_jobs()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise BadInput(f"jobs must be a whole number >= 1, not {jobs!r}")
    return jobs


def answer_list(answers: Any) -> list:
    """A directory, a path, a dict, or a list of them -> the answers in order (directories
    expanded to their .toml/.json regular files sorted by name). No answers at all is BadInput."""
    return collect(answers)[0]


def step_weights(trace: Trace, weights: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Every graded step key of `trace` -> its weight (see the module's docstring). The weights
    must be finite, >= 0, and add up to a finite number (1e308 twice does not)."""
    keys = [answer_name(s) for s in trace.steps]  # every block of the online softmax has its own
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
                        out[answer_name(s)] = float(w)
            else:
                raise BadInput(f"weights: this problem has no step {name!r} (steps: {', '.join(keys)})")
    graded = {k: w for k, w in out.items() if w > 0}
    if not graded:
        raise BadInput("the weights leave no step to grade (every weight is 0)")
    if not math.isfinite(sum(graded.values())):
        raise BadInput("the weights are too large: their sum is not a finite number (give weights such as 1, 2, 0.5)")
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


def _without_prefix(reason: str | None, source: str | None) -> str | None:
    """A reason shown next to its file name need not start with it again."""
    if reason and source and reason.startswith(source + ": "):
        return reason[len(source) + 2:]
    return reason


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


def tex_breakable(text: Any) -> str:
    """User text for LaTeX (escaped) in which a long word may break anywhere (a long file
    name in a narrow table column must not run into the margin)."""
    from attntrace.inputs.textescape import escape_tex

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
        return json.dumps(report.to_dict(), ensure_ascii=False, indent=1)
    if format == "csv":
        return report.to_csv()
    tally = Tally(report.trace, report.weights)
    for s in report.students:
        tally.add(s)
    return _render_document(report.trace, report.weights, tally, report.skipped, format, lang, summary_only, options)


def _render_document(trace: Trace, weights: Mapping[str, float], tally: Tally, skipped, format: str, lang: str,
                     summary_only: bool, options: Mapping[str, Any]) -> str:
    """The class document from a tally that kept its rows (`Tally(keep_rows=True)`)."""
    from attntrace.grading.messages import FORMATS as CHECK_FORMATS, LANGS, messages as _messages, report_environment, report_title
    from attntrace.grading.reports import render_report
    from attntrace.rendering.jinja_env import user_template_errors
    from attntrace.rendering.plaindata import to_plain

    options = dict(options)
    if format not in CHECK_FORMATS:
        raise BadInput(f"unknown report format {format!r}; choose one of {', '.join(FORMATS)}")
    if lang not in LANGS:
        raise BadInput(f"unknown language {lang!r}; choose one of {', '.join(LANGS)}")
    standalone = bool(options.pop("standalone", False))
    template_dir = options.get("template_dir")
    duplicated = {d["student"] for d in tally.duplicates()}
    students = []
    for s in tally.rows:
        text = None
        if not summary_only:
            text = s.text
            if text is None and s.report is not None:
                text = render_report(s.report, format, lang=lang, standalone=False, **options).rstrip("\n")
        students.append({"name": s.name, "source": s.source, "readable": s.readable, "ok": s.ok,
                         "score": percent(s.score), "points": "" if s.points is None else _trim(s.points, 2),
                         "max_points": _trim(s.max_points, 2), "first_wrong": s.first_wrong, "codes": list(s.codes),
                         "reason": _without_prefix(s.reason, s.source), "report": text,
                         "duplicate": s.readable and s.name in duplicated})
    steps = [{"key": k, "weight": _trim(w, 2), **tally.counts[k]} for k, w in weights.items()]
    env = report_environment(template_dir)
    env.filters["text_table"] = text_table
    env.filters["tex_breakable"] = tex_breakable
    with user_template_errors(env, template_dir):
        m = _messages(lang, template_dir, format)
        c = env.get_template(f"check/class_messages.{lang}.j2").make_module({"format": format})
        text = env.get_template(f"check/class.{format}.j2").render(
            m=m.module, c=c, lang=lang, students=to_plain(students), steps=to_plain(steps), mistakes=to_plain(tally.mistakes()),
            n_students=tally.n, n_ok=tally.n_ok, n_unreadable=tally.n_unreadable, n_readable=tally.n - tally.n_unreadable,
            mean=percent(tally.mean_score), summary_only=summary_only, standalone=standalone,
            equal_weights=len(set(weights.values())) == 1,
            title=report_title(trace, format, lang, options.get("math_delimiters") or "dollars"),
            skipped=to_plain([{"source": name, "reason": why} for name, why in skipped]),
            duplicates=to_plain([{"student": d["student"], "files": list(d["files"])} for d in tally.duplicates()]),
            ignored=to_plain([{"key": k, "count": n} for k, n in tally.ignored.most_common()]), n_ignoring=tally.n_ignoring,
        )
    return text.rstrip("\n") + "\n"


def wants_class(args) -> bool:
    """`attntrace check`: grade a class when given several answers, a folder, csv, a
    summary or weights; one answer file alone is the single check, unchanged."""
    return (len(args.answer) > 1 or Path(args.answer[0]).is_dir() or args.format == "csv"
            or args.summary_only or args.weights is not None or getattr(args, "jobs", None) is not None)


def class_command(args, render_options: Mapping[str, Any], write) -> bool:
    """`attntrace check SPEC ANSWER... | DIR`: each student's report and the class summary (only
    the summary with --summary-only, csv or json), written through `write(text, is_json)` as it
    is graded: csv rows and json students stream out one by one and nothing is kept of them;
    the text, md and tex summaries keep one small row per student for their table. Returns
    whether every answer was right. --jobs N grades in N processes (default: the cores)."""
    fmt = args.format
    per_student = fmt in ("text", "md", "tex") and not args.summary_only
    options = {k: v for k, v in render_options.items() if k not in ("lang", "standalone", "figures", "output_path")}
    g, items, skipped = prepare(args.spec, args.answer, weights=parse_weights(args.weights), mode=args.mode,
                                atol=args.atol, rtol=args.rtol, decimals=getattr(args, "decimals", None), lang=args.lang,
                                render_format=fmt if per_student else None, render_options=options)
    jobs = _jobs(getattr(args, "jobs", None))
    tally = Tally(g.trace, g.weights, keep_rows=fmt not in ("csv", "json"))
    graded = _flag_repeats(_progress(results(g, items, jobs), len(items)), tally)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(csv_header(g.weights))
        for s in graded:
            tally.add(s)
            w.writerow(csv_row(s, g.weights))
            write(buf.getvalue(), False)
            buf.seek(0)
            buf.truncate()
        for name, why in skipped:
            w.writerow(skipped_row(name, why, g.weights))
        write(buf.getvalue(), False)
    elif fmt == "json":
        write('{\n "title": ' + json.dumps(g.trace.title, ensure_ascii=False) + ',\n "students": [', True)
        for i, s in enumerate(graded):
            tally.add(s)
            write(("," if i else "") + "\n  " + json.dumps(s.to_dict(), ensure_ascii=False), True)
        d = class_dict(g.trace, (), tally, skipped)
        d.pop("title")
        d.pop("students")
        tail = json.dumps(d, ensure_ascii=False, indent=1)
        write("\n ],\n" + tail[2:] + "\n", True)
    else:
        for s in graded:
            tally.add(s)
        text = _render_document(g.trace, g.weights, tally, skipped, fmt, args.lang, args.summary_only,
                                {**render_options, "lang": args.lang})
        write(text, False)
    return tally.n > 0 and tally.n_ok == tally.n


def _flag_repeats(graded: Iterable[StudentResult], tally: Tally) -> Iterable[StudentResult]:
    """A streamed answer naming a student an earlier answer named: flagged as a duplicate
    (the earlier row is already written; the summary lists both files)."""
    from dataclasses import replace

    for s in graded:
        yield replace(s, duplicate=True) if s.readable and s.name in tally.names else s


def _progress(graded: Iterable[StudentResult], total: int, stream=None) -> Iterable[StudentResult]:
    """A count on standard error ("graded 120 of 1008 answers"), for a run of many answers,
    only when standard error is a terminal (never in a pipe, a file or a test)."""
    stream = stream or sys.stderr
    show = total >= 50 and getattr(stream, "isatty", lambda: False)()
    last = time.monotonic()
    done = 0
    for s in graded:
        done += 1
        if show and (time.monotonic() - last > 0.2 or done == total):
            last = time.monotonic()
            stream.write(f"\rgraded {done} of {total} answers")
            stream.flush()
        yield s
    if show:
        stream.write("\n")
        stream.flush()


__all__ = ["check_class", "ClassReport", "StudentResult", "Tally", "render_class", "step_weights", "parse_weights",
           "STATUSES", "ANSWER_SUFFIXES"]
