"""Numbers a reader can check, and no paragraph said twice (issue 22 items 2 and 4), over every
example in en and zh:

- within a matrix one number format: every entry has the same decimals (an exact 0 may print as
  0; no 1 next to 1.0000), a matrix of whole numbers prints as integers;
- every substituted line reproduces its printed result from its printed operands: the numbers
  are parsed back from the text report (``name = symbols = 2*0.99995 - 1*0.01000 = 1.9899``),
  recomputed by a tiny arithmetic walker over Python's ``ast`` (numbers, + - * / ^, parentheses,
  a number before a parenthesis, a function or a number as a product (``1/6 (...)``, ``2 tanh(x)``),
  sqrt, max, exp, tanh, sin, cos and e; never eval)
  and compared with the printed result at its own decimals: sums of products, a norm's mean,
  variance and entries, a score over sqrt(d_k), SiLU and ReLU entries, soft-capping, a router's gate,
  the sinusoidal position table;
- an operand of a substituted line prints as its matrix prints it: no 6.364 in a line beside a
  matrix that prints 6.3640 (more decimals where the line needs them: 0.01965);
- the softmax rows (text report): each exponential from its printed shifted score, the row's sum
  from its printed exponentials, each weight from its printed exponential over the printed sum;
- RoPE's 2x2 pair lines (Markdown report: the rotation matrix times the pair gives the pair
  turned, ``[[0.99995, -0.01000], [0.01000, 0.99995]] [2, 1] = [1.9899, 1.0199]``), each row;
- no paragraph longer than 100 characters appears twice in one report (the Markdown source).
"""

from __future__ import annotations

import ast
import math
from decimal import Decimal
import operator
import re

import pytest

import attntrace
from attntrace.rendering.renderer import render
from attntrace.teach.examples import example_paths

NAMES = [p.stem for p in example_paths()]
LANGS = ("en", "zh")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
ARITHMETIC = re.compile(r"^(?:[-+*/^ ().,0-9]|sqrt|max|exp|tanh|sin|cos|e)+$")
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv, ast.Pow: operator.pow}
FUNCS = {"sqrt": math.sqrt, "max": max, "exp": math.exp, "tanh": math.tanh, "sin": math.sin, "cos": math.cos}


@pytest.fixture(scope="module")
def traces():
    return {name: attntrace.run(name) for name in NAMES}


def _value(node) -> float:
    """Numbers, + - * / ^, sqrt, max, exp and e only: anything else is not a substituted line."""
    if isinstance(node, ast.Expression):
        return _value(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)
    if isinstance(node, ast.Name) and node.id == "e":
        return math.e
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCS and not node.keywords:
        return FUNCS[node.func.id](*[_value(a) for a in node.args])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return -_value(node.operand) if isinstance(node.op, ast.USub) else _value(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError(ast.dump(node))


def substituted_lines(text: str) -> list[tuple[str, float, str]]:
    """(line, recomputed value, printed result) of every one-line 'numbers = result' chain."""
    found = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(" = ")]
        if len(parts) < 3:
            continue
        expr, result = parts[-2], parts[-1]
        if not NUMBER.fullmatch(result) or not ARITHMETIC.match(expr) or not re.search(r"[-+*/^]|sqrt|max|exp|tanh|sin|cos", expr.lstrip("-")):
            continue
        # 10^(-5) is a power; 1/6 (a + b), 2 tanh(x), 2.5 0.8044 are products
        python = re.sub(r"(?<=[0-9)])\s+(?=[0-9(a-z])", "*", expr.replace("^", "**"))
        try:
            found.append((line.strip(), _value(ast.parse(python, mode="eval")), result))
        except (SyntaxError, ValueError, TypeError, ZeroDivisionError, OverflowError):
            continue
    return found


def _num(x: str) -> float:
    return -math.inf if x.strip() == "-inf" else float(x)


