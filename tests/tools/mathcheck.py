"""Test helpers that hand generated math to real tools: KaTeX, xelatex, pdftoppm.

Import from a test (tests/conftest.py puts this folder on sys.path)::

    from mathcheck import katex_errors, markdown_math_spans, compile_latex, pdf_to_png

- ``katex_errors(spans)``: every (tex, display) span through KaTeX in one node process;
  returns the error messages (``[]`` = every span parsed).
- ``markdown_math_spans(md_text)``: the math spans of a Markdown text, for both
  ``$..$`` / ``$$..$$`` and ``\\(..\\)`` / ``\\[..\\]`` delimiters.
- ``stray_math_delimiters(md_text)``: text that looks like math but was not parsed as math.
- ``compile_latex(source)``: ``(ok, log_tail, pdf_path)`` from xelatex (or pdflatex).
- ``pdf_to_png(pdf, out_png)``: one page as a PNG, to look at or put in the README.
- ``require_tool(name)``: skip the test when a tool is missing, but fail under CI=true.

The tools are installed by ``bash scripts/install-test-deps.sh``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = Path(os.environ.get("KATEX_NODE_MODULES", REPO_ROOT / "node_modules"))
KATEX_SCRIPT = Path(__file__).resolve().parent / "katex_check.js"
INSTALL_HINT = "run: bash scripts/install-test-deps.sh"

Span = tuple[str, bool]  # (tex, display)


class ToolMissing(RuntimeError):
    """A helper needs an external tool that is not installed."""


# --------------------------------------------------------------------------- KaTeX


def katex_check(spans: list[Span]) -> list[dict]:
    """Run every span through KaTeX in one node process.

    Returns one dict per span, in order: ``{"ok", "error", "warnings", "tex", "display"}``.
    Strict-mode warnings are reported but are not errors.
    """
    spans = [(str(tex), bool(display)) for tex, display in spans]
    if not spans:
        return []
    node = shutil.which("node")
    if node is None:
        raise ToolMissing(f"node is not installed ({INSTALL_HINT})")
    if not (NODE_MODULES / "katex" / "package.json").is_file():
        raise ToolMissing(f"katex is not installed in {NODE_MODULES} ({INSTALL_HINT})")
    payload = json.dumps([{"tex": tex, "display": display} for tex, display in spans])
    env = dict(os.environ, KATEX_NODE_MODULES=str(NODE_MODULES))
    proc = subprocess.run(
        [node, str(KATEX_SCRIPT)],
        input=payload,
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=300,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"katex_check.js exited {proc.returncode}: {proc.stderr.strip()}")
    results = json.loads(proc.stdout)["results"]
    if len(results) != len(spans):  # never trust a checker that skipped input
        raise RuntimeError(f"katex_check.js answered {len(results)} of {len(spans)} spans")
    for result, (tex, display) in zip(results, spans):
        result["tex"], result["display"] = tex, display
    return results


def katex_errors(spans: list[Span]) -> list[str]:
    """KaTeX's error messages for the spans that do not parse; ``[]`` when all parse.

    Each message names the span's index, its mode and the start of its TeX.
    """
    errors = []
    for i, result in enumerate(katex_check(spans)):
        if not result["ok"]:
            mode = "display" if result["display"] else "inline"
            tex = result["tex"]
            snippet = tex if len(tex) <= 120 else tex[:117] + "..."
            errors.append(f"span {i} ({mode}) {snippet!r}: {result['error']}")
    return errors


@functools.lru_cache(maxsize=1)
def katex_version() -> str:
    """The installed KaTeX version (from node_modules), or '' when missing."""
    try:
        return json.loads((NODE_MODULES / "katex" / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return ""


# ------------------------------------------------------------------------ Markdown

# token type -> display?
_MATH_TOKENS = {
    "math_inline": False,  # $..$ and \(..\)
    "math_inline_double": True,  # $$..$$ inside a paragraph
    "math_block": True,  # $$..$$ and \[..\] on their own lines
    "math_block_label": True,  # $$..$$ (label)
    "math_block_eqno": True,  # \[..\] (label)
}


@functools.lru_cache(maxsize=1)
def _markdown_parser():
    from markdown_it import MarkdownIt
    from mdit_py_plugins.dollarmath import dollarmath_plugin
    from mdit_py_plugins.texmath import texmath_plugin

    md = MarkdownIt("commonmark", {"html": True})
    md.enable("table")
    md.use(dollarmath_plugin, double_inline=True)
    md.use(texmath_plugin, delimiters="brackets")
    # keep backslash escapes as separate text_special tokens so that
    # stray_math_delimiters can tell an escaped \$ from an unparsed $
    md.core.ruler.disable("text_join")
    return md


def _walk(tokens):
    for token in tokens:
        yield token
        if token.children:
            yield from _walk(token.children)


def markdown_math_spans(md_text: str) -> list[Span]:
    """Every math span of a Markdown text, in document order, as (tex, display).

    Understands ``$..$``, ``$$..$$`` (inline or on its own lines, with an optional
    ``(label)``), ``\\(..\\)`` and ``\\[..\\]`` (on its own lines). Code spans and fences
    are not math. The TeX is returned without its delimiters and stripped.
    """
    spans = []
    for token in _walk(_markdown_parser().parse(md_text)):
        if token.type in _MATH_TOKENS:
            spans.append((token.content.strip(), _MATH_TOKENS[token.type]))
    return spans


def stray_math_delimiters(md_text: str) -> list[str]:
    """Plain-text fragments holding an unescaped ``$``: math that the parser did not see.

    A test can assert this is empty so that broken delimiters cannot hide math from
    KaTeX. (An escaped ``\\$`` is fine; code spans and fences are ignored.)
    """
    stray = []
    for token in _walk(_markdown_parser().parse(md_text)):
        if token.type == "text" and "$" in token.content:
            stray.append(token.content)
    return stray


# --------------------------------------------------------------------------- LaTeX


def compile_latex(
    tex_source: str,
    engine: str = "xelatex",
    workdir: str | os.PathLike | None = None,
    runs: int = 1,
    timeout: float = 180,
) -> tuple[bool, str, Path | None]:
    """Compile a LaTeX document; returns ``(ok, log_tail, pdf_path)``.

    The source is written as ``doc.tex`` into a fresh folder (made inside ``workdir``
    when given, else in the system temp dir; it is left in place so the PDF can be
    used). The engine runs with ``-interaction=nonstopmode -halt-on-error``; ``ok`` means
    exit code 0 and a PDF. ``log_tail`` holds the log's ``!`` error lines (with the
    context lines after them) and its last lines. ``pdf_path`` is None when not ok.
    """
    exe = shutil.which(engine)
    if exe is None:
        raise ToolMissing(f"{engine} is not installed ({INSTALL_HINT})")
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="latex-", dir=workdir))
    (folder / "doc.tex").write_text(tex_source, encoding="utf-8")
    cmd = [exe, "-interaction=nonstopmode", "-halt-on-error", "-file-line-error", "doc.tex"]
    proc = None
    for _ in range(max(1, runs)):
        proc = subprocess.run(
            cmd,
            cwd=folder,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            timeout=timeout,
        )
        if proc.returncode != 0:
            break
    log_path = folder / "doc.log"
    log = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
    log = log or proc.stdout
    pdf = folder / "doc.pdf"
    ok = proc.returncode == 0 and pdf.is_file() and pdf.stat().st_size > 0
    return ok, _log_tail(log), (pdf if ok else None)


_ERROR_LINE = re.compile(r"^(!|\S+\.(tex|sty|cls|def|cfg):\d+: )")


def _log_tail(log: str, tail: int = 25) -> str:
    lines = log.splitlines()
    errors = []
    for i, line in enumerate(lines):
        if _ERROR_LINE.match(line):
            errors.extend(lines[i : i + 3])
    last = lines[-tail:]
    picked = errors + (["..."] if errors else []) + last
    return "\n".join(picked)


def pdf_to_png(pdf: str | os.PathLike, out_png: str | os.PathLike, dpi: int = 110, page: int = 1) -> Path:
    """Render one page of a PDF to ``out_png`` with pdftoppm; returns the PNG path."""
    exe = shutil.which("pdftoppm")
    if exe is None:
        raise ToolMissing(f"pdftoppm is not installed ({INSTALL_HINT})")
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    prefix = out_png.with_suffix("")
    subprocess.run(
        [exe, "-png", "-r", str(dpi), "-f", str(page), "-l", str(page), "-singlefile",
         str(pdf), str(prefix)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    produced = prefix.with_suffix(".png")
    if produced != out_png:
        produced.replace(out_png)
    return out_png


# --------------------------------------------------------------------------- tools


def _has_katex() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed"
    if not katex_version():
        return f"katex is not installed in {NODE_MODULES}"
    return None


def _has_xelatex() -> str | None:
    if shutil.which("xelatex") is None:
        return "xelatex is not installed"
    kpsewhich = shutil.which("kpsewhich")
    found = kpsewhich and subprocess.run(
        [kpsewhich, "ctexart.cls"], capture_output=True, text=True
    ).stdout.strip()
    if not found:
        return "ctexart.cls (texlive-lang-chinese) is not installed"
    return None


def _has_module(name: str) -> str | None:
    import importlib.util

    return None if importlib.util.find_spec(name) else f"python package {name} is not installed"


def _has_program(name: str) -> str | None:
    return None if shutil.which(name) else f"{name} is not installed"


def _has_chromium() -> str | None:
    from pagefit import find_chromium  # same folder; imported late (pagefit imports us)

    return None if find_chromium() else "chromium is not installed"


def _has_page_fonts() -> str | None:
    from pagefit import missing_page_fonts  # same folder; imported late (pagefit imports us)

    missing = missing_page_fonts()
    return f"fontconfig does not know the font(s) {', '.join(missing)}" if missing else None


_TOOLS = {
    "katex": _has_katex,
    "chromium": _has_chromium,
    "page-fonts": _has_page_fonts,
    "node": lambda: _has_program("node"),
    "xelatex": _has_xelatex,
    "pdflatex": lambda: _has_program("pdflatex"),
    "latexmk": lambda: _has_program("latexmk"),
    "pdftoppm": lambda: _has_program("pdftoppm"),
    "torch": lambda: _has_module("torch"),
}


@functools.lru_cache(maxsize=None)
def missing_tool(name: str) -> str | None:
    """Why ``name`` is unusable, or None when it is there. Names: see ``_TOOLS``."""
    if name not in _TOOLS:
        raise ValueError(f"unknown tool {name!r}; known: {', '.join(sorted(_TOOLS))}")
    return _TOOLS[name]()


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def require_tool(name: str) -> None:
    """In a test: skip when tool ``name`` is missing, but fail when CI=true.

    CI must never pass by skipping the checks that matter.
    """
    import pytest

    reason = missing_tool(name)
    if reason is None:
        return
    message = f"{reason} ({INSTALL_HINT})"
    if in_ci():
        pytest.fail(f"required tool missing under CI: {message}", pytrace=False)
    pytest.skip(message)


def require_modules(*names: str, extra: str = "torch,hf") -> None:
    """In a test or fixture: skip when a Python package (torch, transformers) is missing, but
    fail when CI=true, like `require_tool`."""
    import importlib

    import pytest

    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            message = f"{name} is not installed (pip install 'attntrace[{extra}]'; bash scripts/install-test-deps.sh)"
            if in_ci():
                pytest.fail(f"required under CI: {message}", pytrace=False)
            pytest.skip(message)


# --------------------------------------------------------------------------- MathJax

MATHJAX_SCRIPT = Path(__file__).resolve().parent / "mathjax_width.js"


def mathjax_widths(spans: list[Span]) -> list[dict]:
    """Every span typeset by MathJax (SVG output) in one node process: one dict per span,
    ``{"width_ex", "error"}``; the width is in ex of the surrounding text (a page shows it at
    width_ex times its font's ex height)."""
    spans = [(str(tex), bool(display)) for tex, display in spans]
    if not spans:
        return []
    if shutil.which("node") is None:
        raise ToolMissing(f"node is not installed ({INSTALL_HINT})")
    if not (NODE_MODULES / "mathjax" / "package.json").is_file():
        raise ToolMissing(f"mathjax is not installed in {NODE_MODULES} ({INSTALL_HINT})")
    payload = json.dumps([{"tex": tex, "display": display} for tex, display in spans])
    env = dict(os.environ, KATEX_NODE_MODULES=str(NODE_MODULES))
    proc = subprocess.run(["node", str(MATHJAX_SCRIPT)], input=payload, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"mathjax_width.js failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def _has_mathjax() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed"
    return None if (NODE_MODULES / "mathjax" / "package.json").is_file() else f"mathjax is not installed in {NODE_MODULES}"


_TOOLS["mathjax"] = _has_mathjax
