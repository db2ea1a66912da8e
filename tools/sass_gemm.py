#!/usr/bin/env python
"""Why the tf32 GEMM trails cuBLAS: the SASS of the library's GEMM kernel, bf16 against fp32 inputs (no GPU).

Compiles the baseline config of ``tiletune.gemm`` (bf16) and ``tiletune.gemm_tf32`` (fp32 inputs, run
as tf32) for 4096^3 through their launch plans on meta tensors, and two one-tile probe kernels (fp32
tiles given to ``ct.mma`` as they are, and after ``astype(ct.tfloat32)``), disassembles the cubins with
``cuobjdump -sass`` and prints the count of the instructions that tell the data path apart: tensor-core
MMAs (``HGMMA``), scalar fp32 math (``FMUL``, ``FADD``), shared-memory stores and loads (``STS``, ``LDS``,
``LDSM``), spills (``LDL``, ``STL``), TMA loads (``UTMALDG``), barriers and mbarrier waits (``BAR``,
``SYNCS``).

    python tools/sass_gemm.py [--cuda-bin DIR]     # cuobjdump from DIR, $CUDA_HOME/bin or PATH

On cuda-tile 1.7 / tileiras 13.4 (2026-12-02): the tf32 kernel converts every fp32 tile in registers
and writes it back to shared memory before its ``HGMMA.*.TF32`` (96 ``STS`` in the baseline config, none
in bf16's); fp32 tiles without ``astype`` compile to no tensor-core MMA at all (scalar ``FMUL``/``FADD``
with spills); ``ct.bitcast`` to ``tfloat32`` is refused (widths 32 and 19).
"""

from __future__ import annotations

import argparse
import collections
import io
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cuda.tile as ct  # noqa: E402
import torch  # noqa: E402
from cuda.tile.compilation import CallingConvention, KernelSignature, export_kernel  # noqa: E402

from compile_check import contiguous_array  # noqa: E402
from compile_check_memory import find_tool, signature  # noqa: E402

#: instruction classes printed (opcode prefixes before the first '.')
CLASSES = ("HGMMA", "FMUL", "FADD", "STS", "LDS", "LDSM", "LDL", "STL", "UTMALDG", "BAR", "SYNCS")
ConstInt = ct.Constant[int]


def probe_mma_fp32(A, B, C, TM: ConstInt, TN: ConstInt, TK: ConstInt):
    """One output tile of ``A @ B`` with fp32 tiles given to ``ct.mma`` as they are."""
    acc = ct.zeros((TM, TN), dtype=ct.float32)
    for k in range(ct.cdiv(A.shape[1], TK)):
        a = ct.load(A, (ct.bid(0), k), shape=(TM, TK), padding_mode=ct.PaddingMode.ZERO)
        b = ct.load(B, (k, ct.bid(1)), shape=(TK, TN), padding_mode=ct.PaddingMode.ZERO)
        acc = ct.mma(a, b, acc)
    ct.store(C, (ct.bid(0), ct.bid(1)), acc)


def probe_mma_tf32(A, B, C, TM: ConstInt, TN: ConstInt, TK: ConstInt):
    """The same tile with both operands converted by ``astype(ct.tfloat32)`` (the library's way)."""
    acc = ct.zeros((TM, TN), dtype=ct.float32)
    for k in range(ct.cdiv(A.shape[1], TK)):
        a = ct.load(A, (ct.bid(0), k), shape=(TM, TK), padding_mode=ct.PaddingMode.ZERO)
        b = ct.load(B, (k, ct.bid(1)), shape=(TK, TN), padding_mode=ct.PaddingMode.ZERO)
        acc = ct.mma(a.astype(ct.tfloat32), b.astype(ct.tfloat32), acc)
    ct.store(C, (ct.bid(0), ct.bid(1)), acc)


