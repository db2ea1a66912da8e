"""Evaluate search strategies on recorded spaces, without a GPU.

For a recorded space (a tiletune recording, or an imported Kernel Tuner cache / T4 file) the
*optimum* is the best recorded median among the successfully measured configs. Each strategy is
run once per seed through the real search driver (:func:`tiletune.engine.search.run_search`) and tuning
loop (:func:`tiletune.engine.tuner.run_loop`), answered by a :class:`~tiletune.devices.backends.simulated.SimulatedSession`
replaying the recording with a simulated clock (compile times list-scheduled over the compile
workers, samples drawn from the recorded ones). A run stops once it has evaluated a config within
the tightest tolerance (1%) of the optimum, or when the space is exhausted.

"Reached within 5%" is judged on the *recorded* time of each evaluated config (the ground truth),
not on the noisy median the run measured. The recorded time is the recording's own truth
(:attr:`Recording.truth <tiletune.lab.recordings.Recording.truth>`: the median of the samples, or for an
imported Kernel Tuner cache its ``time`` field, as Kernel Tuner scores it) unless ``truth=`` names the
other one. Per run we keep the number of evaluations (configs
proposed and run, failures included) and the simulated seconds (``known_at_s``: the session clock
when that config's first median was known, compilation included) to reach each tolerance, and the
best-found curve. Per strategy and space: median and 95% interval (2.5 / 97.5 percentiles) over
seeds, against random search's *expected* count: drawing without replacement from ``N`` configs of
which ``K`` are within the tolerance takes ``(N + 1) / (K + 1)`` draws on average.

``N`` counts every config of the space a strategy can propose, failing ones included (random search
cannot know in advance that they fail); ``n_valid`` in the results counts the successfully measured.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from tiletune.lab.recordings.replay import RecordedTiming
from tiletune.devices.backends.simulated import SimulatedSession
from tiletune.lab.recordings import Recording, load_any
from tiletune.records import Status
from tiletune.engine.search import Evaluation, run_search
from tiletune.space.spaces import Config, Space
from tiletune.space.strategies import STRATEGY_NAMES, Budget, make_strategy
from tiletune.engine.tuner import TunerOptions

__all__ = [
    "DEFAULT_TOLERANCES",
    "EVAL_STRATEGIES",
    "Run",
    "SpaceTruth",
    "evaluate",
    "load_truth",
    "plot_space",
    "random_expected_evals",
    "run_one",
    "summarize_runs",
    "write_results",
]

#: Tolerances reported, as relative excess over the optimum (5% and 1%).
DEFAULT_TOLERANCES: tuple[float, ...] = (0.05, 0.01)

#: Strategies evaluated by default (exhaustive for reference).
EVAL_STRATEGIES: tuple[str, ...] = STRATEGY_NAMES


def random_expected_evals(n: int, k: int) -> float:
    """Expected draws without replacement until one of ``k`` good items among ``n``: ``(n+1)/(k+1)``."""
    if k < 1 or n < k:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    return (n + 1) / (k + 1)


def _tol_key(tol: float) -> str:
    """``0.05 -> "5pct"``, ``0.01 -> "1pct"``, ``0.005 -> "0.5pct"``."""
    pct = tol * 100
    return f"{pct:g}pct"


@dataclass(frozen=True)
class SpaceTruth:
    """A recorded space with its ground truth.

    Attributes:
        name: short name (the file name without ``.json.gz``).
        recording: the recording.
        space: the tiletune space whose valid configs are the recorded ones.
        arch: the architecture used for the space (None when the recording names none).
        truth: recorded median (us) of every config of the space, None for a failed one.
        optimum_us: the best recorded median.
        n_configs: configs in the space (failed ones included).
        n_valid: configs measured successfully.
        truth_field: which recorded time is the truth (``"time"`` or ``"times-median"``, see
            :data:`tiletune.lab.recordings.format.TRUTHS`).
    """

    name: str
    recording: Recording
    space: Space
    arch: str | None
    truth: Mapping[Config, float | None]
    optimum_us: float
    n_configs: int
    n_valid: int
    truth_field: str = "times-median"

    def within(self, tol: float) -> int:
        """How many configs are within ``tol`` of the optimum (``median <= (1 + tol) * optimum``)."""
        limit = (1.0 + tol) * self.optimum_us
        return sum(1 for v in self.truth.values() if v is not None and v <= limit)

    def random_expected(self, tol: float) -> float:
        """Random search's expected evaluations to get within ``tol`` (sampling without replacement)."""
        return random_expected_evals(self.n_configs, self.within(tol))


