#!/usr/bin/env python
"""Compile every config of the decode-attention space (partial and direct kernels, and the combine kernel)
to sm_90 cubins, no GPU.

Like ``tools/compile_check_all.py``: for each config and problem variant this builds the
:class:`~cuda.tile.compilation.KernelSignature` ``ct.launch`` would build for the arguments the op's
launch plan passes (C-contiguous, 16-byte aligned tensors), applies the config's hints and runs
:func:`~cuda.tile.compilation.export_kernel` (Python -> TileIR -> ``tileiras`` -> cubin).

Variants (:func:`variants`), covering every row shape the op builds (``decode_rows``):

* ``llama``: bf16, B=8, 32/8 heads (G=4), 1 token, cache 4096, D=128 (16 MMA rows);
* ``mha64``: fp16, MHA (G=1), 1 token, cache 1000, D=64 (1 head x 16 padded tokens);
* ``gqa_q16``: bf16, G=4, 16 tokens, causal, cache 3000, D=128 (64 rows);
* ``gqa8_q16``: bf16, G=8, 16 tokens, causal, cache 2048, D=128 (128 rows);
* ``g6_q3``: fp16, G=6 (padded to 8), 3 tokens, causal, cache 777, D=64 (32 rows);
* ``g16_q16``: bf16, G=16, 16 tokens, D=64 (two group slices of 8 x 16 rows).

The direct (one-split) kernel is compiled for every variant whose group slices tile the heads
(``G % GB == 0``: all but ``g6_q3``), and the grouped direct kernel (any ``G``) for the others, with the
same configs.

Usage::

    python tools/compile_check_decode.py [--variants main|all] [--workers N]

Exit status 0 if every compile succeeded.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "src"))
sys.path.insert(0, os.path.join(_ROOT, "tools"))

import cuda.tile as ct  # noqa: E402
from cuda.tile.compilation import export_kernel  # noqa: E402

from compile_check_all import FakeArray, signature  # noqa: E402


@dataclass(frozen=True)
class DecodeVariant:
    """One decode problem: shapes and dtype as the op's launch plan sees them."""

    name: str
    dtype: Any
    B: int
    Hkv: int
    G: int
    Sq: int
    cap: int
    D: int
    causal: bool

    def shapes(self):
        from tiletune.kernels.decode_attention_kernels import decode_rows, decode_splits

        gb, qp, ngb = decode_rows(self.G, self.Sq)
        ns = decode_splits(self.B * self.Hkv * ngb, self.cap, 132)
        return gb, qp, ngb, ns

    def partial_args(self, cfg) -> tuple:
        """Kernel arguments of ``decode_partial_kernel`` (FakeArrays and constants)."""
        gb, qp, ngb, ns = self.shapes()
        A, dt, f32 = FakeArray, self.dtype, ct.float32
        rows = self.B * self.Hkv * ns
        return (A((self.B, self.Hkv, self.G, self.Sq, self.D), dt), A((self.B, self.Hkv, self.cap, self.D), dt),
                A((self.B, self.Hkv, self.cap, self.D), dt), A((self.B,), ct.int32),
                A((rows, self.G, self.Sq, self.D), f32), A((rows, self.G, self.Sq), f32), 0.125,
                self.D, gb, qp, int(cfg["BLOCK_N"]), self.causal, int(cfg["KV_LATENCY"]))

    def direct_args(self, cfg) -> tuple:
        """Kernel arguments of ``decode_direct_kernel`` (the partial kernel's, ``O`` for ``PO``/``PL``)."""
        p = self.partial_args(cfg)
        return p[:4] + (FakeArray((self.B, self.Hkv * self.G, self.Sq, self.D), self.dtype),) + p[6:]

    def direct_grouped_args(self, cfg) -> tuple:
        """Kernel arguments of ``decode_direct_grouped_kernel`` (``O5``: the output's ``(B, Hkv, G, Sq, D)``
        view)."""
        p = self.partial_args(cfg)
        return p[:4] + (FakeArray((self.B, self.Hkv, self.G, self.Sq, self.D), self.dtype),) + p[6:]

    def combine_args(self) -> tuple:
        gb, qp, ngb, ns = self.shapes()
        A, f32 = FakeArray, ct.float32
        rows = self.B * self.Hkv * ns
        return (A((rows, self.G, self.Sq, self.D), f32), A((rows, self.G, self.Sq), f32),
                A((self.B, self.Hkv * self.G, self.Sq, self.D), self.dtype), qp, self.D)


