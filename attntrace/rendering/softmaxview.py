"""The softmax of a step view, written as a lecturer would: for each row the row maximum, the
shifted scores, their exponentials, their sum and the weights (numeric and exact), or each
row's sum of exponentials once and the weights over it (symbolic); and a note when a row
puts (almost) all its weight on one key.

The floats of a softmax are not always its true values: e^-5340 underflows to 0 and
1 - e^-5340 rounds to 1. `exp_log10` and `weight_log10` give log10 of the true value where
the float is not exact, so that such entries print in scientific notation, never as a 0
that looks like a masked one.
"""

from __future__ import annotations

import math

import numpy as np

from attntrace.model import formula as F
from attntrace.rendering.layout import Seq, join_sum, row_seq
from attntrace.rendering.printing import decimals_needed, first_entries, noise_tolerance, pick, whole_within_noise
from attntrace.rendering.viewparts import in_block, SATURATED, Ref, block, entry_base, resolve, rows_to_expand


class SoftmaxView:
    """Mixin of StepView: the weights step."""

    def build_softmax(self, vm) -> None:
        s, o = self.s, self.out
        src = resolve(self.t, s.inputs[0], s.head)
        vm["extra"]["extra_column"] = src.shape[1] > s.shape[1]  # a logit with no value (kinds.softmax)
        vm["formula_block"] = self.fit_formula(vm["formula"]) if not o.plain else [vm["formula"]]
        lhs = self.named(self.ref)
        if self.mode == "numeric":
            matrix = o.numeric_matrix(s.value, s.shape, self.budget(lhs), self.weight_log10)
            vm["main"] = [block(self.fit(lhs, [matrix]))]
        else:
            vm["main"] = [block(self.fit(lhs, self.result_side(s.value, self.budget(lhs))))]
        # two rows show the pattern (one in a block's report, where attention is one part of many); --rows asks for more
        rows = rows_to_expand(self.rows_opt, s.shape[0], 1 if in_block(self) else 2)
        if not self.rows_opt:
            rows = self.rows_with_keys(src, rows)
        vm["entry_rows"] = rows
        if self.mode == "symbolic":
            if s.expansion is not None:  # named: each row's sum of exponentials once, then its weights
                vm["entries"] = [block(self.symbolic_softmax_row(src, i)) for i in rows]
                return
            chains = [self.fit(self.entry_label(i, j), [self.symbolic_sum(i, j)], align=True, lhs_width=self.lw)
                      for i in rows for j in pick(s.shape[1], o.max_size) if j is not None]
            vm["entries"] = self.blocks_of(chains)
            return
        tokens = [self.escape(x) for x in self.t.settings.get("tokens") or ()]
        for i in rows:
            vm["softmax_rows"].append({"row": i + 1, "token": tokens[i] if i < len(tokens) else "",
                                       "block": block(self.softmax_row(src, i))})
        vm["notes"] = self.saturation(rows, tokens)

    def rows_with_keys(self, src: Ref, rows: list[int]) -> list[int]:
        """The default rows, a row that the mask leaves one key swapped for the next row with
        several: a one-key row's softmax is (1, 0, ..., 0) by construction and shows nothing."""
        def keys(i: int) -> int:
            return sum(1 for j in range(src.shape[1]) if not _minus_inf(src.value[i, j]))
        spare = [i for i in range(src.shape[0]) if i not in rows and keys(i) > 1]
        chosen = [i if keys(i) > 1 or not spare else spare.pop(0) for i in rows]
        return sorted(set(chosen))

    def symbolic_softmax_row(self, src: Ref, i: int) -> list[str]:
        """sum_k e^{t_ik} = e^{t_i1} + ... (broken to fit), then a_ij = e^{t_ij} / sum_k e^{t_ik}."""
        s, o = self.s, self.out
        import sympy

        cols = pick(s.shape[1], o.max_size)
        ecols = pick(src.shape[1], o.max_size)  # the sum's terms: with a logit column of no value, one more
        kept = [j is None or src.value[i, j] != -sympy.oo for j in ecols]
        first = next(j for j in range(s.shape[1]) if src.value[i, j] != -sympy.oo)
        named = src.value[i, first]  # the entries' own names when they have them (a masked step keeps the t's)
        base = entry_base(named.name) if named.is_Symbol else src.symbol
        sigma = o.math(F.Sum(F.sym("k"), F.Power(F.sym("e"), base.at(i + 1, "k")), small=True))
        terms = [o.ellipsis_term() if j is None else o.exp(o.expr(src.value[i, j])) for j, k in zip(ecols, kept) if k]
        rows = [(sigma, [join_sum(terms)])]
        for j in cols:
            if j is None:
                continue
            t = src.value[i, j]
            lhs = self.entry_label(i, j) if s.value[i, j] != 0 else self.ename_plain(i, j)  # a masked weight has no name of its own
            rows.append((lhs, ["0" if t == -sympy.oo else o.frac(o.exp(o.expr(t)), sigma)]))
        lw = max(o.measure(lhs) for lhs, _ in rows)
        return [line for lhs, sides in rows for line in self.fit(lhs, sides, align=True, lhs_width=lw)]

    def softmax_row(self, src: Ref, i: int) -> list[str]:
        """m_i, the shifted scores, their exponentials, their sum and the weights of row i."""
        s, o, d = self.s, self.out, self.s.details
        cols = pick(s.shape[1], o.max_size)
        ecols = pick(src.shape[1], o.max_size)  # shift and exponentials: with a logit column of no value, one more
        plain = o.plain
        m = F.sym("m").at(i + 1)
        t_ij, t_ik = src.symbol.at(i + 1, "j"), src.symbol.at(i + 1, "k")
        a_ij = F.sym("a").head(s.head).at(i + 1, "j")
        if self.mode == "numeric":
            t_row = np.asarray(src.value[i], dtype=float)
            shifted = d.get("shifted")
            shifted_row = np.asarray(shifted[i], dtype=float) if shifted is not None else t_row - float(d["row_max"][i])
            # a score equal to the maximum in exact arithmetic shifts to 0, not to -4.4e-16 (float noise, printing.NOISE)
            scale = np.abs(t_row[np.isfinite(t_row)]).max(initial=0.0)
            shifted_row = np.where(np.abs(shifted_row) <= noise_tolerance(scale), 0.0, shifted_row)
            exp_row = np.asarray(d["exp"][i], dtype=float)
            vec = lambda xs, lg=None, cs=cols: self.vector([None if j is None else float(xs[j]) for j in cs],  # noqa: E731
                                                            None if lg is None else [None if j is None else lg(i, j) for j in cs])
            # the row maximum as the matrix it comes from prints it (1.6330 there, not 1.633 here)
            src_all = np.asarray(src.value, dtype=float)
            head, noise = first_entries(src_all)
            dsrc = decimals_needed(head, o.precision)  # non-finite entries need none
            mx = whole_within_noise(float(d["row_max"][i]), noise)
            m_val = f"{mx:.{dsrc}f}" if dsrc and math.isfinite(mx) and mx != 0 and mx == int(mx) else o.fixed(mx, dsrc, pad=False)
            several = np.isfinite(self.shifted(i)).sum() > 1  # then the sum is 1 + something, never exactly 1
            weights_row = np.asarray(s.value[i], dtype=float)
            shown = [j for j in ecols if j is not None]  # the weights: one fewer with a logit of no value (a sink)
            px, pe, ps = _row_digits(o.precision, [shifted_row[j] for j in shown], [exp_row[j] for j in shown],
                                     float(d["row_sum"][i]) if None not in ecols else None,
                                     [weights_row[j] if j < s.shape[1] else None for j in shown])
            with o.digits(ps):
                total = o.vector([float(d["row_sum"][i])], [0.0] if several else None)[0]
            with o.digits(px):
                shifted_v = vec(shifted_row, cs=ecols)
            with o.digits(pe):
                exp_v = vec(exp_row, self.exp_log10, cs=ecols)
            weights_v = vec(weights_row, self.weight_log10)
            weights_side: list = [weights_v]
        else:  # exact
            shifted = d.get("shifted")
            row_max = d.get("row_max")
            m_val = o.expr(row_max[i]) if row_max is not None and row_max[i] is not None else None  # None: symbols, no order
            ent = lambda mat, cs=cols: self.vector_tex([o.dots(0, None) if j is None else o.entry(mat, i, j) for j in cs])  # noqa: E731
            shifted_v = ent(shifted, ecols) if shifted is not None else None
            exp_v = ent(d["exp"], ecols)
            rs = d["row_sum"][i]  # a sum of exponentials: breakable after its + like any sum
            total = join_sum([o.expr(t) for t in rs.args]) if getattr(rs, "is_Add", False) and not plain else o.expr(rs)
            weights_v = ent(s.value)
            approx = [None if j is None else o.approx_entry(s.value, i, j) for j in cols]
            weights_side = [weights_v]
            exact_items = [None if j is None else o.entry(s.value, i, j) for j in cols]
            if approx == exact_items:
                pass  # (1, 0, 0) is its own approximation: not written twice
            elif all(a is not None for a, j in zip(approx, cols) if j is not None):  # no approximation of symbols
                dots = o.dots(0, None)
                weights_side.append((o.rel("approx"), self.vector_tex([dots if a is None else a for a in approx])))
                room = o.limit - 9.0  # the row's left column and an indent
                if not plain and any(o.measure(x) > room for x in weights_v.items):
                    weights_side = weights_side[1:]  # a weight wider than the page: its value, not its form
        if self.mode == "exact" and not plain:  # an exponent wider than the page (RoPE's cos/sin sums): its value
            room = o.limit - 9.0
            approx_of = lambda mat: self.vector_tex([o.dots(0, None) if j is None else (o.approx_entry(mat, i, j) or o.entry(mat, i, j))  # noqa: E731
                                                     for j in ecols])
            if shifted_v is not None and any(o.measure(x) > room for x in shifted_v.items):
                shifted_v = (o.rel("approx"), approx_of(shifted))
            if any(o.measure(x) > room for x in exp_v.items):
                exp_v = (o.rel("approx"), approx_of(d["exp"]))
                total = (o.rel("approx"), o.num(float(rs.evalf(17))))
        e = F.sym("e")
        shift = t_ij - m if m_val is not None else t_ij
        expo = F.Power(e, shift)
        sumf = F.Sum(F.sym("k"), F.Power(e, t_ik - m if m_val is not None else t_ik), small=True)
        rows = []
        if m_val is not None:
            rows.append((o.math(m), [o.math(F.Sum(F.sym("j"), t_ij, op="max")), m_val]))
            if shifted_v is not None:
                rows.append((o.math(shift), [shifted_v]))
        rows += [(o.math(expo), [exp_v]), (o.math(sumf), [total]), (o.math(a_ij), [o.math(expo / sumf)] + weights_side)]
        lw = max(o.measure(lhs) for lhs, _ in rows)  # the block's left column is as wide as its widest left side
        return [line for lhs, sides in rows for line in self.fit(lhs, sides, align=True, lhs_width=lw)]

    def vector(self, xs: list[float | None], true_log10=None):
        return self.vector_tex(self.out.vector(xs, true_log10))

    # The floats of a softmax are not always its true values: e^-5340 underflows to 0 and
    # 1 - e^-5340 rounds to 1. These give log10 of the true value where the float is not
    # exact (None where it is: a masked 0, the 1 of a row with one kept key, e^0 = 1).
    def shifted(self, i: int) -> np.ndarray:
        return shifted_row(self.t, self.s, i)

    def exp_log10(self, i: int, j: int) -> float | None:
        x = float(self.shifted(i)[j])
        return None if x == 0 or np.isneginf(x) else x / np.log(10)

    def weight_log10(self, i: int, j: int) -> float | None:
        return weight_log10(self.t, self.s, i, j)

    def vector_tex(self, items: list[str]):
        o = self.out
        return o.row(items) if o.plain else row_seq(items)

    def saturation(self, rows: list[int], tokens) -> list[dict]:
        s = self.s
        notes = []
        # keys each row may see: a row with a single unmasked key has all of its weight by
        # construction (the mask did it), which is no saturation of the softmax
        masked = next((m for m in self.t.steps if m.id == "masked" and m.head == s.head), None)
        keep = masked.details.get("keep") if masked is not None else None
        for i in range(s.shape[0]):
            if keep is not None and int(np.count_nonzero(np.asarray(keep)[i])) <= 1:
                continue
            if self.mode != "numeric" and not all(s.value[i, j].is_number for j in range(s.shape[1])):
                continue  # a row with symbols has no weights to compare
            vals = [float(s.value[i, j]) if self.mode == "numeric" else float(s.value[i, j].evalf(17)) for j in range(s.shape[1])]
            j = int(np.argmax(vals))
            if s.shape[1] > 1 and vals[j] >= SATURATED:
                notes.append({"kind": "saturated", "row": i + 1, "col": j + 1, "weight": self.out.num(vals[j]),
                              "rest": self.out.num(1.0 - vals[j]) if vals[j] < 1 else "0",
                              "token": tokens[i] if i < len(tokens) else ""})
        return notes



