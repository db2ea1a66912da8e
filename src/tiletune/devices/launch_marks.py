"""Marks of a check's progress, for the watchdog of the tuning worker that runs it.

A check (a candidate's first, checked launch) has three phases: getting the kernel onto the GPU (the
guard's set-up, loading the cubin's module, cuTile's launch path: slow the first time in a process,
but no candidate kernel runs yet), running the kernel (where an endless loop hangs), and judging its
result (guard bands, the reference, the comparison). A session marks the ends of the first two with
:func:`mark` (``"launched"``: the launch call returned, the kernel is queued; ``"ran"``: the GPU has
finished it). In a tuning worker the marks travel to the caller at once, whose watchdog then gives the
kernel itself a deadline relative to the kernel times of the session, and the phases around it a
generous one (:mod:`tiletune.devices.workers.session`). Anywhere else :func:`mark` does nothing.
"""

from __future__ import annotations

from typing import Callable

__all__ = ["PHASES", "mark", "listen"]

#: the marks, in the order a check passes them
PHASES = ("launched", "ran")

_listener: Callable[[str], None] | None = None


def listen(fn: Callable[[str], None] | None) -> None:
    """Send every :func:`mark` to ``fn`` from now on (None: stop)."""
    global _listener
    _listener = fn


def mark(what: str) -> None:
    """A check reached ``what`` (one of :data:`PHASES`); never raises."""
    fn = _listener
    if fn is not None:
        try:
            fn(what)
        except Exception:  # noqa: BLE001 - a lost mark only leaves the watchdog's longer deadline
            pass
