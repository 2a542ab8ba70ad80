"""List notation clashes of feature combinations no example has: each example with one more
feature (a spec key) taken from another example, traced in numeric mode.

    PYTHONPATH=$PWD python scripts/notation_combos.py

tests/test_notation.py asserts that no example has a clash (one letter, two meanings); this
script looks one step further, at what a course might build by combining two examples (RoPE
with sinusoidal positions, the online softmax with a backward pass, ...). A combination the
spec reader refuses is skipped. Prints one line per clash: the example, the added key, and
(letter, first meaning, second meaning).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import attntrace  # noqa: E402
from attntrace.kinds.notation import notation_of  # noqa: E402
from attntrace.model.errors import AttntraceError  # noqa: E402
from attntrace.resources import example_paths  # noqa: E402

#: Spec keys that turn a feature on, and the keys that must come with them.
FEATURES = {"alibi": (), "softcap": (), "sinks": (), "qk_norm": ("g_q", "g_k"), "rope": (), "window": (), "attn_bias": (),
            "backward": (), "online": (), "position": ("P",), "num_kv_heads": ()}


def main() -> int:
    examples = {p.stem: tomllib.loads(p.read_text(encoding="utf-8")) for p in sorted(example_paths())}
    donors = {}
    for name, spec in examples.items():
        for key, companions in FEATURES.items():
            if key in spec and key not in donors:
                donors[key] = {k: spec[k] for k in (key, *companions) if k in spec}
    found = 0
    for name, spec in examples.items():
        for key, extra in donors.items():
            if key in spec:
                continue
            try:
                trace = attntrace.run({**spec, **extra})
            except AttntraceError:
                continue
            for clash in notation_of(trace).clashes:
                print(f"{name} + {key}: {clash}")
                found += 1
    print(f"{found} clashes in combinations of {len(examples)} examples and {len(donors)} features")
    return 0


if __name__ == "__main__":
    sys.exit(main())
