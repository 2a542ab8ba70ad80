"""A template folder lays out a report and does nothing else (issue 20 B).

One test per hostile case of the issue (in-process: the error is one line naming the template
and line), the plain-data guard of every render, the template files (symbolic links, FIFOs,
oversized files), the figures path in LaTeX and Markdown, and the CLI's exit status.
The fuzz test of whole template folders is in tests/test_template_fuzz.py; the README's
security statement is checked claim by claim in tests/test_security_statement.py.
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
from attntrace.rendering import sandbox
from attntrace.rendering.plaindata import NotPlain, plain_context

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def trace():
    return attntrace.run("sentence-4x6")


def folder_with(tmp_path: Path, rel: str, text: str) -> Path:
    folder = tmp_path / "tpl"
    (folder / rel).parent.mkdir(parents=True, exist_ok=True)
    (folder / rel).write_text(text, encoding="utf-8")
    return folder


def render_error(trace, folder: Path, fmt: str = "md") -> str:
    with pytest.raises(BadInput) as info:
        attntrace.render(trace, format=fmt, template_dir=folder)
    message = str(info.value)
    assert "\n" not in message
    return message


# ----------------------------------------------------------------------------- sizes and counts

#: (template line, the start of the one-line error after "template md/report.j2, line 2: ")
HOSTILE = [
    pytest.param('{{ "{:>3300000000}".format("x") }}', "str.format would build 3,300,000,", id="format-width"),
    pytest.param('{{ "{:.999999999f}".format(1.0) }}', "str.format would build", id="format-precision"),
    pytest.param('{{ "{:{}}".format(1, 10**9) }}', "a nested {} in a format spec", id="format-nested"),
    pytest.param('{{ "{0:>99999}{0:>99999}".format_map({}) }}', "", id="format-map"),
    pytest.param('{{ "%3300000000s" % "x" }}', "%-formatting would build 3,300,000,", id="percent-width"),
    pytest.param('{{ "%*s" % (10**9, "x") }}', "a * width in %-formatting", id="percent-star"),
    pytest.param('{{ "%3300000000s"|format("x") }}', "%-formatting would build", id="format-filter"),
    pytest.param('{{ "x"|center(3300000000) }}', "|center width 3,300,000,000 is too large", id="center"),
    pytest.param('{{ "x"|indent(3300000000) }}', "|indent width 3,300,000,000 is too large", id="indent"),
    pytest.param('{{ ("x\\n" * 1000000)|indent(100) }}', "|indent would build", id="indent-many-lines"),
    pytest.param('{{ ("x " * 4000000)|wordwrap(1, wrapstring="y" * 100) }}', "|wordwrap would build", id="wordwrap"),
    pytest.param('{{ ("x" * 1000000)|replace("x", "yy" * 10) }}', "replace would build", id="replace-filter"),
    pytest.param('{{ ("x" * 1000000).replace("x", "yy" * 10) }}', "replace would build", id="replace-method"),
    pytest.param('{{ "x".ljust(10**9) }}', "str.ljust width 1,000,000,000", id="ljust"),
    pytest.param('{{ "x" * 10**9 }}', "a repetition would build 1,000,000,000 characters", id="string-repetition"),
    pytest.param('{{ [1, 2] * 10**9 }}', "a repetition of 2,000,000,000 items", id="list-repetition"),
    pytest.param('{% set b = "x" * 9000000 %}{{ b ~ b }}', "joining would build 18,000,000", id="tilde"),
    pytest.param('{% set b = "x" * 9000000 %}{{ b + b }}', "a concatenation would build 18,000,000", id="plus"),
    pytest.param('{% set b = "x" * 1000000 %}{{ [b] * 1000 }}', "writing out this list would take more than", id="list-of-long-strings"),
    pytest.param('{% set b = "x" * 1000000 %}{{ ([b] * 1000)|join }}', "joining would build", id="join"),
    pytest.param('{{ ((10**64)**64)**64 }}', "a power with about", id="power-tower"),
    pytest.param('{{ 2 ** (10**9) }}', "a power with about", id="power"),
    pytest.param('{% set x = 10**20000 %}{{ x * x * x * x }}', "a product of this size", id="product"),
    pytest.param('{{ range(10**9)|list|length }}', "a range of 1,000,000,000 numbers", id="range"),
    pytest.param('{{ [1]|batch(10**9, 0)|list }}', "|batch size 1,000,000,000", id="batch"),
    pytest.param('{{ [1]|slice(10**9)|list }}', "|slice into 1,000,000,000 parts", id="slice"),
    pytest.param('{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}',
                 "more than 1,000,000 loop iterations", id="nested-loops"),
    pytest.param('{% macro r(n) %}{% if n %}{{ r(n - 1) }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(60) }}',
                 "more than 1,000,000 loop iterations", id="exponential-macros"),
    pytest.param('{% for i in range(100000) %}{{ range(100000)|sum }}{% endfor %}', "more than 1,000,000 loop iterations",
                 id="filter-work-in-a-loop"),
    pytest.param('{{ lipsum(10**9) }}', "'lipsum' is undefined", id="lipsum"),
    pytest.param('{{ [1, 2, 3][:1, :1] }}', "this expression cannot be compiled", id="tuple-of-slices"),
    pytest.param('{{ "x".translate({}) }}', "access to attribute 'translate' of 'str' object is unsafe", id="str-translate"),
    pytest.param('{{ (1).to_bytes(10**9, "big") }}', "access to attribute 'to_bytes' of 'int' object is unsafe", id="int-to-bytes"),
    pytest.param('{% set l = [] %}{{ l.append(1) }}', "access to attribute 'append' of 'list' object is unsafe", id="list-append"),
    pytest.param('{{ {}.update({"a": 1}) }}', "access to attribute 'update' of 'dict' object is unsafe", id="dict-update"),
    pytest.param('{{ cycler.__init__.__globals__ }}', "access to attribute '__init__'", id="globals"),
]


@pytest.mark.parametrize("line, message", HOSTILE)
def test_each_hostile_template_line_is_one_line_error(trace, tmp_path, line, message):
    folder = folder_with(tmp_path, "md/report.j2", "x\n" + line + "\n")
    assert render_error(trace, folder).startswith("template md/report.j2, line 2: " + message)


def test_the_limits_leave_room_for_every_shipped_report(monkeypatch):
    """Every example's report, every row expanded, renders within 2% of the step budget
    (measured: the largest, llama-block-tiny, uses 10,531 of 1,000,000)."""
    from attntrace.teach.examples import list_examples

    monkeypatch.setattr(sandbox, "MAX_STEPS", sandbox.MAX_STEPS // 50)
    for name, _ in list_examples():
        attntrace.render(attntrace.run(name), format="md", rows="all")


def test_each_render_has_its_own_budget(trace, tmp_path):
    """Two renders of 600,000 loop iterations each both pass: the budget is per render."""
    folder = folder_with(tmp_path, "md/report.j2", "{% for i in range(600) %}{% for j in range(1000) %}{% endfor %}{% endfor %}ok\n")
    for _ in range(2):
        assert attntrace.render(trace, format="md", template_dir=folder) == "ok\n"


# ----------------------------------------------------------------------------- plain data

def test_every_environment_is_the_immutable_sandbox():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from attntrace.grading.messages import report_environment
    from attntrace.rendering.renderer import environment

    assert isinstance(environment(), ImmutableSandboxedEnvironment)
    assert isinstance(report_environment(None), ImmutableSandboxedEnvironment)


@pytest.mark.parametrize("value", [np.zeros((2, 2)), np.float64(1.0), attntrace.run("sentence-4x6"),
                                   lambda: 1, print, object(), {1.5: "x"}, [np.int64(1)], ("a", {"b": [set()]})],
                         ids=["ndarray", "numpy-scalar", "trace", "lambda", "builtin", "object", "float-key", "nested-numpy", "nested-set"])
def test_plain_context_refuses_live_objects(value):
    with pytest.raises(NotPlain):
        plain_context({"x": value})


def test_plain_context_accepts_plain_data_and_template_macros():
    from attntrace.rendering.renderer import environment

    module = environment().get_template("md/fmt.j2").make_module({"fmt": "md", "lang": "en", "delimiters": "dollars"})
    plain_context({"a": "s", "b": 1, "c": 1.5, "d": True, "e": None, "f": [1, (2, {"g": "h"})], "m": module, "mac": module.h})


def test_every_render_is_guarded():
    """A live object reaching any template is a loud error, not a leak."""
    from attntrace.rendering.renderer import environment

    template = environment().from_string("{{ x }}")
    with pytest.raises(NotPlain, match=r"x: numpy.ndarray is not plain data"):
        template.render(x=np.zeros(2))
    with pytest.raises(NotPlain):
        template.make_module({"x": np.zeros(2)})


def test_a_check_template_cannot_write_a_file_through_the_report(tmp_path):
    """The attack of issue 20: `report.trace.steps[0].value.tofile(...)` from the check report."""
    from attntrace.grading.checker import check, render_report

    target = tmp_path / "evil.pth"
    claim = ROOT / "examples" / "article_softmax_claim.toml"
    answer = ROOT / "examples" / "article_softmax_claim.answer.toml"
    folder = folder_with(tmp_path, "check/report.md.j2",
                         "x\n{{ report.trace.steps[0].value.tofile('%s', sep=',') }}\n" % target)
    with pytest.raises(BadInput, match=r"^template check/report.md.j2, line 2: "):
        render_report(check(claim, answer), format="md", template_dir=folder)
    assert not target.exists()


# ----------------------------------------------------------------------------- template files

def test_a_symlink_out_of_the_folder_is_refused(trace, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-LINE\n", encoding="utf-8")
    folder = tmp_path / "tpl"
    (folder / "md").mkdir(parents=True)
    (folder / "md" / "report.j2").symlink_to(secret)
    message = render_error(trace, folder)
    assert message == "template md/report.j2, line 1: is a symbolic link to a file outside the template folder; refused"


def test_an_include_cannot_leave_the_folder(trace, tmp_path):
    (tmp_path / "secret.txt").write_text("TOP-SECRET-LINE\n", encoding="utf-8")
    folder = folder_with(tmp_path, "md/report.j2", "x\n{% include '../../secret.txt' %}\n")
    assert render_error(trace, folder).startswith("template md/report.j2, line 2: template '../../secret.txt' not found")
    folder = folder_with(tmp_path, "md/report.j2", "x\n{% include '/etc/passwd' %}\n")
    assert "root:" not in render_error(trace, folder)


def test_a_symlink_inside_the_folder_is_followed(trace, tmp_path):
    folder = folder_with(tmp_path, "mine/report.j2", "inside the folder\n")
    (folder / "md").mkdir()
    (folder / "md" / "report.j2").symlink_to(folder / "mine" / "report.j2")
    assert attntrace.render(trace, format="md", template_dir=folder) == "inside the folder\n"


def test_a_folder_symlinked_out_is_refused(trace, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "report.j2").write_text("TOP-SECRET-LINE\n", encoding="utf-8")
    folder = tmp_path / "tpl"
    folder.mkdir()
    (folder / "md").symlink_to(outside)
    assert "outside the template folder" in render_error(trace, folder)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_a_fifo_is_refused_not_waited_on(trace, tmp_path):
    folder = tmp_path / "tpl"
    (folder / "md").mkdir(parents=True)
    os.mkfifo(folder / "md" / "report.j2")
    assert render_error(trace, folder) == "template md/report.j2, line 1: is not a regular file (a FIFO, device or folder); refused"


def test_an_oversized_template_is_refused_unread(trace, tmp_path):
    from attntrace.rendering.templatefiles import MAX_TEMPLATE_BYTES

    folder = tmp_path / "tpl"
    (folder / "md").mkdir(parents=True)
    with open(folder / "md" / "report.j2", "wb") as fh:  # sparse: 1.5 GB that takes no disk
        fh.truncate(1_500_000_000)
    assert render_error(trace, folder).startswith("template md/report.j2, line 1: the file has 1,500,000,000 bytes, more than")
    (folder / "md" / "report.j2").write_bytes(b"x" * (MAX_TEMPLATE_BYTES + 1))
    assert "more than a template may have" in render_error(trace, folder)


def test_a_template_that_is_not_utf8_is_one_line(trace, tmp_path):
    folder = tmp_path / "tpl"
    (folder / "md").mkdir(parents=True)
    (folder / "md" / "report.j2").write_bytes(b"\xff\xfe x")
    assert render_error(trace, folder) == "template md/report.j2, line 1: the file is not UTF-8 text"


# ----------------------------------------------------------------------------- the CLI

def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTNTRACE_CACHE_DIR": "off"}
    return subprocess.run([sys.executable, "-m", "attntrace", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_cli_tuple_of_slices_exits_2_in_one_line(tmp_path):
    folder = folder_with(tmp_path, "md/report.j2", "a\nb\n{{ [1,2,3][:1, :1] }}\n")
    proc = _cli(["run", "sentence-4x6", "--format", "md", "--template-dir", str(folder)], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "attntrace: error: template md/report.j2, line 3: this expression cannot be compiled (invalid syntax)\n"


# ----------------------------------------------------------------------------- figures path

def test_figures_path_cannot_inject_latex(tmp_path):
    proc = _cli(["run", "sentence-4x6", "--format", "tex", "--figures", "f}\\input{/etc/passwd}%"], tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert re.fullmatch(r"attntrace: error: --figures .*: a figure path in LaTeX may hold only letters, digits, spaces "
                        r"and \. _ - / \+, not '.*'\n", proc.stderr), proc.stderr
    assert list(tmp_path.iterdir()) == []  # refused before any folder is made


def test_figures_path_cannot_inject_markdown(tmp_path):
    """The link target is percent-encoded: markdown-it (CommonMark) sees one image whose
    target decodes back to the file, and no HTML at all."""
    from urllib.parse import unquote

    from markdown_it import MarkdownIt

    proc = _cli(["run", "sentence-4x6", "--format", "md", "--figures", "g)<script>alert(1)<"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "<script>" not in proc.stdout
    tokens = MarkdownIt("commonmark").parse(proc.stdout)
    inline = [t for tok in tokens if tok.children for t in tok.children]
    assert not [t for t in tokens + inline if t.type in ("html_block", "html_inline")]
    (image,) = [t for t in inline if t.type == "image"]
    assert (tmp_path / unquote(image.attrs["src"])).is_file(), image.attrs["src"]


def test_latex_figures_path_with_a_space_compiles_and_finds_the_image(tmp_path, xelatex):
    out = tmp_path / "doc.tex"
    tex = attntrace.render(attntrace.run("sentence-4x6"), format="tex", standalone=True, figures=tmp_path / "my figs",
                           output_path=out)
    assert "\\includegraphics[width=0.6\\linewidth]{my figs/" in tex
    ok, log, pdf = xelatex(tex.replace("{my figs/", "{" + str(tmp_path / "my figs") + "/"))
    assert ok, log
    assert "not found" not in log
