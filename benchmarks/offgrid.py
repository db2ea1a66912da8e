#!/usr/bin/env python
"""Library ops on shapes drawn at random from real model dimensions, against the best torch route (issue 42).

Shapes come from a fixed-seed draw (``--seed``), never from a hand-picked list: per family, a model
among Llama-3-8B (4096 / 14336 / 32 / 8 / 128, vocab 128256), Mistral-7B (same, vocab 32768),
Qwen2.5-7B (3584 / 18944 / 28 / 4 / 128, vocab 152064), Gemma-2-9B (3584 / 14336 / 16 / 8 / 256, vocab
256000) and Phi-3-mini (3072 / 8192 / 32 / 32 / 96, vocab 32064) (hidden / MLP / heads / kv heads / head
dim), token counts log-uniform in 1-16384 and sequence lengths log-uniform in 128-32768. A draw too large
for comfort (elements or FLOPs over the caps) or that the op does not support (attention heads other than
64 or 128) is recorded in ``skipped`` and drawn again. Families (all bf16):

* ``gemm_linear``: ``K.matmul(a, w.t())`` with ``w`` an ``nn.Linear`` weight ``[N, K]`` of one of the model's
  projections (fused qkv, q, k/v, o, fused gate-up, gate, down, lm head) vs ``F.linear`` and ``torch.matmul``;
* ``attention_gqa``: ``K.attention`` (causal or not, drawn) over ``(B, H, S, D)`` / ``(B, Hkv, S, D)`` vs
  SDPA's default backend with ``enable_gqa=True`` and SDPA after ``repeat_interleave`` of k/v (Hugging Face's
  ``repeat_kv``, inside the timed call);
* ``swiglu``, ``rms_norm``, ``softmax`` (over the vocabulary): vs the eager torch expression and
  ``torch.compile`` of it (``F.rms_norm`` too).

Per row: ``served_ms`` = the op as served on its first call with an EMPTY database and the shipped
tables on (whatever the miss path answers: ``served_source`` says which: table, bucket, tuned, ...);
``tiletune_ms`` = after tuning the exact shape (another empty database, tables off; when the served
call itself tuned, that tuning is the exact one and is not repeated: ``tuned_from: "served"``);
``best_torch_ms`` / ``best_torch_route`` over the routes (``torch_ms``); ``ratio`` = best_torch_ms /
tiletune_ms (> 1: tiletune faster). Every time is ``triton.testing.do_bench``'s median (L2 flushed); the
first three rows also carry ``timer_check``: the tiletune call timed with CUDA events (per call with the
same L2 flush, and back to back) next to do_bench.

Rows are measured round-robin over the families (row i of every family, then row i + 1), so a run cut
by ``--budget-s`` (no new row is started once it is spent) still covers every family alike; the JSON is
written after every row.

    python benchmarks/offgrid.py [--out DIR] [--quick] [--seed 0] [--per-family 30]
        [--families gemm_linear,attention_gqa,swiglu,rms_norm,softmax] [--budget-s 480] [--start-round 0]

``--quick``: 4 rows per family. Writes ``offgrid.json``: ``seed``, ``rows``, ``summary`` (per family:
geomean, min and n of ``ratio``, and the geomean of served_ms / tiletune_ms), ``skipped``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

NAME = "offgrid"
FAMILIES = ("gemm_linear", "attention_gqa", "swiglu", "rms_norm", "softmax")
#: hidden, MLP width, query heads, key-value heads, head dim, vocabulary
MODEL_DIMS: dict[str, dict[str, int]] = {
    "llama3-8b": dict(hidden=4096, ffn=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256),
    "mistral-7b": dict(hidden=4096, ffn=14336, heads=32, kv_heads=8, head_dim=128, vocab=32768),
    "qwen2.5-7b": dict(hidden=3584, ffn=18944, heads=28, kv_heads=4, head_dim=128, vocab=152064),
    "gemma2-9b": dict(hidden=3584, ffn=14336, heads=16, kv_heads=8, head_dim=256, vocab=256000),
    "phi3-mini": dict(hidden=3072, ffn=8192, heads=32, kv_heads=32, head_dim=96, vocab=32064),
}
TOKENS = (1, 16384)
SEQ = (128, 32768)
#: heads K.attention supports
ATTENTION_HEAD_DIMS = (64, 128)
#: largest draw: elements of all operands and outputs together (bf16: 4 GiB), and FLOPs of one call
ELEMENT_CAP = 2 ** 31
FLOP_CAP = 2.5e13
PROJECTIONS = ("qkv", "q", "kv", "o", "gate_up", "gate", "down", "lm_head")
EPS = 1e-6
QUICK_PER_FAMILY = 4
TIMER_CHECK_ROWS = 3
#: seconds a torch route's first call (a torch.compile) may take
ROUTE_LIMIT_S = 180.0


# --------------------------------------------------------------------------------------------
# shapes (pure)
# --------------------------------------------------------------------------------------------


def log_uniform(r: random.Random, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(round(math.exp(r.uniform(math.log(lo), math.log(hi)))))))


def projection(m: dict[str, int], proj: str) -> tuple[int, int]:
    """``(N, K)`` of a model's projection (the ``nn.Linear`` weight is ``[N, K]``)."""
    h, q, kv = m["hidden"], m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"]
    return {"qkv": (q + 2 * kv, h), "q": (q, h), "kv": (kv, h), "o": (h, q), "gate_up": (2 * m["ffn"], h),
            "gate": (m["ffn"], h), "down": (h, m["ffn"]), "lm_head": (m["vocab"], h)}[proj]


