"""`attntrace run` ends its process without the interpreter's teardown (`cli._exit_now`): what it
wrote must still arrive whole, on a pipe, in a file and in a reader that leaves early.

The reference is the same report rendered in this process (`attntrace.render`), so a byte the
fast exit lost would show as a difference.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import attntrace

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict:
    """The child's environment, with buffered standard streams as a user's shell has them (a
    sandbox or CI may set PYTHONUNBUFFERED, under which nothing waits in a buffer to be lost)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONUNBUFFERED", None)
    return env


def _expected(fmt: str, example: str = "sentence-4x6") -> str:
    text = attntrace.render(attntrace.run(example), fmt)
    return text if text.endswith("\n") else text + "\n"


@pytest.mark.parametrize("example", ["sentence-4x6", "eight-heads-shapes"])  # a long report and one that fits a buffer
def test_a_report_on_a_pipe_arrives_whole(example):
    proc = subprocess.run([sys.executable, "-m", "attntrace", "run", example, "--format", "md"],
                          env=_env(), capture_output=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == b""
    assert proc.stdout.decode("utf-8") == _expected("md", example)


def test_a_report_to_a_file_arrives_whole(tmp_path):
    out = tmp_path / "report.tex"
    proc = subprocess.run([sys.executable, "-m", "attntrace", "run", "sentence-4x6", "--format", "tex", "-o", str(out)],
                          env=_env(), capture_output=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout == b"" and proc.stderr == b""
    assert out.read_text(encoding="utf-8") == _expected("tex")


def test_a_reader_that_leaves_early_ends_the_run_quietly():
    """`attntrace run ... | head -c 100`: exit 1, no traceback and no 'Exception ignored' line."""
    run = subprocess.Popen([sys.executable, "-m", "attntrace", "run", "eight-heads-shapes", "--format", "md", "--rows", "all"],
                           env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = run.stdout.read(100)
    run.stdout.close()  # the reader leaves
    err = run.stderr.read()
    code = run.wait(timeout=300)
    assert len(head) == 100
    assert code in (0, 1) and b"Traceback" not in err and b"Exception ignored" not in err, err


def test_an_error_still_exits_2_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "attntrace", "run", "no-such-example"], env=_env(), capture_output=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.decode().count("\n") == 1 and proc.stdout == b""
