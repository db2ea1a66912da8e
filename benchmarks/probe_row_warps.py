"""Probe: do fewer warps per block (TMA loads kept) close the short-row gap to ``torch.compile``?

``ncu_rows.json.gz`` (2026-12-02) found the library's layer_norm at 65536x1024 with 256-thread blocks at
128 registers per thread (theoretical occupancy 25%, achieved 15%) where ``torch.compile``'s kernel
runs 64-thread blocks at 64 registers (46% achieved), and softmax with block-wide reductions (barrier
and shared-memory stalls) where torch reduces each row in one warp. The TMA-load short-row space
(``templates.short_rows_space``) never varies the block size. This tunes, per row, the library's own
launch plan over its shipped space and over a probe space with ``num_worker_warps`` 1, 2 or 4, ``TM``
1-4 rows, occupancy 4-16, both grids, then times the two picks and the fastest torch route of
``kernels_memory.json`` interleaved (cold L2, a 200 us GPU spin before each sample, as
``kernels_memory.py``).

    python benchmarks/probe_row_warps.py [--rows layer_norm:65536x1024,softmax:65536x1024] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

DEFAULT_ROWS = "layer_norm:65536x1024,softmax:65536x1024,rms_norm_residual:65536x1024"


def probe_space(lib_space: Any) -> Any:
    """The probe space: the shipped space's fixed parameters, ``TM`` 1-4, occupancy 4-16, 1-4 worker warps,
    the persistent grid and one block per row block, TMA stores or not (rows x occupancy <= 16 per SM)."""
    from tiletune import Space
    from tiletune.space.templates import SHORT_ROWS_GRID_ALL

    return Space(TM=[1, 2, 4], CHUNK=[0], occupancy=[4, 8, 16], LAT=[0], STORE_TMA=[False, True],
                 GRID_FRAC=[1.0, SHORT_ROWS_GRID_ALL], num_worker_warps=[1, 2, 4],
                 constraints={"rows_in_flight": lambda c: c.TM * c.occupancy <= 16},
                 baseline=dict(TM=1, CHUNK=0, occupancy=8, LAT=0, STORE_TMA=True, GRID_FRAC=1.0, num_worker_warps=2))


def _prepared(op: str, x: Any, extra: tuple) -> Any:
    from tiletune.kernels import norms, softmax_op

    if op == "layer_norm":
        return norms.prepare_layer_norm(x, *extra)
    if op == "rms_norm_residual":
        return norms.prepare_rms_norm_residual(x, *extra)
    if op == "rms_norm":
        return norms.prepare_rms_norm(x, *extra)
    if op == "softmax":
        return softmax_op.prepare_softmax(x)
    raise SystemExit(f"--rows: no probe for {op!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=DEFAULT_ROWS)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch

    import tiletune as tt
    from kernels_memory import COMPILE_ROUTES, build, route_of_record, timed_medians
    from tiletune.devices.measure import ColdL2Timer
    from _common import write_result

    timer = ColdL2Timer(torch.cuda.current_device(), backlog_us=200.0)
    fast = tt.TunerOptions(stopping=tt.StoppingRule(min_samples=5, max_samples=30, max_seconds=0.2))
    rows = []
    for item in a.rows.split(","):
        op, shape_text = item.split(":")
        shape = tuple(int(v) for v in shape_text.split("x"))
        prob = build(op, shape, torch.bfloat16)
        args = prob["args"]
        extra = tuple(args[1:]) + ((1e-5,) if op == "layer_norm" else (1e-6,) if op.startswith("rms") else ())
        prep = _prepared(op, args[0], extra)
        lib = prep.family
        shipped = lib.op(prep.regime).space
        row: dict[str, Any] = {"op": op, "shape": list(shape)}
        picks = {}
        for name, space in (("shipped_space", shipped), ("probe_space", probe_space(shipped))):
            tuned = tt.autotune(space, reference=lib.reference, writes=list(lib.writes), inplace=list(lib.inplace),
                                tolerance=lib.tolerance, name=f"{lib.name}[{name}]", db=False, progress=False,
                                isolation="none", options=fast)(lib.plan)
            t0 = time.perf_counter()
            tuned(*prep.args)
            torch.cuda.synchronize()
            res = next(iter(tuned.results.values()))
            cfg = tuned.config_for(*prep.args)
            row[name] = {"configs": len(space.candidates("sm_90")), "tune_s": round(time.perf_counter() - t0, 1),
                         "pick": cfg.as_dict(), "pick_median_us": round(res.winner_median_us, 2),
                         "failures": len(res.failures),
                         "top": sorted(({"config": dict(m.config), "median_us": round(m.median_us, 2)}
                                        for m in res.successes if m.median_us), key=lambda d: d["median_us"])[:8]}
            picks[name] = (lambda tuned=tuned: tuned(*prep.args))
        route = route_of_record(op, shape)
        fn = torch.compile(prob["torch_fn"], dynamic=False, **COMPILE_ROUTES.get(route, {}))
        calls = {**picks, route: (lambda: fn(*args))}
        for f in calls.values():
            timer.time(f, 5)  # warm-up samples, discarded
        med = timed_medians(calls, timer, a.rounds, 5)
        row["timed_us"] = {n: round(v, 2) for n, v in med.items()}
        row["torch_route"] = route
        row["ratio_shipped"] = round(med[route] / med["shipped_space"], 4)
        row["ratio_probe"] = round(med[route] / med["probe_space"], 4)
        print(json.dumps({k: row[k] for k in ("op", "shape", "timed_us", "ratio_shipped", "ratio_probe")}),
              flush=True)
        print("   probe pick", row["probe_space"]["pick"], "shipped pick", row["shipped_space"]["pick"], flush=True)
        rows.append(row)
        _save(write_result, rows, a.out)  # after each row, should the run be cut short
    return 0


def _save(write_result: Any, rows: list, out: Any) -> None:
    write_result("probe_row_warps", {"problem": "short-row kernels: the shipped space vs a probe space with 1-4 worker "
                                                "warps (TMA loads), each tuned on the library plan, timed against the "
                                                "fastest torch route, cold L2, 200 us backlog", "rows": rows}, out)


if __name__ == "__main__":
    sys.exit(main())