def load_truth(source: str | os.PathLike | Recording, name: str | None = None, baseline: bool = True,
               truth: str | None = None) -> SpaceTruth:
    """Load a recording (any format :func:`tiletune.lab.recordings.load_any` knows) with its truth.

    ``baseline=False`` drops the recorded baseline from the space, so strategies start from their own
    first proposals: with a good hand-picked baseline the "within 5%" figures otherwise measure the
    baseline, not the search. ``truth`` picks the recorded time that is the truth (``"time"`` or
    ``"times-median"``; None: the recording's own, :attr:`Recording.truth`); a recording that does not
    have it (``"time"`` of a tiletune recording, which holds samples only) raises ValueError.
    """
    from tiletune.lab.recordings.format import TRUTHS

    if truth is not None and truth not in TRUTHS:
        raise ValueError(f"truth must be one of {', '.join(TRUTHS)}, got {truth!r}")
    rec = source if isinstance(source, Recording) else load_any(source)
    field = rec.truth if truth is None else truth
    if field not in rec.truths:
        raise ValueError(f"{rec.source} cannot be scored by '{field}' ({TRUTHS[field]}): it records only "
                         f"{', '.join(rec.truths)}")
    if name is None:
        base = Path(rec.source).name if rec.source != "<memory>" else rec.name
        name = re.sub(r"(\.json)?(\.gz)?$", "", base) or rec.name
    arch = rec.device.arch if re.fullmatch(r"sm_\d+", rec.device.arch or "") else None
    space = rec.space_from_params(baseline=baseline)
    truth: dict[Config, float | None] = {}
    for cfg in space.candidates(arch):
        truth[cfg] = rec.truth_us(cfg, field)
    ok = [v for v in truth.values() if v is not None]
    if not ok:
        raise ValueError(f"{rec.source}: no successfully measured config: no optimum to search for")
    return SpaceTruth(name, rec, space, arch, truth, min(ok), len(truth), len(ok), field)


@dataclass(frozen=True)
class Run:
    """One strategy run with one seed on one space.

    Attributes:
        evals_to: tolerance -> evaluations (1-based count) until a config within it was evaluated
            (None: never, within the run).
        seconds_to: tolerance -> simulated session seconds until that config's median was known.
        curve: best recorded median found so far / optimum, after each evaluation (inf before the
            first success).
        evaluations: configs evaluated.
        session_s: simulated session seconds at the end.
        stopped: why the run ended (see :class:`tiletune.engine.search.SearchResult`).
        winner_excess: the run's chosen winner's recorded median / optimum - 1.
    """

    space: str
    strategy: str
    seed: int
    evals_to: Mapping[float, int | None]
    seconds_to: Mapping[float, float | None]
    curve: tuple[float, ...]
    evaluations: int
    session_s: float
    stopped: str
    winner_excess: float | None = None


def run_one(
    truth: SpaceTruth,
    strategy: str,
    seed: int,
    *,
    tolerances: Sequence[float] = DEFAULT_TOLERANCES,
    workers: int = 16,
    batch: int | None = None,
    options: TunerOptions = TunerOptions(),
    max_evals: int | None = None,
    strategy_options: Mapping[str, Any] | None = None,
) -> Run:
    """Run ``strategy`` with ``seed`` on ``truth``'s recording through the real search loop.

    The run stops once a config within ``min(tolerances)`` of the optimum was evaluated, after
    ``max_evals`` evaluations, or when the space is exhausted.
    """
    opt = truth.optimum_us
    tight = (1.0 + min(tolerances)) * opt
    session = SimulatedSession(RecordedTiming(truth.recording), workers=workers, seed=seed)
    strat = make_strategy(strategy, truth.space, truth.arch, seed, **dict(strategy_options or {}))
    seen = [0]

    def reached(evals: Sequence[Evaluation]) -> bool:
        hit = any((truth.truth.get(e.config) or math.inf) <= tight for e in evals[seen[0]:])
        seen[0] = len(evals)
        return hit

    res = run_search(session, strat, Budget(max_evals=max_evals), options, batch=batch, stop_when=reached)
    curve: list[float] = []
    best = math.inf
    evals_to: dict[float, int | None] = {t: None for t in tolerances}
    seconds_to: dict[float, float | None] = {t: None for t in tolerances}
    for e in res.evaluations:
        v = truth.truth.get(e.config)
        if v is not None and v < best:
            best = v
        curve.append(best / opt)
        for t in tolerances:
            if evals_to[t] is None and v is not None and v <= (1.0 + t) * opt:
                evals_to[t] = e.index + 1
                seconds_to[t] = e.known_at_s if e.known_at_s is not None else res.wall_s
    win = None
    if res.winner is not None and truth.truth.get(res.winner.config) is not None:
        win = truth.truth[res.winner.config] / opt - 1.0  # type: ignore[operator]
    return Run(truth.name, strategy, seed, evals_to, seconds_to, tuple(curve), len(res.evaluations),
               res.wall_s, res.stopped, win)


