"""Spec (TOML / JSON file, or a Python dict) -> a validated `Problem`.

A spec names its start point by the keys it holds: `X` (with W_Q, W_K, W_V, or `heads`),
`Q`/`K`/`V`, `scores`, `weights` + `V`, or `Z` (head outputs, for the concatenation alone).
Every key is checked against a whitelist, every matrix goes through `matrices.to_matrix`
(which never evaluates user text), and every problem is reported as one-line `BadInput`.
"""

from __future__ import annotations

from functools import partial

import json
import re
from dataclasses import field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from attntrace.inputs import limits
from attntrace.model.errors import BadInput
from attntrace.inputs.safetext import clean_text
from attntrace.inputs.matrices import copies_in_one, to_matrix
from attntrace.inputs.numbers import shown, whole_number
from attntrace.inputs.blockspec import BLOCK_KEYS, block_options, check_block
from attntrace.inputs.positional import positive_number
from attntrace.inputs.options import DeclaredOptions, OptionReader, SpecOption, split_columns
from attntrace.inputs.stepoptions import MASK_NAMES, parse_attn_bias, parse_mask_options
from attntrace.model.record import record
from attntrace.model.trace import MODES, Operand

#: Per-head matrices and their default entry names in symbolic mode.
HEAD_KEYS = {
    "W_Q": "w^{Q}", "W_K": "w^{K}", "W_V": "w^{V}",
    "b_Q": "b^{Q}", "b_K": "b^{K}", "b_V": "b^{V}",
    "Q": "q", "K": "k", "V": "v", "scores": "s", "weights": "a",
    "K_past": "k^{p}", "V_past": "v^{p}",  # a KV cache (attntrace.kinds.cache)
}
#: Matrices shared by all heads.
SHARED_KEYS = {"X": "x", "X_kv": "y", "W_O": "w^{O}", "b_O": "b^{O}"}
#: Keys of the spec itself; a step kind's own keys (online, backward, ...) are
#: the `SpecOption`s it declares, which `load_spec` receives (`attntrace.kinds.registry.DECLARED_OPTIONS`).
OPTION_KEYS = {"title", "description", "title_zh", "description_zh", "mode", "scale", "d_k", "mask", "num_heads", "heads", "Z", "expand", "tokens", "kv_tokens",
               "num_kv_heads", "window", "key_padding", "attn_bias"}
ALLOWED_KEYS = set(HEAD_KEYS) | set(SHARED_KEYS) | OPTION_KEYS | BLOCK_KEYS
#: Keys that `num_heads` splits into column blocks, one per head.
SPLITTABLE = ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "Q", "K", "V", "K_past", "V_past")
#: Keys that `num_kv_heads` (grouped-query attention) splits into one block per key/value head.
KV_KEYS = ("W_K", "W_V", "b_K", "b_V", "K", "V", "K_past", "V_past")


@record
class Problem:
    """What to trace: mode, start point, per-head operands, shared operands and options."""

    mode: str
    start: str
    heads: tuple[Mapping[str, Operand], ...]
    shared: Mapping[str, Operand]
    scale: Any = True  # True, False, or a positive number
    d_k: int | None = None
    mask: Any = None  # None, "causal", or a 0/1 ndarray
    full_expansion: bool = False
    title: str | None = None
    description: str | None = None
    #: the title and description in other languages, e.g. {"title_zh": ...}
    localized: Mapping[str, str] = field(default_factory=dict)
    tokens: tuple[str, ...] | None = None
    kv_tokens: tuple[str, ...] | None = None
    source: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


def _shown(p: Path) -> str:
    """A file name for a one-line message: control characters (a newline) escaped."""
    text = str(p)
    return text if text.isprintable() else repr(text)[1:-1]


_JSON_STRINGS = r'"[^"\\]*(?:\\.[^"\\]*)*"'  # compiled by `re` when a JSON spec is read
_TOML_STRINGS = r'"""(?:[^\\]|\\.)*?"""|\'\'\'[\s\S]*?\'\'\'|"[^"\\\n]*(?:\\.[^"\\\n]*)*"|\'[^\'\n]*\'|#[^\n]*'
_BRACKET_STEP = np.zeros(256, dtype=np.int8)
_BRACKET_STEP[[ord("["), ord("{")]] = 1
_BRACKET_STEP[[ord("]"), ord("}")]] = -1


