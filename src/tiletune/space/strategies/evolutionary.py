"""An evolutionary strategy: duplicate-free, failure-tolerant, elitist.

The population is the ``population`` fastest configurations measured so far (a (mu + lambda)
scheme: a child only enters by beating a member). Each child comes from two parents picked by
tournament, uniform crossover (each parameter from either parent) and mutation: with probability
``mutation`` one step to a random valid neighbour (``space.neighbours``: one parameter moved to the
previous or next value), with probability ``jump`` one parameter set to a random value.

* Duplicate-free: a child that was already proposed (or is already in this batch) or that violates a
  constraint is discarded and bred again; after ``max_tries`` attempts the strategy falls back to an
  unseen neighbour of the best members, then to an unseen configuration at random. It never proposes
  a configuration twice, and it never stalls while any is left.
* Big spaces: on a lazy space (:mod:`tiletune.space.lazy`) a child is checked against the constraints
  when it is bred, and the neighbours and random configs come from the lazy view; nothing is listed.
* Failure-tolerant: a failed configuration (compile error, launch error, mismatch, timeout) never
  becomes a parent. While the population is not full, each failure is replaced by a fresh random
  configuration, so failures cost an evaluation but never shrink the gene pool.
"""

from __future__ import annotations

from tiletune.space.spaces import Config, Space
from tiletune.space.strategies.base import Strategy

__all__ = ["EvolutionaryStrategy"]


class EvolutionaryStrategy(Strategy):
    """Genetic search with tournament selection, uniform crossover and neighbour mutation.

    Args:
        population: number of members (the fastest measured configurations) that breed.
        tournament: tournament size of parent selection.
        crossover: probability that a child mixes two parents (else it copies one, then mutates).
        mutation: probability of a one-step neighbour move after crossover.
        jump: probability of setting one parameter to a random value (long-range exploration).
        max_tries: breeding attempts per child before the fallbacks.
    """

    name = "evolutionary"

    def __init__(
        self,
        space: Space,
        arch: str | None = None,
        seed: int = 0,
        *,
        population: int = 10,
        tournament: int = 5,
        crossover: float = 0.7,
        mutation: float = 0.6,
        jump: float = 0.15,
        max_tries: int = 64,
    ) -> None:
        super().__init__(space, arch, seed)
        if population < 2:
            raise ValueError(f"population must be >= 2, got {population!r}")
        if tournament < 1:
            raise ValueError(f"tournament must be >= 1, got {tournament!r}")
        for name, p in (("crossover", crossover), ("mutation", mutation), ("jump", jump)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
        self.population_size = population
        self.tournament = tournament
        self.crossover = crossover
        self.mutation = mutation
        self.jump = jump
        self.max_tries = max_tries
        self.names = space.names
        self.values = {n: space.values(n, arch) for n in self.names}
        # the valid configs by value key (a lazy space checks each child against the constraints instead)
        self._by_key = {self._key(c): c for c in self.pool} if self.lazy is None else {}
        self.generations = 0  # batches bred from a population
        self.bred = 0  # children accepted from crossover/mutation
        self.fallbacks = 0  # proposals that came from a fallback

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _key(values: object) -> tuple[tuple[bool, object], ...]:
        vals = values.values() if isinstance(values, Config) else values  # type: ignore[union-attr]
        return tuple((type(v) is bool, v) for v in vals)  # type: ignore[union-attr]

    def _lookup(self, values: list) -> Config | None:  # type: ignore[type-arg]
        """The valid config with these values (in parameter order), or None."""
        if self.lazy is None:
            return self._by_key.get(self._key(values))
        idx = self.lazy.index_of(dict(zip(self.names, values)))
        return None if idx is None else self.lazy.check(idx)

    def _neighbours(self, values: object) -> list[Config]:
        cfg = values if isinstance(values, Config) else dict(zip(self.names, values))  # type: ignore[arg-type]
        if self.lazy is not None:
            return self.lazy.neighbours(cfg)
        return self.space.neighbours(cfg, self.arch)

    def members(self) -> list[tuple[float, Config]]:
        """The current population: the fastest successful configurations, fastest first."""
        ok = [(v, i, c) for i, (c, v) in enumerate(self.results.items()) if v is not None]
        ok.sort(key=lambda t: (t[0], t[1]))
        return [(v, c) for v, _, c in ok[: self.population_size]]

    def _select(self, members: list[tuple[float, Config]]) -> Config:
        k = min(self.tournament, len(members))
        picks = self.rng.sample(range(len(members)), k)
        return members[min(picks)][1]  # members are sorted: the smallest index is the fastest

    def _breed(self, members: list[tuple[float, Config]]) -> Config | None:
        """One child (valid, possibly already seen: the caller checks), or None if invalid."""
        p1 = self._select(members)
        child = list(p1.values())
        if len(members) > 1 and self.rng.random() < self.crossover:
            p2 = self._select(members)
            for _ in range(3):  # prefer a different second parent
                if p2 != p1:
                    break
                p2 = self._select(members)
            child = [a if self.rng.random() < 0.5 else b for a, b in zip(p1.values(), p2.values())]
        if self.rng.random() < self.jump:
            i = self.rng.randrange(len(self.names))
            child[i] = self.rng.choice(self.values[self.names[i]])
        cfg = self._lookup(child)
        if cfg is None or cfg in self.seen or self.rng.random() < self.mutation:
            # mutate: one step to a valid neighbour (the child itself may violate a constraint)
            neigh = self._neighbours(child)
            fresh = [c for c in neigh if c not in self.seen]
            if fresh:
                cfg = self.rng.choice(fresh)
            elif neigh and cfg is None:
                cfg = self.rng.choice(neigh)
        return cfg

    # ------------------------------------------------------------------ strategy
    def _propose(self, n: int) -> list[Config]:
        out: list[Config] = []
        taken: set[Config] = set()
        members = self.members()
        # Fill the population first: fresh random configs replace the ones that failed.
        live = len([v for v in self.results.values() if v is not None]) + len(self.pending)
        if live < self.population_size:
            for cfg in self._unseen_random(min(n, self.population_size - live)):
                out.append(cfg)
                taken.add(cfg)
        if len(members) < 2:
            return out
        self.generations += 1
        while len(out) < n:
            child = None
            for _ in range(self.max_tries):
                c = self._breed(members)
                if c is not None and c not in self.seen and c not in taken:
                    child = c
                    break
            if child is not None:
                self.bred += 1
            else:
                child = self._fallback(members, taken)
                if child is None:
                    break
                self.fallbacks += 1
            out.append(child)
            taken.add(child)
        return out

    def _fallback(self, members: list[tuple[float, Config]], taken: set[Config]) -> Config | None:
        """An unseen neighbour of the best member that has one, else an unseen config at random."""
        for _, m in members:
            fresh = [c for c in self._neighbours(m) if c not in self.seen and c not in taken]
            if fresh:
                return self.rng.choice(fresh)
        if self.lazy is not None:
            got = self.lazy.sample(self.rng, 1, exclude=self.seen | taken)
            return got[0] if got else None
        rest = [c for c in self.pool if c not in self.seen and c not in taken]
        return self.rng.choice(rest) if rest else None
