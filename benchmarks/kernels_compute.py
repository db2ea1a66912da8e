"""Compute-bound kernels: tiletune's GEMM and attention forward vs torch, TFLOP/s on one GPU.

GEMM (``tiletune.kernels.matmul`` vs ``torch.matmul``): bf16, ``M`` in 16..16384 against the
``(N, K)`` of Llama-3-8B's linear layers ((4096, 4096) q/o-proj, (14336, 4096) up/gate, (4096, 14336)
down), which includes the square 4096^3 case. Outside the sweep's geometric mean: fp16, fp32 (tf32 on
both sides) and fp8 e4m3 with per-tensor scales (vs ``torch._scaled_mm``, B column-major) at 4096^3,
and a batched 16 x 1024^3 product. ``A`` is ``M x K`` and ``B`` is
``K x N``, both row-major (``--b-transposed``: ``B`` is the ``.t()`` view of an ``N x K`` weight, the
``x @ W.t()`` layout of a linear layer). 2*M*N*K flops.

Attention forward (``tiletune.kernels.attention_op.attention`` vs
``torch.nn.functional.scaled_dot_product_attention``): a constant 16384 tokens per batch
(``B = 16384 // S``, S from 1k to 16k), 32 query heads, 32 (MHA) or 8 (GQA) key/value heads, head
dim 64 and 128, bf16, causal and not (40 rows; ``--quick``: 4). 4*B*H*S*S*D flops, halved when
causal. The torch routes (:func:`attention_torch_routes`): SDPA with torch's default backend
choice and each backend allowed alone via ``sdpa_kernel`` (flash, cuDNN, efficient; math only when
none of those works), for GQA each both with ``enable_gqa=True`` and with k/v expanded by
``repeat_interleave`` outside the timing. A route that errors (an unsupported backend or shape) is
recorded in ``torch_route_errors``.

Honest baselines (issue 14): every GEMM row times each torch route a user could pick (``torch.matmul``;
``F.linear`` with the weight stored ``N x K``; ``torch.bmm`` for batched rows; with ``--compile-routes``
``torch.compile(mode="max-autotune-no-cudagraphs")``; ``torch._scaled_mm`` for fp8; the SDPA routes
above), each alone (first call excluded, limited to ``--route-limit-s``), and compares tiletune A/B
against the fastest one: ``torch_routes`` (route -> us; the best route's entry is its A/B median,
``torch_routes_solo_us`` keeps the solo medians), ``torch_best_route``, ``torch_best_us``, ``ratio =
torch_best_us / tiletune_us``, ``verdict`` (win / loss). The first ``--timer-check`` rows (3) also
time tiletune and the best torch route with ``triton.testing.do_bench`` and record the
disagreement (``timer_check``, ``timer_check_torch``; agreement: within 3%). ``--quick``: the 9
Llama-3-8B GEMM rows at M 16, 128, 1024 and 4 attention rows (shared helpers: ``_routes.py``).

For each problem the first tiletune call tunes it (or finds it in the tuning database); that call is
timed on its own (``tune_s``) and excluded from the kernel timing. Then both ops are warmed up and
timed alternately (A/B rounds) with CUDA events and a cold L2 (:class:`tiletune.devices.measure.ColdL2Timer`:
an L2-sized memset outside the timed events before every sample); the medians are reported. Both
timings are of the public calls (output allocation included, as for torch). A failing tiletune op
is recorded in its row (``error``) and the sweep goes on.

    python benchmarks/kernels_compute.py [--quick] [--only gemm|attention] [--out DIR]

Writes kernels_compute.json (rows: op, shape, dtype, tiletune_tflops, torch_tflops, ratio,
tiletune_us, torch_us, winner, tune_s, ...), kernels_compute_gemm.png and
kernels_compute_attention.png, and prints a README table and the geometric means against the
issue's targets last. A partial JSON is rewritten after every row, so an interrupted run keeps what
it measured; ``--deadline`` stops starting new problems after that many seconds.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from _common import DEFAULT_OUT, small_png, write_result
from _routes import TIMER_CHECK_TOLERANCE, summarize_timer_checks, time_routes, timer_check, verdict

#: Llama-3-8B linear layers, (N, K): q/o-proj, gate/up-proj, down-proj.
LLAMA3_8B_NK = [(4096, 4096), (14336, 4096), (4096, 14336)]
GEMM_M = [16, 128, 1024, 4096, 16384]
#: ``--quick``: the Llama-3-8B GEMM rows at these token counts (9 rows)
QUICK_GEMM_M = [16, 128, 1024]
#: rows whose tiletune timing is cross-checked against ``triton.testing.do_bench`` (first N GEMM rows)
TIMER_CHECK_ROWS = 3
ATTN_SEQ = [1024, 2048, 4096, 8192, 16384]
ATTN_TOKENS = 16384
ATTN_H = 32
#: k/v heads: MHA (32) and GQA 32/8
ATTN_HKVS = [32, 8]
ATTN_DS = [64, 128]
#: ``--quick`` attention rows, (S, Hkv, D, causal): the GQA row of issue 14 where SDPA's default beats
#: flash-only, a long GQA row, and two MHA rows (one at D 64)
QUICK_ATTN = [(4096, 8, 128, True), (16384, 8, 128, False), (1024, 32, 64, True), (8192, 32, 128, False)]

#: Issue 6 targets on the H200.
TARGETS = {"gemm_4096_ratio": 1.0, "gemm_geomean": 0.95, "attention_geomean": 0.9}


class _Stop(BaseException):
    """Raised by the SIGTERM handler (a BaseException, so no ``except Exception`` in a tuner eats it)."""


# --------------------------------------------------------------------------------------------
# problems
# --------------------------------------------------------------------------------------------


def gemm_problems(quick: bool) -> list[dict[str, Any]]:
    """The GEMM sweep, 4096^3 first (bf16, then fp16), then the bf16 LLM shapes."""
    probs = [dict(op="gemm", M=4096, N=4096, K=4096, dtype="bfloat16", sweep=True),
             dict(op="gemm", M=4096, N=4096, K=4096, dtype="float16", sweep=False),
             dict(op="gemm", M=4096, N=4096, K=4096, dtype="float32", sweep=False),
             dict(op="gemm", M=4096, N=4096, K=4096, dtype="float8_e4m3fn", sweep=False),
             dict(op="gemm", M=1024, N=1024, K=1024, dtype="bfloat16", batch=16, sweep=False)]
    if quick:  # the Llama-3-8B rows at M 16, 128, 1024 only (issue 14: small-M split-K and honest baselines)
        return [dict(op="gemm", M=m, N=n, K=k, dtype="bfloat16", sweep=True)
                for m in QUICK_GEMM_M for (n, k) in LLAMA3_8B_NK]
    shapes = [(m, n, k) for (n, k) in LLAMA3_8B_NK for m in GEMM_M]
    for m, n, k in shapes:
        if (m, n, k) != (4096, 4096, 4096):
            probs.append(dict(op="gemm", M=m, N=n, K=k, dtype="bfloat16", sweep=True))
    return probs


def attention_problems(quick: bool) -> list[dict[str, Any]]:
    """The attention sweep: B * S = 16384 tokens, 32 query heads, MHA (32 k/v heads) and GQA (8), head dim
    64 and 128, bf16, non-causal and causal, S 1k-16k (40 rows); ``quick``: :data:`QUICK_ATTN` (4 rows)."""
    combos = QUICK_ATTN if quick else [(s, hkv, d, c) for s in ATTN_SEQ for hkv in ATTN_HKVS for d in ATTN_DS
                                       for c in (False, True)]
    return [dict(op="attention", B=ATTN_TOKENS // s, H=ATTN_H, Hkv=hkv, S=s, D=d, causal=c, dtype="bfloat16",
                 sweep=True) for s, hkv, d, c in combos]


def shape_label(p: dict[str, Any]) -> str:
    if p["op"] == "gemm":
        return (f"{p['batch']}x" if p.get("batch") else "") + f"{p['M']}x{p['N']}x{p['K']}"
    return f"B{p['B']} H{p['H']}/{p['Hkv']} S{p['S']} D{p['D']}" + (" causal" if p["causal"] else "")


def blank_row(p: dict[str, Any]) -> dict[str, Any]:
    """A result row with no measurement yet."""
    return {"op": p["op"], "shape": shape_label(p), "dtype": p["dtype"], "sweep": p["sweep"],
            "params": {k: v for k, v in p.items() if k not in ("op", "dtype", "sweep")},
            "flops": flops(p), "tiletune_tflops": None, "torch_tflops": None, "ratio": None,
            "tiletune_us": None, "torch_us": None, "winner": None}


def flops(p: dict[str, Any]) -> float:
    if p["op"] == "gemm":
        return 2.0 * p.get("batch", 1) * p["M"] * p["N"] * p["K"]
    f = 4.0 * p["B"] * p["H"] * p["S"] * p["S"] * p["D"]
    return f / 2 if p["causal"] else f


# --------------------------------------------------------------------------------------------
# tiletune op introspection (best effort: the benchmark works without it)
# --------------------------------------------------------------------------------------------


def _tuned_ops(module: Any) -> list[Any]:
    from tiletune import TunedOp

    return [v for v in vars(module).values() if isinstance(v, TunedOp)]


def _plain_gemm_ops() -> list[Any]:
    """The tuned ops of the plain GEMM library ops (16-bit, tf32, fp8), made now if they are not yet
    (library ops are made on first use; the first problem's tuning must find them in the snapshot)."""
    gemm_mod = importlib.import_module("tiletune.kernels.gemm")
    return [lib.op(None) for lib in (gemm_mod.GEMM, gemm_mod.GEMM_TF32, gemm_mod.GEMM_FP8)]


def _snapshot(ops: list[Any]) -> dict[int, set]:
    return {id(op): set(getattr(op, "_configs", {})) for op in ops}


def _tuning_info(ops: list[Any], before: dict[int, set]) -> dict[str, Any]:
    """Winner config and tuning statistics of the keys the first call added."""
    info: dict[str, Any] = {}
    try:
        for op in ops:
            new = [k for k in getattr(op, "_configs", {}) if k not in before.get(id(op), set())]
            for key in new:
                cfg = op._configs[key]
                info["winner"] = cfg.as_dict() if hasattr(cfg, "as_dict") else dict(cfg)
                info["tuned_op"] = op.name
                res = op.results.get(key)
                info["tuned"] = res is not None  # False: the database had it
                if res is not None:
                    info["tuning"] = {
                        "wall_s": round(res.wall_s, 3),
                        "winner_median_us": res.winner_median_us,
                        "evaluations": res.stats.get("evaluations"),
                        "strategy": res.stats.get("strategy"),
                        "ok": len(res.successes),
                        "failed": len(res.failures),
                        "samples": res.stats.get("samples"),
                    }
    except Exception as exc:  # pragma: no cover - introspection only
        info["introspection_error"] = repr(exc)
    return info


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------


def ab_time(timer: Any, fa: Callable[[], Any], fb: Callable[[], Any], rounds: int, per_round: int,
            warmup: int) -> tuple[float, float, int]:
    """Interleaved A/B timing (cold L2): medians of ``rounds * per_round`` samples each, in us."""
    spin = getattr(timer, "spin", None)
    if spin is not None:  # GPU clocks out of idle before the first sample
        spin(0.05)
    timer.time(fa, warmup)
    timer.time(fb, warmup)
    sa: list[float] = []
    sb: list[float] = []
    for r in range(rounds):
        if r % 2 == 0:  # alternate who goes first in a round
            sa += timer.time(fa, per_round)
            sb += timer.time(fb, per_round)
        else:
            sb += timer.time(fb, per_round)
            sa += timer.time(fa, per_round)
    return statistics.median(sa), statistics.median(sb), len(sa)


def _tflops(f: float, us: float | None) -> float | None:
    return None if not us else f / (us * 1e-6) / 1e12


# --------------------------------------------------------------------------------------------
# one problem
# --------------------------------------------------------------------------------------------


def _setup_gemm(p: dict[str, Any], b_transposed: bool,
                compile_routes: bool = False) -> tuple[Callable, dict[str, Callable], tuple, Any]:
    import torch

    gemm_mod = importlib.import_module("tiletune.kernels.gemm")

    dt = getattr(torch, p["dtype"])
    fp8 = p["dtype"] == "float8_e4m3fn"
    g = torch.Generator(device="cuda").manual_seed(0)
    gen = torch.float32 if fp8 else dt
    lead = (p["batch"],) if p.get("batch") else ()
    a = torch.randn(*lead, p["M"], p["K"], device="cuda", dtype=gen, generator=g).to(dt)
    if b_transposed or fp8:  # torch._scaled_mm wants B column-major (the N x K weight's .t())
        b = torch.randn(*lead, p["N"], p["K"], device="cuda", dtype=gen, generator=g).to(dt).transpose(-1, -2)
    else:
        b = torch.randn(*lead, p["K"], p["N"], device="cuda", dtype=gen, generator=g)
    if fp8:
        sa = torch.tensor(0.5, device="cuda")
        sb = torch.tensor(0.25, device="cuda")
        return ((lambda: gemm_mod.matmul(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)),
                {"torch._scaled_mm": (lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb,
                                                                out_dtype=torch.bfloat16))}, (a, b), gemm_mod)
    return (lambda: gemm_mod.matmul(a, b)), gemm_torch_routes(a, b, compile_routes), (a, b), gemm_mod


