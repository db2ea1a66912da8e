"""Probe: where the tuner's timer and ``triton.testing.do_bench`` part on short kernels.

On the H200 (2026-12-02) ``tt.bench`` read a 16 MiB copy 6.4% below ``do_bench`` (12.50 against
13.34 us) and the GEMM sweep's ``timer_check`` read 16-token GEMMs 3-6% below it. The two harnesses
differ in what comes before the timed call: ours memsets twice the L2 and then spins the GPU for
``backlog_us`` (nvbench's blocking kernel); ``do_bench`` zeroes a 256 MiB buffer and records its start
event right after. This probe times each case four ways and reads the kernels' own durations from
CUPTI (``torch.profiler``'s trace) under each harness, so an event-timing difference and a change in
the kernel's speed can be told apart:

* ``ours``: ``tt.bench`` as the tuner times (flush, 100 us spin, events);
* ``ours_no_spin``: ``tt.bench(..., backlog_us=0)`` (flush, events);
* ``do_bench``: ``triton.testing.do_bench(..., return_mode="median")``;
* ``cupti_*``: the timed call's device time from CUPTI inside each of the three (per kernel or copy
  name the median duration, summed over names).

Rounds alternate the harness order; each figure is the median over rounds.

    python benchmarks/probe_timer.py [--rounds 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from typing import Any, Callable

import torch

import tiletune as tt
from _common import write_result

#: kernels of the harnesses themselves (flush memsets/fills and the spin), not of the timed call
_HARNESS_KERNELS = ("FillFunctor", "fill_kernel", "spin_kernel", "sleep", "memset")


def _cases() -> dict[str, Callable[[], Any]]:
    dev = "cuda"
    out: dict[str, Callable[[], Any]] = {}
    for n, label in ((1 << 20, "copy fp32 4 MiB"), (1 << 22, "copy fp32 16 MiB"), (1 << 26, "copy fp32 256 MiB")):
        src = torch.empty(n, dtype=torch.float32, device=dev).uniform_()
        dst = torch.empty_like(src)
        out[label] = (lambda d=dst, s=src: d.copy_(s))
    for m, k, n in ((16, 4096, 4096), (1024, 4096, 4096)):
        a = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
        b = torch.randn(k, n, dtype=torch.bfloat16, device=dev)
        out[f"torch.matmul bf16 {m}x{k}x{n}"] = (lambda a=a, b=b: torch.matmul(a, b))
    return out


def _device_work_us(run: Callable[[], Any]) -> float | None:
    """The timed call's device time per call from CUPTI: for each kernel or copy name that is not the
    harness's, the median duration, summed over names (a call launches each of its kernels once).

    Plain ``Tensor.copy_`` of a contiguous tensor is a device-to-device memcpy, not a kernel, so copies
    count too (the 2026-12-02 08:57 run counted kernels only and read none for the copy cases)."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        run()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    return work_from_trace(trace)


def work_from_trace(trace: dict[str, Any]) -> float | None:
    """:func:`_device_work_us` on a Chrome trace (``torch.profiler``'s export)."""
    by_name: dict[str, list[float]] = {}
    for e in trace.get("traceEvents", []):
        name = e.get("name", "")
        if e.get("cat") in ("kernel", "gpu_memcpy") and not any(h in name for h in _HARNESS_KERNELS):
            by_name.setdefault(name, []).append(float(e["dur"]))
    return sum(statistics.median(v) for v in by_name.values()) if by_name else None


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def probe(fn: Callable[[], Any], rounds: int) -> dict[str, Any]:
    from triton.testing import do_bench

    harnesses: dict[str, Callable[[], float]] = {
        "ours": lambda: tt.bench(fn, samples=60).median_us,
        "ours_no_spin": lambda: tt.bench(fn, samples=60, backlog_us=0).median_us,
        "do_bench": lambda: do_bench(fn, return_mode="median") * 1e3,
    }
    events: dict[str, list[float]] = {k: [] for k in harnesses}
    cupti: dict[str, list[float]] = {k: [] for k in harnesses}
    names = list(harnesses)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            events[name].append(harnesses[name]())
            work = _device_work_us(harnesses[name])
            cupti[name].append(float("nan") if work is None else work)
    row: dict[str, Any] = {}
    for name in names:
        row[f"{name}_us"] = _median(events[name])
        row[f"cupti_{name}_us"] = _median(cupti[name])
    row["ours_vs_do_bench"] = row["ours_us"] / row["do_bench_us"] - 1.0
    row["ours_no_spin_vs_do_bench"] = row["ours_no_spin_us"] / row["do_bench_us"] - 1.0
    row["cupti_ours_vs_cupti_do_bench"] = row["cupti_ours_us"] / row["cupti_do_bench_us"] - 1.0
    row["rounds"] = {"events": events, "cupti": cupti}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for label, fn in _cases().items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        row = {"case": label, **probe(fn, args.rounds)}
        rows.append(row)
        print(f"{label:34s} ours {row['ours_us']:8.2f}  no spin {row['ours_no_spin_us']:8.2f}  "
              f"do_bench {row['do_bench_us']:8.2f} us | CUPTI kernel: ours {row['cupti_ours_us']:8.2f}  "
              f"no spin {row['cupti_ours_no_spin_us']:8.2f}  do_bench {row['cupti_do_bench_us']:8.2f}", flush=True)
    write_result("probe_timer", {
        "question": "why tt.bench reads short kernels below triton.testing.do_bench: event timing or kernel speed",
        "rounds": args.rounds,
        "rows": rows,
    }, args.out)


if __name__ == "__main__":
    main()
