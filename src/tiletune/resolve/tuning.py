"""Tuning one problem key of one op: database, lease, resume, the search, the record.

:func:`resolve` is what a tuned op calls on a key it has not seen: it builds the
:class:`~tiletune.records.TuningIdentity`, answers from the tuning database when it can, and otherwise
tunes. Tuning is one pipeline for every strategy (exhaustive included): a strategy proposes, the
session (in a worker process, or in this process) compiles, checks and measures in
:func:`tiletune.engine.tuner.run_loop`, one interleaved showdown ranks the leaders
(:func:`tiletune.engine.search.run_search`).

Several processes: the one that takes the identity's lease tunes; the others wait for its winner
(:mod:`tiletune.resolve.leases`); a lease whose holder died is taken over. Every candidate's result is
recorded as soon as it is known, so a process killed mid-tune leaves them behind and the next one
measures only the configs still missing.

A database that cannot be used never breaks a tuned op (:func:`open_database`,
:func:`database_failed`): one that fails to open, or fails later (locked, disk full, made read-only),
is dropped and the op tunes and launches without storing anything; one that can only be read (the
file or its folder is not writable) still answers lookups, and the op tunes the other keys without
a lease and without storing them. Either way one :class:`~tiletune.errors.DatabaseWarning` (a
RuntimeWarning, through :func:`warnings.warn`) per process and database path says what is wrong and
what to do, before any tuning whose result could not be stored. A database path that failed is not
tried again in this process.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import random
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from tiletune.devices.backends.base import Backend, Launch
from tiletune.errors import AllCandidatesFailed, DatabaseError, DatabaseWarning, SpaceError, TiletuneError
from tiletune.identity import kernel_identity
from tiletune.keys import args_key_json, key_to_json
from tiletune.engine.progress import tuning_progress
from tiletune.records import Measurement, TuneResult, TuningIdentity, canonical_json
from tiletune.space.spaces import Config, Space
from tiletune.devices.plans import KernelPart, PlanCache
from tiletune.store import TuningDB
from tiletune.space.strategies.base import Budget, make_strategy

if TYPE_CHECKING:  # pragma: no cover
    from tiletune.op.tuned_op import TunedOp

logger = logging.getLogger("tiletune")

__all__ = ["KernelPart", "MissScope", "PlanCache", "Resolution", "Resolved", "database_failed", "kernel_part",
           "lookup", "make_identity", "miss_scope", "open_database", "resolve", "tune"]


# ---------------------------------------------------------------------- a database that cannot be used

#: The warning when a tuned op's database cannot be opened, when it can only be read, and when it
#: fails later (``{error}`` is the exception's message, which names the path, the cause and the fix).
UNUSABLE_WARNING = ("tiletune: {error}. Tuned ops go on without this database: they tune every new problem key "
                    "and store nothing.")
READ_ONLY_WARNING = ("tiletune: {error}. Tuned ops use its records and tune the other problem keys without "
                     "storing the results.")
FAILED_WARNING = ("tiletune: {error}. Tuned ops go on without this database from now on: new tuning results are "
                  "not stored.")

_problems_lock = threading.Lock()
_warned: set[str] = set()  # database paths this process has warned about
_broken: set[str] = set()  # database paths that failed: not opened again by a tuned op


def _db_key(db: TuningDB) -> str:
    return f":memory:{id(db)}" if db.path is None else os.path.abspath(db.where)


def _warn_once(key: str, template: str, error: DatabaseError) -> None:
    with _problems_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(template.format(error=error), DatabaseWarning, stacklevel=2)


def _forget_database_problems() -> None:
    """Forget which databases were warned about or dropped (for tests)."""
    with _problems_lock:
        _warned.clear()
        _broken.clear()


def open_database(arg: Any) -> TuningDB | None:
    """The tuning database of a tuned op, opened now: ``arg`` is a :class:`TuningDB`, a path, or
    None / True (:func:`~tiletune.store.default_db_path`).

    Returns None when it cannot be used (after one :class:`~tiletune.errors.DatabaseWarning` per
    process and path; a path that failed before in this process is not opened again). A read-only
    database is returned (``db.read_only``), after its own warning: the op reads its records and
    stores nothing.
    """
    db = arg if isinstance(arg, TuningDB) else TuningDB(None if arg in (None, True) else arg)
    key = _db_key(db)
    with _problems_lock:
        if key in _broken:
            return None
    try:
        reason = db.read_only_reason  # opens it
    except DatabaseError as exc:
        with _problems_lock:
            _broken.add(key)
        _warn_once(key, UNUSABLE_WARNING, exc)
        return None
    if reason is not None:
        _warn_once(key, READ_ONLY_WARNING, reason)
    return db


def database_failed(op: "TunedOp", db: TuningDB, exc: DatabaseError) -> None:
    """``db`` failed while ``op`` used it: the op drops it (and goes on without storing), and this
    process stops using its path; one warning per process and path."""
    key = _db_key(db)
    with _problems_lock:
        _broken.add(key)
    _warn_once(key, FAILED_WARNING, exc)
    logger.debug("%s: tuning database %s dropped: %s", op.name, db.where, exc)
    op._db = None
    op._db_dropped = True


def _writable(op: "TunedOp", db: TuningDB | None) -> bool:
    """Whether ``op`` may write ``db`` (not None, not read-only, not dropped)."""
    if db is None:
        return False
    try:
        return not db.read_only
    except DatabaseError as exc:  # this thread's connection failed to open
        database_failed(op, db, exc)
        return False


@dataclass
class Resolution:
    """The config for a key, whether the session already launched it on the caller's arguments,
    the tuning result when one ran, and where the config came from: ``"tuned"``, ``"database"``,
    ``"table"``, ``"pin"`` or ``"peer"`` (another rank of a ``torch.distributed`` job, see
    :mod:`tiletune.resolve.peers`)."""

    config: Config
    launched: bool
    result: TuneResult | None = None
    source: str = "tuned"
    median_us: float | None = None  # the pick's stored or measured median, when known


# ---------------------------------------------------------------------- miss scopes (campaigns)


@dataclass(frozen=True)
class Resolved:
    """One key resolved inside a :func:`miss_scope`: the op's name, the identity, the config and
    its source (see :class:`Resolution`), and the tuning result when this process tuned it."""

    op: str
    identity: TuningIdentity
    config: dict[str, Any]
    source: str
    result: TuneResult | None


@dataclass
class MissScope:
    """Overrides for the tunings of one thread (None: the op's own setting), and what was resolved."""

    strategy: Any = None
    budget: Budget | None = None
    seed: int | None = None
    strategy_options: Mapping[str, Any] | None = None
    resolved: list[Resolved] = field(default_factory=list)


_scopes = threading.local()


@contextlib.contextmanager
def miss_scope(*, strategy: Any = None, budget: Budget | None = None, seed: int | None = None,
               strategy_options: Mapping[str, Any] | None = None) -> Iterator[MissScope]:
    """Within this block (this thread), every key a tuned op resolves is listed in the scope's
    ``resolved``, and tunings use ``strategy`` / ``budget`` / ``seed`` / ``strategy_options`` where
    given instead of the op's. A campaign runs each of its calls in one: the library ops are
    wrappers, so the tuned ops a call reaches are known only once it has reached them.

    Read only on a miss (the hot path never looks at it)."""
    if strategy is not None:
        from tiletune.space.strategies import resolve_strategy

        resolve_strategy(strategy)  # a bad name fails here, not in the middle of a call
    if budget is not None and not isinstance(budget, Budget):
        raise TypeError(f"budget must be a tiletune.Budget, got {type(budget).__name__}")
    scope = MissScope(strategy, budget, seed, dict(strategy_options) if strategy_options else None)
    outer = getattr(_scopes, "current", None)
    _scopes.current = scope
    try:
        yield scope
    finally:
        _scopes.current = outer


def _scope() -> MissScope | None:
    return getattr(_scopes, "current", None)


#: Configs whose kernels identify the op on a space too big to list: the baseline and this many drawn
#: with a fixed seed (the same in every process).
IDENTITY_SAMPLE = 64


def _identity_configs(space: Space, arch: str) -> list[Config]:
    """The configs whose kernels enter the identity: every candidate, or on a space too big to list
    (:meth:`Space.is_lazy`) the baseline and :data:`IDENTITY_SAMPLE` configs drawn with seed 0."""
    if not space.is_lazy(arch):
        return space.candidates(arch)
    base = space.baseline(arch)
    drawn = space.lazy(arch).sample(random.Random(0), IDENTITY_SAMPLE)
    return ([base] if base is not None else []) + [c for c in drawn if c != base]


_EXACT_KEYS: contextvars.ContextVar[bool] = contextvars.ContextVar("tiletune_exact_keys", default=False)


@contextlib.contextmanager
def exact_keys() -> Iterator[None]:
    """Within it, an op's identity uses the call's exact key even when the op declares buckets (bucket
    refinement: :meth:`tiletune.TunedOp.refine`)."""
    token = _EXACT_KEYS.set(True)
    try:
        yield
    finally:
        _EXACT_KEYS.reset(token)


def kernel_part(op: "TunedOp", backend: Backend, arch: str, plans: PlanCache) -> KernelPart:
    """The key-independent part of the identity of a call (whose arguments ``plans`` was made for),
    computed at the first request and kept on ``plans``."""
    if plans.kernel is not None:
        return plans.kernel
    sources = []
    seen: set[int] = set()
    for cfg in _identity_configs(op.space, arch):
        try:
            k = plans(cfg).kernel
        except Exception as exc:  # the session records this config as failed; the identity notes it
            sources.append(f"#plan raised {type(exc).__name__} for {cfg.as_dict()}")
            continue
        if id(k) not in seen:
            seen.add(id(k))
            sources.append(backend.kernel_sources(k))
    plans.kernel = KernelPart(kernel_identity(op.plan, sources), canonical_json(dict(backend.versions())))
    return plans.kernel


def make_identity(op: "TunedOp", args: tuple[Any, ...], key: Any, backend: Backend, dev: int, arch: str,
                  plans: PlanCache) -> TuningIdentity:
    """Everything the op's result for this key depends on (kernel sources, space, key, device, versions)."""
    kernel = kernel_part(op, backend, arch, plans)
    try:
        if op.key_fn is not None:
            key_json = canonical_json(key_to_json(key))
        elif getattr(op, "buckets", None) is not None and not _EXACT_KEYS.get():
            key_json = canonical_json(op.buckets.key_json(args))
        else:
            key_json = canonical_json(args_key_json(args))
    except TypeError as exc:
        raise TiletuneError(f"{op.name}: {exc}") from exc
    return TuningIdentity(
        kernel_id=kernel.kernel_id,
        space_hash=op.space.hash,
        key=key_json,
        device=backend.device_info(dev),
        versions=kernel.versions,
        name=op.name,
    )


def _config_from_record(op: "TunedOp", values: Mapping[str, Any], arch: str) -> Config | None:
    try:
        cfg = op.space.config(arch, **dict(values))
    except TiletuneError:
        return None
    if op.space.is_lazy(arch):  # space.config checked the values and the constraints
        return cfg
    return cfg if cfg in set(op.space.candidates(arch)) else None


def lookup(op: "TunedOp", args: tuple[Any, ...], key: Any, backend: Backend, dev: int, arch: str,
           plans: PlanCache | None = None) -> Config | None:
    """The database's config for this key, or None: no lease, no waiting, no tuning (what a call made
    during CUDA graph capture may do). ``plans``: the call's plan cache, when the caller has one."""
    db = op.db
    if plans is None:
        plans = PlanCache(lambda cfg: op._launch_spec(cfg, args))
    identity = make_identity(op, args, key, backend, dev, arch, plans)
    record = None
    if db is not None:
        try:
            record = db.lookup(identity)
        except DatabaseError as exc:
            database_failed(op, db, exc)
    from tiletune.resolve.pins import verified_pin

    pinned = verified_pin(op, identity, arch)  # a pin checked earlier in this process
    if pinned is not None:
        return pinned
    cfg = _config_from_record(op, record.config, arch) if record is not None else None
    return cfg if cfg is not None else _from_table(op, identity, arch)


def _from_table(op: "TunedOp", identity: TuningIdentity, arch: str) -> Config | None:
    """The config a tuning table (the user's, then the shipped ones) holds for exactly this identity."""
    from tiletune.resolve import tables

    hit = tables.lookup(identity)
    if hit is None:
        return None
    entry, table = hit
    cfg = _config_from_record(op, entry.config, arch)
    if cfg is not None:
        logger.info("%s: tuning table %s -> %s", op.name, table.source, cfg)
    return cfg


def resolve(op: "TunedOp", args: tuple[Any, ...], key: Any, backend: Backend, dev: int, arch: str,
            plans: PlanCache | None = None) -> Resolution:
    """The config this op uses for ``key``: from a pin (:mod:`tiletune.resolve.pins`), the database, a tuning
    table, another process's session, or tuned. In a ``torch.distributed`` job every rank that misses
    the same key uses the one config the first of them resolved (:mod:`tiletune.resolve.peers`).
    ``plans``: the call's plan cache (for these ``args``), when the caller has one."""
    if plans is None:
        plans = PlanCache(lambda cfg: op._launch_spec(cfg, args))
    identity = make_identity(op, args, key, backend, dev, arch, plans)
    from tiletune.resolve import peers as distributed

    peers = distributed.peers()  # None outside an initialised multi-rank job: one dict lookup
    if peers is None:
        res = _resolve(op, args, identity, backend, dev, arch, plans)
    else:
        res = peers.agree(op, identity, arch, lambda: _resolve(op, args, identity, backend, dev, arch, plans))
    scope = _scope()
    if scope is not None:
        scope.resolved.append(Resolved(op.name, identity, res.config.as_dict(), res.source, res.result))
    return res


def _resolve(op: "TunedOp", args: tuple[Any, ...], identity: TuningIdentity, backend: Backend, dev: int, arch: str,
             plans: PlanCache) -> Resolution:
    """:func:`resolve` in this process alone."""
    from tiletune.resolve.pins import pinned_config

    pinned = pinned_config(op, args, identity, backend, dev, arch, plans)  # verified once, never tuned
    if pinned is not None:
        return Resolution(pinned, launched=False, source="pin")
    db = op.db
    if db is None:
        cfg = _from_table(op, identity, arch)
        if cfg is not None:
            return Resolution(cfg, launched=False, source="table")
        return _tuned(op, args, identity, backend, dev, arch, plans, None)
    from tiletune.resolve.leases import acquire_lease, lease_holder, wait_for_winner

    lease = None
    try:
        record = db.lookup(identity)
        if record is None:  # the user's database first, then the tables, then tuning
            cfg = _from_table(op, identity, arch)
            if cfg is not None:
                return Resolution(cfg, launched=False, source="table")
        # a read-only database: its record or tune here, without a lease (nothing would be stored)
        while record is None and _writable(op, db) and op.db is db:
            lease = acquire_lease(db, identity)
            if lease is not None:
                record = db.lookup(identity)  # finished just before we took the lease?
                break
            holder = lease_holder(db, identity)
            logger.info("%s: %s is being tuned by %s; waiting for its winner", op.name, identity.key,
                        f"pid {holder['pid']} on {holder['host']}" if holder else "another process")
            record = wait_for_winner(db, identity)
    except DatabaseError as exc:
        if lease is not None:
            with contextlib.suppress(DatabaseError):
                lease.release()
        database_failed(op, db, exc)
        return _tuned(op, args, identity, backend, dev, arch, plans, None)
    try:
        if record is not None:
            cfg = _config_from_record(op, record.config, arch)
            if cfg is not None:
                logger.info("%s: database hit for %s -> %s", op.name, identity.key, cfg)
                return Resolution(cfg, launched=False, source="database", median_us=record.median_us)
        return _tuned(op, args, identity, backend, dev, arch, plans, lease)
    finally:
        if lease is not None:
            try:
                lease.release()
            except DatabaseError as exc:
                database_failed(op, db, exc)


def _tuned(op: "TunedOp", args: tuple[Any, ...], identity: TuningIdentity, backend: Backend, dev: int,
           arch: str, plans: PlanCache, lease: Any) -> Resolution:
    result = tune(op, args, identity, backend, dev, arch, plans, resume=lease is not None)
    cfg = op.space.config(arch, **dict(result.winner))
    # an in-process session leaves exactly one launch of the winner on the caller's arguments;
    # after a worker session the caller launches the (verified) winner itself
    return Resolution(cfg, launched=bool(result.stats.get("launched_winner", True)), result=result,
                      median_us=result.winner_median_us)


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
        from tiletune.devices.workers import IsolationUnavailable

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
    from tiletune.engine.search import DEFAULT_SEARCH_EVALS, default_search, run_search

    db = op.db
    writable = _writable(op, db)  # a read-only database: tune, store nothing (its warning came first)
    prior: dict[str, Measurement] = {}
    on_result: Callable[[Measurement], None] | None = None
    if writable and resume:
        assert db is not None
        from tiletune.resolve.leases import progress

        try:
            prior = {m.config_hash: m for m in progress(db, identity)}
        except DatabaseError as exc:
            database_failed(op, db, exc)
            writable = False
        if prior:
            logger.info("%s: resuming %s from %d recorded config(s)", op.name, identity.key, len(prior))
        if writable:
            on_result = functools.partial(_record_progress, op, db, identity)

    over = _scope() or MissScope()
    seed = op.seed if over.seed is None else over.seed
    if over.strategy is not None:  # a strategy of the scope takes its own options (none: its defaults)
        strategy = make_strategy(over.strategy, op.space, arch, seed, **dict(over.strategy_options or {}))
        budget = over.budget or op.budget or Budget()
    else:
        options = dict(op.strategy_options if over.strategy_options is None else over.strategy_options)
        if op.strategy is None:  # exhaustive for a small space, else auto under a default budget
            name, budget = default_search(op.space, arch, over.budget or op.budget)
        else:
            name, budget = op.strategy, over.budget or op.budget or Budget()
        strategy = make_strategy(name, op.space, arch, seed, **options)
    if strategy.lazy is not None and budget.unlimited:
        raise SpaceError(
            f"{op.name}: the space has {op.space.product_size(arch):.3g} combinations of parameter values on "
            f"{arch}, too many to search to the end: give a budget (budget=tiletune.Budget(max_evals=...) or "
            f"max_seconds=...), or leave strategy= unset (auto, {DEFAULT_SEARCH_EVALS} evaluations)"
        )
    n_valid = len(strategy.pool)
    exhaustive = strategy.name == "exhaustive" and budget.max_evals is None and strategy.lazy is None
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
    if writable and op.db is db:  # (not dropped during the session)
        assert db is not None
        try:
            db.record_session(identity, result.measurements, result.winner, result.winner_median_us, result.tied)
        except DatabaseError as exc:
            database_failed(op, db, exc)
    logger.info("%s: tuned %s\n%s", op.name, identity.key, result.summary())
    return result


def _record_progress(op: "TunedOp", db: TuningDB, identity: TuningIdentity, measurement: Measurement) -> None:
    """Record one candidate's result while the op still uses ``db``; a failure drops the database."""
    if op.db is not db:
        return
    from tiletune.resolve.leases import record_progress

    try:
        record_progress(db, identity, measurement)
    except DatabaseError as exc:
        database_failed(op, db, exc)
