"""Trace -> view model: plain dicts of ready strings that the templates lay out.

No prose here (it lives in templates/prose/) and no arithmetic in the templates: every number
a template shows is formatted here, by `attntrace.printing`, and only for entries that are
shown. User text (title, description, tokens) is escaped for the output format here, so a
template never sees raw user text.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .printing import PlainOut, TexOut, entry_name, pick, plain_formula, plain_name

#: Entry names of each step's matrix (numeric/exact modes name entries only in the expansions).
STEP_BASE = {"Q": "q", "K": "k", "V": "v", "scores": "s", "scaled": "t", "masked": "t", "weights": "a", "Z": "z", "concat": "z", "output": "o"}
#: Matrix letters of the steps.
STEP_LETTER = {"Q": "Q", "K": "K", "V": "V", "scores": "S", "scaled": "T", "masked": "T", "weights": "A", "Z": "Z", "concat": "Z", "output": "O"}
OPERAND_BASE = {"X": "x", "X_kv": "y", "W_Q": "w^{Q}", "W_K": "w^{K}", "W_V": "w^{V}", "W_O": "w^{O}", "b_Q": "b^{Q}", "b_K": "b^{K}",
                "b_V": "b^{V}", "b_O": "b^{O}", "Q": "q", "K": "k", "V": "v", "scores": "s", "weights": "a", "Z": "z"}
OPERAND_LETTER = {"X": "X", "X_kv": "X_{kv}", "W_Q": "W_Q", "W_K": "W_K", "W_V": "W_V", "W_O": "W_O", "b_Q": "b_Q", "b_K": "b_K",
                  "b_V": "b_V", "b_O": "b_O", "Q": "Q", "K": "K", "V": "V", "scores": "S", "weights": "A", "Z": "Z"}
OPERAND_PLAIN = {"X_kv": "X_kv"}
PRODUCTS = {"Q", "K", "V", "scores", "Z", "output"}


# ----------------------------------------------------------------------------- escaping

_TEX_ESCAPES = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#", "^": r"\textasciicircum{}",
                "_": r"\_", "%": r"\%", "~": r"\textasciitilde{}", "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
                # math signs people type in titles, which the text fonts (Latin Modern, Fandol) lack
                "≈": r"\ensuremath{\approx}", "√": r"\ensuremath{\surd}", "→": r"\ensuremath{\to}", "∞": r"\ensuremath{\infty}",
                "±": r"\ensuremath{\pm}", "≤": r"\ensuremath{\le}", "≥": r"\ensuremath{\ge}", "×": r"\ensuremath{\times}",
                "·": r"\ensuremath{\cdot}", "−": r"\ensuremath{-}", "²": r"\ensuremath{^2}", "³": r"\ensuremath{^3}"}
# Only what can start markup is escaped, so the Markdown source stays readable: emphasis,
# code, links, tables, math ($) and HTML. Parentheses stay as they are: "\\(" opens inline
# math in MathJax/KaTeX-flavoured Markdown.
_MD_SPECIAL = set("\\`*_[]$|~")
_MD_LINE_START = re.compile(r"^(\s*)([#>+-]|\d+[.)])")
_MD_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def escape_tex(text: str) -> str:
    text = re.sub(r"\s+", " ", str(text))
    return "".join(_TEX_ESCAPES.get(c, c) for c in text)


def escape_md(text: str) -> str:
    text = re.sub(r"\s+", " ", str(text))
    text = "".join(_MD_HTML[c] if c in _MD_HTML else ("\\" + c if c in _MD_SPECIAL else c) for c in text)
    # a leading "#", "-", "1." would make a heading or a list item
    return _MD_LINE_START.sub(lambda m: m.group(1) + m.group(2)[:-1] + "\\" + m.group(2)[-1], text)


def escape_text(text: str) -> str:
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", re.sub(r"\s+", " ", str(text)))


ESCAPERS = {"md": escape_md, "tex": escape_tex, "text": escape_text}


# ----------------------------------------------------------------------------- references

class Ref:
    """A matrix a step reads: its value, shape, entry base name and matrix name."""

    def __init__(self, value, shape, base, letter, head, plain_letter=None):
        self.value, self.shape, self.base, self.letter, self.head = value, tuple(shape), base, letter, head
        self.plain_letter = plain_letter or letter

    def name(self, i: int, j: int) -> str:
        return entry_name(self.base, i + 1, j + 1, self.head, wide=max(self.shape) >= 10)


def resolve(trace, name: str, head: int | None) -> Ref:
    if "@" in name:
        name, h = name.split("@")
        head = int(h)
    for h in dict.fromkeys((head, None)):
        if trace.has(name, h):
            s = trace.step(name, h)
            return Ref(s.value, s.shape, STEP_BASE[s.id], STEP_LETTER[s.id], h)
        try:
            o = trace.operand(name, h)
        except KeyError:
            continue
        return operand_ref(o)
    raise KeyError(name)


def operand_ref(op) -> Ref:
    return Ref(op.value, op.shape, op.symbol or OPERAND_BASE.get(op.name, "x"), OPERAND_LETTER.get(op.name, op.name), op.head,
               OPERAND_PLAIN.get(op.name))


def step_ref(step) -> Ref:
    return Ref(step.value, step.shape, STEP_BASE[step.id], STEP_LETTER[step.id], step.head)


# ----------------------------------------------------------------------------- steps

class StepView:
    """Builds the view model of one step for one output (TeX or plain)."""

    def __init__(self, trace, step, out):
        self.t, self.s, self.out = trace, step, out
        self.mode = trace.mode
        self.ref = step_ref(step)

    def mname(self, ref: Ref, transpose: bool = False) -> str:
        o = self.out
        letter = ref.plain_letter if o.plain else ref.letter
        return o.head_name(letter, ref.head, transpose)

    def named(self, ref: Ref, transpose: bool = False) -> str:
        shape = ref.shape[::-1] if transpose else ref.shape
        return self.out.named(self.mname(ref, transpose), shape)

    def fits(self, *refs: Ref) -> bool:
        m = self.out.max_size
        return all(max(r.shape) <= m for r in refs)

    def shown_matrix(self, ref: Ref, transpose: bool = False) -> str:
        o = self.out
        if transpose:
            return o.matrix_of(ref.shape[1], ref.shape[0], lambda i, j: o.entry(ref.value, j, i))
        return o.matrix(ref.value, ref.shape)

    def operands(self) -> tuple[Ref, Ref, bool, Ref | None]:
        """The two factors of a product step, whether the second is transposed, and the bias."""
        s, t = self.s, self.t
        a = resolve(t, s.inputs[0], s.head)
        b = resolve(t, s.inputs[1], s.head)
        bias = resolve(t, s.inputs[2], s.head) if len(s.inputs) > 2 else None
        return a, b, s.id == "scores", bias

    def build(self) -> dict[str, Any]:
        s, o = self.s, self.out
        vm: dict[str, Any] = {
            "kind": s.id, "key": s.key, "head": s.head or 0, "mode": self.mode,
            "name": self.mname(self.ref), "formula": plain_formula(s, scaled=self.t.settings["scale"] is not False) if o.plain else s.formula,
            "shape": o.shape(s.shape), "rows": s.shape[0], "cols": s.shape[1],
            "elided": max(s.shape) > o.max_size, "matrix": "", "approx": "", "product": "", "lines": [],
            "rows_shown": 0, "shape_line": self.shape_line(), "extra": {},
        }
        if s.value is not None and s.id != "concat":
            vm["matrix"] = o.eq(self.named(self.ref), o.matrix(s.value, s.shape))
            if self.mode == "exact":
                approx = o.approx_matrix(s.value, s.shape)
                vm["approx"] = o.approx(self.named(self.ref), approx) if approx else ""
        if s.id == "scaled":
            self.scale_facts(vm)
        builder = getattr(self, f"build_{s.id}", self.build_product if s.id in PRODUCTS else None)
        if builder is not None and (s.value is not None or s.id == "concat"):  # concat draws its layout in shape mode too
            builder(vm)
        if s.id == "masked":
            vm["extra"]["kind"] = s.details.get("kind", "matrix")
            vm["extra"]["masked_count"] = int((~np.asarray(s.details["keep"], dtype=bool)).sum()) if "keep" in s.details else 0
        return vm

    # -- shapes ------------------------------------------------------------------
    def shape_line(self) -> str:
        s, o = self.s, self.out
        arrow = " -> " if o.plain else " \\to "
        if s.id in PRODUCTS:
            a, b, tr, _ = self.operands()
            return self.named(a) + (" " if o.plain else "\\,") + self.named(b, tr) + arrow + self.named(self.ref)
        if s.id == "concat":
            refs = [resolve(self.t, n, None) for n in s.inputs]
            widths = {r.shape[1] for r in refs}
            h = len(refs)
            cols = f"{widths.pop()} \\cdot {h}" if len(widths) == 1 else " + ".join(str(r.shape[1]) for r in refs)
            if o.plain:
                cols = cols.replace(" \\cdot ", "*")
                return f"{s.shape[0]} x ({cols}) = {o.shape(s.shape)}"
            return f"{s.shape[0]} \\times ({cols}) = {o.shape(s.shape)}"
        src = resolve(self.t, s.inputs[0], s.head)
        return self.named(src) + arrow + self.named(self.ref)

    # -- products: Q, K, V, scores, Z, output ------------------------------------
    def build_product(self, vm) -> None:
        s, o = self.s, self.out
        a, b, tr, bias = self.operands()
        if not o.plain and self.fits(a, b, self.ref) and (bias is None or self.fits(bias)):
            lhs = o.juxt(self.shown_matrix(a), self.shown_matrix(b, tr))
            if bias is not None:
                lhs = o.add([lhs, self.shown_matrix(bias)])
            if self.mode == "symbolic" and s.expansion is not None:
                vm["product"] = o.eq(self.named(self.ref), lhs, o.matrix(s.expansion, s.shape))
            else:
                vm["product"] = o.eq(self.named(self.ref), lhs, o.matrix(s.value, s.shape))
        if self.mode == "symbolic" and vm["product"]:
            return  # the product already shows every entry's expansion
        inner = a.shape[1]
        for j in range(min(s.shape[1], 3)):
            vm["lines"].append(self.product_line(a, b, tr, bias, inner, 0, j))

    def product_line(self, a, b, tr, bias, inner, i, j) -> str:
        o, s = self.out, self.s
        bij = (lambda k: (j, k)) if tr else (lambda k: (k, j))
        lhs = self.entry_label(i, j)
        if self.mode == "symbolic":
            if s.expansion is None:
                return ""
            return o.eq(lhs, o.expr(s.expansion[i, j]))
        names = o.sum_terms(inner, lambda k: o.juxt(self.ename(a, i, k), self.ename(b, *bij(k))))
        nums = o.sum_terms(inner, lambda k: o.mul(o.entry(a.value, i, k) if k == 0 else o.factor(a.value, i, k), o.factor(b.value, *bij(k))))
        if bias is not None:
            names = o.add([names, self.ename(bias, 0, j)])
            nums = o.add([nums, o.factor(bias.value, 0, j)])
        return self.result_line(lhs, names, nums, self.s.value, i, j)

    def result_line(self, lhs, names, nums, value, i, j) -> str:
        o = self.out
        result = o.entry(value, i, j)
        if self.mode == "exact":
            approx = o.approx_entry(value, i, j)
            if approx is not None and approx != result:
                result = o.approx(result, approx)
        return o.eq(lhs, names, nums, result)

    def ename(self, ref: Ref, i: int, j: int) -> str:
        if self.mode == "symbolic" and ref.value is not None:
            return self.out.entry(ref.value, i, j)
        n = ref.name(i, j)
        return plain_name(n) if self.out.plain else n

    def entry_label(self, i: int, j: int) -> str:
        return self.ename(self.ref, i, j) if self.mode != "symbolic" else self.out.entry(self.s.value, i, j)

    # -- scaling ------------------------------------------------------------------
    def scale_facts(self, vm) -> None:
        s, o = self.s, self.out
        d = s.details
        by_sqrt = d.get("by_sqrt_dk", True)
        factor = d.get("factor")
        extra = vm["extra"]
        extra["by_sqrt"] = bool(by_sqrt)
        extra["d_k"] = "" if d.get("d_k") is None else str(d["d_k"])
        fnum = "" if factor is None else (o.num(float(factor)))
        if by_sqrt and d.get("d_k") is not None:
            root = o.sqrt(str(d["d_k"]))
            extra["factor"] = o.approx(root, fnum) if fnum else root
            extra["factor_tex"] = root
        else:
            label = "c"
            extra["factor"] = o.eq(label, fnum)
            extra["factor_tex"] = fnum

    def build_scaled(self, vm) -> None:
        s, o = self.s, self.out
        src = resolve(self.t, s.inputs[0], s.head)
        factor = vm["extra"]["factor_tex"]
        if self.mode == "symbolic":
            vm["lines"] = [o.eq(o.entry(s.value, 0, j), o.expr(s.expansion[0, j])) for j in range(min(s.shape[1], 3))] if s.expansion is not None else []
            return
        for j in range(min(s.shape[1], 3)):
            names = o.frac(self.ename(src, 0, j), factor)
            nums = o.frac(o.entry(src.value, 0, j), factor)
            vm["lines"].append(self.result_line(self.ename(self.ref, 0, j), names, nums, s.value, 0, j))

    # -- mask -----------------------------------------------------------------------
    def build_masked(self, vm) -> None:
        s, o = self.s, self.out
        keep = s.details.get("keep")
        if keep is not None:
            letter = o.head_name("M", s.head) if not o.plain else "M"
            vm["extra"]["mask"] = o.eq(o.named(letter, s.shape), o.matrix_of(s.shape[0], s.shape[1], lambda i, j: o.num(float(keep[i, j]))))

    # -- softmax ------------------------------------------------------------------
    def build_weights(self, vm) -> None:
        s, o = self.s, self.out
        src = resolve(self.t, s.inputs[0], s.head)
        rows = [i for i in pick(s.shape[0], o.max_size) if i is not None][:4]
        cols = pick(s.shape[1], o.max_size)
        vm["rows_shown"] = len(rows)
        d = s.details
        if self.mode == "symbolic":
            if s.expansion is not None:
                vm["lines"] = [o.eq(o.entry(s.value, 0, j), o.expr(s.expansion[0, j])) for j in range(min(s.shape[1], 3))]
            return
        dots = "\\cdots" if not o.plain else "..."
        for i in rows:
            names = o.row([dots if j is None else self.ename(self.ref, i, j) for j in cols])
            if self.mode == "numeric":
                m = float(d["row_max"][i])
                mtxt = o.num(m)
                shifted = []
                for j in cols:
                    if j is None:
                        shifted.append(dots)
                        continue
                    tij = float(src.value[i, j])
                    shifted.append(o.exp(o.neg_inf() if np.isneginf(tij) else o.sub(o.num(tij), mtxt if m >= 0 else o.paren(mtxt))))
                exps = [dots if j is None else o.num(float(d["exp"][i, j])) for j in cols]
                total = o.num(float(d["row_sum"][i]))
                vm["lines"].append(o.eq(o.max_row(i + 1), mtxt))
                line = o.eq(names, o.frac(o.row(shifted), o.add(shifted)), o.frac(o.row(exps), total),
                            o.row([dots if j is None else o.entry(s.value, i, j) for j in cols]))
            else:  # exact
                exps = [dots if j is None else o.entry(d["exp"], i, j) for j in cols]
                approx = [dots if j is None else (o.approx_entry(s.value, i, j) or o.entry(s.value, i, j)) for j in cols]
                line = o.approx(o.eq(names, o.frac(o.row(exps), o.add(exps))), o.row(approx))
            vm["lines"].append(line)

    # -- concat -------------------------------------------------------------------
    def build_concat(self, vm) -> None:
        s, o = self.s, self.out
        refs = [resolve(self.t, n, None) for n in s.inputs]
        blocks = s.details.get("blocks", ())
        vm["extra"]["blocks"] = [{"head": h, "first": f, "last": l} for h, f, l in blocks]
        heads = pick(len(refs), max(2, o.max_size // 2))
        per = max(2, o.max_size // max(1, len([h for h in heads if h is not None])))
        dots = "\\cdots" if not o.plain else "..."
        layout = [dots if h is None else o.block(self.mname(refs[h]), o.shape(refs[h].shape)) for h in heads]
        vm["extra"]["layout"] = o.eq(self.named(self.ref), o.brackets(layout))
        if s.value is None:
            return
        if o.plain:
            vm["matrix"] = o.eq(self.named(self.ref), o.matrix(s.value, s.shape))
            return
        rows = pick(s.shape[0], o.max_size)
        parts = []
        for h in heads:
            if h is None:
                parts.append("\\cdots")
                continue
            r = refs[h]
            cols = pick(r.shape[1], per)
            body = [[o.dots(i, j) if i is None or j is None else o.entry(r.value, i, j) for j in cols] for i in rows]
            parts.append(o.block(o.inner_matrix(body), self.mname(r)))
        vm["matrix"] = o.eq(self.named(self.ref), o.brackets(parts))


# ----------------------------------------------------------------------------- report

def out_for(fmt: str, precision: int, max_size: int):
    return PlainOut(precision, max_size) if fmt == "text" else TexOut(precision, max_size)


def step_view(trace, step, fmt: str, precision: int, max_size: int) -> dict[str, Any]:
    return StepView(trace, step, out_for(fmt, precision, max_size)).build()


def operand_view(trace, op, out) -> dict[str, Any]:
    ref = operand_ref(op)
    letter = ref.plain_letter if out.plain else ref.letter
    name = out.head_name(letter, op.head)
    vm = {"name": name, "shape": out.shape(op.shape), "matrix": "", "approx": "", "head": op.head or 0}
    if op.value is not None:
        vm["matrix"] = out.eq(out.named(name, op.shape), out.matrix(op.value, op.shape))
        if trace.mode == "exact":
            approx = out.approx_matrix(op.value, op.shape)
            vm["approx"] = out.approx(out.named(name, op.shape), approx) if approx else ""
    else:
        vm["matrix"] = out.named(name, op.shape)
    return vm


def report_view(trace, fmt: str, precision: int, max_size: int, figures: list[dict] | None = None, lang: str = "en") -> dict[str, Any]:
    out = out_for(fmt, precision, max_size)
    esc = ESCAPERS[fmt]
    settings = trace.settings
    multi = trace.num_heads > 1 or any(s.head for s in trace.steps)
    sections = []
    for h in trace.heads():
        steps = [StepView(trace, s, out).build() for s in trace.steps if s.head == h and s.head is not None]
        if steps:
            sections.append({"head": h, "steps": steps})
    combined = [StepView(trace, s, out).build() for s in trace.steps if s.head is None]
    if not multi:
        sections, combined = [{"head": 0, "steps": combined}], []
    d_ks = sorted({str(s.details["d_k"]) for s in trace.steps if s.id == "scaled" and s.details.get("d_k") is not None})
    return {
        "title": esc(trace.localized("title", lang) or ""),
        "description": esc(trace.localized("description", lang) or ""),
        "tokens": [esc(t) for t in settings.get("tokens") or ()],
        "kv_tokens": [esc(t) for t in settings.get("kv_tokens") or ()],
        "mode": trace.mode, "num_heads": trace.num_heads, "multi": multi,
        "start": settings.get("start", ""), "cross": bool(settings.get("cross")),
        "masked": any(s.id == "masked" for s in trace.steps), "mask_kind": settings.get("mask") or "",
        "scaled": any(s.id == "scaled" for s in trace.steps), "has_weights": any(s.id == "weights" for s in trace.steps),
        "has_concat": any(s.id == "concat" for s in trace.steps), "has_output": any(s.id == "output" for s in trace.steps),
        "d_k": ", ".join(d_ks), "precision": precision, "max_size": max_size,
        "elided": any(max(o.shape) > max_size for o in trace.operands) or any(max(s.shape) > max_size for s in trace.steps),
        "operands": [operand_view(trace, op, out) for op in trace.operands],
        "sections": sections, "combined": combined, "figures": figures or [],
    }
