"""Host time per call of every ``tiletune.kernels`` op vs torch's route for the same op (issue 12, item 2).

Small problems (M = 1, 8, 128 rows/tokens, bf16), where the GPU waits for the host: what a call
costs in Python + driver time decides the step time there.

Rows (see :func:`row_specs`): rms_norm (with weight; without weight at M=8), rms_norm_residual,
layer_norm, softmax, swiglu, geglu ([M, 4096] rows or [M, 2*4096] gated inputs), apply_rope_ (q
[1, M, 32, 128] and k [1, M, 8, 128], views of one qkv tensor, in place), cross_entropy ([M, 32000],
M = 8 and 128), matmul (K = N = 4096, weight as ``w.t()`` of an nn.Linear [N, K] weight and as a
[K, N] tensor) and attention (q, k, v [1, 32, 128, 128], causal and not).

Method, per row:

1. inputs; each tiletune op is called a few times first (it tunes on its first call with a new
   shape, seconds, never timed; ``first_call_s`` records it) and every torch candidate too;
2. agreement: tiletune and each torch candidate run once on identical fresh inputs and the outputs
   are compared (``torch.testing.assert_close``, bf16 tolerances per op; matmul's atol scales with
   the output's magnitude); a mismatch is recorded (``agree: false``), not raised;
3. GPU time: 20 calls captured into a ``torch.cuda.CUDAGraph`` and replayed between CUDA events
   (median of 10 replays, divided by 20; warm L2). The graph's node count gives the launches per
   call. A failed capture leaves the GPU time null with the error;
4. torch route: where torch has several eager formulations (rope, matmul, the GLUs, the norms'
   ``F.*`` vs ``torch.*`` entry points, softmax), the candidates that agree with tiletune are timed
   interleaved (host time, as below) and the fastest is the row's ``torch_route``;
5. host time: a batch of n calls timed with ``time.perf_counter`` around the Python loop only,
   then ``torch.cuda.synchronize()`` after the timer stops, so GPU execution is not counted. n is
   ``--calls`` (300) capped so that a batch queues at most ``QUEUE_BUDGET`` launches (from the graph's
   node count), far below the driver's launch queue: a full queue would block the host and
   count GPU time. tiletune and torch batches alternate (A, B, A, B, ... ``--rounds`` 15 rounds) with
   the garbage collector off; the median per-call time of each is reported and
   ``ratio = tiletune_host_us / torch_host_us``.

Every op uses one fresh temporary tuning database (``TILETUNE_DB`` set before tiletune is imported,
plus ``LibraryOp.configure(db=...)``), so a run does not depend on earlier tunings.

    cd benchmarks && python host_cost.py [--out DIR] [--quick] [--only SUBSTRING]

Writes ``host_cost.json`` (rows + max_ratio, rows_over_1, geomean_ratio, method) and prints a table.
This module imports only the standard library at the top: ``row_specs`` and ``summarize`` run on CPU.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from _common import write_result  # stdlib only at import

HIDDEN = 4096  # rows of the norms / softmax, H of the GLUs, K = N of the matmuls
VOCAB = 32000
ROPE_HEADS = (32, 8)  # query heads, key/value heads
HEAD_DIM = 128
ATTN_SHAPE = (1, 32, 128, 128)  # B, H, S, D
MS = (1, 8, 128)
CE_MS = (8, 128)
GRAPH_CALLS = 20
GRAPH_SAMPLES = 10
#: at most this many launches queued by one host-time batch (the driver's queue holds about 1024)
QUEUE_BUDGET = 512
MIN_CALLS = 20

METHOD = (
    "Host time: per variant a batch of n calls timed with time.perf_counter around the Python loop only; "
    "torch.cuda.synchronize() after the timer stops (GPU execution not counted); n = --calls capped so a "
    f"batch queues <= {QUEUE_BUDGET} launches (launches per call from the CUDA graph's node count); tiletune and "
    "torch batches alternate for --rounds rounds with gc off; median per-call figure; ratio = tiletune / torch. "
    "Every tiletune op tuned (first calls, untimed) before timing, in a fresh temporary tuning database. "
    "torch route: the fastest (host time, interleaved pre-pass) of the eager formulations that agree with "
    f"tiletune. GPU time: {GRAPH_CALLS} calls captured in a torch.cuda.CUDAGraph, replayed between CUDA events, "
    f"median of {GRAPH_SAMPLES} replays / {GRAPH_CALLS} (warm L2). Agreement: torch.testing.assert_close of "
    "tiletune vs each torch candidate on identical fresh inputs (bf16 tolerances per op)."
)


# --------------------------------------------------------------------------------------------
# row specification (pure, CPU)
# --------------------------------------------------------------------------------------------


def _row(op: str, variant: str, m: int | None, shape: str, **params: Any) -> dict[str, Any]:
    name = op + (f"[{variant}]" if variant else "") + (f" M={m}" if m is not None else "")
    return {"name": name, "op": op, "variant": variant, "m": m, "shape": shape, "dtype": "bfloat16", **params}


def row_specs(quick: bool = False) -> list[dict[str, Any]]:
    """Every row of the benchmark, in order (pure: no torch, no GPU).

    Each spec has ``name`` (unique), ``op`` (a name of ``tiletune.kernels.__all__``), ``variant``,
    ``m`` (rows/tokens, None for attention), ``shape`` (text) and the op's parameters.
    """
    ms = (8,) if quick else MS
    ce_ms = tuple(m for m in CE_MS if m in ms)
    n = HIDDEN
    hq, hk = ROPE_HEADS
    d = HEAD_DIM
    rows: list[dict[str, Any]] = []
    for m in ms:
        rows.append(_row("rms_norm", "weight", m, f"{m}x{n}", weight=True))
        if m == 8:
            rows.append(_row("rms_norm", "no weight", m, f"{m}x{n}", weight=False))
    rows += [_row("rms_norm_residual", "", m, f"{m}x{n} (x, residual)") for m in ms]
    rows += [_row("layer_norm", "", m, f"{m}x{n}") for m in ms]
    rows += [_row("softmax", "", m, f"{m}x{n}") for m in ms]
    rows += [_row("swiglu", "", m, f"{m}x{2 * n}") for m in ms]
    rows += [_row("geglu", "", m, f"{m}x{2 * n}") for m in ms]
    rows += [_row("apply_rope_", "", m, f"q 1x{m}x{hq}x{d}, k 1x{m}x{hk}x{d} (views of qkv), cos/sin {m}x{d}")
             for m in ms]
    rows += [_row("cross_entropy", "", m, f"{m}x{VOCAB} int64 target") for m in ce_ms]
    for m in ms:
        rows.append(_row("matmul", "w.t()", m, f"{m}x{n} @ ({n}x{n}).t(), w stored [N, K]", layout="nk"))
        rows.append(_row("matmul", "KxN", m, f"{m}x{n} @ {n}x{n}, b stored [K, N]", layout="kn"))
    b, h, s, hd = ATTN_SHAPE
    for causal in (False, True):
        rows.append(_row("attention", "causal" if causal else "non-causal", None, f"{b}x{h}x{s}x{hd} (q, k, v)",
                         causal=causal))
    return rows


# --------------------------------------------------------------------------------------------
# summary and table (pure, CPU)
# --------------------------------------------------------------------------------------------


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Summary fields of the result file from its rows (rows without a ratio are skipped)."""
    rated = [r for r in rows if isinstance(r.get("ratio"), (int, float)) and r["ratio"] > 0]
    out: dict[str, Any] = {
        "n_rows": len(rows),
        "n_rated": len(rated),
        "n_errors": sum(1 for r in rows if r.get("error")),
        "n_disagree": sum(1 for r in rows if r.get("agree") is False),
        "max_ratio": None,
        "max_ratio_row": None,
        "min_ratio": None,
        "geomean_ratio": None,
        "rows_over_1": sum(1 for r in rated if r["ratio"] > 1.0),
        "rows_over_1_names": [r["name"] for r in rated if r["ratio"] > 1.0],
    }
    floored = [r for r in rated if isinstance(r.get("launch_floor_us"), (int, float))]
    # rows over 1.0 where the bare launches of the same kernels alone cost more than torch's whole call
    out["rows_over_1_floor_over_1"] = [r["name"] for r in floored if r["ratio"] > 1.0 and r["floor_ratio"] > 1.0]
    out["median_overhead_us"] = statistics.median(r["overhead_us"] for r in floored) if floored else None
    if rated:
        worst = max(rated, key=lambda r: r["ratio"])
        out["max_ratio"] = worst["ratio"]
        out["max_ratio_row"] = worst["name"]
        out["min_ratio"] = min(r["ratio"] for r in rated)
        out["geomean_ratio"] = math.exp(sum(math.log(r["ratio"]) for r in rated) / len(rated))
    return out