def _tolerance(result: str, value: float) -> float:
    """Half a unit of the printed result's last digit (2.1e-9: of its mantissa's)."""
    exponent = Decimal(result.strip()).as_tuple().exponent
    return 0.5 * 10.0 ** exponent + 1e-9 * max(1.0, abs(value))


def softmax_rows(text: str) -> list[tuple[str, float, str]]:
    """(line, recomputed value, printed result) of every entry of the softmax rows of a text report:

        t_1j - m_1 = (-1.2247, 0, -0.8165, -0.4082)
        e^(t_1j - m_1) = (0.2938, 1, 0.4420, 0.6648)          each e from its shifted score
        sum_k e^(t_1k - m_1) = 2.4006                          the sum of the printed e's
        a_1j = e^(t_1j - m_1) / sum_k e^(t_1k - m_1) = (0.1224, 0.4166, 0.1841, 0.2769)   e / sum

    (a sink's logit has an exponential and no weight: the weights are one fewer). A row shown
    with dots is skipped (its sum has terms the row does not show)."""
    found = []
    lines = [line.strip() for line in text.splitlines()]
    for k in range(1, len(lines) - 2):
        exps = re.fullmatch(r"e\^\(.+? - m_\d+\) = \((.*)\)", lines[k])
        shift = re.fullmatch(r".+? - m_\d+ = \((.*)\)", lines[k - 1])
        total = re.fullmatch(r"sum_k .* = (-?\d+(?:\.\d+)?)", lines[k + 1])
        weights = re.fullmatch(r"\S+ = e\^.* / sum_k .* = \((.*)\)", lines[k + 2])
        if not (exps and shift and total and weights) or "..." in lines[k]:
            continue
        xs, es, ws = (m.group(1).split(", ") for m in (shift, exps, weights))
        for x, e in zip(xs, es):
            found.append((f"{lines[k]} [e^({x})]", math.exp(_num(x)), e))
        found.append((lines[k + 1], sum(_num(e) for e in es), total.group(1)))
        for e, w in zip(es, ws):
            found.append((f"{lines[k + 2]} [{e} / {total.group(1)}]", _num(e) / _num(total.group(1)), w))
    return found


_ARRAY = r"\\left\[\\begin\{array\}\{r+\}(.*?)\\end\{array\}\\right\]"


def rotation_pairs(md: str) -> list[tuple[str, float, str]]:
    """(line, recomputed value, printed result) of each row of RoPE's 2x2 pair lines of a
    Markdown report: R [x; y] = [u; v] with R = [cos, -sin; sin, cos] at the printed digits."""
    found = []
    for line in md.splitlines():
        m = re.search(_ARRAY + " " + _ARRAY + " = " + _ARRAY, line) if "\\cos" in line else None
        if not m:
            continue
        rotation = [row.split("&") for row in m.group(1).split("\\\\")]
        pair, turned = ([x.strip() for x in g.split("\\\\")] for g in (m.group(2), m.group(3)))
        if len(rotation) == len(pair) == len(turned) == 2:
            for row, result in zip(rotation, turned):
                found.append((f"{line.strip()[:50]}... [{row} . {pair}]", sum(float(a) * float(b) for a, b in zip(row, pair)), result))
    return found


def text_matrices(text: str) -> list[list[str]]:
    """The entries of every matrix of a text report (consecutive '[ a  b ]' lines)."""
    out, cur = [], []
    for line in text.splitlines() + [""]:
        m = re.match(r"^\s*(?:\S.*?=\s+)?\[ (.*) \]$", line)
        if m and "|" not in m.group(1) and ";" not in m.group(1):
            cur += m.group(1).split()
        elif cur:
            out.append(cur)
            cur = []
    return out


