"""The view of a backward step (attntrace.kinds.backward): formula = factors = result, fitted.

Every gradient shows its formula, then (numeric and exact) the factors substituted and the
result; products add the entries of the chosen rows, sum of products = numbers = result.
The softmax backward shows, for the chosen rows, r_i = sum_j a_ij g_ij and each entry
a_ij (g_ij - r_i), and for row 1 the Jacobian diag(a_1) - a_1^T a_1 that the row's gradient
is multiplied by. Symbolic mode shows each entry's definition one level deep. No prose here.
"""

from __future__ import annotations

import numpy as np

from attntrace.model.formula import Diff, Dots, Func, Num, Seq as Sequence, Slice, Space, sym, to
from attntrace.kinds import kind_of
from attntrace.kinds.notation import HEAD_INDEX
from attntrace.rendering.layout import Seq
from attntrace.rendering.printing import pick, reproducing_precision
from attntrace.rendering.stepview import register_view
from attntrace.rendering.viewparts import SHAPE_LINES, Ref, block, resolve, rows_to_expand, shape_of, shapes_of


def _shape_line(step, out):
    """op(A) op(B) -> C with the transposes applied (dV: (2 x 3) (3 x 2) for A^T, dZ); the seed: its shape."""
    d = step.details
    if d.get("rule") == "given":
        return out.math(shape_of(step.shape))
    if "factor_shapes" not in d:
        return None
    return out.math(to(shapes_of(*d["factor_shapes"]), shape_of(step.shape)))


SHAPE_LINES["grad"] = _shape_line


def _sides(formula: str) -> list[str]:
    return formula.split(" = ")[1:]


