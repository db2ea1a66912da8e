#!/usr/bin/env python
"""Probe wide spaces of the memory-bound ops on the GPU, to decide what their library spaces keep.

For a few benchmark problems per op (the shapes of ``kernels_memory.py`` where the library missed
its targets), this tunes the op's own launch plan over a *probe space* much wider than the library's
(more tile sizes, occupancies up to 16 for the gated activations, cross-entropy's worker warps and
chunk widths, more rows per tile for short-row norms) through tiletune's normal harness (compile pool, reference check, cold-L2
timing, no database), and writes every configuration's median time and bandwidth, with the best
config of the probe space and of the library space side by side.

    python benchmarks/probe_memory.py [--out DIR] [--only rope,swiglu] [--deadline S]

Writes ``<out>/probe_memory.json.gz``: per problem, ``rows`` (config, status, median_us, gbps,
``in_library``), the probe's best, the best config that is also in the library space (null where the
probe adds a parameter, e.g. ``num_worker_warps``, that the library space does not have), and the
space sizes; ``probe_memory.partial.json`` is rewritten after every problem. Bandwidth counts the same minimal bytes as ``kernels_memory.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_OUT, failure_fields, measurement_rows, ranked_ok, tune_once, write_result  # noqa: E402

from tiletune.space.spaces import Space  # noqa: E402
from tiletune.space.templates import next_power_of_2  # noqa: E402


def glu_probe() -> Space:
    """TILE 1k-16k x occupancy 1-16 x worker warps: 8-64 elements per thread, <= 65536 per SM."""

    def ok(c: Any) -> bool:
        per_thread = c.TILE // (32 * c.num_worker_warps)
        return 8 <= per_thread <= 64 and c.TILE * c.occupancy <= 65536

    return Space(TILE=[1024, 2048, 4096, 8192, 16384], occupancy=[1, 2, 4, 8, 16], num_worker_warps=[4, 8],
                 LAT=[0], STORE_TMA=[True], constraints={"fit": ok})


def ce_loss_probe() -> Space:
    """CHUNK 2k-32k x occupancy x worker warps x LAT, at most 32768 chunk values per SM."""
    return Space(TM=[1], CHUNK=[2048, 4096, 8192, 16384, 32768], occupancy=[1, 2, 4], num_worker_warps=[4, 8],
                 LAT=[0, 10], STORE_TMA=[False], GRID_FRAC=[1.0],
                 constraints={"fit": lambda c: c.CHUNK * c.occupancy <= 32768})


def ce_grad_probe() -> Space:
    return Space(TM=[1], CHUNK=[4096, 8192, 16384], occupancy=[1, 2], num_worker_warps=[4, 8], LAT=[10],
                 STORE_TMA=[False, True], GRID_FRAC=[0.5, 1.0],
                 constraints={"fit": lambda c: c.CHUNK * c.occupancy <= 32768})


def rows_probe(n_cols: int, streams: int) -> Space:
    """Short rows: 1-4x the library's rows per tile x occupancy x worker warps x LAT x STORE_TMA."""
    from tiletune.space.templates import rows_per_tile

    tm = rows_per_tile(n_cols)
    p = next_power_of_2(n_cols)

    def ok(c: Any) -> bool:
        return c.TM * p * c.occupancy * streams <= 65536 and c.TM * p // (32 * c.num_worker_warps) <= 128

    return Space(TM=[tm, 2 * tm, 4 * tm], CHUNK=[0], occupancy=[1, 2, 4], num_worker_warps=[4, 8], LAT=[0, 10],
                 STORE_TMA=[False, True], constraints={"fit": ok})


#: (op, shape, dtype, probe space builder(prepared) -> Space)
PROBLEMS: list[tuple[str, tuple[int, ...], str, Callable[[Any], Space]]] = [
    ("swiglu", (4096, 2 * 11008), "bf16", lambda prep: glu_probe()),
    ("swiglu", (8192, 2 * 14336), "bf16", lambda prep: glu_probe()),
    ("geglu", (4096, 2 * 4096), "bf16", lambda prep: glu_probe()),
    ("cross_entropy", (4096, 128256), "bf16", lambda prep: ce_loss_probe()),
    ("cross_entropy_grad", (4096, 128256), "bf16", lambda prep: ce_grad_probe()),
    ("layer_norm", (65536, 1024), "bf16", lambda prep: rows_probe(1024, 2)),
    ("softmax", (65536, 1024), "bf16", lambda prep: rows_probe(1024, 1)),
    ("rms_norm", (65536, 1024), "bf16", lambda prep: rows_probe(1024, 1)),
]


