"""Trace -> view model: plain dicts of ready strings that the templates lay out.

No prose here (it lives in templates/prose/) and no arithmetic in the templates: every number
a template shows is formatted here, by `attntrace.rendering.printing`, and only for entries that are
shown. User text (title, description, tokens) is escaped for the output format here, so a
template never sees raw user text.
"""

from __future__ import annotations

import copy

from typing import Any

from attntrace.rendering.layout import SIDE_BY_SIDE, fit_chain
from attntrace.inputs.textescape import escape_md, escape_tex, escape_text
from attntrace.inputs.usertext import format_user_text, heading_text, inline_math_for
from attntrace.inputs.spec import KV_KEYS
from attntrace.kinds import KINDS, kind_of
from attntrace.kinds.notation import HEAD_INDEX, KV_HEAD_INDEX, notation_of
from attntrace.model import formula as F
from attntrace.rendering.printing import PlainOut, TexOut
from attntrace.rendering.stepview import StepView
from attntrace.kinds.registry import BLOCK_IDS, MEANING_PROSE, head_kinds_with
from attntrace.rendering.viewparts import block, operand_ref, pack, report_params, resolve, shape_dims

# ----------------------------------------------------------------------------- escaping

ESCAPERS = {"md": escape_md, "tex": escape_tex, "text": escape_text}


# ----------------------------------------------------------------------------- report

def out_for(fmt: str, precision: int, max_size: int, limit: float = 34.0):
    return PlainOut(precision, max_size, limit) if fmt == "text" else TexOut(precision, max_size, limit)


def step_view(trace, step, fmt: str, precision: int, max_size: int, limit: float = 34.0, rows=None) -> dict[str, Any]:
    return StepView(trace, step, out_for(fmt, precision, max_size, limit), rows, ESCAPERS[fmt]).build()


def operand_chain(trace, op, out) -> tuple[str, list[str]]:
    """`X = [...]` (and `\\approx [...]` in exact mode) for one operand, fitted to the page."""
    ref = operand_ref(op)
    name = out.math(ref.matrix.head(op.head))
    lhs = out.named(name, op.shape)
    if op.value is None:
        return name, [lhs]
    budget = out.limit - out.measure(lhs) - 1.4
    sides: list = [out.matrix(op.value, op.shape, budget)]
    if trace.mode == "exact":
        approx = out.approx_matrix(op.value, op.shape)
        if approx:
            sides.append((out.rel("approx"), approx))
    if out.plain:
        return name, [out.eq(lhs, *[x[1] if isinstance(x, tuple) else x for x in sides])]
    return name, fit_chain(lhs, sides, out.limit)


def shape_rows(trace, out) -> list[dict[str, Any]]:
    """Shape mode: one row per step kind; heads whose shapes are alike collapse to one row."""
    rows: list[dict[str, Any]] = []
    seen: dict[tuple, dict[str, Any]] = {}
    for step in trace.steps:
        key = (step.id, step.shape, tuple(resolve(trace, n, step.head).shape for n in step.inputs) if not kind_of(step.id).joins_heads else ())
        if step.head is not None and key in seen:
            seen[key]["last"] = step.head
            continue
        generic = step.head is not None and trace.num_heads > 1
        formula = _inline_fractions(_fewer_heads(F.first_part(step.expr)))  # the matrix form only (softmax)
        formula = out.math(_generic(formula, trace, step) if generic else formula)
        # a formula of head 1 written for every head (eta; a key/value head's g, in GQA), in a
        # table's narrow column: (100{\times}3) sets the sign without its spaces
        shown = copy.copy(out)
        shown.rewrite = lambda tree, step=step, generic=generic: _narrow(_generic(tree, trace, step) if generic else tree, not out.plain)
        line = shape_dims(trace, step, shown, short=True)
        row = {"kind": step.id, "prose": kind_of(step.id).prose, "formula": formula, "shape_line": line, "head": step.head or 0, "last": step.head or 0,
               "generic": generic}
        rows.append(row)
        if step.head is not None:
            seen[key] = row
    return rows


