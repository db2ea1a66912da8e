#!/usr/bin/env python
"""How many KV splits should decode attention use? A sweep of the split count (issue 20).

``tiletune.kernels.decode_attention`` splits the KV cache of each (batch entry, kv head, group slice)
row block into ``ns`` splits (:func:`~tiletune.kernels.decode_attention_kernels.decode_splits`; the rule
this sweep replaced aimed at two blocks per SM), runs the partial kernel over ``units * ns`` blocks and
combines the splits. The sweep was written when the decoder layer's profile put our attention 4-13%
behind cuDNN's, with ``ns = 5`` over 64 row blocks (320 blocks: 2.4 waves of 132 SMs). It forces
each split count in turn (the partial kernel tuned for it, as a first call would), times the op from a
CUDA graph of back-to-back calls (GPU time only; the caches dwarf the L2), and records the split
count the current rule picks, beside ``scaled_dot_product_attention`` over the same cache (torch's
default backend choice, ``enable_gqa``).

Usage (writes ``decode_splits.json`` under ``--out``, default ``$OUT`` or ``benchmarks/results/h200``)::

    python benchmarks/decode_splits.py [--deadline-s 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: (B, query heads, kv heads, cache length): Llama-3-8B (32/8) and Qwen2.5-7B (28/4) decode shapes
PROBLEMS = [(8, 32, 8, 8192), (8, 32, 8, 2048), (8, 28, 4, 8192), (1, 32, 8, 32768), (32, 32, 8, 2048),
            (64, 32, 8, 2048), (8, 28, 4, 2048), (64, 28, 4, 2048), (1, 32, 8, 8192)]
SPLITS = [1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32]
HEAD_DIM = 128


def graph_us(call: Any, calls: int = 20, reps: int = 5) -> float:
    """GPU time per call: a CUDA graph of ``calls`` back-to-back calls, replayed ``reps`` times (median)."""
    import torch

    from tiletune.devices.bench import capture_graph

    g, _ = capture_graph(lambda: [call() for _ in range(calls)])
    g.replay()
    torch.cuda.synchronize()
    got = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        got.append(a.elapsed_time(b) * 1000.0 / calls)
    return statistics.median(got)


def measure(bsz: int, h: int, hkv: int, cap: int, splits: list[int]) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    import tiletune.kernels as K
    from tiletune.kernels.fastcall import clear_recipes
    from tiletune.kernels import decode_attention_kernels as dk
    from tiletune.kernels import decode_attention_op as dop

    gen = torch.Generator(device="cuda").manual_seed(bsz * 131 + cap)
    q = torch.randn(bsz, h, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    ck = torch.randn(bsz, hkv, cap, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    cv = torch.randn(bsz, hkv, cap, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    lens = torch.full((bsz,), cap, dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    _, _, ngb = dk.decode_rows(h // hkv, 1)
    units = bsz * hkv * ngb
    row: dict[str, Any] = {"B": bsz, "H": h, "Hkv": hkv, "S": cap, "units": units,
                           "rule_splits": dk.decode_splits(units, cap, sms), "kv_bytes": 2 * ck.numel() * 2}
    want = F.scaled_dot_product_attention(q, ck, cv, enable_gqa=True)
    row["sdpa_us"] = graph_us(lambda: F.scaled_dot_product_attention(q, ck, cv, enable_gqa=True))
    real = dop.decode_splits
    per: dict[str, Any] = {}
    try:
        for ns in splits:
            if ns > -(-cap // dk.GRANULE):
                continue
            dop.decode_splits = lambda units, capacity, sms, _n=ns: _n
            clear_recipes()  # a recipe learnt with another split count would replay it
            t0 = time.perf_counter()
            out = K.decode_attention(q, ck, cv, lens, causal=True)
            torch.cuda.synchronize()
            tune_s = time.perf_counter() - t0
            err = float((out.float() - want.float()).abs().max())
            us = graph_us(lambda: K.decode_attention(q, ck, cv, lens, causal=True))
            per[str(ns)] = {"us": us, "tune_s": tune_s, "max_abs_err": err,
                            "blocks": units * ns, "gbps": row["kv_bytes"] / us / 1e3}
            print(f"  B={bsz} H={h}/{hkv} S={cap} ns={ns}: {us:.2f} us ({per[str(ns)]['gbps']:.0f} GB/s)", flush=True)
    finally:
        dop.decode_splits = real
        clear_recipes()
    row["by_splits"] = per
    if per:
        best = min(per, key=lambda n: per[n]["us"])
        row["best_splits"] = int(best)
        row["best_us"] = per[best]["us"]
        rule = per.get(str(row["rule_splits"]))
        row["rule_us"] = rule["us"] if rule else None
        row["rule_vs_best"] = (row["rule_us"] / row["best_us"]) if rule else None
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or None)
    ap.add_argument("--deadline-s", type=float, default=300.0, help="no new problem after this many seconds")
    args = ap.parse_args(argv)
    from _common import write_result

    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for bsz, h, hkv, cap in PROBLEMS:
        if time.perf_counter() - t0 > args.deadline_s:
            break
        rows.append(measure(bsz, h, hkv, cap, SPLITS))
        write_result("decode_splits", {"problems": len(PROBLEMS), "rows": rows,
                                       "wall_s": time.perf_counter() - t0}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
