"""Views of the Transformer block's kinds: sums (X-tilde = X + P, residuals), norms, activations and
the sinusoidal position table. The FFN's products use StepView's product view.

Each view writes the step like the attention steps: the general formula, the matrices
substituted and the result (fitted to the page), then the entries of the chosen rows one by
one: the formula in entry names, the numbers substituted, the value. A norm first gives each
chosen row's statistics (mu_i and sigma_i^2, or nu_i for RMSNorm) the same way. Symbolic
mode writes each entry in terms of the previous step's names (and the row statistics as
symbols, defined above the entries).
"""

from __future__ import annotations

import math

import numpy as np

from attntrace.kinds import kind_of
from attntrace.kinds.registry import BLOCK_IDS
from attntrace.model import formula as F
from attntrace.rendering.layout import Seq
from attntrace.rendering.printing import reproducing_digits
from attntrace.rendering.stepview import register_view
from attntrace.rendering.viewparts import entry_columns, block, report_params, resolve, rows_to_expand, vector_entry


def _rhs(sv, vm) -> str:
    """The matrix form of the step's formula (without the entry formula)."""
    return sv.out.math(F.after_lhs(F.first_part(sv.s.expr)))


def _entry_formula(sv, vm) -> list[str]:
    """The formula block: the entry formula (the matrix form, N = LayerNorm(R), starts the
    result's line right below, so it is not written twice); the matrix form when there is none."""
    o, expr = sv.out, sv.s.expr
    if o.plain:
        return [vm["formula"]]
    parts = expr.items if isinstance(expr, F.Parts) else (expr,)
    if len(parts) > 1:
        return sv.fit(o.math(F.lhs(parts[1])), [o.math(F.after_lhs(parts[1]))])
    return sv.fit(o.math(F.lhs(parts[0])), [o.math(F.after_lhs(parts[0]))], align=True)


def _entry_rule(step) -> F.Node:
    """The right side of a step's entry formula (g_ij = ...), to substitute an entry into."""
    return F.after_lhs(step.expr.items[1])


def _number(o, x, exact: bool) -> list:
    """A statistic's value: a float, or an exact SymPy number with its approximation."""
    if isinstance(x, (float, np.floating)):
        return [o.num(float(x))]
    sides: list = [o.expr(x)]
    if exact and getattr(x, "is_number", False):
        approx = o.num(float(x.evalf(17)))
        if approx != sides[0]:
            sides.append((o.rel("approx"), approx))
    return sides


def _eps_text(o, eps: float) -> str:
    """epsilon as written in papers: 10^{-5}, 2 \\cdot 10^{-6} (never rounded to 0 by the precision)."""
    if eps == 0:
        return "0"
    if not isinstance(eps, (int, float)):  # an exact number given as text ("1/4"): as given
        return o.math(F.Value(eps))
    m, e = f"{eps:.3g}".split("e") if "e" in f"{eps:.3g}" else (f"{eps:.3g}", None)
    if e is None:
        return m
    power = F.Power(F.Num(10), F.Num(int(e)))
    return o.math(power if m == "1" else F.Op("mul", F.Num(m), power))


def _digits(o, operands: list[float], compute, result: list) -> int:
    """The decimals of a line's operands (printed at the report's precision, or more when the
    printed operands would not give the printed result); exact lines keep the precision."""
    if not operands or not result or not isinstance(result[0], str):
        return o.precision
    return reproducing_digits(o.precision, operands, compute, result[0])


def _num(o, x) -> str:
    """A value inside a substituted formula: floats at the report's precision, SymPy printed."""
    return o.num(float(x)) if isinstance(x, (float, np.floating)) else o.expr(x)


