"""Grading a class answer by answer: which files are answers, one answer's result, and many
answers in parallel, in order, without keeping them.

Why a module of its own: a class may hold 100,000 answers. Each answer's result is a small
`StudentResult` (its statuses, points, mistake codes; the checker's full `Report` only when
asked for), produced by `results()` one at a time in the answers' order, so a caller can write
each row as it comes and keep nothing (`classcheck.class_command` does). With jobs > 1 the
answers are graded by worker processes in chunks; each worker gets the problem's trace and its
`World` (truth, operands, the catalogue's mistakes) once, when it starts, never per answer.

A folder's entries are read only when they are regular files inside the folder: a FIFO or a
device would block or never end, and a symlink leading out of the folder would grade a file
the teacher did not put there. Each such entry is *skipped* with a one-line reason.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import stat
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from attntrace.model.errors import AttntraceError, BadInput
from attntrace.teach.answerkey import answer_name

#: The suffixes of answer files taken from a directory.
ANSWER_SUFFIXES = (".toml", ".json")


@dataclass(frozen=True)
class StudentResult:
    """One student's answer: the score and what the class summary needs of the check.

    `report` (the checker's Report) is kept only when asked for (`check_class` with jobs=1);
    everything else is plain data, small enough to send between processes."""

    name: str
    source: str | None  # the file name, None for an answer given as a dict
    report: Any = field(default=None, repr=False)  # checker.Report, or None
    reason: str | None = None  # why the answer is unreadable
    statuses: Mapping[str, str] = field(default_factory=dict)  # graded step key -> STATUSES
    points: float | None = None
    max_points: float = 0.0
    verdict: bool = False  # the check's ok: every step given is right
    first_wrong: str | None = None
    codes: tuple[str, ...] = ()  # the diagnosis codes of the wrong steps, each once, in trace order
    mistake_steps: tuple[tuple[str, str], ...] = ()  # (code, step key) of each wrong step, in trace order
    ignored: tuple[str, ...] = ()  # keys of the answer that are not steps (date = "..."): not checked
    text: str | None = field(default=None, repr=False)  # the student's rendered report, when asked for
    duplicate: bool = False  # another answer names the same student (set by the class)

    @property
    def readable(self) -> bool:
        return self.reason is None

    @property
    def ok(self) -> bool:
        return self.readable and self.verdict

    @property
    def score(self) -> float | None:
        if self.points is None or not self.max_points:
            return None
        return self.points / self.max_points

    def to_dict(self) -> dict:
        d = {"student": self.name, "file": self.source,
             "status": "unreadable" if not self.readable else "ok" if self.ok else "wrong",
             "score": self.score, "points": self.points, "max_points": self.max_points,
             "first_wrong": self.first_wrong, "mistakes": list(self.codes),
             "steps": dict(self.statuses), "reason": self.reason}
        if self.ignored:
            d["ignored_keys"] = list(self.ignored)
        if self.duplicate:
            d["duplicate"] = True
        return d


@dataclass(frozen=True)
class Grading:
    """What every answer of one class is graded with (sent to each worker once)."""

    trace: Any
    weights: Mapping[str, float]
    atol: float | None = None
    rtol: float | None = None
    decimals: int | None = None
    lang: str = "en"
    keep_reports: bool = False
    render_format: str | None = None  # also render each student's report (text, md, tex)
    render_options: Mapping[str, Any] = field(default_factory=dict)


# -- which files ---------------------------------------------------------------------------------
def collect(answers: Any) -> tuple[list, list[tuple[str, str]]]:
    """A directory, a path, a dict, or a list of them -> (the answers in order, the skipped
    folder entries as (file name, reason)). Directories are expanded to their .toml/.json
    regular files, sorted by name. No answers at all is BadInput."""
    items = list(answers) if isinstance(answers, (list, tuple)) else [answers]
    out: list = []
    skipped: list[tuple[str, str]] = []
    for a in items:
        if isinstance(a, (str, Path)) and Path(a).is_dir():
            files, skip = folder_answers(Path(a))
            skipped += skip
            if not files and not skip:
                raise BadInput(f"the folder {str(a)!r} holds no answer files (*.toml, *.json)")
            out += files
        elif isinstance(a, (str, Path, Mapping)):
            out.append(a)
        else:
            raise BadInput(f"an answer is a path or a dict, not {type(a).__name__}")
    if not out:
        raise BadInput("no answers to check" + (f" ({len(skipped)} file(s) skipped: {skipped[0][0]}: {skipped[0][1]})"
                                                 if skipped else ""))
    return out, skipped


def folder_answers(folder: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """The answer files of a folder, and the entries skipped with their reason: only regular
    files are read (a FIFO would block forever), and a symlink only when it stays inside the
    folder (os.stat, which never opens the file, tells them apart)."""
    try:
        entries = sorted((p for p in folder.iterdir() if p.suffix.lower() in ANSWER_SUFFIXES), key=lambda p: p.name)
    except OSError as exc:
        raise BadInput(f"cannot list the answers folder {str(folder)!r}: {exc.strerror or exc}") from None
    root = folder.resolve()
    files: list[Path] = []
    skipped: list[tuple[str, str]] = []
    for p in entries:
        try:
            mode = os.stat(p).st_mode  # follows a symlink; never opens the file
        except OSError as exc:
            skipped.append((p.name, f"cannot read: {exc.strerror or exc}"))
            continue
        if stat.S_ISDIR(mode):
            continue  # a folder named like an answer: not an answer, as before
        if p.is_symlink():
            target = p.resolve()
            if root != target.parent and root not in target.parents:
                skipped.append((p.name, "a symbolic link to a file outside the folder: not graded"))
                continue
        if not stat.S_ISREG(mode):
            skipped.append((p.name, "not a regular file (a pipe, socket or device): not read"))
            continue
        files.append(p)
    return files, skipped


# -- one answer ---------------------------------------------------------------------------------
def grade_one(g: Grading, index: int, answer: Any) -> StudentResult:
    """One answer checked and scored; a bad answer is unreadable, never an exception."""
    from attntrace.grading.checker import check
    source = Path(answer).name if isinstance(answer, (str, Path)) else None
    fallback = Path(answer).stem if source is not None else f"#{index}"
    total = sum(g.weights.values())
    name = fallback
    try:
        data = read(answer)
        name = clean_name(data.get("student")) or fallback
        report = check(g.trace, data, atol=g.atol, rtol=g.rtol, decimals=g.decimals, lang=g.lang)
    except (AttntraceError, RecursionError, MemoryError, Exception) as exc:  # noqa: BLE001 - one answer never stops the class
        return StudentResult(name, source, reason=reason(exc), max_points=total)
    # a block of the online softmax under its address, whether the answer named it so or by its plain id (the last block)
    named = {s.key: answer_name(g.trace.step(s.id, s.head)) for s in report.steps}
    given = {named[s.key]: s.status for s in report.steps}
    statuses = {key: given.get(key, "missing") for key in g.weights}
    points = sum(w for key, w in g.weights.items() if statuses[key] in ("correct", "carried"))
    wrong = [(s.diagnosis.code, named[s.key]) for s in report.steps if s.status == "wrong" and s.diagnosis is not None]
    text = None
    if g.render_format is not None:
        from attntrace.grading.checker import render_report

        text = render_report(report, g.render_format, lang=g.lang, standalone=False, **g.render_options).rstrip("\n")
    return StudentResult(name, source, report=report if g.keep_reports else None, statuses=statuses, points=points,
                         max_points=total, verdict=report.ok, first_wrong=report.first_wrong,
                         codes=tuple(dict.fromkeys(code for code, _ in wrong)), mistake_steps=tuple(wrong),
                         ignored=report.ignored, text=text)


def read(answer: Any) -> Mapping:
    """A path -> its table (floats keep their raw text, as the checker reads them); a dict as is."""
    if isinstance(answer, Mapping):
        return answer
    from attntrace.grading.answer import read_answer_file

    return read_answer_file(answer)


def reason(exc: BaseException) -> str:
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


def clean_name(name: Any) -> str | None:
    if not isinstance(name, str):
        return None
    from attntrace.inputs.safetext import clean_text

    text = " ".join(clean_text(name).split())
    return text[:80] or None


# -- many answers ---------------------------------------------------------------------------------
def default_jobs() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def results(g: Grading, items: list, jobs: int = 1) -> Iterator[StudentResult]:
    """Each answer's result, in the order of `items`, as soon as it and those before it are
    graded. jobs > 1: worker processes (forked, so the trace and its World are built once,
    here, and inherited), chunks of answers, at most a few chunks in flight, so memory does
    not grow with the class."""
    from attntrace.grading.diagnose import World

    World.of(g.trace)  # built before forking: every worker inherits it
    if jobs <= 1 or len(items) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        for i, item in enumerate(items, start=1):
            yield grade_one(g, i, item)
        return
    size = max(1, min(32, len(items) // (jobs * 4)))
    chunks = iter([(start + 1, items[start:start + size]) for start in range(0, len(items), size)])
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork"),
                               initializer=_start_worker, initargs=(g,))
    try:
        pending: collections.deque = collections.deque()
        for chunk in chunks:
            pending.append(pool.submit(_grade_chunk, *chunk))
            if len(pending) >= 3 * jobs:
                break
        while pending:
            done = pending.popleft().result()
            chunk = next(chunks, None)
            if chunk is not None:
                pending.append(pool.submit(_grade_chunk, *chunk))
            yield from done
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


_WORKER: dict = {}


def _start_worker(g: Grading) -> None:
    from attntrace.grading.diagnose import World

    _WORKER["grading"] = g
    World.of(g.trace)


def _grade_chunk(first: int, items: list) -> list[StudentResult]:
    g = _WORKER["grading"]
    return [grade_one(g, first + k, item) for k, item in enumerate(items)]


def mark_duplicates(students: Iterable[StudentResult]) -> tuple[StudentResult, ...]:
    """Students whose name another readable answer has too: flagged (each shown with its file)."""
    students = tuple(students)
    names = collections.Counter(s.name for s in students if s.readable)
    return tuple(replace(s, duplicate=True) if s.readable and names[s.name] > 1 else s for s in students)


__all__ = ["StudentResult", "Grading", "collect", "folder_answers", "grade_one", "results", "default_jobs",
           "mark_duplicates", "ANSWER_SUFFIXES"]
