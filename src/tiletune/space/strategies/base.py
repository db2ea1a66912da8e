"""The strategy interface: ask/tell over a space, seeded, never repeating, never touching a GPU.

A strategy proposes configurations (:meth:`Strategy.ask`) and learns from their measured medians
(:meth:`Strategy.tell`); :func:`tiletune.engine.search.run_search` drives it through the tuning loop and
enforces the :class:`Budget`. Every strategy keeps the same contract, enforced here once for all:

* only valid configurations of the space on the given architecture are proposed (constraints and
  per-architecture values honoured): the pool is ``space.candidates(arch)``, or, for a space of more
  than :data:`~tiletune.space.lazy.LAZY_THRESHOLD` combinations, a :class:`LazyPool` over
  :meth:`Space.lazy <tiletune.space.spaces.Space.lazy>` (never enumerated: :attr:`Strategy.lazy` is set);
* the baseline (if the space has one on that architecture) is the very first proposal;
* no configuration is ever proposed twice (a seen set, whatever the subclass does);
* the same ``seed`` gives the same proposals for the same results.

Subclasses implement :meth:`Strategy._propose` (and optionally :meth:`Strategy._learn`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from tiletune.errors import TiletuneError

from tiletune.space.lazy import LazySpace
from tiletune.space.spaces import Config, Space

__all__ = ["Budget", "LazyPool", "Strategy", "Result"]

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


class LazyPool:
    """The pool of a strategy over a lazy space (see :mod:`tiletune.space.lazy`): never enumerated.

    ``len()`` is the product of the value counts (an upper bound of the valid configs), ``cfg in pool``
    checks the config against the values and constraints, and iterating streams the valid configs in
    the order of ``space.candidates`` (baseline first). It has no positions: strategies draw from it
    with :meth:`Strategy._unseen_random` and move through it with the view's neighbourhoods.
    """

    def __init__(self, view: LazySpace, baseline: Config | None) -> None:
        self.view = view
        self.baseline = baseline

    def __len__(self) -> int:
        return len(self.view)

    def __contains__(self, cfg: object) -> bool:
        return cfg in self.view

    def __iter__(self) -> Iterator[Config]:
        if self.baseline is not None:
            yield self.baseline
        for cfg in self.view:
            if cfg != self.baseline:
                yield cfg

    def __repr__(self) -> str:
        return f"LazyPool({self.view!r})"


class Strategy:
    """Base class of the search strategies (see the module docstring for the contract).

    Args:
        space: the space to search.
        arch: the architecture whose values and constraints apply (``"sm_90"``; None: defaults).
        seed: seeds every random choice of the strategy.
    """

    #: Registry name (``make_strategy(name, ...)``): a built-in's own, set by
    #: :func:`~tiletune.space.strategies.registry.register` for the others, else the class name.
    name: str = "strategy"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__  # until @register names it

    def __new__(cls, *args: Any, **kwargs: Any) -> "Strategy":
        self = super().__new__(cls)
        # the constructor's arguments, so that an instance passed as ``strategy=`` can serve as a
        # template for a fresh strategy per search (see :func:`make_strategy`)
        self._init_args = args
        self._init_kwargs = kwargs
        return self

    def __init__(self, space: Space, arch: str | None = None, seed: int = 0) -> None:
        self.space = space
        self.arch = arch
        self.seed = seed
        self.rng = random.Random(seed)
        self.baseline: Config | None = space.baseline(arch)
        #: the lazy view of a space too big to enumerate (None: the pool is the list of valid configs)
        self.lazy: LazySpace | None = space.lazy(arch) if space.is_lazy(arch) else None
        self.pool: Any  # list[Config] (baseline first, then space order), or a LazyPool
        self.valid: Any  # set[Config], or the LazyPool (``in`` checks the constraints)
        if self.lazy is None:
            self.pool = space.candidates(arch)
            self.valid = set(self.pool)
        else:
            self.pool = self.valid = LazyPool(self.lazy, self.baseline)
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
        """The never-proposed configurations, in space order (not for a lazy space: it lists them all)."""
        return [c for c in self.pool if c not in self.seen]

    def _unseen_random(self, n: int) -> list[Config]:
        """Up to ``n`` never-proposed configurations drawn at random (seeded); on a lazy space, by
        rejection sampling (each parameter's value uniformly, until the constraints accept)."""
        if self.lazy is not None:
            return self.lazy.sample(self.rng, n, exclude=self.seen)
        rest = self._unseen()
        return self.rng.sample(rest, min(n, len(rest)))
