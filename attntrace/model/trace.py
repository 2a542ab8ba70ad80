"""The immutable record of one attention computation.

A `Trace` is an ordered tuple of `Step`s plus the `Operand`s it started from. The tracer
builds it; renderers, the checker and the JSON export only read it. Nothing here does
arithmetic or writes prose: a step holds its value, its shape, the ids of its inputs, its
general formula (a tree its kind built, `attntrace.model.formula`, printed in LaTeX and plain math) and, in exact and symbolic
mode, the entry-wise expansion one level deep.
"""

from __future__ import annotations

from dataclasses import field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from attntrace.model.formula import PRINTERS, Node
from attntrace.model.record import record

#: The fixed step vocabulary shared by the JSON, the renderer and the checker, in trace order.
STEP_IDS = ("Q", "K", "V", "scores", "scaled", "masked", "weights", "Z", "concat", "output")
#: Steps computed once per head (they carry head = 1..h in multi-head traces).
PER_HEAD_STEPS = STEP_IDS[:8]
MODES = ("numeric", "exact", "symbolic", "shape")
#: How a Trace is presented by the layers above this one: "json" (trace -> dict,
#: attntrace.rendering.export), "render" (trace, format -> str, attntrace.rendering.renderer)
#: and "html" (trace -> the HTML fragment, attntrace.rendering.html).
#: attntrace/__init__.py fills it in; it runs before any module of the package, so this module
#: imports nothing above it and `to_dict` and the Jupyter hooks always find them.
PRESENTERS: dict[str, Callable[..., Any]] = {}


#: The details of a step that has none (most steps): one read-only mapping serves them all.
_NO_DETAILS: Mapping[str, Any] = MappingProxyType({})


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if not mapping:
        return _NO_DETAILS
    if getattr(mapping, "immutable", False):  # e.g. softmax details that compute a matrix when read
        return mapping
    return MappingProxyType(dict(mapping))


def block_address(step: "Step") -> str | None:
    """An online-softmax step's address with its block, `online_max#2` (query block 1) or
    `online_max#2.3` (query block 2, key block 3); None for a step without blocks."""
    if "query_block" not in step.details:  # the Transformer block's steps say "block" = their arrangement
        return None
    block = step.details["block"]
    qb = step.details.get("query_block", 1)
    return f"{step.id}#{block}" if step.details.get("query_blocks", 1) == 1 else f"{step.id}#{qb}.{block}"


def _block_address(text: str, block, query_block):
    """'online_max#2' -> ('online_max', 2, None); 'online_max#1.2' -> ('online_max', 2, 1)."""
    id, _, where = text.partition("#")
    qb, dot, kb = where.partition(".")
    parts = (qb, kb) if dot else (kb or qb,)
    if not all(p.isdigit() and int(p) > 0 for p in parts) or block is not None or query_block is not None:
        raise KeyError(f"{text!r}: a block address is id#j (key block j) or id#i.j (query block i, key block j)")
    return (id, int(kb), int(qb)) if dot else (id, int(qb), None)


@record
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


@record
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
    expr: the general formula, a tree (`attntrace.model.formula`) its kind built once;
    `formula` is it printed in LaTeX, `plain` in plain math (text reports).
    """

    id: str
    head: int | None
    inputs: tuple[str, ...]
    expr: Node
    value: Any
    shape: tuple[int, int]
    symbol: str | None = None
    expansion: Any = None
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def formula(self) -> str:
        """The general formula in LaTeX (reports, the JSON export)."""
        return PRINTERS["tex"](self.expr)

    @property
    def plain(self) -> str:
        """The general formula in plain math (text reports)."""
        return PRINTERS["plain"](self.expr)

    def __post_init__(self) -> None:
        object.__setattr__(self, "details", _frozen(self.details))

    @property
    def key(self) -> str:
        """The step's address as the checker and JSON write it: 'weights' or 'weights@2'."""
        return self.id if self.head is None else f"{self.id}@{self.head}"


