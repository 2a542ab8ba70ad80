"""The worksheet's prose markup: `$...$` is math, `...` in backticks is code, the rest is text.

`prose_markup` turns a sentence of templates/exercise/prose into Markdown, LaTeX or HTML
(the worksheet and the quizzes of `attntrace.teach.lms`).
"""

from __future__ import annotations

import html
import re

from attntrace.inputs.safetext import clean_text
from attntrace.inputs.textescape import escape_md, escape_tex

_PROSE_PARTS = re.compile(r"(\$[^$]+\$|`[^`]+`)")


def prose_markup(text: str, format: str, brackets: bool = False) -> str:
    """Worksheet prose (templates/exercise/prose) for `format` (md, tex or html): `$...$` is
    math, passed through as math; `...` in backticks is code; the rest is text, escaped for
    the format."""
    out = []
    # cleaned where it enters: a template folder's sentence may hold controls or U+FFFF
    for i, part in enumerate(_PROSE_PARTS.split(clean_text(text))):
        if not part:
            continue
        if i % 2 == 0:
            out.append({"tex": escape_tex, "html": html.escape}.get(format, escape_md)(part))
        elif part.startswith("$"):
            tex = part[1:-1]
            if format == "html":
                out.append(f"\\({html.escape(tex)}\\)")
            else:
                out.append(part if format == "tex" else (f"\\({tex}\\)" if brackets else f"${tex}$"))
        else:
            code = part[1:-1]
            out.append({"tex": f"\\texttt{{{escape_tex(code)}}}", "html": f"<code>{html.escape(code)}</code>"}
                       .get(format, f"`{code}`"))
    return "".join(out)
