"""The attntrace modules that `attntrace run sentence-4x6 --format md` loads, pinned (issue 26).

Start-up is measured in bench/ (`python -X importtime`, ratios against `python -c "import numpy,
jinja2"`); this test does not time anything. It pins the set of attntrace.* modules the
sentence report imports, so that a change which makes every run import one more module (a
kind, a view, an algebra) shows up in review: such a change updates SENTENCE_MODULES below,
on purpose, or imports its module lazily instead. SymPy must never be among the imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: What the numeric sentence report loads today: the kind modules of plain attention (the registry
#: reads the others' declarations from the kinds' manifest and imports a module only when the
#: problem has what its RUNS_WITH names); views, algebras other than numeric, grading, teaching,
#: bridges and HTML are not.
SENTENCE_MODULES = frozenset("""
attntrace attntrace.cli attntrace.budget attntrace.resources attntrace.tracer attntrace.version
attntrace.algebra attntrace.algebra.modes attntrace.algebra.numeric
attntrace.inputs attntrace.inputs.blockspec attntrace.inputs.expr attntrace.inputs.grammar attntrace.inputs.limits attntrace.inputs.matrices attntrace.inputs.options
attntrace.inputs.numbers attntrace.inputs.positional attntrace.inputs.safetext attntrace.inputs.spec
attntrace.inputs.stepoptions attntrace.inputs.textescape attntrace.inputs.tokens attntrace.inputs.usertext
attntrace.kinds attntrace.kinds.base attntrace.kinds.context attntrace.kinds.heads attntrace.kinds.manifest attntrace.kinds.mask
attntrace.kinds.notation attntrace.kinds.online attntrace.kinds.projection attntrace.kinds.registry
attntrace.kinds.scale attntrace.kinds.scores attntrace.kinds.softmax attntrace.kinds.weighted_sum
attntrace.model attntrace.model.errors attntrace.model.formula attntrace.model.record attntrace.model.trace
attntrace.rendering attntrace.rendering.formats attntrace.rendering.formulatext attntrace.rendering.jinja_env attntrace.rendering.layout attntrace.rendering.onlineview
attntrace.rendering.plaindata attntrace.rendering.printing attntrace.rendering.renderer attntrace.rendering.sandbox
attntrace.rendering.softmaxview attntrace.rendering.stepview attntrace.rendering.templatefiles
attntrace.rendering.textcolumns attntrace.rendering.texwidth attntrace.rendering.viewmodel attntrace.rendering.viewparts attntrace.rendering.views
""".split())

#: Standard modules only some specs or formats use, imported where they are used: `fractions`
#: (and `decimal`, which it imports) for exact input and ALiBi slopes, `html` for HTML reports,
#: `unicodedata` for text that is not all printable ASCII (cleaning, terminal columns).
#: None of them is imported by `python -c "import numpy, jinja2"`, the start-up reference.
LAZY_STDLIB = frozenset({"fractions", "decimal", "html", "unicodedata"})


def _loaded(args: list[str]) -> dict:
    code = (
        "import json, os, sys\n"
        "from attntrace.cli import main\n"
        f"rc = main({args!r} + ['-o', os.devnull])\n"
        "mods = sorted(m for m in sys.modules if m == 'attntrace' or m.startswith('attntrace.'))\n"
        "sympy = sorted(m for m in sys.modules if m == 'sympy' or m.startswith('sympy.'))\n"
        f"lazy = sorted(m for m in {sorted(LAZY_STDLIB)!r} if m in sys.modules)\n"
        "sys.stdout.write(json.dumps({'rc': rc, 'modules': mods, 'sympy': sympy[:3], 'lazy': lazy}))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_the_sentence_report_loads_the_pinned_modules():
    got = _loaded(["run", "sentence-4x6", "--format", "md"])
    assert got["rc"] == 0 and got["sympy"] == [] and got["lazy"] == []
    loaded = set(got["modules"])
    assert not loaded - SENTENCE_MODULES, f"new imports in the sentence report: {sorted(loaded - SENTENCE_MODULES)}"
    assert not SENTENCE_MODULES - loaded, f"no longer imported (update SENTENCE_MODULES): {sorted(SENTENCE_MODULES - loaded)}"


def test_a_json_spec_does_not_load_the_toml_reader(tmp_path):
    spec = tmp_path / "small.json"
    spec.write_text(json.dumps({"X": [[1, 0], [0, 2]], "W_Q": [[1, 0], [0, 1]], "W_K": [[0, 1], [1, 0]], "W_V": [[1, 1], [0, 1]]}))
    code = ("import os, sys\nfrom attntrace.cli import main\n"
            f"rc = main(['run', {str(spec)!r}, '--format', 'md', '-o', os.devnull])\n"
            "print(rc, 'tomllib' in sys.modules)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.stdout.split() == ["0", "False"], proc.stderr[-2000:]


def test_the_pinned_set_leaves_out_what_the_sentence_does_not_use():
    for name in ("attntrace.grading", "attntrace.teach", "attntrace.bridges", "attntrace.algebra.exact",
                 "attntrace.algebra.symbolic", "attntrace.rendering.html", "attntrace.rendering.figures",
                 "attntrace.rendering.gradview", "attntrace.rendering.blockview", "attntrace.rendering.ropeview"):
        assert not any(m == name or m.startswith(name + ".") for m in SENTENCE_MODULES), name


def test_the_garbage_collector_is_left_alone_when_main_is_called_with_arguments():
    """The command as a process turns the collector off and freezes at exit (start-up cost);
    a caller that passes argv (a test, a script, a notebook) keeps its own setting."""
    import gc

    from attntrace.cli import main

    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    assert main(["run", "sentence-4x6", "--format", "md", "-o", os.devnull]) == 0
    assert gc.isenabled() and gc.get_freeze_count() == frozen
