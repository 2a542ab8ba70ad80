"""One step of a trace -> the view model its template lays out: displays that fit the page.

Every display is a *block*: a list of lines (one line, or the lines of an aligned block with
'&' before each relation), laid out for the report's width by `attntrace.layout`. A step's
view holds its main block (formula = numbers substituted = result), the entry-by-entry blocks
of the rows chosen for expansion, the softmax row by row (max, shift, exponentials, sum,
weights) and notes (saturation). No prose: the templates write the words.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import BadInput
from .layout import Seq, fit_chain, join_sum
from .printing import STATS, decimals_needed, entry_name, pick, plain_formula, plain_name

#: Entry names and matrix letters of each step (the masked scores are T-tilde: not the same matrix as T).
STEP_BASE = {"Q": "q", "K": "k", "V": "v", "scores": "s", "scaled": "t", "masked": "\\tilde{t}", "weights": "a", "Z": "z",
             "concat": "z", "output": "o"}
STEP_LETTER = {"Q": "Q", "K": "K", "V": "V", "scores": "S", "scaled": "T", "masked": "\\tilde{T}", "weights": "A", "Z": "Z",
               "concat": "Z", "output": "O"}
STEP_PLAIN = {"masked": "T~"}
OPERAND_BASE = {"X": "x", "X_kv": "y", "W_Q": "w^{Q}", "W_K": "w^{K}", "W_V": "w^{V}", "W_O": "w^{O}", "b_Q": "b^{Q}", "b_K": "b^{K}",
                "b_V": "b^{V}", "b_O": "b^{O}", "Q": "q", "K": "k", "V": "v", "scores": "s", "weights": "a", "Z": "z"}
OPERAND_LETTER = {"X": "X", "X_kv": "X_{kv}", "W_Q": "W_Q", "W_K": "W_K", "W_V": "W_V", "W_O": "W_O", "b_Q": "b_Q", "b_K": "b_K",
                  "b_V": "b_V", "b_O": "b_O", "Q": "Q", "K": "K", "V": "V", "scores": "S", "weights": "A", "Z": "Z"}
OPERAND_PLAIN = {"X_kv": "X_kv"}
PRODUCTS = {"Q", "K", "V", "scores", "Z", "output"}
#: A softmax row whose largest weight is at least this is called saturated in the report.
SATURATED = 0.999
#: Lines per aligned block at most: a long block cannot break across pages.
BLOCK_LINES = 8


def block(lines: list[str]) -> dict[str, Any]:
    """A display: its lines, and whether they form an aligned block (several lines, or one
    line with an alignment mark before its relation)."""
    aligned = len(lines) > 1 or any(m in lines[0] for m in (" &= ", " &\\approx ", "} &= "))
    return {"lines": list(lines), "aligned": aligned}


class Ref:
    """A matrix a step reads: its value, shape, entry base name and matrix name."""

    def __init__(self, value, shape, base, letter, head, plain_letter=None):
        self.value, self.shape, self.base, self.letter, self.head = value, tuple(shape), base, letter, head
        self.plain_letter = plain_letter or letter

    def name(self, i: int, j: int) -> str:
        wide = max(self.shape) >= 10
        if self.base.startswith("\\"):  # \tilde{t}: not a parser name, written out here
            sup = "" if self.head is None else f"^{{({self.head})}}"
            sub = f"{i + 1},{j + 1}" if wide else f"{i + 1}{j + 1}"
            return f"{self.base}{sup}_{{{sub}}}"
        return entry_name(self.base, i + 1, j + 1, self.head, wide=wide)


def resolve(trace, name: str, head: int | None) -> Ref:
    if "@" in name:
        name, h = name.split("@")
        head = int(h)
    for h in dict.fromkeys((head, None)):
        if trace.has(name, h):
            return step_ref(trace.step(name, h))
        try:
            o = trace.operand(name, h)
        except KeyError:
            continue
        return operand_ref(o)
    raise KeyError(name)


def operand_ref(op) -> Ref:
    base = op.symbol or OPERAND_BASE.get(op.name, "x")
    # a given Z_i in symbolic mode already carries its head in its symbol (z^{(2)})
    head = None if (op.symbol and "(" in op.symbol) else op.head
    return Ref(op.value, op.shape, base, OPERAND_LETTER.get(op.name, op.name), head if op.symbol else op.head,
               OPERAND_PLAIN.get(op.name))


def step_ref(step) -> Ref:
    return Ref(step.value, step.shape, STEP_BASE[step.id], STEP_LETTER[step.id], step.head, STEP_PLAIN.get(step.id))


def rows_to_expand(option, n: int, default: int) -> list[int]:
    """0-based rows: the option's list (1-based), 'all' (every shown row), or the first `default`."""
    if option == "all":
        return [i for i in pick(n, 10**9) if i is not None]
    if option:
        return [r - 1 for r in option if r <= n]
    return list(range(min(n, default)))


