"""A student's answer (TOML / JSON file, or a dict) -> their matrices, entry by entry.

Format (TOML shown; JSON is the same tree)::

    title = "my homework"           # optional text: title, student, comment
    scores  = [[1, 2], [3, 4]]      # any subset of the step ids, as matrices (lists of rows)
    weights = [["1/3", "2/3"], [0.27, 0.73]]
    masked  = [[0.5, "-inf"], [0.1, 0.2]]

    [head.2]                        # per-head steps of a multi-head problem: a table per head
    weights = [[0.5, 0.5], [0.25, 0.75]]

    # ... or, equivalently, the key form (quote it in TOML): "weights@2" = [[...]]

Entries are integers, decimals (as numbers or strings), exact forms as strings ("1/3",
"sqrt(6)/3", "exp(2)/(1+exp(2))", parsed by the whitelist parser `attntrace.inputs.expr.parse_expr`, never
evaluated), or "-inf" for a masked score (TOML's bare -inf works too).

`student` names the student in every report and in the JSON (`Answers.meta`). Q, K, V and Z
of a multi-head problem may be given full width; the checker splits them into heads.

Each entry keeps how it was written, because the tolerance follows it (see `Policy`: the true
value correctly rounded to the decimals written) and so does the interval a later step is
recomputed over (`Entry.radius`, half a unit of the last decimal):
TOML and JSON numbers are read with their raw text (so 0.650 counts as 3 decimals); Python
floats given in a dict count the decimals of `repr(x)` (0.65 -> 2 decimals).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from attntrace.inputs import limits
from attntrace.model.errors import BadInput
from attntrace.inputs.spec import read_table_file
from attntrace.model.trace import PER_HEAD_STEPS, STEP_IDS

#: Text keys an answer file may hold besides the steps.
META_KEYS = ("title", "student", "comment")
#: The table holding per-head steps: [head.2] in TOML, {"head": {"2": {...}}} in JSON.
HEAD_TABLE = "head"
MAX_ENTRIES = 100_000
MAX_TEXT = 200

_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_NEG_INF = {"-inf", "-infinity", "-oo", "-∞", "−inf", "−∞", "-\\infty"}


class _Raw(str):
    """The raw text of a TOML/JSON float, kept so that 0.650 stays three decimals."""


#: Slack added to every tolerance, relative to max(1, |true value|): a true value that is an
#: exact tie (0.125 to 2 decimals) may be rounded either way, and float64 truth carries
#: about 1e-16 of noise that must not tip a tie over.
TIE_SLACK = 1e-9
MAX_DECIMALS = 15


@dataclass(frozen=True)
class Policy:
    """How close a written number must be to the true value (the teacher's setting).

    - default (no option): a number written with d decimals is right when it is the true value
      correctly rounded to d decimals: |given - true| <= 0.5 * 10^-d + slack; an integer or an
      exact form (1/3, sqrt(6)/3) must be exact (to the slack);
    - `decimals=N` (--decimals N): every entry, however written, must be within half a unit of
      the N-th decimal of the true value;
    - `atol`/`rtol` (--atol/--rtol): |given - true| <= atol + rtol * |true|.

    slack = TIE_SLACK * max(1, |true|). The report footer states the rule in force with these
    numbers (templates/check/messages.*.j2, `tolerance_rule`).
    """

    decimals: int | None = None
    atol: float | None = None
    rtol: float | None = None

    @property
    def kind(self) -> str:
        if self.atol is not None or self.rtol is not None:
            return "absolute"
        return "decimals" if self.decimals is not None else "written"

    def allowed(self, entry: "Entry", expected: float) -> float:
        """How far from `expected` this entry may be and still count as right."""
        slack = TIE_SLACK * max(1.0, abs(expected))
        kind = self.kind
        if kind == "absolute":
            return (self.atol or 0.0) + (self.rtol or 0.0) * abs(expected)
        if kind == "decimals":
            return 0.5 * 10.0 ** -self.decimals + slack
        if entry.kind == "decimal":
            return 0.5 * 10.0 ** -entry.decimals + slack
        return slack

    def to_dict(self) -> dict:
        return {"rule": self.kind, "decimals": self.decimals, "atol": self.atol, "rtol": self.rtol, "slack": TIE_SLACK}


DEFAULT_POLICY = Policy()


@dataclass(frozen=True)
class Entry:
    """One number as the student wrote it.

    kind: "decimal" (decimals = digits after the point, scientific notation counted),
    "exact" (an integer or an exact form such as 1/3), or "neg_inf" (a masked score).
    """

    value: float
    text: str
    kind: str
    decimals: int | None = None

    @property
    def radius(self) -> float:
        """Half a unit of the last decimal written: where the unrounded number the student had
        may lie. A later step computed from this entry is checked over that whole interval."""
        if self.kind == "decimal":
            return 0.5 * 10.0 ** -self.decimals
        return 0.0

    def tolerance(self, expected: float, atol: float | None = None, rtol: float | None = None,
                  policy: Policy | None = None) -> float:
        """How far from `expected` this entry may be and still count as right (see `Policy`)."""
        policy = policy or (Policy(atol=atol, rtol=rtol) if (atol is not None or rtol is not None) else DEFAULT_POLICY)
        return policy.allowed(self, expected)

    def matches(self, expected: float, atol: float | None = None, rtol: float | None = None,
                policy: Policy | None = None) -> bool:
        return self.within(expected, expected, policy or Policy(atol=atol, rtol=rtol))

    def within(self, lo: float, hi: float, policy: Policy) -> bool:
        """Right against some true value in [lo, hi] (a recomputation from rounded inputs)."""
        if math.isnan(lo) or math.isnan(hi):
            return False
        if self.kind == "neg_inf" or math.isinf(lo) or math.isinf(hi):
            return self.value == lo or self.value == hi
        nearest = min(max(self.value, lo), hi)
        return abs(self.value - nearest) <= policy.allowed(self, nearest) * (1 + 1e-12)


@dataclass(frozen=True)
class AnswerMatrix:
    """The student's matrix for one step (`key` is 'weights' or 'weights@2')."""

    id: str
    head: int | None
    entries: tuple[tuple[Entry, ...], ...]

    @property
    def key(self) -> str:
        return self.id if self.head is None else f"{self.id}@{self.head}"

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.entries), len(self.entries[0]))

    @property
    def values(self) -> np.ndarray:
        a = np.array([[e.value for e in row] for row in self.entries], dtype=np.float64)
        a.setflags(write=False)
        return a

    @property
    def radii(self) -> np.ndarray:
        """Half a unit of each entry's last written decimal (0 for exact entries)."""
        return np.array([[e.radius for e in row] for row in self.entries], dtype=np.float64)

    def fits(self, lo: np.ndarray | None, hi: np.ndarray | None, policy: Policy = DEFAULT_POLICY) -> bool:
        """Every entry right against some value in [lo, hi] (same shape required)."""
        if lo is None or tuple(lo.shape) != self.shape:
            return False
        return not self.misfits(lo, hi, policy, stop=True)

    def misfits(self, lo: np.ndarray, hi: np.ndarray, policy: Policy = DEFAULT_POLICY, stop: bool = False) -> list[tuple[int, int, Entry]]:
        """(row, col, entry) of the entries outside [lo, hi] with their tolerance, 0-based."""
        out = []
        for i, row in enumerate(self.entries):
            for j, e in enumerate(row):
                if not e.within(float(lo[i, j]), float(hi[i, j]), policy):
                    out.append((i, j, e))
                    if stop:
                        return out
        return out

    def matches(self, expected: np.ndarray, atol=None, rtol=None, policy: Policy | None = None) -> bool:
        """Every entry right against `expected` (same shape required)."""
        return self.fits(expected, expected, policy or Policy(atol=atol, rtol=rtol))

    def mismatches(self, expected: np.ndarray, atol=None, rtol=None, policy: Policy | None = None) -> list[tuple[int, int, Entry]]:
        """(row, col, entry) of the wrong entries, 0-based."""
        return self.misfits(expected, expected, policy or Policy(atol=atol, rtol=rtol))

    def columns(self, first: int, stop: int, head: int) -> "AnswerMatrix":
        """Columns first..stop-1 as head `head`'s matrix (a full-width answer split into heads)."""
        return AnswerMatrix(self.id, head, tuple(row[first:stop] for row in self.entries))


