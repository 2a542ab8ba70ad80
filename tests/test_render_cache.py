"""The Jinja environment is built once per template folder and each template compiled once;
an edited (or newly added, or removed) user template is picked up by the next render; the
cross-process bytecode cache never breaks a render and never writes into the package.
No wall times are asserted."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from jinja2.bccache import bc_magic

import attntrace
from attntrace.rendering import jinja_env
from attntrace.rendering.renderer import environment, render, render_step
from attntrace.resources import templates_dir

ROOT = Path(__file__).resolve().parent.parent
TRACE = attntrace.run({"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private bytecode cache folder for the test (not the user's ~/.cache)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("ATTNTRACE_CACHE_DIR", str(root))
    return root / "jinja"


def _count_compiles(env, monkeypatch) -> dict:
    """Count template loads that reach the loader and find a file, and compilations from source.
    (A step's block is the first of steps/<id>.j2, steps/view/<view>.j2, steps/default.j2: the
    names before the one found are looked up, and not found, on every render.)"""
    counts = {"loads": 0, "compiles": 0}
    get_source, compile_ = env.loader.get_source, env.compile

    def counting_get_source(environment, name):
        found = get_source(environment, name)
        counts["loads"] += 1
        return found

    def counting_compile(*args, **kwargs):
        counts["compiles"] += 1
        return compile_(*args, **kwargs)

    monkeypatch.setattr(env.loader, "get_source", counting_get_source)
    monkeypatch.setattr(env, "compile", counting_compile)
    return counts


def test_renders_reuse_one_environment_and_its_compiled_templates(cache, monkeypatch):
    first = {fmt: render(TRACE, format=fmt) for fmt in ("md", "tex", "text")}
    env = environment()
    assert environment() is env and environment(None) is env
    counts = _count_compiles(env, monkeypatch)
    for _ in range(2):
        for fmt in ("md", "tex", "text"):
            assert render(TRACE, format=fmt) == first[fmt]
        assert render_step(TRACE, "weights", format="md").strip()
    assert counts == {"loads": 0, "compiles": 0}


def test_one_render_checks_each_template_file_once(tmp_path, cache, monkeypatch):
    """Jinja checks a cached template's file on every include and import; within one render
    each file is checked once (and the next render checks them all again)."""
    folder = tmp_path / "tpl"
    folder.mkdir()
    render(TRACE, format="md", template_dir=folder)  # every template loaded and cached
    checked = []
    getmtime = os.path.getmtime
    monkeypatch.setattr(os.path, "getmtime", lambda p: checked.append(os.fspath(p)) or getmtime(p))
    for _ in range(2):
        checked.clear()
        render(TRACE, format="md", template_dir=folder)
        assert checked and len(checked) == len(set(checked))


def test_one_environment_per_folder(tmp_path, cache, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    assert environment(mine) is environment(str(mine))
    monkeypatch.chdir(tmp_path)
    assert environment("mine") is environment(mine)  # keyed on the absolute path
    assert environment(mine) is not environment()
    other = tmp_path / "other"
    other.mkdir()
    assert environment(other) is not environment(mine)


def test_an_edited_user_template_is_picked_up(tmp_path, cache):
    folder = tmp_path / "tpl"
    (folder / "steps").mkdir(parents=True)
    path = folder / "steps" / "weights.j2"
    path.write_text("FIRST\n", encoding="utf-8")
    assert render_step(TRACE, "weights", format="md", template_dir=folder).strip() == "FIRST"
    path.write_text("SECOND\n", encoding="utf-8")
    st = path.stat()
    os.utime(path, (st.st_atime, st.st_mtime + 2))  # a later mtime whatever the file system's resolution
    assert render_step(TRACE, "weights", format="md", template_dir=folder).strip() == "SECOND"
    assert "SECOND" in render(TRACE, format="md", template_dir=folder)


def test_a_template_added_to_or_removed_from_the_user_folder(tmp_path, cache):
    folder = tmp_path / "tpl"
    folder.mkdir()
    shipped = render_step(TRACE, "weights", format="md", template_dir=folder)
    assert shipped == render_step(TRACE, "weights", format="md")
    (folder / "steps").mkdir()
    (folder / "steps" / "weights.j2").write_text("MINE\n", encoding="utf-8")
    assert render_step(TRACE, "weights", format="md", template_dir=folder).strip() == "MINE"
    (folder / "steps" / "weights.j2").unlink()
    assert render_step(TRACE, "weights", format="md", template_dir=folder) == shipped


def test_the_bytecode_cache_is_filled_and_reused(tmp_path, cache, monkeypatch):
    expected = render(TRACE, format="md")
    assert cache.is_dir() and any(cache.iterdir())
    assert cache.stat().st_mode & 0o077 == 0  # private to the user
    jinja_env.clear()  # a new environment, as in a new process: templates come from the cache
    env = environment()
    assert env is not None and env.bytecode_cache is not None
    counts = _count_compiles(env, monkeypatch)
    assert render(TRACE, format="md") == expected
    assert counts["compiles"] == 0 and counts["loads"] > 0


@pytest.mark.parametrize("how", ["read-only", "under-a-file", "writable-by-others", "off"])
def test_an_unusable_cache_folder_means_no_cache(tmp_path, monkeypatch, how):
    monkeypatch.setenv("ATTNTRACE_CACHE_DIR", "off")
    expected = render(TRACE, format="md")
    target = tmp_path / "cache"
    if how == "read-only":
        target.mkdir(mode=0o500)
    elif how == "under-a-file":
        (tmp_path / "file").write_text("", encoding="utf-8")
        target = tmp_path / "file" / "cache"
    elif how == "writable-by-others":
        (target / "jinja").mkdir(parents=True)
        (target / "jinja").chmod(0o777)
    monkeypatch.setenv("ATTNTRACE_CACHE_DIR", "off" if how == "off" else str(target))
    try:
        assert render(TRACE, format="md") == expected
        assert render_step(TRACE, "weights", format="tex").strip()
        env = environment()
        if how != "read-only" or os.geteuid() != 0:  # root may write into a read-only folder
            assert env.bytecode_cache is None
    finally:
        if target.is_dir():
            target.chmod(0o700)


def test_cache_failures_after_start_are_silent(tmp_path, cache):
    expected = render(TRACE, format="md")
    for f in cache.iterdir():  # corrupt every entry: right header, garbage after it
        f.write_bytes(bc_magic + b"\x80garbage")
    jinja_env.clear()
    assert render(TRACE, format="md") == expected
    shutil.rmtree(cache)  # the folder vanishes: writing the next compiled template fails
    folder = tmp_path / "tpl"
    (folder / "steps").mkdir(parents=True)
    (folder / "steps" / "weights.j2").write_text("NEW\n", encoding="utf-8")
    assert render_step(TRACE, "weights", format="md", template_dir=folder).strip() == "NEW"


def test_a_truncated_cache_entry_is_compiled_again(cache, monkeypatch):
    expected = render(TRACE, format="md")
    for f in cache.iterdir():  # header and checksum intact, the compiled code cut short
        data = f.read_bytes()
        f.write_bytes(data[: len(data) // 2])
    jinja_env.clear()
    counts = _count_compiles(environment(), monkeypatch)
    assert render(TRACE, format="md") == expected
    assert counts["compiles"] > 0


def test_the_cache_keeps_few_files(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(jinja_env._QuietBytecodeCache, "MAX_FILES", 4)
    render(TRACE, format="md")
    assert 0 < len(list(cache.iterdir())) <= 4


def test_a_new_process_reads_compiled_templates_and_never_writes_into_the_package(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"X": [[1, 0], [0, 1], [1, 1]], "W_Q": [[1, 0], [0, 1]], "W_K": [[0, 1], [1, 0]],
                                "W_V": [[1, 2], [3, 4]]}), encoding="utf-8")
    code = (
        "import sys\n"
        "from attntrace.rendering import renderer\n"
        "env = renderer.environment()\n"
        "calls = []\n"
        "compile_ = env.compile\n"
        "env.compile = lambda *a, **k: calls.append(1) or compile_(*a, **k)\n"
        "from attntrace.cli import main\n"
        f"assert main(['run', {str(spec)!r}, '--format', 'md']) == 0\n"
        "sys.stderr.write(f'COMPILED:{len(calls)}')\n"
    )
    shipped = sorted(p for p in templates_dir().rglob("*"))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               ATTNTRACE_CACHE_DIR=str(tmp_path / "cache"))
    outs, compiled = [], []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(proc.stdout)
        compiled.append(int(proc.stderr.rsplit("COMPILED:", 1)[1]))
    assert outs[0] == outs[1] and "$$" in outs[0]
    assert compiled[0] > 0 and compiled[1] == 0
    assert any((tmp_path / "cache" / "jinja").iterdir())
    assert sorted(p for p in templates_dir().rglob("*")) == shipped
