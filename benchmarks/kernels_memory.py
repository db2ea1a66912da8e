"""Memory-bound kernels: tiletune vs every torch route, GB/s and % of the copy of the same bytes.

Ops (``tiletune.kernels``): rms_norm, rms_norm_residual, layer_norm, softmax, swiglu, geglu (tanh
GELU, the LLM-typical ``gelu_pytorch_tanh``), apply_rope_ (in place), cross_entropy (loss) and
cross_entropy with the gradient. Each op runs over 3-4 LLM-typical bf16 shapes (Llama-3 8B/70B
hidden sizes, MLP widths, vocabularies of 32k-256k), plus one fp32 shape for four of them (35 rows;
``--dtypes`` / ``--full`` for more). Budget: about 5 minutes on an H200, most of it torch.compile
warm-ups and tiletune's tuning sessions.

Baselines are what a PyTorch user writes: eager ``F.rms_norm``, ``x + r`` then ``F.rms_norm``,
``F.layer_norm``, ``torch.softmax``, ``F.silu(g) * u``, ``F.gelu(g, approximate="tanh") * u``,
Hugging Face's ``q * cos + rotate_half(q) * sin`` (out of place), ``F.cross_entropy`` and, for the
gradient, ``F.cross_entropy`` + ``torch.autograd.grad``; and the same functions under
``torch.compile(dynamic=False)``, default and ``mode="max-autotune-no-cudagraphs"`` (the gradient
through AOTAutograd's compiled backward), and fused torch alternatives where one exists
(``torch._fused_rms_norm``). Each route's first call (the compile) runs once per shape before any
timing, under ``--route-limit-s``; a route that fails or runs out of time is recorded in
``torch_route_errors`` and the sweep goes on. tiletune's first (tuning) call is excluded too
(``tune_s``). Per row (issue 14): ``torch_routes`` (route -> us), ``torch_best_route``,
``torch_best_us``, ``ratio = torch_best_us / tiletune_us``, ``copy_gbps`` (a torch copy of the
row's ``bytes``, timed in the same rounds) and ``verdict``: win (ratio >= 1), tie (the fastest torch
route and tiletune both >= 97% of copy), else loss. ``--timer-check N`` re-times the first N rows
(tiletune and the fastest torch route) with ``triton.testing.do_bench`` (agreement: within 3%).

Timing: CUDA events around each call, a GPU spin of ``--backlog-us`` (200) before the start event so
that the host's dispatch (Python wrappers, torch.compile guards) runs while the GPU is busy and the
events time device work alone (nvbench's blocking kernel; per-call host cost is what
``dispatch_overhead.py`` measures), an L2-sized memset outside the timed events before every
sample (:class:`tiletune.devices.measure.ColdL2Timer`), tiletune, the copy and every torch route interleaved
in rounds, medians reported. Bandwidth counts the bytes an op must move at least (inputs read once, outputs
written once; cross-entropy: logits read once, and the gradient written once): ``gbps =
bytes / time``. The copy bandwidth is measured in the same run: a device-to-device copy of 1 GiB,
read + write bytes counted, median of the same number of samples.

    python benchmarks/kernels_memory.py [--out DIR] [--only rms_norm,softmax] [--full] [--quick]
                                        [--timer-check N] [--route-limit-s S] [--deadline S]
                                        [--plot-only JSON]

``--quick``: 4 rows (:data:`QUICK_ROWS`), about 3 minutes on a fresh H200.

Writes ``<out>/kernels_memory.json`` (rows: op, shape, dtype, bytes, the issue 14 fields above,
tiletune_gbps, eager_gbps, compile_gbps, pct_of_copy, *_us, speedups, the chosen config), one PNG per op
(``kernels_memory_<op>.png``, needs matplotlib; else render later with ``--plot-only``),
``kernels_memory.md`` (the README table), updates the table between the markers in
``benchmarks/README.md``, and prints the table and the per-op geometric means against the issue's
targets. A partial JSON is rewritten after every row.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from _common import DEFAULT_OUT, failure_fields, small_png, write_result  # noqa: E402
from _routes import best_route, first_calls, summarize_timer_checks, timer_check, verdict  # noqa: E402

#: Issue 5 targets (H200): % of copy bandwidth at working sets >= 64 MiB, geomean speedups.
TARGETS = {"pct_of_copy_min": 90.0, "big_ws_mib": 64.0, "geomean_vs_eager": 1.2, "geomean_vs_compile": 1.0}
#: Issue 14 targets: every row >= 1.0x the fastest torch route or a tie (both >= 97% of the copy of the
#: same bytes), and >= 90% of copy at working sets >= 256 MiB.
ISSUE14 = {"ratio_min": 1.0, "tie_fraction_of_copy": 0.97, "pct_of_copy_min": 90.0, "big_ws_mib": 256.0}
README = Path(__file__).resolve().parent / "README.md"
BEGIN, END = "<!-- kernels_memory:begin -->", "<!-- kernels_memory:end -->"

OPS = ["rms_norm", "rms_norm_residual", "layer_norm", "softmax", "swiglu", "geglu", "rope", "cross_entropy",
       "cross_entropy_grad"]

#: bf16 sweep per op (shape tuples as the op takes them); the first shape of the ops in FP32_TOO is
#: also run in fp32.
SHAPES: dict[str, list[tuple[int, ...]]] = {
    "rms_norm": [(4096, 4096), (16384, 4096), (4096, 8192), (65536, 1024)],
    "rms_norm_residual": [(4096, 4096), (16384, 4096), (8192, 5120)],
    "layer_norm": [(4096, 4096), (16384, 4096), (65536, 1024)],
    "softmax": [(16384, 4096), (65536, 1024), (4096, 32000)],
    "swiglu": [(4096, 2 * 4096), (8192, 2 * 14336), (4096, 2 * 11008)],
    "geglu": [(4096, 2 * 4096), (8192, 2 * 16384), (4096, 2 * 11008)],
    # (B, S, Hq, Hk, D), bshd layout, cos/sin (S, D) float32
    "rope": [(8, 2048, 32, 8, 128), (1, 8192, 32, 8, 128), (16, 1024, 64, 8, 128)],
    "cross_entropy": [(4096, 128256), (8192, 32000), (2048, 256000)],
    "cross_entropy_grad": [(4096, 128256), (8192, 32000), (2048, 256000)],
}
FP32_TOO = ("rms_norm", "softmax", "swiglu", "cross_entropy")
#: two shapes per op (``ab_shrink.py`` uses them)
QUICK = {op: shapes[:2] for op, shapes in SHAPES.items()}
#: ``--quick``: a handful of rows (op, shape, dtype) where issue 14 measured torch.compile ahead, about
#: 3 minutes on a fresh H200 with every tuning and compile cold
QUICK_ROWS: list[tuple[str, tuple[int, ...], str]] = [
    ("rms_norm", (4096, 8192), "bf16"), ("layer_norm", (65536, 1024), "bf16"), ("softmax", (65536, 1024), "bf16"),
    ("swiglu", (8192, 2 * 14336), "bf16")]
#: rows whose timings are cross-checked against ``triton.testing.do_bench`` by default (the first N)
TIMER_CHECK_ROWS = 3
DT = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


# --------------------------------------------------------------------------------------------
# problems: inputs, the three implementations, bytes
# --------------------------------------------------------------------------------------------


def _rotate_half(x: Any) -> Any:
    import torch

    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def build(op: str, shape: tuple[int, ...], dtype: Any) -> dict[str, Any]:
    """Inputs (``args``), ``tiletune()``, the torch function ``torch_fn(*args)`` (run eager and
    compiled), whether the gradient is wanted, and the bytes the op must move."""
    import torch
    import torch.nn.functional as F

    import tiletune.kernels as K

    dev = "cuda"
    b = torch.tensor([], dtype=dtype).element_size()

    def randn(*s: int) -> Any:
        return torch.randn(*s, device=dev, dtype=dtype)

    if op in ("rms_norm", "layer_norm", "softmax", "rms_norm_residual"):
        m, n = shape
        x, w = randn(m, n), randn(n)
        if op == "rms_norm":
            return dict(tiletune=lambda: K.rms_norm(x, w, 1e-6), torch_fn=lambda x, w: F.rms_norm(x, (n,), w, 1e-6),
                        args=(x, w), bytes=2 * m * n * b + n * b)
        if op == "layer_norm":
            bias = randn(n)
            return dict(tiletune=lambda: K.layer_norm(x, w, bias, 1e-5),
                        torch_fn=lambda x, w, bias: F.layer_norm(x, (n,), w, bias, 1e-5),
                        args=(x, w, bias), bytes=2 * m * n * b + 2 * n * b)
        if op == "softmax":
            return dict(tiletune=lambda: K.softmax(x), torch_fn=lambda x: torch.softmax(x, -1), args=(x,),
                        bytes=2 * m * n * b)
        r = randn(m, n)

        def residual_rms_norm(x: Any, r: Any, w: Any) -> Any:
            h = x + r
            return F.rms_norm(h, (n,), w, 1e-6), h

        return dict(tiletune=lambda: K.rms_norm_residual(x, r, w, 1e-6), torch_fn=residual_rms_norm,
                    args=(x, r, w), bytes=4 * m * n * b + n * b)
    if op in ("swiglu", "geglu"):
        m, n2 = shape
        x = randn(m, n2)
        h = n2 // 2
        if op == "swiglu":
            return dict(tiletune=lambda: K.swiglu(x), torch_fn=lambda x: F.silu(x[..., :h]) * x[..., h:], args=(x,),
                        bytes=3 * m * h * b)
        return dict(tiletune=lambda: K.geglu(x, approximate="tanh"),
                    torch_fn=lambda x: F.gelu(x[..., :h], approximate="tanh") * x[..., h:], args=(x,),
                    bytes=3 * m * h * b)
    if op == "rope":
        bs, s, hq, hk, d = shape
        q, k = randn(bs, s, hq, d), randn(bs, s, hk, d)
        ang = torch.rand(s, d, device=dev) * 6.0
        cos, sin = ang.cos(), ang.sin()

        def hf_rope(q: Any, k: Any, cos: Any, sin: Any) -> Any:  # Hugging Face, out of place
            c, sn = cos[None, :, None, :].to(q.dtype), sin[None, :, None, :].to(q.dtype)
            return q * c + _rotate_half(q) * sn, k * c + _rotate_half(k) * sn

        nbytes = 2 * (q.numel() + k.numel()) * b + 2 * cos.numel() * cos.element_size()
        return dict(tiletune=lambda: K.apply_rope_(q, k, cos, sin), torch_fn=hf_rope, args=(q, k, cos, sin),
                    bytes=nbytes)
    if op in ("cross_entropy", "cross_entropy_grad"):
        m, v = shape
        logits = randn(m, v)
        target = torch.randint(0, v, (m,), device=dev)
        if op == "cross_entropy":
            return dict(tiletune=lambda: K.cross_entropy(logits, target), torch_fn=F.cross_entropy,
                        args=(logits, target), bytes=m * v * b + 8 * m)
        return dict(tiletune=lambda: K.cross_entropy(logits, target, return_grad=True),
                    torch_fn=lambda lg, t: F.cross_entropy(lg, t), args=(logits, target), grad=True,
                    bytes=2 * m * v * b + 8 * m)
    raise ValueError(op)


def with_grad(fn: Callable[..., Any], logits: Any, target: Any) -> Callable[[], Any]:
    """``loss = fn(logits, target)`` and ``d loss / d logits`` through autograd (eager or compiled)."""
    import torch

    def call() -> Any:
        lg = logits.detach().requires_grad_(True)
        loss = fn(lg, target)
        (g,) = torch.autograd.grad(loss, lg)
        return loss, g

    return call


def working_set_mib(nbytes: int) -> float:
    return nbytes / 2**20


# --------------------------------------------------------------------------------------------
# measurement
# --------------------------------------------------------------------------------------------


def timed_medians(fns: dict[str, Callable[[], Any]], timer: Any, rounds: int, per_round: int,
                  errors: dict[str, str] | None = None) -> dict[str, float]:
    """Median microseconds of each function, measured in interleaved rounds (cold L2 per sample). A
    function that raises is dropped (its message in ``errors``) and the others go on."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    live = dict(fns)
    for _ in range(rounds):
        for k, fn in list(live.items()):
            try:
                samples[k] += timer.time(fn, per_round)
            except Exception as exc:
                if errors is None:
                    raise
                errors[k] = f"{type(exc).__name__}: {exc}"[:1000]
                del live[k]
    return {k: statistics.median(samples[k]) for k in live if samples[k]}


