#!/usr/bin/env python
"""Probe an attention row that trails SDPA: is a faster config outside the library's space?

``tiletune.attention`` tunes :data:`~tiletune.kernels.attention_op.ATTENTION_SPACE` (17 configs, shrunk
from the 330-config :data:`~tiletune.kernels.attention_op.ATTENTION_FULL_SPACE`: no KV latency hint,
occupancy 2 only for score tiles up to 64 x 128, no tile whose registers spill; 16 configs at occupancy 1 until 2026-12-07). For each row given, this tunes the whole 330-config
space through tiletune's harness (compile pool, reference check, cold-L2 timing, no database), marks
the configs that are in the library space, and times the library call, the full space's winner and
SDPA (torch's default backend choice, and cuDNN alone) with ``triton.testing.do_bench`` (L2 flushed,
interleaved). Writes ``<out>/probe_attention.json.gz``.

    python benchmarks/probe_attention.py [--rows B:H:S:D:causal,... | B:H:Hkv:S:D:causal,...] [--out DIR]

A row of six fields is grouped-query attention (``Hkv`` key/value heads; SDPA with ``enable_gqa``).

Default row: ``16:32:1024:64:1`` (issue 14's worst attention row: 0.743x of SDPA on 2026-12-01).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import do_bench_rounds, measurement_rows, ranked_ok, run_probe, tune_once  # noqa: E402

DEFAULT_ROWS = "16:32:1024:64:1"


def parse_rows(text: str) -> list[tuple[int, int, int, int, int, bool]]:
    """``B:H:S:D:causal`` (MHA) or ``B:H:Hkv:S:D:causal`` (GQA) items, comma-separated (causal 0 or 1);
    returns ``(B, H, Hkv, S, D, causal)`` tuples."""
    rows = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        parts = item.split(":")
        if len(parts) not in (5, 6):
            raise ValueError(f"row {item!r}: expected B:H:S:D:causal or B:H:Hkv:S:D:causal")
        try:
            nums = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"row {item!r}: every field is an integer") from None
        if len(nums) == 5:
            nums.insert(2, nums[1])
        b, h, hkv, s, d, c = nums
        if min(b, h, hkv, s) < 1 or h % hkv or d not in (64, 128) or c not in (0, 1):
            raise ValueError(f"row {item!r}: B, H, Hkv, S >= 1, H a multiple of Hkv, D 64 or 128, causal 0 or 1")
        rows.append((b, h, hkv, s, d, bool(c)))
    if not rows:
        raise ValueError("no rows")
    return rows


def probe_row(b: int, h: int, hkv: int, s: int, d: int, causal: bool) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tiletune.kernels as K
    from tiletune import autotune
    from tiletune.kernels.attention_kernels import LOG2E
    from tiletune.kernels.attention_op import ATTENTION_FULL_SPACE, ATTENTION_SPACE, _reference, _tolerance, attention_plan

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    gqa = {"enable_gqa": True} if hkv != h else {}
    o = torch.empty_like(q)
    scale = 1.0 / d ** 0.5
    flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)  # FLOPs of the query heads (GQA reads fewer K/V)
    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    lib = {tuple(sorted(dict(c).items())) for c in ATTENTION_SPACE.candidates(arch)}
    full = autotune(ATTENTION_FULL_SPACE, reference=_reference, writes=["o"], tolerance=_tolerance,
                    name="probe_attention.full", db=False, progress=False)(attention_plan)
    res, wall = tune_once(full, (q, k, v, o, causal, scale * LOG2E))
    rows = measurement_rows(res, lambda us: {"tflops": round(flops / us / 1e6, 1)},
                            lambda cfg: {"in_library": tuple(sorted(cfg.items())) in lib})
    ok = ranked_ok(rows)
    best_lib = next((r for r in ok if r["in_library"]), None)

    def sdpa(backend: Any = None) -> Any:
        if backend is None:
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)

        def run() -> Any:
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)

        return run

    routes = {"library call": lambda: K.attention(q, k, v, causal=causal),
              "full-space winner": lambda: full(q, k, v, o, causal, scale * LOG2E),
              "SDPA default": sdpa(), "SDPA cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    refused = {}
    for name, fn in list(routes.items()):
        try:
            fn()
        except RuntimeError as exc:  # e.g. a backend without enable_gqa on this build
            refused[name] = str(exc).splitlines()[0][:200]
            del routes[name]
    head = do_bench_rounds(routes, warmup=10, rep=60)
    heads = f"H{h}" if hkv == h else f"H{h}/{hkv}"
    return {"shape": f"B{b} {heads} S{s} D{d}" + (" causal" if causal else ""), "flops": flops,
            "full_space_size": len(rows), "wall_s": round(wall, 1), "winner": dict(res.winner),
            "best": ok[0] if ok else None, "best_library": best_lib,
            "head_to_head_us": head, "routes_refused": refused,
            "head_to_head_tflops": {n: round(flops / us / 1e6, 1) for n, us in head.items()}, "rows": rows}


def report(r: dict[str, Any]) -> list[str]:
    b, bl = r["best"], r["best_library"]
    return [f"{r['full_space_size']} configs in {r['wall_s']} s; best {b and b['median_us']} us "
            f"{b and b['config']}; library best {bl and bl['median_us']} us {bl and bl['config']}",
            f"head to head (do_bench, us): {r['head_to_head_us']}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=DEFAULT_ROWS,
                    help="B:H:S:D:causal or B:H:Hkv:S:D:causal, comma-separated (default %(default)s)")
    ap.add_argument("--out", default=None)
    return run_probe("probe_attention", ap, parse_rows, lambda row, args: probe_row(*row), report)


if __name__ == "__main__":
    sys.exit(main())
