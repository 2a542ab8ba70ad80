"""Problem -> Trace: one small function per step kind, one code path for all four modes.

The shapes are checked here, before any arithmetic, so that numeric, exact, symbolic and
shape mode fail (or succeed) identically, with a one-line message naming the step and both
shapes. The arithmetic itself lives in `algebra.py`; the formulas in `formulas.py`.
"""

from __future__ import annotations

import math

import numpy as np

from attntrace.kinds import formulas
from attntrace.inputs import limits
from attntrace.algebra.modes import algebra_for
from attntrace.model.errors import BadInput
from attntrace.inputs.spec import Problem
from attntrace.model.trace import Operand, Step, Trace

#: Entry names of each step in symbolic mode (the article's letters; t for scaled scores).
STEP_SYMBOLS = {"Q": "q", "K": "k", "V": "v", "scores": "s", "scaled": "t", "weights": "a", "Z": "z", "output": "o"}


class _Value:
    """A value in flight: what the algebra computes with, its shape, and where it came from."""

    __slots__ = ("value", "shape", "ref")

    def __init__(self, value, shape, ref):
        self.value, self.shape, self.ref = value, tuple(shape), ref


def _label(name: str, head: int | None) -> str:
    return name if head is None else f"{name} (head {head})"


def _sum_finite(a: np.ndarray) -> bool:
    """True when the sum of `a` is finite, which proves every entry finite (one pass, no copy)."""
    with np.errstate(all="ignore"):
        return bool(np.isfinite(np.add.reduce(a, axis=None)))


def _check_finite(a: np.ndarray, step: str, how: str) -> None:
    """Refuse, in one line naming the step and entry, a numeric result that overflowed."""
    if _sum_finite(a):
        return
    bad = ~np.isfinite(a)
    if bad.any():
        i, j = (int(k) + 1 for k in np.argwhere(bad)[0])
        raise BadInput(f"step {step}: entry ({i}, {j}) overflows float64 ({how}); scale the inputs down")


