"""One entry for every output format of a trace's derivation.

md, tex and text come from the report templates (`renderer.render`); html wraps the Markdown
report in a page (`html.render_html`). Dispatching here, above both, keeps the page module
and the report module from importing each other.
"""

from __future__ import annotations

from typing import Any

from attntrace.model.trace import Trace
from attntrace.rendering import renderer


def render(trace: Trace, format: str = "md", **options: Any) -> str:
    """Render a trace as a derivation: format md | tex | text | html, lang en | zh
    (`renderer.DEFAULTS`; html also takes fragment=True for a <div> to paste into a page)."""
    if format == "html" and isinstance(trace, Trace):
        from attntrace.rendering.html import render_html  # the page's modules load only for a page

        return render_html(trace, **options)
    return renderer.render(trace, format=format, **options)
