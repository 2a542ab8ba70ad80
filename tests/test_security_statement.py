"""The README's security statement of template folders, one test per sentence.

`CLAIMS` lists the sentences (by their start) with the test that checks each; the first test
fails when the README gains, loses or rewords a sentence without its test following, and
the numbers in the sentences are read from the code's constants.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import attntrace
from attntrace.model.errors import BadInput
from attntrace.rendering import jinja_env, sandbox, templatefiles

ROOT = Path(__file__).resolve().parent.parent
CLAIM = ROOT / "examples" / "article_softmax_claim.toml"
ANSWER = ROOT / "examples" / "article_softmax_claim.answer.toml"

CLAIMS = {
    "A template folder can change any layout and any wording": "test_a_folder_overrides_layout_and_wording",
    "A template sees only plain data built for the view": "test_templates_see_plain_data_only",
    "Templates run in Jinja's immutable sandbox": "test_the_immutable_sandbox_refuses",
    "A template cannot read or write files": "test_no_file_is_read_or_written",
    "A template file that is a symbolic link leading out of the folder": "test_bad_template_files_are_refused_unread",
    "Everything a template builds is bounded before it is built": "test_everything_built_is_bounded",
    "A report, and any block a template captures, is at most": "test_output_and_captures_are_bounded",
    "Loops and calls are counted": "test_loops_and_calls_are_counted",
    "Rendering with a template folder from the command line stops after": "test_rendering_stops_after_the_time_limit",
    "Any error in a template of the folder": "test_every_error_is_one_line_with_exit_2",
    "`--figures DIR` cannot inject markup": "test_figures_cannot_inject_markup",
}


def statement() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- security-statement:start -->")[1].split("<!-- security-statement:end -->")[0]
    return [line[2:] for line in block.strip().splitlines()]


def test_each_sentence_of_the_statement_has_its_test():
    sentences = statement()
    assert len(sentences) == len(CLAIMS), sentences
    for sentence, (start, test) in zip(sentences, CLAIMS.items()):
        assert sentence.startswith(start), (sentence, start)
        assert callable(globals()[test])


def test_the_numbers_in_the_statement_are_the_code_limits():
    s = "\n".join(statement())
    for number in (sandbox.MAX_STRING, sandbox.MAX_ITEMS, sandbox.MAX_INT_BITS, sandbox.MAX_RANGE, sandbox.MAX_OUTPUT, sandbox.MAX_STEPS):
        assert f"{number:,}" in s, number
    assert f"a call counting {sandbox.CALL_COST}" in s
    assert templatefiles.MAX_TEMPLATE_BYTES == 1 << 20 and "larger than 1 MiB" in s
    assert f"stops after {jinja_env.TEMPLATE_TIME_LIMIT:g} s" in s


# ----------------------------------------------------------------------------- helpers

@pytest.fixture(scope="module")
def trace():
    return attntrace.run("sentence-4x6")


def folder(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "tpl"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


def error(trace, root: Path) -> str:
    with pytest.raises(BadInput) as info:
        attntrace.render(trace, format="md", template_dir=root)
    return str(info.value)


# ----------------------------------------------------------------------------- one test per claim

def test_a_folder_overrides_layout_and_wording(trace, tmp_path):
    root = folder(tmp_path, {"prose/en.j2": (ROOT / "templates" / "prose" / "en.j2").read_text(encoding="utf-8")
                             .replace("Conventions", "House rules"),
                             "steps/weights.j2": "WEIGHTS OF {{ vm.kind if vm.kind is defined else 'this step' }}\n"})
    text = attntrace.render(trace, format="md", template_dir=root)
    assert "House rules" in text and "Conventions" not in text
    assert "WEIGHTS OF" in text
    assert text != attntrace.render(trace, format="md")


def test_templates_see_plain_data_only(trace, tmp_path):
    """Every value of every context of a report is plain (the guard of every render raises on
    anything else), and the live objects of the issue are out of reach."""
    from attntrace.rendering.plaindata import NotPlain
    from attntrace.rendering.renderer import environment

    with pytest.raises(NotPlain):
        environment().from_string("{{ x }}").render(x=np.zeros(1))
    root = folder(tmp_path, {"md/report.j2": "x\n{{ r.steps[0].value.tofile('x') }}\n",
                             "check/report.md.j2": "x\n{{ report.trace }}\n"})
    assert error(trace, root).startswith("template md/report.j2, line 2: ")
    from attntrace.grading.checker import check, render_report

    with pytest.raises(BadInput, match=r"^template check/report.md.j2, line 2: .*'trace'"):
        render_report(check(CLAIM, ANSWER), format="md", template_dir=root)


@pytest.mark.parametrize("expr, attr", [("r.__class__", "__class__"), ("[].append", "append"), ("{}.update", "update"),
                                         ("'x'.translate", "translate"), ("'x'.encode", "encode"), ("(1).to_bytes", "to_bytes")])
def test_the_immutable_sandbox_refuses(trace, tmp_path, expr, attr):
    root = folder(tmp_path, {"md/report.j2": "x\n{{ %s(1) }}\n" % expr})
    assert re.match(rf"template md/report.j2, line 2: access to attribute '{attr}' of '\w+' object is unsafe", error(trace, root))


def test_no_file_is_read_or_written(trace, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET\n", encoding="utf-8")
    for text in ("{% include '../secret.txt' %}", "{% import '../secret.txt' as s %}", "{% extends '" + str(secret) + "' %}"):
        assert "not found" in error(trace, folder(tmp_path, {"md/report.j2": "x\n" + text + "\n"}))
    pwned = tmp_path / "PWNED"
    for text in ("{{ cycler.__init__.__globals__.os.system('touch %s') }}" % pwned, "{{ r.steps[0].value.tofile('%s') }}" % pwned,
                 "{{ self._TemplateReference__context }}"):
        error(trace, folder(tmp_path, {"md/report.j2": "x\n" + text + "\n"}))
    assert not pwned.exists()


def test_bad_template_files_are_refused_unread(trace, tmp_path):
    (tmp_path / "secret.txt").write_text("TOP-SECRET\n", encoding="utf-8")
    root = tmp_path / "tpl"
    (root / "md").mkdir(parents=True)
    report = root / "md" / "report.j2"
    report.symlink_to(tmp_path / "secret.txt")
    assert "outside the template folder" in error(trace, root)
    report.unlink()
    os.mkfifo(report)
    assert "not a regular file" in error(trace, root)
    report.unlink()
    with open(report, "wb") as fh:
        fh.truncate(templatefiles.MAX_TEMPLATE_BYTES + 1)
    assert "more than a template may have" in error(trace, root)
    report.write_bytes(b"\xff x")
    assert "not UTF-8" in error(trace, root)


@pytest.mark.parametrize("expr", ['"x" * 10**8', '[1] * 10**7', '10 ** 40000', 'range(10**6)', '"{:>99999999}".format(1)',
                                  '"%99999999d" % 1', '"x"|center(99999999)', '"x"|indent(99999999)', '"x y"|wordwrap(1, wrapstring="z" * 9999999)'])
def test_everything_built_is_bounded(trace, tmp_path, expr):
    message = error(trace, folder(tmp_path, {"md/report.j2": "x\n{{ %s }}\n" % expr}))
    assert re.match(r"template md/report.j2, line 2: .* too (large|long|many) for a template", message), message


def test_output_and_captures_are_bounded(trace, tmp_path):
    line = "{% set b = 'x' * 9000000 %}"
    out = line + "{% for i in range(6) %}{{ b }}{% endfor %}\n"
    captured = line + "{% set c %}{% for i in range(6) %}{{ b }}{% endfor %}{% endset %}{{ c|length }}\n"
    for text in (out, captured):
        assert re.match(r"template md/report.j2(, line 1)?: writes more than 50,000,000 characters", error(trace, folder(tmp_path, {"md/report.j2": text})))


def test_loops_and_calls_are_counted(trace, tmp_path):
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}\n"
    calls = "{% for i in range(100000) %}{{ 'x'.upper() }}{% endfor %}\n"  # 100,000 iterations + 100,000 calls of 10
    for text in (loops, calls):
        assert "more than 1,000,000 loop iterations" in error(trace, folder(tmp_path, {"md/report.j2": text}))


def test_rendering_stops_after_the_time_limit(trace, tmp_path, monkeypatch):
    monkeypatch.setattr(jinja_env, "TEMPLATE_TIME_LIMIT", 0.5)
    monkeypatch.setattr(sandbox, "MAX_STEPS", 10 ** 12)
    loops = "x\n{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}\n"
    assert "rendering took longer than 0.5 s" in error(trace, folder(tmp_path, {"md/report.j2": loops}))


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTNTRACE_CACHE_DIR": "off"}
    return subprocess.run([sys.executable, "-m", "attntrace", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_every_error_is_one_line_with_exit_2(tmp_path):
    root = folder(tmp_path, {"md/report.j2": "a\nb\n{{ 'x' * 10**9 }}\n"})
    proc = _cli(["run", "sentence-4x6", "--format", "md", "--template-dir", str(root)], tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert re.fullmatch(r"attntrace: error: template md/report.j2, line 3: a repetition would build [\d,]+ characters.*\n", proc.stderr)


def test_figures_cannot_inject_markup(tmp_path):
    tex = _cli(["run", "sentence-4x6", "--format", "tex", "--figures", "f}\\input{/etc/passwd}%"], tmp_path)
    assert tex.returncode == 2 and "may hold only letters, digits" in tex.stderr
    md = _cli(["run", "sentence-4x6", "--format", "md", "--figures", "g)<script>alert(1)<"], tmp_path)
    assert md.returncode == 0 and "<script>" not in md.stdout and "g%29%3Cscript%3Ealert%281%29%3C/" in md.stdout