def _generic(tree: F.Node, trace, step) -> F.Node:
    """Head 1's formula written for every head: head (1) becomes the head index (eta, kinds.notation);
    in grouped-query attention a key/value head's own steps get the key/value head index g, and
    the keys and values a query head reads K^(g)T, V^(g)."""
    first = [n for n in F.nodes(tree) if isinstance(n, F.Head) and n.head == 1]
    if not first:
        return tree
    index = {n: n.replace(head=HEAD_INDEX) for n in first}
    if trace.settings.get("kv_groups"):
        if "query_heads" in step.details:
            index = {n: n.replace(head=KV_HEAD_INDEX) for n in first}
        else:
            k, v = F.sym("K"), F.sym("V")
            index.update({k.head(1).T(): k.head(KV_HEAD_INDEX).T(), v.head(1): v.head(KV_HEAD_INDEX)})
    return F.substitute(tree, index)


def _narrow(tree: F.Node, narrow: bool) -> F.Node:
    """Shapes and copies of a shape with the times sign set tight, for a narrow table column."""
    if not narrow:
        return tree
    tree = F.substitute(tree, {n: n.replace(narrow=True) for n in F.nodes(tree) if isinstance(n, F.Shape)})
    return F.substitute(tree, {n: n.replace(op="ntimes") for n in F.nodes(tree) if isinstance(n, F.Op) and n.op == "times"})


def _inline_fractions(tree: F.Node) -> F.Node:
    """S / sqrt(d_k) on the line in a table row: a stacked fraction there is set in script size."""
    return F.substitute(tree, {n: n.replace(inline=True) for n in F.nodes(tree) if isinstance(n, F.Frac)})


def _fewer_heads(tree: F.Node) -> F.Node:
    """Concat(Z^(1), Z^(2), ..., Z^(h)) as Concat(Z^(1), ..., Z^(h)) in a table's narrow column."""
    long = [n for n in F.nodes(tree) if isinstance(n, F.Seq) and len(n.items) == 4 and isinstance(n.items[0], F.Head)
            and n.items[1] == F.Head(n.items[0].of, 2) and isinstance(n.items[2], F.Dots)]
    return F.substitute(tree, {n: n.replace(items=n.items[:1] + n.items[2:]) for n in long})


