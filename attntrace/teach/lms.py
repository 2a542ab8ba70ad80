"""Exercises as quizzes for learning-management systems: Moodle XML and QTI 1.2 (Canvas).

    >>> from attntrace.teach import lms
    >>> variants = lms.make_variants(n=3, d=4, heads=1, seed=7, variants=3)  # seeds 7, 8, 9
    >>> xml_text = lms.moodle_xml(variants, lang="en")        # `attntrace exercise --format moodle`
    >>> zip_bytes = lms.qti_package(variants, lang="en")      # `attntrace exercise --format qti -o quiz.zip`

Both show every variant's given matrices (LaTeX between \\( \\) and \\[ \\], which the MathJax
filters of Moodle and Canvas typeset) and ask for every step of the trace, in trace order.

- Moodle: one Cloze question (type "cloze", Moodle's "embedded answers") per step, with one
  NUMERICAL blank {1:NUMERICAL:=answer:tolerance} per entry of the step's matrix. Each
  variant gets its own question category ($course$/top/attntrace .../seed N), so a quiz
  can draw a random variant per step.
- QTI 1.2: Canvas's numerical question has a single blank, so every entry is one item
  (question_type numerical_question), titled with the variant, step and entry; the
  package is a zip with imsmanifest.xml (IMS Content Packaging 1.1) and one assessment.
  Each answer is a range (vargte, varlte: Canvas's "answer in the range") rather than an exact
  answer with a margin, since Canvas turns a margin below 1e-4 into zero. The items meet the
  QTI 1.2 XSD and the manifest the CP 1.1 XSD; they do not meet the Common Cartridge profile of
  QTI, which has no vargte/varlte (its numerical answers are exact strings): a Canvas QTI zip
  is imported by Canvas's QTI converter, not as a Common Cartridge.
- Moodle: each blank also lists the values the usual mistakes give at that entry (no scaling,
  K Q^T, the softmax down the columns, ... from `teach.feedback`) at 0 % with the checker's
  sentence as feedback; user text and feedback have Cloze's markup characters escaped.

The answers are the answer key (`answerkey.answer_key`, the exact value rounded to 4
decimals) and the tolerance is the one `attntrace check` applies to an entry written with 4
decimals (`answer.Policy`: half a unit in the 4th decimal, plus the check's 1e-9 slack for
ties). On answers typed with 4 decimals the LMS accepts exactly what `attntrace check`
accepts, except that a true value exactly halfway between two 4-decimal numbers is accepted
rounded either way by the check and only as the key's rounding by the LMS.

All XML is built with xml.etree; user text (titles, a template folder's prose) is cleaned of
controls and noncharacters (`attntrace.inputs.safetext`: U+FFFF made the XML unparseable) and
HTML-escaped before it goes into the HTML of a question, and ElementTree escapes that for XML.
"""

from __future__ import annotations

import html
import io
import math
import re
import zipfile
from dataclasses import dataclass
from xml.etree import ElementTree as ET

from attntrace.grading.answer import Entry
from attntrace.inputs.safetext import clean_output, clean_text
from attntrace.model.errors import BadInput
from attntrace.model.trace import Trace
from attntrace.teach import feedback

#: The answers are asked "rounded to 4 decimals" (worksheet's round_note).
DECIMALS = 4
MAX_VARIANTS = 50
QTI_NS = "http://www.imsglobal.org/xsd/ims_qtiasiv1p2"
QTI_XSD = "http://www.imsglobal.org/xsd/ims_qtiasiv1p2p1.xsd"
IMSCP_NS = "http://www.imsglobal.org/xsd/imscp_v1p1"
IMSCP_XSD = "http://www.imsglobal.org/xsd/imscp_v1p1.xsd"
XSI = "http://www.w3.org/2001/XMLSchema-instance"


@dataclass(frozen=True)
class Variant:
    seed: int
    spec: dict
    trace: Trace


def make_variants(n: int = 2, d: int = 4, heads: int = 1, seed: int = 0, variants: int = 1) -> list[Variant]:
    """`variants` exercises with the seeds seed, seed + 1, ..."""
    from attntrace.teach.exercise import make_exercise

    if isinstance(variants, bool) or not isinstance(variants, int) or not 1 <= variants <= MAX_VARIANTS:
        raise BadInput(f"variants must be an integer from 1 to {MAX_VARIANTS}, not {variants!r}")
    out = []
    for s in range(seed, seed + variants):
        spec, trace = make_exercise(n, d, heads, s)
        out.append(Variant(s, spec, trace))
    return out


