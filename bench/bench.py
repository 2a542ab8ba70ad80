"""attntrace benchmarks: ratios against bare NumPy, naive SymPy and a bare interpreter start.

    python bench/bench.py [--quick] [--markdown FILE] [--profile]

Every number is a RATIO measured in one process (medians of alternating runs), so it means
the same on a slow or a busy machine; absolute times are printed for context only. Nothing
here asserts a wall time (tests/test_bench_smoke.py only checks that the functions run).

- numeric: a BERT-base attention layer (n=128, d_model=768, 12 heads, biases, W_O) traced by
  attntrace.run, against the natural NumPy code for it (full-width projections X W + b, then
  per head: scores of its column blocks, scale, stable softmax with row max / exp / sum, Z;
  concat, output). Goal <= 1.3x. The weights are read-only (frozen parameters, kept without
  a copy and checked for non-finite entries the first time they are seen), X writable
  (copied); further ratios: the first trace of the weights, and every input writable (all copied).
- symbolic: the article's 4x6 sentence fully symbolic (X 4x6, W_Q/W_K/W_V 6x6 symbol tables),
  traced and rendered to Markdown, against naive SymPy end to end (Matrix of symbols, X*W_Q,
  QK^T/sqrt(6), row softmax with exp, times V, then sympy.latex). Goals: >= 10x faster,
  >= 20x less text; 16x16 (X and W 16x16) at most 40x the 4x6 time.
- symbolic, fresh process: the same 4x6 report timed ONCE in a new process (its imports done
  first, untimed; Jinja's environment, templates and SymPy's caches all cold), against naive
  SymPy timed once in a new process the same way. Goal >= 30x.
- class: a folder of 1,008 answers to a two-head problem (causal, W_O; right answers at 2-4
  decimals, planted mistakes, partial, extra keys, unreadable files) graded by
  `attntrace check SPEC FOLDER --format csv` as the command does it (streamed rows), in
  answers per second of WALL time (the workers' CPU time is not this process's), with --jobs 1
  and --jobs = the cores. Goal >= 300 answers/s on 2 cores. Also the peak memory of the command
  for 1,008 and 4,032 answers (flat: it must not grow with the class).
- start-up: `python -m attntrace run <numeric spec> --format md` against
  `python -c "import numpy, jinja2"`, cold processes (median of alternating runs, both with their
  Python bytecode cached; attntrace's compiled templates in a temporary cache folder filled by
  a first, untimed run). Goal <= 1.3x. Also: the first run (no compiled templates) and whether
  SymPy gets imported in numeric mode.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _early_blas_threads(argv) -> str | None:
    """--blas-threads N must act before NumPy loads OpenBLAS: set the thread variables now."""
    for i, a in enumerate(argv):
        value = a.split("=", 1)[1] if a.startswith("--blas-threads=") else argv[i + 1] if a == "--blas-threads" and i + 1 < len(argv) else None
        if value is not None:
            if value != "0":
                for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                    os.environ[var] = value
            return value
    return None


if __name__ == "__main__":
    _early_blas_threads(sys.argv[1:] if any(a.startswith("--blas-threads") for a in sys.argv[1:]) else sys.argv[1:] + ["--blas-threads", "1"])

import numpy as np  # noqa: E402

GOALS = {"class_answers_per_s": 300.0, "numeric": 1.3, "numeric_readonly": 1.2, "numeric_writable": 1.5, "llama": 1.5,
         "llama_memory": 1.1, "llama_render_s": 2.0, "exact_gelu_s": 5.0, "symbolic_speed": 10.0, "symbolic_text": 20.0, "symbolic_16": 40.0, "symbolic_fresh": 50.0,
         "startup": 1.2, "layout_300_s": 10.0, "html_bytes": 300_000, "html_render_s": 1.0}


def _attntrace():
    import attntrace

    return attntrace


def _package_root() -> str:
    """The folder holding the attntrace package that this process imports (for subprocesses)."""
    return str(Path(_attntrace().__file__).resolve().parent.parent)


#: "cpu": this process's CPU time (robust when other jobs share the cores; BLAS is single-threaded
#: by default, so nothing spins on a second core); "wall": elapsed time.
CLOCK = {"name": "cpu"}


def _now() -> float:
    return time.process_time() if CLOCK["name"] == "cpu" else time.perf_counter()


def _timed(fn):
    gc.collect()
    t0 = _now()
    out = fn()
    return _now() - t0, out


def _alternate(fns: dict, repeats: int) -> dict:
    """Run each function `repeats` times, alternating between them; the median time of each."""
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            times[k].append(_timed(fn)[0])
    return {k: statistics.median(v) for k, v in times.items()}


# -- machine -----------------------------------------------------------------------------------
def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"), "clock": CLOCK["name"]}
    try:
        info["load_average"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover
        pass
    try:
        import sympy

        info["sympy"] = sympy.__version__
    except ImportError:  # pragma: no cover
        info["sympy"] = "-"
    return info


# -- numeric -------------------------------------------------------------------------------------
def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def bert_layer(n=128, d=768, h=12, seed=0) -> dict:
    """Random BERT-base-sized attention weights, row-vector convention, biases as (1, d) rows.

    The weights are read-only, as a trained layer's frozen parameters are: attntrace keeps
    read-only float64 inputs as they are and copies writable ones (here X, the activations).
    """
    rng = np.random.default_rng(seed)
    s = 1 / math.sqrt(d)
    return {"X": rng.normal(size=(n, d)), "num_heads": h,
            **{f"W_{k}": _frozen(rng.normal(size=(d, d)) * s) for k in "QKVO"},
            **{f"b_{k}": _frozen(rng.normal(size=(1, d)) * 0.1) for k in "QKVO"}}


def numpy_layer(p: dict, keep: list | None = None) -> np.ndarray:
    """The natural NumPy code for the same layer: full-width projections (one product each, as
    PyTorch's in_proj), then per head the scores of its column blocks, scale, stable softmax,
    Z; concat, output. With a list `keep`, every intermediate is appended to it (kept alive, as
    a trace keeps its steps)."""
    X, h = p["X"], p["num_heads"]
    Q = X @ p["W_Q"] + p["b_Q"]  # (n, h*dk)
    K = X @ p["W_K"] + p["b_K"]  # (n, h*dk)
    V = X @ p["W_V"] + p["b_V"]  # (n, h*dv)
    dk = Q.shape[1] // h
    zs = []
    for i in range(h):
        c = slice(i * dk, (i + 1) * dk)
        S = Q[:, c] @ K[:, c].T  # (n, n)
        T = S / math.sqrt(dk)  # (n, n)
        row_max = T.max(axis=1, keepdims=True)  # (n, 1)
        E = np.exp(T - row_max)  # (n, n)
        row_sum = E.sum(axis=1, keepdims=True)  # (n, 1)
        A = E / row_sum  # (n, n)
        zs.append(A @ V[:, c])  # (n, dv)
        if keep is not None:
            keep += [S, T, row_max, E, row_sum, A]
    C = np.hstack(zs)  # (n, h*dv)
    out = C @ p["W_O"] + p["b_O"]  # (n, d)
    if keep is not None:
        keep += [Q, K, V] + zs + [C]
    return out


def writable(p: dict) -> dict:
    """The same layer with every input a writable array (attntrace must copy each: 19 MB)."""
    return {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in p.items()}


def read_only(p: dict) -> dict:
    """The same layer with every input read-only, X too (a frozen model's weights and
    activations that the caller will not change): attntrace copies none of them."""
    return {k: _frozen(np.array(v)) if isinstance(v, np.ndarray) else v for k, v in p.items()}


def bench_numeric(n=128, d=768, h=12, repeats=21) -> dict:
    """attntrace.run on the BERT-base layer against bare NumPy of the same layer, in one process:
    every input read-only (goal <= 1.2x), every input writable and so copied once (goal <= 1.5x),
    writable with copy=False, and the weights frozen with X writable (the usual model call)."""
    at = _attntrace()
    p = bert_layer(n, d, h)
    out = at.run(p).step("output").value
    assert np.allclose(out, numpy_layer(p), atol=1e-9), "attntrace and NumPy disagree"
    from attntrace.inputs.spec import load_spec
    from attntrace.tracer import trace

    frozen = read_only(p)
    problem = load_spec(frozen)
    live = writable(p)
    from attntrace.inputs import matrices

    def first_sight():  # frozen weights never traced before: each checked for non-finite entries
        for v in frozen.values():  # only these: clearing every entry would make the next row check p's weights again
            matrices._FINITE.pop(id(v), None)
        return at.run(frozen)

    med = _alternate({"attntrace": lambda: at.run(p), "numpy": lambda: numpy_layer(p), "readonly": lambda: at.run(frozen),
                      "numpy_keep": lambda: numpy_layer(p, []), "load_spec": lambda: load_spec(live),
                      "trace_only": lambda: trace(problem), "writable": lambda: at.run(live),
                      "nocopy": lambda: at.run(live, copy=False), "first_sight": first_sight}, repeats)
    base = med["numpy"]
    return {"n": n, "d_model": d, "heads": h, "attntrace_s": med["attntrace"], "numpy_s": base,
            "ratio": med["attntrace"] / base, "goal": GOALS["numeric"],
            "readonly_s": med["readonly"], "readonly_ratio": med["readonly"] / base, "goal_readonly": GOALS["numeric_readonly"],
            "writable_s": med["writable"], "writable_ratio": med["writable"] / base, "goal_writable": GOALS["numeric_writable"],
            "nocopy_s": med["nocopy"], "nocopy_ratio": med["nocopy"] / base,
            "first_sight_s": med["first_sight"], "first_sight_ratio": med["first_sight"] / base,
            # where the time beyond bare NumPy goes
            "numpy_keep_s": med["numpy_keep"], "numpy_keep_ratio": med["numpy_keep"] / base,
            "load_spec_s": med["load_spec"], "load_spec_ratio": med["load_spec"] / base,
            "trace_only_s": med["trace_only"], "trace_only_ratio": med["trace_only"] / base}


# -- a Llama-3-8B-shaped decoder layer ------------------------------------------------------------
#: Llama 3 8B: d_model 4096, 32 query heads and 8 key/value heads of 128, SwiGLU with d_ff 14336.
LLAMA_8B = {"d": 4096, "heads": 32, "kv_heads": 8, "d_ff": 14336, "n": 32}


def llama_layer(d=4096, heads=32, kv_heads=8, d_ff=14336, n=32, seed=0) -> dict:
    """A Llama decoder layer's spec (pre-norm RMSNorm, RoPE, grouped-query causal attention,
    W_O, SwiGLU) with random float64 weights, read-only as a loaded model's frozen parameters."""
    rng = np.random.default_rng(seed)
    dk = d // heads

    def w(rows, cols):
        a = rng.standard_normal((rows, cols))
        a *= 1 / math.sqrt(rows)
        return _frozen(a)
    return {"block": "llama", "mask": "causal", "rope": True, "num_heads": heads, "num_kv_heads": kv_heads,
            "X": rng.standard_normal((n, d)), "W_Q": w(d, heads * dk), "W_K": w(d, kv_heads * dk), "W_V": w(d, kv_heads * dk),
            "W_O": w(heads * dk, d), "norm1": {"gain": _frozen(1 + 0.1 * rng.standard_normal((1, d))), "eps": 1e-5},
            "norm2": {"gain": _frozen(1 + 0.1 * rng.standard_normal((1, d))), "eps": 1e-5},
            "ffn": {"W_gate": w(d, d_ff), "W_up": w(d, d_ff), "W_down": w(d_ff, d)}}


