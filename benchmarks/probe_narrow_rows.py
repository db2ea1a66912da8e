"""Probe (GPU): which stores write past the end of a narrow output (rows of one element, matrix @ vector).

The 2026-12-07 GPU suite found every config of the N = 1 norm spaces writing 1-3 elements past the end of
(7, 1) and (5, 1) outputs, and every GEMM config 4 elements past a (100,) matrix @ vector result. This
launches the library's plans directly on an output with a guard band behind it and reports, per variant,
how many guard elements changed: ``STORE_TMA`` as the config says, forced off, and the output as a strided
view of a padded buffer."""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import cuda.tile as ct

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from tiletune.space.spaces import Config  # noqa: E402
from tiletune.kernels import norms  # noqa: E402

GUARD = 64


def run_norm(m: int, n: int, dtype, store_tma: bool, padded: bool) -> dict:
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    w = torch.randn(n, device="cuda", dtype=dtype)
    if padded:
        row = max(n, 16 // x.element_size())
        buf = torch.full((m * row + GUARD,), 7.0, device="cuda", dtype=dtype)
        y = buf[: m * row].view(m, row)[:, :n]
        guard = buf[m * row:]
    else:
        buf = torch.full((m * n + GUARD,), 7.0, device="cuda", dtype=dtype)
        y = buf[: m * n].view(m, n)
        guard = buf[m * n:]
    cfg = Config.from_dict(dict(TM=256, CHUNK=0, occupancy=2, LAT=0, STORE_TMA=store_tma, GRID_FRAC=1.0,
                                num_worker_warps=4))
    plan = norms.rms_norm_plan(cfg, x, w, y, 1e-6, True)
    kernel = plan.kernel.replace_hints(**cfg.hints) if cfg.hints else plan.kernel
    ct.launch(torch.cuda.current_stream(), plan.grid, kernel, plan.args)
    torch.cuda.synchronize()
    ref = norms.rms_norm_reference(x, w, y, 1e-6, True)
    changed = int((guard != 7.0).sum())
    if padded:
        changed += int((buf[: m * row].view(m, row)[:, n:] != 7.0).sum())
    err = float((y.float() - ref.float()).abs().max())
    return dict(op="rms_norm", m=m, n=n, dtype=str(dtype), store_tma=store_tma, padded=padded,
                guard_changed=changed, max_err=err)


def run_gemm(sa, sb, padded_out: bool) -> dict:
    from tiletune.kernels import gemm as G
    a = torch.randn(sa, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(sb, device="cuda", dtype=torch.bfloat16)
    want = torch.matmul(a, b)
    os.environ["TILETUNE_ON_MISS"] = "default"
    try:
        got = G.matmul(a, b)
        ok = float((got.float() - want.float()).abs().max())
        return dict(op="matmul", sa=list(sa), sb=list(sb), served_err=ok)
    except Exception as e:  # noqa: BLE001
        return dict(op="matmul", sa=list(sa), sb=list(sb), error=f"{type(e).__name__}: {str(e)[:300]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for m, n in ((7, 1), (5, 1), (1, 1), (9, 3), (7, 5), (300, 1)):
            for store_tma in (True, False):
                for padded in (False, True):
                    try:
                        r = run_norm(m, n, dtype, store_tma, padded)
                    except Exception as e:  # noqa: BLE001
                        r = dict(op="rms_norm", m=m, n=n, dtype=str(dtype), store_tma=store_tma, padded=padded,
                                 error=f"{type(e).__name__}: {str(e)[:300]}")
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    for sa, sb in (((1000,), (1000, 64)), ((100, 1000), (1000,)), ((5, 64, 32), (32,))):
        r = run_gemm(sa, sb, False)
        rows.append(r)
        print(json.dumps(r), flush=True)
    with open(os.path.join(args.out, "probe_narrow_rows.json"), "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), f)


if __name__ == "__main__":
    main()
