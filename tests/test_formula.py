"""Formula trees (attntrace.model.formula) and their three printers (attntrace.rendering.formulatext).

The oracles are real parsers: KaTeX parses every LaTeX print of every step of every example and
every mode, and an XML parser reads every MathML print (MathML Core elements only). The plain
print must hold no LaTeX. A handful of prints are pinned to the strings the reports and the JSON
export carried before the trees (the article's notation), each checked by hand.
"""

from __future__ import annotations

import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import attntrace
from attntrace.model import formula as F
from attntrace.model.errors import BadInput
from attntrace.rendering.formulatext import MathMLPrinter, TexPrinter, headed, mathml, plain, tex

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MATHML_CORE = {"math", "mrow", "mi", "mn", "mo", "msub", "msup", "msubsup", "mfrac", "msqrt", "mover", "munder",
               "mtable", "mtr", "mtd", "mtext", "mspace"}


def _example_traces():
    for path in sorted(EXAMPLES.glob("*.toml")):
        if path.name.endswith(".answer.toml"):
            continue
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
        for mode in ("numeric", "exact", "symbolic", "shape"):
            try:
                yield path.stem, mode, attntrace.run({**spec, "mode": mode})
            except attntrace.BadInput:
                continue  # a mode the example cannot run in (symbols in numeric mode, too large, ...)


@pytest.fixture(scope="module")
def steps():
    return [(name, mode, s) for name, mode, t in _example_traces() for s in t.steps]


def test_every_step_formula_is_its_tree_printed_and_katex_parses_it(steps, katex):
    assert len(steps) > 300
    spans = []
    for _, _, s in steps:
        assert s.formula == tex(s.expr) and s.plain == plain(s.expr)
        spans.append((s.formula, True))
    assert katex(spans) == []


def test_plain_prints_hold_no_latex(steps):
    for name, mode, s in steps:
        assert "\\" not in s.plain and "{" not in s.plain.replace("{Q", "").replace("{K", ""), (name, mode, s.key, s.plain)


def test_mathml_prints_are_mathml_core(steps):
    for name, mode, s in steps:
        text = mathml(s.expr, display=True)
        root = ET.fromstring(text)
        assert root.tag == "math"
        tags = {e.tag for e in root.iter()}
        assert tags <= MATHML_CORE, (name, s.key, tags - MATHML_CORE)


def test_the_article_notation_prints_as_before():
    """Checked by hand against the reports before the trees (and the 2017 paper's notation)."""
    q, k = F.sym("Q").head(2), F.sym("K").head(2)
    assert tex(F.sym("S").head(2).eq(q * k.T())) == "S^{(2)} = Q^{(2)} K^{(2)\\top}"
    assert plain(F.sym("S").head(2).eq(q * k.T())) == "S(2) = Q(2) K(2)^T"
    scaled = F.sym("T").eq(F.sym("S") / F.Sqrt(F.sym("d", "k")))
    assert (tex(scaled), plain(scaled)) == ("T = \\frac{S}{\\sqrt{d_k}}", "T = S / sqrt(d_k)")
    e, t = F.sym("e"), F.sym("t")
    softmax = F.Parts((F.sym("A").eq(F.Func("softmax", (F.sym("T"),), sized=True)),
                       F.sym("a").at("i", "j").eq(F.Power(e, t.at("i", "j")) / F.Sum(F.sym("k"), F.Power(e, t.at("i", "k"))))))
    assert tex(softmax) == "A = \\operatorname{softmax}\\left(T\\right), \\quad a_{ij} = \\frac{e^{t_{ij}}}{\\sum_{k} e^{t_{ik}}}"
    assert plain(softmax) == "A = softmax(T),  a_ij = e^(t_ij) / sum_k e^(t_ik)"
    tilde = F.sym("T", accent="tilde").head(1).at("i", "j")
    assert (tex(tilde), plain(tilde)) == ("\\tilde{T}^{(1)}_{ij}", "T~^(1)_ij")


def test_substitute_puts_an_entry_into_the_general_formula():
    h = F.sym("h").at("i", "j")
    relu = F.Func("max", (F.Num(0), h))
    assert tex(F.substitute(relu, {h: "-1.2"})) == "\\max(0, -1.2)"
    assert plain(F.substitute(relu, {h: "h_23"})) == "max(0, h_23)"
    assert F.substitute(relu, {F.sym("x"): "1"}) is relu  # nothing to replace: the same tree


def test_after_lhs_and_first_part():
    f = F.Parts((F.sym("G").eq(F.Func("ReLU", (F.sym("H"),))), F.sym("g").at("i", "j").eq(F.Func("max", (F.Num(0), F.sym("h").at("i", "j"))))))
    assert tex(F.first_part(f)) == "G = \\operatorname{ReLU}(H)"
    assert tex(F.after_lhs(f)) == "\\operatorname{ReLU}(H), \\quad g_{ij} = \\max(0, h_{ij})"
    assert tex(F.lhs(f)) == "G"


def test_printer_settings_are_validated():
    with pytest.raises(TypeError, match="unknown printer setting"):
        TexPrinter(display=True)
    assert MathMLPrinter(display=True)(F.sym("x")).startswith('<math display="block">')


def test_a_printer_refuses_what_it_cannot_print():
    with pytest.raises(TypeError, match="cannot print"):
        tex(F.Rel((F.sym("x"), object())))  # type: ignore[arg-type]


