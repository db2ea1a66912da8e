"""An index of a strategy's pool shared by the issue-16 strategies (``local``, ``surrogate``, ``portfolio``).

:class:`PoolIndex` maps every valid configuration of ``space.candidates(arch)`` to a row: the index of
each parameter's value (``V``), the features a model trains on (``X``: log2 of a positive numeric
parameter, else the value's index; scaled to [0, 1]) and a lookup from value indices back to the row.
It answers neighbourhood queries in microseconds:

* ``adjacent(row)``: the valid configs one parameter away by one step in that parameter's value list;
* ``hamming(row)``: the valid configs one parameter away, any value;
* ``design(n, allowed, rng)``: ``n`` configs spread over every parameter's values (a Latin hypercube
  over value indices, snapped to the nearest allowed config): the initial design and random restarts.

Features: one column per parameter (log2 of a positive numeric parameter, else the value's index), plus,
for an integer parameter whose values are not all powers of two, the exponent of the largest power of
two dividing the value (alignment: 128 and 96 are neighbours in value, rarely in speed on a GPU).

The index is built once per (space, arch) and shared by every strategy on it (a space is immutable),
so 100 seeded runs on one space pay for it once.

A space too big to enumerate (:mod:`tiletune.space.lazy`) gets a :class:`LazyIndex` instead, one per
strategy: the same interface, but its rows are only the configs the strategy touched (drawn, or
reached as neighbours), registered as they come; ``sample(n, allowed, rng)`` draws new ones. Per-row
state of a strategy lives in :class:`RowArray` buffers that grow with the index.
"""

from __future__ import annotations

import math
import weakref
from typing import Sequence

import numpy as np

from tiletune.space.lazy import LazySpace
from tiletune.space.spaces import Config, Space

__all__ = ["LazyIndex", "PoolIndex", "RowArray", "index_for", "pool_index"]


def _vkey(v: object) -> tuple[bool, object]:
    return (type(v) is bool, v)


