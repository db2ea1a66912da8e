"""The values of a miss: what the op is (:class:`OpSpec`), what is asked (:class:`Problem`) and what
answered (:class:`Choice`).

A tuned op that misses a key builds one :class:`Problem`: its frozen spec, the call's arguments and
key, the device, the database handle and where candidates would run. The chain of sources
(:mod:`tiletune.resolve.chain`) turns it into a :class:`Choice`. Nothing here holds the op: the
sources read the spec and the problem only.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple

from tiletune.devices.backends.base import Backend
from tiletune.devices.plans import KernelPart, PlanCache
from tiletune.errors import TiletuneError
from tiletune.identity import kernel_identity
from tiletune.keys import args_key_json, key_to_json
from tiletune.records import TuneResult, TuningIdentity, canonical_json
from tiletune.settings import ON_MISS_CHOICES
from tiletune.space.spaces import Config, Space

if TYPE_CHECKING:  # pragma: no cover
    from tiletune.buckets import Buckets
    from tiletune.resolve.handle import DatabaseHandle

__all__ = ["ON_MISS", "OpSpec", "Problem", "Choice", "Raced", "SOURCES", "IDENTITY_SAMPLE", "identity_configs"]

#: What an op does with a key that nothing stored answers: ``"tune"`` it now (the default of
#: ``autotune``), serve the config of its ``"nearest"`` tuned neighbour at once and record the key
#: as pending (the default of the library ops; no neighbour: the default config), or launch the
#: space's ``"default"`` (baseline) config at once and record the key as pending.
ON_MISS = ON_MISS_CHOICES

#: Every source a choice can come from, in the order the chain asks them.
SOURCES = ("capture", "disabled", "single", "pin", "database", "table", "nearest", "default", "fallback", "peer",
           "tuned")

#: Configs whose kernels identify the op on a space too big to list: the baseline and this many drawn
#: with a fixed seed (the same in every process).
IDENTITY_SAMPLE = 64


@dataclass(frozen=True)
class OpSpec:
    """What the miss path needs to know of a tuned op, frozen when the op is made."""

    name: str
    plan: Callable[..., Any]
    space: Space
    reference: Callable[..., Any] | None = None
    writes: tuple[int, ...] = ()
    inplace: tuple[int, ...] = ()
    tolerance: Any = None  # {dtype: (rtol, atol)} or a callable of the arguments
    options: Any = None  # TunerOptions
    progress: bool | None = None
    strategy: Any = None
    budget: Any = None
    seed: int = 0
    strategy_options: Mapping[str, Any] = field(default_factory=dict)
    user_key: bool = False  # keyed by a key function of the user's (stored as its JSON)
    buckets: "Buckets | None" = None
    tune_single: bool = True
    on_miss: str = "tune"
    #: how another process can make this op again (``tiletune tune --pending``): for a library op,
    #: ``{"library": its name, "regime": its regime as JSON}``; None for other ops
    origin: Any = None
    #: ``fallback(*args)``: the op done another way (torch), writing what the kernel writes, run while the
    #: config that answers a new key compiles in the background (None: the call waits for the compile)
    fallback: Callable[..., Any] | None = None
    #: whether a new shape's race also weighs the space's configs next to the nearest neighbour's that a compile
    #: cache holds (:func:`tiletune.resolve.nearest.variants`): only for kernels trusted not to fault (the
    #: library's), since a variant may never have run and the race launches it unchecked in the caller's process
    race_variants: bool = False

    def config_from(self, values: Mapping[str, Any], arch: str) -> Config | None:
        """The space's config with these values on ``arch``, or None when they are not one of its
        valid configs (a record of an older space, a pick of another rank's space)."""
        try:
            cfg = self.space.config(arch, **dict(values))
        except (TiletuneError, TypeError):
            return None
        if self.space.is_lazy(arch):  # space.config checked the values and the constraints
            return cfg
        return cfg if self.space.is_candidate(cfg, arch) else None

    def baseline(self, arch: str) -> Config:
        """The config launched untuned: the space's baseline, else its first valid config."""
        base = self.space.baseline(arch)
        if base is not None:
            return base
        if self.space.is_lazy(arch):  # a space too big to list: its first valid config, streamed
            return next(iter(self.space.lazy(arch)))
        return self.space.candidates(arch)[0]

    def single(self, arch: str) -> Config | None:
        """The space's only valid config on ``arch``, or None (several, none, or too big to list)."""
        if self.space.is_lazy(arch):
            return None
        found = self.space.candidates(arch)
        return found[0] if len(found) == 1 else None


def identity_configs(space: Space, arch: str) -> list[Config]:
    """The configs whose kernels enter the identity: every candidate, or on a space too big to list
    (:meth:`Space.is_lazy`) the baseline and :data:`IDENTITY_SAMPLE` configs drawn with seed 0."""
    if not space.is_lazy(arch):
        return space.candidates(arch)
    base = space.baseline(arch)
    drawn = space.lazy(arch).sample(random.Random(0), IDENTITY_SAMPLE)
    return ([base] if base is not None else []) + [c for c in drawn if c != base]


def kernel_part(spec: OpSpec, backend: Backend, arch: str, plans: PlanCache) -> KernelPart:
    """The key-independent part of the identity of a call (whose arguments ``plans`` was made for),
    computed at the first request and kept on ``plans``."""
    if plans.kernel is not None:
        return plans.kernel
    sources = []
    seen: set[int] = set()
    for cfg in identity_configs(spec.space, arch):
        try:
            k = plans(cfg).kernel
        except Exception as exc:  # the session records this config as failed; the identity notes it
            sources.append(f"#plan raised {type(exc).__name__} for {cfg.as_dict()}")
            continue
        if id(k) not in seen:
            seen.add(id(k))
            sources.append(backend.kernel_sources(k))
    plans.kernel = KernelPart(kernel_identity(spec.plan, sources), canonical_json(dict(backend.versions())))
    return plans.kernel


@dataclass(frozen=True, eq=False)
class Problem:
    """One miss: the op's spec, the call's arguments and key, the device, and where answers are kept
    (the database handle) and candidates run (``tuning``: makes the op's worker backend, or None for
    this process).

    ``exact``: the identity keys the call's exact shape even when the op declares buckets (bucket
    refinement); ``capturing``: the call is being captured into a CUDA graph (nothing may compile,
    wait or tune); ``policy``: what a key nothing stored answers gets (:data:`ON_MISS`);
    ``may_fall_back``: the caller can run the op's fallback instead of a config (a call, not
    ``config_for`` or ``bind``), so a config nothing has compiled yet may compile in the background.
    """

    spec: OpSpec
    args: tuple[Any, ...]
    key: Any
    backend: Backend
    device: int
    arch: str
    plans: PlanCache
    database: "DatabaseHandle"
    tuning: Callable[[], Backend] | None = None  # where candidates run, made when first needed
    exact: bool = False
    capturing: bool = False
    disabled: bool = False
    policy: str = "tune"
    may_fall_back: bool = False
    started: float = field(default_factory=time.perf_counter)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def tuning_backend(self) -> Backend:
        """Where candidates of this problem run: the op's worker process, or this process."""
        return self.backend if self.tuning is None else self.tuning()

    @cached_property
    def key_json(self) -> str:
        """The stored form of the key (a bucket's key for an op with buckets, unless ``exact``)."""
        spec = self.spec
        try:
            if spec.user_key:
                return canonical_json(key_to_json(self.key))
            if spec.buckets is not None and not self.exact:
                return canonical_json(spec.buckets.key_json(self.args))
            return canonical_json(args_key_json(self.args))
        except TypeError as exc:
            raise TiletuneError(f"{spec.name}: {exc}") from exc

    @cached_property
    def sizes_json(self) -> str:
        """:attr:`key_json` with the call's own sizes where the op buckets them (the same structure: a bucket
        key's form, not a key of its own): where a nearest-neighbour source measures distances from. Equal
        to :attr:`key_json` for an op without buckets, an exact problem or a key function of the user's."""
        spec = self.spec
        if spec.user_key or spec.buckets is None or self.exact:
            return self.key_json
        exact = getattr(spec.buckets, "exact_key_json", None)
        try:
            return canonical_json(exact(self.args)) if exact is not None else self.key_json
        except Exception:  # noqa: BLE001 - only a better point to measure from; the stored key still stands
            return self.key_json

    @cached_property
    def identity(self) -> TuningIdentity:
        """Everything the answer depends on (kernel sources, space, key, device, versions)."""
        kernel = kernel_part(self.spec, self.backend, self.arch, self.plans)
        return TuningIdentity(
            kernel_id=kernel.kernel_id,
            space_hash=self.spec.space.hash,
            key=self.key_json,
            device=self.backend.device_info(self.device),
            versions=kernel.versions,
            name=self.spec.name,
        )

    def config_from(self, values: Mapping[str, Any]) -> Config | None:
        return self.spec.config_from(values, self.arch)


class Raced(NamedTuple):
    """One config of a race of neighbours' configs on the call's arguments (see
    :func:`tiletune.resolve.nearest.race`): where it came from (``neighbour`` the stored key, None for the
    space's default config; ``distance`` from the call), the median of its race samples in microseconds
    (None: not timed) and its ``verdict``: ``"served"``; ``"slower"`` (timed, not checked: a faster
    one passed); ``"not compiled"`` (in no compile cache and not needed); ``"failed: ..."`` (its compile,
    launch or check, with why). ``variant``: a config of the space next to the nearest neighbour's
    (:func:`tiletune.resolve.nearest.variants`), not a neighbour's own."""

    config: Mapping[str, Any]
    neighbour: str | None
    distance: float | None
    median_us: float | None
    verdict: str
    variant: bool = False  # a config of the space next to the neighbour's, not the neighbour's own


@dataclass(frozen=True)
class Choice:
    """The answer to a :class:`Problem`: the config, where it came from (one of :data:`SOURCES`),
    whether the tuning session already launched it on the caller's arguments, the tuning result when
    one ran, the pick's stored or measured median, and the seconds the chain took.

    ``provisional``: the config answers the key for now (a neighbour's, the baseline during a capture
    or under ``on_miss="default"``); the key is recorded as pending and tuned later.
    ``neighbour``: for ``"nearest"``, the stored key whose config was taken. ``raced``: for a race of
    neighbours' configs (``"nearest"``, or ``"default"`` where the default config won it), every config
    weighed (:class:`Raced`, nearest first), so a served config can be told apart from a tuning's pick.
    ``"fallback"``: no config yet (``config`` is None): the configs that will answer the key compile in
    the background (``ahead``, with ``done`` and ``wait(timeout)``); until then calls run the op's
    fallback, and the next call after the compile resolves the key again.
    """

    config: Config
    source: str
    launched: bool = False
    result: TuneResult | None = None
    median_us: float | None = None
    seconds: float = 0.0
    provisional: bool = False
    neighbour: str | None = None
    ahead: Any = None
    raced: tuple[Raced, ...] = ()

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"Choice: unknown source {self.source!r}; one of {', '.join(SOURCES)}")
