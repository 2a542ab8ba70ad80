"""Exercises: a random attention problem with small integers, a worksheet and an answer key.

`make_exercise(n, d, heads, seed)` draws X (n, d) with entries in {-1, 0, 1, 2} and weight
matrices with entries in {-1, 0, 1} from `numpy.random.default_rng([seed, n, d, heads])`, so
the same seed always gives the same exercise (the redraws included). Each head gets
d_k = d / heads columns (the standard split of full-width (d, d) matrices). A whole
sqrt(d_k): d_k = 4 (--d 4 with 1 head, --d 8 with 2 heads; 4 heads would need d = 16, above
the limit of 12) or d_k = 1 (--d 2 with 2 heads, --d 4 with 4 heads). Multi-head exercises
add W_O (h d_v, d) with entries in {0, 1}. For wider d the matrices are sparser (about 2.5
non-zero entries per column of W for d_k > 4, 2.6 per row of X), so the scores stay small.

Every draw is validated (`problems`) and redrawn until it passes:

- every row of X is non-zero and the rows are distinct;
- per head, the blocks of W_Q, W_K, W_V (d, d_k) have full column rank d_k (for small
  integer matrices: exact, as the rank of the integer matrix), V is not all zero, and W_O
  (d, d) is invertible (rank d), so no projection throws a direction away;
- per head, the rows of Q are not all equal, the n scores of every row are distinct,
  every softmax weight lies in [MIN_WEIGHT, MAX_WEIGHT) = [0.001, 0.95) (not saturated,
  and no weight that rounds to 0.000x looks like a zero), and no two rows of weights are
  equal at 4 decimals.

X is drawn first (up to X_TRIES = 2000 times, MAX_DRAWS = 60000 candidates in all); then
each head's W_Q and W_K blocks (up to HEAD_TRIES per head, drawn BATCH at a time; with
d_k = 1, where a block is one column, every pair of candidate columns of {-1, 0, 1}^d is
tried, in a seeded random order, as random draws rarely hit the few that work), then W_V's
blocks and W_O (up to MATRIX_TRIES each). A head that finds no
valid block redraws X. When nothing passes within these bounds the options admit no
exercise (n = 4 with d = 1, for instance: four distinct non-zero entries of X do not exist)
and `make_exercise` raises BadInput in one line naming the options.

The worksheet (Markdown or LaTeX, prose in `templates/exercise/`) shows the given matrices
and, for every step of the trace, its formula and an empty matrix of the right shape. The
answer key is the full derivation from `attntrace.render`; `answer_key(trace)` is an answer
file (rounded to 4 decimals) that `attntrace check` accepts.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attntrace.model.errors import BadInput
from attntrace.rendering.jinja_env import user_template_errors
from attntrace.rendering.plaindata import to_plain
from attntrace.rendering.printing import TexOut
from attntrace.rendering.renderer import environment, tidy
from attntrace.model.trace import Trace
from attntrace.kinds import kind_of

MAX_N, MAX_D, MAX_HEADS = 12, 12, 6
#: Every softmax weight is below MAX_WEIGHT (no saturated row) and at least MIN_WEIGHT.
MAX_WEIGHT, MIN_WEIGHT = 0.95, 0.001
#: Drawn entries: X from {-1, 0, 1, 2}; W_Q, W_K, W_V from {-1, 0, 1}; W_O from {0, 1}.
X_VALUES, W_VALUES, O_VALUES = (-1, 0, 1, 2), (-1, 0, 1), (0, 1)
X_TRIES, HEAD_TRIES, MATRIX_TRIES = 2000, 128, 200
#: (W_Q, W_K) candidates are drawn BATCH at a time (HEAD_TRIES is a multiple of it).
BATCH = 32
#: All candidates drawn together (X, blocks, W_O) stop at this; it bounds the time of a hopeless search.
MAX_DRAWS = 60000


def _x_p(d: int):
    nz = min(0.65, 2.6 / d)  # d = 4: 0.15, 0.35, 0.35, 0.15
    return (0.23 * nz, 1 - nz, 0.54 * nz, 0.23 * nz)


def _w_p(d: int, d_k: int):
    nz = min(0.55, 2.5 / d_k)  # d_k <= 4: 0.15, 0.45, 0.40
    return (0.27 * nz, 1 - nz, 0.73 * nz)


def _int_arg(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise BadInput(f"{name} must be an integer, not {value!r}")
    if not low <= value <= high:
        raise BadInput(f"{name} must be from {low} to {high}, not {value}")
    return int(value)


def _validate(n, d, heads, seed) -> tuple[int, int, int, int]:
    n = _int_arg(n, "n (sequence length)", 2, MAX_N)  # one word: its softmax weight is always 1
    d = _int_arg(d, "d (model width)", 1, MAX_D)
    heads = _int_arg(heads, "heads", 1, MAX_HEADS)
    if d % heads:
        raise BadInput(f"heads = {heads} does not divide d = {d}: each head takes d / heads columns")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise BadInput(f"seed must be a non-negative integer, not {seed!r}")
    return n, d, heads, int(seed)


# --------------------------------------------------------------------------- validation


def _rank(m) -> int:
    m = np.asarray(m)
    if m.shape[1] == 1:
        return int(m.any())
    return int(np.linalg.matrix_rank(np.asarray(m, dtype=float)))


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def x_problem(x: np.ndarray) -> str | None:
    if not x.any(axis=1).all():
        return "X has a zero row"
    if len({tuple(r) for r in x.tolist()}) < len(x):
        return "X has two equal rows"
    return None


def head_problem(x: np.ndarray, wq: np.ndarray, wk: np.ndarray) -> str | None:
    """What makes one head's (W_Q, W_K) blocks (d, d_k) a poor exercise, or None."""
    n, d_k = x.shape[0], wq.shape[1]
    q, k = x @ wq, x @ wk
    if (q == q[0]).all():
        return "all rows of Q equal"
    s = q @ k.T
    if (np.diff(np.sort(s, axis=1), axis=1) == 0).any():
        return "equal scores in a row"
    a = _softmax(s / math.sqrt(d_k))
    if a.max() >= MAX_WEIGHT:
        return f"saturated softmax (a weight >= {MAX_WEIGHT})"
    if a.min() < MIN_WEIGHT:
        return f"a weight below {MIN_WEIGHT}"
    if len({tuple(r) for r in np.round(a, 4).tolist()}) < n:
        return "two equal rows of weights"
    if _rank(wq) < d_k or _rank(wk) < d_k:
        return "rank-deficient W_Q or W_K block"
    return None


