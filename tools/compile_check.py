#!/usr/bin/env python
"""Compile every config of the tiletune matmul and rmsnorm spaces to sm_90 cubins, no GPU needed.

For each config this builds the :class:`~cuda.tile.compilation.KernelSignature` that
``ct.launch`` would build for typical launch arguments, applies the config's hints
(``kernel.replace_hints(**matmul_hints(cfg))`` or ``**rmsnorm_hints(cfg)``) and runs
:func:`~cuda.tile.compilation.export_kernel` (Python -> TileIR bytecode -> ``tileiras`` ->
cubin), printing compile time, cubin size and success.

Typical launch arguments modelled:

* matmul: bfloat16 ``A, B, C`` of 4096 x 4096, C-contiguous, 16-byte aligned, then the
  constants ``TM, TN, TK, GROUP_M``;
* rmsnorm: bfloat16 ``x, y`` of 16384 x 4096 and ``w`` of 4096, a float ``eps``, ``TILE_N``.

cuTile compiles under one process-wide lock, so configs are compiled one after another.

Usage::

    python tools/compile_check.py [--arch sm_90] [--only matmul|rmsnorm] [--opt-level N]

Exit status: 0 if every config compiled, 1 otherwise.  cuTile's disk cache is used; for cold
compile times point ``CUDA_TILE_CACHE_DIR`` at an empty directory.
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import sys
import time
import traceback
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import cuda.tile as ct  # noqa: E402
from cuda.tile.compilation import (  # noqa: E402
    ArrayConstraint,
    CallingConvention,
    KernelSignature,
    ScalarConstraint,
    export_kernel,
)

from tiletune.lab.examples.matmul_kernels import (  # noqa: E402
    MATMUL_GROUP_M,
    MATMUL_SPACE_PARAMS,
    matmul_hints,
    matmul_kernel,
    tile_fits,
)
from tiletune.lab.examples.rmsnorm_kernels import (  # noqa: E402
    RMSNORM_SPACE_PARAMS,
    next_power_of_2,
    rmsnorm_hints,
    rmsnorm_kernel,
)

_DTYPE_BYTES = {ct.bfloat16: 2, ct.float16: 2, ct.float32: 4, ct.float8_e4m3fn: 1, ct.int8: 1, ct.int16: 2, ct.int32: 4,
                ct.int64: 8}


def contiguous_array(dtype, shape) -> ArrayConstraint:
    """The constraint ``ct.launch`` derives for a C-contiguous, 16-byte aligned tensor.

    Mirrors the dispatcher's specialization bits: last stride is the constant 1; strides that
    are a multiple of 16 bytes get ``stride_divisible_by = 16 / itemsize``; dims that are a
    multiple of 16 get ``shape_divisible_by = 16``; base address divisible by 16; non-negative
    strides; no aliasing with other arguments and no internal overlap.
    """
    itemsize = _DTYPE_BYTES[dtype]
    ndim = len(shape)
    strides = [1] * ndim
    for i in range(ndim - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    elems_16b = 16 // itemsize
    return ArrayConstraint(
        dtype, ndim,
        index_dtype=ct.int32,
        stride_lower_bound_incl=0,
        alias_groups=(),
        may_alias_internally=False,
        stride_constant=tuple(1 if s == 1 else None for s in strides),
        stride_divisible_by=tuple(
            1 if s == 1 else (elems_16b if (s * itemsize) % 16 == 0 else 1) for s in strides),
        shape_divisible_by=tuple(16 if d % 16 == 0 else 1 for d in shape),
        base_addr_divisible_by=16,
    )


def space(params: dict, constraint=None) -> list[SimpleNamespace]:
    """Cartesian product of ``params`` as attribute objects, filtered by ``constraint``."""
    keys = list(params)
    cfgs = [SimpleNamespace(**dict(zip(keys, vals)))
            for vals in itertools.product(*params.values())]
    return [c for c in cfgs if constraint is None or constraint(c)]


def matmul_signature(cfg, M=4096, N=4096, K=4096, dtype=ct.bfloat16) -> KernelSignature:
    """Signature of ``matmul_kernel(A, B, C, TM, TN, TK, GROUP_M)`` for row-major inputs."""
    return KernelSignature(
        [contiguous_array(dtype, (M, K)), contiguous_array(dtype, (K, N)),
         contiguous_array(dtype, (M, N)),
         cfg.TM, cfg.TN, cfg.TK, getattr(cfg, "GROUP_M", MATMUL_GROUP_M)],
        CallingConvention.cutile_python_v1())


def rmsnorm_signature(cfg, M=16384, N=4096, dtype=ct.bfloat16) -> KernelSignature:
    """Signature of ``rmsnorm_kernel(X, W, Y, eps, TILE_N)``; ``eps`` is a runtime float32."""
    return KernelSignature(
        [contiguous_array(dtype, (M, N)), contiguous_array(dtype, (N,)),
         contiguous_array(dtype, (M, N)), ScalarConstraint(ct.float32), next_power_of_2(N)],
        CallingConvention.cutile_python_v1())


def compile_one(kernel, cfg, signature, hints: dict, arch: str, opt_level: int | None):
    """Compile one config with its hints; returns ``(ok, seconds, cubin_bytes, error_text)``."""
    hints = dict(hints)
    if opt_level is not None:
        hints["opt_level"] = opt_level
    k = kernel.replace_hints(**hints)
    buf = io.BytesIO()
    t0 = time.perf_counter()
    try:
        export_kernel(k, [signature], buf, gpu_code=arch, output_format="cubin")
    except Exception as e:  # noqa: BLE001 - report every failure, keep going
        dt = time.perf_counter() - t0
        msg = f"{type(e).__name__}: {e}"
        if os.environ.get("COMPILE_CHECK_TRACEBACK"):
            msg += "\n" + traceback.format_exc()
        return False, dt, 0, msg
    return True, time.perf_counter() - t0, len(buf.getvalue()), ""


def run(name: str, kernel, cfgs, make_sig, make_hints, arch: str, opt_level: int | None) -> list:
    print(f"== {name}: {len(cfgs)} configs, {arch}")
    results = []
    t_all = time.perf_counter()
    for cfg in cfgs:
        hints = make_hints(cfg)
        ok, dt, size, err = compile_one(kernel, cfg, make_sig(cfg), hints, arch, opt_level)
        label = " ".join(f"{k}={v}" for k, v in vars(cfg).items())
        if "num_worker_warps" in hints:
            label += f" (num_worker_warps={hints['num_worker_warps']})"
        status = f"ok   {size / 1024:7.1f} KiB" if ok else "FAIL"
        print(f"  {label:<62} {dt:6.2f} s  {status}", flush=True)
        if not ok:
            print("      " + err.replace("\n", "\n      "), flush=True)
        results.append((cfg, ok, dt, err))
    n_ok = sum(r[1] for r in results)
    times = [r[2] for r in results if r[1]]
    mean = sum(times) / len(times) if times else float("nan")
    print(f"== {name}: {n_ok}/{len(results)} compiled, total {time.perf_counter() - t_all:.1f} s, "
          f"mean {mean:.2f} s, max {max(times, default=float('nan')):.2f} s\n")
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90", help="gpu_code for export_kernel (default sm_90)")
    ap.add_argument("--only", choices=["matmul", "rmsnorm"], default=None)
    ap.add_argument("--opt-level", type=int, default=None,
                    help="opt_level hint (default: cuTile's)")
    args = ap.parse_args(argv)

    results = []
    if args.only in (None, "matmul"):
        results += run("matmul bf16 4096^3", matmul_kernel,
                       space(MATMUL_SPACE_PARAMS, tile_fits), matmul_signature, matmul_hints,
                       args.arch, args.opt_level)
    if args.only in (None, "rmsnorm"):
        results += run("rmsnorm bf16 16384x4096", rmsnorm_kernel,
                       space(RMSNORM_SPACE_PARAMS), rmsnorm_signature, rmsnorm_hints,
                       args.arch, args.opt_level)
    failed = [r for r in results if not r[1]]
    print(f"TOTAL: {len(results) - len(failed)}/{len(results)} configs compiled")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