def llama_weight_bytes(p: dict) -> int:
    """Bytes of the layer's parameters (what a trace must hold whatever it keeps)."""
    arrays = [v for k, v in p.items() if k.startswith("W_")] + [p["norm1"]["gain"], p["norm2"]["gain"]] + list(p["ffn"].values())
    return sum(a.nbytes for a in arrays)


def numpy_llama(p: dict, keep: list | None = None) -> np.ndarray:
    """The natural NumPy code of the same layer (as Hugging Face's LlamaDecoderLayer computes it)."""
    X, h, hkv = p["X"], p["num_heads"], p["num_kv_heads"]
    n1, n2, ffn = p["norm1"], p["norm2"], p["ffn"]
    N = X / np.sqrt((X * X).mean(axis=1, keepdims=True) + n1["eps"]) * n1["gain"]  # (n, d)
    Q, K, V = N @ p["W_Q"], N @ p["W_K"], N @ p["W_V"]  # (n, h dk), (n, hkv dk), (n, hkv dk)
    dk = Q.shape[1] // h
    pos = np.arange(X.shape[0], dtype=np.float64)
    ang = np.outer(pos, 1.0 / (10000.0 ** (np.arange(0, dk, 2, dtype=np.float64) / dk)))  # (n, dk/2)
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(M):  # rotate_half on each head's dk columns
        M = M.reshape(M.shape[0], -1, dk)
        a, b = M[..., : dk // 2], M[..., dk // 2:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1).reshape(M.shape[0], -1)
    Qr, Kr = rope(Q), rope(K)
    causal = np.tril(np.ones((X.shape[0], X.shape[0]), dtype=bool))
    zs = []
    for i in range(h):
        j = i // (h // hkv)
        q, k, v = Qr[:, i * dk:(i + 1) * dk], Kr[:, j * dk:(j + 1) * dk], V[:, j * dk:(j + 1) * dk]
        T = np.where(causal, q @ k.T / math.sqrt(dk), -np.inf)  # (n, n)
        E = np.exp(T - T.max(axis=1, keepdims=True))
        A = E / E.sum(axis=1, keepdims=True)
        zs.append(A @ v)  # (n, dk)
        if keep is not None:
            keep += [T, E, A]
    O = np.hstack(zs) @ p["W_O"]  # (n, d)
    R = X + O
    M = R / np.sqrt((R * R).mean(axis=1, keepdims=True) + n2["eps"]) * n2["gain"]
    H, U = M @ ffn["W_gate"], M @ ffn["W_up"]  # (n, d_ff)
    G = H / (1 + np.exp(-H)) * U
    Y = R + G @ ffn["W_down"]  # (n, d)
    if keep is not None:
        keep += [N, Q, K, V, Qr, Kr, O, R, M, H, U, G, Y] + zs
    return Y


def _traced_peak(fn):
    """(seconds, peak bytes NumPy and Python allocated while fn ran, bytes its result holds, result)."""
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        t0 = _now()
        result = fn()
        seconds = _now() - t0
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return seconds, peak, held, result


def llama_fits(cfg: dict, share: float = 0.25) -> bool:
    """Whether the layer's float64 weights (twice: bare NumPy and a trace share them, but a
    writable copy would double them) fit in `share` of the memory available now."""
    d, f, h, hkv = cfg["d"], cfg["d_ff"], cfg["heads"], cfg["kv_heads"]
    dk = d // h
    weights = 8 * (2 * d * h * dk + 2 * d * hkv * dk + 3 * d * f + 2 * d)
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError):  # pragma: no cover
        return True
    return 2 * weights <= share * avail


