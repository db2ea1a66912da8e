"""Probe: why the one-launch cross-entropy kernel was withdrawn (wrong loss at one config).

``benchmarks/_ce_one_launch.py`` finishes the mean inside the launch (row terms to scratch, an arrival
counter, the last block sums). On 2026-12-02 the tuner's gate rejected its CHUNK 8192 / occupancy 4
config on a 7 x 32000 bf16 problem. This launches kernels directly (no tuner) many times per config
and counts wrong losses: the one-launch kernel with a 1024- and a 128-wide tile for the final sum,
and the library's per-row kernel (``tiletune.kernels.cross_entropy_op``) whose row losses torch sums.

    python benchmarks/probe_ce_tail.py [--out DIR] [--launches 150]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile

import torch
import torch.nn.functional as F

import cuda.tile as ct

from _common import write_result

HERE = os.path.dirname(os.path.abspath(__file__))


def one_launch_kernel(row_tile: int, tmp: str):
    """The fixture's kernel with ``ROW_TILE`` set (a module of its own: cuTile reads the source)."""
    text = open(os.path.join(HERE, "_ce_one_launch.py")).read().replace("ROW_TILE = 1024", f"ROW_TILE = {row_tile}")
    path = os.path.join(tmp, f"ce_one_launch_{row_tile}.py")
    with open(path, "w") as f:
        f.write(text + "\nK = ct.kernel(cross_entropy_kernel_fn)\n")
    spec = importlib.util.spec_from_file_location(f"ce_one_launch_{row_tile}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.K


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--launches", type=int, default=150)
    args = ap.parse_args()
    from tiletune.kernels.cross_entropy_op import cross_entropy_kernel

    tmp = tempfile.mkdtemp()
    variants = {"one_launch_tile1024": (one_launch_kernel(1024, tmp), True),
                "one_launch_tile128": (one_launch_kernel(128, tmp), True),
                "per_row_then_torch_sum": (cross_entropy_kernel, False)}
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for m, v in ((7, 32000), (64, 50257)):
        x = (torch.randn(m, v, device=dev, generator=g) * 3.0).to(torch.bfloat16)
        t = torch.randint(0, v, (m,), device=dev, generator=g)
        want = float(F.cross_entropy(x.float(), t))
        ph = torch.empty(1, 1, dtype=torch.bfloat16, device=dev)
        for chunk, occ in ((8192, 4), (8192, 1), (4096, 4), (16384, 1)):
            for name, (kern, one) in variants.items():
                hinted = kern.replace_hints(occupancy=occ)
                grid = (min(m, sms * occ),)
                out = torch.empty(1, device=dev)
                scratch = torch.zeros(1024, device=dev)
                sem = torch.zeros(1, dtype=torch.int32, device=dev)
                row_loss = torch.empty(m, device=dev)
                got = []
                stream = torch.cuda.current_stream().cuda_stream
                for _ in range(args.launches):
                    if one:
                        ct.launch(stream, grid, hinted, (x, t, out, ph, scratch, sem, -100, chunk, False,
                                                         v % chunk == 0, 10, False))
                        got.append(out.clone())
                    else:
                        ct.launch(stream, grid, hinted, (x, t, row_loss, ph, -100, chunk, False, v % chunk == 0,
                                                         10, False))
                        got.append(row_loss.sum().reshape(1))
                torch.cuda.synchronize()
                errs = torch.cat(got).double() - want
                bad = int((errs.abs() > 1e-3 * max(1.0, abs(want))).sum())
                row = {"shape": f"{m}x{v}", "chunk": chunk, "occupancy": occ, "variant": name,
                       "launches": args.launches, "wrong": bad, "max_abs_err": float(errs.abs().max()), "want": want,
                       "counter_after": int(sem.item()) if one else None}
                print(row, flush=True)
                rows.append(row)
    write_result("probe_ce_tail", {"problem": "one-launch cross-entropy (benchmarks/_ce_one_launch.py) vs the "
                                              "library's per-row kernel: wrong losses per variant and config",
                                   "rows": rows}, args.out)


if __name__ == "__main__":
    main()
