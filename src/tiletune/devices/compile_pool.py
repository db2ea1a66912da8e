"""Parallel compilation of cuTile candidates on every CPU core.

cuTile compiles under one process-wide lock that is held while its TileIR assembler (``tileiras``,
a subprocess, ~0.3-1 s per matmul config) runs, so threads in one process compile serially. The
assembler step itself needs no lock. This pool therefore splits compilation:

1. a producer thread turns each candidate into TileIR bytecode with cuTile's own front end
   (under cuTile's lock; tens of milliseconds each) and computes the signature cuTile's launcher
   will ask for,
2. up to ``workers`` threads run ``tileiras`` on that bytecode concurrently (subprocesses, so the GIL
   is free),
3. each cubin is handed to the candidate's :class:`~tiletune.devices.prefetch_kernel.PrefetchKernel`, which
   answers cuTile's first-launch compile request with it (no second front-end run), and one background
   writer thread stores it in cuTile's on-disk cache under cuTile's own key (and, for a job whose cubin
   a caller will launch, in :mod:`tiletune.devices.frontend_cache`), so later processes load it without
   compiling; nobody waits for those stores,
4. candidates are yielded as they finish, so the GPU measures while the rest compile.

An assembly claims its cubin's key beside cuTile's disk cache first (a marker file, see
:func:`_claim`): a process that meets a key another live process is assembling (the caller compiling
ahead while its worker starts; ranks of one job missing on the same kernels) waits for that cubin to be
stored instead of running ``tileiras`` on it again, and assembles it itself only when the other gives up.

Before any of that, a job the front-end cache answers (compiled by an earlier process) is handed its
cubin at once: no front end, and no import of cuTile's compiler when every job is answered so.

No worker process imports torch or initialises CUDA. If the installed cuda-tile lacks the internals
used here, the pool reports ``parallel=False`` and yields candidates at once: cuTile then compiles
each at its first launch (serially), which is slower but correct.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import heapq
import itertools
import json
import os
import queue
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Hashable, Iterator, Sequence


_compiling = 0  # compiles running on a launch path in this process (see compiling())
_compiling_lock = threading.Lock()


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """Mark a compile that runs on a launch path (a candidate's first launch compiling it again).

    A tuning worker sends heartbeats while one runs, so the caller's watchdog does not count compile
    time as kernel time (:func:`compiling_now`)."""
    global _compiling
    with _compiling_lock:
        _compiling += 1
    try:
        yield
    finally:
        with _compiling_lock:
            _compiling -= 1


def compiling_now() -> bool:
    """Whether a compile marked with :func:`compiling` is running in this process."""
    return _compiling > 0


def cpu_count() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class CompileJob:
    """One kernel object (a PrefetchKernel, hints applied) to compile for the given launch arguments."""

    tag: Hashable
    kernel: Any
    args: tuple[Any, ...]
    arch: str  # "sm_90"
    #: a caller will launch this cubin (not a tuning worker's candidate): keep it in the front-end cache
    #: for later processes (a candidate's entry goes to the candidates' folder, evicted on its own)
    keep: bool = False
    #: compile only what the front-end cache holds; otherwise skipped: no front end (a few tenths of a second
    #: of Python per kernel, the cost a raced config or an "is it compiled?" question must not pay on a call's
    #: path), no ``tileiras``. cuTile's disk cache is not asked: its key is the front end's output
    if_cached: bool = False
    #: compile before the others (the session's baseline, checked first: its time sets the watchdog's deadlines)
    first: bool = False


@dataclass(frozen=True)
class CompileResult:
    """Outcome of a job: ``error`` is None on success; ``timed_out`` marks assembler time-outs."""

    tag: Hashable
    seconds: float
    error: str | None = None
    timed_out: bool = False
    cached: bool = False  # the cubin was already in cuTile's disk cache
    deferred: bool = False  # nothing was compiled ahead; the first launch will compile
    #: CPU seconds: the front end's (thread CPU time) plus the assembler's run time (tileiras is one
    #: single-threaded, CPU-bound subprocess per job, so its wall time stands for its CPU time)
    cpu_s: float | None = None
    skipped: bool = False  # an ``if_cached`` job no cache answered: nothing was compiled


class _Internals:
    """The cuda-tile internals the pool relies on, looked up once (None when unavailable).

    The launch signature and the context are cheap (``cuda.tile`` has them loaded); the compiler
    (``cuda.tile._compile``, a few tenths of a second to import, and ``tileiras``' version, a
    subprocess) is loaded on first use only: a pool whose jobs are all answered by the front-end
    cache (:mod:`tiletune.devices.frontend_cache`) never loads it."""

    def __init__(self) -> None:
        from cuda.tile._cext import default_tile_context
        from cuda.tile.compilation import CallingConvention, KernelSignature

        self.context = default_tile_context
        self.KernelSignature = KernelSignature
        self.convention = CallingConvention.cutile_python_v1()
        v2 = getattr(CallingConvention, "cutile_python_v2", None)
        self.convention_v2 = v2() if v2 is not None else None
        self._compiler: tuple[Any, Any, str | None] | None = None
        self._compiler_error: str | None = None
        self._lock = threading.Lock()

    def _load_compiler(self) -> tuple[Any, Any, str | None] | None:
        with self._lock:
            if self._compiler is None and self._compiler_error is None:
                try:
                    from cuda.tile import _compile as comp
                    from cutile_cache import _cache as cache

                    for name in ("compile_tile", "compile_cubin", "_tileiras_effective_opt_and_device_debug"):
                        if not hasattr(comp, name):
                            raise AttributeError(name)
                    for name in ("cache_key", "cache_lookup", "cache_store", "MetadataV1"):
                        if not hasattr(cache, name):
                            raise AttributeError(name)
                    self._compiler = (comp, cache, comp._get_compiler_version_string())
                except Exception as exc:  # pragma: no cover - depends on the installed cuda-tile
                    self._compiler_error = f"{type(exc).__name__}: {exc}"
            return self._compiler

    @property
    def comp(self) -> Any:
        got = self._load_compiler()
        return got[0] if got else None

    @property
    def cache(self) -> Any:
        got = self._load_compiler()
        return got[1] if got else None

    @property
    def compiler_version(self) -> str | None:
        got = self._load_compiler()
        return got[2] if got else None

    @property
    def compiler_error(self) -> str | None:
        self._load_compiler()
        return self._compiler_error

    @property
    def cache_dir(self) -> str | None:
        return self.context.config.cache_dir


_internals: _Internals | None = None
_internals_error: str | None = None


#: Niceness the compile threads take over the process's own (Linux: per thread, and inherited by the
#: ``tileiras`` and front-end processes they start): when compiles fill every core, the checks, the
#: timing and the replies the watchdog waits for still run at once.
COMPILE_NICE = 5


def lower_priority() -> None:
    """Run the calling thread (and the processes it starts) at :data:`COMPILE_NICE` over the process."""
    try:
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())  # the main thread's
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, base + COMPILE_NICE))
    except (AttributeError, OSError):  # not Linux, or not allowed: compiles keep the process's priority
        pass


def load_internals() -> bool:
    """Load the cuda-tile internals the pool uses (once per process; True when they are available).

    A tuning worker calls it in the background when it starts, so the first compile of a session
    there (a spare taking over after a fault) does not pay for loading them: cuTile's compiler included."""
    ints = _get_internals()
    return ints is not None and ints.compiler_version is not None


def _get_internals() -> _Internals | None:
    global _internals, _internals_error
    if _internals is None and _internals_error is None:
        try:
            _internals = _Internals()
        except Exception as exc:  # pragma: no cover - depends on the installed cuda-tile
            _internals_error = f"{type(exc).__name__}: {exc}"
    return _internals


# ------------------------------------------------------------------------------- background writes
class _Writer:
    """One daemon thread that stores compiled cubins (cuTile's disk cache: a SQLite file that
    serialises writers; the front-end cache's files) off the compiling caller's path.

    A store is an optimisation for later processes, so nobody waits for it: :func:`flush` waits for
    what was queued (tests, tools; and at interpreter exit, bounded by ``timeout``)."""

    def __init__(self) -> None:
        self._q: "queue.Queue[Any]" = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)

    def submit(self, fn: Any) -> None:
        with self._lock:
            self._pending += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tiletune-cache-writer", daemon=True)
                self._thread.start()
        self._q.put(fn)

    def _run(self) -> None:
        while True:
            batch = [self._q.get()]
            while True:  # what queued meanwhile goes in the same batch (one disk-cache transaction)
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            try:
                disk = [fn.args for fn in batch if getattr(fn, "func", None) is _store_disk]
                calls = [fn for fn in batch if getattr(fn, "func", None) is not _store_disk]
                if disk:
                    _quietly(_store_disk_batch, disk)
                for fn in calls:  # each on its own: a claim is released even where its store failed
                    _quietly(fn)
            finally:
                with self._lock:
                    self._pending -= len(batch)
                    if self._pending == 0:
                        self._idle.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued store ran; False when ``timeout`` passed first."""
        with self._lock:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)


def _quietly(fn: Any, *args: Any) -> None:
    """Run a store (or a claim's release) of the writer: a failure only costs a later compile."""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001
        import logging

        logging.getLogger("tiletune").debug("tiletune: a compiled cubin was not stored (%s: %s)",
                                            type(exc).__name__, exc)


_writer = _Writer()


def flush(timeout: float | None = None) -> bool:
    """Wait for the cubins queued for the disk caches to be stored; False if ``timeout`` passed first."""
    return _writer.flush(timeout)


atexit.register(flush, 30.0)


#: front ends needed at once from which they run in forked processes (fewer: in this process)
FORK_MIN = 3
#: seconds without any front end delivered after which the forked children are given up (their configs
#: then run in-process): a front end takes well under a second; a child stuck on an inherited lock, forever
FORK_SILENCE_S = 20.0


class _FrontEndError(Exception):
    """A front end that failed in a forked process: its message, as the child described it."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "front end failed"


class CompilePool:
    """Compiles jobs ahead of their first launch, ``workers`` assembler processes at a time."""

    def __init__(self, workers: int | None = None, timeout_s: float | None = 300.0,
                 fork_front_ends: bool | None = None) -> None:
        from tiletune import settings

        self.workers = workers or settings.compile_workers() or cpu_count()
        self.timeout_s = timeout_s
        #: run front ends in forked processes: None (default) only with cuTile's real internals
        self.fork_front_ends = fork_front_ends
        #: ``TILETUNE_COMPILE_TRACE``: JSON lines, one per job that ran a front end (:meth:`_trace`)
        self.trace_path = settings.compile_trace()

    @property
    def parallel(self) -> bool:
        """Whether jobs the front-end cache does not answer are compiled ahead (loads the compiler)."""
        ints = _get_internals()
        return ints is not None and ints.compiler_version is not None

    @property
    def why_serial(self) -> str:
        ints = _get_internals()
        if ints is None:
            return _internals_error or "cuda-tile's internals are unavailable"
        if ints.compiler_version is None:
            return ints.compiler_error or "tileiras' version is unknown"
        return ""

    def compile_all(self, jobs: Sequence[CompileJob], stop: threading.Event | None = None) -> Iterator[CompileResult]:
        """Yield one result per job, in completion order.

        ``stop``: once set, jobs whose front end or assembler has not started yet are not compiled
        (their results are ``deferred``); those already running finish."""
        if _get_internals() is None or not all(hasattr(j.kernel, "offer") for j in jobs):
            for job in jobs:
                yield CompileResult(job.tag, 0.0, skipped=True) if job.if_cached else \
                    CompileResult(job.tag, 0.0, deferred=True)
            return
        results: "queue.Queue[CompileResult]" = queue.Queue()
        executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="tiletune-tileiras",
                                      initializer=lower_priority)

        def produce() -> None:
            lower_priority()
            self._produce(jobs, executor, results, stop)

        producer = threading.Thread(target=produce, name="tiletune-bytecode", daemon=True)
        producer.start()
        try:
            for _ in range(len(jobs)):
                yield results.get()
        finally:
            producer.join()
            executor.shutdown(wait=True, cancel_futures=True)

    # -- internals -------------------------------------------------------------------------
    def _produce(
        self,
        jobs: Sequence[CompileJob],
        executor: ThreadPoolExecutor,
        out: "queue.Queue[CompileResult]",
        stop: threading.Event | None = None,
    ) -> None:
        from tiletune.devices import timeline

        ints = _get_internals()
        assert ints is not None
        timeline.mark("pool_start", jobs=len(jobs))
        fronts: list[tuple[CompileJob, Any, Any, float, float]] = []  # jobs whose front end must run
        for job in jobs:
            if stop is not None and stop.is_set():
                out.put(CompileResult(job.tag, 0.0, deferred=True))
                continue
            t0 = time.perf_counter()
            c0 = time.thread_time()
            try:
                sig = launch_signature(ints, job.kernel, job.args)
                entry = _frontend_ticket(ints, job, sig)
                hit = entry.load() if entry is not None else None
                if hit is None:  # a tuning candidate's entry (this or an earlier session compiled it)
                    spare = _frontend_ticket(ints, job, sig, candidates=True)
                    hit = spare.load() if spare is not None else None
                    if not job.keep:
                        entry = spare  # where a candidate's compile is recorded
            except Exception:  # noqa: BLE001 - arguments cuTile cannot sign: the front end names the problem below
                sig = entry = hit = None
            if hit is not None:  # compiled by an earlier process: no front end, no compiler import
                job.kernel.offer(sig, hit[0], job.arch)
                out.put(CompileResult(job.tag, time.perf_counter() - t0, cached=True, cpu_s=time.thread_time() - c0))
                continue
            if job.if_cached:  # only the front-end cache answers it: the front end would cost more than it saves
                out.put(CompileResult(job.tag, time.perf_counter() - t0, skipped=True))
                continue
            if not self.parallel:
                out.put(CompileResult(job.tag, 0.0, skipped=job.if_cached, deferred=not job.if_cached))
                continue
            fronts.append((job, sig, entry, t0, time.thread_time() - c0))
        timeline.mark("fronts_ready", fronts=len(fronts))
        largest = _largest_first()
        if largest:  # the slowest compiles start first rather than make the session's tail
            fronts.sort(key=lambda f: (not f[0].first, -tile_volume(f[0])))
        # jobs waiting for an assembler: (not first, claimed elsewhere, -tile volume, -bytecode size, seq,
        # _assemble's arguments)
        waiting: list[tuple[bool, bool, int, int, int, tuple[Any, ...]]] = []
        waiting_lock = threading.Lock()
        seq = itertools.count()

        def assemble_biggest() -> None:  # one per submitted job: the biggest one waiting goes first
            with waiting_lock:
                a = heapq.heappop(waiting)[-1]
            self._assemble(*a)

        for (job, sig, entry, t0, cpu), got in self._front_ends(ints, fronts, stop):
            if got is None:  # stopped before its front end ran
                out.put(CompileResult(job.tag, time.perf_counter() - t0, deferred=True, cpu_s=cpu))
                continue
            if isinstance(got, BaseException):  # front-end errors: bad tile shapes, type errors, ...
                out.put(CompileResult(job.tag, time.perf_counter() - t0, cpu_s=cpu,
                                      error=str(got) if isinstance(got, _FrontEndError) else _describe(got)))
                continue
            sig, key, bytecode, front_at = got
            cubin = _lookup_disk(ints, key) if ints.cache_dir else None
            if cubin is not None:
                _hand_over_cached(job, sig, key, cubin, entry, t0, cpu, out)
                continue
            a = (ints, job, sig, key, bytecode, t0, out, cpu, entry, stop, (*front_at, time.time()))
            if largest:
                # what another process is assembling goes after the rest: its cubin may be stored meanwhile
                later = _claimed_elsewhere(ints, key, float(self.timeout_s or CLAIM_MAX_S))
                with waiting_lock:
                    heapq.heappush(waiting, (not job.first, later, -tile_volume(job), -len(bytecode), next(seq), a))
                executor.submit(assemble_biggest)
            else:
                executor.submit(self._assemble, *a)

    def _front_ends(self, ints: _Internals, fronts: list[tuple[CompileJob, Any, Any, float, float]],
                    stop: threading.Event | None) -> Iterator[tuple[tuple[CompileJob, Any, Any, float, float], Any]]:
        """Run the front end of each of ``fronts``: ``(front, (sig, key, bytecode) | the exception | None when
        stopped)`` in completion order, the CPU time of the front end added to the front's ``cpu``. Several
        run in forked processes (:mod:`tiletune.devices.forked`) when :meth:`_forks` allows; whatever a child
        did not deliver runs here."""
        from tiletune.devices import forked

        rest = list(range(len(fronts)))
        procs = self._forks(ints, fronts)
        if procs > 1:
            # children get the jobs whose signature this process already knows (it names the cubin);
            # the rest, and whatever a child does not deliver, run here
            signed = [i for i in rest if fronts[i][1] is not None]

            def compute(k: int) -> tuple[str, bytes, tuple[int, float, float]]:
                i = signed[k]
                t = time.time()
                _, key, bytecode = self._bytecode(ints, fronts[i][0], fronts[i][1])
                return key, bytecode, (os.getpid(), t, time.time())

            rest = [i for i in rest if fronts[i][1] is None]
            for d in forked.run_forked(len(signed), compute, procs, timeout_s=FORK_SILENCE_S, stop=stop):
                i = signed[d.index]
                job, sig, entry, t0, cpu = fronts[i]
                front = (job, sig, entry, t0, cpu + d.cpu_s)
                if d.ok is None:
                    rest.append(i)
                elif d.ok:
                    yield front, (sig, *d.value)
                else:
                    yield front, _FrontEndError(d.value)
        for i in rest:
            front = fronts[i]
            if stop is not None and stop.is_set():
                yield front, None
                continue
            c0 = time.thread_time()
            t = time.time()
            try:
                got: Any = (*self._bytecode(ints, front[0], front[1]), (os.getpid(), t, time.time()))
            except Exception as exc:  # noqa: BLE001 - reported as this job's compile error
                got = exc
            job, sig, entry, t0, cpu = front
            yield (job, sig, entry, t0, cpu + time.thread_time() - c0), got

    def _forks(self, ints: Any, fronts: Sequence[Any]) -> int:
        """Processes for the front ends of ``fronts``: 1 (in-process) for fewer than :data:`FORK_MIN`, outside
        a tuning worker process and for stand-ins of cuTile's internals (unless :attr:`fork_front_ends` says
        otherwise), and where ``TILETUNE_FRONTEND_PROCS=1``; else up to that many (default:
        :attr:`workers`). Only a worker forks by default: the caller's process runs other threads (a model's,
        other ops' background compiles) whose locks a child could inherit held."""
        from tiletune import settings
        from tiletune.devices import forked

        wanted = settings.frontend_procs()
        fork = self.fork_front_ends if self.fork_front_ends is not None else (
            isinstance(ints, _Internals) and settings.in_worker())
        if not fork or len(fronts) < FORK_MIN or not forked.available() or wanted == 1:
            return 1
        return max(1, min(wanted or self.workers, len(fronts)))

    def _bytecode(self, ints: _Internals, job: CompileJob, sig: Any = None) -> tuple[Any, str, bytes]:
        kernel = job.kernel
        if sig is None:
            sig = launch_signature(ints, kernel, job.args)
        res = ints.comp.compile_tile(
            kernel._annotated_function,
            [sig],
            sm_arch=job.arch,
            compiler_options=kernel._compiler_options,
            context=ints.context,
            return_bytecode=True,
            return_cubin=False,
        )
        bytecode = bytes(res.bytecode)
        opt, debug = ints.comp._tileiras_effective_opt_and_device_debug(kernel._compiler_options, job.arch)
        key = ints.cache.cache_key(ints.compiler_version, job.arch, opt, bytecode, debug)
        return sig, key, bytecode

    def _trace(self, job: CompileJob, front_at: tuple[int, float, float, float], asm_start: float,
               asm_end: float, size: int) -> None:
        """Append one job's timeline (wall-clock seconds) to :attr:`trace_path`: ``front`` where its front end
        ran (pid, start, end), ``queued`` when its bytecode reached the assemblers, ``asm`` when its
        ``tileiras`` ran. Diagnostics: a file that cannot be written is left alone."""
        pid, f0, f1, queued = front_at
        from tiletune.devices import timeline

        timeline.append(self.trace_path, {  # type: ignore[arg-type]
            "tag": repr(job.tag), "front_pid": pid, "front": [f0, f1], "queued": queued, "asm": [asm_start, asm_end],
            "asm_thread": threading.current_thread().name, "bytecode": size, "pool_pid": os.getpid()})

    def _assemble(
        self,
        ints: _Internals,
        job: CompileJob,
        sig: Any,
        key: str,
        bytecode: bytes,
        t0: float,
        out: "queue.Queue[CompileResult]",
        front_cpu: float = 0.0,
        entry: Any = None,
        stop: threading.Event | None = None,
        front_at: tuple[int, float, float, float] | None = None,
    ) -> None:
        if stop is not None and stop.is_set():  # queued, not started: left to whoever compiles it next
            out.put(CompileResult(job.tag, time.perf_counter() - t0, deferred=True, cpu_s=front_cpu))
            return
        limit = float(self.timeout_s or CLAIM_MAX_S)
        claim, elsewhere = _claim(ints, key, limit)
        if elsewhere:  # another live process assembles this very cubin: take it from the disk cache when stored
            cubin = _await_claimed(ints, key, limit)
            if cubin is not None:
                _hand_over_cached(job, sig, key, cubin, entry, t0, front_cpu, out)
                return
            claim, _ = _claim(ints, key, limit)  # the other gave up: assemble it here
        released = False
        t_asm = time.perf_counter()
        try:
            tmp_dir = ints.context.config.temp_dir
            with tempfile.TemporaryDirectory(dir=tmp_dir, prefix="tiletune-") as d:
                src = Path(d) / "kernel.bytecode"
                src.write_bytes(bytecode)
                t_asm = time.perf_counter()
                asm_at = time.time()
                cubin_path = ints.comp.compile_cubin(
                    str(src), job.kernel._compiler_options, job.arch, timeout_sec=self.timeout_s
                )
                asm_s = time.perf_counter() - t_asm
                cubin = Path(cubin_path).read_bytes()
            if self.trace_path and front_at is not None:
                self._trace(job, front_at, asm_at, asm_at + asm_s, len(bytecode))
            job.kernel.offer(sig, cubin, job.arch)
            if ints.cache_dir:
                _writer.submit(functools.partial(_store_disk, ints, key, cubin, asm_s))
            if claim is not None:  # after the store (one writer, in order): a waiting process then finds the cubin
                _writer.submit(functools.partial(_release, claim))
                released = True
            if entry is not None:  # after the disk store (one writer, in order): a record of cuTile's key
                _writer.submit(functools.partial(entry.save, cubin, sig.symbol, key if ints.cache_dir else None))
            out.put(CompileResult(job.tag, time.perf_counter() - t0, cpu_s=front_cpu + asm_s))
        except Exception as exc:
            timed_out = "timeout" in type(exc).__name__.lower() or "exceeded timeout" in str(exc)
            out.put(CompileResult(job.tag, time.perf_counter() - t0, error=_describe(exc), timed_out=timed_out,
                                  cpu_s=front_cpu + time.perf_counter() - t_asm))
        finally:
            if claim is not None and not released:
                _release(claim)


