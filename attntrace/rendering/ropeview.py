"""The view of a RoPE step (Q_rope, K_rope): the rule, the angles, the result, pair by pair.

What a textbook shows for rotary embeddings: the frequencies theta_i and the general 2x2
rotation of one pair (which columns pair up is the layout), the positions and the table of
angles p_r theta_i, the rotated matrix, and for the chosen rows each pair turned by its 2x2
rotation, written out with the numbers. By default the rows are row 1 and, when row 1 sits
at position 0 (no rotation at all), the first row that really turns. Text output writes
each rotated entry as a line (x cos - y sin) instead of 2x2 matrices.
"""

from __future__ import annotations

import numpy as np

from attntrace.inputs.expr import accented_with_head
from attntrace.kinds.rope import base_text
from attntrace.model import formula as F

from attntrace.rendering.printing import decimals_needed, pick, reproducing_precision
from attntrace.rendering.stepview import register_view
from attntrace.rendering.viewparts import block, pack, resolve, rows_to_expand


def _rows(sv, positions) -> list[int]:
    n = sv.s.shape[0]
    if sv.rows_opt:
        return rows_to_expand(sv.rows_opt, n, 1)
    rows = [0]
    if positions[0] == 0:
        rows += [r for r in range(1, n) if positions[r] != 0][:1]
    return rows


def _pairs_text(pairs, o) -> str:
    shown = [None if p is None else pairs[p] for p in pick(len(pairs), 4)]
    items = [F.Dots() if p is None else F.Paren(F.Seq((F.Num(p[0] + 1), F.Num(p[1] + 1)))) for p in shown]
    return o.math(F.Seq(tuple(items), sep="wide"))