def _shown(x: float, p: int) -> tuple[float, float]:
    """x as a vector prints it at p decimals, and half a unit of its last printed digit."""
    if not math.isfinite(x) or x == 0:
        return x, 0.0
    if abs(x) < 0.5 * 10 ** -p:  # scientific notation, two significant digits
        m, e = f"{x:.1e}".split("e")
        return float(f"{m}e{e}"), 0.05 * 10 ** int(e)
    return float(f"{x:.{p}f}"), 0.5 * 10 ** -p


def _row_digits(precision: int, shifted: list[float], exps: list[float], total: float | None,
                weights: list[float | None], more: int = 3) -> tuple[int, int, int]:
    """The decimals of a softmax row's shifted scores, exponentials and sum (each at least
    `precision`, the fewest that do) at which every line of the row reproduces its printed
    result from its printed operands: e^(printed shift) gives the printed exponential, the
    printed exponentials add up to the printed sum, and each printed exponential over the
    printed sum gives the printed weight (the weights keep the precision of the matrix A).
    `total` is None when the row is shown with dots (its sum has terms the row does not show).
    Why: at 4 decimals e^-0.4372 is 0.6458, but the row prints 0.6459 (the shift is -0.43718),
    and 0.6065 / 2.2131 is 0.2740, where the weight prints 0.2741."""
    tiny = 1e-9

    def ok(px: int, pe: int, ps: int) -> bool:
        e_shown = []
        for x, e in zip(shifted, exps):
            ev, eh = _shown(e, pe)
            if math.isfinite(x) and abs(math.exp(_shown(x, px)[0]) - ev) > eh + tiny:
                return False
            e_shown.append(ev)
        if total is None:
            return True
        sv, sh = _shown(total, ps)
        if abs(sum(e_shown) - sv) > sh + tiny:
            return False
        return all(abs(ev / sv - _shown(a, precision)[0]) <= _shown(a, precision)[1] + tiny
                   for ev, a in zip(e_shown, weights) if a is not None and a != 0)

    tries = sorted(((px, pe, ps) for px in range(precision, precision + more + 1) for pe in range(precision, precision + more + 1)
                    for ps in range(precision, precision + more + 1)), key=lambda t: (sum(t), t[2], t[1]))
    return next((t for t in tries if ok(*t)), (precision,) * 3)


def _minus_inf(x) -> bool:
    """A masked score: -inf as a float, -oo in exact and symbolic mode."""
    try:
        return math.isinf(float(x)) and float(x) < 0
    except TypeError:  # a symbol has no float
        return False


def shifted_row(trace, step, i: int) -> np.ndarray:
    """Row i of a weights step's scores minus the row maximum, as the softmax exponentiated them."""
    d = step.details
    if "shifted" in d:
        return np.asarray(d["shifted"][i], dtype=float)
    src = resolve(trace, step.inputs[0], step.head)
    return np.asarray(src.value[i], dtype=float) - float(d["row_max"][i])


def weight_log10(trace, step, i: int, j: int) -> float | None:
    """log10 of weight (i, j)'s true value where its float is not exact (e^-5340 / sum underflowed
    to 0, 1 - e^-5340 rounded to 1), else None: the weights print the same wherever they appear."""
    row = shifted_row(trace, step, i)
    if np.isneginf(row[j]) or np.isfinite(row).sum() == 1:
        return None
    return float(row[j] - np.log(float(step.details["row_sum"][i]))) / np.log(10)

