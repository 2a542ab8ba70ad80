"""The Numbas export (`attntrace exercise --format numbas`), checked by Numbas itself.

- The .exam validates against Numbas's exam schema (../shared/lms-schemas/numbas/exam_schema.10.0.json).
- Numbas's own compiler (bin/numbas.py from the archive beside it) builds a standalone exam.
- Headless Chromium runs that exam with Numbas's runtime; tests/tools/numbas_harness.js types
  answers into the parts and reads back each part's score. The answers come from an independent
  NumPy reference of a student who rounds every step to 4 decimals and goes on from the
  rounded values: the key gets full marks; a wrong Q with consistent later steps loses the
  marks of Q only (error carried forward through Numbas's variableReplacements); a slip in
  one step loses that step's marks only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

import attntrace
from attntrace.model.errors import BadInput, Unsupported
from attntrace.teach import lms, numbas
from mathcheck import in_ci, require_modules, require_tool

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "lms-schemas" / "numbas"
SCHEMA = SHARED / "exam_schema.10.0.json"
ARCHIVE = SHARED / "Numbas-8f449f5.tar.gz"
MATHJAX = Path(os.environ.get("KATEX_NODE_MODULES", ROOT / "node_modules")) / "mathjax"
HARNESS = Path(__file__).resolve().parent / "tools" / "numbas_harness.js"


def _require(path: Path, what: str) -> None:
    if path.exists():
        return
    message = f"{what} is missing: {path} (bash scripts/install-test-deps.sh)"
    if in_ci():
        pytest.fail(f"required under CI: {message}", pytrace=False)
    pytest.skip(message)


def _exam_json(text: str) -> dict:
    first, rest = text.split("\n", 1)
    assert first == numbas.HEADER
    return json.loads(rest)


# --------------------------------------------------------------------------- a student, in NumPy


def _softmax(t: np.ndarray) -> np.ndarray:
    e = np.exp(t - t.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def student_answers(spec: dict, slips: dict | None = None) -> dict[str, np.ndarray]:
    """Every step as a student computes it: rounded to 4 decimals, the next step from the rounded
    value. `slips` maps a step key to a function that changes the student's value there."""
    slips = slips or {}
    heads = spec.get("num_heads", 1)
    x = np.array(spec["X"], dtype=float)
    out: dict[str, np.ndarray] = {}

    def keep(key, value):
        value = np.round(value, 4)
        if key in slips:
            value = np.round(slips[key](value), 4)
        out[key] = value
        return value

    zs = []
    for h in range(1, heads + 1):
        tag = f"@{h}" if heads > 1 else ""
        blocks = {}
        for name in "QKV":
            w = np.array(spec["W_" + name], dtype=float)
            width = w.shape[1] // heads
            blocks[name] = keep(name + tag, x @ w[:, (h - 1) * width: h * width])
        d_k = blocks["Q"].shape[1]
        s = keep("scores" + tag, blocks["Q"] @ blocks["K"].T)
        t = keep("scaled" + tag, s / np.sqrt(d_k))
        a = keep("weights" + tag, _softmax(t))
        zs.append(keep("Z" + tag, a @ blocks["V"]))
    if heads > 1:
        c = keep("concat", np.hstack(zs))
        keep("output", c @ np.array(spec["W_O"], dtype=float))
    return out


def _typed(matrix: np.ndarray) -> list[list[str]]:
    return [[f"{v:.4f}" for v in row] for row in matrix]


# --------------------------------------------------------------------------- schema


@pytest.mark.parametrize("heads,d,seed", [(1, 4, 3), (2, 4, 7), (2, 8, 11)])
def test_exam_validates_against_numbas_schema(heads, d, seed):
    require_modules("jsonschema", extra="test")
    import jsonschema

    _require(SCHEMA, "Numbas's exam schema")
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    variants = lms.make_variants(n=2, d=d, heads=heads, seed=seed, variants=2)
    exam = _exam_json(numbas.exam_text(variants, lang="en"))
    jsonschema.Draft202012Validator(schema).validate(exam)
    # the schema can fail: a part with an unknown type is refused
    broken = json.loads(json.dumps(exam))
    broken["question_groups"][0]["questions"][0]["parts"][0]["type"] = 7
    assert not jsonschema.Draft202012Validator(schema).is_valid(broken)
    question = exam["question_groups"][0]["questions"][0]
    assert [p["customName"] for p in question["parts"]] == [s.key for s in variants[0].trace.steps]


