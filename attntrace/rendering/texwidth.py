"""How wide a LaTeX math fragment is, in em of a 10pt math font, estimated from its source.

The estimate covers the LaTeX subset that attntrace writes (printing.py and SymPy's LaTeX
printer) with the Computer Modern metrics that LaTeX (amsmath, cmr/cmmi) and KaTeX share,
and errs on the wide side. tests/test_layout.py compares it line by line with widths that
xelatex measures (never more than 4% short, median 0-10% wide) and tests/test_page_fit.py
judges whole documents (xelatex overfull boxes, KaTeX in Chromium). Measuring with a real
typesetter at render time would be exact but costs a TeX or browser run per report; the
estimate costs microseconds, and a cached width per fragment.
"""

from __future__ import annotations

import re
from functools import lru_cache
from operator import itemgetter

# Computer Modern advance widths (em) of the glyphs we print, math italic for letters.
_LOWER = dict(zip("abcdefghijklmnopqrstuvwxyz",
                  (0.53, 0.43, 0.43, 0.52, 0.47, 0.49, 0.48, 0.58, 0.35, 0.41, 0.52, 0.30, 0.88,
                   0.60, 0.49, 0.50, 0.45, 0.45, 0.47, 0.36, 0.57, 0.49, 0.72, 0.57, 0.49, 0.47)))
_UPPER = dict(zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                  (0.75, 0.76, 0.72, 0.83, 0.74, 0.64, 0.79, 0.83, 0.44, 0.56, 0.85, 0.68, 0.97,
                   0.80, 0.76, 0.64, 0.79, 0.76, 0.65, 0.58, 0.68, 0.58, 0.94, 0.83, 0.58, 0.68)))
_UPRIGHT = 0.5  # roman letters in \operatorname, \mathrm, \text
_BIN = 0.778 + 2 * 0.222     # + - \cdot-like binary operators with medium spaces
_REL = 0.778 + 2 * 0.278     # = \approx \to with thick spaces
REL = _REL                   # a relation with its spaces, for the line fitter
_CHARS = {"0": 0.5, "1": 0.5, "2": 0.5, "3": 0.5, "4": 0.5, "5": 0.5, "6": 0.5, "7": 0.5, "8": 0.5, "9": 0.5,
          ".": 0.28, ",": 0.28 + 0.167, ";": 0.28 + 0.167, ":": 0.28 + 0.278, "(": 0.39, ")": 0.39, "[": 0.28, "]": 0.28,
          "|": 0.28, "/": 0.5, "'": 0.28, "!": 0.28, "?": 0.47, "*": 0.5, " ": 0.0, "~": 0.33}
_COMMANDS = {
    "cdot": 0.278 + 2 * 0.222, "times": _BIN, "pm": _BIN, "approx": _REL, "to": 1.0 + 2 * 0.278,
    "rightarrow": 1.0 + 2 * 0.278, "leftarrow": 1.0 + 2 * 0.278, "le": _REL, "ge": _REL, "leq": _REL, "geq": _REL,
    "ne": _REL, "neq": _REL, "in": 0.667 + 2 * 0.278, "mapsto": 1.0 + 2 * 0.278,
    "cdots": 1.34, "ldots": 1.34, "dots": 1.34, "vdots": 0.28, "ddots": 1.34, "infty": 1.0, "top": 0.78,
    "quad": 1.0, "qquad": 2.0, ",": 0.167, ":": 0.222, ";": 0.278, " ": 0.333, "!": -0.167, "enspace": 0.5,
    "alpha": 0.64, "beta": 0.57, "gamma": 0.52, "delta": 0.45, "epsilon": 0.47, "varepsilon": 0.47, "zeta": 0.44,
    "eta": 0.50, "theta": 0.47, "iota": 0.35, "kappa": 0.58, "lambda": 0.58, "mu": 0.60, "nu": 0.49, "xi": 0.44,
    "pi": 0.57, "rho": 0.52, "sigma": 0.57, "tau": 0.44, "upsilon": 0.54, "phi": 0.60, "varphi": 0.65, "chi": 0.63,
    "psi": 0.65, "omega": 0.62, "Gamma": 0.62, "Delta": 0.83, "Theta": 0.78, "Lambda": 0.69, "Xi": 0.67, "Pi": 0.75,
    "Sigma": 0.72, "Phi": 0.72, "Psi": 0.78, "Omega": 0.72, "ell": 0.42, "surd": 0.83, "prime": 0.28,
    "max": 1.53 + 0.167, "min": 1.33 + 0.167, "exp": 1.3 + 0.167, "log": 1.3 + 0.167, "sum": 1.44 + 0.167,
    "sin": 1.23 + 0.167, "cos": 1.34 + 0.167,  # RoPE's rotations (exact mode keeps cos(1), sin(1/100))
    "lvert": 0.28, "rvert": 0.28, "{": 0.5, "}": 0.5, "%": 0.83, "$": 0.5, "&": 0.78, "#": 0.83, "_": 0.5,
    "partial": 0.57, "nabla": 0.83, "circ": 0.5 + 2 * 0.222, "odot": _BIN, "otimes": _BIN, "leftrightarrow": 1.0 + 2 * 0.278,
    "textbackslash": 0.5, "backslash": 0.5,
}
_IGNORED = {"displaystyle", "textstyle", "limits", "nolimits", "left", "right", "middle", "bigl", "bigr", "Bigl", "Bigr",
            "biggl", "biggr", "big", "Big", "allowbreak", "nobreak", "relax"}
