"""The ``@autotune`` decorator and the tuned op's hot path.

A tuned op wraps a *launch plan*: ``plan(config, *args) -> Launch(kernel, grid, kernel_args)``.
On a call with a new problem key the op builds a :class:`~tiletune.resolve.problem.Problem` and asks
the chain of sources (:mod:`tiletune.resolve.chain`: pins, the tuning database, tables, the nearest
tuned neighbour, other ranks, tuning, by default in a worker process) for a choice; then it caches the winning config with a launcher that holds the hinted kernel object, so every later call
with that key costs the key lookup, the plan and one ``ct.launch``.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import os
import threading
import time
import weakref
from contextvars import ContextVar
from operator import itemgetter
from typing import Any, Callable, Mapping, Sequence

from tiletune.devices import timeline
from tiletune.devices.backends.base import Backend, Launch, LaunchParts
from tiletune.op.binding import positional_binder
from tiletune.errors import TiletuneError
from tiletune.op.guards import GuardTable
from tiletune.op.hotpath import Entry, bound_launcher, build_entry
from tiletune.buckets import Buckets
from tiletune.keys import _BY_VALUE, default_key
from tiletune.engine.progress import configure_logging_from_env
from tiletune import events, settings
from tiletune.records import TuneResult
from tiletune.space.spaces import Config, Space
from tiletune.store import TuningDB
from tiletune.space.strategies.base import Budget
from tiletune.space.strategies.registry import StrategySpec
from tiletune.engine.tuner import TunerOptions

from tiletune.devices.plans import PlanCache
from tiletune.resolve.chain import Attempt, current_scope, default_chain
from tiletune.resolve.database import DatabaseSource
from tiletune.resolve.handle import DatabaseHandle
from tiletune.resolve.pins import PinSource, verified_pin
from tiletune.resolve.problem import ON_MISS, OpSpec, Problem
from tiletune.resolve.tables import TableSource

#: ``tolerance(*args) -> {dtype name: (rtol, atol)}``: a problem-dependent tolerance.
ToleranceFn = Callable[..., Mapping[str, "tuple[float, float]"]]

logger = logging.getLogger("tiletune")

Plan = Callable[..., Any]


def _check_strategy(strategy: Any) -> None:
    """Refuse (StrategyError, a ValueError) anything but a registered name, a Strategy subclass or
    a Strategy instance, at the decorator rather than at the first call."""
    from tiletune.space.strategies import resolve_strategy

    resolve_strategy(strategy)


ISOLATION_MODES = settings.ISOLATION_MODES

#: keys installed from their bucket's config an op keeps at most (see ``TunedOp._forget_bucket_keys``)
MAX_BUCKET_KEYS = 4096


#: True while an op is made inside a call that will look its key up at once (a library op is made on
#: its first call): neither the isolated worker nor the background import of cuTile's compiler
#: (:func:`tiletune.devices.backends.prewarm_default`) is started ahead. A call the database or a table
#: answers never needs the worker (no worker process, no second CUDA context), nor, when
#: :mod:`tiletune.devices.frontend_cache` holds its kernel, cuTile's compiler (a background import would only
#: compete with that call for the interpreter); a tuning starts both anyway, at once.
defer_worker_start: ContextVar[bool] = ContextVar("tiletune_defer_worker_start", default=False)


def _resolve_isolation(isolation: str | None, backend: Backend | None) -> str:
    """``isolation=`` or ``TILETUNE_ISOLATION``; by default "process" for the live cuTile backend and
    "none" for a backend object passed in (simulated ones run in this process unless asked)."""
    value = isolation
    if value is None:
        value = settings.isolation()
        if backend is not None and value == "process":
            value = "none"  # the environment switch is for the live backend
    if value is None:
        value = "process" if backend is None else "none"
    if value not in ISOLATION_MODES:
        raise ValueError(f"isolation={value!r}: choose one of {', '.join(ISOLATION_MODES)}")
    from tiletune.devices.workers import in_worker

    return "none" if in_worker() else value


def _no_outputs(args: tuple[Any, ...]) -> None:
    return None


#: threads recording which tuned-op launches a call makes (see :mod:`tiletune.kernels.fastcall`); empty
#: almost always, so the hot path pays one truthiness test
_recorders: dict[int, list[tuple["TunedOp", Any, tuple[Any, ...]]]] = {}
#: the same dict, for the fast paths that test it on every call (read only)
recorders = _recorders


def _note_launch(op: "TunedOp", key: Any, args: tuple[Any, ...]) -> None:
    rec = _recorders.get(threading.get_ident())
    if rec is not None:
        rec.append((op, key, args))


def record_launches(fn: Callable[..., Any], *args: Any,
                    **kwargs: Any) -> tuple[Any, list[tuple["TunedOp", Any, tuple[Any, ...]]]]:
    """``fn(*args, **kwargs)`` once with this thread's tuned-op launches recorded: ``(its result,
    [(op, key, op arguments), ...])`` in launch order (``key`` None where the op missed it). Raises
    RuntimeError when this thread is already recording (a library op inside a recorded call)."""
    tid = threading.get_ident()
    if tid in _recorders:
        raise RuntimeError("record_launches: this thread is already recording launches")
    rec: list[tuple["TunedOp", Any, tuple[Any, ...]]] = []
    _recorders[tid] = rec
    try:
        result = fn(*args, **kwargs)
    finally:
        _recorders.pop(tid, None)
    return result, rec


class FirstLaunch(BaseException):
    """Raised by :func:`first_launch` at a call's first tuned-op launch (a BaseException, so that no
    ``except Exception`` of a library op swallows it)."""

    def __init__(self, op: "TunedOp", key: Any, args: tuple[Any, ...]) -> None:
        super().__init__(op.name)
        self.op = op
        self.key = key  # None: the op missed this key (it would resolve, maybe tune, it)
        self.args = args


class _StopAtFirst:
    """A launch recorder (see :data:`_recorders`) that stops the call at its first tuned-op launch."""

    def append(self, item: tuple["TunedOp", Any, tuple[Any, ...]]) -> None:
        raise FirstLaunch(*item)


def first_launch(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FirstLaunch | None:
    """Call ``fn`` (a tuned op, or a function that calls one, such as a library op) up to its first
    tuned-op launch and stop there, before anything is resolved, tuned or launched: which op, with
    which arguments, and whether its key is cached (``key`` set) or missed (``key`` None). None when
    ``fn`` returned without reaching a tuned op (it then ran for real).

    A campaign uses it to compile the candidates of the next calls while the GPU measures: it rides
    on the launch recorders of :mod:`tiletune.kernels.fastcall`, so it costs the hot path nothing."""
    tid = threading.get_ident()
    if tid in _recorders:
        raise RuntimeError("first_launch: this thread is already recording launches")
    _recorders[tid] = _StopAtFirst()  # type: ignore[assignment]
    try:
        fn(*args, **kwargs)
    except FirstLaunch as hit:
        return hit
    finally:
        _recorders.pop(tid, None)
    return None


def _choices_changed() -> None:
    """A tuned op's choice for a key changed (cache cleared, a pending key tuned): tell the listeners."""
    events.emit("changed", op=None)


