"""A surrogate search built for small evaluation budgets (issue 16): ``"surrogate"``.

The model is a random forest (scikit-learn) over :class:`~._index.PoolIndex` features (log2 of positive
numeric parameters, the value's index for others: booleans, strings, ``None``), trained on log(time).
What it does differently from ``"model"``:

* **Failures are information, not noise.** A failed config (compile error, launch error, mismatch) is
  kept apart: the regressor learns from successful configs only, and a second forest (a classifier,
  once both outcomes were seen) gives each candidate's probability of failing, which multiplies its
  expected improvement. A space whose failures cluster (shared memory overflows at large tiles) is
  steered away from them without dragging the time model towards an invented "worst" value.
* **One config at a time, refitted on a schedule.** Each ask proposes the best candidates under the
  current model; the forest is refitted once the data grew by ``refit`` (10%) since the last fit, so
  a 500-evaluation run fits ~40 times.
* **Local and global candidates.** Candidates are every unseen config of the pool (sampled down to
  ``max_candidates`` when larger) plus every unseen Hamming neighbour (one parameter changed, any value)
  of the best ``top_k`` configs measured: the forest often ranks a neighbour of the incumbent highest,
  which makes the search behave like a model-guided local search once it is near an optimum.
* **Acquisition.** Expected improvement over the best time (log scale) with the forest's spread as the
  uncertainty, times the probability of success; every ``explore_every``-th pick takes the lowest
  predicted mean instead (pure exploitation), which finishes a basin quickly.

The first ``n_init`` configs are a Latin hypercube over the parameters' values, each snapped to the
nearest valid config (:meth:`~._index.PoolIndex.design`; baseline first when the space has one). Deterministic for a
seed; never a config twice (the base class enforces it); when scikit-learn is missing, a
TiletuneError says how to install it.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from tiletune.space.spaces import Space
from tiletune.space.strategies.base import Result, Strategy
from tiletune.space.strategies._index import RowArray, index_for
from tiletune.space.strategies.model import require_sklearn

__all__ = ["SurrogateStrategy"]


def _cdf_pdf(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from scipy.special import ndtr

    return ndtr(z), np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def _fast() -> Any:
    """sklearn without its per-call input and parameter validation (the inputs are ours, finite)."""
    import sklearn

    try:
        return sklearn.config_context(assume_finite=True, skip_parameter_validation=True)
    except TypeError:  # pragma: no cover - scikit-learn < 1.3
        return sklearn.config_context(assume_finite=True)


class _Forest:
    """A bagged ensemble of scikit-learn trees, fitted and queried without sklearn's per-call overhead.

    ``RandomForestRegressor`` spends more time cloning and validating than building 200-sample trees;
    this builds each tree on a bootstrap sample with ``check_input=False`` and predicts with the trees'
    low-level ``tree_.predict``. ``kind``: ``"regressor"`` (predicts a mean and a spread) or
    ``"classifier"`` (predicts the probability of class 1).
    """

    def __init__(self, n_trees: int, seed: int, kind: str = "regressor", extra: bool = True) -> None:
        from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor, ExtraTreeClassifier, ExtraTreeRegressor

        if kind == "regressor":
            self._cls = ExtraTreeRegressor if extra else DecisionTreeRegressor
        else:
            self._cls = ExtraTreeClassifier if extra else DecisionTreeClassifier
        self.kind = kind
        self.n_trees = n_trees
        self.rng = np.random.default_rng(seed)
        self.trees: list[Any] = []

    def fit(self, X: np.ndarray, y: np.ndarray) -> "_Forest":
        X32 = np.ascontiguousarray(X, dtype=np.float32)
        n = len(y)
        self.trees = []
        with _fast():
            for _ in range(self.n_trees):
                idx = self.rng.integers(0, n, n)
                if self.kind == "classifier" and len(np.unique(y[idx])) < 2:
                    idx = np.arange(n)
                t = self._cls(max_features=1.0, min_samples_leaf=1,
                              random_state=int(self.rng.integers(0, 2**31 - 1)))
                t.fit(X32[idx], y[idx], check_input=False)
                self.trees.append(t)
        return self

    def predict_all(self, X: np.ndarray) -> np.ndarray:
        """Per-tree predictions, (trees, rows): the mean for a regressor, P(class 1) for a classifier."""
        X32 = np.ascontiguousarray(X, dtype=np.float32)
        out = np.empty((len(self.trees), len(X32)))
        for i, t in enumerate(self.trees):
            p = t.tree_.predict(X32)
            if self.kind == "regressor":
                out[i] = p.reshape(len(X32), -1)[:, 0]
            else:
                p = p.reshape(len(X32), -1)
                classes = list(t.classes_)
                if 1 in classes:
                    tot = p.sum(axis=1)
                    out[i] = p[:, classes.index(1)] / np.where(tot > 0, tot, 1.0)
                else:
                    out[i] = 0.0
        return out


def _forests() -> tuple[Any, Any]:
    require_sklearn()
    return _Forest, _Forest


class SurrogateStrategy(Strategy):
    """Random-forest surrogate with failure classifier and local candidates (see the module docstring).

    Args:
        n_init: random configs before the first fit (baseline included).
        n_trees: trees per forest.
        refit: refit once the told results grew by this fraction since the last fit.
        top_k: incumbents whose Hamming neighbours are always candidates.
        max_candidates: random unseen configs scored per fit, on top of the neighbours.
        xi: expected-improvement margin (log-time units).
        explore_every: every this many picks, take the lowest predicted mean (0: never).
        min_samples_leaf: leaf size of the regressor.
        extra: extremely randomized trees (True) or CART trees (False) in the bagged forests.
        design: the first ``n_init`` configs: ``"lhs"`` (a Latin hypercube over the parameters'
            values, snapped to valid configs) or ``"uniform"`` (uniform over the valid configs).
    """

    name = "surrogate"

    def __init__(
        self,
        space: Space,
        arch: str | None = None,
        seed: int = 0,
        *,
        n_init: int = 10,
        n_trees: int = 16,
        refit: float = 0.15,
        top_k: int = 3,
        max_candidates: int = 2048,
        xi: float = 0.0,
        explore_every: int = 3,
        min_samples_leaf: int = 1,
        extra: bool = True,
        design: str = "lhs",
    ) -> None:
        self._Reg, self._Clf = _forests()
        super().__init__(space, arch, seed)
        if n_init < 1:
            raise ValueError(f"n_init must be >= 1, got {n_init!r}")
        if n_trees < 1:
            raise ValueError(f"n_trees must be >= 1, got {n_trees!r}")
        if refit < 0:
            raise ValueError(f"refit must be >= 0, got {refit!r}")
        self.n_init = n_init
        self.n_trees = n_trees
        self.refit = refit
        self.top_k = top_k
        self.max_candidates = max_candidates
        self.xi = xi
        self.explore_every = explore_every
        self.min_samples_leaf = min_samples_leaf
        self.extra = extra
        if design not in ("lhs", "uniform"):
            raise ValueError(f"design must be 'lhs' or 'uniform', got {design!r}")
        self.design = design
        self.index = index_for(space, arch, self.pool, self.lazy)
        self._np_rng = np.random.default_rng(seed)
        # per-row state over the index's rows (a lazy space's index grows as configs are touched)
        self._rows_unseen = RowArray(self.index, True, bool)
        self._rows_mu = RowArray(self.index, np.nan, np.float64)
        self._rows_sd = RowArray(self.index, 0.0, np.float64)
        self._rows_pf = RowArray(self.index, 0.0, np.float64)
        self._told_rows: list[int] = []
        self._told_y: list[float | None] = []
        self._fit_at = -1
        self._reg: Any = None
        self._clf: Any = None
        self._p_fail_const = 0.0
        self._picks = 0
        self.fits = 0

    # ------------------------------------------------------------------ per-row state
    @property
    def _unseen(self) -> np.ndarray:
        """Rows never proposed (nor taken for the batch being built)."""
        return self._rows_unseen.view()

    @property
    def _mu(self) -> np.ndarray:
        """Predicted mean log-time of the rows scored since the last fit (NaN: not scored)."""
        return self._rows_mu.view()

    @property
    def _sd(self) -> np.ndarray:
        return self._rows_sd.view()

    @property
    def _pf(self) -> np.ndarray:
        return self._rows_pf.view()

    # ------------------------------------------------------------------ bookkeeping
    def _mark(self, cfg: Any) -> None:
        super()._mark(cfg)
        r = self.index.rowof(cfg)
        if r is not None:
            self._unseen[r] = False

    def _learn(self, results: Sequence[Result]) -> None:
        for cfg, v in results:
            r = self.index.rowof(cfg)
            if r is not None:
                self._told_rows.append(r)
                self._told_y.append(None if v is None else math.log(v))

    # ------------------------------------------------------------------ model
    def _fit(self) -> None:
        rows = np.asarray(self._told_rows)
        ok = np.asarray([y is not None for y in self._told_y])
        y = np.asarray([y for y in self._told_y if y is not None], dtype=np.float64)
        seed = (self.seed * 1_000_003 + self.fits) % (2**31)
        self._reg = _Forest(self.n_trees, seed, "regressor", extra=self.extra)
        self._reg.fit(self.index.X[rows[ok]], y)
        self._clf = None
        self._p_fail_const = 0.0
        if ok.all():
            pass
        elif (~ok).sum() >= 2 and ok.sum() >= 2:
            self._clf = _Forest(max(8, self.n_trees // 2), seed + 1, "classifier", extra=self.extra)
            self._clf.fit(self.index.X[rows], (~ok).astype(np.int64))
        else:
            self._p_fail_const = float((~ok).mean())
        self._fit_at = len(self._told_rows)
        self.fits += 1

    def _needs_fit(self) -> bool:
        n = len(self._told_rows)
        if self._reg is None:
            return True
        return n - self._fit_at >= max(1, int(self.refit * self._fit_at))

    def _predict(self, rows: np.ndarray) -> None:
        """Predict mean, spread and failure probability of ``rows`` with the current forests (cached)."""
        if rows.size == 0:
            return
        Xc = self.index.X[rows]
        per_tree = self._reg.predict_all(Xc)
        self._mu[rows] = per_tree.mean(axis=0)
        self._sd[rows] = per_tree.std(axis=0)
        if self._clf is not None:
            self._pf[rows] = self._clf.predict_all(Xc).mean(axis=0)
        else:
            self._pf[rows] = self._p_fail_const

    def _refresh(self) -> None:
        """After a fit: predict every unseen config (a sample of ``max_candidates`` in a larger pool; on a
        lazy space, ``max_candidates`` unseen configs drawn at random)."""
        self._rows_mu.reset()
        self._rows_sd.reset()
        self._rows_pf.reset()
        if self.lazy is not None:
            unseen = np.asarray(self.index.sample(self.max_candidates, self._unseen, self._np_rng), dtype=np.int64)
        else:
            unseen = np.flatnonzero(self._unseen)
            if unseen.size > self.max_candidates:
                unseen = self._np_rng.choice(unseen, self.max_candidates, replace=False)
        self._predict(unseen)

    def _add_local(self) -> None:
        """Unseen Hamming neighbours of the best ``top_k`` configs are always candidates."""
        told = sorted((y, i, r) for i, (r, y) in enumerate(zip(self._told_rows, self._told_y)) if y is not None)
        local = {rr for _, _, r in told[: self.top_k] for rr in self.index.hamming(r) if self._unseen[rr]}
        new = np.asarray(sorted(r for r in local if np.isnan(self._mu[r])), dtype=np.int64)
        self._predict(new)

    def _acquire(self, cand: np.ndarray, exploit: bool) -> np.ndarray:
        mu, sigma, p_fail = self._mu[cand], self._sd[cand], self._pf[cand]
        if exploit:
            return -mu - 10.0 * p_fail  # mu is in log units: a likely failure sinks far down
        best = min(y for y in self._told_y if y is not None)
        imp = best - mu - self.xi
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.where(sigma > 0, imp / np.where(sigma > 0, sigma, 1.0), 0.0)
        cdf, pdf = _cdf_pdf(z)
        ei = np.where(sigma > 0, imp * cdf + sigma * pdf, np.maximum(imp, 0.0))
        return ei * (1.0 - p_fail) - 1e-9 * mu  # ties (no improvement expected) go to the lower mean

    # ------------------------------------------------------------------ strategy
    def _propose(self, n: int) -> list:
        ok = sum(y is not None for y in self._told_y)
        if len(self.seen) < self.n_init or ok < 2:
            k = max(1, min(n, self.n_init - len(self.seen))) if len(self.seen) < self.n_init else n
            return self._unseen_random(k)
        if self._needs_fit():
            self._fit()
            self._refresh()
        self._add_local()
        out = []
        for _ in range(n):
            cand = np.flatnonzero(self._unseen & ~np.isnan(self._mu))
            if cand.size == 0:
                if not out:
                    out = self._unseen_random(n)
                break
            self._picks += 1
            exploit = self.explore_every > 0 and self._picks % self.explore_every == 0
            r = int(cand[int(np.argmax(self._acquire(cand, exploit)))])
            self._unseen[r] = False  # taken for this batch (the base class marks it as seen)
            out.append(self.index.pool[r])
        return out

    def _unseen_random(self, n: int) -> list:
        """``n`` unseen configs: spread over the parameters' values (:meth:`PoolIndex.design`) with
        ``design="lhs"``, uniformly over the configs with ``design="uniform"``."""
        if self.design == "lhs":
            return [self.index.pool[r] for r in self.index.design(n, self._unseen, self._np_rng)]
        return [self.index.pool[r] for r in self.index.sample(n, self._unseen, self._np_rng)]