_ONE_ARG_SAME = {"mathbf", "boldsymbol", "mathit", "mathsf", "tilde", "hat", "bar", "check", "vec", "dot", "ddot", "overline",
                 "underline", "widetilde", "widehat", "mathbb", "mathcal", "phantom", "bm", "mathnormal"}
_ONE_ARG_UPRIGHT = {"operatorname", "mathrm", "text", "textrm", "mathtt", "texttt", "textbf", "textit", "mbox"}
_SCRIPT = 0.8       # scripts are set at 7pt of 10, but cmr7/cmmi7 glyphs are wider: 0.8 matches xelatex
_SCRIPTSPACE = 0.05
_ITALIC = 0.15      # a superscript starts after the base's italic correction (W^{..}, V^{..})
_COLSEP = 1.0       # two \arraycolsep of 5pt at 10pt, between matrix columns
_LEFT_DELIM = 0.6   # a \left( grows with what it encloses (scripts, fractions)
_GLYPH = {**_CHARS, **_LOWER, **_UPPER}
_TOKEN = re.compile(r"(\\([A-Za-z]+|.)|([{}^_&])|(\s+)|(.))", re.S)


_TEXT = itemgetter(0)  # a token's text


def _is_cjk(ch: str) -> bool:
    return ord(ch) >= 0x2E80


class _Reader:
    """A recursive reader over the tokens of one fragment that sums glyph widths.

    A token is (text, command, special, space, char), '' where a part is absent: the plain
    tuples of re.findall, as the reader is the hot loop of every report."""

    __slots__ = ("toks", "i")

    def __init__(self, tex: str, toks: list | None = None):
        self.toks = _TOKEN.findall(tex) if toks is None else toks
        self.i = 0

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def next(self):
        tok = self.peek()
        self.i += 1
        return tok

    def group_text(self) -> str:
        """The raw text of the next argument ({...} or one token), consumed (past the end: "",
        and the position one further, as `next` leaves it)."""
        toks, i = self.toks, self.i
        n = len(toks)
        if i >= n:
            self.i = i + 1
            return ""
        tok = toks[i]
        i += 1
        if tok[2] != "{":
            self.i = i
            return tok[0]
        depth, start = 1, i
        while i < n:  # every script and fraction of a report comes here: the tokens without peek/next
            special = toks[i][2]
            i += 1
            if special == "{":
                depth += 1
            elif special == "}":
                depth -= 1
                if depth == 0:
                    self.i = i
                    return "".join(map(_TEXT, toks[start:i - 1]))
        self.i = n + 1
        return ""

    def optional(self) -> str:
        tok = self.peek()
        if tok is not None and tok[4] == "[":
            start = self.i + 1
            while (t := self.next()) is not None and t[4] != "]":
                pass
            return "" if t is None else "".join(x[0] for x in self.toks[start:self.i - 1])
        return ""


