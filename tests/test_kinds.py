"""Step kinds are units: each declares everything about itself, and the pieces it names exist.

These tests read the kinds' declarations and check them against the rest of the package:
the stable step ids, the templates and prose (both languages), the checker's catalogue,
and that every kind named in a pipeline traces and renders in every mode.
"""

from __future__ import annotations

import pytest

import attntrace
from attntrace.kinds import COMBINE_PIPELINE, HEAD_PIPELINE, KINDS, Kind
from attntrace.model.trace import STEP_IDS
from attntrace.resources import templates_dir


def test_the_first_ten_step_ids_are_kinds_in_trace_order():
    ids = [k.id for k in HEAD_PIPELINE + COMBINE_PIPELINE]
    assert [i for i in ids if i in STEP_IDS] == list(STEP_IDS)


@pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
def test_kind_declares_everything(kind: Kind):
    assert kind.id and kind.letter and kind.entry and kind.view and kind.prose
    assert kind.writes, kind.id
    assert kind.templates[-1] == "steps/default.j2" and (templates_dir() / kind.templates[-1]).is_file()
    for lang in ("en", "zh"):
        prose = (templates_dir() / "prose" / lang / f"{kind.prose}.j2").read_text()
        for macro in ("title(vm)", "short(kind)", "explain(vm, f)"):
            assert f"macro {macro}" in prose, (lang, kind.prose, macro)


def test_every_checker_mistake_belongs_to_the_kind_it_changes():
    from attntrace.grading.diagnose import CATALOGUE

    for code, step_id in CATALOGUE.items():
        if step_id == "*":  # a mistake of any step (rounding, an arithmetic slip, a transposed matrix)
            continue
        assert code in KINDS[step_id].mistakes, f"{code} changes {step_id} but kind {step_id} does not declare it"


def test_every_mistake_a_kind_declares_is_implemented():
    """The other direction: a kind declares only codes the checker plants (in diagnose.CATALOGUE)."""
    from attntrace.grading.diagnose import CATALOGUE

    missing = {(k.id, code) for k in KINDS.values() for code in k.mistakes if code not in CATALOGUE}
    assert not missing, f"kinds declare mistakes the checker does not know: {sorted(missing)}"


def test_a_pipeline_kind_runs_in_every_mode_and_renders():
    """Each kind of the default pipeline appears in the multi-head masked trace and renders in md/tex/text, en/zh."""
    spec = {"X": [[1, 0], [0, 1], [1, 1]], "W_Q": [[1, 0, 1, 0], [0, 1, 0, 1]], "W_K": [[1, 1, 0, 0], [0, 1, 1, 0]],
            "W_V": [[1, 0, 0, 1], [0, 1, 1, 0]], "num_heads": 2, "mask": "causal",
            "W_O": [[1, 0], [0, 1], [1, 0], [0, 1]]}
    for mode in ("numeric", "exact", "symbolic", "shape"):
        t = attntrace.run(spec, mode=mode)
        assert {s.id for s in t.steps} == set(STEP_IDS), mode
        for s in t.steps:
            assert s.plain and s.formula, s.key
        for fmt in ("md", "tex", "text"):
            for lang in ("en", "zh"):
                assert attntrace.render(t, format=fmt, lang=lang)


@pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
def test_kind_view_exists(kind: Kind):
    """A kind's view is a StepView build_* method or a registered view whose module a kind names (Kind.view_module)."""
    from attntrace.rendering import views
    from attntrace.rendering.stepview import VIEWS, StepView

    if hasattr(StepView, f"build_{kind.view}"):
        return
    assert kind.view in views.modules(), f"{kind.id}: view {kind.view!r} has no view_module on any kind"
    views.load(kind.view)
    assert kind.view in VIEWS, f"{kind.id}: loading {views.modules()[kind.view]} did not register view {kind.view!r}"


def test_a_classic_report_imports_no_view_of_newer_kinds():
    """Start-up stays small: the sentence example's report loads only the views it shows."""
    import subprocess
    import sys

    code = ("import sys, attntrace\n"
            "attntrace.render(attntrace.run('sentence-4x6'), format='md')\n"
            "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('attntrace.rendering.') and m.endswith('view')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "['onlineview', 'softmaxview', 'stepview']", out


def test_every_declared_mistake_has_its_sentence_in_its_kinds_prose():
    """A mistake a kind declares (`Mistake`) is catalogued, and its sentence is the macro of that
    name in the kind's prose templates, in both languages."""
    from attntrace.grading.diagnose import CATALOGUE
    from attntrace.kinds import MISTAKES

    assert MISTAKES
    for code, (kind, mistake) in MISTAKES.items():
        assert CATALOGUE[code] == kind.id and str(mistake) == code
        for lang in ("en", "zh"):
            assert any(f"macro {code}(d)" in (templates_dir() / "prose" / lang / f"{p}.j2").read_text()
                       for p in kind.sentence_prose), (code, lang)


def test_pipelines_follow_the_kinds_declarations():
    """Each head kind runs after every id it names in `after` and before every id in `before`."""
    from attntrace.kinds.registry import resolve_order

    ids = [k.id for k in HEAD_PIPELINE]
    for k in HEAD_PIPELINE:
        assert all(ids.index(a) < ids.index(k.id) for a in k.after if a in ids), k.id
        assert all(ids.index(k.id) < ids.index(b) for b in k.before if b in ids), k.id
    assert ids[:3] == ["Q", "K", "V"] and ids[-2:] == ["weights", "Z"]

    class Late(Kind):
        id, pipeline, after = "late", "head", ("weights",)

    class Loop(Kind):
        id, pipeline, after, before = "loop", "head", ("Z",), ("Q",)

    placed = [k.id for k in resolve_order(list(HEAD_PIPELINE) + [Late()], {"late", *ids})]
    assert placed.index("weights") < placed.index("late") and placed[:len(ids)] == ids  # the others keep their order
    with pytest.raises(RuntimeError, match="cycle"):
        resolve_order(list(HEAD_PIPELINE) + [Loop()], {"loop", *ids})
    with pytest.raises(RuntimeError, match="no kind's id"):
        resolve_order([Late()], {"late"})