def report_view(trace, fmt: str, precision: int, max_size: int, figures: list[dict] | None = None, lang: str = "en",
                limit: float = 34.0, rows=None, math_delimiters: str = "dollars") -> dict[str, Any]:
    out = out_for(fmt, precision, max_size, limit)
    esc = ESCAPERS[fmt]
    settings = trace.settings
    multi = trace.num_heads > 1 or any(s.head for s in trace.steps)
    shape_mode = trace.mode == "shape"
    sections, combined, shared = [], [], []
    if not shape_mode:
        by_head: dict[int, list] = {}  # one pass over the steps: rendering stays linear in the heads
        for s in trace.steps:
            if s.head is not None and not _backward(s):
                # a key/value head shared by query heads (GQA) is shown with the first of them
                by_head.setdefault(s.details.get("query_heads", (s.head,))[0], []).append(s)
        for h in trace.heads():
            steps = [StepView(trace, s, out, rows, esc).build() for s in by_head.get(h, ())]
            if steps:
                sections.append({"head": h, "steps": steps})
        first_head = next((k for k, s in enumerate(trace.steps) if s.head is not None), len(trace.steps))
        layer = [(k, s) for k, s in enumerate(trace.steps) if s.head is None and s.id not in BLOCK_IDS and not _backward(s)]
        # steps made once for every head before any head's own (multi-head latent attention's latents) come first
        # (a trace that starts from the heads' outputs has no head steps: its steps are the combination)
        before_heads = multi and first_head < len(trace.steps)
        shared = [StepView(trace, s, out, rows, esc).build() for k, s in layer if k < first_head] if before_heads else []
        combined = [StepView(trace, s, out, rows, esc).build() for k, s in layer if k >= first_head or not before_heads]
        if not multi:
            sections, combined = [{"head": 0, "steps": combined}], []
    block_pre, block_post, flow = [], [], []
    told = report_params(trace)
    arrangement = told.get("block", "")
    if any(s.id in BLOCK_IDS for s in trace.steps):  # the block's view module, only for a block
        from attntrace.rendering.blockview import block_flow, split_block

        block_pre, block_post = split_block(trace) if not shape_mode else ([], [])
        flow = block_flow(trace, out) if arrangement else []
    given_order = in_order_of_use(trace)
    operands = [operand_chain(trace, op, out) for op in given_order]
    view = {
        "formula_block": block(flow) if flow else block([out.math(intro_formula(trace))]),
        # the Transformer block (attntrace.rendering.blockview): its arrangement, steps before and after attention
        "block": arrangement,
        "block_part": "self_attention" if arrangement and not told.get("ffn_sublayer") else "",
        "block_pre": [StepView(trace, s, out, rows, esc).build() for s in block_pre],
        "shared_steps": shared,
        "block_post": [StepView(trace, s, out, rows, esc).build() for s in block_post],
        "position": told.get("position", ""), "norm_kind": told.get("norm_kind", ""),
        # user text: $...$ spans through the whitelist parser, everything else escaped
        "title": format_user_text(trace.localized("title", lang) or "", fmt, inline_math=inline_math_for(fmt, math_delimiters), escape=esc),
        # the same title as plain text for the heading: math in a heading ends up raw in navigation,
        # tables of contents and <title> (MkDocs, Sphinx, nbconvert), so headings carry no math
        "title_plain": (heading_text(trace.localized("title", lang) or "", fmt) if fmt in ("md", "tex")
                        else esc(format_user_text(trace.localized("title", lang) or "", "text"))),
        "description": format_user_text(trace.localized("description", lang) or "", fmt,
                                        inline_math=inline_math_for(fmt, math_delimiters), escape=esc),
        "tokens": [esc(t) for t in settings.get("tokens") or ()],
        "kv_tokens": [esc(t) for t in settings.get("kv_tokens") or ()],
        "mode": trace.mode, "num_heads": trace.num_heads, "multi": multi,
        "start": settings.get("start", ""), "cross": bool(settings.get("cross")),
        # what the trace's kinds tell the introduction (`Kind.report_params`)
        "masked": told.get("masked", False), "mask_kind": settings.get("mask") or "",
        "scaled": told.get("scaled", False), "by_sqrt": told.get("by_sqrt", False),
        "has_weights": told.get("has_weights", False), "has_projections": told.get("has_projections", False),
        "rope_layout": told.get("rope_layout", ""), "alibi": told.get("alibi", False),
        "has_concat": told.get("has_concat", False), "has_output": told.get("has_output", False),
        "d_k": told.get("d_k", ""), "precision": precision, "max_size": max_size,
        "elided": not shape_mode and any(max(o.shape) > max_size for o in trace.operands) or any(max(s.shape) > max_size for s in trace.steps),
        "operands": [{"name": n, "lines": lines} for n, lines in operands],
        # a reordered Given (a block's, latent attention's): a row vector (a gain) may fill an earlier line
        "given": [block(b) for b in pack([lines for _, lines in operands], out,
                                         first_fit=[given_order != list(trace.operands) and op.shape[0] == 1 for op in given_order])]
                  if not shape_mode else [],
        "given_shapes": given_shapes(trace, out) if shape_mode else [],
        "shape_rows": shape_rows(trace, out) if shape_mode else [],
        "sections": sections, "combined": combined, "figures": figures or [],
        "kv_groups": kv_groups(trace),
        # the letters a formula written for every head numbers them by (attntrace.kinds.notation)
        "head_index": {"tex": HEAD_INDEX.text("tex"), "plain": HEAD_INDEX.text("plain"), **_numbers(trace.num_heads)},
        "kv_index": {"tex": KV_HEAD_INDEX.text("tex"), "plain": KV_HEAD_INDEX.text("plain"), **_numbers(len(kv_groups(trace)))},
        # traced with keep=: the ids of the steps computed but not recorded
        "not_kept": [esc(i) for i in dict.fromkeys(k.partition("@")[0] for k in settings.get("not_kept", ()))],
        "kv_group_size": trace.num_heads // max(len(kv_groups(trace)), 1),
        # the backward pass (attntrace.kinds.backward), in trace order after the forward steps
        "backward": [] if shape_mode else [StepView(trace, s, out, rows, esc).build() for s in trace.steps if _backward(s)],
        "notation": notation_rows(trace, given_order),
    }
    mark_repeats(view)
    group_repeats(view, out, bool(settings.get("kv_groups")))
    return view


