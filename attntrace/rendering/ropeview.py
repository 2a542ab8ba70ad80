"""The view of a RoPE step (Q_rope, K_rope): the rule, the angles, the result, pair by pair.

What a textbook shows for rotary embeddings: the frequencies theta_r and the general 2x2
rotation of one pair (which columns pair up is the layout), the positions and the table of
angles p_i theta_r, the rotated matrix, and for the chosen rows each pair turned by its 2x2
rotation, written out with the numbers. By default the rows are row 1 and, when row 1 sits
at position 0 (no rotation at all), the first row that really turns. Text output writes
each rotated entry as a line (x cos - y sin) instead of 2x2 matrices.

The pair index is r and the row index i, as in every other step (q_{ij}): RoFormer writes
theta_i for pair i, but here i is the row, and the complex form of a pair turns by e^{i p theta}
with i the imaginary unit.
"""

from __future__ import annotations

import numpy as np

from attntrace.kinds.rope import base_text
from attntrace.model import formula as F

from attntrace.rendering.printing import decimals_needed, pick, reproducing_digits, reproducing_precision
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
        self._mu_digits: int | None = None

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
        base = F.Num(base_text(s.details["base"]))
        half = self.d // 2
        theta_i, i = F.sym("theta", "r"), F.sym("r")
        ids = (1, 2) if half == 2 else (1,) if half == 1 else (1, F.Dots(), half)
        rule = (F.Parts((theta_i.eq(F.Power(base, F.Frac(-(2 * F.Paren(F.Add((i, F.Neg(F.Num(1))), tight=True))), F.Num(self.d), inline=True))),
                         i.eq(F.Seq(tuple(F.node(x) for x in ids))))) if half > 1
                else F.sym("theta", "1").eq(F.Power(base, F.Num(0)), 1))  # one pair: no formula over r
        theta = o.math(rule)
        c_i = (F.sym("c", "r"),) if self.factors is not None else ()
        angle = F.Juxt((F.sym("p", "i"), *c_i, theta_i))
        cos, sin = (F.Func(fn, (angle,), bare=True) for fn in ("cos", "sin"))
        a, b = self.index()
        out_e, in_e = sv.ref.symbol, self.src.symbol
        mu = F.sym("mu")
        at = lambda e, c: F.Index(e, (F.sym("i"), c), comma=True)  # noqa: E731  (q_{i,r} beside q_{i,r+2}: both with a comma)
        if o.plain:  # each rotated entry as a line: y_a = x_a cos - x_b sin, y_b = x_a sin + x_b cos
            x_a, x_b = (at(in_e, i) for i in (a, b))
            turned = (x_a * cos - x_b * sin, x_a * sin + x_b * cos)
            if self.scaled:
                turned = tuple(mu * F.Paren(t) for t in turned)
            rot = F.Parts(tuple(at(out_e, i).eq(t) for i, t in zip((a, b), turned)))
            return [block([theta]), *self.scaling_rule(), block([o.math(rot)])]
        vec = lambda e: o.layout([[o.math(at(e, a))], [o.math(at(e, b))]])  # noqa: E731
        rot = o.layout([[o.math(cos), o.math(-sin)], [o.math(sin), o.math(cos)]])
        if self.scaled:
            rot = f"{o.math(mu)} {rot}"
        lines = sv.fit(vec(out_e), [f"{rot} {vec(in_e)}"])
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
        c_i, s_f, i = F.sym("c", "r"), F.Num(s_), F.sym("r")
        slash = lambda a, b: F.Frac(F.node(a), F.node(b), small=True, inline=True)  # noqa: E731  (L/4, 1/s: a slash)
        if sc["type"] == "llama3":
            lo, hi = F.Num(sc["low_freq_factor"]), F.Num(sc["high_freq_factor"])
            lam, kappa, theta = F.sym("lambda", "r"), F.sym("kappa", "r"), F.sym("theta", "r")
            rule = [c_i.eq(F.Cases(((F.Num(1), F.Rel((lam, slash(L, hi)), ("lt",))),
                                    (slash(1, s_f), F.Rel((lam, slash(L, lo)), ("gt",))),
                                    (slash(F.Paren(1 - kappa), s_f) + kappa, F.Rel((slash(L, hi), lam, slash(L, lo)), ("le", "le")))))),
                    F.Parts((lam.eq(F.Frac(F.Juxt((F.Num(2), F.sym("pi"))), theta)),
                             kappa.eq(F.Frac(slash(L, lam) - lo, hi - lo))))]
        else:
            from attntrace.kinds.ropescaling import YARN_RAMP, yarn_range

            lo, hi = yarn_range(sc, self.s.details["base"], self.d, not self.numeric)
            starts_at_0, one_wide = bool(lo == 0), bool(hi - lo == 1)
            gamma, lo, hi = YARN_RAMP, F.Num(num(lo)), F.Num(num(hi))  # the ramp's ends, printed for this output
            rise = i - 1 if starts_at_0 else i - 1 - lo  # not (i - 1 - 0) / (2 - 0)
            ramp = rise if one_wide else F.Frac(rise, hi if starts_at_0 else hi - lo)  # nor (r - 1) / 1
            clamp = F.Func("min", (F.Num(1), F.Func("max", (F.Num(0), ramp), sized=True)), sized=True)
            rule = [F.Parts((c_i.eq(F.Frac(gamma, s_f) + F.Paren(1 - gamma)), gamma.eq(clamp)))]
        half = self.d // 2
        shown = pick(half, o.max_size)
        dots = o.math(F.Dots())
        names = [o.math(F.sym("c").at(i)) for i in ((1, half) if half > 3 else range(1, half + 1))]
        if half > 3:
            names = [names[0], dots, names[1]]
        vals = [dots if i is None else num(self.factors[i]) for i in shown]
        blocks = [block([o.math(r)]) for r in rule] + [block(sv.fit(o.row(names), [sv.vector_tex(vals)]))]
        if self.scaled:
            mu = F.sym("mu")
            given = sc.get("attention_factor") is not None or (sc.get("mscale") and sc.get("mscale_all_dim"))
            rule = mu if given else mu.eq(F.Juxt((F.Num(0.1), F.Func("ln", (s_f,), bare=True))) + 1)
            # exact: 0.1 ln s + 1 is the exact value already; its SymPy form (1 + log(4)/10) only says it again
            if self.numeric:
                blocks.append(block(sv.fit(o.math(rule), [self.mu_number()])))
            elif given:
                blocks.append(block(sv.fit(o.math(rule), [num(self.mu)])))
            else:
                blocks.append(block([o.approx(o.math(rule), o.num(float(self.mu)))]))
        return blocks

    def index(self) -> tuple[F.Node, F.Node]:
        """The columns of pair r: 2r-1 and 2r (interleaved), or r and r + d/2 (halves)."""
        i = F.sym("r")
        if self.s.details["layout"] == "interleaved":
            two_i = F.Juxt((F.Num(2), i), tight=True)
            return F.Add((two_i, F.Neg(F.Num(1))), tight=True), two_i
        return i, F.Add((i, F.Num(self.d // 2)), tight=True)

    # -- the values: theta_i, positions, angles ------------------------------------------
    def values(self) -> list[dict]:
        sv, o = self.sv, self.o
        half = self.d // 2
        if self.numeric:
            thetas = [float(self.angles_theta(i)) for i in range(half)]
        shown = pick(half, o.max_size)
        if self.numeric:
            dec = decimals_needed([t for t in thetas], o.precision)
            if self.factors is not None:  # c_3 theta_3 = 0.000539, not 0.0005: 3 significant digits, so p c_i theta_i reads right
                dec = max(dec, min(8, max(2 - int(np.floor(np.log10(t))) for t in thetas if t > 0)))
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
        lhs = o.math(F.Hcat((F.sym("p", "i") * F.sym("theta", "r"),)))
        if self.factors is not None:
            lhs = o.math(F.Hcat((F.sym("p", "i") * F.sym("c", "r") * F.sym("theta", "r"),)))
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
            rot = o.math(F.Juxt((self.mu_text(), F.Space(), rot)))
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
            p = _operand_decimals(dec, c, sn, x, y, f(res[0]), f(res[1]), self.mu_printed())
            g = lambda v: o.fixed(v, p, pad=False)  # noqa: E731
            nums = o.layout_numeric([[g(c), g(-sn)], [g(sn), g(c)]], p)
            if self.scaled:
                nums = o.math(F.Juxt((self.mu_number(), F.Space(), nums)))
            sides.append(f"{nums} {o.layout_numeric([[g(x)], [g(y)]], p)}")
            sides.append(o.layout_numeric([[f(res[0])], [f(res[1])]], dec))
            return sv.fit(lhs, sides, align=True)
        sides.append(f"{rot} {col(o.entry(self.src.value, r, j), o.entry(self.src.value, r, k))}")
        exact = col(o.entry(s.value, r, j), o.entry(s.value, r, k))
        sides.append(exact)
        a1, a2 = o.approx_entry(s.value, r, j), o.approx_entry(s.value, r, k)
        if a1 is not None and a2 is not None and (a1, a2) != (o.entry(s.value, r, j), o.entry(s.value, r, k)):
            sides.append((o.rel("approx"), col(a1, a2)))
        if o.measure(exact) > o.limit - o.measure(lhs) - 3.0:
            sides.remove(exact)
        return sv.fit(lhs, sides, align=True)

    def mu_digits(self) -> int:
        """The decimals YaRN's mu is printed with, in its definition and in every pair's line: the most
        any pair's line needs to reproduce its result (mu 1.1386 above and 1.13863 in a line, for one
        number, made a reader wonder which one the line used)."""
        if self._mu_digits is None:
            o, s, digits = self.o, self.s, [self.o.precision]
            for r in _rows(self.sv, self.positions):
                for p in self.shown_pairs():
                    j, k = self.pairs[p]
                    phi = float(self.angles[r, p])
                    vals = [float(np.cos(phi)), float(np.sin(phi)), float(self.src.value[r, j]), float(self.src.value[r, k])]
                    res = [float(s.value[r, j]), float(s.value[r, k])]
                    dec = decimals_needed(vals + res, o.precision)
                    c, sn, x, y = vals
                    rj, rk = (o.fixed(v, dec, pad=False) for v in res)
                    mu = float(self.mu)  # rounded with the operands, at each trial's digits
                    digits += [reproducing_precision(dec, [(mu, x, c), (mu, -y, sn)], rj),
                               reproducing_precision(dec, [(mu, x, sn), (mu, y, c)], rk)]
            self._mu_digits = max(digits)
        return self._mu_digits

    def shown_pairs(self) -> list[int]:
        """The pairs written out pair by pair (all, or the first and last few with dots between)."""
        return [p for p in pick(len(self.pairs), max(2, self.o.max_size // 2)) if p is not None]

    def mu_number(self) -> str:
        """YaRN's mu as printed in numeric mode (at `mu_digits`)."""
        return self.o.fixed(float(self.mu), self.mu_digits(), pad=False)

    def mu_printed(self) -> float:
        """The value a reader computes with: mu as printed, 1 without YaRN."""
        return float(self.mu_number()) if self.scaled else 1.0

    def mu_text(self) -> str:
        """YaRN's mu in a pair's rotation, written as the symbol: its value is printed once above (and
        in numeric mode again among the numbers substituted, at their digits)."""
        return self.o.math(F.sym("mu"))

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
            p = _operand_decimals(dec, vals[0], vals[1], vals[2], vals[3], res[j], res[k], self.mu_printed())
            fc, fs, fx, fy = (o.fixed(v, p, pad=False) for v in vals)
            par = lambda t: o.paren(t) if t.startswith("-") else t  # noqa: E731
            nums = {j: f"{par(fx)}*{par(fc)} - {par(fy)}*{par(fs)}", k: f"{par(fx)}*{par(fs)} + {par(fy)}*{par(fc)}"}
        lines = []
        pairs = ((j, f"{xj} {c} - {xk} {sn}"), (k, f"{xj} {sn} + {xk} {c}"))
        if self.scaled:  # YaRN: mu times the rotated pair
            mu = self.mu_text()
            pairs = tuple((col, f"{mu} ({t})") for col, t in pairs)
            if self.numeric:
                nums = {col: f"{self.mu_number()}*({t})" for col, t in nums.items()}
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


def _yarn_ramp(sc: dict, base, d: int) -> dict:
    """YaRN's ramp for the prose: the pair indices (0-based) where a pair makes beta_fast and beta_slow
    turns in the trained context, before and after rounding outward and keeping them within 0..d-1."""
    from attntrace.kinds.ropescaling import yarn_range

    raw = yarn_range({**sc, "truncate": False}, float(base), d)
    lo, hi = yarn_range(sc, float(base), d)
    fmt = lambda v: f"{v:.2f}" if v != int(v) else str(int(v))  # noqa: E731
    return {"beta_fast": str(sc["beta_fast"]), "beta_slow": str(sc["beta_slow"]), "lo_raw": fmt(raw[0]), "hi_raw": fmt(raw[1]),
            "lo": fmt(lo), "hi": fmt(hi), "truncate": bool(sc["truncate"])}


def _operand_decimals(dec: int, c: float, sn: float, x: float, y: float, res_j: str, res_k: str, mu: float = 1.0) -> int:
    """Decimals for cos, sin and the pair so that x cos - y sin and x sin + y cos, computed from the
    printed numbers, give the printed results (cos 0.01 = 0.99995 must not print as 1.0000).
    YaRN: mu (x cos - y sin), mu as printed (already rounded)."""
    if mu != 1.0:
        return max(reproducing_digits(dec, [x, c, y, sn], lambda v: mu * (v[0] * v[1] - v[2] * v[3]), res_j),
                   reproducing_digits(dec, [x, sn, y, c], lambda v: mu * (v[0] * v[1] + v[2] * v[3]), res_k))
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
        c = [float(v) for v in d["factors"]]
        s_ = float(sc["factor"])
        counts = {"fast": sum(v == 1 for v in c), "slow": sum(abs(v - 1 / s_) < 1e-12 for v in c)}
        vm["extra"]["scaling"] = {"type": sc["type"], "factor": str(sc["factor"]), "context": str(sc["original_max_position_embeddings"]),
                                  "mu": rot.scaled, **counts, "between": len(c) - counts["fast"] - counts["slow"],
                                  "ramp": _yarn_ramp(sc, d["base"], rot.d) if sc["type"] == "yarn" else None}
    vm["extra"]["rule"] = rot.rule()
    vm["extra"]["angle_blocks"] = rot.values()
    lhs = sv.named(sv.ref)
    budget = sv.budget(lhs)
    if sv.mode == "symbolic":
        full = o.whole_matrix(sv.expressions(), s.shape, budget)
        if full is not None:
            vm["main"] = [block(sv.fit(lhs, [full]))]
        else:
            vm["main"] = [block(sv.fit(lhs, [o.matrix_of(s.shape[0], s.shape[1], sv.entry_label, budget)]))]
    else:
        vm["main"] = [block(sv.fit(lhs, sv.result_side(s.value, budget)))]
    rows = _rows(sv, d["positions"])
    vm["entry_rows"] = rows
    vm["extra"]["entry_positions"] = [str(d["positions"][r]) for r in rows]
    chains = [rot.pair_chain(r, p) for r in rows for p in rot.shown_pairs()]
    vm["entries"] = sv.blocks_of(chains)