def _upright(text: str) -> float:
    return sum(1.0 if _is_cjk(c) else (0.0 if c == "\\" else (0.33 if c == " " else _UPRIGHT)) for c in text)


def _environment(r: _Reader, name: str, text_style: bool) -> float:
    """A matrix or array: column widths plus column gaps plus the brackets."""
    if name == "array":
        r.group_text()  # column spec
    body_start = r.i
    depth = 1
    toks = r.toks
    end = n = len(toks)
    i = r.i
    while i < n:  # to the matching \end, over the token list itself (the hot loop of a big report)
        kind = toks[i][1]
        i += 1
        if kind == "begin" or kind == "end":
            depth += 1 if kind == "begin" else -1
            if depth == 0:
                end = i - 1
            r.i = i
            r.group_text()
            i = r.i
            if depth == 0:
                break
    r.i = max(i, r.i)
    body = "".join(map(_TEXT, toks[body_start:end]))
    rows = [_split_top(re.sub(r"^\s*\[[^\]]*\]", "", row), "&") for row in _split_top(body, r"\\")]  # \\[3pt] row spacing
    return matrix_width(rows, name)


def matrix_width(rows: list[list[str]], name: str = "bmatrix") -> float:
    """The width of environment `name` (bmatrix, array, ...) whose rows hold these cells: the
    same number `width` gives its LaTeX. A printer that has the cells can ask before it joins
    them, and the width of a matrix's first rows is a lower bound of the whole matrix's."""
    widths: list[float] = []
    for cells in rows:
        for c, cell in enumerate(cells):
            w = width(cell, text_style=True)
            if c < len(widths):
                widths[c] = max(widths[c], w)
            else:
                widths.append(w)
    total = sum(widths) + _COLSEP * max(0, len(widths) - 1)
    if name in ("bmatrix", "pmatrix", "vmatrix", "Bmatrix"):
        total += 2 * _bracket(len(rows))
    if name == "array":  # outer \arraycolsep; its \left[ \right] grow with the rows beyond a \left('s usual size
        total += _COLSEP + 2 * max(0.0, _bracket(len(rows)) - _LEFT_DELIM)
    if name == "cases":  # a brace on the left, a quad between the columns
        total = sum(widths) + 0.9 + 1.0 * max(0, len(widths) - 1)
    if name in ("aligned", "align*", "gathered"):
        total = sum(widths)  # aligned: the columns touch
    return total


def _bracket(rows: int) -> float:
    """How wide a bracket is around a matrix of this many rows (measured: 0.42, 0.53, 0.67em)."""
    return min(0.42 + 0.125 * (rows - 1), 0.9)


#: What `_split_top` looks at: a backslash with the character it escapes (so \\{ and \\& are
#: skipped, and \\\\ is found), a brace, an &.
_SPLIT_MARK = re.compile(r"\\[\s\S]?|[{}&]")


def _split_top(body: str, sep: str) -> list[str]:
    """Split at `sep` outside braces and nested environments."""
    if "{" not in body and "}" not in body and "\\&" not in body:  # no groups (a matrix of numbers): split as it is
        if sep == "&" or "\\\\\\" not in body:
            return body.split(sep)
    parts, depth, env, start = [], 0, 0, 0
    for m in _SPLIT_MARK.finditer(body):  # a backslash and the character after it, or a brace or &
        c = m.group()
        i = m.start()
        if c[0] == "\\":
            if body.startswith("\\begin", i):
                env += 1
            elif body.startswith("\\end", i):
                env -= 1
            elif c == sep and depth == 0 and env == 0:  # \\\\ between rows
                parts.append(body[start:i])
                start = i + 2
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == sep and depth == 0 and env == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    return parts