def gemm_torch_routes(a: Any, b: Any, compile_routes: bool) -> dict[str, Callable[[], Any]]:
    """Every way a torch user computes ``a @ b`` (issue 14, item 1): ``torch.matmul``; ``F.linear`` with
    the weight stored as an ``N x K`` row-major tensor (``b.t()`` made contiguous once, outside the
    timing); ``torch.bmm`` for batched products; with ``compile_routes``
    ``torch.compile(mode="max-autotune-no-cudagraphs")`` of the matmul (autotuned on its first call,
    which is excluded from the timing like tiletune's tuning call)."""
    import torch
    import torch.nn.functional as F

    routes: dict[str, Callable[[], Any]] = {"torch.matmul": lambda: torch.matmul(a, b)}
    if a.dim() == 2:
        w = b.t().contiguous()  # the N x K weight of a linear layer
        routes["F.linear"] = lambda: F.linear(a, w)
    else:
        routes["torch.bmm"] = lambda: torch.bmm(a, b)
    if compile_routes:
        compiled = torch.compile(lambda x, y: torch.matmul(x, y), mode="max-autotune-no-cudagraphs", dynamic=False)
        routes["torch.compile(max-autotune-no-cudagraphs)"] = lambda: compiled(a, b)
    return routes


def attention_torch_routes(q: Any, k: Any, v: Any, causal: bool) -> tuple[dict[str, Callable[[], Any]],
                                                                      dict[str, Callable[[], Any]]]:
    """Every SDPA route a torch user could pick for ``(q, k, v)`` (issue 14, item 1): torch's default
    backend choice, then each backend allowed alone through ``torch.nn.attention.sdpa_kernel`` (flash,
    cuDNN, efficient); for GQA (fewer k/v heads than query heads) each of those both with
    ``enable_gqa=True`` and with k/v expanded by ``repeat_interleave`` (done here, once, outside any
    timing). Returns ``(routes, fallback)``: ``fallback`` holds the math backend, to be timed only
    when no other route works."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [("default", None), ("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    h, hkv = q.shape[-3], k.shape[-3]
    variants: list[tuple[str, Any, Any, dict[str, Any]]]
    if h == hkv:
        variants = [("", k, v, {})]
    else:
        rep = h // hkv
        ke, ve = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
        variants = [(", enable_gqa", k, v, {"enable_gqa": True}), (", expanded k/v", ke, ve, {})]

    def route(backend: Any, kk: Any, vv: Any, kw: dict[str, Any]) -> Callable[[], Any]:
        if backend is None:
            return lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, **kw)

        def call() -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal, **kw)

        return call

    routes = {f"SDPA {name}{tag}": route(be, kk, vv, kw) for name, be in backends for tag, kk, vv, kw in variants}
    fallback = {f"SDPA math{tag}": route(SDPBackend.MATH, kk, vv, kw) for tag, kk, vv, kw in variants}
    return routes, fallback


def _setup_attention(p: dict[str, Any]) -> tuple[Callable, dict[str, Callable], dict[str, Callable], tuple, Any]:
    import torch

    attn_mod = importlib.import_module("tiletune.kernels.attention_op")

    dt = getattr(torch, p["dtype"])
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(p["B"], p["H"], p["S"], p["D"], device="cuda", dtype=dt, generator=g)
    k = torch.randn(p["B"], p["Hkv"], p["S"], p["D"], device="cuda", dtype=dt, generator=g)
    v = torch.randn(p["B"], p["Hkv"], p["S"], p["D"], device="cuda", dtype=dt, generator=g)
    causal = p["causal"]
    routes, fallback = attention_torch_routes(q, k, v, causal)
    return (lambda: attn_mod.attention(q, k, v, causal=causal)), routes, fallback, (q, k, v), attn_mod


def measure(p: dict[str, Any], args: argparse.Namespace, timer: Any) -> dict[str, Any]:
    """One problem: tiletune's first (tuning) call, every torch route timed alone, then tiletune A/B
    against the fastest route; a failing route or tiletune call is recorded in the row."""
    import torch

    row = blank_row(p)
    n_solo = max(args.rounds * args.per_round, 20)
    fallback: dict[str, Callable[[], Any]] = {}
    if p["op"] == "gemm":
        tt_fn, routes, inputs, mod = _setup_gemm(p, args.b_transposed, args.compile_routes)
        row["layout"] = "A row-major, B = W.t() (N x K weight)" if args.b_transposed else "A, B row-major"
    else:
        tt_fn, routes, fallback, inputs, mod = _setup_attention(p)
    ops = _tuned_ops(mod)
    if p["op"] == "gemm":
        from tiletune.kernels.library_op import LibraryOp

        _plain_gemm_ops()
        ops += [op for fam in LibraryOp.instances() if fam.name.startswith("tiletune.gemm")
                for op in fam.ops().values()]
    # torch's reference output: the first route that works (its first call; compiles are excluded)
    ref = None
    for name, fn in {**routes, **fallback}.items():
        try:
            ref = fn()
            torch.cuda.synchronize()
            break
        except Exception as exc:
            row["torch_error"] = f"{name}: {type(exc).__name__}: {exc}"[:2000]
    # tiletune: the first call tunes (or hits the database); timed on its own, excluded below
    before = _snapshot(ops)
    tt_ok = False
    torch_fn: Callable[[], Any] | None = None
    try:
        t0 = time.perf_counter()
        out = tt_fn()
        torch.cuda.synchronize()
        row["tune_s"] = round(time.perf_counter() - t0, 3)
        row.update(_tuning_info(ops, before))
        if ref is not None:
            diff = (out.float() - ref.float()).abs().max().item()
            scale = ref.float().abs().max().item() or 1.0
            row["max_abs_diff_vs_torch"] = diff
            row["rel_diff_vs_torch"] = diff / scale
        del out
        tt_ok = True
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        row["traceback"] = traceback.format_exc()[-4000:]
        row.update(_tuning_info(ops, before))
    if ref is not None:
        best = time_routes(row, routes, timer, args.warmup, n_solo, limit_s=args.route_limit_s, fallback=fallback)
        torch_fn = {**routes, **fallback}.get(best) if best else None
    try:
        if tt_ok and torch_fn is not None:
            ta, tb, n = ab_time(timer, tt_fn, torch_fn, args.rounds, args.per_round, args.warmup)
            row["tiletune_us"], row["torch_us"], row["samples_each"] = ta, tb, n
            row["torch_best_us"] = tb
            row["torch_routes_solo_us"] = dict(row["torch_routes"])
            row["torch_routes"][row["torch_best_route"]] = tb  # the A/B median of the best route
        elif tt_ok:  # no torch route works: tiletune alone, for the table
            timer.time(tt_fn, args.warmup)
            row["tiletune_us"] = statistics.median(timer.time(tt_fn, n_solo))
        elif torch_fn is not None:  # tiletune failed: torch alone, for the table
            row["torch_us"] = row["torch_best_us"] = row["torch_routes"][row["torch_best_route"]]
        if row["tiletune_us"] and getattr(args, "_timer_checks_left", 0) > 0:
            args._timer_checks_left -= 1
            row["timer_check"] = timer_check(tt_fn, row["tiletune_us"])
            if torch_fn is not None and row["torch_us"]:
                row["timer_check_torch"] = timer_check(torch_fn, row["torch_us"])
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        row["traceback"] = traceback.format_exc()[-4000:]
    del ref, inputs
    row["tiletune_tflops"] = _tflops(row["flops"], row["tiletune_us"])
    row["torch_tflops"] = _tflops(row["flops"], row["torch_us"])
    if row["tiletune_us"] and row["torch_us"]:
        row["ratio"] = row["torch_us"] / row["tiletune_us"]  # torch_best_us / tiletune_us
    row["verdict"] = verdict(row["ratio"])
    return row


# --------------------------------------------------------------------------------------------
# summary, table, plots
# --------------------------------------------------------------------------------------------


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(rows: list[dict[str, Any]], planned: dict[str, int]) -> dict[str, Any]:
    gemm = [r for r in rows if r["op"] == "gemm" and r["sweep"] and r["dtype"] == "bfloat16"]
    attn = [r for r in rows if r["op"] == "attention" and r["sweep"]]
    sq = [r for r in gemm if r["params"].get("M") == r["params"].get("N") == r["params"].get("K") == 4096]
    s: dict[str, Any] = {
        "gemm_4096_ratio": sq[0]["ratio"] if sq else None,
        "gemm_geomean": geomean([r["ratio"] for r in gemm]),
        "gemm_measured": sum(1 for r in gemm if r["ratio"]),
        "gemm_planned": planned.get("gemm", 0),
        "attention_geomean": geomean([r["ratio"] for r in attn]),
        "attention_measured": sum(1 for r in attn if r["ratio"]),
        "attention_planned": planned.get("attention", 0),
        "errors": sum(1 for r in rows if r.get("error")),
    }
    s.update(summarize_timer_checks([r[k] for r in rows for k in ("timer_check", "timer_check_torch")
                                     if isinstance(r.get(k), dict)]))
    s["gemm_complete"] = s["gemm_measured"] == s["gemm_planned"]
    s["attention_complete"] = s["attention_measured"] == s["attention_planned"]
    for k, t in TARGETS.items():
        # a geomean over an incomplete sweep (rows that failed or were skipped) does not count as met
        complete = s["attention_complete"] if k.startswith("attention") else s["gemm_complete"]
        s[f"{k}_met"] = None if s[k] is None else bool(s[k] >= t and (complete or k == "gemm_4096_ratio"))
    return s


def _fmt(x: Any, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def readme_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| op | shape | dtype | tiletune TFLOP/s | torch TFLOP/s | ratio |", "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = _fmt(r["ratio"], 3) if r["ratio"] else ("error" if r.get("error") else "-")
        lines.append(f"| {r['op']} | {r['shape']} | {r['dtype']} | {_fmt(r['tiletune_tflops'])} | "
                     f"{_fmt(r['torch_tflops'])} | {ratio} |")
    return "\n".join(lines)


def _ratio_bars(plt: Any, rows: list[dict[str, Any]], *, label: str, ticks: list[str], title: str, path: Path,
                per_row: float, height: float, tick_size: int, legend_size: Any = None) -> str:
    """Bars of tiletune's and the fastest torch route's TFLOP/s per row, the ratio above each pair."""
    fig, ax = plt.subplots(figsize=(max(8, per_row * len(rows) + 2), height))
    xs = range(len(rows))
    w = 0.4
    ax.bar([x - w / 2 for x in xs], [r["tiletune_tflops"] or 0 for r in rows], w, label=label)
    ax.bar([x + w / 2 for x in xs], [r["torch_tflops"] or 0 for r in rows], w,
           label="fastest torch route (named under each row)")
    for x, r in zip(xs, rows):
        if r["ratio"]:
            top = max(r["tiletune_tflops"] or 0, r["torch_tflops"] or 0)
            ax.text(x, top, f"{r['ratio']:.2f}x", ha="center", va="bottom", fontsize=7)
        elif r.get("error"):
            ax.text(x, 0, "error", ha="center", va="bottom", fontsize=7, color="red")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(ticks, rotation=60, ha="right", fontsize=tick_size)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    small_png(path)
    return str(path)


def plot(rows: list[dict[str, Any]], out: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        print(f"no plots (matplotlib unavailable: {exc})", file=sys.stderr)
        return []
    written: list[str] = []
    gemm = [r for r in rows if r["op"] == "gemm"]
    if gemm:
        written.append(_ratio_bars(
            plt, gemm, label="tiletune gemm",
            ticks=[f"{r['shape']}\n{r['dtype'].replace('bfloat', 'bf').replace('float', 'fp')}"
                   f" {r.get('torch_best_route') or '-'}" for r in gemm],
            title="GEMM ([batch x] M x N x K), cold L2: tiletune.kernels.matmul vs torch",
            path=out / "kernels_compute_gemm.png", per_row=0.7, height=5, tick_size=7))
    attn = [r for r in rows if r["op"] == "attention"]
    if attn:
        written.append(_ratio_bars(
            plt, attn, label="tiletune attention",
            ticks=[f"{r['shape']}\n{(r.get('torch_best_route') or '-').replace('SDPA ', '')}" for r in attn],
            title=f"Attention forward (B*S={ATTN_TOKENS}, bf16), cold L2: tiletune vs the fastest SDPA route",
            path=out / "kernels_compute_attention.png", per_row=0.6, height=5.5, tick_size=6, legend_size=8))
    return written


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def _apply_tuning_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Optional: a strategy / budget for the library ops (default: the ops' own settings)."""
    from tiletune import Budget

    splitk: dict[str, Any] = {}
    if args.splitk_evals is not None:  # before the split-K op's first use: its regimes' tuned ops take it
        gemm_mod = importlib.import_module("tiletune.kernels.gemm")
        gemm_mod.GEMM_SPLITK.budget = Budget(max_evals=args.splitk_evals or None)
        splitk = {"splitk_evals": args.splitk_evals or "whole space"}
    if not (args.strategy or args.max_evals or args.tune_seconds):
        return splitk

    attn_mod = importlib.import_module("tiletune.kernels.attention_op")

    budget = Budget(max_evals=args.max_evals, max_seconds=args.tune_seconds) \
        if (args.max_evals or args.tune_seconds) else None
    for op in _plain_gemm_ops() + _tuned_ops(attn_mod):  # (split-K keeps its own budget)
        if args.strategy:
            op.strategy = args.strategy
        if budget is not None:
            op.budget = budget
    return {"strategy": args.strategy, "max_evals": args.max_evals, "tune_seconds": args.tune_seconds, **splitk}