@register_view("grad")
def build_grad(sv, vm) -> None:
    s, o = sv.s, sv.out
    rule = s.details.get("rule", "")
    vm["extra"]["rule"] = rule
    if rule == "given":
        vm["shapes_said"] = True  # a given gradient reads nothing: "Shapes: (2 x 2)" repeated the shape under its name
    vm["extra"]["masked"] = bool(s.details.get("masked"))
    vm["extra"]["by_sqrt"] = bool(s.details.get("by_sqrt_dk", True))
    vm["extra"].update(softmax_rows=[], jacobian=None, jacobian_row=None)
    kind = kind_of(s.id)
    vm["extra"]["of"] = o.math(kind.of.head(s.head))
    vm["extra"]["projections"] = ", ".join(s.details.get("projections", ()))
    vm["extra"]["heads"] = heads = s.details.get("heads", 1)
    # dX sums over the heads, numbered by the head index of the notation (eta), not by the row index i
    values = Sequence(tuple(Num(k) for k in range(1, heads + 1)) if heads <= 3 else (Num(1), Dots(), Num(heads)))
    form = "plain" if o.plain else "tex"
    vm["extra"]["head_range"] = f"{HEAD_INDEX.text(form)} = {values.text(form)}"
    # dW_Q's prose writes the projection, Q = X W_Q + b_Q only when the trace has the bias
    vm["extra"]["bias"] = s.id.startswith("dW_") and any(st.id == "db_" + s.id[3:] for st in sv.t.steps)
    # ... and its input: X, or X_kv for the keys and values of cross-attention
    forward = s.id[3:] if s.id.startswith("dW_") else ""
    # dW_K, dW_V after dW_Q: the same rule, said once (its paragraph appeared three times)
    vm["extra"]["projection_again"] = bool(forward) and next(
        (st for st in sv.t.steps if st.id in ("dW_Q", "dW_K", "dW_V") and st.head == s.head), s) is not s
    vm["extra"]["input"] = (o.math(resolve(sv.t, sv.t.step(forward, s.head).inputs[0], s.head).matrix)
                            if forward and sv.t.has(forward, s.head) else "X")

    lhs = sv.named(sv.ref)
    budget = sv.budget(lhs)
    sides: list = _sides(vm["formula"])
    if rule == "product" and not o.plain and sv.mode != "symbolic":
        product = _factors(sv, budget)
        if product is not None:
            sides.append(product)
    if rule == "scale" and sv.mode != "symbolic":
        src = resolve(sv.t, s.inputs[0], s.head)
        factor = o.sqrt(str(s.details["d_k"])) if s.details.get("by_sqrt_dk", True) and s.details.get("d_k") else o.num(float(s.details["factor"]))
        vm["extra"]["factor_tex"] = factor
        if max(src.shape) <= o.max_size and not o.plain:
            frac = o.frac(o.matrix(src.value, src.shape, budget - 2), factor)
            if o.measure(frac) <= budget:
                sides.append(frac)
    if sv.mode == "symbolic":
        if rule == "given":
            sides.append(o.matrix(s.expansion if s.expansion is not None else s.value, s.shape, budget))
            vm["main"] = [block(sv.fit(lhs, sides))]
            return
        # the softmax backward: each entry simplified (a_11 a_12 (g_11 - g_12)), not a_11 (g_11 - (a_11 g_11 + ...))
        full = o.whole_matrix(_simplified(sv) if rule == "softmax" else sv.expressions(), s.shape, budget)
        if full is not None:
            vm["main"] = [block(sv.fit(lhs, sides + [full]))]
        else:
            vm["main"] = [block(sv.fit(lhs, sides + [o.matrix_of(s.shape[0], s.shape[1], sv.entry_label, budget)]))]
            if rule == "softmax":  # its rows below define every entry, with r_i
                _softmax_rows(sv, vm)
                return
            default = s.shape[0] if s.shape[0] * s.shape[1] <= 12 else 1
            rows = rows_to_expand(sv.rows_opt, s.shape[0], default)
            vm["entry_rows"] = rows
            vm["entries"] = sv.blocks_of([sv.fit(sv.entry_label(i, j), [sv.symbolic_sum(i, j)], align=True, lhs_width=sv.lw)
                                          for i in rows for j in pick(s.shape[1], o.max_size) if j is not None])
    else:
        vm["main"] = [block(sv.fit(lhs, sides + sv.result_side(s.value, budget)))]
        if rule == "product":
            rows = rows_to_expand(sv.rows_opt, s.shape[0], 1)
            vm["entry_rows"] = rows
            vm["entries"] = sv.blocks_of([_product_entry(sv, i, j) for i in rows for j in pick(s.shape[1], o.max_size) if j is not None])
    if rule == "softmax":
        _softmax_rows(sv, vm)


def _operands(sv) -> tuple[Ref, Ref, bool, bool]:
    s = sv.s
    ta, tb = s.details.get("transposed", (False, False))
    return resolve(sv.t, s.inputs[0], s.head), resolve(sv.t, s.inputs[1], s.head), ta, tb


def _factors(sv, budget: float):
    """op(A) op(B) with the numbers, when both are small enough to show whole."""
    o = sv.out
    a, b, ta, tb = _operands(sv)
    if a.value is None or b.value is None or max(a.shape + b.shape) > o.max_size:
        return None
    factors = [sv.shown(a, budget - 2, ta), sv.shown(b, budget - 2, tb)]
    if any(o.measure(f) > budget for f in factors):
        return None
    return Seq(tuple(factors), joiner=" ")


def _product_entry(sv, i: int, j: int) -> list[str]:
    """g_ij = sum_k op(a)_ik op(b)_kj = the numbers = the result."""
    o = sv.out
    a, b, ta, tb = _operands(sv)
    ai = (lambda k: (k, i)) if ta else (lambda k: (i, k))
    bj = (lambda k: (j, k)) if tb else (lambda k: (k, j))
    inner = a.shape[0] if ta else a.shape[1]
    names = sv.sum_seq(inner, lambda k: o.juxt(sv.ename(a, *ai(k)), sv.ename(b, *bj(k))))
    p, result = o.precision, None
    if sv.mode == "numeric" and inner <= o.max_size:  # operands precise enough to give the printed result
        p, result = sv.reproduced([(float(a.value[ai(k)]), float(b.value[bj(k)])) for k in range(inner)], i, j)
    with o.digits(p):
        nums = sv.sum_seq(inner, lambda k: o.mul(o.factor(a.value, *ai(k)), o.factor(b.value, *bj(k))))
    return sv.fit(sv.entry_label(i, j), _shown_sides(sv, [names, nums]) + (result or sv.entry_result(sv.s.value, i, j)), align=True, lhs_width=sv.lw)


