#!/usr/bin/env python
"""Probe why the short-row kernels (rows of <= 2048 elements, ``TM`` rows per tile) stay below
``torch.compile``: experimental kernel variants, tuned through tiletune's harness on the GPU.

The library's row kernels (:mod:`tiletune.kernels.norms`, :mod:`tiletune.kernels.softmax_op`) load
each tile by TMA and walk their row blocks one at a time: load, reduce, store, next load. Inductor's
kernels for the same ops read rows with plain vectorized loads from many small blocks. This probe
tunes, for LayerNorm, softmax and RMSNorm at 65536 x 1024 bf16, one space over

* ``LOAD_TMA``: the tile loads allowed to use TMA (the library's loads) or plain loads only;
* ``PF``: software prefetch: each block loads its *next* row block before it reduces and stores
  the current one (one more tile of registers per block);
* ``TM`` 1-16 rows per tile x ``occupancy`` 1-16 (8192-65536 values in flight per SM, the library
  space stops at occupancy 4), ``STORE_TMA``;
* ``PERSIST``: the persistent grid (``num_SMs * occupancy`` blocks) or one block per row block (the
  loop runs once; ``occupancy`` is then only the register bound);
* ``LIB``: the library's own launch plan on the same ``TM``/``occupancy``/``STORE_TMA`` (LAT 0),

checked against the library's reference and timed by the tuner (cold L2). It then times the library's
public call, the probe's best config and every ``torch.compile`` route with ``triton.testing.do_bench``
(L2 flushed), interleaved, and writes ``<out>/probe_rows.json.gz``: every config's median, the best per
variant, and the head-to-head times. ``do_bench`` counts host dispatch where it exceeds the GPU time (the
``torch.compile`` routes' guards, in some rounds): ``kernels_memory.py``'s timer is the reference for
torch's routes; the head-to-head compares the library call and the probe's winner.

    python benchmarks/probe_rows.py [--out DIR] [--only layer_norm,softmax] [--rows 65536] [--cols 1024]
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_OUT, failure_fields, do_bench_rounds, measurement_rows, ranked_ok, tune_once, write_result  # noqa: E402

import cuda.tile as ct  # noqa: E402

from tiletune.devices.backends.base import Launch  # noqa: E402
from tiletune.space.spaces import Space  # noqa: E402
from tiletune.space.templates import next_power_of_2  # noqa: E402

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
ZERO = ct.PaddingMode.ZERO
LOG2E = 1.4426950408889634
OPS = ("layer_norm", "softmax", "rms_norm")


def _load(A, rb, TM: ConstInt, TN: ConstInt, LOAD_TMA: ConstBool):
    return ct.load(A, (rb, 0), shape=(TM, TN), padding_mode=ZERO, allow_tma=LOAD_TMA).astype(ct.float32)


def _first(X, TM: ConstInt, TN: ConstInt, LOAD_TMA: ConstBool, PF: ConstBool):
    """The block's first row block (prefetch) or an unused placeholder (no memory traffic)."""
    if PF:
        t = _load(X, ct.bid(0), TM, TN, LOAD_TMA)
    else:
        t = ct.zeros((TM, TN), dtype=ct.float32)
    return t


def _advance(X, x, rb, nb, TM: ConstInt, TN: ConstInt, LOAD_TMA: ConstBool, PF: ConstBool):
    """``(current row block, what becomes current next)``: with the prefetch, ``x`` (loaded one step
    earlier) and the block's next row block (past the end: zero padding, never stored); without it, row
    block ``rb`` loaded now, twice."""
    if PF:
        nxt = _load(X, rb + nb, TM, TN, LOAD_TMA)
        cur = x
    else:
        cur = _load(X, rb, TM, TN, LOAD_TMA)
        nxt = cur
    return cur, nxt


def _vector(V, TN: ConstInt):
    return ct.load(V, (0,), shape=(TN,), padding_mode=ZERO).astype(ct.float32).reshape((1, TN))


def ln_rows_fn(X, W, B, Y, eps, TM: ConstInt, TN: ConstInt, LOAD_TMA: ConstBool, PF: ConstBool,
               STORE_TMA: ConstBool):
    """LayerNorm of short rows, ``TM`` per tile (weight and bias present)."""
    N = X.shape[1]
    inv_n = 1.0 / N
    num_rb = ct.cdiv(X.shape[0], TM)
    nb = ct.num_blocks(0)
    cols = ct.arange(TN, dtype=ct.int32).reshape((1, TN))
    w = _vector(W, TN)
    b = _vector(B, TN)
    x = _first(X, TM, TN, LOAD_TMA, PF)
    for rb in range(ct.bid(0), num_rb, nb):
        x, xn = _advance(X, x, rb, nb, TM, TN, LOAD_TMA, PF)
        mean = ct.sum(x, axis=1, keepdims=True) * inv_n
        d = ct.where(cols < N, x - mean, 0.0)
        rstd = ct.rsqrt(ct.sum(d * d, axis=1, keepdims=True) * inv_n + eps)
        ct.store(Y, (rb, 0), (d * rstd * w + b).astype(Y.dtype), allow_tma=STORE_TMA)
        x = xn


