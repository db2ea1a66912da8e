"""The strategy interface: ask/tell over a space, seeded, never repeating, never touching a GPU.

A strategy proposes configurations (:meth:`Strategy.ask`) and learns from their measured medians
(:meth:`Strategy.tell`); :func:`tiletune.search.run_search` drives it through the tuning loop and
enforces the :class:`Budget`. Every strategy keeps the same contract, enforced here once for all:

* only valid configurations of the space on the given architecture are proposed (constraints and
  per-architecture values honoured): the pool is ``space.candidates(arch)``;
* the baseline (if the space has one on that architecture) is the very first proposal;
* no configuration is ever proposed twice (a seen set, whatever the subclass does);
* the same ``seed`` gives the same proposals for the same results.

Subclasses implement :meth:`Strategy._propose` (and optionally :meth:`Strategy._learn`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import TiletuneError
from ..space import Config, Space

__all__ = ["Budget", "Strategy", "Result", "make_strategy", "register", "STRATEGIES"]

Result = tuple[Config, "float | None"]
"""What a strategy is told about one config: its median in microseconds, or None if it failed."""


@dataclass(frozen=True)
class Budget:
    """How much a search may spend: evaluations (configs proposed and run) and/or seconds.

    Seconds are the tuning session's clock (``session.clock()``): wall time for live tuning, the
    simulated clock for replay; compilation counts. ``None`` means no limit on that axis; with both
    ``None`` the search runs until the strategy has nothing left to propose.
    """

    max_evals: int | None = None
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.max_evals is not None and (
            isinstance(self.max_evals, bool) or not isinstance(self.max_evals, int) or self.max_evals < 1
        ):
            raise ValueError(f"Budget.max_evals must be a positive int or None, got {self.max_evals!r}")
        if self.max_seconds is not None and not (
            isinstance(self.max_seconds, (int, float)) and math.isfinite(self.max_seconds) and self.max_seconds > 0
        ):
            raise ValueError(f"Budget.max_seconds must be a positive number or None, got {self.max_seconds!r}")

    @property
    def unlimited(self) -> bool:
        """True when neither evaluations nor seconds are limited."""
        return self.max_evals is None and self.max_seconds is None


class Strategy:
    """Base class of the search strategies (see the module docstring for the contract).

    Args:
        space: the space to search.
        arch: the architecture whose values and constraints apply (``"sm_90"``; None: defaults).
        seed: seeds every random choice of the strategy.
    """

    #: Registry name (``make_strategy(name, ...)``).
    name: str = "strategy"

    def __init__(self, space: Space, arch: str | None = None, seed: int = 0) -> None:
        self.space = space
        self.arch = arch
        self.seed = seed
        self.rng = random.Random(seed)
        self.pool: list[Config] = space.candidates(arch)  # baseline first, then space order
        self.valid: set[Config] = set(self.pool)
        self.baseline: Config | None = space.baseline(arch)
        self.seen: set[Config] = set()  # proposed (told or pending)
        self.pending: set[Config] = set()  # proposed, not told yet
        self.results: dict[Config, float | None] = {}  # told: median us, None for a failure
        self.history: list[Config] = []  # every proposal, in order

    # ------------------------------------------------------------------ public interface
    @property
    def done(self) -> bool:
        """True when the strategy has nothing left to propose (the whole space was proposed)."""
        return len(self.seen) >= len(self.pool)

    @property
    def remaining(self) -> int:
        """How many valid configurations were never proposed."""
        return len(self.pool) - len(self.seen)

    def ask(self, n: int = 1) -> list[Config]:
        """Up to ``n`` new configurations to evaluate; at least one while any is left.

        Never a configuration proposed before; the baseline first if the space has one. A strategy
        may return fewer than ``n`` on purpose (a model-based one starts with a small design).
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"ask: n must be a non-negative int, got {n!r}")
        out: list[Config] = []
        if n and self.baseline is not None and self.baseline not in self.seen:
            out.append(self.baseline)
            self._mark(self.baseline)
        want = min(n, self.remaining + len(out))
        if len(out) < want:
            for cfg in self._propose(want - len(out)):
                if cfg in self.seen or cfg not in self.valid:  # the contract holds whatever _propose does
                    continue
                out.append(cfg)
                self._mark(cfg)
                if len(out) >= want:
                    break
        if not out and want:  # a subclass that proposed nothing new: never stall the search
            for cfg in self._unseen_random(1):
                out.append(cfg)
                self._mark(cfg)
        return out

    def tell(self, results: Sequence[Result]) -> None:
        """Report measured medians (microseconds; None for a failed config) of proposed configs."""
        told: list[Result] = []
        for cfg, value in results:
            if cfg not in self.seen:
                raise TiletuneError(f"tell: {cfg!r} was never proposed by this strategy")
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise TiletuneError(f"tell: the median of {cfg!r} must be a positive finite number or None, got {value!r}")
            self.pending.discard(cfg)
            self.results[cfg] = None if value is None else float(value)
            told.append((cfg, self.results[cfg]))
        self._learn(told)

    def best(self) -> tuple[Config, float] | None:
        """The fastest successful configuration told so far, with its median (None if none)."""
        ok = [(v, i, c) for i, (c, v) in enumerate(self.results.items()) if v is not None]
        if not ok:
            return None
        v, _, c = min(ok)
        return c, v

    # ------------------------------------------------------------------ for subclasses
    def _propose(self, n: int) -> list[Config]:
        """Up to ``n`` proposals (unseen and valid; anything else is skipped by :meth:`ask`)."""
        raise NotImplementedError

    def _learn(self, results: Sequence[Result]) -> None:
        """Hook called by :meth:`tell` with the newly told results."""

    def _mark(self, cfg: Config) -> None:
        self.seen.add(cfg)
        self.pending.add(cfg)
        self.history.append(cfg)

    def _unseen(self) -> list[Config]:
        """The never-proposed configurations, in space order."""
        return [c for c in self.pool if c not in self.seen]

    def _unseen_random(self, n: int) -> list[Config]:
        """Up to ``n`` never-proposed configurations drawn at random (seeded)."""
        rest = self._unseen()
        return self.rng.sample(rest, min(n, len(rest)))


StrategyFactory = Callable[..., Strategy]
STRATEGIES: dict[str, StrategyFactory] = {}


def register(name: str) -> Callable[[type[Strategy]], type[Strategy]]:
    """Class decorator adding a strategy to :data:`STRATEGIES` under ``name``."""

    def deco(cls: type[Strategy]) -> type[Strategy]:
        cls.name = name
        STRATEGIES[name] = cls
        return cls

    return deco


def make_strategy(name: str, space: Space, arch: str | None = None, seed: int = 0, **opts: Any) -> Strategy:
    """Create a strategy by name: ``"exhaustive"``, ``"random"``, ``"evolutionary"`` or ``"model"``.

    ``opts`` are passed to the strategy's constructor (e.g. ``population=12`` for evolutionary).
    """
    from . import evolutionary, model, simple  # noqa: F401  (registration)

    try:
        factory = STRATEGIES[name]
    except KeyError:
        raise TiletuneError(f"unknown strategy {name!r}; choose one of {', '.join(sorted(STRATEGIES))}") from None
    return factory(space, arch, seed, **opts)