def _stream_capturing(backend: Backend, dev: int) -> bool:
    """Whether the stream a launch on ``dev`` goes to is being captured into a CUDA graph."""
    probe = getattr(backend, "stream_capturing", None)
    return bool(probe(dev)) if probe is not None else False


class _ArgTemplate:
    """What :meth:`TunedOp.tune_pending` needs to tune a key later: weak references to the call's
    tensors (strong ones to other values) and their shapes, strides, dtypes and devices."""

    def __init__(self, args: tuple[Any, ...]) -> None:
        from tiletune.keys import is_tensor

        self.parts: list[tuple[str, Any, Any]] = []
        for a in args:
            if is_tensor(a):
                try:
                    ref: Any = weakref.ref(a)
                except TypeError:
                    ref = lambda a=a: a  # noqa: E731 - not weak-referenceable: keep it
                meta = (tuple(a.shape), tuple(a.stride()), a.dtype, getattr(a, "device", None))
                self.parts.append(("tensor", ref, meta))
            else:
                self.parts.append(("value", a, None))

    def fresh_arguments(self) -> tuple[Any, ...]:
        """New tensors like the originals (floats normal, integers zero), the other values as given."""
        return tuple(ref if kind == "value" else _synthesize(*meta) for kind, ref, meta in self.parts)

    def arguments(self) -> tuple[Any, ...]:
        """The original arguments while they live, else fresh tensors like them."""
        out: list[Any] = []
        for kind, ref, meta in self.parts:
            if kind == "value":
                out.append(ref)
                continue
            t = ref()
            if t is None:
                t = _synthesize(*meta)
            out.append(t)
        return tuple(out)


def _synthesize(shape: tuple[int, ...], stride: tuple[int, ...], dtype: Any, device: Any) -> Any:
    import torch

    t = torch.empty_strided(shape, stride, dtype=dtype, device=device)
    if t.is_floating_point():
        t.normal_()
    else:
        t.zero_()
    return t


class _Pending:
    """A key launched during capture without tuning: its config, launcher and arguments template."""

    __slots__ = ("config", "entry", "template")

    def __init__(self, config: Config, entry: Entry, template: _ArgTemplate | None) -> None:
        self.config = config
        self.entry = entry
        self.template = template

    def arguments(self) -> tuple[Any, ...]:
        assert self.template is not None
        return self.template.arguments()