def value_problem(x: np.ndarray, wv: np.ndarray) -> str | None:
    if _rank(wv) < wv.shape[1]:
        return "rank-deficient W_V block"
    if not (x @ wv).any():
        return "V is zero"
    return None


def output_problem(wo: np.ndarray) -> str | None:
    return None if _rank(wo) == wo.shape[0] else "W_O is not invertible"


def problems(spec: dict) -> list[str]:
    """Every reason why `spec` (a generated exercise) would not be worth handing out."""
    x = np.asarray(spec["X"])
    wq, wk, wv = (np.asarray(spec[k]) for k in ("W_Q", "W_K", "W_V"))
    heads = int(spec.get("num_heads", 1))
    d_k = x.shape[1] // heads
    found = [p for p in [x_problem(x)] if p]
    for h in range(heads):
        c = slice(h * d_k, (h + 1) * d_k)
        for p in (head_problem(x, wq[:, c], wk[:, c]), value_problem(x, wv[:, c])):
            if p:
                found.append(f"head {h + 1}: {p}")
    if heads > 1:
        p = output_problem(np.asarray(spec["W_O"]))
        if p:
            found.append(p)
    return found


# --------------------------------------------------------------------------- drawing


@dataclass
class Draw:
    x: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray | None
    #: candidates drawn: {"X": k, "QK": k, "V": k, "O": k}; "X" > 1 means X was redrawn.
    tries: dict = field(default_factory=dict)


