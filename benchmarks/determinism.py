"""Determinism: 5 fresh processes tune the same key (database disabled) and must agree.

Each process tunes the 32-config bf16 4096^3 matmul with ``db=False`` (the cuTile disk cache is
shared, so only the first pays compilation). If the picks differ, the distinct picks are re-timed
interleaved in one process: they count as tied when within 2% of each other.

    python benchmarks/determinism.py [--out DIR] [--runs 5]
Writes determinism.json with picks and same_or_tied.
"""

from __future__ import annotations

import argparse
import json
import sys

from _common import fresh_env, run_child, write_result

TUNE = """
import json, torch
import tiletune as tt
from tiletune.lab.examples.simple_matmul import MATMUL_SPACE, matmul_into
torch.manual_seed(0)
n = 4096
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
op = tt.autotune(MATMUL_SPACE, reference=matmul_into.reference, writes=["c"], db=False, progress=False)(matmul_into.plan)
op(a, b, c); torch.cuda.synchronize()
(r,) = op.results.values()
print("RESULT " + json.dumps({"winner": dict(r.winner), "winner_us": r.winner_median_us,
                              "tied": [dict(t) for t in r.tied]}))
"""

AB = """
import json, torch, cuda.tile as ct
from tiletune.lab.examples.matmul_kernels import matmul_kernel, MATMUL_GROUP_M
from tiletune.devices.backends.cutile import HintedKernels
from _common import interleaved_ab
n = 4096
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
h = HintedKernels(); s = torch._C._cuda_getCurrentRawStream(0)
def launcher(cfg):
    k = h.get(matmul_kernel, {"occupancy": cfg["occupancy"]})
    g = (((n + cfg["TM"] - 1) // cfg["TM"]) * ((n + cfg["TN"] - 1) // cfg["TN"]),)
    args = (a, b, c, cfg["TM"], cfg["TN"], cfg["TK"], MATMUL_GROUP_M)
    return lambda: ct.launch(s, g, k, args)
picks = json.loads(%r)
base = picks[0]
print("RESULT " + json.dumps([interleaved_ab(launcher(base), launcher(p))["gap"] for p in picks[1:]]))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    env = fresh_env(TILETUNE_DB="")
    runs = [run_child(TUNE, env) for _ in range(args.runs)]
    picks = [r["winner"] for r in runs]
    distinct = []
    for p in picks:
        if p not in distinct:
            distinct.append(p)
    gaps = run_child(AB % json.dumps(distinct), env) if len(distinct) > 1 else []
    write_result("determinism", {
        "problem": "bf16 matmul 4096^3, 32 configs, 5 fresh processes, database disabled",
        "picks": picks,
        "distinct_picks": len(distinct),
        "gaps_vs_first_pick": gaps,
        "same_or_tied": len(distinct) == 1 or all(abs(g) <= 0.02 for g in gaps),
        "reported_us": [r["winner_us"] for r in runs],
    }, args.out)


if __name__ == "__main__":
    sys.exit(main())
