"""The online softmax of FlashAttention-2 (arXiv 2307.08691, Algorithm 1), block by block.

With `online = {block_keys = Bc, block_queries = Br}` the head's output Z is computed the way
FlashAttention does, without ever holding a whole row of weights: the queries are cut into
blocks of Br rows, the keys and values into blocks of Bc, and for each query block the key
blocks j = 1, 2, ... update a running row maximum m, a running sum l and an unnormalised
output O:

    m^(j) = max(m^(j-1), rowmax T_j)          P~^(j) = exp(T_j - m^(j))
    l^(j) = e^(m^(j-1) - m^(j)) l^(j-1) + rowsum P~^(j)
    O^(j) = diag(e^(m^(j-1) - m^(j))) O^(j-1) + P~^(j) V_j

from m^(0) = -inf, l^(0) = 0, O^(0) = 0 (block 1's factor e^(m^(0) - m^(1)) is 0: its formulas
are written in full and then as what they reduce to); at the end Z = diag(l^(Tc))^-1 O^(Tc)
and the log-sum-exp L = m^(Tc) + log l^(Tc) (what the backward pass keeps). The letters are
the paper's (m, l, P-tilde, L), and O-tilde for its O (the tilde says unnormalised, as on P-tilde,
and leaves O to the output projection's result: one notation per trace, attntrace.kinds.notation); its S^(j) is the block T_j of the scaled (masked) scores. The steps online_max, online_exp, online_sum,
online_out carry `block` (j) and `query_block` (i) in their details and JSON; the final step
keeps the id Z, so the concatenation and output projection after it are unchanged, and a
step lse holds L. The ordinary softmax still runs before (scores, scaled, masked, weights):
the report puts each block's running values next to it and ends by showing Z = A V.

Numeric, exact and shape mode. Not symbolic: a running maximum of symbols cannot be decided.
"""

from __future__ import annotations

import numpy as np

from attntrace.inputs.options import SpecOption
from attntrace.inputs.stepoptions import parse_online
from attntrace.kinds.base import Kind, Mistake
from attntrace.kinds.weighted_sum import WeightedSum
from attntrace.model.errors import BadInput
from attntrace.model.formula import Func, Num, Power, Slice, Sym, sym

#: The spec's `online = {block_keys = Bc, block_queries = Br}` (Problem.extra["online"]).
SPEC_OPTIONS = (SpecOption("online", lambda value, reader: parse_online(value), "a table {block_keys = Bc, block_queries = Br}"),)


class OnlineStep(Kind):
    """A quantity of the online softmax (m, P, l, O of one block, or L). Emitted by the Z step,
    never run by the pipeline itself."""

    view, prose = "online", "online"
    view_module = "onlineview"
    starts = ("X", "QKV", "scores")
    infinite_ok = True  # a row that has seen only masked keys has m = -inf

    def __init__(self, id: str, letter: Sym, elementwise: str | None = None):
        self.id = self.writes = id
        self.letter = self.entry = letter
        self.elementwise = elementwise

    def enabled(self, problem) -> bool:
        return False

    # -- the checker ---------------------------------------------------------------------------
    def carry(self, iv, step, args, mistake):
        """The step from the student's own earlier blocks (its inputs: the scores, V, and the
        blocks by address), over intervals; see `carry_block` and `carry_lse`."""
        return carry_lse(iv, step, args, mistake) if self.id == "lse" else carry_block(iv, step, args, mistake)

    def json_details(self, details):
        out = {k: details[k] for k in ("block", "query_block") if k in details}
        for k in ("rows", "cols"):
            if k in details:
                out[k] = list(details[k])
        return out


ONLINE_MAX = OnlineStep("online_max", sym("m"))
ONLINE_EXP = OnlineStep("online_exp", sym("P", accent="tilde"), elementwise="sub")  # T - m: the row maximum broadcast
ONLINE_SUM = OnlineStep("online_sum", sym("ell"))
ONLINE_OUT = OnlineStep("online_out", sym("O", accent="tilde"))
LSE = OnlineStep("lse", sym("L"), elementwise="add")  # m + log l
# the checker's mistakes (their sentences: the macros of that name in templates/prose/*/online.j2)
ONLINE_OUT.mistakes = (Mistake("online_no_rescale", when=lambda steps: any(s.details.get("block", 1) > 1 for s in steps)),)
LSE.mistakes = (Mistake("lse_without_max"),)
ONLINE_MAX.meaning = "row_max"  # the row maximum so far: after the last block, the softmax's m_i


