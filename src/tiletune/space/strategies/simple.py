"""The two reference strategies: exhaustive (space order) and random (without replacement)."""

from __future__ import annotations

from tiletune.space.spaces import Config, Space
from tiletune.space.strategies.base import Strategy

__all__ = ["ExhaustiveStrategy", "RandomStrategy"]


class ExhaustiveStrategy(Strategy):
    """Every valid configuration, baseline first, then in space order.

    The racing that makes exhaustive search affordable lives in the tuning loop (candidates that
    clearly cannot win stop being measured), so this strategy only fixes the order.
    """

    name = "exhaustive"

    def __init__(self, space: Space, arch: str | None = None, seed: int = 0) -> None:
        super().__init__(space, arch, seed)
        self._order = iter(self.pool)  # a lazy space's pool streams its valid configs in space order

    def _propose(self, n: int) -> list[Config]:
        out: list[Config] = []
        for cfg in self._order:
            if cfg not in self.seen:
                out.append(cfg)
                if len(out) >= n:
                    break
        return out


class RandomStrategy(Strategy):
    """Uniform random sampling without replacement (baseline first); the yardstick for the others.

    On a lazy space (:attr:`Strategy.lazy`), each proposal is drawn by rejection sampling instead of
    from a shuffled list of the whole space.
    """

    name = "random"

    def __init__(self, space: Space, arch: str | None = None, seed: int = 0) -> None:
        super().__init__(space, arch, seed)
        self._order: list[Config] = []
        if self.lazy is None:
            self._order = [c for c in self.pool if c != self.baseline]
            self.rng.shuffle(self._order)
        self._next = 0

    def _propose(self, n: int) -> list[Config]:
        if self.lazy is not None:
            return self._unseen_random(n)
        out: list[Config] = []
        while len(out) < n and self._next < len(self._order):
            cfg = self._order[self._next]
            self._next += 1
            if cfg not in self.seen:
                out.append(cfg)
        return out
