"""The sentences of a check's report and the Jinja2 environment its templates render in.

`messages(lang, template_dir, format)` is templates/check/messages.<lang>.j2 as an object
whose `diagnosis(code, params)` is the sentence naming a mistake; `report_environment` adds
the escaping and number filters of the check templates; `report_title` is the spec's title
for a report. Used by `checker.Diagnosis.message`, `reports` and `teach.classcheck`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from attntrace.grading.diagnose import UNKNOWN
from attntrace.inputs.textescape import escape_md, escape_tex as tex_escape
from attntrace.inputs.usertext import format_user_text, inline_math_for
from attntrace.model.errors import BadInput
from attntrace.model.trace import Trace
from attntrace.rendering.printing import plain_number

LANGS = ("en", "zh")
FORMATS = ("text", "md", "tex")


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

    def code(self, text: str) -> str:
        """A step's key as code: `weights@2` in Markdown, \\texttt in LaTeX, plain in text."""
        if self.format == "md":
            return f"`{text}`"
        return f"\\texttt{{{tex_escape(text)}}}" if self.format == "tex" else text

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


def report_title(trace: Trace, format: str, lang: str, delimiters: str) -> _Formatted | None:
    """The spec's title for a report: `$...$` spans as math, the rest escaped (usertext)."""
    title = trace.localized("title", lang)
    if not title:
        return None
    return _Formatted(format_user_text(title, format, inline_math=inline_math_for(format, delimiters)))


def report_environment(template_dir: Path | str | None):
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
    env = report_environment(template_dir)
    return _Messages(env.get_template(f"check/messages.{lang}.j2").make_module({"format": format}), format)
