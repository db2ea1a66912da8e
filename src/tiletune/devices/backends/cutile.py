"""The live backend: cuTile kernels on an NVIDIA GPU through PyTorch tensors."""

from __future__ import annotations

import functools
import os
import threading
import time
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

from tiletune.devices.compile_pool import AheadCompile, CompileJob, CompilePool, cpu_count, flush as flush_stores
from tiletune.errors import NoBackendError
from tiletune.identity import function_source
from tiletune.devices.launch_marks import mark
from tiletune.devices.measure import ColdL2Timer
from tiletune import settings
from tiletune.records import DeviceInfo, Status
from tiletune.space.spaces import Config
from tiletune.devices.verify import ArgGuard, Checker
from tiletune.devices.backends.base import Candidate, CheckOutcome, CompileOutcome, Launch, LaunchParts


def _import_cutile() -> tuple[Any, Any]:
    try:
        import torch
        import cuda.tile as ct
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise NoBackendError(
            f"the cuTile backend needs torch and cuda-tile ({exc}); install with `pip install tiletune[cutile]`"
        ) from exc
    if not torch.cuda.is_available():
        raise NoBackendError("the cuTile backend needs an NVIDIA GPU, and torch sees none")
    return torch, ct


class HintedKernels:
    """``base kernel -> kernel.replace_hints(**hints)``, built once per (kernel, hints).

    ``replace_hints`` returns a new kernel object with an empty in-memory compile cache, so it must
    never run on the hot path: every tuned op keeps the hinted objects made here.
    """

    def __init__(self) -> None:
        self._made: dict[tuple[int, tuple], Any] = {}
        self._keep: list[Any] = []  # keep base kernels alive so their id() stays unique

    def get(self, kernel: Any, hints: Mapping[str, Any]) -> Any:
        key = (id(kernel), tuple(sorted(hints.items())))
        k = self._made.get(key)
        if k is None:
            from tiletune.devices.prefetch_kernel import PrefetchKernel

            try:
                k = PrefetchKernel.with_hints(kernel, hints)
            except (AttributeError, TypeError):  # not a plain ct.kernel: use cuTile's own API
                k = kernel.replace_hints(**hints) if hints else kernel
            self._made[key] = k
            self._keep.append(kernel)
        return k


#: a tuning candidate whose warm-up samples took at least this long (us) is sampled in unheld batches: the host
#: enqueues a sample in 25-60 us, so such a kernel keeps the GPU ahead of it after each batch's first sample
UNHELD_FROM_US = 250.0