def test_the_views_options_print_as_their_hand_written_strings_did(katex):
    """The nodes' options that replaced hand-written (TeX, plain) pairs in the views: each TeX print
    is the string main's view wrote (KaTeX parses it), the MathML is Core, the plain has no LaTeX."""
    r, i = F.sym("r"), F.sym("i")
    two_i = F.Juxt((F.Num(2), i), tight=True)
    pair = F.Index(F.sym("q", accent="tilde"), (r, i), comma=True)
    blocks = F.to(F.Hcat((F.Shape(3, 2), F.Shape(3, 1)), inline=True), F.Shape(3, 3))
    cases = F.sym("c", "i").eq(F.Cases(((F.Num(1), F.Rel((F.sym("lambda", "i"), F.Num(4)), ("lt",))),
                                        (F.Num(0), F.Rel((F.sym("lambda", "i"), F.Num(16)), ("gt",))))))
    mu = F.sym("mu").eq(F.Juxt((F.Num(0.1), F.Func("ln", (F.Num(32),), bare=True))) + 1)
    expected = [
        (F.Add((two_i, F.Neg(F.Num(1))), tight=True), "2i-1", "2i-1"),
        (pair, "\\tilde{q}_{r,i}", "q~_(r,i)"),
        (blocks, "\\bigl[(3 \\times 2)\\ \\ (3 \\times 1)\\bigr] \\to (3 \\times 3)", "[(3 x 2)  (3 x 1)] -> (3 x 3)"),
        (cases, "c_i = \\begin{cases} 1 & \\lambda_i < 4 \\\\ 0 & \\lambda_i > 16 \\end{cases}",
         "c_i = 1 (lambda_i < 4), 0 (lambda_i > 16)"),
        (mu, "\\mu = 0.1 \\ln 32 + 1", "mu = 0.1 ln(32) + 1"),
    ]
    for tree, want_tex, want_plain in expected:
        assert (tex(tree), plain(tree)) == (want_tex, want_plain)
        root = ET.fromstring(mathml(tree, display=True))
        assert {e.tag for e in root.iter()} <= MATHML_CORE
    assert katex([(t, True) for _, t, _ in expected]) == []


def test_a_calligraphic_set_prints_apart_from_its_letter():
    """The chosen experts 𝒯_i (a set) print \\mathcal in TeX, script in MathML and a word in plain
    text, so none of them reads as the scaled scores T."""
    from attntrace.model.formula import sym

    chosen = sym("T", "i", style="calligraphic")
    assert chosen.text("tex") == "\\mathcal{T}_i"
    assert chosen.text("plain") == "TopK_i"
    assert '<mi mathvariant="script">T</mi>' in chosen.text("mathml")


def test_head_filter_prints_a_name_of_one_head_from_its_tree():
    """The prose templates' `head` filter: the head superscript comes from the printers, as in
    the step formulas (Q^{(2)} beside Q(2)); a single-head step (head 0) keeps the bare name."""
    assert (headed("Q", 2), headed("Q", 2, "plain")) == ("Q^{(2)}", "Q(2)")
    assert (headed("W_K", 1), headed("\\lambda", 3), headed("s", 0)) == ("W_K^{(1)}", "\\lambda^{(3)}", "s")
    for bad in (("Q^{(2)}", 1, "tex"), ("Q", -1, "tex"), ("Q", 1, "mathml"), ("Q", True, "tex")):
        with pytest.raises(BadInput, match="^head: expected"):
            headed(*bad)


def _node_types(base=F.Node):
    return [s for t in base.__subclasses__() for s in (t, *_node_types(t))]


def test_every_node_type_stores_its_fields_as_a_frozen_value():
    """Each type's written-out constructor: positional and keyword arguments, defaults filled,
    every field stored, equality and hash by the fields, no assignment."""
    from dataclasses import FrozenInstanceError

    types = [t for t in _node_types() if t.__module__ == F.__name__]
    assert len(types) > 25
    for t in types:
        assert "__init__" in t.__dict__, t
        values = tuple(object() for _ in t._fields)
        by_position, by_name = t(*values), t(**dict(zip(t._fields, values)))
        for node in (by_position, by_name):
            assert node.field_values() == values and [getattr(node, f) for f in t._fields] == list(values)
        assert by_position == by_name and hash(by_position) == hash(by_name)
        shortest = t(*values[:t._required])
        assert shortest.field_values() == values[:t._required] + t._defaults
        if t._fields:
            with pytest.raises(FrozenInstanceError):
                setattr(by_position, t._fields[0], 1)
            assert by_position.replace(**{t._fields[0]: 1}).field_values() == (1,) + values[1:]
        with pytest.raises(TypeError):
            t(*values, object())


def test_a_constructor_that_is_not_the_fields_is_refused():
    with pytest.raises(TypeError, match="fields"):
        class Bad(F.Node):  # noqa: F841
            a: int
            b: int = 0

            def __init__(self, a, c=0):
                pass
    with pytest.raises(TypeError, match="fields"):
        class BadDefault(F.Node):  # noqa: F841
            a: int = 1

            def __init__(self, a=2):
                pass

    class Generic(F.Node):  # no constructor of its own: the generic one
        a: int
        b: int = 3

    assert Generic(1).field_values() == (1, 3) and Generic(b=4, a=2) == Generic(2, 4)