def _lay_out(sv, vm, sides: list, entry, default_rows: int = 1, before=None, first_row: int = 0, full_matrix: bool = True,
             entry_has_result: bool = False) -> None:
    """main: name = sides... = result; entries: for each chosen row, before(i) (chains that
    come first, such as a norm's statistics), then entry(i, j) -> the sides of entry (i, j)
    before its value (names, numbers substituted)."""
    s, o = sv.s, sv.out
    lhs = sv.named(sv.ref)
    budget = sv.budget(lhs)
    expand_all = False
    if sv.mode == "symbolic":
        full = o.whole_matrix(sv.expressions(), s.shape, budget) if full_matrix else None
        if full is not None:
            vm["main"] = [block(sv.fit(lhs, sides + [full]))]
            if before is not None:
                chains = [c for i in rows_to_expand(sv.rows_opt, s.shape[0], s.shape[0]) for c in before(i)]
                vm["entries"] = sv.blocks_of(chains)
                vm["entry_rows"] = rows_to_expand(sv.rows_opt, s.shape[0], s.shape[0])
            return
        sides = sides + [o.matrix_of(s.shape[0], s.shape[1], sv.entry_label, budget)]
        expand_all = True
    else:
        sides = sides + sv.result_side(s.value, budget)
    vm["main"] = [block(sv.fit(lhs, sides))]
    n = s.shape[0]
    rows = rows_to_expand(sv.rows_opt, n, n if expand_all and s.shape[0] * s.shape[1] <= 12 else min(default_rows, n))
    if not sv.rows_opt and first_row and n > first_row:  # the position table's row 1 is sin 0, cos 0: row 2 tells more
        rows = [first_row]
    vm["entry_rows"] = rows
    chains, lead, named = [], None, True
    for i in rows:
        if before is not None:
            chains += before(i)
        lead = len(chains) if lead is None else lead  # the first row's statistics come before its entries
        for j in entry_columns(sv, s.shape[1]):
            if j is None:
                chains.append([o.dots(None, 0)])
                continue
            label = sv.entry_label(i, j)
            if sv.mode == "symbolic":
                chains.append(sv.fit(label, [sv.symbolic_sum(i, j)], align=True, lhs_width=sv.lw))
            else:
                result = [] if entry_has_result else sv.entry_result(s.value, i, j)
                sides = entry(i, j) + result
                if not named and len(sides) > 2 and not o.plain:  # the formula in names once, then numbers only
                    sides = sides[1:]
                named = False
                chains.append(sv.fit(label, sides, align=True, lhs_width=sv.lw))
    vm["entries"] = sv.blocks_of(chains)
    if vm["entries"]:
        vm["entries"][0]["lead"] = lead or 0


# -- sums: X-tilde = X + P, R = X-tilde + O, R^f = N + F ------------------------------------------------
@register_view("sum")
def build_sum(sv, vm) -> None:
    s, o = sv.s, sv.out
    a, b = (resolve(sv.t, n, None) for n in s.inputs[:2])
    lhs = sv.named(sv.ref)
    budget = sv.budget(lhs)
    sides: list = [_rhs(sv, vm)]
    # a residual's operands are the sublayer's input and its output, both shown just before: not again
    if a.value is not None and b.value is not None and not o.plain and max(a.shape) <= o.max_size and s.id == "embed":
        seq = Seq((sv.shown(a, budget - 2), "+ " + sv.shown(b, budget - 2)), joiner=" ")
        if o.measure(seq.tex()) <= budget:  # side by side, or not at all: both were shown before
            sides.append(seq)
            # the second residual after the first: formula = result (mark_repeats picks it)
            vm["main_short"] = [block(sv.fit(sv.named(sv.ref), [sides[0]] + sv.result_side(s.value, budget)))]

    def entry(i, j):
        names = Seq((sv.ename(a, i, j), "+ " + sv.ename(b, i, j)), " ")
        p, result = o.precision, sv.entry_result(s.value, i, j)
        if isinstance(a.value, np.ndarray) and isinstance(b.value, np.ndarray):  # the printed sum gives the printed result
            p, result = sv.reproduced([(float(a.value[i, j]),), (float(b.value[i, j]),)], i, j)
        with o.digits(p):
            nums = Seq((o.entry(a.value, i, j), "+ " + o.factor(b.value, i, j)), " ")
        return [names, nums] + result

    # X-tilde = X + P: row 1 adds sin 0 = 0 and cos 0 = 1; row 2 shows a position at work
    _lay_out(sv, vm, sides, entry, first_row=1 if s.id == "embed" and s.inputs[1] == "pos_enc" else 0, entry_has_result=True)


