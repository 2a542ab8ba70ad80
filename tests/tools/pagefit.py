"""Does the typeset page fit? Measures with the real typesetters: xelatex and KaTeX in Chromium.

Import from a test (tests/conftest.py puts this folder on sys.path)::

    from pagefit import overfull_boxes, compile_latex_full, markdown_equation_widths

LaTeX
- ``compile_latex_full(source, workdir=None, engine="xelatex") -> LatexResult``: compiles
  ``doc.tex`` in a fresh folder and keeps the FULL log (``mathcheck.compile_latex`` only
  returns its tail), the page count and the text width the document really used
  (``\\the\\textwidth``, written to the log by a ``\\typeout`` added after
  ``\\begin{document}``; it changes nothing on the page).
- ``overfull_boxes(log_text) -> list[float]``: the width in pt of every
  ``Overfull \\hbox (12.3pt too wide)`` in a TeX log, in log order (log lines are wrapped
  at 79 characters; they are unwrapped first).
- ``overfull_details(log_text, source=None) -> list[dict]``: the same with where TeX saw
  them (``in paragraph at lines 12--14``, ``detected at line 30``, ``in alignment at
  lines 5--9``) and the start of that source line, for messages that name the equation.
- ``page_count(log_text)``: N from ``Output written on doc.pdf (N pages``.

Markdown + KaTeX
- ``markdown_equation_widths(docs, column_px=760) -> {name: [record, ...]}``: every
  document (name -> Markdown text) is turned into HTML with markdown-it-py (the parser of
  ``mathcheck.markdown_math_spans``: ``$``, ``$$``, ``\\(..\\)``, ``\\[..\\]``), every math
  span is typeset by KaTeX (``node_modules/katex/dist``, ``throwOnError: true``) inside a
  ``column_px`` wide column with 16px body text, all documents in ONE headless Chromium
  run, after every KaTeX font has loaded. One record per display equation, plus one per
  inline span that sticks out of the column by more than ``INLINE_TOLERANCE_PX`` or does
  not parse::

      {"kind": "display" | "inline", "index": k (k-th math span of the document),
       "tex": the TeX, "snippet": its first 100 characters on one line,
       "width": rendered width in px (None on error),
       "overflow": px past the column's edges (0 when inside),
       "error": KaTeX's message or None,
       "ink_overflow": inline only: the overflow of its spans (see below)}

  The width is the right edge of the spans inside ``.katex-html`` minus their left edge,
  leaving out ``.hide-tail`` (KaTeX's stretchy parts are 400em wide and clipped), ``svg``
  and the ``.katex-mathml`` copy (GUIDE.md section 5).
  The overflow of a display equation is measured on those spans (strict: every span must
  be inside the column). An inline formula is measured against its line box: the boxes it
  occupies in its lines (``getClientRects`` of ``.katex-html``) must lie within the column.
  Its spans may reach past that box: KaTeX ends every subscript with a 2px ``.vlist-s``
  strut holding a zero-width space (nothing is drawn there), so ``g_{ij}`` placed by the
  browser flush with the end of a line "sticks out 1.4px" by its spans while its box ends
  inside the column. That is a wrapping artefact, not an overflow; the records also give
  ``ink_overflow`` (the spans' overflow) for inline spans.
- Fonts: the page names its fonts (``PAGE_FONTS``: DejaVu Serif for Latin text, Noto Serif
  CJK SC for Chinese, DejaVu Sans Mono for code) instead of the generic ``serif``, whose
  fallback for Chinese differs from machine to machine (``fc-match "sans-serif:lang=zh"``
  gives DejaVu Sans on a fresh Debian, and Chinese lines then break elsewhere).
  ``missing_page_fonts()`` names those fontconfig does not know; measuring refuses to run
  without them (scripts/install-test-deps.sh installs fonts-dejavu-core and fonts-noto-cjk).
- ``find_chromium()``: the browser to use ($CHROMIUM, else chromium / chromium-browser /
  google-chrome on PATH), or None.
"""

