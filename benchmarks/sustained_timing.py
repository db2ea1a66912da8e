#!/usr/bin/env python
"""Is a long kernel slower when it runs back to back than when the tuner times it alone?

On the H200 (2026-12-01) two attention rows timed 5-15% slower in ``kernels_compute.py``'s interleaved
A/B than the tuner had timed the same config (B2 H32 S8192 D128: 3863 vs 3365 us; B1 H32/8 S16384:
7956 vs 7581 us), while cuDNN's kernels were not, and the GEMM call-gap test found 4096^3 3.3% above
the tuner's median. This times each workload's tiletune call and torch's fastest route three ways,
with the SM clock, power draw and slowdown reasons read through NVML after each block:

* ``single``: the tuner's way: L2 flushed and a GPU spin queued before each sample, one call timed
  (:class:`tiletune.devices.measure.ColdL2Timer`);
* ``back_to_back``: ``--calls`` calls of one route between two events, no flush, no gap (per call);
* ``alternating``: tiletune and torch in turn, each call timed by its own events, no flush, no gap
  (the A/B of ``kernels_compute.py`` without its flush).

Writes ``<out>/sustained_timing.json``: per workload and mode the median us of each route, the ratio
torch / tiletune, and the clock readings.

    python benchmarks/sustained_timing.py [--only attention_s8192,gemm_4096] [--calls 20] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_OUT, write_result  # noqa: E402

#: the workloads :func:`build` makes
WORKLOADS = ("attention_s8192", "attention_s16384_gqa", "gemm_4096")
MODES = ("single", "back_to_back", "alternating")


def build(name: str) -> tuple[str, Callable[[], Any], Callable[[], Any], str]:
    """``(description, tiletune call, torch call, torch route)`` on fresh inputs for a workload."""
    import torch
    import torch.nn.functional as F

    import tiletune.kernels as K

    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    if name == "attention_s8192":
        q, k, v = randn(2, 32, 8192, 128), randn(2, 32, 8192, 128), randn(2, 32, 8192, 128)
        return ("attention B2 H32/32 S8192 D128", lambda: K.attention(q, k, v),
                lambda: F.scaled_dot_product_attention(q, k, v), "SDPA default")
    if name == "attention_s16384_gqa":
        q, k, v = randn(1, 32, 16384, 128), randn(1, 8, 16384, 128), randn(1, 8, 16384, 128)
        return ("attention B1 H32/8 S16384 D128", lambda: K.attention(q, k, v),
                lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), "SDPA default, enable_gqa")
    a, b = randn(4096, 4096), randn(4096, 4096)  # gemm_4096
    return "gemm bf16 4096^3", lambda: K.matmul(a, b), lambda: torch.matmul(a, b), "torch.matmul"


def clocks(probe: Any) -> dict[str, Any] | None:
    if probe is None:
        return None
    r = probe.read()
    return {"sm_mhz": r.sm_mhz, "power_w": r.power_w, "reasons": list(r.reasons)}


def summarize(times: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, Any]]:
    """Per mode: the median of each route and torch / tiletune."""
    out = {}
    for mode, by_route in times.items():
        med = {r: statistics.median(v) for r, v in by_route.items() if v}
        row: dict[str, Any] = {f"{r}_us": round(m, 2) for r, m in med.items()}
        if med.get("tiletune") and med.get("torch"):
            row["ratio"] = round(med["torch"] / med["tiletune"], 4)
        out[mode] = row
    return out


def measure(name: str, calls: int, rounds: int) -> dict[str, Any]:
    import torch

    from tiletune.devices.bench import nvml_probe
    from tiletune.devices.measure import ColdL2Timer

    what, ours, theirs, route = build(name)
    ours()  # tunes (or loads) the key
    theirs()
    torch.cuda.synchronize()
    routes = {"tiletune": ours, "torch": theirs}
    probe = nvml_probe(torch.cuda.current_device())
    timer = ColdL2Timer(torch.cuda.current_device(), flush=True, backlog_us=100.0)
    times: dict[str, dict[str, list[float]]] = {m: {"tiletune": [], "torch": []} for m in MODES}
    readings: dict[str, list[Any]] = {m: [] for m in MODES}
    E = torch.cuda.Event
    for _ in range(rounds):
        for r, fn in routes.items():  # single: the tuner's way
            times["single"][r] += timer.time(fn, calls)
            readings["single"].append(clocks(probe))
        for r, fn in routes.items():  # back to back: one block of calls per route
            start, end = E(enable_timing=True), E(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            readings["back_to_back"].append(clocks(probe))  # read while the block runs
            end.synchronize()
            times["back_to_back"][r].append(start.elapsed_time(end) * 1000.0 / calls)
        pairs = [(r, E(enable_timing=True), E(enable_timing=True)) for _ in range(calls) for r in routes]
        for r, s, e in pairs:  # alternating, each call its own events
            s.record()
            routes[r]()
            e.record()
        readings["alternating"].append(clocks(probe))
        torch.cuda.synchronize()
        for r, s, e in pairs:
            times["alternating"][r].append(s.elapsed_time(e) * 1000.0)
    if probe is not None:
        probe.close()
    return {"workload": name, "what": what, "torch_route": route, "calls": calls, "rounds": rounds,
            "summary": summarize(times), "clocks": readings,
            "samples_us": {m: {r: [round(x, 2) for x in v] for r, v in by.items()} for m, by in times.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help=f"comma-separated workloads ({', '.join(WORKLOADS)})")
    ap.add_argument("--calls", type=int, default=20, help="calls per block (default 20)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the three modes (default 3)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",")] if args.only else list(WORKLOADS)
    bad = [n for n in names if n not in WORKLOADS]
    if bad:
        ap.error(f"unknown workload(s) {bad}; choose from {', '.join(WORKLOADS)}")
    if args.calls < 1 or args.rounds < 1:
        ap.error("--calls and --rounds must be >= 1")
    import torch

    if not torch.cuda.is_available():
        print("sustained_timing: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args.out or os.environ.get("BENCH_OUT") or DEFAULT_OUT)
    results = []
    for name in names:
        r = measure(name, args.calls, args.rounds)
        print(f"{r['what']}: " + "; ".join(f"{m} {s}" for m, s in r["summary"].items()), flush=True)
        results.append(r)
    write_result("sustained_timing", {"workloads": results}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