class PoolIndex:
    """Rows, value indices, features and neighbourhoods of the valid configs (see the module docstring)."""

    def __init__(self, pool: Sequence[Config], space: Space, arch: str | None) -> None:
        self.pool = list(pool)
        self.names = space.names
        self.values = [tuple(space.values(n, arch)) for n in self.names]
        lookups = [{_vkey(v): i for i, v in enumerate(vs)} for vs in self.values]
        d = len(self.names)
        n = len(self.pool)
        V = np.empty((n, d), dtype=np.int32)
        for r, cfg in enumerate(self.pool):
            for j, v in enumerate(cfg.values()):
                V[r, j] = lookups[j][_vkey(v)]
        self.V = V
        self.sizes = np.asarray([len(vs) for vs in self.values], dtype=np.int64)
        # a row's code: mixed-radix number of its value indices
        self._radix = np.concatenate([[1], np.cumprod(self.sizes[::-1])[:-1]])[::-1].astype(np.int64)
        codes = V.astype(np.int64) @ self._radix
        self._row_of_code = dict(zip(codes.tolist(), range(n)))
        self.row_of = {cfg: r for r, cfg in enumerate(self.pool)}
        # features: log2 of positive numbers, else the index; scaled to [0, 1] per column
        X = np.empty((n, d), dtype=np.float64)
        for j, vs in enumerate(self.values):
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in vs)
            col = np.asarray([math.log2(v) if numeric else float(i) for i, v in enumerate(vs)])  # type: ignore[arg-type]
            X[:, j] = col[V[:, j]]
        # alignment: the power of two dividing an integer parameter (warp and vector multiples matter on
        # GPUs: 128 and 96 are neighbours in value, not in speed); only where it adds information
        extra = []
        for j, vs in enumerate(self.values):
            ints = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in vs)
            if ints and len(vs) > 2:
                tz = [min((v & -v).bit_length() - 1, 10) for v in vs]  # type: ignore[operator]
                logs = [math.log2(v) for v in vs]  # type: ignore[arg-type]
                if any(abs(t - lg) > 1e-9 for t, lg in zip(tz, logs)):
                    extra.append(np.asarray(tz, dtype=np.float64)[V[:, j]])
        if extra:
            X = np.column_stack([X] + extra)
        lo, hi = X.min(axis=0), X.max(axis=0)
        span = np.where(hi > lo, hi - lo, 1.0)
        self.X = (X - lo) / span
        self.active = np.flatnonzero(self.sizes > 1)  # parameters with a choice
        self._adj: dict[int, list[int]] = {}
        self._ham: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.pool)

    def rowof(self, cfg: Config) -> int | None:
        """The row of a valid config (None for anything else)."""
        return self.row_of.get(cfg)

    def sample(self, n: int, allowed: np.ndarray, rng: np.random.Generator) -> list[int]:
        """Up to ``n`` distinct allowed rows, uniformly at random."""
        rows = np.flatnonzero(allowed)
        if rows.size == 0:
            return []
        return [int(r) for r in rng.choice(rows, min(n, rows.size), replace=False)]

    @property
    def U(self) -> np.ndarray:
        """Value indices scaled to [0, 1] per parameter (the space of :meth:`design`)."""
        u = getattr(self, "_U", None)
        if u is None:
            u = self._U = self.V / np.maximum(self.sizes - 1, 1)
        return u

    def nearest(self, target: np.ndarray, allowed: np.ndarray, rng: np.random.Generator) -> int | None:
        """The allowed row closest (L1 over :attr:`U`) to ``target``, ties broken at random."""
        if not allowed.any():
            return None
        d = np.abs(self.U - target).sum(axis=1)
        d = np.where(allowed, d + 1e-9 * rng.random(len(d)), np.inf)
        return int(np.argmin(d))

    def design(self, n: int, allowed: np.ndarray, rng: np.random.Generator) -> list[int]:
        """``n`` rows spread over every parameter's values: a Latin hypercube over the value indices
        (each parameter's values drawn evenly, not each config), each point snapped to the nearest
        allowed config.

        On GPU spaces, constraints remove far more configs at some values than at others (a block of
        32 x 1024 threads has few valid companions); drawing configs uniformly then under-samples
        those values, which is where the fast configs often are. With ``n == 1`` this is a random
        draw of each parameter's value, snapped: the random restart of the searches here.
        """
        allowed = allowed.copy()
        d = len(self.sizes)
        strata = np.empty((n, d))
        for j in range(d):
            strata[:, j] = (rng.permutation(n) + rng.random(n)) / n  # one point per stratum, per axis
        out: list[int] = []
        for i in range(n):
            target = np.floor(strata[i] * self.sizes) / np.maximum(self.sizes - 1, 1)
            r = self.nearest(target, allowed, rng)
            if r is None:
                break
            allowed[r] = False
            out.append(r)
        return out

    def row(self, idx: Sequence[int]) -> int | None:
        """The row of a value-index vector, or None if that combination is not a valid config."""
        code = int(np.dot(np.asarray(idx, dtype=np.int64), self._radix))
        return self._row_of_code.get(code)

    def adjacent(self, r: int) -> list[int]:
        """Rows one step away in one parameter's value list (valid ones only)."""
        out = self._adj.get(r)
        if out is None:
            out = []
            base = int(np.dot(self.V[r].astype(np.int64), self._radix))
            for j in self.active:
                vj = int(self.V[r, j])
                for k in (vj - 1, vj + 1):
                    if 0 <= k < self.sizes[j]:
                        rr = self._row_of_code.get(base + (k - vj) * int(self._radix[j]))
                        if rr is not None:
                            out.append(rr)
            self._adj[r] = out
        return out

    def hamming(self, r: int) -> list[int]:
        """Rows that differ in exactly one parameter, any value (valid ones only)."""
        out = self._ham.get(r)
        if out is None:
            out = []
            base = int(np.dot(self.V[r].astype(np.int64), self._radix))
            for j in self.active:
                vj = int(self.V[r, j])
                step = int(self._radix[j])
                for k in range(int(self.sizes[j])):
                    if k != vj:
                        rr = self._row_of_code.get(base + (k - vj) * step)
                        if rr is not None:
                            out.append(rr)
            self._ham[r] = out
        return out


_CACHE: "weakref.WeakKeyDictionary[Space, dict[object, PoolIndex]]" = weakref.WeakKeyDictionary()


def pool_index(space: Space, arch: str | None, pool: Sequence[Config]) -> PoolIndex:
    """The shared :class:`PoolIndex` of ``space`` on ``arch`` (built on first use)."""
    try:
        per = _CACHE.setdefault(space, {})
    except TypeError:  # not weak-referenceable: no sharing
        return PoolIndex(pool, space, arch)
    key = (arch, len(pool), pool[0] if pool else None)
    idx = per.get(key)
    if idx is None or idx.pool != list(pool):
        idx = PoolIndex(pool, space, arch)
        per[key] = idx
    return idx