class _Rotation:
    """The strings of one RoPE step for one output (TeX or plain)."""

    def __init__(self, sv):
        self.sv, self.s, self.o = sv, sv.s, sv.out
        d = self.s.details
        self.pairs, self.positions, self.angles, self.d = d["pairs"], d["positions"], d["angles"], d["d"]
        self.src = resolve(sv.t, self.s.inputs[0], self.s.head)
        self.numeric = isinstance(self.angles, np.ndarray)
        self.factors, self.mu = d.get("factors"), d.get("mu")
        self.scaled = self.mu is not None and self.mu != 1  # YaRN: the rotated pair times mu

    # -- numbers ------------------------------------------------------------------------
    def angle(self, r: int, p: int) -> str:
        a = self.angles[r, p]
        return self.o.num(float(a)) if self.numeric else self.o.expr(a)

    def trig(self, fn: str, r: int, p: int, sign: str = "") -> str:
        """cos(p theta) as the report writes it: \\cos 1 (numeric angle), \\cos(1/100) (exact)."""
        o = self.o
        if self.numeric or o.plain:
            trig = F.Func(fn, (self.angle(r, p),), bare=True)
            return o.math(-trig if sign else trig)
        import sympy as sp

        e = (sp.cos if fn == "cos" else sp.sin)(self.angles[r, p])
        return o.expr(-e if sign else e)  # -sin(0) is 0, not -0

    # -- the rule -------------------------------------------------------------------------
    def rule(self) -> list[dict]:
        sv, o, s = self.sv, self.o, self.s
        head = s.head
        base = F.Num(base_text(s.details["base"]))
        half = self.d // 2
        theta_i, i = F.sym("theta", "i"), F.sym("i")
        ids = (1, 2) if half == 2 else (1,) if half == 1 else (1, F.Dots(), half)
        rule = (F.Parts((theta_i.eq(F.Power(base, F.Frac(-(2 * F.Paren(F.Add((i, F.Neg(F.Num(1))), tight=True))), F.Num(self.d), inline=True))),
                         i.eq(F.Seq(tuple(F.node(x) for x in ids))))) if half > 1
                else F.sym("theta", "1").eq(F.Power(base, F.Num(0)), 1))  # one pair: no formula over i
        theta = o.math(rule)
        ang = ("p_r c_i theta_i", "p_r c_i\\theta_i") if self.factors is not None else ("p_r theta_i", "p_r\\theta_i")
        if o.plain:
            a, b = self.index_tex()
            ph = "" if head is None else f"({head})"
            e, x = f"{s.id[0].lower()}~{ph}", f"{o.math(self.src.matrix).lower()}{ph}"
            mu = "mu " if self.scaled else ""
            rot = (f"{e}_r,{a} = {mu}({x}_r,{a} cos({ang[0]}) - {x}_r,{b} sin({ang[0]})),  "
                   f"{e}_r,{b} = {mu}({x}_r,{a} sin({ang[0]}) + {x}_r,{b} cos({ang[0]}))") if self.scaled else \
                  (f"{e}_r,{a} = {x}_r,{a} cos({ang[0]}) - {x}_r,{b} sin({ang[0]}),  "
                   f"{e}_r,{b} = {x}_r,{a} sin({ang[0]}) + {x}_r,{b} cos({ang[0]})")
            return [block([theta]), *self.scaling_rule(), block([rot])]
        a, b = self.index_tex()
        out_e, in_e = self.sv.ref.base, self.src.base
        vec = lambda e: o.layout([[f"{accented_with_head(e, head)}_{{r,{a}}}"], [f"{accented_with_head(e, head)}_{{r,{b}}}"]])  # noqa: E731
        t = ang[1]
        rot = o.layout([[f"\\cos {t}", f"-\\sin {t}"], [f"\\sin {t}", f"\\cos {t}"]])
        mu = "\\mu " if self.scaled else ""
        lines = sv.fit(vec(out_e), [f"{mu}{rot} {vec(in_e)}"])
        scaling = self.scaling_rule()
        if scaling:
            return [block([theta]), *scaling, block(lines)]
        return [block(b) for b in pack([[theta], lines], o)]  # the frequencies and the rotation on one line when they fit

    def scaling_rule(self) -> list[dict]:
        """RoPE scaling: the rule for c_i, the factors c_i themselves, and YaRN's mu."""
        if self.factors is None:
            return []
        sv, o = self.sv, self.o
        sc = self.s.details["scaling"]
        L, s_ = sc["original_max_position_embeddings"], sc["factor"]
        num = lambda v: o.num(float(v)) if self.numeric else o.expr(v)  # noqa: E731
        if sc["type"] == "llama3":
            lo, hi = sc["low_freq_factor"], sc["high_freq_factor"]
            if o.plain:
                rule = [f"lambda_i = 2 pi / theta_i,  c_i = 1 if lambda_i < {L}/{hi};  c_i = 1/{s_} if lambda_i > {L}/{lo};",
                        f"otherwise c_i = (1 - k_i)/{s_} + k_i,  k_i = ({L}/lambda_i - {lo})/({hi} - {lo})"]
            else:
                rule = [f"c_i = \\begin{{cases}} 1 & \\lambda_i < {L}/{hi} \\\\ 1/{s_} & \\lambda_i > {L}/{lo} \\\\ "
                        f"(1 - \\kappa_i)/{s_} + \\kappa_i & \\text{{otherwise}} \\end{{cases}}",
                        f"\\lambda_i = \\frac{{2\\pi}}{{\\theta_i}}, \\quad \\kappa_i = \\frac{{{L}/\\lambda_i - {lo}}}{{{hi} - {lo}}}"]
        else:
            from attntrace.kinds.ropescaling import yarn_range

            lo, hi = yarn_range(sc, self.s.details["base"], self.d, not self.numeric)
            if o.plain:
                rule = [f"c_i = g_i/{s_} + (1 - g_i),  g_i = clamp((i - 1 - {num(lo)})/({num(hi)} - {num(lo)}), 0, 1)"]
            else:
                rule = [f"c_i = \\frac{{\\gamma_i}}{{{s_}}} + (1 - \\gamma_i), \\quad "
                        f"\\gamma_i = \\min\\left(1, \\max\\left(0, \\frac{{i - 1 - {num(lo)}}}{{{num(hi)} - {num(lo)}}}\\right)\\right)"]
        half = self.d // 2
        shown = pick(half, o.max_size)
        dots = "..." if o.plain else "\\ldots"
        names = ([f"c_{i}" for i in (1, half)] if o.plain else [f"c_{{{i}}}" for i in (1, half)]) if half > 3 else \
            [f"c_{i + 1}" if o.plain else f"c_{{{i + 1}}}" for i in range(half)]
        if half > 3:
            names = [names[0], dots, names[1]]
        vals = [dots if i is None else num(self.factors[i]) for i in shown]
        blocks = [block([r]) for r in rule] + [block(sv.fit(o.row(names), [sv.vector_tex(vals)]))]
        if self.scaled:
            mu = f"mu = 0.1 ln {s_} + 1" if o.plain else f"\\mu = 0.1 \\ln {s_} + 1"
            if sc.get("attention_factor") is not None or (sc.get("mscale") and sc.get("mscale_all_dim")):
                mu = "mu" if o.plain else "\\mu"
            blocks.append(block(sv.fit(mu, [num(self.mu)])))
        return blocks

    def index_tex(self) -> tuple[str, str]:
        if self.s.details["layout"] == "interleaved":
            return "2i-1", "2i"
        return "i", f"i+{self.d // 2}"

    # -- the values: theta_i, positions, angles ------------------------------------------
    def values(self) -> list[dict]:
        sv, o = self.sv, self.o
        half = self.d // 2
        if self.numeric:
            thetas = [float(self.angles_theta(i)) for i in range(half)]
        shown = pick(half, o.max_size)
        if self.numeric:
            dec = decimals_needed([t for t in thetas], o.precision)
            cell = lambda i: o.fixed(thetas[i], dec, pad=False)  # noqa: E731
        else:
            cell = lambda i: o.expr(self.angles_theta(i))  # noqa: E731
        dots = o.math(F.Dots())
        theta = lambda i: o.math(F.sym("theta").at(i))  # noqa: E731
        if self.factors is not None:  # scaled: the frequencies the angles use are c_i theta_i
            theta = lambda i: o.math(F.sym("c").at(i) * F.sym("theta").at(i))  # noqa: E731
        names = [theta(1), dots, theta(half)] if half > 3 else [theta(i + 1) for i in range(half)]
        vals = [dots if i is None else cell(i) for i in shown]
        # a Seq: breaks after a comma when long; one pair's theta_1 = 1 is in the rule already
        chains = [sv.fit(o.row(names), [sv.vector_tex(vals)])] if half > 1 else []
        pos = [dots if r is None else str(self.positions[r]) for r in pick(len(self.positions), o.max_size)]
        chains.append(sv.fit("p", [sv.vector_tex(pos)]))
        lhs = o.math(F.Hcat((F.sym("p", "r") * F.sym("theta", "i"),)))
        if self.factors is not None:
            lhs = o.math(F.Hcat((F.sym("p", "r") * F.sym("c", "i") * F.sym("theta", "i"),)))
        if self.angles is not None:
            chains.append(sv.fit(lhs, [o.matrix(self.angles, self.angles.shape, sv.budget(lhs))]))
        return [block(c) for c in pack(chains, o)]

    def angles_theta(self, i: int):
        """theta_{i+1} from the angle table: the angle of position 1, or angle / position."""
        rows = [r for r, m in enumerate(self.positions) if m != 0]
        if self.numeric:
            base = float(self.s.details["base"])
            c = 1.0 if self.factors is None else float(self.factors[i])
            return c / base ** (2 * i / self.d)
        import sympy as sp

        if rows:
            r = rows[0]
            return sp.simplify(self.angles[r, i] / self.positions[r])
        b = self.s.details["base"]
        b = sp.Rational(str(b)) if isinstance(b, float) else sp.sympify(b)
        return (1 if self.factors is None else self.factors[i]) * b ** sp.Rational(-2 * i, self.d)

    # -- pair by pair -------------------------------------------------------------------------
    def pair_chain(self, r: int, p: int) -> list[str]:
        sv, o, s = self.sv, self.o, self.s
        j, k = self.pairs[p]
        if o.plain:
            return self.plain_pair(r, p)[0]
        col = lambda a, b: o.layout([[a], [b]])  # noqa: E731
        lhs = col(sv.entry_label(r, j), sv.entry_label(r, k))
        rot = o.layout([[self.trig("cos", r, p), self.trig("sin", r, p, "-")], [self.trig("sin", r, p), self.trig("cos", r, p)]])
        if self.scaled:  # YaRN: mu times the rotation
            rot = f"{self.mu_text()}\\, {rot}"
        sides: list = [f"{rot} {col(sv.ename(self.src, r, j), sv.ename(self.src, r, k))}"]
        if sv.mode == "symbolic":
            e = sv.expressions()
            sides.append(col(o.expr(e[r, j]), o.expr(e[r, k])))
            return sv.fit(lhs, sides, align=True)
        if self.numeric:
            phi = float(self.angles[r, p])
            c, sn = float(np.cos(phi)), float(np.sin(phi))
            x, y = float(self.src.value[r, j]), float(self.src.value[r, k])
            res = (float(s.value[r, j]), float(s.value[r, k]))
            dec = decimals_needed([c, sn, x, y, *res], o.precision)
            f = lambda v: o.fixed(v, dec, pad=False)  # noqa: E731
            mu = float(self.mu) if self.scaled else 1.0
            p = _operand_decimals(dec, c, sn, x, y, f(res[0] / mu), f(res[1] / mu))
            g = lambda v: o.fixed(v, p, pad=False)  # noqa: E731
            nums = o.layout_numeric([[g(c), g(-sn)], [g(sn), g(c)]], p)
            if self.scaled:
                nums = f"{self.mu_text()}\\, {nums}"
            sides.append(f"{nums} {o.layout_numeric([[g(x)], [g(y)]], p)}")
            sides.append(o.layout_numeric([[f(res[0])], [f(res[1])]], dec))
            return sv.fit(lhs, sides, align=True)
        sides.append(f"{rot} {col(o.entry(self.src.value, r, j), o.entry(self.src.value, r, k))}")
        exact = col(o.entry(s.value, r, j), o.entry(s.value, r, k))
        sides.append(exact)
        a1, a2 = o.approx_entry(s.value, r, j), o.approx_entry(s.value, r, k)
        if a1 is not None and a2 is not None and (a1, a2) != (o.entry(s.value, r, j), o.entry(s.value, r, k)):
            sides.append(("\\approx", col(a1, a2)))
        if o.measure(exact) > o.limit - o.measure(lhs) - 3.0:
            sides.remove(exact)
        return sv.fit(lhs, sides, align=True)

    def mu_text(self) -> str:
        """YaRN's mu as a pair's line multiplies by it: its value in numeric mode, else its exact form."""
        o = self.o
        return o.num(float(self.mu)) if self.numeric else o.expr(self.mu)

    def plain_pair(self, r: int, p: int) -> list[list[str]]:
        """Text output: the pair's two entries, each as one line (x cos - y sin = numbers = value)."""
        sv, o, s = self.sv, self.o, self.s
        j, k = self.pairs[p]
        xj, xk = sv.ename(self.src, r, j), sv.ename(self.src, r, k)
        c, sn = self.trig("cos", r, p), self.trig("sin", r, p)
        nums = {}
        if self.numeric:
            phi = float(self.angles[r, p])
            vals = [float(np.cos(phi)), float(np.sin(phi)), float(self.src.value[r, j]), float(self.src.value[r, k])]
            dec = decimals_needed(vals + [float(s.value[r, j]), float(s.value[r, k])], o.precision)
            res = {j: o.fixed(float(s.value[r, j]), dec, pad=False), k: o.fixed(float(s.value[r, k]), dec, pad=False)}
            p = _operand_decimals(dec, vals[0], vals[1], vals[2], vals[3], res[j], res[k])
            fc, fs, fx, fy = (o.fixed(v, p, pad=False) for v in vals)
            par = lambda t: o.paren(t) if t.startswith("-") else t  # noqa: E731
            nums = {j: f"{par(fx)}*{fc} - {par(fy)}*{fs}", k: f"{par(fx)}*{fs} + {par(fy)}*{fc}"}
        lines = []
        pairs = ((j, f"{xj} {c} - {xk} {sn}"), (k, f"{xj} {sn} + {xk} {c}"))
        if self.scaled:  # YaRN: mu times the rotated pair
            mu = self.mu_text()
            pairs = tuple((col, f"{mu} ({t})") for col, t in pairs)
            nums = {col: f"{mu}*({t})" for col, t in nums.items()}
        for col, names in pairs:
            if sv.mode == "symbolic":
                lines.append(o.eq(sv.entry_label(r, col), o.expr(sv.expressions()[r, col])))
            elif self.numeric:
                lines.append(o.eq(sv.entry_label(r, col), names, nums[col], res[col]))
            else:
                value, approx = o.entry(s.value, r, col), o.approx_entry(s.value, r, col)
                line = o.eq(sv.entry_label(r, col), names, value)
                lines.append(line if approx is None or approx == value else o.approx(line, approx))
        return [lines]


