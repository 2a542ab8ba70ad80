"""What a kind computes with: the problem, the mode's algebra, shape-checked products and `emit`.

`Context` is handed to every kind's `compute` by the tracer (`attntrace.tracer`); `emit`
records the Step and, in numeric mode, refuses in one line a value that overflowed float64
(`check_finite`), naming the step and the entry.

Overflow costs O(1) per step where NumPy has already looked: the tracer runs under
`np.errstate(..., call=ctx.watch)`, so every ufunc (the scaling, the softmax's shift and
exponentials, a bias row, a residual) reports overflow, division by zero and invalid results
to `FloatWatch` as it happens, and `emit` scans a value only when something was reported.
BLAS products are the exception: with several BLAS threads, an overflow in a worker thread
never reaches this thread's floating-point flags, so a step that ran a product
(`NumericAlgebra.products` moved) sums its result once, which is O(output), small next to
the product's O(output x inner width). Unless the product cannot overflow: when both factors
carry a bound on their Frobenius norm (`Flow.norm`: a head's block of a full-width projection,
whose sum of squares checked it; attention weights, whose rows sum to 1) and the bounds
multiply to less than `SAFE_PRODUCT`, every entry of the product and every partial sum of it
is below that (Cauchy-Schwarz: |sum_l a_il b_lj| <= |a_i| |b_j|), so the step is not scanned.
"""

from __future__ import annotations

import numpy as np

from attntrace.algebra.modes import algebra_for
from attntrace.inputs.spec import Problem
from attntrace.kinds.base import Flow, Kind, label
from attntrace.model.errors import BadInput
from attntrace.model.formula import PRINTERS, Node
from attntrace.model.trace import Operand, Step

#: Matrix and entry names, in formulas, of the operands that stand in for a step (a trace that starts mid-way).
_OPERAND_NAMES = {"Q": ("Q", "q"), "K": ("K", "k"), "V": ("V", "v"), "scores": ("S", "s"), "weights": ("A", "a"), "Z": ("Z", "z")}


#: A product whose factors' norm bounds multiply to less than this cannot overflow float64
#: (1.8e308), rounding of the partial sums included.
SAFE_PRODUCT = 1e300


def sum_finite(a: np.ndarray) -> bool:
    """True when the sum of `a` is finite, which proves every entry finite (one pass, no copy).

    Called inside `trace`, whose np.errstate silences the overflow warning of the sum; an
    errstate here too would cost as much as summing a head's scores."""
    return bool(np.isfinite(np.add.reduce(a, axis=None)))


def check_finite(a: np.ndarray, step: str, how: str) -> None:
    """Refuse, in one line naming the step and entry, a numeric result that overflowed."""
    if sum_finite(a):
        return
    bad = ~np.isfinite(a)
    if bad.any():
        i, j = (int(k) + 1 for k in np.argwhere(bad)[0])
        raise BadInput(f"step {step}: entry ({i}, {j}) overflows float64 ({how}); scale the inputs down")


class FloatWatch:
    """NumPy's error callback (`np.errstate(call=...)`): notes that some ufunc overflowed,
    divided by zero or made a NaN since the last step was recorded."""

    __slots__ = ("raised",)

    def __init__(self) -> None:
        self.raised = False

    def __call__(self, kind: str, flag: int) -> None:
        self.raised = True

    def errstate(self):
        """The error state a numeric trace runs under: underflow ignored, the rest reported here."""
        return np.errstate(over="call", divide="call", invalid="call", under="ignore", call=self)


