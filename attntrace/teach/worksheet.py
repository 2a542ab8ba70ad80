"""The worksheet of an exercise: the given matrices and, for every step, its formula and a blank.

The worksheet (Markdown or LaTeX, prose in `templates/exercise/`) shows the given matrices
and, for every step of the trace, its formula and an empty matrix of the right shape. The
answer key is the full derivation from `attntrace.render` (`attntrace exercise --key`).
"""

from __future__ import annotations

import math
import re

import numpy as np

from attntrace.kinds import kind_of
from attntrace.model.errors import BadInput
from attntrace.model.formula import Frac, Sqrt, after_lhs, first_part, node
from attntrace.model.trace import Trace
from attntrace.rendering.jinja_env import user_template_errors
from attntrace.rendering.printing import TexOut
from attntrace.rendering.formulatext import plain, tex
from attntrace.rendering.renderer import environment, tidy
from attntrace.rendering.plaindata import to_plain
from attntrace.teach.prosemarkup import prose_markup

_TEX = TexOut()  # the reports' LaTeX layout: bmatrix, head superscripts


def _tex_int_matrix(m) -> str:
    return _TEX.layout([[str(int(v)) for v in row] for row in np.asarray(m)])


def _blank_matrix(shape, cell: str) -> str:
    rows, cols = shape
    return _TEX.layout([[cell] * cols for _ in range(rows)])


def worksheet_view(spec: dict, trace: Trace) -> dict:
    """What the worksheet templates show: the given matrices and one blank per step."""
    heads = trace.num_heads
    d = len(spec["X"][0])
    d_k = d // heads
    given = [("X", spec["X"], None)]
    for name in ("W_Q", "W_K", "W_V"):
        given.append((f"W_{{{name[-1]}}}", spec[name], None))
    if "W_O" in spec:
        given.append(("W_{O}", spec["W_O"], None))
    cell = "\\boxed{\\phantom{0.000}}"
    steps = []
    for number, step in enumerate(trace.steps, start=1):
        details = dict(step.details)
        steps.append({
            "number": number, "id": step.id, "head": step.head, "key": step.key,
            "formula": step.formula, "shape": step.shape,
            "lhs": step_name(step.id, step.head),
            "blank": _blank_matrix(step.shape, cell),
            "factor": details.get("factor"),
            "root": root_note(step),
        })
    return {
        "title": spec["title"], "seed": _seed_of(spec), "n": len(spec["X"]), "d": d, "heads": heads, "d_k": d_k,
        "factor": math.sqrt(d_k), "factor_is_integer": math.isqrt(d_k) ** 2 == d_k,
        "given": [{"name": nm, "tex": _tex_int_matrix(m), "shape": np.asarray(m).shape} for nm, m, _ in given],
        "steps": steps,
        "split": heads > 1,
    }


def root_note(step) -> str | None:
    """The number a step's square root stands for, as its hint gives it (\\sqrt{d_k} =
    \\sqrt{4} = 2): when the step's formula divides by the square root of a number the step
    records under that symbol's name (the scaling's d_k); else None."""
    rhs = after_lhs(first_part(step.expr))
    if not (isinstance(rhs, Frac) and isinstance(rhs.den, Sqrt)):
        return None
    value = step.details.get(plain(rhs.den.of))
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    root = math.isqrt(value)
    exact = f" = {root}" if root * root == value else f" \\approx {math.sqrt(value):.4f}"
    return f"{tex(rhs.den)} = \\sqrt{{{value}}}{exact}"


def _seed_of(spec: dict) -> int | None:
    m = re.search(r"\(seed (\d+)\)", str(spec.get("title", "")))
    return int(m.group(1)) if m else None


def step_name(step_id: str, head) -> str:
    """The step's matrix name as in the reports (S, A^{(2)}, ...); the concatenation is Z_concat."""
    kind = kind_of(step_id)
    letter = node(kind.answer_letter or kind.letter)
    return tex(letter.head(head))


def render_worksheet(spec: dict, trace: Trace, format: str = "md", lang: str = "en", standalone: bool = False,
                     template_dir=None, math_delimiters: str = "dollars") -> str:
    """The worksheet: given matrices and an empty matrix to fill for each step."""
    if format not in ("md", "tex"):
        raise BadInput(f"a worksheet is md or tex, not {format!r}")
    if lang not in ("en", "zh"):
        raise BadInput(f"lang must be en or zh, not {lang!r}")
    env = environment(template_dir)
    view = worksheet_view(spec, trace)
    env.filters["prose_markup"] = prose_markup  # the worksheet's macro t(text) applies it
    with user_template_errors(env, template_dir):
        prose = env.get_template(f"exercise/prose/{lang}.j2").make_module({})
        brackets = math_delimiters == "brackets"
        text = env.get_template(f"exercise/worksheet.{format}.j2").render(
            ex=to_plain(view), p=prose, lang=lang, standalone=standalone, brackets=brackets)
    return tidy(text)
