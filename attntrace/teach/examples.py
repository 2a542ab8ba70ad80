"""The built-in examples: the seed article's examples as spec files in `examples/`.

`attntrace run NAME` resolves NAME to `examples_dir()/NAME.toml`; `attntrace examples`
lists them with their titles. Answer files (`*.answer.toml`) belong to an example and are
not examples themselves.
"""

from __future__ import annotations

import re
from pathlib import Path

from attntrace.model.errors import BadInput
from attntrace.resources import examples_dir
from attntrace.inputs.usertext import format_user_text

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


def _title(path: Path) -> str:
    from attntrace.inputs.spec import read_spec_file

    try:
        data = read_spec_file(path)
    except BadInput as exc:
        return f"(unreadable: {exc})"
    title = data.get("title")
    # the listing is plain text: $sqrt(d_k)$ reads sqrt(d_k)
    return format_user_text(" ".join(str(title).split()), "text") if title else "(no title)"


def list_examples() -> list[tuple[str, str]]:
    """[(name, title)] for every built-in example, sorted by name."""
    return [(p.stem, _title(p)) for p in example_paths()]
