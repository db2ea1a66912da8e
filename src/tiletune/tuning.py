"""Tuning one problem key of one op: database, lease, resume, the search, the record.

:func:`resolve` is what a tuned op calls on a key it has not seen: it builds the
:class:`~tiletune.records.TuningIdentity`, answers from the tuning database when it can, and otherwise
tunes. Tuning is one pipeline for every strategy (exhaustive included): a strategy proposes, the
session (in a worker process, or in this process) compiles, checks and measures in
:func:`tiletune.tuner.run_loop`, one interleaved showdown ranks the leaders
(:func:`tiletune.search.run_search`).

Several processes: the one that takes the identity's lease tunes; the others wait for its winner
(:mod:`tiletune.leases`); a lease whose holder died is taken over. Every candidate's result is
recorded as soon as it is known, so a process killed mid-tune leaves them behind and the next one
measures only the configs still missing.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .backends.base import Backend, Launch
from .errors import AllCandidatesFailed, TiletuneError
from .identity import kernel_identity
from .keys import args_key_json, key_to_json
from .progress import tuning_progress
from .records import Measurement, TuneResult, TuningIdentity, canonical_json
from .space import Config
from .strategies.base import Budget, make_strategy

if TYPE_CHECKING:  # pragma: no cover
    from .dispatch import TunedOp

logger = logging.getLogger("tiletune")

__all__ = ["PlanCache", "Resolution", "lookup", "resolve", "make_identity", "tune"]


class PlanCache:
    """The launch plan's output per config for one call's arguments: the plan runs once per candidate.

    ``spec_for(cfg)`` evaluates the plan on the fixed arguments; the cache is called like a plan,
    ``cache(cfg, *args)`` (the arguments are those it was made for), so a session can use it as one.
    """

    def __init__(self, spec_for: Callable[[Config], Launch]) -> None:
        self.spec_for = spec_for
        self.specs: dict[Config, Launch] = {}
        self.calls = 0

    def __call__(self, cfg: Config, *args: Any) -> Launch:
        spec = self.specs.get(cfg)
        if spec is None:
            self.calls += 1
            spec = self.specs[cfg] = self.spec_for(cfg)
        return spec


@dataclass
class Resolution:
    """The config for a key, whether the session already launched it on the caller's arguments,
    and the tuning result when one ran."""

    config: Config
    launched: bool
    result: TuneResult | None = None


def make_identity(op: "TunedOp", args: tuple[Any, ...], key: Any, backend: Backend, dev: int, arch: str,
                  plans: PlanCache) -> TuningIdentity:
    """Everything the op's result for this key depends on (kernel sources, space, key, device, versions)."""
    sources = []
    seen: set[int] = set()
    for cfg in op.space.candidates(arch):
        try:
            k = plans(cfg).kernel
        except Exception as exc:  # the session records this config as failed; the identity notes it
            sources.append(f"#plan raised {type(exc).__name__} for {cfg.as_dict()}")
            continue
        if id(k) not in seen:
            seen.add(id(k))
            sources.append(backend.kernel_sources(k))
    try:
        key_json = canonical_json(args_key_json(args) if op.key_fn is None else key_to_json(key))
    except TypeError as exc:
        raise TiletuneError(f"{op.name}: {exc}") from exc
    return TuningIdentity(
        kernel_id=kernel_identity(op.plan, sources),
        space_hash=op.space.hash,
        key=key_json,
        device=backend.device_info(dev),
        versions=canonical_json(dict(backend.versions())),
        name=op.name,
    )


def _config_from_record(op: "TunedOp", values: Mapping[str, Any], arch: str) -> Config | None:
    try:
        cfg = op.space.config(arch, **dict(values))
    except TiletuneError:
        return None
    return cfg if cfg in set(op.space.candidates(arch)) else None


def lookup(op: "TunedOp", args: tuple[Any, ...], key: Any, backend: Backend, dev: int, arch: str) -> Config | None:
    """The database's config for this key, or None: no lease, no waiting, no tuning (what a call made
    during CUDA graph capture may do)."""
    db = op.db
    if db is None:
        return None
    plans = PlanCache(lambda cfg: op._launch_spec(cfg, args))
    record = db.lookup(make_identity(op, args, key, backend, dev, arch, plans))
    return _config_from_record(op, record.config, arch) if record is not None else None


def resolve(op: "TunedOp", args: tuple[Any, ...], key: Any, backend: Backend, dev: int, arch: str) -> Resolution:
    """The config this op uses for ``key``: from the database, from another process's session, or tuned."""
    plans = PlanCache(lambda cfg: op._launch_spec(cfg, args))
    identity = make_identity(op, args, key, backend, dev, arch, plans)
    db = op.db
    if db is None:
        return _tuned(op, args, identity, backend, dev, arch, plans, None)
    from .leases import acquire_lease, lease_holder, wait_for_winner

    lease = None
    record = db.lookup(identity)
    while record is None:
        lease = acquire_lease(db, identity)
        if lease is not None:
            record = db.lookup(identity)  # finished just before we took the lease?
            break
        holder = lease_holder(db, identity)
        logger.info("%s: %s is being tuned by %s; waiting for its winner", op.name, identity.key,
                    f"pid {holder['pid']} on {holder['host']}" if holder else "another process")
        record = wait_for_winner(db, identity)
    try:
        if record is not None:
            cfg = _config_from_record(op, record.config, arch)
            if cfg is not None:
                logger.info("%s: database hit for %s -> %s", op.name, identity.key, cfg)
                return Resolution(cfg, launched=False)
        return _tuned(op, args, identity, backend, dev, arch, plans, lease)
    finally:
        if lease is not None:
            lease.release()


