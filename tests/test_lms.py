"""LMS export: Moodle XML (Cloze questions) and QTI 1.2 packages (Canvas).

The XML is parsed back and its structure checked element by element against the Moodle XML
format (quiz/question[@type]/name/questiontext/...) and the QTI 1.2 ASI content model
(questestinterop/assessment/section/item/presentation/resprocessing) as Canvas imports it.
The QTI items are validated with lxml against the QTI 1.2 XSD and the manifest against the CP
1.1 XSD (../shared/lms-schemas); Moodle XML has no XSD: its Cloze blanks are parsed the way
Moodle's importer reads them.

Every embedded answer is compared with the answer key of `attntrace.run` on the generated
spec, and its tolerance with what `attntrace check` accepts.
"""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path
from xml.etree import ElementTree as ET

import numpy as np
import pytest

import attntrace
from attntrace import BadInput, cli
from attntrace.teach import lms
from attntrace.grading.answer import Entry
from attntrace.teach.exercise import answer_key, exercise_spec
from mathcheck import in_ci

QTI = "{http://www.imsglobal.org/xsd/ims_qtiasiv1p2}"
CP = "{http://www.imsglobal.org/xsd/imscp_v1p1}"
#: a blank's first answer, the key at 100 % (the usual mistakes may follow after ~)
CLOZE = re.compile(r"\{1:NUMERICAL:=([^:}]+):([^:}~]+)(?:~(?:\\.|[^\\}])*)?\}")
CONFIGS = [(3, 4, 1, 7), (3, 4, 2, 205), (2, 2, 2, 4), (4, 8, 2, 1)]


def _truth(n, d, heads, seed):
    """The answer key, computed from scratch: the spec regenerated, traced by attntrace.run."""
    trace = attntrace.run(exercise_spec(n, d, heads, seed))
    return trace, answer_key(trace)


def _children(el):
    return [c.tag for c in el]


# --------------------------------------------------------------------------- Moodle


@pytest.mark.parametrize("n,d,heads,seed", CONFIGS)
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_moodle_xml_structure_and_answers(n, d, heads, seed, lang):
    variants = lms.make_variants(n, d, heads, seed, variants=2)
    root = ET.fromstring(lms.moodle_xml(variants, lang=lang).encode("utf-8"))
    assert root.tag == "quiz"
    questions = root.findall("question")
    assert all(q.get("type") in ("category", "cloze") for q in questions)
    expected_seeds = [seed, seed + 1]
    categories = [q for q in questions if q.get("type") == "category"]
    assert [c.findtext("category/text").rsplit("seed ", 1)[1] for c in categories] == [str(s) for s in expected_seeds]
    blocks = []
    for q in questions:
        if q.get("type") == "category":
            blocks.append([])
        else:
            blocks[-1].append(q)
    for s, block in zip(expected_seeds, blocks):
        trace, key = _truth(n, d, heads, s)
        assert len(block) == len(trace.steps)  # one question per step to fill
        for q, step in zip(block, trace.steps):
            assert _children(q)[:2] == ["name", "questiontext"]
            assert q.findtext("name/text").endswith(f": {step.key}")
            assert q.find("questiontext").get("format") == "html"
            text = q.findtext("questiontext/text")
            blanks = CLOZE.findall(text)
            got = np.array([float(a) for a, _ in blanks]).reshape(np.shape(key[step.key]))
            assert got.tolist() == key[step.key], (s, step.key)
            exact = np.asarray(trace.step(step.id, step.head).value, dtype=float)
            assert np.abs(got - exact).max() <= 0.5e-4 + 1e-12
            # half a unit of the 4th decimal (the key is the true value rounded), plus the check's tie slack
            assert all(0.5e-4 <= float(t) <= 0.5e-4 + 1e-8 * max(1, abs(float(a))) for a, t in blanks)
            assert q.findtext("hidden") == "0" and q.find("generalfeedback") is not None


