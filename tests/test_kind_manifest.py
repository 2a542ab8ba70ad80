"""The kinds' manifest says what the kind modules declare, and leaving a module unimported is safe.

`attntrace.kinds.manifest` is written from the modules (scripts/write_kind_manifest.py): the
first test fails when a kind changes its place, spec keys, RUNS_WITH, operands, mistakes, view
or meanings without the manifest being written again. A process imports a kind module only
when the problem has something the module's `RUNS_WITH` names; the other tests check, over
every built-in example, that no kind of a module left out would have run (its `enabled` is
False for that problem), that a trace with every module turned on is the same, and that a
run imports only the modules of what it uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attntrace import run
from attntrace.kinds import manifest, registry
from attntrace.resources import example_paths
from attntrace.tracer import load_problem

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(example_paths(), key=lambda p: p.stem)
_SMALL = {"X": [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], "W_Q": [[1, 0], [0, 1], [1, 0], [0, 1]],
          "W_K": [[0, 1], [1, 0], [0, 1], [1, 0]], "W_V": [[1, 1], [0, 1], [1, 0], [0, 0]]}
#: What no example has: an additive attention bias, the first sublayer of a block alone.
SPECS = {p.stem: p for p in EXAMPLES} | {"attn-bias": {**_SMALL, "attn_bias": [[0, -1, 0], [0, 0, -1], [1, 0, 0]]},
                                         "block-part": {**_SMALL, "W_O": [[1, 0, 0, 1], [0, 1, 1, 0]], "block": "post_ln",
                                                        "block_part": "self_attention"}}


def test_the_manifest_is_what_the_modules_declare():
    written = (ROOT / "attntrace" / "kinds" / "manifest.py").read_text(encoding="utf-8")
    assert written == registry.manifest_text(), "the kinds changed: run python scripts/write_kind_manifest.py"


def _placed_for(problem) -> list[tuple[str, object]]:
    """(module, kind) of every kind the problem's pipelines hold, its module imported or not:
    the head and combine pipelines and the block's of its arrangement (none without a block)."""
    pipelines, block = manifest.PIPELINES, problem.extra.get("block")
    refs = pipelines["head"] + pipelines["combine"] + pipelines["block_pre"][block] + pipelines["block_post"][block]
    return [(r[0], registry.kind_at(r)) for r in dict.fromkeys(refs)]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_no_kind_of_a_module_left_out_would_run(name):
    problem = load_problem(SPECS[name])
    on = registry.modules_for(problem)
    ran_with = [name for name, kind in _placed_for(problem) if name not in on and kind.enabled(problem)]
    assert not ran_with, f"{name}: kinds of {sorted(set(ran_with))} run, but their RUNS_WITH does not name what the problem has"
    if "backward" not in on:
        from attntrace.kinds.backward import BACKWARD_COMBINE, BACKWARD_HEAD, BACKWARD_INPUTS

        assert not [k.id for k in BACKWARD_COMBINE + BACKWARD_HEAD + BACKWARD_INPUTS if k.enabled(problem)]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_trace_with_every_module_turned_on_is_the_same(name, monkeypatch):
    """What the tracer does must not depend on kinds that do not run (a pipeline that is empty
    only because its kinds' modules were left out, say)."""
    lazy = json.dumps(run(SPECS[name]).to_dict(), sort_keys=True)
    monkeypatch.setattr(registry, "modules_for", lambda problem: frozenset(manifest.MODULES))
    assert json.dumps(run(SPECS[name]).to_dict(), sort_keys=True) == lazy


def test_every_optional_module_is_used_by_some_spec():
    """Each RUNS_WITH is exercised above: some spec turns the module on."""
    used = set()
    for spec in SPECS.values():
        used |= registry.modules_for(load_problem(spec))
    optional = {name for name, m in manifest.MODULES.items() if m["runs_with"] is not None}
    assert optional - used == set()


def test_pipelines_with_every_module_are_the_full_registries():
    from attntrace.kinds import COMBINE_PIPELINE, HEAD_PIPELINE, KINDS

    assert [k.id for k in HEAD_PIPELINE] == [r[2] for r in manifest.PIPELINES["head"]]
    assert [k.id for k in COMBINE_PIPELINE] == [r[2] for r in manifest.PIPELINES["combine"]]
    assert all(KINDS[i].id == i for i in KINDS)


def _kind_modules_loaded(spec: str) -> list[str]:
    code = ("import json, os, sys\nfrom attntrace.cli import main\n"
            f"rc = main(['run', {spec!r}, '--format', 'md', '-o', os.devnull])\n"
            "print(json.dumps([rc, sorted(m.rpartition('.')[2] for m in sys.modules if m.startswith('attntrace.kinds.'))]))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    rc, modules = json.loads(proc.stdout)
    assert rc == 0, proc.stderr[-2000:]
    return modules


def test_a_run_imports_the_kind_modules_of_what_it_uses():
    plain = set(_kind_modules_loaded("sentence-4x6"))
    optional = {name for name, m in manifest.MODULES.items() if m["runs_with"] is not None}
    assert not plain & optional, f"plain attention imports {sorted(plain & optional)}"
    rope = set(_kind_modules_loaded("rope-4-tokens-half"))
    assert "rope" in rope and not (rope & optional) - {"rope"}