def paragraphs(md: str) -> list[str]:
    out = []
    for chunk in re.split(r"\n\s*\n", md):
        p = " ".join(line.strip() for line in chunk.splitlines()).strip()
        if p and not p.startswith(("$$", "\\[", "#", "|")):
            out.append(p)
    return out


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", NAMES)
def test_one_number_format_within_a_matrix(name, lang, traces):
    text = render(traces[name], format="text", lang=lang)
    for entries in text_matrices(text):
        numbers = [x for x in entries if NUMBER.fullmatch(x)]
        decimals = {len(x.split(".")[1]) if "." in x else 0 for x in numbers if x != "0"}
        assert len(decimals) <= 1, f"{name} {lang}: one matrix mixes {sorted(decimals)} decimals: {entries[:12]}"


def test_the_matrix_check_sees_matrices(traces):
    assert sum(len(text_matrices(render(t, format="text"))) for t in traces.values()) > 200


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", NAMES)
def test_substituted_lines_reproduce_their_results(name, lang, traces):
    for line, value, result in substituted_lines(render(traces[name], format="text", lang=lang)):
        d = len(result.split(".")[1]) if "." in result else 0
        assert abs(value - float(result)) <= 0.5 * 10 ** -d + 1e-9 * max(1.0, abs(value)), \
            f"{name} {lang}: {line} (the printed operands give {value!r})"


def trimmed_operands(text: str) -> list[tuple[str, str, str]]:
    """(line, operand, matrix entry) of each operand of a substituted line printed with its
    trailing zeros trimmed where a matrix of the report prints the same number with them
    (6.364 beside 6.3640). A number some line prints as its result in that form (a norm's
    nu_1 = ... = 0.5) is that line's, not a matrix's."""
    entries = {x for m in text_matrices(text) for x in m if NUMBER.fullmatch(x) and "." in x}
    trimmed = {x.rstrip("0"): x for x in entries if x.endswith("0")}
    lines = substituted_lines(text)
    results = {r for _, _, r in lines}
    found = []
    for line, _, _ in lines:
        for x in NUMBER.findall(line.split(" = ")[-2]):
            if "." in x and x in trimmed and x not in entries and x not in results:
                found.append((line, x, trimmed[x]))
    return found


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", NAMES)
def test_operands_print_as_their_matrices(name, lang, traces):
    found = trimmed_operands(render(traces[name], format="text", lang=lang))
    assert not found, f"{name} {lang}: operand {found[0][1]} where its matrix prints {found[0][2]}: {found[0][0]}"


def test_the_operand_check_sees_trimmed_operands():
    # softcap-gemma2's 2 tanh(6.364 / 2) beside t's 6.3640 (issue 22); a norm's own 0.5 is not a matrix's
    text = "t = [ 6.3640  1.0000 ]\n    [ 0.5000  2.0000 ]\ntbar_12 = 2 tanh(t_12 / 2) = 2 tanh(6.364 / 2) = 1.9931\n" \
           "nu_1 = 1/2 (1^2 + 0^2) = 0.5\nn_11 = 1 / sqrt(0.5 + 10^(-6)) = 1.4142"
    assert [x for _, x, _ in trimmed_operands(text)] == ["6.364"]
    assert not trimmed_operands(text.replace("6.364 /", "6.3640 /"))


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", NAMES)
def test_softmax_rows_and_rotations_reproduce_their_results(name, lang, traces):
    checked = softmax_rows(render(traces[name], format="text", lang=lang))
    checked += rotation_pairs(render(traces[name], format="md", lang=lang))
    for line, value, result in checked:
        assert abs(value - _num(result)) <= _tolerance(result, value), f"{name} {lang}: {line} (the printed operands give {value!r})"


