"""Where the shipped templates and examples are, for editable and normal installs alike.

The design card puts `templates/` and `examples/` at the top level of the repository; the
wheel carries them as the data packages `attntrace._templates` and `attntrace._examples`
(see pyproject.toml). A source checkout or editable install finds the top-level folders.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _find(folder: str, packaged: str) -> Path:
    for candidate in (_PACKAGE / packaged, _PACKAGE.parent / folder):
        if candidate.is_dir():
            return candidate
    try:  # editable installs map the data package elsewhere
        from importlib.resources import files

        path = Path(str(files(f"attntrace.{packaged}")))
        if path.is_dir():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    raise FileNotFoundError(f"attntrace cannot find its {folder}/ folder (looked in {_PACKAGE})")


def templates_dir() -> Path:
    return _find("templates", "_templates")


def examples_dir() -> Path:
    return _find("examples", "_examples")