def shape_dims(trace, step, out, short: bool = False) -> str:
    """(100 x 3) (3 x 3) -> (100 x 3): the shapes a step reads and the shape it makes."""
    arrow = " -> " if out.plain else " \\to "
    paren = lambda shape: f"({out.shape(shape)})"  # noqa: E731
    if step.id == "concat":
        refs = [resolve(trace, n, None) for n in step.inputs]
        if len({r.shape for r in refs}) == 1 and not short:  # the article's (n, d_v h): h heads of (n, d_v)
            h, (n, d) = len(refs), refs[0].shape
            if out.plain:
                return f"{h} x ({n} x {d}){arrow}({n} x {d}*{h}) = ({n} x {d * h})"
            return f"{h} \\times ({n} \\times {d}){arrow}({n} \\times {d} \\cdot {h}) = ({n} \\times {d * h})"
        if len({r.shape for r in refs}) == 1:
            times = " x " if out.plain else " \\times "
            return f"{len(refs)}{times}{paren(refs[0].shape)}{arrow}{paren(step.shape)}"
        return ("; " if out.plain else ",\\ ").join(paren(r.shape) for r in refs) + arrow + paren(step.shape)
    ins = [resolve(trace, n, step.head) for n in step.inputs]
    shapes = [r.shape for r in ins]
    if step.id == "scores":
        shapes[1] = shapes[1][::-1]
    return (" " if out.plain else "\\,").join(paren(sh) for sh in shapes) + arrow + paren(step.shape)


def pack(chains: list[list[str]], out) -> list[list[str]]:
    """Put one-line equations side by side (\\qquad apart) while they fit on a line."""
    blocks: list[list[str]] = []
    for lines in chains:
        if (not out.plain and blocks and not block(blocks[-1])["aligned"] and not block(lines)["aligned"]
                and out.measure(blocks[-1][0]) + 2.0 + out.measure(lines[0]) <= out.limit):
            blocks[-1] = [blocks[-1][0] + " \\qquad " + lines[0]]
        else:
            blocks.append(list(lines))
    return blocks


