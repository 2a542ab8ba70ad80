"""`pip install .` (a real wheel, not an editable install) gives a working `attntrace` command
that finds its templates and examples from any folder."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_installs_a_working_command(tmp_path):
    wheel_dir = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheel_dir), str(ROOT)],
                   check=True, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    wheel = next(wheel_dir.glob("attntrace-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("attntrace/_templates/") and n.endswith(".j2") for n in names), names
    assert any(n.startswith("attntrace/_examples/") and n.endswith(".toml") for n in names), names
    venv = tmp_path / "venv"
    # system site packages give numpy/sympy/jinja2 without a download; the package itself comes from the wheel
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True, capture_output=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([str(py), "-c", "import attntrace, sys; print(attntrace.__file__)"], capture_output=True, text=True,
                           cwd=elsewhere, env=env, check=True)
    assert str(venv) in where.stdout, "the test must exercise the installed wheel, not the source tree"
    cmd = venv / "bin" / "attntrace"
    proc = subprocess.run([str(cmd), "run", "scaling-dk6", "--format", "md"], capture_output=True, text=True, cwd=elsewhere, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "2.449" in proc.stdout and "$$" in proc.stdout
    listing = subprocess.run([str(cmd), "examples"], capture_output=True, text=True, cwd=elsewhere, env=env, timeout=120)
    assert listing.returncode == 0 and "sentence-4x6" in listing.stdout
    # every template folder ships: the checker's, the worksheets' and their prose
    for sub in ("steps/", "check/", "exercise/prose/", "prose/"):
        assert any(n.startswith(f"attntrace/_templates/{sub}") for n in names), sub
    sheet = subprocess.run([str(cmd), "exercise", "--lang", "zh"], capture_output=True, text=True, cwd=elsewhere, env=env, timeout=120)
    assert sheet.returncode == 0 and "$$" in sheet.stdout, sheet.stderr
