"""The general formula of each step kind, as a LaTeX math fragment (no prose).

Kept apart from the tracer's arithmetic so that the math code never builds strings by hand;
only KaTeX-safe macros are used (`\\operatorname{softmax}`, `\\top`, `\\sqrt`).
"""

from __future__ import annotations


def _sup(head: int | None) -> str:
    return "" if head is None else f"^{{({head})}}"


def _w(letter: str, head: int | None) -> str:
    return f"W_{letter}" + _sup(head)


def _b(letter: str, head: int | None) -> str:
    return f"b_{letter}" + _sup(head)


def projection(which: str, *, head: int | None, bias: bool, source: str) -> str:
    """Q = X W_Q (+ b_Q); `source` is X, or X_{kv} for the keys and values of cross-attention."""
    lhs = which + _sup(head)
    rhs = f"{source} {_w(which, head)}"
    return f"{lhs} = {rhs}" + (f" + {_b(which, head)}" if bias else "")


def scores(head: int | None) -> str:
    h = _sup(head)
    inner = "" if head is None else f"({head})"
    return f"S{h} = Q{h} K^{{{inner}\\top}}"


def scaled(head: int | None, *, by_sqrt: bool) -> str:
    h = _sup(head)
    divisor = "\\sqrt{d_k}" if by_sqrt else "c"
    return f"T{h} = \\frac{{S{h}}}{{{divisor}}}"


def masked(head: int | None, *, scaled: bool = True) -> str:
    """The masked scores T-tilde: a matrix of its own name, not T changed in place."""
    h = _sup(head)
    m = "T" if scaled else "S"
    return (f"\\tilde{{T}}{h}_{{ij}} = \\begin{{cases}} {m}{h}_{{ij}} & M{h}_{{ij}} = 1 \\\\ "
            f"-\\infty & M{h}_{{ij}} = 0 \\end{{cases}}")


def weights(head: int | None, *, scaled: bool = True, masked: bool = False) -> str:
    """A = softmax(T) over the scaled scores T, softmax(S) when there is no scaling, and
    softmax(T-tilde) over the masked scores."""
    h = _sup(head)
    m, e = ("T", "t") if scaled else ("S", "s")
    if masked:
        m, e = "\\tilde{T}", "\\tilde{t}"
    sup = "" if head is None else f"^{{({head})}}"
    return (f"A{h} = \\operatorname{{softmax}}\\left({m}{h}\\right), \\quad a{sup}_{{ij}} = "
            f"\\frac{{e^{{{e}{sup}_{{ij}}}}}}{{\\sum_{{k}} e^{{{e}{sup}_{{ik}}}}}}")


def weighted_sum(head: int | None) -> str:
    h = _sup(head)
    return f"Z{h} = A{h} V{h}"


def concat(num_heads: int) -> str:
    if num_heads <= 3:
        parts = ", ".join(f"Z^{{({i})}}" for i in range(1, num_heads + 1))
    else:
        parts = f"Z^{{(1)}}, Z^{{(2)}}, \\ldots, Z^{{({num_heads})}}"
    return f"Z = \\operatorname{{Concat}}\\left({parts}\\right)"


def output(*, bias: bool) -> str:
    return "O = Z W_O" + (" + b_O" if bias else "")