def _feature_tables(values: Sequence[tuple[object, ...]]) -> list[np.ndarray]:
    """Per feature column, its value for each value index of its parameter (as :class:`PoolIndex`
    computes them: log2 or index per parameter, then the alignment columns), unscaled."""
    cols: list[np.ndarray] = []
    for vs in values:
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in vs)
        col = [math.log2(v) if numeric else float(i) for i, v in enumerate(vs)]  # type: ignore[arg-type]
        cols.append(np.asarray(col))
    return cols


class LazyIndex:
    """The :class:`PoolIndex` interface over a lazy space: rows are the configs touched so far.

    ``pool``, ``row_of``, ``V`` and ``X`` cover the registered rows only; :meth:`rowof` registers a valid
    config, :meth:`row` a valid value-index vector, :meth:`adjacent` and :meth:`hamming` the valid
    neighbours they find, :meth:`design` and :meth:`sample` the configs they draw. Features are scaled by
    each parameter's range of values (the pool's range is unknown); the alignment columns of
    :class:`PoolIndex` are kept. Deterministic for the generator it is given.
    """

    def __init__(self, view: LazySpace) -> None:
        self.view = view
        self.names = view.names
        self.values = list(view.values)
        self.sizes = np.asarray(view.sizes, dtype=np.int64)
        self.active = np.flatnonzero(self.sizes > 1)
        self.pool: list[Config] = []
        self.row_of: dict[Config, int] = {}
        self._idx: list[tuple[int, ...]] = []
        cols = _feature_tables(self.values)
        tables: list[tuple[int, np.ndarray]] = [(j, c) for j, c in enumerate(cols)]
        for j, vs in enumerate(self.values):  # alignment columns, as PoolIndex adds them
            ints = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in vs)
            if ints and len(vs) > 2:
                tz = [min((v & -v).bit_length() - 1, 10) for v in vs]  # type: ignore[operator]
                logs = [math.log2(v) for v in vs]  # type: ignore[arg-type]
                if any(abs(t - lg) > 1e-9 for t, lg in zip(tz, logs)):
                    tables.append((j, np.asarray(tz, dtype=np.float64)))
        self._tables = []
        for j, t in tables:
            lo, hi = float(t.min()), float(t.max())
            self._tables.append((j, (t - lo) / (hi - lo if hi > lo else 1.0)))
        d = len(self.names)
        self._V = np.empty((64, d), dtype=np.int32)
        self._X = np.empty((64, len(self._tables)), dtype=np.float64)
        self._adj: dict[int, list[int]] = {}
        self._ham: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.pool)

    @property
    def V(self) -> np.ndarray:
        """Value indices of the registered rows."""
        return self._V[: len(self.pool)]

    @property
    def X(self) -> np.ndarray:
        """Scaled features of the registered rows."""
        return self._X[: len(self.pool)]

    def _register(self, idx: tuple[int, ...], cfg: Config) -> int:
        r = self.row_of.get(cfg)
        if r is not None:
            return r
        r = len(self.pool)
        if r >= len(self._V):
            self._V = np.concatenate([self._V, np.empty_like(self._V)])
            self._X = np.concatenate([self._X, np.empty_like(self._X)])
        self._V[r] = idx
        for c, (j, t) in enumerate(self._tables):
            self._X[r, c] = t[idx[j]]
        self.pool.append(cfg)
        self._idx.append(idx)
        self.row_of[cfg] = r
        return r

    def rowof(self, cfg: Config) -> int | None:
        """The row of ``cfg`` (registered now if it is a valid config of the space), else None."""
        r = self.row_of.get(cfg)
        if r is not None:
            return r
        idx = self.view.index_of(cfg)
        if idx is None or self.view.check(idx) is None:
            return None
        return self._register(idx, cfg)

    def row(self, idx: Sequence[int]) -> int | None:
        """The row of a value-index vector (registered now), or None if it is not a valid config."""
        key = tuple(int(i) for i in idx)
        cfg = self.view.check(key)
        return None if cfg is None else self._register(key, cfg)

    def adjacent(self, r: int) -> list[int]:
        """Rows one step away in one parameter's value list (valid ones, registered now)."""
        out = self._adj.get(r)
        if out is None:
            out = [self._register(t, self.view.config_at(t)) for t in self.view.adjacent(self._idx[r])]
            self._adj[r] = out
        return out

    def hamming(self, r: int) -> list[int]:
        """Rows that differ in exactly one parameter, any value (valid ones, registered now)."""
        out = self._ham.get(r)
        if out is None:
            out = [self._register(t, self.view.config_at(t)) for t in self.view.hamming(self._idx[r])]
            self._ham[r] = out
        return out

    @staticmethod
    def _ok(r: int, allowed: np.ndarray, taken: set[int]) -> bool:
        return r not in taken and (r >= len(allowed) or bool(allowed[r]))  # a new row is unseen

    def _draw(self, allowed: np.ndarray, taken: set[int], rng: np.random.Generator, tries: int) -> int | None:
        """A uniformly drawn valid row, allowed and not taken (rejection sampling), or None."""
        view = self.view
        left = tries
        while left > 0:
            chunk = rng.integers(0, self.sizes, size=(min(256, left), len(self.sizes)))
            left -= len(chunk)
            for idx in chunk:
                key = tuple(int(i) for i in idx)
                view.draws += 1
                cfg = view.check(key, cache=False)
                if cfg is None:
                    continue
                view.accepted += 1
                r = self._register(key, cfg)
                if self._ok(r, allowed, taken):
                    return r
        if not view.accepted:
            view._too_sparse()
        return None

    def sample(self, n: int, allowed: np.ndarray, rng: np.random.Generator) -> list[int]:
        """Up to ``n`` distinct valid rows, allowed (rows past ``allowed`` count as allowed), uniformly."""
        taken: set[int] = set()
        out: list[int] = []
        budget = max(20_000, 200 * n)
        for _ in range(n):
            r = self._draw(allowed, taken, rng, budget)
            if r is None:
                break
            taken.add(r)
            out.append(r)
        return out

    def design(self, n: int, allowed: np.ndarray, rng: np.random.Generator) -> list[int]:
        """:meth:`PoolIndex.design` without the pool: a Latin hypercube over the value indices; a point
        the constraints reject (or already taken) has random parameters redrawn, one more at each of a
        few tries, then a uniformly drawn valid row replaces it."""
        d = len(self.sizes)
        strata = np.empty((n, d))
        for j in range(d):
            strata[:, j] = (rng.permutation(n) + rng.random(n)) / n
        out: list[int] = []
        taken: set[int] = set()
        active = self.active if self.active.size else np.arange(d)
        for i in range(n):
            target = np.minimum(np.floor(strata[i] * self.sizes), self.sizes - 1).astype(np.int64)
            r = self.row(target)
            tries = 0
            while (r is None or not self._ok(r, allowed, taken)) and tries < 32:
                tries += 1
                idx = target.copy()
                k = min(1 + tries // 4, active.size)
                for j in rng.choice(active, k, replace=False):
                    idx[j] = int(rng.integers(0, self.sizes[j]))
                r = self.row(idx)
            if r is None or not self._ok(r, allowed, taken):
                r = self._draw(allowed, taken, rng, 20_000)
                if r is None:
                    break
            taken.add(r)
            out.append(r)
        return out



def index_for(space: Space, arch: str | None, pool: Sequence[Config],
              lazy: LazySpace | None) -> "PoolIndex | LazyIndex":
    """The index a strategy works on: the shared :class:`PoolIndex` of an enumerated space, or a fresh
    :class:`LazyIndex` of a lazy one (its rows depend on the strategy's own draws)."""
    return LazyIndex(lazy) if lazy is not None else pool_index(space, arch, pool)


class RowArray:
    """A per-row array of a strategy that grows with its index (new rows get ``fill``).

    :meth:`view` is the array over the index's rows now (writes go to the buffer); :meth:`reset`
    refills every row. Over a :class:`PoolIndex` it is a plain array of the pool's length.
    """

    def __init__(self, index: "PoolIndex | LazyIndex", fill: object, dtype: object) -> None:
        self.index = index
        self.fill = fill
        self.buf = np.full(max(len(index), 1 if isinstance(index, PoolIndex) else 64), fill, dtype=dtype)

    def view(self) -> np.ndarray:
        n = len(self.index)
        if n > len(self.buf):
            grown = np.full(max(n, 2 * len(self.buf)), self.fill, dtype=self.buf.dtype)
            grown[: len(self.buf)] = self.buf
            self.buf = grown
        return self.buf[:n]

    def reset(self) -> None:
        self.buf[:] = self.fill
