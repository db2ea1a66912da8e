"""Issue 16, item 3: big spaces searched lazily: memory and time per strategy (CPU only).

A synthetic space of ``P`` parameters with 8 values each (1, 2, 4, ..., 128: 8^10 = 1.07e9 combinations
for 10 parameters) and one constraint (``p0 * p1 <= 256``: 43 of the 64 pairs of values, so 67% of the
combinations, are valid); the objective is a smooth bowl over the log2 values (failures where
``p2 == 128 and p3 == 128``). Each (size, strategy) runs in its own Python process (so one run's memory
does not hide in another's), asks ``--batch`` configs at a time until ``--evals`` were evaluated, and reports:

* ``peak_rss_mb``: the process's peak resident memory (``VmHWM`` of ``/proc/self/status``; elsewhere
  ``resource.getrusage``, which on Linux also counts the parent's memory at the fork), imports included;
  ``import_rss_mb``: the same right after importing tiletune, numpy and scikit-learn, before the space;
* ``seconds``: wall time of the search (strategy construction included);
* ``evaluations``, ``best`` (the best objective found; the optimum is 1.0), ``lazy`` (whether the space
  was searched through ``Space.lazy``), ``valid_fraction`` (the constraint's acceptance rate seen by the
  rejection sampling).

Sizes are ``8^P``: ``--params 5 6 7 8 10`` (the default) gives 3.3e4 (below ``LAZY_THRESHOLD``: listed,
so its rows show what listing a space costs), 2.6e5, 2.1e6, 1.7e7 and 1.07e9 combinations (lazy). Before lazy spaces, 10^6 configs took about 1.1 GB and 10^7 failed with MemoryError (every config was
built up front).

Usage::

    python benchmarks/lazy_spaces.py --out benchmarks/results     # writes lazy_spaces.json
    python benchmarks/lazy_spaces.py --one hybrid 10 300 16 0      # one run, JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = ("random", "evolutionary", "model", "local", "surrogate", "hybrid", "auto", "exhaustive")
VALUES = (1, 2, 4, 8, 16, 32, 64, 128)


def make_space(n_params: int):  # type: ignore[no-untyped-def]
    """The benchmark space: ``n_params`` parameters ``p0..`` with 8 values each, ``p0 * p1 <= 256``."""
    from tiletune.space.spaces import Space

    return Space(constraints={"p0_p1": lambda c: c.p0 * c.p1 <= 256},
                 **{f"p{i}": list(VALUES) for i in range(n_params)})


def objective(cfg) -> float | None:  # type: ignore[no-untyped-def]
    """A bowl over the log2 values (minimum 1.0); None (a failed config) where p2 = p3 = 128."""
    if len(cfg) > 3 and cfg["p2"] == 128 and cfg["p3"] == 128:
        return None
    return 1.0 + sum((math.log2(v) - (i % 5)) ** 2 for i, v in enumerate(cfg.values())) / 4.0


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB (``VmHWM``: reset by ``exec``, unlike ``ru_maxrss``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(strategy: str, n_params: int, evals: int, batch: int, seed: int) -> dict:
    """One search in this process (call it in a fresh one to measure memory)."""
    import numpy  # noqa: F401
    import sklearn.ensemble  # noqa: F401

    from tiletune.space.strategies import make_strategy

    rss0 = peak_rss_mb()
    space = make_space(n_params)
    t0 = time.perf_counter()
    strat = make_strategy(strategy, space, None, seed)
    seen: set = set()
    n, best, invalid, repeats = 0, math.inf, 0, 0
    while n < evals:
        cfgs = strat.ask(min(batch, evals - n))
        if not cfgs:
            break
        for c in cfgs:
            invalid += not (c.p0 * c.p1 <= 256)
            repeats += c in seen
            seen.add(c)
        told = [(c, objective(c)) for c in cfgs]
        strat.tell(told)
        n += len(cfgs)
        best = min([best] + [v for _, v in told if v is not None])
    seconds = time.perf_counter() - t0
    view = strat.lazy
    return {
        "strategy": strategy, "params": n_params, "combinations": space.product_size(), "seed": seed,
        "batch": batch, "evaluations": n, "best": round(best, 4), "invalid_proposed": invalid,
        "repeated_proposals": repeats, "lazy": view is not None,
        "chosen": getattr(strat, "chosen", strategy),
        "valid_fraction": None if view is None or view.valid_fraction is None else round(view.valid_fraction, 4),
        "seconds": round(seconds, 3), "import_rss_mb": round(rss0, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def run_isolated(strategy: str, n_params: int, evals: int, batch: int, seed: int, timeout: float = 600) -> dict:
    """:func:`run_one` in a fresh Python process (its peak memory is its own)."""
    env_path = str(ROOT / "src")
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2]); "
            "import lazy_spaces as L; print(json.dumps(L.run_one(sys.argv[3], *map(int, sys.argv[4:]))))")
    out = subprocess.run([sys.executable, "-c", code, env_path, str(ROOT / "benchmarks"), strategy,
                          str(n_params), str(evals), str(batch), str(seed)],
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        return {"strategy": strategy, "params": n_params, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="folder for lazy_spaces.json")
    ap.add_argument("--params", type=int, nargs="+", default=[5, 6, 7, 8, 10], help="parameters (8 values each)")
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    ap.add_argument("--evals", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--one", nargs=5, metavar=("STRATEGY", "PARAMS", "EVALS", "BATCH", "SEED"),
                    help="one run in this process, JSON on stdout")
    a = ap.parse_args(argv)
    if a.one:
        sys.path.insert(0, str(ROOT / "src"))
        print(json.dumps(run_one(a.one[0], *map(int, a.one[1:]))))
        return 0
    rows = []
    for p in a.params:
        for s in a.strategies:
            r = run_isolated(s, p, a.evals, a.batch, a.seed)
            print(json.dumps(r), flush=True)
            rows.append(r)
    import importlib.metadata as md

    doc = {
        "rows": rows,
        "settings": {"evals": a.evals, "batch": a.batch, "seed": a.seed, "values_per_param": len(VALUES),
                     "constraint": "p0 * p1 <= 256", "memory_limit_mb": 500},
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "numpy": md.version("numpy"), "scikit-learn": md.version("scikit-learn")},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "all_under_500_mb": all(r.get("peak_rss_mb", math.inf) < 500 for r in rows),
    }
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        path = a.out / "lazy_spaces.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
