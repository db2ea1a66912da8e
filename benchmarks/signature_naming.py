#!/usr/bin/env python
"""What naming a kernel signature costs on the host (no GPU needed): cuTile's ``mangle_kernel_name``, which
demangles every name it makes to check itself, against ``tiletune.devices.frontend_cache.kernel_symbol``, the
same string without that check.

A miss that races configs, and every compile, looks each config up in the compile caches by its launch
signature; ``KernelSignature.from_kernel_args`` names the signature it returns (and the pool asked it for up to
two conventions per config). The signatures timed are the catalogue's (``tools/compile_check_all.py``: every
problem variant of each space, every ``--stride``-th config), named once each way, interleaved in ``--rounds``
rounds; the figures are per name, the median of the rounds.

    python benchmarks/signature_naming.py [--out DIR] [--rounds 5] [--stride 3]

Writes ``signature_naming.json``: ``{"rows": [{"space", "signatures", "mangle_us", "kernel_symbol_us",
"same_names"}]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SPACES = ("gemm", "attention", "layernorm")


def signatures(space: str, stride: int) -> tuple[str, list[Any]]:
    """The kernel's name and the signatures of every ``stride``-th config of every variant of ``space``."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import compile_check_all as cca
    finally:
        sys.path.remove(str(ROOT / "tools"))
    sd = cca.space_defs()[space]
    configs = list(sd.space.configs("sm_90"))[::max(1, stride)]
    return (sd.kernel._annotated_function.pyfunc.__name__,
            [cca.signature(v.make_args(c)) for v in sd.variants for c in configs])


def measure(space: str, rounds: int, stride: int) -> dict[str, Any]:
    from cuda.tile.compilation import mangle_kernel_name

    from tiletune.devices.frontend_cache import kernel_symbol

    name, sigs = signatures(space, stride)
    same = [mangle_kernel_name(name, s) for s in sigs] == [kernel_symbol(name, s) for s in sigs]  # warms both
    public, fast = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for s in sigs:
            mangle_kernel_name(name, s)
        t1 = time.perf_counter()
        for s in sigs:
            kernel_symbol(name, s)
        t2 = time.perf_counter()
        public.append((t1 - t0) / len(sigs) * 1e6)
        fast.append((t2 - t1) / len(sigs) * 1e6)
    return {"space": space, "signatures": len(sigs), "mangle_us": round(statistics.median(public), 1),
            "kernel_symbol_us": round(statistics.median(fast), 1), "same_names": same}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cpu"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stride", type=int, default=3)
    ap.add_argument("--spaces", default=",".join(SPACES))
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.stride < 1:
        ap.error("--rounds and --stride must be >= 1")
    sys.path.insert(0, str(ROOT / "src"))
    import cuda.tile  # noqa: F401

    from importlib.metadata import version

    rows = [measure(s, args.rounds, args.stride) for s in args.spaces.split(",") if s]
    out = {"benchmark": "signature_naming", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "gpu": None, "host": {"cpus": os.cpu_count(), "machine": platform.machine(),
                                 "python": platform.python_version()},
           "versions": {"cuda_tile": version("cuda-tile")}, "rounds": args.rounds, "stride": args.stride,
           "rows": rows}
    path = Path(args.out) / "signature_naming.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(f"{r['space']:10s} {r['signatures']:4d} signatures: mangle_kernel_name {r['mangle_us']} us, "
              f"kernel_symbol {r['kernel_symbol_us']} us, same names: {r['same_names']}")
    print(path)
    return 0 if all(r["same_names"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
