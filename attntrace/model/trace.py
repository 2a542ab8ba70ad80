"""The immutable record of one attention computation.

A `Trace` is an ordered tuple of `Step`s plus the `Operand`s it started from. The tracer
builds it; renderers, the checker and the JSON export only read it. Nothing here does
arithmetic or writes prose: a step holds its value, its shape, the ids of its inputs, its
general formula (a LaTeX math fragment written by its kind, see `attntrace.kinds`) and, in exact and symbolic
mode, the entry-wise expansion one level deep.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

#: The fixed step vocabulary shared by the JSON, the renderer and the checker, in trace order.
STEP_IDS = ("Q", "K", "V", "scores", "scaled", "masked", "weights", "Z", "concat", "output")
#: Steps computed once per head (they carry head = 1..h in multi-head traces).
PER_HEAD_STEPS = STEP_IDS[:8]
MODES = ("numeric", "exact", "symbolic", "shape")


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if getattr(mapping, "immutable", False):  # e.g. softmax details that compute a matrix when read
        return mapping
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Operand:
    """A matrix the trace started from (X, W_Q, b_O, or a given Q, scores, Z_i, ...).

    `symbol` is the base name of its entries in symbolic mode (x, w^{Q}, v), else None.
    An operand named like a step ("Q", "scores", "Z") stands in for that step when the trace
    starts mid-way.
    """

    name: str
    head: int | None
    value: Any
    shape: tuple[int, int]
    symbol: str | None = None


@dataclass(frozen=True)
class Step:
    """One step of the computation.

    value: numpy.ndarray (read-only, float64) in numeric mode, sympy.ImmutableMatrix in exact
    and symbolic mode, None in shape mode. In symbolic mode the value is the matrix of this
    step's own entry names (s_{11}, ...) and `expansion` defines each of them in terms of the
    previous step's names; with full expansion, value == expansion in terms of the inputs.
    inputs: the ids of what this step reads, in order (step ids or operand names).
    symbol: the base name of this step's entries (q, s, a, z^{(2)}, ...), used by reports.
    details: step-specific extras, read-only. weights: row_max, exp, row_sum (numeric), and
    empty_rows never occurs (a fully masked row is refused); scaled: d_k, factor;
    masked: keep (0/1 matrix); concat: blocks = ((head, first_col, last_col), ...).
    plain: the general formula in plain math, for text reports (`formula` is LaTeX).
    """

    id: str
    head: int | None
    inputs: tuple[str, ...]
    formula: str
    value: Any
    shape: tuple[int, int]
    symbol: str | None = None
    expansion: Any = None
    details: Mapping[str, Any] = field(default_factory=dict)
    plain: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "details", _frozen(self.details))

    @property
    def key(self) -> str:
        """The step's address as the checker and JSON write it: 'weights' or 'weights@2'."""
        return self.id if self.head is None else f"{self.id}@{self.head}"


@dataclass(frozen=True)
class Trace:
    """An ordered, immutable attention trace. Build it with `attntrace.run`."""

    mode: str
    steps: tuple[Step, ...]
    operands: tuple[Operand, ...] = ()
    title: str | None = None
    num_heads: int = 1
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", _frozen(self.settings))
        # Indexes by (id, head) and (name, head), so that step/has/operand are O(1) and
        # rendering and checking stay linear in the number of heads. The first match wins,
        # as a scan in order would find it. Not dataclass fields: equality, repr and
        # dataclasses.replace ignore them (replace rebuilds them).
        steps: dict[tuple[str, int | None], Step] = {}
        for s in self.steps:
            steps.setdefault((s.id, s.head), s)
        operands: dict[tuple[str, int | None], Operand] = {}
        for o in self.operands:
            operands.setdefault((o.name, o.head), o)
        object.__setattr__(self, "_step_index", MappingProxyType(steps))
        object.__setattr__(self, "_operand_index", MappingProxyType(operands))

    def step(self, id: str, head: int | None = None) -> Step:
        """The step with this id (and head, for per-head steps of multi-head traces)."""
        try:
            return self._step_index[(id, head)]
        except (KeyError, TypeError):  # TypeError: an unhashable id or head
            pass
        keys = [s.key for s in self.steps]
        have = ", ".join(keys if len(keys) <= 40 else keys[:40] + [f"... ({len(keys)} steps)"])
        raise KeyError(f"no step {id!r}" + (f" for head {head}" if head else "") + f" (steps: {have})")

    def has(self, id: str, head: int | None = None) -> bool:
        try:
            return (id, head) in self._step_index
        except TypeError:
            return False

    def operand(self, name: str, head: int | None = None) -> Operand:
        try:
            return self._operand_index[(name, head)]
        except (KeyError, TypeError):
            raise KeyError(f"no operand {name!r}") from None

    def heads(self) -> list[int | None]:
        """Head numbers in order: [None] for a single-head trace, else [1..h]."""
        return [None] if self.num_heads == 1 and not any(s.head for s in self.steps) else list(range(1, self.num_heads + 1))

    def localized(self, field: str, lang: str) -> str | None:
        """The spec's title or description in `lang` (title_zh, ...), else the default one."""
        default = self.title if field == "title" else self.settings.get(field)
        return self.settings.get(f"{field}_{lang}") or default

    def to_dict(self) -> dict:
        from attntrace.rendering.export import trace_to_dict

        return trace_to_dict(self)

    # Jupyter: show the rendered derivation; on failure show the error, never raise.
    def _repr_markdown_(self) -> str:
        try:
            from attntrace.rendering.renderer import render

            return render(self, format="md")
        except Exception as exc:  # noqa: BLE001 - display must not raise
            return f"**attntrace could not render this trace:** `{type(exc).__name__}: {exc}`"

    def _repr_html_(self) -> str:
        """The explorable derivation (the HTML fragment: MathML, which JupyterLab and VS Code
        notebooks render natively)."""
        try:
            from attntrace.rendering.html import render_html

            return render_html(self, fragment=True)
        except Exception as exc:  # noqa: BLE001 - display must not raise
            import html

            return f"<p><b>attntrace could not render this trace:</b> <code>{html.escape(f'{type(exc).__name__}: {exc}')}</code></p>"

    def _repr_latex_(self) -> str | None:
        try:
            from attntrace.rendering.renderer import render

            return render(self, format="tex")
        except Exception:  # noqa: BLE001
            return None