def test_moodle_tolerance_accepts_exactly_what_check_accepts():
    """On answers typed with 4 decimals, |x - key| <= tolerance iff `attntrace check` says right."""
    trace, key = _truth(3, 4, 2, 205)
    for step in trace.steps:
        exact = np.asarray(step.value, dtype=float)
        for (i, j), want in np.ndenumerate(np.asarray(key[step.key])):
            for k in range(-3, 4):
                typed = f"{want + k * 1e-4:.4f}"
                entry = Entry(float(typed), typed, "decimal", 4)
                lms_ok = abs(float(typed) - want) <= lms.tolerance(want) * (1 + 1e-12)
                assert lms_ok == entry.matches(float(exact[i, j])), (step.key, i, j, typed)


def test_titles_and_user_text_are_escaped():
    spec = exercise_spec(2, 4, 1, 3)
    spec["title"] = 'Evil <script>alert("x")</script> & ]]> {1:NUMERICAL:=9:9}'
    variant = lms.Variant(3, spec, attntrace.run(spec))
    for xml_text in (lms.moodle_xml([variant]), lms.qti_xml([variant])):
        root = ET.fromstring(xml_text.encode("utf-8"))
        texts = [t for t in root.itertext()]
        html_text = "".join(texts)
        assert "<script>" not in html_text and "&lt;script&gt;" in html_text
        assert "&amp; ]]&gt;" in html_text


# --------------------------------------------------------------------------- QTI 1.2


def _package(n, d, heads, seed, variants=1, lang="en"):
    data = lms.qti_package(lms.make_variants(n, d, heads, seed, variants=variants), lang=lang)
    z = zipfile.ZipFile(io.BytesIO(data))
    manifest = ET.fromstring(z.read("imsmanifest.xml"))
    return z, manifest


@pytest.mark.parametrize("n,d,heads,seed", CONFIGS)
def test_qti_package_structure_and_answers(n, d, heads, seed):
    z, manifest = _package(n, d, heads, seed, variants=2, lang="zh")
    assert manifest.tag == f"{CP}manifest"
    assert _children(manifest) == [f"{CP}metadata", f"{CP}organizations", f"{CP}resources"]
    resources = manifest.findall(f"{CP}resources/{CP}resource")
    assert len(resources) == 1 and resources[0].get("type") == "imsqti_xmlv1p2"
    href = resources[0].get("href")
    assert resources[0].find(f"{CP}file").get("href") == href and href in z.namelist()

    root = ET.fromstring(z.read(href))
    assert root.tag == f"{QTI}questestinterop"
    assessment = root.find(f"{QTI}assessment")
    assert assessment.get("ident") and assessment.get("title")
    sections = assessment.findall(f"{QTI}section")
    assert len(sections) == 1
    items = sections[0].findall(f"{QTI}item")
    idents = [it.get("ident") for it in items]
    assert len(set(idents)) == len(idents)
    expected = []
    for s in (seed, seed + 1):
        trace, key = _truth(n, d, heads, s)
        for step in trace.steps:
            for (i, j), v in np.ndenumerate(np.asarray(key[step.key])):
                expected.append((s, step.key, i + 1, j + 1, v))
    assert len(items) == len(expected)
    for item, (s, step_key, i, j, value) in zip(items, expected):
        assert item.get("title") .startswith(f"seed {s}, step ") and item.get("title").endswith(f"{step_key} ({i}, {j})")
        assert _children(item) == [f"{QTI}itemmetadata", f"{QTI}presentation", f"{QTI}resprocessing"]
        fields = {f.findtext(f"{QTI}fieldlabel"): f.findtext(f"{QTI}fieldentry")
                  for f in item.iter(f"{QTI}qtimetadatafield")}
        assert fields["question_type"] == "numerical_question"
        presentation = item.find(f"{QTI}presentation")
        assert _children(presentation) == [f"{QTI}material", f"{QTI}response_str"]
        assert presentation.find(f"{QTI}material/{QTI}mattext").get("texttype") == "text/html"
        response = presentation.find(f"{QTI}response_str")
        assert response.get("ident") == "response1" and response.get("rcardinality") == "Single"
        assert response.find(f"{QTI}render_fib/{QTI}response_label") is not None
        processing = item.find(f"{QTI}resprocessing")
        assert _children(processing) == [f"{QTI}outcomes", f"{QTI}respcondition"]
        assert processing.find(f"{QTI}outcomes/{QTI}decvar").get("varname") == "SCORE"
        condition = processing.find(f"{QTI}respcondition")
        assert _children(condition) == [f"{QTI}conditionvar", f"{QTI}setvar"]
        within = condition.find(f"{QTI}conditionvar")
        assert _children(within) == [f"{QTI}vargte", f"{QTI}varlte"]  # a range, no margin
        low = float(within.findtext(f"{QTI}vargte"))
        high = float(within.findtext(f"{QTI}varlte"))
        slack = 2e-9 * max(1, abs(value))  # the check's tie slack, 1e-9 max(1, |x|), and the 10 digits written
        assert low == pytest.approx(value - 0.5e-4, abs=slack) and high == pytest.approx(value + 0.5e-4, abs=slack)
        assert all(el.get("respident") == "response1" for el in within)
        assert condition.findtext(f"{QTI}setvar") == "100"


