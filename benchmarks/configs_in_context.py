#!/usr/bin/env python
"""Every config of a library op at one shape, timed as the tuner timed it and as a model runs it.

Why (issue 20, 2026-12-01): in the Qwen2.5-7B decoder layer ``rms_norm_residual`` at 8 x 3584 ran
10.7 us per call where the same op at Llama's 4096 ran 2.8 us; the tuner had picked a config with
``LAT=10`` for 3584 and ``LAT=0`` for 4096. The tuner measures each candidate alone with the L2
flushed; a layer runs the op right after the kernel that wrote its input, which is then hot in L2, and
replays it from a CUDA graph. This benchmark puts the two side by side, config by config:

* ``tuner_us``: the tuning session's median for the config (cold L2, a GPU spin before each sample);
* ``cold_us``: the op pinned to the config (``tt.pin``), replayed from a CUDA graph, L2 flushed before
  each sample (:func:`tiletune.devices.bench`);
* ``warm_us``: the same without the flush (the inputs stay in L2 from the previous sample);
* ``in_context_us``: a graph of the producer (a GEMM writing the op's input) and the op, minus a graph of
  the producer alone, L2 flushed before each sample: the input comes hot from the producer, as in a
  layer.

Per run: the tuner's pick, the fastest config in each column, and how far the pick is from the fastest
in context. Writes ``configs_in_context.json`` (one row per config) under ``--out``::

    python benchmarks/configs_in_context.py --op rms_norm_residual --rows 8 --cols 3584
    python benchmarks/configs_in_context.py --op rms_norm_residual --rows 8 --cols 4096   # Llama's, to compare

The tuning database is a fresh temporary file and tuning tables are off, so the pick is this run's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

#: op -> (module of tiletune.kernels, its library op, width of the input a producer writes: "n" or "2n")
OPS: dict[str, tuple[str, str, str]] = {
    "rms_norm": ("norms", "RMS_NORM", "n"),
    "rms_norm_residual": ("norms", "RMS_NORM_RESIDUAL", "n"),
    "layer_norm": ("norms", "LAYER_NORM", "n"),
    "softmax": ("softmax_op", "SOFTMAX", "n"),
    "swiglu": ("glu", "SWIGLU", "2n"),
}


def op_call(op: str, x: Any, extra: dict[str, Any]) -> Callable[[], Any]:
    """The library call of ``op`` on input ``x`` (and the other operands in ``extra``)."""
    import tiletune.kernels as K

    if op == "rms_norm":
        return lambda: K.rms_norm(x, extra["w"])
    if op == "rms_norm_residual":
        return lambda: K.rms_norm_residual(x, extra["r"], extra["w"])
    if op == "layer_norm":
        return lambda: K.layer_norm(x, extra["w"], extra["b"])
    if op == "softmax":
        return lambda: K.softmax(x)
    if op == "swiglu":
        return lambda: K.swiglu(x)
    raise ValueError(f"unknown op {op!r}; choose one of {', '.join(OPS)}")


def summarize(rows: list[dict[str, Any]], pick: dict[str, Any]) -> dict[str, Any]:
    """The tuner's pick and the fastest config per column; ``pick_vs_best_in_context`` = the pick's
    in-context time over the fastest config's (1.0: the tuner chose what is fastest in a layer)."""
    out: dict[str, Any] = {"tuner_pick": pick}
    for col in ("tuner_us", "cold_us", "warm_us", "in_context_us"):
        timed = [r for r in rows if r.get(col) is not None]
        if timed:
            best = min(timed, key=lambda r: r[col])
            out[f"best_{col[:-3]}"] = {"config": best["config"], "us": best[col]}
    picked = [r for r in rows if r["config"] == pick and r.get("in_context_us") is not None]
    if picked and out.get("best_in_context"):
        out["pick_vs_best_in_context"] = picked[0]["in_context_us"] / out["best_in_context"]["us"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="rms_norm_residual", choices=sorted(OPS))
    ap.add_argument("--rows", type=int, default=8, help="M (tokens)")
    ap.add_argument("--cols", type=int, default=3584, help="N (hidden size; swiglu's output width)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="output folder")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="tiletune-cic-"))
    os.environ["TILETUNE_DB"] = str(tmp / "tuning.db")
    os.environ["TILETUNE_TABLES"] = "0"
    import importlib

    import torch

    import tiletune as tt
    from tiletune.resolve.pins import clear_pins

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import write_result

    module, lib_name, width = OPS[args.op]
    lib = getattr(importlib.import_module(f"tiletune.kernels.{module}"), lib_name)
    dtype = getattr(torch, args.dtype)
    m, n = args.rows, args.cols
    xn = 2 * n if width == "2n" else n
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(m, xn, device=dev, dtype=dtype, generator=g)
    extra = {"w": torch.randn(n, device=dev, dtype=dtype, generator=g),
             "b": torch.randn(n, device=dev, dtype=dtype, generator=g),
             "r": torch.randn(m, n, device=dev, dtype=dtype, generator=g)}
    a = torch.randn(m, 1024, device=dev, dtype=dtype, generator=g) / 32
    p = torch.randn(1024, xn, device=dev, dtype=dtype, generator=g)
    call = op_call(args.op, x, extra)

    def produce() -> None:
        torch.matmul(a, p, out=x)

    def both() -> None:  # the op right after the kernel that writes its input, as in a layer
        produce()
        call()

    produce()
    call()  # tunes this shape (fresh database, no tables)
    torch.cuda.synchronize()
    results = [res for op in lib.ops().values() for res in op.results.values()]
    if not results:
        raise SystemExit(f"{lib.name}: no tuning session ran for {m}x{n}")
    res = results[-1]
    pick = dict(res.winner)
    rows: list[dict[str, Any]] = []
    producer_us = tt.bench(produce, graph=True).median_us
    for meas in res.successes:
        cfg = dict(meas.config)
        clear_pins()
        tt.pin(lib.name, cfg)
        for op in lib.ops().values():
            op.cache_clear()
        call()  # the pin is checked once, outside any capture
        torch.cuda.synchronize()
        row = {"config": cfg, "tuner_us": meas.median_us,
               "cold_us": tt.bench(call, graph=True).median_us,
               "warm_us": tt.bench(call, graph=True, flush_l2=False).median_us}
        row["in_context_us"] = tt.bench(both, graph=True).median_us - producer_us
        rows.append(row)
        print(row, flush=True)
    clear_pins()
    write_result("configs_in_context", {"op": args.op, "shape": [m, n], "dtype": args.dtype,
                                        "producer": f"matmul {m}x1024 @ 1024x{xn}", "producer_us": producer_us,
                                        "rows": rows, **summarize(rows, pick)}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
