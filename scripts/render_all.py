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
import tomllib
from pathlib import Path

import attntrace
from attntrace.grading.htmlreport import check_html
from attntrace.resources import example_paths, examples_dir

MODES = ("numeric", "exact", "symbolic", "shape")

#: Specs no example covers: a given attention bias, small, too large to show in full, one per head.
_BIG = [[((3 * i + 5 * j) % 7) / 4 - 0.5 for j in range(10)] for i in range(10)]
EXTRA = {
    "attn-bias-3": {"Q": [[1, 0], [0, 1], [1, 1]], "K": [[1, 2], [0, 1], [1, 0]], "V": [[1, 0], [0, 1], [2, 2]],
                    "attn_bias": [["1/2", 0, -1], [0, 0, "1/4"], [2, 1, 0]], "mask": "causal"},
    "attn-bias-10": {"scores": _BIG, "scale": False, "attn_bias": [row[::-1] for row in _BIG]},
    "attn-bias-heads": {"X": [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]], "num_heads": 2,
                        "W_Q": [[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 1, 1]],
                        "W_K": [[0, 1, 1, 0], [1, 0, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1]],
                        "W_V": [[1, 1, 0, 0], [0, 0, 1, 1], [1, 0, 0, 1], [0, 1, 1, 0]],
                        "attn_bias": [[[0, 1, 0], [1, 0, 1], [0, 0, 1]], [[1, 0, 0], [0, 1, 0], [0, 0, 1]]]},
}
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
    moe = tomllib.loads((examples_dir() / "moe-tiny.toml").read_text(encoding="utf-8"))
    moe["moe"]["bias"] = [0.1, -0.2, 0.3, 0.0]  # the sigmoid router's bias for choosing
    specs = [(p.stem, p) for p in example_paths()] + list(EXTRA.items()) + [("moe-router-bias", moe)]
    for stem, spec in specs:
        for mode in MODES:
            try:
                trace = attntrace.run(spec, mode=mode)
            except Exception as exc:  # noqa: BLE001
                (out / f"{stem}.{mode}.error").write_text(f"{type(exc).__name__}: {exc}\n", encoding="utf-8")
                continue
            for lang in LANGS:
                for fmt in FORMATS:
                    _write(out, f"{stem}.{mode}.{lang}.{fmt}", lambda: attntrace.render(trace, fmt, lang=lang))
            _write(out, f"{stem}.{mode}.standalone.tex", lambda: attntrace.render(trace, "tex", standalone=True, lang="zh"))
            _write(out, f"{stem}.{mode}.all-rows.md", lambda: attntrace.render(trace, "md", rows="all"))
            _write(out, f"{stem}.{mode}.fragment.html", lambda: attntrace.render(trace, "html", fragment=True, lang="zh"))
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
            for fmt in ("md", "tex", "text"):
                _write(out, f"check.{answer.stem}.{lang}.{fmt}", lambda: report.render(fmt, lang=lang))
            for fragment in (False, True):
                _write(out, f"check.{answer.stem}.{lang}.{'fragment' if fragment else 'page'}.html",
                       lambda: check_html(report, answer, lang=lang, fragment=fragment))


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__.strip().splitlines()[-1].strip())  # usage: an option is not an output folder
    main(Path(sys.argv[1]))
