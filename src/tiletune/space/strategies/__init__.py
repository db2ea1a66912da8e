"""Search strategies: which configurations to measure, in which order (ask/tell; never a GPU).

``make_strategy(strategy, space, arch, seed, **opts)`` with ``strategy`` a registered name, a
:class:`Strategy` subclass or a :class:`Strategy` instance (a template). The built-in names:

* ``"exhaustive"``: every valid config, baseline first, space order (racing is the loop's job);
* ``"random"``: uniform without replacement;
* ``"evolutionary"``: elitist genetic search, duplicate-free, failed candidates replaced;
* ``"model"``: an extra-trees surrogate (scikit-learn) with an exploit/expected-improvement batch.

``@register("name")`` on a :class:`Strategy` subclass adds a name; the registry
(:data:`STRATEGIES`) is the only list of names: :func:`strategy_names` and :data:`STRATEGY_NAMES`
are live views of it.

:func:`tiletune.engine.search.run_search` drives a strategy through the tuning loop under a :class:`Budget`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Iterator, overload

from tiletune.space.strategies.base import Budget, Result, Strategy
from tiletune.space.strategies.evolutionary import EvolutionaryStrategy
from tiletune.space.strategies.model import ModelStrategy
from tiletune.space.strategies.registry import (
    STRATEGIES,
    StrategyError,
    StrategySpec,
    make_strategy,
    register,
    resolve_strategy,
    strategy_names,
)
from tiletune.space.strategies.simple import ExhaustiveStrategy, RandomStrategy


class _StrategyNames(Sequence):  # type: ignore[type-arg]
    """The registered strategy names, read from the registry at each use (a live, read-only view)."""

    def _names(self) -> tuple[str, ...]:
        return strategy_names()

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[str, ...]: ...
    def __getitem__(self, i: Any) -> Any:
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (_StrategyNames, tuple, list)):
            return self._names() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return repr(self._names())


#: The registered strategy names (a live view of the registry: names added later with
#: :func:`register` appear here too). ``tuple(STRATEGY_NAMES)`` for a snapshot.
STRATEGY_NAMES: Sequence[str] = _StrategyNames()

__all__ = [
    "STRATEGIES",
    "STRATEGY_NAMES",
    "Budget",
    "EvolutionaryStrategy",
    "ExhaustiveStrategy",
    "ModelStrategy",
    "RandomStrategy",
    "Result",
    "Strategy",
    "StrategyError",
    "StrategySpec",
    "make_strategy",
    "register",
    "resolve_strategy",
    "strategy_names",
]