from __future__ import annotations

import functools
import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import mathcheck
from mathcheck import INSTALL_HINT, NODE_MODULES, ToolMissing

# =========================================================================== LaTeX

#: TeX Live writes log lines of at most this many characters (texmf.cnf max_print_line).
MAX_PRINT_LINE = 79

_OVERFULL = re.compile(r"Overfull \\hbox \((-?\d+(?:\.\d+)?)pt too wide\)([^\n]*)")
_OUTPUT = re.compile(r"Output written on .*?\((\d+) pages?")
_TEXTWIDTH_TAG = "PAGEFIT-TEXTWIDTH="
_TEXTWIDTH = re.compile(re.escape(_TEXTWIDTH_TAG) + r"(-?\d+(?:\.\d+)?)pt")
_LINES = re.compile(r"at lines? (\d+)(?:--(\d+))?")
_DISPLAY_START = re.compile(r"\s*(\\\[|\$\$|\\begin\{(equation|align|gather|multline|flalign|alignat)\*?\})")


def unwrap_log(log_text: str, width: int = MAX_PRINT_LINE) -> str:
    """The log with TeX's hard line wraps undone: a line of exactly ``width`` characters
    continues on the next line. (A line that is naturally 79 characters long is joined to
    the next one too; that cannot create nor hide an ``Overfull`` message, which TeX
    always starts on a fresh line.)"""
    out: list[str] = []
    joining = False
    for line in log_text.split("\n"):
        if joining:
            out[-1] += line
        else:
            out.append(line)
        joining = len(line) == width
    return "\n".join(out)


def overfull_boxes(log_text: str) -> list[float]:
    """Width in pt of every ``Overfull \\hbox (Xpt too wide)`` in a TeX log, in order."""
    return [float(m.group(1)) for m in _OVERFULL.finditer(unwrap_log(log_text))]


def overfull_details(log_text: str, source: str | None = None) -> list[dict]:
    """Every overfull hbox as ``{"width": pt, "where": "in paragraph at lines 12--14",
    "line": first source line or None, "source": those source lines, joined and cut at
    160 characters, or ""}``. A display (``detected at line N``, N = its last line) is
    shown from its ``\\[`` / ``\\begin{align*}`` on."""
    src_lines = source.splitlines() if source is not None else []
    found = []
    for m in _OVERFULL.finditer(unwrap_log(log_text)):
        where = m.group(2).strip()
        lm = _LINES.search(where)
        first = last = int(lm.group(1)) if lm else None
        if lm and lm.group(2):
            last = int(lm.group(2))
        if first is not None and where.startswith("detected"):
            # TeX names a display's last line: go back to where it starts (\[, \begin{align*})
            while (1 < first <= len(src_lines) and not _DISPLAY_START.match(src_lines[first - 1])
                   and src_lines[first - 2].strip()):
                first -= 1
        text = ""
        if first is not None and src_lines:
            text = " ".join(s.strip() for s in src_lines[first - 1:last] if s.strip())
            text = text if len(text) <= 160 else text[:157] + "..."
        found.append({"width": float(m.group(1)), "where": where, "line": first, "source": text})
    return found


def page_count(log_text: str) -> int | None:
    """N of ``Output written on doc.pdf (N pages, ...)``; None when no PDF was written."""
    m = _OUTPUT.search(unwrap_log(log_text))
    return int(m.group(1)) if m else None


def textwidth_pt(log_text: str) -> float | None:
    """The ``\\textwidth`` logged by ``compile_latex_full``'s probe, in pt."""
    m = _TEXTWIDTH.search(unwrap_log(log_text))
    return float(m.group(1)) if m else None


