#!/usr/bin/env python
"""Small-M GEMM (a decoder's projections at decode time): every config of two routes, measured by the tuner.

Issue 20's kernel profile of a decode step put tiletune's projection GEMMs at M = 8 about 1.3x behind
cuBLAS, and the shipped table holds ``SPLIT_K = 1`` winners for every M <= 256 of the 4096 x 4096 GEMM.
This sweep shows where each config stands, per problem, against ``torch.matmul`` (cuBLAS):

* ``splitk``: the library's split-K op as it is (:func:`tiletune.kernels.gemm_kernels.gemm_splitk_kernel`,
  ``SPLIT_K = 1`` is the plain GEMM), ``A = x`` (``M x K``) and ``B = w`` (``K x N``), ``TM = 64``.
* ``swap``: the same kernels on the transposed problem ``C^T = w^T x^T`` (the weight is the MMA's
  ``M`` side, the few tokens its ``N`` side, so ``TN`` may be 16 or 32 instead of 64): operands passed
  as transposed views, the output a transposed view of ``c``. (The library's small-M op has served
  this route since with its own kernel, :func:`tiletune.kernels.gemm_kernels.gemm_swap_kernel`, which
  takes the call's tensors as they are.)

Every config is tuned with the exhaustive strategy (correctness-checked, cold L2), in this process.
Writes ``gemm_small_m.json.gz`` (gzip, ``{"rows": [{"route", "M", "K", "N", "config", "median_us"}],
"torch": [{"M", "K", "N", "torch_us"}]}``) under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: (K, N) of a Llama-3-8B layer's projections: qkv, o, gate-up, down.
PROJECTIONS = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]


def spaces() -> dict[str, Any]:
    import tiletune as tt

    def depth(cfg) -> bool:  # two K tiles per split at least (K >= 4096)
        return cfg.SPLIT_K * 2 * cfg.TK <= 4096

    common = dict(GROUP_M=[8], LAT=[0], occupancy=[1, 2], num_worker_warps=[4])
    return {
        "splitk": tt.Space(TM=[64], TN=[64, 128, 256], TK=[64, 128], SPLIT_K=[1, 2, 4, 8], **common,
                           constraints={"depth": depth}),
        "swap": tt.Space(TM=[64, 128], TN=[16, 32, 64], TK=[64, 128], SPLIT_K=[1, 2, 4, 8], **common,
                         constraints={"depth": depth}),
    }


def make_op(route: str, space: Any) -> Any:
    import tiletune as tt
    from tiletune.kernels.gemm_kernels import gemm_args, gemm_kernel, gemm_splitk_kernel, splitk_args

    sms = 132

    def grid(units: int, cfg: Any) -> tuple[int]:
        return (max(1, min(units, sms * cfg.occupancy)),)

    def plan(cfg: Any, a: Any, b: Any, c: Any, sa: Any, ws: Any, sem: Any) -> tt.Launch:
        if route == "splitk":
            A, B, C = a, b, c
            ta = tb = False
        else:  # C^T (N x M) = w^T (N x K, stored K x N) @ x^T (K x M, stored M x K)
            A, B, C = b, a, c.transpose(1, 2)
            ta = tb = True
        m, n = C.shape[1], C.shape[2]
        ws = ws.view(8, m, n)
        tiles = -(-m // cfg.TM) * -(-n // cfg.TN)
        if cfg.SPLIT_K == 1:
            return tt.Launch(gemm_kernel, grid(tiles, cfg), gemm_args(cfg, A, B, C, sa, sa, ta, tb))
        return tt.Launch(gemm_splitk_kernel, grid(tiles * cfg.SPLIT_K, cfg),
                         splitk_args(cfg, A, B, C, sa, sa, ws, sem, ta, tb))

    def reference(a: Any, b: Any, c: Any, sa: Any, ws: Any, sem: Any) -> tuple[Any, Any, Any]:
        import torch

        return (a.float() @ b.float()).to(c.dtype), SCRATCH, torch.zeros_like(sem)

    from tiletune.kernels.gemm import _tolerance
    from tiletune.devices.verify import SCRATCH

    def tolerance(a: Any, b: Any, c: Any, sa: Any, *_: Any) -> dict:
        return _tolerance(a, b, c, sa, sa, False)

    return tt.autotune(space, reference=reference, writes=["c"], inplace=["ws", "sem"], tolerance=tolerance,
                       db=False, strategy="exhaustive", isolation="none", name=f"small_m_{route}")(plan)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", default="8,64", help="token counts")
    ap.add_argument("--routes", default="splitk,swap")
    ap.add_argument("--out", default=os.environ.get("OUT") or None)
    args = ap.parse_args(argv)
    import torch

    import tiletune as tt
    from _common import write_result

    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    ref_rows: list[dict[str, Any]] = []
    sp = spaces()
    routes = [r for r in args.routes.split(",") if r]
    ops = {r: make_op(r, sp[r]) for r in routes}
    for m in [int(x) for x in args.m.split(",")]:
        for k, n in PROJECTIONS:
            a = torch.randn(1, m, k, device="cuda").to(torch.bfloat16)
            b = (torch.randn(1, k, n, device="cuda") / k ** 0.5).to(torch.bfloat16)
            c = torch.empty(1, m, n, device="cuda", dtype=torch.bfloat16)
            sa = torch.ones(1, device="cuda")
            ws = torch.zeros(8 * m * n, device="cuda")  # float32 partials, (8, M, N) or (8, N, M) in the plan
            sem = torch.zeros(8192, dtype=torch.int32, device="cuda")
            a2, b2 = a[0], b[0]
            ref = tt.bench(lambda: torch.matmul(a2, b2), flush_l2=True)
            ref_rows.append({"M": m, "K": k, "N": n, "torch_us": ref.median_us})
            print(f"M={m} K={k} N={n}: torch {ref.median_us:.1f} us", flush=True)
            for route, op in ops.items():
                ts = time.perf_counter()
                try:
                    op(a, b, c, sa, ws, sem)
                except Exception as exc:  # noqa: BLE001 - a route failing is a result
                    rows.append({"route": route, "M": m, "K": k, "N": n, "error": f"{type(exc).__name__}: {exc}"[:300]})
                    print(f"  {route}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                res = list(op.results.values())[-1]
                for meas in res.measurements:
                    rows.append({"route": route, "M": m, "K": k, "N": n, "config": dict(meas.config),
                                 "median_us": meas.median_us, "status": str(meas.status)})
                print(f"  {route}: best {res.winner_median_us:.1f} us {dict(res.winner)} "
                      f"({len(res.successes)} ok, {len(res.failures)} failed, {time.perf_counter() - ts:.0f} s)",
                      flush=True)
            del a, b, c, ws, sem
    write_result("gemm_small_m", {"rows": rows, "torch": ref_rows, "wall_s": time.perf_counter() - t0},
                 args.out, compress=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