def _columns(d: int) -> np.ndarray:
    """Every non-zero column of {-1, 0, 1}^d (the candidates of a d_k = 1 block)."""
    cols = np.array(list(itertools.product(W_VALUES, repeat=d)), dtype=np.int64)
    return cols[cols.any(axis=1)]


def _head_blocks(rng, x, d, d_k, tries):
    """A valid (W_Q, W_K) block pair for one head, or None."""
    if d_k == 1:  # few candidates: try them all, in a seeded order, the promising ones only
        cols = _columns(d)[rng.permutation(3 ** d - 1)]
        vals = x @ cols.T  # (n, candidates)
        distinct = np.array([len(set(v)) == len(v) for v in vals.T.tolist()])
        q_cols = cols[distinct & vals.all(axis=0)]
        k_cols = cols[distinct]
        q_vals, k_vals = x @ q_cols.T, x @ k_cols.T  # (n, A), (n, B)
        for a in range(len(q_cols)):  # pairs in order (a, b); a quick test of the softmax bounds first
            s = q_vals[:, a][None, :, None] * k_vals.T[:, None, :]  # (B, n, n)
            w = np.exp(s - s.max(axis=2, keepdims=True))
            w /= w.sum(axis=2, keepdims=True)
            quick = (w.max(axis=(1, 2)) < MAX_WEIGHT) & (w.min(axis=(1, 2)) >= MIN_WEIGHT)
            for b in np.flatnonzero(quick):
                wq, wk = q_cols[a][:, None], k_cols[b][:, None]
                if head_problem(x, wq, wk) is None:
                    tries["QK"] += a * len(k_cols) + int(b) + 1
                    return wq, wk
        tries["QK"] += len(q_cols) * len(k_cols)
        return None
    p = _w_p(d, d_k)
    for _ in range(HEAD_TRIES // BATCH):
        # BATCH candidate pairs drawn at once; a quick vectorised test of the scores picks the
        # ones worth the full check, which is the only judge; tries counts candidates looked at
        wqs, wks = (rng.choice(W_VALUES, size=(BATCH, d, d_k), p=p) for _ in range(2))
        s = (x @ wqs) @ np.swapaxes(x @ wks, 1, 2)  # (BATCH, n, n)
        distinct = (np.diff(np.sort(s, axis=2), axis=2) != 0).all(axis=(1, 2))
        for b in range(BATCH):
            tries["QK"] += 1
            if distinct[b] and head_problem(x, wqs[b], wks[b]) is None:
                return wqs[b], wks[b]
    return None


def _draw_matrix(rng, shape, values, p, ok, tries, key):
    for _ in range(MATRIX_TRIES):
        tries[key] += 1
        m = rng.choice(values, size=shape, p=p)
        if ok(m):
            return m
    return None


def draw_exercise(n: int, d: int, heads: int, seed: int) -> Draw:
    """The validated matrices of an exercise (no trace): see the module's docstring."""
    n, d, heads, seed = _validate(n, d, heads, seed)
    d_k = d // heads
    rng = np.random.default_rng([seed, n, d, heads])
    tries = {"X": 0, "QK": 0, "V": 0, "O": 0}
    for _ in range(X_TRIES):
        if sum(tries.values()) >= MAX_DRAWS:
            break
        tries["X"] += 1
        x = rng.choice(X_VALUES, size=(n, d), p=_x_p(d))
        if x_problem(x):
            continue
        blocks = []
        for _h in range(heads):
            pair = _head_blocks(rng, x, d, d_k, tries)
            if pair is None:
                break
            blocks.append(pair)
        else:
            wvs = [_draw_matrix(rng, (d, d_k), W_VALUES, _w_p(d, d_k), lambda m: value_problem(x, m) is None, tries, "V")
                   for _h in range(heads)]
            if any(m is None for m in wvs):
                continue
            wo = None
            if heads > 1:
                wo = _draw_matrix(rng, (d, d), O_VALUES, (0.5, 0.5), lambda m: output_problem(m) is None, tries, "O")
                if wo is None:
                    continue
            wq = np.hstack([b[0] for b in blocks])
            wk = np.hstack([b[1] for b in blocks])
            return Draw(x, wq, wk, np.hstack(wvs), wo, tries)
    raise BadInput(f"no exercise worth handing out for --n {n} --d {d} --heads {heads} --seed {seed} "
                   f"within {X_TRIES} draws of X and {MAX_DRAWS} draws in all (distinct non-zero rows, full-rank projections, every "
                   f"softmax weight in [{MIN_WEIGHT}, {MAX_WEIGHT})); try another seed, a smaller n or d_k > 1")


def make_exercise(n: int = 2, d: int = 4, heads: int = 1, seed: int = 0) -> tuple[dict, Trace]:
    """A reproducible exercise: (spec dict, its numeric trace)."""
    from attntrace import run

    spec = exercise_spec(n, d, heads, seed)
    return spec, run(spec)


def exercise_spec(n: int = 2, d: int = 4, heads: int = 1, seed: int = 0) -> dict:
    """The spec of `make_exercise` without tracing it."""
    n, d, heads, seed = _validate(n, d, heads, seed)
    draw = draw_exercise(n, d, heads, seed)
    spec: dict[str, Any] = {
        "title": f"Exercise (seed {seed}): n = {n}, d = {d}, {heads} head{'s' if heads > 1 else ''}",
        "description": f"Generated by attntrace exercise --n {n} --d {d} --heads {heads} --seed {seed}.",
        "mode": "numeric",
        "X": draw.x.tolist(),
        "W_Q": draw.wq.tolist(),
        "W_K": draw.wk.tolist(),
        "W_V": draw.wv.tolist(),
    }
    if heads > 1:
        spec["num_heads"] = heads
        spec["W_O"] = draw.wo.tolist()
    return spec


def _round(x: float) -> float:
    r = round(float(x), 4)
    return 0.0 if r == 0 else r  # no "-0.0" in answer files


def answer_key(trace: Trace) -> dict[str, list[list[float]]]:
    """Every step of a numeric trace as an answer file {"weights@2": [[...]], ...}, 4 decimals."""
    if trace.mode != "numeric":
        raise BadInput(f"an answer key needs a numeric trace, not a {trace.mode} one")
    key = {}
    for step in trace.steps:
        value = np.asarray(step.value, dtype=float)
        key[step.key] = [[_round(v) if np.isfinite(v) else float(v) for v in row] for row in value]
    return key


# --------------------------------------------------------------------------- TOML output


def _toml_value(v: Any) -> str:
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        if math.isinf(v):
            return "-inf" if v < 0 else "inf"
        return repr(float(v))
    if isinstance(v, (list, tuple)):
        if v and isinstance(v[0], (list, tuple)):
            return "[\n" + "".join(f"  {_toml_value(row)},\n" for row in v) + "]"
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def to_toml(data: dict) -> str:
    """A flat spec or answer dict (text, numbers, matrices) as TOML; keys with @ are quoted."""
    lines = []
    for k, v in data.items():
        name = k if k.replace("_", "").isalnum() else _toml_value(k)
        lines.append(f"{name} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- worksheet


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
            "lhs": _lhs(step.id, step.head),
            "blank": _blank_matrix(step.shape, cell),
            "factor": details.get("factor"),
        })
    return {
        "title": spec["title"], "seed": _seed_of(spec), "n": len(spec["X"]), "d": d, "heads": heads, "d_k": d_k,
        "factor": math.sqrt(d_k), "factor_is_integer": math.isqrt(d_k) ** 2 == d_k,
        "given": [{"name": nm, "tex": _tex_int_matrix(m), "shape": np.asarray(m).shape} for nm, m, _ in given],
        "steps": steps,
        "split": heads > 1,
    }