def tolerance(expected: float) -> float:
    """What `attntrace check` allows around `expected` for an entry written with 4 decimals."""
    return Entry(expected, "0." + "0" * DECIMALS, "decimal", DECIMALS).tolerance(expected)


def _num(x: float) -> str:
    """A number for the XML: at most 10 significant digits, no trailing zeros, no -0."""
    text = f"{float(x):.10g}"
    return "0" if text in ("-0", "0") else text


def _answers(trace: Trace) -> list[tuple]:
    """(step, its answer-key matrix) in trace order."""
    from attntrace.teach.answerkey import answer_key, answer_name

    key = answer_key(trace)
    return [(step, key[answer_name(step)]) for step in trace.steps]


# --------------------------------------------------------------------------- question text (HTML)


class Prose:
    """The worksheet's prose (templates/exercise/prose/{lang}.j2) as HTML."""

    def __init__(self, lang: str, template_dir=None):
        from attntrace.rendering.jinja_env import user_template_errors
        from attntrace.rendering.renderer import environment

        if lang not in ("en", "zh"):
            raise BadInput(f"lang must be en or zh, not {lang!r}")
        env = environment(template_dir)
        with user_template_errors(env, template_dir):
            self.p = env.get_template(f"exercise/prose/{lang}.j2").make_module({})
        self.lang = lang

    def __call__(self, name: str) -> str:
        from attntrace.teach.prosemarkup import prose_markup

        return prose_markup(getattr(self.p, name), "html")

    def step_title(self, number: int, step) -> str:
        from attntrace.teach.prosemarkup import prose_markup

        p = self.p
        head = f" ({html.escape(clean_text(p.head))} {step.head})" if step.head else ""
        number_text = f"{clean_text(p.step)} {number} 步" if self.lang == "zh" else f"{clean_text(p.step)} {number}"
        return f"{html.escape(str(number_text))}: {prose_markup(p.names[step.id], 'html')}{head}"


def _math(tex: str, display: bool = False) -> str:
    tex = html.escape(tex, quote=False)
    return f"\\[ {tex} \\]" if display else f"\\( {tex} \\)"


def given_html(variant: Variant, prose: Prose, escape=lambda text: text) -> str:
    """The given matrices as HTML; `escape` first applies to the user's title (Moodle Cloze)."""
    from attntrace.teach.worksheet import worksheet_view

    view = worksheet_view(variant.spec, variant.trace)
    parts = [f"<p>{html.escape(escape(clean_text(variant.spec['title'])), quote=False)}</p>",
             f"<p>{prose('intro')} " + _math("n = %d,\\ d_{\\text{model}} = %d,\\ h = %d,\\ d_k = %d"
                                              % (view["n"], view["d"], view["heads"], view["d_k"])) + "</p>",
             f"<p><strong>{prose('given')}</strong></p>"]
    parts += [f"<p>{_math(g['name'] + ' = ' + g['tex'], display=True)}</p>" for g in view["given"]]
    if view["split"]:
        parts.append(f"<p>{prose('split_note')}</p>")
    return "\n".join(parts)


def step_html(variant: Variant, prose: Prose, number: int, step) -> str:
    from attntrace.teach.worksheet import root_note

    parts = [f"<p><strong>{prose.step_title(number, step)}</strong></p>",
             f"<p>{_math(step.formula, display=True)}</p>"]
    hint = f"hint_{step.id}"  # the prose's hint for this step, if it has one
    if hasattr(prose.p, hint):
        root = root_note(step)
        parts.append(f"<p>{prose(hint)}" + (f" {_math(root)}" if root else "") + "</p>")
    parts.append(f"<p>{prose('round_note')}</p>")
    return "\n".join(parts)


def _lhs_html(step) -> str:
    from attntrace.teach.worksheet import step_name

    return _math(step_name(step.id, step.head))


# --------------------------------------------------------------------------- Moodle XML


def _text_element(parent, tag: str, text: str, format: str | None = None):
    el = ET.SubElement(parent, tag, {"format": format} if format else {})
    ET.SubElement(el, "text").text = text
    return el


def cloze_escape(text: str) -> str:
    """Text inside Moodle Cloze markup: a backslash before each of \\ { } ~ # (Moodle's Cloze
    parser reads them as markup, so a title with {1:NUMERICAL:=9} would become a blank)."""
    return re.sub(r"([\\{}~#])", r"\\\1", text)


