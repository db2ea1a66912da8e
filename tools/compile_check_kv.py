#!/usr/bin/env python
"""Compile the KV-cache append kernel (``tiletune.kernels.kv_cache_kernels``) to sm_90 cubins, no GPU.

Like ``tools/compile_check_decode.py``: for each variant this builds the
:class:`~cuda.tile.compilation.KernelSignature` ``ct.launch`` would build for the arguments the op's
launch plan passes (C-contiguous, 16-byte aligned tensors) and runs
:func:`~cuda.tile.compilation.export_kernel` (Python -> TileIR -> ``tileiras`` -> cubin).

The op passes the caches and the new rows as integer views of their element size
(:func:`tiletune.kernels.decode_attention_op.prepare_kv_cache_append`): bfloat16 and float16 caches
both run the int16 kernel, float32 caches the int32 one. Variants (:func:`variants`): the cache dtype
as the op sees it, ``B``, ``Hkv``, ``T``, capacity, ``D``, the start tensor's dtype, and whether the
64-bit-index twin is compiled.

Usage::

    python tools/compile_check_kv.py

Exit status 0 if every compile succeeded.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "src"))
sys.path.insert(0, os.path.join(_ROOT, "tools"))

import cuda.tile as ct  # noqa: E402
from cuda.tile.compilation import export_kernel  # noqa: E402

from compile_check_all import FakeArray, signature  # noqa: E402


@dataclass(frozen=True)
class KvVariant:
    """One append problem as the launch plan sees it (``bits``: the integer view dtype)."""

    name: str
    bits: Any
    B: int
    Hkv: int
    T: int
    cap: int
    D: int
    start: Any
    i64: bool = False

    def args(self, chunk: int) -> tuple:
        """Kernel arguments of ``kv_append_kernel`` (FakeArrays and constants)."""
        from tiletune.space.templates import next_power_of_2

        A = FakeArray
        cache = (self.B, self.Hkv, self.cap, self.D)
        rows = (self.B, self.Hkv, self.T, self.D)
        return (A(cache, self.bits), A(cache, self.bits), A(rows, self.bits), A(rows, self.bits),
                A((self.B,), self.start), chunk, next_power_of_2(self.D))


def variants() -> list[KvVariant]:
    i16, i32, i64 = ct.int16, ct.int32, ct.int64
    return [
        KvVariant("bf16_d128_s32", i16, 8, 8, 1, 4096, 128, i32),  # bf16 and fp16 caches: one int16 kernel
        KvVariant("bf16_d64_s32", i16, 4, 1, 3, 1000, 64, i32),
        KvVariant("bf16_d128_s64", i16, 2, 8, 17, 2048, 128, i64),
        KvVariant("bf16_d64_s64", i16, 1, 8, 1, 777, 64, i64),
        KvVariant("bf16_d80_s32", i16, 2, 4, 5, 300, 80, i32),  # D padded to 128
        KvVariant("f32_d128_s32", i32, 2, 8, 3, 512, 128, i32),
        KvVariant("bf16_d128_s32_i64", i16, 8, 8, 1, 4096, 128, i32, True),
        KvVariant("bf16_d128_s64_i64", i16, 8, 8, 1, 4096, 128, i64, True),
    ]


def compile_variant(v: KvVariant, arch: str = "sm_90") -> tuple[bool, float, int, str]:
    """Compile the kernel (or its int64 twin) for ``v`` with the op's config; ``(ok, seconds, bytes, error)``."""
    from tiletune.kernels import decode_attention_op as dop

    cfg = dop.KV_APPEND_SPACE.baseline(arch) or dop.KV_APPEND_SPACE.candidates(arch)[0]
    kernel = dop.kv_append_kernel_i64 if v.i64 else dop.kv_append_kernel
    sig = signature(v.args(int(cfg.CHUNK)))
    if v.i64:  # the twin's arrays are ct.IndexedWithInt64: ct.launch gives them 64-bit index constraints
        params = list(sig.parameters)
        params[:4] = [dataclasses.replace(p, index_dtype=ct.int64) for p in params[:4]]
        sig = dataclasses.replace(sig, parameters=params)
    buf = io.BytesIO()
    t0 = time.perf_counter()
    try:
        export_kernel(kernel, [sig], buf, gpu_code=arch, output_format="cubin")
    except Exception as e:  # noqa: BLE001 - report every failure
        return False, time.perf_counter() - t0, 0, f"{type(e).__name__}: {e}"
    return True, time.perf_counter() - t0, len(buf.getvalue()), ""


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args(argv)
    n_bad = 0
    vs = variants()
    for v in vs:
        ok, dt, size, err = compile_variant(v, args.arch)
        print(f"{v.name:<20} {dt:6.2f} s  {'ok %7.1f KiB' % (size / 1024) if ok else 'FAIL'}", flush=True)
        if not ok:
            n_bad += 1
            print("    " + err[:2000].replace("\n", "\n    "), flush=True)
    print(f"{len(vs) - n_bad}/{len(vs)} compiled")
    return 1 if n_bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