def softmax_rows_fn(X, Y, TM: ConstInt, TN: ConstInt, LOAD_TMA: ConstBool, PF: ConstBool, STORE_TMA: ConstBool):
    """Softmax of short rows whose length is a multiple of ``TN`` (the probe's shapes)."""
    num_rb = ct.cdiv(X.shape[0], TM)
    nb = ct.num_blocks(0)
    x = _first(X, TM, TN, LOAD_TMA, PF)
    for rb in range(ct.bid(0), num_rb, nb):
        x, xn = _advance(X, x, rb, nb, TM, TN, LOAD_TMA, PF)
        m = ct.max(x, axis=1, keepdims=True)
        e = ct.exp2((x - m) * LOG2E, flush_to_zero=True)
        inv = 1.0 / ct.sum(e, axis=1, keepdims=True)
        ct.store(Y, (rb, 0), (e * inv).astype(Y.dtype), allow_tma=STORE_TMA)
        x = xn


def rms_rows_fn(X, W, Y, eps, TM: ConstInt, TN: ConstInt, LOAD_TMA: ConstBool, PF: ConstBool, STORE_TMA: ConstBool):
    """RMSNorm of short rows (weight present)."""
    inv_n = 1.0 / X.shape[1]
    num_rb = ct.cdiv(X.shape[0], TM)
    nb = ct.num_blocks(0)
    w = _vector(W, TN)
    x = _first(X, TM, TN, LOAD_TMA, PF)
    for rb in range(ct.bid(0), num_rb, nb):
        x, xn = _advance(X, x, rb, nb, TM, TN, LOAD_TMA, PF)
        rstd = ct.rsqrt(ct.sum(x * x, axis=1, keepdims=True) * inv_n + eps)
        ct.store(Y, (rb, 0), (x * rstd * w).astype(Y.dtype), allow_tma=STORE_TMA)
        x = xn


KERNELS = {"layer_norm": ct.kernel(ln_rows_fn), "softmax": ct.kernel(softmax_rows_fn),
           "rms_norm": ct.kernel(rms_rows_fn)}


def probe_space(n_cols: int) -> Space:
    """``TM`` x ``occupancy`` pairs holding 8192-65536 values per SM (<= 64 values per thread of 4
    warps), x ``LIB`` x ``LOAD_TMA`` x ``PF`` x ``STORE_TMA`` (the library plan ignores LOAD_TMA and PF:
    only its LOAD_TMA=True, PF=False combination is kept)."""
    p = next_power_of_2(n_cols)

    def ok(c: Any) -> bool:
        per_sm = c.TM * p * c.occupancy
        per_thread = c.TM * p // 128 * (2 if c.PF else 1)
        if c.LIB and (not c.LOAD_TMA or c.PF):
            return False
        if c.PF and (not c.LOAD_TMA or not c.PERSIST):  # plain loads + prefetch lost everywhere (23:46 run)
            return False
        return 8192 <= per_sm <= 65536 and per_thread <= 64

    return Space(TM=[1, 2, 4, 8, 16], occupancy=[1, 2, 4, 8, 16], LIB=[False, True], LOAD_TMA=[True, False],
                 PF=[False, True], PERSIST=[True, False], STORE_TMA=[False, True], constraints={"fit": ok},
                 baseline=dict(TM=4, occupancy=2, LIB=True, LOAD_TMA=True, PF=False, PERSIST=True, STORE_TMA=True))