def _seed_of(spec: dict) -> int | None:
    m = re.search(r"\(seed (\d+)\)", str(spec.get("title", "")))
    return int(m.group(1)) if m else None


_PROSE_PARTS = re.compile(r"(\$[^$]+\$|`[^`]+`)")


def prose_markup(text: str, format: str, brackets: bool = False) -> str:
    """Worksheet prose (templates/exercise/prose) for `format` (md, tex or html): `$...$` is
    math, passed through as math; `...` in backticks is code; the rest is text, escaped for
    the format."""
    import html

    from attntrace.rendering.viewmodel import escape_md, escape_tex

    out = []
    for i, part in enumerate(_PROSE_PARTS.split(str(text))):
        if not part:
            continue
        if i % 2 == 0:
            out.append({"tex": escape_tex, "html": html.escape}.get(format, escape_md)(part))
        elif part.startswith("$"):
            tex = part[1:-1]
            if format == "html":
                out.append(f"\\({html.escape(tex)}\\)")
            else:
                out.append(part if format == "tex" else (f"\\({tex}\\)" if brackets else f"${tex}$"))
        else:
            code = part[1:-1]
            out.append({"tex": f"\\texttt{{{escape_tex(code)}}}", "html": f"<code>{html.escape(code)}</code>"}
                       .get(format, f"`{code}`"))
    return "".join(out)


