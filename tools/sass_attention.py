#!/usr/bin/env python
"""The SASS of the attention kernel per config of its D=128 space (no GPU): what each config executes.

``probe_power.py`` found the library attention kernel 6-12% behind cuDNN once the H200 sits at its power
cap, with the tuner's pick still the fastest config there. This compiles every config of
:data:`~tiletune.kernels.attention_op.ATTENTION_SPACE` through the launch plan on meta tensors
(B2 H32 S8192 D128, bf16, non-causal), disassembles the cubins with ``cuobjdump -sass`` and prints the
instruction classes that decide the work per tile: tensor-core MMAs (``HGMMA``), the exponentials
(``MUFU``), fp32 math (``FFMA``, ``FMUL``, ``FADD``, ``FMNMX``), conversions (``F2FP``), shared memory
(``STS``, ``LDS``, ``LDSM``, ``STSM``), spills (``LDL``, ``STL``), TMA (``UTMALDG``), barriers (``BAR``,
``SYNCS``), and the kernel's registers per thread.

    python tools/sass_attention.py [--cuda-bin DIR] [--causal]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from compile_check_memory import signature  # noqa: E402
from sass_gemm import cuobjdump_texts, need_cuobjdump, opcode_counts  # noqa: E402

CLASSES = ("HGMMA", "MUFU", "FFMA", "FMUL", "FADD", "FMNMX", "F2FP", "STS", "LDS", "LDSM", "STSM", "LDL", "STL",
           "UTMALDG", "BAR", "SYNCS")


def registers(resources: str) -> int | None:
    """Registers per thread from ``cuobjdump -res-usage`` text."""
    m = re.search(r"REG:(\d+)", resources)
    return int(m.group(1)) if m else None


def compile_config(cfg: Any, causal: bool, cuobjdump: str) -> dict[str, Any]:
    from tiletune.kernels.attention_op import attention_plan

    q, k, v, o = (torch.empty(2, 32, 8192, 128, dtype=torch.bfloat16, device="meta") for _ in range(4))
    with mock.patch.object(torch.Tensor, "get_device", lambda self: 0):
        kernel, grid, kargs = attention_plan(cfg, q, k, v, o, causal, 0.127)
    sass, res = cuobjdump_texts(kernel, signature(kernel, kargs), cfg.hints, cuobjdump, "-sass", "-res-usage")
    return {"config": dict(cfg), "regs": registers(res), **opcode_counts(sass, CLASSES)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuda-bin", default=None, help="folder holding cuobjdump")
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args(argv)
    cuobjdump = need_cuobjdump("sass_attention", args.cuda_bin)
    if cuobjdump is None:
        return 2
    from tiletune.kernels.attention_op import ATTENTION_SPACE

    rows = []
    for cfg in ATTENTION_SPACE.candidates("sm_90"):
        try:
            rows.append(compile_config(cfg, args.causal, cuobjdump))
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is reported, the rest go on
            rows.append({"config": dict(cfg), "error": f"{type(exc).__name__}: {exc}"[:200]})
    label = lambda r: "{BLOCK_M}x{BLOCK_N} w{num_worker_warps} occ{occupancy} lat{KV_LATENCY}".format(**r["config"])  # noqa: E731
    width = max(len(label(r)) for r in rows)
    cols = ("regs",) + CLASSES
    print(f"{'config':{width}s}  " + " ".join(f"{c:>7s}" for c in cols))
    for r in rows:
        if "error" in r:
            print(f"{label(r):{width}s}  {r['error']}")
        else:
            print(f"{label(r):{width}s}  " + " ".join(f"{r[c] if r[c] is not None else '-':>7}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
