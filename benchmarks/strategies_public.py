"""Issue 16: tiletune's search strategies against Kernel Tuner's on public recorded spaces (CPU only).

Spaces: the Kernel Tuner cache files of AutoTuningAssociation/benchmark_hub (``cachefiles/<kernel>/<GPU>
.json.gz`` for the kernels convolution_milo, dedispersion_milo, gemm_milo, hotspot_milo on A4000, A6000,
W6600, W7800 and MI250X: 20 spaces; the data stays out of this repository, point ``--cachefiles`` at a
copy), plus the three H200 recordings of ``benchmarks/spaces/``.

Protocol, the same for both tuners:

* the space is the cache's configurations minus Kernel Tuner's ``InvalidConfig`` entries (restriction
  failures); compile and runtime failures stay in the space and cost an evaluation when proposed;
* ground truth is the cache's ``time`` field (milliseconds; for an H200 recording, its recorded median),
  the value Kernel Tuner's simulation mode scores; the optimum is its minimum over the space;
* a run has a budget of ``--budget`` evaluations (500), one per configuration evaluated for the first
  time, failures included, and stops early once it evaluated a config within 1% of the optimum (the
  tightest tolerance reported: later evaluations change nothing);
* ``--seeds`` runs (100) per (space, strategy); per (space, strategy) we report the median evaluations
  to get within 5% and within 1% of the optimum (a run that never gets there counts as infinitely many:
  the median is null when more than half the runs missed) and the reach rates.

tiletune's strategies run through their ask/tell interface (``make_strategy``), one config per ask by
default (``--batch``), told the truth in microseconds (None for a failure). Kernel Tuner 1.5.0 runs in
its own virtual environment (``--kt-python``, e.g. ``python3 -m venv /tmp/ktv && /tmp/ktv/bin/pip install
kernel_tuner==1.5.0``; never a tiletune dependency): ``benchmarks/_kt_simulate.py`` runs one strategy in
simulation mode on a plain JSON copy of the cache for every seed (``random`` and ``numpy.random`` seeded
per run) and writes the time of every config it evaluated, in order. Its results are kept in
``--kt-dir`` and reused when the space, strategy, seeds and budget are the same.

Writes ``<out>/strategies_public.json``: ``{"rows": [...], "summary": {...}, "settings": {...}}``, one row
per (space, strategy) for both tuners (``tuner``: ``tiletune`` or ``kernel_tuner``) with ``space``,
``n_valid``, ``strategy``, ``median_evals_5pct``, ``reach_5pct``, ``median_evals_1pct``, ``reach_1pct``,
``kt_best_strategy``, ``kt_median_evals_5pct``, ``kt_reach_5pct`` (Kernel Tuner's best strategy on that
space: the lowest median evaluations to 5%, ties broken by reach); the summary evaluates the issue's
targets for the default strategy (``--default``). PNGs: ``strategies_public_evals.png`` (per space:
default vs Kernel Tuner's best vs random's expectation) and ``strategies_public_curves.png``.

Usage::

    python benchmarks/strategies_public.py --cachefiles /tmp/benchmark_hub/cachefiles --kt-python /tmp/ktv/bin/python
    python benchmarks/strategies_public.py --cachefiles ... --quick      # smoke run: 2 spaces, 5 seeds
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from _common import small_png  # noqa: E402

KERNELS: tuple[str, ...] = ("convolution_milo", "dedispersion_milo", "gemm_milo", "hotspot_milo")
GPUS: tuple[str, ...] = ("A4000", "A6000", "W6600", "W7800", "MI250X")
TOLERANCES: tuple[float, ...] = (0.05, 0.01)

#: Kernel Tuner strategies evaluated by default (``random_sample`` is its random search).
KT_STRATEGIES: tuple[str, ...] = (
    "random_sample", "genetic_algorithm", "dual_annealing", "simulated_annealing", "greedy_ils", "mls",
    "pso", "firefly_algorithm", "basinhopping", "diff_evo", "bayes_opt",
)
#: Kernel Tuner strategies that cost seconds of CPU per run: fewer seeds by default (``--kt-slow-seeds``).
KT_SLOW: frozenset[str] = frozenset({"pso", "basinhopping", "bayes_opt"})
#: ... and the slowest of them (a Gaussian process refitted per evaluation: ~10 CPU s per run).
KT_SLOWEST: frozenset[str] = frozenset({"bayes_opt"})
#: tiletune strategies that cost tens of CPU seconds per run with one config per ask.
TT_SLOW: frozenset[str] = frozenset({"model"})

_KT_FAILURES = {"CompilationFailedConfig", "RuntimeFailedConfig", "ErrorConfig"}


# ------------------------------------------------------------------------------------------------
# spaces
# ------------------------------------------------------------------------------------------------


@dataclass
class PublicSpace:
    """A recorded space as both tuners see it.

    Attributes:
        name: ``<kernel>/<GPU>`` or the H200 recording's name.
        params: parameter -> values (the cache's ``tune_params``, in its key order).
        configs: every configuration of the space (tuples in ``params`` order), cache order.
        times: the truth of each config: the cache's ``time`` in ms, None for a failed config.
        kt_cache: path of the plain JSON cache Kernel Tuner simulates (written by :func:`write_kt_cache`).
        restrictions: Kernel Tuner restriction expressions that give exactly ``configs`` (None: a
            membership restriction over the recorded configs is used instead).
        kt_params: the ``tune_params`` given to Kernel Tuner (values that are not numbers are replaced
            by their index for an H200 recording); None: ``params``.
        source: where the space came from.
        kind: ``"public"`` (benchmark_hub) or ``"h200"``.
    """

    name: str
    params: dict[str, list[Any]]
    configs: list[tuple[Any, ...]]
    times: list[float | None]
    kernel_name: str = "unknown"
    problem_size: Any = "unknown"
    device: str = "unknown"
    kt_cache: str | None = None
    restrictions: list[str] | None = None
    kt_params: dict[str, list[Any]] | None = None
    source: str = ""
    kind: str = "public"
    _optimum: float | None = field(default=None, repr=False)

    @property
    def n_configs(self) -> int:
        return len(self.configs)

    @property
    def n_valid(self) -> int:
        return sum(t is not None for t in self.times)

    @property
    def optimum(self) -> float:
        if self._optimum is None:
            self._optimum = min(t for t in self.times if t is not None)
        return self._optimum

    def within(self, tol: float) -> int:
        limit = (1.0 + tol) * self.optimum
        return sum(1 for t in self.times if t is not None and t <= limit)

    def random_expected(self, tol: float) -> float:
        """Random search's expected evaluations to ``tol`` (without replacement): ``(N+1)/(K+1)``."""
        return (self.n_configs + 1) / (self.within(tol) + 1)

    def digest(self) -> str:
        h = hashlib.sha256(json.dumps([self.name, self.params, self.configs, self.times], default=str).encode())
        return h.hexdigest()[:16]


def kt_key(values: Sequence[Any]) -> str:
    """Kernel Tuner's cache key of a configuration: the values' ``str`` joined by commas."""
    return ",".join(str(v) for v in values)


def _read_json(path: str | os.PathLike) -> Any:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def parse_kt_cache(doc: Mapping[str, Any], name: str, source: str = "") -> PublicSpace:
    """A :class:`PublicSpace` from a Kernel Tuner cache document (``InvalidConfig`` entries left out).

    A numeric ``time`` (``0 < t < 1e19``) is the truth in ms; ``CompilationFailedConfig``,
    ``RuntimeFailedConfig`` (any other error string, or the ``1e20`` old caches wrote) make a failed
    config, which stays in the space.
    """
    tp = doc["tune_params"]
    names = [str(k) for k in doc.get("tune_params_keys", list(tp))]
    params = {k: list(tp[k]) for k in names}
    configs: list[tuple[Any, ...]] = []
    times: list[float | None] = []
    for ckey, entry in doc["cache"].items():
        t = entry.get("time")
        if t == "InvalidConfig":
            continue
        if all(k in entry for k in names):
            cfg = tuple(entry[k] for k in names)
        else:  # parse the key: match each text to a value's str
            parts = str(ckey).split(",")
            cfg = tuple(next(v for v in params[k] if str(v) == p) for k, p in zip(names, parts))
        ok = isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < 1e19
        configs.append(cfg)
        times.append(float(t) if ok else None)
    if not any(t is not None for t in times):
        raise ValueError(f"{source or name}: no successfully measured config")
    return PublicSpace(name, params, configs, times, kernel_name=str(doc.get("kernel_name", "unknown")),
                       problem_size=doc.get("problem_size", "unknown"), device=str(doc.get("device_name", "")),
                       source=source)


def restrictions_match(space: PublicSpace, expressions: Sequence[str]) -> bool:
    """Whether ``expressions`` (Python boolean expressions over the parameter names) keep exactly the
    space's configurations out of the product of the parameter values."""
    names = list(space.params)
    code = [compile(e, "<restriction>", "eval") for e in expressions]
    have = {kt_key(c) for c in space.configs}
    n = 0
    for values in itertools.product(*space.params.values()):
        env = dict(zip(names, values))
        if all(eval(c, {"__builtins__": {}}, env) for c in code):  # noqa: S307 - the benchmark's own data
            n += 1
            if kt_key(values) not in have:
                return False
    return n == len(have)


def load_hub_space(path: str | os.PathLike, kernel_json: str | os.PathLike | None = None) -> PublicSpace:
    """A benchmark_hub cache file (``.../<kernel>/<GPU>.json.gz``) with its restrictions when the hub's
    ``kernels/<kernel>.json`` is found (``kernel_json``, or ``<cachefiles>/../kernels/``) and matches."""
    p = Path(path)
    kernel = p.parent.name
    gpu = p.name.split(".")[0]
    space = parse_kt_cache(_read_json(p), f"{kernel}/{gpu}", str(p))
    kj = Path(kernel_json) if kernel_json else p.parent.parent.parent / "kernels" / f"{kernel}.json"
    if kj.exists():
        spec = json.loads(kj.read_text())
        exprs = [c["Expression"] for c in spec.get("ConfigurationSpace", {}).get("Conditions", [])]
        if exprs and restrictions_match(space, exprs):
            space.restrictions = exprs
    return space


def load_h200_space(path: str | os.PathLike) -> PublicSpace:
    """An H200 tiletune recording as a space (truth: each config's recorded median, in ms)."""
    from tiletune.lab.recordings import load_any
    from tiletune.records import Status

    rec = load_any(path)
    params = rec.param_values
    names = list(params)
    configs: list[tuple[Any, ...]] = []
    times: list[float | None] = []
    for m in rec.measurements:
        configs.append(tuple(m.config[n] for n in names))
        ok = m.status is Status.OK and m.samples_us
        times.append(m.median_us / 1e3 if ok else None)
    kt_params = {}
    for n, vs in params.items():
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vs)
        kt_params[n] = list(vs) if numeric else list(range(len(vs)))
    name = Path(path).name.split(".")[0]
    return PublicSpace(name, params, configs, times, kernel_name=name, problem_size="recorded",
                       device=rec.device.name, kt_params=kt_params, source=str(path), kind="h200")