def make_plan(op: str, lib_plan: Any) -> Any:
    """The probe's launch plan over the library plan's arguments."""
    from tiletune.kernels._membound import persistent_grid

    kernel = KERNELS[op]

    def plan(cfg: Any, *args: Any) -> Launch:
        if cfg.LIB:  # a huge GRID_FRAC: one block per row block (the loop runs once)
            lib = {"TM": cfg.TM, "CHUNK": 0, "occupancy": cfg.occupancy, "LAT": 0, "STORE_TMA": cfg.STORE_TMA,
                   "GRID_FRAC": 1.0 if cfg.PERSIST else 1e9}
            return lib_plan(_Cfg(lib), *args)
        x = args[0]
        m, n = x.shape
        tn = next_power_of_2(n)
        units = -(-m // cfg.TM)
        grid = persistent_grid(units, x.get_device(), cfg.occupancy) if cfg.PERSIST else (units,)
        consts = (cfg.TM, tn, cfg.LOAD_TMA, cfg.PF, cfg.STORE_TMA)
        if op == "layer_norm":
            xx, w, b, y, eps = args[:5]
            return Launch(kernel, grid, (xx, w, b, y, eps) + consts)
        if op == "softmax":
            xx, y = args
            return Launch(kernel, grid, (xx, y) + consts)
        xx, w, y, eps = args[:4]
        return Launch(kernel, grid, (xx, w, y, eps) + consts)

    plan.__name__ = plan.__qualname__ = f"probe_rows_{op}_plan"
    plan.__signature__ = inspect.signature(lib_plan)  # the tuner binds writes/inplace by parameter name
    return plan


class _Cfg(dict):
    """A config-like mapping (attribute access and ``get``) for the library plan."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc


def variant(cfg: dict[str, Any]) -> str:
    grid = "" if cfg.get("PERSIST", True) else ", a block per row block"
    if cfg["LIB"]:
        return "library kernel" + grid
    return ("tma" if cfg["LOAD_TMA"] else "plain") + (" loads + prefetch" if cfg["PF"] else " loads") + grid


def probe_one(op: str, m: int, n: int) -> dict[str, Any]:
    import torch

    from kernels_memory import build
    from probe_memory import prepared
    from tiletune import autotune

    prob = build(op, (m, n), torch.bfloat16)
    prep = prepared(op, prob)
    fam = prep.family
    if op == "layer_norm" and not (prep.args[5] and prep.args[6]) or op == "rms_norm" and not prep.args[4]:
        raise RuntimeError("the probe kernels assume weight (and bias) present")
    tuned = autotune(probe_space(n), reference=fam.reference, writes=list(fam.writes), inplace=list(fam.inplace),
                     tolerance=fam.tolerance, name=f"probe_rows.{op}", db=False, progress=False)(make_plan(op, fam.plan))
    res, wall = tune_once(tuned, prep.args)
    rows = measurement_rows(res, lambda us: {"gbps": round(prob["bytes"] / us / 1e3, 1)},
                            lambda cfg: {"variant": variant(cfg)})
    ok = ranked_ok(rows)
    best_by_variant: dict[str, Any] = {}
    for r in ok:
        best_by_variant.setdefault(r["variant"], r)
    winner = dict(res.winner)

    # head to head, neutral timer: library public call, the probe's winner, torch.compile routes
    torch_fn, targs = prob["torch_fn"], prob["args"]
    routes: dict[str, Any] = {"library call": prob["tiletune"], "probe winner": lambda: tuned(*prep.args)}
    for mode in ("default", "max-autotune-no-cudagraphs"):
        try:
            fn = torch.compile(torch_fn, mode=None if mode == "default" else mode, dynamic=False)
            fn(*targs)
            routes[f"torch.compile({mode})"] = (lambda f: lambda: f(*targs))(fn)
        except Exception as exc:  # noqa: BLE001 - a route that does not compile is reported
            routes[f"torch.compile({mode})"] = f"failed: {type(exc).__name__}: {exc}"[:300]
    head: dict[str, Any] = do_bench_rounds({k: v for k, v in routes.items() if callable(v)}, warmup=25, rep=100)
    head.update({k: v for k, v in routes.items() if not callable(v)})
    out = {"op": op, "shape": [m, n], "dtype": "bfloat16", "bytes": prob["bytes"], "probe_size": len(rows),
           "wall_s": round(wall, 1), "winner": winner, "winner_variant": variant(winner),
           "best_by_variant": best_by_variant, "head_to_head_us": head,
           "head_to_head_gbps": {k: round(prob["bytes"] / v / 1e3, 1) for k, v in head.items()
                                 if isinstance(v, float) and v > 0},
           "rows": rows}
    routes.clear()
    torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, help="comma-separated ops (layer_norm, softmax, rms_norm)")
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--cols", type=int, default=1024)
    args = ap.parse_args()
    ops = args.only.split(",") if args.only else list(OPS)
    bad = [o for o in ops if o not in OPS]
    if bad:
        ap.error(f"unknown op(s) {bad}; choose from {', '.join(OPS)}")
    if args.cols > 2048 or args.cols < 16 or math.log2(args.cols) % 1:
        ap.error("--cols must be a power of two in 16..2048 (the probe kernels assume full, short rows)")
    import torch

    if not torch.cuda.is_available():
        print("probe_rows: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args.out or os.environ.get("BENCH_OUT") or DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    t0 = time.perf_counter()
    for op in ops:
        print(f"[{time.perf_counter() - t0:6.1f} s] {op} {args.rows}x{args.cols}", flush=True)
        try:
            r = probe_one(op, args.rows, args.cols)
            print(f"    {r['probe_size']} configs in {r['wall_s']} s; winner {r['winner_variant']} {r['winner']}", flush=True)
            for v, b in r["best_by_variant"].items():
                print(f"    best {v:28s} {b['median_us']:8.2f} us {b['gbps']:7.1f} GB/s {b['config']}", flush=True)
            print(f"    head to head (do_bench, us): {r['head_to_head_us']}", flush=True)
        except Exception as exc:  # noqa: BLE001 - one failing op must not lose the others
            r = {"op": op, **failure_fields(exc)}
        results.append(r)
    # per-config rows compressed (a sweep of ~170 configs per op; the uncompressed file did not come back
    # from the device machine at 23:53)
    path = write_result("probe_rows", {"problems": results, "wall_s": round(time.perf_counter() - t0, 1)}, out,
                        compress=True)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