def test_qti_package_is_reproducible():
    a = lms.qti_package(lms.make_variants(2, 4, 1, 5))
    b = lms.qti_package(lms.make_variants(2, 4, 1, 5))
    assert a == b


@pytest.mark.parametrize("variants", [0, 51, True, 2.5])
def test_bad_variants(variants):
    with pytest.raises(BadInput, match="variants"):
        lms.make_variants(2, 4, 1, 0, variants=variants)


# --------------------------------------------------------------------------- CLI


def test_cli_moodle(tmp_path, capsys):
    assert cli.main(["exercise", "--n", "3", "--d", "4", "--heads", "2", "--seed", "205",
                     "--format", "moodle", "--variants", "3"]) == 0
    root = ET.fromstring(capsys.readouterr().out.encode("utf-8"))
    assert len(root.findall("question[@type='category']")) == 3
    out = tmp_path / "quiz.xml"
    assert cli.main(["exercise", "--format", "moodle", "--lang", "zh", "-o", str(out)]) == 0
    assert ET.parse(out).getroot().tag == "quiz"


def test_cli_qti(tmp_path, capsys):
    out = tmp_path / "quiz.zip"
    assert cli.main(["exercise", "--n", "2", "--d", "2", "--heads", "2", "--format", "qti",
                     "--variants", "2", "-o", str(out)]) == 0
    assert "imsmanifest.xml" in zipfile.ZipFile(out).namelist()
    assert cli.main(["exercise", "--format", "qti"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-o FILE.zip" in err
    assert cli.main(["exercise", "--format", "moodle", "--key"]) == 2


def test_question_math_parses_with_katex(katex):
    """The LaTeX in the questions' HTML (typeset by the LMS's MathJax filter) parses."""
    import html

    spans = []
    for xml_text in (lms.moodle_xml(lms.make_variants(3, 4, 2, 7), lang="zh"), lms.qti_xml(lms.make_variants(2, 8, 2, 3))):
        for text in ET.fromstring(xml_text.encode("utf-8")).itertext():
            body = html.unescape(text)
            spans += [(m, False) for m in re.findall(r"\\\((.+?)\\\)", body, re.S)]
            spans += [(m, True) for m in re.findall(r"\\\[(.+?)\\\]", body, re.S)]
    spans = list(dict.fromkeys(spans))
    assert len(spans) > 20
    assert katex(spans) == []


# --------------------------------------------------------------------------- Moodle feedback on usual mistakes

from attntrace.teach import feedback  # noqa: E402

CLOZE_BLANK = re.compile(r"\{1:NUMERICAL:((?:\\.|[^\\}])*)\}")


def _moodle_answers(blank: str) -> list[tuple[str, float, float, str]]:
    """A blank's answers as Moodle's Cloze parser reads them: split at unescaped ~, each
    [%percent% or =]value:tolerance[#feedback], escapes \\{ \\} \\~ \\# \\\\ undone."""
    parts = re.split(r"(?<!\\)~", blank)
    out = []
    for part in parts:
        m = re.fullmatch(r"(=|%(\d+)%)([^:#]+):([^#]+)(?:#(.*))?", part, re.S)
        assert m, part
        percent = "100" if m.group(1) == "=" else m.group(2)
        text = re.sub(r"\\(.)", r"\1", m.group(5) or "")
        out.append((percent, float(m.group(3)), float(m.group(4)), text))
    return out


def _softmax_rows(t):
    e = np.exp(t - t.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("n,d,heads,seed", [(3, 4, 2, 205), (3, 4, 1, 7)])
def test_mistake_values_are_what_the_mistakes_give_and_what_check_says(n, d, heads, seed):
    """Each alternative is the value of its mistake (NumPy, from the right earlier steps, for the
    ones computed here) and `attntrace check` gives that matrix the same sentence."""
    trace, key = _truth(n, d, heads, seed)
    values = feedback.mistake_values(trace, "en")
    tag = "@1" if heads > 1 else ""
    s = np.asarray(trace.step("scores", 1 if heads > 1 else None).value)
    t = np.asarray(trace.step("scaled", 1 if heads > 1 else None).value)
    q = np.asarray(trace.step("Q", 1 if heads > 1 else None).value)
    k = np.asarray(trace.step("K", 1 if heads > 1 else None).value)
    expected = {"scaled" + tag: [s], "scores" + tag: [k @ q.T],
                "weights" + tag: [t, np.exp(t - t.max(axis=0)) / np.exp(t - t.max(axis=0)).sum(axis=0)]}
    for step_key, wants in expected.items():
        got = [np.asarray(m) for m, _ in values[step_key]]
        for want in wants:
            assert any(np.allclose(g, want, atol=1e-12) for g in got), step_key
    if heads > 1:
        concat = np.asarray(trace.step("concat").value)
        assert any(np.allclose(np.asarray(m), concat, atol=1e-12) for m, _ in values["output"])
    for step_key, alternatives in values.items():
        for matrix, sentence in alternatives:
            answer = dict(key)
            answer[step_key] = np.round(np.asarray(matrix), 6).tolist()
            report = attntrace.check(trace, answer)
            result = report.step(*([step_key.split("@")[0], int(step_key.split("@")[1])] if "@" in step_key else [step_key]))
            assert result.status == "wrong", (step_key, sentence)
            said = [result.diagnosis.message("en")] + [a.message("en") for a in result.diagnosis.alternatives]
            assert " ".join(sentence.split()) in [" ".join(x.split()) for x in said], (step_key, sentence, said)


def test_moodle_blanks_offer_the_usual_mistakes_with_feedback():
    variants = lms.make_variants(3, 4, 2, 205)
    root = ET.fromstring(lms.moodle_xml(variants, lang="en").encode("utf-8"))
    trace, key = _truth(3, 4, 2, 205)
    values = feedback.mistake_values(trace, "en")
    sentences = {}
    for q in root.findall("question[@type='cloze']"):
        step_key = q.findtext("name/text").rsplit(": ", 1)[1]
        blanks = CLOZE_BLANK.findall(q.findtext("questiontext/text"))
        assert len(blanks) == np.size(key[step_key])
        for (i, j), blank in zip(np.ndindex(np.shape(key[step_key])), blanks):
            answers = _moodle_answers(blank)
            assert answers[0][0] == "100" and answers[0][1] == key[step_key][i][j]
            for percent, value, tol, text in answers[1:]:
                assert percent == "0" and text
                # the alternative is that mistake's value at this entry, apart from the key
                assert any(abs(value - round(m[i][j], 4)) < 1e-9 and " ".join(text.split()) == s
                           for m, s in values[step_key]), (step_key, i, j, value)
                assert abs(value - answers[0][1]) > answers[0][2] + tol
                sentences[text] = step_key
    # at least 10 different mistakes get their own feedback in this quiz
    codes = {c for c in lms_codes(trace, sentences)}
    assert len(codes) >= 10, codes


def lms_codes(trace, sentences):
    """The checker's codes whose sentence appears as feedback."""
    from attntrace.grading.diagnose import World, diagnosis_params
    from attntrace.grading.reports import messages

    world, text = World(trace), messages("en", None, "text")
    for m in world.mutations:
        for step in trace.steps:
            if m.changes(step.id):
                sentence = " ".join(text.diagnosis(m.code, diagnosis_params(world, step, m)).split())
                if sentence in sentences:
                    yield m.code


def test_moodle_cloze_markup_in_user_text_is_escaped():
    spec = exercise_spec(2, 4, 1, 3)
    spec["title"] = r"Try {1:NUMERICAL:=9:9} ~ # \ braces"
    variant = lms.Variant(3, spec, attntrace.run(spec))
    root = ET.fromstring(lms.moodle_xml([variant]).encode("utf-8"))
    trace = variant.trace
    for q in root.findall("question[@type='cloze']"):
        text = q.findtext("questiontext/text")
        step_key = q.findtext("name/text").rsplit(": ", 1)[1]
        # exactly one blank per entry: the title's markup is not a blank
        unescaped = re.sub(r"\\.", "", text)
        assert len(re.findall(r"\{1:NUMERICAL:", unescaped)) == np.size(trace.step(step_key).value)
        assert r"\{1:NUMERICAL:=9:9\} \~ \# \\ braces" in text


# --------------------------------------------------------------------------- XSD validation

SCHEMAS = Path(__file__).resolve().parents[2] / "shared" / "lms-schemas"


def _schema(path: Path):
    lxml_etree = pytest.importorskip("lxml.etree") if not in_ci() else __import__("lxml.etree").etree
    if not path.exists():
        if in_ci():
            pytest.fail(f"required under CI: {path}", pytrace=False)
        pytest.skip(f"missing {path}")

    class LocalXml(lxml_etree.Resolver):  # the XSDs import xml.xsd from the web; tests run offline
        def resolve(self, url, pubid, context):
            if url.endswith("xml.xsd"):
                return self.resolve_filename(str(SCHEMAS / "moodle-cc-schemas" / "schemas" / "xml.xsd"), context)
            return None

    parser = lxml_etree.XMLParser()
    parser.resolvers.add(LocalXml())
    return lxml_etree, lxml_etree.XMLSchema(lxml_etree.parse(str(path), parser))


@pytest.mark.parametrize("n,d,heads,seed", [(3, 4, 1, 7), (2, 8, 2, 3)])
def test_qti_package_validates_against_the_qti_and_cp_schemas(n, d, heads, seed):
    etree, qti = _schema(SCHEMAS / "moodle-cc-schemas" / "schemas" / "domainProfile_4" / "ims_qtiasiv1p2.xsd")
    _, cp = _schema(SCHEMAS / "canvas-QTIMigrationTool" / "imscp_v1p1.xsd")
    z, _ = _package(n, d, heads, seed, variants=2)
    quiz = etree.fromstring(z.read(z.namelist()[1]))
    assert qti.validate(quiz), qti.error_log
    assert cp.validate(etree.fromstring(z.read("imsmanifest.xml"))), cp.error_log
    # the schema can fail: a respcondition with no conditionvar is refused
    broken = etree.fromstring(z.read(z.namelist()[1]))
    for cv in broken.iter("{http://www.imsglobal.org/xsd/ims_qtiasiv1p2}conditionvar"):
        cv.getparent().remove(cv)
        break
    assert not qti.validate(broken)
