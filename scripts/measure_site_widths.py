"""Measure the Markdown column and the math size of real documentation sites, in headless Chromium.

The `--width sphinx|jupyter|mkdocs` presets (attntrace/rendering/layout.py) say how wide a
site's text column is and how big its MathJax sets one em of TeX. This script builds real
pages with the real tools and measures both in the browser, so the presets come from
measurement rather than from reading CSS:

- Sphinx + MyST (dollarmath, amsmath) with three themes: alabaster (Sphinx's default),
  sphinx_rtd_theme and furo, math by Sphinx's default renderer (MathJax 4, `mathjax_path`
  pointed at the repository's node_modules/mathjax instead of the CDN; its speech and Braille
  are switched off, since their web worker cannot start from file:// and MathJax 4 then never
  finishes: they add no width);
- Jupyter: `jupyter nbconvert --to html` (lab template) of a notebook whose Markdown cell holds
  the report, math by nbconvert's MathJax 2.7 (npm `mathjax@2`, given with --mathjax2);
- MkDocs Material with pymdownx.arithmatex and MathJax 3 (npm `mathjax@3`, --mathjax3), as its
  documentation configures it. The same build counts raw `\\(` in the navigation, the table of
  contents and <title> (issue 22 item 9b), next to a control page whose headings hold math.

Each site also gets a shape-mode report, whose table rows must all come out as <tr> (item 9a).

Every page starts with a probe display `\\hspace{10em}`: its typeset width / 10 is the px per
TeX em there. The column is the width a display equation may take (its container's box). Each
page also holds reports rendered at the site's preset, and the script counts how many of their
display equations are wider than the column in that page.

GitHub cannot be built here: its preset comes from github.com's CSS (see layout.py).

This is a one-off measurement, not part of the test command: it needs packages the tests do
not (install them in a separate virtual environment so the test environment stays as it is):

    python -m venv /tmp/sitevenv
    /tmp/sitevenv/bin/pip install sphinx myst-parser furo sphinx-rtd-theme nbconvert nbformat mkdocs-material
    (cd /tmp/mj2 && npm install mathjax@2) ; (cd /tmp/mj3 && npm install mathjax@3)
    PYTHONPATH=$PWD python scripts/measure_site_widths.py --tools /tmp/sitevenv/bin \\
        --mathjax2 /tmp/mj2/node_modules/mathjax --mathjax3 /tmp/mj3/node_modules/mathjax --out /tmp/sites

It prints one JSON line per page and a summary table. Fonts: the pages get the fonts the
machine has; a theme that ships its font (sphinx_rtd_theme's Lato) is measured in that font,
the others fall back to the machine's sans-serif (the summary names the font in use).
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import attntrace

ROOT = Path(__file__).resolve().parent.parent
MATHJAX4 = ROOT / "node_modules" / "mathjax"
EXAMPLES = ["sentence-4x6", "encoder-block-post-ln", "gqa-4-query-2-kv", "rope-4-tokens-half", "backward-2x2",
            "llama-block-tiny"]
VIEWPORTS = [960, 1024, 1280, 1366, 1440, 1920]
PROBE = "$$\n\\hspace{10em}\n$$\n"

#: Runs in the page once MathJax has typeset it; writes its findings into <pre id="measure">.
MEASURE_JS = r"""
<script>
(function () {
  function measure() {
    try { run(); } catch (e) {
      var pre = document.createElement('pre');
      pre.id = 'measure';
      pre.textContent = JSON.stringify({error: String(e)});
      document.body.appendChild(pre);
    }
  }
  function run() {
    var out = {viewport: window.innerWidth};
    var p = document.querySelector('article p, div.body p, .rst-content p, .jp-RenderedMarkdown p, .md-content p, p');
    var cs = getComputedStyle(p);
    var ex = document.createElement('span');
    ex.style.cssText = 'display:inline-block;width:1px;height:1ex;padding:0;margin:0;border:0';
    p.appendChild(ex);
    out.font_px = parseFloat(cs.fontSize);
    out.ex_px = ex.getBoundingClientRect().height;
    out.font_family = cs.fontFamily;
    p.removeChild(ex);
    out.fonts_loaded = [];
    document.fonts.forEach(function (f) { if (f.status === 'loaded') out.fonts_loaded.push(f.family); });
    out.p_width = p.clientWidth;
    var boxes = document.querySelectorAll('mjx-container[display="true"], .MJXc-display');
    out.displays = [];
    boxes.forEach(function (c) {
      var m = c.querySelector('mjx-math, .mjx-math');
      if (!m) return;
      out.displays.push([Math.round(c.getBoundingClientRect().width * 10) / 10,
                         Math.round(m.getBoundingClientRect().width * 10) / 10]);
    });
    out.errors = document.querySelectorAll('mjx-merror, .mjx-merror, merror').length;
    var pre = document.createElement('pre');
    pre.id = 'measure';
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  var done = false;
  var t = setInterval(function () {
    var MJ = window.MathJax;
    if (done || !MJ) return;
    function later() { document.fonts.ready.then(function () { setTimeout(measure, 500); }); }
    // MathJax 2: after the start-up typeset and the one nbconvert queues behind it
    if (MJ.Hub && MJ.Hub.Register) { done = true; clearInterval(t); MJ.Hub.Register.StartupHook('End', function () { MJ.Hub.Queue(later); }); }
    else if (MJ.startup && MJ.startup.promise) { done = true; clearInterval(t); MJ.startup.promise.then(later); }
  }, 50);
})();
</script>
"""


def report_pages(preset: str | None) -> dict[str, str]:
    """name -> Markdown of a report at the preset (the probe first, after the title)."""
    pages = {}
    for name in EXAMPLES:
        trace = attntrace.run(name)
        for lang in ("en", "zh"):
            md = attntrace.render(trace, format="md", lang=lang, width=preset) if preset else attntrace.render(
                trace, format="md", lang=lang)
            title, rest = md.split("\n", 1)
            pages[f"{name}-{lang}"] = f"{title}\n\n{PROBE}\n{rest}"
    return pages


def inject(html_file: Path) -> None:
    text = html_file.read_text(encoding="utf-8")
    html_file.write_text(text.replace("</body>", MEASURE_JS + "</body>", 1), encoding="utf-8")


def chromium(html_file: Path, viewport: int) -> dict:
    proc = subprocess.run(["chromium", "--headless", "--no-sandbox", "--allow-file-access-from-files",
                           "--disable-gpu", "--virtual-time-budget=60000", f"--window-size={viewport},1000",
                           "--dump-dom", html_file.as_uri()], capture_output=True, text=True, timeout=300)
    m = re.search(r'<pre id="measure">(.*?)</pre>', proc.stdout, re.S)
    if not m:
        raise RuntimeError(f"no measurement from {html_file} (is MathJax reachable?): {proc.stderr[-500:]}")
    data = json.loads(html.unescape(m.group(1)))
    if "error" in data:
        raise RuntimeError(f"measuring {html_file} failed: {data['error']}")
    return data


def summarize(site: str, page: str, data: dict) -> dict:
    """The probe (first display) gives px per em; the rest are the report's displays."""
    (probe_box, probe_w), rest = data["displays"][0], data["displays"][1:]
    over = [w for box, w in rest if w > box + 0.5]
    return {"site": site, "page": page, "viewport": data["viewport"], "column_px": probe_box,
            "p_width": data["p_width"], "font_px": data["font_px"], "ex_px": round(data["ex_px"], 3),
            "x_height": round(data["ex_px"] / data["font_px"], 4), "math_px_per_em": round(probe_w / 10, 3),
            "displays": len(rest), "overflow": len(over), "widest_px": max((w for _, w in rest), default=0),
            "mathjax_errors": data["errors"], "font_family": data["font_family"][:60],
            "fonts_loaded": sorted(set(data["fonts_loaded"]))[:6]}


# ----------------------------------------------------------------------------- Sphinx

SPHINX_CONF = """
project = "attntrace widths"
extensions = ["myst_parser"]
myst_enable_extensions = ["dollarmath", "amsmath"]
html_theme = {theme!r}
mathjax_path = {mathjax!r}
mathjax4_config = {{"loader": {{"paths": {{"fonts": {fonts!r}}}}}, "options": {{"menuOptions": {{"settings": {{
    "speech": False, "braille": False, "enrich": False, "collapsible": False, "assistiveMml": True}}}}}}}}
"""


def build_sphinx(tools: Path, out: Path, theme: str, pages: dict[str, str]) -> Path:
    src = out / f"sphinx-{theme}-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    (src / "conf.py").write_text(SPHINX_CONF.format(theme=theme, mathjax=(MATHJAX4 / "tex-mml-chtml.js").as_uri(),
                                                    fonts=(MATHJAX4.parent / "@mathjax").as_uri()), encoding="utf-8")
    toc = "\n".join(pages)
    (src / "index.md").write_text(f"# Widths\n\n```{{toctree}}\n{toc}\n```\n", encoding="utf-8")
    for name, md in pages.items():
        (src / f"{name}.md").write_text(md, encoding="utf-8")
    built = out / f"sphinx-{theme}"
    subprocess.run([str(tools / "sphinx-build"), "-q", "-b", "html", str(src), str(built)], check=True)
    return built


