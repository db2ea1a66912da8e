#!/usr/bin/env python
"""Which configs of a library op's space compile to the same code (no GPU).

Compiles every sm_90 config of a library space through its launch plan on meta tensors, disassembles each
cubin (``cuobjdump -sass``, which needs ``nvdisasm`` beside it) and groups configs whose instructions are
identical once addresses and the kernel's name are left out: a hint the compiler did not honour (an
occupancy it could not fit) makes a config that only repeats another's measurement. Prints, per config,
its registers, spilled loads and stores (``LDL``, ``STL``) and the group it shares code with.

    python tools/sass_space.py gemm [--m 4096 --n 4096 --k 4096] [--cuda-bin DIR]
    python tools/sass_space.py attention [--causal]

``gemm``: ``tiletune.gemm`` on ``x @ w.t()`` (``nn.Linear``'s weight layout), bf16. ``attention``: heads of
128, B2 H32 S8192, bf16.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path
from typing import Any, Callable
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from compile_check_memory import signature  # noqa: E402
from sass_attention import registers  # noqa: E402
from sass_gemm import cuobjdump_texts, need_cuobjdump, opcode_counts  # noqa: E402


def code_digest(sass: str) -> str:
    """A digest of the instructions of ``cuobjdump -sass`` text: opcodes and operands, without the
    addresses, the encodings and the function's name (which carries the config's constants)."""
    lines = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+([^;]*);", line)
        if m:
            lines.append(re.sub(r"0x[0-9a-f]+", "#", m.group(1)))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]


def gemm_plans(m: int, n: int, k: int) -> tuple[Any, Callable[[Any], Any]]:
    import tiletune.kernels._membound as mb
    import tiletune.kernels.gemm as G

    x = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
    w = torch.empty(n, k, dtype=torch.bfloat16, device="meta")
    one = torch.empty((), dtype=torch.float32, device="meta")
    lib, _, args = G.prepare_matmul(x, w.t(), torch.bfloat16, one, one, False)

    def plan(cfg: Any) -> Any:
        with mock.patch.object(torch.Tensor, "get_device", lambda self: 0), \
                mock.patch.object(mb, "sm_count", lambda dev: 132), mock.patch.object(G, "_sm_count", lambda dev: 132):
            return lib.plan(cfg, *args)

    return G.GEMM_SPACE, plan


def attention_plans(causal: bool) -> tuple[Any, Callable[[Any], Any]]:
    from tiletune.kernels.attention_op import ATTENTION_SPACE, attention_plan

    q, k, v, o = (torch.empty(2, 32, 8192, 128, dtype=torch.bfloat16, device="meta") for _ in range(4))

    def plan(cfg: Any) -> Any:
        with mock.patch.object(torch.Tensor, "get_device", lambda self: 0):
            return attention_plan(cfg, q, k, v, o, causal, 0.127)

    return ATTENTION_SPACE, plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("op", choices=("gemm", "attention"))
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--cuda-bin", default=None, help="folder holding cuobjdump and nvdisasm")
    args = ap.parse_args(argv)
    cuobjdump = need_cuobjdump("sass_space", args.cuda_bin)
    if cuobjdump is None:
        return 2
    space, plan = gemm_plans(args.m, args.n, args.k) if args.op == "gemm" else attention_plans(args.causal)
    rows = []
    for cfg in space.candidates("sm_90"):
        try:
            spec = plan(cfg)
            kernel, kargs = (spec.kernel, spec.args) if hasattr(spec, "kernel") else (spec[0], spec[2])
            sass, res = cuobjdump_texts(kernel, signature(kernel, kargs), cfg.hints, cuobjdump, "-sass", "-res-usage")
            rows.append({"config": dict(cfg), "regs": registers(res), **opcode_counts(sass, ("LDL", "STL")),
                         "code": code_digest(sass)})
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is reported, the rest go on
            rows.append({"config": dict(cfg), "error": f"{type(exc).__name__}: {exc}"[:200]})
    first: dict[str, str] = {}
    label = lambda r: " ".join(f"{k}={v}" for k, v in r["config"].items())  # noqa: E731
    width = max(len(label(r)) for r in rows)
    print(f"{'config':{width}s}  {'regs':>5s} {'LDL':>6s} {'STL':>6s}  same code as")
    for r in rows:
        if "error" in r:
            print(f"{label(r):{width}s}  {r['error']}")
            continue
        twin = first.setdefault(r["code"], label(r))
        print(f"{label(r):{width}s}  {r['regs'] or '-':>5} {r['LDL']:>6} {r['STL']:>6}  {'' if twin == label(r) else twin}")
    dup = sum(1 for r in rows if "code" in r) - len(first)
    print(f"{len(rows)} configs, {len(first)} distinct kernels, {dup} repeating another's code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
