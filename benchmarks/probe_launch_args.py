"""Probe: what each kernel argument adds to the host time of one ``ct.launch``.

The same one-block copy kernel is launched (host time per call, batches ended by one
synchronisation, variants interleaved) with:

* ``const1``: two arrays and one ``ct.Constant`` (the tile size);
* ``const7``: two arrays and seven constants (a row kernel's plan passes six or more);
* ``int7``: two arrays, one constant and six runtime ``int`` scalars;
* ``baked7``: two arrays only, the seven constants captured by a closure of a kernel made per
  constant tuple (cuTile reads closure cells as globals at compile time), i.e. the constants moved
  out of the launch.

If ``baked7`` is well below ``const7``, a tuned op could launch a per-config kernel with its constant
arguments baked in and beat a bare launch of the user's kernel; if not, the argument count is not
where the launch time goes.

    python benchmarks/probe_launch_args.py [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import time

import cuda.tile as ct
import torch

from _common import write_result

ConstInt = ct.Constant[int]


def _copy(X, Y, T, A, B, C, D, E, F):
    i = ct.bid(0)
    t = ct.load(X, index=(i,), shape=(T,))
    if A + B + C + D + E + F < 0:  # never true; keeps every constant read
        t = t * 2.0
    ct.store(Y, (i,), t)


@ct.kernel
def copy_const1(X, Y, T: ConstInt):
    _copy(X, Y, T, 1, 2, 3, 4, 5, 6)


@ct.kernel
def copy_const7(X, Y, T: ConstInt, A: ConstInt, B: ConstInt, C: ConstInt, D: ConstInt, E: ConstInt, F: ConstInt):
    _copy(X, Y, T, A, B, C, D, E, F)


@ct.kernel
def copy_int7(X, Y, T: ConstInt, A: int, B: int, C: int, D: int, E: int, F: int):
    i = ct.bid(0)
    t = ct.load(X, index=(i,), shape=(T,))
    if A + B + C + D + E + F < 0:
        t = t * 2.0
    ct.store(Y, (i,), t)


def baked(consts: tuple[int, ...]):
    """``copy_const7`` with its seven constants captured instead of passed."""
    T, A, B, C, D, E, F = consts

    def copy_baked(X, Y):
        _copy(X, Y, T, A, B, C, D, E, F)

    return ct.kernel(copy_baked)


def timed(fns: dict, calls: int, rounds: int) -> dict:
    per = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn(calls)
            torch.cuda.synchronize()
            per[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {name: statistics.median(v) for name, v in per.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    x = torch.randn(1024, device="cuda")
    ys = {name: torch.empty_like(x) for name in ("const1", "const7", "int7", "baked7")}
    consts = (1024, 1, 2, 3, 4, 5, 6)
    kb = baked(consts)
    raw = torch._C._cuda_getCurrentRawStream
    launch = ct.launch
    grid = (1,)

    def make(kernel, y, extra):
        def run(n: int) -> None:
            for _ in range(n):
                launch(raw(0), grid, kernel, (x, y, *extra))
        return run

    fns = {"const1": make(copy_const1, ys["const1"], (1024,)),
           "const7": make(copy_const7, ys["const7"], consts),
           "int7": make(copy_int7, ys["int7"], consts),
           "baked7": make(kb, ys["baked7"], ())}
    for fn in fns.values():
        fn(3)  # compiles
    torch.cuda.synchronize()
    ok = {name: bool(torch.equal(y, x)) for name, y in ys.items()}
    costs = timed(fns, args.calls, args.rounds)
    print({k: round(v, 3) for k, v in costs.items()}, ok)
    write_result("probe_launch_args", {"problem": "ct.launch host time per call of a one-block copy kernel by argument "
                                                  "list, batches of calls, variants interleaved",
                                       "calls": args.calls, "rounds": args.rounds, "launch_us": costs,
                                       "results_ok": ok}, args.out)


if __name__ == "__main__":
    main()