# ----------------------------------------------------------------------------- Jupyter

def build_jupyter(tools: Path, out: Path, mathjax2: Path, pages: dict[str, str]) -> Path:
    built = out / "jupyter"
    shutil.rmtree(built, ignore_errors=True)
    built.mkdir(parents=True)
    for name, md in pages.items():
        nb = {"cells": [{"id": "report", "cell_type": "markdown", "metadata": {}, "source": md}],
              "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
              "nbformat": 4, "nbformat_minor": 5}
        (built / f"{name}.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    url = (mathjax2 / "MathJax.js").as_uri() + "?config=TeX-AMS_CHTML-full,Safe"
    subprocess.run([str(tools / "jupyter-nbconvert"), "--log-level=ERROR", "--to", "html",
                    f"--HTMLExporter.mathjax_url={url}", *sorted(str(p) for p in built.glob("*.ipynb"))], check=True)
    return built


# ----------------------------------------------------------------------------- MkDocs Material

MKDOCS_YML = """site_name: attntrace widths
theme:
  name: material
markdown_extensions:
  - tables
  - pymdownx.arithmatex:
      generic: true
extra_javascript:
  - javascripts/mathjax.js
  - {mathjax}
"""
#: MkDocs Material's documented MathJax set-up (docs/reference/math.md).
MKDOCS_MATHJAX_JS = """window.MathJax = {
  tex: {inlineMath: [["\\\\(", "\\\\)"]], displayMath: [["\\\\[", "\\\\]"]], processEscapes: true, processEnvironments: true},
  options: {ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex"}
};
"""


def build_mkdocs(tools: Path, out: Path, mathjax3: Path, pages: dict[str, str]) -> Path:
    src = out / "mkdocs-src"
    shutil.rmtree(src, ignore_errors=True)
    (src / "docs" / "javascripts").mkdir(parents=True)
    (src / "mkdocs.yml").write_text(MKDOCS_YML.format(mathjax=(mathjax3 / "es5" / "tex-mml-chtml.js").as_uri()),
                                    encoding="utf-8")
    (src / "docs" / "javascripts" / "mathjax.js").write_text(MKDOCS_MATHJAX_JS, encoding="utf-8")
    (src / "docs" / "index.md").write_text("# Widths\n", encoding="utf-8")
    for name, md in pages.items():
        (src / "docs" / f"{name}.md").write_text(md, encoding="utf-8")
    built = out / "mkdocs"
    subprocess.run([str(tools / "mkdocs"), "build", "-q", "--no-directory-urls", "-f", str(src / "mkdocs.yml"),
                    "-d", str(built)], check=True)
    return built


#: A page whose headings hold math: the control that shows the count below sees raw math.
CONTROL = "# Control $Q$\n\n## Scores $S = Q K^T$\n\nText.\n"


def raw_math_in_mkdocs_headings(html_dir: Path, control: str) -> dict:
    """Issue 22 item 9b: raw `\\(` in <title>, the navigation and the table of contents, summed over
    every page of the site but the control, and on the control page alone (which must show some)."""
    from lxml import html as lhtml

    where = {"title": "//title", "nav": '//nav[contains(@class, "md-nav--primary")]',
             "toc": '//nav[contains(@class, "md-nav--secondary")]'}
    counts = {"pages": {k: 0 for k in where}, "control": {k: 0 for k in where}}
    for page in sorted(html_dir.glob("*.html")):
        doc = lhtml.fromstring(page.read_text(encoding="utf-8"))
        into = counts["control"] if page.stem == control else counts["pages"]
        for key, xpath in where.items():
            into[key] += sum(e.text_content().count("\\(") for e in doc.xpath(xpath))
            if into is counts["pages"]:  # the control's own entry in every page's navigation
                into[key] -= sum(a.text_content().count("\\(") for a in doc.xpath(f'{xpath}//a[contains(@href, "{control}.")]'))
    return counts


def table_rows(html_file: Path, md: str) -> dict:
    """Issue 22 item 9a: every row of the Markdown's tables is a <tr> of the html page, and no
    paragraph of pipes is left over."""
    from lxml import html as lhtml

    doc = lhtml.fromstring(html_file.read_text(encoding="utf-8"))
    md_rows = [ln for ln in md.splitlines() if ln.startswith("|") and not re.match(r"^\|[-|: ]+\|$", ln)]
    pipes = [p.text_content()[:60] for p in doc.iter("p") if p.text_content().lstrip().startswith("|")]
    return {"md_table_rows": len(md_rows), "html_table_rows": len(doc.xpath("//table//tr")), "paragraphs_of_pipes": pipes}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools", type=Path, required=True, help="bin folder with sphinx-build, jupyter-nbconvert, mkdocs")
    ap.add_argument("--mathjax2", type=Path, required=True, help="npm mathjax@2 package folder (nbconvert's MathJax)")
    ap.add_argument("--mathjax3", type=Path, required=True, help="npm mathjax@3 package folder (MkDocs Material's)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sites", default="sphinx,jupyter,mkdocs")
    ap.add_argument("--preset", action="store_true", help="render the reports at each site's preset (else at 760px)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []

    def pages_for(preset):
        return report_pages(preset if args.preset else None)

    def measure(site, html_dir, names, viewports):
        for name in names:
            page = html_dir / f"{name}.html"
            inject(page)
            for vp in viewports:
                row = summarize(site, name, chromium(page, vp))
                rows.append(row)
                print(json.dumps(row, ensure_ascii=False), flush=True)

    sites = args.sites.split(",")
    shape = attntrace.render(attntrace.run("sentence-4x6", mode="shape"), format="md", lang="en")
    if "sphinx" in sites:
        pages = pages_for("sphinx")
        for theme in ("alabaster", "sphinx_rtd_theme", "furo"):
            built = build_sphinx(args.tools, args.out, theme, {**pages, "shape-mode": shape})
            print(json.dumps({"site": f"sphinx/{theme}", "shape_table": table_rows(built / "shape-mode.html", shape)}))
            measure(f"sphinx/{theme}", built, pages, [1440])
            measure(f"sphinx/{theme}", built, list(pages)[:1], [v for v in VIEWPORTS if v != 1440])
    if "jupyter" in sites:
        pages = pages_for("jupyter")
        built = build_jupyter(args.tools, args.out, args.mathjax2, {**pages, "shape-mode": shape})
        print(json.dumps({"site": "jupyter", "shape_table": table_rows(built / "shape-mode.html", shape)}))
        measure("jupyter/nbconvert-lab", built, pages, [1024])
        measure("jupyter/nbconvert-lab", built, list(pages)[:1], [v for v in VIEWPORTS if v != 1024])
    if "mkdocs" in sites:
        pages = pages_for("mkdocs")
        built = build_mkdocs(args.tools, args.out, args.mathjax3, {**pages, "shape-mode": shape, "control": CONTROL})
        print(json.dumps({"site": "mkdocs", "shape_table": table_rows(built / "shape-mode.html", shape),
                          "raw_math_in_headings": raw_math_in_mkdocs_headings(built, "control")}), flush=True)
        measure("mkdocs/material", built, pages, [1440])
        measure("mkdocs/material", built, list(pages)[:1], [v for v in VIEWPORTS if v != 1440])

    (args.out / "measurements.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")
    print("\nsite                      viewport column  font   x-height  px/em  displays overflow")
    by = {}
    for r in rows:
        by.setdefault((r["site"], r["viewport"]), []).append(r)
    for (site, vp), rs in by.items():
        r = rs[0]
        print(f"{site:26} {vp:7} {r['column_px']:7.1f} {r['font_px']:5.1f} {r['x_height']:8.4f} {r['math_px_per_em']:6.2f}"
              f" {sum(x['displays'] for x in rs):8} {sum(x['overflow'] for x in rs):8}")


if __name__ == "__main__":
    sys.exit(main())