class _Tracer:
    def __init__(self, problem: Problem):
        self.p = problem
        self.alg = algebra_for(problem.mode, full_expansion=problem.full_expansion)
        self.steps: list[Step] = []
        self.multi = len(problem.heads) > 1
        self.numeric = problem.mode == "numeric"

    # -- helpers ---------------------------------------------------------------
    def operand(self, op: Operand) -> _Value:
        return _Value(op.value, op.shape, op.name)

    def emit(self, id, head, inputs, formula, result, shape, details=None, symbolic_name=True) -> _Value:
        symbol = STEP_SYMBOLS.get(id) if symbolic_name else None
        value, expansion = self.alg.finish(result, symbol=symbol, head=head, shape=shape)
        if self.numeric and id != "masked":  # masked scores are -inf on purpose; inputs were finite
            how = f"{inputs[0]} divided by {details['factor']:.6g}" if id == "scaled" else f"computed from {', '.join(inputs)}"
            _check_finite(value, _label(id, head), how)
        self.steps.append(Step(id=id, head=head, inputs=tuple(inputs), formula=formula, value=value, shape=tuple(shape),
                               symbol=symbol, expansion=expansion, details=details or {}))
        return _Value(value, shape, id)

    def product(self, id, head, a: _Value, b: _Value, *, b_transposed=False):
        """Shape-checked a @ b (or a @ b.T); returns (result, shape)."""
        inner_b = b.shape[1] if b_transposed else b.shape[0]
        if a.shape[1] != inner_b:
            b_desc = f"{b.ref}^T {b.shape[::-1]}" if b_transposed else f"{b.ref} {b.shape}"
            raise BadInput(f"step {_label(id, head)}: cannot multiply {a.ref} {a.shape} by {b_desc}: {a.shape[1]} != {inner_b}")
        shape = (a.shape[0], b.shape[0] if b_transposed else b.shape[1])
        result = self.alg.matmul_t(a.value, b.value) if b_transposed else self.alg.matmul(a.value, b.value)
        return result, shape

    def add_bias(self, id, head, result, shape, bias: Operand | None):
        if bias is None:
            return result
        if bias.shape != (1, shape[1]):
            raise BadInput(f"step {_label(id, head)}: bias {bias.name} has shape {bias.shape}, expected (1, {shape[1]})")
        return self.alg.add_row(result, bias.value)

    # -- steps -----------------------------------------------------------------
    def project(self, which: str, head, ops) -> _Value:
        source_name = "X_kv" if which in ("K", "V") and "X_kv" in self.p.shared else "X"
        x = self.operand(self.p.shared[source_name])
        w = self.operand(ops[f"W_{which}"])
        result, shape = self.product(which, head, x, w)
        bias = ops.get(f"b_{which}")
        result = self.add_bias(which, head, result, shape, bias)
        inputs = [source_name, f"W_{which}"] + ([f"b_{which}"] if bias else [])
        src_tex = "X_{kv}" if source_name == "X_kv" else "X"
        return self.emit(which, head, inputs, formulas.projection(which, head=head, bias=bias is not None, source=src_tex),
                         result, shape, {"bias": bias.name} if bias else None)

    def scores(self, head, q: _Value, k: _Value) -> _Value:
        result, shape = self.product("scores", head, q, k, b_transposed=True)
        return self.emit("scores", head, [q.ref, k.ref], formulas.scores(head), result, shape)

    def scaled(self, head, s: _Value, d_k: int | None) -> _Value:
        number = None if self.p.scale is True else self.p.scale
        if number is None and d_k is None:
            raise BadInput("scale is on but d_k is unknown: give d_k (the key width) or set scale = false")
        factor = self.alg.factor(d_k, number)
        result = self.alg.divide(s.value, factor)
        details = {"d_k": d_k, "factor": factor, "by_sqrt_dk": number is None}
        return self.emit("scaled", head, [s.ref], formulas.scaled(head, by_sqrt=number is None), result, s.shape, details)

    def masked(self, head, t: _Value) -> _Value:
        keep = self.keep_matrix(t.shape)
        result = self.alg.mask(t.value, keep)
        details = {"keep": keep, "kind": "causal" if isinstance(self.p.mask, str) else "matrix"}
        return self.emit("masked", head, [t.ref], formulas.masked(head, scaled=self.p.scale is not False), result, t.shape, details, symbolic_name=False)

    def keep_matrix(self, shape) -> np.ndarray:
        if isinstance(self.p.mask, str):  # causal: query i sees keys j <= i (top-left aligned, as PyTorch)
            keep = np.tril(np.ones(shape, dtype=bool))
        else:
            keep = self.p.mask
            if keep.shape != tuple(shape):
                raise BadInput(f"step masked: mask has shape {keep.shape} but the scores are {tuple(shape)}")
        empty = np.flatnonzero(~keep.any(axis=1))
        if empty.size:
            raise BadInput(f"step masked: row {empty[0] + 1} of the mask keeps no entry, so its softmax is undefined")
        keep = keep.copy()
        keep.setflags(write=False)
        return keep

    def weights(self, head, t: _Value) -> _Value:
        result, details = self.alg.softmax(t.value)
        if self.numeric:
            # t - max overflows when a row spans more than the float range (1e308 and -1e308)
            shifted = details["shifted"]
            if not _sum_finite(shifted):
                bad = np.isneginf(shifted) & ~np.isneginf(t.value)
                if bad.any():
                    i, j = (int(k) + 1 for k in np.argwhere(bad)[0])
                    raise BadInput(f"step {_label('weights', head)}: entry ({i}, {j}) minus its row maximum overflows float64 "
                                   f"(the row spans more than the float range); scale the inputs down")
        return self.emit("weights", head, [t.ref], formulas.weights(head, scaled=self.p.scale is not False, masked=self.p.mask is not None), result, t.shape, details)

    def weighted_sum(self, head, a: _Value, v: _Value) -> _Value:
        result, shape = self.product("Z", head, a, v)
        return self.emit("Z", head, [a.ref, v.ref], formulas.weighted_sum(head), result, shape)

    # -- whole problem -----------------------------------------------------------
    def head(self, head, ops) -> _Value | None:
        start = self.p.start
        if start == "X":
            q, k, v = (self.project(w, head, ops) for w in ("Q", "K", "V"))
        elif start == "QKV":
            q, k = self.operand(ops["Q"]), self.operand(ops["K"])
            v = self.operand(ops["V"]) if "V" in ops else None
        if start in ("X", "QKV"):
            s = self.scores(head, q, k)
            d_k = q.shape[1]
            if self.p.d_k is not None and self.p.d_k != d_k and self.p.scale is True:
                raise BadInput(f"d_k = {self.p.d_k} but the keys of {_label('K', head)} are {d_k} wide")
        elif start == "scores":
            s, d_k = self.operand(ops["scores"]), self.p.d_k
            v = self.operand(ops["V"]) if "V" in ops else None
        if start == "weights":
            a, v = self.operand(ops["weights"]), self.operand(ops["V"])
        else:
            t = self.scaled(head, s, d_k) if self.p.scale is not False else s
            if self.p.mask is not None:
                t = self.masked(head, t)
            a = self.weights(head, t)
        return self.weighted_sum(head, a, v) if v is not None else None

    def run(self) -> Trace:
        self.check_budget()
        if not self.numeric:
            return self._run()
        with np.errstate(all="ignore"):  # overflow is reported per step by _check_finite, not as warnings
            return self._run()

    def _run(self) -> Trace:
        p = self.p
        heads = [None] if not self.multi else list(range(1, len(p.heads) + 1))
        if p.start == "Z":
            zs = [self.operand(ops["Z"]) for ops in p.heads]
        else:
            zs = [self.head(h, ops) for h, ops in zip(heads, p.heads)]
        z = zs[0]
        if self.multi and all(x is not None for x in zs):
            z = self.concat(zs)
        if "W_O" in p.shared:
            if z is None:
                raise BadInput("W_O needs the head outputs Z: give V")
            z = self.output(z)
        elif p.start == "Z" and not self.multi:
            raise BadInput("a single Z needs W_O or more heads to trace anything")
        # the report's "Given" order: the inputs, then each head's matrices, then W_O and b_O
        first = tuple(p.shared[k] for k in ("X", "X_kv") if k in p.shared)
        last = tuple(op for k, op in p.shared.items() if k not in ("X", "X_kv"))
        operands = first + tuple(op for ops in p.heads for op in ops.values()) + last
        settings = {
            "start": p.start, "scale": p.scale, "d_k": p.d_k, "mask": None if p.mask is None else ("causal" if isinstance(p.mask, str) else "matrix"),
            "cross": "X_kv" in p.shared, "full_expansion": p.full_expansion, "description": p.description,
            "tokens": p.tokens, "kv_tokens": p.kv_tokens, "source": p.source, **p.localized,
        }
        return Trace(mode=p.mode, steps=tuple(self.steps), operands=operands, title=p.title,
                     num_heads=len(p.heads), settings=settings)

    def concat(self, zs: list[_Value]) -> _Value:
        rows = zs[0].shape[0]
        for i, z in enumerate(zs[1:], start=2):
            if z.shape[0] != rows:
                raise BadInput(f"step concat: Z of head {i} has {z.shape[0]} rows but Z of head 1 has {rows}")
        blocks, col = [], 1
        for i, z in enumerate(zs, start=1):
            blocks.append((i, col, col + z.shape[1] - 1))
            col += z.shape[1]
        shape = (rows, col - 1)
        result = self.alg.hstack([z.value for z in zs])
        return self.emit("concat", None, [f"Z@{i}" for i in range(1, len(zs) + 1)], formulas.concat(len(zs)),
                         result, shape, {"blocks": tuple(blocks)}, symbolic_name=False)

    def output(self, z: _Value) -> _Value:
        w = self.operand(self.p.shared["W_O"])
        if w.shape[0] != z.shape[1]:
            raise BadInput(f"step output: W_O has {w.shape[0]} rows but the concatenated heads are {z.shape} (need h*d_v = {z.shape[1]} rows)")
        result, shape = self.product("output", None, z, w)
        bias = self.p.shared.get("b_O")
        result = self.add_bias("output", None, result, shape, bias)
        inputs = [z.ref, "W_O"] + (["b_O"] if bias else [])
        return self.emit("output", None, inputs, formulas.output(bias=bias is not None), result, shape)

    def check_budget(self) -> None:
        """Refuse, before any work, a trace that would not finish in seconds or fit in memory.

        Numeric mode: the entries of every step (scores, scaled, masked, weights and the
        softmax's details are n x m each) against limit numeric_entries. Exact and symbolic
        mode: `work_estimate`, which follows the size of the entries from step to step,
        against exact_cost, symbolic_cost or expanded_cost, and in exact mode the digits
        the values grow to against limit digits.
        """
        p = self.p
        if p.mode == "shape":
            return
        dims = [_dims(ops, p.shared) for ops in p.heads]
        if p.mode == "numeric":
            total, biggest = 0, (0, "")
            for h, dm in enumerate(dims, start=1):
                n, m, dk, dv = dm["n"], dm["m"], dm["dk"], dm["dv"]
                sizes = {"Q": n * dk, "K": m * dk, "V": m * dv, "scores": 6 * n * m, "Z": n * dv}
                total += sum(sizes.values())
                biggest = max(biggest, (n * m, f"scores ({n}x{m})"), (n * dk, f"Q ({n}x{dk})"))
            n0 = dims[0]["n"]
            dz = sum(dm["dv"] for dm in dims)
            total += n0 * dz * (len(dims) > 1) + n0 * dims[0]["out"]
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
                                f"from the sizes and number of its entries); {how}", name)
        if digits > limits.get("digits"):
            raise limits.refuse(f"exact values in this trace would grow to about {digits:,} digits; use --mode numeric", "digits")


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
    d = x.shape[1] if x is not None else 1
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
            q, kk, v = prod(x, st["W_Q"], d), prod(xkv, st["W_K"], d), prod(xkv, st["W_V"], d)
            total += n * dk * q[0] + m * dk * kk[0] + m * dv * v[0]
        else:
            q, kk, v = st.get("Q", one), st.get("K", one), st.get("V", one)
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
        if "V" in st or "X" in p.shared:
            zs = 2 * m if named else m * (a + v[0])
            total += n * dv * zs
            top_bits = max(top_bits, v[2] + s[2] + m)
    if "W_O" in p.shared:
        wo, n0 = stats["W_O"], dims[0]["n"]
        width = sum(dm["dv"] for dm in dims)
        total += n0 * dims[0]["out"] * width * (2 if named else wo[0] * (m + 1))
        top_bits += wo[2] + math.log2(width + 1)
    return int(total), int(top_bits / math.log2(10)) + 1 if p.mode == "exact" else 0


def trace(problem: Problem) -> Trace:
    """Run the problem and record every step."""
    return _Tracer(problem).run()
