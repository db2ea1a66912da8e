"""What one pass through the chain holds (:class:`Attempt`), and miss scopes: per-thread overrides of
the tunings a call starts and the list of what it resolved (:func:`miss_scope`, for campaigns and fills).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from tiletune.errors import DatabaseError
from tiletune.records import TuneResult, TuningIdentity
from tiletune.settings import ON_MISS_CHOICES

if TYPE_CHECKING:  # pragma: no cover
    from tiletune.resolve.problem import Choice
    from tiletune.space.strategies.base import Budget

__all__ = ["Attempt", "MissScope", "Resolved", "current_scope", "miss_scope"]


class Attempt:
    """What one pass through the chain holds while it runs: the sources visited, the leases taken
    (released when the pass ends), and hooks to call with its outcome."""

    def __init__(self) -> None:
        self.visited: list[str] = []
        self.tuning_started = False
        self.stored = 0
        self.peer_tied: tuple[Mapping[str, Any], ...] = ()
        self._leases: list[tuple[Any, Any, Any, str]] = []
        self._finish: list[Callable[["Choice | None", BaseException | None], None]] = []

    def hold(self, lease: Any, db: Any, handle: Any, name: str) -> None:
        """Keep ``lease`` until the pass ends (the winner is stored first)."""
        self._leases.append((lease, db, handle, name))

    def on_finish(self, fn: Callable[["Choice | None", BaseException | None], None]) -> None:
        self._finish.append(fn)

    def close(self, choice: "Choice | None", error: BaseException | None) -> None:
        for fn in self._finish:
            fn(choice, error)
        self._finish.clear()
        for lease, db, handle, name in self._leases:
            try:
                lease.release()
            except DatabaseError as exc:
                handle.failed(db, exc, name)
        self._leases.clear()


# ---------------------------------------------------------------------- miss scopes (campaigns)


@dataclass(frozen=True)
class Resolved:
    """One key resolved inside a :func:`miss_scope`: the op's name, the identity, the config and
    its source, and the tuning result when this process tuned it."""

    op: str
    identity: TuningIdentity
    config: dict[str, Any]
    source: str
    result: TuneResult | None


@dataclass
class MissScope:
    """Overrides for the tunings of one thread (None: the op's own setting), and what was resolved."""

    strategy: Any = None
    budget: "Budget | None" = None
    seed: int | None = None
    strategy_options: Mapping[str, Any] | None = None
    on_miss: str | None = None
    resolved: list[Resolved] = field(default_factory=list)


_scopes = threading.local()


@contextlib.contextmanager
def miss_scope(*, strategy: Any = None, budget: "Budget | None" = None, seed: int | None = None,
               strategy_options: Mapping[str, Any] | None = None, on_miss: str | None = None) -> Iterator[MissScope]:
    """Within this block (this thread), every key a tuned op resolves is listed in the scope's
    ``resolved``, and tunings use ``strategy`` / ``budget`` / ``seed`` / ``strategy_options`` where
    given instead of the op's, and ``on_miss`` (``"tune"`` for a fill: every key tuned exactly) instead of
    the op's policy. A campaign runs each of its calls in one: the library ops are
    wrappers, so the tuned ops a call reaches are known only once it has reached them.

    Read only on a miss (the hot path never looks at it)."""
    from tiletune.space.strategies.base import Budget

    if strategy is not None:
        from tiletune.space.strategies import resolve_strategy

        resolve_strategy(strategy)  # a bad name fails here, not in the middle of a call
    if budget is not None and not isinstance(budget, Budget):
        raise TypeError(f"budget must be a tiletune.Budget, got {type(budget).__name__}")
    if on_miss is not None and on_miss not in ON_MISS_CHOICES:
        raise ValueError(f"on_miss={on_miss!r}: choose one of {', '.join(ON_MISS_CHOICES)}")
    scope = MissScope(strategy, budget, seed, dict(strategy_options) if strategy_options else None, on_miss)
    outer = getattr(_scopes, "current", None)
    _scopes.current = scope
    try:
        yield scope
    finally:
        _scopes.current = outer


def current_scope() -> MissScope | None:
    return getattr(_scopes, "current", None)
