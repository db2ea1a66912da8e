#!/usr/bin/env python
"""Probe a GEMM row that trails cuBLAS: is a faster config outside the library's space?

``tiletune.kernels.matmul`` tunes products of more than 256 rows over
:data:`~tiletune.kernels.gemm.GEMM_SPACE` (the matmul template: 38 configs, no latency hint, ``GROUP_M``
8). For each ``M:N:K`` row this tunes (with ``--full``) the 512-config
:data:`~tiletune.kernels.gemm.GEMM_FULL_SPACE` (``GROUP_M`` 8/16, ``LAT`` 0/2/4/8 added) on ``x @ w.t()`` (``nn.Linear``'s weight layout, bf16) through
tiletune's harness (compile pool, reference check, cold-L2 timing, no database), marks the configs of the
library space, and times the library call, the full space's winner, ``F.linear`` and ``torch.matmul``
with ``triton.testing.do_bench`` (L2 flushed, interleaved), and what answered the library call's key
(``served``: the source, config and neighbour of each answer, its fallback's compiles awaited). It also
reports the wave count of each tile shape on this GPU (tiles over SMs x occupancy), the suspected cause of
the large-M rows below 0.9,
and (with ``--tail``) tunes the experimental tail-split GEMM (``_gemm_tail.py``: full waves whole, the last short wave's
tiles split along ``K``) over the template's space times its split caps, to measure that cause. A route
"row split" times two library calls instead: ``matmul`` over the leading rows (a multiple of 256) and over
the trailing ones (at most 256 rows, which ``matmul`` sends to its split-K op).
Writes ``<out>/probe_gemm_space.json.gz``.

    python benchmarks/probe_gemm_space.py [--rows M:N:K,...] [--full] [--tail] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import do_bench_rounds, measurement_rows, ranked_ok, run_probe, tune_once  # noqa: E402

#: Off-grid rows of seed 7 (2026-12-04) that trailed cuBLAS most, and one of issue 42's.
DEFAULT_ROWS = "2076:4096:14336,3000:3584:3584"


def parse_rows(text: str) -> list[tuple[int, int, int]]:
    """``M:N:K`` items, comma-separated, each at least 257 rows (smaller ones go to the split-K op)."""
    rows = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        parts = item.split(":")
        if len(parts) != 3:
            raise ValueError(f"row {item!r}: expected M:N:K")
        try:
            m, n, k = (int(p) for p in parts)
        except ValueError:
            raise ValueError(f"row {item!r}: every field is an integer") from None
        if m < 257 or min(n, k) < 16 or n % 8 or k % 8:
            raise ValueError(f"row {item!r}: M >= 257 (smaller products take the split-K op), N and K >= 16 "
                             f"and multiples of 8")
        rows.append((m, n, k))
    if not rows:
        raise ValueError("no rows")
    return rows


def waves(m: int, n: int, tm: int, tn: int, sms: int, occupancy: int) -> float:
    """Output tiles of a ``tm x tn`` tiling over the blocks the GPU holds at once (``sms * occupancy``)."""
    return (-(-m // tm)) * (-(-n // tn)) / (sms * occupancy)


def linear_operands(m: int, n: int, k: int, seed: int = 0) -> tuple[Any, Any, tuple[Any, ...]]:
    """``(x, w, the library GEMM's launch arguments of x @ w.t())`` in bf16 (``nn.Linear``'s weight layout);
    a product that ``matmul`` sends to another op than the plain GEMM is a ValueError."""
    import torch

    from tiletune.kernels.gemm import GEMM, prepare_matmul

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k ** 0.5
    one = torch.ones((), device="cuda", dtype=torch.float32)
    lib_op, _, args = prepare_matmul(x, w.t(), torch.bfloat16, one, one, False)
    if lib_op is not GEMM:
        raise ValueError(f"M={m}: matmul sends this product to {lib_op.name}, not the plain GEMM")
    return x, w, args


def probe_row(m: int, n: int, k: int, full_space: bool = False, tail_space_too: bool = False) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    import tiletune.kernels as K
    from tiletune import autotune
    from tiletune.kernels.gemm import GEMM, GEMM_FULL_SPACE, GEMM_SPACE

    x, w, args = linear_operands(m, n, k)
    flops = 2 * m * n * k
    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    lib = {tuple(sorted(dict(c).items())) for c in GEMM_SPACE.candidates(arch)}
    from _gemm_tail import tail_plan, tail_plan_numbers, tail_space

    routes: dict[str, Any] = {"library call": lambda: K.matmul(x, w.t())}
    tail_res = tail_wall = None
    if tail_space_too:
        tail = autotune(tail_space(), reference=GEMM.reference, writes=list(GEMM.writes), tolerance=GEMM.tolerance,
                        name="probe_gemm_space.tail", db=False, progress=False)(tail_plan)
        tail_res, tail_wall = tune_once(tail, args)
        routes["tail-split winner"] = lambda: tail(*args)
    rows, ok, best_lib, wall, winner = [], [], None, None, None
    if full_space:
        full = autotune(GEMM_FULL_SPACE, reference=GEMM.reference, writes=list(GEMM.writes),
                        tolerance=GEMM.tolerance, name="probe_gemm_space.full", db=False, progress=False)(GEMM.plan)
        res, wall = tune_once(full, args)
        winner = dict(res.winner)

        def extra(cfg: dict[str, Any]) -> dict[str, Any]:
            return {"in_library": tuple(sorted(cfg.items())) in lib,
                    "waves": round(waves(m, n, cfg["TM"], cfg["TN"], sms, cfg["occupancy"]), 2)}

        rows = measurement_rows(res, lambda us: {"tflops": round(flops / us / 1e6, 1)}, extra)
        ok = ranked_ok(rows)
        best_lib = next((r for r in ok if r["in_library"]), None)
        routes["full-space winner"] = lambda: full(*args)

    def tail_extra(cfg: dict[str, Any]) -> dict[str, Any]:
        from types import SimpleNamespace

        grid, dp, s, r = tail_plan_numbers(SimpleNamespace(**cfg), m, n, k, sms)
        return {"grid": grid, "whole_tiles": dp, "tail_tiles": r, "tail_splits": s}

    tail_rows = [] if tail_res is None else \
        measurement_rows(tail_res, lambda us: {"tflops": round(flops / us / 1e6, 1)}, tail_extra)
    tail_ok = ranked_ok(tail_rows)
    # the row split: the library's GEMM over the leading rows (a multiple of 256, so every tile height fits) and
    # the library's split-K op over the trailing ones (at most 256 rows), two launches of existing ops
    split_rows = (m // 256) * 256 if m % 256 else m - 256
    if 0 < split_rows < m and m - split_rows <= 256:
        wt = w.t()
        routes[f"row split at {split_rows}"] = lambda: (K.matmul(x[:split_rows], wt), K.matmul(x[split_rows:], wt))
    routes["F.linear"] = lambda: F.linear(x, w)
    routes["torch.matmul"] = lambda: torch.matmul(x, w.t())
    from nearest_quality import ChoiceLog

    from tiletune import wait_for_compiles

    with ChoiceLog() as log:  # what answers the library call's key (a table, a neighbour, its fallback first)
        for fn in routes.values():
            fn()
        wait_for_compiles()
        routes["library call"]()
    served = [dict(info, op=name) for name, _, info in log.items if name.startswith("tiletune.gemm")]
    head = do_bench_rounds(routes, warmup=10, rep=60)
    return {"shape": f"{m}x{n}x{k}", "flops": flops, "sm_count": sms, "full_space_size": len(rows),
            "wall_s": wall and round(wall, 1), "winner": winner, "best": ok[0] if ok else None,
            "best_library": best_lib, "tail_wall_s": tail_wall and round(tail_wall, 1),
            "tail_winner": tail_res and dict(tail_res.winner),
            "tail_best": tail_ok[0] if tail_ok else None,
            "tail_best_unsplit": next((r for r in tail_ok if r["tail_tiles"] == 0), None),
            "served": [{k: v for k, v in c.items() if k != "tuning"} for c in served],
            "head_to_head_us": head,
            "head_to_head_tflops": {name: round(flops / us / 1e6, 1) for name, us in head.items()},
            "rows": rows, "tail_rows": tail_rows}


def report(r: dict[str, Any]) -> list[str]:
    b, bl = r["best"], r["best_library"]
    return [f"full space: {r['full_space_size']} configs in {r['wall_s']} s; best {b and b['median_us']} us "
            f"{b and b['config']}; library best {bl and bl['median_us']} us {bl and bl['config']}",
            f"tail-split space: {len(r['tail_rows'])} configs in {r['tail_wall_s']} s",
            f"tail-split best {r['tail_best'] and r['tail_best']['median_us']} us {r['tail_best']}",
            f"head to head (do_bench, us): {r['head_to_head_us']}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="M:N:K, comma-separated (default %(default)s)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--full", action="store_true", help="also tune the 512-config GEMM_FULL_SPACE")
    ap.add_argument("--tail", action="store_true", help="also tune the experimental tail-split kernel's space")
    return run_probe("probe_gemm_space", ap, parse_rows,
                     lambda row, args: probe_row(*row, full_space=args.full, tail_space_too=args.tail), report)


if __name__ == "__main__":
    sys.exit(main())
