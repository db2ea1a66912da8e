"""A model-based strategy: a tree-ensemble surrogate (scikit-learn) trained during the search.

Every configuration is a feature vector (``space.encode``: log2 of numeric parameters, the value's
index otherwise). The search starts with a small initial design (the baseline, then configs at
random; or greedy maximin picks over the scaled features with ``design="maximin"``). After that,
each batch refits an ``ExtraTreesRegressor`` on log(median) of everything measured so far (failed
configs are imputed with the worst measured value, so the model steers away from them) and scores
every configuration not yet proposed. The spread of the trees' predictions is the model's uncertainty. A batch of ``n``:

* the first ``ceil(n * exploit)`` are the lowest predicted times (exploitation, most promising
  first: the order in which they are proposed matters to a tight budget);
* the rest maximise expected improvement over the best measured time (exploration).

The candidate sets are a few hundred to a few thousand configs, so a refit plus a full scan costs
tens of milliseconds. On a lazy space (:mod:`tiletune.space.lazy`: too big to enumerate) the candidates
of a batch are ``max_candidates`` unseen configs drawn at random plus the unseen neighbours (one
parameter one step) of the three fastest configs measured, encoded as they are drawn. scikit-learn is an optional dependency (``pip install 'tiletune[search]'``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tiletune.errors import TiletuneError
from tiletune.space.spaces import Config, Space
from tiletune.space.strategies.base import Strategy

__all__ = ["ModelStrategy"]


def require_sklearn() -> Any:
    try:
        from sklearn.ensemble import ExtraTreesRegressor
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise TiletuneError(
            "the model-based strategy ('model') needs scikit-learn: pip install 'tiletune[search]' "
            f"(or pip install scikit-learn) ({exc})"
        ) from exc
    return ExtraTreesRegressor


def _normal_cdf_pdf(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    erf = np.vectorize(math.erf, otypes=[float])
    cdf = 0.5 * (1.0 + erf(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return cdf, pdf


class ModelStrategy(Strategy):
    """Surrogate-model search with an extra-trees ensemble (see the module docstring).

    Args:
        n_init: size of the initial design, baseline included (the first batch is no larger).
        n_trees: trees in the ensemble.
        exploit: fraction of each batch chosen by lowest predicted time (the rest by expected
            improvement).
        xi: expected-improvement margin, in log-time units.
        min_samples_leaf: leaf size of the trees.
        design: the initial design, ``"random"`` (seeded, uniform) or ``"maximin"`` (space-filling
            over the scaled features). On the synthetic test spaces random was as good or better:
            maximin favours the corners of the space, where tile sizes are extreme and slow.
        max_candidates: on a lazy space, the random unseen configs scored per batch.
    """

    name = "model"

    def __init__(
        self,
        space: Space,
        arch: str | None = None,
        seed: int = 0,
        *,
        n_init: int = 10,
        n_trees: int = 48,
        exploit: float = 0.75,
        xi: float = 0.01,
        min_samples_leaf: int = 1,
        design: str = "random",
        max_candidates: int = 4096,
    ) -> None:
        self._Regressor = require_sklearn()
        super().__init__(space, arch, seed)
        if n_init < 1:
            raise ValueError(f"n_init must be >= 1, got {n_init!r}")
        if not 0.0 <= exploit <= 1.0:
            raise ValueError(f"exploit must be in [0, 1], got {exploit!r}")
        self.n_init = n_init
        self.n_trees = n_trees
        self.exploit = exploit
        self.xi = xi
        self.min_samples_leaf = min_samples_leaf
        if design not in ("maximin", "random"):
            raise ValueError(f"design must be 'maximin' or 'random', got {design!r}")
        self.design = design
        if max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1, got {max_candidates!r}")
        self.max_candidates = max_candidates
        self.fits = 0
        if self.lazy is not None:  # configs are encoded as they are drawn: nothing is listed
            return
        self.X = np.asarray([space.encode(c, arch) for c in self.pool], dtype=np.float64)
        span = self.X.max(axis=0) - self.X.min(axis=0)
        self._Xs = (self.X - self.X.min(axis=0)) / np.where(span > 0, span, 1.0)  # scaled to [0, 1]
        self._row = {c: i for i, c in enumerate(self.pool)}

    # ------------------------------------------------------------------ initial design
    def _design(self, n: int) -> list[Config]:
        """Initial picks: at random, or greedy maximin (each new point far from all proposed so far)."""
        if self.design == "random":
            return self._unseen_random(n)
        if self.lazy is not None:
            return self._lazy_maximin(n)
        chosen = [self._row[c] for c in self.seen]
        unseen = [i for i, c in enumerate(self.pool) if c not in self.seen]
        out: list[Config] = []
        for _ in range(min(n, len(unseen))):
            cands = unseen if len(unseen) <= 256 else self.rng.sample(unseen, 256)
            if not chosen:
                pick = self.rng.choice(cands)
            else:
                d = np.min(
                    np.linalg.norm(self._Xs[cands][:, None, :] - self._Xs[chosen][None, :, :], axis=2), axis=1
                )
                pick = cands[int(np.argmax(d))]
            chosen.append(pick)
            unseen.remove(pick)
            out.append(self.pool[pick])
        return out

    def _lazy_encode(self, configs: list[Config]) -> np.ndarray:
        """Encoded configs of a lazy space, each column scaled by its parameter's range of values."""
        assert self.lazy is not None
        lv = self.lazy
        if not hasattr(self, "_enc_lo"):
            cols = []
            for vs in lv.values:
                numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in vs)
                cols.append([math.log2(x) if numeric else float(i) for i, x in enumerate(vs)])  # type: ignore[arg-type]
            lo = np.asarray([min(c) for c in cols])
            hi = np.asarray([max(c) for c in cols])
            self._enc_lo, self._enc_span = lo, np.where(hi > lo, hi - lo, 1.0)
        X = np.asarray([lv.encode(c) for c in configs], dtype=np.float64).reshape(len(configs), len(lv.sizes))
        return (X - self._enc_lo) / self._enc_span

    def _lazy_maximin(self, n: int) -> list[Config]:
        """Greedy maximin over 256 random unseen configs per pick (a lazy space)."""
        chosen = self._lazy_encode(list(self.seen)) if self.seen else np.empty((0, len(self.space.names)))
        out: list[Config] = []
        for _ in range(n):
            cands = self.lazy.sample(self.rng, 256, exclude=self.seen | set(out))  # type: ignore[union-attr]
            if not cands:
                break
            Xc = self._lazy_encode(cands)
            if not len(chosen):
                pick = self.rng.randrange(len(cands))
            else:
                d = np.min(np.linalg.norm(Xc[:, None, :] - chosen[None, :, :], axis=2), axis=1)
                pick = int(np.argmax(d))
            chosen = np.vstack([chosen, Xc[pick:pick + 1]])
            out.append(cands[pick])
        return out

    def _lazy_candidates(self, told: list[tuple[Config, float | None]]) -> list[Config]:
        """A lazy space's candidates: the unseen neighbours of the three fastest configs, then random ones."""
        assert self.lazy is not None
        best = sorted(((v, i) for i, (_, v) in enumerate(told) if v is not None))[:3]
        out: list[Config] = []
        taken: set[Config] = set()
        for _, i in best:
            for c in self.lazy.neighbours(told[i][0]):
                if c not in self.seen and c not in taken:
                    out.append(c)
                    taken.add(c)
        for c in self.lazy.sample(self.rng, self.max_candidates, exclude=self.seen | taken):
            out.append(c)
        return out

    # ------------------------------------------------------------------ strategy
    def _propose(self, n: int) -> list[Config]:
        told = [(c, v) for c, v in self.results.items()]
        ok = [v for _, v in told if v is not None]
        if len(self.seen) < self.n_init or len(ok) < 2:
            k = min(n, max(self.n_init - len(self.seen), 0)) or n
            return self._design(k)
        worst = math.log(max(ok))
        y = np.asarray([math.log(v) if v is not None else worst for _, v in told])
        if self.lazy is not None:
            cands = self._lazy_candidates(told)
            if not cands:
                return []
            Xtrain = self._lazy_encode([c for c, _ in told])
            Xcand = self._lazy_encode(cands)
        else:
            rows = np.asarray([self._row[c] for c, _ in told])
            unseen = np.asarray([i for i, c in enumerate(self.pool) if c not in self.seen])
            if unseen.size == 0:
                return []
            Xtrain, Xcand = self.X[rows], self.X[unseen]
            cands = [self.pool[int(i)] for i in unseen]
        picks = self._pick(Xtrain, y, [v is not None for _, v in told], Xcand, n)
        return [cands[i] for i in picks]

    def _pick(self, Xtrain: np.ndarray, y: np.ndarray, ok: list[bool], Xcand: np.ndarray, n: int) -> list[int]:
        """Fit the ensemble on ``(Xtrain, y)``; the indices (into ``Xcand``) of the batch's picks."""
        unseen = np.arange(len(Xcand))
        model = self._Regressor(
            n_estimators=self.n_trees,
            min_samples_leaf=self.min_samples_leaf,
            max_features=1.0,
            random_state=self.seed * 1_000_003 + self.fits,
            n_jobs=1,
        )
        model.fit(Xtrain, y)
        per_tree = np.stack([t.predict(Xcand) for t in model.estimators_])
        mu = per_tree.mean(axis=0)
        sigma = per_tree.std(axis=0)
        self.fits += 1
        n = min(n, unseen.size)
        n_exploit = min(n, math.ceil(n * self.exploit))
        tie = np.asarray(self.rng.sample(range(unseen.size), unseen.size))  # seeded random tie-break
        order = np.lexsort((tie, mu))  # lowest predicted time first (trees predict many ties)
        picks = [int(i) for i in order[:n_exploit]]
        if len(picks) < n:
            best = float(np.min(y[ok]))
            imp = best - mu - self.xi
            with np.errstate(divide="ignore", invalid="ignore"):
                z = np.where(sigma > 0, imp / np.where(sigma > 0, sigma, 1.0), 0.0)
            cdf, pdf = _normal_cdf_pdf(z)
            ei = np.where(sigma > 0, imp * cdf + sigma * pdf, np.maximum(imp, 0.0))
            taken = set(picks)
            for i in np.lexsort((tie, -ei)):
                if len(picks) >= n:
                    break
                if int(i) not in taken:
                    picks.append(int(i))
                    taken.add(int(i))
        return picks
