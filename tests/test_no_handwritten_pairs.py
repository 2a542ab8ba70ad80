"""No formula is written by hand as LaTeX in the views or the kinds (issue 21, item 4).

A formula is built once as a tree (`attntrace.model.formula`) and printed by the TeX, plain and
MathML printers (`attntrace.rendering.formulatext`); matrices and numbers come from the outputs
(`attntrace.rendering.printing`), breakable lines from `attntrace.rendering.layout`. So a string
literal holding LaTeX (a control sequence such as \\frac or \\, or a group ^{...} / _{...}) in
a kind's module, a view's module or the view model (viewmodel.py) is a formula written by hand
for one notation, and it usually has a hand-written plain twin beside it (`if o.plain: ... else: ...`). This test reads
those modules with `ast` and fails on such a literal.

Not formulas, so not flagged:
- docstrings;
- regular expressions and their replacements (arguments of `re.*`, or a module constant passed to `re.*`);
- SymPy names: the argument of `sp.Symbol(...)`, and a kind's entry base name (a small letter
  or a Greek one, perhaps accented, perhaps with a superscript group: `g^{O}`, `\\hat{c}^{Q}`,
  `\\gamma^{q}`), one string that SymPy prints in each notation.
An f-string is judged whole, its values standing in as a letter: f"g^{{{which}}}" is the name
g^{x}, f"\\frac{{1}}{{{factor}}}" is LaTeX.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "attntrace"
MODULES = sorted([*ROOT.glob("kinds/*.py"), *ROOT.glob("rendering/*view.py"), ROOT / "rendering" / "viewparts.py",
                  ROOT / "rendering" / "viewmodel.py"])

#: LaTeX in a string: a control word or symbol (\frac, \,, \{), or a script group (^{, _{).
LATEX = re.compile(r"\\[A-Za-z]+|\\[,;:! {}|]|\^\{|_\{")
#: A SymPy entry base name: one letter, perhaps accented, perhaps with a superscript group.
SYMPY_BASE = re.compile(r"(?:\\(?:hat|tilde|bar|check)\{[a-z]\}|[a-z]|\\[a-z]+)(?:\^\{[A-Za-z]+\})?")

#: (module, literal as judged): why it is not a tree yet. Keep this tiny.
ALLOWED: dict[tuple[str, str], str] = {}


def _exempt_nodes(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings, regular expressions or SymPy names."""
    out: set[int] = set()
    patterns: set[str] = set()  # names passed to re.*: a pattern kept as a string, compiled on first use
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant):
                out.add(id(n.body[0].value))
        if isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            if owner == "re" or (owner in ("sp", "sympy") and name == "Symbol"):
                for arg in n.args:
                    out.update(id(c) for c in ast.walk(arg) if isinstance(c, ast.Constant))
                    if owner == "re" and isinstance(arg, ast.Name):
                        patterns.add(arg.id)
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in patterns for t in n.targets):
            out.update(id(c) for c in ast.walk(n.value) if isinstance(c, ast.Constant))
    return out


def latex_literals(path: Path) -> list[tuple[int, str]]:
    """(line, literal) of every LaTeX-bearing string literal of a module that is not exempt."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    exempt = _exempt_nodes(tree)
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            parts = [v for v in n.values if isinstance(v, ast.Constant)]
            if any(id(p) in exempt for p in parts):
                continue
            exempt.update(id(p) for p in parts)
            text = "".join(v.value if isinstance(v, ast.Constant) else "x" for v in n.values)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in exempt:
            text = n.value
        else:
            continue
        if LATEX.search(text) and not SYMPY_BASE.fullmatch(text) and (path.name, text) not in ALLOWED:
            found.append((n.lineno, text))
    return sorted(found)


def test_the_scan_sees_the_modules():
    names = {p.name for p in MODULES}
    assert {"ropeview.py", "mlaview.py", "moeview.py", "viewparts.py", "mla.py", "rope.py"} <= names


def test_the_scan_finds_a_handwritten_pair(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('def f(o, n):\n    """\\\\frac in a docstring is fine."""\n    re.sub(r"_\\{1\\}", "_{2}", n)\n'
                     '    return f"({n} x {n})" if o.plain else f"({n} \\\\times {n})"\n')
    assert latex_literals(probe) == [(4, "(x \\times x)")]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_latex_written_by_hand(path):
    found = latex_literals(path)
    assert not found, f"{path.name}: LaTeX written by hand (build a formula tree instead):\n" + "\n".join(
        f"  line {line}: {text!r}" for line, text in found)