def bench_llama(cfg: dict | None = None, repeats: int = 3, render: bool = True) -> dict:
    """The Llama-3-8B-shaped layer: attntrace.run against bare NumPy of the same layer (first
    trace: the frozen weights checked once for non-finite entries; later traces), the peak
    memory of a trace (tracemalloc: what the trace allocates beyond the weights it shares)
    against weights + the steps it keeps + 10%, with every step kept and with keep=["output"],
    and the Markdown report with --max-size 8. When the weights would not fit in a quarter of
    the memory available, d and d_ff are halved (together) until they do: `scale` says so."""
    at = _attntrace()
    cfg = dict(cfg or LLAMA_8B)
    scale = 1.0
    while not llama_fits(cfg) and cfg["d"] > 256:
        cfg["d"] //= 2
        cfg["d_ff"] //= 2
        scale /= 2
    p = llama_layer(**cfg)
    weights = llama_weight_bytes(p)
    first_s, first_peak, _, trace = _traced_peak(lambda: at.run(p))
    assert np.allclose(trace.output, numpy_llama(p), atol=1e-8), "attntrace and NumPy disagree on the layer"
    del trace
    med = _alternate({"attntrace": lambda: at.run(p), "numpy": lambda: numpy_llama(p)}, repeats)
    _, peak_all, held_all, full = _traced_peak(lambda: at.run(p))
    kept_all = sum(s.value.nbytes for s in full.steps)
    last = full.output_step.id  # the layer's result: residual2
    del full
    _, peak_out, held_out, only = _traced_peak(lambda: at.run(p, keep=[last]))
    kept_out = only.output.nbytes
    out = {**cfg, "scale": scale, "weights_bytes": weights, "attntrace_s": med["attntrace"], "numpy_s": med["numpy"],
           "ratio": med["attntrace"] / med["numpy"], "first_s": first_s, "first_ratio": first_s / med["numpy"],
           "goal": GOALS["llama"], "steps": len(only.steps) + len(only.settings["not_kept"]),
           "kept_all_bytes": kept_all, "peak_all_bytes": weights + peak_all, "held_all_bytes": held_all,
           "memory_all_ratio": (weights + peak_all) / (weights + kept_all),
           "kept_out_bytes": kept_out, "peak_out_bytes": weights + peak_out, "held_out_bytes": held_out,
           "memory_out_ratio": (weights + peak_out) / (weights + kept_out), "goal_memory": GOALS["llama_memory"], "kept_id": last}
    if render:
        full = at.run(p)
        t, text = _timed(lambda: at.render(full, "md", max_size=8))
        out.update(render_s=t, render_chars=len(text), goal_render_s=GOALS["llama_render_s"])
    return out


def exact_gelu_block(n: int = 4, d_ff: int = 6) -> dict:
    """An exact post-LN encoder block with a GELU FFN: whole-number weights, W_Q = 0 so that the
    weights are 1/n (exact entries stay small enough for exact mode), LayerNorm's square roots
    and GELU's erf in every later entry."""
    def m(rows, cols, k):
        return [[((i * 3 + j * 5 + k) % 5) - 2 for j in range(cols)] for i in range(rows)]
    return {"mode": "exact", "block": "post_ln", "X": m(n, n, 1), "W_Q": [[0] * n for _ in range(n)], "W_K": m(n, n, 2),
            "W_V": m(n, n, 3), "W_O": m(n, n, 4), "norm1": {"gain": [1] * n, "bias": [0] * n},
            "norm2": {"gain": [1] * n, "bias": [0] * n}, "ffn": {"W_1": m(n, d_ff, 5), "W_2": m(d_ff, n, 6), "activation": "gelu"}}