# -- activations: ReLU, GELU (erf and tanh), SiLU(H) * U ---------------------------------
_H, _U = F.sym("h").at("i", "j"), F.sym("u").at("i", "j")


def _act_entry(o, rule: F.Node, h: str, u: str | None) -> str:
    """The kind's entry formula with one entry h (and u for SwiGLU) in it, as names or numbers."""
    return o.math(F.substitute(rule, {_H: h, _U: u}))


@register_view("activation")
def build_activation(sv, vm) -> None:
    s, o = sv.s, sv.out
    act = s.details.get("activation", "relu")
    h = resolve(sv.t, s.inputs[0], None)
    u = resolve(sv.t, s.inputs[1], None) if len(s.inputs) > 1 else None
    vm["extra"]["activation"] = act
    vm["formula_block"] = _entry_formula(sv, vm)
    rule = _entry_rule(s)

    def entry(i, j):
        names = _act_entry(o, rule, sv.ename(h, i, j), u and sv.ename(u, i, j))
        digits = o.precision
        if sv.mode == "numeric" and act in ("relu", "swiglu"):  # operands that give the printed result
            ops = [float(h.value[i, j])] + ([float(u.value[i, j])] if u is not None else [])
            compute = (lambda xs: max(0.0, xs[0])) if act == "relu" else (lambda xs: xs[0] / (1 + math.exp(-xs[0])) * xs[1])  # noqa: E731
            digits = _digits(o, ops, compute, sv.entry_result(s.value, i, j))
        with o.digits(digits):
            hv = o.entry(h.value, i, j) if act == "relu" else o.factor(h.value, i, j)  # max(0, -1.2): no parentheses
            nums = _act_entry(o, rule, hv, u and o.factor(u.value, i, j))
        return [names, nums]

    _lay_out(sv, vm, [_rhs(sv, vm)], entry)


def _braced(name: str) -> str:
    """An entry name with a superscript of its own (c^{KV}_{11}) in braces before it is squared."""
    return f"{{{name}}}" if "^" in name else name


