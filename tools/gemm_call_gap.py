#!/usr/bin/env python
"""Why is a public ``tiletune.kernels.matmul`` call slower than the winner the tuner measured?

For a few GEMM problems: tune through the public call (fresh database, isolated worker as by
default), record the tuned-op launch the public call makes, then time, interleaved and with a cold
L2, (1) the public call, (2) a bare ``ct.launch`` of the winning config (the op's own launch plan,
hinted kernel, the same arguments), (3) ``torch.matmul``; each with three timers: the tuner's own
(:class:`~tiletune.devices.measure.ColdL2Timer` as the backend builds it: no GPU backlog unless
``TILETUNE_TIMER_BACKLOG_US`` says so), a short (100 us) and a long (2 ms) backlog before the start
event. NVML's SM clock and power are read after each timer's block. The same op is then tuned again in
this process (``isolation="none"``, no database), to separate the worker's measurement from the timer.

Reading it: if (1) only catches up with (2) under the long backlog, host dispatch cost leaks into the
events; if (1) stays slower than (2), the call launches something else than the tuned winner; if (2)
under the tuner's timer matches the tuner's median but not under the backlog timers, the gap is the
timing condition, not the call.

    python tools/gemm_call_gap.py [--out DIR] [--problems 1x4096x4096x4096,...]   (writes gemm_call_gap.json)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

PROBLEMS = [(1, 128, 14336, 4096), (1, 1024, 4096, 4096), (16, 1024, 1024, 1024), (1, 4096, 4096, 4096)]


def parse_problems(text: str | None) -> list[tuple[int, int, int, int]]:
    """``"BxMxNxK,..."`` (or ``"MxNxK"``, batch 1) -> problems; the default list when empty."""
    if not text:
        return list(PROBLEMS)
    out = []
    for item in text.split(","):
        dims = [int(v) for v in item.lower().split("x")]
        if len(dims) == 3:
            dims = [1, *dims]
        if len(dims) != 4 or min(dims) < 1:
            raise SystemExit(f"--problems: {item!r} is not BxMxNxK or MxNxK with positive sizes")
        out.append(tuple(dims))
    return out


def tuning_result(op, key):
    """The tuning session's result for ``key`` (None: not tuned in this process, e.g. a database hit)."""
    return op.results.get(key)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--problems", default=None, help="comma-separated BxMxNxK (default: the built-in four)")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    problems = parse_problems(args.problems)
    import cuda.tile as ct
    import torch

    import tiletune as tt
    from tiletune import settings
    from tiletune.op import tuned_op as dispatch
    from tiletune.devices.bench import nvml_probe
    from tiletune.kernels import gemm as gm
    from tiletune.devices.measure import ColdL2Timer

    os.environ.setdefault("TILETUNE_DB", str(Path(tempfile.mkdtemp()) / "t.db"))
    os.environ.setdefault("TILETUNE_TABLES", "0")
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.cuda.current_device()
    timers = {"tuner": ColdL2Timer(dev, backlog_us=settings.timer_backlog_us()),
              "backlog_100us": ColdL2Timer(dev, backlog_us=100), "backlog_2ms": ColdL2Timer(dev, backlog_us=2000)}
    probe = nvml_probe(dev)
    rows = []
    for batch, m, n, k in problems:
        g = torch.Generator(device="cuda").manual_seed(0)
        lead = (batch,) if batch > 1 else ()
        a = torch.randn(*lead, m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(*lead, k, n, device="cuda", dtype=torch.bfloat16, generator=g)
        t0 = time.perf_counter()
        gm.matmul(a, b)
        torch.cuda.synchronize()
        tune_s = time.perf_counter() - t0
        _, rec = dispatch.record_launches(gm.matmul, a, b)  # the tuned-op launch the public call makes
        torch.cuda.synchronize()
        op, key, op_args = rec[-1]
        cfg = op._configs[key]
        res = tuning_result(op, key)
        kernel, grid, kargs = op._launch_spec(cfg, op_args)
        kern = kernel.replace_hints(**cfg.hints) if cfg.hints else kernel
        grid, kargs = tuple(grid), tuple(kargs)
        stream = torch.cuda.current_stream().cuda_stream
        fns = {
            "public": lambda: gm.matmul(a, b),
            "bare_launch": lambda: ct.launch(stream, grid, kern, kargs),
            "torch": lambda: torch.matmul(a, b),
        }
        row = {"batch": batch, "M": m, "N": n, "K": k, "op": op.name, "launches_per_call": len(rec),
               "winner": cfg.as_dict(), "tune_s": round(tune_s, 2), "isolation": op.isolation,
               "tuner_winner_median_us": None if res is None else round(res.winner_median_us, 2)}
        for tname, timer in timers.items():
            for f in fns.values():
                timer.time(f, 5)
            samples = {name: [] for name in fns}
            for _ in range(args.rounds):
                for name, f in fns.items():
                    samples[name] += timer.time(f, 5)
            row[tname] = {name: round(statistics.median(s), 2) for name, s in samples.items()}
            if probe is not None:
                r = probe.read()
                row[tname]["nvml"] = {"sm_mhz": r.sm_mhz, "power_w": r.power_w, "reasons": list(r.reasons)}
        # the same op tuned again here, in this process: its winner's median beside the worker's
        again = tt.autotune(op.space, reference=op.reference, writes=list(op.writes), inplace=list(op.inplace),
                            tolerance=op.tolerance, name=op.name + ".in_process", db=False, progress=False,
                            isolation="none")(op.plan)
        again(*op_args)
        torch.cuda.synchronize()
        res2 = again.results.get(again._key(op_args))
        if res2 is not None:
            cfg2 = again._configs[again._key(op_args)]
            row["in_process"] = {"winner": cfg2.as_dict(), "winner_median_us": round(res2.winner_median_us, 2),
                                 "same_winner": cfg2 == cfg}
        # host cost of one public call, no GPU wait
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            gm.matmul(a, b)
        row["host_us_per_public_call"] = round((time.perf_counter() - t0) / 50 * 1e6, 1)
        torch.cuda.synchronize()
        print(json.dumps(row), flush=True)
        rows.append(row)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    from _common import write_result

    write_result("gemm_call_gap", {"problem": "public matmul vs a bare launch of its tuned winner vs torch.matmul, "
                                              "bf16, cold L2, three timers", "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