def _cloze_blank(value: float, alternatives=()) -> str:
    """A NUMERICAL blank: the key at 100 %, then each usual mistake's value at 0 % with the
    checker's sentence as feedback ({1:NUMERICAL:=key:tol~%0%wrong:tol#feedback})."""
    answers = ["=%s:%s" % (_num(value), _num(tolerance(value)))]
    answers += ["%%0%%%s:%s#%s" % (_num(wrong), _num(tolerance(wrong)), feedback) for wrong, feedback in alternatives]
    return "{1:NUMERICAL:%s}" % "~".join(answers)


def _entry_alternatives(wrongs, i: int, j: int, value: float) -> list[tuple[float, str]]:
    """The usual mistakes' values at entry (i, j) that a student can tell from the key (outside
    both tolerances) and from each other, first sentence kept."""
    out: list[tuple[float, str]] = []
    for matrix, message in wrongs:
        wrong = round(float(matrix[i][j]), DECIMALS)
        if not math.isfinite(wrong) or abs(wrong - value) <= tolerance(value) + tolerance(wrong):
            continue
        if any(abs(wrong - w) <= tolerance(w) + tolerance(wrong) for w, _ in out):
            continue
        out.append((wrong, message))
    return out


def moodle_quiz(variants: list[Variant], lang: str = "en", template_dir=None) -> ET.Element:
    """The Moodle XML <quiz> element: per variant a category and one Cloze question per step."""
    prose = Prose(lang, template_dir)
    quiz = ET.Element("quiz")
    for v in variants:
        n, d = len(v.spec["X"]), len(v.spec["X"][0])
        heads = v.trace.num_heads
        category = ET.SubElement(quiz, "question", {"type": "category"})
        _text_element(category, "category", f"$course$/top/attntrace n={n} d={d} heads={heads}/seed {v.seed}")
        given = given_html(v, prose, escape=cloze_escape)
        wrongs = feedback.mistake_values(v.trace, lang, template_dir)
        for number, (step, matrix) in enumerate(_answers(v.trace), start=1):
            q = ET.SubElement(quiz, "question", {"type": "cloze"})
            _text_element(q, "name", f"seed {v.seed}, step {number}: {step.key}")
            mine = [(m, html.escape(cloze_escape(text), quote=False)) for m, text in wrongs.get(step.key, [])]
            rows = "".join("<tr>" + "".join(f"<td>{_cloze_blank(x, _entry_alternatives(mine, i, j, x))}</td>"
                                            for j, x in enumerate(row)) + "</tr>"
                           for i, row in enumerate(matrix))
            body = (f"{given}\n{step_html(v, prose, number, step)}\n"
                    f"<p>{_lhs_html(step)} =</p>\n<table class=\"attntrace-matrix\">{rows}</table>")
            _text_element(q, "questiontext", body, "html")
            _text_element(q, "generalfeedback", "", "html")
            ET.SubElement(q, "penalty").text = "0.3333333"
            ET.SubElement(q, "hidden").text = "0"
            ET.SubElement(q, "idnumber").text = f"attntrace-{n}-{d}-{heads}-{v.seed}-{step.key.replace('@', '-h')}"
    return quiz


