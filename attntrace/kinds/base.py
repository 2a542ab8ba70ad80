"""What a step kind is: everything about one kind of step, declared in one place.

A kind says which values of a head's state it reads and which it writes, whether it runs
for a problem, how it computes (through the algebra interface, so one body serves numeric,
exact, symbolic and shape mode), its general formula in LaTeX and plain math, the names
its matrix and entries go by, how reports lay it out (`view`), which prose templates
explain it (`templates/prose/{lang}/{prose}.j2`, block `Kind.templates`: `steps/{id}.j2`, else `steps/view/{view}.j2`, else `steps/default.j2`), its
extra JSON fields, the checker mistakes that change it (`Mistake`: code, when it can be
made) and how the checker recomputes it from a student's values (`carry`, over intervals).
It also says where it runs (`pipeline`, `after`, `before`) and which spec keys it reads
(`SpecOption`s in its module's `SPEC_OPTIONS`). `attntrace.kinds.registry` collects every
kind module and derives the pipelines, the spec options and the mistakes from these
declarations; adding a kind touches no other kind and no registry.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, ClassVar


class Flow:
    """A value in flight between kinds: the algebra's value, its shape, the id of the step
    or operand that made it, and the names its matrix and entries go by in formulas."""

    __slots__ = ("value", "shape", "ref", "letter", "entry")

    def __init__(self, value, shape, ref: str, letter: str, entry: str | None = None):
        self.value, self.shape, self.ref = value, tuple(shape), ref
        self.letter, self.entry = letter, entry


class Mistake(str):
    """A checker mistake a kind declares: its code (the string itself: answer files, templates,
    `code in kind.mistakes` all see the code) and what the checker needs to plant it.

    also: the other step ids it changes (the kind's own id comes first); when(steps): whether
    it can be made in a trace whose steps of this kind are `steps` (e.g. not when it would give
    the right values). Its sentence is the macro named by the code in the kind's prose
    templates (templates/prose/{lang}/{prose}.j2), and the kind's `carry` computes it."""

    also: tuple[str, ...]
    when: Any

    def __new__(cls, code: str, *, also: tuple[str, ...] = (), when=None):
        self = super().__new__(cls, code)
        self.also, self.when = tuple(also), when
        return self


class Kind:
    """One step kind. Subclasses set the class attributes and implement `compute`."""

    #: Which pipeline runs it: "head" (per head, `HEAD_PIPELINE`), "combine" (after the heads),
    #: or None (a pipeline of its own module: the block's, the backward pass's).
    pipeline: ClassVar[str | None] = None
    #: Where it runs in its pipeline: after these step ids and before those (ids of kinds that
    #: may be absent from a trace are fine: a kind is placed, then runs only when `enabled`).
    after: ClassVar[tuple[str, ...]] = ()
    before: ClassVar[tuple[str, ...]] = ()

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
    #: How its two inputs meet in the shape line when they meet entry by entry (a broadcast, not
    #: a product): ("+", "+") for a sum, ("\\odot", "*") for a product; None: the usual line.
    elementwise: ClassVar[tuple[str, str] | None] = None

    def enabled(self, problem) -> bool:
        """Whether this kind runs for the problem (start, scale, mask settings, ...)."""
        return problem.start in self.starts

    def compute(self, ctx, head: int | None, state: dict[str, Flow]) -> Flow | None:
        """Compute the step from the head's state and record it with `ctx.emit` (`ctx`: an
        `attntrace.kinds.context.Context`, not imported here since that module imports this one)."""
        raise NotImplementedError

    #: How the checker recomputes the step from the student's own earlier values, over intervals
    #: (None: no rule, the step is taken at its true value and nothing is carried through it).
    #: Called as carry(iv, step, args, mistake): `iv` is the checker's interval toolkit
    #: (`attntrace.grading.kindcarry.TOOLKIT`: monotone maps, norms, sums, products,
    #: `iv.Impossible`), `args` the Boxes of `step.inputs`, `mistake` a code of this kind's
    #: `mistakes` to compute instead of the right value, or None.
    carry = None

    def exact_work(self, problem, dims: dict, named: bool) -> int:
        """Exact and symbolic mode: the units of work this kind adds to a head's trace beyond
        the cost model's own steps (`attntrace.budget.work_estimate`; a unit is about 0.2-0.5 ms,
        rendering included). dims: the head's n, m, d, dk, dv; named: symbolic names."""
        return 0

    def message_params(self, step) -> dict[str, Any]:
        """Numbers the sentences of this kind's mistakes quote (as `d.<name>`), from its step."""
        return {}

    def intro(self, tex: str, plain: str, steps) -> tuple[str, str]:
        """The report's one-line formula softmax(...) V: this kind's change to the score term
        (tex, plain) when the trace has its `steps` (e.g. ALiBi adds + B). Default: none."""
        return tex, plain

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


#: How an accent over a letter is written in plain text, after the letter: T~, T', Tbar.
PLAIN_ACCENTS = {"tilde": "~", "hat": "'", "bar": "bar"}
_ACCENTED = re.compile(r"\\(" + "|".join(PLAIN_ACCENTS) + r")\{(\w)\}")


def plain_accents(name: str) -> str:
    """Each accented letter of a LaTeX name in plain text: \\tilde{q}_{11} -> q~_{11}."""
    return _ACCENTED.sub(lambda m: m.group(2) + PLAIN_ACCENTS[m.group(1)], name)


@lru_cache(maxsize=512)  # the same few letters, once per step of every trace
def plain_math(name: str) -> str:
    """A matrix or entry name in plain text: an accent follows its letter (\\tilde{T} -> T~, \\hat{t} -> t')."""
    name = re.sub(r"_\{\\text\{(\w+)\}\}", r"_\1", name)  # K_{\text{cache}} -> K_cache (attntrace.kinds.cache)
    return plain_accents(name)


def plain_braces(letter: str) -> str:
    """A block matrix's name in plain text: its braces dropped (R^{f} -> R^f, W_{gate} -> W_gate)."""
    return letter.replace("{", "").replace("}", "")


def plain_sup(head: int | None) -> str:
    return "" if head is None else f"({head})"