def _lhs(step_id: str, head) -> str:
    """The step's matrix name as in the reports (S, A^{(2)}, ...); the concatenation is Z_concat."""
    letter = "Z_{\\text{concat}}" if step_id == "concat" else kind_of(step_id).letter
    return _TEX.head_name(letter, head)


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


def _write(path: Path, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot write {str(path)!r}: {exc.strerror or type(exc).__name__}") from None


def exercise_command(args, render_options: dict) -> int:
    """`attntrace exercise`: print the worksheet (or with --key the answer key); write spec/answers;
    --format moodle / qti: a quiz of --variants seeded variants (see attntrace.teach.lms)."""
    from attntrace.cli import _emit

    if args.format in ("moodle", "qti", "numbas"):
        return _lms_command(args, render_options)
    spec, trace = make_exercise(args.n, args.d, args.heads, args.seed)
    if args.spec_out is not None:
        _write(args.spec_out, "# " + spec["description"] + "\n" + to_toml(spec))
    if args.answer_out is not None:
        _write(args.answer_out, f"# answer key of: {spec['title']}\n" + to_toml(answer_key(trace)))
    options = dict(render_options)
    if args.key:
        from attntrace.rendering.renderer import render

        text = render(trace, format=args.format, **options)
    else:
        text = render_worksheet(spec, trace, format=args.format, lang=options.get("lang", "en"),
                                standalone=bool(options.get("standalone")), template_dir=options.get("template_dir"),
                                math_delimiters=options.get("math_delimiters", "dollars"))
    _emit(text, options.get("output_path"))
    return 0


def _lms_command(args, options: dict) -> int:
    from attntrace.teach import lms
    from attntrace.cli import _emit

    if args.key or args.spec_out is not None or args.answer_out is not None:
        raise BadInput(f"--format {args.format} writes a quiz with its answers: --key, --spec-out and --answer-out do not apply")
    variants = lms.make_variants(args.n, args.d, args.heads, args.seed, getattr(args, "variants", None) or 1)
    lang, template_dir, output = options.get("lang", "en"), options.get("template_dir"), options.get("output_path")
    if args.format == "moodle":
        _emit(lms.moodle_xml(variants, lang, template_dir), output)
        return 0
    if args.format == "numbas":
        from attntrace.teach import numbas

        _emit(numbas.exam_text(variants, lang, template_dir), output)
        return 0
    if output is None:
        raise BadInput("--format qti writes a zip package: give -o FILE.zip")
    data = lms.qti_package(variants, lang, template_dir)
    try:
        Path(output).write_bytes(data)
    except OSError as exc:
        raise BadInput(f"cannot write {str(output)!r}: {exc.strerror or type(exc).__name__}") from None
    return 0