def print_summary(summary: dict[str, Any]) -> None:
    """The issue's targets against the summary, one line each."""
    print("== summary vs issue 6 targets (H200)")
    for k, t in TARGETS.items():
        v = summary[k]
        verdict = "n/a" if v is None else ("MET" if summary[f"{k}_met"] else "MISSED")
        if v is not None and v >= t and not summary[f"{k}_met"]:
            verdict = "INCOMPLETE (sweep not fully measured)"
        extra = ""
        if k == "gemm_geomean":
            extra = f" over {summary['gemm_measured']}/{summary['gemm_planned']} bf16 shapes"
        elif k == "attention_geomean":
            extra = f" over {summary['attention_measured']}/{summary['attention_planned']} problems"
        print(f"  {k:<18} {_fmt(v, 3):>6}  target >= {t}  {verdict}{extra}")
    if summary.get("timer_check_rows"):
        print(f"  timer vs triton do_bench: max disagreement {_fmt(summary['timer_check_max_disagreement'], 4)} over "
              f"{summary['timer_check_rows']} rows ({'within' if summary['timer_check_ok'] else 'OUTSIDE'} "
              f"{TIMER_CHECK_TOLERANCE:.0%})")
    if summary["errors"]:
        print(f"  {summary['errors']} row(s) with a tiletune error (see 'error' in the JSON)")


