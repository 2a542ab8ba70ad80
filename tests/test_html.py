"""`--format html` in a real browser: every example, en and zh, with and without JavaScript.

All pages are opened in a few headless Chromium runs (tests/tools/htmlprobe.py: one run with
the pages' scripts, one without, one screenshot; the network is disabled in each). What a
reader meets is checked against the trace: the numbers an entry's computation shows are the
trace's operands and value, and they add up to the shown result. The screenshot of each first
screen is compared with a reference image taken and looked at by hand (tests/golden/html/).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from attntrace import run
from attntrace.grading.checker import check
from attntrace.rendering.html import render_html
from attntrace.teach.examples import example_path, list_examples

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "html"
LANGS = ("en", "zh")
EXAMPLES = [name for name, _ in list_examples()]
RAW_TEX = ("\\frac", "\\begin", "$$", "^{")
CHECK_CASE = ("cross-attention", "cross-attention-kv-from-x.answer.toml")
#: the first screen of each page, as the screenshot test compares it (downscaled, grey)
TILE, SMALL = (800, 600), (200, 150)


@pytest.fixture(scope="module")
def traces():
    return {name: run(name) for name in EXAMPLES}


@pytest.fixture(scope="module")
def pages(traces):
    return {(name, lang): render_html(traces[name], lang=lang) for name in EXAMPLES for lang in LANGS}


@pytest.fixture(scope="module")
def check_page():
    spec, answer = CHECK_CASE
    report = check(spec, example_path(spec).parent / answer)
    from attntrace.grading.htmlreport import check_html

    return report, check_html(report, example_path(spec).parent / answer)


@pytest.fixture(scope="module")
def browser(pages, check_page):
    """The three Chromium runs at once (2 cores: the runs mostly wait on layout)."""
    from htmlprobe import probe_pages, screenshot_tiles

    named = {f"{n}.{l}": h for (n, l), h in pages.items()}
    named["check.en"] = check_page[1]
    with ThreadPoolExecutor(3) as pool:
        js = pool.submit(probe_pages, named, True)
        nojs = pool.submit(probe_pages, {k: v for k, v in named.items() if k != "check.en"}, False)
        shots = pool.submit(screenshot_tiles, {k: v for k, v in named.items() if k != "check.en"}, TILE, 9)
        return {"js": js.result(), "nojs": nojs.result(), "shots": shots.result()}


def _each(browser, scripted):
    recs = browser["js" if scripted else "nojs"]
    for name in EXAMPLES:
        for lang in LANGS:
            rec = recs[f"{name}.{lang}"]
            assert "error" not in rec, f"{name}.{lang}: {rec['error']}"
            yield f"{name}.{lang}", rec


@pytest.mark.parametrize("scripted", [True, False], ids=["js", "nojs"])
def test_no_raw_tex_and_no_merror(browser, scripted):
    bad = []
    for name, rec in _each(browser, scripted):
        raw = [t for t in RAW_TEX if t in rec["text"]]
        if raw or rec["merror"] or rec["tex_errors"]:
            bad.append(f"{name}: raw {raw}, {rec['merror']} merror, {rec['tex_errors']} unconverted spans")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("scripted", [True, False], ids=["js", "nojs"])
def test_nothing_wider_than_the_column(browser, scripted):
    bad = []
    for name, rec in _each(browser, scripted):
        assert rec["column"] == pytest.approx(760, abs=0.5), name
        bad += [f"{name}: <{w['tag']} class={w['cls']!r}> {w['right']:.0f}px past the column: {w['text']!r}"
                for w in rec["too_wide"]]
    assert not bad, "\n".join(bad[:30])


@pytest.mark.parametrize("scripted", [True, False], ids=["js", "nojs"])
def test_no_request_leaves_the_file(browser, pages, scripted):
    for name, rec in _each(browser, scripted):
        assert rec["resources"] == [], f"{name} loaded {rec['resources']}"
        assert rec["links"] == [], f"{name} refers to {rec['links']}"
    for key, html in pages.items():
        assert "content=\"default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\"" in html
        # the only URLs are XML namespace names (never fetched)
        urls = re.findall(r"""([\w:-]+)=["']?(?:https?:)?//""", html)
        assert set(urls) <= {"xmlns"}, (key, set(urls))
        assert "url(" not in html and "@import" not in html, key


def _num(s: str) -> float:
    return {"inf": math.inf, "-inf": -math.inf}.get(s, None) or float(s)


def _step(trace, key):
    sid, _, head = key.partition("@")
    return trace.step(sid, int(head) if head else None)


