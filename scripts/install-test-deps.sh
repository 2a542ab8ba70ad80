#!/usr/bin/env bash
# Install everything the test suite needs, on a fresh Debian machine (as root) or
# again on one that has it all (then it takes a few seconds). Non-interactive.
#
#   1. LaTeX (xelatex + ctexart with Fandol fonts, amsmath) and pdftoppm   [apt]
#   2. KaTeX and MathJax 4, pinned in package.json / package-lock.json, into ./node_modules [npm]
#   3. torch==2.13.0 (CPU wheel found locally) and this package with .[test], whose
#      extra brings transformers (5.x, CPU-only use: tests/oracles.py builds tiny random
#      models, downloads nothing) next to pytest, hypothesis, ...            [pip]
#   4. Chromium (Debian's package) to measure KaTeX-typeset equations, and a CJK
#      font when fontconfig has none (Chinese text must have real widths)   [apt]
#
# Environment: PYTHON (default: python3, else python) picks the interpreter.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO_ROOT="$(pwd -P)"
PYTHON="${PYTHON:-$(command -v python3 || command -v python)}"
TORCH_VERSION="2.13.0"
export DEBIAN_FRONTEND=noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1

log() { printf '[install-test-deps] %s\n' "$*" >&2; }
now() { date +%s; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo -n "$@"
  else log "need root for: $*"; return 1
  fi
}

APT_UPDATED=0
apt_install() {
  if [ "$APT_UPDATED" -eq 0 ]; then
    as_root apt-get update -q
    APT_UPDATED=1
  fi
  as_root apt-get install -y -q --no-install-recommends "$@"
}

# ---------------------------------------------------------------- 1. LaTeX, poppler
# texlive-xetex pulls texlive-latex-base/-recommended/-extra (amsmath, fontspec);
# texlive-lang-chinese brings ctex + xeCJK + the Fandol fonts that ctexart uses.
latex_ready() {
  command -v xelatex >/dev/null 2>&1 &&
    command -v latexmk >/dev/null 2>&1 &&
    command -v pdftoppm >/dev/null 2>&1 &&
    [ -n "$(kpsewhich ctexart.cls 2>/dev/null)" ] &&
    [ -n "$(kpsewhich amsmath.sty 2>/dev/null)" ]
}
t0=$(now)
if latex_ready; then
  log "LaTeX: xelatex, ctexart.cls, latexmk, pdftoppm present; skipping apt"
else
  log "LaTeX: installing with apt (about 500 MB, 1-2 minutes)"
  apt_install texlive-latex-base texlive-xetex texlive-lang-chinese latexmk poppler-utils
  latex_ready || { log "LaTeX still incomplete after apt-get install"; exit 1; }
  log "LaTeX: done in $(( $(now) - t0 )) s"
fi

# ---------------------------------------------------------------- 2. KaTeX (npm)
t0=$(now)
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  log "node/npm missing: installing Debian's nodejs + npm"
  apt_install nodejs npm
fi
# every package the lock file pins at the top of node_modules (KaTeX; MathJax 4 for the
# compiled Numbas exam in tests/test_numbas.py) must be there at its locked version
npm_ready() {
  node -e '
    const lock = require("./package-lock.json");
    for (const [path, meta] of Object.entries(lock.packages)) {
      if (!path.startsWith("node_modules/") || path.slice(13).includes("node_modules/")) continue;
      let have = "";
      try { have = require("./" + path + "/package.json").version; } catch (e) {}
      if (have !== meta.version) { console.error(path + ": want " + meta.version + ", have " + (have || "none")); process.exit(1); }
    }'
}
if npm_ready; then
  log "npm packages of package-lock.json present in node_modules; skipping npm"
else
  log "npm ci (KaTeX, MathJax)"
  npm ci --no-audit --no-fund --loglevel=error
  npm_ready || { log "node_modules still differs from package-lock.json after npm ci"; exit 1; }
  log "npm: done in $(( $(now) - t0 )) s"
fi

