#!/usr/bin/env python
"""Which attention config is fastest once the GPU sits at its power cap, and does it change the pick?

``sustained_timing.py`` (H200, 2026-12-02) found the long attention rows slowing as the board reached
its power cap (``sw_power_cap``, ~690 W): tiletune's kernel went from 3385 to 4237 us per call over
three rounds at B2 H32 S8192 D128 while SDPA (cuDNN) stayed at 3451-3613 us. The tuner times each
config in short bursts on a cool GPU, so it cannot see a config's draw. This probe, per row:

1. tunes :data:`~tiletune.kernels.attention_op.ATTENTION_SPACE` through tiletune's harness (compile pool,
   reference check, cold-L2 timing, no database): each config's *cool* time, as the tuner sees it;
2. heats the GPU (``--heat-s`` of back-to-back SDPA calls);
3. times every config that passed the check *hot*: back-to-back blocks of about ``--block-ms`` of calls,
   each followed by a block of SDPA's default route, ``--rounds`` rounds in a shuffled order, with the
   SM clock and power draw read through NVML during each block.

Writes ``<out>/probe_power.json``: per config its cool and hot times and draw, the cool and the hot
ranking, and SDPA's hot time.

    python benchmarks/probe_power.py [--rows B:H:Hkv:S:D:causal,...] [--heat-s 3] [--block-ms 200] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_OUT, measurement_rows, ranked_ok, run_rows, tune_once, write_result  # noqa: E402

DEFAULT_ROWS = "2:32:32:8192:128:0,1:32:8:16384:128:0"
def lazy_plan(cfg: Any, q: Any, k: Any, v: Any, o: Any, causal: bool, qk_scale_log2: float) -> Any:
    """The library plan with ``_lazy_attention.lazy_attention_kernel`` (non-causal only)."""
    from tiletune import Launch
    from tiletune.kernels.attention_kernels import attention_grid

    from _lazy_attention import lazy_attention_kernel

    if causal:
        raise ValueError("lazy_attention_kernel is non-causal")
    return Launch(lazy_attention_kernel, attention_grid(cfg, q),
                  (q, k, v, o, qk_scale_log2, q.shape[-1], cfg.BLOCK_M, cfg.BLOCK_N, causal, cfg.KV_LATENCY))


def parse_rows(text: str) -> list[tuple[int, int, int, int, int, bool]]:
    """``B:H:Hkv:S:D:causal`` items, comma-separated."""
    rows = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        parts = item.split(":")
        if len(parts) != 6:
            raise ValueError(f"row {item!r}: expected B:H:Hkv:S:D:causal")
        b, h, hkv, s, d, c = (int(p) for p in parts)
        if min(b, h, hkv, s) < 1 or h % hkv or d not in (64, 128) or c not in (0, 1):
            raise ValueError(f"row {item!r}: B, H, Hkv, S >= 1, H % Hkv == 0, D 64 or 128, causal 0 or 1")
        rows.append((b, h, hkv, s, d, bool(c)))
    if not rows:
        raise ValueError("no rows")
    return rows


def block_calls(cool_us: float, block_ms: float) -> int:
    """Calls per hot block: about ``block_ms`` of back-to-back work, at least 3."""
    return max(3, int(block_ms * 1000.0 / max(cool_us, 1.0)))


def rank(times: dict[str, float]) -> list[str]:
    """Names from fastest to slowest."""
    return sorted(times, key=times.__getitem__)


def hot_block(fn: Callable[[], Any], calls: int, probe: Any) -> dict[str, Any]:
    """One back-to-back block: per-call us, and an NVML reading taken while it runs."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    reading = probe.read() if probe is not None else None
    end.synchronize()
    out: dict[str, Any] = {"us": start.elapsed_time(end) * 1000.0 / calls}
    if reading is not None:
        out.update(sm_mhz=reading.sm_mhz, power_w=reading.power_w, reasons=list(reading.reasons))
    return out


#: the kernels a row can time: the library's attention plan, and the lazy-rescaling experiment
KERNELS = ("library", "lazy")