class CutileBackend:
    """Compiles in parallel, verifies and times cuTile kernels on the GPU; launches tuned ones."""

    name = "cutile"
    #: ``ct.launch`` reads ``__cuda_array_interface__`` objects (recipes pass views that way)
    accepts_array_interface = True
    #: ``open_session(defer_reference=True)``: a worker starts the compiles before the reference runs
    defers_reference = True

    def __init__(self, workers: int | None = None, compile_timeout_s: float | None = 300.0) -> None:
        self.torch, self.ct = _import_cutile()
        self.hinted = HintedKernels()
        self.workers = workers
        self.compile_timeout_s = compile_timeout_s
        self._raw_stream = self.torch._C._cuda_getCurrentRawStream

    @functools.lru_cache(maxsize=None)
    def device_info(self, device_index: int) -> DeviceInfo:
        p = self.torch.cuda.get_device_properties(device_index)
        return DeviceInfo(name=p.name, arch=f"sm_{p.major}{p.minor}", sm_count=int(p.multi_processor_count))

    def versions(self) -> Mapping[str, str]:
        return software_versions()

    def arg_device(self, args: Sequence[Any]) -> int:
        for a in args:
            get = getattr(a, "get_device", None)
            if get is not None:
                d = get()
                if d < 0:
                    raise ValueError("tiletune: a tensor argument is on the CPU; cuTile kernels need CUDA tensors")
                return d
        return self.torch.cuda.current_device()

    def kernel_sources(self, kernel: Any) -> str:
        fn = getattr(kernel, "_pyfunc", kernel)
        opts = getattr(kernel, "_compiler_options", None)
        return function_source(fn) + f"\n#options {opts!r}"

    def stream_capturing(self, device_index: int) -> bool:
        """Whether the current stream is being captured into a CUDA graph (tuning must not run then)."""
        return bool(self.torch.cuda.is_current_stream_capturing())

    def launch_parts(self, config: Config, kernel: Any, device_index: int) -> LaunchParts:
        # replace_hints runs here, once per (kernel, hints), never on the hot path
        return LaunchParts(self.ct.launch, self._raw_stream, self.hinted.get(kernel, config.hints), device_index)

    def compile_ahead(self, plan: Callable[..., Any], args: Sequence[Any], configs: Sequence[Config],
                      device_index: int, keep: bool = False) -> AheadCompile | None:
        """Start compiling ``configs`` (``plan(cfg, *args)`` -> a Launch or its tuple) in this process into
        cuTile's disk cache, in the background (see :class:`~tiletune.devices.compile_pool.AheadCompile`).
        None when nothing can be compiled so: cuTile's internals or its disk cache unavailable, no config
        whose plan gives a cuTile kernel. Two cores are left to the worker process starting meanwhile.
        ``keep``: configs a caller will launch (a new key's answer compiling while the op's fallback
        runs): kept in the front-end cache too."""
        from tiletune.devices import compile_pool
        from tiletune.devices.prefetch_kernel import PrefetchKernel

        ints = compile_pool._get_internals()
        if ints is None or not ints.cache_dir or not configs:
            return None
        arch = self.device_info(device_index).arch
        jobs = []
        for i, cfg in enumerate(configs):
            try:
                spec = plan(cfg, *args)
                spec = spec if isinstance(spec, Launch) else Launch(*spec)
                # a throwaway kernel object: the cubin offered to it is dropped with it (the worker
                # finds it in the disk cache); the same compiler options as the worker's hinted kernel
                kernel = PrefetchKernel.with_hints(spec.kernel, cfg.hints)
            except Exception:  # noqa: BLE001 - a plan that rejects a config fails in the session itself
                continue
            jobs.append(CompileJob(i, kernel, tuple(spec.args), arch, keep=keep))
        if not jobs:
            return None
        workers = self.workers or settings.compile_workers() or max(1, cpu_count() - 2)
        return AheadCompile(CompilePool(workers, self.compile_timeout_s), jobs)

    def is_compiled(self, plan: Callable[..., Any], args: Sequence[Any], cfg: Config, device_index: int) -> bool | None:
        """Whether the front-end cache holds ``cfg``'s kernel for these arguments (asked without running the
        front end: cuTile's disk cache, whose key is the front end's output, is left to the compile that
        follows a False): the cubin is then offered to the kernel object a launch uses. None when it cannot
        be told (a plan that fails, cuTile's internals unavailable)."""
        from tiletune.devices import compile_pool

        if compile_pool._get_internals() is None:
            return None
        try:
            spec = plan(cfg, *args)
            spec = spec if isinstance(spec, Launch) else Launch(*spec)
            kernel = self.hinted.get(spec.kernel, cfg.hints)
        except Exception:  # noqa: BLE001 - the launch itself reports a failing plan
            return None
        job = CompileJob(0, kernel, tuple(spec.args), self.device_info(device_index).arch, keep=True, if_cached=True)
        for r in CompilePool(1, self.compile_timeout_s).compile_all([job]):
            if r.skipped:
                return False
            return r.error is None or None
        return None

    def open_session(
        self,
        plan: Callable[..., Launch],
        args: tuple[Any, ...],
        *,
        device_index: int,
        writes: Sequence[int],
        inplace: Sequence[int] = (),
        reference: Callable[..., Any] | None,
        tolerance: Mapping[str, tuple[float, float]] | None,
        name: str,
        defer_reference: bool = False,
    ) -> "CutileSession":
        """``defer_reference``: the reference runs at :meth:`CutileSession.prepare` (a worker calls it once its
        compiles are under way), at the latest before the first checked launch."""
        return CutileSession(self, plan, args, device_index, writes, inplace, reference, tolerance,
                             defer_reference=defer_reference)


