"""What a step kind is: everything about one kind of step, declared in one place.

A kind says which values of a head's state it reads and which it writes, whether it runs
for a problem, how it computes (through the algebra interface, so one body serves numeric,
exact, symbolic and shape mode), its general formula in LaTeX and plain math, the names
its matrix and entries go by, how reports lay it out (`view`), which prose templates
explain it (`templates/prose/{lang}/{prose}.j2`, block `Kind.templates`: `steps/{id}.j2`, else `steps/view/{view}.j2`, else `steps/default.j2`), its
extra JSON fields and the checker mistakes that change it. The tracer only composes kinds
(`attntrace.kinds.PIPELINE`); adding a kind touches no other kind.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar


class Flow:
    """A value in flight between kinds: the algebra's value, its shape, the id of the step
    or operand that made it, and the names its matrix and entries go by in formulas."""

    __slots__ = ("value", "shape", "ref", "letter", "entry")

    def __init__(self, value, shape, ref: str, letter: str, entry: str | None = None):
        self.value, self.shape, self.ref = value, tuple(shape), ref
        self.letter, self.entry = letter, entry


class Kind:
    """One step kind. Subclasses set the class attributes and implement `compute`."""

    #: The step id in traces, JSON and answer files (stable contract).
    id: ClassVar[str]
    #: Computed once per head (head = 1..h in multi-head traces), or once for the whole layer.
    per_head: ClassVar[bool] = True
    #: The head-state roles it reads, and the role it writes (Q, K, V, S, A, Z, O, ...).
    reads: ClassVar[tuple[str, ...]] = ()
    writes: ClassVar[str] = ""
    #: Problem starts (spec's first given matrices) at which this kind still runs.
    starts: ClassVar[tuple[str, ...]] = ("X",)
    #: LaTeX and plain name of its matrix; base of its entry names (q, s, \tilde{t}).
    letter: ClassVar[str] = ""
    plain_letter: ClassVar[str | None] = None
    entry: ClassVar[str] = ""
    #: Symbolic mode names this step's entries with this base (None: keeps computed entries).
    symbol: ClassVar[str | None] = None
    #: How reports lay the step out (a StepView builder): product, scaled, masked, softmax, concat.
    view: ClassVar[str] = "product"
    #: The prose templates that explain it: templates/prose/{lang}/{prose}.j2.
    prose: ClassVar[str] = ""
    #: Checker mistake codes that change this step (implemented in attntrace.grading; the
    #: catalogue's mistakes of any step, such as rounding, are not repeated here).
    mistakes: ClassVar[tuple[str, ...]] = ()
    #: Step ids of kinds that do not run when this one does (it makes their value another way:
    #: multi-head latent attention's Q, K, V replace the projections' and RoPE's).
    replaces: tuple[str, ...] = ()
    #: Its values may be infinite on purpose (masked scores are -inf): no overflow check.
    infinite_ok: ClassVar[bool] = False

    def enabled(self, problem) -> bool:
        """Whether this kind runs for the problem (start, scale, mask settings, ...)."""
        return problem.start in self.starts

    def compute(self, ctx, head: int | None, state: dict[str, Flow]) -> Flow | None:
        """Compute the step from the head's state and record it with `ctx.emit` (`ctx`: an
        `attntrace.kinds.context.Context`, not imported here since that module imports this one)."""
        raise NotImplementedError

    def json_details(self, details) -> dict[str, Any]:
        """Extra fields of the step in the JSON export (beyond id, head, shape, inputs, formula)."""
        return {}

    def overflow_how(self, inputs, details) -> str:
        """How the step's value was made, for the one-line overflow error."""
        return f"computed from {', '.join(inputs)}"

    @property
    def templates(self) -> tuple[str, str, str]:
        """The step's block, first found wins: the kind's own template, its view's, the default
        body (a kind with no special layout needs no template file)."""
        return (f"steps/{self.id}.j2", f"steps/view/{self.view}.j2", "steps/default.j2")


def sup(head: int | None) -> str:
    """The head superscript of a matrix name: Q^{(2)}."""
    return "" if head is None else f"^{{({head})}}"


def label(name: str, head: int | None) -> str:
    """A step as error messages name it: 'scores' or 'scores (head 2)'."""
    return name if head is None else f"{name} (head {head})"


def plain_math(name: str) -> str:
    """A matrix or entry name in plain text: an accent follows its letter (\\tilde{T} -> T~, \\hat{t} -> t')."""
    name = re.sub(r"_\{\\text\{(\w+)\}\}", r"_\1", name)  # K_{\text{cache}} -> K_cache (attntrace.kinds.cache)
    return re.sub(r"\\(tilde|hat)\{(\w)\}", lambda m: m.group(2) + ("~" if m.group(1) == "tilde" else "'"), name)


def plain_braces(letter: str) -> str:
    """A block matrix's name in plain text: its braces dropped (R^{f} -> R^f, W_{gate} -> W_gate)."""
    return letter.replace("{", "").replace("}", "")


def plain_sup(head: int | None) -> str:
    return "" if head is None else f"({head})"
