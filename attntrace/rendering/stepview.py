"""One step of a trace -> the view model its template lays out: displays that fit the page.

Every display is a *block* (see `attntrace.rendering.viewparts`), laid out for the report's width by
`attntrace.rendering.layout`. A step's view holds its main block (formula = numbers substituted =
result), the entry-by-entry blocks of the rows chosen for expansion, the softmax row by row
(`attntrace.rendering.softmaxview`) and notes (saturation). No prose: the templates write the words.
"""

from __future__ import annotations

import math

from typing import Any, Callable

import numpy as np

from attntrace.model.errors import BadInput
from attntrace.model.formula import Dots, Frac, Num, after_lhs, sym
from attntrace.rendering.layout import Seq, fit_chain, join_sum, row_seq
from attntrace.rendering.printing import (STATS, decimals_needed, first_entries, pick, plain_name, reproducing_digits,
                                          reproducing_precision, whole_within_noise)
from attntrace.rendering.softmaxview import SoftmaxView, weight_log10
from attntrace.kinds import kind_of
from attntrace.rendering import views
from attntrace.rendering.viewparts import inputs_not_kept, Ref, block, entry_columns, pack, resolve, rows_to_expand, shape_dims, step_ref, vector_entry


#: Views laid out by modules of their own (`views.modules()`): view name -> function(step_view, vm)
#: that fills vm like the build_* methods below. Register with `register_view`.
VIEWS: dict[str, Callable[["StepView", dict], None]] = {}


def register_view(name: str):
    """Decorator: `@register_view("rotation") def build(sv, vm): ...` lays out kinds whose view is "rotation"."""
    def add(fn):
        VIEWS[name] = fn
        return fn
    return add