def _document(root: ET.Element) -> str:
    """The XML document of `root`, indented. ElementTree writes any character as it is, even
    those XML 1.0 forbids (U+FFFF, U+FFFE, C0 controls): the text was cleaned where it entered
    (prose, titles); `clean_output` removes them again, as the last line of defence."""
    ET.indent(root)
    return clean_output('<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n")


def moodle_xml(variants: list[Variant], lang: str = "en", template_dir=None) -> str:
    """Moodle XML (Question bank > Import > Moodle XML format)."""
    return _document(moodle_quiz(variants, lang, template_dir))


# --------------------------------------------------------------------------- QTI 1.2


def _field(parent, label: str, entry: str) -> None:
    f = ET.SubElement(parent, "qtimetadatafield")
    ET.SubElement(f, "fieldlabel").text = label
    ET.SubElement(f, "fieldentry").text = entry


def _numerical_item(section, ident: str, title: str, text: str, value: float) -> None:
    item = ET.SubElement(section, "item", {"ident": ident, "title": title})
    meta = ET.SubElement(ET.SubElement(item, "itemmetadata"), "qtimetadata")
    _field(meta, "question_type", "numerical_question")
    _field(meta, "points_possible", "1.0")
    presentation = ET.SubElement(item, "presentation")
    ET.SubElement(ET.SubElement(presentation, "material"), "mattext", {"texttype": "text/html"}).text = text
    response = ET.SubElement(presentation, "response_str", {"ident": "response1", "rcardinality": "Single"})
    fib = ET.SubElement(response, "render_fib", {"fibtype": "Decimal"})
    ET.SubElement(fib, "response_label", {"ident": "answer1"})
    processing = ET.SubElement(item, "resprocessing")
    ET.SubElement(ET.SubElement(processing, "outcomes"), "decvar",
                  {"maxvalue": "100", "minvalue": "0", "varname": "SCORE", "vartype": "Decimal"})
    # A range answer (Canvas: "answer in the range"), not an exact answer with a margin: Canvas
    # is reported to turn numbers below 1e-4 into zero (text2qti issue 51), which would make the
    # margin of 5e-5 zero; the bounds are numbers near the key and survive.
    condition = ET.SubElement(processing, "respcondition", {"continue": "No"})
    within = ET.SubElement(condition, "conditionvar")
    tol = tolerance(value)
    ET.SubElement(within, "vargte", {"respident": "response1"}).text = _num(value - tol)
    ET.SubElement(within, "varlte", {"respident": "response1"}).text = _num(value + tol)
    ET.SubElement(condition, "setvar", {"action": "Set", "varname": "SCORE"}).text = "100"


def _ident(*parts) -> str:
    return "attntrace_" + "_".join(str(p).replace("@", "_h") for p in parts)


def qti_assessment(variants: list[Variant], lang: str = "en", template_dir=None) -> ET.Element:
    """The QTI 1.2 <questestinterop>: one assessment, one section, one item per entry."""
    prose = Prose(lang, template_dir)
    first = variants[0]
    n, d, heads = len(first.spec["X"]), len(first.spec["X"][0]), first.trace.num_heads
    seeds = f"{variants[0].seed}" if len(variants) == 1 else f"{variants[0].seed}-{variants[-1].seed}"
    root = ET.Element("questestinterop", {"xmlns": QTI_NS, "xmlns:xsi": XSI,
                                          "xsi:schemaLocation": f"{QTI_NS} {QTI_XSD}"})
    assessment = ET.SubElement(root, "assessment", {
        "ident": _ident(n, d, heads, "seeds", seeds.replace("-", "_")),
        "title": f"attntrace exercise n = {n}, d = {d}, heads = {heads}, seeds {seeds}"})
    meta = ET.SubElement(assessment, "qtimetadata")
    _field(meta, "cc_maxattempts", "1")
    section = ET.SubElement(assessment, "section", {"ident": "root_section"})
    for v in variants:
        given = given_html(v, prose)
        for number, (step, matrix) in enumerate(_answers(v.trace), start=1):
            step_text = step_html(v, prose, number, step)
            for i, row in enumerate(matrix, start=1):
                for j, value in enumerate(row, start=1):
                    text = (f"{given}\n{step_text}\n<p>{_lhs_html(step)}: "
                            f"{html.escape(_entry_label(prose.lang, i, j))}</p>")
                    _numerical_item(section, _ident(n, d, heads, v.seed, step.key, i, j),
                                    f"seed {v.seed}, step {number} {step.key} ({i}, {j})", text, value)
    return root


def _entry_label(lang: str, i: int, j: int) -> str:
    return f"第 {i} 行第 {j} 列的元素" if lang == "zh" else f"the entry in row {i}, column {j}"


def qti_xml(variants: list[Variant], lang: str = "en", template_dir=None) -> str:
    return _document(qti_assessment(variants, lang, template_dir))


def qti_manifest(ident: str, href: str) -> str:
    root = ET.Element("manifest", {"identifier": ident + "_manifest", "xmlns": IMSCP_NS, "xmlns:xsi": XSI,
                                   "xsi:schemaLocation": f"{IMSCP_NS} {IMSCP_XSD}"})
    metadata = ET.SubElement(root, "metadata")
    ET.SubElement(metadata, "schema").text = "IMS Content"
    ET.SubElement(metadata, "schemaversion").text = "1.1.3"
    ET.SubElement(root, "organizations")
    resources = ET.SubElement(root, "resources")
    resource = ET.SubElement(resources, "resource", {"identifier": ident, "type": "imsqti_xmlv1p2", "href": href})
    ET.SubElement(resource, "file", {"href": href})
    return _document(root)


def qti_package(variants: list[Variant], lang: str = "en", template_dir=None) -> bytes:
    """A zip that Canvas imports (Settings > Import course content > QTI .zip file)."""
    root = qti_assessment(variants, lang, template_dir)
    ident = root.find("assessment").get("ident")
    href = f"{ident}/{ident}.xml"
    quiz = _document(root)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in (("imsmanifest.xml", qti_manifest(ident, href)), (href, quiz)):
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))  # reproducible bytes
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, text.encode("utf-8"))
    return buffer.getvalue()
