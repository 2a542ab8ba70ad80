"""A check report as HTML: the student's matrices, each entry coloured by the checker's verdict.

An entry is *right* when the checker found it right, *wrong* when it is one of a wrong step's
wrong entries, *carried* when it differs from the truth only because an earlier wrong step
was carried forward (the checker recomputed from the student's numbers and it matches). Beside
each wrong step stands its diagnosis, the same sentence the Markdown report gives. Below
comes the Markdown report itself, as HTML (`rendering.html.markdown_page`).

The verdicts are the checker's (`Report.steps`); this module only lays them out as plain data
for `templates/html/check.j2`.
"""

from __future__ import annotations

from typing import Any

from attntrace.grading.answer import load_answer
from attntrace.grading.checker import Report, split_full_width
from attntrace.rendering.printing import plain_number

#: status of a step -> the verdict of its entries listed as wrong (the others are right)
_LISTED = {"wrong": "wrong", "carried": "carried", "correct": "right"}


def entry_verdicts(report: Report, answers: Any) -> list[dict]:
    """One record per checked step: key, status, the student's entries with a verdict each,
    and the diagnosis code (the message is added by `check_html`)."""
    out = []
    for s in report.steps:
        a = answers.get((s.id, s.head))
        if a is None:
            continue
        listed = {(e.row, e.col): e for e in s.wrong_entries}
        mismatch = s.given_shape is not None and s.expected_shape is not None and s.given_shape != s.expected_shape
        rows = []
        for i, row in enumerate(a.entries, start=1):
            cells = []
            for j, e in enumerate(row, start=1):
                w = listed.get((i, j))
                # a matrix of the wrong shape cannot be compared entry by entry: all of it is
                # the step's verdict (wrong, or carried from an earlier step's wrong shape)
                verdict = _LISTED.get(s.status, "wrong") if (mismatch or w is not None) else "right"
                cells.append({"text": e.text, "verdict": verdict,
                              "expected": "" if w is None else plain_number(float(w.expected), 4, count=False)})
            rows.append(cells)
        out.append({"key": s.key, "status": s.status, "rows": rows,
                    "code": s.diagnosis.code if s.diagnosis is not None else ""})
    return out


def check_html(report: Report, answer: Any, lang: str = "en", fragment: bool = False, **options: Any) -> str:
    """The report as an HTML page (or fragment): coloured matrices, then the Markdown report."""
    from attntrace.grading.reports import render_report
    from attntrace.rendering.html import markdown_page, markdown_to_html
    from attntrace.rendering.renderer import environment

    trace = report.trace
    answers = split_full_width(trace, load_answer(answer, tuple(dict.fromkeys(s.id for s in trace.steps))))
    steps = entry_verdicts(report, answers)
    for st, s in zip(steps, [s for s in report.steps if (s.id, s.head) in answers]):
        msg = s.diagnosis.message(lang, "md", options.get("template_dir")) if s.diagnosis is not None and st["status"] == "wrong" else ""
        st["diagnosis"] = markdown_to_html(msg) if msg else ""
    keep = {k: v for k, v in options.items() if k in ("precision", "max_size", "template_dir")}
    md = render_report(report, format="md", lang=lang, **keep)
    from attntrace.rendering.jinja_env import user_template_errors

    env = environment(options.get("template_dir"))
    with user_template_errors(env, options.get("template_dir")):  # a user's html/check.j2 fails in one line
        extra = env.get_template("html/check.j2").render(lang=lang, steps=steps)
    title = trace.localized("title", lang) or ""
    return markdown_page(md, lang, title, fragment=fragment, extra=extra, template_dir=options.get("template_dir"))