class StepView:
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
        letter = ref.plain_letter if self.out.plain else ref.letter
        return self.out.head_name(letter, ref.head, transpose)

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
        """Group single-line chains into aligned blocks of at most BLOCK_LINES lines."""
        blocks: list[list[str]] = []
        for lines in chains:
            if blocks and len(blocks[-1]) + len(lines) <= BLOCK_LINES:
                blocks[-1].extend(lines)
            else:
                blocks.append(list(lines))
        return [block(b) for b in blocks]

    # -- the view -------------------------------------------------------------------
    def build(self) -> dict[str, Any]:
        s, o = self.s, self.out
        sup = "" if s.head is None else f"^{{({s.head})}}"
        scaled = self.t.settings["scale"] is not False
        vm: dict[str, Any] = {
            "kind": s.id, "key": s.key, "head": s.head or 0, "mode": self.mode, "sup": sup,
            "psup": "" if s.head is None else f"({s.head})",
            "name": self.mname(self.ref),
            "formula": plain_formula(s, scaled=scaled, masked=self.t.has("masked", s.head)) if o.plain else s.formula,
            "shape": o.shape(s.shape), "rows": s.shape[0], "cols": s.shape[1],
            "elided": max(s.shape) > o.max_size, "main": [], "entries": [], "entry_rows": [], "softmax_rows": [],
            "notes": [], "shape_line": self.shape_line(), "extra": {}, "formula_block": [],
        }
        if s.id == "scaled":
            self.scale_facts(vm)
        self.lw = self.label_width()
        builder = getattr(self, f"build_{s.id}", self.build_product if s.id in PRODUCTS else None)
        if self.mode == "shape":
            vm["formula_block"] = self.fit_formula(vm["formula"])
        elif builder is not None:
            builder(vm)
        if isinstance(vm["formula_block"], list):
            vm["formula_block"] = block(vm["formula_block"]) if vm["formula_block"] else None
        vm["entry_rows"] = [i + 1 for i in vm["entry_rows"]]
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
        sides: list = [o.matrix(value, shape, budget)]
        if self.mode == "exact":
            approx = o.approx_matrix(value, shape)
            if approx:
                sides.append(("\\approx" if not o.plain else "~", approx))
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
        return a, b, s.id == "scores", bias

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
        rhs = s.formula.partition(" = ")[2] if not o.plain else vm["formula"].partition(" = ")[2]
        small = all(max(r.shape) <= o.max_size for r in (a, b) + ((bias,) if bias else ()))
        budget = self.budget(lhs)
        sides: list = [rhs]
        if small and a.value is not None and b.value is not None and not o.plain:  # plain matrices span lines: no product
            factors = [self.shown(a, budget - 2), self.shown(b, budget - 2, tr)]
            product = Seq(tuple(factors), joiner=" ")
            if bias is not None:
                product = Seq((product.tex(), "+ " + self.shown(bias, budget - 2)), joiner=" ")
            sides.append(product)
        expand_all = False
        if self.mode == "symbolic":
            full = o.matrix(self.expressions(), s.shape)
            if o.plain or o.measure(full) <= budget:
                sides.append(full)
                vm["main"] = [block(self.fit(lhs, sides))]
                return  # the matrix shows every entry's expansion: no entry lines needed
            sides.append(o.matrix_of(s.shape[0], s.shape[1], self.entry_label, budget))  # names; each entry below
            expand_all = True
        else:
            sides += self.result_side(s.value, budget)
        vm["main"] = [block(self.fit(lhs, sides))]
        n = s.shape[0]
        default = n if expand_all and s.shape[0] * s.shape[1] <= 12 else 1
        rows = rows_to_expand(self.rows_opt, n, default)
        vm["entry_rows"] = rows
        chains = []
        for i in rows:
            for j in pick(s.shape[1], o.max_size):
                if j is not None:
                    chains.append(self.product_entry(a, b, tr, bias, i, j))
        vm["entries"] = self.blocks_of(chains)

    def product_entry(self, a, b, tr, bias, i, j) -> list[str]:
        o, s = self.out, self.s
        bij = (lambda k: (j, k)) if tr else (lambda k: (k, j))
        lhs = self.entry_label(i, j)
        if self.mode == "symbolic":
            return self.fit(lhs, [self.symbolic_sum(i, j)], align=True, lhs_width=self.lw)
        inner = a.shape[1]
        names = self.sum_seq(inner, lambda k: o.juxt(self.ename(a, i, k), self.ename(b, *bij(k))))
        nums = self.sum_seq(inner, lambda k: o.mul(o.entry(a.value, i, k) if k == 0 and not o.plain else o.factor(a.value, i, k),
                                                     o.factor(b.value, *bij(k))))
        if bias is not None:
            names = Seq(names.items + ("+ " + self.ename(bias, 0, j),), " ")
            nums = Seq(nums.items + ("+ " + o.factor(bias.value, 0, j),), " ")
        return self.fit(lhs, [names, nums] + self.entry_result(s.value, i, j), align=True, lhs_width=self.lw)

    def entry_result(self, value, i, j) -> list:
        """The result of entry (i, j); numeric results of one step share one decimal layout."""
        o = self.out
        if isinstance(value, np.ndarray):
            if not hasattr(self, "_decimals"):
                self._decimals = decimals_needed([float(x) for x in value.ravel()[:4096]], o.precision)
            STATS["entries"] += 1
            return [o.fixed(float(value[i, j]), self._decimals, pad=False)]
        result = o.entry(value, i, j)
        sides: list = [result]
        if self.mode == "exact":
            approx = o.approx_entry(value, i, j)
            if approx is not None and approx != result:
                sides.append(("\\approx" if not o.plain else "~", approx))
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
        rhs = vm["formula"].partition(" = ")[2]
        sides: list = [rhs, o.frac(self.mname(src), factor) if not o.plain else f"{self.mname(src)} / {factor}"]
        if self.mode == "symbolic":
            vm["main"] = [block(self.fit(lhs, sides + [o.matrix(s.value, s.shape, self.budget(lhs))]))]
        else:
            vm["main"] = [block(self.fit(lhs, sides + self.result_side(s.value, self.budget(lhs))))]
        rows = rows_to_expand(self.rows_opt, s.shape[0], 1)
        vm["entry_rows"] = rows
        chains = []
        for i in rows:
            for j in pick(s.shape[1], o.max_size):
                if j is None:
                    continue
                if self.mode == "symbolic":
                    chains.append(self.fit(self.entry_label(i, j), [self.symbolic_sum(i, j)], align=True, lhs_width=self.lw))
                    continue
                names = o.frac(self.ename(src, i, j), factor)
                nums = o.frac(o.entry(src.value, i, j), factor)
                chains.append(self.fit(self.ename(self.ref, i, j), [names, nums] + self.entry_result(s.value, i, j), align=True,
                                       lhs_width=self.lw))
        vm["entries"] = self.blocks_of(chains)

    # -- mask -------------------------------------------------------------------------
    def build_masked(self, vm) -> None:
        s, o = self.s, self.out
        vm["extra"]["kind"] = s.details.get("kind", "matrix")
        keep = s.details.get("keep")
        vm["extra"]["masked_count"] = int((~np.asarray(keep, dtype=bool)).sum()) if keep is not None else 0
        vm["formula_block"] = self.fit_formula(vm["formula"]) if not o.plain else [vm["formula"]]
        blocks = []
        if keep is not None:
            letter = o.head_name("M", s.head)
            mlhs = o.named(letter, s.shape)
            blocks.append(self.fit(mlhs, [o.matrix_of(s.shape[0], s.shape[1], lambda i, j: "1" if keep[i, j] else "0", self.budget(mlhs))]))
        lhs = self.named(self.ref)
        blocks.append(self.fit(lhs, [o.matrix(s.value, s.shape, self.budget(lhs))]))
        vm["main"] = [block(b) for b in pack(blocks, o)]

    # -- softmax ------------------------------------------------------------------------
    def build_weights(self, vm) -> None:
        s, o = self.s, self.out
        src = resolve(self.t, s.inputs[0], s.head)
        vm["formula_block"] = self.fit_formula(vm["formula"]) if not o.plain else [vm["formula"]]
        lhs = self.named(self.ref)
        if self.mode == "numeric":
            matrix = o.numeric_matrix(s.value, s.shape, self.budget(lhs), self.weight_log10)
            vm["main"] = [block(self.fit(lhs, [matrix]))]
        else:
            vm["main"] = [block(self.fit(lhs, self.result_side(s.value, self.budget(lhs))))]
        rows = rows_to_expand(self.rows_opt, s.shape[0], 4)
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

    def symbolic_softmax_row(self, src: Ref, i: int) -> list[str]:
        """sum_k e^{t_ik} = e^{t_i1} + ... (broken to fit), then a_ij = e^{t_ij} / sum_k e^{t_ik}."""
        s, o = self.s, self.out
        import sympy

        cols = pick(s.shape[1], o.max_size)
        kept = [j is None or src.value[i, j] != -sympy.oo for j in cols]
        first = next(j for j in range(s.shape[1]) if src.value[i, j] != -sympy.oo)
        base = o.entry(src.value, i, first).rsplit("_", 1)[0]
        wide = max(src.shape) >= 10
        sub = f"{i + 1},k" if wide else f"{i + 1}k"
        if o.plain:
            sigma = f"sum_k e^({plain_name(base)}_{sub.replace(',', '')})"
        else:
            sigma = f"\\textstyle\\sum_{{k}} e^{{{base}_{{{sub}}}}}"
        terms = [o.ellipsis_term() if j is None else o.exp(o.expr(src.value[i, j])) for j, k in zip(cols, kept) if k]
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
        plain = o.plain
        e = self.ename(src, i, 0).rsplit("_", 1)[0] if not plain else None
        h = "" if s.head is None else (f"^{{({s.head})}}" if not plain else f"({s.head})")
        m = f"m_{{{i + 1}}}" if not plain else f"m_{i + 1}"
        tij = (f"{e}_{{{i + 1}j}}" if not plain else plain_name(self.ename(src, i, 0)).rsplit("_", 1)[0] + f"_{i + 1}j")
        tik = tij.replace("j}", "k}") if not plain else tij[:-1] + "k"
        aij = (f"a{h}_{{{i + 1}j}}" if not plain else f"a{h}_{i + 1}j")
        if self.mode == "numeric":
            t_row = np.asarray(src.value[i], dtype=float)
            shifted = d.get("shifted")
            shifted_row = np.asarray(shifted[i], dtype=float) if shifted is not None else t_row - float(d["row_max"][i])
            exp_row = np.asarray(d["exp"][i], dtype=float)
            vec = lambda xs, lg=None: self.vector([None if j is None else float(xs[j]) for j in cols],  # noqa: E731
                                                  None if lg is None else [None if j is None else lg(i, j) for j in cols])
            m_val = o.vector([float(d["row_max"][i])])[0]
            several = np.isfinite(self.shifted(i)).sum() > 1  # then the sum is 1 + something, never exactly 1
            total = o.vector([float(d["row_sum"][i])], [0.0] if several else None)[0]
            shifted_v = vec(shifted_row)
            exp_v = vec(exp_row, self.exp_log10)
            weights_v = vec(np.asarray(s.value[i], dtype=float), self.weight_log10)
            weights_side: list = [weights_v]
        else:  # exact
            shifted = d.get("shifted")
            row_max = d.get("row_max")
            m_val = o.expr(row_max[i]) if row_max is not None and row_max[i] is not None else None  # None: symbols, no order
            ent = lambda mat: self.vector_tex([None if j is None else o.entry(mat, i, j) for j in cols])  # noqa: E731
            shifted_v = ent(shifted) if shifted is not None else None
            exp_v = ent(d["exp"])
            total = o.expr(d["row_sum"][i])
            weights_v = ent(s.value)
            approx = [None if j is None else o.approx_entry(s.value, i, j) for j in cols]
            weights_side = [weights_v]
            if all(a is not None for a, j in zip(approx, cols) if j is not None):  # no approximation of symbols
                dots = o.dots(0, None)
                weights_side.append(("\\approx" if not plain else "~", self.vector_tex([dots if a is None else a for a in approx])))
        maxf = (f"\\max_{{j}} {tij}" if not plain else f"max_j {tij}")
        shift = f"{tij} - {m}" if m_val is not None else tij
        expo = o.exp(shift)
        sumf = (f"\\textstyle\\sum_{{k}} {o.exp(tik + (' - ' + m if m_val is not None else ''))}" if not plain
                else f"sum_k e^({tik}{' - ' + m if m_val is not None else ''})")
        rows = []
        if m_val is not None:
            rows.append((m, [maxf, m_val]))
            if shifted_v is not None:
                rows.append((shift, [shifted_v]))
        rows += [(expo, [exp_v]), (sumf, [total]), (aij, [o.frac(expo, sumf)] + weights_side)]
        lw = max(o.measure(lhs) for lhs, _ in rows)  # the block's left column is as wide as its widest left side
        return [line for lhs, sides in rows for line in self.fit(lhs, sides, align=True, lhs_width=lw)]

    def vector(self, xs: list[float | None], true_log10=None):
        return self.vector_tex(self.out.vector(xs, true_log10))

    # The floats of a softmax are not always its true values: e^-5340 underflows to 0 and
    # 1 - e^-5340 rounds to 1. These give log10 of the true value where the float is not
    # exact (None where it is: a masked 0, the 1 of a row with one kept key, e^0 = 1).
    def shifted(self, i: int) -> np.ndarray:
        d = self.s.details
        if "shifted" in d:
            return np.asarray(d["shifted"][i], dtype=float)
        src = resolve(self.t, self.s.inputs[0], self.s.head)
        return np.asarray(src.value[i], dtype=float) - float(d["row_max"][i])

    def exp_log10(self, i: int, j: int) -> float | None:
        x = float(self.shifted(i)[j])
        return None if x == 0 or np.isneginf(x) else x / np.log(10)

    def weight_log10(self, i: int, j: int) -> float | None:
        row = self.shifted(i)
        if np.isneginf(row[j]) or np.isfinite(row).sum() == 1:
            return None
        return float(row[j] - np.log(float(self.s.details["row_sum"][i]))) / np.log(10)

    def vector_tex(self, items: list[str]):
        o = self.out
        if o.plain:
            return o.row(items)
        return Seq(tuple(items), joiner=",\\ ", tail=",", open="(", close=")", open_one="\\left(", close_one="\\right)")

    def saturation(self, rows: list[int], tokens) -> list[dict]:
        s = self.s
        notes = []
        for i in range(s.shape[0]):
            if self.mode != "numeric" and not all(s.value[i, j].is_number for j in range(s.shape[1])):
                continue  # a row with symbols has no weights to compare
            vals = [float(s.value[i, j]) if self.mode == "numeric" else float(s.value[i, j].evalf(17)) for j in range(s.shape[1])]
            j = int(np.argmax(vals))
            if s.shape[1] > 1 and vals[j] >= SATURATED:
                notes.append({"kind": "saturated", "row": i + 1, "col": j + 1, "weight": self.out.num(vals[j]),
                              "rest": self.out.num(1.0 - vals[j]) if vals[j] < 1 else "0",
                              "token": tokens[i] if i < len(tokens) else ""})
        return notes

    # -- concat -------------------------------------------------------------------------
    def build_concat(self, vm) -> None:
        s, o = self.s, self.out
        refs = [resolve(self.t, n, None) for n in s.inputs]
        blocks = s.details.get("blocks", ())
        vm["extra"]["blocks"] = [{"head": h, "first": f, "last": l} for h, f, l in blocks]
        vm["formula_block"] = self.fit_formula(vm["formula"]) if not o.plain else [vm["formula"]]
        lhs = self.named(self.ref)
        heads = pick(len(refs), max(2, o.max_size // 2))
        dots = "\\cdots" if not o.plain else "..."
        layout = [dots if h is None else o.block(self.mname(refs[h]), o.shape(refs[h].shape)) for h in heads]
        main = [self.fit(lhs, [o.brackets(layout)])]
        if s.value is not None:
            if o.plain:
                main.append([o.eq(lhs, o.matrix(s.value, s.shape))])
            else:
                values = self.concat_values(refs, heads, lhs)
                if values:
                    main.append(values)
        vm["main"] = [block(b) for b in main]

    def head_block(self, r: Ref, rows, cols, refs) -> str:
        """One head's block of the concatenation; numbers share one decimal layout across heads."""
        o = self.out
        if not isinstance(r.value, np.ndarray):
            body = [[o.dots(i, j) if i is None or j is None else o.entry(r.value, i, j) for j in cols] for i in rows]
            return o.inner_matrix(body)
        d = decimals_needed([float(x) for ref in refs for x in np.asarray(ref.value).ravel()[:4096]], o.precision)
        body = [[o.dots(i, j) if i is None or j is None else o.fixed(float(r.value[i, j]), d) for j in cols] for i in rows]
        return o.inner_matrix(body, numeric=True)

    def concat_values(self, refs, heads, lhs) -> list[str] | None:
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
                        parts.append("\\cdots")
                        continue
                    r = refs[h]
                    cols = pick(r.shape[1], per)
                    parts.append(o.block(self.head_block(r, rows, cols, refs), self.mname(r)))
                text = o.brackets(parts)
                if o.measure(text) <= self.budget(lhs):
                    return self.fit(lhs, [text])
                if per <= 2:
                    break
                per -= 1
            head_limit -= 1
        return None