class CutileSession:
    """One tuning problem on one GPU (see :class:`tiletune.devices.backends.base.TuningSession`)."""

    compiles_only_cached = True

    def __init__(
        self,
        backend: CutileBackend,
        plan: Callable[..., Launch],
        args: tuple[Any, ...],
        device_index: int,
        writes: Sequence[int],
        inplace: Sequence[int],
        reference: Callable[..., Any] | None,
        tolerance: Mapping[str, tuple[float, float]] | None,
        defer_reference: bool = False,
    ) -> None:
        self.t0 = time.perf_counter()
        self.backend = backend
        self.torch = backend.torch
        self.plan = plan
        self.args = args
        self.dev = device_index
        self._devctx = self.torch.cuda.device(device_index)
        self._devctx.__enter__()
        self.guard = ArgGuard(args, writes, inplace) if (writes or inplace) else None
        self.checker = (Checker(reference, self.guard, tolerance, defer=defer_reference)
                        if self.guard is not None else None)
        self.timer = ColdL2Timer(device_index, backlog_us=settings.timer_backlog_us())
        self.pool = CompilePool(backend.workers, backend.compile_timeout_s)
        self._launchers: dict[int, Callable[[], None]] = {}
        # kernel objects of this session, with their prefetch counters when the session first met them
        # (the objects are shared by every session of the process, so the counters are cumulative)
        self._kernels: dict[int, tuple[Any, int, int]] = {}
        self._warm: set[int] = set()
        self._long: set[int] = set()  # candidates whose warm-up samples say their tuning batches need no hold
        self._race_warm: set[int] = set()
        # "parallel_compile" / "why_serial" are added by compile(): asking loads cuTile's compiler, which a
        # session answered by the front-end cache never needs
        self.stats: dict[str, Any] = {}

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    def _launcher(self, cand: Candidate) -> Callable[[], None]:
        fn = self._launchers.get(cand.order)
        if fn is None:
            spec = self.plan(cand.config, *self.args)
            kernel = self.backend.hinted.get(spec.kernel, cand.config.hints)
            self._track(kernel)
            stream = self.backend._raw_stream
            launch, dev, grid, kargs = self.backend.ct.launch, self.dev, tuple(spec.grid), tuple(spec.args)

            def fn() -> None:
                launch(stream(dev), grid, kernel, kargs)

            self._launchers[cand.order] = fn
        return fn

    def _track(self, kernel: Any) -> None:
        if id(kernel) not in self._kernels:
            hits, misses = getattr(kernel, "prefetch_hits", 0), getattr(kernel, "prefetch_misses", 0)
            self._kernels[id(kernel)] = (kernel, hits, misses)

    def compile(self, candidates: Sequence[Candidate], only_cached: Collection[int] = ()) -> Iterator[CompileOutcome]:
        keep = not settings.in_worker()  # the caller's own session (a check): it launches what it compiles
        jobs = []
        by_order = {c.order: c for c in candidates}
        for c in candidates:
            try:
                spec = self.plan(c.config, *self.args)
                kernel = self.backend.hinted.get(spec.kernel, c.config.hints)
                self._track(kernel)  # before anything of this session is offered to it
            except Exception as exc:  # a plan that rejects a config is a failed candidate
                yield CompileOutcome(c, Status.COMPILE_ERROR, 0.0, f"launch plan failed: {type(exc).__name__}: {exc}")
                continue
            jobs.append(CompileJob(c.order, kernel, tuple(spec.args), self.backend.device_info(self.dev).arch,
                                   keep=keep, if_cached=c.order in only_cached, first=c.is_baseline))
        for r in self.pool.compile_all(jobs):
            if r.skipped:  # before the stats below: asking them loads the compiler
                yield CompileOutcome(by_order[r.tag], Status.COMPILE_ERROR, r.seconds,  # type: ignore[index]
                                     "not in a compile cache (skipped)", skipped=True)
                continue
            if r.deferred or not r.cached:
                self.stats.setdefault("parallel_compile", self.pool.parallel)
                self.stats.setdefault("why_serial", self.pool.why_serial)
            c = by_order[r.tag]  # type: ignore[index]
            if r.error is None:
                yield CompileOutcome(c, Status.OK, r.seconds, cpu_s=r.cpu_s, assembled=not (r.cached or r.deferred))
            else:
                yield CompileOutcome(c, Status.TIMEOUT if r.timed_out else Status.COMPILE_ERROR, r.seconds, r.error,
                                     cpu_s=r.cpu_s)

    def _checked_launcher(self, cand: Candidate) -> Callable[[], None] | None:
        """The checked run's launch: the candidate's kernel arguments moved onto the guard's banded twins
        of the written arguments (same layout, so the same compiled kernel); None (nothing prepared) when
        there are no twins."""
        if self.guard is None or not self.guard.banded:
            return None
        spec = self.plan(cand.config, *self.args)
        kargs = self.guard.checked_kernel_args(spec.args)
        if kargs is None:
            if self.guard.band_error:  # the twins could not be made (out of memory): in place from now on
                self.stats["guard_bands_off"] = self.guard.band_error
            return None
        kernel = self.backend.hinted.get(spec.kernel, cand.config.hints)
        stream, launch, dev, grid = self.backend._raw_stream, self.backend.ct.launch, self.dev, tuple(spec.grid)

        def fn() -> None:
            launch(stream(dev), grid, kernel, kargs)

        return fn

    def prepare(self, expected: Any = None) -> None:
        """Run the deferred reference now (a no-op when it has run), or take ``expected``, its answer
        computed elsewhere."""
        if self.checker is not None:
            if expected is not None:
                self.checker.set_expected(expected)
            else:
                self.checker.prepare()

    def check(self, candidate: Candidate) -> CheckOutcome:
        self.prepare()  # before the launch: the reference reads the pristine inputs
        fn = self._launcher(candidate)
        banded = self._checked_launcher(candidate)
        if banded is not None:
            fn = banded  # the guard armed its twins
        elif self.guard is not None:
            self.guard.prepare_checked_run()
        t = time.perf_counter()
        try:
            fn()  # first launch: loads the cubin (compiles here if the pool could not)
            mark("launched")  # queued: from here a worker's watchdog counts kernel time
            self.torch.cuda.synchronize(self.dev)
            mark("ran")
        except Exception as exc:
            name = type(exc).__name__
            status = Status.COMPILE_ERROR if "Compil" in name or "TileCompiler" in name else Status.LAUNCH_ERROR
            return CheckOutcome(status, f"{name}: {exc}")
        self.stats.setdefault("first_launch_s", []).append(round(time.perf_counter() - t, 4))
        if banded is not None:
            outside = self.guard.after_checked_run()  # type: ignore[union-attr]
            if outside is not None:
                return CheckOutcome(Status.MISMATCH, outside)
        if self.checker is not None:
            reason = self.checker.compare()
            if reason is not None:
                return CheckOutcome(Status.MISMATCH, reason)
        return CheckOutcome(Status.OK)

    def race_samples(self, candidates: Sequence[Candidate], n: int) -> dict[int, list[float] | str] | None:
        """``n`` cold-L2 samples of each compiled candidate, checked or not, interleaved (one launch of each
        per round, one synchronisation in all), launched on the guard's twins of the written arguments: a
        candidate that writes past an output lands in a guard band, never in the caller's memory, and the
        caller's tensors are not written at all. ``{order: samples, or why its launch failed}``; None (nothing
        launched) when some written argument has no twin (aliased, not a torch tensor, a view that cannot be
        moved, the twins could not be made): then each candidate must pass its check before it is timed.

        No clock-raising spin first (:meth:`sample` spins 50 ms once per session): the candidates are
        interleaved, so a clock still rising weighs on all of them alike. A candidate's first call here
        launches it once untimed (its cubin loads outside the timed region). Each batch is held (the GPU
        waits on a spin kernel while the host enqueues it): without it the samples of a small kernel timed
        the host's launch as well, and the batch's first candidate more of it than the others."""
        g = self.guard
        if g is None or not g.banded or set(g.banded) != {*g.outputs, *g.inplace}:
            return None
        launch, stream, dev = self.backend.ct.launch, self.backend._raw_stream, self.dev
        fns: dict[int, Callable[[], None]] = {}
        for c in candidates:
            spec = self.plan(c.config, *self.args)
            kargs = g.checked_kernel_args(spec.args)  # arms the twins (the caller's tensors are not touched)
            if kargs is None:
                if g.band_error:
                    self.stats["guard_bands_off"] = g.band_error
                return None
            kernel = self.backend.hinted.get(spec.kernel, c.config.hints)
            self._track(kernel)
            fns[c.order] = functools.partial(_launch_on, launch, stream, dev, tuple(spec.grid), kernel, kargs)
        out: dict[int, list[float] | str] = {}
        for order, fn in list(fns.items()):
            if order in self._race_warm:
                continue
            try:
                fn()  # untimed: loads the cubin (a launch error is this candidate's alone)
                self.torch.cuda.synchronize(self.dev)
            except Exception as exc:
                out[order] = f"{Status.LAUNCH_ERROR.value}: {type(exc).__name__}: {exc}"[:300]
                del fns[order]
                continue
            self._race_warm.add(order)
        if fns and n > 0:
            orders = list(fns)
            # held: the race's launches go through cuTile's Python launch, which can outlast the memset of a
            # small kernel's sample; the GPU waits while they are enqueued, so no sample holds host time
            batch = [fns[o] for _ in range(n) for o in orders]
            try:
                got = self.timer.time_each(batch, hold=True)
                if getattr(self.timer, "hold_covered", None) is False:
                    # the host outlasted the spin (a busy host, a slow launch): the batch again, held longer (the
                    # timer has learnt the spin this host needs)
                    self.stats["race_hold_retakes"] = self.stats.get("race_hold_retakes", 0) + 1
                    got = self.timer.time_each(batch, hold=True)
            except Exception as exc:  # noqa: BLE001 - a launch that failed inside the batch: whose is unknown
                self.stats["race_batch_error"] = f"{type(exc).__name__}: {exc}"[:300]
                return None  # the race checks each config before it times it instead (a failure is then its own)
            for i, o in enumerate(orders):
                out[o] = got[i::len(orders)]
        return out

    def sample(self, candidate: Candidate, n: int) -> list[float]:
        fn = self._launcher(candidate)
        if not self._warm:
            self.timer.spin(0.05)  # clocks up before the first timed sample of the session
        if candidate.order not in self._warm:
            self._warm.add(candidate.order)
            warm = self.timer.time(fn, 2)  # warm-up samples are discarded
            self._long.update({candidate.order} if warm and min(warm) >= UNHELD_FROM_US else ())
        # held, as the race's batches are: a short kernel's sample would otherwise hold the host's launch whenever
        # the host falls behind the memset (the worker's compile threads share its interpreter while it times); a
        # long one keeps the GPU ahead of the host after a batch's first sample, and the spin would only wait
        return self.timer.time_each([fn] * n, hold=candidate.order not in self._long)

    def finish(self, winner: Candidate | None) -> None:
        self.stats["prefetch_hits"] = sum(getattr(k, "prefetch_hits", 0) - h0 for k, h0, _ in self._kernels.values())
        self.stats["prefetch_misses"] = sum(getattr(k, "prefetch_misses", 0) - m0
                                            for k, _, m0 in self._kernels.values())
        try:
            if self.guard is not None:
                self.guard.restore()
            if winner is not None:
                self._launcher(winner)()
            self.torch.cuda.synchronize(self.dev)
        finally:
            self.timer.close()
            self._launchers.clear()
            self._devctx.__exit__(None, None, None)
            if settings.in_worker():
                # the caller launches the winner next and finds its cubin in cuTile's disk cache: the
                # worker's stores (queued while candidates were timed) must be there by then
                flush_stores(30.0)