def opcode_counts(sass: str, classes: tuple[str, ...] = CLASSES) -> dict[str, int]:
    """Counts of the ``classes`` opcodes (the mnemonic before its first '.') in ``cuobjdump -sass`` text
    (predicated ones included)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z0-9_]+)", line)
        if m and m.group(1) in classes:
            counts[m.group(1)] += 1
    return {c: counts.get(c, 0) for c in classes}


def cuobjdump_texts(kernel: Any, sig: KernelSignature, hints: dict[str, Any], cuobjdump: str,
                    *options: str) -> list[str]:
    """Compile ``kernel`` for sm_90 once and return ``cuobjdump OPTION cubin``'s output per option."""
    buf = io.BytesIO()
    export_kernel(kernel.replace_hints(**hints) if hints else kernel, [sig], buf, gpu_code="sm_90",
                  output_format="cubin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(buf.getvalue())
        f.flush()
        return [subprocess.run([cuobjdump, opt, f.name], capture_output=True, text=True, check=True).stdout
                for opt in options]


def disassemble(kernel: Any, sig: KernelSignature, hints: dict[str, Any], cuobjdump: str) -> dict[str, int]:
    return opcode_counts(cuobjdump_texts(kernel, sig, hints, cuobjdump, "-sass")[0])


def library_gemm(op_name: str, dtype: Any, n: int, cuobjdump: str) -> tuple[str, dict[str, int]]:
    import tiletune.kernels._membound as mb
    import tiletune.kernels.gemm as G

    lib = getattr(G, op_name)
    a, b = (torch.empty(1, n, n, dtype=dtype, device="meta") for _ in range(2))
    c = torch.empty(1, n, n, dtype=dtype, device="meta")
    one = torch.empty(1, dtype=torch.float32, device="meta")
    cfg = lib.space_for(None).baseline("sm_90")
    with mock.patch.object(torch.Tensor, "get_device", lambda self: 0), \
            mock.patch.object(mb, "sm_count", lambda dev: 132), mock.patch.object(G, "_sm_count", lambda dev: 132):
        spec = lib.plan(cfg, a, b, c, one, one, False, False, False)
    return str(dict(cfg)), disassemble(spec.kernel, signature(spec.kernel, spec.args), cfg.hints, cuobjdump)


def need_cuobjdump(tool: str, cuda_bin: str | None) -> str | None:
    """``cuobjdump``'s path (``--cuda-bin``, ``$CUDA_HOME/bin`` or PATH), or None after one line on stderr."""
    found = find_tool("cuobjdump", cuda_bin)
    if found is None:
        print(f"{tool}: cuobjdump not found (--cuda-bin DIR, $CUDA_HOME/bin or PATH)", file=sys.stderr)
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuda-bin", default=None, help="folder holding cuobjdump")
    args = ap.parse_args(argv)
    cuobjdump = need_cuobjdump("sass_gemm", args.cuda_bin)
    if cuobjdump is None:
        return 2
    rows = []
    for name, op, dtype in (("bf16 GEMM", "GEMM", torch.bfloat16), ("tf32 GEMM", "GEMM_TF32", torch.float32)):
        cfg, counts = library_gemm(op, dtype, 4096, cuobjdump)
        rows.append((f"{name} 4096^3 {cfg}", counts))
    sig = KernelSignature([contiguous_array(ct.float32, (4096, 4096))] * 3 + [128, 128, 32],
                          CallingConvention.cutile_python_v1())
    for name, fn in (("probe: fp32 tiles to ct.mma", probe_mma_fp32), ("probe: astype(tfloat32)", probe_mma_tf32)):
        rows.append((name, disassemble(ct.kernel(fn), sig, {"num_worker_warps": 8}, cuobjdump)))
    width = max(len(r[0]) for r in rows)
    print(f"{'kernel':{width}s}  " + "  ".join(f"{c:>7s}" for c in CLASSES))
    for label, counts in rows:
        print(f"{label:{width}s}  " + "  ".join(f"{counts[c]:7d}" for c in CLASSES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
