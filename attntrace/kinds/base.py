"""What a step kind is: everything about one kind of step, declared in one place.

A kind says which values of a head's state it reads and which it writes, whether it runs
for a problem, how it computes (through the algebra interface, so one body serves numeric,
exact, symbolic and shape mode), its general formula (a tree, `attntrace.model.formula`), the names
its matrix and entries go by, how reports lay it out (`view`), which prose templates
explain it (`templates/prose/{lang}/{prose}.j2`, block `Kind.templates`: `steps/{id}.j2`, else `steps/view/{view}.j2`, else `steps/default.j2`), what
a report's introduction and a block's data flow say of it (`report_params`, `flow_line`), its extra JSON fields, the checker mistakes that change it (`Mistake`: code, when it can be
made) and how the checker recomputes it from a student's values (`carry`, over intervals).
It also says where it runs (`pipeline`, `after`, `before`) and which spec keys it reads
(`SpecOption`s in its module's `SPEC_OPTIONS`). `attntrace.kinds.registry` collects every
kind module and derives the pipelines, the spec options and the mistakes from these
declarations; adding a kind touches no other kind and no registry.
"""

from __future__ import annotations

import re
from typing import Any, Callable, ClassVar

from attntrace.model.formula import Expr, Node, Sym, Word, first_part, node, sym
from attntrace.model.record import record

#: The index of a head in a formula written for every head: Q^{(eta)} = X W_Q^{(eta)}, eta = 1, ..., h;
#: a concrete head is a number, Q^{(1)}. Not i (the 2017 paper's head_i): i and j number an entry's
#: row and column (q^{(i)}_{ij} read i twice) and k is the index of a sum; h is the number of heads
#: (the 2017 paper's h = 8, the article's h), and every Latin letter free of those is some matrix's
#: entries in one report or another (u: SwiGLU's up projection, c: the soft cap, l looks like 1).
#: Eta is the Greek letter Latin H comes from: head eta of h.
HEAD_INDEX = sym("eta")
#: The index of a key/value head under grouped-query attention: K^{(g)}, g = 1, ..., h_kv. The GQA
#: paper (Ainslie et al. 2023) divides the query heads into G groups, one key/value head each:
#: g numbers the group. (GQA has no backward pass here, so g^{M} gradient entries never sit beside it.)
KV_HEAD_INDEX = sym("g")


@record
class Symbol:
    """One row of a trace's notation table: a symbol (a formula tree, printed in each notation
    when a report or the JSON shows it), the key of its meaning (words: the `words` macro of its
    prose module, else templates/prose/{lang}/notation.j2), its shape (rows, cols) or a word key
    ("scalar", ...), and its entries' name when it is a matrix (q_{ij} of Q, a tree too)."""

    symbol: Node
    meaning: str
    shape: tuple[int, int] | str | None = None
    entry: Node | None = None

    @classmethod
    def of(cls, symbol: Node, meaning: str, shape=None) -> "Symbol":
        """A row for a formula symbol."""
        return cls(symbol, meaning, shape)

    @property
    def tex(self) -> str:
        return self.symbol.text("tex")

    @property
    def plain(self) -> str:
        return self.symbol.text("plain")

    @property
    def entry_tex(self) -> str | None:
        return None if self.entry is None else self.entry.text("tex")


#: A SymPy entry base name (`Kind.symbol`, an operand's): an accented letter or a letter or Greek
#: name, a superscript group, an upright subscript: \tilde{q}^{R}, w^{Q}, \gamma^{f}, k_{\text{c}}.
_BASE = re.compile(r"^(?:\\(hat|tilde|bar|check)\{\\?(\w+)\}|\\?(\w+))(?:\^\{([^{}]+)\})?(?:_\{\\text\{(\w+)\}\})?$")


def base_sym(name: str) -> Sym:
    """The formula symbol of a SymPy entry base name (w^{Q} -> sym("w", sup="Q")); a name of
    another form stays one symbol of that name."""
    m = _BASE.match(name)
    if m is None:
        return sym(name)
    accent, accented, letter, sup, sub = m.groups()
    return sym(accented or letter, Word(sub) if sub else None, sup, accent=accent)


