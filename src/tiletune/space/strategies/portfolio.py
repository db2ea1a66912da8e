"""Model-guided local search and the ``"auto"`` strategy (issue 16).

``"hybrid"`` combines the two searches that won on different public spaces: the iterated local search
of :mod:`.local` (fast descent in a basin, perturbations and restarts to leave it) and the forest
surrogate of :mod:`.surrogate` (which knows where failures and slow regions are), with a bandit that
gives more picks to whichever finds new best configs on the space at hand (see
:class:`HybridStrategy`). The first ``n_init`` configs are random (baseline first if any) and the
surrogate is refitted on the schedule of :class:`~.surrogate.SurrogateStrategy`.

``"auto"`` picks by the space: a space of at most ``small`` configs is searched at random (the budget
covers most of it anyway and a model cannot learn from a handful of points); without scikit-learn the
iterated local search ``"local"``; otherwise ``"hybrid"``. The choice is in :attr:`AutoStrategy.chosen`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from tiletune.space.spaces import Config, Space
from tiletune.space.strategies.base import Result, Strategy
from tiletune.space.strategies.registry import make_strategy
from tiletune.space.strategies.surrogate import SurrogateStrategy

__all__ = ["AutoStrategy", "HybridStrategy"]


class HybridStrategy(SurrogateStrategy):
    """A bandit over three ways of picking the next config, sharing one current config and one model.

    Arms (each pick draws one by Thompson sampling over discounted success counts; a success is a
    pick that found a new best config):

    * ``"walk"``: an unseen neighbour of the current config at random, adjacent ones (one parameter one
      step) before the rest of the Hamming neighbourhood: the model-free local search of :mod:`.local`;
    * ``"ranked"``: the unseen neighbour of the current config the surrogate predicts fastest (a likely
      failure last);
    * ``"global"``: the unseen config of highest expected improvement in the whole space (the surrogate's
      pick in :mod:`.surrogate`); the search moves there when it is faster than the current config.

    A faster neighbour becomes the current config (first improvement). When the current config has no
    unseen neighbour left (a local optimum), the search jumps, in turn, to the global pick, to a random
    perturbation of the best config (``kick`` parameters re-drawn) and to a random config, and goes on
    from there whatever its time.

    Restarts (``stall > 0``; off by default, and under ``"auto"``: over 100 seeds they did not help on
    the public spaces, see benchmarks/README.md): once ``stall`` results in a row failed to
    improve the best time found since the last restart by ``stall_tol`` (a basin is spent: on a plateau
    first-improvement moves by tiny margins go on for hundreds of evaluations), the best config of the
    basin joins a tabu list and the search restarts from the model's pick (expected improvement) among
    the unseen configs more than ``tabu`` parameters away from every abandoned basin, and goes on from
    there whatever its time. With ``sticky``, a global pick that is not a new best overall does not
    pull the current config back towards an old basin (only the walk's own moves do).

    Args (besides :class:`~.surrogate.SurrogateStrategy`'s):
        arms: the arms in play (any of ``"walk"``, ``"ranked"``, ``"global"``).
        discount: per-pick decay of the arms' counts (recent picks weigh more).
        kick: parameters re-drawn by a perturbation of the best config.
        jumps: the cycle of jumps taken at local optima (``"kick"``, ``"random"``, ``"global"``).
        restart: a random jump draws a config uniformly (``"uniform"``) or each parameter's value
            uniformly, snapped to the nearest valid config (``"marginal"``).
        stall: results without progress that trigger a restart (0: never).
        stall_tol: the relative improvement of the basin's best that counts as progress.
        tabu: a restart lands more than this many parameters away from every abandoned basin.
        sticky: only a new best overall moves the current config when a global pick found it.
    """

    name = "hybrid"

    ARMS = ("walk", "ranked", "global", "exploit")

    def __init__(self, space: Space, arch: str | None = None, seed: int = 0, *, n_init: int = 6,
                 arms: Sequence[str] = ("walk", "global"), discount: float = 0.9, kick: int = 2,
                 jumps: Sequence[str] = ("kick", "random", "global"), restart: str = "uniform",
                 stall: int = 0, stall_tol: float = 0.01, tabu: int = 2, sticky: bool = False,
                 **opts: Any) -> None:
        super().__init__(space, arch, seed, n_init=n_init, **opts)
        bad = [a for a in arms if a not in self.ARMS]
        if bad or not arms:
            raise ValueError(f"arms must be a non-empty subset of {self.ARMS}, got {list(arms)!r}")
        if not 0.0 < discount <= 1.0:
            raise ValueError(f"discount must be in (0, 1], got {discount!r}")
        self.arms = tuple(arms)
        if not jumps or any(j not in ("global", "kick", "random") for j in jumps):
            raise ValueError(f"jumps must be a non-empty sequence of 'global', 'kick', 'random', got {jumps!r}")
        self.jumps = tuple(jumps)
        if restart not in ("uniform", "marginal"):
            raise ValueError(f"restart must be 'uniform' or 'marginal', got {restart!r}")
        self.restart = restart
        if stall < 0:
            raise ValueError(f"stall must be >= 0, got {stall!r}")
        self.stall = stall
        self.stall_tol = stall_tol
        self.tabu = tabu
        self.sticky = sticky
        self._basin_best = float("inf")  # best time since the last restart
        self._since = 0  # results since the basin's best last improved by stall_tol
        self._basins: list[int] = []  # rows of the best config of every abandoned basin
        self._restart_due = False
        self.restarts = 0
        self.discount = discount
        self.kick = kick
        self.current: int | None = None
        self._cur_val = float("inf")
        self._best_val = float("inf")
        self._jumped: set[int] = set()  # rows the search goes on from whatever their time
        self._arm_of: dict[int, str] = {}  # pending picks -> their arm
        self._wins = {a: 0.0 for a in self.arms}
        self._losses = {a: 0.0 for a in self.arms}
        self._walk: list[int] = []  # random order of the current config's neighbours (walk arm)
        self._walk_of: int | None = None
        self._jumps = 0
        self.moves = 0
        self.arm_picks = {a: 0 for a in self.arms}

    # ------------------------------------------------------------------ learning
    def _learn(self, results: Sequence[Result]) -> None:
        super()._learn(results)
        for cfg, v in results:
            r = self.index.rowof(cfg)
            if r is None:
                continue
            jumped = r in self._jumped
            self._jumped.discard(r)
            arm = self._arm_of.pop(r, None)
            improved = v is not None and v < self._best_val
            if arm is not None:
                for a in self.arms:
                    self._wins[a] *= self.discount
                    self._losses[a] *= self.discount
                if improved:
                    self._wins[arm] += 1.0
                else:
                    self._losses[arm] += 1.0
            if self.stall:
                if v is not None and v < self._basin_best * (1.0 - self.stall_tol):
                    self._since = 0
                else:
                    self._since += 1
                if v is not None:
                    self._basin_best = min(self._basin_best, float(v))
                if self._since >= self.stall and self.current is not None:
                    self._restart_due = True
            if v is None:
                continue
            far = self.sticky and arm in ("global", "exploit") and not improved
            self._best_val = min(self._best_val, float(v))
            if jumped or (v < self._cur_val and not far):
                if self.current is not None:
                    self.moves += 1
                self.current, self._cur_val = r, float(v)

    # ------------------------------------------------------------------ picks
    def _unseen_neighbours(self) -> list[int]:
        assert self.current is not None
        return [r for r in self.index.hamming(self.current) if self._unseen[r]]

    def _walk_pick(self) -> int | None:
        if self._walk_of != self.current:
            assert self.current is not None
            adj = list(self.index.adjacent(self.current))
            adj_set = set(adj)
            rest = [r for r in self.index.hamming(self.current) if r not in adj_set]
            self._np_rng.shuffle(adj)
            self._np_rng.shuffle(rest)
            self._walk, self._walk_of = adj + rest, self.current
        while self._walk:
            r = self._walk.pop(0)
            if self._unseen[r]:
                return r
        return None

    def _ranked_pick(self) -> int | None:
        neigh = self._unseen_neighbours()
        if not neigh:
            return None
        rows = np.asarray(neigh, dtype=np.int64)
        if self._reg is None:
            return int(self._np_rng.choice(rows))
        self._predict(rows[np.isnan(self._mu[rows])])
        score = self._mu[rows] + 10.0 * self._pf[rows]
        tie = self._np_rng.random(rows.size)
        return int(rows[np.lexsort((tie, score))[0]])

    def _global_pick(self) -> int | None:
        if self._reg is None:
            return None
        cand = np.flatnonzero(self._unseen & ~np.isnan(self._mu))
        if cand.size == 0:
            return None
        return int(cand[int(np.argmax(self._acquire(cand, False)))])

    def _exploit_pick(self) -> int | None:
        if self._reg is None:
            return None
        cand = np.flatnonzero(self._unseen & ~np.isnan(self._mu))
        if cand.size == 0:
            return None
        return int(cand[int(np.argmax(self._acquire(cand, True)))])

    def _kick_pick(self) -> int | None:
        told = [(y, r) for r, y in zip(self._told_rows, self._told_y) if y is not None]
        if not told:
            return None
        best = min(told)[1]
        active = self.index.active
        for _ in range(32):
            idx = self.index.V[best].copy()
            for j in self._np_rng.choice(active, min(self.kick, len(active)), replace=False):
                idx[j] = int(self._np_rng.integers(0, self.index.sizes[j]))
            r = self.index.row(idx)
            if r is not None and self._unseen[r]:
                return r
        return None

    def _random_pick(self) -> int | None:
        if self.restart == "marginal":
            got = self.index.design(1, self._unseen, self._np_rng)
            return got[0] if got else None
        if self.lazy is not None:
            got = self.index.sample(1, self._unseen, self._np_rng)
            return got[0] if got else None
        rows = np.flatnonzero(self._unseen)
        return int(self._np_rng.choice(rows)) if rows.size else None

    def _restart_pick(self) -> int | None:
        """A restart after ``stall`` results without progress: the current basin's best joins the tabu
        list, and the new start is the model's pick (else a random config) among the unseen configs
        more than ``tabu`` parameters away from every abandoned basin."""
        assert self.current is not None
        told = [(y, r) for r, y in zip(self._told_rows, self._told_y) if y is not None]
        basin = min(told)[1] if told else self.current
        if self._cur_val < float("inf"):
            basin = self.current
        self._basins.append(basin)
        self.restarts += 1
        allowed = self._unseen.copy()
        if self.lazy is None and self.tabu > 0:
            V = self.index.V
            for b in self._basins:
                allowed &= (V != V[b]).sum(axis=1) > self.tabu
            if not allowed.any():
                allowed = self._unseen.copy()
        r = None
        if self._reg is not None:
            cand = np.flatnonzero(allowed & ~np.isnan(self._mu))
            if cand.size:
                r = int(cand[int(np.argmax(self._acquire(cand, False)))])
        if r is None:
            if self.lazy is not None:
                got = self.index.sample(1, allowed, self._np_rng)
            else:
                got = self.index.design(1, allowed, self._np_rng)
            r = got[0] if got else None
        self._basin_best = float("inf")
        self._since = 0
        self._restart_due = False
        return r

    def _choose_arm(self) -> str:
        draws = [self._np_rng.beta(1.0 + self._wins[a], 1.0 + self._losses[a]) for a in self.arms]
        return self.arms[int(np.argmax(draws))]

    def _propose(self, n: int) -> list:
        ok = sum(y is not None for y in self._told_y)
        if len(self.seen) < self.n_init or ok < 2 or self.current is None:
            if len(self.seen) < self.n_init or not self.pending:
                k = max(1, min(n, self.n_init - len(self.seen))) if len(self.seen) < self.n_init else 1
                return self._unseen_random(k)
            return []  # the first results are on their way: the base class proposes at random if it must
        if self._needs_fit():
            self._fit()
            self._refresh()
        out: list[Config] = []
        for _ in range(n):
            if self._restart_due:
                r = self._restart_pick()
                if r is not None:
                    self._unseen[r] = False
                    self._jumped.add(r)
                    self._cur_val = float("inf")
                    out.append(self.index.pool[r])
                    continue
            arm = self._choose_arm()
            r = {"walk": self._walk_pick, "ranked": self._ranked_pick, "global": self._global_pick,
                 "exploit": self._exploit_pick}[arm]()
            jump = False
            if r is None and arm not in ("global", "exploit") and self.pending and out:
                break  # the neighbourhood is spent but results are pending: wait for them
            if r is None:  # a local optimum (or no model yet): jump
                self._jumps += 1
                arm = "jump"
                pickers = {"global": self._global_pick, "kick": self._kick_pick, "random": self._random_pick}
                k = (self._jumps - 1) % len(self.jumps)
                order = self.jumps[k:] + self.jumps[:k]
                for f in [pickers[j] for j in order] + [self._random_pick]:
                    r = f()
                    if r is not None:
                        break
                jump = True
            if r is None:
                break
            self._unseen[r] = False
            if jump:
                self._jumped.add(r)
            elif arm in self.arm_picks:
                self._arm_of[r] = arm
                self.arm_picks[arm] += 1
            out.append(self.index.pool[r])
        return out


class AutoStrategy(Strategy):
    """Picks a strategy by the space (see the module docstring) and delegates every call to it.

    Args:
        small: spaces with at most this many valid configs are searched at random.
        **opts: passed to the chosen strategy.
    """

    name = "auto"

    def __init__(self, space: Space, arch: str | None = None, seed: int = 0, *, small: int = 24,
                 **opts: Any) -> None:
        super().__init__(space, arch, seed)
        n = len(self.pool)
        if n <= small:
            chosen = "random"
        else:
            try:
                from tiletune.space.strategies.model import require_sklearn

                require_sklearn()
                chosen = "hybrid"
            except Exception:  # noqa: BLE001 - no scikit-learn: the model-free search
                chosen = "local"
        self.chosen = chosen
        self.inner: Strategy = make_strategy(chosen, space, arch, seed, **opts)
        # share the inner strategy's bookkeeping: ask/tell of this object act on it
        self.lazy = self.inner.lazy
        self.pool = self.inner.pool
        self.valid = self.inner.valid
        self.seen = self.inner.seen
        self.pending = self.inner.pending
        self.results = self.inner.results
        self.history = self.inner.history

    def ask(self, n: int = 1) -> list[Config]:
        return self.inner.ask(n)

    def tell(self, results: Sequence[Result]) -> None:
        self.inner.tell(results)

    def best(self) -> tuple[Config, float] | None:
        return self.inner.best()

    def _propose(self, n: int) -> list[Config]:  # pragma: no cover - ask is delegated
        return self.inner._propose(n)
