"""Iterated local search with restarts (issue 16): ``"local"``.

A constraint-aware local search over the valid configurations only (neighbourhoods come from
:class:`~._index.PoolIndex`, so a move never lands on a config that breaks a constraint):

* from the current config, try its unseen neighbours in a seeded random order: first the *adjacent*
  ones (one parameter moved one step in its value list), then the rest of the *Hamming* neighbourhood
  (one parameter set to any other value); move to the first one that is faster (first improvement);
* when every neighbour was tried and none is faster, the current config is a local optimum: the
  search *perturbs* the best config found so far (``kick`` parameters set to random values; redrawn
  until the combination is valid and unseen) and goes on from there, whatever its time; every
  ``restart_every``-th perturbation is a random restart instead, so a search stuck in one basin gets
  out;
* failed configs are never moved to (a failure counts as infinitely slow).

The start is the baseline if the space has one, else a random config. Deterministic for a seed.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tiletune.space.spaces import Space
from tiletune.space.strategies._index import index_for
from tiletune.space.strategies.base import Result, Strategy

__all__ = ["LocalSearchStrategy"]


class LocalSearchStrategy(Strategy):
    """Iterated first-improvement local search with perturbations and restarts (see the module docstring).

    Args:
        kick: parameters changed by a perturbation of the best config.
        restart_every: every this many perturbations, restart from a random config (0: never).
        n_init: random configs measured before the first move (the start is the best of them).
    """

    name = "local"

    def __init__(self, space: Space, arch: str | None = None, seed: int = 0, *, kick: int = 2,
                 restart_every: int = 3, n_init: int = 1) -> None:
        super().__init__(space, arch, seed)
        if kick < 1:
            raise ValueError(f"kick must be >= 1, got {kick!r}")
        if n_init < 1:
            raise ValueError(f"n_init must be >= 1, got {n_init!r}")
        self.kick = kick
        self.restart_every = restart_every
        self.n_init = n_init
        self.index = index_for(space, arch, self.pool, self.lazy)
        self._np_rng = np.random.default_rng(seed)
        self._val: dict[int, float] = {}  # told rows -> time (inf for a failure)
        self._seen_rows: set[int] = set()
        self.current: int | None = None
        self._queue: list[int] = []
        self._kicked: set[int] = set()  # perturbed starts: the search goes on from them whatever their time
        self.perturbations = 0
        self.moves = 0

    # ------------------------------------------------------------------ bookkeeping
    def _mark(self, cfg) -> None:  # type: ignore[no-untyped-def]
        super()._mark(cfg)
        r = self.index.rowof(cfg)
        if r is not None:
            self._seen_rows.add(r)

    def _learn(self, results: Sequence[Result]) -> None:
        for cfg, v in results:
            r = self.index.rowof(cfg)
            if r is None:
                continue
            self._val[r] = float("inf") if v is None else float(v)
            kicked = r in self._kicked
            self._kicked.discard(r)
            if v is not None and (kicked or self.current is None
                                  or self._val[r] < self._val.get(self.current, float("inf"))):
                if self.current is not None:
                    self.moves += 1
                self._set_current(r)

    def _set_current(self, r: int) -> None:
        self.current = r
        adj = [x for x in self.index.adjacent(r)]
        rest = [x for x in self.index.hamming(r) if x not in set(adj)]
        self._np_rng.shuffle(adj)
        self._np_rng.shuffle(rest)
        self._queue = adj + rest

    def _random_unseen(self) -> int | None:
        """A random unseen config: each parameter's value drawn at random, snapped to the nearest valid
        unseen config (:meth:`~._index.PoolIndex.design`)."""
        allowed = np.ones(len(self.index), dtype=bool)
        if self._seen_rows:
            allowed[list(self._seen_rows)] = False
        got = self.index.design(1, allowed, self._np_rng)
        return got[0] if got else None

    def _perturb(self) -> int | None:
        """An unseen config near the best one (``kick`` parameters re-drawn), or a random restart."""
        self.perturbations += 1
        if self.restart_every and self.perturbations % self.restart_every == 0:
            return self._random_unseen()
        ok = [(v, r) for r, v in self._val.items() if v != float("inf")]
        if not ok:
            return self._random_unseen()
        best = min(ok)[1]
        active = self.index.active
        for _ in range(32):
            idx = self.index.V[best].copy()
            for j in self._np_rng.choice(active, min(self.kick, len(active)), replace=False):
                idx[j] = int(self._np_rng.integers(0, self.index.sizes[j]))
            r = self.index.row(idx)
            if r is not None and r not in self._seen_rows:
                return r
        return self._random_unseen()

    # ------------------------------------------------------------------ strategy
    def _propose(self, n: int) -> list:
        out: list = []
        taken: set[int] = set()
        while len(out) < n:
            r: int | None = None
            if len(self._seen_rows) + len(taken) < self.n_init or self.current is None and not self._val:
                r = self._random_unseen()
            else:
                while self._queue:
                    x = self._queue.pop(0)
                    if x not in self._seen_rows and x not in taken:
                        r = x
                        break
                if r is None:
                    if self.pending - {self.index.pool[t] for t in taken}:
                        break  # wait for the pending results before declaring a local optimum
                    r = self._perturb()
                    if r is not None:
                        self._queue = []  # the perturbed config is tried; the search goes on from it
                        self._kicked.add(r)
            if r is None or r in taken:
                break
            taken.add(r)
            out.append(self.index.pool[r])
        return out