#: General formulas already built, by what each depends on (`formula_once`).
_FORMULAS: dict[tuple, Node] = {}
#: More keys than this (thousands of heads, or many different spellings): the table starts over.
_FORMULAS_KEPT = 4096


def formula_once(key: tuple, build: Callable[[], Node]) -> Node:
    """The formula `build()` makes, built once per process for `key`: the kind's id and
    everything the tree depends on (the head, the letters of its inputs, its options). A tree is
    a frozen value, so one serves every trace and step that asks for the same key; a BERT-base
    layer records 86 steps, and building each one's tree anew was a third of the tracer's own
    time (the softmax's alone is 19 us)."""
    tree = _FORMULAS.get(key)
    if tree is None:
        if len(_FORMULAS) >= _FORMULAS_KEPT:
            _FORMULAS.clear()
        tree = _FORMULAS[key] = build()
    return tree


class Flow:
    """A value in flight between kinds: the algebra's value, its shape, the id of the step
    or operand that made it, and the names its matrix and entries go by in formulas.

    `norm`: an upper bound on the value's Frobenius norm when the kind that made it knows one
    (a head's block of a full-width projection, attention weights), else None; a product of
    two bounded values that cannot overflow is not scanned for overflow (`Context.product`)."""

    __slots__ = ("value", "shape", "ref", "letter", "entry", "norm")

    def __init__(self, value, shape, ref: str, letter: Expr, entry: Expr | None = None):
        self.value, self.shape, self.ref = value, tuple(shape), ref
        self.letter: Node = node(letter)
        self.entry: Node | None = None if entry is None else node(entry)
        self.norm: float | None = None


class Planting(str):
    """One way a mistake is planted in a trace: its code (the string itself, so a kind's `carry`
    compares `mistake == "missing_scale"`) and what the checker needs to recompute with it.

    kind: the step id it is catalogued under; steps: the step ids it changes (empty: `kind`
    alone); swap: input references read instead ((("W_K", "W_Q"),) computes K with W_Q);
    order: a head order (1-based: the concatenation's order, or the key/value head each query
    head reads); numbers: what the kind's `carry` needs from the rest of the trace (d_model, the
    rotation of the keys)."""

    kind: str
    order: tuple[int, ...] | None
    swap: tuple[tuple[str, str], ...]
    steps: frozenset
    numbers: dict

    def __new__(cls, code: str, kind: str, order=None, swap=(), steps=frozenset(), numbers=None):
        self = super().__new__(cls, code)
        self.kind, self.order, self.swap, self.steps = kind, order, tuple(swap), frozenset(steps)
        self.numbers = dict(numbers or {})
        return self

    @property
    def code(self) -> str:
        return str(self)

    def __eq__(self, other) -> bool:
        """As its code against a string; against another planting, every field counts too."""
        if isinstance(other, Planting):
            return str.__eq__(self, other) and (self.kind, self.order, self.swap, self.steps, self.numbers) == (
                other.kind, other.order, other.swap, other.steps, other.numbers)
        return str.__eq__(self, other)

    def __ne__(self, other) -> bool:
        return not self == other

    __hash__ = str.__hash__

    def changes(self, step_id: str) -> bool:
        return step_id in self.steps if self.steps else step_id == self.kind


class Mistake(str):
    """A checker mistake a kind declares: its code (the string itself: answer files, templates,
    `code in kind.mistakes` all see the code) and what the checker needs to plant or see it.

    also: the other step ids it changes (the kind's own id comes first); when(steps): whether
    it can be made in a trace whose steps of this kind are `steps` (e.g. not when it would give
    the right values); plant(kind, trace): the `Planting`s of this mistake in a trace, when one
    planting with `also` and `when` is not enough (a weight swapped for each other projection's,
    each order of the heads); planted: False for a mistake only read off the student's numbers;
    rewire(step, refs, planting): the input references a step reads under the planting;
    read_off(step, answer, reference, bad): the mistake's numbers (a dict) when the student's
    values show it against `reference` (the interval of what they should have got, `bad` the
    entries outside it), else None; explains: a mistake read off that accounts for the wrong
    entries (no `arithmetic_slip` is read off next to it). Its sentence is the macro named by
    the code in the kind's prose templates (templates/prose/{lang}/{prose}.j2), and the kind's
    `carry` computes it."""

    also: tuple[str, ...]
    when: Any

    def __new__(cls, code: str, *, also: tuple[str, ...] = (), when=None, plant=None, planted: bool = True,
                rewire=None, read_off=None, explains: bool = False):
        self = super().__new__(cls, code)
        self.also, self.when, self.plant, self.planted = tuple(also), when, plant, planted
        self.rewire, self.read_off, self.explains = rewire, read_off, explains
        return self

    def plantings(self, kind: "Kind", trace) -> list[Planting]:
        """Where this mistake can be made in `trace` (none when its steps are absent)."""
        if not self.planted:
            return []
        if self.plant is not None:
            return self.plant(kind, trace)
        steps = (kind.id,) + self.also
        present = [s for s in trace.steps if s.id in steps]
        if not present or (self.when is not None and not self.when(present)):
            return []
        return [Planting(str(self), kind.id, steps=frozenset(steps))]


