"""attntrace.check_class: a generated class graded at once.

The class: one multi-head problem with a causal mask; students who got everything right
(rounding at 2, 3 and 4 decimals), one student per mistake code the diagnoser knows (planted by
transforming the correct hand calculation the way tests/test_check.py's sweep does, in head 1
or head 2), students who left steps out, and unreadable files (bad TOML, ragged rows, an empty
file, binary garbage, an unknown step, a JSON syntax error, a name that is not text).

The summary's numbers are checked against a count made here from each file checked on its own
with `attntrace.check` (not from the summary code).
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

import attntrace
from attntrace.teach.classcheck import STATUSES, check_class, parse_weights, render_class
from attntrace.cli import main
from attntrace.grading.diagnose import CATALOGUE, CODES
from attntrace.model.errors import BadInput
from test_grading_sweep import TARGET, problem, simulate

#: The codes the NumPy student of the sweep can plant (the newer kinds' mistakes are planted in
#: tests/test_grading_new_kinds.py, in problems with RoPE, ALiBi, a cache, a window, GQA).
CLASSIC = [c for c in CATALOGUE if c in TARGET]

# Two heads, a causal mask, cross-attention (K and V from X_kv) and h*d_k = d_model = n_kv * 2:
# every catalogued mistake can be made here, and seed 1 makes each one tell itself apart.
SPEC, P = problem(n=3, d_model=6, d_k=3, h=2, causal=True, cross=3, seed=1)


def toml_answer(answer: dict, student: str | None = None) -> str:
    """An answer file as a student writes it: numbers bare (their decimals kept), -inf bare."""
    lines = [] if student is None else [f"student = {json.dumps(student, ensure_ascii=False)}"]
    for key, rows in answer.items():
        body = ", ".join("[" + ", ".join(str(x) for x in row) + "]" for row in rows)
        lines.append(f'{json.dumps(key) if "@" in key else key} = [{body}]')
    return "\n".join(lines) + "\n"


def unknown_mistake(answer: dict) -> dict:
    """Every entry of Q@1 off by a different amount (0.5, 0.7, 0.9, ...): not a slip of a few
    entries, and no catalogued mistake reproduces it."""
    out = {k: [list(r) for r in v] for k, v in answer.items()}
    out["Q@1"] = [[f"{float(x) + 0.5 + 0.2 * (i * len(row) + j):.4f}" for j, x in enumerate(row)] for i, row in enumerate(out["Q@1"])]
    return out


def wrong_shape(answer: dict) -> dict:
    out = dict(answer)
    out["Z@1"] = answer["Z@1"][:-1]  # a row left out
    return out


# (file name, student name or None, answer dict, expected first wrong code or None)
def class_files() -> list[tuple[str, str | None, dict, str | None]]:
    files = []
    for decimals in (2, 3, 4):
        files.append((f"correct-{decimals}dp.toml", f"Correct {decimals}", simulate(P, decimals=decimals), None))
    for i, code in enumerate(CLASSIC):
        head = 1 + i % 2
        files.append((f"mistake-{code}.toml", None, simulate(P, plant=code, plant_head=head), code))
    files.append(("mistake-again-skipped.toml", "Second skipper", simulate(P, plant="skipped_softmax", plant_head=2), "skipped_softmax"))
    files.append(("mistake-unknown.toml", "Unknown", unknown_mistake(simulate(P)), "unknown"))
    files.append(("mistake-wrong_shape.toml", "Shape", wrong_shape(simulate(P)), "wrong_shape"))
    partial = {k: v for k, v in simulate(P).items() if k.startswith(("weights", "Z"))}
    files.append(("partial.toml", "张三", partial, None))  # only the weights and Z: ok, but not full marks
    partial_wrong = {k: v for k, v in simulate(P, plant="missing_scale", plant_head=2).items() if k in ("weights@2", "Z@2", "output")}
    files.append(("partial-wrong.toml", "Left out the scaling step", partial_wrong, "missing_scale"))
    files.append(("long-name.toml", "Maximilian-Alexander_von_Hohenzollern-Sigmaringen_the_third_of_his_name", simulate(P, decimals=2), None))
    files.append(("tex-specials.toml", "O'Brien & Co_ $x$ 100% #1 {a} \\relax ~^", simulate(P, decimals=3), None))
    return files


UNREADABLE = {
    "bad-toml.toml": "weights@1 = [[0.5, 0.5]\n",
    "ragged.toml": '"weights@1" = [[0.5, 0.5], [0.5]]\n',
    "empty.toml": "",
    "garbage.toml": bytes(range(256)) * 4,
    "unknown-step.toml": "wieghts = [[0.5, 0.5], [0.5, 0.5]]\n",
    "syntax.json": '{"student": "J", "weights@1": [[0.5, 0.5]\n',
    "name-not-text.toml": 'student = 3\n"Q@1" = [[1, 2], [3, 4], [5, 6]]\n',
}


@pytest.fixture(scope="module")
def class_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("answers")
    for name, student, answer, _ in class_files():
        (d / name).write_text(toml_answer(answer, student), encoding="utf-8")
    # the same answer once as JSON (numbers as strings, as JSON students may write them)
    (d / "json-student.json").write_text(json.dumps({"student": "Jay Son", **simulate(P, decimals=3)}), encoding="utf-8")
    for name, content in UNREADABLE.items():
        path = d / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content, encoding="utf-8")
    (d / "notes.txt").write_text("not an answer", encoding="utf-8")  # ignored: not .toml/.json
    return d


@pytest.fixture(scope="module")
def report(class_dir):
    return check_class(SPEC, class_dir)


def independent_count(class_dir: Path, weights: dict[str, float] | None = None):
    """Each file checked on its own with attntrace.check; the class counted here by hand."""
    trace = attntrace.run(SPEC)
    keys = [s.key for s in trace.steps]
    w = {k: 1.0 for k in keys}
    for k, v in (weights or {}).items():
        for key in keys:
            if key == k or key.partition("@")[0] == k and "@" not in k:
                w[key] = v
    students = []
    for path in sorted(p for p in class_dir.iterdir() if p.suffix in (".toml", ".json")):
        try:
            rep = attntrace.check(SPEC, path)
        except BadInput as exc:
            students.append({"file": path.name, "unreadable": str(exc)})
            continue
        status = {s.key: s.status for s in rep.steps}
        points = sum(w[k] for k in keys if status.get(k) in ("correct", "carried"))
        codes = []
        for s in rep.steps:
            if s.status == "wrong" and s.diagnosis.code not in codes:
                codes.append(s.diagnosis.code)
        students.append({"file": path.name, "status": status, "points": points, "max": sum(w.values()),
                         "first_wrong": rep.first_wrong, "codes": codes, "ok": rep.ok})
    per_step = {k: dict.fromkeys(STATUSES, 0) for k in keys if w[k] > 0}
    mistakes: dict[str, list[str]] = {}
    for s in students:
        if "unreadable" in s:
            continue
        for k in per_step:
            per_step[k][s["status"].get(k, "missing")] += 1
        for code in s["codes"]:
            mistakes.setdefault(code, []).append(s["file"])
    return students, per_step, mistakes


def test_class_summary_matches_an_independent_count(report, class_dir):
    students, per_step, mistakes = independent_count(class_dir)
    n_files = len(class_files()) + 1 + len(UNREADABLE)
    assert len(report.students) == len(students) == n_files  # notes.txt ignored
    # the answers in file-name order, each as attntrace.check sees it
    assert [s.source for s in report.students] == [s["file"] for s in students]
    for got, want in zip(report.students, students):
        if "unreadable" in want:
            assert not got.readable and got.score is None and got.reason
            assert "\n" not in got.reason
            continue
        assert got.readable and got.report is not None
        assert got.first_wrong == want["first_wrong"] and list(got.codes) == want["codes"] and got.ok == want["ok"]
        assert got.points == want["points"] and got.max_points == want["max"]
        assert got.score == pytest.approx(want["points"] / want["max"])
    d = report.to_dict()
    assert {s["key"]: {k: s[k] for k in STATUSES} for s in d["steps"]} == per_step
    assert report.step_counts() == per_step
    assert {m["code"]: m["count"] for m in d["mistakes"]} == {c: len(f) for c, f in mistakes.items()}
    by_file = {s.source: s.name for s in report.students}
    for m in d["mistakes"]:
        assert m["example"] == by_file[mistakes[m["code"]][0]]  # the first student (by file) who made it
    counts = [m["count"] for m in d["mistakes"]]
    assert counts == sorted(counts, reverse=True)
    assert d["counts"] == {"students": n_files, "ok": sum(s.get("ok", False) for s in students), "unreadable": len(UNREADABLE)}
    assert d["ok"] is False and report.ok is False
    readable = [s for s in students if "unreadable" not in s]
    assert d["mean_score"] == pytest.approx(sum(s["points"] / s["max"] for s in readable) / len(readable))
    # every code of the diagnoser is in this class
    assert set(mistakes) == set(CODES) - (set(CATALOGUE) - set(CLASSIC))


def test_planted_mistakes_are_diagnosed_per_student(report):
    by_file = {s.source: s for s in report.students}
    for name, student, _, code in class_files():
        s = by_file[name]
        assert s.name == (student or Path(name).stem)
        if code is None:
            assert s.ok and s.first_wrong is None, (name, s.statuses)
        else:
            assert s.codes and s.codes[0] == code, (name, s.codes)
    assert by_file["json-student.json"].name == "Jay Son" and by_file["json-student.json"].score == 1
    partial = by_file["partial.toml"]
    assert partial.ok and 0 < partial.score < 1 and "missing" in partial.statuses.values()
    # a carried step earns full credit: missing_scale in head 2 costs exactly one step
    ms = by_file["mistake-missing_scale.toml"]
    assert list(ms.statuses.values()).count("wrong") == 1 and "carried" in ms.statuses.values()
    assert ms.points == ms.max_points - 1
    # unreadable files keep their file name and a one-line reason
    reasons = {s.source: s.reason for s in report.students if not s.readable}
    assert set(reasons) == set(UNREADABLE)
    assert "TOML syntax error" in reasons["bad-toml.toml"] and "ragged" in reasons["ragged.toml"]
    assert "no steps" in reasons["empty.toml"] and "UTF-8" in reasons["garbage.toml"]
    assert "JSON syntax error" in reasons["syntax.json"] and "student must be text" in reasons["name-not-text.toml"]
    assert by_file["name-not-text.toml"].name == "name-not-text"


def test_weights(class_dir):
    weights = {"weights": 3, "weights@1": 2, "Q": 0, "output": 0.5}
    rep = check_class(SPEC, class_dir, weights=weights)
    assert rep.weights["weights@1"] == 2 and rep.weights["weights@2"] == 3 and "Q@1" not in rep.weights
    assert rep.weights["output"] == 0.5 and rep.weights["K@2"] == 1
    students, per_step, _ = independent_count(class_dir, {"weights": 3, "Q": 0, "output": 0.5} | {"weights@1": 2})
    assert rep.step_counts() == per_step
    for got, want in zip(rep.students, students):
        if got.readable:
            assert got.points == pytest.approx(want["points"]) and got.max_points == pytest.approx(want["max"])
    text = rep.render("text")
    assert "Weight" in text and "Q@1" not in text.split("Steps:")[1].split("Most common")[0]
    with pytest.raises(BadInput, match="no step 'nope'"):
        check_class(SPEC, class_dir, weights={"nope": 1})
    with pytest.raises(BadInput, match=">= 0"):
        check_class(SPEC, class_dir, weights={"Q": -1})
    with pytest.raises(BadInput, match="no step to grade"):
        check_class(SPEC, class_dir, weights={k: 0 for k in ("Q", "K", "V", "scores", "scaled", "masked", "weights", "Z", "concat", "output")})
    assert parse_weights("weights=2, Z@2=0.5") == {"weights": 2.0, "Z@2": 0.5}
    with pytest.raises(BadInput, match="step=weight"):
        parse_weights("weights:2")


def test_list_of_answers_and_dicts():
    a = simulate(P)
    rep = check_class(SPEC, [{"student": "A", **a}, a, {"student": "B", "Q@1": [[1]]}])
    assert [s.name for s in rep.students] == ["A", "#2", "B"]
    assert rep.students[0].ok and rep.students[1].ok and rep.students[2].codes == ("wrong_shape",)
    with pytest.raises(BadInput, match="no answers"):
        check_class(SPEC, [])
    with pytest.raises(BadInput):  # a bad problem is an error, not an unreadable answer
        check_class({"X": [[1, 2]]}, [a])


def test_csv_one_row_per_student(report, class_dir):
    rows = list(csv.DictReader(io.StringIO(report.to_csv())))
    assert len(rows) == len(report.students)
    students, _, _ = independent_count(class_dir)
    for row, s, want in zip(rows, report.students, students):
        assert row["file"] == want["file"]
        if "unreadable" in want:
            assert row["status"] == "unreadable" and row["score"] == "" and row["reason"]
        else:
            assert float(row["score"]) == pytest.approx(100 * want["points"] / want["max"], abs=0.01)
            assert row["first_wrong"] == (want["first_wrong"] or "") and row["mistakes"].split() == want["codes"]
            assert all(row[k] == want["status"].get(k, "missing") for k in report.weights)
    assert rows[[s.source for s in report.students].index("tex-specials.toml")]["student"].startswith("O'Brien")


def _md_table(md: str, heading: str) -> list[list[str]]:
    part = md.split(heading, 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in part.splitlines() if line.startswith("| `")]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_rendered_summary_shows_the_counts(report, class_dir, lang):
    _, per_step, mistakes = independent_count(class_dir)
    md = report.render("md", lang=lang)
    rows = _md_table(md, "## 各步骤" if lang == "zh" else "## Steps")
    assert {r[0].strip("`"): dict(zip(STATUSES, map(int, r[1:]))) for r in rows} == per_step
    for code, files in mistakes.items():
        pattern = rf"`{code}`（[^\n]*）：{len(files)} 名" if lang == "zh" else rf"`{code}` \([^\n]*\): {len(files)} student"
        assert re.search(pattern, md), code
    text = report.render("text", lang=lang)
    for s in report.students:
        assert s.name.split()[0] in text
    assert ("无法读取" if lang == "zh" else "unreadable") in text
    if lang == "zh":
        assert "全班汇总" in text and "张三" in text


def test_full_class_report_has_each_students_report(report):
    text = render_class(report, "text")
    for s in report.students:
        assert f"==== {s.name}" in text
    assert text.index("==== Class summary") > text.index("==== Correct 2")
    assert text.count("Check of your hand calculation") == len(report.readable)


def test_markdown_math_parses(report, katex):
    from mathcheck import markdown_math_spans

    spans = []
    for lang in ("en", "zh"):
        spans += markdown_math_spans(render_class(report, "md", lang=lang))
    assert len(spans) > 20
    assert katex(spans) == []


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_tex_summary_compiles_without_overfull_lines(report, class_dir, pagefit_latex, lang):
    weighted = check_class(SPEC, class_dir, weights={"weights": 2.5, "Q": 0}, lang=lang)
    for rep in (report, weighted):
        tex = rep.render("tex", lang=lang, standalone=True)
        result = pagefit_latex(tex)
        assert result.ok, result.error_summary()
        assert result.overfull == [], result.overfull_details()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_tex_full_class_report_compiles(report, xelatex, lang):
    tex = render_class(report, "tex", lang=lang, standalone=True)
    ok, log, _ = xelatex(tex)
    assert ok, log


# -- command line ----------------------------------------------------------------------------
def _write_spec(tmp_path: Path) -> Path:
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(SPEC), encoding="utf-8")
    return path


def test_cli_directory_and_exit_codes(tmp_path, capsys, class_dir):
    spec = _write_spec(tmp_path)
    assert main(["check", str(spec), str(class_dir), "--format", "csv"]) == 1
    out = capsys.readouterr().out
    assert len(list(csv.DictReader(io.StringIO(out)))) == len(list(class_dir.glob("*.toml"))) + len(list(class_dir.glob("*.json")))
    good = tmp_path / "good"
    good.mkdir()
    for i, decimals in enumerate((2, 4)):
        (good / f"s{i}.toml").write_text(toml_answer(simulate(P, decimals=decimals), f"S{i}"), encoding="utf-8")
    assert main(["check", str(spec), str(good)]) == 0
    out = capsys.readouterr().out
    assert "==== S0" in out and "==== S1" in out and "Class summary" in out
    assert main(["check", str(spec), str(good), "--summary-only", "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert "Check of your hand calculation" not in out and "# Class summary" in out
    assert main(["check", str(spec), str(good / "s0.toml"), str(good / "s1.toml"), "--format", "json"]) == 0
    assert [s["student"] for s in json.loads(capsys.readouterr().out)["students"]] == ["S0", "S1"]
    # one unreadable file among good ones: exit 1, the others still graded
    (good / "zz.toml").write_text("oops = [", encoding="utf-8")
    assert main(["check", str(spec), str(good), "--format", "csv"]) == 1
    assert [r["status"] for r in csv.DictReader(io.StringIO(capsys.readouterr().out))] == ["ok", "ok", "unreadable"]
    assert main(["check", str(spec), str(good), "--weights", "weights=2"]) == 1
    capsys.readouterr()
    # a bad spec, bad arguments, an empty folder: exit 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["check", str(spec), str(empty)]) == 2
    (tmp_path / "bad.toml").write_text("X = [[1, 2]]\n", encoding="utf-8")
    assert main(["check", str(tmp_path / "bad.toml"), str(good)]) == 2
    assert main(["check", str(spec), str(good), "--weights", "nope=1"]) == 2
    assert main(["check", str(spec), str(good), "--format", "csv", "--weights", "weights:2"]) == 2
    err = capsys.readouterr().err
    assert err.count("attntrace: error:") == 4


def test_cli_one_answer_unchanged(tmp_path, capsys):
    """With one answer file, `check` is the single check: same output, same exit codes."""
    from attntrace.grading.checker import check, render_report

    spec = _write_spec(tmp_path)
    answer = tmp_path / "a.toml"
    answer.write_text(toml_answer(simulate(P, plant="column_softmax", plant_head=1), "Alice"), encoding="utf-8")
    assert main(["check", str(spec), str(answer)]) == 1
    assert capsys.readouterr().out == render_report(check(spec, answer), "text")
    answer.write_text("oops = [", encoding="utf-8")
    assert main(["check", str(spec), str(answer)]) == 2  # a single bad answer stays an error
    # csv and --summary-only make one file a class of one
    assert main(["check", str(spec), str(answer), "--format", "csv"]) == 1
    assert [r["status"] for r in csv.DictReader(io.StringIO(capsys.readouterr().out))] == ["unreadable"]


def test_readme_class_summary_is_real_output():
    """README, Teachers: the class summary shown is what the command prints today."""
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    shown = readme.split("docs/class-example/answers/ --summary-only`", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    example = root / "docs" / "class-example"
    real = check_class(example / "problem.toml", example / "answers").render("text")
    assert real.startswith(shown), (shown, real)
    assert main(["check", str(example / "problem.toml"), str(example / "answers"), "--summary-only", "--format", "csv"]) == 1