def variants() -> list[DecodeVariant]:
    bf16, f16 = ct.bfloat16, ct.float16
    return [
        DecodeVariant("llama", bf16, 8, 8, 4, 1, 4096, 128, False),
        DecodeVariant("mha64", f16, 2, 16, 1, 1, 1000, 64, False),
        DecodeVariant("gqa_q16", bf16, 2, 8, 4, 16, 3000, 128, True),
        DecodeVariant("gqa8_q16", bf16, 1, 4, 8, 16, 2048, 128, True),
        DecodeVariant("g6_q3", f16, 3, 2, 6, 3, 777, 64, True),
        DecodeVariant("g16_q16", bf16, 1, 2, 16, 16, 1024, 64, False),
    ]


def compile_partial(variant: DecodeVariant, cfg: dict, arch: str = "sm_90") -> tuple[bool, float, int, str]:
    """Compile the partial kernel for one config; ``(ok, seconds, cubin bytes, error)``."""
    from tiletune.kernels.decode_attention_kernels import decode_hints, decode_partial_kernel

    return _compile(decode_partial_kernel.replace_hints(**decode_hints(cfg)), variant.partial_args(cfg), arch)


def compile_direct(variant: DecodeVariant, cfg: dict, arch: str = "sm_90") -> tuple[bool, float, int, str]:
    """Compile the direct (one-split) kernel for one config; ``(ok, seconds, cubin bytes, error)``."""
    from tiletune.kernels.decode_attention_kernels import decode_direct_kernel, decode_hints

    return _compile(decode_direct_kernel.replace_hints(**decode_hints(cfg)), variant.direct_args(cfg), arch)


def compile_direct_grouped(variant: DecodeVariant, cfg: dict, arch: str = "sm_90") -> tuple[bool, float, int, str]:
    """Compile the grouped direct kernel (any ``G``) for one config; ``(ok, seconds, cubin bytes, error)``."""
    from tiletune.kernels.decode_attention_kernels import decode_direct_grouped_kernel, decode_hints

    return _compile(decode_direct_grouped_kernel.replace_hints(**decode_hints(cfg)),
                    variant.direct_grouped_args(cfg), arch)


def compile_combine(variant: DecodeVariant, arch: str = "sm_90") -> tuple[bool, float, int, str]:
    from tiletune.kernels.decode_attention_kernels import decode_combine_kernel

    return _compile(decode_combine_kernel, variant.combine_args(), arch)


def _compile(kernel, args, arch) -> tuple[bool, float, int, str]:
    buf = io.BytesIO()
    t0 = time.perf_counter()
    try:
        export_kernel(kernel, [signature(args)], buf, gpu_code=arch, output_format="cubin")
    except Exception as e:  # noqa: BLE001 - report every failure
        return False, time.perf_counter() - t0, 0, f"{type(e).__name__}: {e}"
    return True, time.perf_counter() - t0, len(buf.getvalue()), ""


def _job(item):
    vname, kind, cfg, arch = item
    v = {x.name: x for x in variants()}[vname]
    if cfg is None:
        return vname, kind, "combine", compile_combine(v, arch)
    compile_fn = {"direct": compile_direct, "grouped": compile_direct_grouped, "partial": compile_partial}[kind]
    return vname, kind, cfg, compile_fn(v, cfg, arch)


def _direct_applies(v: DecodeVariant) -> bool:
    from tiletune.kernels.decode_attention_kernels import decode_direct

    return decode_direct(v.G, v.Sq, 1)


def main(argv=None) -> int:
    from tiletune.kernels.decode_attention_op import DECODE_SPACE

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--variants", choices=["main", "all"], default="all")
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    vs = variants() if args.variants == "all" else variants()[:1]
    cfgs = [c.as_dict() for c in DECODE_SPACE.candidates(args.arch)]
    items = ([(v.name, "combine", None, args.arch) for v in vs]
             + [(v.name, "partial", c, args.arch) for v in vs for c in cfgs]
             + [(v.name, "direct", c, args.arch) for v in vs if _direct_applies(v) for c in cfgs]
             + [(v.name, "grouped", c, args.arch) for v in vs if not _direct_applies(v) for c in cfgs])
    n_bad = 0
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as ex:
        for vname, kind, cfg, (ok, dt, size, err) in ex.map(_job, items):
            label = cfg if isinstance(cfg, str) else " ".join(f"{k}={v}" for k, v in cfg.items())
            print(f"{vname:<9} {kind:<8} {label:<60} {dt:6.2f} s  "
                  f"{'ok %7.1f KiB' % (size / 1024) if ok else 'FAIL'}", flush=True)
            if not ok:
                n_bad += 1
                print("    " + err[:2000].replace("\n", "\n    "), flush=True)
    print(f"{len(items) - n_bad}/{len(items)} compiled")
    return 1 if n_bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