def _launch_on(launch: Any, stream: Any, dev: int, grid: tuple[int, ...], kernel: Any, kargs: tuple[Any, ...]) -> None:
    launch(stream(dev), grid, kernel, kargs)


_prewarm_started = False


def prewarm() -> None:
    """Start, once per process, a daemon thread that loads cuTile's compiler and asks ``tileiras``
    its version and bytecode level (subprocesses cuTile needs before any first launch).

    Called when a tuned op is defined, so this one-off cost overlaps with whatever the program does
    before its first call instead of landing on that call. ``TILETUNE_PREWARM=0`` turns it off.
    ``os.fork()`` waits for the thread, so no child inherits the compiler's import half done.
    """
    global _prewarm_started

    if _prewarm_started or not settings.prewarm():
        return
    _prewarm_started = True

    def work() -> None:
        try:
            warm_compiler()
        except Exception:  # best effort: the first call does this itself otherwise
            pass

    thread = threading.Thread(target=work, name="tiletune-prewarm", daemon=True)

    def before_fork() -> None:
        if thread.is_alive() and threading.current_thread() is not thread:
            thread.join(30.0)

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=before_fork)
    thread.start()


def warm_compiler() -> None:
    """Load cuTile's compiler and ask ``tileiras`` its version and bytecode level now, in this thread
    (cuTile keeps both answers for the life of the process, and a process forked after this inherits
    them); the toolchain's versions are recorded beside cuTile's cache (:func:`software_versions`)."""
    from cuda.tile import _compile as comp
    from cuda.tile._cext import default_tile_context

    software_versions()
    comp._get_max_supported_bytecode_version(default_tile_context.config.temp_dir)