class TunedOp:
    """A cuTile launch plan made into an autotuned op. Create it with :func:`autotune`."""

    def __init__(
        self,
        plan: Plan,
        space: Space,
        *,
        reference: Callable[..., Any] | None = None,
        writes: Sequence[str | int] = (),
        inplace: Sequence[str | int] = (),
        key: Callable[..., Any] | None = None,
        name: str | None = None,
        db: TuningDB | str | os.PathLike | bool | None = None,
        backend: Backend | None = None,
        tolerance: Mapping[str, tuple[float, float]] | ToleranceFn | None = None,
        options: TunerOptions | None = None,
        progress: bool | None = None,
        cache_plan: bool = True,
        strategy: StrategySpec | None = None,
        budget: Budget | None = None,
        seed: int = 0,
        strategy_options: Mapping[str, Any] | None = None,
        isolation: str | None = None,
        buckets: Buckets | None = None,
        tune_single: bool = True,
        on_miss: str = "tune",
        background: bool | None = None,
        fallback: Callable[..., Any] | None = None,
    ) -> None:
        if not isinstance(space, Space):
            raise TypeError(f"autotune needs a tiletune.Space, got {type(space).__name__}")
        if budget is not None and not isinstance(budget, Budget):
            raise TypeError(f"budget must be a tiletune.Budget, got {type(budget).__name__}")
        if strategy is not None:
            _check_strategy(strategy)
        self.plan = plan
        self.space = space
        self.reference = reference
        self.name = name or getattr(plan, "__qualname__", "op")
        self.key_fn = key
        if tolerance is not None and not callable(tolerance) and not isinstance(tolerance, Mapping):
            raise TypeError("tolerance must be a {dtype name: (rtol, atol)} mapping or a callable of the op's arguments")
        self.tolerance: Mapping[str, tuple[float, float]] | ToleranceFn | None = (
            tolerance if callable(tolerance) else (dict(tolerance) if tolerance else None))
        self.options = options or TunerOptions()
        self.progress = progress
        self.strategy = strategy
        self.budget = budget
        self.seed = seed
        self.strategy_options = dict(strategy_options or {})
        self._backend = backend
        self._backend_given = backend is not None  # the live backend is created lazily into _backend
        self.isolation = _resolve_isolation(isolation, backend)
        self._isolated: Backend | None = None
        self._database = DatabaseHandle(db)  # opened at first use, dropped for good if it fails
        if on_miss not in ON_MISS:
            raise ValueError(f"on_miss={on_miss!r}: choose one of {', '.join(ON_MISS)}")
        #: what a key nothing stored answers gets: "tune", "nearest" or "default" (:data:`ON_MISS`)
        self.on_miss = on_miss
        #: tune provisional keys in a background thread (None: ``TILETUNE_BACKGROUND``)
        self.background = background
        if fallback is not None and not callable(fallback):
            raise TypeError(f"fallback must be a callable of the plan's arguments, got {type(fallback).__name__}")
        #: ``fallback(*args)``: the op done another way, run while a new key's config compiles in the background
        self.fallback = fallback
        self._ahead: dict[Any, Any] = {}  # key -> its configs compiling in the background (calls fall back)
        self._fell_back: set[Any] = set()  # keys that fell back once: resolved by compiling from then on
        self._background_thread: threading.Thread | None = None
        #: how another process can make this op again (set by the library's ops; see OpSpec.origin)
        self.origin: Any = None
        #: a new shape's race also weighs configs next to the nearest neighbour's that a compile cache holds
        #: (set by the library's ops, whose kernels do not fault; see OpSpec.race_variants)
        self.race_variants = False
        sig = inspect.signature(plan)
        self._params = list(sig.parameters)[1:]
        self._binder = positional_binder(sig.replace(parameters=list(sig.parameters.values())[1:]))
        self.inplace = self._resolve_positions(inplace, "inplace")
        self.writes = tuple(p for p in self._resolve_positions(writes, "writes") if p not in self.inplace)
        self.cache_plan = cache_plan and key is None  # a user key may omit what the plan reads
        self._key: Callable[[tuple[Any, ...]], Any] = default_key if key is None else (lambda a: key(*a))
        if buckets is not None and not isinstance(buckets, Buckets):
            raise TypeError(f"buckets must be a tiletune.Buckets, got {type(buckets).__name__}")
        if buckets is not None and key is not None:
            raise ValueError("buckets= and key= cannot be combined: a key function decides the grouping itself")
        #: shape buckets: keys of one bucket share a tuning result (see :mod:`tiletune.buckets`)
        self.buckets = buckets.resolve(self._params) if buckets is not None else None
        self._bucket_configs: dict[Any, Config] = {}
        self._cache: dict[Any, Entry] = {}
        #: guards of recently called keys with their entries (default key only; see :mod:`tiletune.op.guards`)
        self._fast: GuardTable[Entry] = GuardTable()
        self._guarded = key is None
        self._configs: dict[Any, Config] = {}
        self.recipe_keys: set[Any] = set()  # keys whose entry replays a recorded plan output
        self._pending: dict[Any, _Pending] = {}  # keys met during CUDA graph capture, not tuned yet
        self.tune_single = bool(tune_single)
        self._refine: dict[Any, _ArgTemplate] = {}  # keys a bucket answered, queued for exact tuning
        self._provisional: dict[Any, _ArgTemplate] = {}  # keys a neighbour or the default answered
        #: keys installed from their bucket's config, oldest first: a shape that changes on every call (a cache
        #: grown by concatenation) must not grow the op's memory, and such a key answers again at once
        self._bucket_keys: dict[Any, None] = {}
        outs = sorted(set(self.writes) | set(self.inplace))
        #: ``outputs(args)``: what a call returns: None, the one written argument, or a tuple of them
        self._outputs: Callable[[tuple[Any, ...]], Any] = itemgetter(*outs) if outs else _no_outputs
        self._lock = threading.RLock()
        self.results: dict[Any, TuneResult] = {}
        self.tuning_count = 0
        functools.update_wrapper(self, plan)
        if backend is None and not defer_worker_start.get():
            from tiletune.devices.backends import prewarm_default

            prewarm_default()
            if self.isolation == "process":
                from tiletune.devices.workers import prestart
                from tiletune.devices.workers.zygote import plan_modules

                tol = self.tolerance if callable(self.tolerance) else None
                prestart(modules=plan_modules([plan, reference, tol]))

    # ------------------------------------------------------------------ hot path
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            args = self._bind_arguments(args, kwargs)
        if not _recorders:  # a guard of a recent key passes: its entry, no key built (GuardTable.lookup inlined)
            try:
                row = self._fast.rows[args[0].shape]
            except Exception:  # noqa: BLE001 - no arguments, no shape, or a shape not seen
                row = ()
            for check, entry in row:
                if check(args):
                    entry(args)
                    return self._outputs(args)
        key = self._key(args)
        entry = self._cache.get(key)
        if entry is None:
            return self._miss(args, key, fall_back=True)
        if _recorders:
            _note_launch(self, key, args)
        elif self._guarded:
            self._remember(key, args, entry)
        entry(args)
        return self._outputs(args)

    def _remember(self, key: Any, args: tuple[Any, ...], entry: Entry) -> None:
        """Make ``key``'s guard the first one its selector tries (entries change under ``self._lock``)."""
        self._fast.remember_current(key, args, _BY_VALUE.__contains__, entry, self._cache, self._lock)

    # ------------------------------------------------------------------ public helpers
    def config_for(self, *args: Any, **kwargs: Any) -> Config:
        """The config this op uses for these arguments (tunes if the key is new, without launching twice)."""
        if kwargs:
            args = self._bind_arguments(args, kwargs)
        key = self._key(args)
        if key not in self._configs:
            self._miss(args, key)
        pend = self._pending.get(key)
        return pend.config if pend is not None else self._configs[key]

    def known_config(self, *args: Any, **kwargs: Any) -> Config | None:
        """The config a call with these arguments would launch, if this op already holds one for their
        key (tuned or loaded in this process, a capture-time fallback, or a tuned bucket's winner that
        the call would take at once); None where a call would have to look it up or tune. Tunes, loads
        and launches nothing (safe inside a CUDA graph capture)."""
        if kwargs:
            args = self._bind_arguments(args, kwargs)
        key = self._key(args)
        pend = self._pending.get(key)
        if pend is not None:
            return pend.config
        cfg = self._configs.get(key)
        if cfg is None and self.buckets is not None and not self.buckets.refine:
            cfg = self._bucket_configs.get(self.buckets.key(args))  # what a call would launch at once
        return cfg

    def bind(self, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        """A launcher of this op on these exact arguments: ``bound()`` launches the chosen config's kernel
        with no key, lookup or plan on the way (the cheapest call there is).

        The key is resolved now (a new key is tuned, which launches the winner once on these
        arguments, as a call would); ``bind`` itself launches nothing otherwise. The bound launcher
        keeps references to the arguments and passes the same memory on every call (on cuTile as array
        views made once, skipping the per-call DLPack conversion): it is for fixed buffers (static
        inputs and outputs, CUDA-graph style). Rebind after reallocating them (``resize_``, ``set_``).
        It returns what a call returns; its ``config`` attribute is the config it launches.
        """
        if kwargs:
            args = self._bind_arguments(args, kwargs)
        key = self._key(args)
        with self._lock:
            if key not in self._cache:
                self._miss(args, key, launch=False)
            cfg = self._configs[key]
        parts, grid, kargs = self._resolved_launch(cfg, args)
        views = bool(getattr(self.backend, "accepts_array_interface", False))
        return bound_launcher(parts, grid, kargs, self._outputs(args), views=views, config=cfg, op=self)

    def cache_clear(self) -> None:
        """Forget in-memory choices (the database keeps its records)."""
        with self._lock:
            self._cache.clear()
            self._fast.clear()
            self._configs.clear()
            self.recipe_keys.clear()
            self._pending.clear()
            self._bucket_keys.clear()
        _choices_changed()

    @property
    def pending(self) -> list[Any]:
        """Keys first met during a CUDA graph capture and launched without tuning (see :meth:`tune_pending`)."""
        return list(self._pending)

    @property
    def provisional(self) -> list[Any]:
        """Keys answered provisionally (a tuned neighbour's config under ``on_miss="nearest"``, the default
        config under ``on_miss="default"``) and not tuned yet (see :meth:`tune_pending`)."""
        return list(self._provisional)

    def tune_pending(self) -> dict[Any, Config]:
        """Tune every pending key: those first met during a CUDA graph capture (launched there with a
        stored answer or the baseline config) and those answered provisionally (:attr:`provisional`).
        Call it outside any capture.

        A capture-time key is tuned on the call's arguments when they are still alive (the tuning
        session saves and restores them like any call's), a provisional key on fresh tensors of its
        shapes, strides and dtypes (floats normal, integers zero), never on the caller's. Graphs
        captured before keep the config they captured: capture again to use the tuned one. Returns
        ``{key: tuned config}``; a key that cannot be tuned stays pending (logged).
        """
        done: dict[Any, Config] = {}
        for key in list(self._pending):
            pend = self._pending.get(key)
            if pend is None:
                continue
            try:
                args = pend.arguments()
            except Exception as exc:  # noqa: BLE001 - reported, the key stays pending
                logger.warning("%s: cannot rebuild the arguments of pending key %r (%s); it stays pending",
                               self.name, key, exc)
                continue
            self._miss(args, key, launch=False)
            if key in self._cache:
                done[key] = self._configs[key]
        for key in list(self._provisional):
            template = self._provisional.get(key)
            if template is None:
                continue
            try:
                args = template.fresh_arguments()
                self._miss(args, key, launch=False, policy="tune", force=True)
            except Exception as exc:  # noqa: BLE001 - reported, the key keeps its provisional config
                logger.warning("%s: tuning provisional key %r failed (%s: %s); it keeps its config", self.name, key,
                               type(exc).__name__, exc)
                continue
            if key in self._cache and key not in self._provisional:
                done[key] = self._configs[key]
        return done

    def _background_enabled(self) -> bool:
        return settings.background() if self.background is None else bool(self.background)

    def _start_background(self) -> None:
        """Tune the provisional keys in a daemon thread (one at a time per op); each tuned config replaces
        the provisional one between calls (a call never waits for it)."""
        thread = self._background_thread
        if thread is not None and thread.is_alive():
            return

        def run() -> None:
            while self._provisional:
                before = set(self._provisional)
                self.tune_pending()
                if set(self._provisional) >= before:  # nothing could be tuned: stop
                    return

        self._background_thread = threading.Thread(target=run, name=f"tiletune-background-{self.name}", daemon=True)
        self._background_thread.start()

    @property
    def refining(self) -> list[Any]:
        """Keys answered by their bucket's winner and queued for exact tuning (``Buckets(refine=True)``)."""
        return list(self._refine)

    def refine(self, *, background: bool = False) -> "dict[Any, Config] | threading.Thread":
        """Tune the shapes queued by bucket refinement (``Buckets(..., refine=True)``) on their exact
        keys, and use each exact winner for its shape from then on.

        Each is tuned on fresh tensors of its shape, strides and dtypes (floats normal, integers zero),
        never on the caller's, so it is safe while the program runs; the winner is stored under the
        exact key. Calls of already-resolved shapes never wait for it; a call of a new shape of this op
        waits while one refinement session holds the op. ``background=True`` runs the same in a daemon
        thread and returns it (tuning then shares the GPU with the program: its timings are noisier).
        Returns ``{key: exact config}``; a shape that fails to tune keeps its bucket's config (logged).
        """
        if background:
            thread = threading.Thread(target=self.refine, name=f"tiletune-refine-{self.name}", daemon=True)
            thread.start()
            return thread
        done: dict[Any, Config] = {}
        for key in list(self._refine):
            template = self._refine.pop(key, None)
            if template is None:
                continue
            try:
                args = template.fresh_arguments()
                backend = self.backend
                dev = backend.arg_device(args)
                with self._lock:
                    problem = self.problem(args, key, exact=True, policy="tune")
                    attempt = Attempt()
                    try:
                        choice = default_chain().resolve(problem, attempt)
                    finally:
                        if attempt.tuning_started:
                            self.tuning_count += 1
                    if choice.result is not None:
                        self.results[key] = choice.result
                    self._install(choice.config, args, key, backend, dev)
            except Exception as exc:  # noqa: BLE001 - the bucket's config stays; reported
                logger.warning("%s: refining %r on its exact shape failed (%s: %s); it keeps its bucket's "
                               "config", self.name, key, type(exc).__name__, exc)
                continue
            done[key] = choice.config
            logger.info("%s: refined %r -> %s", self.name, key, choice.config)
        if done:
            _choices_changed()
        return done

    def _queue_refinement(self, key: Any, args: tuple[Any, ...]) -> None:
        if self.buckets is not None and self.buckets.refine and key not in self._refine:
            self._refine[key] = _ArgTemplate(args)

    def _exact_record(self, args: tuple[Any, ...], key: Any, plans: PlanCache) -> Config | None:
        """The stored config of this exact key (a refined shape), or None; no tuning. ``plans``: the
        call's plan cache, shared with the bucket's resolution (one kernel id for both)."""
        try:
            problem = self.problem(args, key, plans=plans, exact=True)
            for source in (PinSource(), DatabaseSource(), TableSource()):
                got = source.get(problem, Attempt())
                if got is not None:
                    return got.config
        except Exception as exc:  # noqa: BLE001 - the bucket answers without it
            logger.debug("%s: exact lookup failed: %s", self.name, exc)
        return None

    @property
    def db(self) -> TuningDB | None:
        """The tuning database this op reads and writes, opened at first use.

        None when persistence is off (``db=False``) and when the database cannot be used: it failed to
        open, or failed later (locked, disk full, ...); the op then tunes and launches without storing
        anything, after one :class:`~tiletune.errors.DatabaseWarning` per process and database path
        saying what is wrong and what to do. A read-only database (``db.read_only``) is kept: its
        records are used, nothing is stored (see :func:`tiletune.resolve.handle.open_database`).
        """
        return self._database.db

    @property
    def backend(self) -> Backend:
        """The backend that compiles, measures and launches (the live cuTile one by default)."""
        if self._backend is None:
            from tiletune.devices.backends import default_backend

            self._backend = default_backend()
        return self._backend

    # ------------------------------------------------------------------ slow path
    def _resolve_positions(self, names: Sequence[str | int] | str | int, what: str) -> tuple[int, ...]:
        if isinstance(names, (str, int)):
            names = (names,)
        variadic = any(p.kind is p.VAR_POSITIONAL for p in inspect.signature(self.plan).parameters.values())
        out: list[int] = []
        for w in names:
            if isinstance(w, int) and not isinstance(w, bool):
                if w < 0 or (w >= len(self._params) and not variadic):
                    raise ValueError(f"{what}: position {w} is out of range for the plan's arguments {self._params}")
                pos = w
            elif isinstance(w, str) and w in self._params:
                pos = self._params.index(w)
            else:
                raise ValueError(
                    f"{what}: {w!r} is not an argument of the launch plan (after the config): {self._params}"
                )
            if pos not in out:
                out.append(pos)
        return tuple(out)

    def _launch_spec(self, cfg: Config, args: tuple[Any, ...]) -> Launch:
        spec = self.plan(cfg, *args)
        if not isinstance(spec, Launch):
            try:
                spec = Launch(*spec)
            except TypeError as exc:
                raise TiletuneError(
                    f"{self.name}: the launch plan must return tiletune.Launch(kernel, grid, args), got {spec!r}"
                ) from exc
        return spec

    def _resolved_launch(self, cfg: Config,
                         args: tuple[Any, ...]) -> tuple[LaunchParts, tuple[int, ...], tuple[Any, ...]]:
        """``cfg``'s launch on ``args`` ready to issue: ``(the backend's launch parts for the plan's kernel,
        grid, kernel arguments)``; ``launch, stream, kernel, device = parts; launch(stream(device), grid, kernel, kargs)``."""
        kernel, grid, kargs = self._launch_spec(cfg, args)
        return self.backend.launch_parts(cfg, kernel, self.backend.arg_device(args)), tuple(grid), tuple(kargs)

    def _bind_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        """Keyword arguments bound to the plan's parameters: the positional tuple the plan is called with
        (defaults filled in only up to the last argument given)."""
        try:
            bound, rest = self._binder(args, kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}(): {exc}") from None
        if rest:
            raise TypeError(f"{self.name}(): keyword-only parameters of a launch plan cannot be passed "
                            f"({', '.join(rest)}); make them positional")
        return bound

    def spec(self) -> OpSpec:
        """The op as the miss path sees it (frozen; made from the op's current settings)."""
        return OpSpec(
            name=self.name, plan=self.plan, space=self.space, reference=self.reference, writes=self.writes,
            inplace=self.inplace, tolerance=self.tolerance, options=self.options, progress=self.progress,
            strategy=self.strategy, budget=self.budget, seed=self.seed, strategy_options=dict(self.strategy_options),
            user_key=self.key_fn is not None, buckets=self.buckets, tune_single=self.tune_single,
            on_miss=self.on_miss, origin=self.origin, fallback=self.fallback, race_variants=self.race_variants,
        )

    def problem(self, args: tuple[Any, ...], key: Any, *, plans: PlanCache | None = None, exact: bool = False,
                policy: str | None = None, capturing: bool = False, disabled: bool = False,
                backend: Backend | None = None, device: int | None = None, arch: str | None = None,
                may_fall_back: bool = False) -> Problem:
        """The :class:`~tiletune.resolve.problem.Problem` of a call with these arguments and key (on the op's
        backend, or ``backend`` with ``device`` and ``arch`` given: e.g. an offline one)."""
        backend = self.backend if backend is None else backend
        dev = backend.arg_device(args) if device is None else device
        arch = backend.device_info(dev).arch if arch is None else arch
        if plans is None:
            plans = PlanCache(lambda c: self._launch_spec(c, args))
        if policy is None:
            scope = current_scope()
            policy = (scope.on_miss if scope is not None else None) or settings.on_miss() or self.on_miss
        return Problem(self.spec(), args, key, backend, dev, arch, plans, self._database,
                       tuning=lambda: self._tuning_backend(backend), exact=exact, capturing=capturing,
                       disabled=disabled, policy=policy, may_fall_back=may_fall_back)

    def _miss(self, args: tuple[Any, ...], key: Any, launch: bool = True, policy: str | None = None,
              force: bool = False, fall_back: bool = False) -> Any:
        if _recorders:
            _note_launch(self, None, args)  # not a cached choice: nothing a recipe could replay
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None and not force:  # another thread finished first
                if launch:
                    entry(args)
                return self._outputs(args)
            configure_logging_from_env()
            backend = self.backend
            dev = backend.arg_device(args)
            disabled = settings.disabled()
            capturing = not disabled and _stream_capturing(backend, dev)
            pend = self._pending.get(key)
            if pend is not None and capturing:  # met during this capture already: the same provisional launch
                if launch:
                    pend.entry(args)
                return self._outputs(args)
            ahead = self._ahead.get(key)
            if ahead is not None:
                if fall_back and launch and not capturing and not force and not ahead.done:
                    self.fallback(*args)  # its configs still compile: the call does not wait for them
                    return self._outputs(args)
                del self._ahead[key]  # compiled (or a caller that needs a config): resolved below
            bucket = self.buckets.key(args) if self.buckets is not None and not disabled and not force else None
            plans = PlanCache(lambda c: self._launch_spec(c, args))  # this call's plans, for every identity
            cfg = None
            if bucket is not None and self.buckets.refine:  # a refined (exact) record wins over the bucket's
                cfg = self._exact_record(args, key, plans)
                if cfg is not None:
                    bucket = None
            if cfg is None and bucket is not None:
                cfg = self._bucket_configs.get(bucket)
                if cfg is not None:  # a tuned bucket answers at once, inside a graph capture too
                    logger.info("%s: bucket hit for %r -> %s", self.name, key, cfg)
                    self._queue_refinement(key, args)
                    self._bucket_keys[key] = None
            launched = False
            tuned = None  # the tuning result of this miss (its install and first launch are timed into it)
            if cfg is None:
                timeline.mark("miss", op=self.name)
                problem = self.problem(args, key, plans=plans, policy=policy, capturing=capturing, disabled=disabled,
                                       may_fall_back=(fall_back and launch and not force and self.fallback is not None
                                                      and key not in self._fell_back))
                attempt = Attempt()
                try:
                    choice = default_chain().resolve(problem, attempt)
                finally:
                    if attempt.tuning_started:
                        self.tuning_count += 1
                if choice.source == "fallback":  # nothing installed: the next call after the compile resolves it
                    self._ahead[key] = choice.ahead
                    self._fell_back.add(key)  # once: should the compile not reach a cache, the next one waits
                    self.fallback(*args)
                    return self._outputs(args)
                cfg, launched = choice.config, choice.launched
                if choice.source == "capture":  # not installed: tuned at the next call outside capture
                    entry, _ = self._entry(cfg, args, backend, dev)
                    pend = _Pending(cfg, entry, _ArgTemplate(args))
                    self._pending[key] = pend
                    if launch:
                        pend.entry(args)
                    return self._outputs(args)
                if choice.result is not None:
                    self.results[key] = tuned = choice.result
                if bucket is not None and choice.source not in ("disabled", "single"):
                    self._bucket_configs[bucket] = cfg
                    if choice.result is None and not choice.provisional:  # the bucket's winner, tuned on another shape
                        self._queue_refinement(key, args)
                if choice.provisional:
                    self._provisional[key] = _ArgTemplate(args)
                else:
                    self._provisional.pop(key, None)
            t_install = time.perf_counter()
            timeline.mark("install", op=self.name)
            entry = self._install(cfg, args, key, backend, dev)
            if pend is not None:
                del self._pending[key]
                _choices_changed()
            elif force:
                _choices_changed()
            t_launch = time.perf_counter()
            if launch and not launched:
                entry(args)
            timeline.mark("launched", op=self.name)
            if tuned is not None and isinstance(tuned.stats, dict):
                tuned.stats["install_s"] = round(t_launch - t_install, 4)  # the winner's launch prepared here
                tuned.stats["first_launch_s"] = round(time.perf_counter() - t_launch, 4)  # enqueued, not run
            if self._provisional and self._background_enabled():
                self._start_background()
            return self._outputs(args)

    def tune(self, *args: Any, **kwargs: Any) -> Config:
        """Tune the key of these arguments now (``on_miss="tune"`` for this call), unless the database or a
        table already holds its winner, and use the result from then on; a key answered provisionally
        (a neighbour's or the default config) is tuned too. Launches nothing on the caller's arguments
        beyond what a tuning session restores. Returns the config."""
        if kwargs:
            args = self._bind_arguments(args, kwargs)
        key = self._key(args)
        with self._lock:
            if key not in self._cache or key in self._provisional or key in self._pending:
                self._miss(args, key, launch=False, policy="tune", force=True)
            return self._configs[key]

    def key_of(self, *args: Any, **kwargs: Any) -> Any:
        """The in-memory problem key of a call with these arguments."""
        if kwargs:
            args = self._bind_arguments(args, kwargs)
        return self._key(args)

    def bind_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        """Keyword arguments bound to the plan's parameters: the positional tuple the plan is called with."""
        return self._bind_arguments(args, kwargs) if kwargs else tuple(args)

    def launch_spec(self, cfg: Config, args: tuple[Any, ...]) -> Launch:
        """What the plan launches for ``cfg`` on these arguments (``Launch(kernel, grid, args)``)."""
        return self._launch_spec(cfg, args)

    def launch_parts(self, cfg: Config, args: tuple[Any, ...]) -> tuple[LaunchParts, tuple[int, ...], tuple[Any, ...]]:
        """``cfg``'s launch on ``args`` ready to issue: ``(the backend's launch parts, grid, kernel arguments)``;
        ``launch, stream, kernel, device = parts; launch(stream(device), grid, kernel, kargs)``."""
        return self._resolved_launch(cfg, args)

    def settled(self, key: Any) -> Config | None:
        """The config installed for ``key`` for good (tuned, stored, or a tuned bucket's), or None: not
        resolved in this process, or only provisionally during a CUDA graph capture."""
        if key in self._pending:
            return None
        return self._configs.get(key)

    def chosen(self) -> dict[Any, Config]:
        """Every key resolved in this process and its config."""
        return dict(self._configs)

    def bucket_config(self, *args: Any) -> Config | None:
        """The config a tuned bucket holds for these arguments' bucket (ops with buckets), or None."""
        if self.buckets is None:
            return None
        return self._bucket_configs.get(self.buckets.key(args))

    def stored_config(self, *args: Any) -> Config | None:
        """The config a pin verified in this process, the database or a tuning table holds for these
        arguments' key, or None; looks up only (no tuning, no lease, no wait, no check)."""
        key = self._key(args)
        try:
            problem = self.problem(args, key)
            cfg = verified_pin(problem)
            if cfg is not None:
                return cfg
            for source in (DatabaseSource(), TableSource()):
                got = source.get(problem, Attempt())
                if got is not None:
                    return got.config
        except Exception as exc:  # noqa: BLE001 - a lookup that fails answers nothing
            logger.debug("%s: stored lookup failed: %s", self.name, exc)
        return None

    def baseline(self, arch: str) -> Config:
        """The config launched untuned on ``arch``: the space's baseline, else its first valid config."""
        return self.spec().baseline(arch)

    _baseline = baseline

    def _entry(self, cfg: Config, args: tuple[Any, ...], backend: Backend, dev: int) -> tuple[Entry, bool]:
        """The per-call launcher of ``cfg`` for this key, and whether it replays the plan's recipe."""
        spec = self._launch_spec(cfg, args)
        return build_entry(self.plan, cfg, spec, args, lambda k: backend.launch_parts(cfg, k, dev), self.cache_plan)

    def _install(self, cfg: Config, args: tuple[Any, ...], key: Any, backend: Backend, dev: int) -> Entry:
        entry, replays = self._entry(cfg, args, backend, dev)
        self._configs[key] = cfg
        self._cache[key] = entry
        self._fast.clear()  # a guard's entry may be this key's old one
        if replays:
            self.recipe_keys.add(key)
        if len(self._bucket_keys) > MAX_BUCKET_KEYS:
            self._forget_bucket_keys()
        return entry

    def _forget_bucket_keys(self) -> None:
        """Forget the oldest keys installed from their bucket's config, down to 3/4 of
        :data:`MAX_BUCKET_KEYS` (their next call is a bucket hit again; a refinement queued for them is
        dropped). Called under the op's lock."""
        drop = len(self._bucket_keys) - MAX_BUCKET_KEYS * 3 // 4
        for key in list(itertools.islice(self._bucket_keys, drop)):
            del self._bucket_keys[key]
            if key in self._pending or key in self._provisional or key in self.results:
                continue
            self._cache.pop(key, None)
            self._configs.pop(key, None)
            self._refine.pop(key, None)
            self.recipe_keys.discard(key)

    def _tuning_backend(self, backend: Backend) -> Backend:
        """Where candidates run: a worker process (isolation "process") or this process."""
        if self.isolation != "process":
            return backend
        if self._isolated is None:
            from tiletune.devices.workers import IsolatedBackend

            spec = backend if self._backend_given else "cutile"  # the live backend is rebuilt in the worker
            self._isolated = IsolatedBackend(backend, worker_spec=spec)
        return self._isolated


def autotune(
    space: Space,
    *,
    reference: Callable[..., Any] | None = None,
    writes: Sequence[str | int] | str = (),
    inplace: Sequence[str | int] | str = (),
    key: Callable[..., Any] | None = None,
    name: str | None = None,
    db: TuningDB | str | os.PathLike | bool | None = None,
    backend: Backend | None = None,
    tolerance: Mapping[str, tuple[float, float]] | ToleranceFn | None = None,
    options: TunerOptions | None = None,
    progress: bool | None = None,
    cache_plan: bool = True,
    strategy: StrategySpec | None = None,
    budget: Budget | None = None,
    seed: int = 0,
    strategy_options: Mapping[str, Any] | None = None,
    isolation: str | None = None,
    buckets: Buckets | None = None,
    tune_single: bool = True,
    on_miss: str = "tune",
    background: bool | None = None,
    fallback: Callable[..., Any] | None = None,
) -> Callable[[Plan], TunedOp]:
    """Make a cuTile launch plan an autotuned op.

    Args:
        space: the configurations to choose from (:class:`tiletune.Space`).
        reference: optional ``reference(*args)`` returning the expected contents of the written
            arguments (one tensor, or a tuple in ``writes`` order). Candidates that disagree fail.
        writes: names (or positions) of the plan's arguments the kernel only writes (outputs).
            They are saved before tuning and restored afterwards, and poisoned with NaN before each
            correctness check. The check runs on guard-banded twins of the written arguments: a
            candidate that writes outside their elements (past the end, between strided rows) fails.
            After tuning they hold exactly one launch of the winner.
        inplace: arguments the kernel reads *and* writes (e.g. RoPE on q and k). They are saved and
            restored before every candidate's checked run, so each candidate sees the caller's data.
        key: ``key(*args)`` returning a hashable, JSON-able problem key. Default: shapes, dtypes,
            contiguity of tensors (+ device), ints/strings by value, floats by type.
        name: op name in logs and the database (default: the plan's name).
        db: a :class:`TuningDB`, a path, ``None`` for the default database, ``False`` for none.
        backend: where to run (default: the live cuTile backend).
        tolerance: ``{"bfloat16": (rtol, atol), ...}`` overriding the per-dtype defaults, or a
            callable of the op's arguments returning such a mapping (for error bounds that depend
            on the problem, e.g. a tf32 GEMM whose error grows with ``K``), called once per tuning.
        options: :class:`TunerOptions` for the measurement loop.
        progress: force the progress bar on or off (default: on interactive terminals).
        cache_plan: with the default key, record the plan's output once per key and replay it on
            later calls instead of calling the plan (see :mod:`tiletune.op.hotpath` for what is
            checked). Set False if the plan reads anything besides the config, shapes, strides,
            dtypes and int arguments.
        strategy: how to search the space: ``"exhaustive"`` (every config, raced), ``"auto"`` (picks by
            the space's size and type), ``"random"``, ``"evolutionary"``, ``"model"``, ``"local"``,
            ``"surrogate"``, ``"hybrid"`` or any name added with
            ``@tiletune.space.strategies.register(name)``; or a :class:`tiletune.space.strategies.Strategy`
            subclass, or an instance of one (a template: each tuning gets a fresh copy built with
            its keyword options). Anything else is refused here, listing the registered names.
            ``None`` (the default): exhaustive for a space of at most 1024 valid configs, else ``"auto"``
            with ``budget`` or, without one, 500 evaluations (:func:`tiletune.engine.search.default_search`).
        budget: a :class:`tiletune.Budget` limiting evaluations and/or seconds (compile included). A
            space too big to enumerate (over 2^16 combinations of values) needs one with an explicit
            ``strategy``.
        seed: seeds the strategy (same seed, same proposals).
        strategy_options: keyword options of the strategy (e.g. ``{"population": 12}``).
        isolation: ``"process"`` (default for the live cuTile backend, or ``TILETUNE_ISOLATION``):
            candidates are compiled, checked and timed in a worker process, so a faulting or hanging
            candidate fails alone and this process never launches an unverified config;
            ``"none"``: in this process (the default for a ``backend=`` object).
        buckets: a :class:`tiletune.Buckets` grouping keys by rounded-up dimensions (e.g. the token
            count to the next power of two): the first call of a bucket tunes, every other shape of
            the bucket reuses its winner at once (also from the database, in other processes). Every
            config must be correct for every size of a bucket. Not combinable with ``key``.
        tune_single: False: when the space holds exactly one valid config for the device's
            architecture, a new key launches it at once, with no tuning session: no correctness
            check, no timing, no database record, and no copies of the arguments. For ops whose one
            config is tested elsewhere and whose arguments may be too large to copy (a KV-cache
            append into tens of GiB of cache). Default True: a one-config space is still checked
            once per key like any other.
        on_miss: what a key that nothing stored (no pin, database record or table entry) answers gets:
            ``"tune"`` (the default): it is tuned now; ``"nearest"``: the config of its nearest tuned
            neighbour (same op, device and layout; see :mod:`tiletune.resolve.nearest`), checked once on
            the call, launched at once and recorded as pending (no neighbour: the baseline, likewise);
            ``"default"``: the baseline config, checked once, launched at once and recorded as pending.
            Pending keys are tuned by :meth:`TunedOp.tune_pending`, ``tiletune tune --pending`` (from
            the database's pending file) or in the background.
        background: tune pending keys in a background thread and swap each tuned config in between
            calls (None: the ``TILETUNE_BACKGROUND`` environment variable, off by default).
        fallback: ``fallback(*args)`` does what the kernel does another way (torch), writing the same
            arguments. With ``on_miss="nearest"`` or ``"default"``, a new key whose answer nothing has
            compiled yet (no compile cache holds it) does not wait for the compiler: its config compiles in
            the background and calls run the fallback until it is ready (``TILETUNE_FALLBACK=0``: off).
            :func:`tiletune.wait_for_compiles` waits for those compiles.
    """

    if strategy is not None:
        _check_strategy(strategy)  # fail at the decorator, not at the first call

    def wrap(plan: Plan) -> TunedOp:
        return TunedOp(
            plan,
            space,
            reference=reference,
            writes=writes,  # type: ignore[arg-type]
            inplace=inplace,  # type: ignore[arg-type]
            key=key,
            name=name,
            db=db,
            backend=backend,
            tolerance=tolerance,
            options=options,
            progress=progress,
            cache_plan=cache_plan,
            strategy=strategy,
            budget=budget,
            seed=seed,
            strategy_options=strategy_options,
            isolation=isolation,
            buckets=buckets,
            tune_single=tune_single,
            on_miss=on_miss,
            background=background,
            fallback=fallback,
        )

    return wrap
