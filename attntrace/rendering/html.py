"""Trace -> one self-contained HTML page (or a <div> fragment) with MathML and explorable entries.

The words and the math are the Markdown report's (`renderer.render(format="md")`): one
derivation, tested against KaTeX and xelatex, is the source of every format. Its math spans
become MathML Core (`mathml.tex_to_mathml`), its sections collapsible ``<details>``. Then
come the explorers and heatmaps (`explore`), all as plain data for `templates/html/*.j2`.

Self-contained: CSS and script are inline, heatmaps inline SVG; a Content-Security-Policy
``default-src 'none'`` keeps the page from loading anything. Everything reads without
JavaScript; the script only adds the explorers' click-to-see and hover highlights.
"""

from __future__ import annotations

import os
from typing import Any

from attntrace.model.errors import BadInput
from attntrace.model.trace import Trace
from attntrace.rendering.explore import data_json, explorers, heatmaps
from attntrace.rendering.jinja_env import user_template_errors
from attntrace.rendering.mathml import markdown_sections, markdown_to_html
from attntrace.rendering import renderer


def _template(template_dir, name: str, **context: Any) -> str:
    env = renderer.environment(template_dir)
    with user_template_errors(env, template_dir):
        return env.get_template(name).render(**context)


def page_context(trace: Trace, lang: str, precision: int) -> dict:
    """The plain data every HTML template of a trace sees (no live objects)."""
    title = trace.localized("title", lang) or ""
    ex = explorers(trace, precision)
    for e in ex:
        e["json"] = data_json({k: v for k, v in e.items() if k != "json"})
    return {"lang": lang, "title_text": _plain_title(title), "explorers": ex,
            "heatmaps": heatmaps(trace, precision)}


def _plain_title(title: str) -> str:
    """The title for <title>: its $..$ math as plain letters (no markup in a tab's name)."""
    return title.replace("$", "").replace("\\", "").replace("{", "").replace("}", "")


def render_html(trace: Trace, *, fragment: bool = False, **options: Any) -> str:
    """The derivation as HTML: a whole page, or with ``fragment=True`` a ``<div>`` to paste."""
    if not isinstance(fragment, bool):
        raise BadInput(f"fragment must be true or false, not {fragment!r}")
    options = {k: v for k, v in options.items() if k != "standalone"}
    if options.get("math_delimiters", "dollars") != "dollars":
        options["math_delimiters"] = "dollars"  # only the Markdown in between; HTML has no delimiters
    if options.get("figures") is not None:
        raise BadInput("--figures is for md and tex; HTML draws its heatmaps inline")
    md = renderer.render(trace, format="md", **options)
    lang = options.get("lang", "en")
    ctx = page_context(trace, lang, options.get("precision", 4))
    return html_document(md, ctx, fragment, options.get("template_dir"))


def html_document(md: str, ctx: dict, fragment: bool, template_dir: str | os.PathLike | None = None) -> str:
    """A Markdown derivation with the page data -> the page or the fragment."""
    sections = markdown_sections(md)
    ctx = {**ctx, "sections": sections, "fragment": fragment}
    return _template(template_dir, "html/page.j2", **ctx)


def markdown_page(md: str, lang: str, title: str, fragment: bool = False, extra: str = "",
                  template_dir: str | os.PathLike | None = None) -> str:
    """Any Markdown report (the checker's) as an HTML page; ``extra``: HTML put before it."""
    ctx = {"lang": lang, "title_text": _plain_title(title), "explorers": [], "heatmaps": [], "extra": extra}
    return html_document(md, ctx, fragment, template_dir)


__all__ = ["render_html", "markdown_page", "markdown_to_html", "page_context"]
