"""The last source of the chain: tune the key, under the identity's lease.

Several processes: the one that takes the identity's lease tunes; the others wait for its winner
(:mod:`tiletune.resolve.leases`) and answer from the database; a lease whose holder died is taken
over. Every candidate's result is recorded as soon as it is known, so a process killed mid-tune
leaves them behind and the next one measures only the configs still missing. The winner itself is
stored by the chain (:mod:`tiletune.resolve.chain`), once, after this source answered.

Tuning is one pipeline for every strategy (exhaustive included): a strategy proposes, the session
(in a worker process, or in this process) compiles, checks and measures
(:func:`tiletune.engine.tuner.run_loop`), one interleaved showdown ranks the leaders
(:func:`tiletune.engine.search.run_search`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Mapping

from tiletune.errors import AllCandidatesFailed, DatabaseError, SpaceError
from tiletune.records import Measurement, TuneResult

if TYPE_CHECKING:  # pragma: no cover
    from tiletune.resolve.attempt import Attempt
    from tiletune.resolve.problem import Choice, Problem

logger = logging.getLogger("tiletune")

__all__ = ["TuneSource", "open_session", "session_kwargs", "tune"]

_warned_lock = threading.Lock()
_warned_unshippable: set[str] = set()  # op names warned that their plan cannot go to a worker


def _tolerance_for(problem: "Problem") -> Mapping[str, tuple[float, float]] | None:
    tol = problem.spec.tolerance
    if tol is None or not callable(tol):
        return tol
    got = tol(*problem.args)
    if got is not None and not isinstance(got, Mapping):
        raise TypeError(f"{problem.name}: the tolerance callable returned {type(got).__name__}, not a mapping")
    return dict(got) if got else None


def session_kwargs(problem: "Problem") -> dict[str, Any]:
    spec = problem.spec
    return dict(device_index=problem.device, writes=spec.writes, inplace=spec.inplace, reference=spec.reference,
                tolerance=_tolerance_for(problem), name=spec.name)


def open_session(problem: "Problem", ahead: Any = ()) -> Any:
    """A tuning session: in the op's worker process when isolation is on and the plan can be shipped
    there; otherwise (one warning per op name) in this process. ``ahead``: the configs the session
    compiles first, which this process may compile while the worker starts (see
    :meth:`tiletune.devices.workers.IsolatedBackend.open_session`)."""
    kwargs = session_kwargs(problem)
    backend = problem.backend
    tuning = problem.tuning_backend
    if tuning is not backend:
        from tiletune.devices.workers import IsolationUnavailable

        try:
            # the raw plan travels (the worker evaluates it once per candidate there)
            extra = {"ahead": ahead} if ahead and getattr(tuning, "compiles_ahead", False) else {}
            return tuning.open_session(problem.spec.plan, problem.args, **kwargs, **extra)  # type: ignore[arg-type]
        except IsolationUnavailable as exc:
            with _warned_lock:
                first = problem.name not in _warned_unshippable
                _warned_unshippable.add(problem.name)
            if first:
                warnings.warn(
                    f"tiletune: {problem.name} cannot be tuned in a worker process ({exc}); tuning in this "
                    "process without isolation (a faulting candidate can take this process down)",
                    RuntimeWarning,
                    stacklevel=5,
                )
    plan: Callable[..., Any] = problem.spec.plan if getattr(backend, "ships_plan", False) else problem.plans
    if ahead and tuning is backend and getattr(backend, "compiles_ahead", False):  # an isolated backend given as is
        kwargs["ahead"] = ahead
    return backend.open_session(plan, problem.args, **kwargs)  # type: ignore[arg-type]


def tune(problem: "Problem", *, resume: bool = False, on_result: Callable[[Measurement], None] | None = None,
         prior: Mapping[str, Measurement] | None = None) -> TuneResult:
    """Tune one key: the strategy's search over a session. Stores nothing (the chain stores the
    winner); ``on_result`` is called with every candidate's result as soon as it is known, ``prior``
    holds the results another (killed) process recorded for this identity."""
    from tiletune.devices import timeline
    from tiletune.engine.progress import tuning_progress
    from tiletune.engine.search import DEFAULT_SEARCH_EVALS, default_search, run_search
    from tiletune.resolve.attempt import MissScope, current_scope
    from tiletune.space.strategies.base import Budget
    from tiletune.space.strategies.registry import make_strategy

    spec, arch, identity = problem.spec, problem.arch, problem.identity
    over = current_scope() or MissScope()
    seed = spec.seed if over.seed is None else over.seed
    if over.strategy is not None:  # a strategy of the scope takes its own options (none: its defaults)
        strategy = make_strategy(over.strategy, spec.space, arch, seed, **dict(over.strategy_options or {}))
        budget = over.budget or spec.budget or Budget()
    else:
        options = dict(spec.strategy_options if over.strategy_options is None else over.strategy_options)
        if spec.strategy is None:  # exhaustive for a small space, else auto under a default budget
            name, budget = default_search(spec.space, arch, over.budget or spec.budget)
        else:
            name, budget = spec.strategy, over.budget or spec.budget or Budget()
        strategy = make_strategy(name, spec.space, arch, seed, **options)
    if strategy.lazy is not None and budget.unlimited:
        raise SpaceError(
            f"{spec.name}: the space has {spec.space.product_size(arch):.3g} combinations of parameter values on "
            f"{arch}, too many to search to the end: give a budget (budget=tiletune.Budget(max_evals=...) or "
            f"max_seconds=...), or leave strategy= unset (auto, {DEFAULT_SEARCH_EVALS} evaluations)"
        )
    prior = dict(prior or {})
    n_valid = len(strategy.pool)
    exhaustive = strategy.name == "exhaustive" and budget.max_evals is None and strategy.lazy is None
    t0 = time.perf_counter()
    timeline.mark("tune_strategy_ready", configs=n_valid)
    # exhaustive: the first (only) batch is the whole pool, known now; compiled while the worker starts
    session = open_session(problem, ahead=strategy.pool if exhaustive else ())
    winner = None
    try:
        total = min(budget.max_evals if budget.max_evals is not None else n_valid, n_valid)
        with tuning_progress(spec.name, total, spec.progress) as progress_fn:
            loop = run_search(
                session, strategy, budget, spec.options,
                batch=n_valid if exhaustive else None,  # exhaustive: the compile pool sees the whole space
                progress=progress_fn, name=spec.name, prior=prior, on_result=on_result,
            )
        winner = loop.winner
    finally:
        session.finish(winner)
    if winner is None:
        raise AllCandidatesFailed(spec.name, loop.measurements)
    stats = {
        "samples": loop.samples_taken,
        "session_clock_s": loop.wall_s,
        "strategy": loop.strategy,
        "evaluations": len(loop.evaluations),
        "stopped": loop.stopped,
        "batches": loop.batches,
        "space_size": n_valid,
        "plan_calls": problem.plans.calls,
        "resumed": len(prior),
        "phases": dict(loop.phases),  # where the time went (tiletune.engine.tuner.PhaseTimer)
        **getattr(session, "stats", {}),
        "launched_winner": bool(getattr(session, "launches_winner", True)),
    }
    result = TuneResult(
        identity=identity,
        winner=winner.config.as_dict(),
        winner_median_us=float(loop.winner_median_us or 0.0),
        measurements=loop.measurements,
        tied=tuple(c.config.as_dict() for c in loop.tied),
        wall_s=time.perf_counter() - t0,
        stats=stats,
    )
    logger.info("%s: tuned %s\n%s", spec.name, identity.key, result.summary())
    return result


class TuneSource:
    """Tune the key: take the identity's lease (or wait for the winner of the process holding it, and
    answer from the database), resume from what a killed process recorded, tune. The lease is held
    until the chain has stored the winner."""

    name = "tuned"

    def get(self, problem: "Problem", attempt: "Attempt") -> "Choice | None":
        from tiletune.resolve.leases import acquire_lease, lease_holder, progress, wait_for_winner
        from tiletune.resolve.problem import Choice

        handle = problem.database
        db = handle.db
        lease = None
        record = None
        if db is not None:
            try:
                # a read-only database: tune here, without a lease (nothing would be stored)
                while record is None and handle.writable(db, problem.name):
                    lease = acquire_lease(db, problem.identity)
                    if lease is not None:
                        record = db.lookup(problem.identity)  # finished just before we took the lease?
                        break
                    holder = lease_holder(db, problem.identity)
                    logger.info("%s: %s is being tuned by %s; waiting for its winner", problem.name,
                                problem.identity.key,
                                f"pid {holder['pid']} on {holder['host']}" if holder else "another process")
                    record = wait_for_winner(db, problem.identity)
            except DatabaseError as exc:
                if lease is not None:
                    with contextlib.suppress(DatabaseError):
                        lease.release()
                    lease = None
                handle.failed(db, exc, problem.name)
        if lease is not None:
            attempt.hold(lease, db, handle, problem.name)
        if record is not None:
            cfg = problem.config_from(record.config)
            if cfg is not None:
                logger.info("%s: database hit for %s -> %s", problem.name, problem.identity.key, cfg)
                return Choice(cfg, "database", median_us=record.median_us)
        prior: dict[str, Measurement] = {}
        on_result = None
        if lease is not None and handle.writable(db, problem.name):
            assert db is not None
            try:
                prior = {m.config_hash: m for m in progress(db, problem.identity)}
            except DatabaseError as exc:
                handle.failed(db, exc, problem.name)
            if prior:
                logger.info("%s: resuming %s from %d recorded config(s)", problem.name, problem.identity.key,
                            len(prior))
            if handle.writable(db, problem.name):
                on_result = functools.partial(_record_progress, problem, db)
        attempt.tuning_started = True
        from tiletune.devices import timeline

        timeline.mark("tune_lease_held", lease=lease is not None)
        result = tune(problem, resume=lease is not None, on_result=on_result, prior=prior)
        cfg = problem.spec.space.config(problem.arch, **dict(result.winner))
        # an in-process session leaves exactly one launch of the winner on the caller's arguments;
        # after a worker session the caller launches the (verified) winner itself
        return Choice(cfg, "tuned", launched=bool(result.stats.get("launched_winner", True)), result=result,
                      median_us=result.winner_median_us)


def _record_progress(problem: "Problem", db: Any, measurement: Measurement) -> None:
    """Record one candidate's result while the op still uses ``db``; a failure drops the database."""
    from tiletune.resolve.leases import record_progress

    if not problem.database.writable(db, problem.name):
        return
    try:
        record_progress(db, problem.identity, measurement)
    except DatabaseError as exc:
        problem.database.failed(db, exc, problem.name)
