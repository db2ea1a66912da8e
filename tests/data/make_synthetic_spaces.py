"""Generate the synthetic recorded spaces in this folder (CPU only, deterministic).

These are *not* H200 measurements. They stand in for the recorded H200 spaces until those exist,
so the strategies, the search driver and the evaluation can be tested and benchmarked on a CPU.
Each is built from a timing model with the structure real cuTile spaces show, calibrated on the
packaged H200 recording (``tiletune/data/h200_matmul_bf16_4096.json.gz``: ~187 us for the best
bf16 4096^3 matmul):

* ``synthetic_gemm``: the persistent GEMM space of :mod:`tiletune.kernels.gemm_kernels` (tiles,
  TK, GROUP_M, latency hint, occupancy, worker warps, with its three constraints); one narrow
  optimum (big tiles with two consumer warpgroups), strong interactions, ~3% compile failures.
* ``synthetic_attention``: the attention space of :mod:`tiletune.kernels.attention_kernels`
  plus a TMA flag; a few good tile shapes, occupancy and latency interacting.
* ``synthetic_rowwise``: a memory-bound row-wise kernel (RMSNorm-like): a broad plateau of
  near-optimal configs, so random search is already good there (an honest hard case for the
  "1/10 of random" target).

Every config gets a deterministic per-config "ruggedness" factor (lognormal, a few percent) and
10 samples with 1% lognormal noise; compile times grow with the tile size.

Run ``python tests/data/make_synthetic_spaces.py`` to regenerate.
"""

from __future__ import annotations

import itertools
import math
import random
import sys
from pathlib import Path
from typing import Any, Callable

from tiletune.lab.recordings import save_recording
from tiletune.records import DeviceInfo, Measurement, Status, stable_hash

HERE = Path(__file__).resolve().parent
DEVICE = DeviceInfo("synthetic (H200-like model)", "sm_90", 132)
VERSIONS = {"cuda_tile": "synthetic", "tileiras": "synthetic", "driver": "synthetic"}


def _rng(name: str, cfg: dict[str, Any]) -> random.Random:
    return random.Random(int(stable_hash([name, cfg], 16), 16))


def _product(params: dict[str, list[Any]]) -> list[dict[str, Any]]:
    names = list(params)
    return [dict(zip(names, vals)) for vals in itertools.product(*params.values())]


# ------------------------------------------------------------------------------------ GEMM
GEMM_PARAMS = dict(TM=[64, 128, 256], TN=[64, 128, 256], TK=[32, 64, 128], GROUP_M=[8, 16],
                   LAT=[0, 2, 4, 8], occupancy=[1, 2], num_worker_warps=[4, 8])
GEMM_BASELINE = dict(TM=128, TN=128, TK=64, GROUP_M=8, LAT=0, occupancy=1, num_worker_warps=4)


def gemm_valid(c: dict[str, Any]) -> bool:
    return ((c["TM"] + c["TN"]) * c["TK"] <= 24576 and c["TM"] * c["TN"] * c["occupancy"] <= 256 * 128
            and (c["TM"] * c["TN"] < 256 * 128 or c["num_worker_warps"] == 8))


def gemm_time(c: dict[str, Any], r: random.Random) -> float | str:
    tm, tn, tk, lat, occ, w = c["TM"], c["TN"], c["TK"], c["LAT"], c["occupancy"], c["num_worker_warps"]
    eff = {(64, 64): 0.40, (64, 128): 0.61, (128, 64): 0.59, (64, 256): 0.70, (256, 64): 0.68,
           (128, 128): 0.84, (128, 256): 0.97, (256, 128): 0.95}[(tm, tn)]
    area = tm * tn
    if w == 8:
        eff *= 0.86 if area <= 128 * 64 else (0.93 if area == 128 * 128 else 1.0)
    eff *= {32: 0.91, 64: 1.0, 128: 0.96}[tk]
    if occ == 2:
        eff *= 1.07 if area <= 128 * 64 else 1.02
    if c["GROUP_M"] == 16:
        eff *= 0.985 if tm == 256 else 1.005
    eff *= {0: 1.0, 2: 1.01, 4: 1.03 if area >= 128 * 128 else 0.99, 8: 0.93 if area >= 128 * 128 else 1.02}[lat]
    if tk == 32 and lat >= 4:
        eff *= 0.97
    if area == 256 * 128 and tk == 64 and lat == 8:
        return "compile_error: ptxas: too many resources requested (registers)"
    if r.random() < 0.025:
        return "compile_error: tileiras: failed to compile Tile IR program"
    best_us = 2 * 4096**3 / 720e12 * 1e6  # ~191 us at 720 TFLOP/s
    return best_us / eff * r.lognormvariate(0.0, 0.035)


