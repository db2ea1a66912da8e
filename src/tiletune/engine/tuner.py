"""The tuning loop: one piece of code for live GPU tuning and for simulated (fake, replay) tuning.

Flow for one session: candidates are compiled by the backend (in parallel where it can) and handed
over as they finish; each compiled candidate is checked against the reference, then measured in
batches. While compilation continues the GPU already measures whatever is ready. Candidates that
clearly cannot win are raced out; contenders get samples until their confidence interval is tight.
The winner is picked by :func:`tiletune.stats.rank`: the fastest median (the baseline where it is
within the smallest band of it), with the candidates inside the noise band reported as tied.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from tiletune.devices.backends.base import Candidate, CheckOutcome, CompileOutcome, TuningSession
from tiletune.records import Measurement, Status, config_hash
from tiletune.stats import Entry, SampleSummary, StoppingRule, hopeless, raced_out, rank, summarize

logger = logging.getLogger("tiletune")


@dataclass(frozen=True)
class TunerOptions:
    """Knobs of the tuning loop. The defaults suit kernels from a few microseconds to a few ms."""

    stopping: StoppingRule = field(default_factory=StoppingRule)
    batch: int = 10  # samples per measurement batch
    race_margin: float = 0.02  # raced out when its CI lies this far above the best's
    hopeless_factor: float = 3.0  # raced out when its median is this many times the best's
    min_tie_band: float = 0.01
    max_tie_band: float = 0.03
    max_seconds: float | None = None  # wall-clock budget of the whole session (compile included)
    #: Final showdown: the candidates whose median is within ``showdown_band`` of the best (at most
    #: ``showdown_max``, raced-out ones included) are re-measured in ``showdown_rounds`` interleaved
    #: rounds of ``batch`` samples, and the winner is ranked on those samples alone. Interleaving
    #: cancels drift (clocks ramping, thermals, a neighbour's load) that separate phases would see.
    showdown_rounds: int = 4
    showdown_band: float = 0.10
    showdown_max: int = 8


@dataclass
class _State:
    cand: Candidate
    status: Status = Status.OK
    reason: str = ""
    compile_s: float | None = None
    samples: list[float] = field(default_factory=list)
    spent_s: float = 0.0
    done: str | None = None  # why measuring stopped ("converged", "raced_out", ...)
    summary: SampleSummary | None = None
    known_at_s: float | None = None  # session clock when its first result (median or failure) was known

    def add(self, samples: Sequence[float]) -> None:
        self.samples.extend(samples)
        self.spent_s += sum(samples) * 1e-6
        self.summary = summarize(self.samples)

    def measurement(self) -> Measurement:
        reason = self.reason or (self.done or "")
        return Measurement(
            config=self.cand.config.as_dict(),
            status=self.status,
            reason=reason,
            samples_us=tuple(self.samples),
            compile_s=self.compile_s,
            order=self.cand.order,
            is_baseline=self.cand.is_baseline,
        )


@dataclass(frozen=True)
class LoopResult:
    """What the loop decided: every candidate's measurement, the winner and its tied set."""

    measurements: tuple[Measurement, ...]
    winner: Candidate | None
    winner_median_us: float | None
    tied: tuple[Candidate, ...]
    wall_s: float
    samples_taken: int
    #: Per candidate, in candidate order: the session clock (s) when its first result was known
    #: (first median, or its failure). ``None`` for a candidate that never got that far.
    known_at_s: tuple[float | None, ...] = ()


ProgressFn = Callable[[str, int, int], None]  # (message, done, total)


#: The phases of :class:`PhaseTimer`, in the order of its log line. The first five are disjoint and
#: add up to ``wall_s``; ``compile_wall_s`` and ``compile_cpu_s`` overlap the others.
PHASES = ("worker_start_s", "compile_s", "check_s", "timing_s", "idle_s")


