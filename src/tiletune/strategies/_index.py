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
"""

from __future__ import annotations

import math
import weakref
from typing import Sequence

import numpy as np

from ..space import Config, Space

__all__ = ["PoolIndex", "pool_index"]


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
