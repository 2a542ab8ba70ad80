"""Refuse, before any work, a trace that would not finish in seconds or fit in memory.

The estimates follow the sizes of each step's entries from step to step; the limits are
`attntrace.inputs.limits` (ATTNTRACE_LIMITS).
"""

from __future__ import annotations

import math

from attntrace.inputs import limits
from attntrace.inputs.spec import Problem
from attntrace.kinds.registry import block_pipelines, head_pipeline
from attntrace.model.errors import BadInput
from attntrace.model.trace import Operand


def check_budget(p: Problem, keep=None) -> None:
    """Refuse, before any work, a trace that would not finish in seconds or fit in memory.

    Numeric mode: the entries of every step (scores, scaled, masked, weights and the
    softmax's details are n x m each) against limit numeric_entries; with `keep` (the step
    ids and keys a trace records), only the kept steps stay in memory and count. Exact and symbolic
    mode: `work_estimate`, which follows the size of the entries from step to step,
    against exact_cost, symbolic_cost or expanded_cost, and in exact mode the digits
    the values grow to against limit digits.
    """
    dims = [_dims(ops, p.shared) for ops in p.heads]
    _check_online_blocks(p, dims)
    if p.mode == "shape":
        return
    if p.mode == "numeric":
        total, biggest = 0, (0, "")
        backward = 2 if p.extra.get("backward") is not None else 1  # a gradient per forward matrix
        ids = None if keep is None else {k.partition("@")[0] for k in keep}
        kept = lambda *names: ids is None or not ids.isdisjoint(names)  # noqa: E731
        for h, dm in enumerate(dims, start=1):
            n, m, dk, dv = dm["n"], dm["m"], dm["dk"], dm["dv"]
            # the step ids each size counts: the scores stand for the four n x m matrices after them too
            sizes = {("Q",): n * dk, ("K",): m * dk, ("V",): m * dv, ("scores", "scaled", "masked", "weights"): 6 * n * m, ("Z",): n * dv}
            total += sum(v for covered, v in sizes.items() if kept(*covered)) * backward
            total += _online_entries(p, n, m, dv)
            biggest = max(biggest, (n * m, f"scores ({n}x{m})"), (n * dk, f"Q ({n}x{dk})"))
        n0 = dims[0]["n"]
        dz = sum(dm["dv"] for dm in dims)
        total += n0 * dz * (len(dims) > 1 and kept("concat")) + n0 * dims[0]["out"] * kept("output")
        limit = limits.get("numeric_entries")
        if biggest[0] > limit:
            raise limits.refuse(f"{biggest[1]} would have {biggest[0]:,} entries", "numeric_entries")
        if total > limit:
            raise limits.refuse(f"this numeric trace would hold about {total:,} entries in its steps", "numeric_entries")
        return
    cost, digits = work_estimate(p, dims)
    named = p.mode == "symbolic" and not p.full_expansion
    name = "exact_cost" if p.mode == "exact" else "symbolic_cost" if named else "expanded_cost"
    if cost > limits.get(name):
        how = "use --mode numeric or shape" if p.mode == "exact" else \
            "use expand = \"named\", --mode numeric or shape" if not named else "use --mode shape or numeric"
        raise limits.refuse(f"this {p.mode} trace is too large to finish in seconds (about {cost:,} units of work "
                            f"from the sizes and number of its entries, {_seconds(cost)}); {how}", name)
    if digits > limits.get("digits"):
        raise limits.refuse(f"exact values in this trace would grow to about {digits:,} digits; use --mode numeric", "digits")


#: Seconds a unit of work takes, trace and report together (measured here: 0.2-0.5 ms).
SECONDS_PER_UNIT = (0.0002, 0.0005)


def _seconds(cost: int) -> str:
    """The time a cost predicts, as a range: 'an estimated 40 s to 1.6 min'."""
    def span(sec: float) -> str:
        return f"{sec:.0f} s" if sec < 120 else f"{sec / 60:.0f} min" if sec < 7200 else f"{sec / 3600:.0f} h"
    lo, hi = (cost * k for k in SECONDS_PER_UNIT)
    return f"an estimated {span(lo)} to {span(hi)}"