class PhaseTimer:
    """A session seen through a stopwatch: where a tuning session's time goes.

    Wraps a :class:`~tiletune.devices.backends.base.TuningSession` and adds up, on the session's own
    clock (wall time live, the simulated clock for fake and replay sessions), the time the search
    spent blocked in each primitive:

    * ``compile_s``: waiting for the next compile result (compiles running while candidates are
      checked and timed cost nothing here: that is the overlap);
    * ``check_s``: correctness runs (a first launch that compiles again counts here);
    * ``timing_s``: GPU measurement (samples, showdown included);
    * ``worker_start_s``: waiting for the tuning worker to be ready (the session's ``worker_wait_s``,
      a worker started in the background before the session included);
    * ``idle_s``: the rest of ``wall_s`` (opening the session, shipping arguments, the strategy, the loop).

    Besides: ``compile_wall_s`` (from each compile request to its last result, summed over batches)
    and ``compile_cpu_s`` (CPU seconds summed over every compile, across processes and threads, the
    caller's compiles ahead included: the session's ``ahead_cpu_s``; waiting for those to hand over
    counts in ``compile_s``).
    Everything else is forwarded to the wrapped session.
    """

    def __init__(self, session: TuningSession) -> None:
        self.session = session
        self.compile_s = self.check_s = self.timing_s = 0.0
        self.compile_wall_s = self.compile_cpu_s = 0.0
        self.compiled = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    def clock(self) -> float:
        return self.session.clock()

    def compile(self, candidates: Sequence[Candidate]) -> Iterator[CompileOutcome]:
        it = iter(self.session.compile(candidates))
        start = last = self.clock()
        try:
            while True:
                t = self.clock()
                try:
                    outcome = next(it)
                except StopIteration:
                    self.compile_s += self.clock() - t
                    return
                last = self.clock()
                self.compile_s += last - t
                self.compiled += 1
                cpu = getattr(outcome, "cpu_s", None)
                self.compile_cpu_s += float(cpu if cpu is not None else (outcome.seconds or 0.0))
                yield outcome
        finally:
            self.compile_wall_s += max(0.0, last - start)

    def check(self, candidate: Candidate) -> CheckOutcome:
        t = self.clock()
        try:
            return self.session.check(candidate)
        finally:
            self.check_s += self.clock() - t

    def sample(self, candidate: Candidate, n: int) -> list[float]:
        t = self.clock()
        try:
            return self.session.sample(candidate, n)
        finally:
            self.timing_s += self.clock() - t

    def finish(self, winner: Candidate | None) -> None:
        self.session.finish(winner)

    def phases(self) -> dict[str, float]:
        """Seconds per phase so far (see the class docstring); ``wall_s`` is the session clock."""
        wall = float(self.clock())
        stats = getattr(self.session, "stats", None)
        start = stats.get("worker_wait_s", 0.0) if isinstance(stats, Mapping) else 0.0
        start = float(start) if isinstance(start, (int, float)) and not isinstance(start, bool) else 0.0
        ahead = stats.get("ahead_cpu_s", 0.0) if isinstance(stats, Mapping) else 0.0
        ahead = float(ahead) if isinstance(ahead, (int, float)) and not isinstance(ahead, bool) else 0.0
        busy = start + self.compile_s + self.check_s + self.timing_s
        return {
            "wall_s": round(wall, 4),
            "worker_start_s": round(start, 4),
            "compile_s": round(self.compile_s, 4),
            "check_s": round(self.check_s, 4),
            "timing_s": round(self.timing_s, 4),
            "idle_s": round(max(0.0, wall - busy), 4),
            "compile_wall_s": round(self.compile_wall_s, 4),
            "compile_cpu_s": round(self.compile_cpu_s + ahead, 4),
            "compiled": self.compiled,
        }


def log_phases(name: str, phases: Mapping[str, float]) -> None:
    """The one INFO line per tuning session that says where its time went."""
    logger.info(
        "%s: %.2f s: worker start %.2f, compile wait %.2f (compiling %.2f s wall, %.2f CPU-s over %d), "
        "checks %.2f, timing %.2f, idle %.2f",
        name, phases["wall_s"], phases["worker_start_s"], phases["compile_s"], phases["compile_wall_s"],
        phases["compile_cpu_s"], phases["compiled"], phases["check_s"], phases["timing_s"], phases["idle_s"],
    )