def test_later_parts_name_the_parts_they_read():
    variants = lms.make_variants(n=2, d=4, heads=2, seed=7)
    parts = _exam_json(numbas.exam_text(variants))["question_groups"][0]["questions"][0]["parts"]
    by_name = {p["customName"]: i for i, p in enumerate(parts)}
    reads = {p["customName"]: sorted(parts[int(r["part"][1:])]["customName"] for r in p["variableReplacements"])
             for p in parts}
    assert reads["scores@1"] == ["K@1", "Q@1"]
    assert reads["weights@2"] == ["scaled@2"]
    assert reads["Z@2"] == ["V@2", "weights@2"]
    assert reads["concat"] == ["Z@1", "Z@2"]
    assert reads["output"] == ["concat"]
    assert reads["Q@1"] == []
    assert by_name["output"] == len(parts) - 1


def test_zh_prose_and_hostile_title_escaped():
    variants = lms.make_variants(n=2, d=4, heads=1, seed=5)
    text = numbas.exam_text(variants, lang="zh")
    exam = _exam_json(text)
    assert "第" in exam["question_groups"][0]["questions"][0]["parts"][0]["prompt"]


# --------------------------------------------------------------------------- compiled, in Chromium


@pytest.fixture(scope="module")
def numbas_compiler(tmp_path_factory):
    require_tool("chromium")
    require_modules("html5lib", extra="test")
    _require(ARCHIVE, "Numbas's source archive")
    _require(MATHJAX / "tex-svg.js", "MathJax 4 (npm mathjax)")
    where = tmp_path_factory.mktemp("numbas-src")
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(where, filter="data")
    return next(where.glob("*/bin/numbas.py")).parent.parent


def _compile(compiler: Path, exam_text: str, out: Path) -> Path:
    source = out.with_suffix(".exam")
    source.write_text(exam_text, encoding="utf-8")
    proc = subprocess.run([sys.executable, "bin/numbas.py", "-c", "-o", str(out),
                           f"--mathjax-4-url={MATHJAX.as_uri()}", str(source)],
                          cwd=compiler, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "index.html").exists()
    return out


def _scores(exam_dir: Path, answers: list) -> list[list[list[float]]]:
    """[question][part] -> [score, marks] after typing `answers` into the compiled exam, in a
    fresh browser profile (Numbas keeps an attempt in the browser's storage and would resume it)."""
    import tempfile

    from pagefit import find_chromium

    profile = tempfile.mkdtemp(prefix="numbas-profile-")

    page = (exam_dir / "index.html").read_text(encoding="utf-8")
    inject = (f"<script>window.ATTNTRACE_DEBUG = {json.dumps(int(os.environ.get('NUMBAS_DEBUG') or 0))}; window.ATTNTRACE_ANSWERS = {json.dumps(answers)};</script>"
              f"<script>{HARNESS.read_text(encoding='utf-8')}</script></body>")
    test_page = exam_dir / "attntrace-test.html"
    test_page.write_text(page.replace("</body>", inject, 1), encoding="utf-8")
    cmd = [find_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-extensions", f"--user-data-dir={profile}", "--allow-file-access-from-files",
           "--virtual-time-budget=30000", "--dump-dom", test_page.as_uri()]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    found = re.search(r'<pre id="attntrace-result">(.*?)</pre>', proc.stdout, re.S)
    assert found, proc.stderr[-2000:]
    import html

    result = json.loads(html.unescape(found.group(1)))
    assert "scores" in result, result
    return result["scores"]


