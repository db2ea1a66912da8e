"""How many evaluations suffice: the default search under a budget on the recorded H200 spaces.

Replays the three full H200 recordings (``benchmarks/spaces/``: GEMM 512 configs, attention 330,
LayerNorm 352) through the real search loop on a simulated clock: ``"auto"`` with evaluation
budgets of 24, 40, 64 and 96 over ``--seeds`` seeds, and exhaustive search once. Per budget: the
chosen winner's loss against the recorded optimum (median, 90th percentile, max), the share of runs
within 1% and 2%, and the simulated session seconds (compiles included) against exhaustive's. This is
what ``budget=tiletune.Budget(max_evals=N)`` buys on a space of a few hundred configs; CPU only.

    python benchmarks/budget_sufficiency.py [--seeds 20] [--out DIR]
Writes budget_sufficiency.json.
"""

from __future__ import annotations

import argparse
import glob
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))
from _common import write_result  # noqa: E402

BUDGETS = (24, 40, 64, 96)
NEVER = (-1.0,)  # a tolerance no config meets: every run spends its whole budget


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    from tiletune.lab.strategy_eval import load_truth, run_one

    rows = []
    for path in sorted(glob.glob(str(HERE / "spaces" / "*.json.gz"))):
        truth = load_truth(path)
        ex = run_one(truth, "exhaustive", 0, tolerances=NEVER)
        for budget in BUDGETS:
            runs = [run_one(truth, "auto", s, tolerances=NEVER, max_evals=budget) for s in range(args.seeds)]
            loss = sorted(r.winner_excess for r in runs if r.winner_excess is not None)
            row = {"space": truth.name, "n_valid": len(truth.truth), "strategy": "auto", "budget": budget,
                   "seeds": args.seeds, "median_loss": statistics.median(loss),
                   "p90_loss": loss[int(0.9 * (len(loss) - 1))], "max_loss": loss[-1],
                   "within_1pct": sum(x <= 0.01 for x in loss) / len(loss),
                   "within_2pct": sum(x <= 0.02 for x in loss) / len(loss),
                   "session_s": statistics.median(r.session_s for r in runs),
                   "exhaustive_session_s": ex.session_s, "exhaustive_loss": ex.winner_excess}
            rows.append(row)
            print(f"{truth.name:45s} budget {budget:3d}: within 1% {row['within_1pct']:.2f}, max loss "
                  f"{row['max_loss'] * 100:5.2f}%, {row['session_s']:6.1f} s vs exhaustive {ex.session_s:6.1f} s",
                  flush=True)
    write_result("budget_sufficiency", {"note": "replayed recordings (simulated clock, 16 compile workers); loss "
                                        "= recorded median of the run's winner / recorded optimum - 1",
                                        "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
