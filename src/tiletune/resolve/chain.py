"""The chain of sources: one way through a miss.

A tuned op that misses a key builds a :class:`~tiletune.resolve.problem.Problem` and asks
:meth:`Chain.resolve` for a :class:`~tiletune.resolve.problem.Choice`. The sources are asked in
order, and the first that answers wins:

1. **capture**: the call is being captured into a CUDA graph: a record that needs no compile, check
   or wait (the database's, a verified pin's, a table's), else the baseline, provisionally;
2. **disabled** (``TILETUNE_DISABLE=1``): the baseline; **single** (``tune_single=False``): the
   space's only valid config;
3. **pin** (:mod:`tiletune.resolve.pins`), **database** (:mod:`tiletune.resolve.database`),
   **table** (:mod:`tiletune.resolve.tables`);
4. **nearest** (:mod:`tiletune.resolve.nearest`): under ``on_miss="nearest"`` a tuned neighbour's
   config, under ``on_miss="default"`` the baseline, checked once, provisionally;
5. **peer** (:mod:`tiletune.resolve.peers`): the pick of the rank that claimed the key first;
6. **tuned** (:mod:`tiletune.resolve.tune`): under the identity's lease, or the winner of the
   process holding it.

Storing happens here, once, after a source answered (:meth:`Chain.store`): a tuned winner with its
measurements, a peer's pick, a provisional answer as a pending key. Listeners learn of every choice
through :mod:`tiletune.events`; nothing here holds the op.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace
from typing import Any, Sequence

from tiletune.devices import timeline
from tiletune import events
from tiletune.errors import DatabaseError, TiletuneError
from tiletune.resolve.attempt import Attempt, MissScope, Resolved, current_scope, miss_scope
from tiletune.resolve import fallback
from tiletune.resolve.database import DatabaseSource
from tiletune.resolve.nearest import NearestSource
from tiletune.resolve.peers import PeerSource
from tiletune.resolve.pins import PinSource, verified_pin
from tiletune.resolve.problem import Choice, Problem
from tiletune.resolve.tables import TableSource
from tiletune.resolve.tune import TuneSource

logger = logging.getLogger("tiletune")

__all__ = ["Attempt", "Chain", "MissScope", "Resolved", "current_scope", "default_chain", "default_sources", "miss_scope"]


# ---------------------------------------------------------------------- the first sources


class CaptureSource:
    """During a CUDA graph capture nothing may compile, check, wait or tune: a stored answer that needs
    none of that (a pin verified earlier in this process, the database's record, a table's entry),
    else the baseline, provisionally (tuned at the next call outside capture)."""

    name = "capture"

    def get(self, problem: Problem, attempt: Attempt) -> Choice | None:
        if not problem.capturing or problem.disabled:
            return None
        if not problem.spec.tune_single and problem.spec.single(problem.arch) is not None:
            return None  # the single source answers at once, inside a capture too
        try:
            cfg = verified_pin(problem)
            if cfg is not None:
                return Choice(cfg, "pin")
            for source in (DatabaseSource(), TableSource()):
                got = source.get(problem, attempt)
                if got is not None:
                    logger.info("%s: %s hit during CUDA graph capture -> %s", problem.name, got.source, got.config)
                    return got
        except Exception as exc:  # noqa: BLE001 - the baseline is the answer without them
            logger.debug("%s: lookup during capture failed: %s", problem.name, exc)
        cfg = problem.spec.baseline(problem.arch)
        logger.warning("tiletune: %s met a new problem key during CUDA graph capture; launching the baseline "
                       "config %s untuned; it is tuned at the next call outside capture or by tune_pending()",
                       problem.name, cfg)
        return Choice(cfg, "capture", provisional=True)


class DisabledSource:
    """``TILETUNE_DISABLE=1``: the baseline, with nothing looked up or stored."""

    name = "disabled"

    def get(self, problem: Problem, attempt: Attempt) -> Choice | None:
        return Choice(problem.spec.baseline(problem.arch), "disabled") if problem.disabled else None


class SingleSource:
    """``tune_single=False``: the space's only valid config, launched without a session."""

    name = "single"

    def get(self, problem: Problem, attempt: Attempt) -> Choice | None:
        if problem.spec.tune_single:
            return None
        cfg = problem.spec.single(problem.arch)
        if cfg is None:
            return None
        return fallback.while_compiling(problem, cfg) or Choice(cfg, "single")