def _operand_decimals(dec: int, c: float, sn: float, x: float, y: float, res_j: str, res_k: str) -> int:
    """Decimals for cos, sin and the pair so that x cos - y sin and x sin + y cos, computed from the
    printed numbers, give the printed results (cos 0.01 = 0.99995 must not print as 1.0000)."""
    return max(reproducing_precision(dec, [(x, c), (-y, sn)], res_j), reproducing_precision(dec, [(x, sn), (y, c)], res_k))


@register_view("rotation")
def build_rotation(sv, vm) -> None:
    s, o = sv.s, sv.out
    rot = _Rotation(sv)
    d = s.details
    vm["extra"].update({"layout": d["layout"], "which": s.id[0], "pairs": _pairs_text(d["pairs"], o),
                        "half": str(rot.d // 2), "d": str(rot.d), "source": sv.mname(rot.src)})
    sc = d.get("scaling")
    vm["extra"]["scaling"] = None
    if sc is not None:
        vm["extra"]["scaling"] = {"type": sc["type"], "factor": str(sc["factor"]), "context": str(sc["original_max_position_embeddings"]),
                                  "mu": rot.scaled}
    vm["extra"]["rule"] = rot.rule()
    vm["extra"]["angle_blocks"] = rot.values()
    lhs = sv.named(sv.ref)
    budget = sv.budget(lhs)
    if sv.mode == "symbolic":
        full = o.matrix(sv.expressions(), s.shape)
        if o.plain or o.measure(full) <= budget:
            vm["main"] = [block(sv.fit(lhs, [full]))]
        else:
            vm["main"] = [block(sv.fit(lhs, [o.matrix_of(s.shape[0], s.shape[1], sv.entry_label, budget)]))]
    else:
        vm["main"] = [block(sv.fit(lhs, sv.result_side(s.value, budget)))]
    rows = _rows(sv, d["positions"])
    vm["entry_rows"] = rows
    vm["extra"]["entry_positions"] = [str(d["positions"][r]) for r in rows]
    chains = [rot.pair_chain(r, p) for r in rows for p in pick(len(d["pairs"]), max(2, o.max_size // 2)) if p is not None]
    vm["entries"] = sv.blocks_of(chains)