def _stats(values: Sequence[float | None]) -> tuple[float | None, float | None, float | None]:
    """Median, 2.5 and 97.5 percentiles; a run that never reached counts as +inf (reported as None)."""
    x = np.asarray([math.inf if v is None else float(v) for v in values], dtype=np.float64)
    if x.size == 0:
        return None, None, None
    method = "linear" if np.all(np.isfinite(x)) else "nearest"
    q = np.percentile(x, [50.0, 2.5, 97.5], method=method)
    return tuple(None if not math.isfinite(v) else round(float(v), 4) for v in q)  # type: ignore[return-value]


def summarize_runs(truth: SpaceTruth, strategy: str, runs: Sequence[Run],
                   tolerances: Sequence[float] = DEFAULT_TOLERANCES, target_ratio: float = 0.1) -> dict[str, Any]:
    """One result row: medians and 95% intervals over seeds, random's expectation, the target check."""
    rec = truth.recording
    row: dict[str, Any] = {
        "space": truth.name,
        "n_valid": truth.n_valid,
        "n_configs": truth.n_configs,
        "strategy": strategy,
        "seeds": len(runs),
        "optimum_us": round(truth.optimum_us, 3),
        "device": rec.device.name,
        "arch": rec.device.arch,
        "recorded": rec.recorded,
        "recording_versions": dict(rec.versions),
        "synthetic": "SYNTHETIC" in rec.note.upper() or "synthetic" in rec.device.name.lower(),
        "truth": truth.truth_field,
    }
    for t in tolerances:
        k = _tol_key(t)
        med, lo, hi = _stats([r.evals_to[t] for r in runs])
        row[f"median_evals_to_{k}"] = med
        row[f"evals_to_{k}_ci95"] = [lo, hi]
        smed, slo, shi = _stats([r.seconds_to[t] for r in runs])
        row[f"median_seconds_to_{k}"] = smed
        row[f"seconds_to_{k}_ci95"] = [slo, shi]
        row[f"reached_{k}"] = sum(r.evals_to[t] is not None for r in runs) / max(len(runs), 1)
        row[f"configs_within_{k}"] = truth.within(t)
        expected = truth.random_expected(t)
        row[f"random_expected_evals_to_{k}"] = round(expected, 3)
        row[f"ratio_to_random_{k}"] = None if med is None else round(med / expected, 4)
    r5 = row.get(f"ratio_to_random_{_tol_key(0.05)}")
    row["meets_target_5pct"] = (r5 is not None and r5 <= target_ratio) if 0.05 in tolerances else None
    row["median_session_s"] = round(float(np.median([r.session_s for r in runs])), 3) if runs else None
    return row


ProgressCb = Callable[[str], None]


def evaluate(
    sources: Iterable[str | os.PathLike | Recording | SpaceTruth],
    strategies: Sequence[str] = EVAL_STRATEGIES,
    seeds: int = 100,
    *,
    tolerances: Sequence[float] = DEFAULT_TOLERANCES,
    workers: int = 16,
    batch: int | None = None,
    options: TunerOptions = TunerOptions(),
    exhaustive_seeds: int | None = 10,
    progress: ProgressCb | None = None,
    baseline: bool = True,
    max_evals: int | None = None,
    truth: str | None = None,
) -> tuple[list[dict[str, Any]], dict[tuple[str, str], list[Run]], list[SpaceTruth]]:
    """Evaluate ``strategies`` on every space, ``seeds`` seeds each (seeds ``0 .. seeds-1``).

    ``max_evals`` caps each run's evaluations (None: until the tightest tolerance is reached or the
    space is exhausted); ``baseline`` and ``truth`` are :func:`load_truth`'s (for sources that are not
    loaded yet).

    Exhaustive search proposes in a fixed order, so its evaluation counts do not depend on the
    seed; ``exhaustive_seeds`` (default 10; None: ``seeds``) limits its runs to save time.

    Returns ``(rows, runs, truths)``: the result rows (see :func:`summarize_runs`), every run by
    ``(space, strategy)``, and the loaded spaces.
    """
    truths = [s if isinstance(s, SpaceTruth) else load_truth(s, baseline=baseline, truth=truth) for s in sources]
    rows: list[dict[str, Any]] = []
    all_runs: dict[tuple[str, str], list[Run]] = {}
    for truth in truths:
        for strategy in strategies:
            n = seeds if strategy != "exhaustive" or exhaustive_seeds is None else min(seeds, exhaustive_seeds)
            t0 = time.perf_counter()
            runs = [run_one(truth, strategy, seed, tolerances=tolerances, workers=workers, batch=batch,
                            options=options, max_evals=max_evals) for seed in range(n)]
            all_runs[(truth.name, strategy)] = runs
            row = summarize_runs(truth, strategy, runs, tolerances)
            row["budget_evals"] = max_evals
            row["cpu_s"] = round(time.perf_counter() - t0, 2)
            rows.append(row)
            if progress is not None:
                k5, k1 = _tol_key(tolerances[0]), _tol_key(tolerances[-1])
                progress(f"{truth.name:>24} {strategy:>12}: evals to {k5} {row[f'median_evals_to_{k5}']} "
                         f"(random expects {row[f'random_expected_evals_to_{k5}']}), to {k1} "
                         f"{row[f'median_evals_to_{k1}']}, {row['cpu_s']} s")
    return rows, all_runs, truths