def _operand(trace, name, head):
    for h in (head, None):
        if trace.has(name, h):
            return np.asarray(trace.step(name, h).value, dtype=float)
        try:
            return np.asarray(trace.operand(name, h).value, dtype=float)
        except KeyError:
            pass
    raise KeyError(name)


def _close(shown: str, true: float, places: int = 4) -> bool:
    x = _num(shown)
    if math.isinf(true) or math.isinf(x):
        return x == true
    return abs(x - true) <= 0.5 * 10 ** -places * (1 + 1e-9) + 1e-12 or abs(x - true) <= 1e-4 * abs(true)


def _check_product(trace, step, click):
    i, j = click["i"] - 1, click["j"] - 1
    left, right = (_operand(trace, n, step.head) for n in step.inputs)
    right = right.T if step.id == "scores" else right
    gen, sub, res = click["lines"]
    assert [l["cls"].split()[-1] for l in click["lines"]] == ["at-general", "at-substituted", "at-result"]
    nums = sub["nums"]
    d = left.shape[1]
    ks = list(range(d)) if d <= 8 else [0, 1, 2, d - 2, d - 1]
    assert len(nums) == 2 * len(ks), (step.key, nums)
    for n, k in enumerate(ks):
        assert _close(nums[2 * n], left[i, k]), (step.key, i, k, nums[2 * n], left[i, k])
        assert _close(nums[2 * n + 1], right[k, j]), (step.key, k, j, nums[2 * n + 1], right[k, j])
    assert _close(res["nums"][0], float(step.value[i, j])), (step.key, res["nums"], step.value[i, j])
    assert res["nums"][0] == click["shown"]  # the clicked entry is the result line's
    if d <= 8:  # the shown terms add up to the shown result, to the rounding shown
        total = sum(_num(nums[2 * n]) * _num(nums[2 * n + 1]) for n in range(d))
        bound = sum(abs(_num(nums[2 * n])) + abs(_num(nums[2 * n + 1])) for n in range(d)) * 0.5e-4 + 0.5e-4 + 1e-9
        assert abs(total - _num(res["nums"][0])) <= bound, (step.key, nums, res)
    assert re.match(rf"^[a-z]", gen["text"]) and "=" in gen["text"]


def _check_softmax(trace, step, click):
    i, j = click["i"] - 1, click["j"] - 1
    row, frac, res = click["lines"][1]["nums"], click["lines"][2]["nums"], click["lines"][3]["nums"]
    exp, total = step.details["exp"][i], step.details["row_sum"][i]
    assert len(row) == len(exp) + 1
    assert all(_close(s, float(x)) for s, x in zip(row, exp)), (step.key, row, exp)
    assert _close(row[-1], float(total))
    scaled = _operand(trace, step.inputs[0], step.head)
    t, m, s, e, s2 = frac
    assert _close(t, float(scaled[i, j])) and _close(m, float(step.details["row_max"][i]))
    assert _close(e, float(exp[j])) and _close(s, float(total)) and s2 == s
    assert _close(res[0], float(step.value[i, j])) and res[0] == click["shown"]
    assert abs(_num(e) / _num(s) - _num(res[0])) <= 1e-3  # e / sum is the shown weight


def test_clicking_an_entry_shows_its_computation_from_the_trace(browser, traces):
    seen = {"product": 0, "softmax": 0}
    for name, rec in _each(browser, True):
        trace = traces[name.rsplit(".", 1)[0]]
        assert rec["js_class"], name
        for ex in rec["explorers"]:
            step = _step(trace, ex["key"])
            assert ex["tabindex"], (name, ex["key"])
            assert ex["cells"] == step.value.shape[0] * step.value.shape[1]
            for click in ex["clicks"] + [{**ex["keyboard"], "shown": None}]:
                assert click["lines"], (name, ex["key"], "nothing shown")
                if click["shown"] is None:  # the keyboard: Enter shows the same lines as a click
                    click["shown"] = click["lines"][-1]["nums"][0]
                kind = "softmax" if step.id == "weights" else "product"
                (_check_softmax if kind == "softmax" else _check_product)(trace, step, click)
                seen[kind] += 1
            # hover: the row of the left matrix and the column of the right one, nothing else
            i, j = ex["hover"]["i"], ex["hover"]["j"]
            cols = step.value.shape[1]
            lhs = ex["hover"]["lhs"]
            assert lhs and {r for r, _ in lhs} == {i}, (name, ex["key"], lhs)
            if ex["hover"]["rhs"] is not None:
                assert {c + 1 for _, c in ex["hover"]["rhs"]} == {j} and len(ex["hover"]["rhs"]) >= 1
            assert ex["after_leave"] == 0
            assert ex["clicks"][-1]["pressed"] == "true"
        if rec["explorers"]:
            assert [c.split()[-1] for c, shown in rec["toggle"] if shown != "none"] == ["at-general"], rec["toggle"]
    assert seen["product"] > 100 and seen["softmax"] > 30, seen


