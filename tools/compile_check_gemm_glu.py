#!/usr/bin/env python
"""Compile every config of the fused gate-up + SwiGLU GEMM space to sm_90 cubins, no GPU needed.

Like ``tools/compile_check_decode.py``: for each config and problem variant this builds the
:class:`~cuda.tile.compilation.KernelSignature` ``ct.launch`` would build for the arguments the op's
launch plan passes (:func:`tiletune.kernels.gemm_glu.prepare_matmul_swiglu` on meta tensors, so the
views of the two weight halves, their strides and the transposed flag are the op's own), applies the
config's hints and runs :func:`~cuda.tile.compilation.export_kernel` (Python -> TileIR -> ``tileiras``
-> cubin). A launch with a size-1 dimension (``M = 1``) is signed with calling convention v2, where
that dimension is a shape constant (see :func:`tiletune.devices.compile_pool.launch_signature`); others with v1.

Variants (Llama-3-8B's MLP, hidden 4096, FFN 14336, plus odd sizes):

* ``m1_nt``: bf16 M=1 (decode, v2), weight as ``W.T`` (``[2N, K]`` row-major);
* ``m16_nn``: bf16 M=16, weight ``[K, 2N]`` row-major;
* ``m2048_nt``: bf16 M=2048, ``W.T``;
* ``odd_fp16``: fp16 M=1000, N=1000, K=1000, ``[K, 2N]`` row-major (edge tiles in every dimension).

Usage::

    python tools/compile_check_gemm_glu.py [--variants main|all] [--workers N] [--resources CUDA_BIN]

Exit status 0 if every compile succeeded.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "src"))
sys.path.insert(0, os.path.join(_ROOT, "tools"))

import cuda.tile as ct  # noqa: E402
from cuda.tile.compilation import CallingConvention, KernelSignature, export_kernel  # noqa: E402

from compile_check_memory import array_constraint, find_tool, resources  # noqa: E402

#: name -> (torch dtype name, M, N, K, weight given as W.T)
VARIANTS: dict[str, tuple[str, int, int, int, bool]] = {
    "m1_nt": ("bfloat16", 1, 14336, 4096, True),
    "m16_nn": ("bfloat16", 16, 14336, 4096, False),
    "m2048_nt": ("bfloat16", 2048, 14336, 4096, True),
    "odd_fp16": ("float16", 1000, 1000, 1000, False),
}
MAIN = ("m1_nt", "m2048_nt")

def signature(args: tuple) -> KernelSignature:
    """The signature ``ct.launch`` would build for the plan's arguments: convention v2 when some array
    has a size-1 dimension (the launcher's rule), v1 otherwise."""
    import torch

    v2 = any(isinstance(a, torch.Tensor) and 1 in tuple(a.shape) for a in args)
    params = [array_constraint(a, ct.int32, v2) if isinstance(a, torch.Tensor) else a for a in args]
    conv = CallingConvention.cutile_python_v2() if v2 else CallingConvention.cutile_python_v1()
    return KernelSignature(params, conv)


def launch_args(variant: str, cfg: dict) -> tuple:
    """The kernel arguments of the op's launch plan for one variant, on meta tensors."""
    import torch

    from tiletune.kernels import gemm_glu as gg

    dt, m, n, k, nt = VARIANTS[variant]
    dtype = getattr(torch, dt)
    x = torch.empty((m, k), dtype=dtype, device="meta")
    w = torch.empty((2 * n, k), dtype=dtype, device="meta").t() if nt else \
        torch.empty((k, 2 * n), dtype=dtype, device="meta")
    prep = gg.prepare_matmul_swiglu(x, w)
    return gg.plan_args(cfg, *prep.args)


def compile_one(variant: str, cfg: dict, arch: str = "sm_90", cuda_bin: str | None = None
                ) -> tuple[bool, float, int, str]:
    """Compile one config for one variant; ``(ok, seconds, cubin bytes, error or resources)``: with
    ``cuda_bin`` (a folder holding ``cuobjdump``) the last item of a success reads the cubin's
    registers, spill stack and shared memory (``tools/compile_check_memory.py``'s reader)."""
    from tiletune.kernels.gemm_glu_kernels import gemm_swiglu_hints, gemm_swiglu_kernel

    kernel = gemm_swiglu_kernel.replace_hints(**gemm_swiglu_hints(cfg))
    buf = io.BytesIO()
    t0 = time.perf_counter()
    try:
        export_kernel(kernel, [signature(launch_args(variant, cfg))], buf, gpu_code=arch, output_format="cubin")
    except Exception as e:  # noqa: BLE001 - report every failure
        return False, time.perf_counter() - t0, 0, f"{type(e).__name__}: {e}"
    dt = time.perf_counter() - t0
    info = ""
    if cuda_bin:
        cuobjdump = find_tool("cuobjdump", cuda_bin)
        if cuobjdump:
            r = resources(buf.getvalue(), cuobjdump, None)
            info = f"reg {r.get('reg')} stack {r.get('stack')} smem {r.get('smem')}"
    return True, dt, len(buf.getvalue()), info


def _job(item: tuple[str, dict, str, str | None]) -> tuple[str, dict, tuple[bool, float, int, str]]:
    vname, cfg, arch, cuda_bin = item
    return vname, cfg, compile_one(vname, cfg, arch, cuda_bin)


def main(argv: list[str] | None = None) -> int:
    from tiletune.kernels.gemm_glu import GEMM_SWIGLU_SPACE

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--variants", choices=["main", "all"], default="all")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--resources", default=None, metavar="CUDA_BIN",
                    help="folder with cuobjdump: print registers / spill stack / shared memory per cubin")
    args = ap.parse_args(argv)
    names = list(VARIANTS) if args.variants == "all" else list(MAIN)
    cfgs = [c.as_dict() for c in GEMM_SWIGLU_SPACE.candidates(args.arch)]
    items = [(v, c, args.arch, args.resources) for v in names for c in cfgs]
    n_bad = spills = 0
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as ex:
        for vname, cfg, (ok, dt, size, err) in ex.map(_job, items):
            label = " ".join(f"{k}={v}" for k, v in cfg.items())
            print(f"{vname:<9} {label:<90} {dt:6.2f} s  {'ok %7.1f KiB' % (size / 1024) if ok else 'FAIL'}"
                  + (f"  {err}" if ok and err else ""), flush=True)
            spills += bool(ok and err and " stack 0 " not in err)
            if not ok:
                n_bad += 1
                print("    " + err[:2000].replace("\n", "\n    "), flush=True)
    print(f"{len(items) - n_bad}/{len(items)} compiled ({len(cfgs)} configs x {len(names)} variants)"
          + (f"; {spills} cubins spill registers" if args.resources else ""))
    return 1 if n_bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