def _tuned(op: "TunedOp", args: tuple[Any, ...], identity: TuningIdentity, backend: Backend, dev: int,
           arch: str, plans: PlanCache, lease: Any) -> Resolution:
    result = tune(op, args, identity, backend, dev, arch, plans, resume=lease is not None)
    cfg = op.space.config(arch, **dict(result.winner))
    # an in-process session leaves exactly one launch of the winner on the caller's arguments;
    # after a worker session the caller launches the (verified) winner itself
    return Resolution(cfg, launched=bool(result.stats.get("launched_winner", True)), result=result)


def _tolerance_for(op: "TunedOp", args: tuple[Any, ...]) -> Mapping[str, tuple[float, float]] | None:
    tol = op.tolerance
    if tol is None or not callable(tol):
        return tol
    got = tol(*args)
    if got is not None and not isinstance(got, Mapping):
        raise TypeError(f"{op.name}: the tolerance callable returned {type(got).__name__}, not a mapping")
    return dict(got) if got else None


def open_session(op: "TunedOp", backend: Backend, args: tuple[Any, ...], dev: int, plans: PlanCache) -> Any:
    """A tuning session: in the op's worker process when isolation is on and the plan can be
    shipped there; otherwise (one warning per op) in this process."""
    kwargs = dict(device_index=dev, writes=op.writes, inplace=op.inplace, reference=op.reference,
                  tolerance=_tolerance_for(op, args), name=op.name)
    tuning = op._tuning_backend(backend)
    if tuning is not backend:
        from .workers import IsolationUnavailable

        try:
            # the raw plan travels (the worker evaluates it once per candidate there)
            return tuning.open_session(op.plan, args, **kwargs)  # type: ignore[arg-type]
        except IsolationUnavailable as exc:
            if not op._warned_unshippable:
                op._warned_unshippable = True
                warnings.warn(
                    f"tiletune: {op.name} cannot be tuned in a worker process ({exc}); tuning in this "
                    "process without isolation (a faulting candidate can take this process down)",
                    RuntimeWarning,
                    stacklevel=5,
                )
    plan: Callable[..., Launch] = op.plan if getattr(backend, "ships_plan", False) else plans
    return backend.open_session(plan, args, **kwargs)  # type: ignore[arg-type]


def tune(op: "TunedOp", args: tuple[Any, ...], identity: TuningIdentity, backend: Backend, dev: int, arch: str,
         plans: PlanCache, resume: bool = False) -> TuneResult:
    """Tune one key: the strategy's search over a session, then record the result in the database.

    With ``resume`` the per-config results another (killed) process recorded for this identity are
    reused, and every result of this session is recorded as soon as it is known.
    """
    from .search import run_search

    db = op.db
    prior: dict[str, Measurement] = {}
    on_result: Callable[[Measurement], None] | None = None
    if db is not None and resume:
        from .leases import progress, record_progress

        prior = {m.config_hash: m for m in progress(db, identity)}
        if prior:
            logger.info("%s: resuming %s from %d recorded config(s)", op.name, identity.key, len(prior))

        on_result = functools.partial(record_progress, db, identity)

    strategy = make_strategy(op.strategy or "exhaustive", op.space, arch, op.seed, **op.strategy_options)
    budget = op.budget or Budget()
    n_valid = len(strategy.pool)
    exhaustive = strategy.name == "exhaustive" and budget.max_evals is None
    t0 = time.perf_counter()
    session = open_session(op, backend, args, dev, plans)
    winner = None
    try:
        total = min(budget.max_evals if budget.max_evals is not None else n_valid, n_valid)
        with tuning_progress(op.name, total, op.progress) as progress_fn:
            loop = run_search(
                session, strategy, budget, op.options,
                batch=n_valid if exhaustive else None,  # exhaustive: the compile pool sees the whole space
                progress=progress_fn, name=op.name, prior=prior, on_result=on_result,
            )
        winner = loop.winner
    finally:
        session.finish(winner)
    op.tuning_count += 1
    if winner is None:
        raise AllCandidatesFailed(op.name, loop.measurements)
    stats = {
        "samples": loop.samples_taken,
        "session_clock_s": loop.wall_s,
        "strategy": loop.strategy,
        "evaluations": len(loop.evaluations),
        "stopped": loop.stopped,
        "batches": loop.batches,
        "space_size": n_valid,
        "plan_calls": plans.calls,
        "resumed": len(prior),
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
    if db is not None:
        db.record_session(identity, result.measurements, result.winner, result.winner_median_us, result.tied)
    logger.info("%s: tuned %s\n%s", op.name, identity.key, result.summary())
    return result