@dataclass
class LatexResult:
    """What one compile gave: ``ok`` (exit 0 and a PDF), the full ``log``, ``pages``,
    ``textwidth`` (pt), the ``pdf`` path (None when not ok), the ``folder`` and the
    ``source`` as compiled."""

    ok: bool
    log: str
    pages: int | None
    textwidth: float | None
    pdf: Path | None
    folder: Path
    source: str = field(repr=False, default="")

    @property
    def overfull(self) -> list[float]:
        return overfull_boxes(self.log)

    def overfull_details(self) -> list[dict]:
        return overfull_details(self.log, self.source)

    def error_summary(self) -> str:
        return mathcheck._log_tail(self.log)


def _probe_textwidth(source: str) -> str:
    r"""Adds ``\typeout{PAGEFIT-TEXTWIDTH=\the\textwidth}`` after ``\begin{document}``
    (geometry and ctexart set the width at \begin{document}); nothing is typeset."""
    marker = "\\begin{document}"
    i = source.find(marker)
    if i < 0:
        return source
    i += len(marker)
    probe = "\\typeout{" + _TEXTWIDTH_TAG + "\\the\\textwidth}"
    return source[:i] + probe + source[i:]


def compile_latex_full(
    tex_source: str,
    workdir: str | os.PathLike | None = None,
    engine: str = "xelatex",
    timeout: float = 180,
    probe_textwidth: bool = True,
) -> LatexResult:
    """Compile ``tex_source`` once as ``doc.tex`` in a fresh folder (inside ``workdir``
    when given); returns a ``LatexResult`` with the full log. One run is enough for
    overfull boxes and the page count (no cross references in generated reports)."""
    exe = shutil.which(engine)
    if exe is None:
        raise ToolMissing(f"{engine} is not installed ({INSTALL_HINT})")
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="pagefit-", dir=workdir))
    source = _probe_textwidth(tex_source) if probe_textwidth else tex_source
    (folder / "doc.tex").write_text(source, encoding="utf-8")
    proc = subprocess.run(
        [exe, "-interaction=nonstopmode", "-halt-on-error", "-file-line-error", "doc.tex"],
        cwd=folder, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        encoding="utf-8", errors="replace", timeout=timeout,
    )
    log_path = folder / "doc.log"
    log = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
    log = log or proc.stdout
    pdf = folder / "doc.pdf"
    ok = proc.returncode == 0 and pdf.is_file() and pdf.stat().st_size > 0
    pages = page_count(log)
    if ok and pages is None:
        pages = _pdfinfo_pages(pdf)
    return LatexResult(ok=ok, log=log, pages=pages, textwidth=textwidth_pt(log),
                       pdf=pdf if ok else None, folder=folder, source=source)


def _pdfinfo_pages(pdf: Path) -> int | None:
    exe = shutil.which("pdfinfo")
    if exe is None:
        return None
    out = subprocess.run([exe, str(pdf)], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"^Pages:\s+(\d+)", out, re.M)
    return int(m.group(1)) if m else None


# ======================================================================= Markdown

KATEX_DIST = NODE_MODULES / "katex" / "dist"

#: markdown-it token type -> display? (the same table as mathcheck.markdown_math_spans)
_MATH_TOKENS = dict(mathcheck._MATH_TOKENS)


#: Seconds before a Chromium run counts as hung: a guard, not a speed check. All documents of
#: test_page_fit take about a minute alone, and over 3 minutes on a loaded 2-core machine.
CHROMIUM_TIMEOUT = 900

#: The fonts the test page names (never a generic family: its fallback depends on the machine).
PAGE_FONTS = {"latin": "DejaVu Serif", "cjk": "Noto Serif CJK SC", "mono": "DejaVu Sans Mono"}


@functools.lru_cache(maxsize=None)
def missing_page_fonts() -> tuple[str, ...]:
    """The families of ``PAGE_FONTS`` that fontconfig does not know (all of them when there
    is no ``fc-list``): Chromium on Linux finds its fonts through fontconfig."""
    exe = shutil.which("fc-list")
    if exe is None:
        return tuple(PAGE_FONTS.values())
    missing = []
    for family in PAGE_FONTS.values():
        out = subprocess.run([exe, f":family={family}", "family"], capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL).stdout
        if family not in {name.strip() for line in out.splitlines() for name in line.split(",")}:
            missing.append(family)
    return tuple(missing)