def test_the_softmax_and_rotation_check_sees_lines(traces):
    rows = [x for t in traces.values() for x in softmax_rows(render(t, format="text"))]
    pairs = [x for t in traces.values() for x in rotation_pairs(render(t, format="md"))]
    # about 350 entries of softmax rows and 30 rows of rotations in the examples' English reports
    assert len(rows) > 300 and len(pairs) > 25, (len(rows), len(pairs))
    # the rows of a sink (an exponential with no weight) and of a causal mask (-inf, 0) are read too
    assert any("tcheck" in line for line, _, _ in softmax_rows(render(traces["attention-sinks"], format="text")))
    assert any("e^(-inf)" in line for line, _, _ in softmax_rows(render(traces["causal-mask"], format="text")))
    # cross-attention's e^-0.5 printed 0.6065 gave 0.6065 / 2.2131 = 0.2740, not the weight 0.2741: the row shows 0.60653
    cross = softmax_rows(render(traces["cross-attention"], format="text"))
    assert any("0.60653 / 2.2131" in line for line, _, _ in cross)
    assert softmax_rows("t_1j - m_1 = (-0.5, 0)\ne^(t_1j - m_1) = (0.6065, 1)\nsum_k e^(t_1k - m_1) = 1.6065\n"
                        "a_1j = e^(t_1j - m_1) / sum_k e^(t_1k - m_1) = (0.3775, 0.6225)")[2][1] == pytest.approx(1.6065)
    rope = [line for line, _, _ in rotation_pairs(render(traces["rope-4-tokens-half"], format="md"))]
    assert any("0.99995" in line for line in rope)


def test_the_line_check_sees_lines(traces):
    lines = [x for t in traces.values() for x in substituted_lines(render(t, format="text"))]
    # about 220 since later products show one entry and a block's second norm and residual none (page budgets)
    assert len(lines) > 200
    # the RoPE case of issue 22: cos 0.01 needs five decimals for 2 cos - sin to give 1.9899
    rope = substituted_lines(render(traces["rope-4-tokens-half"], format="text"))
    assert any("0.99995" in line for line, _, _ in rope)
    assert substituted_lines("q = a*b = 2*1.0000 - 1*0.0100 = 1.9899")[0][1] == pytest.approx(1.99)
    # the lines that are not sums of products are read too: a LayerNorm's variance and entry, a score over sqrt(d_k)
    enc = [line for line, _, _ in substituted_lines(render(traces["encoder-block-post-ln"], format="text"))]
    assert any(line.startswith("sigma_1^2 =") for line in enc) and any(line.startswith("n_11 =") for line in enc)
    assert any(line.startswith("t_12 =") for line in enc) and any(line.startswith("mu_1 =") for line in enc)
    # the encoder's r_11 prints as 0.0551, but (0.0551 - 1) / sqrt(1.2774 + 10^-5) is -0.8360: the line shows 0.05506
    assert any(line.startswith("n_11 =") and "0.05506" in line for line in enc)
    assert substituted_lines("n = x = (0.0551 - 1) / sqrt(1.2774 + 10^(-5)) = -0.8361")[0][1] == pytest.approx(-0.83603, abs=1e-5)
    assert substituted_lines("m = x = 1/6 (1 + 2 + 3) = 1")[0][1] == pytest.approx(1.0)
    # SwiGLU's h~_12 = 1.4142 / (1 + e^-1.4142) 2.8284 gives 3.2176: the line shows 1.41421 and 2.82842
    llama = [line for line, _, _ in substituted_lines(render(traces["llama-block-tiny"], format="text"))]
    assert any(line.startswith("h~_12 =") and "1.41421" in line for line in llama)
    # a router's gate, and a soft cap
    assert any(line.startswith("g^r_") for line, _, _ in substituted_lines(render(traces["moe-tiny"], format="text")))
    assert any("tanh(" in line for line, _, _ in substituted_lines(render(traces["softcap-gemma2"], format="text")))


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", NAMES)
def test_no_long_paragraph_twice(name, lang, traces):
    seen: dict[str, int] = {}
    for p in paragraphs(render(traces[name], format="md", lang=lang)):
        if len(p) > 100:
            seen[p] = seen.get(p, 0) + 1
    twice = [p[:80] for p, n in seen.items() if n > 1]
    assert not twice, f"{name} {lang}: said again: {twice}"


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", ["backward-2x2", "multihead-output", "cross-attention"])
def test_the_weight_gradients_say_their_rule_once(name, lang):
    """dW_Q, dW_K and dW_V had one paragraph each that differed only in the letter Q, K or V (three
    times in backward-2x2, and the full-width one in multihead-output); dX's heads were numbered
    i = 1, ..., 2 beside the row index i, where the formula sums over eta."""
    md = render(attntrace.run(name, backward=True), format="md", lang=lang)
    seen: dict[str, int] = {}
    for p in paragraphs(md):
        if len(p) > 100:
            key = re.sub(r"(?<=[_{ ])[QKV](?=[_}$ ])|(?<=[_{])[QKV]$", "M", p)
            seen[key] = seen.get(key, 0) + 1
    assert not [p[:80] for p, n in seen.items() if n > 1], name
    assert "i = 1" not in md, name