def _sum(r: _Reader, text_style: bool, stop_at_group_end: bool = False) -> float:
    total = 0.0
    sup = sub = 0.0        # widths of ^ and _ on the last atom
    prev_operand = False   # whether a binary operator here is binary (not a sign)
    toks = r.toks
    while r.i < len(toks):
        _, cmd, special, space, ch = toks[r.i]
        if special == "}" and stop_at_group_end:
            break
        r.i += 1
        if space:
            continue
        if special == "^" or special == "_":
            w = width(r.group_text(), text_style=True)
            if special == "^":
                sup = w
            else:
                sub = w
            continue
        if sup or sub:  # the scripts of the last atom end here
            total += max(sup + _ITALIC, sub) * _SCRIPT + _SCRIPTSPACE
            sup = sub = 0.0
        if special:
            if special == "{":
                total += _sum(r, text_style, stop_at_group_end=True)
                r.i += 1
                prev_operand = True
            continue
        if cmd:
            if cmd == "left" or cmd == "right":  # \left( : the delimiter that follows
                d = r.next()
                total += 0.0 if d is None or d[0] == "." else _LEFT_DELIM
                prev_operand = cmd == "right"
                continue
            w, operand = _command(r, cmd, text_style)
            total += w
            if cmd not in _IGNORED:
                prev_operand = operand
            continue
        if ch in "+-":
            total += _BIN if prev_operand else 0.778
            prev_operand = False
        elif ch in "=<>":
            total += _REL
            prev_operand = False
        else:
            w = _GLYPH.get(ch)
            if w is None:
                w = 1.0 if _is_cjk(ch) else 0.55
            total += w
            prev_operand = ch not in "(["
    if sup or sub:
        total += max(sup + _ITALIC, sub) * _SCRIPT + _SCRIPTSPACE
    return total


def _command(r: _Reader, cmd: str, text_style: bool) -> tuple[float, bool]:
    """Width of a control sequence with its arguments; and whether it ends an operand."""
    if cmd in _IGNORED:
        return 0.0, False
    if cmd == _ENV_TOKEN:
        return _env_width(r.toks[r.i - 1][0]), True
    if cmd == "frac" or cmd == "dfrac" or cmd == "tfrac":
        a, b = r.group_text(), r.group_text()
        small = cmd == "tfrac" or (cmd == "frac" and text_style)  # \dfrac is display size everywhere
        w = max(width(a, text_style=True), width(b, text_style=True)) * (_SCRIPT if small else 1.0)
        return w + 0.24, True
    if cmd == "sqrt":
        idx = r.optional()
        return width(r.group_text(), text_style=text_style) + 0.83 + (0.4 if idx else 0.0), True
    if cmd in ("underset", "overset"):
        small, big = r.group_text(), r.group_text()
        return max(width(big, text_style=text_style), width(small, text_style=True) * _SCRIPT), True
    if cmd in ("underbrace", "overbrace"):
        inner = width(r.group_text(), text_style=text_style)
        nxt = r.peek()
        if nxt is not None and nxt[2] in ("_", "^"):  # the label goes under (over) the brace
            r.next()
            return max(inner, width(r.group_text(), text_style=True) * _SCRIPT), True
        return inner, True
    if cmd == "begin":
        env = r.group_text()
        return _environment(r, env, text_style), True
    if cmd == "end":
        r.group_text()
        return 0.0, True
    if cmd in _ONE_ARG_UPRIGHT:
        w = _upright(r.group_text())
        return w + (0.167 if cmd == "operatorname" else 0.0), True
    if cmd in _ONE_ARG_SAME:
        return width(r.group_text(), text_style=text_style), True
    if cmd == "ensuremath":
        return width(r.group_text(), text_style=text_style), True
    if cmd == "hspace":
        return _length(r.group_text()), False
    if cmd in ("mathop", "mathrel", "mathbin", "mathord", "mathinner"):
        return width(r.group_text(), text_style=text_style) + (0.56 if cmd == "mathrel" else 0.0), True
    w = _COMMANDS.get(cmd)
    if w is None:
        return 0.6, True  # an unknown symbol: about one glyph
    operand = cmd not in ("cdot", "times", "pm", "approx", "to", "rightarrow", "leftarrow", "le", "ge", "leq", "geq",
                          "ne", "neq", "in", "quad", "qquad", ",", ";", ":", " ", "!", "mapsto", "circ", "odot", "otimes")
    return w, operand


