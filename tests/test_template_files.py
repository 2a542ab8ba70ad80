"""The shipped templates hold no copies: no two files are the same, no file only includes another.

A kind or a format with no layout of its own has no file: the renderer falls back (a report is
`<format>/report.j2`, else `report/body.j2`; a step `steps/<id>.j2`, else `steps/view/<view>.j2`,
else `steps/default.j2`). A new file that repeats another or merely includes one is refused here.
"""

from __future__ import annotations

import hashlib
import re

from attntrace.resources import templates_dir

_COMMENT = re.compile(r"\{#.*?#\}", re.S)
_INCLUDE_ONLY = re.compile(r"\{%-?\s*(include|extends)\s+[^%]*-?%\}")


def _files():
    root = templates_dir()
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_no_two_templates_are_the_same():
    seen: dict[str, str] = {}
    for name, data in _files().items():
        digest = hashlib.sha256(data).hexdigest()
        assert digest not in seen, f"{name} is a copy of {seen.get(digest)}"
        seen[digest] = name


def test_no_template_only_includes_another():
    for name, data in _files().items():
        text = _COMMENT.sub("", data.decode("utf-8")).strip()
        assert not _INCLUDE_ONLY.fullmatch(text), f"{name} only includes another template: leave it to the fallback"


def test_every_format_finds_a_report_template():
    from attntrace.rendering.renderer import FORMATS, report_templates

    names = set(_files())
    for fmt in FORMATS:
        assert any(t in names for t in report_templates(fmt)), fmt
