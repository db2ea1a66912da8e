"""Caller side of a tuning worker: start it, talk to it with deadlines, kill and replace it.

A :class:`WorkerProcess` is one ``python -m tiletune.devices.workers.worker_main`` child connected over a
Unix socket. Every request waits for its reply under a deadline; a worker that dies (EOF on the
socket, any signal), exceeds a deadline (a kernel that never finishes) or sends an invalid reply is
killed and reported as a :class:`WorkerFault`; the next request goes to a warm spare when one is
kept (:meth:`WorkerProcess.keep_spares`: children started ahead in the background, in parallel, so a
fault costs no cold start; a spare that takes over is replaced at once, again in the background),
else to a fresh worker.

A worker is ended politely (:meth:`WorkerProcess.close`: the ``exit`` request, a short wait, then
SIGTERM, then SIGKILL) on close and at interpreter exit; SIGKILL at once only after a fault (a kernel
stuck on the GPU ends with its context). A killed child is reaped on a background thread (its exit,
CUDA context teardown included, is off the caller's path); :meth:`WorkerProcess.wait_reaped` waits for
it where it matters (before timing anything, the GPU must be free of a kernel that hung).

:func:`worker_for` keeps one worker per (backend, GPU) for the life of the caller and
:func:`prestart` starts the default one in the background when the first op is defined, so its start-up
(importing torch and cuda.tile, creating a CUDA context: seconds) overlaps with the user's program.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection, Listener, wait
from typing import Any, Callable, Deque, Mapping, Sequence

from tiletune import settings
from tiletune.devices.workers.protocol import BusyEvent, CompiledEvent, PhaseEvent, ProtocolError, Reply, decode_reply
from tiletune.devices.workers.shipping import collect_shared, dumps

logger = logging.getLogger("tiletune")

__all__ = ["WorkerFault", "WorkerProcess", "worker_for", "prestart", "shutdown_all", "in_worker", "wait_for_worker"]

#: Seconds a new worker may take to import torch and cuda.tile and create its CUDA context; None:
#: ``TILETUNE_WORKER_START_TIMEOUT`` (default 180), read at each start.
START_TIMEOUT_S: float | None = None

#: How a worker is started from scratch (a worker forked by the zygote runs the same entry point).
DEFAULT_COMMAND = [sys.executable, "-m", "tiletune.devices.workers.worker_main"]

#: Seconds to wait for the zygote's fork (it may be importing a kernel package first: that import
#: would otherwise happen in the worker, so waiting for it costs nothing).
ZYGOTE_FORK_WAIT_S = 60.0

#: Seconds to wait for the exit status of a worker whose connection broke (for the fault's message:
#: "exit code 7", "killed by signal SIGSEGV"); a child still tearing down its CUDA context is not
#: waited for longer (its status is then "still running" and it is reaped in the background).
EXIT_STATUS_WAIT_S = 0.5
#: how long a worker whose kernel faulted (the GPU said so, an Xid) may still take to report it after
#: the kernel's deadline (the report can lag while the host is loaded)
FAULT_REPORT_GRACE_S = 5.0


def _keep_logs() -> bool:
    try:
        return settings.worker_trace()
    except ValueError:  # cleanup never fails on a bad variable; keep the logs to be safe
        return True


def _start_timeout_s() -> float:
    return START_TIMEOUT_S if START_TIMEOUT_S is not None else settings.worker_start_timeout_s()


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:  # gone already (the directory was removed with a killed worker)
        pass


def _listen(address: str, authkey: bytes) -> Listener:
    """A Unix-socket listener whose socket file this module removes itself.

    multiprocessing registers an unlink finalizer that runs at interpreter exit; when a worker
    started in the background had not connected yet, :meth:`WorkerProcess.kill` has removed the
    socket's directory by then and that finalizer printed a ``FileNotFoundError`` traceback. The
    finalizer is cancelled here; :meth:`WorkerProcess._start` unlinks the socket once it is done with it.
    """
    listener = Listener(address, family="AF_UNIX", authkey=authkey)
    inner = getattr(listener, "_listener", None)
    fin = getattr(inner, "_unlink", None)
    if fin is not None:
        fin.cancel()
        inner._unlink = None  # type: ignore[union-attr]
    return listener


def in_worker() -> bool:
    """True inside a tuning worker process (ops defined there never start workers of their own)."""
    return settings.in_worker()


class WorkerFault(Exception):
    """The worker died, hung past its deadline, lost its CUDA context or sent garbage.

    ``kind`` is ``"died"``, ``"timeout"``, ``"fatal"`` (sticky CUDA error) or ``"protocol"``; for a
    timeout, ``phase`` is what the watchdog was waiting for (``"request"``: the reply or a check's
    launch; ``"launched"``: a launched kernel to finish; ``"ran"``: the check's verdict after its kernel
    ran) and ``deadline_s`` the deadline that expired; ``info``: what a fatal reply said of its check.
    """

    def __init__(self, kind: str, message: str, phase: str = "", deadline_s: float | None = None,
                 info: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.phase = phase
        self.deadline_s = deadline_s
        self.info = dict(info or {})  # a fatal reply's own figures (check_s, probe_s, marks)


class WorkerProcess:
    """One worker child process and its connection."""

    def __init__(self, backend_spec: Any = "cutile", device_index: int = 0,
                 command: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        #: counters: ``starts`` (child processes this object served from, spares included),
        #: ``spares_used`` (faults answered by a warm spare, no cold start), ``graceful_exits``
        #: (children that left on the ``exit`` request); ``start_s``: per start, the seconds it took
        #: (for a spare taking over: the seconds waited for it); ``reap_s``: per killed child, the
        #: seconds from SIGKILL until it was gone (measured on the reaper thread).
        self.backend_spec = backend_spec
        self.device_index = device_index
        self.command = command or DEFAULT_COMMAND
        self.forked = False  # the current child came from the zygote
        self.fork_ok = True  # False: children start from scratch (a forked one could not open a session)
        self.extra_env = dict(env or {})
        self.events: Deque[CompiledEvent] = collections.deque()
        self.lock = threading.RLock()  # one tuning session at a time per worker
        self.proc: subprocess.Popen | None = None
        self._last_proc: subprocess.Popen | None = None  # the last child killed (its exit status)
        self.conn: Connection | None = None
        self.info: dict[str, Any] = {}
        self.marks: dict[str, float] = {}  # the last request's phases: seconds from sending (request())
        self.xids: list[int] = []  # the last request's memory-fault Xids met at its kernel's deadline
        self._grace_until = 0.0  # monotonic end of the grace those Xids gave (_fault_reported_late)
        self.generation = 0  # bumped on every (re)start
        self.starts = 0
        self.start_s: list[float] = []
        self._next_id = 0
        self._log_path = ""
        self._tmp_dir = ""  # the worker's socket and log (removed with the worker)
        self._ready = threading.Event()
        self._starting = False
        self._start_lock = threading.Lock()
        self._proc_lock = threading.Lock()  # spawning vs. a final close (no child born after shutdown)
        self._closed = False  # closed for good (interpreter exit): nothing starts any more
        self._spares: list[WorkerProcess] = []
        self._spare_target = 0  # spares to keep (keep_spares)
        self._spare_done = threading.Event()  # a spare's start finished (started or failed)
        self._on_started: Callable[[], None] | None = None  # called when a background start finishes
        self._reaping: list[threading.Thread] = []  # reaper threads of killed children
        self._reap_started: dict[threading.Thread, float] = {}  # each reaper's SIGKILL time
        self.reap_s: list[float] = []
        self.spares_used = 0
        self.graceful_exits = 0

    # -- life cycle ------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.conn is not None

    @property
    def ready(self) -> bool:
        """Whether the child is up and has answered ``hello`` (not starting, in the background or not)."""
        return self.alive and not self._starting and self._ready.is_set()

    def start(self) -> None:
        """Start the child and wait until it answers ``hello`` (raises WorkerFault if it cannot)."""
        logger.debug("tiletune worker: starting (thread %s, previous pid %s)", threading.current_thread().name,
                     self.proc.pid if self.proc is not None else None)
        self._ready.clear()
        try:
            self._start()
        finally:
            self._ready.set()  # started or failed: waiters look at `alive`

    def _start(self) -> None:
        from tiletune.devices import timeline

        timeline.mark("worker_start", thread=threading.current_thread().name)
        self.kill()
        t0 = time.perf_counter()
        start_timeout = _start_timeout_s()  # an invalid TILETUNE_WORKER_START_TIMEOUT fails before anything starts
        if self._closed:
            raise WorkerFault("died", "the worker pool was shut down")
        tmp = self._tmp_dir = tempfile.mkdtemp(prefix="tiletune-worker-")
        address = os.path.join(tmp, "sock")
        authkey = secrets.token_bytes(32)
        listener = _listen(address, authkey)
        env = dict(os.environ)
        env.update(self.extra_env)
        env["TILETUNE_WORKER_ADDRESS"] = address
        env["TILETUNE_WORKER_AUTHKEY"] = authkey.hex()
        env["TILETUNE_IN_WORKER"] = "1"
        env["TILETUNE_WORKER_SYSPATH"] = json.dumps([p for p in sys.path if p])
        with _workers_lock:
            if _preload:
                env["TILETUNE_WORKER_PRELOAD"] = json.dumps(list(_preload))
        # the worker imports the very tiletune this process runs (a source tree on sys.path, e.g. a
        # checkout under test, would otherwise lose to an installed copy found first in the child)
        root = os.path.dirname(os.path.dirname(os.path.abspath(settings.__file__)))
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._log_path = os.path.join(tmp, "worker.log")
        log = open(self._log_path, "wb")
        try:
            with self._proc_lock:
                if self._closed:
                    listener.close()
                    _unlink_quietly(address)
                    raise WorkerFault("died", "the worker pool was shut down")
                self.proc = self._forked(env) if self.command == DEFAULT_COMMAND else None
                if self.proc is None:
                    self.proc = subprocess.Popen(self.command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                                 stderr=subprocess.STDOUT, cwd=os.getcwd(), start_new_session=True)
        finally:
            log.close()
        try:
            self.conn = self._accept(listener, start_timeout)
        finally:
            listener.close()
            _unlink_quietly(address)
        self.generation += 1
        self.starts += 1
        self.events.clear()
        reply = self.request({"op": "hello", "backend": self.backend_spec, "device_index": self.device_index},
                             start_timeout)
        self.info = dict(reply.body)
        self.start_s.append(time.perf_counter() - t0)
        logger.debug("tiletune worker pid %s started in %.2f s", self.info.get("pid"), self.start_s[-1])

    def _forked(self, env: dict[str, str]) -> Any:
        """A child forked by the zygote (torch, cuda.tile and the kernels' modules imported already), or
        None: no zygote here, or it cannot fork now (the caller then starts one from scratch)."""
        from tiletune.devices.workers.zygote import zygote

        self.forked = False
        z = zygote() if self.fork_ok else None
        if z is None:
            return None
        proc = z.fork(env, os.getcwd(), self._log_path, timeout=ZYGOTE_FORK_WAIT_S)
        self.forked = proc is not None
        return proc

    def _accept(self, listener: Listener, timeout: float) -> Connection:
        result: list[Any] = []

        def accept() -> None:
            try:
                result.append(listener.accept())
            except Exception as exc:  # pragma: no cover - closed listener
                result.append(exc)

        proc = self.proc
        t = threading.Thread(target=accept, daemon=True)
        t.start()
        deadline = time.monotonic() + timeout
        while t.is_alive():
            t.join(0.05)
            if proc is None or proc.poll() is not None or self.proc is not proc:  # exited, or killed meanwhile
                listener.close()
                raise WorkerFault("died", f"the worker exited during start-up ({self._exit_text()}){self.log_tail()}")
            if time.monotonic() > deadline:
                listener.close()
                self.kill()
                raise WorkerFault("timeout", f"the worker did not connect within {timeout:.0f} s")
        if not result or isinstance(result[0], BaseException):
            raise WorkerFault("died", f"the worker could not connect{self.log_tail()}")
        return result[0]

    def ensure(self) -> None:
        """Start the worker if it is not running (taking over the warm spare when there is one)."""
        if not self.alive and not self._take_spare():
            self.start()

    # -- the warm spares -------------------------------------------------------------------
    def keep_spare(self) -> None:
        """Keep at least one warm spare (see :meth:`keep_spares`)."""
        self.keep_spares(max(1, self._spare_target))

    def keep_spares(self, count: int) -> None:
        """Keep ``count`` workers started ahead (in the background, in parallel) to replace this one at
        once after a fault: a dead worker then costs the spare's session set-up, not a cold start
        (importing torch and cuda.tile, creating a CUDA context: seconds). Missing spares start now;
        spares beyond ``count`` are closed (those still starting first). A spare that takes over is
        replaced at once (:meth:`_take_spare`)."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        if self._closed:
            return
        with self._start_lock:
            self._spare_target = count
            new, extra = self._refill_locked()
        _discard(extra)
        for sp in new:
            sp.start_in_background()

    def _refill_locked(self) -> tuple[list["WorkerProcess"], list["WorkerProcess"]]:
        """(spares to start, spares to close) for the target; the caller holds ``_start_lock``."""
        keep: list[WorkerProcess] = []
        extra: list[WorkerProcess] = []
        for sp in self._spares:
            (keep if (sp.alive or sp._starting) else extra).append(sp)  # a failed start is dropped
        keep.sort(key=lambda sp: not sp.alive)  # ready ones first: those stay
        extra += keep[self._spare_target:]
        keep = keep[: self._spare_target]
        new = [self._new_spare() for _ in range(self._spare_target - len(keep))]
        self._spares = keep + new
        return new, extra

    def _new_spare(self) -> "WorkerProcess":
        sp = WorkerProcess(self.backend_spec, self.device_index, self.command, self.extra_env)
        sp.fork_ok = self.fork_ok
        sp._on_started = self._spare_done.set
        return sp

    @property
    def spare(self) -> "WorkerProcess | None":
        """The first spare (None without one)."""
        spares = self._spares
        return spares[0] if spares else None

    @property
    def spares(self) -> tuple["WorkerProcess", ...]:
        """The spares kept now (started or starting)."""
        return tuple(self._spares)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until a start (in the background or not) has finished; True when the worker answered
        ``hello`` and runs (``alive`` alone turns true as soon as the child connects)."""
        t0 = time.monotonic()
        while self._starting or not self._ready.is_set():
            left = None if timeout is None else timeout - (time.monotonic() - t0)
            if left is not None and left <= 0:
                return False
            self._ready.wait(0.05 if left is None else min(0.05, left))
        return self.alive

    def _take_spare(self) -> bool:
        """Become a spare's child process (True) and start its replacement; False without a usable
        spare. A spare that has finished starting is taken at once; otherwise the first of those still
        starting to finish is taken (woken by its start, not by polling)."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + _start_timeout_s()
        sp: WorkerProcess | None = None
        dead: list[WorkerProcess] = []
        while True:
            with self._start_lock:
                self._spare_done.clear()  # before looking: a start finishing after the look wakes us
                ready = [s for s in self._spares if s.alive and not s._starting and s._ready.is_set()]
                starting = [s for s in self._spares if s._starting]
                if ready:
                    sp = ready[0]
                    self._spares.remove(sp)
                    break
                if not starting:
                    dead, self._spares = self._spares, []
                    break
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._spare_done.wait(left)
        if sp is None:
            _discard(dead)
            return False
        self.kill()  # the dead one's remains (reaped in the background)
        self.proc, self.conn, self.info = sp.proc, sp.conn, dict(sp.info)
        self._tmp_dir, self._log_path = sp._tmp_dir, sp._log_path
        self.forked = sp.forked
        sp.proc, sp.conn, sp._tmp_dir = None, None, ""
        self.events.clear()
        self.generation += 1
        self.starts += 1
        self.spares_used += 1
        self.start_s.append(time.perf_counter() - t0)
        logger.debug("tiletune worker: the spare pid %s took over (waited %.3f s)", self.info.get("pid"),
                     self.start_s[-1])
        if not self._closed:
            with self._start_lock:
                new, extra = self._refill_locked()
            _discard(extra)
            for n in new:
                n.start_in_background()
        return True

    def close(self, timeout: float = 2.0, final: bool = False) -> int | None:
        """End the worker (and its spare) gracefully: the ``exit`` request, up to ``timeout`` s for the
        child to leave, then SIGTERM, then SIGKILL. Returns the child's exit code (None without one).

        ``final`` (interpreter exit): no worker starts on this object afterwards, so a start in the
        background cannot leave a child behind."""
        if final:
            with self._proc_lock:
                self._closed = True
        with self._start_lock:
            spares, self._spares = self._spares, []
            self._spare_target = 0
        closers = []
        for sp in spares:  # in parallel: each may take up to `timeout`
            closers.append(threading.Thread(target=sp.close, args=(timeout, final), daemon=True))
            closers[-1].start()
        proc = self.proc
        asked = False
        if proc is not None and proc.poll() is None and self.conn is not None:
            if self.lock.acquire(timeout=min(timeout, 0.5)):  # not in the middle of someone's session
                try:
                    asked = self.request({"op": "exit"}, timeout).ok
                except (WorkerFault, OSError, ValueError):
                    pass
                finally:
                    self.lock.release()
        code = None
        if proc is not None:
            code = self._wait_or_signal(proc, timeout if asked else 0.0)
            if code == 0:
                self.graceful_exits += 1
        self.kill()  # whatever is left; removes the socket directory
        self.wait_reaped(timeout + 3.0)
        for closer in closers:
            closer.join(timeout + 3.0)
        return code if code is not None else (proc.poll() if proc is not None else None)

    @staticmethod
    def _wait_or_signal(proc: subprocess.Popen, timeout: float) -> int | None:
        for sig, wait_s in ((None, timeout), (signal.SIGTERM, 1.0)):
            if sig is None and wait_s <= 0:
                continue
            if sig is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    proc.terminate()
            try:
                return proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        return None

    def kill(self) -> None:
        """Kill the child (SIGKILL: a kernel stuck on the GPU ends with its context) and reap it on a
        background thread: its exit (the CUDA context's teardown) is not waited for here; see
        :meth:`wait_reaped`."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            logger.debug("tiletune worker: killing pid %s", proc.pid)
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
            self.conn = None
        self.events.clear()
        tmp, self._tmp_dir = self._tmp_dir, ""
        if proc is None:
            self._remove_dir(tmp)
            return
        self._last_proc = proc
        t0 = time.perf_counter()
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()

        def reap() -> None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
                pass
            self.reap_s.append(round(time.perf_counter() - t0, 4))
            self._remove_dir(tmp)

        t = threading.Thread(target=reap, name="tiletune-worker-reap", daemon=True)
        with self._start_lock:
            self._reaping = [r for r in self._reaping if r.is_alive()] + [t]
            self._reap_started[t] = t0
        t.start()

    @staticmethod
    def _remove_dir(tmp: str) -> None:
        if tmp and not _keep_logs():
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)  # fault reasons quoted the log already

    @property
    def reaping(self) -> bool:
        """Whether a child this object killed is still being torn down (on a GPU: a kernel that hung
        there may still share the GPU with the next check)."""
        return any(r.is_alive() for r in self._reaping)

    def reaping_for_s(self) -> float | None:
        """How long the oldest teardown still running has taken (seconds since its SIGKILL), or None
        when no killed child is still being torn down."""
        now = time.perf_counter()
        with self._start_lock:
            alive = [self._reap_started.get(r, now) for r in self._reaping if r.is_alive()]
            self._reap_started = {r: t for r, t in self._reap_started.items() if r.is_alive()}
        return now - min(alive) if alive else None

    def wait_reaped(self, timeout: float | None = None) -> float:
        """Wait until every child this object killed is gone (its CUDA context torn down, so a kernel
        that hung no longer runs on the GPU); returns the seconds waited."""
        t0 = time.perf_counter()
        with self._start_lock:
            threads = [r for r in self._reaping if r.is_alive()]
        for r in threads:
            left = None if timeout is None else max(0.0, timeout - (time.perf_counter() - t0))
            r.join(left)
        return time.perf_counter() - t0

    def _exit_text(self) -> str:
        proc = self.proc if self.proc is not None else self._last_proc
        code = proc.poll() if proc is not None else None
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def log_tail(self, lines: int = 6) -> str:
        """The last lines the worker printed (for failure reasons), prefixed with a newline."""
        try:
            with open(self._log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4000))
                text = f.read().decode("utf-8", "replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        return ("\n  worker output: " + "\n  ".join(text)) if text else ""

    # -- requests --------------------------------------------------------------------------
    def request(self, msg: dict, timeout: float | None, compile_allowance: float = 0.0,
                phases: Mapping[str, float] | None = None, xid: Any = None) -> Reply:
        """Send one request and wait for its reply; compile events met meanwhile are queued.

        ``timeout`` is the watchdog of the work itself: each ``busy`` heartbeat of the worker (the
        request is compiling) restarts it, for at most ``compile_allowance`` seconds in all, so a
        compile is not taken for a hung kernel and a hung kernel is still caught after ``timeout``.
        ``phases`` re-arms it when the worker reports a phase of a check (``{"launched": s, "ran": s}``,
        :mod:`tiletune.devices.launch_marks`): from that moment the request may take ``s`` more. The
        seconds from sending to each phase reported are left in :attr:`marks`. ``xid``: the GPU's
        :class:`~tiletune.devices.xid.XidWatch`, marked when the request is sent; when the kernel's
        deadline passes and the GPU has reported a memory fault since, the worker gets
        :data:`FAULT_REPORT_GRACE_S` more to report it, and a fault that is still not reported is
        ``fatal``, not ``timeout`` (the Xids are left in :attr:`xids`).

        Raises :class:`WorkerFault` (the worker is killed first) on death, deadline, a fatal CUDA
        error reported by the worker, or an invalid reply.
        """
        if not self.alive:
            raise WorkerFault("died", "the worker is not running")
        self._next_id += 1
        rid = self._next_id
        data = rid.to_bytes(8, "little", signed=True) + dumps(msg)  # the id travels outside the pickle
        self.marks = {}
        self.xids = []
        if xid is not None:
            try:
                xid.mark()  # the GPU's faults from now on are this request's (its kernel runs after the send)
            except Exception:
                xid = None
        try:
            assert self.conn is not None
            self.conn.send_bytes(data)
        except (OSError, EOFError) as exc:
            self._fault("died", f"sending to the worker failed ({exc})")
        t_sent = t_phase = time.monotonic()
        deadline = None if timeout is None else t_sent + timeout
        phase = ""
        while True:
            got = self._receive(deadline, timeout, phase, xid)
            if isinstance(got, CompiledEvent):
                self.events.append(got)
                continue
            if isinstance(got, BusyEvent):
                if deadline is not None and timeout is not None:
                    now = time.monotonic()
                    deadline = max(deadline, min(now + timeout, t_phase + timeout + compile_allowance))
                continue
            if isinstance(got, PhaseEvent):
                now = time.monotonic()
                self.marks.setdefault(got.what, now - t_sent)
                if phases is not None and got.what in phases and deadline is not None:
                    phase, timeout, t_phase = got.what, float(phases[got.what]), now
                    deadline = now + timeout
                continue
            if got.id != rid:
                self._fault("protocol", f"reply to request {got.id} while waiting for {rid}")
            if not got.ok and got.fatal:
                self._fault("fatal", got.error, info=got.body)
            if got.body.get("fatal"):
                self._fault("fatal", str(got.body.get("reason", "CUDA context lost")))
            return got

    def next_event(self, timeout: float | None) -> CompiledEvent:
        """The next queued or arriving compile event."""
        if self.events:
            return self.events.popleft()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            got = self._receive(deadline, timeout)
            if isinstance(got, CompiledEvent):
                return got
            if isinstance(got, (BusyEvent, PhaseEvent)):
                continue
            self._fault("protocol", f"unexpected reply {got.id} while waiting for compile results")

    def _receive(self, deadline: float | None, timeout: float | None,
                 phase: str = "", xid: Any = None) -> Reply | CompiledEvent | BusyEvent | PhaseEvent:
        conn = self.conn
        if conn is None:
            raise WorkerFault("died", "the worker is not running")
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not wait([conn], left) and not self._fault_reported_late(conn, phase, xid, timeout):
            since = {"launched": " of its kernel's launch", "ran": " of its kernel's end"}.get(phase, "")
            # a GPU may report a fault (an illegal address) a second or more after the launch
            maybe = ": a kernel that never ends, or a fault not reported yet" if phase == "launched" else ""
            self._fault("timeout", f"no answer from the worker within {timeout:.2f} s{since} (watchdog{maybe})",
                        phase=phase or "request", deadline_s=timeout)
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            try:
                self.proc.wait(timeout=EXIT_STATUS_WAIT_S)  # type: ignore[union-attr]
            except Exception:
                pass
            self._fault("died", f"the worker died ({self._exit_text()})")
        try:
            return decode_reply(raw)
        except ProtocolError as exc:
            self._fault("protocol", f"invalid reply from the worker: {exc}")
        raise AssertionError("unreachable")  # pragma: no cover

    def _fault_reported_late(self, conn: Any, phase: str, xid: Any, timeout: float | None) -> bool:
        """At a launched kernel's deadline: has the GPU reported a memory fault (an Xid) since the
        launch? Then the worker has :data:`FAULT_REPORT_GRACE_S` more to say so (True: it has
        something to read); a fault it still does not report is ``fatal``."""
        if phase != "launched" or xid is None:
            return False
        if not self.xids:  # the deadline has just passed: ask the GPU, once per request
            try:
                got = xid.faults()
            except Exception:
                return False
            if not got:
                return False
            self.xids = list(got)
            self._grace_until = time.monotonic() + FAULT_REPORT_GRACE_S
        left = self._grace_until - time.monotonic()  # the same grace for every message read within it
        if left > 0 and wait([conn], left):
            return True
        self._fault("fatal", f"the GPU reported Xid {', '.join(map(str, self.xids))} (a memory fault) while the "
                    f"check's kernel ran; the worker did not report it within {(timeout or 0.0) + FAULT_REPORT_GRACE_S:.2f} s "
                    f"of the launch", phase=phase, deadline_s=timeout)
        return False  # pragma: no cover (_fault raises)

    def _fault(self, kind: str, message: str, phase: str = "", deadline_s: float | None = None,
               info: Mapping[str, Any] | None = None) -> None:
        tail = self.log_tail() if kind in ("died", "fatal") else ""
        self.kill()
        raise WorkerFault(kind, message + tail, phase=phase, deadline_s=deadline_s, info=info)

    # -- background start ------------------------------------------------------------------
    def start_in_background(self) -> None:
        """Start the worker on a daemon thread, unless it runs or is starting."""
        with self._start_lock:
            if self._starting or self.alive:
                return
            self._starting = True

        def run() -> None:
            try:
                with self.lock:
                    self.ensure()
            except BaseException:  # a failed start: the first tuning starts (and reports) it again
                pass
            finally:
                self._starting = False
                self._ready.set()
                if self._on_started is not None:
                    self._on_started()

        self._ready.clear()
        threading.Thread(target=run, name="tiletune-worker-start", daemon=True).start()


def _discard(spares: list[WorkerProcess]) -> None:
    """Close spares no longer wanted, for good (a start still in progress cannot leave a child
    behind), on a background thread each."""
    for sp in spares:
        threading.Thread(target=sp.close, kwargs={"final": True}, name="tiletune-spare-close", daemon=True).start()


_workers: dict[tuple[str, int], WorkerProcess] = {}
_workers_lock = threading.Lock()
_prestarted: set[int | None] = set()  # prestart() arguments already handled
_preload: list[str] = []  # modules the ops' plans need: each new worker imports them as it starts


def worker_for(backend_key: str, device_index: int, factory: Callable[[], WorkerProcess]) -> WorkerProcess:
    """The process-wide worker for (backend, GPU), created by ``factory`` on first use."""
    with _workers_lock:
        w = _workers.get((backend_key, device_index))
        if w is None:
            w = _workers[(backend_key, device_index)] = factory()
        return w


def prestart(device_index: int | None = None, modules: Sequence[str] = ()) -> None:
    """Start the live cuTile worker for the current (or given) GPU in the background.

    Called by every isolated op when it is defined, with the modules its plan needs (``modules``): every
    worker started from now on imports them as it starts (before its first session asks for them).
    Only the first call per GPU argument starts a worker. Does nothing inside a worker, with
    ``TILETUNE_WORKER_PRESTART=0``, before torch is imported, or when torch sees no GPU.
    """
    if in_worker() or not settings.worker_prestart():
        return
    with _workers_lock:
        _preload.extend(m for m in modules if m not in _preload)
    if "torch" not in sys.modules:
        # torch imported on a side thread races the caller's own first import and, in a process that
        # ends at once, module teardown (torch's finalizers then print tracebacks at exit); a program
        # with CUDA tensors has imported torch by now, and a later definition prestarts
        return
    with _workers_lock:
        if device_index in _prestarted:
            return
        _prestarted.add(device_index)

    def run() -> None:
        try:
            import torch

            if not torch.cuda.is_available():
                return
            dev = torch.cuda.current_device() if device_index is None else device_index
            w = worker_for("cutile", dev, lambda: WorkerProcess("cutile", dev))
            if w.starts == 0:
                w.start_in_background()
        except Exception:  # best effort; tuning starts the worker itself otherwise
            pass

    threading.Thread(target=run, name="tiletune-worker-prestart", daemon=True).start()


def wait_for_worker(device_index: int | None = None, timeout: float | None = None) -> bool:
    """Wait until the live cuTile worker of a GPU (the current one by default) is running.

    Starts it if nothing has (returns False when it cannot start, e.g. without a GPU). Useful
    before timing a first call, or to pay the worker's start-up at a moment of your choosing.
    """
    import torch

    if not torch.cuda.is_available() or in_worker():
        return False
    dev = torch.cuda.current_device() if device_index is None else device_index
    w = worker_for("cutile", dev, lambda: WorkerProcess("cutile", dev))
    if not w.alive and not w._starting:
        w.start_in_background()
    t0 = time.monotonic()
    while w._starting or not w._ready.is_set():  # until it has answered hello (or failed)
        if timeout is not None and time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.02)
    return w.alive


def shutdown_all(final: bool = True) -> None:
    """Stop every worker of this process and its spare, gracefully and in parallel (see
    :meth:`WorkerProcess.close`), then free the CUDA memory they had released (a worker drops its
    views of this process's memory before it answers ``exit``; :func:`~tiletune.devices.workers.shipping.collect_shared`);
    registered with :mod:`atexit`."""
    with _workers_lock:
        ws = list(_workers.values())
        _workers.clear()

    def close(w: WorkerProcess) -> None:
        try:
            w.close(final=final)
        except Exception:
            try:
                w.kill()
            except Exception:
                pass

    threads = [threading.Thread(target=close, args=(w,), daemon=True) for w in ws]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10.0)
    collect_shared()
    if final:
        from tiletune.devices.workers.zygote import shutdown

        shutdown()


atexit.register(shutdown_all)
