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
the paper's (m, l, P-tilde, O, L); its S^(j) is the block T_j of the scaled (masked) scores. The steps online_max, online_exp, online_sum,
online_out carry `block` (j) and `query_block` (i) in their details and JSON; the final step
keeps the id Z, so the concatenation and output projection after it are unchanged, and a
step lse holds L. The ordinary softmax still runs before (scores, scaled, masked, weights):
the report puts each block's running values next to it and ends by showing Z = A V.

Numeric, exact and shape mode. Not symbolic: a running maximum of symbols cannot be decided.
"""

from __future__ import annotations

from attntrace.inputs.options import SpecOption
from attntrace.inputs.stepoptions import parse_online
from attntrace.kinds.base import Kind, plain_math
from attntrace.kinds.weighted_sum import WeightedSum
from attntrace.model.errors import BadInput

#: The spec's `online = {block_keys = Bc, block_queries = Br}` (Problem.extra["online"]).
SPEC_OPTIONS = (SpecOption("online", lambda value, reader: parse_online(value), "a table {block_keys = Bc, block_queries = Br}"),)


class OnlineStep(Kind):
    """A quantity of the online softmax (m, P, l, O of one block, or L). Emitted by the Z step,
    never run by the pipeline itself."""

    view, prose = "online", "online"
    starts = ("X", "QKV", "scores")
    infinite_ok = True  # a row that has seen only masked keys has m = -inf

    def __init__(self, id: str, letter: str, plain: str):
        self.id = self.writes = id
        self.letter, self.plain_letter, self.entry = letter, plain, letter

    def enabled(self, problem) -> bool:
        return False

    def json_details(self, details):
        out = {k: details[k] for k in ("block", "query_block") if k in details}
        for k in ("rows", "cols"):
            if k in details:
                out[k] = list(details[k])
        return out


ONLINE_MAX = OnlineStep("online_max", "m", "m")
ONLINE_EXP = OnlineStep("online_exp", "\\tilde{P}", "P~")
ONLINE_SUM = OnlineStep("online_sum", "\\ell", "l")
ONLINE_OUT = OnlineStep("online_out", "O", "O")
LSE = OnlineStep("lse", "L", "L")
ONLINE_OUT.mistakes, LSE.mistakes = ("online_no_rescale",), ("lse_without_max",)


def _rng(a: int, b: int) -> str:
    return f"{a}" if a == b else f"{a}{{:}}{b}"


class OnlineWeightedSum(WeightedSum):
    """Z = A V, or with `online` the same Z by FlashAttention-2's loop over key blocks."""

    view, prose = "online_z", "online"
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
        t_name = t.letter
        z_parts, lse_parts = [], []
        n_qblocks, n_kblocks = -(-n // br), -(-keys // bc)
        for qb, r0 in enumerate(range(0, n, br), start=1):
            r1 = min(n, r0 + br)
            q = f"_{{{qb}}}" if n_qblocks > 1 else ""
            pq = f"_{qb}" if n_qblocks > 1 else ""
            rows = (r0 + 1, r1)
            m = l_ = o = None
            for kb, c0 in enumerate(range(0, keys, bc), start=1):
                c1 = min(keys, c0 + bc)
                cols = (c0 + 1, c1)
                tb = alg.block(t.value, r0, r1, c0, c1)
                vb = alg.block(v.value, c0, c1, 0, dv)
                u = alg.online_update(m, l_, o, tb, vb)
                info = {"block": kb, "query_block": qb, "rows": rows, "cols": cols, "blocks": n_kblocks, "query_blocks": n_qblocks}
                j, pj = f"^{{({kb})}}", f"({kb})"
                prev, pprev = f"^{{({kb - 1})}}", f"({kb - 1})"
                tsub = f"{t_name}_{{{_rng(*rows)},\\,{_rng(*cols)}}}" if n_qblocks > 1 else f"{t_name}_{{:,\\,{_rng(*cols)}}}"
                ptsub = f"{plain_math(t.letter)}[{rows[0]}..{rows[1]}, {cols[0]}..{cols[1]}]"
                vsub, pvsub = f"V_{{{_rng(*cols)},\\,:}}", f"V[{cols[0]}..{cols[1]}, :]"
                first = kb == 1
                ordinary_m = None if row_max is None else _column(alg, row_max, r0, r1)
                ordinary_l = None if row_sum is None else _column(alg, row_sum, r0, r1)
                # FlashAttention-2's updates, block 1 too: from m^(0) = -inf, l^(0) = 0, O^(0) = 0 the
                # factor e^(m^(0) - m^(1)) is 0, so each block-1 formula ends in what it reduces to
                rowmax, prowmax = f"\\operatorname{{rowmax}}({tsub})", f"rowmax({ptsub})"
                ctx.emit(ONLINE_MAX, head, [t.ref] + ([] if first else ["online_max"]),
                         f"m{q}{j} = \\max\\left(m{q}{prev}, {rowmax}\\right)" + (f" = {rowmax}" if first else ""),
                         f"m{pq}{pj} = max(m{pq}{pprev}, {prowmax})" + (f" = {prowmax}" if first else ""),
                         u["m"], (r1 - r0, 1), {**info, "ordinary": ordinary_m})
                p_tex, p_plain = f"\\tilde{{P}}{q}{j}", f"P~{pq}{pj}"
                ctx.emit(ONLINE_EXP, head, [t.ref, "online_max"], f"{p_tex} = \\exp\\left({tsub} - m{q}{j}\\right)",
                         f"{p_plain} = exp({ptsub} - m{pq}{pj})", u["P"], (r1 - r0, c1 - c0), info)
                alpha, palpha = f"e^{{m{q}{prev} - m{q}{j}}}", f"e^(m{pq}{pprev} - m{pq}{pj})"
                rowsum, prowsum = f"\\operatorname{{rowsum}}({p_tex})", f"rowsum({p_plain})"
                ctx.emit(ONLINE_SUM, head, ["online_exp"] + ([] if first else ["online_sum", "online_max"]),
                         f"\\ell{q}{j} = {alpha} \\ell{q}{prev} + {rowsum}" + (f" = {rowsum}" if first else ""),
                         f"l{pq}{pj} = {palpha} l{pq}{pprev} + {prowsum}" + (f" = {prowsum}" if first else ""),
                         u["l"], (r1 - r0, 1), {**info, "alpha": None if first else u["alpha"], "ordinary": ordinary_l})
                pv, ppv = f"{p_tex} {vsub}", f"{p_plain} {pvsub}"
                ctx.emit(ONLINE_OUT, head, ["online_exp", v.ref] + ([] if first else ["online_out", "online_max"]),
                         f"O{q}{j} = \\operatorname{{diag}}\\left({alpha}\\right) O{q}{prev} + {pv}" + (f" = {pv}" if first else ""),
                         f"O{pq}{pj} = diag({palpha}) O{pq}{pprev} + {ppv}" + (f" = {ppv}" if first else ""),
                         u["O"], (r1 - r0, dv), {**info, "alpha": None if first else u["alpha"]})
                m, l_, o = u["m"], u["l"], u["O"]
            z_q, lse_q = alg.online_finish(m, l_, o)
            z_parts.append(z_q)
            lse_parts.append(lse_q)
        shape_mode = alg.mode == "shape"
        lse = None if shape_mode else alg.vstack(lse_parts)
        z = None if shape_mode else alg.vstack(z_parts)
        last = f"^{{({n_kblocks})}}"
        ordinary_lse = None if row_max is None or row_sum is None else _lse(alg, row_max, row_sum)
        ctx.emit(LSE, head, ["online_max", "online_sum"], f"L = m{last} + \\log \\ell{last}", f"L = m({n_kblocks}) + log l({n_kblocks})",
                 lse, (n, 1), {"blocks": n_kblocks, "query_blocks": n_qblocks, "ordinary": ordinary_lse})
        ordinary = None if shape_mode else alg.matmul(a.value, v.value)
        return ctx.emit(self, head, ["online_out", "online_sum"], f"Z = \\operatorname{{diag}}\\left(\\ell{last}\\right)^{{-1}} O{last}",
                        f"Z = diag(l({n_kblocks}))^-1 O({n_kblocks})", z, (n, dv),
                        {"online": True, "blocks": n_kblocks, "query_blocks": n_qblocks, "block_keys": bc, "block_queries": br,
                         "ordinary": ordinary, "max_diff": None if shape_mode else _max_diff(z, ordinary)})

    def json_details(self, details):
        if not details.get("online"):
            return {}
        return {"online": {k: details[k] for k in ("blocks", "query_blocks", "block_keys", "block_queries")}}


def _column(alg, values, r0, r1):
    """Rows r0..r1 of a per-row softmax detail (row_max, row_sum) as a column."""
    if alg.mode == "numeric":
        import numpy as np

        return np.asarray(values[r0:r1], dtype=float).reshape(-1, 1)
    import sympy as sp

    part = list(values[r0:r1])
    return None if any(x is None for x in part) else sp.Matrix(len(part), 1, part)


def _lse(alg, row_max, row_sum):
    """The ordinary log-sum-exp of each row, m_i + log of the shifted exponentials' sum."""
    if alg.mode == "numeric":
        import numpy as np

        return (np.asarray(row_max, dtype=float) + np.log(np.asarray(row_sum, dtype=float))).reshape(-1, 1)
    import sympy as sp

    if any(x is None for x in row_max):
        return None
    return sp.Matrix(len(row_max), 1, [m + sp.log(s) for m, s in zip(row_max, row_sum)])


def _max_diff(z, ordinary) -> float:
    """max |Z_online - A V| over the entries (evaluated to 30 digits in exact mode)."""
    import numpy as np

    if isinstance(z, np.ndarray):
        return float(np.max(np.abs(z - ordinary))) if z.size else 0.0
    import sympy as sp

    return max((abs(float(sp.N(z[i, j] - ordinary[i, j], 30))) for i in range(z.rows) for j in range(z.cols)), default=0.0)


ONLINE_Z = OnlineWeightedSum()
ONLINE_KINDS: tuple[Kind, ...] = (ONLINE_MAX, ONLINE_EXP, ONLINE_SUM, ONLINE_OUT, LSE)