class AheadCompile:
    """Jobs compiled on a background thread into cuTile's disk cache, while something else goes on.

    A tuning session whose worker process is still starting (importing torch, creating its CUDA
    context: seconds) has the caller compile its candidates meanwhile; the worker's own compile of
    each then runs the front end, finds the cubin in the disk cache and runs no assembler.
    :meth:`finish` stops what has not started (the worker compiles it, pipelined with its checks),
    waits for what is running and for the disk-cache stores, and returns the figures."""

    def __init__(self, pool: CompilePool, jobs: Sequence[CompileJob]) -> None:
        self.jobs = len(jobs)
        self.compiled = self.cached = self.errors = self.stopped = 0
        self.cpu_s = 0.0
        self.t0 = time.perf_counter()
        self.wall_s: float | None = None
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(pool, list(jobs)), name="tiletune-compile-ahead",
                                        daemon=True)
        self._thread.start()

    def _run(self, pool: CompilePool, jobs: list[CompileJob]) -> None:
        try:
            for r in pool.compile_all(jobs, stop=self._stop):
                self.cpu_s += float(r.cpu_s or 0.0)
                if r.deferred:
                    self.stopped += 1
                elif r.error is not None:
                    self.errors += 1
                elif r.cached:
                    self.cached += 1
                else:
                    self.compiled += 1
        except Exception as exc:  # noqa: BLE001 - compiling ahead is an optimisation: the worker compiles
            import logging

            logging.getLogger("tiletune").debug("tiletune: compiling ahead failed (%s: %s)", type(exc).__name__, exc)
        finally:
            flush(60.0)  # done means stored: a lookup right after finds the cubins in the caches
            self.wall_s = time.perf_counter() - self.t0
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait (up to ``timeout``) for every job and for its disk-cache store; True when all are done."""
        t = time.perf_counter()
        if not self._done.wait(timeout):
            return False
        return flush(None if timeout is None else max(0.0, timeout - (time.perf_counter() - t)))

    def stop(self) -> None:
        """Start no more jobs (those running finish; their cubins are claimed, so a process compiling the
        same candidates waits for them instead of assembling them again)."""
        self._stop.set()

    def finish(self, timeout: float = 10.0) -> dict[str, float]:
        """Stop starting jobs, wait (up to ``timeout``) for those running and for their disk-cache stores;
        return ``ahead_*`` figures (jobs, compiled, cached, errors, stopped, cpu_s, wall_s, wait_s)."""
        t = time.perf_counter()
        self._stop.set()
        self._done.wait(timeout)
        flush(max(0.0, timeout - (time.perf_counter() - t)))
        return {
            "ahead_jobs": self.jobs, "ahead_compiled": self.compiled, "ahead_cached": self.cached,
            "ahead_errors": self.errors, "ahead_stopped": self.stopped, "ahead_cpu_s": round(self.cpu_s, 4),
            "ahead_wall_s": round(self.wall_s if self.wall_s is not None else time.perf_counter() - self.t0, 4),
            "ahead_wait_s": round(time.perf_counter() - t, 4),
        }


def compile_signature(kernel: Any, signature: Any, context: Any, arch: str) -> tuple[bytes, str, str | None] | None:
    """``(cubin, symbol, key)`` of ``kernel`` compiled for ``signature`` on a launch path, the way the pool
    compiles (front end, cuTile's disk cache, ``tileiras``), except that the cubin is stored in the disk
    cache in the background instead of before the launch; ``key`` is the cubin's key in cuTile's disk cache
    (None without one). None when the pool cannot (another cuTile context, internals unavailable): the
    caller then takes cuTile's own path."""
    ints = _get_internals()
    if ints is None or context is not ints.context or not hasattr(kernel, "_annotated_function"):
        return None
    comp, cache = ints.comp, ints.cache
    if comp is None or cache is None or ints.compiler_version is None:
        return None
    res = comp.compile_tile(kernel._annotated_function, [signature], sm_arch=arch,
                            compiler_options=kernel._compiler_options, context=ints.context, return_bytecode=True,
                            return_cubin=False)
    if tuple(getattr(res, "library_lifecycle_providers", ()) or ()):
        return None  # a kernel with library providers: cuTile's path hands them to the launcher
    sigs = getattr(res, "kernel_signatures", None)
    symbol = sigs[0].symbol if sigs else signature.symbol
    bytecode = bytes(res.bytecode)
    opt, debug = comp._tileiras_effective_opt_and_device_debug(kernel._compiler_options, arch)
    key = cache.cache_key(ints.compiler_version, arch, opt, bytecode, debug)
    cubin = _lookup_disk(ints, key) if ints.cache_dir else None
    if cubin is None:
        with tempfile.TemporaryDirectory(dir=ints.context.config.temp_dir, prefix="tiletune-") as d:
            src = Path(d) / "kernel.bytecode"
            src.write_bytes(bytecode)
            t_asm = time.perf_counter()
            cubin_path = comp.compile_cubin(str(src), kernel._compiler_options, arch, timeout_sec=None)
            asm_s = time.perf_counter() - t_asm
            cubin = Path(cubin_path).read_bytes()
        if ints.cache_dir:
            _writer.submit(functools.partial(_store_disk, ints, key, cubin, asm_s))
    return cubin, symbol, key if ints.cache_dir else None


def tile_volume(job: CompileJob) -> int:
    """How big a job's tiles are, for ordering only: the product of its integer launch arguments (a cuTile
    kernel's tile sizes are integer constants; the dimensions that every config of a session shares scale
    every job alike). Bigger tiles unroll into more code for the assembler."""
    v = 1
    for a in job.args:
        if isinstance(a, int) and not isinstance(a, bool):
            v *= max(1, abs(a))
    return v


def _largest_first() -> bool:
    from tiletune import settings

    try:
        return settings.compile_order() == "largest"
    except ValueError:  # an invalid TILETUNE_COMPILE_ORDER (settings reports it): the default
        return True


def _store_disk_batch(items: list[tuple[Any, ...]]) -> None:
    """Store ``[(ints, key, cubin, asm_s), ...]`` in cuTile's disk cache in one connection and transaction
    (each ``cache_store`` opens the database and re-runs its schema statements: a few fsyncs each)."""
    ints = items[0][0]
    connect = getattr(ints.cache, "_connect", None)
    if connect is None or len({i[0].cache_dir for i in items}) != 1:
        for it in items:
            _store_disk(*it)
        return
    import json as _json

    conn = connect(ints.cache_dir)
    try:
        for _, key, cubin, asm_s in items:
            meta = _metadata(ints, asm_s)
            conn.execute("INSERT OR IGNORE INTO cache (key, blob, blob_size, atime, metadata) VALUES (?, ?, ?, ?, ?)",
                         (key, cubin, len(cubin), time.time(), _json.dumps(meta, sort_keys=True)))
        conn.commit()
    finally:
        conn.close()


def _metadata(ints: _Internals, asm_s: float) -> dict:
    return ints.cache.MetadataV1(
        kernel_names=[],
        compiler_version=(ints.compiler_version or "").strip(),
        compilation_timestamp=time.time(),
        compilation_time_seconds=asm_s,
        remarks="",
    ).to_dict()


def _lookup_disk(ints: _Internals, key: str) -> bytes | None:
    """The cubin cuTile's disk cache holds under ``key``, read without cuTile's per-call schema statements
    and access-time update (a read, no write lock); cuTile's own lookup when its file cannot be read so."""
    if not hasattr(ints.cache, "_connect"):  # not the SQLite layout read below: cuTile's lookup
        return ints.cache.cache_lookup(ints.cache_dir, key)
    import sqlite3

    from tiletune.devices.frontend_cache import read_cutile_cache

    try:
        return read_cutile_cache(ints.cache_dir, key)
    except sqlite3.Error:
        return ints.cache.cache_lookup(ints.cache_dir, key)


def _hand_over_cached(job: CompileJob, sig: Any, key: str, cubin: bytes, entry: Any, t0: float, cpu_s: float,
                      out: "queue.Queue[CompileResult]") -> None:
    """A cubin cuTile's disk cache holds for ``job``: offered to its kernel, recorded in the front-end cache
    (``entry``), reported as cached."""
    job.kernel.offer(sig, cubin, job.arch)
    if entry is not None:
        _writer.submit(functools.partial(entry.save, cubin, sig.symbol, key))
    out.put(CompileResult(job.tag, time.perf_counter() - t0, cached=True, cpu_s=cpu_s))


#: How long a claim on an assembly holds at most (and so how long another process waits for it) when the
#: pool has no assembler limit of its own; a claim older than its holder's limit is stale.
CLAIM_MAX_S = 300.0
#: How often a process waiting for another's assembly looks for the cubin in the disk cache.
CLAIM_POLL_S = 0.02
CLAIMS_DIR = "tiletune-assembling"


def _claim(ints: Any, key: str, limit_s: float) -> tuple[Path | None, bool]:
    """Claim the assembly of ``key``'s cubin for this process: ``(marker, False)`` when this process may
    assemble it (``marker`` None where no claim can be made: no disk cache, a folder this process cannot
    write), ``(None, True)`` when another live process holds a fresh claim on it (see :func:`_claim_live`).

    The marker is a file named after the key in ``CLAIMS_DIR`` beside cuTile's disk cache, created
    exclusively, holding the claimer's pid; :func:`_release` removes it once the cubin is stored. A
    marker whose process is gone or which is older than ``limit_s`` is taken over."""
    if not ints.cache_dir:
        return None, False
    path = _claim_path(ints, key)
    folder = path.parent
    for _ in range(2):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _claim_live(path, limit_s):
                return None, True
            with contextlib.suppress(OSError):
                path.unlink()  # stale: its process is gone, or it is older than any assembly may take
            continue
        except OSError:
            return None, False
        try:
            os.write(fd, f"{os.getpid()} {threading.get_ident()}".encode())
        finally:
            os.close(fd)
        return path, False
    return None, False  # taken over by a third process meanwhile: assemble without a claim


def _claim_live(path: Path, limit_s: float) -> bool:
    """Whether the claim ``path`` is held: the file exists, is younger than ``limit_s`` and names a process
    that runs (a marker still being written counts as held)."""
    try:
        text = path.read_text()
        age = time.time() - path.stat().st_mtime
    except OSError:
        return False
    if age > limit_s:
        return False
    try:
        pid = int(text.split()[0])
    except (ValueError, IndexError):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it runs
        return True
    return True


def _claim_path(ints: Any, key: str) -> Path:
    return Path(ints.cache_dir) / CLAIMS_DIR / hashlib.sha256(key.encode()).hexdigest()[:40]


def _claimed_elsewhere(ints: Any, key: str, limit_s: float) -> bool:
    """Whether a live claim on ``key`` exists (this process holds none before it assembles)."""
    return bool(ints.cache_dir) and _claim_live(_claim_path(ints, key), limit_s)


def _await_claimed(ints: Any, key: str, limit_s: float) -> bytes | None:
    """Wait (up to ``limit_s``) for the cubin another process claimed to reach the disk cache: the cubin,
    or None when its claim ends without it (that process failed or gave up) or the wait runs out."""
    path = _claim_path(ints, key)
    deadline = time.monotonic() + limit_s
    while True:
        cubin = _lookup_disk(ints, key)
        if cubin is not None:
            return cubin
        if not _claim_live(path, limit_s):
            return _lookup_disk(ints, key)  # released just now: stored, or given up
        if time.monotonic() >= deadline:
            return None
        time.sleep(CLAIM_POLL_S)


def _release(path: Path) -> None:
    """End a claim of :func:`_claim` (its cubin is stored, or its assembly failed)."""
    with contextlib.suppress(OSError):
        path.unlink()


def _store_disk(ints: _Internals, key: str, cubin: bytes, asm_s: float) -> None:
    """Store a cubin in cuTile's disk cache under cuTile's own key (on the writer thread)."""
    meta = ints.cache.MetadataV1(
        kernel_names=[],
        compiler_version=(ints.compiler_version or "").strip(),
        compilation_timestamp=time.time(),
        compilation_time_seconds=asm_s,
        remarks="",
    )
    ints.cache.cache_store(ints.cache_dir, key, cubin, meta.to_dict())


def _frontend_ticket(ints: _Internals, job: CompileJob, sig: Any, candidates: bool = False) -> Any:
    """The front-end cache's entry of this job (None: cache off, or a kernel it cannot fingerprint);
    ``candidates``: in the tuning candidates' folder."""
    from tiletune.devices import frontend_cache

    return frontend_cache.ticket(job.kernel, sig, ints.context, job.arch, candidates=candidates)


def _needs_v2(constraint: Any) -> bool:
    """Whether a parameter constraint can only be expressed in calling convention v2: an array with a
    constant dimension (cuTile specialises size-1 dimensions), a list of such arrays, or a tuple."""
    shape_constant = getattr(constraint, "shape_constant", None)
    if shape_constant is not None and any(x is not None for x in shape_constant):
        return True
    element = getattr(constraint, "element", None)
    if element is not None:
        return _needs_v2(element)
    return type(constraint).__name__ == "TupleConstraint"


def launch_signature(ints: Any, kernel: Any, args: Sequence[Any]) -> Any:
    """The signature cuTile's launcher asks the kernel to compile for ``args``.

    The launcher derives the constraints with convention v2 (where a size-1 dimension becomes a
    shape constant) and uses v2 only when some constraint needs it, v1 otherwise (cuda.tile's JAX
    bridge states the same rule). Computing the signature with v1 alone misses every kernel launched
    with a size-1 dimension (e.g. decode attention's one query token): its cubin compiled ahead is
    never matched and the first launch compiles again.
    """
    v2 = getattr(ints, "convention_v2", None)
    if v2 is not None:
        try:
            sig = _unnamed_signature(ints, kernel, args, v2)
        except Exception:  # arguments v2 cannot express: the launcher signs them with v1 as well
            sig = None
        if sig is not None and any(_needs_v2(c) for c in getattr(sig, "parameters", ())):
            return _named(kernel, sig)
    return _named(kernel, _unnamed_signature(ints, kernel, args, ints.convention))


#: the placeholder symbol of a signature :func:`_named` names
_UNNAMED = "_"


def _unnamed_signature(ints: Any, kernel: Any, args: Sequence[Any], convention: Any) -> Any:
    """``from_kernel_args`` with a placeholder symbol: asked for none, it mangles the kernel's name and then
    demangles it again to check itself (most of a lookup's cost); :func:`_named` names it without the check.
    A ``from_kernel_args`` that takes no symbol names the signature itself."""
    try:
        return ints.KernelSignature.from_kernel_args(kernel, args, convention, symbol=_UNNAMED)
    except TypeError as exc:
        if "symbol" not in str(exc):
            raise
        return ints.KernelSignature.from_kernel_args(kernel, args, convention)


def _named(kernel: Any, sig: Any) -> Any:
    """``sig`` with the mangled name the launcher's signature carries (:func:`~tiletune.devices.frontend_cache.
    kernel_symbol`), where :func:`_unnamed_signature` left the placeholder."""
    if getattr(sig, "symbol", None) != _UNNAMED:
        return sig
    from tiletune.devices.frontend_cache import kernel_symbol

    return sig.with_symbol(kernel_symbol(kernel._annotated_function.pyfunc.__name__, sig))


def _describe(exc: BaseException) -> str:
    msg = str(exc).strip()
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