class Answers(dict):
    """{(step id, head): AnswerMatrix} plus the file's text fields (`meta`: title, student, comment)."""

    meta: dict

    @property
    def student(self) -> str | None:
        return self.meta.get("student")


# -- reading ---------------------------------------------------------------------------------
def read_answer_file(path: str | Path) -> dict:
    """Read a TOML or JSON answer file, keeping the raw text of every float."""
    return read_table_file(path, "answer", parse_float=_Raw)


def load_answer(answer: Any, steps: tuple[str, ...] | None = None) -> Answers:
    """Path or dict -> Answers {(step id, head): AnswerMatrix}. Every problem is one-line BadInput.

    Any step kind's id is accepted (`attntrace.kinds.KINDS`: Q_rope, K_cache, dZ, norm1, ...);
    whether the trace has it is checked against the trace. steps: the trace's step ids, named
    in the message for an unknown id (default: the ten of `STEP_IDS`)."""
    known = _known_ids()
    listed = ", ".join(steps or STEP_IDS)
    if isinstance(answer, (str, Path)):
        data = read_answer_file(answer)
    elif isinstance(answer, Mapping):
        data = dict(answer)
    else:
        raise BadInput(f"an answer is a path or a dict, not {type(answer).__name__}")
    out = Answers()
    out.meta = {}

    def put(step_id: str, head: int | None, raw: Any) -> None:
        m = AnswerMatrix(step_id, head, _matrix(raw, step_id if head is None else f"{step_id}@{head}"))
        if (step_id, head) in out:
            raise BadInput(f"answer gives {m.key} twice (as a key and in a [{HEAD_TABLE}.{head}] table)")
        out[(step_id, head)] = m

    for key, raw in data.items():
        if not isinstance(key, str):
            raise BadInput(f"answer keys must be step names, not {key!r}")
        if key in META_KEYS:
            if not isinstance(raw, str):
                raise BadInput(f"answer: {key} must be text")
            out.meta[key] = raw
            continue
        if key == HEAD_TABLE:
            if not isinstance(raw, Mapping):
                raise BadInput(f"answer: {HEAD_TABLE} must be a table of heads, e.g. [{HEAD_TABLE}.2] weights = ...")
            for h, table in raw.items():
                head = _head_number(str(h), f"[{HEAD_TABLE}.{h}]")
                if not isinstance(table, Mapping):
                    raise BadInput(f"answer: [{HEAD_TABLE}.{h}] must be a table of step names")
                for step_id, value in table.items():
                    if step_id not in known or step_id in STEP_IDS and step_id not in PER_HEAD_STEPS:
                        raise BadInput(f"answer: unknown per-head step {step_id!r} in [{HEAD_TABLE}.{h}]; "
                                       f"per-head steps are {', '.join(PER_HEAD_STEPS)} (and per-head steps of the trace)")
                    put(step_id, head, value)
            continue
        step_id, sep, h = key.partition("@")
        if step_id not in known:
            raise BadInput(f"answer: unknown step {key!r}; steps are {listed} "
                           f"(per head: weights@2 or a [{HEAD_TABLE}.2] table)")
        head = None
        if sep:
            if step_id in STEP_IDS and step_id not in PER_HEAD_STEPS:
                raise BadInput(f"answer: {step_id} is not a per-head step, so {key!r} has no meaning")
            head = _head_number(h, repr(key))
        put(step_id, head, raw)
    if not out:
        raise BadInput("the answer gives no steps; give any of " + listed)
    return out


