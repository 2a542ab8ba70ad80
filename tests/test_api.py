"""The package-level API stays callable after its implementation modules are imported."""

import importlib

import attntrace


def test_functions_are_not_shadowed_by_submodules():
    for module in ("renderer", "checker", "spec", "tracer", "export", "examples", "exercise"):
        importlib.import_module(f"attntrace.{module}")
    t = attntrace.run({"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False})
    assert callable(attntrace.render) and callable(attntrace.check) and callable(attntrace.run)
    assert "0.6457" in attntrace.render(t, format="text")
    assert attntrace.check(t, {"weights": [[0.65, 0.35], [0.40, 0.60]]}).ok
    assert not attntrace.check(t, {"weights": [[0.8, 0.2], [0.3, 0.7]]}).ok