#: a matrix entry or a vector entry in scientific notation at float64's noise level (1e-13 to 1e-20)
_NOISE_ENTRY = re.compile(r"(?:&|\{r+\}|\\left\(|,\\ )\s*-?\d(?:\.\d+)? \\cdot 10\^\{-(?:1[3-9]|20)\}")
#: a number of the prose at float64's noise level, in Python's e-notation (MLA's "differs by at most 4.4e-16")
#: or as inline math (the online softmax's "largest difference $2.2 \cdot 10^{-16}$")
_NOISE_WORD = re.compile(r"\d(?:\.\d+)?e-(?:1[3-9]|20)\b|\$-?\d(?:\.\d+)? \\cdot 10\^\{-(?:1[3-9]|20)\}\$")


@pytest.mark.parametrize("name", NAMES)
def test_float_noise_prints_as_zero(name, traces):
    """An entry that is 0 in exact arithmetic and float noise in the trace (MLA's S^C: -9.3e-17
    beside entries near 1; a softmax shift of a score equal to the maximum: -4.4e-16) prints as 0
    (attntrace.rendering.printing.NOISE), in a matrix and in the prose; true tiny values (underflowed
    weights) keep theirs."""
    for rows in (None, "all"):
        md = render(traces[name], format="md", lang="en", **({"rows": rows} if rows else {}))
        assert not _NOISE_ENTRY.search(md), f"{name}: {_NOISE_ENTRY.search(md).group(0)}"
    for lang in ("en", "zh"):  # nor in a sentence: the absorbed scores equal S up to rounding, not "differ by 4.4e-16"
        md = render(traces[name], format="md", lang=lang)
        assert not _NOISE_WORD.search(md), f"{name} ({lang}): {_NOISE_WORD.search(md).group(0)}"


def test_float_noise_is_zero_in_print_only(traces):
    """The trace keeps its floats: the noise is dropped where a matrix is formatted."""
    import numpy as np

    from attntrace.rendering.printing import without_noise

    step = next(s for s in traces["mla-tiny"].steps if s.id == "scores_C" and s.head == 2)
    value = np.asarray(step.value, dtype=float)
    assert 0 < np.abs(value[1, 1]) < 1e-15  # -9.3e-17 in the trace
    assert without_noise(value)[1, 1] == 0 and without_noise(value)[0, 0] == value[0, 0]
    tiny = np.array([[1.0, 1e-11]])
    assert without_noise(tiny) is tiny  # above the tolerance: a value, printed in scientific notation


def test_an_elided_matrix_is_denoised_on_its_shown_rows_only(monkeypatch):
    """Printing an elided matrix costs what is printed: the noise rule reads the shown rows, not
    the whole matrix (a Llama-3-8B-shaped layer's report spent 3.8 s of 6 s in full passes over
    its weights), a worked line its first 4096 entries. A noise entry in a shown row still prints as 0."""
    import numpy as np

    from attntrace.rendering import printing

    read = []
    real = printing.without_noise
    monkeypatch.setattr(printing, "without_noise", lambda v: read.append(v.shape) or real(v))
    scores = np.random.default_rng(0).normal(size=(200, 200))
    scores[0, 1] = -9.3e-17
    md = attntrace.render(attntrace.run({"scores": scores, "scale": False}), "md", max_size=8)
    # the shown rows of a matrix, or a worked line's first 4096 entries (printing.first_entries)
    assert read and all(shape[0] < 200 if len(shape) == 2 else shape[0] <= 4096 for shape in read), read
    assert "-17}" not in md and "e-17" not in md