def write_kt_cache(space: PublicSpace, directory: str | os.PathLike) -> str:
    """Write the plain JSON cache Kernel Tuner simulates on (failed configs keep their error string)."""
    kt_params = space.kt_params or space.params
    names = list(space.params)
    index = {n: {json.dumps(v): i for i, v in enumerate(space.params[n])} for n in names}

    def kt_values(cfg: Sequence[Any]) -> list[Any]:
        if space.kt_params is None:
            return list(cfg)
        return [kt_params[n][index[n][json.dumps(v)]] for n, v in zip(names, cfg)]

    cache = {}
    for cfg, t in zip(space.configs, space.times):
        vals = kt_values(cfg)
        entry = dict(zip(names, vals))
        entry.update(time=t if t is not None else "RuntimeFailedConfig", times=[t] if t is not None else [],
                     compile_time=0, verification_time=0, benchmark_time=0)
        cache[kt_key(vals)] = entry
    doc = {"device_name": space.device or "unknown", "kernel_name": space.kernel_name,
           "problem_size": space.problem_size, "tune_params_keys": names, "tune_params": kt_params,
           "objective": "time", "cache": cache}
    out = Path(directory) / f"{space.name.replace('/', '__')}_{space.digest()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(out)
    space.kt_cache = str(out)
    return str(out)


