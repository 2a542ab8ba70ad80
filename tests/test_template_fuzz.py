"""Fuzz test of template folders (issue 20 B): generated hostile folders, each run by the CLI
in a subprocess limited to 1 GB of address space and 10 s of CPU.

A fixed-seed generator (deterministic, in CI and out) builds each folder from 1-3 hostile
pieces: templates that build huge strings, lists and numbers, loop and recurse, probe
attributes for a way out, include files outside the folder, or are symbolic links, FIFOs,
sparse giants, invalid UTF-8 or invalid syntax. Next to each folder lies a secret file with a
random marker. Every case must: end by itself (no CPU-limit kill, no hang) with exit status
0, 1 or 2; print at most one line on stderr and no traceback; never show the secret (or
/etc/passwd) in any output; and create no file except its own report under `out/`.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

resource = pytest.importorskip("resource")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MEMORY_LIMIT = 1024 ** 3  # 1 GB of address space
CPU_SECONDS = 10
HANG_GUARD = 300  # seconds of wall time: only a blocked process (a FIFO read) gets near it
SEED = 20
WORKERS = 3

#: Pieces of template text; `{secret}`, `{case}` are filled in per case.
SIZE = [
    '{{ "{:>3300000000}".format("x") }}', '{{ "%3300000000s" % "x" }}', '{{ "x"|center(3300000000) }}',
    '{{ "x"|indent(3300000000) }}', '{{ ("x\\n" * 999999)|indent(999) }}', '{{ ("x " * 5000000)|wordwrap(1, wrapstring="w" * 99) }}',
    '{{ "x" * 10**9 }}', '{{ [0] * 10**9 }}', '{{ ((10**64)**64)**64 }}', '{{ 7 ** (10**8) }}', '{{ range(10**9)|list }}',
    '{% set b = "x" * 9999999 %}{{ b ~ b }}', '{% set b = "x" * 9999999 %}{{ [b] * 999 }}', '{% set b = "x" * 999999 %}{{ ([b] * 999)|join }}',
    '{% set ns = namespace(s="xy") %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}',
    '{% set ns = namespace(s=[1]) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}',
    '{% set ns = namespace(s="x") %}{% for i in range(64) %}{% set ns.s = "%s%s" % (ns.s, ns.s) %}{% endfor %}{{ ns.s|length }}',
    '{% set ns = namespace(s="x") %}{% for i in range(64) %}{% set ns.s = "{0}{0}".format(ns.s) %}{% endfor %}{{ ns.s|length }}',
    '{% set ns = namespace(s="ab") %}{% for i in range(64) %}{% set ns.s = ns.s.replace("a", "aa") %}{% endfor %}{{ ns.s|length }}',
    '{% set l = [1] %}{% for i in range(40) %}{% set l = [l, l] %}{% endfor %}{{ l }}', '{{ [1]|batch(10**9, 0)|list }}',
    '{{ "{:.999999999f}".format(1.0) }}', '{{ "x".zfill(10**9) }}', '{{ "\\t".expandtabs(10**9) }}', '{{ "%.999999999f" % 1.0 }}',
]
LOOPS = [
    '{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}',
    '{% for i in range(99999) %}{% for j in range(99999) %}{{ i }}{% endfor %}{% endfor %}',
    '{% macro r(n) %}{% if n %}{{ r(n - 1) }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(64) }}',
    '{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}',
    '{% for x in [[1]] recursive %}{{ loop(x * 2) }}{% endfor %}',
    '{% for i in range(100000) %}{{ range(100000)|sum }}{% endfor %}',
    '{% for i in range(100000) %}{{ range(100000)|join(",")|length }}{% endfor %}',
]
ESCAPES = [
    '{{ r.__class__ }}', '{{ f.__dict__ }}', '{{ self.__init__.__globals__ }}', '{{ cycler.__init__.__globals__.os.system("touch PWNED") }}',
    '{{ namespace.__init__.__globals__ }}', '{{ r.steps[0].value.tofile("PWNED") }}', '{{ "".__class__.__mro__[1].__subclasses__() }}',
    '{{ joiner.__call__.__globals__ }}', '{{ range.__self__ }}', '{{ r|attr("__class__") }}', '{{ "{0.__class__}".format(r) }}',
    '{{ "{0.__init__.__globals__}".format(cycler) }}', '{{ (r.title|attr("format"))("{0.__class__}") }}', '{{ lipsum.__globals__ }}',
    '{{ f.h.__call__.__globals__ }}', '{{ p.__loader__ }}', '{% set x = r.update({"a": 1}) %}', '{{ r.items().mapping }}',
    '{{ dict.__base__.__subclasses__() }}', '{{ "x".translate({120: "y" * 99}) }}', '{{ "x".encode("utf-8") }}',
    '{{ (1).to_bytes(10**9, "big") }}', '{{ "%s" % r.__class__ }}', '{% set g = cycler(1).__class__ %}{{ g }}',
]
FILES_TEXT = [
    "{% include '../secret.txt' %}", "{% include '{secret}' %}", "{% import '../../secret.txt' as s %}{{ s }}",
    "{% extends '../secret.txt' %}", "{% include '/etc/passwd' %}", "{% include ['../secret.txt', 'md/fmt.j2'] %}",
]
SYNTAX = [
    "{{ [1,2,3][:1, :1] }}", "{% if %}", "{{ }}", "{% for %}", "{{ 1 + }}", "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
    "{{ " + "[" * 5000 + "]" * 5000 + " }}", "{% raw %}", "{{ x|nofilter }}", "{{ 1 / 0 }}", "{{ nothing.at.all }}",
    "{{ [1, 2][1:2:3, 4] }}", "{{ 10 ** -5000 }}", "{{ 1e308 * 10 }}", "{{ '%d' % 'x' }}",
]
#: Where a template piece goes (a whole report, the format's macros, one step's block).
PLACES = ["md/report.j2", "md/fmt.j2", "steps/weights.j2", "steps/default.j2", "report/body.j2", "prose/en.j2", "html/page.j2"]
#: What a folder-level piece does to a template file of the folder.
FILE_KINDS = ["symlink-secret", "symlink-etc", "symlink-dir", "fifo", "sparse", "not-utf8", "empty", "symlink-loop"]
COMMANDS = [
    ["run", "sentence-4x6", "--format", "md"], ["run", "sentence-4x6", "--format", "tex"], ["run", "gqa-4-query-2-kv", "--format", "text"],
    ["check", str(EXAMPLES / "article_softmax_claim.toml"), str(EXAMPLES / "article_softmax_claim.answer.toml"), "--format", "md"],
    ["run", "sentence-4x6", "--format", "html"],
]


@dataclass
class Folder:
    files: dict[str, str] = field(default_factory=dict)     # relative path -> text
    specials: list[tuple[str, str]] = field(default_factory=list)  # (kind, relative path)
    command: list[str] = field(default_factory=list)


def generate(seed: int = SEED) -> list[Folder]:
    """Every piece and every file kind once, shuffled and dealt 1-3 to a folder, plus a random
    second helping of pieces: about 60 folders, the same ones on every run."""
    rng = random.Random(seed)
    groups = {"size": SIZE, "loops": LOOPS, "escapes": ESCAPES, "files": FILES_TEXT, "syntax": SYNTAX}
    items = [(g, p) for g, pieces in groups.items() for p in pieces] + [("special", k) for k in FILE_KINDS]
    extra = [rng.choice(items) for _ in range(len(items) // 3)]
    rng.shuffle(items)
    items += extra
    folders = []
    while items:
        folder = Folder(command=COMMANDS[len(folders) % len(COMMANDS)])
        for _ in range(min(rng.randint(1, 3), len(items))):
            group, piece = items.pop()
            if group == "special":
                folder.specials.append((piece, rng.choice(PLACES)))
                continue
            place = rng.choice(PLACES if folder.command[0] == "run" else ["check/report.md.j2", "check/messages.en.j2", *PLACES])
            folder.files[place] = folder.files.get(place, "line one\n") + piece + "\n"
        folders.append(folder)
    return folders


CASES = len(generate())


def _limits() -> None:  # in the child, before exec
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def build(folder: Folder, base: Path, secret: str) -> tuple[Path, Path]:
    """The case's files: base/secret.txt, base/tpl (the template folder), base/work (cwd)."""
    base.mkdir(parents=True)
    (base / "secret.txt").write_text(secret + "\n", encoding="utf-8")
    tpl, work = base / "tpl", base / "work"
    tpl.mkdir(parents=True)
    work.mkdir()
    for rel, text in folder.files.items():
        (tpl / rel).parent.mkdir(parents=True, exist_ok=True)
        (tpl / rel).write_text(text.replace("{secret}", str(base / "secret.txt")), encoding="utf-8")
    for kind, rel in folder.specials:
        path = tpl / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()
        if kind == "symlink-secret":
            path.symlink_to(base / "secret.txt")
        elif kind == "symlink-etc":
            path.symlink_to("/etc/passwd")
        elif kind == "symlink-dir":
            outside = base / "outside" / rel
            outside.parent.mkdir(parents=True, exist_ok=True)
            outside.write_text(secret + "\n", encoding="utf-8")
            link = tpl / rel.split("/")[0]
            if not link.is_symlink():
                import shutil

                shutil.rmtree(link)
                link.symlink_to(base / "outside" / rel.split("/")[0])
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "sparse":
            with open(path, "wb") as fh:
                fh.truncate(1_500_000_000)
        elif kind == "not-utf8":
            path.write_bytes(b"\xff\xfe\x00" + secret.encode())
        elif kind == "empty":
            path.write_bytes(b"")
        elif kind == "symlink-loop":
            path.symlink_to(path)
    return tpl, work