def _check_structure(text: str, is_json: bool, name: str, what: str) -> None:
    """Refuse, before parsing, nesting and numbers that the parsers cannot take cheaply.

    json and tomllib recurse once per nested array (RecursionError at about 1000 levels),
    tomllib takes quadratic time in the number of parts of a dotted key, and Python refuses
    to convert integers of more than 4300 digits. Strings and comments are blanked first so
    that brackets, dots and digits inside them do not count.
    """
    code = re.sub(_JSON_STRINGS if is_json else _TOML_STRINGS, '""', text)
    depth_limit = limits.get("depth")
    steps = _BRACKET_STEP[np.frombuffer(code.encode("utf-8"), dtype=np.uint8)]
    if steps.size:
        depth = int(np.cumsum(steps, dtype=np.int64).max())
        if depth > depth_limit:
            raise limits.refuse(f"{name}: arrays or tables nested {depth} deep", "depth")
    if not is_json and re.search(r"(?:\.[^.\n=,\[\]{}]*){%d}" % depth_limit, code):
        raise limits.refuse(f"{name}: a dotted key with more than {depth_limit} parts", "depth")
    digits = limits.get("digits")
    m = re.search(r"(?<![0-9])[0-9]{%d}" % (digits + 1), code)
    if m:
        line = code.count("\n", 0, m.start()) + 1
        raise limits.refuse(f"{name}, line {line}: a number with more than {digits} digits", "digits")


def _check_parsed(data: Any, name: str) -> None:
    """Depth and integer size of the parsed tree, without recursion (dotted keys nest too)."""
    depth_limit, digits = limits.get("depth"), limits.get("digits")
    bits = int(digits * 3.3219280948873626) + 1
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            if isinstance(node, int) and node.bit_length() > bits and len(str(node)) > digits:
                raise limits.refuse(f"{name}: an integer with more than {digits} digits", "digits")
            continue
        if depth > depth_limit:
            raise limits.refuse(f"{name}: arrays or tables nested more than {depth_limit} deep", "depth")
        stack.extend((c, depth + 1) for c in children)


