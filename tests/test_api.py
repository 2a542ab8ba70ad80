"""The package-level API stays callable after its implementation modules are imported."""

import importlib

import attntrace


def test_functions_are_not_shadowed_by_submodules():
    for module in ("rendering.renderer", "grading.checker", "inputs.spec", "tracer", "rendering.export", "teach.examples",
                   "teach.exercise", "model.trace", "algebra.modes", "kinds", "bridges"):
        importlib.import_module(f"attntrace.{module}")
    t = attntrace.run({"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False})
    assert callable(attntrace.render) and callable(attntrace.check) and callable(attntrace.run)
    assert "0.6457" in attntrace.render(t, format="text")
    assert attntrace.check(t, {"weights": [[0.65, 0.35], [0.40, 0.60]]}).ok
    assert not attntrace.check(t, {"weights": [[0.8, 0.2], [0.3, 0.7]]}).ok


def test_numeric_run_and_every_report_format_never_import_sympy():
    """SymPy costs about half a second to import: numeric work must not pay for it."""
    import subprocess
    import sys

    code = ("import sys, attntrace\n"
            "t = attntrace.run('sentence-4x6')\n"
            "[attntrace.render(t, format=f, lang=l) for f in ('md', 'tex', 'text') for l in ('en', 'zh')]\n"
            "attntrace.check(t, {'weights': t.step('weights').value.round(4).tolist()})\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sympy')[:3])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_jupyter_display_shows_an_error_instead_of_raising(monkeypatch):
    from attntrace.rendering import renderer

    t = attntrace.run({"scores": [[1, 2]], "scale": False})

    def broken(*args, **kwargs):
        raise RuntimeError("template exploded")

    monkeypatch.setattr(renderer, "render", broken)
    shown = t._repr_markdown_()
    assert "could not render" in shown and "template exploded" in shown
    assert t._repr_latex_() is None