def test_numeric_examples_have_explorers(browser, traces):
    have = {name.rsplit(".", 1)[0] for name, rec in _each(browser, True) if rec["explorers"]}
    for must in ("sentence-4x6", "causal-mask", "multihead-output", "height-weight-raw"):
        assert must in have
    assert {n for n in have if traces[n].mode != "numeric"} == set()


def test_without_javascript_the_page_reads_and_offers_no_controls(browser):
    for name, rec in _each(browser, False):
        assert not rec["js_class"] and not rec["toggle_visible"] and rec["hints_visible"] == 0, name
        assert all(not c["lines"] for ex in rec["explorers"] for c in ex["clicks"]), name
        assert len(rec["text"]) > 300, name


def _small(img):
    """1/4 scale, 16 grey levels (the reference stays small; both sides are quantised alike)."""
    from PIL import Image

    return img.convert("L").resize(SMALL, Image.Resampling.BOX).point(lambda v: (v // 16) * 17)


def test_first_screens_match_the_reference_images(browser, request):
    """Each first screen (800x600) against the reference, at 1/4 scale (anti-aliasing averages
    out; a moved block, a missing matrix or raw TeX does not). Refresh with
    ATTNTRACE_UPDATE_GOLDEN=1 and look at the images before committing them."""
    import os

    from PIL import Image

    names = [f"{n}.{l}" for l in LANGS for n in EXAMPLES]
    cols = 9
    rows = (len(names) + cols - 1) // cols
    sheet = Image.new("L", (cols * SMALL[0], rows * SMALL[1]), 255)
    for k, name in enumerate(names):
        sheet.paste(_small(browser["shots"][name]), ((k % cols) * SMALL[0], (k // cols) * SMALL[1]))
    ref = GOLDEN / "first-screens.png"
    if os.environ.get("ATTNTRACE_UPDATE_GOLDEN"):
        GOLDEN.mkdir(parents=True, exist_ok=True)
        sheet.save(ref, optimize=True, bits=4)
        (GOLDEN / "first-screens.txt").write_text("\n".join(names) + "\n", encoding="utf-8")
    assert (GOLDEN / "first-screens.txt").read_text(encoding="utf-8").split() == names, "examples changed: refresh"
    golden = np.asarray(Image.open(ref).convert("L"), dtype=float)
    now = np.asarray(sheet, dtype=float)
    bad = []
    for k, name in enumerate(names):
        x, y = (k % cols) * SMALL[0], (k // cols) * SMALL[1]
        diff = np.abs(golden[y:y + SMALL[1], x:x + SMALL[0]] - now[y:y + SMALL[1], x:x + SMALL[0]]).mean()
        if diff > 3.0:
            bad.append(f"{name}: mean difference {diff:.2f} / 255")
    assert not bad, "\n".join(bad)


def test_the_screenshot_comparison_catches_a_broken_layout(browser):
    """The threshold is tight enough: the same page 40px lower, or another example, fails it."""
    from PIL import Image

    a = _small(browser["shots"]["sentence-4x6.en"])
    moved = Image.new("RGB", TILE, "white")
    moved.paste(browser["shots"]["sentence-4x6.en"], (0, 40))
    for other in (_small(moved), _small(browser["shots"]["causal-mask.en"])):
        assert np.abs(np.asarray(a, dtype=float) - np.asarray(other, dtype=float)).mean() > 3.0


# ------------------------------------------------------------------------- the check report
_VERDICT_OF = {"correct": "right", "wrong": "wrong", "carried": "carried"}


@pytest.mark.parametrize("verdict", ["right", "carried", "wrong"])
def test_check_report_colours_each_entry_by_its_verdict(browser, check_page, verdict):
    report, html = check_page
    cells = re.findall(r'<div class="at-checked at-status-(\w+)" data-key="([^"]+)">(.*?)</div>\s*(?:<div class="at-diagnosis">|</div>)',
                       html, re.S)
    assert cells
    expected = 0
    for status, key, body in cells:
        s = next(s for s in report.steps if s.key == key)
        assert s.status == status
        listed = {(e.row, e.col) for e in s.wrong_entries}
        shape_differs = s.given_shape != s.expected_shape
        for i, row in enumerate(re.findall(r"<tr>(.*?)</tr>", body, re.S), start=1):
            for j, v in enumerate(re.findall(r'data-verdict="(\w+)"', row), start=1):
                want = _VERDICT_OF[s.status] if (shape_differs or (i, j) in listed) else "right"
                assert v == want, (key, i, j, v, want)
                expected += v == verdict
    rec = browser["js"]["check.en"]
    assert rec["verdicts"][verdict]["n"] == expected > 0
    colours = rec["verdicts"][verdict]["colours"]
    others = {c for v, r in rec["verdicts"].items() if v != verdict for c in r["colours"]}
    assert len(colours) == 1 and colours[0] not in others and colours[0] not in ("rgba(0, 0, 0, 0)", "rgb(255, 255, 255)")


def test_check_report_puts_the_diagnosis_beside_each_wrong_step(check_page):
    report, html = check_page
    for s in report.steps:
        block = re.search(rf'data-key="{re.escape(s.key)}">.*?(?=<div class="at-checked|</section>)', html, re.S).group(0)
        assert ('class="at-diagnosis"' in block) == (s.status == "wrong"), s.key
    assert "<math" in html and "\\frac" not in html.split("</section>")[0]


# ------------------------------------------------------------------------- page and CLI
@pytest.mark.parametrize("lang", LANGS)
def test_page_has_lang_print_style_heatmap_alt_and_collapsible_steps(pages, lang):
    html = pages[("sentence-4x6", lang)]
    assert html.startswith("<!DOCTYPE html>") and f'<html lang="{lang}">' in html
    assert "@media print" in html and "<details open" in html and "<summary>" in html
    svg = re.search(r'<svg role="img" aria-labelledby="([^"]+)"[^>]*>\s*<title id="\1">([^<]+)</title>', html)
    assert svg and ("the → " in svg.group(2) if lang == "en" else "注意力权重" in svg.group(2))
    assert "Noto Serif CJK SC" in html
    assert len(html.encode()) < 300_000


def test_fragment_and_jupyter(traces):
    t = traces["sentence-4x6"]
    frag = render_html(t, fragment=True)
    assert frag.startswith('<div class="attntrace"') and "<html" not in frag and "<script>" in frag
    assert t._repr_html_() == frag


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "attntrace", *args], capture_output=True, text=True, cwd=ROOT)


def test_cli_html_fragment_and_check(tmp_path):
    p = _cli("run", "causal-mask", "--format", "html", "--fragment", "--lang", "zh")
    assert p.returncode == 0 and p.stdout.startswith('<div class="attntrace" lang="zh"')
    p = _cli("run", "causal-mask", "--format", "md", "--fragment")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--fragment needs --format html" in p.stderr
    spec, answer = CHECK_CASE
    out = tmp_path / "c.html"
    p = _cli("check", spec, str(example_path(spec).parent / answer), "--format", "html", "-o", str(out))
    assert p.returncode == 1 and 'data-verdict="wrong"' in out.read_text(encoding="utf-8")


def test_cli_class_report_as_html(tmp_path):
    out = tmp_path / "class.html"
    p = _cli("check", "docs/class-example/problem.toml", "docs/class-example/answers", "--format", "html", "-o", str(out))
    assert p.returncode in (0, 1), p.stderr
    html = out.read_text(encoding="utf-8")
    text = re.sub(r"<math.*?</math>", "", html, flags=re.S)
    text = re.sub(r"<style>.*?</style>|<script>.*?</script>", "", text, flags=re.S)
    assert "<math" in html and "Ada Lovelace" in html and "<details" in html
    assert not [t for t in RAW_TEX if t in re.sub(r"<[^>]+>", "", text)]


def test_user_text_stays_text():
    """A title, description or token holding HTML is shown as text: no element of the user's."""
    spec = {"title": "<script>alert(1)</script> & <img src=x onerror=alert(2)>", "description": "<iframe src=//evil>",
            "X": [[1, 0], [0, 1]], "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [0, 1]], "W_V": [[1, 0], [0, 1]],
            "tokens": ["<b>a</b>", "\"q'"]}
    for lang in LANGS:
        html = render_html(run(spec), lang=lang)
        assert re.findall(r"<script[^>]*>", html) == ["<script>"]  # the page's own
        assert not re.findall(r"<(?:img|iframe|b)\b", html)
        assert "&lt;script&gt;" in html and "onerror" not in re.sub(r"&lt;img[^<]*", "", html)


def test_jupyter_html_shows_an_error_instead_of_raising(monkeypatch):
    from attntrace.rendering import renderer

    t = run({"scores": [[1, 2]], "scale": False})

    def broken(*args, **kwargs):
        raise RuntimeError("template <exploded>")

    monkeypatch.setattr(renderer, "render", broken)
    shown = t._repr_html_()
    assert "could not render" in shown and "template &lt;exploded&gt;" in shown