class StepView(SoftmaxView):
    """Builds the view model of one step for one output (TeX or plain)."""

    def __init__(self, trace, step, out, rows, escape):
        """`escape` makes user text (token labels) safe for the output format; required
        whenever tokens can reach the view (every report passes its format's escaper)."""
        self.t, self.s, self.out, self.rows_opt = trace, step, out, rows
        self.escape = escape
        self.mode = trace.mode
        self.ref = step_ref(step)

    # -- names and layout -----------------------------------------------------------
    def mname(self, ref: Ref, transpose: bool = False) -> str:
        return self.out.math(ref.named.T() if transpose else ref.named)

    def named(self, ref: Ref, transpose: bool = False) -> str:
        shape = ref.shape[::-1] if transpose else ref.shape
        return self.out.named(self.mname(ref, transpose), shape)

    def fit(self, lhs: str, sides: list, align: bool = False, lhs_width: float = 0.0) -> list[str]:
        o = self.out
        if o.plain:
            parts = [s[1] if isinstance(s, tuple) else s for s in sides if s]
            texts = [p.tex() if isinstance(p, Seq) else p for p in parts]
            return [o.eq(lhs, *texts)]
        return fit_chain(lhs, sides, o.limit, align=align, lhs_width=lhs_width)

    def budget(self, lhs: str, indent: float = 0.0) -> float:
        """The width left for a matrix on a line that starts with `lhs =`."""
        return self.out.limit - self.out.measure(lhs) - 1.4 - indent

    def ename(self, ref: Ref, i: int, j: int) -> str:
        if self.mode == "symbolic" and ref.value is not None:
            return self.out.entry(ref.value, i, j)
        n = ref.name(i, j)
        return plain_name(n).replace("tildet", "t~") if self.out.plain else n

    def entry_label(self, i: int, j: int) -> str:
        if self.mode == "symbolic" and self.s.expansion is not None:
            return self.out.entry(self.s.value, i, j)  # the step's own name for the entry
        n = self.ref.name(i, j)  # numeric, exact and fully expanded symbolic entries have no name of their own
        return plain_name(n).replace("tildet", "t~") if self.out.plain else n

    def ename_plain(self, i: int, j: int) -> str:
        n = self.ref.name(i, j)
        return plain_name(n) if self.out.plain else n

    def expressions(self):
        """Symbolic mode: each entry in terms of the previous step (named), or of the inputs (full)."""
        return self.s.expansion if self.s.expansion is not None else self.s.value

    def symbolic_sum(self, i: int, j: int) -> Seq:
        """One symbolic entry as a breakable sum of its terms (at most max_size of them shown).

        A term too wide for a line of its own cannot be typeset: with expand='full' that is
        refused with a one-line error rather than written as a line TeX would cut off."""
        o = self.out
        e = self.expressions()[i, j]
        if self.s.expansion is None and e.is_polynomial():
            import sympy  # full expansion: a product of sums is shown as its sum of monomials

            e = sympy.expand(e)
        args = list(e.args) if getattr(e, "is_Add", False) else [e]
        ks = pick(len(args), o.max_size)
        terms = [o.ellipsis_term() if k is None else o.expr(args[k]) for k in ks]
        if not o.plain and self.s.expansion is None:
            widest = max(o.measure(t) for t in terms)
            if widest > o.limit - self.lw - 3.5:
                raise BadInput(f"entry {plain_name(self.ref.name(i, j))} of step {self.s.key} has a term too wide for the page "
                               f"({widest:.0f} em of {o.limit:.0f}); use expand = \"named\" (the default)")
        return join_sum(terms)

    def sum_seq(self, n: int, term) -> Seq:
        """term(k) for k < n as a breakable sum, eliding the middle beyond max_size terms."""
        ks = pick(n, self.out.max_size)
        return join_sum([self.out.ellipsis_term() if k is None else term(k) for k in ks])

    def blocks_of(self, chains: list[list[str]]) -> list[dict[str, Any]]:
        """The chains of an entry list as one aligned block (two blocks left a visible gap in
        the middle of one list; LaTeX breaks a long block across pages, \\allowdisplaybreaks).
        The block records each chain's line count, so a report can show the first entry only."""
        if not chains:
            return []
        b = block([line for lines in chains for line in lines])
        b["chains"] = [len(lines) for lines in chains]
        return [b]

    # -- the view -------------------------------------------------------------------
    def build(self) -> dict[str, Any]:
        s, o = self.s, self.out
        vm: dict[str, Any] = {
            "kind": s.id, "view": kind_of(s.id).view, "prose": kind_of(s.id).prose, "key": s.key, "head": s.head or 0, "mode": self.mode,
            "name": self.mname(self.ref),
            "formula": o.math(s.expr),
            "shape": o.shape(s.shape), "rows": s.shape[0], "cols": s.shape[1],
            "elided": max(s.shape) > o.max_size, "main": [], "entries": [], "entry_rows": [], "softmax_rows": [],
            "notes": [], "shape_line": self.shape_line(), "extra": {}, "formula_block": [], "entry_form": "entries",
        }
        if s.id == "scaled":
            self.scale_facts(vm)
        if s.id == "scores" and len(s.inputs) == 2:  # the queries and keys it reads: rotated, normed or a key/value head's
            vm["extra"]["read_q"], vm["extra"]["read_k"] = (self.mname(resolve(self.t, n, s.head)) for n in s.inputs)
        if s.id == "output":  # one head: no concatenation to speak of, its own Z times W_O
            vm["extra"]["heads"] = self.t.num_heads
        self.lw = self.label_width()
        view = kind_of(s.id).view
        builder = getattr(self, f"build_{view}", None)
        missing = inputs_not_kept(self.t, s)
        if missing:  # traced with keep=: an input's values are gone, so the result only
            vm["inputs_not_kept"] = missing
            lhs = self.named(self.ref)
            vm["formula_block"] = self.fit_formula(vm["formula"])
            vm["main"] = [block(self.fit(lhs, self.result_side(s.value, self.budget(lhs))))] if s.value is not None else []
        elif self.mode == "shape":
            vm["formula_block"] = self.fit_formula(vm["formula"])
        elif builder is not None:
            builder(vm)
        else:
            if view not in VIEWS:
                views.load(view)
            if view in VIEWS:
                VIEWS[view](self, vm)
        if isinstance(vm["formula_block"], list):
            vm["formula_block"] = block(vm["formula_block"]) if vm["formula_block"] else None
        vm["entry_rows"] = [i + 1 for i in vm["entry_rows"]]
        before, arrow, after = vm["shape_line"].partition(f" {o.rel('to')} ")
        vm["shape_same"] = bool(arrow) and before == after  # (3 x 2) -> (3 x 2): the step keeps its input's shape
        return vm

    def label_width(self) -> float:
        """The widest entry label of this step (its last entry): the left column of its entry blocks."""
        s, o = self.s, self.out
        if o.plain or s.value is None:
            return 0.0
        i, j = s.shape[0] - 1, s.shape[1] - 1
        return o.measure(self.entry_label(i, j)) + 0.2

    def fit_formula(self, formula: str) -> list[str]:
        if self.out.plain:
            return [formula]
        lhs, _, rhs = formula.partition(" = ")
        return self.fit(lhs, [rhs]) if rhs else [formula]

    def result_side(self, value, budget: float) -> list:
        """The result matrix, and in exact mode its approximation as a second side."""
        o, shape = self.out, self.s.shape
        exact = o.matrix(value, shape, budget)
        sides: list = [exact]
        if self.mode == "exact":
            approx = o.approx_matrix(value, shape, budget)
            if approx:
                sides.append((o.rel("approx"), approx))
                if not o.plain and o.measure(exact) > budget:
                    sides = sides[1:]  # the exact entries do not fit even with dots: the entry lines show them
        return sides

    # -- shapes ---------------------------------------------------------------------
    def shape_line(self) -> str:
        return shape_dims(self.t, self.s, self.out)

    # -- products: Q, K, V, scores, Z, output ------------------------------------------
    def operands(self) -> tuple[Ref, Ref, bool, Ref | None]:
        """The two factors of a product step, whether the second is transposed, and the bias."""
        s, t = self.s, self.t
        a = resolve(t, s.inputs[0], s.head)
        b = resolve(t, s.inputs[1], s.head)
        bias = resolve(t, s.inputs[2], s.head) if len(s.inputs) > 2 else None
        return a, b, kind_of(s.id).transposes_second or bool(s.details.get("transposed")), bias

    def shown(self, ref: Ref, budget: float, transpose: bool = False) -> str:
        o = self.out
        if transpose:
            if isinstance(ref.value, np.ndarray):
                return o.numeric_matrix(ref.value.T, ref.shape[::-1], budget)
            return o.matrix_of(ref.shape[1], ref.shape[0], lambda i, j: o.entry(ref.value, j, i), budget)
        return o.matrix(ref.value, ref.shape, budget)

    def build_product(self, vm) -> None:
        s, o = self.s, self.out
        a, b, tr, bias = self.operands()
        lhs = self.named(self.ref)
        rhs = o.math(after_lhs(s.expr))
        small = all(max(r.shape) <= o.max_size for r in (a, b) + ((bias,) if bias else ()))
        budget = self.budget(lhs)
        sides: list = [rhs]
        true_a = self.saturated_weights(s.inputs[0])
        if small and a.value is not None and b.value is not None and not o.plain:  # plain matrices span lines: no product
            factors = [o.numeric_matrix(a.value, a.shape, budget - 2, true_a) if true_a else self.shown(a, budget - 2),
                       self.shown(b, budget - 2, tr)]
            product = Seq(tuple(factors), joiner=" ")
            if bias is not None:
                product = Seq((product.tex(), "+ " + self.shown(bias, budget - 2)), joiner=" ")
            # the factors side by side on one line, or not at all: each was shown before (given, or an
            # earlier step's result), and factors stacked one above the other cost a page a block
            if o.measure(product.tex()) <= budget:
                sides.append(product)
        expand_all = False
        if self.mode == "symbolic":
            full = o.whole_matrix(self.expressions(), s.shape, budget)
            if full is not None:
                sides.append(full)
                vm["main"] = [block(self.fit(lhs, sides))]
                return  # the matrix shows every entry's expansion: no entry lines needed
            sides.append(o.matrix_of(s.shape[0], s.shape[1], self.entry_label, budget))  # names; each entry below
            expand_all = True
        else:
            sides += self.result_side(s.value, budget)
        vm["main"] = [block(self.fit(lhs, sides))]
        if len(sides) > 1 and isinstance(sides[1], Seq):  # a repeated product (K after Q) shows formula = result
            vm["main_short"] = [block(self.fit(lhs, sides[:1] + sides[2:]))]
        vm["extra"]["left"] = (s.inputs[0], s.head)  # a later product of the same left factor is shown short
        # the factors by name, for the prose: the weighted sum reads V_cache or a shared V^(2), not "V"
        vm["extra"]["factors"] = [self.mname(a), self.mname(b)]
        n = s.shape[0]
        default = n if expand_all and s.shape[0] * s.shape[1] <= 12 else 1
        rows = rows_to_expand(self.rows_opt, n, default)
        vm["entry_rows"] = rows
        cells = [(i, j) for i in rows for j in entry_columns(self, s.shape[1])]
        self._line_digits = self.shared_digits(a, b, tr, bias, [c for c in cells if c[1] is not None])
        chains = []
        for i, j in cells:
            chains.append(self.product_entry(a, b, tr, bias, i, j, named=not chains, true_a=true_a) if j is not None else [o.dots(None, 0)])
        vm["entries"] = self.blocks_of(chains)

    def saturated_weights(self, name: str) -> Callable[[int, int], float | None] | None:
        """When this product reads attention weights some of whose floats are not their true values
        (e^-5340 / sum underflowed to 0, 1 - e^-5340 rounded to 1), log10 of the true values, so that
        the weights print here as the softmax step printed them (7.4e-2320 and 1.0000, not 0 and 1)."""
        base, _, h = name.partition("@")
        head = int(h) if h else self.s.head
        if self.mode != "numeric" or base != "weights" or not self.t.has(base, head):
            return None
        step = self.t.step(base, head)
        value = np.asarray(step.value, dtype=float)
        true = lambda i, j: weight_log10(self.t, step, i, j)  # noqa: E731
        rows, cols = value.shape
        if not any(value[i, j] in (0.0, 1.0) and true(i, j) is not None for i in range(rows) for j in range(cols)):
            return None
        return true

    def product_terms(self, a, b, tr, bias, i, j) -> list[tuple[float, ...]] | None:
        """The numbers of entry (i, j)'s line, sum of a_ik b_kj (+ bias), or None when it is not written out."""
        if self.mode != "numeric" or a.shape[1] > self.out.max_size:
            return None
        bij = (lambda k: (j, k)) if tr else (lambda k: (k, j))
        terms = [(float(a.value[i, k]), float(b.value[bij(k)])) for k in range(a.shape[1])]
        return terms + [(float(bias.value[0, j]),)] if bias is not None else terms

    def shared_digits(self, a, b, tr, bias, cells) -> int:
        """One number of decimals for every entry line of a product: the fewest at which each line
        reproduces its printed result (a_11 printed 0.2955 in z_11's line and 0.29547 in z_12's)."""
        lines = [(t, self.entry_result(self.s.value, i, j, operands=[x for f in t for x in f])[0])
                 for i, j in cells if (t := self.product_terms(a, b, tr, bias, i, j)) is not None]
        p = self.out.precision
        for _ in range(7):
            q = max([reproducing_precision(p, t, r) for t, r in lines] or [p])
            if q == p:
                break
            p = q
        return p

    def product_entry(self, a, b, tr, bias, i, j, named: bool = True, true_a=None) -> list[str]:
        """One entry: the sum of products in names, the numbers substituted, the result. Only the
        first entry of a list writes the names (`named`): the others follow the same pattern, and a
        textbook gives them with their numbers only."""
        o, s = self.out, self.s
        bij = (lambda k: (j, k)) if tr else (lambda k: (k, j))
        lhs = self.entry_label(i, j)
        if self.mode == "symbolic":
            return self.fit(lhs, [self.symbolic_sum(i, j)], align=True, lhs_width=self.lw)
        inner = a.shape[1]
        names = self.sum_seq(inner, lambda k: o.juxt(self.ename(a, i, k), self.ename(b, *bij(k))))
        result, p = None, o.precision
        terms = self.product_terms(a, b, tr, bias, i, j)
        if terms is not None:
            p, result = self.reproduced(terms, i, j)
            p = max(p, getattr(self, "_line_digits", p))  # the product's lines share their digits

        def left(k):  # a weight whose float is not its true value prints as the softmax step printed it
            lg = true_a(i, k) if true_a else None
            x = float(a.value[i, k]) if lg is not None else None
            if x == 0:
                return o.power_of_ten(lg)
            if x is not None and x == int(x):
                return f"{x:.{o.precision}f}"
            return o.entry(a.value, i, k) if k == 0 and not o.plain else o.factor(a.value, i, k)

        with o.digits(p):
            nums = self.sum_seq(inner, lambda k: o.mul(left(k), o.factor(b.value, *bij(k))))
            if bias is not None:
                nums = Seq(nums.items + ("+ " + o.factor(bias.value, 0, j),), " ")
        if bias is not None:
            names = Seq(names.items + ("+ " + (vector_entry(self.ename(bias, 0, j)) if bias.shape[0] == 1 else self.ename(bias, 0, j)),), " ")
        if self.mode == "exact" and not o.plain and any(o.measure(t) > o.limit - self.lw - 4.0 for t in nums.items):
            # a factor wider than the page (RoPE's exact weights): the products of its values instead
            ap = lambda v, r, c: (lambda x: o.paren(x) if x.startswith("-") else x)(o.approx_entry(v, r, c) or o.entry(v, r, c))  # noqa: E731
            nums = (o.rel("approx"), self.sum_seq(inner, lambda k: o.mul(ap(a.value, i, k), ap(b.value, *bij(k)))))
        sides = [names, nums] if named or o.plain else [nums]
        return self.fit(lhs, sides + (result or self.entry_result(s.value, i, j)), align=True, lhs_width=self.lw)

    def reproduced(self, terms: list[tuple[float, ...]], i: int, j: int) -> tuple[int, list]:
        """For a substituted line sum_t prod(t) = entry (i, j): the decimals its operands need so
        that the printed numbers give the printed result, and that result."""
        result = self.entry_result(self.s.value, i, j, operands=[x for t in terms for x in t])
        return reproducing_precision(self.out.precision, terms, result[0]), result

    def entry_result(self, value, i, j, operands: list[float] | None = None) -> list:
        """The result of entry (i, j); numeric results of one step share one decimal layout, the
        matrix's: a whole number among decimals gets them too (1.0000, as the matrix prints it),
        unless every operand of its line is a whole number (0 + 1 = 1, not 1.0000)."""
        o = self.out
        if isinstance(value, np.ndarray):
            if not hasattr(self, "_decimals"):
                head, self._noise_scale = first_entries(value)
                self._decimals = decimals_needed(head, o.precision)
            STATS["entries"] += 1
            # within float noise of a whole number: that number, as the matrix prints it (printing.NOISE)
            x, d = whole_within_noise(float(value[i, j]), self._noise_scale), self._decimals
            whole_line = operands is not None and all(math.isfinite(v) and v == int(v) for v in operands)
            if d and x != 0 and math.isfinite(x) and x == int(x) and not whole_line:
                return [f"{x:.{d}f}"]
            return [o.fixed(x, d, pad=False)]
        result = o.entry(value, i, j)
        sides: list = [result]
        if self.mode == "exact":
            approx = o.approx_entry(value, i, j)
            if approx is not None and approx != result:
                sides.append((o.rel("approx"), approx))
                if not o.plain and o.measure(result) > o.limit - self.lw - 3.0:
                    sides = sides[1:]  # one fraction wider than the page: its value, not its form
        return sides

    # -- scaling ------------------------------------------------------------------------
    def scale_facts(self, vm) -> None:
        s, o = self.s, self.out
        d = s.details
        by_sqrt = d.get("by_sqrt_dk", True)
        factor = d.get("factor")
        extra = vm["extra"]
        extra["by_sqrt"] = bool(by_sqrt)
        extra["d_k"] = "" if d.get("d_k") is None else str(d["d_k"])
        fnum = "" if factor is None else o.num(float(factor))
        if by_sqrt and d.get("d_k") is not None:
            root = o.sqrt(str(d["d_k"]))
            whole = float(d["d_k"]) ** 0.5 == int(float(d["d_k"]) ** 0.5)
            extra["factor"] = o.eq(root, fnum) if whole else o.approx(root, fnum)
            extra["factor_tex"] = root
        else:
            extra["factor"] = o.eq("c", fnum)
            extra["factor_tex"] = fnum

    def build_scaled(self, vm) -> None:
        s, o = self.s, self.out
        src = resolve(self.t, s.inputs[0], s.head)
        factor = vm["extra"]["factor_tex"]
        lhs = self.named(self.ref)
        rhs = o.math(after_lhs(s.expr))
        sides: list = [rhs, o.frac(self.mname(src), factor)]
        if self.mode != "symbolic" and s.details.get("factor") is not None and float(s.details["factor"]) == 1:
            # d_k = 1 (the height-weight toys): T = S / sqrt(1) = S, shown above; no row to divide out
            vm["main"] = [block(self.fit(lhs, sides + [self.mname(src)]))]
            return
        if self.mode == "symbolic":
            vm["main"] = [block(self.fit(lhs, sides + [o.matrix(s.value, s.shape, self.budget(lhs))]))]
        else:
            vm["main"] = [block(self.fit(lhs, sides + self.result_side(s.value, self.budget(lhs))))]
        rows = rows_to_expand(self.rows_opt, s.shape[0], 1)
        vm["entry_rows"] = rows
        if self.mode == "numeric" and not o.plain:  # one division per row, as a row vector
            row_lines = [self.scaled_row(src, factor, i) for i in rows]  # each row laid out once
            vm["entries"] = [block([line for lines in row_lines for line in lines])]
            vm["entries"][0]["chains"] = [len(lines) for lines in row_lines]
            vm["entry_form"] = "row"
            return
        chains = []
        for i in rows:
            for j in pick(s.shape[1], o.max_size):
                if j is None:
                    continue
                if self.mode == "symbolic":
                    chains.append(self.fit(self.entry_label(i, j), [self.symbolic_sum(i, j)], align=True, lhs_width=self.lw))
                    continue
                names = o.frac(self.ename(src, i, j), factor)
                result = self.entry_result(s.value, i, j)
                with o.digits(self.divided_digits(src, [(i, j)], result)):
                    nums = o.frac(o.entry(src.value, i, j), factor)
                if not o.plain and o.measure(nums) > o.limit - self.lw - 3.0:
                    nums = None  # one fraction wider than the page (an exact score of cosines): the score is above
                chains.append(self.fit(self.ename(self.ref, i, j), [x for x in [names, nums] + result if x is not None],
                                       align=True, lhs_width=self.lw))
        vm["entries"] = self.blocks_of(chains)

    def scaled_row(self, src: Ref, factor: str, i: int) -> list[str]:
        """t_{ij} = s_{ij} / sqrt(d_k) for row i at once: (3, 6, 4, 5) / sqrt(6) = (1.2247, ...)."""
        o, s = self.out, self.s
        cols = pick(s.shape[1], o.max_size)
        row = lambda ref: o.math(ref.symbol.at(i + 1, "j"))  # noqa: E731  (t^{(2)}_{1j})
        lhs = row(self.ref)
        dots = o.dots(0, None)
        shown = [j for j in cols if j is not None]
        d = self.divided_digits(src, [(i, j) for j in shown], [self.entry_result(s.value, i, j)[0] for j in shown])
        if isinstance(src.value, np.ndarray):
            # the scores as their matrix prints them (2.5930 there, not 2.593 here), more digits when needed
            head, noise = first_entries(src.value)  # a score within float noise of 4 is 4 (printing.NOISE)
            d = max(d, decimals_needed(head, o.precision))
            values = [dots if j is None else o.fixed(whole_within_noise(float(src.value[i, j]), noise), d, pad=False)
                      for j in cols]
        else:
            with o.digits(d):
                values = [dots if j is None else o.entry(src.value, i, j) for j in cols]
        one_over = tuple(o.math(Frac(Num(1), factor, small=small)) for small in (False, True))
        nums = row_seq(values, one_over)  # 1/sqrt(6) (3, 6, 4, 5)
        results = self.vector_tex([dots if j is None else self.entry_result(s.value, i, j)[0] for j in cols])
        return self.fit(lhs, [o.frac(row(src), factor), nums, results], align=True, lhs_width=o.measure(lhs))

    def divided_digits(self, src: Ref, cells: list[tuple[int, int]], results: list[str]) -> int:
        """The decimals at which the printed scores over the printed factor give the printed
        results (8.0000 / sqrt(2) is 5.6569, not the 5.6568 of the score 7.99998)."""
        o, factor = self.out, self.s.details.get("factor")
        if self.mode != "numeric" or factor is None:
            return o.precision
        f = float(factor)
        return max([reproducing_digits(o.precision, [float(src.value[i, j])], lambda xs: xs[0] / f, r)
                    for (i, j), r in zip(cells, results)] or [o.precision])

    # -- mask -------------------------------------------------------------------------
    def build_masked(self, vm) -> None:
        s, o = self.s, self.out
        vm["extra"]["kind"] = s.details.get("kind", "matrix")
        keep = s.details.get("keep")
        vm["extra"]["masked_count"] = int((~np.asarray(keep, dtype=bool)).sum()) if keep is not None else 0
        vm["formula_block"] = self.fit_formula(vm["formula"]) if not o.plain else [vm["formula"]]
        blocks = []
        # one mask for every head: printed with the first head's masked scores, again only where it differs
        first = next(x for x in self.t.steps if x.id == s.id)
        shown = first is not s and np.array_equal(np.asarray(first.details.get("keep"), dtype=bool), np.asarray(keep, dtype=bool))
        if keep is not None and not shown:
            letter = o.math(sym("M"))  # M, as the notation table writes it
            mlhs = o.named(letter, s.shape)
            blocks.append(self.fit(mlhs, [o.matrix_of(s.shape[0], s.shape[1], lambda i, j: "1" if keep[i, j] else "0", self.budget(mlhs))]))
        lhs = self.named(self.ref)
        masked = o.matrix(s.value, s.shape, self.budget(lhs))
        if self.mode == "exact" and not o.plain and o.measure(masked) > self.budget(lhs):
            # exact entries wider than the page even with dots: their values, as the scaled step shows them
            approx = o.approx_matrix(s.value, s.shape, self.budget(lhs))
            blocks.append(self.fit(lhs, [(o.rel("approx"), approx)] if approx else [masked]))
        else:
            blocks.append(self.fit(lhs, [masked]))
        vm["main"] = [block(b) for b in pack(blocks, o)]

    # -- softmax ------------------------------------------------------------------------
    def build_concat(self, vm) -> None:
        """One display: Z = Concat(Z^(1), Z^(2)) = [the entries, each head's block marked]; the
        blocks' names and shapes stand under them, so no second display of names is needed."""
        s, o = self.s, self.out
        refs = [resolve(self.t, n, None) for n in s.inputs]
        blocks = s.details.get("blocks", ())
        vm["extra"]["blocks"] = [{"head": h, "first": f, "last": l} for h, f, l in blocks]
        lhs = self.named(self.ref)
        rhs = o.math(after_lhs(s.expr))
        if o.plain:
            vm["main"] = [block([o.eq(lhs, rhs, o.matrix(s.value, s.shape)) if s.value is not None else vm["formula"]])]
            return
        heads = pick(len(refs), max(2, o.max_size // 2))
        values = self.concat_values(refs, heads, lhs) if s.value is not None else None
        if values is None:  # no numbers, or too wide even with dots: the blocks' names and shapes
            dots = o.math(Dots(centered=True))
            values = o.brackets([dots if h is None else o.block(self.mname(refs[h]), o.shape(refs[h].shape)) for h in heads])
        vm["main"] = [block(self.fit(lhs, [rhs, values]))]

    def head_block(self, r: Ref, rows, cols, refs) -> str:
        """One head's block of the concatenation; numbers share one decimal layout across heads."""
        o = self.out
        if not isinstance(r.value, np.ndarray):
            body = [[o.dots(i, j) if i is None or j is None else o.entry(r.value, i, j) for j in cols] for i in rows]
            return o.inner_matrix(body)
        if getattr(self, "_concat_decimals", None) is None:  # one layout for every head: counted once
            self._concat_decimals = decimals_needed(np.concatenate([np.asarray(ref.value, dtype=float).ravel()[:4096] for ref in refs]),
                                                    o.precision)
        d = self._concat_decimals
        body = [[o.dots(i, j) if i is None or j is None else o.fixed(float(r.value[i, j]), d) for j in cols] for i in rows]
        return o.inner_matrix(body, numeric=True)

    def concat_values(self, refs, heads, lhs) -> str | None:
        """The entries with each head's block marked; fewer columns per head, then fewer
        heads, until it fits; None when not even two heads of two columns fit."""
        o, s = self.out, self.s
        rows = pick(s.shape[0], o.max_size)
        head_limit = len([h for h in heads if h is not None]) + (1 if None in heads else 0)
        while head_limit >= 2:
            heads = pick(len(refs), head_limit)
            shown = len([h for h in heads if h is not None])
            per = max(2, o.max_size // max(1, shown))
            while True:
                parts = []
                for h in heads:
                    if h is None:
                        parts.append(o.ellipsis_term())
                        continue
                    r = refs[h]
                    cols = pick(r.shape[1], per)
                    parts.append(o.block(self.head_block(r, rows, cols, refs), self.mname(r)))
                text = o.brackets(parts)
                if o.measure(text) <= self.budget(lhs):
                    return text
                if per <= 2:
                    break
                per -= 1
            head_limit -= 1
        return None

