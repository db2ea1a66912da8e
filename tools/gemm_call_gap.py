#!/usr/bin/env python
"""Why is a public ``tiletune.kernels.matmul`` call slower than the winner the tuner measured?

For a few GEMM problems: tune through the public call (fresh database), then time, interleaved and
with a cold L2, (1) the public call, (2) a bare ``ct.launch`` of the winning config (the op's own
launch plan, hinted kernel), (3) ``torch.matmul``; each with a short (100 us) and a long (2 ms) GPU
backlog before the start event. If (1) only catches up with (2) under the long backlog, the gap is
host-side dispatch cost leaking into the events; if (1) stays slower than (2), the call launches
something else than the tuned winner.

    python tools/gemm_call_gap.py [--out DIR]       (writes gemm_call_gap.json)
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


def tuning_result(op, op_args):
    """The tuning session's result for the problem key of ``op_args`` (None: not tuned in this process,
    e.g. a database hit)."""
    return op.results.get(op._key(op_args))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    import cuda.tile as ct
    import torch

    import tiletune as tt
    from tiletune.kernels import gemm as gm
    from tiletune.measure import ColdL2Timer

    os.environ.setdefault("TILETUNE_DB", str(Path(tempfile.mkdtemp()) / "t.db"))
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.cuda.current_device()
    timers = {"backlog_100us": ColdL2Timer(dev, backlog_us=100), "backlog_2ms": ColdL2Timer(dev, backlog_us=2000)}
    rows = []
    for batch, m, n, k in PROBLEMS:
        g = torch.Generator(device="cuda").manual_seed(0)
        lead = (batch,) if batch > 1 else ()
        a = torch.randn(*lead, m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(*lead, k, n, device="cuda", dtype=torch.bfloat16, generator=g)
        t0 = time.perf_counter()
        gm.matmul(a, b)
        torch.cuda.synchronize()
        tune_s = time.perf_counter() - t0
        # the arguments the public call hands to the tuned op
        a3, b3 = a.reshape(batch, m, k), b.reshape(batch, k, n)
        c = torch.empty(batch, m, n, device="cuda", dtype=torch.bfloat16)
        one = gm._unit_scale(a.device)
        op_args = (a3, b3, c, one, one, False, False, False)
        op = gm.GEMM.op(None)
        cfg = op.config_for(*op_args)
        # the tuning result of *this* problem: results are keyed by the op's problem key. (Looking it up
        # by winning config instead picked another problem's session whenever two problems had the same
        # winner, e.g. the 4096^3 row reported the 1024x4096x4096 session's 49.7 us.)
        res = tuning_result(op, op_args)
        launch = op.plan(cfg, *op_args)
        kern = launch.kernel.replace_hints(**cfg.hints)
        stream = torch.cuda.current_stream().cuda_stream
        fns = {
            "public": lambda: gm.matmul(a, b),
            "bare_launch": lambda: ct.launch(stream, launch.grid, kern, launch.args),
            "torch": lambda: torch.matmul(a, b),
        }
        row = {"batch": batch, "M": m, "N": n, "K": k, "winner": cfg.as_dict(), "tune_s": round(tune_s, 2),
               "tuner_winner_median_us": None if res is None else round(res.winner_median_us, 2),
               "hot_path_recipes": len(getattr(op, "recipe_keys", ()))}
        for tname, timer in timers.items():
            for f in fns.values():
                timer.time(f, 5)
            samples = {name: [] for name in fns}
            for _ in range(6):
                for name, f in fns.items():
                    samples[name] += timer.time(f, 5)
            row[tname] = {name: round(statistics.median(s), 2) for name, s in samples.items()}
        # host cost of one public call, no GPU wait
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            gm.matmul(a, b)
        row["host_us_per_public_call"] = round((time.perf_counter() - t0) / 50 * 1e6, 1)
        torch.cuda.synchronize()
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = Path(args.out) / "gemm_call_gap.json"
    out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "tiletune": tt.__version__ if hasattr(tt, "__version__") else None, "rows": rows},
                              indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