def write_results(rows: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike,
                  settings: Mapping[str, Any] | None = None, name: str = "strategies.json") -> Path:
    """Write ``rows`` as a JSON list to ``out_dir/name``; each row also names the evaluation settings,
    the date and the versions (the recording's device and versions are in the row already)."""
    import importlib.metadata as md

    def version(pkg: str) -> str:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "missing"

    meta = {
        "evaluated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "evaluation": dict(settings or {}),
        "software": {"tiletune": version("tiletune"), "scikit-learn": version("scikit-learn"),
                     "numpy": version("numpy")},
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps([{**r, **meta} for r in rows], indent=1) + "\n")
    return path


def _curves(runs: Sequence[Run], length: int, cap: float) -> np.ndarray:
    """Runs' best-found curves as a (runs, length) array, held at their last value, capped."""
    out = np.full((len(runs), length), cap, dtype=np.float64)
    for i, r in enumerate(runs):
        c = np.minimum(np.asarray(r.curve[:length], dtype=np.float64), cap)
        out[i, : c.size] = c
        if 0 < c.size < length:
            out[i, c.size:] = c[-1]
    return out


def plot_space(truth: SpaceTruth, runs: Mapping[str, Sequence[Run]], path: str | os.PathLike,
               tolerances: Sequence[float] = DEFAULT_TOLERANCES, title: str | None = None) -> Path:
    """PNG of the median best-found (excess over the optimum, %) vs evaluations, one line per strategy.

    The band is the interquartile range over seeds; a run that stopped (it reached the tightest
    tolerance) is held at the value it reached. The dashed vertical line is random search's expected
    evaluations to the loosest tolerance. Needs matplotlib (``pip install 'tiletune[plots]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("plots need matplotlib: pip install 'tiletune[plots]'") from exc
    worst = max(v for v in truth.truth.values() if v is not None) / truth.optimum_us
    loose = max(tolerances)
    horizon = min(truth.n_configs, max(20, int(math.ceil(2.5 * truth.random_expected(loose)))))
    for rs in runs.values():
        reach = [r.evals_to[min(tolerances)] for r in rs if r.evals_to[min(tolerances)] is not None]
        if reach:
            horizon = max(horizon, min(truth.n_configs, int(np.percentile(reach, 75))))
    x = np.arange(1, horizon + 1)
    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=120)
    for strategy, rs in runs.items():
        if not rs:
            continue
        a = (_curves(rs, horizon, worst) - 1.0) * 100.0
        med = np.median(a, axis=0)
        lo, hi = np.percentile(a, [25.0, 75.0], axis=0)
        (line,) = ax.plot(x, med, label=f"{strategy} ({len(rs)} seeds)", lw=1.8)
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
    for t in tolerances:
        ax.axhline(t * 100.0, color="grey", lw=0.8, ls=":")
    ax.axvline(truth.random_expected(loose), color="black", lw=0.9, ls="--",
               label=f"random expected to {loose * 100:g}% ({truth.random_expected(loose):.1f})")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xscale("log")
    ax.set_xlim(1, horizon)
    start = max((float(np.median([r.curve[0] for r in rs if r.curve])) for rs in runs.values() if rs), default=worst)
    top = max(min(worst, start) - 1.0, 2.0 * loose) * 100.0
    ax.set_ylim(0, top * 1.3)
    ax.set_xlabel("evaluations (configs compiled and measured)")
    ax.set_ylabel("best found: % slower than the optimum")
    ax.set_title(title or f"{truth.name}: {truth.n_configs} configs ({truth.n_valid} valid), "
                          f"{truth.recording.device.name}", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out

