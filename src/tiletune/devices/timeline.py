"""Named moments of a tuning miss, across the caller, its worker and the compile pool, for diagnostics.

With ``TILETUNE_COMPILE_TRACE`` set, :func:`mark` appends one JSON line ``{"mark", "t", "pid", ...}`` to
that file (``t``: wall-clock seconds, comparable across processes), beside the compile pool's per-job
lines. Unset (the default), a mark costs one environment lookup. A file that cannot be written is left
alone: a diagnostic never fails a call.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any

from tiletune import settings

__all__ = ["mark", "append"]

_lock = threading.Lock()  # one line at a time from this process's threads


def append(path: str, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line to ``path`` (errors ignored)."""
    line = json.dumps(record, default=str)
    with contextlib.suppress(OSError), _lock, open(path, "a") as f:
        f.write(line + "\n")


def mark(event: str, **fields: Any) -> None:
    """Record that ``event`` happened now in this process (a no-op unless ``TILETUNE_COMPILE_TRACE`` is set)."""
    try:
        path = settings.compile_trace()
    except ValueError:
        return
    if path:
        append(path, {"mark": event, "t": time.time(), "pid": os.getpid(), **fields})
