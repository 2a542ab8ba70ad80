"""TeX math -> MathML Core, and a Markdown report -> HTML whose math is MathML.

Why convert TeX rather than print MathML from the formula trees: the reports' TeX is what
every other format is tested against (KaTeX, xelatex), and the trees that would print MathML
directly (the design issue) do not exist yet. `latex2mathml` (pure Python, kept on PyPI)
converts every span the reports emit -- ``\\begin{aligned}``, ``array`` with ``\\left[``,
``\\underset``, ``\\underbrace``, ``\\operatorname``, ``\\text{中文}``, ``\\sqrt``,
``\\tilde`` -- without an error or an ``<merror>`` (tests/test_html.py checks all examples,
en and zh, in Chromium). SymPy's MathML printer only prints SymPy expressions, not the TeX
the templates lay out (prose, aligned lines, matrices with shapes), so it cannot serve here.
When the formula trees land, `tex_to_mathml` is the one place to swap.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache

_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")


@lru_cache(maxsize=4096)
def tex_to_mathml(tex: str, display: bool) -> str:
    """One ``<math>`` element (MathML Core) for a TeX span; ``display="block"`` for displays.

    A span latex2mathml cannot read shows as its TeX in ``<code>`` (tests fail on that), so a
    page is still produced and the reader sees what went wrong."""
    from latex2mathml.converter import convert

    try:
        out = convert(_for_latex2mathml(tex.strip()), display="block" if display else "inline")
    except Exception:  # noqa: BLE001 - the library raises many kinds on bad input
        return f'<code class="tex-error">{html.escape(tex)}</code>'
    # latex2mathml writes MathML 3 attributes MathML Core ignores; they do no harm.
    return out


_TEXTTT = re.compile(r"\\texttt\{([^{}]*)\}")


def _for_latex2mathml(tex: str) -> str:
    """The two spellings latex2mathml reads differently from KaTeX: ``aligned`` (it knows
    ``align*``, the same layout: a right/left column pair per ``&``) and ``\\_`` inside
    ``\\texttt`` (it would keep the backslash)."""
    tex = tex.replace("\\begin{aligned}", "\\begin{align*}").replace("\\end{aligned}", "\\end{align*}")
    return _TEXTTT.sub(lambda m: "\\texttt{" + m.group(1).replace("\\_", "_") + "}", tex)


def _parser():
    """markdown-it (CommonMark, tables, raw HTML off: user text stays text) whose math spans
    render as MathML."""
    from markdown_it import MarkdownIt
    from mdit_py_plugins.dollarmath import dollarmath_plugin
    from mdit_py_plugins.texmath import texmath_plugin

    md = MarkdownIt("commonmark", {"html": False})
    md.enable("table")
    md.use(dollarmath_plugin, double_inline=True)
    md.use(texmath_plugin, delimiters="brackets")

    def rule(display: bool):
        def render(self, tokens, idx, options, env):
            m = tex_to_mathml(tokens[idx].content, display)
            return f'<div class="display">{m}</div>\n' if display else m
        return render

    for name, display in (("math_inline", False), ("math_inline_double", True), ("math_block", True),
                          ("math_block_label", True), ("math_single", False), ("math_block_eqno", True)):
        md.add_render_rule(name, rule(display))
    return md


_MD = None


def markdown_to_html(text: str) -> str:
    """Markdown with ``$..$``/``$$..$$`` (or ``\\(..\\)``/``\\[..\\]``) math -> HTML + MathML."""
    global _MD
    if _MD is None:
        _MD = _parser()
    return _MD.render(text)


def markdown_sections(text: str) -> list[dict]:
    """The report cut at its headings: ``[{"level", "title" (HTML), "body" (HTML), "id"}]``;
    the text before the first heading is a section of level 0. Headings inside a display
    (``$$`` blocks) are not cut at (none start a line with ``#`` there)."""
    sections: list[dict] = []
    current = {"level": 0, "title": "", "lines": []}
    in_display = False
    for line in text.splitlines():
        if line.strip() in ("$$", "\\[", "\\]"):
            in_display = not in_display if line.strip() == "$$" else line.strip() == "\\["
        m = None if in_display else _HEADING.match(line)
        if m:
            sections.append(current)
            current = {"level": len(m.group(1)), "title": m.group(2), "lines": []}
        else:
            current["lines"].append(line)
    sections.append(current)
    out = []
    for k, s in enumerate(sections):
        body = "\n".join(s["lines"]).strip()
        if s["level"] == 0 and not body:
            continue
        title = markdown_to_html(s["title"]).strip() if s["title"] else ""
        title = re.sub(r"^<p>(.*)</p>$", r"\1", title, flags=re.S)
        out.append({"level": s["level"], "title": title, "body": markdown_to_html(body) if body else "",
                    "id": f"s{k}"})
    return out
