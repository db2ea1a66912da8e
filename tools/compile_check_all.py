#!/usr/bin/env python
"""Compile every config of the GEMM, attention and LayerNorm spaces to cubins, no GPU needed.

For each space, each config and each problem variant this builds the
:class:`~cuda.tile.compilation.KernelSignature` that ``ct.launch`` would build for the launch
arguments the space's ``*_args`` helper produces (C-contiguous, 16-byte aligned tensors; see
``tools/compile_check.py``), applies the config's cuTile hints and runs
:func:`~cuda.tile.compilation.export_kernel` (Python -> TileIR bytecode -> ``tileiras`` -> cubin).
cuTile compiles under one process-wide lock, so configs are compiled in ``--workers`` processes.

Spaces (each listed baseline first, in the tuner's candidate order):

* ``gemm``: :data:`tiletune.kernels.gemm.GEMM_SPACE` (persistent GEMM, 16-bit inputs);
  variant ``main`` = bf16 4096 x 4096 x 4096, others: fp16 with ``B`` transposed (``x @ W.T``,
  8192 x 4096 x 4096), bf16 with ``A`` transposed and odd sizes (1000 x 1000 x 1000: no
  16-byte aligned rows), a bf16 batch of 8 x 512^3.
* ``gemm_tf32`` / ``gemm_fp8``: ``GEMM_TF32_SPACE`` (fp32 inputs) / ``GEMM_FP8_SPACE`` (e4m3
  with per-tensor scales, ``B`` as ``N x K`` and row-major).
* ``gemm_splitk``: every ``SPLIT_K > 1`` config of the 16-bit split-K spaces
  (:func:`tiletune.kernels.gemm_kernels.splitk_space` with ``K >= 4096``, every ``TM``; the
  ``SPLIT_K == 1`` configs are the plain GEMM's, checked under ``gemm``), on
  :func:`~tiletune.kernels.gemm_kernels.gemm_splitk_kernel` with its workspace and counters; variant
  ``main`` = bf16 16 x 4096 x 14336 with ``B`` as ``N x K`` (Llama-3-8B's down-proj at 16 tokens),
  others: bf16 128 x 4096 x 4096 row-major, fp16 100 x 1000 x 5000 with ``A`` as ``K x M``.
* ``gemm_swap``: every swapped (``SWAP = 1``) config of those spaces, on
  :func:`~tiletune.kernels.gemm_kernels.gemm_swap_kernel`; variant ``main`` = bf16 8 x 4096 x 14336
  (``x @ W``, a decode step's down-proj), others: bf16 64 x 4096 x 4096 with ``B`` as ``N x K``, fp16
  100 x 1000 x 5000 with ``A`` as ``K x M``.
* ``gemm_full`` / ``attention_full`` (only with ``--only``): the 512- and 330-config spaces
  recorded on the H200 (``GEMM_FULL_SPACE``, ``ATTENTION_FULL_SPACE``), main variant.
* ``attention``: :data:`tiletune.kernels.attention_op.ATTENTION_SPACE`;
  variant ``main`` = bf16 B=4, H=16, S=4096, D=128, causal (the recorded problem), others:
  fp16 D=64 non-causal GQA (H=16, Hkv=4, S=1000), bf16 D=128 non-causal Sq=512 / Sk=3000.
* ``layernorm``: the :mod:`tiletune.lab.examples.layernorm_kernels` space;
  variant ``main`` = bf16 16384 x 4096 (the recorded problem), others: bf16 N=3000
  (padding columns masked), fp32 N=8192 (chunked), fp16 N=1000.

Usage::

    python tools/compile_check_all.py                    # main variants, every config
    python tools/compile_check_all.py --variants all     # every variant, every config
    python tools/compile_check_all.py --variants sample  # main: every config; others: every 7th
    python tools/compile_check_all.py --variants others  # only every 7th config of the other variants
    python tools/compile_check_all.py --only gemm --workers 4 --json /tmp/gemm.json

Exit status: 0 if every compile succeeded, 1 otherwise.  Compile times are per config, in one
process, measured around ``export_kernel`` (front end + ``tileiras``); by default the workers use
a fresh, empty cuTile disk cache so the times are cold compiles (``--warm-cache`` uses yours).
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Callable

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "src"))
sys.path.insert(0, os.path.join(_ROOT, "tools"))

import cuda.tile as ct  # noqa: E402
from cuda.tile.compilation import (  # noqa: E402
    CallingConvention,
    KernelSignature,
    ScalarConstraint,
    export_kernel,
)

from compile_check import contiguous_array  # noqa: E402
from tiletune.space.spaces import Space  # noqa: E402

SPACE_NAMES = ("gemm", "gemm_tf32", "gemm_fp8", "gemm_splitk", "gemm_swap", "attention", "layernorm", "gemm_full",
               "attention_full")
#: What ``--only`` defaults to: the library ops' spaces (the two full, recorded spaces on request).
DEFAULT_SPACES = ("gemm", "gemm_tf32", "gemm_fp8", "gemm_splitk", "gemm_swap", "attention", "layernorm")


class FakeArray:
    """A shape + dtype stand-in for a C-contiguous tensor (what the ``*_args`` helpers read)."""

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape = tuple(shape)
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"FakeArray({self.shape}, {self.dtype})"


def signature(args: tuple) -> KernelSignature:
    """The signature ``ct.launch`` would build for ``args`` (FakeArrays, floats, constants)."""
    params = []
    for a in args:
        if isinstance(a, FakeArray):
            params.append(contiguous_array(a.dtype, a.shape))
        elif isinstance(a, float):
            params.append(ScalarConstraint(ct.float32))
        else:  # int / bool constants
            params.append(a)
    return KernelSignature(params, CallingConvention.cutile_python_v1())


@dataclass(frozen=True)
class Variant:
    name: str
    describe: str
    make_args: Callable[[Any], tuple]  # cfg -> kernel args (FakeArrays etc.)


@dataclass(frozen=True)
class SpaceDef:
    name: str
    kernel: Any
    space: Space
    hints: Callable[[Any], dict]
    variants: tuple[Variant, ...]


def space_defs() -> dict[str, SpaceDef]:
    """The three spaces with their problem variants (imports cuTile kernels)."""
    from tiletune.kernels import attention_kernels as at
    from tiletune.kernels import gemm_kernels as gk
    from tiletune.lab.examples import layernorm_kernels as ln
    from tiletune.kernels.attention_op import ATTENTION_FULL_SPACE, ATTENTION_SPACE
    from tiletune.kernels.gemm import GEMM_FP8_SPACE, GEMM_FULL_SPACE, GEMM_SPACE, GEMM_TF32_SPACE

    A = FakeArray
    bf16, f16, f32 = ct.bfloat16, ct.float16, ct.float32

    def gemm_v(m, n, k, dt, ta=False, tb=False, batch=1, scaled=False, out=None):
        def make(cfg):
            a = A((batch, k, m) if ta else (batch, m, k), dt)
            b = A((batch, n, k) if tb else (batch, k, n), dt)
            one = A((1,), f32)
            return gk.gemm_args(cfg, a, b, A((batch, m, n), out or dt), one, one, ta, tb, scaled)
        return make

    def splitk_v(m, n, k, dt, ta=False, tb=False):
        def make(cfg):
            a = A((1, k, m) if ta else (1, m, k), dt)
            b = A((1, n, k) if tb else (1, k, n), dt)
            one = A((1,), f32)
            ws = A((max(gk.SPLIT_K_VALUES), gk.pow2_ceil(m), n), f32)
            sem = A((gk.splitk_sem_count(m, n),), ct.int32)
            return gk.splitk_args(cfg, a, b, A((1, m, n), dt), one, one, ws, sem, ta, tb, False)
        return make

    def att_v(bsz, h, hkv, sq, sk, d, dt, causal):
        def make(cfg):
            q = A((bsz, h, sq, d), dt)
            kv = A((bsz, hkv, sk, d), dt)
            return at.attention_args(cfg, q, kv, A((bsz, hkv, sk, d), dt), A((bsz, h, sq, d), dt),
                                     causal, 1.0 / d ** 0.5)
        return make

    def ln_v(m, n, dt):
        def make(cfg):
            return ln.layernorm_args(cfg, A((m, n), dt), A((n,), dt), A((n,), dt), A((m, n), dt), 1e-5)
        return make

    att_variants = (
        Variant("main", "bf16 B4 H16 S4096 D128 causal", att_v(4, 16, 16, 4096, 4096, 128, bf16, True)),
        Variant("gqa_d64", "fp16 B2 H16 Hkv4 S1000 D64 non-causal", att_v(2, 16, 4, 1000, 1000, 64, f16, False)),
        Variant("cross", "bf16 B1 H8 Sq512 Sk3000 D128 non-causal", att_v(1, 8, 8, 512, 3000, 128, bf16, False)),
    )
    ln_space = Space(**ln.LAYERNORM_SPACE_PARAMS, constraints=ln.LAYERNORM_CONSTRAINTS,
                     baseline=ln.LAYERNORM_BASELINE)
    return {
        "gemm": SpaceDef("gemm", gk.gemm_kernel, GEMM_SPACE, gk.gemm_hints, (
            Variant("main", "bf16 4096x4096x4096", gemm_v(4096, 4096, 4096, bf16)),
            Variant("fp16_nt", "fp16 8192x4096x4096, B given as N x K", gemm_v(8192, 4096, 4096, f16, tb=True)),
            Variant("odd_tn", "bf16 1000x1000x1000, A given as K x M", gemm_v(1000, 1000, 1000, bf16, ta=True)),
            Variant("batched", "bf16 8 x 512x512x512", gemm_v(512, 512, 512, bf16, batch=8)),
        )),
        "gemm_tf32": SpaceDef("gemm_tf32", gk.gemm_kernel, GEMM_TF32_SPACE, gk.gemm_hints, (
            Variant("main", "fp32 (tf32) 2048x2048x2048", gemm_v(2048, 2048, 2048, f32)),
            Variant("nt", "fp32 (tf32) 1000x1000x1000, B given as N x K", gemm_v(1000, 1000, 1000, f32, tb=True)),
        )),
        "gemm_fp8": SpaceDef("gemm_fp8", gk.gemm_kernel, GEMM_FP8_SPACE, gk.gemm_hints, (
            Variant("main", "fp8 e4m3 4096x4096x4096, B given as N x K, bf16 out",
                    gemm_v(4096, 4096, 4096, ct.float8_e4m3fn, tb=True, scaled=True, out=bf16)),
            Variant("nn", "fp8 e4m3 2048x2048x2048, B row-major, fp32 out",
                    gemm_v(2048, 2048, 2048, ct.float8_e4m3fn, scaled=True, out=f32)),
        )),
        "gemm_splitk": SpaceDef("gemm_splitk", gk.gemm_splitk_kernel, _small_m_compile_space(0), gk.gemm_hints, (
            Variant("main", "bf16 16x4096x14336, B given as N x K", splitk_v(16, 4096, 14336, bf16, tb=True)),
            Variant("m128", "bf16 128x4096x4096", splitk_v(128, 4096, 4096, bf16)),
            Variant("odd_tn", "fp16 100x1000x5000, A given as K x M", splitk_v(100, 1000, 5000, f16, ta=True)),
        )),
        "gemm_swap": SpaceDef("gemm_swap", gk.gemm_swap_kernel, _small_m_compile_space(1), gk.gemm_hints, (
            Variant("main", "bf16 8x14336x4096 (x @ W, W as K x N)", gemm_v(8, 14336, 4096, bf16)),
            Variant("nt", "bf16 64x4096x4096, B given as N x K", gemm_v(64, 4096, 4096, bf16, tb=True)),
            Variant("odd_tn", "fp16 100x1000x5000, A given as K x M", gemm_v(100, 1000, 5000, f16, ta=True)),
        )),
        "gemm_full": SpaceDef("gemm_full", gk.gemm_kernel, GEMM_FULL_SPACE, gk.gemm_hints, (
            Variant("main", "bf16 4096x4096x4096", gemm_v(4096, 4096, 4096, bf16)),
        )),
        "attention": SpaceDef("attention", at.attention_kernel, ATTENTION_SPACE, at.attention_hints, att_variants),
        "attention_full": SpaceDef("attention_full", at.attention_kernel, ATTENTION_FULL_SPACE, at.attention_hints,
                                   att_variants),
        "layernorm": SpaceDef("layernorm", ln.layernorm_kernel, ln_space, ln.layernorm_hints, (
            Variant("main", "bf16 16384x4096", ln_v(16384, 4096, bf16)),
            Variant("odd", "bf16 4096x3000", ln_v(4096, 3000, bf16)),
            Variant("fp32_wide", "fp32 4096x8192", ln_v(4096, 8192, f32)),
            Variant("fp16_small", "fp16 8192x1000", ln_v(8192, 1000, f16)),
        )),
    }


def _small_m_compile_space(swap: int) -> Space:
    """The configs of the 16-bit small-M spaces with ``K >= 4096`` (every token tile) on one route:
    ``swap=0``: every ``SPLIT_K > 1`` config (``gemm_splitk_kernel``; ``SPLIT_K == 1`` is the plain GEMM's,
    checked under ``gemm``); ``swap=1``: every swapped config (``gemm_swap_kernel``)."""
    from tiletune.kernels import gemm_kernels as gk

    full = gk.splitk_space(2, 4096, gk.SPLITK_MAX_M, max(gk.SPLIT_K_VALUES))
    params = {n: list(full.values(n)) for n in full.names}
    params["SWAP"] = [swap]
    if not swap:
        params["SPLIT_K"] = [v for v in params["SPLIT_K"] if v > 1]
    return Space(**params, constraints=dict(full._constraints))


# ------------------------------------------------------------------------------------------
# worker side
# ------------------------------------------------------------------------------------------

_DEFS: dict[str, SpaceDef] | None = None
_HINTED: dict[tuple, Any] = {}


def _compile_task(space_name: str, variant_name: str, cfg: dict, arch: str) -> dict:
    global _DEFS
    if _DEFS is None:
        _DEFS = space_defs()
    sd = _DEFS[space_name]
    var = next(v for v in sd.variants if v.name == variant_name)
    hints = sd.hints(cfg)
    key = (space_name, tuple(sorted(hints.items())))
    kernel = _HINTED.get(key)
    if kernel is None:
        kernel = _HINTED[key] = sd.kernel.replace_hints(**hints)
    buf = io.BytesIO()
    t0 = time.perf_counter()
    try:
        export_kernel(kernel, [signature(var.make_args(cfg))], buf, gpu_code=arch, output_format="cubin")
    except Exception as e:  # noqa: BLE001 - report every failure, keep going
        msg = f"{type(e).__name__}: {e}"
        if os.environ.get("COMPILE_CHECK_TRACEBACK"):
            msg += "\n" + traceback.format_exc()
        return dict(ok=False, seconds=time.perf_counter() - t0, size=0, error=msg)
    return dict(ok=True, seconds=time.perf_counter() - t0, size=len(buf.getvalue()), error="")


# ------------------------------------------------------------------------------------------
# driver
# ------------------------------------------------------------------------------------------


def _label(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(DEFAULT_SPACES),
                    help=f"comma-separated spaces of {','.join(SPACE_NAMES)} (default: {','.join(DEFAULT_SPACES)})")
    ap.add_argument("--variants", choices=["main", "sample", "others", "all"], default="main",
                    help="main: the recorded problem only; sample: + every --stride-th config of the "
                         "other variants; others: only that sample of the other variants; all: every "
                         "variant x every config")
    ap.add_argument("--stride", type=int, default=7, help="config stride of --variants sample")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--limit", type=int, default=None, help="at most this many configs per space (testing)")
    ap.add_argument("--where", action="append", default=[], metavar="PARAM=VALUE",
                    help="only configs with this parameter value (repeatable; e.g. --where KV_LATENCY=1)")
    ap.add_argument("--json", default=None, help="write every result to this JSON file")
    ap.add_argument("--quiet", action="store_true", help="print failures and summaries only")
    ap.add_argument("--warm-cache", action="store_true",
                    help="use cuTile's disk cache (default: a fresh empty one, so times are cold compiles)")
    args = ap.parse_args(argv)

    names = [n.strip() for n in args.only.split(",") if n.strip()]
    bad = [n for n in names if n not in SPACE_NAMES]
    if bad:
        ap.error(f"unknown space(s) {bad}; choose from {SPACE_NAMES}")
    defs = space_defs()

    tasks: list[tuple[str, str, dict]] = []
    for n in names:
        sd = defs[n]
        cfgs = [c.as_dict() for c in sd.space.candidates(args.arch)]
        for cond in args.where:
            pname, _, pval = cond.partition("=")
            if pname in sd.space.names:
                cfgs = [c for c in cfgs if str(c[pname]) == pval]
        if args.limit is not None:
            cfgs = cfgs[: args.limit]
        print(f"== {n}: {len(cfgs)} configs (space params: {', '.join(sd.space.names)}); "
              f"variants: {', '.join(f'{v.name} ({v.describe})' for v in sd.variants)}")
        for v in sd.variants:
            if args.variants == "all" or (v.name == "main" and args.variants != "others"):
                sel = cfgs
            elif v.name != "main" and args.variants in ("sample", "others"):
                sel = cfgs[:: max(1, args.stride)]
            else:
                continue
            tasks += [(n, v.name, c) for c in sel]
    print(f"compiling {len(tasks)} kernels for {args.arch} with {args.workers} worker process(es)\n", flush=True)

    cache_tmp = None
    if not args.warm_cache:  # the workers import cuda.tile after this, and read the variable then
        cache_tmp = tempfile.mkdtemp(prefix="tiletune-compile-check-")
        os.environ["CUDA_TILE_CACHE_DIR"] = cache_tmp

    results: list[dict] = []
    t_all = time.perf_counter()
    # spawn, not fork: a forked child can inherit a lock held by one of the parent's threads
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, args.workers), mp_context=ctx) as ex:
        futs = {ex.submit(_compile_task, n, v, c, args.arch): (n, v, c) for n, v, c in tasks}
        for i, fut in enumerate(as_completed(futs), 1):
            n, v, c = futs[fut]
            try:
                r = fut.result()
            except Exception as e:  # noqa: BLE001 - a crashed worker is a failure too
                r = dict(ok=False, seconds=0.0, size=0, error=f"worker crashed: {type(e).__name__}: {e}")
            r.update(space=n, variant=v, config=c)
            results.append(r)
            if not args.quiet or not r["ok"]:
                status = f"ok {r['size'] / 1024:7.1f} KiB" if r["ok"] else "FAIL"
                print(f"[{i:4d}/{len(tasks)}] {n:9s} {v:10s} {_label(c):<88s} {r['seconds']:6.2f} s  {status}",
                      flush=True)
                if not r["ok"]:
                    print("      " + r["error"].replace("\n", "\n      ")[:4000], flush=True)
    wall = time.perf_counter() - t_all
    if cache_tmp is not None:
        shutil.rmtree(cache_tmp, ignore_errors=True)

    print(f"\n== summary ({args.arch}, {args.workers} workers, wall {wall:.1f} s)")
    print(f"{'space':10s} {'variant':11s} {'ok':>9s} {'cpu-s':>8s} {'mean':>6s} {'max':>6s}  {'proj. wall, 16 cores':>20s}")
    any_fail = False
    for n in names:
        for v in defs[n].variants:
            rs = [r for r in results if r["space"] == n and r["variant"] == v.name]
            if not rs:
                continue
            ok = [r for r in rs if r["ok"]]
            secs = [r["seconds"] for r in rs]
            any_fail |= len(ok) != len(rs)
            print(f"{n:10s} {v.name:11s} {len(ok):4d}/{len(rs):<4d} {sum(secs):8.1f} {sum(secs) / len(secs):6.2f} "
                  f"{max(secs):6.2f}  {sum(secs) / 16:17.1f} s")
    n_ok = sum(r["ok"] for r in results)
    print(f"TOTAL: {n_ok}/{len(results)} compiled")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(arch=args.arch, workers=args.workers, wall_s=wall, results=results), f)
        print(f"wrote {args.json}")
    return 1 if any_fail else 0


if __name__ == "__main__":
    sys.exit(main())
