"""Write attntrace/kinds/manifest.py from the kind modules' declarations (after adding or changing
a kind: its pipeline place, spec keys, RUNS_WITH, operands, mistakes, view or meanings).

    python scripts/write_kind_manifest.py

tests/test_kind_manifest.py fails while the manifest differs from what the modules declare."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attntrace.kinds.registry import write_manifest  # noqa: E402

if __name__ == "__main__":
    print(f"wrote {write_manifest()}")