def _known_ids() -> frozenset:
    """Every step id a trace may have: those of `STEP_IDS` and every step kind's."""
    from attntrace.kinds import KINDS

    return frozenset(STEP_IDS) | frozenset(KINDS)


def _head_number(text: str, where: str) -> int:
    if not _INTEGER.fullmatch(text) or int(text) < 1:
        raise BadInput(f"answer: {where}: heads are numbered 1, 2, ..., not {text!r}")
    return int(text)


# -- matrices and entries ----------------------------------------------------------------------
def _matrix(raw: Any, label: str) -> tuple[tuple[Entry, ...], ...]:
    if hasattr(raw, "tolist") and not isinstance(raw, (str, bytes)):
        raw = raw.tolist()  # numpy array or SymPy matrix
    if not isinstance(raw, (list, tuple)):
        raise BadInput(f"answer {label}: a matrix is a list of rows, not {_describe(raw)}")
    if not raw:
        raise BadInput(f"answer {label}: the matrix is empty")
    if not any(isinstance(r, (list, tuple)) for r in raw):
        raw = [raw]  # a single row written flat
    rows = []
    width = None
    for i, row in enumerate(raw, start=1):
        if not isinstance(row, (list, tuple)):
            raise BadInput(f"answer {label}: row {i} is {_describe(row)}, not a list of numbers")
        if not row:
            raise BadInput(f"answer {label}: row {i} is empty")
        if width is None:
            width = len(row)
        elif len(row) != width:
            raise BadInput(f"answer {label}: ragged rows: row 1 has {width} entries but row {i} has {len(row)}")
        rows.append(tuple(parse_entry(x, f"answer {label}, row {i}, column {j}") for j, x in enumerate(row, start=1)))
        if len(rows) * width > MAX_ENTRIES:
            raise BadInput(f"answer {label}: more than {MAX_ENTRIES} entries")
    return tuple(rows)


