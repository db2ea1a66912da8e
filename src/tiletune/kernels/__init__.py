"""tiletune's library of autotuned cuTile ops (needs ``cuda-tile``; runs on an NVIDIA GPU).

Each op allocates its output, accepts torch tensors and tunes itself through :func:`tiletune.autotune`
the first time it sees a problem key.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "apply_rope_",
    "attention",
    "cross_entropy",
    "geglu",
    "layer_norm",
    "matmul",
    "rms_norm",
    "rms_norm_residual",
    "softmax",
    "swiglu",
]

# memory-bound ops (issue 5): public name -> module that defines it
_MEMORY_OPS = {
    "rms_norm": "norms",
    "rms_norm_residual": "norms",
    "layer_norm": "norms",
    "softmax": "softmax_op",
    "swiglu": "glu",
    "geglu": "glu",
    "apply_rope_": "rope",
    "cross_entropy": "cross_entropy_op",
}

# KV-cache decode ops (issue 20): importable as tiletune.kernels.decode_attention / kv_cache_append; not
# in __all__ yet (benchmarks/host_cost.py covers exactly __all__); torch.compile traces them as the custom ops
# tiletune::decode_attention / kv_cache_append (torch_ops)
_DECODE_OPS = {"decode_attention": "decode_attention_op", "kv_cache_append": "decode_attention_op"}

# fused GEMM epilogues (issue 20): importable as tiletune.kernels.matmul_swiglu, not in __all__ either; not
# used by any other library path until tests/test_gpu_gemm_glu.py has passed on a GPU
_FUSED_OPS = {"matmul_swiglu": "gemm_glu"}


_background: Any = None  # the thread of load_in_background(), once started


def load_in_background(modules: "list[str] | None" = None) -> bool:
    """Import the op modules (and cuda.tile with them) on a daemon thread, once per process.

    Called when this package is imported: a program builds its model between ``import tiletune.kernels``
    and its first forward, so the ops' imports (cuda.tile's among them) and their definitions (which
    start the tuning worker and cuTile's prewarm) happen then, not inside that forward. Only where it
    pays and is safe: a GPU visible (read from the driver's files, without CUDA), torch already imported
    by the program (a side thread must not race the program's own torch import), cuda.tile installed,
    not inside a tuning worker, and ``TILETUNE_PREWARM`` not off. Returns whether it started the thread.
    An attribute the program reads while the thread imports its module waits for that import (Python's
    module locks), so nothing is imported twice. ``os.fork()`` (a data loader's workers, the tuning
    worker's zygote) waits for the module the thread is importing, not for the whole list: the thread takes
    one step at a time (an import, the tables' read) and a fork waiting goes before its next step, so no child inherits an
    import half done (its lock held by a thread the child does not have) and the thread goes on once the
    fork is made. The interpreter's exit waits for the thread. ``modules``: full module names (tests), by default every
    op module of this package.
    """
    global _background
    import importlib.util
    import threading

    from tiletune import settings
    from tiletune.devices.workers import in_worker
    from tiletune.devices.workers.zygote import gpu_visible
    from tiletune.keys import imported_torch

    if _background is not None or not settings.prewarm() or in_worker() or imported_torch() is None:
        return False
    if not gpu_visible() or importlib.util.find_spec("cuda.tile") is None:
        return False
    if modules is None:
        modules = [f"{__name__}.{m}" for m in sorted({*_MEMORY_OPS.values(), *_DECODE_OPS.values(), "gemm", "attention_op"})]

    gate = threading.Condition()  # the side thread's steps and the forks, one at a time
    state = {"busy": False, "forks": 0}  # a step under way; forks waiting or being made
    forking = threading.local()

    def step(fn: Any, *args: Any) -> None:
        with gate:
            gate.wait_for(lambda: not state["forks"])  # a fork waiting goes first
            state["busy"] = True
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - best effort: the first use imports it (or reads them) itself
            pass
        finally:
            with gate:
                state["busy"] = False
                gate.notify_all()

    def work() -> None:
        import importlib

        for module in modules:
            step(importlib.import_module, module)
        # what a first miss of any op reads, whatever its shape: the identity sources, the tables
        step(warm_first_miss)

    thread = threading.Thread(target=work, name="tiletune-kernels-import", daemon=True)

    def wait(timeout: float) -> None:
        if thread.is_alive() and threading.current_thread() is not thread:
            thread.join(timeout)

    def before_fork() -> None:  # the thread between two steps (or done) while the fork is made
        forking.counted = threading.current_thread() is not thread and thread.is_alive()
        if forking.counted:
            with gate:
                state["forks"] += 1
                gate.wait_for(lambda: not state["busy"], timeout=30.0)

    def after_fork_parent() -> None:
        if getattr(forking, "counted", False):
            forking.counted = False
            with gate:
                state["forks"] -= 1
                gate.notify_all()

    def after_fork_child() -> None:  # no side thread here; the gate was free when the fork was made
        forking.counted = False

    import atexit
    import os

    _background = thread
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=before_fork, after_in_parent=after_fork_parent,
                            after_in_child=after_fork_child)
    atexit.register(wait, 10.0)  # never tear modules down under an import in progress
    thread.start()
    return True


def warm_first_miss() -> None:
    """Read what the first miss of any library op reads whatever its shape, once per process: the source
    texts its identity hashes (:meth:`LibraryOp.warm_identity_sources`) and the tuning tables (when
    ``TILETUNE_TABLES`` is on). Called on :func:`load_in_background`'s thread after its imports."""
    from tiletune import settings
    from tiletune.kernels.library_op import LibraryOp

    LibraryOp.warm_identity_sources()
    if settings.tables_enabled():
        from tiletune.resolve import tables

        tables.tables()


def __getattr__(name: str) -> Any:  # imported lazily: cuda.tile is an optional dependency
    if name in ("matmul", "attention"):
        import importlib

        fn = getattr(importlib.import_module(".gemm" if name == "matmul" else ".attention_op", __name__), name)
        globals()[name] = fn
        return fn
    if name in _MEMORY_OPS or name in _DECODE_OPS or name in _FUSED_OPS:
        import importlib

        module = _MEMORY_OPS.get(name) or _DECODE_OPS.get(name) or _FUSED_OPS[name]
        fn = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = fn
        return fn
    raise AttributeError(f"module 'tiletune.kernels' has no attribute {name!r}")


try:
    load_in_background()
except Exception:  # noqa: BLE001 - never fail an import over a speed-up
    pass
