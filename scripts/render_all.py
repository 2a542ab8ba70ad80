"""Render every built-in example in every mode it supports, every format and language, into a folder.

A change to the templates that means to keep the reports as they are is checked by rendering
before and after and comparing the folders (`diff -r`). Each output is one file named
<example>.<mode>.<lang>.<format>; a mode or render the example refuses is written as its
one-line error, so a refusal that appears or disappears shows as a difference too. The
check reports of the examples' answer files and a worksheet per example come along.

    PYTHONPATH=$PWD python scripts/render_all.py OUT_FOLDER
"""

from __future__ import annotations

import sys
from pathlib import Path

import attntrace
from attntrace.resources import example_paths, examples_dir

MODES = ("numeric", "exact", "symbolic", "shape")
FORMATS = ("md", "tex", "text", "html")
LANGS = ("en", "zh")


def _write(out: Path, name: str, produce) -> None:
    try:
        text = produce()
    except Exception as exc:  # noqa: BLE001 - a refusal is an output too
        text = f"ERROR {type(exc).__name__}: {exc}\n"
    (out / name).write_text(text, encoding="utf-8")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for path in example_paths():
        for mode in MODES:
            try:
                trace = attntrace.run(path, mode=mode)
            except Exception as exc:  # noqa: BLE001
                (out / f"{path.stem}.{mode}.error").write_text(f"{type(exc).__name__}: {exc}\n", encoding="utf-8")
                continue
            for lang in LANGS:
                for fmt in FORMATS:
                    _write(out, f"{path.stem}.{mode}.{lang}.{fmt}", lambda: attntrace.render(trace, fmt, lang=lang))
            _write(out, f"{path.stem}.{mode}.standalone.tex", lambda: attntrace.render(trace, "tex", standalone=True, lang="zh"))
    for answer in sorted(examples_dir().glob("*.answer.toml")):
        spec = examples_dir() / (answer.name.split(".")[0] + ".toml")
        if not spec.is_file():
            spec = next(examples_dir().glob("*.toml"))
        try:
            report = attntrace.check(spec, answer)
        except Exception as exc:  # noqa: BLE001
            (out / f"check.{answer.stem}.error").write_text(f"{type(exc).__name__}: {exc}\n", encoding="utf-8")
            continue
        for lang in LANGS:
            for fmt in ("md", "tex", "text", "html"):
                _write(out, f"check.{answer.stem}.{lang}.{fmt}", lambda: report.render(fmt, lang=lang))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
