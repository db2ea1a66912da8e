#!/usr/bin/env python
"""What tiletune's front-end cache adds on top of cuTile's own disk cache (host side, no GPU needed).

A library kernel's first launch in a process gets its cubin one of three ways:

* ``cold``: neither cache holds it: cuTile's front end (Python -> Tile IR bytecode) and ``tileiras``;
* ``disk``: cuTile's disk cache holds it (``TILETUNE_FRONTEND_CACHE=0``): cuTile still imports its
  compiler, asks ``tileiras`` for its version and bytecode level (subprocesses) and lowers the kernel
  to bytecode, whose hash is the disk cache's key;
* ``frontend``: tiletune's front-end cache holds it: keyed by the kernel's code fingerprint, hints,
  signature and toolchain, it skips all of that.

A last row compiles every kernel one after another in one process (what a layer's first forward
pays: cuTile's compiler is imported once, each kernel is lowered).

Each measurement is a fresh process (the first-launch cost a served call pays), compiling the
baseline config of a library space for its main problem through the same path ``ct.launch`` takes
(:class:`tiletune.devices.prefetch_kernel.PrefetchKernel` in cuTile's default context), with its own
fresh ``CUDA_TILE_CACHE_DIR`` per kernel. The sizes say what each cache holds on disk: cuTile's
database holds the cubins, tiletune's folder only records of their keys. The compile runs for sm_90 with or without a GPU (the front end and ``tileiras`` are host
work), so the figures hold for any host; they are the host's, not the H200 machine's.

Usage::

    python benchmarks/frontend_cache.py [--kernels gemm,attention,layernorm,gemm_splitk] [--reps 3]
        [--json benchmarks/results/cpu/frontend_cache.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ("gemm", "attention", "layernorm", "gemm_splitk")
MODES = ("cold", "disk", "frontend")


def child(space: str, arch: str) -> dict[str, Any]:
    """In a fresh process: compile the space's baseline for its main variant as a first launch would."""
    t0 = time.perf_counter()
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT / "tools"))
    from cuda.tile._cext import default_tile_context

    import compile_check_all as cca
    from tiletune.devices.prefetch_kernel import PrefetchKernel

    defs = cca.space_defs()
    ctx = default_tile_context  # the launch path's (its disk cache: CUDA_TILE_CACHE_DIR)
    cc = (int(arch[3:-1]), int(arch[-1]))
    imported = time.perf_counter()
    hits = 0
    size = 0
    for name in space.split(","):  # several: one after another in this process, as a layer's first forward
        sd = defs[name]
        var = next(v for v in sd.variants if v.name == "main")
        cfg = sd.space.baseline(arch) or next(iter(sd.space.configs(arch)))  # the split-K compile space has none
        kernel = PrefetchKernel.with_hints(sd.kernel, sd.hints(cfg))
        cubin, _symbol, _extra, _providers = kernel._compile(cca.signature(var.make_args(cfg)), ctx, cc)
        hits += kernel.frontend_hits
        size += len(cubin)
    from tiletune.devices import compile_pool

    compile_pool.flush(60)  # the disk-cache stores happen after the launch: done before the next process
    done = time.perf_counter()
    return {"import_s": imported - t0, "first_compile_s": done - imported, "cubin_bytes": size,
            "frontend_hits": hits}


def _run(space: str, mode: str, cache: Path, arch: str) -> dict[str, Any]:
    env = dict(os.environ, CUDA_TILE_CACHE_DIR=str(cache), PYTHONDONTWRITEBYTECODE="1")
    env["TILETUNE_FRONTEND_CACHE"] = "0" if mode == "disk" else "1"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, __file__, "--child", space, "--arch", arch], env=env,
                       capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{space} {mode}: {r.stderr[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["process_s"] = wall
    return out


def _sizes(cache: Path) -> dict[str, int]:
    front = cache / "tiletune-frontend"
    return {"cutile_cache_bytes": sum(p.stat().st_size for p in cache.glob("cache.db*")),
            "frontend_cache_bytes": sum(p.stat().st_size for p in front.iterdir()) if front.is_dir() else 0,
            "frontend_cubin_bytes": sum(p.stat().st_size for p in front.glob("*.cubin")) if front.is_dir() else 0}


def measure(kernels: list[str], reps: int, arch: str) -> dict[str, Any]:
    rows = []
    for space in [*kernels, ",".join(kernels)] if len(kernels) > 1 else kernels:  # then all in one process
        samples: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        sizes: dict[str, int] = {}
        for _ in range(reps):
            cache = Path(tempfile.mkdtemp(prefix="fc-bench-"))
            try:
                # cold fills both caches; "disk" reads cuTile's (front-end cache off); then a front-end hit
                for mode in MODES:
                    samples[mode].append(_run(space, mode, cache, arch))
                sizes = _sizes(cache)
            finally:
                shutil.rmtree(cache, ignore_errors=True)
        row: dict[str, Any] = {"kernel": space, "reps": reps, **sizes}
        for mode in MODES:
            row[f"{mode}_first_compile_s"] = statistics.median(s["first_compile_s"] for s in samples[mode])
            row[f"{mode}_process_s"] = statistics.median(s["process_s"] for s in samples[mode])
        row["frontend_hit"] = all(s["frontend_hits"] == len(space.split(",")) for s in samples["frontend"])
        row["disk_minus_frontend_s"] = row["disk_first_compile_s"] - row["frontend_first_compile_s"]
        rows.append(row)
        print(f"{space:12.40s} cold {row['cold_first_compile_s']:.3f} s  disk hit {row['disk_first_compile_s']:.3f} s  "
              f"front-end hit {row['frontend_first_compile_s']:.4f} s  (cubin {sizes.get('frontend_cubin_bytes', 0)} B, "
              f"cuTile cache {sizes.get('cutile_cache_bytes', 0)} B)", flush=True)
    return {"rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.arch)))
        return 0
    kernels = [k for k in a.kernels.split(",") if k]
    bad = [k for k in kernels if k not in KERNELS]
    if bad:
        ap.error(f"unknown kernels {bad}; choose from {', '.join(KERNELS)}")
    if a.reps < 1:
        ap.error("--reps must be at least 1")
    import cuda.tile as ct

    t0 = time.time()
    out = measure(kernels, a.reps, a.arch)
    out = {"benchmark": "frontend_cache", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
           "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()},
           "cuda_tile": ct.__version__, "arch": a.arch, "gpu": None, **out,
           "wall_s": time.time() - t0}
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
