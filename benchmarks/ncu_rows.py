"""Hardware counters (Nsight Compute) of the library kernel and of the fastest torch route's kernel on
memory-bound rows (``op:MxN``) and GEMM rows (``gemm:MxNxK``, against ``F.linear``), to say where the
time goes where the library is behind (issue 14).

Two steps. On the GPU host, under ``ncu`` (``run_pending_h200.sh ncu``)::

    ncu --profile-from-start off --clock-control none --target-processes application-only --set full \\
        -o OUT/ncu_rows python benchmarks/ncu_rows.py --rows layer_norm:65536x1024,softmax:65536x1024
    ncu --import OUT/ncu_rows.ncu-rep --csv --page details > OUT/ncu_details.csv
    ncu --import OUT/ncu_rows.ncu-rep --csv --page raw > OUT/ncu_raw.csv

The script builds each row's inputs (``kernels_memory.build``), warms both routes outside the profiled
range (the library op tunes in this process, ``torch.compile`` compiles), then runs each route
``--launches`` times between ``cudaProfilerStart`` and ``cudaProfilerStop``, with NVTX ranges named
``<op> <shape> <route>``. ncu flushes the caches before each replayed kernel (cold L2, as the benchmarks).

Anywhere, ``--summarize OUT/ncu_details.csv OUT/ncu_raw.csv --out DIR`` writes ``ncu_rows.json.gz``: per
kernel its route, duration, DRAM throughput and bytes, achieved occupancy, launch shape, registers,
warp-cycles per issued instruction, the leading warp-stall reasons and ncu's rule messages.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

DEFAULT_ROWS = "layer_norm:65536x1024,softmax:65536x1024,swiglu:8192x28672,rms_norm:4096x8192"
#: ``gemm:MxNxK`` rows time ``K.matmul(x, w.t())`` against ``F.linear(x, w)`` (cuBLAS) instead;
#: ``attention:BxHxHkvxSxD`` rows (suffix ``c``: causal, e.g. ``attention:4x32x8x4096x128c``) time the
#: library attention against SDPA with torch's default backend choice and with cuDNN alone (both with
#: ``enable_gqa`` where ``Hkv < H``), the routes that were fastest on the attention rows

#: details-page metrics kept per kernel: (section, metric name) -> field
DETAILS = {
    ("GPU Speed Of Light Throughput", "Duration"): "duration",
    ("GPU Speed Of Light Throughput", "DRAM Throughput"): "dram_throughput_pct",
    ("GPU Speed Of Light Throughput", "Memory Throughput"): "memory_throughput_pct",
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"): "sm_throughput_pct",
    ("GPU Speed Of Light Throughput", "SM Frequency"): "sm_frequency",
    ("GPU Speed Of Light Throughput", "DRAM Frequency"): "dram_frequency",
    ("Memory Workload Analysis", "Memory Throughput"): "memory_throughput",
    ("Memory Workload Analysis", "L2 Hit Rate"): "l2_hit_pct",
    ("Memory Workload Analysis", "Mem Busy"): "mem_busy_pct",
    ("Memory Workload Analysis", "Max Bandwidth"): "max_bandwidth_pct",
    ("GPU Speed Of Light Throughput", "Elapsed Cycles"): "elapsed_cycles",
    ("Compute Workload Analysis", "Issue Slots Busy"): "issue_slots_busy_pct",
    ("Compute Workload Analysis", "Executed Ipc Active"): "ipc_active",
    ("Launch Statistics", "Grid Size"): "grid_size",
    ("Launch Statistics", "Block Size"): "block_size",
    ("Launch Statistics", "Registers Per Thread"): "registers",
    ("Launch Statistics", "Waves Per SM"): "waves_per_sm",
    ("Launch Statistics", "Dynamic Shared Memory Per Block"): "dyn_smem_per_block",
    ("Occupancy", "Theoretical Occupancy"): "theoretical_occupancy_pct",
    ("Occupancy", "Achieved Occupancy"): "achieved_occupancy_pct",
    ("Warp State Statistics", "Warp Cycles Per Issued Instruction"): "warp_cycles_per_issue",
    ("Scheduler Statistics", "No Eligible"): "no_eligible_pct",
    ("Scheduler Statistics", "Issued Warp Per Scheduler"): "issued_warp_per_scheduler",
}
#: raw-page metrics kept per kernel
RAW = {"dram__bytes_read.sum": "dram_read", "dram__bytes_write.sum": "dram_write",
       "gpu__time_duration.sum": "gpu_time", "smsp__inst_executed.sum": "instructions",
       "TPC.TriageCompute.sm__pipe_tensor_cycles_active_realtime.avg.pct_of_peak_sustained_elapsed":
           "tensor_pipe_elapsed_pct",
       "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active": "gmma_inst_active_pct",
       "sm__cycles_active.avg": "sm_cycles_active", "lts__t_sector_hit_rate.pct": "l2_sector_hit_pct"}
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


def _parse_shape(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.lower().split("x"))


def parse_attention(text: str) -> dict[str, Any]:
    """``BxHxHkvxSxD`` with an optional ``c`` (causal) as the problem dict of ``kernels_compute``'s rows."""
    causal = text.lower().endswith("c")
    try:
        b, h, hkv, s, d = (int(v) for v in text.lower().rstrip("c").split("x"))
    except ValueError:
        raise ValueError(f"attention rows are BxHxHkvxSxD[c] (e.g. 4x32x8x4096x128c), got {text!r}") from None
    if min(b, h, hkv, s, d) < 1 or h % hkv:
        raise ValueError(f"attention row {text!r}: sizes must be positive and H a multiple of Hkv")
    return {"op": "attention", "B": b, "H": h, "Hkv": hkv, "S": s, "D": d, "causal": causal, "dtype": "bfloat16"}