#: the given matrices a head reads its queries, keys and values with (`in_order_of_use`)
_PROJECTIONS = {f"{w}_{m}" for w in "Wb" for m in "QKV"}


def in_order_of_use(trace) -> list:
    """The given matrices of a block, or of latent attention, in the order the computation first
    reads them (ties: the trace's order). A block's norm gains then stand beside their
    sublayer's weights (pre-norm: gamma with X, gamma^f with W_gate), not all after W_O, where
    they left W_gate alone on a line; latent attention's shared down-projections come before
    the heads' matrices. A matrix given per head stands with its other heads' (W_Q^(2) beside
    W_Q^(1), where it stood after W_V^(1) and beside W_O); given scores or weights come before the
    values they weigh (softmax(S) V, A V: the trace lists V first). Other traces keep the spec's
    order (X beside X_kv)."""
    first_head = next((k for k, s in enumerate(trace.steps) if s.head is not None), 0)
    from_scores = trace.settings.get("start") in ("scores", "weights")
    if not any(s.id in BLOCK_IDS for s in trace.steps) and first_head == 0 and not from_scores:
        return list(trace.operands)
    per_head = {op.name for op in trace.operands if op.head is not None}
    first: dict[tuple, tuple[int, int]] = {}
    for k, step in enumerate(trace.steps):
        for pos, ref in enumerate(step.inputs):
            name, _, head = ref.partition("@")
            # A before V in Z = A V; elsewhere a step's inputs tie (the trace's order)
            first.setdefault((name, int(head) if head else (step.head if name in per_head else None)), (k, pos if from_scores else 0))
    use = [first.get((op.name, op.head), (len(trace.steps), 0)) for op in trace.operands]
    # the projections' weights and biases of every head (the spec's W_Q split into column blocks): one name's heads
    # stand together (latent attention's per-head up-projections stay by head: each head's four are read together)
    together = {op.name for op in trace.operands if op.head is not None and op.name in _PROJECTIONS}
    name_first: dict[str, tuple[int, int]] = {}
    for op, k in zip(trace.operands, use):
        if op.name in together:
            name_first[op.name] = min(name_first.get(op.name, k), k)
    order = sorted(range(len(use)), key=lambda k: (name_first.get(trace.operands[k].name, use[k]), use[k]))
    return [trace.operands[k] for k in order]


def _numbers(n: int) -> dict[str, str]:
    """The values an index takes, 1 to n: "1, 2" (not "1, ..., 2"), "1, ..., 4"."""
    values = F.Seq(tuple(F.Num(k) for k in range(1, n + 1)) if n <= 3 else (F.Num(1), F.Dots(), F.Num(n)))
    return {"range_tex": values.text("tex"), "range_plain": values.text("plain")}


