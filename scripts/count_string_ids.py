"""Count, per folder of attntrace/, the comparisons that name a step id or a mistake code as a
string: `step.id == "scores"`, `s.id in ("Q_rope", "K_rope")`, `m == "missing_scale"`, ...

    python scripts/count_string_ids.py

A comparison (==, !=, in, not in) counts as a step-id compare when one of its operands is a
string constant that is a step id (or a tuple, list or set of them, any one a step id), and
as a code compare when such a constant is a mistake code the checker knows. The kinds'
own modules (attntrace/kinds/) may compare their ids and codes: they are counted apart. Issue
21 asks for none outside the kinds, and no `code == "..."` chain in grading.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def known() -> tuple[set[str], set[str]]:
    sys.path.insert(0, str(ROOT))
    from attntrace.grading.diagnose import CODES
    from attntrace.kinds.registry import all_kinds
    from attntrace.model.trace import STEP_IDS

    ids = set(STEP_IDS) | {k.id for k in all_kinds()}
    return ids, set(CODES) - ids


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def count(path: Path, ids: set[str], codes: set[str]) -> tuple[int, int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    n_ids = n_codes = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        if not all(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
            continue
        strings = [s for operand in (node.left, *node.comparators) for s in _strings(operand)]
        if any(s in ids for s in strings):
            n_ids += 1
        elif any(s in codes for s in strings):
            n_codes += 1
    return n_ids, n_codes


def main() -> int:
    ids, codes = known()
    by_ids, by_codes = Counter(), Counter()
    for path in sorted((ROOT / "attntrace").rglob("*.py")):
        folder = path.relative_to(ROOT / "attntrace").parts[0] if len(path.relative_to(ROOT / "attntrace").parts) > 1 else "(top)"
        i, c = count(path, ids, codes)
        by_ids[folder] += i
        by_codes[folder] += c
    print(f"{'folder':<12} {'step-id compares':>17} {'code compares':>14}")
    for folder in sorted(set(by_ids) | set(by_codes)):
        print(f"{folder:<12} {by_ids[folder]:>17} {by_codes[folder]:>14}")
    outside = [f for f in by_ids if f != "kinds"]
    print(f"{'outside kinds':<12} {sum(by_ids[f] for f in outside):>17} {sum(by_codes[f] for f in outside):>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