def copy_bandwidth(timer: Any, samples: int) -> dict[str, float]:
    """Device-to-device copy of 1 GiB: (read + write bytes) / median time."""
    import torch

    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.fill_(1)
    for _ in range(3):
        dst.copy_(src)
    us = statistics.median(timer.time(lambda: dst.copy_(src), samples))
    del src, dst
    torch.cuda.empty_cache()
    return {"copy_bytes": 2 * n, "copy_us": us, "copy_gbps": 2 * n / us / 1e3}


def copy_of(nbytes: int) -> Callable[[], Any]:
    """A torch copy that moves ``nbytes`` (read + write): ``nbytes / 2`` bytes copied device to device."""
    import torch

    half = max(1, nbytes // 2)
    src = torch.ones(half, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


#: the torch.compile routes every row gets: route name -> torch.compile keyword arguments
COMPILE_ROUTES: dict[str, dict[str, Any]] = {
    "torch.compile": {},
    "torch.compile(max-autotune-no-cudagraphs)": {"mode": "max-autotune-no-cudagraphs"},
}


def route_of_record(op: str, shape: tuple[int, ...]) -> str:
    """The fastest torch route of the ``(op, shape)`` row in the committed ``kernels_memory.json`` (for the
    probes that compare against it), ``"torch.compile"`` when the file has no such row."""
    path = Path(DEFAULT_OUT) / "kernels_memory.json"
    if path.exists():
        for r in json.loads(path.read_text())["rows"]:
            if r["op"] == op and tuple(r["shape"]) == tuple(shape) and r.get("torch_best_route"):
                return r["torch_best_route"]
    return "torch.compile"


def fused_alternatives(op: str, prob: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """Fused torch kernels a user could call instead of the eager expression, where torch has one that
    ``F.*`` may not pick: ``torch._fused_rms_norm`` (torch >= 2.8) for rms_norm. (layer_norm, softmax
    and cross_entropy's eager calls are torch's fused kernels already; the GLUs, RoPE and the residual
    add have no fused torch op: torch.compile is their fused route.)"""
    import torch

    if op == "rms_norm" and hasattr(torch, "_fused_rms_norm"):
        n = prob["args"][0].shape[-1]
        return {"torch._fused_rms_norm": lambda x, w: torch._fused_rms_norm(x, [n], w, 1e-6)[0]}
    return {}


def memory_torch_routes(op: str, prob: dict[str, Any], compile_modes: bool = True) -> dict[str, Callable[[], Any]]:
    """Every torch route for one problem, as zero-argument calls: ``eager`` (the straightforward torch
    expression), each of :data:`COMPILE_ROUTES` of the same function (``dynamic=False``; compiled on
    the first call, which the caller runs outside the timing) and :func:`fused_alternatives`. The
    gradient rows wrap each in autograd (:func:`with_grad`)."""
    import torch

    fn, fargs = prob["torch_fn"], prob["args"]

    def call(f: Callable[..., Any]) -> Callable[[], Any]:
        return with_grad(f, *fargs) if prob.get("grad") else (lambda: f(*fargs))

    routes = {"eager": call(fn)}
    if compile_modes:
        for name, kw in COMPILE_ROUTES.items():
            routes[name] = call(torch.compile(fn, dynamic=False, **kw))
    for name, f in fused_alternatives(op, prob).items():
        routes[name] = call(f)
    return routes


def fill_row(row: dict[str, Any], med: dict[str, float], routes: list[str], nbytes: int) -> dict[str, Any]:
    """The honest-baseline fields of a row from the interleaved medians (``med``: ``tiletune``, ``copy``
    and each surviving torch route): ``torch_routes``, ``torch_best_route``, ``torch_best_us``,
    ``ratio``, the bandwidths, ``copy_gbps`` of the same bytes, ``pct_of_copy`` and ``verdict``."""
    gbps = (lambda us: None if not us else round(nbytes / us / 1e3, 1))
    row["torch_routes"] = {k: round(med[k], 2) for k in routes if k in med}
    row["torch_best_route"] = best_route(row["torch_routes"])
    tt, cp = med.get("tiletune"), med.get("copy")
    best = med.get(row["torch_best_route"]) if row["torch_best_route"] else None
    row["tiletune_us"] = None if tt is None else round(tt, 2)
    row["torch_best_us"] = None if best is None else round(best, 2)
    row["copy_us"] = None if cp is None else round(cp, 2)
    row["tiletune_gbps"], row["torch_best_gbps"], row["copy_gbps"] = gbps(tt), gbps(best), gbps(cp)
    for k in ("eager", "torch.compile"):  # the columns of earlier result files
        key = "compile" if k == "torch.compile" else k
        row[f"{key}_us"] = row["torch_routes"].get(k)
        row[f"{key}_gbps"] = gbps(med.get(k))
    row["pct_of_copy"] = round(100.0 * row["tiletune_gbps"] / row["copy_gbps"], 1) \
        if row["tiletune_gbps"] and row["copy_gbps"] else None
    row["torch_best_pct_of_copy"] = round(100.0 * row["torch_best_gbps"] / row["copy_gbps"], 1) \
        if row["torch_best_gbps"] and row["copy_gbps"] else None
    row["ratio"] = round(best / tt, 4) if best and tt else None
    row["speedup_vs_eager"] = round(med["eager"] / tt, 3) if tt and med.get("eager") else None
    row["speedup_vs_compile"] = round(med["torch.compile"] / tt, 3) if tt and med.get("torch.compile") else None
    row["verdict"] = verdict(row["ratio"], row["tiletune_gbps"], row["torch_best_gbps"], row["copy_gbps"])
    return row


def measure(op: str, shape: tuple[int, ...], dtype_name: str, args: argparse.Namespace, timer: Any,
            device_copy_gbps: float) -> dict[str, Any]:
    """One row: tiletune's first (tuning) call, each torch route's first call (compiles, under
    ``--route-limit-s``; failures become ``torch_route_errors``), then tiletune, a copy of the same
    bytes and every working route timed interleaved in rounds (cold L2)."""
    import torch

    from tiletune.kernels.library_op import LibraryOp

    dtype = getattr(torch, DT[dtype_name])
    prob = build(op, shape, dtype)
    nbytes = prob["bytes"]
    row: dict[str, Any] = {"op": op, "shape": list(shape), "dtype": DT[dtype_name], "bytes": nbytes,
                           "working_set_mib": round(working_set_mib(nbytes), 1),
                           "device_copy_gbps": round(device_copy_gbps, 1)}
    fam_before = {id(f): f.chosen() for f in LibraryOp.instances()}

    t0 = time.perf_counter()
    prob["tiletune"]()  # tunes (or finds the key in the database)
    torch.cuda.synchronize()
    row["tune_s"] = round(time.perf_counter() - t0, 2)
    for f in LibraryOp.instances():  # the config this problem got
        new = [c for c in f.chosen() if c not in fam_before.get(id(f), [])]
        if new:
            row["config"] = new[-1]["config"]

    torch._dynamo.reset()  # one shape's compiles never count against another's recompile limit
    t0 = time.perf_counter()
    routes = first_calls(row, memory_torch_routes(op, prob, not args.no_compile), args.route_limit_s)
    row["routes_first_calls_s"] = round(time.perf_counter() - t0, 1)
    fns: dict[str, Callable[[], Any]] = {"tiletune": prob["tiletune"], "copy": copy_of(nbytes), **routes}
    for fn in fns.values():  # warm-up
        for _ in range(args.warmup):
            fn()
    torch.cuda.synchronize()
    errors: dict[str, str] = {}
    med = timed_medians(fns, timer, args.rounds, args.per_round, errors)
    if errors:
        row.setdefault("torch_route_errors", {}).update(errors)
    fill_row(row, med, list(routes), nbytes)
    if getattr(args, "_timer_checks_left", 0) > 0 and row["tiletune_us"]:
        args._timer_checks_left -= 1
        row["timer_check"] = timer_check(prob["tiletune"], row["tiletune_us"])
        if row["torch_best_route"]:
            row["timer_check_torch"] = timer_check(routes[row["torch_best_route"]], row["torch_best_us"])
    return row


# --------------------------------------------------------------------------------------------
# summary, table, plots
# --------------------------------------------------------------------------------------------


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per op: geomean speedups over its rows, the lowest % of copy at working sets >= 64 MiB, targets met."""
    out: dict[str, Any] = {}
    for op in OPS:
        rs = [r for r in rows if r["op"] == op and r.get("tiletune_gbps")]
        if not rs:
            continue
        big = [r["pct_of_copy"] for r in rs if r["working_set_mib"] >= TARGETS["big_ws_mib"]]
        ge, gc = _geomean([r["speedup_vs_eager"] for r in rs]), _geomean([r.get("speedup_vs_compile") for r in rs])
        s = {"rows": len(rs), "geomean_vs_eager": ge and round(ge, 3), "geomean_vs_compile": gc and round(gc, 3),
             "min_pct_of_copy_big": min(big) if big else None}
        s["met_pct"] = None if not big else min(big) >= TARGETS["pct_of_copy_min"]
        s["met_eager"] = None if ge is None else ge >= TARGETS["geomean_vs_eager"]
        s["met_compile"] = None if gc is None else gc >= TARGETS["geomean_vs_compile"]
        out[op] = s
    return out


def summarize_honest(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 14 over the measured rows: verdict counts, the rows lost (not a tie) to the fastest torch
    route, the lowest % of copy at working sets >= 256 MiB, the timer checks, and whether the targets
    were met."""
    rated = [r for r in rows if r.get("verdict")]
    count = {v: sum(1 for r in rated if r["verdict"] == v) for v in ("win", "tie", "loss")}
    big = [r for r in rated if r["working_set_mib"] >= ISSUE14["big_ws_mib"] and r.get("pct_of_copy") is not None]
    low = min((r["pct_of_copy"] for r in big), default=None)
    losses = [f"{r['op']} {_shape(r)} {r['dtype']}: {r['ratio']:.3f}x vs {r['torch_best_route']}"
              for r in rated if r["verdict"] == "loss"]
    best_routes: dict[str, int] = {}
    for r in rated:
        best_routes[r["torch_best_route"]] = best_routes.get(r["torch_best_route"], 0) + 1
    s: dict[str, Any] = {"rows_rated": len(rated), "rows_unrated": len(rows) - len(rated), **count,
                         "losses": losses, "geomean_ratio": _geomean([r["ratio"] for r in rated]),
                         "min_pct_of_copy_256mib": low, "best_route_counts": best_routes,
                         **summarize_timer_checks([r[k] for r in rows for k in ("timer_check", "timer_check_torch")
                                                   if isinstance(r.get(k), dict)])}
    s["met_every_row"] = bool(rated) and not losses and s["rows_unrated"] == 0
    s["met_pct_of_copy"] = None if low is None else low >= ISSUE14["pct_of_copy_min"]
    return s


def _f(x: Any, nd: int = 0, suffix: str = "") -> str:
    return "-" if x is None else f"{x:.{nd}f}{suffix}"


def _shape(r: dict[str, Any]) -> str:
    return "x".join(str(s) for s in r["shape"])


def readme_table(rows: list[dict[str, Any]], summary: dict[str, Any], env: dict[str, Any]) -> str:
    copy = next((r["copy_gbps"] for r in rows if r.get("copy_gbps")), None)
    lines = [
        f"Measured by `benchmarks/kernels_memory.py` on {env.get('gpu', '?')} ({env.get('date', '?')}, torch "
        f"{env.get('torch', '?')}); device copy {_f(copy)} GB/s (read + write). GB/s = minimal bytes / median "
        "time, cold L2.",
        "",
        "| op | shape | dtype | MiB | tiletune GB/s | % copy | eager GB/s | compile GB/s | vs eager | vs compile "
        "| fastest torch route | vs fastest | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("error") or r.get("skipped"):
            lines.append(f"| {r['op']} | {_shape(r)} | {r['dtype']} | - | {'error' if r.get('error') else 'skipped'} "
                         "| - | - | - | - | - | - | - | - |")
            continue
        lines.append(
            f"| {r['op']} | {_shape(r)} | {r['dtype']} | {_f(r['working_set_mib'])} | {_f(r['tiletune_gbps'])} | "
            f"{_f(r['pct_of_copy'], 1)} | {_f(r['eager_gbps'])} | {_f(r.get('compile_gbps'))} | "
            f"{_f(r['speedup_vs_eager'], 2, 'x')} | {_f(r.get('speedup_vs_compile'), 2, 'x')} | "
            f"{r.get('torch_best_route') or '-'} | {_f(r.get('ratio'), 2, 'x')} | {r.get('verdict') or '-'} |")
    lines += ["", "| op | geomean vs eager (>= 1.2) | geomean vs compile (>= 1.0) | min % copy, >= 64 MiB (>= 90) |",
              "|---|---|---|---|"]

    def mark(v: Any, ok: Any, nd: int, suffix: str) -> str:
        return "-" if v is None else f"{v:.{nd}f}{suffix}" + ("" if ok is None else (" ok" if ok else " **missed**"))

    for op, s in summary.items():
        lines.append(f"| {op} | {mark(s['geomean_vs_eager'], s['met_eager'], 2, 'x')} | "
                     f"{mark(s['geomean_vs_compile'], s['met_compile'], 2, 'x')} | "
                     f"{mark(s['min_pct_of_copy_big'], s['met_pct'], 1, '%')} |")
    return "\n".join(lines)


def update_readme(table: str, path: Path = README) -> bool:
    """Replace the text between the kernels_memory markers of ``benchmarks/README.md``."""
    if not path.exists():
        return False
    text = path.read_text()
    if BEGIN not in text or END not in text:
        return False
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    return True


def plot(rows: list[dict[str, Any]], out: Path) -> list[str]:
    """One PNG per op: GB/s of tiletune, eager and compile per shape, the copy bandwidth and 90% of it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        print(f"no plots (matplotlib unavailable: {exc}); render them later with --plot-only", file=sys.stderr)
        return []
    written = []
    for op in OPS:
        rs = [r for r in rows if r["op"] == op and r.get("tiletune_gbps")]
        if not rs:
            continue
        fig, ax = plt.subplots(figsize=(max(6.0, 1.5 * len(rs) + 2), 4.5))
        xs = list(range(len(rs)))
        w = 0.27
        for i, (k, label) in enumerate((("tiletune", "tiletune"), ("eager", "torch eager"),
                                        ("torch_best", "fastest torch route (named below)"))):
            ax.bar([x + (i - 1) * w for x in xs], [r.get(f"{k}_gbps") or 0 for r in rs], w, label=label)
        # the copy of each row's bytes (older result files: one device copy for all rows)
        ax.plot(xs, [r.get("copy_gbps") or 0 for r in rs], "k_", ms=30, mew=1.5, ls="none",
                label="torch copy of the same bytes")
        ax.plot(xs, [0.9 * (r.get("copy_gbps") or 0) for r in rs], "_", color="gray", ms=30, ls="none",
                label="90% of copy")
        for x, r in zip(xs, rs):
            ax.text(x - w, r["tiletune_gbps"], f"{r['pct_of_copy']:.0f}%" if r.get("pct_of_copy") else "",
                    ha="center", va="bottom", fontsize=7)
            if r.get("verdict"):
                ax.text(x, 0.02 * (r.get("copy_gbps") or 1), f"{r['ratio']:.2f}x {r['verdict']}", ha="center",
                        va="bottom", fontsize=7, color="white")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{_shape(r)}\n{r['dtype'].replace('bfloat', 'bf').replace('float', 'fp')}\n"
                            f"{r['working_set_mib']:.0f} MiB\n{r.get('torch_best_route') or 'compile'}" for r in rs],
                           fontsize=6)
        ax.set_ylabel("GB/s (minimal bytes / time)")
        ax.set_title(f"{op}: tiletune vs torch routes (cold L2)")
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        p = out / f"kernels_memory_{op}.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        small_png(p)
        written.append(str(p))
    return written


def print_honest(h: dict[str, Any]) -> None:
    """Issue 14's targets against :func:`summarize_honest`."""
    print(f"\n== issue 14: vs the fastest torch route over {h['rows_rated']} rows ({h['rows_unrated']} unrated): "
          f"{h['win']} win, {h['tie']} tie (both >= {ISSUE14['tie_fraction_of_copy']:.0%} of copy), {h['loss']} loss "
          f"[{'ok' if h['met_every_row'] else 'MISSED'}]; geomean {_f(h['geomean_ratio'], 3)}x; min % of copy at >= "
          f"{ISSUE14['big_ws_mib']:.0f} MiB {_f(h['min_pct_of_copy_256mib'], 1)} (>= {ISSUE14['pct_of_copy_min']:.0f})")
    for line in h["losses"]:
        print(f"  loss: {line}")
    print(f"  fastest torch route per row: {h['best_route_counts']}")
    if h["timer_check_rows"]:
        print(f"  timer vs triton do_bench: max disagreement {_f(h['timer_check_max_disagreement'], 4)} over "
              f"{h['timer_check_rows']} timings ({'within' if h['timer_check_ok'] else 'OUTSIDE'} 3%)")


def print_summary(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    print(f"\n{'op':<20} {'shape':<22} {'dtype':<9} {'MiB':>7} {'tiletune':>9} {'%copy':>6} {'eager':>8} "
          f"{'compile':>8} {'xeager':>7} {'xcomp':>7}  config")
    for r in rows:
        if not r.get("tiletune_gbps"):
            print(f"{r['op']:<20} {_shape(r):<22} {r['dtype']:<9} {r.get('error') or r.get('skipped')}")
            continue
        print(f"{r['op']:<20} {_shape(r):<22} {r['dtype']:<9} {r['working_set_mib']:7.0f} {r['tiletune_gbps']:9.0f} "
              f"{_f(r['pct_of_copy'], 1):>6} {_f(r['eager_gbps']):>8} {_f(r.get('compile_gbps')):>8} "
              f"{_f(r['speedup_vs_eager'], 2):>7} {_f(r.get('speedup_vs_compile'), 2):>7}  "
              f"{json.dumps(r.get('config', {}))}")
    print(f"\n== per-op targets (H200): geomean >= {TARGETS['geomean_vs_eager']}x eager, >= "
          f"{TARGETS['geomean_vs_compile']}x compile, >= {TARGETS['pct_of_copy_min']}% of copy at >= "
          f"{TARGETS['big_ws_mib']:.0f} MiB")
    for op, s in summary.items():
        flags = {k: ("ok" if v else "MISSED") if v is not None else "-" for k, v in s.items() if k.startswith("met_")}
        print(f"{op:<20} vs eager {_f(s['geomean_vs_eager'], 2)} [{flags['met_eager']}]  vs compile "
              f"{_f(s['geomean_vs_compile'], 2)} [{flags['met_compile']}]  min %copy "
              f"{_f(s['min_pct_of_copy_big'], 1)} [{flags['met_pct']}]")


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def problems(args: argparse.Namespace) -> list[tuple[str, tuple[int, ...], str]]:
    """The rows to measure, (op, shape, dtype name), from ``--only``, ``--quick``, ``--full``, ``--dtypes``."""
    ops = OPS if not args.only else [o.strip() for o in args.only.split(",")]
    bad = [o for o in ops if o not in SHAPES]
    if bad:
        raise SystemExit(f"unknown op(s) {bad}; choose from {OPS}")
    if args.quick:
        return [r for r in QUICK_ROWS if r[0] in ops]
    dtypes = [d.strip() for d in args.dtypes.split(",")] if args.dtypes else None
    bad = [d for d in dtypes or [] if d not in DT]
    if bad:
        raise SystemExit(f"unknown dtype(s) {bad}; choose from {list(DT)}")
    out = []
    for op in ops:
        for i, shape in enumerate(SHAPES[op]):
            if args.full:
                ds = ["bf16", "fp16", "fp32"]
            elif dtypes:
                ds = dtypes
            else:
                ds = ["bf16", "fp32"] if i == 0 and op in FP32_TOO else ["bf16"]
            out += [(op, shape, d) for d in ds]
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=f"result folder (default {DEFAULT_OUT})")
    ap.add_argument("--only", default=None, help="comma-separated ops: " + ",".join(OPS))
    ap.add_argument("--quick", action="store_true",
                    help=f"{len(QUICK_ROWS)} rows (rms_norm, layer_norm, softmax, swiglu), < 4 min on a fresh H200")
    ap.add_argument("--full", action="store_true", help="every shape in bf16, fp16 and fp32")
    ap.add_argument("--dtypes", default=None, help="e.g. bf16,fp32 for every shape (default: bf16, + fp32 first shape)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile routes")
    ap.add_argument("--route-limit-s", type=float, default=None,
                    help="time limit of a torch route's first call (its compile); past it the route is recorded "
                         "as an error (default 90, --quick 45)")
    ap.add_argument("--timer-check", type=int, default=TIMER_CHECK_ROWS, metavar="N",
                    help="re-time the first N rows (tiletune and the fastest torch route) with "
                         f"triton.testing.do_bench; agreement within 3%% (default {TIMER_CHECK_ROWS}, 0: off)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--backlog-us", type=float, default=200.0,
                    help="GPU spin before each timed call so host overhead stays out of the events (0: off)")
    ap.add_argument("--db", default=None, help="tuning database (default: a fresh one in a temp folder)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="start no new problem after this many seconds (default: none, --quick 150)")
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite the table in benchmarks/README.md")
    ap.add_argument("--plot-only", default=None, metavar="JSON", help="only render PNGs/table from a result file")
    args = ap.parse_args(argv)
    if args.route_limit_s is None:
        args.route_limit_s = 45.0 if args.quick else 90.0
    if args.deadline is None and args.quick:
        args.deadline = 150.0
    if args.timer_check < 0:
        ap.error("--timer-check must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args._timer_checks_left = args.timer_check

    if args.plot_only:
        doc = json.loads(Path(args.plot_only).read_text())
        out = Path(args.out) if args.out else Path(args.plot_only).parent
        out.mkdir(parents=True, exist_ok=True)
        pngs = plot(doc["rows"], out)
        table = readme_table(doc["rows"], summarize(doc["rows"]), doc)
        (out / "kernels_memory.md").write_text(table + "\n")
        if not args.no_readme and update_readme(table):
            print(f"updated {README}")
        print("\n".join(pngs) or "no PNGs written")
        return 0

    import tempfile

    import torch

    if not torch.cuda.is_available():
        print("kernels_memory: needs a CUDA GPU", file=sys.stderr)
        return 2
    import tiletune as tt
    from tiletune.kernels.library_op import LibraryOp
    from tiletune.devices.measure import ColdL2Timer

    out = Path(args.out or os.environ.get("BENCH_OUT") or DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    db_path = Path(args.db) if args.db else Path(tempfile.mkdtemp(prefix="tiletune-kmem-")) / "tuning.db"
    LibraryOp.configure(db=tt.TuningDB(db_path), progress=False)

    timer = ColdL2Timer(torch.cuda.current_device(), backlog_us=args.backlog_us)
    n_samples = args.rounds * args.per_round
    copy = copy_bandwidth(timer, n_samples)
    print(f"device copy: {copy['copy_gbps']:.0f} GB/s (1 GiB, read + write)", flush=True)
    todo = problems(args)
    rows: list[dict[str, Any]] = []
    partial = out / "kernels_memory.partial.json"
    t_start = time.perf_counter()
    for i, (op, shape, dn) in enumerate(todo):
        elapsed = time.perf_counter() - t_start
        base = {"op": op, "shape": list(shape), "dtype": DT[dn], "device_copy_gbps": round(copy["copy_gbps"], 1)}
        if args.deadline is not None and elapsed > args.deadline:
            rows.append({**base, "skipped": f"deadline {args.deadline:.0f} s"})
            continue
        print(f"[{elapsed:6.1f} s] {i + 1}/{len(todo)} {op} {shape} {dn} ...", flush=True)
        try:
            row = measure(op, shape, dn, args, timer, copy["copy_gbps"])
            print(f"    tiletune {_f(row['tiletune_gbps'])} GB/s ({_f(row['pct_of_copy'], 1)}% of copy), eager "
                  f"{_f(row['eager_gbps'])}, best torch {row.get('torch_best_route')} {_f(row.get('torch_best_gbps'))} "
                  f"(ratio {_f(row.get('ratio'), 3)}, {row.get('verdict')}), copy {_f(row.get('copy_gbps'))}, "
                  f"tune {row['tune_s']} s, "
                  f"config {json.dumps(row.get('config'))}", flush=True)
        except Exception as exc:  # keep going: one failing problem must not lose the sweep
            row = {**base, **failure_fields(exc)}
        rows.append(row)
        torch.cuda.empty_cache()
        partial.write_text(json.dumps({"rows": rows}, indent=1, default=str) + "\n")

    summary = summarize(rows)
    honest = summarize_honest(rows)
    pngs = plot(rows, out)
    path = write_result("kernels_memory", {
        "problem": "memory-bound ops: tiletune vs every torch route (eager, torch.compile default and "
                   "max-autotune-no-cudagraphs, fused alternatives); public calls, CUDA events, cold L2, medians of "
                   "interleaved rounds; GB/s = minimal bytes / time; copy_gbps per row: a torch copy of the same bytes",
        **copy,
        "samples_each": n_samples,
        "backlog_us": args.backlog_us,
        "backlog_cycles": timer.backlog_cycles,
        "targets": TARGETS,
        "summary": summary,
        "honest_baselines": honest,
        "issue14_targets": ISSUE14,
        "quick": args.quick,
        "route_limit_s": args.route_limit_s,
        "torch_route_names": ["eager", *COMPILE_ROUTES, "torch._fused_rms_norm (rms_norm)"],
        "ratio_definition": "torch_best_us / tiletune_us, all routes timed interleaved with tiletune and a copy of "
                            "the same bytes; verdict: win (ratio >= 1), tie (ratio < 1 but the fastest torch route "
                            "and tiletune both >= 97% of copy_gbps), loss",
        "wall_s": round(time.perf_counter() - t_start, 1),
        "pngs": [Path(p).name for p in pngs],
        "rows": rows,
    }, out)
    partial.unlink(missing_ok=True)
    doc = json.loads(path.read_text())
    table = readme_table(rows, summary, doc)
    (out / "kernels_memory.md").write_text(table + "\n")
    if not args.no_readme and update_readme(table):
        print(f"updated {README}")
    print(f"wrote {path}" + "".join(f", {p}" for p in pngs))
    print_summary(rows, summary)
    print_honest(honest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