def notation_rows(trace, given_order: list) -> list[dict[str, str]]:
    """The notation section's rows (attntrace.kinds.notation): the symbol, with its entries when
    their letter is not the symbol's (dZ: g^{Z}_{ij}, X_kv: y_{ij}; not W_Q: w^{Q}_{ij}); the
    meaning key; the shape. The gradients share one row, the first with dots ("gradient": d
    before a matrix, g^{M} its entries), so that a backward report's table stays short (the
    JSON keeps a row for each). The operands come in `given_order`, as the Given section lists them."""
    rows: list[dict[str, str]] = []
    gradients = None
    for sym in notation_of(trace, given_order).rows:
        shown = sym.symbol
        if sym.entry is not None and _initial(sym.entry) != _initial(sym.symbol):
            shown = F.Seq((shown, sym.entry), sep="wide")
        if sym.meaning in KINDS and getattr(kind_of(sym.meaning), "backward", False):
            if gradients is None:
                more = F.Seq((shown, F.Dots()))
                gradients = {"tex": more.text("tex"), "plain": more.text("plain"), "meaning": "gradient", "prose": None, "sized": False,
                             "shape": "as_matrix", "plain_shape": "as_matrix"}
                rows.append(gradients)
            continue
        shape = sym.shape
        sized = isinstance(shape, tuple)
        size = F.Op("ntimes", F.Num(shape[0]), F.Num(shape[1])) if sized else None
        rows.append({"tex": shown.text("tex"), "plain": shown.text("plain"),
                     "meaning": sym.meaning, "prose": MEANING_PROSE.get(sym.meaning), "sized": sized,
                     "shape": size.text("tex") if sized else (shape or ""),
                     "plain_shape": size.text("plain") if sized else (shape or "")})
    return rows


def _initial(tree: F.Node) -> str:
    """The letter a name starts with, in lower case, a gradient's d aside: dZ -> z, W_Q -> w, g^{Z}_{ij} -> g."""
    while not isinstance(tree, F.Sym):
        tree = tree.of  # the matrix of a differential, a head, an entry
    return tree.name[0].lower()


def _backward(step) -> bool:
    """A step of the backward pass: reports give these a section of their own."""
    return getattr(kind_of(step.id), "backward", False)


def kv_groups(trace) -> list[dict[str, int]]:
    """Grouped-query attention: which query heads (first..last) read key/value head kv."""
    groups: list[dict[str, int]] = []
    for i, j in enumerate(trace.settings.get("kv_groups") or (), start=1):
        if groups and groups[-1]["kv"] == j:
            groups[-1]["last"] = i
        else:
            groups.append({"kv": j, "first": i, "last": i})
    return groups


def intro_formula(trace) -> F.Node:
    """The one formula the report's introduction names: what this trace computes, no more.
    The score term starts as Q K^T and each per-head kind the trace has changes it, in
    pipeline order (`Kind.intro`: RoPE's rotated Q, K, the scaling, a bias, ...)."""
    start = trace.settings.get("start")
    if start == "weights":
        return F.sym("Z").eq(F.sym("A") * F.sym("V"))
    if start == "Z":
        z = F.sym("Z")
        cat = F.Func("Concat", (F.Seq((z.head(1), F.Dots(), z.head(F.sym("h")))),))
        return F.sym("O").eq(cat * F.Space() * F.sym("W", "O")) if report_params(trace).get("has_output") else z.eq(cat)
    by_id: dict[str, list] = {}
    for s in trace.steps:
        by_id.setdefault(s.id, []).append(s)
    # given scores start the term at S; without a weighted sum the trace ends at the weights
    term: F.Node = F.sym("S") if start == "scores" else F.sym("Q") * F.sym("K").T()
    for kind in head_kinds_with(by_id):
        term = kind.intro(term, by_id[kind.id])
    weights = F.Func("softmax", (term,))
    if start == "scores" and "Z" not in by_id:
        return F.sym("A").eq(weights)
    return weights * F.Space() * F.sym("V")


def given_shapes(trace, out) -> list[dict[str, Any]]:
    """Shape mode: the operands' shapes, per-head operands of equal shapes collapsed."""
    rows: list[dict[str, Any]] = []
    seen: dict[tuple, dict[str, Any]] = {}
    for op in trace.operands:
        ref = operand_ref(op)
        key = (op.name, op.shape)
        if op.head is not None and key in seen:
            seen[key]["last"] = op.head
            continue
        generic = op.head is not None and trace.num_heads > 1
        kv = trace.settings.get("kv_groups") and op.name in KV_KEYS  # a key/value head's matrix (GQA)
        name = out.math(ref.matrix.head((KV_HEAD_INDEX if kv else HEAD_INDEX) if generic else op.head))
        row = {"name": name, "shape": out.shape(op.shape), "generic": generic, "head": op.head or 0, "last": op.head or 0}
        rows.append(row)
        if op.head is not None:
            seen[key] = row
    return rows