def read_table_file(path: str | Path, what: str = "spec", parse_float=None) -> dict:
    """Read a TOML or JSON file holding one table; errors become one-line BadInput.

    `parse_float` receives each float's text (the checker keeps it to know the decimals written).
    The file's size, nesting and integers are checked against `attntrace.inputs.limits` first.
    """
    p = Path(path)
    name = _shown(Path(p.name))
    size_limit = limits.get("file_mb") * 1_000_000
    try:
        with open(p, "rb") as f:  # at most limit + 1 bytes: /dev/zero or a huge file is not read whole
            raw = f.read(size_limit + 1)
    except OSError as exc:
        raise BadInput(f"cannot read {what} file {_shown(p)}: {exc.strerror or exc}") from None
    if len(raw) > size_limit:
        raise limits.refuse(f"{what} file {_shown(p)} is larger than {limits.get('file_mb')} MB", "file_mb")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{what} file {name} is not UTF-8 text") from None
    del raw
    is_json = p.suffix.lower() == ".json" or (p.suffix.lower() != ".toml" and text.lstrip().startswith("{"))
    _check_structure(text, is_json, name, what)
    try:
        if is_json:
            try:
                data = json.loads(text, parse_float=parse_float, parse_constant=parse_float)
            except json.JSONDecodeError as exc:
                raise BadInput(f"{name}: JSON syntax error at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
        else:
            import tomllib  # here, not at the top: a JSON spec or a dict does not pay for its regular expressions

            try:
                data = tomllib.loads(text, parse_float=(lambda t: parse_float(t.replace("_", ""))) if parse_float else float)
            except tomllib.TOMLDecodeError as exc:
                raise BadInput(f"{name}: TOML syntax error: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise limits.refuse(f"{name}: arrays or tables nested too deeply to read", "depth") from None
    except ValueError as exc:  # Python's own limit on converting integers of > 4300 digits
        if "digits" in str(exc):
            raise limits.refuse(f"{name}: a number with more than {limits.get('digits')} digits", "digits") from None
        raise BadInput(f"{name}: cannot read: {' '.join(str(exc).split())[:120]}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{name}: a {what} must be a table of keys, not {type(data).__name__}")
    _check_parsed(data, name)
    return data


def read_spec_file(path: str | Path) -> dict:
    return read_table_file(path, "spec")


def _text(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise BadInput(f"{key} must be text, not {type(value).__name__}")
    if len(value) > 500:
        raise BadInput(f"{key} is too long ({len(value)} characters; at most 500)")
    return clean_text(value)  # control and bidi characters never enter the trace (nor its JSON)


def _tokens(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        raise BadInput(f"{key} must be a list of strings")
    return tuple(_text(t, key) for t in value)


def _mode(data: Mapping[str, Any], override: str | None) -> str:
    mode = override or data.get("mode")
    if mode is None:
        # a symbol table anywhere (top level, in a head, among the Z_i) means symbolic mode
        values = [v for k, v in data.items() if k in HEAD_KEYS or k in SHARED_KEYS]
        values += [v for head in data.get("heads") or [] if isinstance(head, dict) for v in head.values()]
        values += list(data.get("Z") or []) if isinstance(data.get("Z"), list) else []
        return "symbolic" if any(isinstance(v, dict) for v in values) else "numeric"
    if mode not in MODES:
        raise BadInput(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    return mode


def _scale(value: Any) -> Any:
    """true, false, or a positive finite number (an int, a float or an exact string)."""
    if isinstance(value, bool):
        return value
    return positive_number(value, "scale", "true, false or a positive number")


#: Largest d_k or num_heads: beyond it a float cannot hold sqrt(d_k) exactly enough to matter,
#: and no matrix is that wide.
MAX_COUNT = 10**12


def _positive_int(value: Any, key: str) -> int:
    """d_k at most 10^12; the head counts are checked against the width they split."""
    return whole_number(value, key, high=MAX_COUNT if key == "d_k" else None, what="be a positive integer")


def _mask(value: Any) -> Any:
    if value is None or value is False:
        return None
    if isinstance(value, str) and value in MASK_NAMES:
        return value
    if isinstance(value, str):
        raise BadInput(f"mask must be \"causal\", \"causal_bottom_right\" or a 0/1 matrix, not {value!r}"[:200])
    keep, _, _ = to_matrix(value, mode="numeric", name="mask")
    if not ((keep == 0) | (keep == 1)).all():
        raise BadInput("mask entries must be 0 (masked) or 1 (kept)")
    return keep.astype(bool)


def _operand(raw: Any, key: str, mode: str, head: int | None, default: str, *, copy: bool = True) -> Operand:
    label = key if head is None else f"{key} of head {head}"
    value, shape, symbol = to_matrix(raw, mode=mode, name=label, default_symbol=default, head=head, copy=copy)
    return Operand(name=key, head=head, value=value, shape=shape, symbol=symbol)


def load_spec(spec: Any, *, mode: str | None = None, options: tuple[SpecOption, ...] | DeclaredOptions = (), copy: bool = True,
              **overrides: Any) -> Problem:
    """Validate a spec (path, dict) with optional overrides (mode, scale, mask, title, ...).

    `options`: the spec keys the step kinds declare (`attntrace.kinds.registry.DECLARED_OPTIONS`,
    passed by the tracer, which loads the options of the keys the spec has); each parsed value
    goes to `Problem.extra` under its key.
    copy=False: writable float64 arrays are kept as read-only views instead of copied (the
    caller promises not to change them while the trace lives; `matrices.to_matrix`).
    The arrays of a dict spec that numeric mode copies are copied into one allocation
    (`matrices.copies_in_one`)."""
    if isinstance(spec, Mapping) and (mode or spec.get("mode") or "numeric") == "numeric":
        with copies_in_one(spec, copy):
            return _load_spec(spec, mode, options, copy, overrides)
    return _load_spec(spec, mode, options, copy, overrides)


def _load_spec(spec: Any, mode: str | None, options: tuple[SpecOption, ...] | DeclaredOptions, copy: bool, overrides: dict) -> Problem:
    source = None
    if isinstance(spec, (str, Path)):
        source = str(spec)
        data = read_spec_file(spec)
    elif isinstance(spec, Mapping):
        data = dict(spec)
    else:
        raise BadInput(f"a spec is a path or a dict, not {type(spec).__name__}")
    if overrides.get("backward") is True and data.get("backward"):
        overrides.pop("backward")  # `run --backward` on a spec that says how: the spec's dO or loss
    data.update({k: v for k, v in overrides.items() if v is not None})
    declared_keys = options.keys if isinstance(options, DeclaredOptions) else {o.key for o in options}
    allowed = ALLOWED_KEYS | declared_keys
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise BadInput(f"unknown key {unknown[0]!r} in spec; allowed: {', '.join(sorted(allowed))}")
    if isinstance(options, DeclaredOptions):
        options = options.load(frozenset(data) & declared_keys)
    mode = _mode(data, mode)
    operand = partial(_operand, copy=copy)

    shared = {k: operand(data[k], k, mode, None, d) for k, d in SHARED_KEYS.items() if k in data}
    block_ops, block_extra = block_options(data, mode, operand, options)  # position encodings, the Transformer block
    shared.update(block_ops)
    top = {k: data[k] for k in HEAD_KEYS if k in data}
    heads_raw = data.get("heads")
    num_heads = data.get("num_heads")
    if num_heads is not None:
        num_heads = _positive_int(num_heads, "num_heads")
    num_kv_heads = _kv_heads(data, num_heads)
    full_width: Mapping[str, Operand] = {}
    started: dict[str, Any] = {}  # an option that makes the heads' operands itself (SpecOption.start)
    starter = next((o for o in options if o.start is not None and o.key in data), None)

    if starter is not None:
        reader = OptionReader(mode, data, num_heads or 1, operand=operand)
        started[starter.key] = starter.parse(data[starter.key], reader)
        shared.update(reader.shared)
        heads, start = reader.heads, starter.start
    elif "Z" in data:
        if heads_raw or top or "X" in data:
            raise BadInput("Z (head outputs) starts a trace at the concatenation; give it without X, Q/K/V, scores, weights or heads")
        zs = data["Z"]
        if not isinstance(zs, list) or not zs or not all(isinstance(z, (list, dict)) or hasattr(z, "shape") for z in zs):
            raise BadInput("Z must be a list of head outputs [Z_1, ..., Z_h]")
        if isinstance(zs[0], list) and zs[0] and not isinstance(zs[0][0], (list, dict)) and not hasattr(zs[0], "shape"):
            zs = [zs]  # a single matrix given as Z
        heads = tuple({"Z": operand(z, "Z", mode, i + 1 if len(zs) > 1 else None, "z")} for i, z in enumerate(zs))
        start = "Z"
    else:
        if heads_raw is not None:
            if top:
                raise BadInput(f"{sorted(top)[0]} is given both at the top level and in heads; give per-head matrices in heads only")
            if not isinstance(heads_raw, list) or not heads_raw or not all(isinstance(h, dict) for h in heads_raw):
                raise BadInput("heads must be a non-empty list of tables")
            if len(heads_raw) > limits.get("heads"):
                raise limits.refuse(f"heads lists {len(heads_raw)} tables, too many heads", "heads")
            if num_heads is not None and num_heads != len(heads_raw):
                raise BadInput(f"num_heads = {shown(num_heads)} but heads lists {len(heads_raw)} tables")
            multi = len(heads_raw) > 1
            heads_list = []
            for i, table in enumerate(heads_raw, start=1):
                bad = sorted(set(table) - set(HEAD_KEYS))
                if bad:
                    raise BadInput(f"unknown key {bad[0]!r} in head {i}; allowed: {', '.join(HEAD_KEYS)}")
                heads_list.append({k: operand(v, k, mode, i if multi else None, HEAD_KEYS[k]) for k, v in table.items()})
            heads = tuple(heads_list)
        else:
            single = {k: operand(v, k, mode, None, HEAD_KEYS[k]) for k, v in top.items()}
            if num_heads and num_heads > 1:
                not_splittable = sorted(set(single) - set(SPLITTABLE))
                if not_splittable:
                    raise BadInput(f"num_heads splits {', '.join(SPLITTABLE)} into column blocks; give {not_splittable[0]} per head in heads instead")
                for k, op in single.items():  # before anything per head is built
                    parts = num_kv_heads if k in KV_KEYS else num_heads
                    if op.shape[1] % parts:
                        raise BadInput(f"{'num_kv_heads' if k in KV_KEYS and num_kv_heads != num_heads else 'num_heads'} = "
                                       f"{shown(parts)} does not divide the width of {k} {op.shape}")
                if num_heads > limits.get("heads"):
                    raise limits.refuse(f"num_heads = {shown(num_heads)} is too many heads", "heads")
                _check_key_width(single, num_heads, num_kv_heads)
                per_head = [dict() for _ in range(num_heads)]
                group = num_heads // num_kv_heads  # query heads per key/value head (repeat_interleave order)
                for k, op in single.items():
                    blocks = split_columns(op, num_kv_heads if k in KV_KEYS else num_heads, mode)
                    for i in range(num_heads):
                        per_head[i][k] = blocks[i // group] if k in KV_KEYS else blocks[i]
                heads = tuple(per_head)
                full_width = single  # the unsplit matrices: projections are computed once at full width
            else:
                heads = (single,)
        start = _start(heads[0], shared)
        for i, h in enumerate(heads[1:], start=2):
            if _start(h, shared) != start or set(h) != set(heads[0]):
                raise BadInput(f"head {i} gives different matrices from head 1 ({', '.join(sorted(h))} vs {', '.join(sorted(heads[0]))})")
            for key, op in h.items():
                if op.shape != heads[0][key].shape:
                    raise BadInput(f"heads disagree: {key} of head {i} is {op.shape} but {key} of head 1 is {heads[0][key].shape}")

    tokens = _tokens(data["tokens"], "tokens") if "tokens" in data else None
    kv_tokens = _tokens(data["kv_tokens"], "kv_tokens") if "kv_tokens" in data else None
    _check_token_counts(tokens, kv_tokens, heads[0], shared)
    mask_opts = parse_mask_options(data)  # window, key_padding (attntrace.inputs.stepoptions)
    attn_bias = parse_attn_bias(data.get("attn_bias"), len(heads), mode, operand)  # attntrace.inputs.stepoptions
    if attn_bias and start not in ("X", "QKV", "scores"):
        raise BadInput("attn_bias is added to the scores: give X, Q/K/V or scores, not a later step")
    reader = OptionReader(mode, data, len(heads))
    declared = {o.key: value for o in options if data.get(o.key) is not None and o.start is None and o.instead_of is None
                for value in [o.parse(data[o.key], reader)] if value is not None}
    shared.update(reader.shared)  # matrices an option gives (a norm's gains): operands of the trace
    expand = data.get("expand", "named")
    if expand not in ("named", "full"):
        raise BadInput(f"expand must be \"named\" or \"full\", not {expand!r}")
    problem = Problem(
        mode=mode,
        start=start,
        heads=heads,
        shared=shared,
        scale=_scale(data.get("scale", True)),
        d_k=_positive_int(data["d_k"], "d_k") if "d_k" in data else None,
        mask=_mask(data["mask"] if data.get("mask") is not None else ("causal_bottom_right" if "window" in mask_opts else None)),
        full_expansion=expand == "full",
        title=_text(data["title"], "title") if "title" in data else None,
        description=_text(data["description"], "description") if "description" in data else None,
        localized={k: _text(data[k], k) for k in ("title_zh", "description_zh") if k in data},
        tokens=tokens,
        kv_tokens=kv_tokens,
        source=source,
        extra={**mask_opts, **attn_bias, "full_width": full_width, **({"num_kv_heads": num_kv_heads} if num_kv_heads != (num_heads or 1) else {}),
               **block_extra, **declared, **started},
    )
    for option in options:  # what each kind's setting needs from the rest of the spec
        if option.check is not None and option.key in declared:
            option.check(problem)
    check_block(problem, options)
    if starter is not None and starter.check is not None:
        starter.check(problem)
    return problem


def _check_key_width(single: Mapping[str, Operand], h: int, h_kv: int) -> None:
    """Each key head must be as wide as a query head (d_k), or the scores cannot be formed;
    said here, in terms of the full-width matrices the user wrote, not later per head."""
    for q, k in (("W_Q", "W_K"), ("Q", "K")):
        if q in single and k in single and single[q].shape[1] // h != single[k].shape[1] // h_kv:
            d_k = single[q].shape[1] // h
            raise BadInput(f"{k} {single[k].shape} has {single[k].shape[1]} columns but {h_kv} key head(s) of d_k = {d_k} "
                           f"({q} {single[q].shape} / num_heads = {h}) need {h_kv * d_k}")


def _kv_heads(data: Mapping[str, Any], num_heads: int | None) -> int:
    """num_kv_heads (grouped-query attention; 1 = multi-query): it must divide num_heads, and the
    key/value matrices must be given at full width, to be split into that many column blocks."""
    h = num_heads or 1
    if "num_kv_heads" not in data:
        return h
    h_kv = _positive_int(data["num_kv_heads"], "num_kv_heads")
    if h % h_kv:
        raise BadInput(f"num_kv_heads = {shown(h_kv)} does not divide num_heads = {h} (each key/value head serves h / h_kv query heads)")
    if h_kv != h and ("heads" in data or "Z" in data):
        raise BadInput("num_kv_heads splits full-width W_K, W_V (or K, V) given at the top level with num_heads; not heads or Z")
    return h_kv


def _check_token_counts(tokens, kv_tokens, head: Mapping[str, Operand], shared: Mapping[str, Operand]) -> None:
    """tokens label the queries (rows), kv_tokens the keys: one label each."""
    x = shared.get("X")
    if x is not None:
        n, m = x.shape[0], shared.get("X_kv", x).shape[0]
    elif "Q" in head:
        n, m = head["Q"].shape[0], head["K"].shape[0] if "K" in head else None
    elif "scores" in head or "weights" in head:
        n, m = head["scores" if "scores" in head else "weights"].shape
    elif "Z" in head:
        n, m = head["Z"].shape[0], None
    else:
        return
    if tokens is not None and len(tokens) != n:
        raise BadInput(f"tokens lists {len(tokens)} labels but there are {n} queries (rows); give one label per row")
    if m is not None and "K_past" in head:  # a KV cache: its keys come first
        m += head["K_past"].shape[0]
    if kv_tokens is not None and m is not None and len(kv_tokens) != m:
        raise BadInput(f"kv_tokens lists {len(kv_tokens)} labels but there are {m} keys; give one label per key")


def _start(head: Mapping[str, Operand], shared: Mapping[str, Operand]) -> str:
    """Which point the article-style derivation starts from, from the keys present."""
    keys = set(head)
    if "X" in shared:
        need = {"W_Q", "W_K", "W_V"} - keys
        if need:
            raise BadInput(f"X is given, so {', '.join(sorted(need))} must be given too")
        extra = keys & {"Q", "K", "V", "scores", "weights"}
        if extra:
            raise BadInput(f"X starts at the projections; {sorted(extra)[0]} cannot be given as well")
        return "X"
    if "X_kv" in shared:
        raise BadInput("X_kv (keys and values for cross-attention) needs X (the queries' input)")
    if keys & {"W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"}:
        raise BadInput(f"{sorted(keys & {'W_Q', 'W_K', 'W_V', 'b_Q', 'b_K', 'b_V'})[0]} needs X")
    if "Q" in keys or "K" in keys:
        if not {"Q", "K"} <= keys:
            raise BadInput("Q and K must be given together")
        if keys & {"scores", "weights"}:
            raise BadInput("give Q and K, or scores, or weights, not several start points")
        return "QKV"
    if "scores" in keys:
        if "weights" in keys:
            raise BadInput("give scores or weights, not both")
        return "scores"
    if "weights" in keys:
        if "V" not in keys:
            raise BadInput("weights needs V to compute Z = A V")
        return "weights"
    raise BadInput("nothing to trace: give X with W_Q, W_K, W_V; or Q, K, V; or scores; or weights and V; or Z")