def gemm_compile(c: dict[str, Any], r: random.Random) -> float:
    return (0.5 + 0.9 * c["TM"] * c["TN"] / (256 * 128) + 0.2 * (c["TK"] / 64) + 0.1 * (c["LAT"] > 0)) * r.uniform(0.85, 1.2)


# ------------------------------------------------------------------------------------ attention
ATTN_PARAMS = dict(BLOCK_M=[64, 128, 256], BLOCK_N=[32, 64, 128, 256], KV_LATENCY=[0, 2, 4, 8],
                   occupancy=[1, 2, 4], num_worker_warps=[4, 8], allow_tma=[True, False])
ATTN_BASELINE = dict(BLOCK_M=128, BLOCK_N=64, KV_LATENCY=0, occupancy=1, num_worker_warps=4, allow_tma=True)


def attn_valid(c: dict[str, Any]) -> bool:
    return c["BLOCK_M"] * c["BLOCK_N"] <= 128 * 256


def attn_time(c: dict[str, Any], r: random.Random) -> float | str:
    bm, bn, lat, occ, w, tma = (c["BLOCK_M"], c["BLOCK_N"], c["KV_LATENCY"], c["occupancy"],
                                c["num_worker_warps"], c["allow_tma"])
    eff = {64: 0.62, 128: 0.90, 256: 0.84}[bm] * {32: 0.78, 64: 0.95, 128: 1.0, 256: 0.88}[bn]
    if bm == 256 and w == 4:
        eff *= 0.55  # one warpgroup for 256 rows spills
    if bm == 64 and w == 8:
        eff *= 0.85
    regs = bm * bn * occ
    if regs > 128 * 128 * 2:
        eff *= 0.6  # occupancy the register file cannot hold
    elif occ == 2:
        eff *= 1.06 if bm * bn <= 128 * 64 else 0.98
    elif occ == 4:
        eff *= 1.04 if bm * bn <= 64 * 64 else 0.9
    eff *= {0: 1.0, 2: 1.04 if bn >= 128 else 1.0, 4: 1.02, 8: 0.95}[lat]
    if not tma:
        eff *= 0.9 if bn >= 128 else 0.97
    if bm == 256 and bn == 128 and occ >= 2:
        return "compile_error: out of shared memory"
    if r.random() < 0.02:
        return "launch_error: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
    best_us = 420.0  # a causal bf16 prefill, batch 4 x 32 heads x 4096 tokens x d=128, ~690 TFLOP/s
    return best_us / eff * r.lognormvariate(0.0, 0.03)


def attn_compile(c: dict[str, Any], r: random.Random) -> float:
    return (0.9 + 1.6 * c["BLOCK_M"] * c["BLOCK_N"] / (128 * 256)) * r.uniform(0.85, 1.25)


# ------------------------------------------------------------------------------------ row-wise
ROW_PARAMS = dict(BLOCK=[512, 1024, 2048, 4096, 8192], ROWS=[1, 2, 4, 8], LAT=[0, 2, 4, 8],
                  occupancy=[1, 2, 4, 8], num_worker_warps=[2, 4, 8])
ROW_BASELINE = dict(BLOCK=4096, ROWS=1, LAT=0, occupancy=1, num_worker_warps=4)