def _fmt(v: Any, nd: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def table(rows: list[dict[str, Any]]) -> str:
    """A compact text table of the rows (a failed row shows its error)."""
    head = ["row", "tt host us", "torch host us", "ratio", "floor us", "tt gpu us", "torch gpu us", "agree", "torch route"]
    body = []
    for r in rows:
        if r.get("ratio") is None:
            body.append([r["name"], "ERROR: " + (str(r.get("error") or "no result").splitlines() or [""])[0][:100]])
            continue
        body.append([r["name"], _fmt(r.get("tiletune_host_us")), _fmt(r.get("torch_host_us")), _fmt(r.get("ratio"), 2),
                     _fmt(r.get("launch_floor_us")), _fmt(r.get("tiletune_gpu_us")), _fmt(r.get("torch_gpu_us")), _fmt(r.get("agree")),
                     _fmt(r.get("torch_route"))])
    full = [head] + [ln for ln in body if len(ln) == len(head)]
    widths = [max(len(ln[i]) for ln in full) for i in range(len(head))]
    widths[0] = max([widths[0]] + [len(ln[0]) for ln in body])
    widths[-1] = 0  # last column unpadded
    out = []
    for ln in [head] + body:
        if len(ln) != len(head):
            out.append(f"{ln[0]:<{widths[0]}}  {ln[1]}")
            continue
        cells = [f"{ln[0]:<{widths[0]}}"] + [f"{c:>{w}}" for c, w in zip(ln[1:-2], widths[1:-2])]
        cells += [f"{ln[-2]:>{max(widths[-2], 5)}}", ln[-1]]
        out.append("  ".join(cells))
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# cases (GPU): inputs, the tiletune call, torch candidates, tolerances
# --------------------------------------------------------------------------------------------


def _rotate_half(x: Any) -> Any:
    import torch

    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def build_case(spec: dict[str, Any], device: str = "cuda") -> dict[str, Any]:
    """``make(seed) -> args``, ``tiletune(*args)``, ``routes {name: fn(*args)}``, ``tol (rtol, atol)``,
    ``scale_atol`` (atol relative to the reference's max |value|) and ``inplace`` for one row spec.

    Building touches no tiletune op (they are looked up when called), so the torch candidates can
    be checked on CPU (``device="cpu"``).
    """
    import torch
    import torch.nn.functional as F

    import tiletune.kernels as K

    dev, dt = device, torch.bfloat16
    op, m, n = spec["op"], spec["m"], HIDDEN

    def seeded(seed: int) -> torch.Generator:
        return torch.Generator(device=dev).manual_seed(seed)

    def randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> Any:
        t = torch.randn(*shape, device=dev, dtype=torch.float32, generator=g)
        return (t * scale).to(dt)

    case: dict[str, Any] = {"tol": (2e-2, 2e-2), "scale_atol": False, "inplace": False}
    if op == "rms_norm" and spec.get("weight", True):
        case["make"] = lambda s: (randn(g := seeded(s), m, n), randn(g, n))
        case["tiletune"] = lambda x, w: K.rms_norm(x, w, 1e-6)
        case["routes"] = {"F.rms_norm": lambda x, w: F.rms_norm(x, (n,), w, 1e-6),
                          "torch.rms_norm": lambda x, w: torch.rms_norm(x, (n,), w, 1e-6)}
    elif op == "rms_norm":
        case["make"] = lambda s: (randn(seeded(s), m, n),)
        case["tiletune"] = lambda x: K.rms_norm(x, None, 1e-6)
        case["routes"] = {"F.rms_norm": lambda x: F.rms_norm(x, (n,), None, 1e-6),
                          "torch.rms_norm": lambda x: torch.rms_norm(x, (n,), None, 1e-6)}
    elif op == "rms_norm_residual":
        def f_route(x: Any, r: Any, w: Any) -> Any:
            h = x + r
            return F.rms_norm(h, (n,), w, 1e-6), h

        def t_route(x: Any, r: Any, w: Any) -> Any:
            h = x + r
            return torch.rms_norm(h, (n,), w, 1e-6), h

        case["make"] = lambda s: (randn(g := seeded(s), m, n), randn(g, m, n), randn(g, n))
        case["tiletune"] = lambda x, r, w: K.rms_norm_residual(x, r, w, 1e-6)
        case["routes"] = {"x + r; F.rms_norm": f_route, "x + r; torch.rms_norm": t_route}
    elif op == "layer_norm":
        case["make"] = lambda s: (randn(g := seeded(s), m, n), randn(g, n), randn(g, n))
        case["tiletune"] = lambda x, w, b: K.layer_norm(x, w, b, 1e-5)
        case["routes"] = {"F.layer_norm": lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5),
                          "torch.layer_norm": lambda x, w, b: torch.layer_norm(x, (n,), w, b, 1e-5)}
    elif op == "softmax":
        case["make"] = lambda s: (randn(seeded(s), m, n),)
        case["tiletune"] = lambda x: K.softmax(x)
        case["routes"] = {"torch.softmax": lambda x: torch.softmax(x, -1), "Tensor.softmax": lambda x: x.softmax(-1)}
        case["tol"] = (2e-2, 1e-4)
    elif op in ("swiglu", "geglu"):
        act = F.silu if op == "swiglu" else F.gelu
        an = "F.silu" if op == "swiglu" else "F.gelu"
        case["make"] = lambda s: (randn(seeded(s), m, 2 * n),)
        case["tiletune"] = (lambda x: K.swiglu(x)) if op == "swiglu" else (lambda x: K.geglu(x))
        case["routes"] = {f"{an}(x[..., :H]) * x[..., H:]": lambda x: act(x[..., :n]) * x[..., n:],
                          f"{an}(x[..., :H]).mul_(x[..., H:])": lambda x: act(x[..., :n]).mul_(x[..., n:])}
    elif op == "apply_rope_":
        hq, hk = ROPE_HEADS
        d, half = HEAD_DIM, HEAD_DIM // 2

        def make_rope(s: int) -> tuple:
            g = seeded(s)
            qkv = randn(g, 1, m, hq + 2 * hk, d)
            pos = torch.arange(m, device=dev, dtype=torch.float32) + 7.0
            inv = 10000.0 ** (-torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d)
            ang = torch.outer(pos, inv)
            ang = torch.cat((ang, ang), dim=-1)  # Hugging Face layout: (S, D) = cat(freqs, freqs)
            return qkv[:, :, :hq], qkv[:, :, hq:hq + hk], ang.cos().to(dt), ang.sin().to(dt)

        def hf_copy(q: Any, k: Any, cos: Any, sin: Any) -> Any:
            c, sn = cos[:, None, :], sin[:, None, :]  # (S, 1, D) broadcasts over (1, S, H, D)
            q.copy_(q * c + _rotate_half(q) * sn)
            k.copy_(k * c + _rotate_half(k) * sn)
            return q, k

        def halves(q: Any, k: Any, cos: Any, sin: Any) -> Any:
            c, sn = cos[:, None, :], sin[:, None, :]
            c1, c2, s1, s2 = c[..., :half], c[..., half:], sn[..., :half], sn[..., half:]
            for x in (q, k):
                x1, x2 = x[..., :half], x[..., half:]
                n1 = torch.addcmul(x1 * c1, x2, s1, value=-1)  # x1 c - x2 s, from the old halves
                x2.mul_(c2).addcmul_(x1, s2)  # x2 c + x1 s (x1 still old)
                x1.copy_(n1)
            return q, k

        def cat_halves(q: Any, k: Any, cos: Any, sin: Any) -> Any:
            c, sn = cos[:, None, :], sin[:, None, :]
            for x in (q, k):
                x1, x2 = x[..., :half], x[..., half:]
                x.copy_(x * c + torch.cat((-x2, x1), dim=-1) * sn)
            return q, k

        case["make"] = make_rope
        case["tiletune"] = lambda q, k, cos, sin: K.apply_rope_(q, k, cos, sin)
        case["routes"] = {"q.copy_(q*cos + rotate_half(q)*sin)": hf_copy,
                          "halves: addcmul + in-place mul_/addcmul_/copy_": halves,
                          "x.copy_(x*cos + cat(-x2, x1)*sin)": cat_halves}
        case["inplace"] = True
        case["tol"] = (2e-2, 5e-2)  # torch rounds each product and the sum to bf16
    elif op == "cross_entropy":
        def make_ce(s: int) -> tuple:
            g = seeded(s)
            return randn(g, m, VOCAB), torch.randint(0, VOCAB, (m,), device=dev, generator=g, dtype=torch.int64)

        case["make"] = make_ce
        case["tiletune"] = lambda lg, t: K.cross_entropy(lg, t)
        case["routes"] = {"F.cross_entropy": lambda lg, t: F.cross_entropy(lg, t)}
    elif op == "matmul":
        inv = 1.0 / math.sqrt(n)
        if spec["layout"] == "nk":
            case["make"] = lambda s: (randn(g := seeded(s), m, n), randn(g, n, n, scale=inv))  # a, w [N, K]
            case["tiletune"] = lambda a, w: K.matmul(a, w.t())
            case["routes"] = {"a @ w.t()": lambda a, w: a @ w.t(), "F.linear(a, w)": lambda a, w: F.linear(a, w),
                              "torch.mm(a, w.t())": lambda a, w: torch.mm(a, w.t())}
        else:
            case["make"] = lambda s: (randn(g := seeded(s), m, n), randn(g, n, n, scale=inv))  # a, b [K, N]
            case["tiletune"] = lambda a, b: K.matmul(a, b)
            case["routes"] = {"a @ b": lambda a, b: a @ b, "torch.mm(a, b)": lambda a, b: torch.mm(a, b)}
        case["scale_atol"] = True
    elif op == "attention":
        causal = bool(spec["causal"])
        case["make"] = lambda s: tuple(randn(g, *ATTN_SHAPE) for g in [seeded(s)] for _ in range(3))
        case["tiletune"] = lambda q, k, v: K.attention(q, k, v, causal=causal)
        case["routes"] = {"F.scaled_dot_product_attention": lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=causal)}
    else:
        raise ValueError(f"no case for op {op!r}")
    return case