def _describe(x: Any) -> str:
    if isinstance(x, str):
        return f"the text {x[:40]!r}"
    if isinstance(x, Mapping):
        return "a table"
    return type(x).__name__


def parse_entry(x: Any, where: str) -> Entry:
    """One written number -> Entry (value, how it was written)."""
    if isinstance(x, bool):
        raise BadInput(f"{where}: {x!r} is not a number")
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, int):
        digits = limits.get("digits")
        if abs(x).bit_length() > 3 * digits and len(str(abs(x))) > digits:
            raise limits.refuse(f"{where}: a number with more than {digits} digits", "digits")
        if abs(x).bit_length() > 1023:
            raise BadInput(f"{where}: {str(x)[:20]}... is too large")
        return Entry(float(x), str(x), "exact")
    if isinstance(x, float) and not isinstance(x, _Raw):
        if x == -math.inf:
            return Entry(-math.inf, "-inf", "neg_inf")
        if not math.isfinite(x):
            raise BadInput(f"{where}: {x!r} is not allowed (only -inf, for a masked score)")
        return _decimal(repr(x), where)
    if isinstance(x, Fraction):
        return Entry(float(x), str(x), "exact")
    if isinstance(x, str):
        return _text(x, where)
    if type(x).__module__.startswith("sympy"):
        return _sympy_number(x, str(x), where)
    raise BadInput(f"{where}: {_describe(x)} is not a number")


def _text(text: str, where: str) -> Entry:
    t = text.strip()
    if len(t) > MAX_TEXT:
        raise BadInput(f"{where}: entry too long ({len(t)} characters; at most {MAX_TEXT})")
    if t.lower() in _NEG_INF:
        return Entry(-math.inf, t, "neg_inf")
    if t.lower().lstrip("+-") in ("inf", "infinity", "nan", "oo", "∞"):
        raise BadInput(f"{where}: {t!r} is not allowed (only -inf, for a masked score)")
    if _INTEGER.fullmatch(t):
        return Entry(float(int(t)), t, "exact")
    if _DECIMAL.fullmatch(t):
        return _decimal(t, where)
    from attntrace.inputs.expr import parse_expr  # the whitelist parser: never eval

    try:
        value = parse_expr(t, allow_symbols=False)
    except BadInput as exc:
        raise BadInput(f"{where}: {exc}") from None
    return _sympy_number(value, t, where)


def _decimal(text: str, where: str) -> Entry:
    try:
        d = Decimal(text)
    except InvalidOperation:
        raise BadInput(f"{where}: {text!r} is not a number") from None
    exponent = d.as_tuple().exponent
    value = float(d)
    if not math.isfinite(value):
        raise BadInput(f"{where}: {text!r} is too large")
    if "e" not in text.lower() and "." not in text:
        return Entry(value, text, "exact")
    return Entry(value, text, "decimal", max(0, -int(exponent)))


def _sympy_number(value: Any, text: str, where: str) -> Entry:
    import sympy

    try:
        expr = value if isinstance(value, sympy.Basic) else sympy.sympify(value, strict=True)  # strict: never parses text
    except (sympy.SympifyError, TypeError):
        raise BadInput(f"{where}: {text!r} is not a number") from None
    if expr == -sympy.oo:
        return Entry(-math.inf, text, "neg_inf")
    if getattr(expr, "free_symbols", None) or not expr.is_number:
        raise BadInput(f"{where}: {text!r} is not a number (it has letters in it)")
    try:
        v = complex(sympy.N(expr, 30))
    except (TypeError, ValueError):
        raise BadInput(f"{where}: {text!r} is not a number") from None
    if abs(v.imag) > 1e-12 or not math.isfinite(v.real):
        raise BadInput(f"{where}: {text!r} is not a finite real number")
    if isinstance(expr, sympy.Float):
        return _decimal(text if _DECIMAL.fullmatch(text) else repr(float(v.real)), where)
    return Entry(v.real, text, "exact")
