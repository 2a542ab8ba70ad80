"""Trace -> Markdown, LaTeX or plain-text derivation, through Jinja2 templates.

Pipeline (latexify_py style): validate settings -> build the view model
(`attntrace.rendering.viewmodel`, math fragments from `attntrace.rendering.printing`) -> render templates
(prose and layout only, `templates/`). Settings are declared once in `DEFAULTS` and unknown
ones are refused (SymPy printer style). Templates are found by fallback, so a format or a kind
with no layout of its own needs no file: `<format>/report.j2`, else `report/body.j2` for a whole
report (only LaTeX wraps the body, in a document or a fragment); `steps/<kind>.j2`, else
`steps/view/<view>.j2`, else `steps/default.j2` for one step (shared by the formats);
`<format>/fmt.j2` for the format's primitives (headings, display math, matrices) and
`prose/<lang>.j2` for all the words.
"""

from __future__ import annotations

import numbers
import os
from pathlib import Path
from typing import Any

import jinja2
import numpy as np

from attntrace.model.errors import BadInput
from attntrace.inputs.safetext import clean_output
from attntrace.rendering.layout import parse_width
from attntrace.rendering.jinja_env import cached_environment, user_template_errors
from attntrace.rendering.formulatext import headed
from attntrace.rendering.textcolumns import text_table
from attntrace.resources import templates_dir
from attntrace.model.trace import Step, Trace
from attntrace.rendering.viewmodel import report_view, step_view
from attntrace.kinds import kind_of

FORMATS = ("md", "tex", "text")
LANGS = ("en", "zh")
DELIMITERS = ("dollars", "brackets")

