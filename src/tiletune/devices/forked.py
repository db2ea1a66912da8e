"""Python work spread over forked processes: cuTile's front end for many configs at once.

cuTile's front end (a kernel's Python turned into TileIR bytecode) is Python: in one process its runs
queue behind the interpreter lock, a few tenths of a second per config, while the ``tileiras`` assemblers
that follow run in parallel anyway. :func:`run_forked` runs ``compute(i)`` for every index in up to
``procs`` children forked from this process (each inherits the kernels, arguments and compiler state as
they are: nothing is pickled on the way in), and yields each result as it arrives.

The children take indices from one pipe (whoever is free takes the next), write each result to their
own pipe, touch no GPU and end with ``os._exit``. Whatever a child did not deliver (it died, hung past
``timeout_s`` of silence, or ``stop`` was set) is yielded as undelivered: the caller runs it in-process,
so a child that deadlocks (a lock some other thread held at the fork) costs time, never a result.
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import struct
import threading
import time
import warnings
from typing import Any, Callable, Iterator, NamedTuple

#: most indices one call takes (they are written to a pipe before the fork: 4 bytes each in 64 KiB)
MAX_ITEMS = 15000
_HEAD = struct.Struct("<Q")
_INDEX = struct.Struct("<I")


class Delivered(NamedTuple):
    """One index's outcome: ``ok`` True (``value`` is what ``compute`` returned), False (``value`` is why it
    raised, a line of text) or None (not delivered: run it in-process); ``cpu_s`` the child's CPU time."""

    index: int
    ok: bool | None
    value: Any
    cpu_s: float


def available() -> bool:
    """Whether this platform can fork (POSIX)."""
    return hasattr(os, "fork") and hasattr(os, "pipe")


def run_forked(n: int, compute: Callable[[int], Any], procs: int, timeout_s: float = 120.0,
               stop: threading.Event | None = None) -> Iterator[Delivered]:
    """Yield one :class:`Delivered` per index in ``range(n)``, in completion order (undelivered last)."""
    if n <= 0:
        return
    if n > MAX_ITEMS or not available():
        for i in range(n):
            yield Delivered(i, None, None, 0.0)
        return
    task_r, task_w = os.pipe()
    os.write(task_w, b"".join(_INDEX.pack(i) for i in range(n)))  # 4n bytes < 64 KiB: never blocks
    os.close(task_w)  # children see EOF once the indices are taken
    children: dict[int, int] = {}  # read fd -> pid
    try:
        with warnings.catch_warnings():  # "multi-threaded, use of fork() may deadlock": handled by timeout_s
            warnings.simplefilter("ignore", DeprecationWarning)
            for _ in range(max(1, min(procs, n))):
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:  # the child: never returns
                    os.close(r)
                    _child(task_r, w, compute)
                os.close(w)
                children[r] = pid
    except OSError:  # out of processes: those forked take every index
        if not children:
            os.close(task_r)
            for i in range(n):
                yield Delivered(i, None, None, 0.0)
            return
    os.close(task_r)
    yield from _collect(n, children, timeout_s, stop)


def _child(task_r: int, w: int, compute: Callable[[int], Any]) -> None:
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        while True:
            got = os.read(task_r, _INDEX.size)
            if len(got) < _INDEX.size:
                break
            (i,) = _INDEX.unpack(got)
            c0 = time.process_time()
            try:
                msg: tuple[Any, ...] = (i, True, compute(i))
            except BaseException as exc:  # noqa: BLE001 - reported as this index's failure
                text = str(exc).strip()
                msg = (i, False, f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
            try:
                data = pickle.dumps((*msg, time.process_time() - c0), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # noqa: BLE001 - a value that cannot travel: in-process instead
                data = pickle.dumps((i, None, f"unpicklable result: {exc}", 0.0))
            _write_all(w, _HEAD.pack(len(data)) + data)
    except BaseException:  # noqa: BLE001 - whatever is left undelivered runs in the parent
        code = 1
    finally:
        os._exit(code)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _collect(n: int, children: dict[int, int], timeout_s: float,
             stop: threading.Event | None) -> Iterator[Delivered]:
    seen: set[int] = set()
    bufs = {fd: bytearray() for fd in children}
    sel = selectors.DefaultSelector()
    for fd in children:
        sel.register(fd, selectors.EVENT_READ)
    last = time.monotonic()
    try:
        while sel.get_map() and len(seen) < n:
            if stop is not None and stop.is_set():
                break
            ready = sel.select(timeout=0.2)
            if not ready:
                if time.monotonic() - last > timeout_s:
                    break  # silence: the children are stuck; the rest runs in-process
                continue
            for key, _ in ready:
                fd = key.fd
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    sel.unregister(fd)
                    continue
                last = time.monotonic()
                buf = bufs[fd]
                buf += chunk
                while len(buf) >= _HEAD.size:
                    (size,) = _HEAD.unpack_from(buf)
                    if len(buf) < _HEAD.size + size:
                        break
                    i, ok, value, cpu = pickle.loads(bytes(buf[_HEAD.size:_HEAD.size + size]))
                    del buf[:_HEAD.size + size]
                    if 0 <= i < n and i not in seen:
                        seen.add(i)
                        yield Delivered(i, ok, value if ok is not None else None, cpu)
    finally:
        sel.close()
        for fd, pid in children.items():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
            try:
                os.close(fd)
            except OSError:
                pass
    for i in range(n):
        if i not in seen:
            yield Delivered(i, None, None, 0.0)