@dataclass
class Outcome:
    index: int
    rc: int | None
    stdout: str
    stderr: str
    new_files: list[str]
    texts: dict[str, str]


def run_one(index: int, folder: Folder, base: Path) -> Outcome:
    secret = f"SECRET-{random.Random(index).getrandbits(64):016x}"
    tpl, work = build(folder, base, secret)
    before = _listing(base)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATTNTRACE_CACHE_DIR": "off", "HOME": str(base / "home"),
           "MPLCONFIGDIR": str(base / "home"), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
    args = [sys.executable, "-m", "attntrace", *folder.command, "--template-dir", str(tpl), "-o", "out/report.out"]
    (work / "out").mkdir()
    before.add("work/out")
    try:
        proc = subprocess.run(args, cwd=work, env=env, capture_output=True, timeout=HANG_GUARD, preexec_fn=_limits)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = None, exc.stdout or b"", exc.stderr or b""
    new = sorted(_listing(base) - before)
    texts = {rel: (base / rel).read_text("utf-8", "replace") for rel in new if (base / rel).is_file()}
    return Outcome(index, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), new, texts)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> list[tuple[Folder, Outcome, str]]:
    root = tmp_path_factory.mktemp("template-fuzz")
    folders = generate()
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        futures = [pool.submit(run_one, i, f, root / f"case{i}") for i, f in enumerate(folders)]
        return [(f, fut.result(), f"SECRET-{random.Random(i).getrandbits(64):016x}") for i, (f, fut) in enumerate(zip(folders, futures))]