# ------------------------------------------------------------------------------------------------
# metrics (pure)
# ------------------------------------------------------------------------------------------------


def evals_to(times: Sequence[float | None], optimum: float, tol: float) -> int | None:
    """1-based evaluation count at which a config within ``tol`` of ``optimum`` was first evaluated."""
    limit = (1.0 + tol) * optimum
    for i, t in enumerate(times):
        if t is not None and t <= limit:
            return i + 1
    return None


def median_evals(values: Sequence[int | None]) -> float | None:
    """Median over runs, a run that never reached counting as infinitely many; None when infinite."""
    x = sorted(math.inf if v is None else float(v) for v in values)
    if not x:
        return None
    n = len(x)
    m = x[n // 2] if n % 2 else (x[n // 2 - 1] + x[n // 2]) / 2.0
    return None if math.isinf(m) else round(m, 2)


def reach_rate(values: Sequence[int | None]) -> float:
    return round(sum(v is not None for v in values) / len(values), 4) if values else 0.0


def summarize(space: PublicSpace, tuner: str, strategy: str, runs: Sequence[Sequence[float | None]],
              errors: Sequence[str | None] = ()) -> dict[str, Any]:
    """One row: medians and reach rates to 5% and 1% over the runs' evaluated times."""
    row: dict[str, Any] = {"space": space.name, "kind": space.kind, "n_valid": space.n_valid,
                           "n_configs": space.n_configs, "tuner": tuner, "strategy": strategy, "seeds": len(runs)}
    for tol in TOLERANCES:
        k = f"{tol * 100:g}pct"
        hits = [evals_to(r, space.optimum, tol) for r in runs]
        row[f"median_evals_{k}"] = median_evals(hits)
        row[f"reach_{k}"] = reach_rate(hits)
        row[f"random_expected_{k}"] = round(space.random_expected(tol), 2)
    errs = [e for e in errors if e]
    if errs:
        row["errors"] = len(errs)
        row["error"] = errs[0].splitlines()[0][:300]
    return row


def _inf(v: float | None) -> float:
    return math.inf if v is None else float(v)


def kt_best(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """Kernel Tuner's best row of one space: lowest median evaluations to 5%, then highest reach."""
    kt = [r for r in rows if r["tuner"] == "kernel_tuner" and r["seeds"] > 0]
    if not kt:
        return None
    return min(kt, key=lambda r: (_inf(r["median_evals_5pct"]), -r["reach_5pct"], r["strategy"]))


def attach_kt_best(rows: list[dict[str, Any]]) -> None:
    """Add ``kt_best_strategy``, ``kt_median_evals_5pct``, ``kt_reach_5pct`` to every row."""
    for space in dict.fromkeys(r["space"] for r in rows):
        mine = [r for r in rows if r["space"] == space]
        best = kt_best(mine)
        for r in mine:
            r["kt_best_strategy"] = best["strategy"] if best else None
            r["kt_median_evals_5pct"] = best["median_evals_5pct"] if best else None
            r["kt_reach_5pct"] = best["reach_5pct"] if best else None


def targets(rows: Sequence[Mapping[str, Any]], default: str, budget: int, expected_public: int = 20) -> dict[str, Any]:
    """The issue's targets for the ``default`` strategy (see the module docstring).

    * ``beats_kt_best``: public spaces where its median evaluations to 5% <= KT best's and its reach
      >= KT best's (target: >= 80% of the 20 public spaces);
    * ``geomean_ratio_vs_kt_best``: geomean of its median / KT best's median over the public spaces
      where KT best needs > 10 evaluations (target <= 0.7; a median that is null counts as
      ``budget + 1``);
    * ``vs_random``: spaces where random search expects >= 100 evaluations to 5%: its median <= 1/10
      of random's expectation.
    """
    mine = [r for r in rows if r["tuner"] == "tiletune" and r["strategy"] == default]
    public = [r for r in mine if r["kind"] == "public"]
    per_space = []
    wins = 0
    ratios = []
    for r in public:
        kt_m, kt_r = r.get("kt_median_evals_5pct"), r.get("kt_reach_5pct")
        me = r["median_evals_5pct"]
        ok = kt_r is not None and _inf(me) <= _inf(kt_m) and r["reach_5pct"] >= kt_r
        wins += ok
        entry = {"space": r["space"], "median_evals_5pct": me, "reach_5pct": r["reach_5pct"],
                 "kt_best_strategy": r.get("kt_best_strategy"), "kt_median_evals_5pct": kt_m,
                 "kt_reach_5pct": kt_r, "meets": ok}
        if kt_m is not None and kt_m > 10:
            ratio = (me if me is not None else budget + 1) / kt_m
            ratios.append(ratio)
            entry["ratio_vs_kt_best"] = round(ratio, 3)
        per_space.append(entry)
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else None
    vs_random = []
    for r in mine:
        exp5 = r["random_expected_5pct"]
        if exp5 >= 100:
            me = r["median_evals_5pct"]
            vs_random.append({"space": r["space"], "median_evals_5pct": me, "random_expected_5pct": exp5,
                              "ratio": None if me is None else round(me / exp5, 4),
                              "meets": me is not None and me <= exp5 / 10})
    return {
        "default_strategy": default,
        "public_spaces_expected": expected_public,
        "public_spaces_evaluated": len(public),
        "beats_kt_best": wins,
        "beats_kt_best_target": math.ceil(0.8 * expected_public),
        "beats_kt_best_met": wins >= math.ceil(0.8 * expected_public),
        "beats_kt_best_of_evaluated": f"{wins}/{len(public)}",
        "geomean_ratio_vs_kt_best": None if geo is None else round(geo, 3),
        "geomean_spaces": len(ratios),
        "geomean_target": 0.7,
        "geomean_met": geo is not None and geo <= 0.7,
        "per_space": per_space,
        "vs_random": vs_random,
        "vs_random_met": all(v["meets"] for v in vs_random) if vs_random else None,
    }


# ------------------------------------------------------------------------------------------------
# runs
# ------------------------------------------------------------------------------------------------

_SPACE_CACHE: dict[str, Any] = {}


def tiletune_space(space: PublicSpace) -> tuple[Any, dict[Any, float | None]]:
    """The tiletune :class:`Space` whose valid configs are exactly ``space.configs``, and the truth."""
    key = space.digest()
    hit = _SPACE_CACHE.get(key)
    if hit is not None:
        return hit
    from tiletune.lab.recordings.format import RecordedConfigs
    from tiletune.space.spaces import Space

    names = list(space.params)
    rec = RecordedConfigs(names, [dict(zip(names, c)) for c in space.configs])
    sp = Space(constraints={"recorded": rec}, **space.params)
    truth = {}
    by_key = {tuple((type(v) is bool, v) for v in c): t for c, t in zip(space.configs, space.times)}
    for cfg in sp.configs():
        truth[cfg] = by_key[tuple((type(v) is bool, v) for v in cfg.values())]
    _SPACE_CACHE[key] = (sp, truth)
    return sp, truth


def run_tiletune(space: PublicSpace, strategy: str, seed: int, budget: int = 500, batch: int = 1,
                 stop_tol: float = min(TOLERANCES), options: Mapping[str, Any] | None = None) -> list[float | None]:
    """One tiletune run: the truth (ms, None for a failure) of every config evaluated, in order."""
    from tiletune.space.strategies import make_strategy

    sp, truth = tiletune_space(space)
    strat = make_strategy(strategy, sp, None, seed, **dict(options or {}))
    stop = (1.0 + stop_tol) * space.optimum
    times: list[float | None] = []
    while len(times) < budget and not strat.done:
        cfgs = strat.ask(min(batch, budget - len(times)))
        if not cfgs:
            break
        told = []
        hit = False
        for c in cfgs:
            t = truth[c]
            times.append(t)
            told.append((c, None if t is None else t * 1e3))
            hit = hit or (t is not None and t <= stop)
        strat.tell(told)
        if hit:
            break
    return times


def _code_digest(strategy: str) -> str:
    """A digest of the code a tiletune strategy runs (the modules of its class and of its bases, the
    space; every strategy module for one that delegates, like ``auto``), so that kept results are
    reused only while that code is unchanged."""
    import inspect

    from tiletune.space.strategies import STRATEGIES

    src = ROOT / "src" / "tiletune"
    files = {src / "space.py"}
    cls = STRATEGIES.get(strategy)
    if cls is None or strategy == "auto":
        files |= set((src / "strategies").glob("*.py"))
    else:
        for k in inspect.getmro(cls):
            f = inspect.getsourcefile(k) if k.__module__.startswith("tiletune") else None
            if f:
                files.add(Path(f))
        if any(f.name in ("surrogate.py", "local.py", "portfolio.py") for f in files):
            files.add(src / "strategies" / "_index.py")
    h = hashlib.sha256()
    for p in sorted(files):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()[:16]


def _tiletune_job(args: tuple[PublicSpace, str, list[int], int, int, str | None]) -> tuple[str, str, list[list[float | None]], float]:
    space, strategy, seeds, budget, batch, tt_dir = args
    out = None
    if tt_dir:
        tag = hashlib.sha256(json.dumps([space.digest(), strategy, seeds, budget, batch,
                                         _code_digest(strategy)]).encode()).hexdigest()[:16]
        out = Path(tt_dir) / f"{space.name.replace('/', '__')}__{strategy}__{tag}.json"
        if out.exists():
            d = json.loads(out.read_text())
            return space.name, strategy, d["runs"], d["cpu_s"]
    t0 = time.process_time()
    runs = [run_tiletune(space, strategy, s, budget, batch) for s in seeds]
    cpu = time.process_time() - t0
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"runs": runs, "cpu_s": cpu}))
    return space.name, strategy, runs, cpu


