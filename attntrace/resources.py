"""Where the shipped templates and examples are, for editable and normal installs alike.

The design card puts `templates/` and `examples/` at the top level of the repository; the
wheel carries them as the data packages `attntrace._templates` and `attntrace._examples`
(see pyproject.toml). A source checkout or editable install finds the top-level folders.
A spec may be given as the bare name of a built-in example (`resolve_spec`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from attntrace.model.errors import BadInput

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


_NAME = re.compile(r"^[a-z0-9_-]+$")


def example_paths() -> list[Path]:
    """The example spec files, sorted by name (answer files excluded)."""
    paths = []
    for p in sorted(examples_dir().iterdir()):
        if p.suffix not in (".toml", ".json") or p.name.endswith((".answer.toml", ".answer.json")):
            continue
        if _NAME.match(p.stem):
            paths.append(p)
    return paths


def example_path(name: str) -> Path:
    """The spec file of the example called `name`; BadInput when there is none."""
    for p in example_paths():
        if p.stem == name:
            return p
    raise BadInput(f"no example named {name!r}; run `attntrace examples` for the list")


def resolve_spec(spec):
    """A path, a dict, or the name of a built-in example (a bare name such as sentence-4x6)."""
    if isinstance(spec, (str, Path)) and not os.path.exists(spec):
        text = str(spec)
        if os.sep not in text and "/" not in text and not Path(text).suffix:
            return example_path(text)
    return spec