# -- norms: LayerNorm, RMSNorm --------------------------------------------------------------
@register_view("norm")
def build_norm(sv, vm) -> None:
    s, o = sv.s, sv.out
    d = s.details
    rms = d.get("norm") == "rms"
    r = resolve(sv.t, s.inputs[0], s.head)
    # the gain and bias operands: the block's gamma_1/beta_1 (or _2), or the ones a kind names
    gain_name, bias_name = d.get("gain_operand", f"gamma_{d.get('which')}"), d.get("bias_operand", f"beta_{d.get('which')}")
    gain = resolve(sv.t, gain_name, None) if gain_name in s.inputs else None
    bias = resolve(sv.t, bias_name, None) if bias_name in s.inputs else None
    vm["extra"].update(norm="rms" if rms else "layer", eps=_eps_text(o, d["eps"]), dim=str(s.shape[1]), gain=gain is not None,
                       bias=bias is not None, offset=bool(d.get("offset")))
    vm["formula_block"] = _entry_formula(sv, vm)
    exact = sv.mode == "exact"
    width = s.shape[1]
    eps = _eps_text(o, d["eps"])
    third = o.math(F.Frac(F.Num(1), F.Num(width), small=True))

    def mean_of(term) -> Seq:
        seq = sv.sum_seq(width, term)
        items = list(seq.items)
        items[0], items[-1] = f"{third} {o.big_open}{items[0]}", f"{items[-1]}{o.big_close}"
        return Seq(tuple(items), seq.joiner)

    mu_ = lambda i: F.sym("mu", str(i + 1))  # noqa: E731
    mu = lambda i: o.math(mu_(i))  # noqa: E731
    sig = lambda i: o.math(F.Power(F.sym("sigma").at(i + 1), F.Num(2)))  # noqa: E731
    nu = lambda i: o.math(F.sym("nu", str(i + 1)))  # noqa: E731
    square = lambda x: o.math(F.Power(x, F.Num(2)))  # noqa: E731

    def stats(i) -> list[list[str]]:
        if sv.mode == "symbolic":
            import sympy as sp

            defs = dict(d.get("defs", ()))
            wanted = ((nu(i), sp.Symbol(f"\\nu_{{{i + 1}}}")),) if rms else (
                (mu(i), sp.Symbol(f"\\mu_{{{i + 1}}}")), (sig(i), sp.Symbol(f"\\sigma_{{{i + 1}}}") ** 2))
            out = []
            for name, key in wanted:
                expr = defs.get(key)
                if expr is None:
                    continue
                # (1/d)(t_1 + ... + t_d): SymPy distributes the 1/d over the sum, so take it back out
                terms = [x * width for x in expr.args] if expr.is_Add and len(expr.args) == width else None
                side = mean_of(lambda k: o.expr(terms[k])) if terms else o.expr(expr)
                out.append(sv.fit(name, [side], align=True, lhs_width=sv.lw))
            return out
        if s.value is None:
            return []
        row = [float(r.value[i, k]) for k in range(width)] if not exact else []
        if rms:
            ms = d["mean_square"][i]
            names = mean_of(lambda k: square(_braced(sv.ename(r, i, k))))
            result = _number(o, ms, exact)
            with o.digits(_digits(o, row, lambda xs: sum(x * x for x in xs) / width, result)):
                nums = mean_of(lambda k: square(o.factor(r.value, i, k)))
            return [sv.fit(nu(i), [names, nums] + result, align=True, lhs_width=sv.lw)]
        m, v = d["mean"][i], d["var"][i]
        m_res, v_res = _number(o, m, exact), _number(o, v, exact)
        with o.digits(_digits(o, row, lambda xs: sum(xs) / width, m_res)):
            mean_nums = mean_of(lambda k: o.entry(r.value, i, k))
        mean_line = sv.fit(mu(i), [mean_of(lambda k: sv.ename(r, i, k)), mean_nums] + m_res, align=True, lhs_width=sv.lw)
        sq = lambda x: square(F.Paren(x, sized=True))  # noqa: E731
        with o.digits(_digits(o, row + [float(m)] if row else [], lambda xs: sum((x - xs[-1]) ** 2 for x in xs[:-1]) / width, v_res)):
            mt = _num(o, m)
            var_nums = mean_of(lambda k: sq(f"{o.entry(r.value, i, k)} - {o.paren(mt) if mt.startswith('-') else mt}"))
        var_line = sv.fit(sig(i), [mean_of(lambda k: sq(f"{sv.ename(r, i, k)} - {mu(i)}")), var_nums] + v_res,
                          align=True, lhs_width=sv.lw)
        return [mean_line, var_line]

    def entry(i, j):
        if exact:
            return entry_at(i, j)
        # the operands at the decimals that reproduce the printed result from the printed numbers
        g = float(gain.value[0, j]) if gain is not None else 1.0
        b = float(bias.value[0, j]) if bias is not None else 0.0
        if rms:
            ops = [float(r.value[i, j]), float(d["mean_square"][i])]
            compute = lambda xs: g * xs[0] / math.sqrt(xs[1] + d["eps"]) + b  # noqa: E731
        else:
            ops = [float(r.value[i, j]), float(d["mean"][i]), float(d["var"][i])]
            compute = lambda xs: g * (xs[0] - xs[1]) / math.sqrt(xs[2] + d["eps"]) + b  # noqa: E731
        with o.digits(_digits(o, ops, compute, sv.entry_result(s.value, i, j))):
            return entry_at(i, j)

    def entry_at(i, j):
        centred_n = sv.ename(r, i, j) if rms else F.Add((sv.ename(r, i, j), F.Neg(mu_(i))))
        spread_n = F.Add((nu(i) if rms else sig(i), F.sym("varepsilon")))
        names = o.math(F.Frac(centred_n, F.Sqrt(spread_n)))
        if rms:
            centred = o.entry(r.value, i, j)
            spread = _num(o, d['mean_square'][i])
        else:
            mt = _num(o, d["mean"][i])
            centred = F.Add((o.entry(r.value, i, j), F.Neg(o.paren(mt) if mt.startswith('-') else mt)))
            spread = _num(o, d['var'][i])
        if d["eps"] != 0:  # epsilon = 0 (a hand-computed example) adds nothing: sqrt(0.5), not sqrt(0.5 + 0)
            spread = F.Add((spread, eps))
        nums = o.math(F.Frac(centred, F.Sqrt(spread)))
        if gain is not None and d.get("offset"):  # Gemma's 1 + gamma_j
            one = F.Num(d["offset"])
            names = o.math(F.Op("mul", F.Paren(F.Add((one, vector_entry(sv.ename(gain, 0, j))))), names))
            nums = o.math(F.Op("mul", F.Paren(F.Add((one, o.factor(gain.value, 0, j)))), nums))
        elif gain is not None:
            names = o.math(F.Op("mul", vector_entry(sv.ename(gain, 0, j)), names))
            nums = o.math(F.Op("mul", o.factor(gain.value, 0, j), nums))
        if bias is not None:
            names = f"{names} + {vector_entry(sv.ename(bias, 0, j))}"
            nums = f"{nums} + {o.factor(bias.value, 0, j)}"
        return [names, nums]

    # symbolic: a matrix of fractions over square roots is set too small to read; names, then entries
    _lay_out(sv, vm, [_rhs(sv, vm)], entry, before=stats, full_matrix=False)