def bench_exact(repeats: int = 3) -> dict:
    """Exact mode: the GELU block traced and rendered to Markdown in a fresh process each time
    (SymPy's caches and attntrace's evalf cache cold; goal <= 5 s), and how long the refusal
    of exact backward = true on a 4x4 two-head problem takes (refused up front by its estimate)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "gelu.json"
        spec.write_text(json.dumps(exact_gelu_block()), encoding="utf-8")
        m = lambda r, c, k: [[((i * 3 + j * 5 + k) % 5) - 2 for j in range(c)] for i in range(r)]  # noqa: E731
        back = Path(tmp) / "backward.json"
        back.write_text(json.dumps({"mode": "exact", "X": m(4, 4, 1), "W_Q": m(4, 4, 2), "W_K": m(4, 4, 3), "W_V": m(4, 4, 4),
                                    "W_O": m(4, 4, 5), "num_heads": 2, "backward": True}), encoding="utf-8")
        env = {**_env(), "ATTNTRACE_CACHE_DIR": os.path.join(tmp, "cache")}
        cmd = [sys.executable, "-m", "attntrace", "run", str(spec), "--format", "md"]
        _run(cmd, env)  # bytecode and templates
        gelu = statistics.median(_run(cmd, env) for _ in range(repeats))
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "attntrace", "run", str(back), "--format", "md"], env=env,
                              capture_output=True, text=True)
        refused = time.perf_counter() - t0
    return {"gelu_s": gelu, "goal_s": GOALS["exact_gelu_s"], "backward_rc": proc.returncode,
            "backward_refusal_s": refused, "backward_message": proc.stderr.strip()[-300:]}


#: glibc malloc settings that keep freed memory for reuse instead of returning it to the kernel.
MALLOC_REUSE = {"MALLOC_MMAP_THRESHOLD_": "268435456", "MALLOC_TRIM_THRESHOLD_": "1073741824", "MALLOC_TOP_PAD_": "268435456"}


def bench_numeric_malloc_reuse(repeats=21) -> dict | None:
    """bench_numeric in a child process whose malloc reuses freed memory: on machines where a
    page fault is expensive (this sandbox: ~10 us a page), fresh memory for the trace's copies
    and kept steps is most of the overhead; this shows the ratio without that cost."""
    if not sys.platform.startswith("linux"):
        return None
    env = {**_env(), **MALLOC_REUSE}
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); import bench; "
            f"bench.CLOCK['name'] = {CLOCK['name']!r}; print(json.dumps(bench.bench_numeric(repeats={repeats})))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"numeric bench with malloc reuse failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def profile_numeric(n=128, d=768, h=12, top=15) -> str:
    """cProfile of attntrace.run on the BERT layer: where the time beyond NumPy goes."""
    import cProfile
    import io
    import pstats

    at = _attntrace()
    p = bert_layer(n, d, h)
    at.run(p)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(10):
        at.run(p)
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


# -- symbolic ------------------------------------------------------------------------------------
def _clear_sympy_cache():
    from sympy.core.cache import clear_cache

    clear_cache()


def symbolic_spec(n: int, d: int) -> dict:
    """X (n, d) and W_Q, W_K, W_V (d, d) as symbol tables: every entry its own symbol."""
    table = lambda r, c: {"shape": [r, c]}  # noqa: E731 - default entry names x, w^{Q}, ...
    return {"X": table(n, d), "W_Q": table(d, d), "W_K": table(d, d), "W_V": table(d, d), "mode": "symbolic"}


def attntrace_symbolic(n: int, d: int, render: bool = True) -> int:
    """Trace (and render to Markdown) the fully symbolic problem; returns the text length."""
    at = _attntrace()
    t = at.run(symbolic_spec(n, d))
    if not render:
        return 0
    return len(at.render(t, format="md"))


def naive_sympy(n: int, d: int) -> int:
    """SymPy done naively end to end: returns the length of sympy.latex(Z)."""
    import sympy as sp

    sym = lambda base: sp.Matrix(n if base == "x" else d, d, lambda i, j: sp.Symbol(f"{base}_{{{i + 1}{j + 1}}}"))  # noqa: E731
    X, WQ, WK, WV = sym("x"), sym("w^{Q}"), sym("w^{K}"), sym("w^{V}")
    Q, K, V = X * WQ, X * WK, X * WV  # (n, d) each
    S = Q * K.T / sp.sqrt(d)  # (n, n)
    E = S.applyfunc(sp.exp)  # (n, n)
    A = sp.Matrix(n, n, lambda i, j: E[i, j] / sum(E[i, k] for k in range(n)))  # row softmax
    Z = A * V  # (n, d)
    return len(sp.latex(Z))


def render_available() -> bool:
    try:
        import attntrace.rendering.renderer  # noqa: F401
    except ImportError:
        return False
    return True


def bench_symbolic(n=4, d=6, big=16, repeats=3, naive_repeats=1, render=None) -> dict:
    render = render_available() if render is None else render

    def ours(size_n, size_d):
        def fn():
            _clear_sympy_cache()
            return attntrace_symbolic(size_n, size_d, render)
        return fn

    def naive():
        _clear_sympy_cache()
        return naive_sympy(n, d)

    ours(n, d)()  # warm up imports (sympy, templates)
    times = {"attntrace": [], "naive": []}
    text_ours = text_naive = 0
    for i in range(max(repeats, naive_repeats)):  # alternate while both still have runs left
        if i < repeats:
            t, text_ours = _timed(ours(n, d))
            times["attntrace"].append(t)
        if i < naive_repeats:
            t, text_naive = _timed(naive)
            times["naive"].append(t)
    t_ours, t_naive = statistics.median(times["attntrace"]), statistics.median(times["naive"])
    big_times = [_timed(ours(big, big))[0] for _ in range(max(1, repeats // 2))]
    t_big = statistics.median(big_times)
    res = {"n": n, "d": d, "rendered": render, "attntrace_s": t_ours, "naive_s": t_naive, "speedup": t_naive / t_ours,
           "big": big, "big_s": t_big, "big_ratio": t_big / t_ours}
    if render:
        res.update(attntrace_chars=text_ours, naive_chars=text_naive, text_ratio=text_naive / max(text_ours, 1))
    else:
        res.update(attntrace_chars=None, naive_chars=text_naive, text_ratio=None)
    return res


#: attntrace modules a report never needs (optional extras) or that must not be imported (__main__).
_NOT_PREIMPORTED = ("__main__", "pytorch", "huggingface", "blocks", "figures")


def _preimport_attntrace() -> None:
    """Import every module of attntrace (whatever modules it has today), as a process that is
    about to render would have: imports stay out of the timed part."""
    import importlib
    import pkgutil

    at = _attntrace()
    for m in pkgutil.walk_packages(at.__path__, prefix="attntrace."):  # subpackages too (model, rendering, ...)
        if m.name.rpartition(".")[2] not in _NOT_PREIMPORTED:
            try:
                importlib.import_module(m.name)
            except ImportError:  # pragma: no cover - an optional extra
                pass


#: SymPy modules imported on first use by naive SymPy (Matrix products, latex) or by attntrace;
#: any other module imported while timing shows in the JSON as "imported_during_timing".
_SYMPY_LAZY = ("sympy.printing.latex", "sympy.combinatorics", "sympy.tensor.tensor", "sympy.sets.setexpr", "encodings.unicode_escape")


def fresh_child(kind: str, n: int, d: int) -> dict:
    """In a new process: do the imports, then time ONE symbolic n x d run ("ours": trace +
    Markdown report; "naive": naive SymPy + latex). Returns seconds, text length and the modules
    imported during the timed part (they count against the side that imports them)."""
    import importlib

    import sympy  # noqa: F401 - both sides use it; its import is not timed

    for name in _SYMPY_LAZY:  # what SymPy imports on first use (either side), imported untimed
        importlib.import_module(name)
    if kind == "ours":
        _preimport_attntrace()
        fn = lambda: attntrace_symbolic(n, d)  # noqa: E731
    elif kind == "naive":
        fn = lambda: naive_sympy(n, d)  # noqa: E731
    else:
        raise ValueError(kind)
    before = set(sys.modules)
    seconds, chars = _timed(fn)
    return {"seconds": seconds, "chars": chars, "imported": sorted(set(sys.modules) - before)}


def _fresh(kind: str, n: int, d: int, env: dict) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); import bench; "
            f"bench.CLOCK['name'] = {CLOCK['name']!r}; print(json.dumps(bench.fresh_child({kind!r}, {n}, {d})))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"fresh {kind} run failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_symbolic_fresh(n=4, d=6, repeats=3) -> dict:
    """The symbolic n x d report timed once in a fresh process against naive SymPy timed once in
    a fresh process (imports excluded on both sides), medians of alternating runs. "ours" has the
    compiled templates that an earlier run left in its cache folder (a temporary one here, filled
    by an untimed first run); "first" is a process that must compile every template (the cache
    off), as the very first run after an install or a template edit."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**_env(), "ATTNTRACE_CACHE_DIR": os.path.join(tmp, "cache")}
        first_env = {**_env(), "ATTNTRACE_CACHE_DIR": "off"}
        _fresh("ours", n, d, env)  # fills the template cache
        runs = {"ours": [], "first": [], "naive": []}
        for _ in range(repeats):
            runs["ours"].append(_fresh("ours", n, d, env))
            runs["first"].append(_fresh("ours", n, d, first_env))
            runs["naive"].append(_fresh("naive", n, d, env))
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
    speedups = sorted(b["seconds"] / a["seconds"] for a, b in zip(runs["ours"], runs["naive"]))
    return {"n": n, "d": d, "repeats": repeats, "attntrace_s": med["ours"], "first_s": med["first"], "naive_s": med["naive"],
            "speedup": med["naive"] / med["ours"], "first_speedup": med["naive"] / med["first"],
            "speedup_range": [speedups[0], speedups[-1]], "goal": GOALS["symbolic_fresh"],
            "imported_during_timing": {k: v[-1]["imported"] for k, v in runs.items()}}


# -- start-up ----------------------------------------------------------------------------------
SMALL_SPEC = {"X": [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], "W_Q": [[1, 0], [0, 1], [1, 0], [0, 1]],
              "W_K": [[0, 1], [1, 0], [0, 1], [1, 0]], "W_V": [[1, 1], [0, 1], [1, 0], [0, 0]], "mode": "numeric"}


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = _package_root() + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PYTHONSTARTUP", None)
    return env