def run_loop(
    session: TuningSession,
    candidates: Sequence[Candidate],
    options: TunerOptions = TunerOptions(),
    progress: ProgressFn | None = None,
    name: str = "op",
    incumbent: SampleSummary | None = None,
    showdown: bool = True,
    prior: Mapping[str, Measurement] | None = None,
    on_result: Callable[[Measurement], None] | None = None,
) -> LoopResult:
    """Compile, check and measure ``candidates`` in ``session``; return the ranked result.

    ``incumbent`` is the best candidate measured *before* this call (by :func:`tiletune.engine.search.run_search`,
    which calls the loop once per batch a strategy proposes): candidates that clearly cannot beat it are
    raced out as if it were part of this batch. The ranking covers ``candidates`` only.
    ``showdown=False`` skips the final interleaved re-measurement (a caller that runs the loop on
    several batches holds one showdown at the end, see :func:`showdown_rank`).

    ``prior`` (by :attr:`Measurement.config_hash`) resumes an interrupted session: a config that
    failed there fails again without running; one measured there is compiled and checked (it must
    pass here too) and keeps its samples instead of taking new ones (the showdown still re-times
    it when it leads). ``on_result`` is called with a candidate's measurement as soon as its first
    result is known and again at the end (a resumable session records them).
    """
    states = {c.order: _State(c) for c in candidates}
    total = len(candidates)
    finished = 0
    resumed: dict[int, Measurement] = {}
    for c in candidates if prior else ():
        m = prior.get(config_hash(c.config))  # type: ignore[union-attr]
        if m is not None:
            resumed[c.order] = m

    def record(st: _State) -> None:
        if on_result is not None:
            try:
                on_result(st.measurement())
            except Exception as exc:  # recording progress must never end the search
                logger.warning("%s: could not record progress: %s", name, exc)

    def report(msg: str) -> None:
        if progress is not None:
            progress(msg, finished, total)

    def out_of_time() -> bool:
        return options.max_seconds is not None and session.clock() > options.max_seconds

    def best_state() -> _State | None:
        live = [s for s in states.values() if s.status is Status.OK and s.summary is not None]
        if not live:
            return None
        return min(live, key=lambda s: (s.summary.median, s.cand.order))  # type: ignore[union-attr]

    def best_summary(st: _State) -> SampleSummary | None:
        """The summary ``st`` is raced against: the best of this batch (not ``st``) or the incumbent."""
        best = best_state()
        own = best.summary if best is not None and best is not st else None
        if incumbent is not None and (own is None or incumbent.median < own.median):
            return incumbent
        return own

    def measure_batch(st: _State) -> None:
        try:
            st.add(session.sample(st.cand, options.batch))
        except Exception as exc:  # a launch failing mid-measurement is a failed candidate
            st.status, st.reason = _fault_status(exc), _fault_reason(exc)
            st.done = "failed"

    def judge(st: _State) -> None:
        """Decide whether ``st`` stops: raced out against the best, or converged."""
        if st.done is not None or st.summary is None:
            return
        best = best_summary(st)
        if best is not None:
            if hopeless(st.summary, best, options.hopeless_factor) or raced_out(
                st.summary, best, options.race_margin
            ):
                st.done = "raced_out"
                return
        verdict = options.stopping.decide(st.summary, st.spent_s)
        if verdict is not None:
            st.done = verdict

    to_compile = []
    for c in candidates:
        m = resumed.get(c.order)
        if m is not None and m.status.failed:
            st = states[c.order]
            st.status, st.reason, st.done, st.compile_s = m.status, m.reason, "failed", m.compile_s
            st.known_at_s = session.clock()
            finished += 1
        else:
            to_compile.append(c)

    def take(outcome: Any) -> None:
        """Phase 1 for one compiled candidate: check it and take its first batch."""
        nonlocal finished
        st = states[outcome.candidate.order]
        st.compile_s = outcome.seconds
        finished += 1
        if outcome.status is not Status.OK:
            st.status, st.reason, st.done = outcome.status, outcome.reason, "failed"
            st.known_at_s = session.clock()
            _log_candidate(name, st)
            record(st)
            report(f"{st.cand.config} {outcome.status.value}")
            return
        if out_of_time() and (best_state() is not None or incumbent is not None):
            st.status, st.reason, st.done = Status.TIMEOUT, "tuning time budget exhausted", "failed"
            return
        check = session.check(st.cand)
        if check.status is not Status.OK:
            st.status, st.reason, st.done = check.status, check.reason, "failed"
            st.known_at_s = session.clock()
            _log_candidate(name, st)
            record(st)
            report(f"{st.cand.config} {check.status.value}")
            return
        earlier = resumed.get(st.cand.order)
        if earlier is not None and earlier.samples_us:
            st.add(earlier.samples_us)
            st.done = "resumed"
        else:
            measure_batch(st)
        st.known_at_s = session.clock()
        judge(st)
        record(st)
        report(f"{st.cand.config} {st.summary.median:.2f} us" if st.summary else str(st.cand.config))

    # Phase 1: as candidates finish compiling, check them and take a first batch. The baseline (the
    # space's known-good config) goes first while nothing is timed yet: its time sets the watchdog's
    # deadlines, so a config that never ends, met before it, would be waited for with the session's
    # first, generous deadline; the others compiled meanwhile wait for it (they are checked right after).
    base = next((c.order for c in to_compile if c.is_baseline), None)
    held: list[Any] = []
    for outcome in session.compile(to_compile):
        if base is not None and outcome.candidate.order != base and best_state() is None and incumbent is None:
            held.append(outcome)
            continue
        take(outcome)
        if outcome.candidate.order == base:
            base = None
            for h in held:
                take(h)
            held.clear()
    for h in held:  # the baseline never came (not compiled in this batch)
        take(h)

    # Phase 2: race. Contenders get batches, fastest first, until every one has stopped.
    while not out_of_time():
        active = [s for s in states.values() if s.status is Status.OK and s.done is None]
        if not active:
            break
        active.sort(key=lambda s: (s.summary.median if s.summary else float("inf"), s.cand.order))
        for st in active:
            judge(st)
            if st.done is None:
                measure_batch(st)
                judge(st)

    for st in states.values():
        if st.status is Status.OK and st.done is None:
            st.done = "time_budget"
        if st.status is Status.OK:
            _log_candidate(name, st)

    ok = [s for s in states.values() if s.status is Status.OK and s.summary is not None]
    winner: Candidate | None = None
    winner_median: float | None = None
    tied: tuple[Candidate, ...] = ()
    final = _showdown(session, ok, options) if showdown else {}
    ok = [s for s in states.values() if s.status is Status.OK and s.summary is not None]
    if ok:
        if final:
            entries = [Entry(s.cand.order, s.cand.is_baseline, final[s.cand.order]) for s in ok if s.cand.order in final]
        else:
            contenders = [s for s in ok if s.done != "raced_out"] or ok
            entries = [Entry(s.cand.order, s.cand.is_baseline, s.summary) for s in contenders]  # type: ignore[arg-type]
        ranking = rank(entries, min_band=options.min_tie_band, max_band=options.max_tie_band)
        winner = states[ranking.winner.ident].cand
        winner_median = ranking.winner.summary.median
        tied = tuple(states[e.ident].cand for e in ranking.tied)

    for c in candidates:
        record(states[c.order])
    measurements = tuple(states[c.order].measurement() for c in candidates)
    return LoopResult(
        measurements=measurements,
        winner=winner,
        winner_median_us=winner_median,
        tied=tied,
        wall_s=session.clock(),
        samples_taken=sum(len(s.samples) for s in states.values()),
        known_at_s=tuple(states[c.order].known_at_s for c in candidates),
    )


