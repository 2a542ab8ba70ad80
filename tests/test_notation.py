"""One notation per trace (issue 21 item 5, issue 22 item 1).

Every example, in every format and in en and zh: the notation table (attntrace.kinds.notation)
gives no letter two meanings, every symbol it lists is one the report writes, the report has
the notation section with the table's words, and the JSON export carries the table. Apart from
the table, the report's math is read for the overloads issue 22 found (m as a slope or a RoPE
position next to the row maximum m_i, g for an RMSNorm gain or an activation next to the
gradients g^M, C = A B beside the weights A), so a renamed symbol cannot come back unseen.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

import attntrace
from attntrace.kinds import KINDS, kind_of
from attntrace.kinds.notation import letter_of, notation_of
from attntrace.model.trace import Operand
from attntrace.teach.examples import list_examples

EXAMPLES = [name for name, _ in list_examples()]


@pytest.fixture(scope="module")
def traces():
    return {name: attntrace.run(name) for name in EXAMPLES}


def _math(md: str) -> str:
    """Every $...$ and $$...$$ span of a Markdown report, joined."""
    return " ".join(m.group(1) or m.group(2) for m in re.finditer(r"\$\$(.+?)\$\$|\$(.+?)\$", md, re.S))


@pytest.mark.parametrize("name", EXAMPLES)
def test_no_symbol_has_two_meanings(name, traces):
    table = notation_of(traces[name])
    assert table.rows, name
    assert table.clashes == (), f"{name}: {table.clashes}"
    letters = [letter_of(r.tex) for r in table.rows]
    assert len(letters) == len(set(letters)), f"{name}: a letter listed twice: {letters}"


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_every_listed_symbol_is_used_and_the_section_is_there(name, lang, traces):
    trace = traces[name]
    md = attntrace.render(trace, format="md", lang=lang)
    heading = {"en": "\n## Notation\n", "zh": "\n## 符号\n"}[lang]
    assert heading in md, name
    before, _, after = md.partition(heading)
    section, _, rest = after.partition("\n## ")
    math = _math(rest) + " " + _math(before)
    listed = _math(section)
    for row in notation_of(trace).rows:
        gradient = getattr(kind_of(row.meaning), "backward", False) if row.meaning in KINDS else False
        # the section lists each symbol (the gradients share one row: d before a matrix, g^M its entries)
        assert row.tex in listed or gradient, (name, row.tex)
        if row.meaning in ("head_index", "kv_head_index"):  # the letter of the general formula: Q^{(\eta)} in the table
            assert f"({row.tex})" in listed, (name, row.tex)
            continue
        used = re.sub(r"\((\\eta|g)\)(?=[}\\])", "(1)", row.tex)  # Q^{(\eta)} -> Q^{(1)}, W^{UQ(\eta)} -> W^{UQ(1)}
        assert used in math or row.tex in math, f"{name} ({lang}): {row.tex} is listed but the report never writes it"


@pytest.mark.parametrize("name", EXAMPLES)
def test_no_renamed_overload_comes_back(name, traces):
    math = " ".join(_math(attntrace.render(traces[name], format="md", lang=lang)) for lang in ("en", "zh"))
    # m is the row maximum (m_i, FlashAttention-2's running m): no slope -m (i - j), no RoPE angle m theta
    assert not re.search(r"-m(\^\{\(\d\)\})?\s*\\,\s*\(i", math), name
    assert "m\\theta" not in math and "m_r\\theta" not in math, name
    # i is the row index (q_{ij}) and the imaginary unit of RoPE's complex form: RoPE's pair is r (theta_r, c_r),
    # its row i (q_{i,r}, the angle p_i theta_r), never theta_i nor a row r
    assert not re.search(r"\\(theta|gamma|lambda|kappa)_\{?i\b|(?<![a-zA-Z\\])c_\{?i\b|p_\{?r\b|_\{r,", math), name
    # g is a gradient's entries (g^{Z}_{ij}): no bare g_{ij} or g_{11} (an RMSNorm gain, an activation)
    assert not re.search(r"(?<![\\a-zA-Z])g_\{", math), name
    # the chain rule is written on Z = A V, not on a C = A B beside the weights A
    assert "C = A B" not in math, name
    # the online softmax's unnormalised output is O-tilde: O stays the output projection's result
    assert not re.search(r"(?<![\\{a-zA-Z])O\^\{\(\d\)\}", math), name
    # a gain or a bias is a row vector written gamma_j, b_j by its formula: no gamma_{11} (read as gamma_{1j}) in its entries
    assert not re.search(r"\\gamma(\^\{[^{}]*\})?_\{1,?\d+\}", math), name
    # T is the scaled scores: the set of experts a token chose is a calligraphic T_i (Switch Transformer)
    assert not re.search(r"(?<![{\\a-zA-Z])T_\{?(i|\d+)\}?\s*=\s*\\\{|\\in T_", math), name
    # e is Euler's number (the softmax's e^{t_ij}, the router's e^{l_ij}): the expert index is xi, the embedding X-tilde
    assert not re.search(r"\^\{\(e\)\}|_\{i,?e\}|\\sum_\{e\b", math), name
    # the mask is one matrix for every head, M as the table lists it: no M^{(2)} per head
    assert not re.search(r"(?<![\\a-zA-Z])M\^\{\(", math), name
    # M is the mask: no projection index M (sum over M in {Q, K, V}, M = Q, K, V) in the backward pass
    assert not re.search(r"M\s*(\\in|=)\s*\\?\{?\s*[QK]\b", math), name
    # the number of heads is h (n x h d_v, as the concatenation says): ALiBi's slopes 2^{-8/h} for h = 2, no H
    assert not re.search(r"(?<![\\a-zA-Z])H = \d|/H\}", math), name


MULTI = [name for name in EXAMPLES if attntrace.run(name).num_heads > 1]
#: the row, column and summation indices of an entry (q_{ij} = sum_k x_{ik} w_{kj}): no head index may be one
_ENTRY_INDICES = {"i", "j", "k"}


@pytest.mark.parametrize("name", MULTI)
def test_a_head_index_is_no_row_or_column_index(name, traces):
    """A head is numbered by a letter of its own (q^{(i)}_{ij} read i twice: the head and the row;
    under GQA K^{(j)} beside the column j): the table lists the head index (and a key/value head's),
    no listed symbol carries (i) or (j), and the report's math and text write none either."""
    trace = traces[name]
    for lang in ("en", "zh"):
        math = _math(attntrace.render(trace, format="md", lang=lang))
        heads = set(re.findall(r"\^\{[^{}]*\((\\?[a-z]+)\)[^{}]*\}", math))  # Q^{(x)}, W^{UQ(x)}, K^{(x)\top}
        assert not heads & _ENTRY_INDICES, f"{name} {lang}: a head written with {heads & _ENTRY_INDICES}"
        text = attntrace.render(trace, format="text", lang=lang)
        assert not re.search(r"\b[A-Z][A-Za-z_~]*\(([ijk])\)", text), f"{name} {lang}: text writes a head as (i) or (j)"
    rows = notation_of(trace).rows
    index = {r.meaning: letter_of(r.tex) for r in rows if r.meaning in ("head_index", "kv_head_index")}
    assert "head_index" in index, f"{name}: the table has no head index"
    assert ("kv_head_index" in index) == bool(trace.settings.get("kv_groups")), name
    assert not set(index.values()) & _ENTRY_INDICES, f"{name}: a head index is a row, column or sum index: {index}"
    assert len(set(index.values())) == len(index), index
    for r in rows:
        assert not re.search(r"\(([ij])\)", r.tex + (r.entry_tex or "")), f"{name}: {r.tex} numbers its head like a row or column"


@pytest.mark.parametrize("name", MULTI)
def test_the_mask_is_printed_once(name, traces):
    """M is one matrix for every head: its 0/1 pattern stands beside head 1's masked scores, not
    again beside each later head's (llama-block-tiny and mla-tiny printed it per head)."""
    for lang in ("en", "zh"):
        for fmt, shown in (("md", r"\\underset\{\(\d+ \\times \d+\)\}\{M\} ="), ("text", r"(?m)^\s*M \(\d+ x \d+\) =")):
            count = len(re.findall(shown, attntrace.render(traces[name], format=fmt, lang=lang)))
            assert count <= 1, f"{name} ({fmt}, {lang}): the mask is printed {count} times"


def test_a_clash_is_found(traces):
    """The collector is not vacuous: an operand named m beside the softmax's row maximum m_i is a clash."""
    trace = traces["sentence-4x6"]
    clashing = dataclasses.replace(trace, operands=trace.operands + (Operand("m", None, None, (1, 1)),))
    assert notation_of(clashing).clashes == (("m", "m", "row_max"),)
    # Euler's number is no row of the table, but the softmax writes it: entries e_ij beside e^{t_ij} are a clash
    euler = dataclasses.replace(trace, operands=trace.operands + (Operand("E", None, None, (4, 6), "e"),))
    assert notation_of(euler).clashes == (("e", "euler", "entry:E"),)
    assert letter_of("q^{(i)}_{ij}") == "q^{(i)}" and letter_of("m^{(j)}") == "m" and letter_of("W_Q") == "W_Q"


def test_json_carries_the_table(traces):
    for name in ("alibi-causal", "llama-block-tiny", "backward-2x2"):
        data = traces[name].to_dict()
        assert data["notation"] == notation_of(traces[name]).to_list()
        symbols = {row["symbol"]: row["meaning"] for row in data["notation"]}
        assert len(symbols) == len(data["notation"])
    assert {"symbol": "\\lambda", "plain": "lambda", "meaning": "alibi_slope", "shape": "scalar", "entry": None} in traces["alibi-causal"].to_dict()["notation"]


def test_multi_head_input_gradient_has_no_index_m_beside_the_mask():
    """dX of two heads under a causal mask: every projection written out under one sum over the
    heads, so M stays the mask (it was also the projection index, M in {Q, K, V})."""
    import numpy as np

    rng = np.random.default_rng(0)
    spec = {"X": rng.normal(size=(3, 4)).round(2).tolist(), "num_heads": 2, "mask": "causal", "backward": True}
    spec.update({w: rng.normal(size=(4, 4)).round(1).tolist() for w in ("W_Q", "W_K", "W_V")})
    trace = attntrace.run(spec)
    for lang in ("en", "zh"):
        math = _math(attntrace.render(trace, format="md", lang=lang))
        assert "M_{ij}" in math  # the mask is there, one for both heads
        assert "\\sum_{\\eta} \\left(\\mathrm{d}Q^{(\\eta)}\\, W_Q^{(\\eta)\\top} + \\mathrm{d}K^{(\\eta)}\\, W_K^{(\\eta)\\top}" in math
        assert not re.search(r"M\s*(\\in|=)\s*\\?\{?\s*[QK]\b", math) and "W_M" not in math and "W_{M}" not in math


@pytest.mark.parametrize("lang, given", [("en", "given"), ("zh", "给定")])
def test_every_row_has_its_own_words(lang, given, traces):
    """No row of any example's notation section falls back to "given": every operand and every
    symbol a kind brings (latent attention's projections and latents, the mixture's router and
    experts, ...) has words in its prose module or in notation.j2, in en and zh."""
    heading = "Notation" if lang == "en" else "符号"
    for name, trace in traces.items():
        text = attntrace.render(trace, format="text", lang=lang)
        section = text[text.index(heading):].split("\n\n")[1]
        assert not [line for line in section.splitlines() if given in line], (name, section)


def test_a_per_head_row_is_the_tree_with_the_head_in_it(traces):
    """The table's rows are formula trees: a per-head matrix is its symbol with the head index
    substituted in (a superscript of its own merges with it, an entry named with one keeps it),
    printed the same way as every formula of the report."""
    from attntrace.kinds.base import HEAD_INDEX
    from attntrace.model.formula import Head

    rows = {r.meaning: r for r in notation_of(traces["alibi-causal"]).rows}
    q, w = rows["Q"], rows["W_Q"]
    assert isinstance(q.symbol, Head) and q.symbol.head == HEAD_INDEX
    assert (q.tex, q.plain, q.entry_tex) == ("Q^{(\\eta)}", "Q(eta)", "q^{(\\eta)}_{ij}")
    assert (w.tex, w.entry_tex) == ("W_Q^{(\\eta)}", "w^{Q}_{ij}")
    uq = next(r for r in notation_of(traces["mla-tiny"]).rows if r.meaning == "W_UQ")
    assert (uq.tex, uq.plain) == ("W^{UQ(\\eta)}", "W^UQ(eta)")


def test_an_expert_index_beside_the_embedding_is_its_own_letter():
    """A Llama block with sinusoidal positions and a mixture of experts shows the embedding
    X-tilde = X + P (entries x-tilde_ij, not e_ij beside Euler's e^{l_ij}) and the experts in one
    report: the expert is numbered xi (Y^{(xi)}), listed in the table, not e."""
    import tomllib

    from attntrace.resources import examples_dir

    spec = tomllib.loads((examples_dir() / "moe-tiny.toml").read_text(encoding="utf-8"))
    spec["position"] = "sinusoidal"
    trace = attntrace.run(spec)
    table = notation_of(trace)
    assert table.clashes == ()
    assert {"\\xi": "expert_index", "\\tilde{X}": "embed"}.items() <= {r.tex: r.meaning for r in table.rows}.items()
    for lang in ("en", "zh"):
        math = _math(attntrace.render(trace, format="md", lang=lang))
        assert "\\tilde{x}_{ij}" in math and "Y^{(\\xi)}" in math and "\\sum_{\\xi \\in \\mathcal{T}_i}" in math
        assert not re.search(r"\^\{\(e\)\}|_\{i,?e\}|\\sum_\{e\b", math)


def test_yarn_ramp_is_no_norm_gain():
    """A Llama block with YaRN: the ramp over the pairs (the paper's gamma(r)) is rho_r, listed
    in the table, because gamma is RMSNorm's gain in the same report."""
    import tomllib

    from attntrace.resources import examples_dir

    spec = tomllib.loads((examples_dir() / "llama-block-tiny.toml").read_text(encoding="utf-8"))
    spec["rope"] = {"scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64, "beta_fast": 8}}
    trace = attntrace.run(spec)
    table = notation_of(trace)
    assert table.clashes == ()
    meanings = {r.tex: r.meaning for r in table.rows}
    assert meanings["\\rho_r"] == "yarn_ramp" and meanings["\\gamma"] == "gamma_1", meanings
    for lang in ("en", "zh"):
        math = _math(attntrace.render(trace, format="md", lang=lang))
        assert "\\rho_r" in math and "\\gamma_j" in math
        assert not re.search(r"\\gamma_\{?r\b", math), lang


@pytest.mark.parametrize("name, backward", [("backward-2x2", False), ("backward-2x2-symbolic", False), ("multihead-output", True)])
def test_the_backward_prose_writes_entries_as_the_steps_do(name, backward):
    """The backward pass wrote L = sum (Z_ij)^2 and r_i = sum_j dZ_ij Z_ij beside the entries z_ij
    and g^Z_ij of its own steps: an entry is the lower-case letter (z_ij, o_ij), a gradient's entry g^Z_ij."""
    trace = attntrace.run(name, backward=True) if backward else attntrace.run(name)
    for lang in ("en", "zh"):
        math = _math(attntrace.render(trace, format="md", lang=lang))
        assert not re.search(r"(?<![\\a-zA-Z{])[A-Z]_\{ij\}", math), (name, lang, re.findall(r".{20}[A-Z]_\{ij\}", math))
        assert "\\mathrm{d}Z_{ij}" not in math, (name, lang)


@pytest.mark.parametrize("name, backward", [("backward-2x2", False), ("backward-2x2-symbolic", False), ("multihead-output", True)])
def test_a_differential_is_set_apart_from_the_next_factor(name, backward):
    """dQ = dS K printed as dSK, which reads as d(SK): a factor after a differential gets a thin space."""
    trace = attntrace.run(name, backward=True) if backward else attntrace.run(name)
    md = attntrace.render(trace, format="md")
    spans = [m.group(1) or m.group(2) for m in re.finditer(r"\$\$(.+?)\$\$|\$(.+?)\$", md, re.S)]
    glued = [g for span in spans for g in re.findall(r"\\mathrm\{d\}[A-Z](?:_[A-Z]|_\{[^{}]*\}|\^\{\\top\}|\^\{\([^{}]*\)\}|\^\{\([^{}]*\)\\top\})* "
                       r"(?!\\(?:circ|odot|cdot|quad|qquad|right|end|text|\\))[A-Za-z\\]", span)]
    assert not glued, (name, glued[:5])
