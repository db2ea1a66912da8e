"""Calls that do not wait for the compiler: an op's fallback while its configs compile in the background.

A call of an op with a *fallback* (``autotune(fallback=...)``: the library ops' torch versions) under
``on_miss="nearest"`` or ``"default"`` (a call that is served at once, never tuned) whose answer no compile
cache holds yet (a fresh machine) does not wait for ``tileiras``: the configs that will
answer it compile in the background (the backend's ``compile_ahead``: into cuTile's disk cache and the
front-end cache) and the chain answers ``"fallback"``: the op runs its fallback for this key until the
compile is done; the next call then resolves the key again and finds the configs compiled. A key falls
back once per process (should its compile reach no cache, the next call compiles and waits). Never during
a CUDA graph capture, nor for ``config_for`` / ``bind`` (they need a config); ``TILETUNE_FALLBACK=0``
turns it off. The single-config, database, table and nearest-neighbour sources use it (:func:`while_compiling`,
:func:`fall_back`); :func:`wait_for_compiles` waits
for every background compile (benchmarks, warm-ups).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from tiletune.resolve.problem import Choice, Problem
    from tiletune.space.spaces import Config

logger = logging.getLogger("tiletune")

__all__ = ["AHEAD_CONFIGS", "fall_back", "may_fall_back", "not_compiled", "wait_for_compiles", "while_compiling"]


#: configs compiled in the background for a new key that nothing compiled holds a config of (the
#: nearest neighbour's and the next one; a call after the compile races them)
AHEAD_CONFIGS = 2


_AHEAD: "weakref.WeakSet[Any]" = weakref.WeakSet()  # background compiles of new keys' configs
_ahead_lock = threading.Lock()


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Wait (up to ``timeout`` seconds) for the configs compiling in the background for new keys (while
    their ops run their fallbacks) and for their cubins to be stored; True when every one is done. The
    next call of each such key then launches its config. For benchmarks and warm-ups: serving never
    needs to wait."""
    deadline = None if timeout is None else time.perf_counter() + timeout
    with _ahead_lock:
        pending = list(_AHEAD)
    ok = True
    for ahead in pending:
        left = None if deadline is None else max(0.0, deadline - time.perf_counter())
        ok = bool(ahead.wait(left)) and ok
    return ok


def _stop_compiles_at_exit() -> None:
    """At exit: start no more background compiles; wait a little for those running (their ``tileiras``
    subprocesses and disk-cache stores), so the interpreter never ends under a running compile thread."""
    with _ahead_lock:
        pending = [a for a in _AHEAD if not a.done]
    for ahead in pending:
        finish = getattr(ahead, "finish", None)
        if finish is not None:
            try:
                finish(5.0)
            except Exception:  # noqa: BLE001 - exiting: nothing to report to
                pass


atexit.register(_stop_compiles_at_exit)


def may_fall_back(problem: "Problem") -> bool:
    from tiletune import settings

    return (problem.may_fall_back and problem.spec.fallback is not None and not problem.capturing
            and problem.policy in ("nearest", "default")
            and hasattr(problem.backend, "compile_ahead") and settings.fallback())


def fall_back(problem: "Problem", cfgs: Sequence["Config"]) -> "Choice | None":
    """Compile ``cfgs`` in the background and answer with the op's fallback meanwhile; None when the
    backend cannot compile them so (the caller then compiles as before)."""
    from tiletune.resolve.problem import Choice

    plan = problem.spec.plan if getattr(problem.backend, "ships_plan", False) else problem.plans
    try:
        ahead = problem.backend.compile_ahead(plan, problem.args, list(cfgs), problem.device,  # type: ignore[attr-defined]
                                              keep=True)
    except Exception as exc:  # noqa: BLE001 - an optimisation: the call compiles as before
        logger.debug("%s: compiling ahead failed (%s: %s)", problem.name, type(exc).__name__, exc)
        ahead = None
    if ahead is None:
        return None
    with _ahead_lock:
        _AHEAD.add(ahead)
    logger.info("%s: nothing compiled holds a config for %s: %d config(s) compile in the background, the "
                "op's fallback runs meanwhile", problem.name, problem.identity.key, len(cfgs))
    return Choice(None, "fallback", provisional=True, ahead=ahead)  # type: ignore[arg-type]


def not_compiled(problem: "Problem", cfg: "Config") -> bool:
    """Whether the backend can tell that no compile cache holds ``cfg``'s kernels for this call (the
    backend's ``is_compiled``; False when it cannot tell: the caller then launches as before)."""
    compiled = getattr(problem.backend, "is_compiled", None)
    if not callable(compiled):
        return False
    plan = problem.spec.plan if getattr(problem.backend, "ships_plan", False) else problem.plans
    try:
        return compiled(plan, problem.args, cfg, problem.device) is False
    except Exception as exc:  # noqa: BLE001 - cannot tell: launch as before
        logger.debug("%s: compile-cache lookup failed (%s: %s)", problem.name, type(exc).__name__, exc)
        return False


def while_compiling(problem: "Problem", cfg: "Config") -> "Choice | None":
    """The op's fallback while ``cfg`` compiles in the background, for a source that has found ``cfg``
    (the single config, a database record, a table entry) on a call that may fall back when no compile
    cache holds it; None otherwise (the source answers ``cfg``, which a cache holds or the launch compiles)."""
    if may_fall_back(problem) and not_compiled(problem, cfg):
        return fall_back(problem, [cfg])
    return None