def online_blocks(p: Problem, dims: list[dict]) -> int:
    """How many (query block, key block) pairs the online softmax runs over all heads: each
    records four steps (m, P, l, O), which the report lays out one by one."""
    online = p.extra.get("online")
    if online is None:
        return 0
    total = 0
    for dm in dims:
        n, m = dm["n"], dm["m"]
        total += -(-n // (online.get("block_queries") or n)) * -(-m // online["block_keys"])
    return total


def _check_online_blocks(p: Problem, dims: list[dict]) -> None:
    """Refuse, in any mode (shape mode too: 10^5 rows in 1 x 1 blocks are 10^10 steps), an
    online softmax with more blocks than limit online_blocks."""
    blocks = online_blocks(p, dims)
    if blocks > limits.get("online_blocks"):
        online = p.extra["online"]
        raise limits.refuse(f"the online softmax would run {blocks:,} blocks ({4 * blocks:,} steps) with block_keys = "
                            f"{online['block_keys']}, block_queries = {online.get('block_queries') or 'all rows'}; "
                            "give larger blocks", "online_blocks")


def _online_entries(p: Problem, n: int, m: int, dv: int) -> int:
    """Numeric entries the online softmax's steps hold for one head: P is n x m in all, and
    each key block adds a column of m and l and n x dv of O."""
    online = p.extra.get("online")
    if online is None:
        return 0
    blocks = -(-m // online["block_keys"])
    return n * m + blocks * n * (2 + dv) + 2 * n * dv


def _dims(ops, shared) -> dict:
    """Sizes of one head: n queries, m keys, d input width, dk key width, dv value width, out."""
    sh = {k: op.shape for k, op in ops.items()}
    x, xkv = shared.get("X"), shared.get("X_kv")
    if x is not None:
        n, m = x.shape[0], (xkv or x).shape[0]
    elif "Q" in sh:
        n, m = sh["Q"][0], sh.get("K", sh["Q"])[0]
    elif "scores" in sh or "weights" in sh:
        n, m = sh.get("scores", sh.get("weights"))
    else:
        n, m = sh.get("Z", (1, 1))[0], 1
    if "K_past" in sh:  # a KV cache: the new queries also read the cached keys
        m += sh["K_past"][0]
    d = x.shape[1] if x is not None else 1
    if "c_KV_past" in shared:  # a latent cache (multi-head latent attention): as many more keys
        m += shared["c_KV_past"].shape[0]
    if "W_UQ" in sh:  # multi-head latent attention: a head's query is [q^C  q^R]
        dk, dv = sh["W_UQ"][1] + sh["W_QR"][1], sh["W_UV"][1]
    else:
        dk = sh.get("W_Q", sh.get("Q", (1, 1)))[1]
        dv = sh.get("W_V", sh.get("V", sh.get("Z", (1, 0))))[1]
    wo = shared.get("W_O")
    return {"n": n, "m": m, "d": d, "dk": dk, "dv": dv, "out": wo.shape[1] if wo else 0}


def _entry_stats(op: Operand | None, named: bool) -> tuple[int, bool, float, int]:
    """(size of the largest entry, all entries rational, bits of the largest exact number, kinds).

    The size is the entry's number of tree nodes with named entries (a product is built
    unevaluated, its cost grows with both factors' text), else its number of terms (an
    evaluated product of sums has up to the product of their term counts). `kinds` counts
    the distinct irrational terms (sqrt(2), e^3, a symbol) up to a rational factor: sums of
    products of them have at most that many distinct terms whatever their length.
    """
    if op is None or op.value is None:
        return 1, True, 0.0, 0
    import sympy

    size, rational, bits = 1, True, 0.0
    dens = 1
    kinds: set = set()
    for e in op.value:
        if e.is_Rational:
            bits = max(bits, float(abs(e.p).bit_length()))
            if dens.bit_length() < 100_000:
                dens = math.lcm(dens, int(e.q))
            continue
        rational = False
        terms = sympy.Add.make_args(e)
        if len(kinds) < 1_000_000:
            kinds.update(t.as_coeff_Mul()[1] for t in terms if not t.is_Rational)
        if e.is_Atom:
            continue
        nodes = 0
        for node in sympy.preorder_traversal(e):
            nodes += 1
            if node.is_Rational:
                bits = max(bits, float(abs(node.p).bit_length() + node.q.bit_length()))
        size = max(size, nodes if named else len(terms))
    return size, rational, bits + dens.bit_length(), len(kinds)


def work_estimate(p: Problem, dims: list[dict]) -> tuple[int, int]:
    """(work, digits): predicted cost of an exact or symbolic trace, and the digits exact values reach.

    Each step's entries have a predicted size (terms): a product of sums over k columns has
    up to k * size(a) * size(b) terms unless both sides are plain rationals (which merge into
    one number); a softmax entry holds the m entries of its row; Z = A V sums m weights.
    The work is the sum over steps of entries x size. With named entries (symbolic, the
    default) every step after the first reads names, so sizes do not grow. Measured on
    this machine: about 0.2-0.5 ms per unit, rendering included.
    """
    named = p.mode == "symbolic" and not p.full_expansion
    stats = {k: _entry_stats(op, named) for k, op in p.shared.items()}
    total, top_bits = 0, 0.0
    z_out, spread = 0, False  # a head's Z entry (predicted terms); whether a softmax spreads exponentials
    for ops, dm in zip(p.heads, dims):
        st = dict(stats)
        st.update({k: _entry_stats(op, named) for k, op in ops.items()})
        n, m, d, dk, dv = dm["n"], dm["m"], dm["d"], dm["dk"], dm["dv"]

        def prod(a, b, k):  # (size, rational, bits, kinds) of a k-term sum of products
            if named:
                return (a[0] + b[0]) * k, False, 0.0, 0
            rational = a[1] and b[1]
            kinds = min((a[3] + 1) * (b[3] + 1) - 1, 10**12)
            size = 1 if rational else min(k * a[0] * b[0], kinds + 1)
            return size, rational, a[2] + b[2] + math.log2(k + 1), kinds

        one = (1, False, 0.0, 1)
        if "X" in p.shared:
            x, xkv = st["X"], st.get("X_kv", st["X"])
            if "W_UQ" in st:  # multi-head latent attention: through the latents (their norms are not rational)
                cq = prod(x, st["W_DQ"], d) if "W_DQ" in st else x
                ckv = prod(x, st["W_DKV"], d)
                c = p.shared["W_DKV"].shape[1]
                if named:  # the latents and their norms name their entries: the up-projections read one name each
                    total += (n + m) * c * (ckv[0] + 2 * d)
                    ckv, cq = (1, False, 0.0, 0), (1, False, 0.0, 0) if "W_DQ" in st else cq
                else:
                    ckv, cq = (ckv[0] * d, False, ckv[2], ckv[3]), (cq[0] * d, False, cq[2], cq[3]) if "W_DQ" in st else cq
                q, kk, v = prod(cq, st["W_UQ"], c), prod(ckv, st["W_UK"], c), prod(ckv, st["W_UV"], c)
                total += (n + m) * c * ckv[0] * 4 + n * c * m * 2 * (q[0] + kk[0])  # the latents and the absorbed scores
            else:
                q, kk, v = prod(x, st["W_Q"], d), prod(xkv, st["W_K"], d), prod(xkv, st["W_V"], d)
            total += n * dk * q[0] + m * dk * kk[0] + m * dv * v[0]
        else:
            q, kk, v = st.get("Q", one), st.get("K", one), st.get("V", one)
        if not named:
            total += _position_work(p, n, m, d, dk)
        total += sum(kind.exact_work(p, dm, named) for kind in head_pipeline(p) if kind.enabled(p))
        if "scores" in st or "Q" in st or "X" in p.shared:
            s = st["scores"] if "scores" in st else prod(one if named else q, one if named else kk, dk)
            total += n * m * s[0] * (2 if p.scale is not False else 1)
            a = (m if named else m * s[0]) + 1
            total += n * m * a
            top_bits = max(top_bits, q[2], kk[2], s[2])
        elif "weights" in st:
            a, s = st["weights"][0], st["weights"]
            top_bits = max(top_bits, s[2])
        else:
            a, s = 1, one
        zs = 0
        if "V" in st or "X" in p.shared:
            zs = 2 * m if named else m * (a + v[0])
            total += n * dv * zs
            z_out = max(z_out, zs)
            spread = spread or (m > 1 and not _zero_scores(p, ops))
            total += _online_work(p, named, n, m, dv, s[0], v[0])
            top_bits = max(top_bits, v[2] + s[2] + m)
        if p.extra.get("backward") is not None:
            x = st.get("X", one)
            w = max(st.get(k, one)[0] for k in ("W_Q", "W_K", "W_V")) if "X" in p.shared else 1
            sizes = {"q": q[0], "k": kk[0], "v": v[0], "a": a, "z": zs, "x": x[0], "w": w}
            work = _backward_work(p, named, dm, sizes, stats)
            total += work if named else work // BACKWARD_NODES_PER_UNIT
    if "W_O" in p.shared:
        wo, n0 = stats["W_O"], dims[0]["n"]
        width = sum(dm["dv"] for dm in dims)
        total += n0 * dims[0]["out"] * width * (2 if named else wo[0] * (m + 1))
        top_bits += wo[2] + math.log2(width + 1)
        z_out = width * (z_out + wo[0])
    if p.mode == "exact" and p.extra.get("block") and spread:
        total += block_work(p, dims[0]["n"], z_out)
    return int(total), int(top_bits / math.log2(10)) + 1 if p.mode == "exact" else 0


def _zero_scores(p: Problem, ops: dict) -> bool:
    """Whether a head's scores are exactly 0 (W_Q, W_K, Q or K all zero): its softmax is uniform,
    rational weights with no exponential for the block's steps to carry."""
    for key in ("W_Q", "W_K", "Q", "K"):
        op = ops.get(key) or p.shared.get(key)
        if op is not None and op.value is not None and all(e == 0 for e in op.value):
            return True
    return False


def block_work(p: Problem, n: int, z_attn: int) -> int:
    """Exact mode, the Transformer block after a softmax that is not uniform: every step nests
    its input's exponentials again (a norm's entry holds its row's d entries under a square
    root, a product d_in of them), so the entries grow by a factor at each step. Each block
    kind predicts its entries' operations (`Kind.exact_size`) from those of what it reads; the
    work is entries x operations / BLOCK_OPS_PER_UNIT. Measured on this machine (2 x 2 blocks of -3/2..3/2): Z's
    entries have 2 to 4 times the cost model's terms, and the predictions come within a factor
    2 of SymPy's count_ops. A step whose entries are predicted beyond BLOCK_OPS_MARGIN x `EXACT_OPS` is
    refused here, before any work, instead of inside the trace after seconds (llama-block-tiny:
    5 s); nearer the bound the trace's own check decides (and an input error, a constant row
    with eps = 0, is still reported as such)."""
    from attntrace.kinds.exactsize import EXACT_OPS

    _, post = block_pipelines(p)
    d = p.shared["X"].shape[1]
    x = _entry_stats(p.shared["X"], False)[0]
    pre_norm = p.extra["block"] != "post_ln"  # V is read from the first norm's output: twice Z's operations
    sizes = {"X": x, "O": z_attn * (4 if pre_norm else 2)}
    work = 0
    replaced = {r for kind in post if kind.enabled(p) for r in kind.replaces}  # skipped as the tracer skips them
    for kind in post:
        if not kind.enabled(p) or kind.id in replaced:
            continue
        size = kind.exact_size(p, sizes)
        if size is None:
            break
        if size > BLOCK_OPS_MARGIN * EXACT_OPS:
            raise BadInput(f"step {kind.id}: exact entries would grow to about {size:,} operations each, more than the {EXACT_OPS} an "
                           "exact entry may have: after a softmax, exact entries grow at every step of the block; use mode numeric or symbolic")
        sizes[kind.writes] = size
        work += n * d * size // BLOCK_OPS_PER_UNIT
    return work


#: Exact mode, the block: predicted operations of its entries per unit of work (a pre-LN 2 x 2
#: block predicting 10,600 operations in all traced and rendered in 0.9 s, a unit 0.2-0.5 ms).
BLOCK_OPS_PER_UNIT = 4
#: The predictions come within a factor 2 of count_ops: refused up front only beyond 3 x EXACT_OPS.
BLOCK_OPS_MARGIN = 3


#: Exact mode: predicted nodes of the backward pass's entries per unit of work. SymPy builds the
#: gradients' unexpanded sums at about 0.04 ms a node (measured: 27,000 nodes of a (3, 2)
#: two-head trace in 1.2 s), but the report, which evaluates each entry for its decimal, takes
#: most of the time: traced and rendered as Markdown, 4 x 4 with two heads took 91 s, 3 x 4
#: with two heads 17 s, 4 x 2 with one head 14 s, 1 to 1.7 ms a unit at 8 nodes a unit; at 4
#: a unit is 0.5 to 0.9 ms, so what the exact_cost limit lets through ends within about 5 s.
BACKWARD_NODES_PER_UNIT = 4


def _position_work(p: Problem, n: int, m: int, d: int, dk: int) -> int:
    """Exact mode, the position kinds (measured on this machine, 4 x 4 inputs of -2..2):

    - RoPE: each rotated entry is q cos(m theta) + q' sin(m theta), a different angle per
      position and pair, and every score is rewritten over the angle differences (cos(a - b)):
      about (2 d_k)^2 work per score (6 tokens, d_k = 6: 50 s before this estimate refused it);
    - sinusoidal positions: X-tilde = X + P puts a different sin or cos in every entry, and every
      later product and softmax carries them all (4 tokens, d = 4: 17 s).
    """
    work = 0
    if p.extra.get("rope") is not None:
        work += 3 * n * m * (2 * dk) ** 2 // 2
    if p.extra.get("position") == "sinusoidal":
        work += 30 * n * m * d * d
    return work


def _online_work(p: Problem, named: bool, n: int, m: int, dv: int, s: int, v: int) -> int:
    """The online softmax of one head, exact mode: for each row and key block j, the running
    max, sum and output hold the j blocks seen so far (m^(j) a max over j Bc scores, O^(j) a sum
    of j Bc terms per column), so the work grows as the square of the number of blocks."""
    online = p.extra.get("online")
    if online is None or named:
        return 0
    bc = online["block_keys"]
    blocks = -(-m // bc)
    seen = bc * blocks * (blocks + 1) // 2  # keys seen, summed over the blocks
    return 2 * n * (seen * (2 * s + dv * (s + v)) + m * s)  # 2: measured about twice a forward unit's time


def _backward_work(p: Problem, named: bool, dm: dict, z: dict, stats: dict) -> int:
    """The backward pass of one head: entries x predicted size of each gradient.

    Exact mode keeps SymPy's own arithmetic (kinds.backward): a product's entry is an
    unexpanded sum of k products, whose size is k (size(a) + size(b)), and the softmax
    backward A o (dA - r 1^T), r_i = sum_j a_ij dA_ij, holds m + 1 copies of a and dA. From
    the seed (2 Z for the sum of squares) back to dX the sizes compound: measured on random
    integer and half-integer inputs the predicted sizes are within a factor 2 of SymPy's node
    counts (SymPy merges equal terms, so small masked or d_k = 1 cases predict up to 15 times
    too many); a (4, 4) two-head trace predicts about 420,000 (its trace alone takes 13 s).
    Symbolic mode names every gradient's entries, so each costs its k terms.
    """
    n, m, d, dk, dv = dm["n"], dm["m"], dm["d"], dm["dk"], dm["dv"]
    from_x = "X" in p.shared
    if named:
        work = n * dv * 2 * n + n * m * 2 * dv + 2 * n * m * 2 * m + n * dk * 2 * m + m * dk * 2 * n
        if from_x:
            work += 3 * d * dk * 2 * n + n * d * 2 * 3 * dk
        return work
    back = p.extra["backward"]
    if "dO" in back:
        seed = _entry_stats(back["dO"], named)[0]
    else:
        seed = 1 if back["loss"] == "sum" else z["z"]
    if "W_O" in p.shared:  # dO W_O^T: a sum over the output's columns
        out = dm["out"]
        seed = out * (seed + stats["W_O"][0])
    dz, a, v, q, k = seed, z["a"], z["v"], z["q"], z["k"]
    dv_ = n * (a + dz)
    da = dv * (dz + v)
    dt = (m + 1) * (a + da)
    ds = dt + 1
    dq, dk_ = m * (ds + k), n * (ds + q)
    work = n * dv * (dz + dv_) + n * m * (da + dt + ds) + n * dk * dq + m * dk * dk_
    if from_x:
        x, w = z["x"], z["w"]
        work += d * dk * n * (2 * x + dq + dk_) + d * dv * n * (x + dv_)  # dW_Q, dW_K, dW_V
        work += n * d * 3 * dk * (max(dq, dk_) + w)  # this head's three paths into dX
    return work
