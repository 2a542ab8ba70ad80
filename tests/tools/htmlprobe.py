"""Open many generated HTML pages in ONE headless Chromium and report what a reader would meet.

Import from a test (tests/conftest.py puts this folder on sys.path)::

    from htmlprobe import probe_pages, screenshot_tiles

``probe_pages({name: html}, scripted=True)`` loads each page in turn into an iframe of a
harness page (``srcdoc``: same origin as the harness, so it can measure; the page's own CSP
still applies). ``scripted=False`` loads it in ``sandbox="allow-same-origin"``: the page's
scripts do not run, as in a reader with JavaScript off. Chromium runs with the network
disabled (no proxy, every host unresolvable, no background networking). For each page::

    {"text": the visible text (innerText), "merror": number of <merror>,
     "tex_errors": number of code.tex-error, "column": the .attntrace column's width,
     "too_wide": [{"tag", "cls", "right", "width", "text"}] elements past the column's right edge,
     "resources": URLs the page loaded (performance entries), "links": src/href/url() seen,
     "explorers": [{"key", "cells", "clicks": [{"i", "j", "lines": [{"cls", "display", "nums"}]}],
                    "hover": {"lhs_row": n, "rhs_col": n}, "keyboard": bool, "toggle": {...}}]}

``screenshot_tiles({name: html}, tile=(800, 600))`` lays the pages out as a grid of iframes,
takes one screenshot and returns {name: PIL image of its first screen}.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from mathcheck import INSTALL_HINT, ToolMissing
from pagefit import find_chromium

NO_NETWORK = ["--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-extensions", "--no-proxy-server", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost",
              "--disable-default-apps", "--disable-domain-reliability", "--no-pings", "--metrics-recording-only"]

_HARNESS = r"""<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0">
<script type="application/json" id="pages">%(pages)s</script>
<script>
(async function () {
  const pages = JSON.parse(document.getElementById('pages').textContent);
  const scripted = %(scripted)s;
  const out = {};
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  for (const [name, html] of Object.entries(pages)) {
    const t0 = performance.now();
    const f = document.createElement('iframe');
    f.style.cssText = 'width:800px;height:1000px;border:0';
    if (!scripted) f.setAttribute('sandbox', 'allow-same-origin');
    const loaded = new Promise(r => f.addEventListener('load', r, {once: true}));
    f.srcdoc = html;
    document.body.appendChild(f);
    await loaded;
    const doc = f.contentDocument, win = f.contentWindow;
    await doc.fonts.ready;
    const rec = {t_load: performance.now() - t0};
    try {
      rec.text = doc.body.innerText;
      rec.merror = doc.querySelectorAll('merror').length;
      rec.tex_errors = doc.querySelectorAll('.tex-error').length;
      rec.js_class = !!doc.querySelector('.attntrace.at-js');
      const root = doc.querySelector('.attntrace');
      const col = root.getBoundingClientRect();
      rec.column = col.width;
      rec.too_wide = [];
      for (const e of root.querySelectorAll('*')) {
        const r = e.getBoundingClientRect();
        if (r.width === 0 && r.height === 0) continue;
        if (r.right > col.right + 1 || r.left < col.left - 1) {
          rec.too_wide.push({tag: e.tagName, cls: String(e.className && e.className.baseVal !== undefined ? e.className.baseVal : e.className),
                             right: r.right - col.right, width: r.width, text: (e.textContent || '').slice(0, 80)});
          if (rec.too_wide.length > 20) break;
        }
      }
      rec.t_wide = performance.now() - t0;
      rec.resources = win.performance.getEntriesByType('resource').map(e => e.name);
      rec.links = [];
      for (const e of doc.querySelectorAll('[src],[href],[srcset],[poster],[data],link,img,iframe,object,embed,audio,video,source'))
        rec.links.push(e.outerHTML.slice(0, 120));
      for (const s of doc.querySelectorAll('style')) if (/url\(|@import/i.test(s.textContent)) rec.links.push('style url()');
      const tog = doc.querySelector('.at-toggle');
      rec.toggle_visible = !!tog && win.getComputedStyle(tog).display !== 'none';
      rec.hints_visible = Array.from(doc.querySelectorAll('.at-hint')).filter(e => win.getComputedStyle(e).display !== 'none').length;
      rec.verdicts = {};
      for (const td of doc.querySelectorAll('td[data-verdict]')) {
        const v = td.dataset.verdict;
        (rec.verdicts[v] = rec.verdicts[v] || {colours: [], n: 0}).n++;
        const bg = win.getComputedStyle(td).backgroundColor;
        if (!rec.verdicts[v].colours.includes(bg)) rec.verdicts[v].colours.push(bg);
      }
      rec.explorers = [];
      for (const fig of doc.querySelectorAll('.at-explorer')) {
        const x = {key: JSON.parse(fig.getAttribute('data-explore')).key, cells: fig.querySelectorAll('.at-cell').length,
                   tabindex: Array.from(fig.querySelectorAll('.at-cell')).every(c => c.getAttribute('tabindex') === '0'),
                   clicks: []};
        const panel = fig.querySelector('.at-panel');
        const read = () => Array.from(panel.querySelectorAll('.at-line')).map(l => ({
          cls: l.className, display: win.getComputedStyle(l).display,
          nums: Array.from(l.querySelectorAll('[data-n]')).map(n => n.getAttribute('data-n')),
          text: l.textContent}));
        const cells = Array.from(fig.querySelectorAll('.at-cell'));
        // the first, the last and one in the middle
        for (const c of [cells[0], cells[Math.floor(cells.length / 2)], cells[cells.length - 1]]) {
          c.click();
          x.clicks.push({i: +c.dataset.i, j: +c.dataset.j, shown: c.textContent, lines: read(),
                         pressed: c.getAttribute('aria-pressed')});
        }
        // keyboard: Enter on the second cell
        const k = cells[1] || cells[0];
        panel.textContent = '';
        k.focus();
        k.dispatchEvent(new win.KeyboardEvent('keydown', {key: 'Enter', bubbles: true}));
        x.keyboard = {i: +k.dataset.i, j: +k.dataset.j, lines: read()};
        k.blur();
        // hover: the row of the left matrix and the column of the right one light up
        const h = cells[cells.length - 1];
        h.dispatchEvent(new win.MouseEvent('mouseenter'));
        const lit = t => t ? Array.from(t.querySelectorAll('td')).filter(td => td.classList.contains('at-hl'))
                                .map(td => [td.parentElement.rowIndex + 1, td.cellIndex - (td.parentElement.querySelector('th') ? 1 : 0)]) : null;
        x.hover = {i: +h.dataset.i, j: +h.dataset.j, lhs: lit(fig.querySelector('.at-lhs')), rhs: lit(fig.querySelector('.at-rhs'))};
        h.dispatchEvent(new win.MouseEvent('mouseleave'));
        x.after_leave = fig.querySelectorAll('.at-hl').length;
        rec.explorers.push(x);
      }
      // the toggle: "general formula" hides the other lines
      const radio = doc.querySelector('.at-toggle input[value="general"]');
      if (radio && rec.explorers.length) {
        radio.click();
        const fig = doc.querySelector('.at-explorer');
        rec.toggle = Array.from(fig.querySelectorAll('.at-line')).map(l => [l.className, win.getComputedStyle(l).display]);
        doc.querySelector('.at-toggle input[value="all"]').click();
      }
    } catch (e) { rec.error = String(e && e.stack || e); }
    rec.t_total = performance.now() - t0;
    out[name] = rec;
    f.remove();
  }
  document.body.innerHTML = '';
  const pre = document.createElement('pre');
  pre.id = 'probe-result';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script></body></html>
"""


def _json_for_script(value) -> str:
    return json.dumps(value, ensure_ascii=True).replace("</", "<\\/").replace("<!--", "<\\!--")


def _chromium(args: list[str], page: Path, timeout: float) -> subprocess.CompletedProcess:
    exe = find_chromium()
    if exe is None:
        raise ToolMissing(f"chromium is not installed ({INSTALL_HINT})")
    profile = page.parent / "profile"
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--mute-audio",
           "--hide-scrollbars", f"--user-data-dir={profile}", *NO_NETWORK, *args, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, encoding="utf-8", errors="replace")


def probe_pages(pages: dict[str, str], scripted: bool = True, timeout: float = 240) -> dict[str, dict]:
    """Measure every page in one Chromium run (see the module docstring)."""
    import re

    with tempfile.TemporaryDirectory(prefix="htmlprobe-") as tmp:
        page = Path(tmp) / "harness.html"
        page.write_text(_HARNESS % {"pages": _json_for_script(pages), "scripted": "true" if scripted else "false"},
                        encoding="utf-8")
        proc = _chromium(["--window-size=820,1000", "--virtual-time-budget=600000", "--dump-dom"], page, timeout)
    m = re.search(r'<pre id="probe-result">(.*?)</pre>', proc.stdout, re.S)
    if not m:
        raise RuntimeError(f"the probe page gave no result (exit {proc.returncode}): {proc.stderr[-2000:]}")
    import html

    return json.loads(html.unescape(m.group(1)))


def screenshot_tiles(pages: dict[str, str], tile: tuple[int, int] = (800, 600), columns: int = 6, timeout: float = 240):
    """{name: the page's first screen (a PIL image tile[0] x tile[1])}, from one screenshot."""
    import html

    from PIL import Image

    names = list(pages)
    rows = (len(names) + columns - 1) // columns
    w, h = tile
    frames = "".join(
        f'<iframe style="position:absolute;left:{(k % columns) * w}px;top:{(k // columns) * h}px;'
        f'width:{w}px;height:{h}px;border:0" scrolling="no" srcdoc="{html.escape(pages[n], quote=True)}"></iframe>'
        for k, n in enumerate(names))
    doc = f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0;background:#fff">{frames}</body></html>'
    with tempfile.TemporaryDirectory(prefix="htmlshot-") as tmp:
        page = Path(tmp) / "gallery.html"
        page.write_text(doc, encoding="utf-8")
        png = Path(tmp) / "shot.png"
        proc = _chromium([f"--window-size={columns * w},{rows * h}", "--virtual-time-budget=20000",
                          f"--screenshot={png}"], page, timeout)
        if not png.is_file():
            raise RuntimeError(f"no screenshot (exit {proc.returncode}): {proc.stderr[-2000:]}")
        shot = Image.open(png).convert("RGB")
        shot.load()
    return {n: shot.crop(((k % columns) * w, (k // columns) * h, (k % columns + 1) * w, (k // columns + 1) * h))
            for k, n in enumerate(names)}
