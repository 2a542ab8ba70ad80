"""Issue 20: no control or invisible formatting character of any field reaches any output.

Every field a user writes (a spec's title, description, title_zh, description_zh, tokens;
an answer's title, student and comment; the file names of a class folder; a template folder's
worksheet prose) is given the characters the issue lists, which the old hand-made filter let
through (U+2028/2029, U+200B, U+FEFF, U+2060, U+00AD, U+180E, the tag characters
U+E0000-E007F, CR, ESC, NEL U+0085) and the noncharacters U+FFFF/U+FFFE, and then every
output is read: run (md, tex, text, json, html; en and zh; heatmap SVGs), check (text, md, tex,
json, html), a class (text, md, tex, json, csv), exercises (md, tex worksheets and the Moodle XML).
No output may hold one (`unsafe_char`, from the Unicode categories, written apart from
attntrace.inputs.safetext), while the visible text around them is kept.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import unicodedata
from pathlib import Path

import pytest

import attntrace
from attntrace.cli import main
from attntrace.inputs import safetext

#: The characters the issue lists (the old filter let them through), and U+FFFF/U+FFFE.
LISTED = ["\u2028", "\u2029", "\u200b", "\ufeff", "\u2060", "\u00ad", "\u180e", "\U000E0000", "\U000E0001",
          "\U000E0041", "\U000E007F", "\r", "\x1b", "\x85", "\uffff", "\ufffe"]
ALL = "".join(LISTED)
#: what a field holds: visible words around every listed character
FIELD = "Left" + ALL + "Right"


def unsafe_char(c: str) -> bool:
    """No output may hold `c`: Cc but newline and tab, Cf but ZWNJ/ZWJ, Zl, Zp, Cs, Co, the
    noncharacters and the Tags block (issue 20)."""
    o = ord(c)
    if c in "\n\t\u200c\u200d":
        return False
    return (unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co") or 0xE0000 <= o <= 0xE007F
            or 0xFDD0 <= o <= 0xFDEF or (o & 0xFFFE) == 0xFFFE)


def _bad(text: str) -> list[str]:
    return sorted({f"U+{ord(c):04X}" for c in text if unsafe_char(c)})


def _cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


def _spec(folder: Path, value: str = FIELD) -> Path:
    spec = {"title": value, "description": value, "title_zh": value, "description_zh": value,
            "tokens": [value, "B" + value], "scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False}
    path = folder / "spec.json"
    path.write_text(json.dumps(spec, ensure_ascii=True), encoding="utf-8")  # \u escapes: even lone surrogates
    return path


def _answer(folder: Path, name: str = "answer.json", value: str = FIELD, weights=((0.8, 0.2), (0.3, 0.6))) -> Path:
    path = folder / name
    path.write_text(json.dumps({"title": value, "student": value, "comment": value, "weights": weights},
                               ensure_ascii=True), encoding="utf-8")
    return path


def test_safetext_filters_by_category():
    """The rule itself: every listed character goes (U+FFFF/U+FFFE too), whitespace controls
    become a space in a field and a newline in a whole report, a lone surrogate becomes U+FFFD,
    ZWJ and ZWNJ stay (Persian, Indic scripts, emoji sequences need them)."""
    for c in LISTED:
        assert unsafe_char(c)
        assert not _bad(safetext.clean_text("a" + c + "b")), f"U+{ord(c):04X}"
        assert not _bad(safetext.clean_output("a" + c + "b\n")), f"U+{ord(c):04X}"
        assert not _bad(safetext.one_line("a" + c + "b")), f"U+{ord(c):04X}"
        assert safetext.has_unsafe_chars("a" + c)
    assert safetext.clean_text(FIELD) == "Left" + " " * 4 + "Right"  # CR, NEL, LS, PS: a space each
    assert safetext.clean_text("a\r\nb\tc\x1fd") == "a  b c d"
    assert safetext.clean_output("a\r\nb\rc\u2028d\te\n") == "a\nb\nc\nd\te\n"
    assert safetext.clean_text("x\ud800y") == "x\ufffdy"
    for kept in ("می\u200cخواهم", "क्\u200dष", "👩\u200d💻", "自注意力 √6 ≈ 2.449", "e\u0301", "\u00a0\u3000"):
        assert safetext.clean_text(kept) == kept and not safetext.has_unsafe_chars(kept)
    assert safetext.one_line("a\nb\x1b\U000E0041") == "a\\nb\\x1b\\U000e0041"
    text = json.dumps({"t": "a" + ALL + "\ud800"}, ensure_ascii=False)
    assert json.loads(safetext.json_safe(text)) == {"t": "a" + ALL + "\ud800"}  # the same JSON value
    assert not _bad(safetext.json_safe(text))


def test_every_field_through_run_in_every_format(tmp_path):
    spec = _spec(tmp_path)
    for fmt in ("md", "tex", "text", "json", "html"):
        for lang in ("en", "zh"):
            rc, out, err = _cli(["run", str(spec), "--format", fmt, "--lang", lang])
            assert rc == 0 and not err, (fmt, lang, err)
            assert not _bad(out), (fmt, lang, _bad(out))
            assert "Left" in out and "Right" in out, (fmt, lang)
    data = json.loads(_cli(["run", str(spec), "--format", "json"])[1])
    assert data["title"].startswith("Left") and not _bad(data["title"])  # the decoded JSON value too
    trace = attntrace.run(str(spec))
    for value in (trace.title, trace.settings["description"], *trace.settings["tokens"], *trace.settings["title_zh"]):
        assert not _bad(value)  # cleaned where it entered: the trace holds none of them


def test_every_field_through_heatmap_labels(tmp_path):
    pytest.importorskip("matplotlib")
    spec = _spec(tmp_path)
    rc, out, err = _cli(["run", str(spec), "--format", "md", "--figures", str(tmp_path / "figs")])
    assert rc == 0 and not err and not _bad(out)
    svgs = list((tmp_path / "figs").glob("*.svg"))
    assert svgs
    for svg in svgs:
        assert not _bad(svg.read_text(encoding="utf-8")), svg.name


@pytest.mark.parametrize("value", [FIELD, "\r", "\u2028", "\x85", "\ufeff"])
def test_every_field_through_check_in_every_format(tmp_path, value):
    """`description='\\r'` reached `check --format text` as ``Student: \\r`` (issue 20)."""
    spec, answer = _spec(tmp_path, value), _answer(tmp_path, value=value)
    for fmt in ("text", "md", "tex", "json", "html"):
        for lang in ("en", "zh"):
            rc, out, err = _cli(["check", str(spec), str(answer), "--format", fmt, "--lang", lang])
            assert rc == 1 and not err, (fmt, lang, err)
            assert not _bad(out), (fmt, lang, _bad(out), out[:200])
    rc, out, _ = _cli(["check", str(spec), str(answer), "--format", "text"])
    if value == FIELD:
        assert re.search(r"Left +Right", out)
    else:  # a student name of nothing but whitespace controls is no name
        assert "Student" not in out
    report = json.loads(_cli(["check", str(spec), str(answer), "--format", "json"])[1])
    assert not _bad(json.dumps(report, ensure_ascii=False))


def test_every_field_and_file_name_through_a_class(tmp_path):
    spec = _spec(tmp_path)
    answers = tmp_path / "answers"
    answers.mkdir()
    _answer(answers, "a.json")
    _answer(answers, "b.json", value="", weights=((0.8, 0.2), (0.3, 0.7)))
    try:  # the file name is shown for a student without a name
        _answer(answers, "Left" + "".join(c for c in ALL if c not in "\uffff\ufffe") + "Right.json", value="")
    except OSError:  # a file system that refuses such names
        pass
    (answers / ("broken\x1b\u2028.json")).write_text("{", encoding="utf-8")  # unreadable: its reason is shown
    for fmt in ("text", "md", "tex", "json", "csv"):
        rc, out, err = _cli(["check", str(spec), str(answers), "--format", fmt])
        assert rc in (1, 2) and len(err.splitlines()) <= 1, (fmt, err)
        assert not _bad(out) and not _bad(err), (fmt, _bad(out), _bad(err))
        assert "Left" in out, fmt


def _prose_folder(tmp_path: Path) -> Path:
    from attntrace.resources import templates_dir

    folder = tmp_path / "tpl"
    escaped = ALL.encode("unicode_escape").decode("ascii")  # Jinja reads the escapes back
    for lang in ("en", "zh"):
        text = (templates_dir() / "exercise" / "prose" / f"{lang}.j2").read_text(encoding="utf-8")
        spiked = re.sub(r'"((?:[^"\\]|\\.)+)"(\s*:)?', lambda m: m.group(0) if m.group(2) else  # a key stays
                        f'"{m.group(1)[:1]}{escaped}{m.group(1)[1:]}"', text)
        path = folder / "exercise" / "prose" / f"{lang}.j2"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(spiked, encoding="utf-8")
    return folder


def test_template_prose_through_exercises(tmp_path):
    folder = _prose_folder(tmp_path)
    for args in (["--format", "md"], ["--format", "tex"], ["--format", "md", "--key"], ["--format", "moodle"],
                 ["--format", "md", "--lang", "zh"], ["--format", "moodle", "--lang", "zh"], ["--format", "numbas"]):
        rc, out, err = _cli(["exercise", "--template-dir", str(folder), *args])
        assert rc == 0 and not err, (args, err)
        assert not _bad(out), (args, _bad(out))
    from attntrace.teach.exercise import make_exercise
    from attntrace.teach.worksheet import render_worksheet

    spec, trace = make_exercise(2, 4, 1, 0)
    for fmt in ("md", "tex"):
        assert not _bad(render_worksheet(spec, trace, format=fmt, template_dir=folder))


def test_titles_and_prose_through_the_lms_exports(tmp_path):
    """The Python API of the quiz exports, with a title holding every listed character (and a
    lone surrogate): Moodle XML, QTI and the Numbas exam (JSON: not even as a \\u escape)."""
    import io
    import zipfile
    from xml.etree import ElementTree as ET

    from attntrace.teach import lms, numbas

    folder = _prose_folder(tmp_path)
    variants = lms.make_variants(2, 4, 2, 3, variants=2)
    variants[0] = lms.Variant(variants[0].seed, dict(variants[0].spec, title=FIELD + "\ud800"), variants[0].trace)
    for lang in ("en", "zh"):
        exam = numbas.exam_text(variants, lang=lang, template_dir=folder)
        assert not _bad(exam)
        data = json.loads(exam.split("\n", 1)[1])
        assert not _bad(json.dumps(data, ensure_ascii=False))  # the values themselves
        assert data["question_groups"][0]["questions"][0]["name"].startswith("Left")
        package = zipfile.ZipFile(io.BytesIO(lms.qti_package(variants, lang=lang, template_dir=folder)))
        for xml_text in (lms.moodle_xml(variants, lang=lang, template_dir=folder).encode("utf-8"),
                         *(package.read(name) for name in package.namelist())):
            root = ET.fromstring(xml_text)  # parses: no U+FFFF, U+FFFE or C0 control
            assert not _bad("".join(root.itertext()))


def test_python_api_outputs(tmp_path):
    """The same through the Python API: render, the check's report and its dict."""
    from attntrace.grading.checker import check, render_report

    trace = attntrace.run({"title": FIELD, "description": FIELD, "tokens": [FIELD, FIELD],
                           "scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False})
    for fmt in ("md", "tex", "text"):
        assert not _bad(attntrace.render(trace, format=fmt)), fmt
    assert not _bad(json.dumps(trace.to_dict(), ensure_ascii=False))
    report = check(trace, {"student": FIELD, "title": FIELD, "weights": [[0.8, 0.2], [0.3, 0.6]]})
    assert report.student == "Left Right"
    for fmt in ("md", "tex", "text", "json"):
        assert not _bad(render_report(report, format=fmt)), fmt
