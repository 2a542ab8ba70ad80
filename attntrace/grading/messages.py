"""The sentences of a check's report and the Jinja2 environment its templates render in.

`messages(lang, template_dir, format)` is templates/check/messages.<lang>.j2 as an object
whose `diagnosis(code, params)` is the sentence naming a mistake; `report_environment` adds
the escaping and number filters of the check templates; `report_title` is the spec's title
for a report. Used by `checker.Diagnosis.message`, `reports` and `teach.classcheck`.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Mapping

from attntrace.grading.diagnose import UNKNOWN
from attntrace.kinds import MISTAKES
from attntrace.inputs.textescape import escape_md, escape_tex as tex_escape
from attntrace.inputs.usertext import format_user_text, inline_math_for
from attntrace.model.errors import BadInput
from attntrace.model.trace import Trace
from attntrace.rendering.plaindata import Formatted, plain_context, to_plain
from attntrace.rendering.printing import plain_number
from attntrace.rendering.sandbox import fresh_budget

LANGS = ("en", "zh")
FORMATS = ("text", "md", "tex")


class _Messages:
    """The phrases and diagnosis sentences of one language (templates/check/messages.<lang>.j2).
    A diagnosis macro gets `d`: the diagnosis numbers as plain data plus the helper macros of
    templates/check/helpers.j2 (d.math, d.code, d.num, d.shape), never a Python object."""

    def __init__(self, module: Any, format: str, helpers: Any, prose=None):
        self.module = module
        self.prose = prose  # prose name -> that prose template's module
        self.format = format
        self.helpers = {name: getattr(helpers, name) for name in ("math", "code", "num", "shape")}

    def diagnosis(self, code: str, params: Mapping[str, Any]) -> str:
        macro = getattr(self.module, code, None) or self.declared(code) or getattr(self.module, UNKNOWN, None)
        if macro is None:  # a user's messages template without the catch-all macro
            raise BadInput(f"template {getattr(self.module, '__name__', 'check/messages')}: no macro {code!r} "
                           f"and no {UNKNOWN!r} macro for the mistakes it does not name")
        d = plain_context({"d": {**to_plain(dict(params)), **self.helpers}})["d"]
        with fresh_budget():
            return str(macro(d))

    def declared(self, code: str):
        """The sentence of a mistake a kind declares: the macro named by its code in the
        kind's prose template (templates/prose/{lang}/{prose}.j2), or None."""
        found = MISTAKES.get(code)
        if found is None or self.prose is None:
            return None
        return next((m for m in (getattr(self.prose(p), code, None) for p in found[0].sentence_prose) if m is not None), None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)


def format_number(x: Any, precision: int = 4) -> str:
    return "" if x is None else plain_number(float(x), precision, count=False)


_Formatted = Formatted  # user text already formatted for its output: the escaping filters pass it through


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
    prose = functools.lru_cache(maxsize=None)(lambda name: env.get_template(f"prose/{lang}/{name}.j2").make_module({"format": format}))
    return _Messages(env.get_template(f"check/messages.{lang}.j2").make_module({"format": format}), format,
                     env.get_template("check/helpers.j2").make_module({"format": format}), prose)