def probe_row(b: int, h: int, hkv: int, s: int, d: int, causal: bool, heat_s: float, block_ms: float,
              rounds: int, kernels: tuple[str, ...] = ("library",), hot_top: int = 0) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from tiletune import autotune
    from tiletune.devices.bench import nvml_probe
    from tiletune.kernels.attention_kernels import LOG2E
    from tiletune.kernels.attention_op import ATTENTION_SMALL_HEAD_SPACE, ATTENTION_SPACE, _reference, _tolerance
    from tiletune.kernels.attention_op import attention_plan

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    o = torch.empty_like(q)
    scale = 1.0 / d ** 0.5
    args = (q, k, v, o, causal, scale * LOG2E)
    flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
    space = ATTENTION_SMALL_HEAD_SPACE if d <= 64 else ATTENTION_SPACE
    plans = {"library": attention_plan, "lazy": lazy_plan}
    dev = torch.cuda.current_device()
    launchers: dict[str, Callable[[], Any]] = {}
    cool_us: dict[str, float] = {}
    kinds: dict[str, dict[str, Any]] = {}
    cool_rows: list[dict[str, Any]] = []
    for kind in kernels:
        op = autotune(space, reference=_reference, writes=["o"], tolerance=_tolerance, name=f"probe_power.{kind}",
                      db=False, progress=False)(plans[kind])
        res, wall = tune_once(op, args)
        cool = ranked_ok(measurement_rows(res, lambda us: {"tflops": round(flops / us / 1e6, 1)}))
        if not cool:
            raise RuntimeError(f"{kind}: no config passed the check")
        kinds[kind] = {"tune_wall_s": round(wall, 1), "tuner_pick": dict(res.winner), "passed": len(cool),
                       "failed": sum(1 for m in res.measurements if m.status.failed)}
        by_name = {str(dict(m.config)): space.config(**dict(m.config)) for m in res.measurements}
        for r in cool[:hot_top or None]:
            cfg = by_name[str(r["config"])]
            kernel, grid, kargs = op.plan(cfg, *args)
            launch, stream, hinted, d_ = op.backend.launch_parts(cfg, kernel, dev)
            name = f"{kind} {r['config']}"
            launchers[name] = (lambda launch=launch, stream=stream, hinted=hinted, d_=d_, grid=tuple(grid),
                               kargs=tuple(kargs): launch(stream(d_), grid, hinted, kargs))
            cool_us[name] = r["median_us"]
            cool_rows.append({"kernel": kind, "name": name, **r})
    gqa = {"enable_gqa": True} if hkv != h else {}
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)  # noqa: E731
    for fn in (*launchers.values(), sdpa):
        fn()
    torch.cuda.synchronize()
    sdpa_calls = block_calls(min(cool_us.values()), block_ms)

    probe = nvml_probe(dev)
    t_end = time.perf_counter() + heat_s
    while time.perf_counter() < t_end:  # heat: the board reaches its steady draw before any block
        hot_block(sdpa, sdpa_calls, None)
    blocks: dict[str, list[dict[str, Any]]] = {name: [] for name in launchers}
    sdpa_blocks: list[dict[str, Any]] = []
    order = list(launchers)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            blocks[name].append(hot_block(launchers[name], block_calls(cool_us[name], block_ms), probe))
            sdpa_blocks.append(hot_block(sdpa, sdpa_calls, probe))
    if probe is not None:
        probe.close()

    def med(bs: list[dict[str, Any]], field: str) -> float | None:
        vals = [x[field] for x in bs if x.get(field) is not None]
        return round(statistics.median(vals), 2) if vals else None

    hot_us = {name: med(bs, "us") for name, bs in blocks.items()}
    sdpa_hot = med(sdpa_blocks, "us")
    configs = [{"kernel": r["kernel"], "config": r["config"], "cool_us": r["median_us"], "hot_us": hot_us[r["name"]],
                "hot_power_w": med(blocks[r["name"]], "power_w"), "hot_sm_mhz": med(blocks[r["name"]], "sm_mhz"),
                "hot_vs_sdpa": round(sdpa_hot / hot_us[r["name"]], 4) if sdpa_hot else None,
                "blocks": blocks[r["name"]]} for r in cool_rows]
    for kind, info in kinds.items():
        mine = [n for n in launchers if n.startswith(kind + " ")]
        cool_rank = rank({n: cool_us[n] for n in mine})
        hot_rank = rank({n: hot_us[n] for n in mine if hot_us[n] is not None})
        info.update(cool_best=cool_rank[0], hot_best=hot_rank[0], tuner_pick_hot_rank=hot_rank.index(cool_rank[0]) + 1,
                    hot_best_vs_tuner_pick=round(hot_us[cool_rank[0]] / hot_us[hot_rank[0]], 4),
                    best_hot_us=hot_us[hot_rank[0]],
                    best_hot_vs_sdpa=round(sdpa_hot / hot_us[hot_rank[0]], 4) if sdpa_hot else None)
    first = kinds[kernels[0]]
    return {"shape": f"B{b} H{h}/{hkv} S{s} D{d}" + (" causal" if causal else ""), "flops": flops,
            "kernels": kinds, "space_size": first["passed"], "tune_wall_s": first["tune_wall_s"],
            "tuner_pick": first["tuner_pick"], "cool_best": first["cool_best"], "hot_best": first["hot_best"],
            "tuner_pick_hot_rank": first["tuner_pick_hot_rank"], "hot_best_vs_tuner_pick": first["hot_best_vs_tuner_pick"],
            "sdpa_hot_us": sdpa_hot, "sdpa_hot_power_w": med(sdpa_blocks, "power_w"),
            "sdpa_hot_sm_mhz": med(sdpa_blocks, "sm_mhz"), "best_hot_vs_sdpa": first["best_hot_vs_sdpa"],
            "configs": configs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="B:H:Hkv:S:D:causal[,...] (default %(default)s)")
    ap.add_argument("--heat-s", type=float, default=3.0, help="seconds of SDPA before timing (default 3)")
    ap.add_argument("--block-ms", type=float, default=200.0, help="length of a hot block (default 200 ms)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kernels", default="library", help=f"comma-separated, of {', '.join(KERNELS)} (default library)")
    ap.add_argument("--hot-top", type=int, default=0, help="time hot only each kernel's N fastest cool configs (0: all)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    try:
        rows = parse_rows(args.rows)
    except ValueError as exc:
        ap.error(str(exc))
    if args.heat_s < 0 or args.block_ms <= 0 or args.rounds < 1 or args.hot_top < 0:
        ap.error("--heat-s >= 0, --block-ms > 0, --rounds >= 1, --hot-top >= 0")
    kernels = tuple(k.strip() for k in args.kernels.split(",") if k.strip())
    if not kernels or any(k not in KERNELS for k in kernels):
        ap.error(f"--kernels: comma-separated, of {', '.join(KERNELS)}")
    import torch

    if not torch.cuda.is_available():
        print("probe_power: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args.out or os.environ.get("BENCH_OUT") or DEFAULT_OUT)
    def report(r: dict[str, Any]) -> list[str]:
        return [f"{kind}: tuner pick {i['cool_best']} is #{i['tuner_pick_hot_rank']} hot; hot best {i['hot_best']} "
                f"{i['best_hot_us']} us ({i['hot_best_vs_tuner_pick']}x the pick's hot time); best hot vs SDPA "
                f"{i['best_hot_vs_sdpa']} ({i['failed']} configs failed the check)" for kind, i in r["kernels"].items()] + [
            f"SDPA hot {r['sdpa_hot_us']} us {r['sdpa_hot_power_w']} W {r['sdpa_hot_sm_mhz']} MHz"] + [
            f"  {c['kernel']} {c['config']}: cool {c['cool_us']:.1f} hot {c['hot_us']} us {c['hot_power_w']} W "
            f"{c['hot_sm_mhz']} MHz" for c in r["configs"]]

    results, wall = run_rows(rows, lambda row: probe_row(*row, heat_s=args.heat_s, block_ms=args.block_ms,
                                                         rounds=args.rounds, kernels=kernels,
                                                         hot_top=args.hot_top), report)
    write_result("probe_power", {"problems": results, "wall_s": wall}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
