"""What a decode-attention check's reference costs on its first call in a fresh process (GPU).

A warm first forward spends most of a decode row's check in ``decode_direct_reference`` (cProfile, 2026-12-06:
0.17 s of 0.54 s). This probe times, each in its own fresh process (first use of a kernel loads its module, so
variants must not share a process), the first and second call of:

* ``split_direct_reference``: the one-split computation (float32 matmuls, masks, exp2, sums per length);
* ``decode_direct_reference``: the same result through ``scaled_dot_product_attention`` in float32 with a
  boolean mask of the visible keys (one fused kernel per run of sequences).

Before the timed calls each process runs a bf16 ``torch.matmul`` and a few elementwise ops (a first forward's
GEMM checks have started cuBLAS by then). Usage: ``python probe_reference_first_use.py --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SHAPES = [dict(B=38, H=32, Hkv=8, Sq=1, D=128, cap=6975, L=6515),
          dict(B=62, H=28, Hkv=4, Sq=1, D=128, cap=5007, L=4970),
          dict(B=5, H=32, Hkv=8, Sq=1, D=128, cap=3000, L=1777)]


def _one(variant: str, shape: dict) -> dict:
    import torch
    from tiletune.kernels import decode_attention_op as dao

    dev = torch.device("cuda")
    a = torch.randn(64, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    (a @ w.t()).float().abs().amax().item()  # cuBLAS started, as a GEMM check would have
    B, H, Hkv, Sq, D, cap, L = (shape[k] for k in ("B", "H", "Hkv", "Sq", "D", "cap", "L"))
    g = H // Hkv
    q5 = torch.randn(B, Hkv, g, Sq, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, cap, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, cap, D, device=dev, dtype=torch.bfloat16)
    lens = torch.full((B,), L, device=dev, dtype=torch.int32)
    o = torch.empty(B, H, Sq, D, device=dev, dtype=torch.bfloat16)
    scale_log2 = (1.0 / D ** 0.5) * dao.LOG2E if hasattr(dao, "LOG2E") else (1.0 / D ** 0.5) * 1.4426950408889634
    fn = getattr(dao, variant)
    times = []
    outs = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(q5, k, v, lens, o, True, scale_log2)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        outs.append(out)
    ref = dao.split_direct_reference(q5, k, v, lens, o, True, scale_log2)
    diff = float((outs[0].float() - ref.float()).abs().max())
    return {"variant": variant, "shape": shape, "first_s": times[0], "second_s": times[1], "third_s": times[2],
            "max_abs_diff_vs_split": diff}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--variants", default="split_direct_reference,decode_direct_reference")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--shape", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(_one(a.one, SHAPES[a.shape])))
        return
    rows = []
    for si in range(len(SHAPES)):
        for variant in a.variants.split(","):
            p = subprocess.run([sys.executable, __file__, "--one", variant, "--shape", str(si)],
                               capture_output=True, text=True, timeout=120)
            line = (p.stdout.strip().splitlines() or [""])[-1]
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                rows.append({"variant": variant, "shape": SHAPES[si], "error": p.stderr[-600:]})
            print(json.dumps(rows[-1]), flush=True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _common import environment

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "probe_reference_first_use.json"), "w") as f:
        json.dump({"benchmark": "probe_reference_first_use", **environment(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