class Kind:
    """One step kind. Subclasses set the class attributes and implement `compute`."""

    #: Which pipeline runs it: "head" (per head, `HEAD_PIPELINE`), "combine" (after the heads),
    #: "block_pre" / "block_post" (the Transformer block's kinds before attention / after the
    #: output projection, `registry.block_pipelines`), or None (a pipeline of its own module:
    #: the backward pass's, the online softmax's).
    pipeline: ClassVar[str | None] = None
    #: Where it runs in its pipeline: after these step ids and before those (ids of kinds that
    #: may be absent from a trace are fine: a kind is placed, then runs only when `enabled`).
    after: ClassVar[tuple[str, ...]] = ()
    before: ClassVar[tuple[str, ...]] = ()
    #: A block kind: the arrangements (the spec's `block`) whose pipeline holds it; None: every
    #: one, and a trace without a block as well (the position encodings).
    blocks: ClassVar[tuple[str, ...] | None] = None
    #: A block kind after attention that belongs to attention's sublayer (it still runs with
    #: block_part = "self_attention"): the first residual and what normalises around it.
    attention_sublayer: ClassVar[bool] = False

    #: A trace with this kind is a report where attention is one part of many (a Transformer
    #: block's residuals, multi-head latent attention's latents): fewer entries written out.
    one_of_many: ClassVar[bool] = False

    #: A block step whose matrix a later step's line of the block's data flow holds (the report's
    #: opening equations): P in X-tilde = X + P, the feed-forward network's H, U and act(H) in its line.
    folded_in_flow: ClassVar[bool] = False

    #: The step id in traces, JSON and answer files (stable contract).
    id: ClassVar[str]
    #: Computed once per head (head = 1..h in multi-head traces), or once for the whole layer.
    per_head: ClassVar[bool] = True
    #: The head-state roles it reads, and the role it writes (Q, K, V, S, A, Z, O, ...).
    reads: ClassVar[tuple[str, ...]] = ()
    writes: ClassVar[str] = ""
    #: Problem starts (spec's first given matrices) at which this kind still runs.
    starts: ClassVar[tuple[str, ...]] = ("X",)
    #: The name of its matrix and the base of its entry names, as formula symbols (T-tilde and
    #: t-tilde; a plain string is a symbol of that name: "S", "s").
    letter: ClassVar[Expr] = ""
    entry: ClassVar[Expr] = ""
    #: Symbolic mode names this step's entries with this base (None: keeps computed entries).
    symbol: ClassVar[str | None] = None
    #: How reports lay the step out (a StepView builder): product, scaled, masked, softmax, concat.
    view: ClassVar[str] = "product"
    #: The module in attntrace.rendering that registers `view` when it is not a StepView builder
    #: (blockview, ropeview, ...): imported the first time a report shows the view. A kind that
    #: reuses another kind's view may leave it out; kinds that give one must agree.
    view_module: ClassVar[str | None] = None
    #: The prose templates that explain it: templates/prose/{lang}/{prose}.j2.
    prose: ClassVar[str] = ""
    #: Checker mistake codes that change this step (implemented in attntrace.grading; the
    #: catalogue's mistakes of any step, such as rounding, are not repeated here).
    mistakes: ClassVar[tuple[str, ...]] = ()
    #: Step ids of kinds that do not run when this one does (it makes their value another way:
    #: multi-head latent attention's Q, K, V replace the projections' and RoPE's).
    replaces: tuple[str, ...] = ()
    #: Kinds of one prose module with this set share one explanation per view (the latents'
    #: products, norms and rotations of multi-head latent attention): a later one refers back.
    explained_by_view: ClassVar[bool] = False
    #: Kinds of one prose module with this set share one explanation (Q, K and V; the two norms;
    #: Q_norm and K_norm; the two residuals): a later one refers back to the first.
    explained_by_prose: ClassVar[bool] = False
    #: Its values may be infinite on purpose (masked scores are -inf): no overflow check.
    infinite_ok: ClassVar[bool] = False
    #: The key of what its matrix means in the notation table (default: its id); two kinds that
    #: make the same quantity (the ALiBi and the given bias) share one.
    meaning: ClassVar[str | None] = None
    #: The other symbols its formula introduces, (symbol tree, meaning key, shape): shape is
    #: "scalar", "rows" (one per row of the step: n x 1), "step" (the step's shape), "pairs" (1 x half its columns) or a word key of the notation templates.
    symbols: ClassVar[tuple[tuple[Node, str, str], ...]] = ()
    #: The meaning keys its `notation` override adds beyond `letter` and `symbols` (RoPE
    #: scaling's factors and YaRN's mu), whose words its prose's `words` macro gives.
    added_meanings: ClassVar[tuple[str, ...]] = ()
    #: The name an exercise asks the student for, where the report's `letter` is also another
    #: matrix's (the concatenation's Z, which a worksheet calls Z_concat); None: `letter`.
    answer_letter: ClassVar[Expr | None] = None
    #: How its two inputs meet in the shape line when they meet entry by entry (a broadcast, not
    #: a product): "add" for a sum, "hadamard" for a product; None: the usual line.
    elementwise: ClassVar[str | None] = None
    #: Its inputs are every head's step of one id, with no head of its own (the concatenation):
    #: its shape line lists the heads' shapes.
    joins_heads: ClassVar[bool] = False
    #: One of attention's two products, Q K^T and A V: it reads the keys or the values (under
    #: grouped-query attention a key/value head's, which its formula names).
    attends: ClassVar[bool] = False
    #: A product that reads its second input transposed (S = Q K^T): its views and shape line
    #: write B^T. A step may say so in its details instead ("transposed", latent attention's parts).
    transposes_second: ClassVar[bool] = False

    def enabled(self, problem) -> bool:
        """Whether this kind runs for the problem (start, scale, mask settings, ...)."""
        return problem.start in self.starts

    def compute(self, ctx, head: int | None, state: dict[str, Flow]) -> Flow | None:
        """Compute the step from the head's state and record it with `ctx.emit` (`ctx`: an
        `attntrace.kinds.context.Context`, not imported here since that module imports this one)."""
        raise NotImplementedError

    def notation(self, step) -> list[Symbol]:
        """The symbols this step introduces (its matrix with its entries, and `symbols`)."""
        out = []
        if self.letter:
            letter = node(self.letter)
            entry = node(self.entry).at("i", "j") if self.entry and node(self.entry) != letter else None
            out.append(Symbol(letter, self.meaning or self.id, tuple(step.shape), entry))
        for symbol, meaning, shape in self.symbols:
            sized = {"rows": (step.shape[0], 1), "step": tuple(step.shape), "pairs": (1, step.shape[1] // 2)}
            out.append(Symbol.of(symbol, meaning, sized.get(shape, shape)))
        return out

    #: How the checker recomputes the step from the student's own earlier values, over intervals
    #: (None: no rule, the step is taken at its true value and nothing is carried through it).
    #: Called as carry(iv, step, args, mistake): `iv` is the checker's interval toolkit
    #: (`attntrace.grading.kindcarry.TOOLKIT`: monotone maps, norms, sums, products,
    #: `iv.Impossible`), `args` the Boxes of `step.inputs`, `mistake` the `Planting` of a code
    #: of this kind's `mistakes` to compute instead of the right value (or `transposed`, which
    #: the checker applies itself), or None.
    carry = None

    #: The checker plants `transposed` (the transpose of the right matrix) in this step; the
    #: scores do not, since their transpose is their own mistake (`transposed_scores`).
    transposable: ClassVar[bool] = True
    #: A multi-head answer may give this step full width, (n, h d_k), head 1's columns first.
    full_width_answer: ClassVar[bool] = False

    def trace_params(self, steps) -> dict[str, Any]:
        """Numbers every mistake sentence of the trace may quote (as `d.<name>`), from this kind's
        steps in it (`steps`: of the head being diagnosed first); {} when it has none to give."""
        return {}

    def report_params(self, steps) -> dict[str, Any]:
        """What a report's introduction says about this kind's `steps` in a trace, as variables of
        its templates (whether the scores are masked, the d_k they are scaled by, RoPE's layout,
        the block's arrangement); {} when it says nothing. A variable two kinds give is taken
        from the kind whose step comes first in the trace."""
        return {}

    def accepts(self, step, values, truth, right) -> str | None:
        """A remark code when the student's values (float64, the step's shape), wrong against
        `truth`, are still accepted as right (masked scores written as a huge negative number
        give the weights of -inf); None otherwise. right(): which entries fit the truth under
        the check's tolerance (computed when called). Called only for a wrong-looking answer."""
        return None

    def exact_work(self, problem, dims: dict, named: bool) -> int:
        """Exact and symbolic mode: the units of work this kind adds to a head's trace beyond
        the cost model's own steps (`attntrace.budget.work_estimate`; a unit is about 0.2-0.5 ms,
        rendering included). dims: the head's n, m, d, dk, dv; named: symbolic names."""
        return 0

    def exact_size(self, problem, sizes: dict) -> int | None:
        """Exact mode, a Transformer block kind: the predicted operations (SymPy's count_ops) of
        an entry of its step, from `sizes` (role -> predicted operations of the entries the
        earlier steps wrote; `attntrace.budget.block_work` walks the block). None: no prediction
        (the walk stops and the size bound inside the trace, kinds.exactsize, still applies)."""
        return None

    def message_params(self, step) -> dict[str, Any]:
        """Numbers the sentences of this kind's mistakes quote (as `d.<name>`), from its step."""
        return {}

    def intro(self, term: Node, steps) -> Node:
        """The report's one-line formula softmax(...) V: this kind's change to the score term
        (a formula tree, Q K^T at first) when the trace has its `steps` (e.g. ALiBi adds + B).
        Default: none."""
        return term

    def flow_line(self, trace, step) -> Node:
        """The step's line of a Transformer block's data flow (the report's opening equations):
        its formula's matrix form, unless its line holds steps `folded_in_flow`."""
        return first_part(step.expr)

    def json_details(self, details) -> dict[str, Any]:
        """Extra fields of the step in the JSON export (beyond id, head, shape, inputs, formula)."""
        return {}

    def overflow_how(self, inputs, details) -> str:
        """How the step's value was made, for the one-line overflow error."""
        return f"computed from {', '.join(inputs)}"

    @property
    def sentence_prose(self) -> tuple[str, ...]:
        """The prose templates that hold the sentences of this kind's mistakes, first found wins:
        its own, then those of the kinds it extends (the online Z keeps A V's mistakes)."""
        mro = [vars(c)["prose"] for c in type(self).__mro__ if "prose" in vars(c)]
        return tuple(p for p in dict.fromkeys([self.prose] + mro) if p)

    @property
    def templates(self) -> tuple[str, str, str]:
        """The step's block, first found wins: the kind's own template, its view's, the default
        body (a kind with no special layout needs no template file)."""
        return (f"steps/{self.id}.j2", f"steps/view/{self.view}.j2", "steps/default.j2")


def place(kind: Kind, pipeline: str, blocks: tuple[str, ...] | None = None, *, after: tuple[str, ...] = (),
          before: tuple[str, ...] = (), attention_sublayer: bool = False) -> Kind:
    """`kind` with its place declared (`pipeline`, `blocks`, `after`, `before`,
    `attention_sublayer`): for kinds made by calling a class, several per class (the block's norms)."""
    kind.pipeline, kind.blocks, kind.after, kind.before = pipeline, blocks, tuple(after), tuple(before)
    kind.attention_sublayer = attention_sublayer
    return kind


def label(name: str, head: int | None) -> str:
    """A step as error messages name it: 'scores' or 'scores (head 2)'."""
    return name if head is None else f"{name} (head {head})"
