"""How to break an equation so that it fits the page, and what width the page has.

Reports are judged by how they look on a page, so every display equation is laid out for a
target width: the whole chain on one line when it fits; else one side per line, aligned at
the = signs; a side that is still too wide (a long sum, a product of matrices, a row vector)
is broken after its + or comma, or between its factors, with an indented continuation line.
Widths come from `attntrace.rendering.texwidth`.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from attntrace.rendering.texwidth import REL as _REL
from attntrace.rendering.texwidth import width  # noqa: F401  (re-exported: the width of a fragment)

# ----------------------------------------------------------------------------- target widths

#: Points per em of the report's math font: 10pt (article), 10.5bp (ctexart's default, zihao=5). A zh report is
#: set at 10pt (zihao=false) but fitted for 10.5bp: check reports and worksheets keep ctexart's default size.
FONT_PT = {"en": 10.0, "zh": 10.54}
#: KaTeX sets math at 1.21 times a 16px body font.
KATEX_PX_PER_EM = 16 * 1.21
DEFAULT_WIDTH = {"tex": "345pt", "md": "760px", "text": "100ch"}
_UNITS = {"pt": 1.0, "bp": 72.27 / 72, "mm": 72.27 / 25.4, "cm": 72.27 / 2.54, "in": 72.27}
_WIDTH_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(pt|bp|mm|cm|in|px|em|ch)\s*$")


#: A MathJax display is as wide in ex of the surrounding text as it is in TeX em times this
#: (MathJax 4's font: 1 em = 2.2624 ex, measured with tex2svg of \\hspace{10em}). MathJax sets
#: its ex to the page font's ex, in SVG and in CHTML (matchFontHeight) output alike.
MATHJAX_EX_PER_EM = 2.2624


class Preset(NamedTuple):
    """A named target: its column, and how many px one em of TeX math takes there.

    `column` is a width with a unit; for Markdown sites `font` (px) and `x_height` (the body
    font's size and x-height ratio) say how big MathJax sets the math there."""

    column: str
    font: float = 0.0
    x_height: float = 0.0
    engine: str = ""  # "mathjax" for sites that typeset with MathJax; "" for LaTeX pages

    def px_per_em(self) -> float:
        return self.font * self.x_height * MATHJAX_EX_PER_EM


#: `--width NAME`: the usual targets. LaTeX: article's 345pt at 10pt; beamer's 128 mm frame with
#: 1 cm margins (108 mm) at 11pt. Markdown sites typeset with MathJax, which scales its math to the
#: ex of the text around it, so a column holds column / (font * x-height * 2.2624) em of TeX.
#: Columns measured 2026-12-02 in headless Chromium on pages built by the tools themselves
#: (scripts/measure_site_widths.py; MathJax's typeset \hspace{10em} agrees with font * x-height
#: to 0.3%). The x-height is the site's web font where it ships one; for a system font stack, the
#: largest of its fonts, which is Linux's DejaVu fallback as Chromium sets it (9px at 16px):
#: - mkdocs: MkDocs Material 9.8, 688px in 1280px to 1440px windows (735px at 1024px; 757px at
#:   1920px in a 17.6px font: the same 36 em), Roboto 16px (x-height 0.528);
#: - sphinx: Sphinx 9 with MyST, alabaster (Sphinx's default theme): 660px at every window width,
#:   Georgia 17px, here DejaVu Serif (ex 9px). Chosen because it holds the fewest em of the
#:   themes measured: Read the Docs 696.5px in its own Lato 16px (x-height 0.506; 38.0 em; 605px
#:   at a 1024px window) and furo 736px in system fonts 16px (36.1 em) take what fits it;
#: - jupyter: nbconvert 7.17's lab template, MathJax 2.7, a Markdown cell in a 1024px window:
#:   862px (the column is the window less 162px: 798px at 960, 1204px at 1366), system fonts 14px
#:   (ex 8px);
#: - github: not measured (github.com cannot be built here): from its CSS, the markdown-body of a
#:   file is 980px less 45px padding a side, 890px, in system fonts 16px (ex 9px as above).
PRESETS = {
    "article": Preset("345pt"),
    "beamer": Preset("307.28pt", font=11.0),
    "mkdocs": Preset("688px", 16.0, 0.528, "mathjax"),
    "sphinx": Preset("660px", 17.0, 9 / 17, "mathjax"),
    "jupyter": Preset("862px", 14.0, 8 / 14, "mathjax"),
    "github": Preset("890px", 16.0, 9 / 16, "mathjax"),
}


class Width(NamedTuple):
    """The target width of one report: `em` for the fitter, `pt` for a standalone page."""

    em: float
    pt: float | None = None
    chars: int | None = None


def parse_width(text: str | None, fmt: str, lang: str) -> Width:
    """'345pt', '12cm', '760px', '40em', '100ch' -> Width; None gives the format's default.

    pt/cm/mm/in/bp are page lengths (LaTeX), px is a browser column (Markdown, KaTeX at 1.21
    times a 16px font), em is the math font's em, ch is characters (plain text).
    """
    from attntrace.model.errors import BadInput

    text = DEFAULT_WIDTH[fmt] if text is None else text
    preset = PRESETS.get(str(text).strip().lower())
    if preset is not None:
        return preset_width(preset, lang)
    m = _WIDTH_RE.match(str(text))
    if not m:
        raise BadInput(f"width must be a number with a unit (345pt, 12cm, 760px, 40em, 100ch) or one of "
                       f"{', '.join(PRESETS)}, not {text!r}")
    x, unit = float(m.group(1)), m.group(2)
    font = FONT_PT[lang]
    if unit == "ch":
        chars = int(x)
        if not 30 <= chars <= 1000:
            raise BadInput(f"width {text!r} is out of range (30ch to 1000ch)")
        return Width(em=chars * 0.5, pt=None, chars=chars)
    if unit == "px":
        em = x / KATEX_PX_PER_EM
        pt = em * font
    elif unit == "em":
        em, pt = x, x * font
    else:
        pt = x * _UNITS[unit]
        em = pt / font
    if not 8 <= em <= 400:
        raise BadInput(f"width {text!r} is out of range (about 80pt to 4000pt)")
    return Width(em=em, pt=pt, chars=int(em * 2))


def preset_width(preset: Preset, lang: str) -> Width:
    """A named target's Width: its column in em of the math it shows there."""
    x = float(preset.column[:-2])
    if preset.engine == "mathjax":
        em = x / preset.px_per_em()
        return Width(em=em, pt=em * FONT_PT[lang], chars=int(em * 2))
    pt = x * _UNITS[preset.column[-2:]]
    font = preset.font or FONT_PT[lang]  # beamer sets its math at 11pt
    em = pt / max(font, FONT_PT[lang])
    return Width(em=em, pt=pt, chars=int(em * 2))


# ----------------------------------------------------------------------------- fitting a chain

class Seq:
    """A side of an equation that may break: terms of a sum, factors of a product, a row vector.

    `items` are LaTeX strings; `joiner` goes between them on one line; when broken, each line
    but the last ends with `tail` (a + or a comma) and the next starts indented. `open_one`
    and `close_one` are the delimiters when the whole Seq is on one line (a \\left( grows with
    fractions, but it cannot span lines). A plain class, not a tuple: a side that is a tuple
    means (relation, side) to `fit_chain`.
    """

    __slots__ = ("items", "joiner", "tail", "open", "close", "open_one", "close_one")

    def __init__(self, items, joiner: str, tail: str = "", open: str = "", close: str = "",  # noqa: A002
                 open_one: str | None = None, close_one: str | None = None):
        self.items, self.joiner, self.tail, self.open, self.close = tuple(items), joiner, tail, open, close
        self.open_one, self.close_one = open_one, close_one

    def tex(self) -> str:
        o = self.open if self.open_one is None else self.open_one
        c = self.close if self.close_one is None else self.close_one
        return o + self.joiner.join(self.items) + c


#: The gap between two equations set side by side on one line.
SIDE_BY_SIDE = " \\qquad "


def row_seq(items: list[str], factor: tuple[str, str] = ("", "")) -> Seq:
    """A row vector (a, b, c) that breaks after its commas; `factor` (on one line, broken) is a
    coefficient before it: \\frac{1}{\\sqrt{6}} grown parentheses on one line, a \\tfrac and
    fixed ones across lines."""
    one, broken = factor
    return Seq(tuple(items), joiner=",\\ ", tail=",", open=broken + ("\\,(" if broken else "("), close=")",
               open_one=one + "\\left(", close_one="\\right)")


def join_sum(terms: list[str]) -> Seq:
    """A sum whose terms keep their own signs: 'a', '-b' -> a - b; it breaks after a + or -."""
    items = [terms[0]] + [("- " + t[1:] if t.startswith("-") and not t.startswith("-\\infty") else "+ " + t) for t in terms[1:]]
    return Seq(tuple(items), joiner=" ")


def _side_tex(side) -> str:
    return side.tex() if isinstance(side, Seq) else side


def side_width(side) -> float:
    """The width of a side, from the (cached) widths of its parts: a matrix is measured once,
    however many chains it is tried in."""
    if not isinstance(side, Seq):
        return width(side)
    o = side.open if side.open_one is None else side.open_one
    c = side.close if side.close_one is None else side.close_one
    total = (width(o) if o else 0.0) + (width(c) if c else 0.0)
    for k, item in enumerate(side.items):
        total += width(item) + (2 * 0.222 if k and side.joiner == " " and item[:2] in ("+ ", "- ") else 0.0)
    return total + width(side.joiner) * max(0, len(side.items) - 1)


def fit_chain(lhs: str, sides: list, limit: float, *, align: bool = False, lhs_width: float = 0.0) -> list[str]:
    """Lay out lhs = side1 = side2 = ... within `limit` em; returns the lines.

    A side is a LaTeX string, a Seq, or (relation, side) for another relation than =.
    One line when everything fits (with `align`, an & before its first relation, so that it
    can join an aligned block). Otherwise the lines of an aligned block ('&' before each
    relation): sides are packed greedily onto lines, and a side too wide for a line of its
    own is broken (a Seq: after its + or comma, or between factors) onto continuation lines
    indented by 2em. `lhs_width` is the width of the widest left side of the aligned block
    this chain joins: every line of the block starts after it.
    """
    pairs = [(s if isinstance(s, tuple) else ("=", s)) for s in sides if s]
    pairs = [(rel, side) for rel, side in pairs if side]
    if not pairs:
        return [lhs]
    widths = [side_width(side) for _, side in pairs]
    lhs_w = max(width(lhs), lhs_width) + _REL
    if lhs_w + sum(widths) + _REL * (len(pairs) - 1) <= limit:
        one = lhs + "".join(f" {rel} {_side_tex(side)}" for rel, side in pairs)
        if not align:
            return [one]
        rel, side = pairs[0]
        return [f"{lhs} &{rel} " + _side_tex(side) + "".join(f" {r} {_side_tex(x)}" for r, x in pairs[1:])]
    lines: list[str] = []
    cur, cur_w = f"{lhs} ", lhs_w - _REL + 0.3
    first = True
    for (rel, side), w in zip(pairs, widths):
        tex = _side_tex(side)
        if not first and cur_w + _REL + w <= limit:
            cur += f" {rel} {tex}"
            cur_w += _REL + w
            continue
        if not first:
            lines.append(cur)
            cur = ""
        cur += f"&{rel} "
        cur_w = lhs_w
        first = False
        if cur_w + w <= limit or not isinstance(side, Seq):
            cur += tex
            cur_w += w
            continue
        pieces = _break_seq(side, limit - lhs_w, limit - lhs_w - 2.0)
        cur += pieces[0]
        for p in pieces[1:]:
            lines.append(cur)
            cur = "&\\qquad " + p
        cur_w = lhs_w + 2.0 + width(pieces[-1])
    lines.append(cur)
    return lines


def _break_seq(seq: Seq, first_limit: float, limit: float) -> list[str]:
    """Greedy line breaking of a Seq's items.

    A sum breaks after its operator (the line ends with '+ {}' so that TeX keeps the binary
    spacing), a row vector after its comma, a product of matrices between the factors.
    """
    lines: list[str] = []
    cur, cur_w, lim = seq.open, width(seq.open) if seq.open else 0.0, first_limit
    empty = True
    close_w = width(seq.close) if seq.close else 0.0
    for k, item in enumerate(seq.items):
        piece = ("" if empty else seq.joiner) + item
        # a leading + or - is binary here (it follows a term): measured alone it would be a sign
        is_op = seq.joiner == " " and item[:2] in ("+ ", "- ")  # a sum's operator; in a vector, a sign
        binary = 2 * 0.222 if is_op and not empty else 0.0
        w = width(piece) + binary + (close_w if k == len(seq.items) - 1 else width(seq.tail) + 0.8)
        if not empty and cur_w + w > lim:
            op, rest = "", item
            if is_op:
                op, rest = " " + item[0] + " {}", item[2:]
            lines.append(cur + seq.tail + op)
            cur, cur_w, lim = rest, width(rest), limit
        else:
            cur += piece
            cur_w += width(piece) + binary
        empty = False
    lines.append(cur + seq.close)
    return lines
