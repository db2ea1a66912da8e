"""Issue 4 evaluation: search strategies on recorded spaces, replayed on a CPU.

For every recorded space (``benchmarks/spaces/*.json.gz`` by default: tiletune recordings of
exhaustive H200 runs; Kernel Tuner caches and T4 files work too) and every strategy, 100 seeds
each: the evaluations and simulated seconds to get within 5% and within 1% of the space's optimum
(the best recorded median), median and 95% interval, against random search's expected count
``(N + 1) / (K + 1)``. Every run goes through the real search driver and tuning loop
(:func:`tiletune.engine.search.run_search` -> :func:`tiletune.engine.tuner.run_loop`) on a simulated session that
replays the recording (see :mod:`tiletune.lab.strategy_eval`).

Writes ``<out>/strategies.json`` (a list of rows: ``space``, ``n_valid``, ``strategy``,
``median_evals_to_5pct``, ``median_evals_to_1pct``, ``random_expected_evals_to_5pct``, and more)
and ``<out>/strategies_<space>.png`` (median best-found vs evaluations, one line per strategy).

Usage::

    python benchmarks/strategies.py                       # benchmarks/spaces/*.json.gz -> results/h200
    python benchmarks/strategies.py --synthetic           # tests/data/synthetic_*.json.gz -> results/synthetic
    python benchmarks/strategies.py --spaces a.json.gz b.json --seeds 20 --out /tmp/eval
"""

from __future__ import annotations

import argparse
import glob
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from tiletune.space.strategies import STRATEGY_NAMES  # noqa: E402
from tiletune.lab.strategy_eval import evaluate, plot_space, write_results  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spaces", nargs="*", default=None,
                    help="recordings (paths or globs); default benchmarks/spaces/*.json.gz")
    ap.add_argument("--synthetic", action="store_true",
                    help="evaluate the synthetic test spaces (tests/data/synthetic_*.json.gz) instead")
    ap.add_argument("--strategies", nargs="*", default=list(STRATEGY_NAMES), choices=STRATEGY_NAMES)
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--exhaustive-seeds", type=int, default=10,
                    help="exhaustive search's order does not depend on the seed: fewer runs suffice")
    ap.add_argument("--workers", type=int, default=16, help="simulated compile workers (the H200 host has 16 cores)")
    ap.add_argument("--batch", type=int, default=None, help="configs per ask (default: the compile workers)")
    ap.add_argument("--out", type=Path, default=None,
                    help="output directory (default benchmarks/results/h200, or results/synthetic with --synthetic)")
    ap.add_argument("--no-baseline", action="store_true",
                    help="drop the recorded baseline from each space (strategies start cold); results get a "
                         "'_no_baseline' suffix")
    args = ap.parse_args(argv)

    if args.synthetic:
        patterns = [str(ROOT / "tests" / "data" / "synthetic_*.json.gz")]
        out = args.out or ROOT / "benchmarks" / "results" / "synthetic"
    else:
        patterns = args.spaces or [str(ROOT / "benchmarks" / "spaces" / "*.json.gz")]
        out = args.out or ROOT / "benchmarks" / "results" / "h200"
    paths = sorted({p for pat in patterns for p in (glob.glob(pat) or ([pat] if Path(pat).exists() else []))})
    if not paths:
        print(f"no recorded spaces found ({', '.join(patterns)}). Put exhaustive recordings in benchmarks/spaces/ "
              "or run with --synthetic.", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows, runs, truths = evaluate(paths, args.strategies, args.seeds, workers=args.workers, batch=args.batch,
                                  exhaustive_seeds=args.exhaustive_seeds, progress=print,
                                  baseline=not args.no_baseline)
    settings = {"seeds": args.seeds, "exhaustive_seeds": args.exhaustive_seeds, "workers": args.workers,
                "batch": args.batch or args.workers, "spaces": [Path(p).name for p in paths],
                "cpu_s": round(time.perf_counter() - t0, 1), "baseline_in_space": not args.no_baseline}
    suffix = "_no_baseline" if args.no_baseline else ""
    path = write_results(rows, out, settings, name=f"strategies{suffix}.json")
    print(f"wrote {path}")
    for t in truths:
        png = plot_space(t, {s: runs[(t.name, s)] for s in args.strategies}, out / f"strategies{suffix}_{t.name}.png")
        print(f"wrote {png}")
    # the target: evolutionary and model each within 5% with <= 1/10 of random's expected evaluations
    # (median over seeds) on at least two spaces
    for s in ("evolutionary", "model"):
        hits = [r["space"] for r in rows if r["strategy"] == s and r.get("meets_target_5pct")]
        print(f"target (<= 1/10 of random's expected evaluations to 5%): {s}: met on {len(hits)} of "
              f"{len(truths)} spaces {hits}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