def _length(text: str) -> float:
    m = re.match(r"\s*(-?[\d.]+)\s*(em|pt|mu)", text)
    if not m:
        return 0.0
    x = float(m.group(1))
    return {"em": x, "pt": x / 10.0, "mu": x / 18.0}[m.group(2)]


#: A command where the reader's tokens cut one (\\begin, not \\\\begin), and an environment's
#: \\begin{name} or \\end{name} written plainly.
_COMMAND = re.compile(r"\\(?:[A-Za-z]+|.)", re.S)
_ENV_MARK = re.compile(r"\\(begin|end)\{([A-Za-z*]+)\}")
#: The command of a token that stands for a whole environment (its text): see `_tokens`.
_ENV_TOKEN = "\x00env"


def _tokens(tex: str) -> list:
    """The reader's tokens of `tex`, each outermost environment one token (its text,
    `_ENV_TOKEN`): a matrix is most of a report's text, and its body is cut into cells by
    `_split_top` (as the reader's `_environment` does) without a token per character first.
    Anything unusual (a \\begin without a plain {name}, an unmatched \\end) is read token by token."""
    if "\\begin" not in tex:
        return _TOKEN.findall(tex)
    toks: list = []
    pos = start = depth = 0
    for m in _COMMAND.finditer(tex):
        name = m.group()
        if name != "\\begin" and name != "\\end":
            continue
        mark = _ENV_MARK.match(tex, m.start())
        if mark is None:
            return _TOKEN.findall(tex)
        if name == "\\begin":
            if depth == 0:
                start = m.start()
            depth += 1
            continue
        depth -= 1
        if depth < 0:
            return _TOKEN.findall(tex)
        if depth == 0:
            toks += _TOKEN.findall(tex[pos:start])
            toks.append((tex[start:mark.end()], _ENV_TOKEN, "", "", ""))
            pos = mark.end()
    if depth:
        return _TOKEN.findall(tex)
    toks += _TOKEN.findall(tex[pos:])
    return toks


@lru_cache(maxsize=1024)
def _env_width(text: str) -> float:
    """The width of one environment, `text` from its \\begin{name} to its \\end{name}: what
    `_environment` gives, from the same body text. Kept for the texts that hold it again (a
    matrix alone, then in a product or after its name); fewer than `width` keeps, as a
    matrix's text can be large."""
    begin = _ENV_MARK.match(text)
    name, body_start = begin.group(2), begin.end()
    if name == "array":  # its column spec: a plain {rr|r} group, else read token by token
        close = text.find("}", body_start)
        if not text.startswith("{", body_start) or close < 0 or "{" in text[body_start + 1:close] or "\\" in text[body_start:close]:
            return _sum(_Reader(text), False)
        body_start = close + 1
    body = text[body_start:text.rindex("\\end")]
    rows = [_split_top(re.sub(r"^\s*\[[^\]]*\]", "", row), "&") for row in _split_top(body, r"\\")]  # \\[3pt] row spacing
    return matrix_width(rows, name)


@lru_cache(maxsize=65536)
def width(tex: str, text_style: bool = False) -> float:
    """The estimated width of a LaTeX math fragment in em (of a 10pt math font: 1em = 10pt).

    Alignment marks (&) and line breaks are ignored: give one line at a time. Estimates
    err wide, so that what fits by this count fits in the typeset page.
    """
    if _NUMBER.fullmatch(tex):  # a printed number (most cells of a report): its glyphs, left to right
        total = 0.0
        for ch in tex:
            total += _SIGN if ch == "-" else _CHARS[ch]
        return total
    return _sum(_Reader(tex, _tokens(tex)), text_style)


#: A plain decimal number as printing writes it (a matrix cell keeps its spaces), and the width of its leading minus (a sign,
#: not a binary operator: no spaces). `width` takes these without the reader; the result is
#: the reader's own, to the bit (checked on every fragment of the examples' reports).
_NUMBER = re.compile(r" *-?[0-9]+(?:\.[0-9]+)? *")
_SIGN = 0.778
