"""Probe: where the host time of one cuTile launch goes, and what a capture tolerates.

Measures (host time per call, batches of calls ended by one synchronisation, variants interleaved):

* ``ct.launch`` with torch tensors (cuTile converts each with ``torch._C._to_dlpack``);
* ``ct.launch`` with ``__cuda_array_interface__`` views built per call, and with views whose data
  pointer is fixed (what a pre-bound launcher can pass);
* the parts a tuned op adds: ``_to_dlpack`` alone, the raw stream, the default key, ``torch.empty``;

and whether compiling a kernel met for the first time inside a ``torch.cuda.graph`` capture breaks
it, in global capture mode and with the thread switched to relaxed mode around the first launch
(``cuThreadExchangeStreamCaptureMode``). Each capture case runs in its own process.

    python benchmarks/probe_launch.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import cuda.tile as ct
import torch

from _common import write_result


@ct.kernel
def copy_kernel(X, Y, T: ct.Constant[int]):
    i = ct.bid(0)
    ct.store(Y, (i,), ct.load(X, index=(i,), shape=(T,)))


class CudaArray:
    """A minimal ``__cuda_array_interface__`` holder."""

    __slots__ = ("__cuda_array_interface__", "owner")

    def __init__(self, iface: dict, owner: object) -> None:
        self.__cuda_array_interface__ = iface
        self.owner = owner


_TYPESTR = {torch.float32: "<f4", torch.float16: "<f2", torch.bfloat16: "<V2", torch.int32: "<i4"}


def view(t: torch.Tensor) -> CudaArray:
    es = t.element_size()
    return CudaArray({"shape": tuple(t.shape), "typestr": _TYPESTR[t.dtype], "data": (t.data_ptr(), False),
                      "strides": tuple(s * es for s in t.stride()), "version": 3}, t)


def timed(fns: dict, calls: int, rounds: int) -> dict:
    per: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        f(200)
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, f in fns.items():
            t = time.perf_counter()
            f(calls)
            torch.cuda.synchronize()
            per[name].append((time.perf_counter() - t) / calls * 1e6)
    return {k: statistics.median(v) for k, v in per.items()}


def launch_costs(calls: int, rounds: int) -> dict:
    from tiletune.keys import default_key

    x = torch.randn(1024, device="cuda")
    y = torch.empty_like(x)
    raw = torch._C._cuda_getCurrentRawStream
    launch = ct.launch
    k = copy_kernel
    grid = (1,)
    vx, vy = view(x), view(y)
    to_dlpack = torch._C._to_dlpack
    launch(raw(0), grid, k, (x, y, 1024))
    launch(raw(0), grid, k, (vx, vy, 1024))
    torch.cuda.synchronize()
    y.zero_()
    launch(raw(0), grid, k, (view(x), view(y), 1024))
    torch.cuda.synchronize()
    ok = bool(torch.equal(x, y))

    def bare(n):
        for _ in range(n):
            launch(raw(0), grid, k, (x, y, 1024))

    def cai_per_call(n):
        for _ in range(n):
            launch(raw(0), grid, k, (view(x), view(y), 1024))

    def cai_fixed(n):
        for _ in range(n):
            launch(raw(0), grid, k, (vx, vy, 1024))

    def dlpack_only(n):
        for _ in range(n):
            to_dlpack(x)
            to_dlpack(y)

    def stream_only(n):
        for _ in range(n):
            raw(0)

    def key_only(n):
        a = (x, y)
        for _ in range(n):
            default_key(a)

    def data_ptr_only(n):
        for _ in range(n):
            x.data_ptr()
            y.data_ptr()

    def empty_only(n):
        for _ in range(n):
            torch.empty((8, 4096), dtype=torch.bfloat16, device="cuda")

    def empty_like_only(n):
        for _ in range(n):
            torch.empty_like(x)

    out = timed({"bare": bare, "cai_per_call": cai_per_call, "cai_fixed": cai_fixed, "dlpack_x2": dlpack_only,
                 "raw_stream": stream_only, "default_key": key_only, "data_ptr_x2": data_ptr_only,
                 "torch_empty": empty_only, "torch_empty_like": empty_like_only}, calls, rounds)
    out["cai_result_ok"] = ok
    return out


def custom_op_cost(calls: int, rounds: int) -> dict:
    """Eager overhead of a torch.library custom op around a plain Python function."""
    x = torch.randn(1024, device="cuda")

    def plain(t):
        return torch.empty_like(t)

    @torch.library.custom_op("ttprobe::emp", mutates_args=())
    def emp(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(t)

    @emp.register_fake
    def _(t):
        return torch.empty_like(t)

    def a(n):
        for _ in range(n):
            plain(x)

    def b(n):
        for _ in range(n):
            emp(x)

    def c(n):
        for _ in range(n):
            torch.compiler.is_compiling()

    return timed({"plain_fn": a, "custom_op": b, "is_compiling": c}, calls, rounds)


CAPTURE_CHILD = r"""
import ctypes, sys, json, torch, cuda.tile as ct
sys.path.insert(0, "benchmarks")
from probe_launch import copy_kernel
mode = sys.argv[1]
T = {"global_cold": 512, "relaxed_cold": 256, "warm": 128}[mode]
x = torch.randn(1024, device="cuda"); y = torch.zeros_like(x)
raw = torch._C._cuda_getCurrentRawStream
if mode == "warm":
    ct.launch(raw(0), (1024 // T,), copy_kernel, (x, y, T)); torch.cuda.synchronize(); y.zero_()
libcuda = ctypes.CDLL("libcuda.so.1")
g = torch.cuda.CUDAGraph()
res = {"mode": mode}
try:
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            prev = ctypes.c_int(2)
            if mode == "relaxed_cold":
                libcuda.cuThreadExchangeStreamCaptureMode(ctypes.byref(prev))
            try:
                ct.launch(raw(x.get_device()), (1024 // T,), copy_kernel, (x, y, T))
            finally:
                if mode == "relaxed_cold":
                    libcuda.cuThreadExchangeStreamCaptureMode(ctypes.byref(prev))
    g.replay(); torch.cuda.synchronize()
    res["ok"] = bool(torch.equal(x, y))
except Exception as exc:
    res["ok"] = False; res["error"] = f"{type(exc).__name__}: {exc}"[:400]
print("RESULT" + json.dumps(res))
"""


def capture_cases() -> list:
    out = []
    for mode in ("warm", "global_cold", "relaxed_cold"):
        p = subprocess.run([sys.executable, "-c", CAPTURE_CHILD, mode], capture_output=True, text=True, timeout=300)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")]
        out.append(json.loads(line[-1][6:]) if line else {"mode": mode, "ok": False, "rc": p.returncode,
                                                           "stderr": p.stderr[-800:]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    write_result("probe_launch", {
        "launch_us": launch_costs(a.calls, a.rounds),
        "custom_op_us": custom_op_cost(a.calls, a.rounds),
        "capture": capture_cases(),
    }, a.out)


if __name__ == "__main__":
    sys.exit(main())