#: Every render option and its default; unknown names are refused.
DEFAULTS: dict[str, Any] = {
    "format": "md", "lang": "en", "precision": 4, "standalone": False, "template_dir": None,
    "math_delimiters": "dollars", "max_size": 8, "figures": None, "output_path": None,
    "width": None, "rows": None,
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
        raise BadInput(f"template_dir {os.fspath(s['template_dir'])!r} is not a folder")
    s["page"] = parse_width(s["width"], s["format"], s["lang"])
    s["rows"] = parse_rows(s["rows"])
    return s


def parse_rows(rows: Any) -> list[int] | str | None:
    """The rows to expand entry by entry: None (the default), 'all', '1,3' or [1, 3] (1-based)."""
    if hasattr(rows, "tolist") and not isinstance(rows, str):  # a NumPy array (or scalar) of row numbers
        rows = rows.tolist()
        rows = rows if isinstance(rows, list) else [rows]
    if rows is None or (isinstance(rows, str) and rows == "all"):
        return rows
    if isinstance(rows, str):
        parts = [p.strip() for p in rows.split(",")]
        if not all(p.isdigit() for p in parts):
            raise BadInput(f"rows must be 'all' or row numbers like 1,3, not {rows!r}")
        rows = [int(p) for p in parts]
    if isinstance(rows, (list, tuple)):  # NumPy integers count as integers
        rows = [int(r) if isinstance(r, numbers.Integral) and not isinstance(r, (bool, np.bool_)) else r for r in rows]
    if not isinstance(rows, (list, tuple)) or not rows or len(rows) > 1000 or not all(
            isinstance(r, int) and not isinstance(r, bool) and 1 <= r <= 100_000 for r in rows):
        shown = repr(rows)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise BadInput(f"rows must be 'all' or a list of row numbers from 1, not {shown}")
    return sorted(set(rows))


def environment(template_dir: str | os.PathLike | None = None) -> jinja2.Environment:
    """The Jinja2 environment of reports: the user's folder first, then the shipped templates.

    Built once per folder and reused (an edited or newly added user template is picked up by
    the next render); compiled templates are kept in the user's cache folder across processes.
    See `attntrace.rendering.jinja_env`.
    """
    folders = [template_dir] if template_dir is not None else []
    env = cached_environment([*folders, templates_dir()], undefined=jinja2.StrictUndefined)
    env.filters["text_table"] = text_table  # text notation table: columns by display width (CJK counts 2)
    env.filters["head"] = headed  # "Q" | head(vm.head): a name with its head superscript, printed from its tree
    return env


def _context(env: jinja2.Environment, fmt: str, lang: str, delimiters: str) -> dict[str, Any]:
    """The format primitives (f) and the prose macros (p) every template sees."""
    base = {"fmt": fmt, "lang": lang, "delimiters": delimiters}
    f = env.get_template(f"{fmt}/fmt.j2").make_module(base)
    p = env.get_template(f"prose/{lang}.j2").make_module(base)
    return {**base, "f": f, "p": p}


_DISPLAY_START = ("\\[", "\\begin{align*}")


def tidy(text: str, fmt: str = "md") -> str:
    """At most one blank line in a row; one newline at the end. In LaTeX a display never
    starts a paragraph: it stays with the lead-in line above it, so no page break falls
    between them (and no empty paragraph opens above the display). The text is cleaned
    first (`safetext.clean_output`): whatever a template folder writes, no control or format
    character leaves (str.splitlines would also break lines at CR, VT, FF, NEL, U+2028...)."""
    lines, blank = [], 0
    for line in clean_output(text).split("\n"):
        line = line.rstrip()
        if fmt == "tex" and line.startswith(_DISPLAY_START) and lines and not lines[-1] and len(lines) > 1 \
                and not lines[-2].startswith(("\\section", "\\subsection", "\\subsubsection", "\\paragraph", "\\end{itemize}", "\\begin{document}")):
            lines.pop()
        blank = blank + 1 if not line else 0
        if blank <= 1:
            lines.append(line)
    return "\n".join(lines).strip("\n") + "\n"


def fit_limit(s: dict[str, Any]) -> float:
    """The width a display line may take, in em, with a small margin for the estimate."""
    return s["page"].em * 0.97


def render_step(trace: Trace, step: Step | str, *, format: str, lang: str = "en", precision: int = 4, max_size: int = 8,
                math_delimiters: str = "dollars", template_dir: str | os.PathLike | None = None, width: str | None = None,
                rows: Any = None) -> str:
    """One step's block (explanation, formula, matrices, entry-wise lines) in a format."""
    s = validate({"format": format, "lang": lang, "precision": precision, "max_size": max_size,
                  "math_delimiters": math_delimiters, "template_dir": template_dir, "width": width, "rows": rows})
    if isinstance(step, str):
        sid, _, head = step.partition("@")
        step = trace.step(sid, int(head) if head else None)
    env = environment(s["template_dir"])
    vm = step_view(trace, step, s["format"], s["precision"], s["max_size"], fit_limit(s), s["rows"])
    with user_template_errors(env, s["template_dir"]):
        ctx = _context(env, s["format"], s["lang"], s["math_delimiters"])
        text = env.select_template(list(kind_of(step.id).templates)).render(**ctx, vm=vm)
    return tidy(text, s["format"])


def _figures(trace: Trace, directory, output_path, fmt: str) -> list[dict]:
    try:
        from attntrace.rendering.figures import weight_matrices, write_heatmaps
    except ImportError:
        raise BadInput("figures need attntrace[figures] (matplotlib)") from None
    weight_matrices(trace)  # nothing to plot: refused before the folder is made
    directory = Path(directory)
    base = Path(output_path).resolve().parent if output_path is not None else Path.cwd()
    figure_link(_relative(directory, base), fmt, shown=os.fspath(directory))  # refused before the folder is made
    check_figures_folder(directory)
    out = []
    # LaTeX cannot \\includegraphics an SVG: give it a PDF; Markdown viewers show SVG.
    formats = ("pdf",) if fmt == "tex" else ("svg",)
    for fig in write_heatmaps(trace, directory, formats=formats):
        link = figure_link(_relative(Path(fig["path"]), base), fmt, shown=os.fspath(directory))
        out.append({"path": link, "head": fig.get("head") or 0})
    return out


def _relative(path: Path, base: Path) -> str:
    return os.path.relpath(path.resolve(), base).replace(os.sep, "/")


#: The characters a figure path may hold in LaTeX (any letter or digit, and these): a path is
#: an argument of \\includegraphics, where { } \\ % # ~ $ & ^ would be markup.
TEX_PATH_PUNCTUATION = frozenset("._-/+ ")


def figure_link(rel: str, fmt: str, shown: str) -> str:
    """A figure's path (relative to the report) as the report writes it. Markdown: percent-
    encoded (RFC 3986; only letters, digits and ``_.-~/`` stay), so no character of the path
    can end the link or open HTML (``g)<script>`` becomes ``g%29%3Cscript%3E``), and viewers
    decode it back to the file's name. LaTeX has no such encoding for \\includegraphics
    (``\\detokenize`` fails on an unbalanced brace), so a path with any character other than
    letters, digits and ``._-/+`` and space is refused in one line. Text: the path as is,
    control characters removed."""
    if fmt == "md":
        from urllib.parse import quote

        return quote(rel, safe="/")
    if fmt == "tex":
        bad = sorted({c for c in rel if not (c.isalnum() or c in TEX_PATH_PUNCTUATION)})
        if bad:
            raise BadInput(f"--figures {shown!r}: a figure path in LaTeX may hold only letters, digits, spaces and "
                           f". _ - / +, not {''.join(bad)!r}")
        return rel
    from attntrace.inputs.safetext import clean_text

    return clean_text(rel)


def check_figures_folder(directory: str | os.PathLike) -> None:
    """`directory` is (or can be made) a folder heatmaps can be written into; else one line.
    Called before any work, so that a bad --figures fails fast."""
    directory = Path(directory)
    shown = repr(os.fspath(directory))  # one line, whatever the name holds
    if directory.exists() and not directory.is_dir():
        raise BadInput(f"--figures {shown} is a file, not a folder")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"cannot create the figures folder {shown}: {exc.strerror or type(exc).__name__}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise BadInput(f"cannot write into the figures folder {shown}: permission denied")


def report_templates(fmt: str) -> tuple[str, ...]:
    """The templates of a whole report in `fmt`, the first found wins: the format's own
    (a user's folder may add one for any format), else the body every format shares."""
    return (f"{fmt}/report.j2", "report/body.j2")


def render(trace: Trace, format: str = "md", **options: Any) -> str:
    """Render a trace as a derivation: format md | tex | text, lang en | zh (see DEFAULTS).
    The HTML page wraps this report: `attntrace.rendering.formats.render`."""
    if format == "html" and isinstance(trace, Trace):
        raise BadInput("an HTML page is made by attntrace.render (attntrace.rendering.formats.render), which wraps this report")
    if format not in FORMATS and isinstance(format, str):
        raise BadInput(f"format must be one of {', '.join(FORMATS)}, html, not {format!r}")
    s = validate({**options, "format": format})
    if not isinstance(trace, Trace):
        raise BadInput(f"render needs a Trace (from attntrace.run), not {type(trace).__name__}")
    figures = _figures(trace, s["figures"], s["output_path"], s["format"]) if s["figures"] is not None else []
    env = environment(s["template_dir"])
    vm = report_view(trace, s["format"], s["precision"], s["max_size"], figures, lang=s["lang"], limit=fit_limit(s), rows=s["rows"],
                     math_delimiters=s["math_delimiters"])
    page = s["page"]
    with user_template_errors(env, s["template_dir"]):
        ctx = _context(env, s["format"], s["lang"], s["math_delimiters"])
        text = env.select_template(report_templates(s["format"])).render(**ctx, r=vm, standalone=s["standalone"],
                                                                   textwidth=f"{page.pt:.1f}pt" if page.pt else "")
    return tidy(text, s["format"])