def row_valid(c: dict[str, Any]) -> bool:
    return c["BLOCK"] * c["ROWS"] <= 16384 and c["BLOCK"] >= 1024 // c["ROWS"]


def row_time(c: dict[str, Any], r: random.Random) -> float | str:
    block, rows, lat, occ, w = c["BLOCK"], c["ROWS"], c["LAT"], c["occupancy"], c["num_worker_warps"]
    inflight = block * rows * occ * 2  # bytes of a row tile in flight per SM, roughly
    bw = min(1.0, 0.55 + 0.45 * min(inflight / 65536, 1.0))  # enough bytes in flight saturates DRAM
    if inflight > 262144:
        bw *= 0.9  # register pressure
    if block < 4096:
        bw *= 0.97  # a 4096-wide row needs several passes
    bw *= {2: 0.96, 4: 1.0, 8: 0.99}[w]
    bw *= {0: 1.0, 2: 1.005, 4: 1.01, 8: 0.99}[lat]
    if r.random() < 0.01:
        return "compile_error: tileiras: failed to compile Tile IR program"
    best_us = 72.0  # bf16 16384x4096 RMSNorm, ~3.7 TB/s
    return best_us / bw * r.lognormvariate(0.0, 0.015)


def row_compile(c: dict[str, Any], r: random.Random) -> float:
    return (0.3 + 0.1 * math.log2(c["BLOCK"] * c["ROWS"] / 512)) * r.uniform(0.85, 1.2)


SPACES: dict[str, tuple[dict[str, list[Any]], Callable, Callable, Callable, dict[str, Any], Any]] = {
    "synthetic_gemm": (GEMM_PARAMS, gemm_valid, gemm_time, gemm_compile, GEMM_BASELINE,
                       {"op": "gemm", "shape": [4096, 4096, 4096], "dtype": "bfloat16"}),
    "synthetic_attention": (ATTN_PARAMS, attn_valid, attn_time, attn_compile, ATTN_BASELINE,
                            {"op": "attention", "shape": [4, 32, 4096, 128], "dtype": "bfloat16", "causal": True}),
    "synthetic_rowwise": (ROW_PARAMS, row_valid, row_time, row_compile, ROW_BASELINE,
                          {"op": "rms_norm", "shape": [16384, 4096], "dtype": "bfloat16"}),
}


def build(name: str, samples: int = 10) -> list[Measurement]:
    """The measurements of one synthetic space (deterministic)."""
    params, valid, timing, compile_s, baseline, _ = SPACES[name]
    out: list[Measurement] = []
    for cfg in _product(params):
        if not valid(cfg):
            continue
        r = _rng(name, cfg)
        t = timing(cfg, r)
        cs = round(compile_s(cfg, r), 4)
        base = cfg == baseline
        order = 0 if base else len(out) + 1
        if isinstance(t, str):
            kind, reason = t.split(": ", 1)
            out.append(Measurement(cfg, Status(kind), reason, (), cs, order, base))
            continue
        xs = tuple(round(t * r.lognormvariate(0.0, 0.01), 3) for _ in range(samples))
        out.append(Measurement(cfg, Status.OK, "converged", xs, cs, order, base))
    return out


def main(out_dir: Path = HERE) -> list[Path]:
    paths = []
    for name, (params, *_rest, key) in SPACES.items():
        ms = build(name)
        path = save_recording(
            out_dir / f"{name}.json.gz", name=name, key=key, device=DEVICE, versions=VERSIONS,
            measurements=ms, space={"params": params},
            note="SYNTHETIC: generated by tests/data/make_synthetic_spaces.py from a timing model; not a measurement",
        )
        ok = [m for m in ms if not m.status.failed]
        print(f"{path.name}: {len(ms)} configs, {len(ok)} ok, best {min(m.median_us for m in ok):.1f} us, "
              f"{path.stat().st_size / 1024:.0f} KiB")
        paths.append(path)
    return paths


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