def combine(paths: list[str], out: Path) -> int:
    """Merge result files of single-op runs (GEMM rows first) into one, recomputing the summary. A row
    measured in several files (same op, shape and dtype: a re-run of one row, ``--shapes``) is taken from
    the latest file (by ``date``), in the place of its first appearance; ``replaced`` lists those rows."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    order = sorted(range(len(docs)), key=lambda i: str(docs[i].get("date", "")))
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    replaced = []
    for i in order:
        for r in docs[i]["rows"]:
            key = (r["op"], r["shape"], r["dtype"])
            if key in latest:
                replaced.append({"op": key[0], "shape": key[1], "dtype": key[2], "from": Path(paths[i]).name,
                                 "date": docs[i].get("date")})
            latest[key] = r
    rows, seen = [], set()
    for op in ("gemm", "attention"):
        for d in docs:
            for r in d["rows"]:
                key = (r["op"], r["shape"], r["dtype"])
                if r["op"] == op and key not in seen:
                    seen.add(key)
                    rows.append(latest[key])
    planned = {op: sum(1 for r in rows if r["op"] == op and r.get("sweep")) for op in ("gemm", "attention")}
    summary = summarize(rows, planned)
    out.mkdir(parents=True, exist_ok=True)
    pngs = plot(rows, out)
    keep = ("benchmark", "date", "torch", "gpu", "arch", "sm_count", "driver", "versions", "cpus", "problem",
            "quick", "b_transposed", "samples_each", "backlog_us", "tuning_overrides", "reference_matmul_tf32")
    doc = {k: docs[0][k] for k in keep if k in docs[0]}
    sources: list[dict[str, Any]] = []
    for p, d in zip(paths, docs):  # a combined file brings its own sources
        sources += d.get("combined_from") or [{"file": Path(p).name, "only": d.get("only"), "date": d.get("date"),
                                               "wall_s": d.get("wall_s"), "stopped": d.get("stopped")}]
    doc["combined_from"] = sources
    if replaced:
        doc["replaced"] = replaced
    doc.update({**summary, "targets": TARGETS, "pngs": [Path(x).name for x in pngs], "rows": rows})
    path = out / "kernels_compute.json"
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"wrote {path}" + "".join(f", {x}" for x in pngs))
    print()
    print(readme_table(rows))
    print()
    print_summary(summary)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=f"result folder (default {DEFAULT_OUT})")
    ap.add_argument("--only", choices=["gemm", "attention"], default=None)
    ap.add_argument("--quick", action="store_true",
                    help="fewer shapes: the 9 Llama-3-8B GEMM rows at M 16, 128, 1024; 4 attention problems")
    ap.add_argument("--b-transposed", action="store_true", help="GEMM B as the .t() view of an N x K weight")
    ap.add_argument("--compile-routes", action="store_true",
                    help="GEMM: also time torch.compile(max-autotune-no-cudagraphs) of the matmul (its "
                         "autotuning adds ~10-60 s per shape)")
    ap.add_argument("--route-limit-s", type=float, default=300.0,
                    help="time limit of a torch route's first call (a compile); past it the route is an error")
    ap.add_argument("--timer-check", type=int, default=TIMER_CHECK_ROWS, metavar="N",
                    help=f"cross-check the first N rows' timings with triton.testing.do_bench "
                         f"(default {TIMER_CHECK_ROWS}, 0: off)")
    ap.add_argument("--rounds", type=int, default=8, help="A/B rounds (default 8)")
    ap.add_argument("--per-round", type=int, default=4, help="samples per op per round (default 4)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--backlog-us", type=float, default=100.0,
                    help="GPU spin before each timed call so host overhead stays out of the events (0: off)")
    ap.add_argument("--shapes", default=None, metavar="TEXT[,TEXT]",
                    help="only the rows whose shape label contains one of these (e.g. 'D64' or '4096x4096x4096')")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds after which no new problem is started (rows left are marked skipped)")
    ap.add_argument("--merge", nargs="?", const="", default=None, metavar="JSON",
                    help="keep the other op's rows from an earlier kernels_compute.json (default: the one in "
                         "--out), e.g. after '--only gemm', run '--only attention --merge'")
    ap.add_argument("--fp32-reference", action="store_true",
                    help="keep torch's fp32 matmuls exact (no tf32) in the ops' tuning references (slow)")
    ap.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                    help="no GPU: merge the rows of result files from '--only gemm' and '--only attention' runs "
                         "(e.g. made on two GPUs at once) into <out>/kernels_compute.json, with PNGs and table")
    ap.add_argument("--strategy", default=None, choices=["exhaustive", "random", "evolutionary", "model"],
                    help="override the ops' tuning strategy")
    ap.add_argument("--max-evals", type=int, default=None, help="override: configs evaluated per tuning")
    ap.add_argument("--tune-seconds", type=float, default=None, help="override: seconds per tuning session")
    ap.add_argument("--splitk-evals", type=int, default=None, metavar="N",
                    help="override the split-K op's search budget: N configs per key (0: its whole regime space)")
    ap.add_argument("--splitk", action="store_true",
                    help="route small-M 16-bit GEMMs to the split-K op (tiletune.kernels.gemm.ROUTE_SMALL_M_TO_SPLITK)")
    args = ap.parse_args()
    if args.splitk:
        import tiletune.kernels.gemm as _gemm

        _gemm.ROUTE_SMALL_M_TO_SPLITK = True
    if args.combine:
        return combine(args.combine, Path(args.out or DEFAULT_OUT))
    if args.rounds * args.per_round < 20:
        ap.error("--rounds x --per-round must be at least 20 samples")

    import torch

    if not torch.cuda.is_available():
        print("kernels_compute: needs a CUDA GPU", file=sys.stderr)
        return 2
    from tiletune.devices.measure import ColdL2Timer

    out = Path(args.out or os.environ.get("BENCH_OUT") or DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    overrides = _apply_tuning_overrides(args)
    args._timer_checks_left = max(0, args.timer_check)
    if not args.fp32_reference:
        # The ops' correctness references are fp32 torch matmuls (a.float() @ b.float(); fp32 attention
        # scores). bf16/fp16 values are exact in tf32, so for the 16-bit GEMMs a tf32 reference is as
        # exact (fp32 accumulation) and ~8x faster; for attention it moves the scores by ~1e-3, far
        # inside the bf16 gate. It only touches the tuners' reference computations, not the timed
        # calls (torch.matmul on bf16/fp16 and SDPA flash ignore it).
        torch.backends.cuda.matmul.allow_tf32 = True

    problems: list[dict[str, Any]] = []
    if args.only in (None, "gemm"):
        problems += gemm_problems(args.quick)
    if args.only in (None, "attention"):
        problems += attention_problems(args.quick)
    if args.shapes:  # rows whose shape label contains one of the given substrings
        wanted = [w.strip() for w in args.shapes.split(",") if w.strip()]
        problems = [p for p in problems if any(w in shape_label(p) for w in wanted)]
        if not problems:
            ap.error(f"--shapes {args.shapes!r} matches no row")
    planned = {op: sum(1 for p in problems if p["op"] == op and p["sweep"]) for op in ("gemm", "attention")}

    def on_term(signum: int, frame: Any) -> None:
        raise _Stop(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    timer = ColdL2Timer(torch.cuda.current_device(), backlog_us=args.backlog_us)
    rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    stopped: str | None = None
    partial = out / "kernels_compute.partial.json"
    for i, p in enumerate(problems):
        elapsed = time.perf_counter() - t_start
        if stopped is None and args.deadline is not None and elapsed > args.deadline:
            stopped = f"deadline {args.deadline:.0f} s reached after {elapsed:.0f} s"
        if stopped is not None:
            rows.append({**blank_row(p), "skipped": stopped})
            continue
        print(f"[{elapsed:6.1f} s] {i + 1}/{len(problems)} {p['op']} {shape_label(p)} {p['dtype']} ...", flush=True)
        try:
            row = measure(p, args, timer)
        except (_Stop, KeyboardInterrupt) as exc:
            stopped = f"interrupted ({exc or type(exc).__name__}) at {time.perf_counter() - t_start:.0f} s"
            rows.append({**blank_row(p), "skipped": stopped})
            continue
        except Exception as exc:  # set-up failures (e.g. out of memory allocating inputs)
            row = {**blank_row(p), "error": f"{type(exc).__name__}: {exc}"[:4000],
                   "traceback": traceback.format_exc()[-4000:]}
        rows.append(row)
        torch.cuda.empty_cache()
        print(f"    tiletune {_fmt(row['tiletune_tflops'])} TFLOP/s ({_fmt(row['tiletune_us'])} us), "
              f"torch {_fmt(row['torch_tflops'])} TFLOP/s ({_fmt(row['torch_us'])} us), "
              f"ratio {_fmt(row['ratio'], 3)} vs {row.get('torch_best_route')}, tune {_fmt(row.get('tune_s'), 1)} s"
              + (f", winner {json.dumps(row['winner'])}" if row.get("winner") else "")
              + (f"\n    ERROR {row['error'].splitlines()[0]}" if row.get("error") else ""), flush=True)
        partial.write_text(json.dumps({"rows": rows}, indent=1, default=str) + "\n")

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    merged_from = None
    if args.merge is not None and args.only is not None:
        src = Path(args.merge) if args.merge else out / "kernels_compute.json"
        try:
            old_doc = json.loads(src.read_text())
            kept = [r for r in old_doc.get("rows", []) if r.get("op") != args.only]
            rows = kept + rows if args.only == "attention" else rows + kept
            for op in ("gemm", "attention"):
                if op != args.only:
                    planned[op] = old_doc.get(f"{op}_planned", sum(1 for r in kept if r["op"] == op and r["sweep"]))
            merged_from = {"file": str(src), "date": old_doc.get("date"), "rows_kept": len(kept)}
        except Exception as exc:
            print(f"--merge: could not read {src}: {exc}", file=sys.stderr)
    summary = summarize(rows, planned)
    pngs = plot(rows, out)
    path = write_result("kernels_compute", {
        "problem": ("GEMM: bf16 M in 16..16384 x Llama-3-8B (N, K) + fp16 4096^3 vs torch.matmul; attention "
                    f"forward: B*S={ATTN_TOKENS}, H={ATTN_H}, Hkv {ATTN_HKVS}, D {ATTN_DS}, bf16, causal and not, "
                    "vs the fastest SDPA route (default, flash, cudnn, efficient; GQA: enable_gqa and expanded "
                    "k/v). Public calls, CUDA events, cold L2, medians of interleaved A/B rounds; "
                    "the tuning call is excluded."),
        "quick": args.quick,
        "only": args.only,
        "compile_routes": args.compile_routes,
        "route_limit_s": args.route_limit_s,
        "ratio_definition": "torch_best_us / tiletune_us (torch_best_route: the fastest of torch_routes, "
                            "then timed A/B against tiletune)",
        "b_transposed": args.b_transposed,
        "samples_each": args.rounds * args.per_round,
        "backlog_us": args.backlog_us,
        "backlog_cycles": timer.backlog_cycles,
        "tuning_overrides": overrides,
        "reference_matmul_tf32": not args.fp32_reference,
        "merged_from": merged_from,
        "wall_s": round(time.perf_counter() - t_start, 1),
        "stopped": stopped,
        **{k: summary[k] for k in summary},
        "targets": TARGETS,
        "pngs": [Path(x).name for x in pngs],
        "rows": rows,
    }, out)
    partial.unlink(missing_ok=True)
    print(f"wrote {path}" + "".join(f", {x}" for x in pngs))
    print()
    print(readme_table(rows))
    print()
    print_summary(summary)
    if stopped:
        print(f"  stopped early: {stopped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