def test_the_generator_is_deterministic_and_covers_every_kind():
    a, b = generate(), generate()
    assert [(f.files, f.specials) for f in a] == [(f.files, f.specials) for f in b]
    text = "".join(t for f in a for t in f.files.values())
    kinds = {k for f in a for k, _ in f.specials}
    assert kinds == set(FILE_KINDS), kinds
    for group in (SIZE, LOOPS, ESCAPES, FILES_TEXT, SYNTAX):
        assert all(piece in text for piece in group), group


@pytest.mark.parametrize("index", range(CASES))
def test_a_hostile_template_folder_does_nothing_but_fail_cleanly(outcomes, index):
    folder, o, secret = outcomes[index]
    where = f"case {index} {folder.command[:2]} files={ {k: v[:200] for k, v in folder.files.items()} } specials={folder.specials}: " \
            f"rc={o.rc} stderr={o.stderr[-500:]!r}"
    assert o.rc is not None, "blocked (no answer within the hang guard): " + where
    assert o.rc in (0, 1, 2), where  # a CPU-limit kill (SIGXCPU) or a crash is negative, an internal error 3
    assert len(o.stderr.splitlines()) <= 1 and "Traceback" not in o.stderr, where
    for name, text in [("stdout", o.stdout), ("stderr", o.stderr), *o.texts.items()]:
        assert secret not in text, f"{name} shows the secret: {where}"
        assert "root:x:0:0" not in text, f"{name} shows /etc/passwd: {where}"
    stray = [f for f in o.new_files if not f.startswith("work/out/")]
    assert not stray, f"files created outside out/: {stray}: {where}"
    assert not (ROOT / "PWNED").exists()
    if o.rc == 2:
        assert o.stderr.startswith("attntrace: error: "), where