def address(step_id: str, block: int, query_block: int, query_blocks: int) -> str:
    """A block step's address as `Trace.step` reads it: online_max#2, or online_max#1.2 with
    several query blocks. Block steps name what they read by address, so every block's inputs
    point at the blocks they were computed from."""
    return f"{step_id}#{block}" if query_blocks == 1 else f"{step_id}#{query_block}.{block}"


def carry_block(iv, step, args, mistake):
    """m^(j), P^(j), l^(j) or O^(j) from the student's values (every bound a valid enclosure):
    max is monotone; exp(a - b) increases with a and falls with b (`iv.exp_diff`); products
    and quotients by their end points, P V by midpoint and radius. Block j >= 2 of l and O also
    reads m^(j-1) and m^(j), the factor e^(m^(j-1) - m^(j)). online_no_rescale: the factor dropped."""
    det = step.details
    rows = det["rows"][1] - det["rows"][0] + 1

    def column(b):
        if b.shape != (rows, 1):
            raise iv.Impossible()
        return b

    def scores(b):
        if b.shape[0] < det["rows"][1] or b.shape[1] < det["cols"][1]:
            raise iv.Impossible()
        return iv.block(b, det["rows"], det["cols"])

    if step.id == "online_max":
        top = iv.row_max(scores(args[0]))
        return top if len(args) == 1 else iv.maximum(column(args[1]), top)
    if step.id == "online_exp":
        return iv.exp_diff(scores(args[0]), column(args[1]))
    p = args[0]
    if p.shape[0] != rows:
        raise iv.Impossible()
    if step.id == "online_sum":
        new = iv.rowsum(p)
    else:
        v = args[1]
        if v.shape[0] < det["cols"][1] or p.shape[1] != det["cols"][1] - det["cols"][0] + 1:
            raise iv.Impossible()
        new = iv.matmul(p, iv.block(v, det["cols"]))
    if det["block"] == 1:
        return new
    old = args[-3]
    if old.shape != new.shape:
        raise iv.Impossible()
    if mistake == "online_no_rescale":
        return iv.plus(old, new)
    return iv.plus(iv.times(iv.exp_diff(column(args[-2]), column(args[-1])), old), new)


def carry_lse(iv, step, args, mistake):
    """L = m^(Tc) + log l^(Tc) over the query blocks' last blocks (m's first, then l's);
    lse_without_max: log l alone."""
    half = len(args) // 2
    m, l_ = iv.stack(list(args[:half]), axis=0), iv.stack(list(args[half:]), axis=0)
    if m.shape != l_.shape or m.shape != tuple(step.shape) or (l_.lo <= 0).any():
        raise iv.Impossible()
    if mistake == "lse_without_max":
        return iv.log(l_)
    if not (np.isfinite(m.lo).all() and np.isfinite(m.hi).all()):
        raise iv.Impossible()  # a row that saw only masked keys has no log-sum-exp
    return iv.plus(m, iv.log(l_))


def carry_z(iv, step, args):
    """Z = diag(l^(Tc))^-1 O^(Tc) from the query blocks' last O's and l's (the checker's rule
    for an online Z; an ordinary Z is A V, the checker's own)."""
    half = len(args) // 2
    o, l_ = iv.stack(list(args[:half]), axis=0), iv.stack(list(args[half:]), axis=0)
    if o.shape != tuple(step.shape) or l_.shape != (o.shape[0], 1):
        raise iv.Impossible()
    return iv.quotient(o, l_)


def _rng(a: int, b: int) -> str:
    return f"{a}" if a == b else f"{a}{{:}}{b}"


