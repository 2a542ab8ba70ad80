"""Escaping user text for each output format: LaTeX, Markdown and plain text.

User text (titles, descriptions, tokens, course-author strings) reaches a report only through
these functions, which first clean it (`safetext.clean_text`: control and bidi characters
removed, lone surrogates replaced) and then escape what could start markup in the format.
"""

from __future__ import annotations

import re

from attntrace.inputs.safetext import clean_text

_TEX_ESCAPES = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#", "^": r"\textasciicircum{}",
                "_": r"\_", "%": r"\%", "~": r"\textasciitilde{}", "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
                # math signs people type in titles, which the text fonts (Latin Modern, Fandol) lack
                "≈": r"\ensuremath{\approx}", "√": r"\ensuremath{\surd}", "→": r"\ensuremath{\to}", "∞": r"\ensuremath{\infty}",
                "±": r"\ensuremath{\pm}", "≤": r"\ensuremath{\le}", "≥": r"\ensuremath{\ge}", "×": r"\ensuremath{\times}",
                "·": r"\ensuremath{\cdot}", "−": r"\ensuremath{-}", "²": r"\ensuremath{^2}", "³": r"\ensuremath{^3}"}
# Only what can start markup is escaped, so the Markdown source stays readable: emphasis,
# code, links, tables, math ($) and HTML. Parentheses stay as they are: "\\(" opens inline
# math in MathJax/KaTeX-flavoured Markdown.
_MD_SPECIAL = set("\\`*_[]$|~")
_MD_LINE_START = re.compile(r"^(\s*)([#>+-]|\d+[.)])")
_MD_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


# Every escaper first cleans the text (`safetext.clean_text`: control and bidi characters
# removed, lone surrogates replaced), so no user text reaches an output with them.

#: A straight double quote that opens a quotation (at the start, or after a space or an opening bracket):
#: TeX prints a bare " as a closing quote, so "the cat sat" came out as two closing quotes.
_OPENING_QUOTE = re.compile(r'(^|(?<=[\s(\[]))"')


def escape_tex(text: str) -> str:
    text = re.sub(r"\s+", " ", clean_text(text))
    return "".join(_TEX_ESCAPES.get(c, c) for c in text)


def escape_tex_prose(text: str) -> str:
    """escape_tex for running text (a title, a description): quotation marks open with `` and close
    with ''. Not for code (\texttt), where a quote is a character of the code."""
    return _OPENING_QUOTE.sub("``", escape_tex(text)).replace('"', "''")


def escape_md(text: str) -> str:
    text = re.sub(r"\s+", " ", clean_text(text))
    text = "".join(_MD_HTML[c] if c in _MD_HTML else ("\\" + c if c in _MD_SPECIAL else c) for c in text)
    # a leading "#", "-", "1." would make a heading or a list item
    return _MD_LINE_START.sub(lambda m: m.group(1) + m.group(2)[:-1] + "\\" + m.group(2)[-1], text)


def escape_text(text: str) -> str:
    return re.sub(r"\s+", " ", clean_text(text))
