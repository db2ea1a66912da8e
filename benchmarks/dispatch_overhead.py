"""Per-call host cost of a tuned op vs a bare ``ct.launch`` of the same hinted kernel (20k calls each).

A tiny kernel (one block copying 1024 floats) makes the host cost the whole cost. Batches of 2000
calls of each variant alternate 10 times; each batch ends with a synchronisation; the median
per-call time of the batches is reported. Variants: ``bare`` (``ct.launch(raw stream, grid, hinted
kernel, args)``), ``tuned`` (``op(x, y)``: key, lookup, launch), ``tuned_kwargs`` (``op(x, y=y)``),
``bound`` (``op.bind(x, y)()``: the pre-resolved launcher), and a naive wrapper (key tuple +
``torch.cuda.current_stream()`` + ``ct.launch``) for context.

    python benchmarks/dispatch_overhead.py [--out DIR]
Writes dispatch_overhead.json: ``ratio`` = tuned / bare (the call path), ``bound_ratio`` = bound / bare
(target <= 1.0 for the tuned dispatch, stretch 0.8).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import cuda.tile as ct
import torch

import tiletune as tt
from _common import write_result


@ct.kernel
def copy_kernel(X, Y, T: ct.Constant[int]):
    i = ct.bid(0)
    ct.store(Y, (i,), ct.load(X, index=(i,), shape=(T,)))


SPACE = tt.Space(T=[256, 512, 1024], occupancy=[1, 2], baseline=dict(T=1024, occupancy=1))


@tt.autotune(SPACE, reference=lambda x, y: x.clone(), writes=["y"], db=False, progress=False)
def tuned_copy(cfg, x, y):
    return tt.Launch(copy_kernel, ((x.shape[0] + cfg.T - 1) // cfg.T,), (x, y, cfg.T))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    x = torch.randn(1024, device="cuda")
    y = torch.empty_like(x)
    tuned_copy(x, y)  # tunes
    torch.cuda.synchronize()
    cfg = tuned_copy.config_for(x, y)
    kernel = copy_kernel.replace_hints(**cfg.hints)
    grid = ((x.shape[0] + cfg.T - 1) // cfg.T,)
    raw = torch._C._cuda_getCurrentRawStream
    launch = ct.launch
    T = cfg.T

    def bare(n: int) -> None:
        for _ in range(n):
            launch(raw(0), grid, kernel, (x, y, T))

    def tuned(n: int) -> None:
        for _ in range(n):
            tuned_copy(x, y)

    def tuned_kwargs(n: int) -> None:
        for _ in range(n):
            tuned_copy(x, y=y)

    bound_copy = tuned_copy.bind(x, y)

    def bound(n: int) -> None:
        for _ in range(n):
            bound_copy()

    def naive(n: int) -> None:
        for _ in range(n):
            key = (tuple(x.shape), x.dtype, tuple(y.shape), y.dtype)
            _ = key in {}
            launch(torch.cuda.current_stream(), grid, kernel, (x, y, T))

    variants = {"bare": bare, "tuned": tuned, "tuned_kwargs": tuned_kwargs, "bound": bound, "naive": naive}
    per_call: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():
        fn(500)
    torch.cuda.synchronize()
    for _ in range(args.rounds):
        for name, fn in variants.items():
            t = time.perf_counter()
            fn(args.calls)
            torch.cuda.synchronize()
            per_call[name].append((time.perf_counter() - t) / args.calls * 1e6)
    torch.testing.assert_close(y, x)
    med = {k: statistics.median(v) for k, v in per_call.items()}
    write_result("dispatch_overhead", {
        "problem": "1024-float copy kernel, 1 block; calls alternate in batches",
        "calls_per_variant": args.calls * args.rounds,
        "bare_us": med["bare"],
        "tuned_us": med["tuned"],
        "tuned_kwargs_us": med["tuned_kwargs"],
        "bound_us": med["bound"],
        "naive_wrapper_us": med["naive"],
        "ratio": med["tuned"] / med["bare"],
        "kwargs_ratio": med["tuned_kwargs"] / med["bare"],
        "bound_ratio": med["bound"] / med["bare"],
        "naive_ratio": med["naive"] / med["bare"],
        "target_ratio": 1.0,
        "stretch_ratio": 0.8,
        "recipe_replayed": bool(tuned_copy.recipe_keys),
        "batches_us": per_call,
    }, args.out)


if __name__ == "__main__":
    sys.exit(main())