# -- the sinusoidal position table ----------------------------------------------------------
@register_view("posenc")
def build_posenc(sv, vm) -> None:
    s, o = sv.s, sv.out
    d = s.details
    base, dim = d.get("base", 10000), s.shape[1]
    b = f"{base:g}" if isinstance(base, float) else str(base)
    # the kind's p_{i,2k} = sin((i - 1) / b^{2k/d}), p_{i,2k+1} = cos(...), with this d
    rules = F.substitute(s.expr.items[1], {F.sym("d"): F.Num(dim)})
    if o.plain:
        vm["formula_block"] = [vm["formula"]]
    else:
        vm["formula_block"] = [line for rule in rules.items for line in sv.fit(o.math(F.lhs(rule)), [o.math(F.after_lhs(rule))], align=True)]
    vm["extra"].update(base=b, dim=str(dim))
    # rows and columns count from 1 like the entries (p_{21}); k = 1, ..., d/2
    i_minus_1 = F.sym("i") - 1
    two_k = F.Num(2) * F.Paren(F.Add((F.sym("k"), F.Neg(F.Num(1))), tight=True))

    def entry(i, j):
        rule = F.after_lhs(rules.items[j % 2])
        return [o.math(F.substitute(rule, {i_minus_1: F.Num(i), two_k: F.Num(2 * (j // 2))}))]

    lhs = sv.named(sv.ref)
    sides: list = []
    if sv.mode == "symbolic":  # constants: shown as exact values, like exact mode
        sides = sv.result_side(s.value, sv.budget(lhs))
        vm["main"] = [block(sv.fit(lhs, sides))]
        return
    _lay_out(sv, vm, [], entry, first_row=1)


# -- the report: block sections and the data flow ----------------------------------------------


def split_block(trace) -> tuple[list, list]:
    """The block's steps before attention (positions, pre-LN norm) and after it (residuals,
    norms, feed-forward network), in trace order."""
    pre, post, seen_attention = [], [], False
    for s in trace.steps:
        if s.id not in BLOCK_IDS:
            seen_attention = True
        elif seen_attention:
            post.append(s)
        else:
            pre.append(s)
    return pre, post


def block_flow(trace, out) -> list[str]:
    """The block's data flow, one equation per line (aligned at =): what the report derives."""
    lines: list[str] = []
    attention_done = False
    for s in trace.steps:
        if s.id in BLOCK_IDS:
            if kind_of(s.id).folded_in_flow:
                continue
            tree = kind_of(s.id).flow_line(trace, s)
            lines.append(out.math(tree))
        elif not attention_done and s.id in ("Q", "Z", "output"):
            if s.id == "Q":
                x = F.first_factor(F.after_lhs(s.expr))
                out_letter = "O" if report_params(trace).get("has_output") else "Z"
                name = "MultiHead" if trace.num_heads > 1 else "Attention"
                lines.append(out.math(F.sym(out_letter).eq(F.Func(name, (x,)))))
                attention_done = True
    if out.plain:
        return lines
    return [line.replace(" = ", " &= ", 1) for line in lines]