def run(rows: str, launches: int) -> None:
    """Warm, then profile: each row's library op and torch route, ``launches`` times each."""
    os.environ.setdefault("TILETUNE_ISOLATION", "none")
    if "TILETUNE_DB" not in os.environ:
        import tempfile

        os.environ["TILETUNE_DB"] = str(Path(tempfile.mkdtemp()) / "t.db")
    import torch

    from kernels_memory import COMPILE_ROUTES, build, route_of_record

    plan = []
    for item in rows.split(","):
        op, shape_text = item.split(":")
        if op == "attention":
            calls, route = _attention_calls(parse_attention(shape_text))
        elif op == "gemm":
            calls, route = _gemm_calls(_parse_shape(shape_text))
        else:
            shape = _parse_shape(shape_text)
            prob = build(op, shape, torch.bfloat16)
            route = route_of_record(op, shape)
            fn = torch.compile(prob["torch_fn"], dynamic=False, **COMPILE_ROUTES.get(route, {}))
            args = prob["args"]
            calls = {"tiletune": prob["tiletune"], route: (lambda fn=fn, args=args: fn(*args))}
        for f in calls.values():  # tune / compile, then settle
            for _ in range(3):
                f()
        plan.append((f"{op} {shape_text}", calls))
        print(f"warmed {op} {shape_text}: torch route {route}", file=sys.stderr, flush=True)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for label, calls in plan:
        for name, f in calls.items():
            for _ in range(launches):
                torch.cuda.nvtx.range_push(f"{label} {name}")
                f()
                torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def _gemm_calls(shape: tuple[int, ...]) -> tuple[dict[str, Any], str]:
    """``gemm:MxNxK``: ``x[M, K] @ w[N, K].t()`` in bf16, the library's matmul and ``F.linear`` (cuBLAS)."""
    import torch
    import torch.nn.functional as F

    import tiletune.kernels as K

    m, n, k = shape
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    return {"tiletune": lambda: K.matmul(x, w.t()), "F.linear": lambda: F.linear(x, w)}, "F.linear"


def _attention_calls(p: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The library attention and SDPA (torch's default choice, cuDNN alone) on one problem."""
    from kernels_compute import _setup_attention

    tt_fn, routes, _, _, _ = _setup_attention(p)
    tag = ", enable_gqa" if p["Hkv"] < p["H"] else ""
    calls = {"tiletune": tt_fn}
    for name in (f"SDPA default{tag}", f"SDPA cudnn{tag}"):
        calls[name] = routes[name]
    return calls, f"SDPA default{tag}"


def _csv_rows(path: str) -> list[dict[str, str]]:
    text = Path(path).read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))


def _number(text: str) -> Any:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return text


def summarize(details_csv: str, raw_csv: str) -> list[dict[str, Any]]:
    """One dict per profiled kernel launch (ncu's ID order)."""
    kernels: dict[str, dict[str, Any]] = defaultdict(dict)
    for r in _csv_rows(details_csv):
        k = kernels[r["ID"]]
        k.setdefault("kernel", r.get("Kernel Name"))
        k.setdefault("nvtx", r.get("thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg")
                     or next((v for c, v in r.items() if c and c.startswith("thread Domain") and v), None))
        field = DETAILS.get((r.get("Section Name"), r.get("Metric Name")))
        if field:
            k[field] = _number(r.get("Metric Value", ""))
            unit = r.get("Metric Unit")
            if unit and field in ("duration", "memory_throughput", "sm_frequency", "dram_frequency"):
                k[field + "_unit"] = unit
        if r.get("Rule Name") and r.get("Rule Description"):
            k.setdefault("rules", {})[r["Rule Name"]] = r["Rule Description"][:400]
    raw = _csv_rows(raw_csv)
    if raw:
        for r in raw[1:] if raw[0].get("ID", "").strip() == "" else raw:  # the first row may hold units
            k = kernels.get(r.get("ID"))
            if k is None:
                continue
            for metric, field in RAW.items():
                if metric in r:
                    k[field] = _number(r[metric])
            stalls = {c[len(STALL_PREFIX):-len(STALL_SUFFIX)]: _number(v) for c, v in r.items()
                      if c and c.startswith(STALL_PREFIX) and c.endswith(STALL_SUFFIX) and "not_issued" not in c}
            stalls = {n: v for n, v in stalls.items() if isinstance(v, float)}
            k["top_stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:6])
    return [dict(kernels[i], id=i) for i in sorted(kernels, key=lambda s: int(s) if s.isdigit() else 0)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="comma-separated op:MxN (default: %(default)s)")
    ap.add_argument("--launches", type=int, default=2)
    ap.add_argument("--summarize", nargs=2, metavar=("DETAILS_CSV", "RAW_CSV"), default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--name", default="ncu_rows", help="result file name (with --summarize)")
    a = ap.parse_args(argv)
    if a.summarize is None:
        run(a.rows, a.launches)
        return 0
    kernels = summarize(*a.summarize)
    from _common import write_result

    write_result(a.name, {"problem": "Nsight Compute (--set full, --clock-control none, caches flushed per replay) "
                                     "of the library kernel and the fastest torch route's kernel per row, bf16",
                          "kernels": kernels}, a.out, compress=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
