"""Probe: do CTA clusters (cuTile's ``num_ctas`` hint) help the library GEMM where cuBLAS uses them?

``ncu_gemm.json.gz`` (2026-12-02) has cuBLAS (``F.linear``) running 2-CTA clusters at 4096^3 and
1024x14336x4096 and reading 20% less DRAM than the library kernel at 4096^3 (150 vs 186 MB); the
matmul template never tried ``num_ctas``. This launches a few of the template's leading configs with
``num_ctas`` 1 and 2 on those rows, checks each product against the op's reference and tolerance, and
times them interleaved with ``F.linear`` (the tuner's timer: cold L2, no backlog).

    python benchmarks/probe_gemm_clusters.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys

import cuda.tile as ct
import torch
import torch.nn.functional as F

from _common import write_result
from kernels_memory import timed_medians

ROWS = ((4096, 4096, 4096), (1024, 14336, 4096))
#: leading configs of the bf16 template (the 4096^3 winner first)
CONFIGS = (dict(TM=128, TN=256, TK=32), dict(TM=128, TN=256, TK=64), dict(TM=256, TN=128, TK=64))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    from tiletune import Space
    from tiletune.kernels import gemm as G
    from tiletune.devices.measure import ColdL2Timer
    from tiletune.devices.verify import compare_tensors

    timer = ColdL2Timer(torch.cuda.current_device())
    one = torch.ones(1, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    for m, n, k in ROWS:
        x = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        a_arg, ta = G._as_kernel_operand(x)
        b_arg, tb = G._as_kernel_operand(w.t().unsqueeze(0))
        c = torch.empty(1, m, n, device="cuda", dtype=torch.bfloat16)
        call = (a_arg, b_arg, c, one, one, ta, tb, False)
        want, tol = G._reference(*call), G._tolerance(*call)
        fns, checks = {"F.linear": lambda: F.linear(x, w)}, {}
        for base in CONFIGS:
            space = Space(**{p: [v] for p, v in base.items()}, GROUP_M=[8], LAT=[0], occupancy=[1],
                          num_worker_warps=[8], num_ctas=[1, 2])
            for cfg in space.candidates("sm_90"):
                name = f"{cfg.TM}x{cfg.TN}x{cfg.TK} num_ctas={cfg.num_ctas}"
                try:
                    kernel, grid, kargs = G._plan(cfg, *call)
                    hinted = kernel.replace_hints(**cfg.hints)
                    grid, kargs = tuple(grid), tuple(kargs)
                    c.fill_(float("nan"))
                    ct.launch(stream, grid, hinted, kargs)
                    torch.cuda.synchronize()
                    checks[name] = compare_tensors(c, want, tol) or "ok"
                    if checks[name] == "ok":
                        fns[name] = (lambda g=grid, h=hinted, ka=kargs: ct.launch(stream, g, h, ka))
                except Exception as exc:  # noqa: BLE001 - a config that does not compile or launch
                    checks[name] = f"{type(exc).__name__}: {exc}"[:300]
        for f in fns.values():
            timer.time(f, 5)  # warm-up samples, discarded
        med = {nm: round(v, 2) for nm, v in timed_medians(fns, timer, a.rounds, 5).items()}
        row = {"shape": f"{m}x{n}x{k}", "checks": checks, "median_us": med}
        print(row, flush=True)
        rows.append(row)
    write_result("probe_gemm_clusters", {"problem": "library GEMM configs with num_ctas 1 and 2 vs F.linear, bf16, "
                                                    "cold L2, interleaved", "rows": rows}, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