@pytest.mark.parametrize("name", ["height-weight-raw", "height-weight-3-raw"])
def test_saturated_weights_print_alike_in_the_softmax_and_the_weighted_sum(name, traces):
    """The softmax printed A = (7.4e-2320, ..., 1.0000) and the weighted sum then read
    0 * 52 + ... + 1 * 80: one matrix, two forms. The weighted sum prints the weights as the softmax did."""
    for lang in LANGS:
        tex = render(traces[name], format="tex", lang=lang)
        softmax, _, weighted = tex.partition("\\paragraph*{" + ("Weighted sum" if lang == "en" else "加权求和") + "}")
        row = re.search(r"\\underset\{\(1 \\times 5\)\}\{A\} = \\left\[\\begin\{array\}\{r+\}(.*?)\\end\{array\}", softmax).group(1)
        first, last = row.split(" & ")[0], row.split(" & ")[-1]
        assert "10^{-" in first and last == "1.0000", (name, row)
        line = weighted[weighted.index("z_{11} &="):].split("\\end{align*}")[0]
        assert f"= {first} \\cdot " in line and f"{last} \\cdot 80" in line, (name, lang, line)
        assert not re.search(r"(?<![.\d])0 \\cdot \d", line), (name, lang, line)


@pytest.mark.parametrize("lang", LANGS)
def test_a_scale_of_one_is_not_divided_out(lang, traces):
    """d_k = 1: the report divided every score by sqrt(1) and printed the scores again (T = S/sqrt(1) =
    [28480 ...], t_1j = 1/sqrt(1) (28480, ...) = (28480, ...)); now T = S / sqrt(1) = S."""
    tex = render(traces["height-weight-raw"], format="tex", lang=lang)
    scaling = tex.split("\\paragraph*{" + ("Scaling" if lang == "en" else "缩放") + "}")[1].split("\\paragraph*")[0]
    assert "\\frac{S}{\\sqrt{1}} = S\n" in scaling and "\\frac{1}{\\sqrt{1}}" not in scaling and "28480" not in scaling


@pytest.mark.parametrize("lang", LANGS)
def test_the_rounding_sentence_allows_the_extra_digits_it_prints(lang, traces):
    """"Numbers are rounded to at most 4 decimal places" stood above e^(-2.4495) = 0.08634 and
    sums of 1.08634: the sentence says that a substituted line's operands may carry more."""
    md = render(traces["scaling-dk6"], format="md", lang=lang)
    assert "0.08634" in md
    assert ("(an operand more where its line needs them)" if lang == "en" else "（算式需要时运算数多留几位）") in md


@pytest.mark.parametrize("lang", LANGS)
def test_yarn_mu_prints_one_way(lang, traces):
    """YaRN's mu is one number: its definition and every pair's line print it with the same digits
    (1.1386 above and 1.13863 in a line made a reader wonder which the line used)."""
    for fmt in ("text", "md"):
        out = render(traces["rope-yarn-long-context"], format=fmt, lang=lang)
        defined = re.findall(r"mu\b.{0,3}= 0\.1 .{0,20}= (\d\.\d+)", out)
        used = re.findall(r"= (1\.\d+)(?:\*\(|\\, )", out)
        assert len(defined) == 1 and len(used) >= 3, (fmt, defined, used)
        assert set(used) == set(defined), (fmt, defined, sorted(set(used)))


