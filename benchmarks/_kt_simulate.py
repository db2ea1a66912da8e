"""Run one Kernel Tuner strategy in simulation mode on one cache file, for many seeds (issue 16).

Run by ``benchmarks/strategies_public.py`` with the interpreter of a separate virtual environment
that has ``kernel_tuner==1.5.0`` (never a tiletune dependency): this file imports only the standard
library, numpy and kernel_tuner, never tiletune.

    /tmp/ktv/bin/python benchmarks/_kt_simulate.py JOB.json OUT.json

``JOB.json``: ``{"cache": plain JSON cache path, "tune_params": {...}, "restrictions": [str] | null,
"valid_keys": [cache key] | null (a membership restriction instead of expressions), "kernel_name",
"problem_size", "strategy", "strategy_options": {...}, "seeds": [int], "max_fevals": 500,
"stop_below_ms": float | null}``.

Every configuration Kernel Tuner evaluates for the first time (a cache hit it counts towards
``max_fevals``, failed ones included) is recorded in order with its cache ``time`` (ms; null for a
failed config). A run stops at ``max_fevals`` or, to save time, right after the first evaluated
config whose time is ``<= stop_below_ms`` (the tightest tolerance the harness reports): the budget
then reads as exhausted, which every strategy handles as its normal end.

``OUT.json``: ``{"strategy", "runs": [{"seed", "times": [...], "error": str | null, "cpu_s"}],
"kernel_tuner": version}``.
"""

from __future__ import annotations

import json
import random
import sys
import time
import traceback
import warnings


def main(job_path: str, out_path: str) -> int:
    job = json.load(open(job_path))
    import numpy as np

    import kernel_tuner
    from kernel_tuner import util

    orig_read_cache = util.read_cache
    cache_doc = orig_read_cache(job["cache"], open_cache=False)  # error strings become ErrorConfig objects

    def read_cache(cachefile, open_cache=True):  # parsed once for every seed
        if cachefile == job["cache"]:
            return cache_doc
        return orig_read_cache(cachefile, open_cache=open_cache)

    util.read_cache = read_cache

    state = {"times": [], "hit": False}
    stop_below = job.get("stop_below_ms")
    orig_print = util.print_config_output

    def record(tune_params, result, quiet, metrics, units):  # called once per new config
        t = result.get("time")
        ok = isinstance(t, (int, float)) and not isinstance(t, bool) and "__error__" not in result and 0 < t < 1e19
        state["times"].append(float(t) if ok else None)
        if ok and stop_below is not None and t <= stop_below:
            state["hit"] = True
        return orig_print(tune_params, result, True, metrics, units)

    util.print_config_output = record
    orig_is_done = util.TuningBudget.is_done

    def is_done(self):
        return state["hit"] or orig_is_done(self)

    util.TuningBudget.is_done = is_done

    restrictions = job.get("restrictions")
    if job.get("valid_keys") is not None:
        valid = set(job["valid_keys"])
        names = list(job["tune_params"])

        def restrictions(p):  # noqa: F811  (a membership restriction: the recorded configs)
            return ",".join(str(p[n]) for n in names) in valid

    runs = []
    for seed in job["seeds"]:
        state["times"] = []
        state["hit"] = False
        random.seed(seed)
        np.random.seed(seed)
        t0 = time.process_time()
        err = None
        opts = dict(job.get("strategy_options") or {})
        opts["max_fevals"] = job["max_fevals"]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                kernel_tuner.tune_kernel(
                    job["kernel_name"], "// simulated", job["problem_size"], [], job["tune_params"],
                    restrictions=restrictions, cache=job["cache"], simulation_mode=True,
                    strategy=job["strategy"], strategy_options=opts, quiet=True, verbose=False,
                    objective="time",
                )
        except Exception as exc:  # noqa: BLE001 - reported per seed
            err = f"{type(exc).__name__}: {exc}"
            tb = traceback.format_exc(limit=6)
            err += "\n" + tb[-1500:]
        runs.append({"seed": seed, "times": list(state["times"]), "error": err,
                     "cpu_s": round(time.process_time() - t0, 3)})
        if err is not None and not state["times"]:
            # the strategy cannot run at all here: the other seeds would fail the same way
            break
    json.dump({"strategy": job["strategy"], "runs": runs, "kernel_tuner": kernel_tuner.__version__},
              open(out_path, "w"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