def prepared(op: str, prob: dict[str, Any]) -> Any:
    """The library call's :class:`~tiletune.kernels._membound.Prepared` for the benchmark's inputs."""
    from tiletune.kernels.cross_entropy_op import prepare_cross_entropy
    from tiletune.kernels.glu import ACT_GELU_TANH, ACT_SILU, prepare_glu
    from tiletune.kernels.norms import prepare_layer_norm, prepare_rms_norm
    from tiletune.kernels.softmax_op import prepare_softmax

    a = prob["args"]
    if op == "swiglu":
        return prepare_glu(a[0], ACT_SILU)
    if op == "geglu":
        return prepare_glu(a[0], ACT_GELU_TANH)
    if op == "cross_entropy":
        return prepare_cross_entropy(a[0], a[1])
    if op == "cross_entropy_grad":
        return prepare_cross_entropy(a[0], a[1], True)
    if op == "layer_norm":
        return prepare_layer_norm(a[0], a[1], a[2], 1e-5)
    if op == "softmax":
        return prepare_softmax(a[0])
    if op == "rms_norm":
        return prepare_rms_norm(a[0], a[1], 1e-6)
    raise ValueError(op)


def probe_one(op: str, shape: tuple[int, ...], dn: str, make_space: Callable[[Any], Space]) -> dict[str, Any]:
    import torch

    from kernels_memory import DT, build
    from tiletune import autotune

    prob = build(op, shape, getattr(torch, DT[dn]))
    prep = prepared(op, prob)
    fam = prep.family
    space = make_space(prep)
    lib_space = fam.space_for(prep.regime)
    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    lib = {json.dumps(dict(c), sort_keys=True) for c in lib_space.candidates(arch)}
    tuned = autotune(space, reference=fam.reference, writes=list(fam.writes), inplace=list(fam.inplace),
                     tolerance=fam.tolerance, name=fam.name + ".probe", db=False, progress=False)(fam.plan)
    res, wall = tune_once(tuned, prep.args)
    nbytes = prob["bytes"]
    rows = measurement_rows(res, lambda us: {"gbps": round(nbytes / us / 1e3, 1)},
                            lambda cfg: {"in_library": json.dumps(cfg, sort_keys=True) in lib})
    ok = ranked_ok(rows)
    best_lib = next((r for r in ok if r["in_library"]), None)
    out = {"op": op, "shape": list(shape), "dtype": DT[dn], "bytes": prob["bytes"], "probe_size": len(rows),
           "library_size": len(lib), "wall_s": round(wall, 1), "winner": dict(res.winner),
           "best": ok[0] if ok else None, "best_library": best_lib, "rows": rows}
    del prob, prep, tuned
    torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, help="comma-separated ops")
    ap.add_argument("--deadline", type=float, default=None, help="start no new problem after this many seconds")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("probe_memory: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args.out or os.environ.get("BENCH_OUT") or DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    results = []
    partial = out / "probe_memory.partial.json"
    t0 = time.perf_counter()
    for op, shape, dn, make in PROBLEMS:
        if only and op not in only:
            continue
        if args.deadline is not None and time.perf_counter() - t0 > args.deadline:
            results.append({"op": op, "shape": list(shape), "skipped": "deadline"})
            continue
        print(f"[{time.perf_counter() - t0:6.1f} s] {op} {shape} {dn}", flush=True)
        try:
            r = probe_one(op, shape, dn, make)
            b, bl = r["best"], r["best_library"]
            print(f"    {r['probe_size']} configs in {r['wall_s']} s; best {b and b['gbps']} GB/s {b and b['config']}; "
                  f"library best {bl and bl['gbps']} GB/s {bl and bl['config']}", flush=True)
        except Exception as exc:  # one failing problem must not lose the others
            r = {"op": op, "shape": list(shape), **failure_fields(exc)}
        results.append(r)
        partial.write_text(json.dumps({"problems": results}, indent=1, default=str) + "\n")
    path = write_result("probe_memory", {"problems": results, "wall_s": round(time.perf_counter() - t0, 1)}, out,
                        compress=True)
    partial.unlink(missing_ok=True)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