# --------------------------------------------------------------------------------------------
# measurement (GPU)
# --------------------------------------------------------------------------------------------


def _flat(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def compare(case: dict[str, Any], route: Callable[..., Any]) -> dict[str, Any]:
    """Run tiletune and ``route`` once on identical fresh inputs; agreement, max |diff| and the error text."""
    import torch

    a_args, b_args = case["make"](1234), case["make"](1234)
    got = [t.detach() for t in _flat(case["tiletune"](*a_args)) if t is not None]
    ref = [t.detach() for t in _flat(route(*b_args)) if t is not None]
    torch.cuda.synchronize()
    res: dict[str, Any] = {"agree": True, "max_abs_diff": 0.0}
    if len(got) != len(ref):
        return {"agree": False, "error": f"{len(got)} outputs vs {len(ref)}"}
    rtol, atol = case["tol"]
    for g_, r_ in zip(got, ref):
        g32, r32 = g_.float(), r_.float()
        if g32.shape != r32.shape:
            return {"agree": False, "error": f"shape {tuple(g32.shape)} vs {tuple(r32.shape)}"}
        diff = float((g32 - r32).abs().max()) if g32.numel() else 0.0
        res["max_abs_diff"] = max(res["max_abs_diff"], diff)
        a = atol * float(r32.abs().max()) if case["scale_atol"] and r32.numel() else atol
        try:
            torch.testing.assert_close(g32, r32, rtol=rtol, atol=a)
        except AssertionError as exc:
            res["agree"] = False
            res["error"] = str(exc).strip().splitlines()[0][:300] + f" (rtol={rtol}, atol={a:.3g})"
    return res


def _graph_nodes(raw: Any) -> int | None:
    """Number of nodes of a ``cudaGraph_t`` (driver ``cuGraphGetNodes``), or None."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        handle = raw if isinstance(raw, int) else int(raw)
        count = ctypes.c_size_t(0)
        rc = lib.cuGraphGetNodes(ctypes.c_void_p(handle), None, ctypes.byref(count))
        return int(count.value) if rc == 0 else None
    except Exception:
        return None


def gpu_time(fn: Callable[..., Any], args: tuple) -> dict[str, Any]:
    """Per-call GPU time of ``fn(*args)`` from CUDA-graph replays, and launches per call (graph nodes)."""
    import torch

    from tiletune.devices.bench import warm_on_side_stream

    out: dict[str, Any] = {"gpu_us": None, "launches_per_call": None}
    graph = None
    try:
        warm_on_side_stream(lambda: fn(*args), times=3)
        torch.cuda.synchronize()
        try:
            graph, keep = torch.cuda.CUDAGraph(keep_graph=True), True
        except TypeError:
            graph, keep = torch.cuda.CUDAGraph(), False
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_CALLS):
                fn(*args)
        if keep:
            nodes = _graph_nodes(graph.raw_cuda_graph())
            if nodes is not None:
                out["launches_per_call"] = nodes / GRAPH_CALLS
            graph.instantiate()
        graph.replay()
        torch.cuda.synchronize()
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(GRAPH_SAMPLES)]
        for start, end in pairs:
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        out["gpu_us"] = statistics.median(s.elapsed_time(e) * 1e3 / GRAPH_CALLS for s, e in pairs)
    except Exception as exc:
        out["gpu_error"] = f"{type(exc).__name__}: {exc}"[:400]
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
    finally:
        del graph
    return out


def calls_for(launches_per_call: float | None, calls: int) -> int:
    """Calls per host-time batch: ``calls``, capped so a batch queues at most QUEUE_BUDGET launches."""
    if not launches_per_call:
        return calls
    return max(MIN_CALLS, min(calls, int(QUEUE_BUDGET // max(1.0, launches_per_call))))


def host_times(variants: dict[str, tuple[Callable[..., Any], tuple, int]], rounds: int) -> dict[str, dict[str, Any]]:
    """Interleaved host-time batches: per variant ``(fn, args, n)``; median per-call us and sync wait us."""
    import torch

    sync = torch.cuda.synchronize
    clock = time.perf_counter

    def batch(fn: Callable[..., Any], args: tuple, n: int) -> tuple[float, float]:
        t0 = clock()
        for _ in range(n):
            fn(*args)
        t1 = clock()
        sync()
        return (t1 - t0) / n * 1e6, (clock() - t1) * 1e6

    for fn, args, n in variants.values():  # warm the loop, the allocator's blocks and the caches
        batch(fn, args, n)
    per: dict[str, list[float]] = {k: [] for k in variants}
    waits: dict[str, list[float]] = {k: [] for k in variants}
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for name, (fn, args, n) in variants.items():
                us, wait = batch(fn, args, n)
                per[name].append(us)
                waits[name].append(wait)
    finally:
        gc.enable()
    return {k: {"us": statistics.median(per[k]), "sync_wait_us": statistics.median(waits[k]),
                "batches_us": [round(v, 3) for v in per[k]]} for k in variants}


def launch_floor(fn: Callable[..., Any], args: tuple) -> tuple[Callable[..., Any], int]:
    """``(floor, launches)``: ``floor(*args)`` issues the bare ``ct.launch`` calls one call of ``fn`` makes
    (the tuned ops' chosen kernels, grids and arguments as recorded from one call, outputs included):
    what any wrapper of these kernels costs at least, with nothing but the launches."""
    from tiletune.op import tuned_op as dispatch

    _, rec = dispatch.record_launches(fn, *args)
    launches = []
    for op, key, op_args in rec:
        if key is None:
            raise RuntimeError(f"{op.name}: a recorded launch was not a cached choice")
        (launch, stream, hinted, dev), grid, kargs = op._resolved_launch(op._configs[key], op_args)
        launches.append((launch, stream, hinted, dev, grid, kargs))
    if len(launches) == 1:
        launch, stream, hinted, dev, grid, kargs = launches[0]

        def floor(*_: Any) -> None:
            launch(stream(dev), grid, hinted, kargs)
    else:
        def floor(*_: Any) -> None:
            for launch, stream, hinted, dev, grid, kargs in launches:
                launch(stream(dev), grid, hinted, kargs)

    return floor, len(launches)


def measure_row(spec: dict[str, Any], calls: int, rounds: int, select_rounds: int) -> dict[str, Any]:
    """One row: warm/tune, agreement, GPU times, torch route choice, interleaved host times."""
    import torch

    row: dict[str, Any] = dict(spec)
    case = build_case(spec)
    args = case["make"](0)
    tt_fn = case["tiletune"]
    t = time.perf_counter()
    tt_fn(*args)  # tunes
    torch.cuda.synchronize()
    row["first_call_s"] = round(time.perf_counter() - t, 3)
    for _ in range(3):
        tt_fn(*args)
    routes: dict[str, Callable[..., Any]] = {}
    row["route_errors"] = {}
    for name, fn in case["routes"].items():
        try:
            for _ in range(3):
                fn(*args)
            torch.cuda.synchronize()
            routes[name] = fn
        except Exception as exc:
            row["route_errors"][name] = f"{type(exc).__name__}: {exc}"[:300]
    if not routes:
        raise RuntimeError(f"every torch route failed: {row['route_errors']}")
    if not row["route_errors"]:
        del row["route_errors"]

    # agreement with each torch candidate
    checks: dict[str, dict[str, Any]] = {}
    for name, fn in routes.items():
        try:
            checks[name] = compare(case, fn)
        except Exception as exc:
            checks[name] = {"agree": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    row["check"] = checks
    agreeing = [k for k in routes if checks[k].get("agree")]

    # GPU time and launches per call
    tt_gpu = gpu_time(tt_fn, args)
    route_gpu = {name: gpu_time(fn, args) for name, fn in routes.items()}

    # torch route: the fastest agreeing candidate by host time (all of them if none agrees)
    pool = agreeing or list(routes)
    if len(pool) > 1:
        sel = host_times({k: (routes[k], args, calls_for(route_gpu[k]["launches_per_call"], calls)) for k in pool},
                         select_rounds)
        row["torch_routes_host_us"] = {k: round(v["us"], 3) for k, v in sel.items()}
        chosen = min(pool, key=lambda k: sel[k]["us"])
    else:
        chosen = pool[0]
    row["torch_route"] = chosen
    if len(routes) > 1:
        row["torch_routes_gpu_us"] = {k: v["gpu_us"] for k, v in route_gpu.items()}
    row["agree"] = bool(checks[chosen].get("agree"))
    if not row["agree"]:
        row["mismatch"] = checks[chosen].get("error")
    t_gpu = route_gpu[chosen]

    n_tt = calls_for(tt_gpu["launches_per_call"], calls)
    n_t = calls_for(t_gpu["launches_per_call"], calls)
    variants = {"tiletune": (tt_fn, args, n_tt), "torch": (routes[chosen], args, n_t)}
    try:
        floor, n_launches = launch_floor(tt_fn, args)
        variants["floor"] = (floor, args, n_tt)
    except Exception as exc:  # noqa: BLE001 - the floor is context; the row stands without it
        row["floor_error"] = f"{type(exc).__name__}: {exc}"[:300]
    res = host_times(variants, rounds)
    row["tiletune_host_us"] = res["tiletune"]["us"]
    row["torch_host_us"] = res["torch"]["us"]
    row["ratio"] = res["tiletune"]["us"] / res["torch"]["us"]
    if "floor" in res:
        row["launch_floor_us"] = res["floor"]["us"]  # bare ct.launch of the same kernels and arguments
        row["floor_launches"] = n_launches
        row["floor_ratio"] = res["floor"]["us"] / res["torch"]["us"]
        row["overhead_us"] = res["tiletune"]["us"] - res["floor"]["us"]
    row["tiletune_gpu_us"] = tt_gpu["gpu_us"]
    row["torch_gpu_us"] = t_gpu["gpu_us"]
    gpu_errors = {k: v["gpu_error"] for k, v in (("tiletune", tt_gpu), ("torch", t_gpu)) if "gpu_error" in v}
    row["gpu_error"] = gpu_errors or None
    row["launches_per_call"] = {"tiletune": tt_gpu["launches_per_call"], "torch": t_gpu["launches_per_call"]}
    row["calls_per_batch"] = {"tiletune": n_tt, "torch": n_t}
    row["sync_wait_us"] = {"tiletune": res["tiletune"]["sync_wait_us"], "torch": res["torch"]["sync_wait_us"]}
    row["batches_us"] = {"tiletune": res["tiletune"]["batches_us"], "torch": res["torch"]["batches_us"]}
    torch.cuda.synchronize()
    return row


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def combine(paths: list[str], out: str | None) -> Path:
    """Merge result files of partial runs (``--only`` / ``--skip``) into one ``host_cost.json``: rows in
    :func:`row_specs` order, a row measured in several files taken from the latest file (by ``date``),
    the summary recomputed; ``combined_from`` names each source with its date and settings."""
    import json

    docs = sorted((json.loads(Path(p).read_text()) for p in paths), key=lambda d: str(d.get("date", "")))
    latest: dict[str, dict[str, Any]] = {}
    for d in docs:
        for r in d["rows"]:
            latest[r["name"]] = r
    order = {s["name"]: i for i, s in enumerate(row_specs())}
    rows = sorted(latest.values(), key=lambda r: order.get(r["name"], len(order)))
    sources = []
    for d in docs:
        sources += d.get("combined_from") or [{"date": d.get("date"), "settings": d.get("settings"),
                                               "rows": [r["name"] for r in d["rows"]]}]
    env = ("benchmark", "date", "torch", "gpu", "arch", "sm_count", "driver", "versions", "cpus")
    doc = {**{k: docs[-1][k] for k in env if k in docs[-1]}, "problem": docs[-1].get("problem"), "method": METHOD,
           "combined_from": sources, **summarize(rows), "rows": rows}
    path = Path(out or os.environ.get("BENCH_OUT") or Path(__file__).resolve().parent / "results" / "h200")
    path.mkdir(parents=True, exist_ok=True)
    path = path / "host_cost.json"
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(table(rows))
    print(f"wrote {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="result folder (default: BENCH_OUT or benchmarks/results/h200)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 100 calls, 5 rounds, M=8 only")
    ap.add_argument("--calls", type=int, default=None, help="calls per host-time batch (<= 300; default 300)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 15)")
    ap.add_argument("--only", default=None, help="run only rows whose name contains this text")
    ap.add_argument("--skip", default=None, help="skip rows whose name contains any of these comma-separated texts")
    ap.add_argument("--keep-db", action="store_true", help="keep the temporary tuning database")
    ap.add_argument("--full-tuning", action="store_true",
                    help="tune with the default measurement options (slower; the GPU-time column then uses "
                         "carefully picked configs; host times do not depend on it)")
    ap.add_argument("--db", default=None, help="tuning database to use (kept) instead of a fresh temporary one, "
                                               "e.g. to split a run over several commands with --only")
    ap.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                    help="merge these result files of partial runs into <out>/host_cost.json and exit")
    a = ap.parse_args(argv)
    if a.combine:
        combine(a.combine, a.out)
        return 0
    calls = min(300, a.calls or (100 if a.quick else 300))
    rounds = a.rounds or (5 if a.quick else 15)
    select_rounds = 3 if a.quick else 5

    # one fresh tuning database for every op, set before tiletune is imported
    tmp = Path(tempfile.mkdtemp(prefix="tiletune-host-cost-"))
    db = Path(a.db).resolve() if a.db else tmp / "tt.db"
    os.environ["TILETUNE_DB"] = str(db)
    os.environ.setdefault("TILETUNE_PROGRESS", "0")

    import torch

    from tiletune.kernels.library_op import LibraryOp

    import tiletune as tt

    # short tuning measurements: host cost does not depend on which config wins (--full-tuning: default)
    fast = None if a.full_tuning else tt.TunerOptions(
        stopping=tt.StoppingRule(min_samples=3, max_samples=10, max_seconds=0.05), showdown_rounds=1)
    LibraryOp.configure(db=str(db), progress=False, **({"options": fast} if fast else {}))  # every op's, attention's too
    if not torch.cuda.is_available():
        print("host_cost.py needs a CUDA GPU", file=sys.stderr)
        return 2

    specs = row_specs(quick=a.quick)
    if a.only:
        specs = [s for s in specs if a.only in s["name"]]
    if a.skip:
        skips = [t for t in a.skip.split(",") if t]
        specs = [s for s in specs if not any(t in s["name"] for t in skips)]
    rows: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    for i, spec in enumerate(specs, 1):
        t = time.perf_counter()
        try:
            row = measure_row(spec, calls, rounds, select_rounds)
        except Exception as exc:
            row = dict(spec)
            row.update(tiletune_host_us=None, torch_host_us=None, ratio=None, tiletune_gpu_us=None,
                       torch_gpu_us=None, torch_route=None, agree=None,
                       error=f"{type(exc).__name__}: {exc}"[:600], traceback=traceback.format_exc()[-2000:])
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
        row["row_s"] = round(time.perf_counter() - t, 2)
        rows.append(row)
        status = (f"ratio {row['ratio']:.2f}" if row.get("ratio") is not None else f"ERROR {row.get('error')}")
        print(f"[{i}/{len(specs)}] {spec['name']}: {status} ({row['row_s']} s)", file=sys.stderr, flush=True)

    print(table(rows))
    summary = summarize(rows)
    print(f"max ratio {_fmt(summary['max_ratio'], 2)} ({summary['max_ratio_row']}), rows over 1: "
          f"{summary['rows_over_1']}/{summary['n_rated']}, geomean {_fmt(summary['geomean_ratio'], 2)}, "
          f"errors {summary['n_errors']}, disagree {summary['n_disagree']}")
    write_result("host_cost", {
        "problem": "host time per call of each tiletune.kernels op vs torch's eager route, small bf16 problems",
        "method": METHOD,
        "settings": {"calls": calls, "rounds": rounds, "route_select_rounds": select_rounds, "quick": a.quick,
                     "only": a.only, "skip": a.skip, "queue_budget_launches": QUEUE_BUDGET, "graph_calls": GRAPH_CALLS,
                     "graph_samples": GRAPH_SAMPLES, "tuning_db": str(db), "fresh_db": not a.db},
        **summary,
        "total_s": round(time.perf_counter() - t_all, 1),
        "rows": rows,
    }, a.out)
    if not a.keep_db:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