_DECIMALS = re.compile(r"(?<![\w.])-?\d+\.(\d+)")
#: the entry lines of a product step: q_11, k^(2)_12, s_13, z_21, o_11 (not a rotation q~ nor a gradient g)
_PRODUCT_ENTRY = re.compile(r"^[qkvszo](\^\(\d+\))?_\d+$")


def mixed_line_digits(text: str) -> list[dict[str, int]]:
    """For each display of a product's entry lines (one block of the text report), the most decimals of an
    operand in each line, when the lines at the report's 4 decimals or more disagree."""
    bad = []
    for group in re.split(r"\n\s*\n", text):
        widths = {}
        for line in group.splitlines():
            parts = [p.strip() for p in line.split(" = ")]
            if len(parts) >= 3 and _PRODUCT_ENTRY.match(parts[0]) and "*" in parts[-2]:
                w = max((len(m) for m in _DECIMALS.findall(parts[-2])), default=0)
                if w >= 4:
                    widths[parts[0]] = w
        if len(set(widths.values())) > 1:
            bad.append(widths)
    return bad


@pytest.mark.parametrize("name", NAMES)
def test_a_products_entry_lines_share_their_digits(name, traces):
    """a_11 printed 0.2955 in z_11's line and 0.29547 in z_12's: a product's lines take one number of decimals."""
    assert not mixed_line_digits(render(traces[name], format="text")), name


def test_the_digits_check_sees_a_mix():
    text = "    z_11 = a_11*v_11 + a_12*v_21 = 0.2955*2 + 0.1087*1 = 0.6997\n    z_12 = a_11*v_12 + a_12*v_22 = 0.29547*1 + 0.1087*2 = 0.5129\n"
    assert mixed_line_digits(text) == [{"z_11": 4, "z_12": 5}]


def test_the_scaled_row_prints_the_scores_as_their_matrix(traces):
    """S prints 2.5930; the row divided by sqrt(d_k) below it printed 2.593 (m_2 1.633 beside 1.6330, issue 22)."""
    md = render(traces["rope-yarn-long-context"], format="md")
    assert "2.5930 & 3.4166" in md and "\\frac{1}{\\sqrt{6}}\\left(2.5930,\\ 3.4166,\\ 0.5087\\right)" in md


def test_dots_never_stand_for_one_entry(traces):
    """Five scores in a row: s_11, s_12, s_13, dots, s_15 hid only s_14, in a line as tall as the entry."""
    text = render(traces["sliding-window"], format="text")
    assert "s_14 = " in text and "\n    ...\n" not in text.split("Scaling")[0]


@pytest.mark.parametrize("name", ["rope-yarn-long-context", "alibi-causal", "sentence-4x6"])
def test_an_exact_reports_approximations_have_one_number_format(name):
    """Exact mode: S ~ [2.593, 3.4166 ...] mixed 3 and 4 decimals in one matrix; like a numeric matrix, one layout."""
    text = render(attntrace.run(f"examples/{name}.toml", mode="exact"), format="text")
    for entries in text_matrices(text):
        numbers = [x for x in entries if NUMBER.fullmatch(x)]
        decimals = {len(x.split(".")[1]) if "." in x else 0 for x in numbers if x != "0"}
        assert len(decimals) <= 1, f"{name}: one matrix mixes {sorted(decimals)} decimals: {entries[:12]}"


def _whole_trace(trace):
    """The trace with each float entry within float noise (printing.NOISE, here 1e-12 of its matrix's
    largest |entry|) of a nonzero integer set to that integer; None when no entry is."""
    import dataclasses

    import numpy as np

    steps, changed = [], False
    for s in trace.steps:
        if isinstance(s.value, np.ndarray) and s.value.dtype.kind == "f":
            a = s.value
            finite = np.abs(a[np.isfinite(a)])
            with np.errstate(invalid="ignore"):
                whole = np.rint(a)
                near = (np.abs(a - whole) <= 1e-12 * finite.max(initial=0.0)) & (a != whole) & (whole != 0)
            if near.any():
                s, changed = dataclasses.replace(s, value=np.where(near, whole, a)), True
        steps.append(s)
    return dataclasses.replace(trace, steps=tuple(steps)) if changed else None


