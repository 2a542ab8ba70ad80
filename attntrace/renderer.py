"""Trace -> Markdown, LaTeX or plain-text derivation, through Jinja2 templates.

Pipeline (latexify_py style): validate settings -> build the view model
(`attntrace.viewmodel`, math fragments from `attntrace.printing`) -> render templates
(prose and layout only, `templates/`). Settings are declared once in `DEFAULTS` and unknown
ones are refused (SymPy printer style). Templates: `<format>/report.j2` for a whole report,
`steps/<kind>.j2` for one step (shared by the formats), `<format>/fmt.j2` for the format's
primitives (headings, display math, matrices) and `prose/<lang>.j2` for all the words.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jinja2

from .errors import BadInput
from .resources import templates_dir
from .trace import Step, Trace
from .viewmodel import report_view, step_view

FORMATS = ("md", "tex", "text")
LANGS = ("en", "zh")
DELIMITERS = ("dollars", "brackets")

#: Every render option and its default; unknown names are refused.
DEFAULTS: dict[str, Any] = {
    "format": "md", "lang": "en", "precision": 4, "standalone": False, "template_dir": None,
    "math_delimiters": "dollars", "max_size": 8, "figures": None, "output_path": None,
}


def validate(options: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise BadInput(f"unknown render option {unknown[0]!r}; known: {', '.join(DEFAULTS)}")
    s = {**DEFAULTS, **{k: v for k, v in options.items()}}
    for key, allowed in (("format", FORMATS), ("lang", LANGS), ("math_delimiters", DELIMITERS)):
        if s[key] not in allowed:
            raise BadInput(f"{key} must be one of {', '.join(allowed)}, not {s[key]!r}")
    for key, low, high in (("precision", 0, 15), ("max_size", 2, 1000)):
        v = s[key]
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise BadInput(f"{key} must be an integer from {low} to {high}, not {v!r}")
    if not isinstance(s["standalone"], bool):
        raise BadInput(f"standalone must be true or false, not {s['standalone']!r}")
    for key in ("template_dir", "figures", "output_path"):
        if s[key] is not None and not isinstance(s[key], (str, os.PathLike)):
            raise BadInput(f"{key} must be a path, not {type(s[key]).__name__}")
    if s["template_dir"] is not None and not Path(s["template_dir"]).is_dir():
        raise BadInput(f"template_dir {s['template_dir']} is not a folder")
    return s


def environment(template_dir: str | os.PathLike | None = None) -> jinja2.Environment:
    """The Jinja2 environment of reports: the user's folder first, then the shipped templates."""
    loaders: list[jinja2.BaseLoader] = []
    if template_dir is not None:
        loaders.append(jinja2.FileSystemLoader(str(template_dir)))
    loaders.append(jinja2.FileSystemLoader(str(templates_dir())))
    return jinja2.Environment(loader=jinja2.ChoiceLoader(loaders), undefined=jinja2.StrictUndefined, autoescape=False,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def _context(env: jinja2.Environment, fmt: str, lang: str, delimiters: str) -> dict[str, Any]:
    """The format primitives (f) and the prose macros (p) every template sees."""
    base = {"fmt": fmt, "lang": lang, "delimiters": delimiters}
    f = env.get_template(f"{fmt}/fmt.j2").make_module(base)
    p = env.get_template(f"prose/{lang}.j2").make_module(base)
    return {**base, "f": f, "p": p}


def tidy(text: str) -> str:
    """At most one blank line in a row; one newline at the end."""
    lines, blank = [], 0
    for line in text.splitlines():
        line = line.rstrip()
        blank = blank + 1 if not line else 0
        if blank <= 1:
            lines.append(line)
    return "\n".join(lines).strip("\n") + "\n"


def render_step(trace: Trace, step: Step | str, *, format: str, lang: str = "en", precision: int = 4, max_size: int = 8,
                math_delimiters: str = "dollars", template_dir: str | os.PathLike | None = None) -> str:
    """One step's block (explanation, formula, matrices, entry-wise lines) in a format."""
    s = validate({"format": format, "lang": lang, "precision": precision, "max_size": max_size,
                  "math_delimiters": math_delimiters, "template_dir": template_dir})
    if isinstance(step, str):
        sid, _, head = step.partition("@")
        step = trace.step(sid, int(head) if head else None)
    env = environment(s["template_dir"])
    ctx = _context(env, s["format"], s["lang"], s["math_delimiters"])
    vm = step_view(trace, step, s["format"], s["precision"], s["max_size"])
    return tidy(env.get_template(f"steps/{step.id}.j2").render(**ctx, vm=vm))


def _figures(trace: Trace, directory, output_path, fmt: str) -> list[dict]:
    try:
        from .figures import write_heatmaps
    except ImportError:
        raise BadInput("figures need attntrace[figures] (matplotlib)") from None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    base = Path(output_path).resolve().parent if output_path is not None else Path.cwd()
    out = []
    # LaTeX cannot \\includegraphics an SVG: give it a PDF; Markdown viewers show SVG.
    formats = ("pdf",) if fmt == "tex" else ("svg",)
    for fig in write_heatmaps(trace, directory, formats=formats):
        rel = os.path.relpath(Path(fig["path"]).resolve(), base).replace(os.sep, "/")
        out.append({"path": rel, "head": fig.get("head") or 0})
    return out


def render(trace: Trace, format: str = "md", **options: Any) -> str:
    """Render a trace as a derivation: format md | tex | text, lang en | zh (see DEFAULTS)."""
    s = validate({**options, "format": format})
    if not isinstance(trace, Trace):
        raise BadInput(f"render needs a Trace (from attntrace.run), not {type(trace).__name__}")
    figures = _figures(trace, s["figures"], s["output_path"], s["format"]) if s["figures"] is not None else []
    env = environment(s["template_dir"])
    ctx = _context(env, s["format"], s["lang"], s["math_delimiters"])
    vm = report_view(trace, s["format"], s["precision"], s["max_size"], figures, lang=s["lang"])
    text = env.get_template(f"{s['format']}/report.j2").render(**ctx, r=vm, standalone=s["standalone"])
    return tidy(text)