# (4, 4, 0): d_k = 1, so the scaled scores are whole numbers, typed exactly, and the weights'
# tolerance has no slack for rounded inputs; the concatenation's formula elides heads 3 of 4
@pytest.mark.parametrize("heads,d,seed", [(1, 4, 3), (2, 4, 7), (4, 4, 0)])
def test_compiled_exam_marks_key_and_carried_forward(numbas_compiler, tmp_path, heads, d, seed):
    """One exam whose four questions are the same exercise, answered by four students."""
    variants = lms.make_variants(n=2, d=d, heads=heads, seed=seed)
    spec, trace = variants[0].spec, variants[0].trace
    keys = [s.key for s in trace.steps]
    tag = "@1" if heads > 1 else ""

    def wrong_q(q):  # a slip in Q: one entry off by 1
        q = q.copy()
        q[0, 0] += 1
        return q

    def wrong_scores(s):
        s = s.copy()
        s[1, 0] += 2
        return s

    def z_from_nowhere(z):  # follows from nothing the student wrote; later steps go on from it
        return z + 0.01

    worlds = {
        "key": student_answers(spec),
        "wrong Q, the rest from it": student_answers(spec, {"Q" + tag: wrong_q}),
        "wrong scores, the rest from them": student_answers(spec, {"scores" + tag: wrong_scores}),
        "a Z from nowhere": student_answers(spec, {"Z" + tag: z_from_nowhere}),
    }
    exam_dir = _compile(numbas_compiler, numbas.exam_text(variants * len(worlds)), tmp_path / "exam")
    answers = [[i, [_typed(world[k]) for k in keys]] for i, world in enumerate(worlds.values())]
    results = {name: dict(zip(keys, scores)) for name, scores in zip(worlds, _scores(exam_dir, answers))}

    full = results["key"]
    assert all(score == marks for score, marks in full.values()), full

    carried = results["wrong Q, the rest from it"]
    assert carried["Q" + tag][0] < carried["Q" + tag][1]
    assert all(carried[k][0] == carried[k][1] for k in keys if k != "Q" + tag), carried

    slip = results["wrong scores, the rest from them"]
    assert slip["scores" + tag][0] < slip["scores" + tag][1]
    assert all(slip[k][0] == slip[k][1] for k in keys if k != "scores" + tag), slip

    # carried forward is not "anything goes": a Z that does not follow from the student's own
    # A and V loses its marks, and only those
    nowhere = results["a Z from nowhere"]
    assert nowhere["Z" + tag][0] == 0
    assert all(nowhere[k][0] == nowhere[k][1] for k in keys if k != "Z" + tag), nowhere


def test_jme_prints_the_formula_trees():
    """The JME printer is one more back end of the trees: products, transposes, a division by
    a number, the softmax, a concatenation whose elided heads are written out."""
    from attntrace.model import formula as F
    from attntrace.teach import jme

    q, k, z = F.sym("Q").head(1), F.sym("K").head(1), F.sym("Z")
    names = {q: "Q1", k: "K1", F.sym("d", "k"): "2"}
    assert jme.jme(q * k.T(), names) == "Q1 * transpose(K1)"
    assert jme.jme(F.sym("S") / F.Sqrt(F.sym("d", "k")), {F.sym("S"): "S", F.sym("d", "k"): "4"}) == "S / sqrt(4)"
    heads = F.Seq((z.head(1), z.head(2), F.Dots(), z.head(4)))
    concat = F.Func("Concat", (heads,))
    assert jme.jme(concat, {z.head(h): f"Z{h}" for h in range(1, 5)}) == (
        "combine_horizontally(combine_horizontally(combine_horizontally(Z1, Z2), Z3), Z4)")
    assert [jme.variable_name(x) for x in (q, F.sym("W", "Q").head(2), F.sym("W", "O"), z)] == ["Q1", "WQ2", "WO", "Z"]
    with pytest.raises(Unsupported):  # a sum: a bias added row by row has no JME form here
        jme.jme(q + k, names)
    with pytest.raises(Unsupported):  # a symbol the question has no variable for
        jme.jme(q * F.sym("V"), names)


def test_a_step_without_a_jme_formula_is_refused_in_one_line():
    variant = lms.make_variants(n=2, d=4, heads=1, seed=7)[0]
    spec = dict(variant.spec, mask="causal")
    masked = lms.Variant(variant.seed, spec, attntrace.run(spec))
    with pytest.raises(BadInput, match=r"^a Numbas exam has no part for step 'masked'$"):
        numbas.exam_text([masked])