def showdown(
    session: TuningSession,
    leaders: Sequence[tuple[Candidate, SampleSummary]],
    options: TunerOptions,
) -> tuple[dict[int, list[float]], dict[int, str]]:
    """Re-measure the leading candidates in interleaved rounds.

    From ``leaders`` (every measured OK candidate, with its summary so far) it takes those within
    ``options.showdown_band`` of the best (the baseline first if near, then the fastest, at most
    ``options.showdown_max``) and samples them in ``options.showdown_rounds`` alternating rounds.
    Returns the fresh samples by candidate order ({} when fewer than two are near) and the launch
    errors met on the way.
    """
    if options.showdown_rounds <= 0 or len(leaders) < 2:
        return {}, {}
    best = min(s.median for _, s in leaders)
    near = sorted(
        (pair for pair in leaders if pair[1].median <= best * (1 + options.showdown_band)),
        key=lambda p: (not p[0].is_baseline, p[1].median, p[0].order),
    )
    lead = [c for c, _ in near[: options.showdown_max]]
    if len(lead) < 2:
        return {}, {}
    fresh: dict[int, list[float]] = {c.order: [] for c in lead}
    errors: dict[int, str] = {}
    for r in range(options.showdown_rounds):
        for cand in lead if r % 2 == 0 else lead[::-1]:
            if cand.order in errors:
                continue
            try:
                fresh[cand.order].extend(session.sample(cand, options.batch))
            except Exception as exc:
                errors[cand.order] = _fault_reason(exc)
    return {o: v for o, v in fresh.items() if v and o not in errors}, errors


def _showdown(session: TuningSession, ok: Sequence[_State], options: TunerOptions) -> dict[int, SampleSummary]:
    """Run :func:`showdown` over the loop's states; fresh summaries by candidate order."""
    fresh, errors = showdown(session, [(s.cand, s.summary) for s in ok if s.summary is not None], options)
    by_order = {s.cand.order: s for s in ok}
    for order, reason in errors.items():
        st = by_order[order]
        st.status, st.reason, st.done = Status.LAUNCH_ERROR, reason, "failed"
    for order, samples in fresh.items():
        by_order[order].add(samples)
    return {o: summarize(v) for o, v in fresh.items()}


def _fault_status(exc: BaseException) -> Status:
    """The status of a candidate whose sampling raised ``exc`` (a worker fault may say TIMEOUT)."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, Status) and status.failed else Status.LAUNCH_ERROR


def _fault_reason(exc: BaseException) -> str:
    return str(exc) if hasattr(exc, "status") else f"{type(exc).__name__}: {exc}"


def _log_candidate(name: str, st: _State) -> None:
    if not logger.isEnabledFor(logging.INFO):
        return
    if st.status is not Status.OK:
        first = st.reason.strip().splitlines()[0][:200] if st.reason.strip() else ""
        logger.info("%s %s: %s %s", name, st.cand.config, st.status.value, first)
    elif st.summary is not None:
        logger.info(
            "%s %s: median %.3f us  ci +-%.2f%%  n=%d  (%s)%s",
            name,
            st.cand.config,
            st.summary.median,
            100 * st.summary.rel_halfwidth,
            st.summary.n,
            st.done,
            "  [baseline]" if st.cand.is_baseline else "",
        )