@record
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
        blocks: dict[tuple, Step] = {}
        last: dict[tuple[str, int | None], Step] = {}
        for s in self.steps:
            steps.setdefault((s.id, s.head), s)
            block = s.details.get("block") if "query_block" in s.details else None  # (a layer's "block" is its arrangement)
            if block is not None:  # an online-softmax block: step(id, head) gives the last, as an answer means it
                last[(s.id, s.head)] = s
                blocks[(s.id, s.head, s.details.get("query_block", 1), block)] = s
        operands: dict[tuple[str, int | None], Operand] = {}
        for o in self.operands:
            operands.setdefault((o.name, o.head), o)
        object.__setattr__(self, "_step_index", MappingProxyType(steps))
        object.__setattr__(self, "_block_index", MappingProxyType(blocks))
        object.__setattr__(self, "_last_block", MappingProxyType(last))
        object.__setattr__(self, "_operand_index", MappingProxyType(operands))

    def step(self, id: str, head: int | None = None, *, block: int | None = None, query_block: int | None = None,
             query_head: int | None = None, kv_head: int | None = None) -> Step:
        """The step with this id (and head, for per-head steps of multi-head traces).

        Heads: `head` is the step's own head, 1..h. Every step is indexed by the query head it
        serves, except, under grouped-query attention (`num_kv_heads`), the steps a group of
        query heads shares (K, V, K_rope, K_cache, V_cache; K, V and K_rope list the group in their
        `query_heads` detail): those carry their key/value head 1..h_kv. Either spelling may be named:
        `query_head=i` finds a shared step through the key/value head that query head i reads,
        and `kv_head=j` finds a per-query-head step when exactly one query head reads key/value
        head j. In a single-head trace, head=1 is the one head.

        Online softmax (`online`): online_max, online_exp, online_sum and online_out are emitted
        once per key block j (and query block i): `block=j` (and `query_block=i`, default 1)
        picks one; without `block` the last block is returned, the one whose values an answer
        file gives when it names no block (a step without blocks is its own block 1). The
        address `online_max#j` (key block j of query block 1) or `online_max#i.j` (query block
        i) says the same in one string, as answer files and the JSON's `address` write it. A KeyError lists the steps there are.
        """
        if isinstance(id, str) and "#" in id:  # an address with its block: online_max#2, online_max#1.2
            id, block, query_block = _block_address(id, block, query_block)
        if query_head is not None or kv_head is not None:
            head = self._resolve_head(id, head, query_head, kv_head)
        elif head == 1 and self.num_heads == 1 and (id, None) in self._step_index and (id, 1) not in self._step_index:
            head = None  # a single-head trace: head 1 is its only head
        try:
            if block is None and query_block is None:
                return self._last_block.get((id, head)) or self._step_index[(id, head)]
            qb = 1 if query_block is None else query_block
            found = self._block_index.get((id, head, qb, block if block is not None else self._last_of(id, head, qb)))
            if found is None and block in (None, 1) and qb == 1 and (id, head) not in self._last_block:
                found = self._step_index[(id, head)]  # a step without blocks is its own block 1
            if found is not None:
                return found
        except (KeyError, TypeError):  # TypeError: an unhashable id or head
            pass
        keys = [s.key for s in self.steps]
        have = ", ".join(keys if len(keys) <= 40 else keys[:40] + [f"... ({len(keys)} steps)"])
        where = (f" for head {head}" if head else "") + (f" block {block}" if block is not None else "") + (
            f" query block {query_block}" if query_block is not None else "")
        raise KeyError(f"no step {id!r}{where} (steps: {have})")

    def _last_of(self, id: str, head, qb: int) -> int | None:
        return max((k[3] for k in self._block_index if k[:3] == (id, head, qb)), default=None)

    def _resolve_head(self, id: str, head, query_head, kv_head):
        """`head` from `query_head=` or `kv_head=` (see `step`)."""
        groups = self.settings.get("kv_groups")  # the key/value head of each query head, under GQA
        if groups is None:  # no grouped-query attention: the two spellings are the head itself
            given = {h for h in (head, query_head, kv_head) if h is not None}
            if len(given) > 1:
                raise KeyError(f"head={head}, query_head={query_head}, kv_head={kv_head} name different heads")
            h = given.pop()
            return None if h == 1 and self.num_heads == 1 and (id, None) in self._step_index else h
        # a step of a key/value head exists for heads 1..h_kv only (K, V, K_rope, K_cache, V_cache)
        heads_of_id = {h for (i, h) in self._step_index if i == id}
        shared = lambda h: h in heads_of_id and heads_of_id <= set(groups)  # noqa: E731
        if query_head is not None:
            if not 1 <= query_head <= len(groups):
                raise KeyError(f"query_head={query_head}, but the trace has query heads 1 to {len(groups)}")
            own = groups[query_head - 1]
            h = own if shared(own) else query_head
            if kv_head is not None and own != kv_head:
                raise KeyError(f"query head {query_head} reads key/value head {own}, not {kv_head}")
            return h
        if shared(kv_head):
            return kv_head
        readers = [i for i, j in enumerate(groups, start=1) if j == kv_head]
        if len(readers) != 1:
            raise KeyError(f"{id} is computed per query head, and key/value head {kv_head} is read by query heads "
                           f"{', '.join(map(str, readers)) or 'none'}: give query_head= (or head=) instead")
        return readers[0]

    @property
    def output_step(self) -> Step:
        """The step that holds the forward result: the last step of the forward pass, never a
        gradient (the backward steps come after it). `output` for an attention layer with W_O,
        concat for heads without one, Z for one head; the block's last step for a layer."""
        if not self.steps:
            raise KeyError("the trace has no steps")
        last = self.settings.get("forward_steps", len(self.steps))
        if last == 0:  # traced with keep=, which left out the forward pass's last step
            raise KeyError("the forward result was not kept: trace with keep= naming it (e.g. output)")
        return self.steps[last - 1]

    @property
    def output(self) -> Any:
        """The forward result's value, what the traced module returns (one sequence: (n, d)
        where torch gives (1, n, d)); see `output_step`."""
        return self.output_step.value

    def has(self, id: str, head: int | None = None) -> bool:
        if isinstance(id, str) and "#" in id:
            try:
                self.step(id, head)
                return True
            except KeyError:
                return False
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
        return PRESENTERS["json"](self)

    # Jupyter: show the rendered derivation; on failure show the error, never raise.
    def _repr_markdown_(self) -> str:
        try:
            return PRESENTERS["render"](self, format="md")
        except Exception as exc:  # noqa: BLE001 - display must not raise
            return f"**attntrace could not render this trace:** `{type(exc).__name__}: {exc}`"

    def _repr_html_(self) -> str:
        """The explorable derivation (the HTML fragment: MathML, which JupyterLab and VS Code
        notebooks render natively)."""
        try:
            return PRESENTERS["html"](self)
        except Exception as exc:  # noqa: BLE001 - display must not raise
            import html

            return f"<p><b>attntrace could not render this trace:</b> <code>{html.escape(f'{type(exc).__name__}: {exc}')}</code></p>"

    def _repr_latex_(self) -> str | None:
        try:
            return PRESENTERS["render"](self, format="tex")
        except Exception:  # noqa: BLE001
            return None