def test_a_whole_number_within_float_noise_prints_as_that_number(traces):
    """An entry a few ulps from an integer (RoPE's score 3.9999999999999996, an attention output
    0.9999999999999999) prints as the integer would: the report of the trace is the report of the
    same trace with those entries made whole, in every language, format and row selection. The
    rounding rule (a rounded 1.0000 is not an exact 1) is for values that are not whole, not for
    float noise: RoPE's t_{4j} row printed (..., 4.0000) / sqrt(4) where an exact 4 prints 4."""
    noisy = {name: whole for name in NAMES if (whole := _whole_trace(traces[name])) is not None}
    # one test over the examples that have such an entry (no skip per example without one), and some must
    assert "rope-4-tokens-half" in noisy, sorted(noisy)
    for name, whole in noisy.items():
        for lang in LANGS:
            for fmt in ("md", "text"):
                for rows in (None, "all"):
                    kw = {"rows": rows} if rows else {}
                    assert render(traces[name], format=fmt, lang=lang, **kw) == render(whole, format=fmt, lang=lang, **kw), \
                        (name, lang, fmt, rows)


@pytest.mark.parametrize("lang", LANGS)
def test_a_matrix_of_whole_numbers_up_to_float_noise_prints_integers(lang):
    """0.1 * 3 + 1.1 * 7 is 8 and 1.1 * 3 + 0.1 * 7 is 4, but the float of one score is
    8.000000000000002: S printed 8.0000, 4.0000 and s_11 = ... = 8.0000 for a matrix of whole
    numbers. It prints S as 8, 4 and the worked lines end in = 8, = 4; the trace keeps its float."""
    import numpy as np

    from attntrace.rendering.printing import without_noise

    trace = attntrace.run({"Q": [[0.1, 1.1], [1.1, 0.1]], "K": [[3, 7], [7, 3]], "V": [[1, 0], [0, 1]]})
    scores = trace.step("scores").value
    assert scores[1, 1] != 8 and abs(scores[1, 1] - 8) < 1e-14  # noise in the trace
    assert without_noise(scores)[1, 1] == 8 and without_noise(np.array([[1.0, 1.5 + 1e-11]]))[0, 1] != 1.5
    tex = render(trace, format="tex", lang=lang)
    assert r"{S} = Q K^{\top} = " in tex and r"\begin{array}{rr}8 & 4 \\ 4 & 8\end{array}" in tex, tex
    assert "1.1 \\cdot 7 = 8 \\\\" in tex and "8.0000" not in tex and "4.0000" not in tex
    text = render(trace, format="text", lang=lang)
    assert "8.0000" not in text and "4.0000" not in text


def test_beside_huge_entries_a_true_fraction_is_not_noise():
    """The noise rule is relative to a matrix's largest entry and capped (printing.NOISE_CAP):
    beside 5e11, 1e-12 of it is 0.5, and S = [5e11 + 0.3, 5e5 + 0.3] printed as
    [500000000000, 500000]; the truth is printed, while an entry a few ulps from a whole number
    beside entries near 1 still prints whole."""
    import numpy as np

    from attntrace.rendering.printing import without_noise

    trace = attntrace.run({"Q": [[5e5, 0.3]], "K": [[1e6, 1.0], [1.0, 1.0]], "V": [[1, 0], [0, 1]], "scale": False})
    assert abs(trace.step("scores").value[0, 1] - 500000.3) < 1e-6  # the truth, computed by hand
    md = render(trace, format="md", lang="en")
    assert r"\begin{array}{rr}500000000000.3 & 500000.3\end{array}" in md, md
    assert without_noise(np.array([[5e11, 0.3]]))[0, 1] == 0.3
    assert without_noise(np.array([[1.0, 3.9999999999999996]]))[0, 1] == 4.0