def _kt_job(args: tuple[PublicSpace, str, list[int], int, str, str]) -> tuple[str, str, dict[str, Any]]:
    space, strategy, seeds, budget, kt_python, kt_dir = args
    tag = hashlib.sha256(json.dumps([space.digest(), strategy, seeds, budget,
                                     space.restrictions]).encode()).hexdigest()[:16]
    out = Path(kt_dir) / f"{space.name.replace('/', '__')}__{strategy}__{tag}.json"
    if out.exists():
        return space.name, strategy, json.loads(out.read_text())
    job = {"cache": space.kt_cache, "tune_params": space.kt_params or space.params,
           "restrictions": space.restrictions, "kernel_name": space.kernel_name,
           "problem_size": space.problem_size, "strategy": strategy, "seeds": seeds, "max_fevals": budget,
           "stop_below_ms": (1.0 + min(TOLERANCES)) * space.optimum, "valid_keys": None}
    if space.restrictions is None:
        kt_params = space.kt_params or space.params
        names = list(space.params)
        idx = {n: {json.dumps(v): i for i, v in enumerate(space.params[n])} for n in names}
        job["valid_keys"] = [kt_key([kt_params[n][idx[n][json.dumps(v)]] for n, v in zip(names, c)])
                             for c in space.configs]
    with tempfile.TemporaryDirectory() as tmp:
        jp, op = Path(tmp) / "job.json", Path(tmp) / "out.json"
        jp.write_text(json.dumps(job))
        proc = subprocess.run([kt_python, str(ROOT / "benchmarks" / "_kt_simulate.py"), str(jp), str(op)],
                              capture_output=True, text=True)
        if proc.returncode != 0 or not op.exists():
            res = {"strategy": strategy, "runs": [], "error": (proc.stderr or proc.stdout)[-2000:]}
        else:
            res = json.loads(op.read_text())
    if res.get("runs"):
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res))
    return space.name, strategy, res


