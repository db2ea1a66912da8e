"""The search driver: a strategy proposes, the tuning loop measures, the strategy learns.

:func:`run_search` asks the strategy for a batch (by default as many configs as there are compile
workers, so the compile pool stays full), measures the batch with the very same
:func:`tiletune.engine.tuner.run_loop` that exhaustive tuning uses (parallel compile, correctness check,
adaptive sampling, racing against the best found so far), tells the strategy each config's median
(None for a failure), and stops when the :class:`~tiletune.space.strategies.Budget` is spent (evaluations,
or seconds of the session clock, compilation included) or the strategy has nothing left. The winner
is ranked over everything measured with :func:`tiletune.stats.rank`, as in exhaustive tuning.

Live tuning (the cuTile session) and replay (a simulated session answering from a recording) go
through exactly this code; only the session differs.

**The default search** (``strategy=None``): :func:`default_search`. A space of at most
:data:`EXHAUSTIVE_MAX_CONFIGS` valid configs is tuned exhaustively (every config, raced), as before,
unless an evaluation budget smaller than the space is given; a bigger one, a budgeted one, or one too big to enumerate (:mod:`tiletune.space.lazy`), with the ``"auto"`` strategy,
which picks by the space's size and type (:class:`tiletune.space.strategies.portfolio.AutoStrategy`), under
the given budget or, without one, :data:`DEFAULT_SEARCH_EVALS` evaluations.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence
from tiletune.devices.backends.base import Candidate, TuningSession
from tiletune.records import Measurement, Status
from tiletune.space.spaces import Config, Space
from tiletune.stats import Entry, SampleSummary, rank, summarize
from tiletune.space.strategies.base import Budget, Strategy
from tiletune.engine.tuner import LoopResult, PhaseTimer, ProgressFn, TunerOptions, log_phases, run_loop, showdown

logger = logging.getLogger("tiletune")

__all__ = ["Evaluation", "SearchResult", "run_search", "default_search", "DEFAULT_BATCH",
           "EXHAUSTIVE_MAX_CONFIGS", "DEFAULT_SEARCH_EVALS"]

#: Batch size when the session does not say how many compile workers it has.
DEFAULT_BATCH = 16

#: The default search measures every config of a space of at most this many valid configs (exhaustive,
#: raced); a bigger space is searched with ``"auto"``.
EXHAUSTIVE_MAX_CONFIGS = 1024

#: Evaluations the default search spends on a space bigger than :data:`EXHAUSTIVE_MAX_CONFIGS` when no
#: budget is given (the budget of the public-space comparison of issue 16).
DEFAULT_SEARCH_EVALS = 500


def default_search(space: Space, arch: str | None, budget: Budget | None) -> tuple[str, Budget]:
    """The strategy name and budget of a tuning that names no strategy (see the module docstring).

    ``"exhaustive"`` with ``budget`` (or no limit) for a space of at most :data:`EXHAUSTIVE_MAX_CONFIGS`
    valid configs on ``arch`` that ``budget`` lets it measure whole (an evaluation budget smaller than
    the space would cut exhaustive search off at an arbitrary config); otherwise ``"auto"`` with ``budget``, or with
    ``Budget(max_evals=DEFAULT_SEARCH_EVALS)`` when ``budget`` limits nothing. A space too big to
    enumerate (``space.is_lazy(arch)``) is never listed to decide.
    """
    budget = budget or Budget()
    if not space.is_lazy(arch):
        size = space.size(arch)
        if size <= EXHAUSTIVE_MAX_CONFIGS and (budget.max_evals is None or budget.max_evals >= size):
            return "exhaustive", budget
    if budget.unlimited:
        budget = Budget(max_evals=DEFAULT_SEARCH_EVALS)
    return "auto", budget


@dataclass(frozen=True)
class Evaluation:
    """One proposed config, in proposal order.

    Attributes:
        index: 0-based proposal position (also the candidate's ``order``).
        config: the configuration.
        status: OK or the failure.
        median_us: the measured median (None for a failure).
        known_at_s: session clock when its first result (median or failure) was known.
        batch: which batch (0-based) it was proposed in.
    """

    index: int
    config: Config
    status: Status
    median_us: float | None
    known_at_s: float | None
    batch: int


@dataclass(frozen=True)
class SearchResult:
    """What a search found. Has every field of :class:`tiletune.engine.tuner.LoopResult` (same meaning).

    Attributes:
        measurements: every proposed config's measurement, in proposal order.
        winner / winner_median_us / tied: the ranked winner over all batches.
        wall_s: the session clock at the end (simulated for replay).
        samples_taken: timing samples over all batches.
        evaluations: per proposed config, in proposal order (see :class:`Evaluation`).
        stopped: why the search ended: ``"max_evals"``, ``"max_seconds"``, ``"exhausted"`` (the
            strategy proposed the whole space), ``"strategy_done"`` or ``"stop_when"``.
        strategy: the strategy's name.
        batches: how many batches were measured.
        phases: where the session's time went (see :class:`tiletune.engine.tuner.PhaseTimer`).
    """

    measurements: tuple[Measurement, ...]
    winner: Candidate | None
    winner_median_us: float | None
    tied: tuple[Candidate, ...]
    wall_s: float
    samples_taken: int
    evaluations: tuple[Evaluation, ...]
    stopped: str
    strategy: str
    batches: int
    phases: Mapping[str, float] = dataclasses.field(default_factory=dict)


def _batch_size(session: TuningSession, batch: int | None) -> int:
    if batch is not None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        return batch
    workers = getattr(session, "workers", None)
    if workers is None:
        pool = getattr(session, "pool", None)
        workers = getattr(pool, "workers", None)
    return int(workers) if isinstance(workers, int) and workers > 0 else DEFAULT_BATCH


def _summary(m: Measurement) -> SampleSummary | None:
    return summarize(m.samples_us) if (m.status is Status.OK and m.samples_us) else None


def run_search(
    session: TuningSession,
    strategy: Strategy,
    budget: Budget = Budget(),
    options: TunerOptions = TunerOptions(),
    batch: int | None = None,
    progress: ProgressFn | None = None,
    name: str = "op",
    stop_when: Callable[[Sequence[Evaluation]], bool] | None = None,
    prior: Mapping[str, Measurement] | None = None,
    on_result: Callable[[Measurement], None] | None = None,
) -> SearchResult:
    """Search with ``strategy`` in ``session`` under ``budget``; return every measurement and the winner.

    Args:
        session: an open tuning session (live, fake or replay); the caller calls ``finish``.
        strategy: a fresh strategy over the space and architecture being tuned.
        budget: evaluations and/or session seconds. The evaluation limit is exact (the last batch
            is cut to fit); the seconds limit is checked before each batch and inside the loop
            (a config compiled after the deadline is not measured).
        options: the tuning loop's options; ``options.max_seconds`` and ``budget.max_seconds``
            combine (the smaller wins).
        batch: configs per ask (default: the session's compile workers, else :data:`DEFAULT_BATCH`).
        progress: ``progress(message, done, total)``; ``total`` is the evaluation budget, or the
            number of valid configs when evaluations are unlimited.
        name: the op name for logs.
        stop_when: called with all evaluations so far after each batch; True ends the search
            (e.g. "a config below 100 us was found"; the strategy evaluation stops a run once it
            is within 1% of a recorded optimum).
        prior / on_result: resuming an interrupted session, see :func:`tiletune.engine.tuner.run_loop`.
    """
    timer = session if isinstance(session, PhaseTimer) else PhaseTimer(session)
    session = timer  # type: ignore[assignment]
    size = _batch_size(session, batch)
    limits = [s for s in (options.max_seconds, budget.max_seconds) if s is not None]
    loop_options = dataclasses.replace(options, max_seconds=min(limits)) if limits else options
    deadline = loop_options.max_seconds
    total = budget.max_evals if budget.max_evals is not None else len(strategy.pool)
    measurements: list[Measurement] = []
    evaluations: list[Evaluation] = []
    candidates: dict[int, Candidate] = {}
    contenders: dict[int, SampleSummary] = {}  # OK and not raced out: ranked at the end
    incumbent: SampleSummary | None = None
    samples = 0
    batches = 0
    stopped = "strategy_done"

    def batch_progress(msg: str, done: int, _total: int) -> None:
        if progress is not None:
            progress(msg, len(measurements) + done, total)

    while True:
        if budget.max_evals is not None and len(evaluations) >= budget.max_evals:
            stopped = "max_evals"
            break
        if deadline is not None and session.clock() >= deadline:
            stopped = "max_seconds"
            break
        if strategy.done:
            stopped = "exhausted"
            break
        want = size
        if budget.max_evals is not None:
            want = min(want, budget.max_evals - len(evaluations))
        configs = strategy.ask(want)
        if not configs:
            stopped = "exhausted" if strategy.done else "strategy_done"
            break
        base = strategy.baseline
        cands = [
            Candidate(c, len(evaluations) + i, is_baseline=(base is not None and c == base))
            for i, c in enumerate(configs)
        ]
        loop: LoopResult = run_loop(
            session, cands, loop_options, batch_progress, name, incumbent=incumbent, showdown=False,
            prior=prior, on_result=on_result,
        )
        told: list[tuple[Config, float | None]] = []
        for cand, m, known in zip(cands, loop.measurements, loop.known_at_s or (None,) * len(cands)):
            candidates[cand.order] = cand
            measurements.append(m)
            s = _summary(m)
            median = s.median if s is not None else None
            evaluations.append(Evaluation(cand.order, cand.config, m.status, median, known, batches))
            told.append((cand.config, median))
            if s is not None:
                if m.reason != "raced_out":
                    contenders[cand.order] = s
                if incumbent is None or s.median < incumbent.median:
                    incumbent = s
        samples += loop.samples_taken
        batches += 1
        strategy.tell(told)
        if stop_when is not None and stop_when(evaluations):
            stopped = "stop_when"
            logger.debug("%s: stop_when after %d evaluations", name, len(evaluations))
            break
        logger.debug("%s: batch %d, %d evaluated, best %s", name, batches, len(evaluations),
                     f"{incumbent.median:.2f} us" if incumbent else "-")

    winner: Candidate | None = None
    winner_median: float | None = None
    tied: tuple[Candidate, ...] = ()
    if contenders or incumbent is not None:
        pool = contenders or {
            e.index: summarize(measurements[e.index].samples_us) for e in evaluations if e.median_us is not None
        }
        # one interleaved showdown across all batches: drift between batches cannot pick the winner
        measured = {e.index: summarize(measurements[e.index].samples_us) for e in evaluations if e.median_us is not None}
        fresh, errors = showdown(session, [(candidates[i], s) for i, s in measured.items()], options)
        for i, reason in errors.items():
            measurements[i] = dataclasses.replace(measurements[i], status=Status.LAUNCH_ERROR, reason=reason)
            pool.pop(i, None)
        for i, extra in fresh.items():
            measurements[i] = dataclasses.replace(measurements[i], samples_us=measurements[i].samples_us + tuple(extra))
            samples += len(extra)
        if fresh:
            pool = {i: summarize(v) for i, v in fresh.items()}
        ranking = rank(
            [Entry(i, candidates[i].is_baseline, s) for i, s in pool.items()],
            min_band=options.min_tie_band,
            max_band=options.max_tie_band,
        )
        winner = candidates[ranking.winner.ident]
        winner_median = ranking.winner.summary.median
        tied = tuple(candidates[e.ident] for e in ranking.tied)
    phases = timer.phases()
    log_phases(name, phases)
    return SearchResult(
        measurements=tuple(measurements),
        winner=winner,
        winner_median_us=winner_median,
        tied=tied,
        wall_s=session.clock(),
        samples_taken=samples,
        evaluations=tuple(evaluations),
        stopped=stopped,
        strategy=strategy.name,
        batches=batches,
        phases=phases,
    )