# ---------------------------------------------------------------------- the chain


class Chain:
    """Sources asked in order; the first answer is stored once and returned."""

    def __init__(self, sources: Sequence[Any] | None = None) -> None:
        self.sources: tuple[Any, ...] = tuple(sources) if sources is not None else default_sources()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sources)

    def resolve(self, problem: Problem, attempt: Attempt | None = None) -> Choice:
        attempt = attempt if attempt is not None else Attempt()
        choice: Choice | None = None
        error: BaseException | None = None
        try:
            for source in self.sources:
                attempt.visited.append(source.name)
                timeline.mark("source", name=source.name)
                choice = source.get(problem, attempt)
                if choice is not None:
                    break
            if choice is None:
                raise TiletuneError(f"{problem.name}: no source answered for {problem.key!r}")
            choice = replace(choice, seconds=time.perf_counter() - problem.started)
            t_store = time.perf_counter()
            self.store(problem, choice, attempt)
            if choice.result is not None and isinstance(choice.result.stats, dict):  # time outside its session
                choice.result.stats["miss_s"] = round(choice.seconds, 4)  # the miss's start to the answer
                choice.result.stats["store_s"] = round(time.perf_counter() - t_store, 4)
        except BaseException as exc:
            error = exc
            raise
        finally:
            attempt.close(choice if error is None else None, error)
        scope = current_scope()
        if scope is not None and choice.source not in ("capture", "disabled", "single", "fallback"):
            scope.resolved.append(Resolved(problem.name, problem.identity, choice.config.as_dict(), choice.source,
                                           choice.result))
        events.emit("choice", op=problem.name, problem=problem, choice=choice)
        if choice.result is not None:
            events.emit("tuned", op=problem.name, problem=problem, result=choice.result)
        return choice

    def store(self, problem: Problem, choice: Choice, attempt: Attempt) -> None:
        """Keep what the answer adds: a tuned winner (with its measurements) or a peer's pick in the
        database, a provisional answer in the pending file. Answers read from somewhere (a pin, the
        database, a table) add nothing."""
        handle = problem.database
        if choice.source == "tuned" and choice.result is not None:
            db = handle.db
            if handle.writable(db, problem.name):
                r = choice.result
                try:
                    db.record_session(problem.identity, r.measurements, r.winner, r.winner_median_us, r.tied)
                    attempt.stored += 1
                except DatabaseError as exc:
                    handle.failed(db, exc, problem.name)
            self._untrack_pending(problem)
        elif choice.source == "peer" and choice.median_us:
            db = handle.db
            if handle.writable(db, problem.name):
                try:
                    if db.lookup(problem.identity) is None:
                        db.record_session(problem.identity, [], choice.config.as_dict(), float(choice.median_us),
                                          [dict(t) for t in attempt.peer_tied])
                        attempt.stored += 1
                except DatabaseError as exc:
                    handle.failed(db, exc, problem.name)
        elif choice.provisional and choice.source in ("nearest", "default"):
            from tiletune.resolve import pending

            if pending.record(problem, choice):
                attempt.stored += 1

    @staticmethod
    def _untrack_pending(problem: Problem) -> None:
        from tiletune.resolve import pending

        path = pending.pending_path(problem.database.db)
        if path is not None and path.exists():
            ident = problem.identity
            with contextlib.suppress(OSError):
                pending.remove(path, [(ident.kernel_id, ident.space_hash, ident.key)])


def default_sources() -> tuple[Any, ...]:
    return (CaptureSource(), DisabledSource(), SingleSource(), PinSource(), DatabaseSource(), TableSource(),
            NearestSource(), PeerSource(), TuneSource())


_default: Chain | None = None


def default_chain() -> Chain:
    """The chain every tuned op asks (its sources in the order of this module's docstring)."""
    global _default
    if _default is None:
        _default = Chain()
    return _default
