"""Big spaces, lazily: a view of a :class:`~tiletune.space.spaces.Space` that never enumerates it.

A space's configurations are the product of its parameters' values filtered by its constraints.
:meth:`Space.configs` builds every one of them (a few hundred bytes of Python objects each), which is
right for the spaces of a kernel (tens to thousands of configs) and impossible for a space of 10^9.
Above :data:`LAZY_THRESHOLD` combinations (the product of the value counts, known without enumerating)
the search strategies work on a :class:`LazySpace` instead:

* its size is the product of the value counts (an upper bound of the valid configs: the constraints
  are only ever applied to the configs a strategy touches);
* a configuration is a vector of value indices (a mixed-radix number in space order); membership is
  "every value among its parameter's values and no constraint rejects it", checked per config;
* random valid configs are drawn by rejection (each parameter's value uniformly, redrawn until the
  constraints accept the combination), with a cap on the draws: a space whose constraints keep too
  small a share of the product to sample raises :class:`~tiletune.errors.SpaceError` saying so;
* neighbours (one parameter one step along its value list, or to any other value) are index
  arithmetic, each candidate checked against the constraints;
* iterating streams the valid configs in space order, one at a time.

The constraint verdicts of recently touched index vectors are kept in a bounded cache, so memory stays
proportional to what a search touched, not to the space. :meth:`Space.lazy` returns the (cached) view;
:func:`is_lazy` says whether a space is over the threshold on an architecture.
"""

from __future__ import annotations

import itertools
import math
import random
import sys
from typing import Any, Iterator, Mapping, Protocol, Sequence

from tiletune.errors import SpaceError

#: a configuration (:class:`tiletune.space.spaces.Config`) and a parameter's value, as this view sees them:
#: it only hands them on (the space makes and checks them)
Config = Any
Scalar = Any


class Space(Protocol):
    """What the view uses of a :class:`tiletune.space.spaces.Space` (the space owns its view, so this
    module does not import that one)."""

    names: tuple[str, ...]

    def values(self, name: str, arch: str | None = None) -> Sequence[Scalar]: ...

    def product_size(self, arch: str | None = None) -> int: ...

    def config_of(self, values: Sequence[Scalar]) -> Config: ...

    def first_failure(self, cfg: Config) -> str | None: ...

__all__ = ["LAZY_THRESHOLD", "LazySpace", "is_lazy"]

#: Spaces whose product of value counts exceeds this are searched lazily (:class:`LazySpace`); at or
#: below it they are enumerated, exactly as before (same picks for the same seeds). Listing a space
#: builds Python objects for every valid config in the space, the strategy's pool and its index, so
#: the threshold keeps listed spaces small (``benchmarks/lazy_spaces.py`` measures both sides of it).
LAZY_THRESHOLD: int = 1 << 16

#: Random draws a lazy sample may spend per config it returns (and at least :data:`_MIN_DRAWS` per call)
#: before it gives up: constraints that keep less than about 1 in 200 combinations make a space too
#: sparse to sample by rejection.
_DRAWS_PER_CONFIG = 200
_MIN_DRAWS = 20_000
#: Constraint verdicts of neighbourhood checks kept (index vector -> config or None); the cache is
#: cleared when full. Random draws are not cached (in a big space they almost never repeat).
_CACHE_LIMIT = 32_768


def _vkey(value: Any) -> tuple[bool, Any]:
    return (type(value) is bool, value)


def is_lazy(space: "Space", arch: str | None = None) -> bool:
    """Whether ``space`` on ``arch`` has more than :data:`LAZY_THRESHOLD` combinations (its product of
    value counts), so strategies search it through :meth:`Space.lazy` instead of enumerating it."""
    return space.product_size(arch) > LAZY_THRESHOLD


