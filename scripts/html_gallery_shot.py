"""Takes docs/img/html-explorer.png: sentence-4x6 as HTML, the explorer of the scores with entry (1, 2)
clicked and hovered (its computation shown, row 1 of Q and column 2 of Kᵀ lit).

    PYTHONPATH=. python scripts/html_gallery_shot.py
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from attntrace import run
from attntrace.rendering.html import render_html

ROOT = Path(__file__).resolve().parent.parent
CLICK = """<script>addEventListener('load', function () {
  var fig = document.querySelector('.at-explorer[id="at-x3"]');
  var cell = fig.querySelector('.at-cell[data-i="1"][data-j="2"]');
  cell.click(); cell.dispatchEvent(new MouseEvent('mouseenter'));
  // the shot shows the explorer from the top of the window: what comes before it is hidden
  document.querySelectorAll('.attntrace > :not(#at-explore):not(style):not(script)').forEach(function (e) { e.style.display = 'none'; });
  document.querySelectorAll('#at-explore > :not(summary)').forEach(function (e) {
    if (!e.contains(fig) && e !== fig && !e.classList.contains('at-toggle')) e.style.display = 'none'; });
});</script>"""


def main() -> int:
    page = render_html(run("sentence-4x6")).replace("</body>", CLICK + "</body>")
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    out = ROOT / "docs" / "img" / "html-explorer.png"
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "page.html"
        f.write_text(page, encoding="utf-8")
        subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp}/p",
                        "--window-size=800,440", "--virtual-time-budget=5000", f"--screenshot={out}", f.as_uri()],
                       check=True, capture_output=True)
    from PIL import Image

    Image.open(out).convert("P", palette=Image.Palette.ADAPTIVE, colors=64).save(out, optimize=True)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