class Context:
    """What a kind computes with: the problem, the algebra of its mode, and the steps so far."""

    def __init__(self, problem: Problem, keep: frozenset[str] | None = None):
        self.p = problem
        #: `trace(..., keep=)`: the step ids and keys (weights, weights@2) to record; None keeps all
        self.keep = keep
        #: keys of the steps computed but not recorded (their values are freed once no kind reads them)
        self.not_kept: list[str] = []
        self.not_kept_shapes: list[tuple[int, int]] = []
        self.ids_not_kept: dict[str, None] = {}
        #: whether the last step computed was recorded (the forward result, at the end of the forward pass)
        self.last_kept = True
        self.alg = algebra_for(problem.mode, full_expansion=problem.full_expansion)
        self.steps: list[Step] = []
        self.numeric = problem.mode == "numeric"
        #: floating-point errors reported by NumPy since the last step (see the module docstring)
        self.watch = FloatWatch()
        self._products = getattr(self.alg, "products", 0)
        #: what a kind computes once and reuses across heads (full-width projections, shared K/V heads)
        self.cache: dict = {}
        #: inputs the block's PRE pipeline replaced (X -> X-tilde = X + P, or its pre-LN norm): see `source`
        self.sources: dict[str, Flow] = {}

    def source(self, name: str) -> Flow:
        """What attention reads as the shared input `name` (X, X_kv): the block's value when a
        PRE pipeline made one (position encodings, pre-LN norm), else the operand itself."""
        return self.sources.get(name) or self.operand(self.p.shared[name])

    def operand(self, op: Operand) -> Flow:
        letter, entry = _OPERAND_NAMES.get(op.name, (op.name, None))
        return Flow(op.value, op.shape, op.name, letter, entry)

    def emit(self, kind: Kind, head, inputs, formula: Node, result, shape, details=None, *, checked=False) -> Flow:
        """Record the step `kind` computed, with its general formula (a tree), and return its
        value in flight (`checked`: the kind has already checked the value for overflow, e.g.
        once for a full-width product)."""
        value, expansion = self.alg.finish(result, symbol=kind.symbol, head=head, shape=shape)
        details = details or {}
        if self.numeric:
            if not kind.infinite_ok and not checked and self.float_trouble():
                check_finite(value, label(kind.id, head), kind.overflow_how(inputs, details))
            self.watch.raised, self._products = False, self.alg.products
        keep = self.keep
        key = None if keep is None else kind.id if head is None else f"{kind.id}@{head}"
        self.last_kept = keep is None or kind.id in keep or key in keep
        if self.last_kept:
            self.steps.append(Step(kind.id, head, tuple(inputs), formula, value, tuple(shape), kind.symbol, expansion, details))
        else:
            self.not_kept.append(key)
            self.not_kept_shapes.append(tuple(shape))
            self.ids_not_kept.setdefault(kind.id, None)
        return Flow(value, shape, kind.id, kind.letter, kind.entry)

    def float_trouble(self) -> bool:
        """Whether the values computed since the last step may hold an overflow: NumPy reported a
        floating-point error, or a BLAS product ran (whose worker threads report none)."""
        return self.watch.raised or self.alg.products != self._products

    def product(self, id, head, a: Flow, b: Flow, *, b_transposed=False):
        """Shape-checked a @ b (or a @ b.T); returns (result, shape)."""
        inner_b = b.shape[1] if b_transposed else b.shape[0]
        if a.shape[1] != inner_b:
            b_desc = f"{b.ref}^T {b.shape[::-1]}" if b_transposed else f"{b.ref} {b.shape}"
            raise BadInput(f"step {label(id, head)}: cannot multiply {a.ref} {a.shape} by {b_desc}: {a.shape[1]} != {inner_b}")
        shape = (a.shape[0], b.shape[0] if b_transposed else b.shape[1])
        ran = getattr(self.alg, "products", 0)
        result = self.alg.matmul_t(a.value, b.value) if b_transposed else self.alg.matmul(a.value, b.value)
        if self.numeric and a.norm is not None and b.norm is not None and a.norm * b.norm < SAFE_PRODUCT:
            self._products += self.alg.products - ran  # bounded: this product is no reason to scan the step
        return result, shape

    def add_bias(self, id, head, result, shape, bias: Operand | None):
        if bias is None:
            return result
        if bias.shape != (1, shape[1]):
            raise BadInput(f"step {label(id, head)}: bias {bias.name} has shape {bias.shape}, expected (1, {shape[1]})")
        return self.alg.add_row(result, bias.value)