def _spec_file(folder: str) -> str:
    path = os.path.join(folder, "small_numeric.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(SMALL_SPEC, f)
    return path


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(cmd, env) -> float:
    """Seconds one command takes: its CPU time (clock "cpu") or the elapsed time (clock "wall")."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = (_children_cpu() - cpu0) if CLOCK["name"] == "cpu" else time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return elapsed


def sympy_import_chain(spec_path: str | None = None) -> list[str] | None:
    """None if `attntrace run <numeric spec> --format md` never imports sympy, else the import
    chain (outermost module first) that first pulls it in, from `python -X importtime`."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = spec_path or _spec_file(tmp)
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "attntrace", "run", spec_path, "--format", "md"],
                              env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"attntrace run failed: {proc.stderr.strip().splitlines()[-1:]}")
    rows = []  # (depth, module) in the order importtime prints them (children before parents)
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+\d+ \|( *)(\S+)", line)
        if m:
            rows.append((len(m.group(1)) // 2, m.group(2)))
    for i, (depth, mod) in enumerate(rows):
        if mod == "sympy" or mod.startswith("sympy."):
            chain, want = [mod], depth
            for d, parent in rows[i + 1:]:  # a parent is the next row printed with a smaller depth
                if d < want:
                    chain.append(parent)
                    want = d
            # the top-level sympy package is the one the chain names
            return [m for m in reversed(chain) if not (m == "sympy" or m.startswith("sympy."))] + ["sympy"]
    return None


def _startup_envs(tmp: str) -> dict:
    """Child environments of the start-up runs. "cached": as an installed package runs, with
    Python bytecode for every module (a temporary PYTHONPYCACHEPREFIX, on both sides: some
    sandboxes set PYTHONDONTWRITEBYTECODE) and attntrace's compiled templates in a temporary
    cache folder that the untimed first run fills. "first": the templates compiled from source
    (no cache folder), as on the first run after an install or a template edit. "no_pyc": the
    caller's environment as it is (attntrace's own modules recompiled on every start if
    PYTHONDONTWRITEBYTECODE is set), templates cached."""
    base = _env()
    cached = {**base, "PYTHONPYCACHEPREFIX": os.path.join(tmp, "pyc"), "ATTNTRACE_CACHE_DIR": os.path.join(tmp, "cache")}
    cached.pop("PYTHONDONTWRITEBYTECODE", None)
    return {"cached": cached, "first": {**cached, "ATTNTRACE_CACHE_DIR": "off"},
            "no_pyc": {**base, "ATTNTRACE_CACHE_DIR": os.path.join(tmp, "cache")}}


def bench_startup(repeats=7) -> dict:
    """Cold processes: `attntrace run <numeric spec> --format md` (a full report) against
    `python -c "import numpy, jinja2"`, medians of alternating runs; per-pair ratios give the spread."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = _spec_file(tmp)
        envs = _startup_envs(tmp)
        ours = [sys.executable, "-m", "attntrace", "run", spec, "--format", "md"]
        bare = [sys.executable, "-c", "import numpy, jinja2"]
        sentence = [sys.executable, "-m", "attntrace", "run", "sentence-4x6", "--format", "md"]  # the issue's row
        cmds = {"attntrace": (ours, envs["cached"]), "bare": (bare, envs["cached"]), "sentence": (sentence, envs["cached"]),
                "first": (ours, envs["first"]), "no_pyc": (ours, envs["no_pyc"])}
        for cmd, env in cmds.values():  # fill the bytecode caches and the file cache
            _run(cmd, env)
        times = {k: [] for k in cmds}
        for _ in range(repeats):
            for k, (cmd, env) in cmds.items():
                times[k].append(_run(cmd, env))
        chain = sympy_import_chain(spec)
    med = {k: statistics.median(v) for k, v in times.items()}
    pairs = sorted(a / b for a, b in zip(times["attntrace"], times["bare"]))
    sentence_pairs = sorted(a / b for a, b in zip(times["sentence"], times["bare"]))
    return {"attntrace_s": med["attntrace"], "bare_s": med["bare"], "ratio": med["attntrace"] / med["bare"],
            "ratio_range": [pairs[0], pairs[-1]], "goal": GOALS["startup"], "repeats": repeats,
            "sentence_s": med["sentence"], "sentence_ratio": med["sentence"] / med["bare"],
            "sentence_range": [sentence_pairs[0], sentence_pairs[-1]],
            "first_s": med["first"], "first_ratio": med["first"] / med["bare"],
            "no_pyc_s": med["no_pyc"], "no_pyc_ratio": med["no_pyc"] / med["bare"],
            "sympy_imported": chain is not None, "sympy_chain": chain}


# -- layout: --max-size on a long sequence ------------------------------------------------------
def layout_spec(n: int, d: int = 4) -> dict:
    """n tokens of width d: the scores and weights are n x n."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(d, d)).round(2)
    return {"X": rng.normal(size=(n, d)).round(2), "W_Q": w, "W_K": w, "W_V": w}


def bench_layout(n=300, small=60, repeats=3) -> dict:
    """Markdown of an n-token trace with max_size 1000 (every row printed, columns cut to fit
    the page) against the same report at max_size 8, and against `small` tokens at max_size
    1000: the cost follows what is printed (n rows), not n x n cells laid out again per column
    dropped (issue 20: over 5 minutes for 300 tokens before)."""
    at = _attntrace()
    traces = {k: at.run(layout_spec(size)) for k, size in (("big", n), ("small", small))}
    out = {}

    def fn(key, max_size):
        return lambda: out.setdefault((key, max_size), len(at.render(traces[key], "md", max_size=max_size)))
    med = _alternate({"big_1000": fn("big", 1000), "big_8": fn("big", 8), "small_1000": fn("small", 1000)}, repeats)
    return {"n": n, "small": small, "big_1000_s": med["big_1000"], "big_8_s": med["big_8"], "small_1000_s": med["small_1000"],
            "chars_ratio": out[("big", 1000)] / out[("small", 1000)], "time_ratio": med["big_1000"] / med["small_1000"],
            "max8_ratio": med["big_1000"] / med["big_8"], "goal_s": GOALS["layout_300_s"]}


_TIMING = ("<script>addEventListener('load', function () { document.body.offsetHeight;"
           " var p = document.createElement('pre'); p.id = 'bench-ms'; p.textContent = performance.now();"
           " document.body.appendChild(p); });</script>")


def _chromium_ms(exe: str, url: str, profile: str) -> float:
    """Milliseconds from the start of navigation to the load event with the layout done, as the
    page itself measures them (Chromium's own start-up is not counted)."""
    proc = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-proxy-server", f"--user-data-dir={profile}",
                           "--window-size=820,1000", "--dump-dom", url], capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="bench-ms">([\d.]+)</pre>', proc.stdout)
    if not m:
        raise RuntimeError(f"chromium gave no timing: {proc.stderr[-500:]}")
    return float(m.group(1))


def bench_html(repeats=5) -> dict:
    """`sentence-4x6` as a self-contained HTML page: its size, and Chromium's time to load and
    lay it out (navigation start to the load event with layout forced, measured in the page,
    median of headless runs; an empty page's time for context; None when Chromium is missing)."""
    import shutil

    from attntrace import run
    from attntrace.rendering.html import render_html

    page = render_html(run("sentence-4x6"))
    out = {"bytes": len(page.encode("utf-8")), "goal_bytes": GOALS["html_bytes"], "render_s": None,
           "goal_s": GOALS["html_render_s"]}
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    if exe is None:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        full, empty = Path(tmp) / "page.html", Path(tmp) / "empty.html"
        full.write_text(page.replace("</body>", _TIMING + "</body>"), encoding="utf-8")
        empty.write_text("<!DOCTYPE html><html><body>" + _TIMING + "</body></html>", encoding="utf-8")
        profile = os.path.join(tmp, "profile")
        _chromium_ms(exe, empty.as_uri(), profile)  # the profile is created once, untimed
        times = {"page": [], "empty": []}
        for _ in range(repeats):
            times["page"].append(_chromium_ms(exe, full.as_uri(), profile))
            times["empty"].append(_chromium_ms(exe, empty.as_uri(), profile))
    out["render_s"] = statistics.median(times["page"]) / 1e3
    out["empty_s"] = statistics.median(times["empty"]) / 1e3
    return out


# -- report ------------------------------------------------------------------------------------
# -- class grading ------------------------------------------------------------------------------
CLASS_VARIANTS = ("right-2", "right-3", "right-4", "missing_scale", "column_softmax", "skipped_softmax",
                  "transposed_scores", "head_order", "partial", "slip", "extra_key", "unreadable")


def class_problem(seed: int = 0) -> dict:
    """Two heads (d_k = 2), three tokens, a causal mask and W_O; one-decimal numbers."""
    rng = np.random.default_rng(seed)
    r = lambda *shape: np.round(rng.uniform(-1, 1, size=shape), 1)  # noqa: E731
    return {"X": rng.integers(-3, 4, size=(3, 4)).astype(float).tolist(), "W_Q": r(4, 4).tolist(), "W_K": r(4, 4).tolist(),
            "W_V": r(4, 4).tolist(), "W_O": r(4, 4).tolist(), "num_heads": 2, "mask": "causal"}


def class_answer(spec: dict, variant: str) -> str:
    """One student's answer file (TOML), computed here in NumPy from their own rounded values."""
    if variant == "unreadable":
        return "weights@1 = [[0.5, 0.5]\n"
    decimals = int(variant[-1]) if variant.startswith("right") else 3
    rd = lambda a: np.round(a, decimals)  # noqa: E731
    X = np.array(spec["X"])
    out, zs = {}, []
    with np.errstate(all="ignore"):  # skipped_softmax: -inf weights, nothing after them is written
        return _class_answer(spec, variant, decimals, rd, X, out, zs)


def _class_answer(spec, variant, decimals, rd, X, out, zs) -> str:
    for h in (1, 2):
        cols = slice(2 * (h - 1), 2 * h)
        m = variant if h == 1 or variant == "column_softmax" else None
        Q, K, V = (rd(X @ np.array(spec[w])[:, cols]) for w in ("W_Q", "W_K", "W_V"))
        if variant == "slip" and h == 1:
            Q = Q.copy()
            Q[0, 0] += 1
        S = rd(K @ Q.T if m == "transposed_scores" else Q @ K.T)
        T = rd(S if m == "missing_scale" else S / np.sqrt(2))
        M = np.where(np.tril(np.ones((3, 3), dtype=bool)), T, -np.inf)
        ax = 0 if m == "column_softmax" and h == 2 else 1
        e = np.exp(M - M.max(axis=ax, keepdims=True))
        A = rd(M if m == "skipped_softmax" else e / e.sum(axis=ax, keepdims=True))
        Z = rd(A @ V)
        out.update({f"Q@{h}": Q, f"K@{h}": K, f"V@{h}": V, f"scores@{h}": S, f"scaled@{h}": T, f"masked@{h}": M,
                    f"weights@{h}": A, f"Z@{h}": Z})
        zs.append(Z)
    C = rd(np.hstack(zs[::-1] if variant == "head_order" else zs))
    out.update({"concat": C, "output": rd(C @ np.array(spec["W_O"]))})
    if variant == "partial":
        out = {k: v for k, v in out.items() if k.startswith(("weights", "Z", "output"))}
    if variant == "skipped_softmax":
        out = {k: v for k, v in out.items() if not k.startswith(("Z@1", "concat", "output"))}
    fmt = lambda x: "-inf" if x == -np.inf else f"{x:.{decimals}f}"  # noqa: E731
    lines = [f'student = "{variant}"'] + (['date = "2026-12-01"'] if variant == "extra_key" else [])
    lines += [f'"{k}" = [' + ", ".join("[" + ", ".join(fmt(x) for x in row) + "]" for row in v) + "]" for k, v in out.items()]
    return "\n".join(lines) + "\n"


def write_class(folder: Path, n_answers: int = 1008, seed: int = 0) -> Path:
    """The problem (folder/problem.json) and n_answers answers (folder/answers/*.toml)."""
    spec = class_problem(seed)
    (folder / "answers").mkdir(parents=True, exist_ok=True)
    texts = {v: class_answer(spec, v) for v in CLASS_VARIANTS}
    for i in range(n_answers):
        v = CLASS_VARIANTS[i % len(CLASS_VARIANTS)]
        (folder / "answers" / f"{i:05d}-{v}.toml").write_text(texts[v].replace(f'student = "{v}"', f'student = "{v} {i}"'),
                                                             encoding="utf-8")
    path = folder / "problem.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


def _grade_class(spec: Path, answers: Path, jobs: int) -> int:
    """What `attntrace check SPEC FOLDER --format csv --jobs N` does, its rows thrown away."""
    from attntrace.teach.classcheck import Tally, csv_row, prepare, results

    g, items, _ = prepare(str(spec), answers, weights=None, mode=None, atol=None, rtol=None, decimals=None, lang="en")
    tally = Tally(g.trace, g.weights, keep_rows=False)
    for s in results(g, items, jobs):
        tally.add(s)
        csv_row(s, g.weights)
    return tally.n


def _peak_rss_mb(spec: Path, answers: Path, jobs: int) -> float:
    """Peak resident memory (MB) of the command itself, grading to /dev/null: the process's own
    high-water mark (VmHWM). Not ru_maxrss: Linux carries it over from the parent through fork and
    exec, so after the Llama layer the class's row reported this script's 1.7-2.7 GB."""
    code = ("import os, re, resource, sys\nfrom attntrace.cli import main\n"
            f"main(['check', {str(spec)!r}, {str(answers)!r}, '--format', 'csv', '--jobs', '{jobs}', '-o', '/dev/null'])\n"
            "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()) if os.path.exists('/proc/self/status') else None\n"
            "sys.stdout.write(hwm.group(1) if hwm else str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), check=True).stdout
    return int(out.strip().splitlines()[-1]) / 1024


def bench_class(n_answers: int = 1008, jobs: int | None = None, repeats: int = 3, memory: bool = True) -> dict:
    """Answers per second (wall time) grading a class, --jobs 1 and --jobs = cores."""
    from attntrace.teach.classgrade import default_jobs

    jobs = jobs or default_jobs()
    with tempfile.TemporaryDirectory() as tmp:
        spec = write_class(Path(tmp), n_answers)
        answers = Path(tmp) / "answers"
        _grade_class(spec, answers, 1)  # warm: imports, templates
        times = {}
        for j in dict.fromkeys((1, jobs)):
            runs = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                assert _grade_class(spec, answers, j) == n_answers
                runs.append(time.perf_counter() - t0)
            times[j] = statistics.median(runs)
        t0 = time.process_time()
        _grade_class(spec, answers, 1)
        cpu = time.process_time() - t0  # one core's worth of work, whatever else the machine runs
        out = {"answers": n_answers, "jobs": jobs, "serial_s": times[1], "parallel_s": times[jobs],
               "serial_cpu_s": cpu, "serial_per_cpu_s": n_answers / cpu,
               "serial_per_s": n_answers / times[1], "parallel_per_s": n_answers / times[jobs]}
        if memory:
            big = Path(tmp) / "big"
            write_class(big, 4 * n_answers)
            out["rss_mb"] = _peak_rss_mb(spec, answers, jobs)
            out["rss_4x_mb"] = _peak_rss_mb(big / "problem.json", big / "answers", jobs)
    return out


def profile_class(n_answers: int = 240, top: int = 20) -> str:
    """cProfile of grading a class in one process (where the per-answer time goes)."""
    import cProfile
    import io as _io
    import pstats

    with tempfile.TemporaryDirectory() as tmp:
        spec = write_class(Path(tmp), n_answers)
        _grade_class(spec, Path(tmp) / "answers", 1)
        prof = cProfile.Profile()
        prof.enable()
        _grade_class(spec, Path(tmp) / "answers", 1)
        prof.disable()
    buf = _io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def _ok(value, goal, le=True) -> str:
    if value is None:
        return "n/a"
    return "yes" if (value <= goal if le else value >= goal) else "**NO**"


def markdown(results: dict) -> str:
    m = results["machine"]
    lines = [f"# attntrace benchmarks", "",
             f"Machine: {m['cpu']}, {m['cores']} cores (BLAS threads: {m['blas_threads']}); Python {m['python']}, "
             f"NumPy {m['numpy']}, SymPy {m['sympy']}.",
             f"Clock: {'process CPU time' if m['clock'] == 'cpu' else 'wall time'}; load average at the end: {m.get('load_average', '-')}. "
             "Ratios are medians of alternating runs in one process; times for context only.", "",
             "| benchmark | attntrace | reference | ratio | goal | met |", "|---|---|---|---|---|---|"]
    nu = results.get("numeric")
    if nu:
        head = f"numeric: BERT-base layer (n={nu['n']}, d={nu['d_model']}, {nu['heads']} heads, W_O) vs bare NumPy, one BLAS thread"
        lines.append(f"| {head}, every input read-only | {nu['readonly_s'] * 1e3:.2f} ms | {nu['numpy_s'] * 1e3:.2f} ms "
                     f"| {nu['readonly_ratio']:.2f}x | <= {nu['goal_readonly']}x | {_ok(nu['readonly_ratio'], nu['goal_readonly'])} |")
        lines.append(f"| {head}, every input writable (copied once: 19 MB) | {nu['writable_s'] * 1e3:.2f} ms | {nu['numpy_s'] * 1e3:.2f} ms "
                     f"| {nu['writable_ratio']:.2f}x | <= {nu['goal_writable']}x | {_ok(nu['writable_ratio'], nu['goal_writable'])} |")
        lines.append(f"| - every input writable, `copy=False` (read-only views, checked finite) | {nu['nocopy_s'] * 1e3:.2f} ms "
                     f"| {nu['numpy_s'] * 1e3:.2f} ms | {nu['nocopy_ratio']:.2f}x | - | - |")
        lines.append(f"| - weights frozen, X writable (a model's usual call) | {nu['attntrace_s'] * 1e3:.2f} ms | {nu['numpy_s'] * 1e3:.2f} ms "
                     f"| {nu['ratio']:.2f}x | - | - |")
        lines.append(f"| - of which: loading the writable spec (the copies and their checks) | {nu['load_spec_s'] * 1e3:.2f} ms "
                     f"| {nu['numpy_s'] * 1e3:.2f} ms | {nu['load_spec_ratio']:.2f}x | - | - |")
        lines.append(f"| - of which: tracing a loaded problem | {nu['trace_only_s'] * 1e3:.2f} ms | {nu['numpy_s'] * 1e3:.2f} ms "
                     f"| {nu['trace_only_ratio']:.2f}x | - | - |")
        lines.append(f"| - NumPy keeping every step alive (as a trace must) | {nu['numpy_keep_s'] * 1e3:.2f} ms "
                     f"| {nu['numpy_s'] * 1e3:.2f} ms | {nu['numpy_keep_ratio']:.2f}x | - | - |")
        lines.append(f"| - the first trace of frozen weights (each checked for non-finite entries once) | {nu['first_sight_s'] * 1e3:.2f} ms "
                     f"| {nu['numpy_s'] * 1e3:.2f} ms | {nu['first_sight_ratio']:.2f}x | - | - |")
    ll = results.get("llama")
    if ll:
        shape = (f"d={ll['d']}, {ll['heads']} query / {ll['kv_heads']} KV heads, d_ff={ll['d_ff']}, n={ll['n']}, float64"
                 + ("" if ll["scale"] == 1 else f"; d and d_ff scaled by {ll['scale']:g}: the full 8B weights do not fit"))
        gb = ll["weights_bytes"] / 1e9
        lines.append(f"| Llama-3-8B-shaped layer ({shape}; weights {gb:.2f} GB, read-only) vs bare NumPy, {ll['steps']} steps "
                     f"| {ll['attntrace_s']:.3f} s | {ll['numpy_s']:.3f} s | {ll['ratio']:.2f}x | <= {ll['goal']}x | {_ok(ll['ratio'], ll['goal'])} |")
        lines.append(f"| - the first trace (every weight checked for non-finite entries once) | {ll['first_s']:.3f} s | {ll['numpy_s']:.3f} s "
                     f"| {ll['first_ratio']:.2f}x | - | - |")
        lines.append(f"| - peak memory, every step kept: weights + the trace's peak vs weights + kept steps ({ll['kept_all_bytes'] / 1e6:.1f} MB) "
                     f"| {ll['peak_all_bytes'] / 1e9:.3f} GB | {(ll['weights_bytes'] + ll['kept_all_bytes']) / 1e9:.3f} GB "
                     f"| {ll['memory_all_ratio']:.3f}x | <= {ll['goal_memory']}x | {_ok(ll['memory_all_ratio'], ll['goal_memory'])} |")
        lines.append(f"| - peak memory, `keep=[\"{ll.get('kept_id', 'output')}\"]` (the layer's result, {ll['kept_out_bytes'] / 1e6:.2f} MB kept; "
                     f"held after: {ll['held_out_bytes'] / 1e6:.2f} MB) "
                     f"| {ll['peak_out_bytes'] / 1e9:.3f} GB | {(ll['weights_bytes'] + ll['kept_out_bytes']) / 1e9:.3f} GB "
                     f"| {ll['memory_out_ratio']:.3f}x | <= {ll['goal_memory']}x | {_ok(ll['memory_out_ratio'], ll['goal_memory'])} |")
        if "render_s" in ll:
            lines.append(f"| - Markdown report of the whole layer, `--max-size 8` ({ll['render_chars'] / 1e3:.0f} KB) | {ll['render_s']:.2f} s | - | - "
                         f"| <= {ll['goal_render_s']} s | {_ok(ll['render_s'], ll['goal_render_s'])} |")
    nr = results.get("numeric_malloc_reuse")
    if nr:
        lines.append(f"| numeric BERT-base, malloc reusing freed memory (no page faults for fresh arrays): read-only / writable "
                     f"| {nr['readonly_s'] * 1e3:.2f} / {nr['writable_s'] * 1e3:.2f} ms | {nr['numpy_s'] * 1e3:.2f} ms "
                     f"| {nr['readonly_ratio']:.2f}x / {nr['writable_ratio']:.2f}x | - | - |")
    sy = results.get("symbolic")
    if sy:
        what = "trace + Markdown" if sy["rendered"] else "trace only (render.py missing)"
        lines.append(f"| symbolic {sy['n']}x{sy['d']} ({what}) vs naive SymPy + latex: speed-up | {sy['attntrace_s']:.3f} s "
                     f"| {sy['naive_s']:.3f} s | {sy['speedup']:.1f}x faster | >= {GOALS['symbolic_speed']}x "
                     f"| {_ok(sy['speedup'], GOALS['symbolic_speed'], le=False)} |")
        if sy["text_ratio"] is not None:
            lines.append(f"| symbolic {sy['n']}x{sy['d']}: text size | {sy['attntrace_chars']:,} chars | {sy['naive_chars']:,} chars "
                         f"| {sy['text_ratio']:.1f}x less | >= {GOALS['symbolic_text']}x | {_ok(sy['text_ratio'], GOALS['symbolic_text'], le=False)} |")
        else:
            lines.append(f"| symbolic {sy['n']}x{sy['d']}: text size | n/a | {sy['naive_chars']:,} chars | n/a | >= {GOALS['symbolic_text']}x | n/a |")
        lines.append(f"| symbolic {sy['big']}x{sy['big']} vs {sy['n']}x{sy['d']} ({what}) | {sy['big_s']:.3f} s | {sy['attntrace_s']:.3f} s "
                     f"| {sy['big_ratio']:.1f}x | <= {GOALS['symbolic_16']}x | {_ok(sy['big_ratio'], GOALS['symbolic_16'])} |")
    sf = results.get("symbolic_fresh")
    if sf:
        lo, hi = sf["speedup_range"]
        lines.append(f"| symbolic {sf['n']}x{sf['d']} report timed once in a fresh process vs naive SymPy + latex the same way "
                     f"(imports excluded on both sides) | {sf['attntrace_s']:.3f} s | {sf['naive_s']:.3f} s "
                     f"| {sf['speedup']:.1f}x faster ({lo:.0f}-{hi:.0f}x) | >= {GOALS['symbolic_fresh']}x "
                     f"| {_ok(sf['speedup'], GOALS['symbolic_fresh'], le=False)} |")
        lines.append(f"| - first run ever (every template compiled: no template cache) | {sf['first_s']:.3f} s | {sf['naive_s']:.3f} s "
                     f"| {sf['first_speedup']:.1f}x faster | - | - |")
    ex = results.get("exact")
    if ex:
        lines.append(f"| exact: post-LN block with a GELU FFN (4 tokens, d_ff 6), `run --format md`, whole process "
                     f"| {ex['gelu_s']:.2f} s | - | - | <= {ex['goal_s']} s | {_ok(ex['gelu_s'], ex['goal_s'])} |")
        est = re.search(r"an estimated [^)]*", ex["backward_message"])
        lines.append(f"| - exact `backward = true`, 4x4, 2 heads: refused up front (exit {ex['backward_rc']}"
                     f"{', ' + est.group(0) if est else ''}) | {ex['backward_refusal_s']:.2f} s | - | - | refused | "
                     f"{'yes' if ex['backward_rc'] == 2 else '**NO**'} |")
    la = results.get("layout")
    if la:
        lines.append(f"| layout: {la['n']} tokens, Markdown, --max-size 1000 vs {la['small']} tokens (report {la['chars_ratio']:.1f}x "
                     f"longer) | {la['big_1000_s']:.2f} s | {la['small_1000_s']:.2f} s | {la['time_ratio']:.1f}x "
                     f"| <= {la['goal_s']} s | {_ok(la['big_1000_s'], la['goal_s'])} |")
        lines.append(f"| - the same {la['n']} tokens with --max-size 8 | {la['big_8_s']:.2f} s | {la['big_1000_s']:.2f} s "
                     f"| {la['big_8_s'] / la['big_1000_s']:.2f}x | - | - |")
    st = results.get("startup")
    if st:
        lo, hi = st["ratio_range"]
        lines.append(f"| start-up: `attntrace run` numeric spec `--format md` (a full report) vs `python -c \"import numpy, jinja2\"`, "
                     f"cold processes | {st['attntrace_s'] * 1e3:.0f} ms | {st['bare_s'] * 1e3:.0f} ms | {st['ratio']:.2f}x ({lo:.2f}-{hi:.2f}x) "
                     f"| <= {GOALS['startup']}x | {_ok(st['ratio'], GOALS['startup'])} |")
        lo, hi = st["sentence_range"]
        lines.append(f"| start-up: `attntrace run sentence-4x6 --format md` (the issue's row: a 4x6 report, a title with math) "
                     f"vs the same | {st['sentence_s'] * 1e3:.0f} ms | {st['bare_s'] * 1e3:.0f} ms | {st['sentence_ratio']:.2f}x "
                     f"({lo:.2f}-{hi:.2f}x) | <= {GOALS['startup']}x | {_ok(st['sentence_ratio'], GOALS['startup'])} |")
        lines.append(f"| - first run (every template compiled: no template cache) | {st['first_s'] * 1e3:.0f} ms | {st['bare_s'] * 1e3:.0f} ms "
                     f"| {st['first_ratio']:.2f}x | - | - |")
        lines.append(f"| - attntrace's modules without .pyc (PYTHONDONTWRITEBYTECODE, as this sandbox sets) | {st['no_pyc_s'] * 1e3:.0f} ms "
                     f"| {st['bare_s'] * 1e3:.0f} ms | {st['no_pyc_ratio']:.2f}x | - | - |")
        chain = " -> ".join(st["sympy_chain"]) if st["sympy_chain"] else "-"
        lines.append(f"| start-up: SymPy imported in numeric mode? | {'**yes**: ' + chain if st['sympy_imported'] else 'no'} "
                     f"| - | - | no | {'**NO**' if st['sympy_imported'] else 'yes'} |")
    ht = results.get("html")
    if ht:
        lines.append(f"| html: `sentence-4x6` page size (self-contained: MathML, inline CSS/JS/SVG) | {ht['bytes'] / 1000:.0f} KB "
                     f"| - | - | < {ht['goal_bytes'] / 1000:.0f} KB | {_ok(ht['bytes'], ht['goal_bytes'] - 1)} |")
        if ht["render_s"] is not None:
            lines.append(f"| html: Chromium loads and lays out `sentence-4x6` (navigation to load event, layout forced, measured in the page) "
                         f"| {ht['render_s']:.2f} s | {ht['empty_s']:.2f} s (empty page) | - | < {ht['goal_s']} s "
                         f"| {_ok(ht['render_s'], ht['goal_s'])} |")
    cl = results.get("class")
    if cl:
        goal = GOALS["class_answers_per_s"]
        lines.append(f"| class: {cl['answers']:,} answers to a two-head problem, `--jobs {cl['jobs']}` (WALL time) "
                     f"| {cl['parallel_per_s']:.0f} answers/s | {cl['serial_per_s']:.0f} answers/s with --jobs 1 "
                     f"| {cl['parallel_s']:.2f} s vs {cl['serial_s']:.2f} s | >= {goal:.0f}/s | {_ok(cl['parallel_per_s'], goal, le=False)} |")
        lines.append(f"| - --jobs 1 in answers per CPU second of this process (what one idle core would do) "
                     f"| {cl['serial_per_cpu_s']:.0f} answers/s | - | {cl['serial_cpu_s']:.2f} s CPU | - | - |")
        if "rss_mb" in cl:
            lines.append(f"| - peak memory of the command, {cl['answers']:,} vs {4 * cl['answers']:,} answers (csv, streamed) "
                         f"| {cl['rss_mb']:.0f} MB | {cl['rss_4x_mb']:.0f} MB | {cl['rss_4x_mb'] / cl['rss_mb']:.2f}x | flat | - |")
    return "\n".join(lines) + "\n"


def run_all(quick: bool = False, only=None) -> dict:
    results = {}
    only = set(only or ("numeric", "llama", "exact", "symbolic", "startup", "layout", "html", "class"))
    if "llama" in only:  # first: the largest allocation, before the other benches fragment memory
        results["llama"] = bench_llama(repeats=1 if quick else 3)
    if "exact" in only:
        results["exact"] = bench_exact(repeats=1 if quick else 3)
    if "numeric" in only:
        results["numeric"] = bench_numeric(repeats=9 if quick else 21)
        results["numeric_malloc_reuse"] = bench_numeric_malloc_reuse(repeats=9 if quick else 21)
    if "symbolic" in only:
        results["symbolic"] = bench_symbolic(repeats=1 if quick else 5, naive_repeats=1 if quick else 3)
        results["symbolic_fresh"] = bench_symbolic_fresh(repeats=1 if quick else 3)
    if "startup" in only:
        results["startup"] = bench_startup(repeats=3 if quick else 21)
    if "layout" in only:
        results["layout"] = bench_layout(repeats=1 if quick else 3)
    if "html" in only:
        results["html"] = bench_html(repeats=3 if quick else 7)
    if "class" in only:
        results["class"] = bench_class(repeats=1 if quick else 3)
    results["machine"] = machine()
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", type=Path, default=None, help="also write the table to FILE")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw numbers to FILE")
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--only", action="append", choices=("numeric", "llama", "exact", "symbolic", "startup", "layout", "html", "class"), help="run only these (repeatable)")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the numeric trace")
    ap.add_argument("--profile-class", action="store_true", help="print a cProfile of grading a class in one process")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="CPU time of this process (default) or wall time")
    ap.add_argument("--blas-threads", default="1", help="OpenBLAS threads (default 1: stable ratios on a shared machine; 0 = library default)")
    args = ap.parse_args(argv)
    CLOCK["name"] = args.clock
    results = run_all(quick=args.quick, only=args.only)
    table = markdown(results)
    sys.stdout.write(table)
    if args.markdown:
        args.markdown.write_text(table, encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    if args.profile:
        sys.stdout.write("\n```\n" + profile_numeric() + "```\n")
    if args.profile_class:
        sys.stdout.write("\n```\n" + profile_class() + "```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