def kt_rows(space: PublicSpace, strategy: str, res: Mapping[str, Any]) -> tuple[dict[str, Any], list[list[float | None]]]:
    """A Kernel Tuner strategy's row; a strategy whose every run failed before evaluating anything
    gets ``seeds: 0`` and its error (it is never Kernel Tuner's best)."""
    runs_all = res.get("runs") or []
    ok = [r for r in runs_all if r["times"]]
    if not ok:
        row = summarize(space, "kernel_tuner", strategy, [])
        row["seeds"] = 0
        err = res.get("error") or next((r["error"] for r in runs_all if r.get("error")), "no run")
        row["errors"] = len(runs_all)
        row["error"] = str(err).strip().splitlines()[0][:300] if err else "no run"
        for tol in TOLERANCES:
            row[f"median_evals_{tol * 100:g}pct"] = None
        return row, []
    runs = [r["times"] for r in ok]
    row = summarize(space, "kernel_tuner", strategy, runs, [r.get("error") for r in ok])
    row["kt_cpu_s_per_run"] = round(sum(r["cpu_s"] for r in ok) / len(ok), 3)
    return row, runs


# ------------------------------------------------------------------------------------------------
# figures
# ------------------------------------------------------------------------------------------------


def plot_evals(rows: Sequence[Mapping[str, Any]], default: str, path: Path, budget: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    mine = [r for r in rows if r["tuner"] == "tiletune" and r["strategy"] == default]
    spaces = [r["space"] for r in mine]
    cap = budget * 1.15
    me = [min(_inf(r["median_evals_5pct"]), cap) for r in mine]
    kt = [min(_inf(r.get("kt_median_evals_5pct")), cap) for r in mine]
    rnd = [r["random_expected_5pct"] for r in mine]
    x = np.arange(len(spaces))
    fig, ax = plt.subplots(figsize=(max(7.0, 0.55 * len(spaces) + 2), 4.2), dpi=80)
    ax.bar(x - 0.2, me, 0.4, label=f"tiletune {default}", color="#1f77b4")
    ax.bar(x + 0.2, kt, 0.4, label="Kernel Tuner best strategy", color="#ff7f0e")
    ax.scatter(x, rnd, marker="_", s=200, color="black", label="random (expected)", zorder=3)
    for i, r in enumerate(mine):
        ax.text(x[i] - 0.2, me[i] * 1.05, f"{r['reach_5pct']:.0%}", ha="center", fontsize=6, rotation=90)
        ax.text(x[i] + 0.2, kt[i] * 1.05, f"{(r.get('kt_best_strategy') or '')[:10]}", ha="center", fontsize=6,
                rotation=90)
    ax.set_yscale("log")
    ax.set_xticks(x)
    ax.set_xticklabels(spaces, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("median evals to within 5%", fontsize=8)
    ax.set_ylim(0.8, cap * 2.5)
    ax.grid(True, axis="y", which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=3, frameon=False)
    fig.suptitle(f"{budget}-evaluation budget (bars at the top: not reached); labels: tiletune's reach rate, "
                 "KT's best strategy", fontsize=8, y=0.995)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    small_png(path)


def plot_curves(spaces: Sequence[PublicSpace], curves: Mapping[tuple[str, str, str], list[list[float | None]]],
                strategies: Sequence[tuple[str, str]], path: Path, budget: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    n = len(spaces)
    cols = min(5, n)
    rows_ = math.ceil(n / cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(3.0 * cols, 2.3 * rows_), dpi=64, squeeze=False)
    x = np.arange(1, budget + 1)
    for ax, sp in zip(axes.flat, spaces):
        opt = sp.optimum
        worst = max(t for t in sp.times if t is not None) / opt
        for tuner, strat in strategies:
            runs = curves.get((sp.name, tuner, strat))
            if not runs:
                continue
            a = np.full((len(runs), budget), worst)
            for i, r in enumerate(runs):
                best = math.inf
                row = []
                for t in r[:budget]:
                    if t is not None:
                        best = min(best, t / opt)
                    row.append(min(best, worst))
                if row:
                    a[i, : len(row)] = row
                    a[i, len(row):] = row[-1]
            med = (np.median(a, axis=0) - 1.0) * 100
            ax.plot(x, np.maximum(med, 0.01), lw=1.2, label=f"{strat}" + (" (KT)" if tuner == "kernel_tuner" else ""),
                    ls="-" if tuner == "tiletune" else "--")
        ax.axhline(5.0, color="grey", lw=0.6, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(0.1, 300)
        ax.set_title(sp.name, fontsize=8)
        ax.tick_params(labelsize=6)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=7, frameon=False)
    fig.supylabel("median best found: % over optimum", fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.text(0.5, 0.045, "evaluations", ha="center", fontsize=8)
    fig.savefig(path)
    plt.close(fig)
    small_png(path)


# ------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------


def find_spaces(cachefiles: Path | None, kernels: Iterable[str], gpus: Iterable[str]) -> tuple[list[Path], list[str]]:
    found, missing = [], []
    for k in kernels:
        for g in gpus:
            p = cachefiles / k / f"{g}.json.gz" if cachefiles else None
            if p is None or not p.exists():
                q = cachefiles / k / f"{g}.json" if cachefiles else None
                if q is not None and q.exists():
                    found.append(q)
                    continue
                missing.append(f"{k}/{g}")
            else:
                found.append(p)
    return found, missing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cachefiles", type=Path, default=Path("/tmp/benchmark_hub/cachefiles"),
                    help="benchmark_hub's cachefiles/ folder (a copy outside this repository)")
    ap.add_argument("--kernels", nargs="*", default=list(KERNELS))
    ap.add_argument("--gpus", nargs="*", default=list(GPUS))
    ap.add_argument("--h200", nargs="*", default=None, help="H200 recordings (default benchmarks/spaces/*.json.gz)")
    ap.add_argument("--no-h200", action="store_true")
    ap.add_argument("--strategies", nargs="*", default=None, help="tiletune strategies (default: all registered "
                    "but exhaustive)")
    ap.add_argument("--default", default=None, help="the strategy the targets are evaluated for (default: 'auto' "
                    "when registered, else 'model')")
    ap.add_argument("--kt-strategies", nargs="*", default=list(KT_STRATEGIES))
    ap.add_argument("--kt-python", default="/tmp/ktv/bin/python",
                    help="interpreter of a virtual environment with kernel_tuner==1.5.0 ('' skips Kernel Tuner)")
    ap.add_argument("--kt-dir", type=Path, default=Path(tempfile.gettempdir()) / "strategies_public_kt",
                    help="Kernel Tuner's plain caches and per-strategy results (reused)")
    ap.add_argument("--tt-dir", type=Path, default=Path(tempfile.gettempdir()) / "strategies_public_tt",
                    help="tiletune's per-(space, strategy, seeds) results, reused while the strategy code is "
                         "unchanged ('' disables)")
    ap.add_argument("--tt-only", action="store_true", help="only run (and keep in --tt-dir) tiletune's results")
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--kt-slow-seeds", type=int, default=30,
                    help=f"seeds for the slow Kernel Tuner strategies ({', '.join(sorted(KT_SLOW))})")
    ap.add_argument("--kt-slowest-seeds", type=int, default=10,
                    help=f"seeds for the slowest Kernel Tuner strategies ({', '.join(sorted(KT_SLOWEST))})")
    ap.add_argument("--budget", type=int, default=500)
    ap.add_argument("--batch", type=int, default=1, help="configs per ask for tiletune's strategies")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 public spaces, no H200, 5 seeds")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--kt-only", action="store_true", help="only run (and keep in --kt-dir) Kernel Tuner's results")
    ap.add_argument("--slow-seeds", type=int, default=5,
                    help=f"seeds for tiletune's slow strategies ({', '.join(sorted(TT_SLOW))}: a refit per evaluation)")
    args = ap.parse_args(argv)

    from tiletune.space.strategies import STRATEGIES, make_strategy  # noqa: F401  (registration)
    import tiletune.space.strategies as _ts

    for mod in ("surrogate", "local", "portfolio"):  # issue 16's strategies register at import
        try:
            __import__(f"tiletune.space.strategies.{mod}")
        except ImportError:
            pass

    names = list(getattr(_ts, "STRATEGY_NAMES", ())) or sorted(STRATEGIES)
    for extra in sorted(STRATEGIES):
        if extra not in names:
            names.append(extra)
    default = args.default or ("auto" if "auto" in names else "model")
    strategies = args.strategies or [s for s in names if s != "exhaustive"]
    if default not in strategies:
        strategies.append(default)
    if args.quick:
        args.seeds = min(args.seeds, 5)
        args.kt_slow_seeds = min(args.kt_slow_seeds, 3)
        args.kt_slowest_seeds = min(args.kt_slowest_seeds, 2)
        args.slow_seeds = min(args.slow_seeds, 2)
        args.no_h200 = True
        args.kernels = args.kernels[:2] if args.kernels == list(KERNELS) else args.kernels
        args.gpus = args.gpus[:1] if args.gpus == list(GPUS) else args.gpus
    t_start = time.perf_counter()
    paths, missing = find_spaces(args.cachefiles, args.kernels, args.gpus)
    spaces: list[PublicSpace] = []
    for p in paths:
        try:
            spaces.append(load_hub_space(p))
        except Exception as exc:  # noqa: BLE001 - an unreadable file is reported, not fatal
            missing.append(f"{p.parent.name}/{p.name.split('.')[0]} (unreadable: {type(exc).__name__}: {exc})")
    if not args.no_h200:
        h200 = args.h200 if args.h200 is not None else sorted(str(p) for p in (ROOT / "benchmarks" / "spaces").glob("*.json.gz"))
        spaces += [load_h200_space(p) for p in h200]
    if not spaces:
        print("no spaces found", file=sys.stderr)
        return 2
    for sp in spaces:
        write_kt_cache(sp, args.kt_dir / "caches")
        print(f"{sp.name:>28}: {sp.n_configs} configs, {sp.n_valid} valid, optimum {sp.optimum:.4g} ms, "
              f"random expects {sp.random_expected(0.05):.1f} evals to 5%; KT restrictions: "
              f"{'expressions' if sp.restrictions else 'recorded configs'}", flush=True)
    if missing:
        print(f"missing spaces: {', '.join(missing)}", flush=True)

    seeds = list(range(args.seeds))
    jobs_tt = []
    chunk = max(1, math.ceil(len(seeds) / 4))
    for sp in spaces:
        for s in strategies if not args.kt_only else ():
            mine = seeds[: args.slow_seeds] if s in TT_SLOW else seeds
            for i in range(0, len(mine), chunk):
                jobs_tt.append((sp, s, mine[i:i + chunk], args.budget, args.batch,
                                str(args.tt_dir) if args.tt_dir else None))
    jobs_kt = []
    if args.kt_python and not args.tt_only:
        for sp in spaces:
            for s in args.kt_strategies:
                n = args.kt_slowest_seeds if s in KT_SLOWEST else args.kt_slow_seeds if s in KT_SLOW else args.seeds
                jobs_kt.append((sp, s, list(range(n)), args.budget, args.kt_python, str(args.kt_dir)))

    import multiprocessing as mp

    tt_runs: dict[tuple[str, str], list[list[float | None]]] = {}
    tt_cpu: dict[tuple[str, str], float] = {}
    kt_res: dict[tuple[str, str], dict[str, Any]] = {}
    with mp.get_context("fork").Pool(args.jobs) as pool:
        kt_async = pool.imap_unordered(_kt_job, jobs_kt)
        for name, strat, runs, cpu in pool.imap_unordered(_tiletune_job, jobs_tt):
            tt_runs.setdefault((name, strat), []).extend(runs)
            tt_cpu[(name, strat)] = tt_cpu.get((name, strat), 0.0) + cpu
        print(f"tiletune runs done ({time.perf_counter() - t_start:.0f} s)", flush=True)
        for name, strat, res in kt_async:
            kt_res[(name, strat)] = res
            print(f"  KT {name} {strat}: {len(res.get('runs') or [])} runs ({time.perf_counter() - t_start:.0f} s)",
                  flush=True)
    if args.kt_only or args.tt_only:
        return 0

    rows: list[dict[str, Any]] = []
    curves: dict[tuple[str, str, str], list[list[float | None]]] = {}
    for sp in spaces:
        for s in strategies:
            runs = tt_runs.get((sp.name, s), [])
            row = summarize(sp, "tiletune", s, runs)
            row["cpu_s_per_run"] = round(tt_cpu.get((sp.name, s), 0.0) / max(len(runs), 1), 4)
            rows.append(row)
            curves[(sp.name, "tiletune", s)] = runs
        for s in args.kt_strategies:
            if (sp.name, s) in kt_res:
                row, runs = kt_rows(sp, s, kt_res[(sp.name, s)])
                rows.append(row)
                curves[(sp.name, "kernel_tuner", s)] = runs
    attach_kt_best(rows)
    summary = targets(rows, default, args.budget, expected_public=len(KERNELS) * len(GPUS))
    summary["missing_public_spaces"] = missing
    kt_failed = sorted({(r["strategy"], r.get("error", "")) for r in rows if r["tuner"] == "kernel_tuner" and r.get("errors")})
    summary["kt_strategy_errors"] = [{"strategy": s, "error": e} for s, e in kt_failed]
    settings = {"budget": args.budget, "seeds": args.seeds, "kt_slow_seeds": args.kt_slow_seeds,
                "kt_slowest_seeds": args.kt_slowest_seeds, "kt_slowest_strategies": sorted(KT_SLOWEST),
                "slow_seeds": args.slow_seeds, "slow_strategies": sorted(TT_SLOW),
                "kt_slow_strategies": sorted(KT_SLOW), "batch": args.batch, "tolerances": list(TOLERANCES),
                "truth": "cache 'time' field (ms); H200 recordings: recorded median",
                "stop": "a run stops after its first config within 1% of the optimum",
                "spaces": [{"name": s.name, "source": Path(s.source).name, "kind": s.kind, "n_configs": s.n_configs,
                            "n_valid": s.n_valid, "optimum_ms": s.optimum,
                            "kt_restrictions": "expressions" if s.restrictions else "recorded configs"}
                           for s in spaces],
                "kernel_tuner": next((r.get("kernel_tuner") for r in kt_res.values() if r.get("kernel_tuner")), None),
                "quick": args.quick, "wall_s": round(time.perf_counter() - t_start, 1), "jobs": args.jobs,
                "evaluated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    path = args.out / f"strategies_public{suffix}.json"
    # one row per line: the file stays small and diffs stay readable
    path.write_text('{"rows": [\n' + ",\n".join(json.dumps(r) for r in rows) + '\n],\n"summary": '
                    + json.dumps(summary, indent=1) + ',\n"settings": ' + json.dumps(settings, indent=1) + "\n}\n")
    print(f"wrote {path}")
    # report
    print(f"\n{'space':>28} {'tiletune ' + default:>22} {'KT best':>34}  random")
    for e in summary["per_space"] + [{"space": r["space"], "median_evals_5pct": r["median_evals_5pct"],
                                      "reach_5pct": r["reach_5pct"], "kt_best_strategy": r.get("kt_best_strategy"),
                                      "kt_median_evals_5pct": r.get("kt_median_evals_5pct"),
                                      "kt_reach_5pct": r.get("kt_reach_5pct"), "meets": None}
                                     for r in rows if r["tuner"] == "tiletune" and r["strategy"] == default
                                     and r["kind"] != "public"]:
        rr = next(r for r in rows if r["space"] == e["space"] and r["tuner"] == "tiletune" and r["strategy"] == default)
        print(f"{e['space']:>28} {str(e['median_evals_5pct']):>12} ({e['reach_5pct']:.0%}) "
              f"{str(e['kt_best_strategy']):>20} {str(e['kt_median_evals_5pct']):>7} ({(e['kt_reach_5pct'] or 0):.0%})"
              f"  {rr['random_expected_5pct']:>7}  {'ok' if e['meets'] else ('MISS' if e['meets'] is False else '')}")
    print(f"\ntargets ({default}): beats KT best on {summary['beats_kt_best']} of {summary['public_spaces_evaluated']} "
          f"evaluated public spaces (target {summary['beats_kt_best_target']} of {summary['public_spaces_expected']}); "
          f"geomean ratio vs KT best {summary['geomean_ratio_vs_kt_best']} over {summary['geomean_spaces']} spaces "
          f"(target <= 0.7); <= 1/10 of random: {summary['vs_random_met']}")
    if not args.no_plots:
        png1 = args.out / f"strategies_public{suffix}_evals.png"
        plot_evals(rows, default, png1, args.budget)
        best_kt = {r["kt_best_strategy"] for r in rows if r.get("kt_best_strategy")}
        shown = [("tiletune", default), ("tiletune", "random")] + [("kernel_tuner", s) for s in sorted(best_kt)][:3]
        shown += [("tiletune", s) for s in strategies if s not in (default, "random")][:2]
        png2 = args.out / f"strategies_public{suffix}_curves.png"
        plot_curves(spaces, curves, shown, png2, args.budget)
        print(f"wrote {png1}\nwrote {png2}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
