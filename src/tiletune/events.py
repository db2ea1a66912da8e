"""Events of the miss path, for listeners (fast paths, campaigns, reports) that must not read an op's
private state.

``subscribe(kind, fn)`` calls ``fn(**payload)`` on every event of that kind, in the thread that
raised it; a listener that raises is logged and never breaks the call. Kinds:

* ``"choice"``: a key was answered (``op`` the op's name, ``problem``, ``choice``);
* ``"tuned"``: a tuning session ended (``op``, ``problem``, ``result``);
* ``"changed"``: an op's choices changed (cache cleared, a pending key tuned, a better config swapped
  in): whatever was derived from them (recorded launch recipes) must be forgotten (``op``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

__all__ = ["KINDS", "subscribe", "unsubscribe", "emit"]

KINDS = ("choice", "tuned", "changed")

logger = logging.getLogger("tiletune")
_lock = threading.Lock()
_listeners: dict[str, tuple[Callable[..., None], ...]] = {k: () for k in KINDS}


def subscribe(kind: str, fn: Callable[..., None]) -> Callable[..., None]:
    """Call ``fn(**payload)`` on every ``kind`` event; returns ``fn`` (usable as a decorator)."""
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}; one of {', '.join(KINDS)}")
    with _lock:
        if fn not in _listeners[kind]:
            _listeners[kind] = _listeners[kind] + (fn,)
    return fn


def unsubscribe(kind: str, fn: Callable[..., None]) -> None:
    with _lock:
        _listeners[kind] = tuple(f for f in _listeners.get(kind, ()) if f is not fn)


def emit(kind: str, **payload: Any) -> None:
    for fn in _listeners[kind]:
        try:
            fn(**payload)
        except Exception:  # noqa: BLE001 - a listener never breaks the call
            logger.exception("tiletune: a %r listener failed", kind)