class LazySpace:
    """A space on one architecture, searched without enumerating it (see the module docstring).

    Made by :meth:`Space.lazy`. ``names``, ``values`` (per parameter, on the architecture) and
    ``sizes`` describe the product; ``product`` is its size. Statistics of the rejection sampling
    (``draws``, ``accepted``) give :attr:`valid_fraction`, an estimate of the share of valid
    combinations.
    """

    def __init__(self, space: "Space", arch: str | None) -> None:
        self.space = space
        self.arch = arch
        self.names: tuple[str, ...] = space.names
        self.values: tuple[tuple[Scalar, ...], ...] = tuple(tuple(space.values(n, arch)) for n in self.names)
        self.lookups = tuple({_vkey(v): i for i, v in enumerate(vs)} for vs in self.values)
        self.sizes: tuple[int, ...] = tuple(len(vs) for vs in self.values)
        self.product: int = math.prod(self.sizes)
        self.active: tuple[int, ...] = tuple(j for j, s in enumerate(self.sizes) if s > 1)
        self._cache: dict[tuple[int, ...], Config | None] = {}
        self.draws = 0
        self.accepted = 0
        self.checks = 0  # constraint evaluations (cache misses)

    # ------------------------------------------------------------------ size
    def __len__(self) -> int:
        """The product of the value counts (capped at ``sys.maxsize``): an upper bound of the valid configs."""
        return min(self.product, sys.maxsize)

    @property
    def valid_fraction(self) -> float | None:
        """Share of random combinations the constraints accepted so far (None before any draw)."""
        return self.accepted / self.draws if self.draws else None

    # ------------------------------------------------------------------ configs and indices
    def config_at(self, idx: Sequence[int]) -> "Config":
        """The config of a value-index vector (not checked against the constraints)."""
        return self.space.config_of(tuple(vs[i] for vs, i in zip(self.values, idx)))

    def index_of(self, cfg: Mapping[str, Any]) -> tuple[int, ...] | None:
        """The value-index vector of ``cfg``, or None if it names other parameters or a value that is
        not among its parameter's values on this architecture."""
        try:
            if len(cfg) != len(self.names):
                return None
            return tuple(lk[_vkey(cfg[n])] for n, lk in zip(self.names, self.lookups))
        except (KeyError, TypeError):
            return None

    def check(self, idx: Sequence[int], cache: bool = True) -> "Config | None":
        """The config of ``idx`` if the constraints accept it, else None (verdicts are cached unless
        ``cache`` is false)."""
        key = tuple(int(i) for i in idx)
        if key in self._cache:
            return self._cache[key]
        cfg = self.config_at(key)
        self.checks += 1
        ok = self.space.first_failure(cfg) is None
        if not cache:
            return cfg if ok else None
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = cfg if ok else None
        return cfg if ok else None

    def __contains__(self, cfg: object) -> bool:
        if not isinstance(cfg, Mapping):
            return False
        idx = self.index_of(cfg)
        return idx is not None and self.check(idx) is not None

    def code(self, idx: Sequence[int]) -> int:
        """The position of ``idx`` in the product (space order: the last parameter varies fastest)."""
        c = 0
        for i, s in zip(idx, self.sizes):
            c = c * s + int(i)
        return c

    # ------------------------------------------------------------------ sampling
    def draw(self, rng: random.Random) -> tuple[int, ...]:
        """One combination, each parameter's value index uniformly (not checked)."""
        return tuple(rng.randrange(s) for s in self.sizes)

    def sample(self, rng: random.Random, n: int, exclude: "set[Config] | frozenset[Config]" = frozenset(),
               max_draws: int | None = None) -> list["Config"]:
        """Up to ``n`` distinct valid configs not in ``exclude``, uniformly by rejection (seeded by ``rng``).

        Fewer are returned when the draws run out (``max_draws``, default ``max(20000, 200 n)``). Raises
        SpaceError when no valid config was ever found: the constraints keep too small a share of the
        product to sample.
        """
        if n <= 0:
            return []
        budget = max_draws if max_draws is not None else max(_MIN_DRAWS, _DRAWS_PER_CONFIG * n)
        out: list[Config] = []
        taken: set[Config] = set()
        for _ in range(budget):
            self.draws += 1
            cfg = self.check(self.draw(rng), cache=False)
            if cfg is None:
                continue
            self.accepted += 1
            if cfg in exclude or cfg in taken:
                continue
            out.append(cfg)
            taken.add(cfg)
            if len(out) >= n:
                break
        if not out and not self.accepted:
            self._too_sparse()
        return out

    def _too_sparse(self) -> None:
        raise SpaceError(
            f"the space has {self.product:.3g} combinations ({self._where()}) and its constraints "
            f"({', '.join(self.space.constraint_names) or 'none'}) accepted none of {self.draws} random ones: "
            f"too few valid configs to search it without enumerating it (more than {LAZY_THRESHOLD} "
            "combinations): narrow the parameters' values so that fewer combinations break the constraints"
        )

    def _where(self) -> str:
        return "default values" if self.arch is None else f"on {self.arch}"

    # ------------------------------------------------------------------ neighbourhoods
    def adjacent(self, idx: Sequence[int]) -> list[tuple[int, ...]]:
        """Valid index vectors one parameter one step away (previous value before next, in parameter order)."""
        out: list[tuple[int, ...]] = []
        base = list(idx)
        for j in self.active:
            v = base[j]
            for k in (v - 1, v + 1):
                if 0 <= k < self.sizes[j]:
                    trial = base.copy()
                    trial[j] = k
                    if self.check(trial) is not None:
                        out.append(tuple(trial))
        return out

    def hamming(self, idx: Sequence[int]) -> list[tuple[int, ...]]:
        """Valid index vectors that differ in exactly one parameter, any value (parameter order)."""
        out: list[tuple[int, ...]] = []
        base = list(idx)
        for j in self.active:
            for k in range(self.sizes[j]):
                if k != base[j]:
                    trial = base.copy()
                    trial[j] = k
                    if self.check(trial) is not None:
                        out.append(tuple(trial))
        return out

    def neighbours(self, cfg: Mapping[str, Any]) -> list["Config"]:
        """:meth:`Space.neighbours` without enumerating: valid configs one parameter one step from ``cfg``
        (which need not satisfy the constraints; its values must be in the space)."""
        idx = self._coerce(cfg)
        return [self.config_at(t) for t in self.adjacent(idx)]

    def _coerce(self, cfg: Mapping[str, Any]) -> tuple[int, ...]:
        idx = self.index_of(cfg)
        if idx is None:
            raise SpaceError(f"{dict(cfg)!r} is not a combination of the space's values {self._where()}")
        return idx

    # ------------------------------------------------------------------ features
    def encode(self, cfg: Mapping[str, Any]) -> list[float]:
        """:meth:`Space.encode` without enumerating: log2 of a parameter whose values are all positive
        numbers, else the value's index."""
        idx = self._coerce(cfg)
        out: list[float] = []
        for vs, i in zip(self.values, idx):
            if all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in vs):
                out.append(math.log2(vs[i]))  # type: ignore[arg-type]
            else:
                out.append(float(i))
        return out

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator["Config"]:
        """The valid configs in space order, streamed (no verdict is cached)."""
        first = self.space.first_failure
        make = self.space.config_of
        for values in itertools.product(*self.values):
            cfg = make(values)
            if first(cfg) is None:
                yield cfg

    def __repr__(self) -> str:
        sizes = ", ".join(f"{n}: {s}" for n, s in zip(self.names, self.sizes))
        return f"LazySpace({sizes}; {self.product:.3g} combinations)"