class OnlineWeightedSum(WeightedSum):
    """Z = A V, or with `online` the same Z by FlashAttention-2's loop over key blocks."""

    def carry(self, iv, step, args, mistake):
        """An online Z from the last blocks (`carry_z`), else A V (`WeightedSum.carry`)."""
        if step.details.get("online"):
            return carry_z(iv, step, args)
        return super().carry(iv, step, args, mistake)

    view, prose = "online_z", "online"
    view_module = "onlineview"
    pipeline, after = "head", ("weights",)

    def compute(self, ctx, head, state):
        online = ctx.p.extra.get("online")
        if online is None or state.get("V") is None:
            return super().compute(ctx, head, state)
        if ctx.p.mode == "symbolic":
            raise BadInput("online softmax in symbolic mode: a running maximum of symbols cannot be decided; use numeric or exact mode")
        alg = ctx.alg
        t, a, v = state["S"], state["A"], state["V"]
        n, keys = t.shape
        dv = v.shape[1]
        bc, br = online["block_keys"], online.get("block_queries") or n
        weights = next(s for s in reversed(ctx.steps) if s.id == "weights" and s.head == head)
        row_max, row_sum = weights.details.get("row_max"), weights.details.get("row_sum")
        z_parts, lse_parts = [], []
        n_qblocks, n_kblocks = -(-n // br), -(-keys // bc)
        for qb, r0 in enumerate(range(0, n, br), start=1):
            r1 = min(n, r0 + br)
            of_block = (lambda s: s.at(qb)) if n_qblocks > 1 else (lambda s: s)  # noqa: E731
            m_, l_sym, o_sym, p_sym = (of_block(k.letter) for k in (ONLINE_MAX, ONLINE_SUM, ONLINE_OUT, ONLINE_EXP))
            rows = (r0 + 1, r1)
            m = l_ = o = None
            for kb, c0 in enumerate(range(0, keys, bc), start=1):
                c1 = min(keys, c0 + bc)
                cols = (c0 + 1, c1)
                tb = alg.block(t.value, r0, r1, c0, c1)
                vb = alg.block(v.value, c0, c1, 0, dv)
                u = alg.online_update(m, l_, o, tb, vb)
                info = {"block": kb, "query_block": qb, "rows": rows, "cols": cols, "blocks": n_kblocks, "query_blocks": n_qblocks}
                tsub = Slice(t.letter, rows if n_qblocks > 1 else None, cols)
                vsub = Slice(sym("V"), cols, None)
                first = kb == 1
                at = lambda sid, b=kb: address(sid, b, qb, n_qblocks)  # noqa: E731 - a block's address
                rescale = [] if first else [at("online_max", kb - 1), at("online_max")]  # e^(m^(j-1) - m^(j))
                ordinary_m = None if row_max is None else _column(alg, row_max, r0, r1)
                ordinary_l = None if row_sum is None else _column(alg, row_sum, r0, r1)
                # FlashAttention-2's updates, block 1 too: from m^(0) = -inf, l^(0) = 0, O^(0) = 0 the
                # factor e^(m^(0) - m^(1)) is 0, so each block-1 formula ends in what it reduces to
                rowmax = Func("rowmax", (tsub,))
                then = (lambda value: (value,)) if first else (lambda value: ())  # noqa: E731
                ctx.emit(ONLINE_MAX, head, [t.ref] + ([] if first else [at("online_max", kb - 1)]),
                         m_.head(kb).eq(Func("max", (m_.head(kb - 1), rowmax), sized=True), *then(rowmax)),
                         u["m"], (r1 - r0, 1), {**info, "ordinary": ordinary_m})
                ctx.emit(ONLINE_EXP, head, [t.ref, at("online_max")], p_sym.head(kb).eq(Func("exp", (tsub - m_.head(kb),), sized=True)),
                         u["P"], (r1 - r0, c1 - c0), info)
                alpha = Power(sym("e"), m_.head(kb - 1) - m_.head(kb))
                rowsum = Func("rowsum", (p_sym.head(kb),))
                ctx.emit(ONLINE_SUM, head, [at("online_exp")] + ([] if first else [at("online_sum", kb - 1)] + rescale),
                         l_sym.head(kb).eq(alpha * l_sym.head(kb - 1) + rowsum, *then(rowsum)),
                         u["l"], (r1 - r0, 1), {**info, "alpha": None if first else u["alpha"], "ordinary": ordinary_l})
                pv = p_sym.head(kb) * vsub
                ctx.emit(ONLINE_OUT, head, [at("online_exp"), v.ref] + ([] if first else [at("online_out", kb - 1)] + rescale),
                         o_sym.head(kb).eq(Func("diag", (alpha,), sized=True) * o_sym.head(kb - 1) + pv, *then(pv)),
                         u["O"], (r1 - r0, dv), {**info, "alpha": None if first else u["alpha"]})
                m, l_, o = u["m"], u["l"], u["O"]
            z_q, lse_q = alg.online_finish(m, l_, o)
            z_parts.append(z_q)
            lse_parts.append(lse_q)
        shape_mode = alg.mode == "shape"
        lse = None if shape_mode else alg.vstack(lse_parts)
        z = None if shape_mode else alg.vstack(z_parts)
        m_last, l_last, o_last = (k.letter.head(n_kblocks) for k in (ONLINE_MAX, ONLINE_SUM, ONLINE_OUT))
        ordinary_lse = None if row_max is None or row_sum is None else _lse(alg, row_max, row_sum)
        last_of = lambda sid: [address(sid, n_kblocks, i, n_qblocks) for i in range(1, n_qblocks + 1)]  # noqa: E731
        ctx.emit(LSE, head, last_of("online_max") + last_of("online_sum"), sym("L").eq(m_last + Func("log", (l_last,), bare=True)),
                 lse, (n, 1), {"blocks": n_kblocks, "query_blocks": n_qblocks, "ordinary": ordinary_lse})
        ordinary = None if shape_mode else alg.matmul(a.value, v.value)
        formula = sym("Z").eq(Power(Func("diag", (l_last,), sized=True), Num(-1)) * o_last)
        return ctx.emit(self, head, last_of("online_out") + last_of("online_sum"), formula, z, (n, dv),
                        {"online": True, "blocks": n_kblocks, "query_blocks": n_qblocks, "block_keys": bc, "block_queries": br,
                         "ordinary": ordinary, "max_diff": None if shape_mode else _max_diff(z, ordinary)})

    def json_details(self, details):
        if not details.get("online"):
            return {}
        return {"online": {k: details[k] for k in ("blocks", "query_blocks", "block_keys", "block_queries")}}


def _column(alg, values, r0, r1):
    """Rows r0..r1 of a per-row softmax detail (row_max, row_sum) as a column."""
    if alg.mode == "numeric":
        return np.asarray(values[r0:r1], dtype=float).reshape(-1, 1)
    import sympy as sp

    part = list(values[r0:r1])
    return None if any(x is None for x in part) else sp.Matrix(len(part), 1, part)


def _lse(alg, row_max, row_sum):
    """The ordinary log-sum-exp of each row, m_i + log of the shifted exponentials' sum."""
    if alg.mode == "numeric":
        return (np.asarray(row_max, dtype=float) + np.log(np.asarray(row_sum, dtype=float))).reshape(-1, 1)
    import sympy as sp

    if any(x is None for x in row_max):
        return None
    return sp.Matrix(len(row_max), 1, [m + sp.log(s) for m, s in zip(row_max, row_sum)])


def _max_diff(z, ordinary) -> float:
    """max |Z_online - A V| over the entries (evaluated to 30 digits in exact mode)."""
    if isinstance(z, np.ndarray):
        return float(np.max(np.abs(z - ordinary))) if z.size else 0.0
    import sympy as sp

    return max((abs(float(sp.N(z[i, j] - ordinary[i, j], 30))) for i in range(z.rows) for j in range(z.cols)), default=0.0)


ONLINE_Z = OnlineWeightedSum()
ONLINE_KINDS: tuple[Kind, ...] = (ONLINE_MAX, ONLINE_EXP, ONLINE_SUM, ONLINE_OUT, LSE)
