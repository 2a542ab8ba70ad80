"""`attntrace check` on the command line: the article's softmax claim, exit codes, and
malformed answer files (one stderr line, exit 2, no traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attntrace.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SPEC = 'title = "t"\nscores = [[0.8, 0.2], [0.3, 0.7]]\nscale = false\n'


def cli(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "attntrace", "check", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd or ROOT, timeout=120, env=env)


def test_article_softmax_claim_exits_1_and_names_skipped_softmax():
    proc = cli(EXAMPLES / "article_softmax_claim.toml", EXAMPLES / "article_softmax_claim.answer.toml")
    assert proc.returncode == 1, proc.stderr
    assert "skipped_softmax" in proc.stdout and "The first wrong step is weights" in proc.stdout
    assert "0.6457" in proc.stdout  # the correct weight it should have been


def test_article_claim_json(capsys):
    code = main(["check", str(EXAMPLES / "article_softmax_claim.toml"), str(EXAMPLES / "article_softmax_claim.answer.toml"),
                 "--format", "json", "--lang", "zh"])
    assert code == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["first_wrong"] == "weights"
    step = report["steps"][0]
    assert step["id"] == "weights" and step["head"] is None and step["status"] == "wrong"
    assert step["diagnosis"]["code"] == "skipped_softmax"
    assert {"row", "col", "expected", "given"} <= set(step["wrong_entries"][0])


def test_correct_answer_exits_0(tmp_path, capsys):
    (tmp_path / "spec.toml").write_text(SPEC, encoding="utf-8")
    (tmp_path / "answer.json").write_text('{"weights": [[0.6457, 0.3543], ["0.401", "0.599"]]}', encoding="utf-8")
    assert main(["check", str(tmp_path / "spec.toml"), str(tmp_path / "answer.json"), "--format", "md"]) == 0
    assert "Every step you gave is correct" in capsys.readouterr().out


# in a subprocess: the real command, its stderr and exit status
BAD = [
    ("ragged rows", "weights = [[0.6, 0.4], [0.5]]\n", "ragged"),
    ("unknown step", "wieghts = [[0.6, 0.4], [0.4, 0.6]]\n", "unknown step 'wieghts'"),
    ("text entry (code)", 'weights = [["__import__(\'os\').system(\'touch PWNED\')", 0.4], [0.4, 0.6]]\n', "row 1, column 1"),
    ("toml syntax", "weights = [[0.6, 0.4], [0.4, 0.6]\n", "TOML syntax error"),
]
# in-process through cli.main (same code path, faster)
BAD_IN_PROCESS = [
    ("text entry", 'weights = [["sixty", 0.4], [0.4, 0.6]]\n', "row 1, column 1"),
    ("not a matrix", 'weights = "0.6 0.4"\n', "list of rows"),
    ("head of single-head problem", "[head.2]\nweights = [[0.6, 0.4], [0.4, 0.6]]\n", "single head"),
]


@pytest.mark.parametrize("text,needle", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_malformed_answer_is_one_line_exit_2(tmp_path, text, needle):
    (tmp_path / "spec.toml").write_text(SPEC, encoding="utf-8")
    (tmp_path / "answer.toml").write_text(text, encoding="utf-8")
    proc = cli("spec.toml", "answer.toml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attntrace: error:"), proc.stderr
    assert needle.lower() in lines[0].lower() and "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("text,needle", [b[1:] for b in BAD_IN_PROCESS], ids=[b[0] for b in BAD_IN_PROCESS])
def test_malformed_answer_in_process(tmp_path, capsys, text, needle):
    (tmp_path / "spec.toml").write_text(SPEC, encoding="utf-8")
    (tmp_path / "answer.toml").write_text(text, encoding="utf-8")
    assert main(["check", str(tmp_path / "spec.toml"), str(tmp_path / "answer.toml")]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("attntrace: error:") and needle.lower() in lines[0].lower()


def test_report_titles_are_escaped_and_localized():
    """User text in a check report is data: no HTML tag in Markdown, no command in LaTeX;
    a spec's title_zh is used for --lang zh."""
    import attntrace
    from attntrace.grading.checker import render_report

    spec = {"scores": [[0.8, 0.2]], "scale": False, "title": "<script>alert(1)</script> \\input{x}", "title_zh": "原文的 softmax 例子"}
    report = attntrace.check(spec, {"weights": [[0.8, 0.2]]})
    md = render_report(report, format="md")
    assert "<script>" not in md and "&lt;script&gt;" in md
    tex = render_report(report, format="tex")
    assert "\\input{x}" not in tex and "\\textbackslash{}input" in tex
    assert "原文的 softmax 例子" in render_report(report, format="md", lang="zh")