def find_chromium() -> str | None:
    """The Chromium binary: $CHROMIUM, else the first of chromium, chromium-browser,
    google-chrome on PATH; None when there is none."""
    env = os.environ.get("CHROMIUM")
    if env:
        return shutil.which(env) or (env if os.access(env, os.X_OK) else None)
    for name in ("chromium", "chromium-browser", "google-chrome"):
        exe = shutil.which(name)
        if exe:
            return exe
    return None


def _math_html_parser(spans: list[tuple[str, bool]]):
    """A markdown-it parser like mathcheck's whose math renders as empty placeholders
    ``<span|div class="pf-math" data-k="K">``; the TeX goes to ``spans[K]``."""
    from markdown_it import MarkdownIt
    from mdit_py_plugins.dollarmath import dollarmath_plugin
    from mdit_py_plugins.texmath import texmath_plugin

    md = MarkdownIt("commonmark", {"html": True})
    md.enable("table")
    md.use(dollarmath_plugin, double_inline=True)
    md.use(texmath_plugin, delimiters="brackets")

    def make_rule(display: bool):
        def rule(self, tokens, idx, options, env):
            k = len(spans)
            spans.append((tokens[idx].content.strip(), display))
            tag = "div" if display else "span"
            return f'<{tag} class="pf-math" data-k="{k}"></{tag}>' + ("\n" if display else "")

        return rule

    for token_type, display in _MATH_TOKENS.items():
        md.add_render_rule(token_type, make_rule(display))
    return md


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<link rel="stylesheet" href="{css}">
<style>
  html, body {{ margin: 0; padding: 0; }}
  body {{ font-family: "{latin}", "{cjk}"; font-size: 16px;
          line-height: 1.5; color: #000; background: #fff; }}
  .pf-doc {{ margin: 0 20px 40px 20px; padding: 0; overflow: visible; }}
  .pf-doc pre, .pf-doc code {{ font-family: "{mono}", "{cjk}"; font-size: 14px; }}
  .pf-doc table {{ border-collapse: collapse; }}
  .pf-doc td, .pf-doc th {{ border: 1px solid #888; padding: 2px 6px; }}
</style>
</head><body>
<div class="pf-probe"><span id="pf-cjk-probe">中文中文中文中文中文</span></div>
{docs}
<script type="application/json" id="pf-spans">{spans}</script>
<script src="{js}"></script>
<script>
{script}
</script>
</body></html>
"""

# Runs in the page: typeset, wait for the fonts, measure, replace the body by the JSON.
_SCRIPT = r"""
(async function () {
  const out = {ok: false, results: [], fonts: {}, error: null};
  try {
    // load every KaTeX face first (not only the ones the page happens to use), so
    // that the page is laid out once, with the real fonts
    const faces = Array.from(document.fonts);
    await Promise.all(faces.map(f => f.load().catch(() => null)));
    await document.fonts.ready;
    const failed = faces.filter(f => f.status !== 'loaded')
                        .map(f => f.family + ' ' + f.style + ' ' + f.weight + ': ' + f.status);
    out.fonts = {total: faces.length, failed: failed};
    const spans = JSON.parse(document.getElementById('pf-spans').textContent);
    const nodes = Array.from(document.querySelectorAll('.pf-math'));
    for (const el of nodes) {
      const k = +el.dataset.k;
      const [tex, display] = spans[k];
      try {
        // the MathML copy is left out: it is clipped away and not measured
        katex.render(tex, el, {displayMode: display, throwOnError: true, output: 'html'});
      } catch (e) {
        el.textContent = '[KaTeX error]';
        el.dataset.error = String(e && e.message || e);
      }
    }
    await document.fonts.ready;  // nothing new to load, unless a glyph needs a system font
    // CJK text has real glyph widths only when the system has a CJK font (about 1em each)
    const probe = document.getElementById('pf-cjk-probe');
    out.cjk_em = probe.getBoundingClientRect().width / 10
                 / parseFloat(getComputedStyle(probe).fontSize);

    for (const el of nodes) {
      const k = +el.dataset.k;
      const display = spans[k][1];
      const col = el.closest('.pf-doc').getBoundingClientRect();
      const rec = {k: k, width: null, left: null, right: null, col_left: col.left,
                   col_right: col.right, error: el.dataset.error || null};
      const khtml = el.querySelector('.katex-html');
      if (!rec.error && khtml && !display) {
        // an inline formula: the boxes it takes in its line boxes (one per line it is on)
        rec.boxes = Array.from(khtml.getClientRects()).filter(r => r.width > 0)
                         .map(r => [r.left, r.right]);
      }
      if (!rec.error && khtml) {
        let left = Infinity, right = -Infinity;
        // every span but KaTeX's clipped stretchy parts (.hide-tail: 400em wide svgs)
        for (const s of khtml.querySelectorAll('span:not(.hide-tail, .hide-tail *)')) {
          const r = s.getBoundingClientRect();
          if (r.width <= 0) continue;
          if (r.left < left) left = r.left;
          if (r.right > right) right = r.right;
        }
        if (right > left) { rec.width = right - left; rec.left = left; rec.right = right; }
        else { rec.width = 0; }
      }
      out.results.push(rec);
    }
    out.ok = true;
  } catch (e) {
    out.error = String(e && e.stack || e);
  }
  document.body.innerHTML = '';
  const pre = document.createElement('pre');
  pre.id = 'pagefit-result';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
"""

#: An inline formula is reported when its box in its line sticks out more than this: layout
#: rounding, not a visible overflow (display math: every span within the column, strictly).
INLINE_TOLERANCE_PX = 0.5

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_RESULT = re.compile(r'<pre id="pagefit-result">(.*?)</pre>', re.S)


def _json_for_script(value) -> str:
    # inside <script>: no "</" (ends the element) and no raw U+2028/9
    return (json.dumps(value, ensure_ascii=True)
            .replace("</", "<\\/").replace("<!--", "<\\!--"))


def build_page(docs: dict[str, str], column_px: int = 760) -> tuple[str, list[tuple[str, bool]], list[str]]:
    """The HTML page of all documents; returns ``(html, spans, owner)`` where
    ``spans[k] = (tex, display)`` and ``owner[k]`` is the name of its document."""
    if not (KATEX_DIST / "katex.min.js").is_file():
        raise ToolMissing(f"KaTeX is not installed in {NODE_MODULES} ({INSTALL_HINT})")
    spans: list[tuple[str, bool]] = []
    owner: list[str] = []
    md = _math_html_parser(spans)
    parts = []
    for name, text in docs.items():
        start = len(spans)
        body = md.render(text)
        owner.extend([name] * (len(spans) - start))
        parts.append(
            f'<div class="pf-doc" data-name="{html.escape(name, quote=True)}" '
            f'style="width: {float(column_px)}px">\n{body}</div>'
        )
    page = _PAGE.format(
        css=(KATEX_DIST / "katex.min.css").as_uri(),
        js=(KATEX_DIST / "katex.min.js").as_uri(),
        docs="\n".join(parts),
        spans=_json_for_script(spans),
        script=_SCRIPT,
        **PAGE_FONTS,
    )
    return page, spans, owner


def run_chromium(page_html: str, timeout: float = CHROMIUM_TIMEOUT, keep: str | os.PathLike | None = None) -> str:
    """Load ``page_html`` from a file:// URL in one headless Chromium and return the DOM
    it dumps. ``keep``: also write the page there (to look at it)."""
    exe = find_chromium()
    if exe is None:
        raise ToolMissing(f"chromium is not installed ({INSTALL_HINT})")
    with tempfile.TemporaryDirectory(prefix="pagefit-chromium-") as tmp:
        page = Path(tmp) / "page.html"
        page.write_text(page_html, encoding="utf-8")
        if keep is not None:
            Path(keep).write_text(page_html, encoding="utf-8")
        profile = Path(tmp) / "profile"
        cmd = [
            exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--mute-audio", "--hide-scrollbars",
            f"--user-data-dir={profile}", "--allow-file-access-from-files",
            "--window-size=1280,1000", "--virtual-time-budget=20000",
            "--dump-dom", page.as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8",
                              errors="replace", timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode != 0 or "pagefit-result" not in proc.stdout:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"chromium exited {proc.returncode} without a result:\n{tail}")
    return proc.stdout


def markdown_equation_widths(
    docs: dict[str, str],
    column_px: float = 760,
    *,
    timeout: float = CHROMIUM_TIMEOUT,
    keep_html: str | os.PathLike | None = None,
) -> dict[str, list[dict]]:
    """Typeset the math of every Markdown document with KaTeX in ONE Chromium run and
    measure it in a ``column_px`` wide column (see the module docstring for the records).

    Raises ToolMissing without Chromium or KaTeX, and RuntimeError when the page did not
    report, when a KaTeX font did not load, or when a span was not measured: a measuring
    tool must not pass by measuring nothing."""
    docs = dict(docs)
    missing = missing_page_fonts()
    if missing:
        raise ToolMissing(f"fontconfig does not know the font(s) {', '.join(missing)} ({INSTALL_HINT})")
    page, spans, owner = build_page(docs, column_px)
    out = {name: [] for name in docs}
    if not spans:
        return out
    dom = run_chromium(page, timeout=timeout, keep=keep_html)
    m = _RESULT.search(dom)
    if not m:
        raise RuntimeError("the page wrote no result")
    data = json.loads(html.unescape(m.group(1)))
    if not data.get("ok"):
        raise RuntimeError(f"the measuring script failed: {data.get('error')}")
    fonts = data.get("fonts", {})
    if not fonts.get("total") or fonts.get("failed"):
        raise RuntimeError(f"KaTeX fonts did not load: {fonts}")
    if data.get("cjk_em", 0) < 0.9 and any(_CJK.search(text) for text in docs.values()):
        raise RuntimeError(
            f"Chinese text is {data.get('cjk_em')}em a character in Chromium: no CJK font "
            f"(fc-list :lang=zh is empty; {INSTALL_HINT})")
    results = data["results"]
    if sorted(r["k"] for r in results) != list(range(len(spans))):
        raise RuntimeError(f"measured {len(results)} of {len(spans)} math spans")

    counters: dict[str, int] = {}
    index_of = []
    for name in owner:  # k-th span of its document
        index_of.append(counters.get(name, 0))
        counters[name] = counters.get(name, 0) + 1
    for r in sorted(results, key=lambda r: r["k"]):
        k = r["k"]
        tex, display = spans[k]
        if r["error"] is None and r["width"] is None:
            raise RuntimeError(f"span {k} ({tex[:60]!r}) was typeset but has no .katex-html")
        ink = 0.0
        if r["right"] is not None:
            ink = max(0.0, r["right"] - r["col_right"], r["col_left"] - r["left"])
        overflow = ink
        if not display and r.get("boxes"):  # inline: its boxes in the line boxes
            overflow = max(0.0, *(max(right - r["col_right"], r["col_left"] - left) for left, right in r["boxes"]))
        flat = " ".join(tex.split())
        rec = {
            "kind": "display" if display else "inline",
            "index": index_of[k],
            "tex": tex,
            "snippet": flat if len(flat) <= 100 else flat[:97] + "...",
            "width": None if r["width"] is None else round(r["width"], 2),
            "overflow": round(overflow, 2),
            "error": r["error"],
        }
        if not display:
            rec["ink_overflow"] = round(ink, 2)
        if display or rec["error"] or overflow > INLINE_TOLERANCE_PX:
            out[owner[k]].append(rec)
    return out