def mark_repeats(view: dict[str, Any]) -> None:
    """Mark each step view whose explanation the report has already given (the
    projection paragraph appeared 6 to 8 times in one report). The first view of a prose kind
    keeps its explanation; a later one gets ``again = {"head", "kind"}`` naming the first, and the
    prose says it briefly and refers back. Views are visited in the order the report prints them."""
    order = list(view["block_pre"]) + list(view.get("shared_steps", []))
    for sec in view["sections"]:
        order += sec["steps"]
    order += view["combined"] + view["block_post"] + view["backward"]
    first: dict[str, dict[str, Any]] = {}
    by_kind: dict[str, dict[str, Any]] = {}
    first_view: dict[str, dict[str, Any]] = {}
    intros_seen: set = set()
    lefts_seen: set = set()
    grad_lines_seen = False
    norm_shapes_said = norm_entry_shown = False
    shape_lines_said: set = set()
    factors_shown = False
    many = view.get("block") or view.get("shared_steps")  # a block's or latent attention's report
    for vm in order:
        if not isinstance(vm, dict) or "prose" not in vm:
            continue
        if many and vm.get("main_short"):
            # attention is one part of many: the first product is shown with its factors, later ones
            # as formula = result (their factors are displayed above them)
            if factors_shown:
                vm["main"] = vm["main_short"]
            factors_shown = True
        if many and vm.get("shape_line") and not vm.get("shape_same"):
            # attention is one part of many: a product's shapes, (3 x 2)(2 x 2) -> (3 x 2), are said once
            if vm["shape_line"] in shape_lines_said:
                vm["shapes_said"] = True
            shape_lines_said.add(vm["shape_line"])
        left = vm.get("extra", {}).get("left")
        if left is not None and left in lefts_seen and vm.get("main_short"):
            vm["main"] = vm["main_short"]  # the up projection after the gate: N^f's product with its factors was shown
            if view.get("block"):
                vm["entries"] = []  # and its entry: the same row of N^f times another column
        elif left is not None:
            lefts_seen.add(left)
        # kinds that share a prose module share one explanation when they say so (Kind.explained_by_prose: Q, K
        # and V, the two norms); others (the backward steps, the online softmax) differ by kind or by view
        kind = KINDS.get(vm["kind"])
        if kind is not None and kind.explained_by_prose:
            key = vm["prose"]
        elif kind is not None and kind.explained_by_view:  # kinds of one prose that say the same per view
            key = f'{vm["prose"]}/{vm.get("view")}'
        else:
            key = f'{vm["prose"]}/{vm["kind"]}'
        seen = first.get(key)
        earlier = by_kind.setdefault(vm["kind"], {"head": vm.get("head", 0), "kind": vm["kind"]})
        if earlier["head"] and vm.get("head") != earlier["head"]:
            seen = earlier  # K of head 2 repeats K of head 1 (not Q of head 2)
        if seen is None:
            first[key] = {"head": vm.get("head", 0), "kind": vm["kind"]}
            first_view[key] = vm
        else:
            vm["again"] = seen
            shown = first_view.get(key, {}).get("extra", {})
            if vm["extra"].get("angle_blocks") and vm["extra"].get("angle_blocks") == shown.get("angle_blocks"):
                # the keys turn by the queries' angles (same positions): the rule, the angles and
                # the pair-by-pair rotation are above
                vm["extra"]["angle_blocks"], vm["extra"]["rule"], vm["extra"]["same_angles"] = [], [], True
                vm["entries"] = []
            if vm.get("main_short"):  # the product was shown with its factors once: now formula = result
                vm["main"] = vm["main_short"]
            if seen["kind"] == vm["kind"] and seen["head"] and vm.get("head") != seen["head"]:
                # a later head repeats the computation: its result is shown, its entries were
                # written out once, for the first head
                vm["entries"], vm["softmax_rows"] = [], []
                if vm["extra"].get("softmax_rows") or vm["extra"].get("jacobian"):
                    vm["extra"]["softmax_rows"], vm["extra"]["jacobian"] = [], None  # the backward softmax's rows
                # nor its formula and shapes, which are head 1's: the result is what is new
                vm["formula_block"], vm["head_repeat"] = None, True
            elif seen["kind"] != vm["kind"] and vm["prose"] == "residual":
                # the second residual after the first: an addition, and its shapes, shown once
                vm["entries"], vm["shapes_said"] = [], True
            elif seen["kind"] != vm["kind"]:
                # K after Q, the second norm after the first: one entry as an example
                _one_entry(vm)
        if vm.get("entries"):
            # the entry lines of a sum of products (of a norm) are explained once: later ones briefly
            family = "norm" if vm.get("view") == "norm" else (
                "product" if vm["kind"] not in OWN_LINES_INTRO and vm.get("view") != "elementwise" else None)
            vm["lines_again"] = family in intros_seen
            intros_seen.add(family)
        if vm.get("view") == "norm":
            # a norm: the row's statistics and one entry (the others differ only in their numbers);
            # its shapes, (n x d) o (1 x d) -> (n x d), are the same for every norm of a block: said once
            _one_entry(vm)
            if norm_shapes_said:
                vm["shapes_said"] = True
            norm_shapes_said = True
            if many and norm_entry_shown:
                # a block's later norms: the entry formula, row 1's statistics and an entry were shown for
                # the first, and these differ only in their numbers and gain (Gemma 2's four norms took a page)
                vm["entries"], vm["formula_block"] = [], None
            norm_entry_shown = norm_entry_shown or bool(vm.get("entries"))
        if many and _attends(vm) and ("Q" in by_kind or "C_Q" in by_kind):
            # attention is one part of many, and its products were written out for Q (latent attention: for C^Q)
            _one_entry(vm)
        if many and vm.get("view") == "elementwise" and vm.get("entries") and "scaled" in by_kind:
            # a function applied entry by entry (the soft cap) in a report of many parts: one entry shows it
            _one_entry(vm, telling=True)
        if vm.get("view") == "activation" and vm.get("entries"):
            # the activation after the products of a block (it reads the hidden layer's): one entry shows the formula at work
            _one_entry(vm, telling=True)
        if vm.get("view") == "grad" and vm.get("entries") and vm["entries"][0].get("chains"):
            # the backward pass's products: the first writes its row out, later ones one entry (as K after Q)
            if grad_lines_seen:
                _one_entry(vm)
            grad_lines_seen = True
        if vm.get("view") == "sum":
            # an addition entry by entry (X-tilde = X + P, a residual): one entry shows it
            _one_entry(vm)
        if vm.get("view") == "product" and vm["kind"] in LATER_PRODUCTS and ("projection" in first or many):
            # the feed-forward and output products after the projections were written out
            _one_entry(vm)