def size_of(shape: dict[str, Any]) -> tuple[int, float]:
    """``(elements of operands and outputs, FLOPs)`` of one call (pure)."""
    f = shape["family"]
    if f == "gemm_linear":
        m, n, k = shape["M"], shape["N"], shape["K"]
        return m * k + n * k + m * n, 2.0 * m * n * k
    if f == "attention_gqa":
        b, h, hkv, s, d = shape["B"], shape["H"], shape["Hkv"], shape["S"], shape["D"]
        flops = 4.0 * b * h * s * s * d * (0.5 if shape["causal"] else 1.0)
        return 2 * b * h * s * d + 2 * b * hkv * s * d, flops
    if f == "swiglu":
        return 3 * shape["T"] * shape["H"], 4.0 * shape["T"] * shape["H"]
    if f == "rms_norm":
        return 2 * shape["T"] * shape["N"], 4.0 * shape["T"] * shape["N"]
    if f == "softmax":
        return 2 * shape["T"] * shape["N"], 5.0 * shape["T"] * shape["N"]
    raise ValueError(f"unknown family {f!r}")


def _draw_one(family: str, r: random.Random) -> dict[str, Any]:
    model = r.choice(sorted(MODEL_DIMS))
    m = MODEL_DIMS[model]
    if family == "gemm_linear":
        proj = r.choice(PROJECTIONS)
        n, k = projection(m, proj)
        return {"family": family, "model": model, "proj": proj, "M": log_uniform(r, *TOKENS), "N": n, "K": k}
    if family == "attention_gqa":
        s = log_uniform(r, *SEQ)
        return {"family": family, "model": model, "B": r.randint(1, max(1, min(8, 16384 // s))), "H": m["heads"],
                "Hkv": m["kv_heads"], "S": s, "D": m["head_dim"], "causal": r.random() < 0.5}
    t = log_uniform(r, *TOKENS)
    if family == "swiglu":
        return {"family": family, "model": model, "T": t, "H": m["ffn"]}
    if family == "rms_norm":
        return {"family": family, "model": model, "T": t, "N": m["hidden"]}
    if family == "softmax":
        return {"family": family, "model": model, "T": t, "N": m["vocab"]}
    raise ValueError(f"unknown family {family!r}")


def why_not(shape: dict[str, Any]) -> str | None:
    """Why a drawn shape is not measured (None: it is)."""
    if shape["family"] == "attention_gqa" and shape["D"] not in ATTENTION_HEAD_DIMS:
        return f"head dim {shape['D']} (K.attention supports {ATTENTION_HEAD_DIMS})"
    elems, flops = size_of(shape)
    if elems > ELEMENT_CAP:
        return f"{elems} elements > cap {ELEMENT_CAP}"
    if flops > FLOP_CAP:
        return f"{flops:.3g} FLOPs > cap {FLOP_CAP:.3g}"
    return None


def draw_family(family: str, n: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``n`` measurable shapes of ``family`` and the draws set aside on the way (``{"shape", "reason"}``),
    from the stream ``(seed, family)``: the same on every machine; the first ``k`` of ``n`` are a run of
    ``k``'s shapes."""
    r = random.Random(f"tiletune-offgrid:{seed}:{family}")
    shapes: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    tries = 0
    while len(shapes) < n:
        tries += 1
        if tries > 100 * n + 100:
            raise RuntimeError(f"{family}: could not draw {n} measurable shapes")
        s = _draw_one(family, r)
        reason = why_not(s)
        if reason:
            skipped.append({"shape": s, "reason": reason})
        else:
            shapes.append(s)
    return shapes, skipped


def plan(families: list[str], n: int, seed: int,
         start_round: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every row's shape, round-robin over the families (row i of each, then i + 1), from round
    ``start_round`` on; and the draws set aside (pure)."""
    drawn = {f: draw_family(f, n, seed) for f in families}
    rows = [drawn[f][0][i] for i in range(start_round, n) for f in families]
    skipped = [s for f in families for s in drawn[f][1]]
    return rows, skipped


def shape_label(s: dict[str, Any]) -> str:
    keys = [k for k in s if k not in ("family", "model")]
    return f"{s['family']} {s['model']} " + " ".join(f"{k}={s[k]}" for k in keys)


# --------------------------------------------------------------------------------------------
# results (pure)
# --------------------------------------------------------------------------------------------


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(rows: list[dict[str, Any]], families: list[str]) -> dict[str, Any]:
    out = {}
    for f in families:
        ratios = [r["ratio"] for r in rows if r.get("family") == f and r.get("ratio")]
        svt = [r["served_ms"] / r["tiletune_ms"] for r in rows if r.get("family") == f
               and r.get("served_ms") and r.get("tiletune_ms")]
        out[f] = {"geomean": geomean(ratios), "min": min(ratios, default=None), "n": len(ratios),
                  "served_vs_tuned_geomean": geomean(svt),
                  "wins": sum(1 for x in ratios if x >= 1.0),
                  "errors": sum(1 for r in rows if r.get("family") == f and "error" in r)}
    return out


def served_source(sources: dict[str, int], sessions: int) -> str:
    """Where the served call's configs came from: ``tuned`` when it started a tuning session, else the
    log's source (table, bucket, database, nearest, default: no neighbour, the space's default config), else
    ``other``."""
    if sessions:
        return "tuned"
    for what in ("nearest", "table", "bucket", "database", "refined", "default"):
        if sources.get(what):
            return what
    return "other"


def best(torch_ms: dict[str, float]) -> tuple[str | None, float | None]:
    timed = {k: v for k, v in torch_ms.items() if v}
    if not timed:
        return None, None
    k = min(timed, key=lambda name: (timed[name], list(timed).index(name)))
    return k, timed[k]


# --------------------------------------------------------------------------------------------
# the calls (GPU)
# --------------------------------------------------------------------------------------------


def make_calls(shape: dict[str, Any], dev: str = "cuda") -> tuple[Callable[[], Any], dict[str, Callable[[], Any]]]:
    """``(tiletune call, {torch route: call})`` of one shape, inputs made (bf16, seeded)."""
    import torch
    import torch.nn.functional as F

    import tiletune.kernels as K

    g = torch.Generator(device=dev).manual_seed(0)
    bf = torch.bfloat16

    def randn(*size: int, scale: float = 1.0) -> Any:
        return (torch.randn(*size, device=dev, generator=g) * scale).to(bf)

    f = shape["family"]
    if f == "gemm_linear":
        a, w = randn(shape["M"], shape["K"]), randn(shape["N"], shape["K"], scale=shape["K"] ** -0.5)
        return (lambda: K.matmul(a, w.t())), {"F.linear": lambda: F.linear(a, w),
                                              "torch.matmul": lambda: torch.matmul(a, w.t())}
    if f == "attention_gqa":
        b, h, hkv, s, d, causal = (shape[k] for k in ("B", "H", "Hkv", "S", "D", "causal"))
        q, k, v = randn(b, h, s, d), randn(b, hkv, s, d), randn(b, hkv, s, d)
        rep = h // hkv
        return (lambda: K.attention(q, k, v, causal=causal)), {
            "sdpa_gqa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True),
            "sdpa_repeat_kv": lambda: F.scaled_dot_product_attention(
                q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), is_causal=causal)}
    if f == "swiglu":
        x, hh = randn(shape["T"], 2 * shape["H"]), shape["H"]

        def expr(z: Any) -> Any:
            return F.silu(z[..., :hh]) * z[..., hh:]

        comp = torch.compile(expr, dynamic=False)
        return (lambda: K.swiglu(x)), {"eager": lambda: expr(x), "torch.compile": lambda: comp(x)}
    if f == "rms_norm":
        x, wt = randn(shape["T"], shape["N"]), (1.0 + 0.1 * torch.randn(shape["N"], device=dev, generator=g)).to(bf)

        def expr(z: Any, weight: Any) -> Any:  # Hugging Face's LlamaRMSNorm
            zf = z.float()
            return weight * (zf * torch.rsqrt(zf.pow(2).mean(-1, keepdim=True) + EPS)).to(z.dtype)

        comp = torch.compile(expr, dynamic=False)
        return (lambda: K.rms_norm(x, wt, EPS)), {"eager": lambda: expr(x, wt),
                                                  "F.rms_norm": lambda: F.rms_norm(x, (shape["N"],), wt, EPS),
                                                  "torch.compile": lambda: comp(x, wt)}
    if f == "softmax":
        x = randn(shape["T"], shape["N"], scale=4.0)

        def expr(z: Any) -> Any:
            return torch.softmax(z, dim=-1)

        comp = torch.compile(expr, dynamic=False)
        return (lambda: K.softmax(x, -1)), {"eager": lambda: expr(x), "torch.compile": lambda: comp(x)}
    raise ValueError(f"unknown family {f!r}")


def events_ms(fn: Callable[[], Any], n: int = 50) -> dict[str, float]:
    """``fn`` timed with CUDA events: per call after zeroing a 256 MB buffer (do_bench's L2 flush;
    median) and ``n`` calls back to back (mean, L2 warm)."""
    import statistics

    import torch

    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in pairs:
        flush.zero_()
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    per_call = statistics.median(a.elapsed_time(b) for a, b in pairs)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    del flush
    return {"events_flushed_ms": per_call, "events_loop_ms": a.elapsed_time(b) / n}


def measure(shape: dict[str, Any], tmp: Path, index: int, log: Any, timer_check: bool) -> dict[str, Any]:
    import torch
    import torch._dynamo

    import _layer as L
    from _routes import first_calls

    row: dict[str, Any] = {"family": shape["family"], "shape": dict(shape)}
    torch._dynamo.reset()  # a compiled route per row: never the recompile limit, never a dynamic kernel
    tt_call, routes = make_calls(shape)

    # served: an empty database, the shipped tables on
    L.use_fresh_database(str(tmp / f"served-{index}.db"), tables=True)
    log.reset()
    os.environ["TILETUNE_FALLBACK"] = "1"  # the first call as a user's: no wait for a compile
    t0 = time.perf_counter()
    out = tt_call()
    torch.cuda.synchronize()
    row["served_first_call_s"] = round(time.perf_counter() - t0, 3)
    row["served_fell_back"] = bool(log.snapshot()["sources"].get("fallback"))
    row["served_compile_wait_s"] = L.settle_compiles(tt_call)  # the fallback's configs compiled: served from now on
    os.environ["TILETUNE_FALLBACK"] = "0"
    sessions = L.tuning_sessions()
    row["served_source"] = served_source(log.snapshot()["sources"], sessions)
    row["served_log"] = log.snapshot()["sources"]
    row["served_ms"] = L.bench_ms(tt_call)

    # tuned: the exact shape (unless the served call just did that)
    if sessions:
        row["tiletune_ms"], row["tuned_from"], row["tune_s"] = row["served_ms"], "served", row["served_first_call_s"]
    else:
        L.use_fresh_database(str(tmp / f"tuned-{index}.db"), tables=False, on_miss="tune")
        t0 = time.perf_counter()
        out = tt_call()
        torch.cuda.synchronize()
        row["tune_s"] = round(time.perf_counter() - t0, 3)
        row["tuned_from"] = "exact" if L.tuning_sessions() else "no tuning session (one config?)"
        row["tiletune_ms"] = L.bench_ms(tt_call)
    row["tuning_sessions"] = L.tuning_sessions()

    # torch routes: first calls (compiles) under a time limit, then do_bench each
    ok = first_calls(row, routes, ROUTE_LIMIT_S)
    if ok:
        first = next(iter(ok.values()))()
        torch.cuda.synchronize()
        row["rel_err_vs_torch"] = L.rel_err(out, first)
        del first
    torch_ms = {}
    for name, fn in ok.items():
        try:
            torch_ms[name] = L.bench_ms(fn)
        except Exception as exc:  # noqa: BLE001 - a route that fails is an error of that route
            row.setdefault("torch_route_errors", {})[name] = f"{type(exc).__name__}: {exc}"[:500]
    row["torch_ms"] = torch_ms
    row["best_torch_route"], row["best_torch_ms"] = best(torch_ms)
    row["ratio"] = (row["best_torch_ms"] / row["tiletune_ms"]) if row["best_torch_ms"] and row["tiletune_ms"] else None
    if timer_check:
        ev = events_ms(tt_call)
        row["timer_check"] = {"do_bench_ms": row["tiletune_ms"], **ev,
                              "disagreement": abs(ev["events_flushed_ms"] / row["tiletune_ms"] - 1.0)}
    del out, tt_call, routes, ok
    gc.collect()
    torch.cuda.empty_cache()
    return row


ROW_KEYS = ("family", "shape", "tiletune_ms", "served_ms", "best_torch_ms", "best_torch_route", "ratio")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="output folder (default $OUT)")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_PER_FAMILY} rows per family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-family", type=int, default=None, help="rows per family (default 30; --quick 4)")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="start no new row after this many seconds (default 480; 0: no limit)")
    ap.add_argument("--start-round", type=int, default=0,
                    help="skip the first N rows of every family (continue an earlier run cut by its budget)")
    args = ap.parse_args(argv)
    if args.per_family is None:
        args.per_family = QUICK_PER_FAMILY if args.quick else 30
    args.families = [f for f in args.families.split(",") if f]
    bad = [f for f in args.families if f not in FAMILIES]
    if bad or not args.families:
        ap.error(f"--families: unknown {bad}; choose from {', '.join(FAMILIES)}")
    if args.per_family < 1 or not 0 <= args.start_round < args.per_family:
        ap.error("--per-family must be >= 1 and 0 <= --start-round < --per-family")
    return args


def document(args: argparse.Namespace, rows: list[dict[str, Any]], skipped: list[dict[str, Any]],
             not_reached: int, wall_s: float, complete: bool) -> dict[str, Any]:
    return {"seed": args.seed, "quick": args.quick, "complete": complete, "wall_s": round(wall_s, 1),
            "per_family": args.per_family, "start_round": args.start_round, "families": args.families,
            "models": MODEL_DIMS, "caps": {"elements": ELEMENT_CAP, "flops": FLOP_CAP},
            "timer": "triton.testing.do_bench median (L2 flushed)", "dtype": "bfloat16",
            "rows_not_reached_in_budget": not_reached,
            "summary": summarize(rows, args.families), "rows": rows, "skipped": skipped}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tiletune-offgrid-"))
    os.environ["TILETUNE_DB"] = str(tmp / "first.db")
    os.environ.setdefault("CUDA_TILE_CACHE_DIR", str(tmp / "cutile-cache"))
    import torch._dynamo

    import _layer as L
    from _common import failure_fields, write_result

    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, int(getattr(torch._dynamo.config, name))))
    log = L.SourceLog().install()
    shapes, skipped = plan(args.families, args.per_family, args.seed, args.start_round)
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for i, shape in enumerate(shapes):
        spent = time.perf_counter() - t0
        if args.budget_s and spent > args.budget_s:
            write_result(NAME, document(args, rows, skipped, len(shapes) - i, spent, False), args.out, commit=True)
            print(f"budget of {args.budget_s:g} s spent: {len(shapes) - i} rows not measured", flush=True)
            return 0
        print(f"[{spent:6.1f} s] {shape_label(shape)}", flush=True)
        try:
            r = measure(shape, tmp, i, log, timer_check=i < TIMER_CHECK_ROWS)
        except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
            r = {"family": shape["family"], "shape": shape, **failure_fields(exc)}
            try:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
            except Exception as sync_exc:  # noqa: BLE001 - a sticky CUDA error: the rest would fail too
                r["sync_error"] = f"{type(sync_exc).__name__}: {sync_exc}"[:500]
                rows.append(r)
                break
        rows.append(r)
        print("    " + json.dumps({k: r.get(k) for k in ROW_KEYS[2:]} | {"served_source": r.get("served_source"),
                                                                        "tune_s": r.get("tune_s")}), flush=True)
        write_result(NAME, document(args, rows, skipped, len(shapes) - i - 1, time.perf_counter() - t0, False),
                     args.out, commit=True)
    write_result(NAME, document(args, rows, skipped, len(shapes) - len(rows), time.perf_counter() - t0, True),
                 args.out, commit=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