def _softmax_rows(sv, vm) -> None:
    """The softmax backward row by row: r_i, each entry a_ij (g_ij - r_i), and row 1's Jacobian."""
    s, o = sv.s, sv.out
    a = resolve(sv.t, s.inputs[0], s.head)
    da = resolve(sv.t, s.inputs[1], s.head)
    rowdot = s.details.get("rowdot")
    if rowdot is None:
        return
    n_rows, cols = s.shape
    symbolic = sv.mode == "symbolic"
    rows = rows_to_expand(sv.rows_opt, n_rows, n_rows if symbolic and n_rows * cols <= 12 else 1)
    rname = lambda i: o.math(sym("r").head(s.head).at(i + 1))  # noqa: E731
    kept = lambda i: [j for j in range(cols) if a.value[i, j] != 0]  # noqa: E731 - masked weights are exactly 0
    out_rows = []
    for i in rows:
        js = kept(i)
        chain: list = [sv.sum_seq(len(js), lambda k: o.juxt(sv.ename(a, i, js[k]), sv.ename(da, i, js[k])))]
        numeric = isinstance(a.value, np.ndarray) and isinstance(da.value, np.ndarray)
        if not symbolic:
            r_text = _value(sv, rowdot[i])
            p = o.precision
            if numeric:  # operands precise enough to give the printed r_i
                p = reproducing_precision(o.precision, [(float(a.value[i, j]), float(da.value[i, j])) for j in js], r_text)
            with o.digits(p):
                chain.append(sv.sum_seq(len(js), lambda k: o.mul(o.factor(a.value, i, js[k]), o.factor(da.value, i, js[k]))))
            chain.append(r_text)
            if sv.mode == "exact" and getattr(rowdot[i], "is_number", False):  # a given dO of symbols has no float
                chain.append((o.rel("approx"), o.num(float(rowdot[i].evalf(17)))))
        lines = [sv.fit(rname(i), _shown_sides(sv, chain), align=True)]
        for j in pick(cols, o.max_size):
            if j is None:
                continue
            gname = sv.ename(da, i, j)
            entry = [o.juxt(sv.ename(a, i, j), o.paren(f"{gname} - {rname(i)}"))]
            if not symbolic:
                p, result = o.precision, sv.entry_result(s.value, i, j)
                if numeric:  # a_ij (g_ij - r_i) from the printed numbers gives the printed result
                    aij, r = float(a.value[i, j]), float(rowdot[i])
                    p, result = sv.reproduced([(aij, float(da.value[i, j])), (-aij, r)], i, j)
                with o.digits(p):
                    entry.append(o.mul(o.factor(a.value, i, j), o.paren(f"{o.entry(da.value, i, j)} - {_value(sv, rowdot[i])}")))
                entry = _shown_sides(sv, entry) + result
            elif s.expansion is not None:
                entry.append(o.expr(softmax_grad_simplified(a.value, da.value, i, j)))
            lines.append(sv.fit(sv.entry_label(i, j), entry, align=True, lhs_width=sv.lw))
        out_rows.append({"row": i + 1, "token": "", "blocks": sv.blocks_of(lines)})
    vm["extra"]["softmax_rows"] = out_rows
    jac = s.details.get("jacobian")
    if jac is not None and cols <= o.max_size:
        jname = sym("J").head(s.head).at(1)
        a_1 = sym("a").at(1)
        jlhs = o.named(o.math(jname), (cols, cols))
        general = o.math(Func("diag", (a_1,)) - a_1.T() * a_1)
        vm["extra"]["jacobian"] = block(sv.fit(jlhs, [general] + _matrix(sv, jac, (cols, cols), sv.budget(jlhs))))
        # symbolic: the row's entries written out (their names alone would define dT_1 by itself)
        first = _simplified(sv, rows=1) if symbolic and s.expansion is not None else (s.value[0:1, :] if s.value is not None else None)
        row = _matrix(sv, first, (1, cols), sv.budget(jlhs)) if first is not None else []
        first_row = lambda matrix: Slice(matrix.head(s.head), (1, 1), None)  # noqa: E731
        glhs = o.math(first_row(sv.ref.matrix))
        vm["extra"]["jacobian_row"] = block(sv.fit(glhs, [o.math(first_row(Diff(sym("A"))) * Space() * jname)] + row))


