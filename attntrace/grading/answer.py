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

import difflib
import math
import re
from dataclasses import dataclass
from functools import cached_property
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from attntrace.inputs import limits
from attntrace.model.errors import BadInput
from attntrace.inputs.safetext import clean_text
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


#: Entry kinds as stored in an AnswerMatrix's `kinds` array.
KIND_CODES = {"exact": 0, "decimal": 1, "neg_inf": 2}
_KIND_NAMES = tuple(KIND_CODES)
#: 0.5 * 10^-d for d = 0..400 (computed by Python, so an array lookup gives exactly the
#: number `Policy.allowed` computes for one entry); every d > 400 gives 0.
_HALF_UNITS = np.array([0.5 * 10.0 ** -d for d in range(401)], dtype=np.float64)


def _half_units(decimals: np.ndarray) -> np.ndarray:
    return _HALF_UNITS[np.minimum(decimals, 400)]


@dataclass(frozen=True, eq=False)
class AnswerMatrix:
    """The student's matrix for one step (`key` is 'weights' or 'weights@2').

    Held as arrays, entry by entry (a 256 x 256 matrix is 65,536 entries; one Python object
    each cost seconds and gigabytes): `values` (float64), `kinds` (KIND_CODES), `decimals`
    (digits after the point of a "decimal" entry, else 0) and `texts` (how each was written).
    `entry(i, j)` and `entries` give `Entry` objects.
    """

    id: str
    head: int | None
    values: np.ndarray
    kinds: np.ndarray
    decimals: np.ndarray
    texts: np.ndarray

    @classmethod
    def from_entries(cls, id: str, head: int | None, rows) -> "AnswerMatrix":
        rows = [list(r) for r in rows]
        flat = [e for r in rows for e in r]
        shape = (len(rows), len(rows[0]) if rows else 0)
        return cls(id, head, *_arrays([e.value for e in flat], [KIND_CODES[e.kind] for e in flat],
                                      [e.decimals or 0 for e in flat], [e.text for e in flat], shape))

    @property
    def key(self) -> str:
        return self.id if self.head is None else f"{self.id}@{self.head}"

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.values.shape)

    def entry(self, i: int, j: int) -> Entry:
        kind = _KIND_NAMES[int(self.kinds[i, j])]
        return Entry(float(self.values[i, j]), str(self.texts[i, j]), kind,
                     int(self.decimals[i, j]) if kind == "decimal" else None)

    @property
    def entries(self) -> tuple[tuple[Entry, ...], ...]:
        rows, cols = self.shape
        return tuple(tuple(self.entry(i, j) for j in range(cols)) for i in range(rows))

    @cached_property
    def radii(self) -> np.ndarray:
        """Half a unit of each entry's last written decimal (0 for exact entries)."""
        return np.where(self.kinds == KIND_CODES["decimal"], _half_units(self.decimals), 0.0)

    @cached_property
    def _neg_inf(self) -> np.ndarray:
        return self.kinds == KIND_CODES["neg_inf"]

    def allowed(self, expected: np.ndarray, policy: Policy) -> np.ndarray:
        """`Policy.allowed` of every entry against `expected` (same numbers, entry by entry:
        slack + 0 is slack, and half + slack is slack + half)."""
        kind = policy.kind
        if kind == "absolute":
            return (policy.atol or 0.0) + (policy.rtol or 0.0) * np.abs(expected)
        slack = TIE_SLACK * np.maximum(1.0, np.abs(expected))
        if kind == "decimals":
            return 0.5 * 10.0 ** -policy.decimals + slack
        return slack + self.radii

    def ok_mask(self, lo: np.ndarray, hi: np.ndarray, policy: Policy = DEFAULT_POLICY) -> np.ndarray:
        """Entry by entry, `Entry.within(lo, hi, policy)`: right against some value in [lo, hi]."""
        v = self.values
        point = lo is hi
        lo = np.asarray(lo, dtype=np.float64)
        hi = lo if point else np.asarray(hi, dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            if point:  # min(max(v, lo), lo) is lo
                nan = np.isnan(lo)
                infinite = self._neg_inf | np.isinf(lo)
                ok_inf = v == lo
                nearest = lo
            else:
                nan = np.isnan(lo) | np.isnan(hi)
                infinite = self._neg_inf | np.isinf(lo) | np.isinf(hi)
                ok_inf = (v == lo) | (v == hi)
                nearest = np.minimum(np.maximum(v, lo), hi)
            ok = np.abs(v - nearest) <= self.allowed(nearest, policy) * (1 + 1e-12)
        return ~nan & np.where(infinite, ok_inf, ok)

    def fits(self, lo: np.ndarray | None, hi: np.ndarray | None, policy: Policy = DEFAULT_POLICY) -> bool:
        """Every entry right against some value in [lo, hi] (same shape required)."""
        if lo is None or tuple(lo.shape) != self.shape:
            return False
        return bool(self.ok_mask(lo, hi, policy).all())

    def misfit_cells(self, lo: np.ndarray, hi: np.ndarray, policy: Policy = DEFAULT_POLICY) -> np.ndarray:
        """(row, col) of the entries outside [lo, hi], 0-based, row by row: an (k, 2) array."""
        return np.argwhere(~self.ok_mask(lo, hi, policy))

    def misfits(self, lo: np.ndarray, hi: np.ndarray, policy: Policy = DEFAULT_POLICY, stop: bool = False) -> list[tuple[int, int, Entry]]:
        """(row, col, entry) of the entries outside [lo, hi] with their tolerance, 0-based."""
        cells = self.misfit_cells(lo, hi, policy)
        if stop:
            cells = cells[:1]
        return [(int(i), int(j), self.entry(i, j)) for i, j in cells]

    def matches(self, expected: np.ndarray, atol=None, rtol=None, policy: Policy | None = None) -> bool:
        """Every entry right against `expected` (same shape required)."""
        return self.fits(expected, expected, policy or Policy(atol=atol, rtol=rtol))

    def mismatches(self, expected: np.ndarray, atol=None, rtol=None, policy: Policy | None = None) -> list[tuple[int, int, Entry]]:
        """(row, col, entry) of the wrong entries, 0-based."""
        return self.misfits(expected, expected, policy or Policy(atol=atol, rtol=rtol))

    def columns(self, first: int, stop: int, head: int) -> "AnswerMatrix":
        """Columns first..stop-1 as head `head`'s matrix (a full-width answer split into heads)."""
        cut = lambda a: _frozen(a[:, first:stop])  # noqa: E731
        return AnswerMatrix(self.id, head, cut(self.values), cut(self.kinds), cut(self.decimals), cut(self.texts))


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _arrays(values, kinds, decimals, texts, shape) -> tuple:
    t = np.empty(len(texts), dtype=object)
    t[:] = texts
    return (_frozen(np.asarray(values, dtype=np.float64).reshape(shape)), _frozen(np.asarray(kinds, dtype=np.int8).reshape(shape)),
            _frozen(np.asarray(decimals, dtype=np.int64).reshape(shape)), _frozen(t.reshape(shape)))


class Answers(dict):
    """{(step id, head): AnswerMatrix} plus the file's text fields (`meta`: title, student,
    comment) and the keys that were ignored (`ignored`: not a step, nor close to one)."""

    meta: dict
    ignored: tuple = ()

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
    ignored: list[str] = []

    def put(step_id: str, head: int | None, raw: Any) -> None:
        m = _matrix(raw, step_id if head is None else f"{step_id}@{head}", step_id, head)
        if (step_id, head) in out:
            raise BadInput(f"answer gives {m.key} twice (as a key and in a [{HEAD_TABLE}.{head}] table)")
        out[(step_id, head)] = m

    for key, raw in data.items():
        if not isinstance(key, str):
            raise BadInput(f"answer keys must be step names, not {key!r}")
        if key in META_KEYS:
            if not isinstance(raw, str):
                raise BadInput(f"answer: {key} must be text")
            # cleaned where it enters: no control or format character reaches a report
            out.meta[key] = " ".join(clean_text(raw).split())
            continue
        if key == HEAD_TABLE:
            if not isinstance(raw, Mapping):
                raise BadInput(f"answer: {HEAD_TABLE} must be a table of heads, e.g. [{HEAD_TABLE}.2] weights = ...")
            for h, table in raw.items():
                head = _head_number(str(h), f"[{HEAD_TABLE}.{h}]")
                if not isinstance(table, Mapping):
                    raise BadInput(f"answer: [{HEAD_TABLE}.{h}] must be a table of step names")
                for step_id, value in table.items():
                    if step_id not in known and not _near(str(step_id), known):
                        ignored.append(f"{HEAD_TABLE}.{h}.{step_id}")
                        continue
                    if step_id not in known or step_id in STEP_IDS and step_id not in PER_HEAD_STEPS:
                        raise BadInput(f"answer: unknown per-head step {step_id!r} in [{HEAD_TABLE}.{h}]; "
                                       f"per-head steps are {', '.join(PER_HEAD_STEPS)} (and per-head steps of the trace)"
                                       + _did_you_mean(str(step_id), known))
                    put(step_id, head, value)
            continue
        step_id, sep, h = _block_key(key).partition("@")
        if step_id.partition("#")[0] not in known:
            if not _near(step_id.partition("#")[0], known):  # date = "...", notes = "...": not meant as a step
                ignored.append(key)
                continue
            raise BadInput(f"answer: unknown step {key!r}{_did_you_mean(step_id.partition('#')[0], known)}; steps are {listed} "
                           f"(per head: weights@2 or a [{HEAD_TABLE}.2] table)")
        head = None
        if sep:
            if step_id in STEP_IDS and step_id not in PER_HEAD_STEPS:
                raise BadInput(f"answer: {step_id} is not a per-head step, so {key!r} has no meaning")
            head = _head_number(h, repr(key))
        put(step_id, head, raw)
    if not out:
        raise BadInput("the answer gives no steps; give any of " + listed)
    out.ignored = tuple(ignored)
    return out


#: How alike (difflib's ratio) an unknown key must be to a step id or a text field to be
#: taken as a misspelling of it ("scors", "weight") rather than a key of its own ("date").
NEAR_MISS = 0.7


def _names(known: frozenset) -> list[str]:
    return sorted(known | set(META_KEYS) | {HEAD_TABLE})


def _near(key: str, known: frozenset) -> bool:
    return bool(difflib.get_close_matches(key, _names(known), n=1, cutoff=NEAR_MISS))


def _did_you_mean(key: str, known: frozenset) -> str:
    close = difflib.get_close_matches(key, _names(known), n=1, cutoff=NEAR_MISS)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _block_key(key: str) -> str:
    """An online-softmax block's key, 'online_max#2@1' or 'online_max@1#2' (head 1, key block 2;
    '#1.2': query block 1, key block 2), written one way: 'online_max#2@1'. The trace resolves
    the address (`Trace.step`); other keys are unchanged."""
    if "#" not in key:
        return key
    head_part, hash_, block = key.partition("#")
    if "@" in head_part:  # online_max@1#2 -> online_max#2@1
        step_id, _, h = head_part.partition("@")
        return f"{step_id}#{block}@{h}"
    return key


def _known_ids() -> frozenset:
    """Every step id a trace may have: those of `STEP_IDS` and every step kind's."""
    from attntrace.kinds import KINDS

    return frozenset(STEP_IDS) | frozenset(KINDS)


def _head_number(text: str, where: str) -> int:
    if not _INTEGER.fullmatch(text) or int(text) < 1:
        raise BadInput(f"answer: {where}: heads are numbered 1, 2, ..., not {text!r}")
    return int(text)


# -- matrices and entries ----------------------------------------------------------------------
def _in_own_precision(raw: Any) -> Any:
    """A NumPy array, torch tensor or SymPy matrix -> nested lists. Floats other than float64
    (float32, float16, bfloat16, longdouble) become the text of the shortest decimal that
    reads back as the same value in their own type, because the tolerance follows the decimals
    written: np.float32(-1.8) is "-1.8", not the -1.7999999523162842 of widening it to a
    Python float (which a right answer then missed in its 16th decimal)."""
    if type(raw).__module__.startswith("torch") and hasattr(raw, "detach"):
        t = raw.detach().cpu()
        if not t.is_floating_point() or t.dtype == _torch().float64:
            return t.tolist()
        if t.dtype == _torch().bfloat16:  # no NumPy type: search the shortest decimal
            wide = t.float().numpy()  # exact
            return _texts(wide, [_shortest_bfloat16(float(x)) for x in wide.flat])
        raw = t.numpy()
    if isinstance(raw, np.ndarray) and raw.dtype.kind == "f" and raw.dtype != np.float64:
        return _texts(raw, [str(x) for x in raw.flat])  # NumPy prints a scalar's shortest decimal in its type
    return raw.tolist()


def _texts(array: np.ndarray, texts: list[str]) -> list:
    return np.array(texts, dtype=object).reshape(array.shape).tolist()


def _torch():
    import torch

    return torch


def _shortest_bfloat16(x: float) -> str:
    """The shortest decimal that rounds to the bfloat16 value `x` (given widened to a float)."""
    if not math.isfinite(x):
        return repr(x)
    torch = _torch()
    for digits in range(1, 18):
        text = f"{x:.{digits}g}"
        if torch.tensor(float(text), dtype=torch.bfloat16).item() == x:
            return text
    return repr(x)


def _matrix(raw: Any, label: str, step_id: str, head: int | None) -> AnswerMatrix:
    if hasattr(raw, "tolist") and not isinstance(raw, (str, bytes)):
        raw = _in_own_precision(raw)  # numpy array, torch tensor or SymPy matrix
    if not isinstance(raw, (list, tuple)):
        raise BadInput(f"answer {label}: a matrix is a list of rows, not {_describe(raw)}")
    if not raw:
        raise BadInput(f"answer {label}: the matrix is empty")
    if not any(isinstance(r, (list, tuple)) for r in raw):
        raw = [raw]  # a single row written flat
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
        if i * width > MAX_ENTRIES:
            raise BadInput(f"answer {label}: more than {MAX_ENTRIES} entries")
    flat = [x for row in raw for x in row]
    return AnswerMatrix(step_id, head, *_parse_flat(flat, label, (len(raw), width)))


def _parse_flat(flat: list, label: str, shape: tuple[int, int]) -> tuple:
    """Every entry of a matrix, row by row -> (values, kinds, decimals, texts) arrays.

    The common entries (decimals as TOML/JSON read them, or as plain strings, and small
    integers) are read in bulk: one regular expression each, their digits after the point
    from its groups; anything else goes through `parse_entry`. The numbers are exactly those
    `parse_entry` gives (float() and float(Decimal()) both round correctly)."""
    n = len(flat)
    values = [0.0] * n
    kinds = [0] * n
    decimals = [0] * n
    texts: list = [None] * n
    match = _DECIMAL_PARTS.fullmatch
    decimal = KIND_CODES["decimal"]
    for k, x in enumerate(flat):
        t = type(x)
        if (t is _Raw or t is str) and len(x) <= _FAST_TEXT:
            m = match(x)
            if m is not None:
                frac, exp = m.group(1) or m.group(2) or "", m.group(3)
                if exp is None and "." not in x:  # an integer
                    if len(x) <= 15:
                        values[k], texts[k] = float(int(x)), x
                        continue
                    e = parse_entry(x, _where(label, k, shape))
                    values[k], kinds[k], decimals[k], texts[k] = e.value, KIND_CODES[e.kind], e.decimals or 0, e.text
                    continue
                value = float(x)
                if value != value or value in (math.inf, -math.inf):
                    e = parse_entry(x, _where(label, k, shape))  # raises: too large
                else:
                    values[k], kinds[k], texts[k] = value, decimal, x
                    decimals[k] = max(0, len(frac) - (int(exp) if exp else 0))
                    continue
        elif t is int and -_EXACT_INT < x < _EXACT_INT:
            values[k], texts[k] = float(x), str(x)
            continue
        e = parse_entry(x, _where(label, k, shape))
        values[k], kinds[k], decimals[k], texts[k] = e.value, KIND_CODES[e.kind], e.decimals or 0, e.text
    return _arrays(values, kinds, decimals, texts, shape)


def _where(label: str, k: int, shape: tuple[int, int]) -> str:
    return f"answer {label}, row {k // shape[1] + 1}, column {k % shape[1] + 1}"


#: A plain decimal as written (no spaces, no underscores): its digits after the point and its exponent.
_DECIMAL_PARTS = re.compile(r"[+-]?(?:\d+(?:\.(\d*))?|\.(\d+))(?:[eE]([+-]?\d+))?")
_EXACT_INT = 2 ** 53
_FAST_TEXT = 40


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
    if type(x).__module__.startswith("torch") and getattr(x, "shape", None) == ():
        x = _in_own_precision(x)  # a 0-d tensor: its value, as text in its own precision
    if isinstance(x, np.floating) and not isinstance(x, np.float64):
        return _text(str(x), where)  # float32, float16, longdouble: the decimals of their own type
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