_versions_lock = threading.Lock()


def software_versions() -> dict[str, str]:
    """Versions of cuda-tile, the tileiras assembler and the NVIDIA driver (``"unknown"`` if unreadable).

    The first two are read once per toolchain and recorded next to cuTile's cache
    (:func:`tiletune.devices.frontend_cache.stored_toolchain_versions`): asking ``tileiras`` imports cuTile's
    compiler and starts a subprocess, which a process served from the caches would not otherwise pay.
    Read once per process: a thread that asks while another reads them (the prewarm thread and a first
    miss) waits for that answer instead of reading them again."""
    with _versions_lock:
        return _software_versions()


@functools.lru_cache(maxsize=1)
def _software_versions() -> dict[str, str]:
    from tiletune.devices import frontend_cache

    try:
        known = frontend_cache.stored_toolchain_versions()
    except Exception:  # noqa: BLE001 - the record is an optimisation: read the versions instead
        known = None
    if known is not None:
        return {**known, "driver": driver_version()}
    out = {"cuda_tile": "unknown", "tileiras": "unknown", "driver": "unknown"}
    try:
        import cuda.tile as ct

        out["cuda_tile"] = str(ct.__version__)
    except Exception:
        pass
    try:
        from cuda.tile._compile import _get_compiler_version_string

        v = _get_compiler_version_string()
        if v:
            import re

            m = re.search(r"V(\d+\.\d+\.\d+)", v)
            out["tileiras"] = m.group(1) if m else v.strip().splitlines()[-1].strip()
    except Exception:
        pass
    out["driver"] = driver_version()
    try:
        frontend_cache.store_toolchain_versions(out)
    except Exception:  # noqa: BLE001 - best effort
        pass
    return out


software_versions.cache_clear = _software_versions.cache_clear  # type: ignore[attr-defined]


def driver_version() -> str:
    """The NVIDIA kernel driver's version (e.g. ``580.159.04``), read without starting any process."""
    import re

    try:
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)", f.read())
        if m:
            return m.group(1)
    except OSError:
        pass
    try:
        from cuda.tile._cext import get_driver_version

        return "cuda " + ".".join(str(x) for x in get_driver_version())
    except Exception:
        return "unknown"