def softmax_grad_simplified(a, g, i: int, j: int):
    """Entry (i, j) of dT in symbolic mode as a lecturer writes it: a_ij (g_ij - r_i) with
    r_i = sum_k a_ik g_ik becomes a_ij sum_{k != j} a_ik (g_ij - g_ik), since the row's weights
    sum to 1 (masked weights are exactly 0 and drop out). Two keys: a_11 a_12 (g_11 - g_12).
    `a` and `g` are the weights' and their gradients' SymPy matrices of names."""
    import sympy

    others = [k for k in range(a.shape[1]) if k != j and a[i, k] != 0]
    if a[i, j] == 0 or not others:
        return sympy.Integer(0)  # a masked weight, or the row's only key: the gradient is 0
    diff = lambda k: sympy.Add(g[i, j], -g[i, k], evaluate=False)  # noqa: E731
    if len(others) == 1:
        pair = sorted((j, others[0]))  # a_11 a_12, in index order
        return sympy.Mul(a[i, pair[0]], a[i, pair[1]], diff(others[0]), evaluate=False)
    return sympy.Mul(a[i, j], sympy.Add(*[sympy.Mul(a[i, k], diff(k), evaluate=False) for k in others], evaluate=False),
                     evaluate=False)


def _simplified(sv, rows: int | None = None):
    """The softmax backward's entries in their simplified form (symbolic mode), as a matrix."""
    import sympy

    s = sv.s
    a = resolve(sv.t, s.inputs[0], s.head).value
    g = resolve(sv.t, s.inputs[1], s.head).value
    n = s.shape[0] if rows is None else rows
    return sympy.ImmutableMatrix(n, s.shape[1], lambda i, j: softmax_grad_simplified(a, g, i, j))


def _narrow(sv, side) -> bool:
    """Whether each piece of a side (each term of a sum) fits a line of entry blocks: an exact
    gradient through the softmax can be a fraction of fractions far wider than the page."""
    o = sv.out
    if o.plain:
        return True
    items = side.items if isinstance(side, Seq) else (side,)
    return all(o.measure(t if isinstance(t, str) else t.tex()) <= o.limit - sv.lw - 3.5 for t in items)


def _shown_sides(sv, sides: list) -> list:
    """The sides that fit; in exact mode a value too wide for the page gives way to its approximation."""
    return [x for x in sides if x and (isinstance(x, tuple) or _narrow(sv, x))]


def _matrix(sv, value, shape, budget) -> list:
    """A small matrix of a detail (the Jacobian, a row): exact when it fits, else approximated."""
    o = sv.out
    exact = o.matrix(value, shape, budget)
    if sv.mode != "exact" or o.plain or o.measure(exact) <= budget:
        return [exact]
    approx = o.approx_matrix(value, shape, budget)
    return [(o.rel("approx"), approx)] if approx else [exact]


def _value(sv, x) -> str:
    """One number of a softmax detail (a float, or a SymPy number in exact mode)."""
    o = sv.out
    if isinstance(x, float) or hasattr(x, "dtype"):
        return o.num(float(x))
    return o.expr(x)


def _joined(chain: list) -> list:
    return [c for c in chain if c]
