"""The built-in examples: the seed article's examples as spec files in `examples/`.

`attntrace run NAME` resolves NAME to `examples_dir()/NAME.toml`; `attntrace examples`
lists them with their titles. Answer files (`*.answer.toml`) belong to an example and are
not examples themselves.
"""

from __future__ import annotations

from pathlib import Path

from attntrace.model.errors import BadInput
from attntrace.resources import example_path, example_paths  # noqa: F401 - example_path is public here too
from attntrace.inputs.usertext import format_user_text

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