#: A view's parts that are shown beside its result and may differ by head (an ALiBi slope, a sink's logit,
#: the experts a token chose): such a view keeps its own paragraph in a later head.
_OWN_PARTS = ("bias", "sink", "chosen_blocks", "alpha", "ordinary", "softmax_rows", "jacobian")


def group_repeats(view: dict[str, Any], out, gqa: bool = False) -> None:
    """A later head's steps that only repeat head 1's (a result, no entries, no notes) in one
    paragraph, each as its name and value (its formula is head 1's with the head's number), side
    by side where they fit: multi-head latent attention's head 2 took 17 paragraphs of "Computed
    as in head 1." and a formula with a matrix, 2.5 pages. A key/value head's steps (GQA: K^(2)
    with head 3, the first query head that reads it) join the paragraph with their formula, which
    names the head's weights; a view with parts of its own keeps its paragraph."""
    for sec in view["sections"]:
        steps, grouped, run = sec["steps"], [], []

        def flush() -> None:
            if len(run) > 1:
                # a stack (latent attention's Q^(2) = [Q^C(2), Q~^R(2)]) repeats two results shown here: named only
                shown = [vm for vm in run if vm.get("view") != "stack"]
                # name = value; under GQA the scores and the weighted sum keep their formula, which tells
                # which key/value head they read (S^(4) = Q~^(4) K^(2)T)
                lines = [b["lines"] if out.plain or (gqa and (_attends(vm) or vm["kind"] in _KV_KINDS)) else [_name_and_value(b["lines"][0])]
                         for vm in shown for b in vm["main"]]
                continued = any(g.get("view") == "head_repeats" for g in grouped)  # after a paragraph of its own (ALiBi's bias)
                grouped.append({"kind": "head_repeats", "view": "head_repeats", "head": sec["head"], "again": run[0]["again"],
                                "continued": continued,
                                "main": [block(b) for b in pack(lines, out)], "extra": {},
                                "stacked": [vm["name"] for vm in run if vm.get("view") == "stack"]})
            else:
                grouped.extend(run)
            run.clear()

        for vm in steps:
            plain = (vm.get("head_repeat") and (vm.get("head") == sec["head"] or gqa and vm["kind"] in _KV_KINDS)
                     and not vm.get("entries") and not vm.get("notes")
                     and not vm.get("softmax_rows") and not any(b["aligned"] for b in vm["main"])
                     and not any(vm["extra"].get(k) for k in _OWN_PARTS))
            if plain:
                run.append(vm)
            else:
                flush()
                grouped.append(vm)
        flush()
        sec["steps"] = grouped


