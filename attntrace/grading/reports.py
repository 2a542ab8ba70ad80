"""The reports of a check a student reads: text, Markdown, LaTeX (JSON is `Report.to_dict`).

Every wrong step is explained (its wrong entries, the likely mistake and the mistakes that
cannot be told apart from it, the correct computation of the step); remarks on steps that are
not wrong (moved by an earlier rounding, -inf written as a huge negative number) are listed;
the footer states the tolerance rule in force. All sentences are in
templates/check/messages.<lang>.j2; the layout in templates/check/report.<format>.j2.
"""

from __future__ import annotations

from typing import Any, Mapping

from attntrace.grading.messages import FORMATS, format_number, messages, report_environment, report_title
from attntrace.inputs.usertext import clean_output, clean_text
from attntrace.model.errors import BadInput
from attntrace.model.trace import Trace
from attntrace.rendering.jinja_env import user_template_errors
from attntrace.rendering.plaindata import to_plain


def render_report(report, format: str = "text", lang: str = "en", **options: Any) -> str:
    """The report a student reads: verdict, each step's status, every wrong step's wrong
    entries, likely mistake (and the ones that cannot be told apart from it) and the correct
    computation of that step (render.render_step), remarks, and the tolerance rule. `report`
    is a `checker.Report` (not imported here: the checker's records render through this module).

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
    env = report_environment(template_dir)
    with user_template_errors(env, template_dir):
        return _render_report(report, format, lang, precision, template_dir, env, options)


def _render_report(report, format: str, lang: str, precision: int, template_dir, env, options: Mapping[str, Any]) -> str:
    msgs = messages(lang, template_dir, format)
    rows = to_plain([_row(s, report.trace, format, lang, precision, template_dir, options) for s in report.steps])
    wrong = [r for r in rows if r["status"] == "wrong"]
    student = report.student
    text = env.get_template(f"check/report.{format}.j2").render(
        m=msgs.module, lang=lang, report={"ok": report.ok}, rows=rows, wrong=wrong, first=wrong[0] if wrong else None,
        remarks=[r for r in rows if r["code"] and r["status"] != "wrong"],
        student=None if student is None else clean_text(student),
        ignored=[clean_text(k)[:80] for k in report.ignored],
        policy=policy_view(report.policy), slack=to_plain(report.tolerance.get("slack")),
        title=report_title(report.trace, format, lang, options.get("math_delimiters") or "dollars"),
        standalone=bool(options.get("standalone")), math_delimiters=options.get("math_delimiters") or "dollars",
        n_wrong=len(wrong), n_carried=sum(r["status"] == "carried" and not r["code"] for r in rows),
        max_entries=options.get("max_size") or 8,
    )
    return clean_output(text.rstrip("\n") + "\n")  # whatever a template folder writes


def policy_view(policy) -> dict[str, Any]:
    """The tolerance rule in force, as the footer's templates read it (kind, decimals, atol, rtol)."""
    return to_plain({"kind": policy.kind, "decimals": policy.decimals, "atol": policy.atol, "rtol": policy.rtol})


def _row(s, trace: Trace, format: str, lang: str, precision: int, template_dir, options) -> dict:
    """One step of the report: status, remark or diagnosis (with its alternatives), wrong
    entries and, for a wrong step, its correct computation."""
    d = s.diagnosis
    return {
        "key": s.key, "id": s.id, "head": s.head, "status": s.status,
        "code": d.code if d else None,
        "message": d.message(lang, format, template_dir) if d else None,
        "alternatives": [{"code": a.code, "message": a.message(lang, format, template_dir)} for a in d.alternatives] if d else [],
        # a report shows a few of up to 65,536 wrong entries: only those are formatted (plain data)
        "entries": [{"row": e.row, "col": e.col, "expected": format_number(e.expected, precision), "given": clean_text(e.given_text)}
                    for e in s.wrong_entries[:options.get("max_size") or 8]],
        "n_entries": len(s.wrong_entries),
        "expected_shape": s.expected_shape, "given_shape": s.given_shape,
        "derivation": _correct_computation(trace, s, format, lang, options) if s.status == "wrong" else None,
    }


def _correct_computation(trace: Trace, result, format: str, lang: str, options: Mapping[str, Any]) -> str:
    """The derivation of one step, from the renderer; a plain matrix when the renderer cannot be imported."""
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