# ---------------------------------------------------------------- 3. Python
t0=$(now)
torch_ready() {
  (cd / && "$PYTHON" -c "import importlib.metadata as md, sys
sys.exit(0 if md.version('torch').split('+')[0] == '$TORCH_VERSION' else 1)") 2>/dev/null
}
if torch_ready; then
  log "torch $TORCH_VERSION present; skipping"
else
  log "torch: pip install torch==$TORCH_VERSION"
  "$PYTHON" -m pip install -q "torch==$TORCH_VERSION"
  log "torch: done in $(( $(now) - t0 )) s"
fi

# Reinstall the package when: it is not installed editable from THIS checkout (CI uses
# a fresh clone elsewhere), pyproject.toml changed since the last install, or a
# requirement of the package or its test extra (transformers included) is not satisfied.
t0=$(now)
stamp_file="$REPO_ROOT/.test-deps.stamp"
stamp="$(sha256sum pyproject.toml | cut -d' ' -f1) $REPO_ROOT $PYTHON"
python_ready() {
  [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] || return 1
  # run from / so that an attntrace.egg-info in the checkout does not shadow the install
  (cd / && "$PYTHON" - "$REPO_ROOT") <<'PY'
import importlib.metadata as md, json, sys, tomllib
from pathlib import Path

root = Path(sys.argv[1])
try:
    dist = md.distribution("attntrace")
    url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
except md.PackageNotFoundError:
    sys.exit(1)
if url.rstrip("/") != root.as_uri():
    sys.exit(1)
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
reqs = project.get("dependencies", []) + project.get("optional-dependencies", {}).get("test", [])
for text in reqs:
    req = Requirement(text)
    if req.marker and not req.marker.evaluate():
        continue
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        sys.exit(1)
    if not req.specifier.contains(version, prereleases=True):
        sys.exit(1)
PY
}
if python_ready; then
  log "attntrace[test] installed editable from $REPO_ROOT; skipping pip"
else
  log "pip install -e '.[test]'"
  "$PYTHON" -m pip install -q -e '.[test]'
  # the oracles need transformers importable next to torch (not merely installed)
  (cd / && "$PYTHON" -c "import torch, transformers; print('transformers', transformers.__version__)") >&2 ||
    { log "transformers does not import after pip install"; exit 1; }
  echo "$stamp" > "$stamp_file"
  log "attntrace[test]: done in $(( $(now) - t0 )) s"
fi

# ---------------------------------------------------------------- 4. Chromium, CJK font
# tests/tools/pagefit.py typesets the Markdown reports' math with KaTeX in headless
# Chromium and measures it. Chinese glyphs need some CJK font known to fontconfig
# (texlive-lang-chinese brings the Arphic TrueType fonts; else fonts-noto-cjk),
# otherwise Chinese text is measured with the widths of missing-glyph boxes.
t0=$(now)
cjk_font_ready() {
  if command -v fc-list >/dev/null 2>&1; then
    [ -n "$(fc-list :lang=zh family 2>/dev/null | head -n 1)" ]
  else  # no fontconfig tools: look for the packages' font files
    compgen -G '/usr/share/fonts/opentype/noto/NotoS*CJK*' >/dev/null ||
      compgen -G '/usr/share/fonts/truetype/arphic*/*.ttf' >/dev/null
  fi
}
want=()
if [ ! -x /usr/bin/chromium ] && ! command -v chromium >/dev/null 2>&1; then
  want+=(chromium)
fi
if ! cjk_font_ready; then
  want+=(fonts-noto-cjk)
fi
if [ "${#want[@]}" -eq 0 ]; then
  log "Chromium and a CJK font present; skipping apt"
else
  log "installing with apt: ${want[*]}"
  apt_install "${want[@]}"
  { [ -x /usr/bin/chromium ] || command -v chromium >/dev/null 2>&1; } ||
    { log "chromium still missing after apt-get install"; exit 1; }
  cjk_font_ready || { log "no CJK font known to fontconfig after apt-get install"; exit 1; }
  log "Chromium/CJK font: done in $(( $(now) - t0 )) s"
fi