#: Kinds computed once per key/value head under GQA and shown with the first query head that reads them.
_KV_KINDS = ("K", "V", "K_rope", "K_cache", "V_cache")


def _attends(vm) -> bool:
    """The view of one of attention's two products (`Kind.attends`: S = Q K^T, Z = A V)."""
    kind = KINDS.get(vm["kind"])
    return kind is not None and kind.attends


def _name_and_value(line: str) -> str:
    """name = formula = value -> name = value, for each equation of a display line (\\qquad apart)."""
    out = []
    for eq in line.split(SIDE_BY_SIDE):
        parts = eq.split(" = ")
        out.append(f"{parts[0]} = {parts[-1]}" if len(parts) > 2 else eq)
    return SIDE_BY_SIDE.join(out)


#: Kinds whose entry lines have an introduction of their own (not "the sum of products, ...").
OWN_LINES_INTRO = ("pos_enc", "embed", "residual1", "residual2", "ffn_act", "norm1", "norm2", "scaled", "biased", "bias")
#: Products (kinds) whose entries a report writes out once it has written out the queries': one entry as an example.
LATER_PRODUCTS = ("ffn_hidden", "ffn_up", "ffn_out", "output")


def _one_entry(vm: dict[str, Any], telling: bool = False) -> None:
    """Keep one entry of a view's entry list (after the row's statistics, for a norm). `telling`:
    the first of the row's leading columns whose result is not 0 (SwiGLU's 0 times anything is 0
    shows nothing); `entry_col` is the entry's column, for the prose."""
    if not vm.get("entries") or not vm["entries"][0].get("chains") or vm.get("entries_cut"):
        return
    b = vm["entries"][0]
    lead = b.get("lead", 0)
    starts = [sum(b["chains"][:k]) for k in range(len(b["chains"]) + 1)]
    pick_k = lead
    if telling:
        for k in range(lead, len(b["chains"])):
            lines = b["lines"][starts[k]:starts[k + 1]]
            if any("dots" in x or x.strip() in ("...", ":") for x in lines):
                break  # past the gap the column is not k + 1
            if not lines[-1].rstrip().rstrip("\\").rstrip().endswith("= 0"):
                pick_k = k
                break
    vm["entries"] = [block(b["lines"][:starts[lead]] + b["lines"][starts[pick_k]:starts[pick_k + 1]])]
    vm["entry_col"] = pick_k - lead + 1
    vm["entries_cut"] = True
