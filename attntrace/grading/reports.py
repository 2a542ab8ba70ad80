"""The reports of a check a student reads: text, Markdown, LaTeX (JSON is `Report.to_dict`).

Every wrong step is explained (its wrong entries, the likely mistake and the mistakes that
cannot be told apart from it, the correct computation of the step); remarks on steps that are
not wrong (moved by an earlier rounding, -inf written as a huge negative number) are listed;
the footer states the tolerance rule in force. All sentences are in
templates/check/messages.<lang>.j2; the layout in templates/check/report.<format>.j2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from attntrace.grading.checker import FORMATS, LANGS, Report, StepResult
from attntrace.grading.diagnose import UNKNOWN
from attntrace.inputs.usertext import clean_text, format_user_text, inline_math_for
from attntrace.model.errors import BadInput
from attntrace.model.trace import Trace
from attntrace.rendering.jinja_env import user_template_errors
from attntrace.rendering.plaindata import Formatted, plain_context, to_plain
from attntrace.rendering.sandbox import fresh_budget
from attntrace.rendering.printing import plain_number
from attntrace.rendering.viewmodel import escape_md, escape_tex as tex_escape


class _Messages:
    """The phrases and diagnosis sentences of one language (templates/check/messages.<lang>.j2).
    A diagnosis macro gets `d`: the diagnosis numbers as plain data plus the helper macros of
    templates/check/helpers.j2 (d.math, d.code, d.num, d.shape), never a Python object."""

    def __init__(self, module: Any, format: str, helpers: Any):
        self.module = module
        self.format = format
        self.helpers = {name: getattr(helpers, name) for name in ("math", "code", "num", "shape")}

    def diagnosis(self, code: str, params: Mapping[str, Any]) -> str:
        macro = getattr(self.module, code, None) or getattr(self.module, UNKNOWN, None)
        if macro is None:  # a user's messages template without the catch-all macro
            raise BadInput(f"template {getattr(self.module, '__name__', 'check/messages')}: no macro {code!r} "
                           f"and no {UNKNOWN!r} macro for the mistakes it does not name")
        d = plain_context({"d": {**to_plain(dict(params)), **self.helpers}})["d"]
        with fresh_budget():
            return str(macro(d))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)


def format_number(x: Any, precision: int = 4) -> str:
    return "" if x is None else plain_number(float(x), precision, count=False)


_Formatted = Formatted  # user text already formatted for its output: the escaping filters pass it through


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


def messages(lang: str, template_dir, format: str) -> _Messages:
    if lang not in LANGS:
        raise BadInput(f"unknown language {lang!r}; choose one of {', '.join(LANGS)}")
    env = _environment(template_dir)
    return _Messages(env.get_template(f"check/messages.{lang}.j2").make_module({"format": format}), format,
                     env.get_template("check/helpers.j2").make_module({"format": format}))


def render_report(report: Report, format: str = "text", lang: str = "en", **options: Any) -> str:
    """The report a student reads: verdict, each step's status, every wrong step's wrong
    entries, likely mistake (and the ones that cannot be told apart from it) and the correct
    computation of that step (render.render_step), remarks, and the tolerance rule.

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
        title=_title(report.trace, format, lang, options.get("math_delimiters") or "dollars"),
        standalone=bool(options.get("standalone")), math_delimiters=options.get("math_delimiters") or "dollars",
        n_wrong=len(wrong), n_carried=sum(r["status"] == "carried" and not r["code"] for r in rows),
        max_entries=options.get("max_size") or 8,
    )
    return text.rstrip("\n") + "\n"


def policy_view(policy) -> dict[str, Any]:
    """The tolerance rule in force, as the footer's templates read it (kind, decimals, atol, rtol)."""
    return to_plain({"kind": policy.kind, "decimals": policy.decimals, "atol": policy.atol, "rtol": policy.rtol})


def _row(s: StepResult, trace: Trace, format: str, lang: str, precision: int, template_dir, options) -> dict:
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


