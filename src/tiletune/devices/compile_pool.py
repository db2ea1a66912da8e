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
   answers cuTile's first-launch compile request with it (no second front-end run), and one writer
   thread stores it in cuTile's on-disk cache under cuTile's own key, so later processes load it
   without compiling,
4. candidates are yielded as they finish, so the GPU measures while the rest compile.

No worker process imports torch or initialises CUDA. If the installed cuda-tile lacks the internals
used here, the pool reports ``parallel=False`` and yields candidates at once: cuTile then compiles
each at its first launch (serially), which is slower but correct.
"""

from __future__ import annotations

import contextlib
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


class _Internals:
    """The cuda-tile internals the pool relies on, looked up once (None when unavailable)."""

    def __init__(self) -> None:
        from cuda.tile import _compile as comp
        from cuda.tile._cext import default_tile_context
        from cuda.tile.compilation import CallingConvention, KernelSignature
        from cutile_cache import _cache as cache

        self.comp = comp
        self.cache = cache
        self.context = default_tile_context
        self.KernelSignature = KernelSignature
        self.convention = CallingConvention.cutile_python_v1()
        v2 = getattr(CallingConvention, "cutile_python_v2", None)
        self.convention_v2 = v2() if v2 is not None else None
        self.compiler_version = comp._get_compiler_version_string()
        for name in ("compile_tile", "compile_cubin", "_tileiras_effective_opt_and_device_debug"):
            if not hasattr(comp, name):
                raise AttributeError(name)
        for name in ("cache_key", "cache_lookup", "cache_store", "MetadataV1"):
            if not hasattr(cache, name):
                raise AttributeError(name)

    @property
    def cache_dir(self) -> str | None:
        return self.context.config.cache_dir


_internals: _Internals | None = None
_internals_error: str | None = None


def load_internals() -> bool:
    """Load the cuda-tile internals the pool uses (once per process; True when they are available).

    A tuning worker calls it in the background when it starts, so the first compile of a session
    there (a spare taking over after a fault) does not pay for loading them."""
    return _get_internals() is not None


def _get_internals() -> _Internals | None:
    global _internals, _internals_error
    if _internals is None and _internals_error is None:
        try:
            _internals = _Internals()
        except Exception as exc:  # pragma: no cover - depends on the installed cuda-tile
            _internals_error = f"{type(exc).__name__}: {exc}"
    return _internals


class CompilePool:
    """Compiles jobs ahead of their first launch, ``workers`` assembler processes at a time."""

    def __init__(self, workers: int | None = None, timeout_s: float | None = 300.0) -> None:
        from tiletune import settings

        self.workers = workers or settings.compile_workers() or cpu_count()
        self.timeout_s = timeout_s
        ints = _get_internals()
        self.parallel = ints is not None and ints.compiler_version is not None
        self.why_serial = "" if self.parallel else (_internals_error or "tileiras' version is unknown")

    def compile_all(self, jobs: Sequence[CompileJob]) -> Iterator[CompileResult]:
        """Yield one result per job, in completion order."""
        if not self.parallel or not all(hasattr(j.kernel, "offer") for j in jobs):
            for job in jobs:
                yield CompileResult(job.tag, 0.0, deferred=True)
            return
        results: "queue.Queue[CompileResult]" = queue.Queue()
        to_disk: "queue.Queue[tuple[str, bytes, float] | None]" = queue.Queue()
        executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="tiletune-tileiras")
        producer = threading.Thread(
            target=self._produce, args=(jobs, executor, results, to_disk), name="tiletune-bytecode", daemon=True
        )
        writer = threading.Thread(target=self._write_disk, args=(to_disk,), name="tiletune-cache-writer", daemon=True)
        producer.start()
        writer.start()
        try:
            for _ in range(len(jobs)):
                yield results.get()
        finally:
            producer.join()
            executor.shutdown(wait=True, cancel_futures=True)
            to_disk.put(None)
            writer.join()

    # -- internals -------------------------------------------------------------------------
    def _produce(
        self,
        jobs: Sequence[CompileJob],
        executor: ThreadPoolExecutor,
        out: "queue.Queue[CompileResult]",
        to_disk: "queue.Queue[tuple[str, bytes, float] | None]",
    ) -> None:
        ints = _get_internals()
        assert ints is not None
        for job in jobs:
            t0 = time.perf_counter()
            c0 = time.thread_time()
            try:
                sig, key, bytecode = self._bytecode(ints, job)
            except Exception as exc:  # front-end errors: bad tile shapes, type errors, ...
                out.put(CompileResult(job.tag, time.perf_counter() - t0, error=_describe(exc),
                                      cpu_s=time.thread_time() - c0))
                continue
            cubin = ints.cache.cache_lookup(ints.cache_dir, key) if ints.cache_dir else None
            front_cpu = time.thread_time() - c0
            if cubin is not None:
                job.kernel.offer(sig, cubin, job.arch)
                out.put(CompileResult(job.tag, time.perf_counter() - t0, cached=True, cpu_s=front_cpu))
                continue
            executor.submit(self._assemble, ints, job, sig, key, bytecode, t0, out, to_disk, front_cpu)

    def _bytecode(self, ints: _Internals, job: CompileJob) -> tuple[Any, str, bytes]:
        kernel = job.kernel
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

    def _assemble(
        self,
        ints: _Internals,
        job: CompileJob,
        sig: Any,
        key: str,
        bytecode: bytes,
        t0: float,
        out: "queue.Queue[CompileResult]",
        to_disk: "queue.Queue[tuple[str, bytes, float] | None]",
        front_cpu: float = 0.0,
    ) -> None:
        t_asm = time.perf_counter()
        try:
            tmp_dir = ints.context.config.temp_dir
            with tempfile.TemporaryDirectory(dir=tmp_dir, prefix="tiletune-") as d:
                src = Path(d) / "kernel.bytecode"
                src.write_bytes(bytecode)
                t_asm = time.perf_counter()
                cubin_path = ints.comp.compile_cubin(
                    str(src), job.kernel._compiler_options, job.arch, timeout_sec=self.timeout_s
                )
                asm_s = time.perf_counter() - t_asm
                cubin = Path(cubin_path).read_bytes()
            job.kernel.offer(sig, cubin, job.arch)
            if ints.cache_dir:
                to_disk.put((key, cubin, asm_s))
            out.put(CompileResult(job.tag, time.perf_counter() - t0, cpu_s=front_cpu + asm_s))
        except Exception as exc:
            timed_out = "timeout" in type(exc).__name__.lower() or "exceeded timeout" in str(exc)
            out.put(CompileResult(job.tag, time.perf_counter() - t0, error=_describe(exc), timed_out=timed_out,
                                  cpu_s=front_cpu + time.perf_counter() - t_asm))

    @staticmethod
    def _write_disk(to_disk: "queue.Queue[tuple[str, bytes, float] | None]") -> None:
        """Store cubins in cuTile's disk cache one at a time (its SQLite file serialises writers)."""
        ints = _get_internals()
        while True:
            item = to_disk.get()
            if item is None or ints is None:
                return
            key, cubin, asm_s = item
            meta = ints.cache.MetadataV1(
                kernel_names=[],
                compiler_version=(ints.compiler_version or "").strip(),
                compilation_timestamp=time.time(),
                compilation_time_seconds=asm_s,
                remarks="",
            )
            ints.cache.cache_store(ints.cache_dir, key, cubin, meta.to_dict())


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
            sig = ints.KernelSignature.from_kernel_args(kernel, args, v2)
        except Exception:  # arguments v2 cannot express: the launcher signs them with v1 as well
            sig = None
        if sig is not None and any(_needs_v2(c) for c in getattr(sig, "parameters", ())):
            return sig
    return ints.KernelSignature.from_kernel_args(kernel, args, ints.convention)


def _describe(exc: BaseException) -> str:
    msg = str(exc).strip()
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
