"""A cuTile kernel object whose first compilation can be answered by a cubin compiled ahead.

cuTile's launcher compiles a kernel on its first launch for a specialisation by calling the kernel
object's ``_compile(signature, context, compute_capability)``; the stock implementation runs the
front end again (AST -> IR -> bytecode, under cuTile's process-wide lock) and then looks the cubin
up in the disk cache. During tuning, :mod:`tiletune.devices.compile_pool` has already produced the cubin for
exactly that signature, so :class:`PrefetchKernel` hands it over directly: no second front-end run,
no lock, no disk access on the GPU thread. Signatures are matched by equality of all parameter
constraints (constants included) and the calling convention, i.e. only when the bytecode would be
identical. Otherwise :mod:`tiletune.devices.frontend_cache` may hold the cubin from an earlier process (also
without a front-end run); anything else falls through to cuTile's own path, whose cubin is then kept
in that cache (outside tuning workers: candidates are not kept, only what callers launch).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, Mapping

import cuda.tile as ct

logger = logging.getLogger("tiletune")


class PrefetchKernel(ct.kernel):
    """``kernel.replace_hints(**hints)`` that also accepts cubins compiled ahead of time."""

    def __init__(self, function: Any = None, /, **options: Any) -> None:
        super().__init__(function, **options)
        self._ahead: list[tuple[Any, bytes, str, str]] = []  # (signature, cubin, symbol, arch)
        self._ahead_lock = threading.Lock()
        self.prefetch_hits = 0
        self.prefetch_misses = 0  # first launches that found cubins compiled ahead, none for their signature
        self.frontend_hits = 0  # first launches answered by tiletune.devices.frontend_cache (no front end run)

    @staticmethod
    def with_hints(kernel: Any, hints: Mapping[str, Any]) -> "PrefetchKernel":
        """The equivalent of ``kernel.replace_hints(**hints)`` as a PrefetchKernel."""
        options = dataclasses.replace(kernel._compiler_options, **dict(hints))
        return PrefetchKernel(kernel._pyfunc, **dataclasses.asdict(options))

    def offer(self, signature: Any, cubin: bytes, arch: str) -> None:
        """Register a cubin compiled for ``signature`` on ``arch`` (e.g. ``"sm_90"``)."""
        with self._ahead_lock:
            self._ahead.append((signature, cubin, signature.symbol, arch))

    def _compile(self, signature: Any, context: Any, compute_capability: Any = None) -> Any:
        from cuda.tile._cext import get_compute_capability

        from tiletune import settings


        from tiletune.devices import frontend_cache
        cc = compute_capability or get_compute_capability()
        arch = f"sm_{cc[0]}{cc[1]}"
        with self._ahead_lock:
            for i, (sig, cubin, symbol, sig_arch) in enumerate(self._ahead):
                if (
                    sig_arch == arch
                    and sig.calling_convention.code == signature.calling_convention.code
                    and sig.parameters == signature.parameters
                ):
                    del self._ahead[i]
                    self.prefetch_hits += 1
                    return cubin, symbol, None, ()  # a tuning candidate: not kept on disk
            if self._ahead:
                self.prefetch_misses += 1
        try:  # the entry's key is made before the compile, from the globals it is about to read
            entry = frontend_cache.ticket(self, signature, context, arch)
            cached = entry.load() if entry is not None else None
        except Exception as exc:  # noqa: BLE001 - the cache must never fail a launch: cuTile's own path
            logger.debug("tiletune: front-end cache lookup failed (%s: %s)", type(exc).__name__, exc)
            entry = cached = None
        if cached is not None:
            self.frontend_hits += 1
            return cached[0], cached[1], None, ()
        from tiletune.devices.compile_pool import compile_signature, compiling

        with compiling():  # a tuning worker's watchdog does not count this (see compile_pool.compiling)
            result = None
            cutile_key = None  # where cuTile's disk cache keeps the cubin (the pool's way only)
            try:  # the pool's way: the disk-cache store happens in the background, after the launch
                got = compile_signature(self, signature, context, arch)
                if got is not None:
                    result, cutile_key = (got[0], got[1], None, ()), got[2]
            except Exception as exc:  # noqa: BLE001 - cuTile's own path reports the error properly
                logger.debug("tiletune: compile on launch via the pool failed (%s: %s); cuTile's path",
                             type(exc).__name__, exc)
            if result is None:
                result = super()._compile(signature, context, compute_capability)
        cubin, symbol, extra, providers = result
        # a plain cubin (no library lifecycle to replay) that a caller launches, not a tuning worker's
        # candidate: the cache holds what later processes will launch, not every config ever tried
        if entry is not None and extra is None and not providers and not settings.in_worker():
            try:
                entry.save(cubin, symbol, cutile_key)
            except Exception as exc:  # noqa: BLE001 - the launch goes on with the compiled cubin
                logger.debug("tiletune: front-end cache not written (%s: %s)", type(exc).__name__, exc)
        return result
