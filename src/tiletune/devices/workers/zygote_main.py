"""The zygote: a process that has imported torch and cuda.tile without touching the GPU, and forks
tuning workers on request.

A worker started from scratch spends seconds importing torch and cuda.tile before it can open a
session; forked from here it starts with them imported and pays for its CUDA context and its
kernels' packages only. Started by :mod:`tiletune.devices.workers.zygote`: as a fork of the process
that imported tiletune where that is safe (:func:`serve_forked`), else as
``python -m tiletune.devices.workers.zygote_main``. It talks to its caller over its standard input
(commands) and output (events), one JSON object per line, and leaves when its input closes.

Commands: ``{"op": "fork", "token": n, "env": {...}, "cwd": path, "log": path}`` forks a worker, which
takes the caller's environment and folder as they are now, writes its output to ``log`` and runs
:func:`tiletune.devices.workers.worker_main.main`. The kernels' own packages are imported by each
worker as it starts (``TILETUNE_WORKER_PRELOAD``), not here: many touch the GPU when imported (TileGym
does), after which no process may fork; ``TILETUNE_ZYGOTE_IMPORTS`` names packages known not to.

Events: ``ready`` (imports done), ``forked`` (its pid) or ``refused``, and ``exit`` (a worker's exit
status, as :attr:`subprocess.Popen.returncode` gives it): the zygote reaps its workers, so their
statuses reach the caller through it.

Forking is only safe while this process runs one thread and holds no CUDA state: after every import
it checks (torch's CUDA not initialised, no ``/dev/nvidia*`` descriptor open, one OS thread) and, once
that fails, refuses every fork (the caller then starts workers from scratch) and says which import
made it unsafe.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import sys
import time

#: Imports whose native threads are tolerated (see :func:`fork_hazards`).
TORCH_MODULES = ("torch", "torch.multiprocessing")

#: What every worker imports; imported here at start (each one that fails is skipped).
BASE_MODULES = (
    "torch",
    "torch.multiprocessing",
    "cuda.tile",
    "tiletune.devices.workers.worker_main",
    "tiletune.devices.workers.shipping",
    "tiletune.devices.backends.cutile",
    "tiletune.devices.verify",
    "tiletune.devices.measure",
    "tiletune.devices.compile_pool",
)


#: The step after the imports that warms cuTile's compiler (:func:`Zygote.warm_compiler`); a name in
#: ``TILETUNE_ZYGOTE_SKIP`` like a module's, should it ever make forking unsafe.
COMPILER_STEP = "tiletune:compiler"


def os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def fork_hazards(allowed_threads: int = 1) -> str:
    """Why forking this process now would be unsafe ("" when it is safe). ``allowed_threads``: OS
    threads tolerated (those ``import torch`` starts, which PyTorch's own forking data loaders live
    with); a Python thread besides the main one never is."""
    import threading

    if threading.active_count() > 1:
        return f"{threading.active_count()} Python threads run"
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return "torch initialised CUDA"
    except Exception:  # noqa: BLE001 - a torch without the attribute
        pass
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            return f"a GPU device file is open ({target})"
    threads = os_threads()
    if threads > allowed_threads:
        return f"{threads} threads run"
    return ""


class Zygote:
    """The command loop (one per process)."""

    def __init__(self, skip: set[str]) -> None:
        self.skip = set(skip)
        self.hazard = ""  # non-empty: forks are refused
        self.hazard_module = ""
        self.allowed_threads = 1  # raised to what importing torch starts
        self.children: set[int] = set()
        self.inbuf = b""
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)

    def emit(self, event: dict) -> None:
        data = (json.dumps(event) + "\n").encode()
        while data:
            n = os.write(1, data)
            data = data[n:]

    def load(self, modules: list[str]) -> tuple[list[str], dict[str, str]]:
        """Import ``modules`` in order (stopping at the first that makes forking unsafe)."""
        done: list[str] = []
        failed: dict[str, str] = {}
        for name in modules:
            if self.hazard:
                break
            if name in self.skip:
                failed[name] = "skipped (made forking unsafe before)"
                continue
            if name in sys.modules:
                done.append(name)
                continue
            try:
                importlib.import_module(name)
                done.append(name)
            except BaseException as exc:  # noqa: BLE001 - a module that cannot be imported here
                failed[name] = f"{type(exc).__name__}: {exc}"[:300]
            if name in TORCH_MODULES:
                self.allowed_threads = max(self.allowed_threads, os_threads())
            hazard = fork_hazards(self.allowed_threads)
            if hazard:
                self.hazard, self.hazard_module = hazard, name
        return done, failed

    def warm_compiler(self, failed: dict[str, str]) -> bool:
        """Load cuTile's compiler, ask ``tileiras`` its version and bytecode level (subprocesses, ended
        before this returns) and load the compile pool's internals, so that every worker forked from here
        starts compiling at once instead of paying for them first (a few tenths of a second on each
        worker's first compile). The toolchain's versions are recorded beside cuTile's cache on the way,
        where the caller reads them instead of loading the compiler on its first miss. Skipped after a
        hazard, or when named in the skip list (it made forking unsafe once: treated as a module that
        did). True when it ran."""
        if self.hazard or COMPILER_STEP in self.skip:
            return False
        try:
            from tiletune.devices.backends.cutile import warm_compiler
            from tiletune.devices.compile_pool import load_internals

            warm_compiler()
            load_internals()
        except BaseException as exc:  # noqa: BLE001 - each worker does it itself then
            failed[COMPILER_STEP] = f"{type(exc).__name__}: {exc}"[:300]
        hazard = fork_hazards(self.allowed_threads)
        if hazard:
            self.hazard, self.hazard_module = hazard, COMPILER_STEP
        return True

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the wakeup descriptor
        t0 = time.perf_counter()
        extra = [m for m in os.environ.get("TILETUNE_ZYGOTE_IMPORTS", "").split(",") if m.strip()]
        done, failed = self.load(list(BASE_MODULES) + [m.strip() for m in extra])
        t1 = time.perf_counter()
        warmed = self.warm_compiler(failed)
        self.emit({"event": "ready", "pid": os.getpid(), "import_s": round(t1 - t0, 3),
                   "compiler_s": round(time.perf_counter() - t1, 3) if warmed else None,
                   "modules": done, "failed": failed, "hazard": self.hazard, "hazard_module": self.hazard_module})
        while True:
            self.reap()
            try:
                readable, _, _ = select.select([0, self.wake_r], [], [], 1.0)
            except InterruptedError:
                continue
            if self.wake_r in readable:
                try:
                    while os.read(self.wake_r, 512):
                        pass
                except (BlockingIOError, OSError):
                    pass
            if 0 in readable:
                chunk = os.read(0, 65536)
                if not chunk:
                    return  # the caller is gone (or closed us)
                self.inbuf += chunk
                while b"\n" in self.inbuf:
                    line, self.inbuf = self.inbuf.split(b"\n", 1)
                    if line.strip():
                        self.handle(json.loads(line))

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self.children.discard(pid)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            self.emit({"event": "exit", "pid": pid, "status": code})

    def handle(self, cmd: dict) -> None:
        op = cmd.get("op")
        if op == "fork":
            token = cmd.get("token")
            if self.hazard:
                self.emit({"event": "refused", "token": token, "why": self.hazard})
                return
            hazard = fork_hazards(self.allowed_threads)
            if hazard:
                self.hazard = hazard
                self.emit({"event": "refused", "token": token, "why": hazard})
                return
            pid = os.fork()
            if pid == 0:
                self.become_worker(cmd)  # never returns
            self.children.add(pid)
            self.emit({"event": "forked", "token": token, "pid": pid})

    def become_worker(self, cmd: dict) -> None:
        code = 1
        try:
            os.setsid()  # a group of its own: the caller kills the worker and its compile processes at once
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (self.wake_r, self.wake_w):
                os.close(fd)
            log = os.open(cmd["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(null)
            os.close(log)
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in cmd["env"].items()})
            os.chdir(cmd.get("cwd") or "/")
            from tiletune.devices.workers import worker_main

            worker_main.main()  # ends with os._exit(0)
            code = 0
        except BaseException:  # noqa: BLE001 - report and leave; never return into the zygote's loop
            import traceback

            try:
                traceback.print_exc()
                sys.stderr.flush()
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)


def serve(skip: set[str]) -> None:
    """Run the command loop on this process's standard input and output; leaves through ``os._exit``."""
    try:
        Zygote(skip).run()
    finally:
        try:
            sys.stdout.flush()
        except BaseException:  # noqa: BLE001 - leaving anyway
            pass
        os._exit(0)


def main() -> None:
    os.environ["TILETUNE_IN_WORKER"] = "1"
    extra = os.environ.get("TILETUNE_WORKER_SYSPATH")
    if extra:
        for p in json.loads(extra):
            if p not in sys.path:
                sys.path.append(p)
    serve({m for m in os.environ.get("TILETUNE_ZYGOTE_SKIP", "").split(",") if m})


def forget_import_locks() -> list[str]:
    """In a process forked in the middle of an import (``import tiletune`` forks the zygote), release
    this thread's hold on the import machinery: the modules being imported (``tiletune`` and whatever
    imported it) stay locked by this thread for good, as it never returns from that import, so any
    other thread importing a submodule of theirs would wait for ever (a worker's compile threads
    do). Their locks are dropped from importlib's table, so later imports take fresh ones. Returns
    the names of those modules."""
    import _thread
    import importlib._bootstrap as bootstrap

    locks = getattr(bootstrap, "_module_locks", None)
    if not isinstance(locks, dict):
        return []
    me = _thread.get_ident()
    dropped: list[str] = []
    for name, ref in list(locks.items()):
        try:
            lock = ref() if callable(ref) else ref
        except Exception:  # noqa: BLE001 - an entry of another shape: leave it
            continue
        if lock is not None and getattr(lock, "owner", None) == me:
            locks.pop(name, None)
            dropped.append(name)
    return dropped


_KEPT: list = []  # the caller's logging handlers, detached but never finalised here


def _detach_logging() -> None:
    """Take the caller's logging handlers off every logger: their files' descriptors were closed here,
    and a number reused by then (a worker's connection) would receive their records. The handlers stay
    referenced (:data:`_KEPT`), so none is finalised and flushes what the caller had buffered into such
    a number. Records then go where a fresh interpreter's would (warnings to standard error: the log)."""
    import logging

    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for lg in loggers:
        if lg.handlers:
            _KEPT.append(list(lg.handlers))
            lg.handlers = []


def isolate(commands: int, events: int, log_path: str) -> None:
    """Make a fork of the caller a process of its own (see :func:`serve_forked`): a session of its own,
    ``commands`` / ``events`` / ``log_path`` as its standard input / output / error, every other
    descriptor closed, the caller's garbage frozen, its logging handlers detached, ``sys`` streams on
    the log, its Python signal handlers reset."""
    os.setsid()
    import gc

    gc.freeze()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(commands, 0)
    os.dup2(events, 1)
    os.dup2(log, 2)
    os.closerange(3, 1 << 20)
    _detach_logging()
    sys.stdin = open(0, "rb", buffering=0, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stdout = sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    try:
        signal.set_wakeup_fd(-1)
    except (ValueError, OSError):
        pass
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
            if sig == signal.SIGINT:
                signal.signal(sig, signal.default_int_handler)
            elif callable(handler):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass


def serve_forked(commands: int, events: int, log_path: str, skip: set[str]) -> None:
    """The zygote as a fork of the process that imported tiletune (its imports done already): made a
    process of its own before it serves. Never returns.

    * a session of its own (the caller's terminal signals and job-control groups do not reach it);
    * ``commands`` / ``events`` become its standard input / output, its standard error goes to
      ``log_path``, and every other descriptor the caller had is closed: a pipe, socket or lock file
      of the caller's must not stay open here (a child of the caller waiting for end-of-file on a pipe
      would wait for this process too). The caller's garbage is frozen first (``gc.freeze``), so no
      object of the caller's is finalised here and closes a descriptor number reused by now;
    * ``sys.stdout`` / ``sys.stderr`` write to the log (output the caller buffered is never flushed
      here: this process leaves through ``os._exit``), the caller's logging handlers are detached
      (:func:`_detach_logging`), Python signal handlers of the caller's are reset (none of the
      caller's code runs here);
    * the import locks this thread holds (it was forked inside ``import tiletune``) are dropped
      (:func:`forget_import_locks`), and the caller's modules whose import was under way (the module
      that imported tiletune, what imported it) are removed from ``sys.modules``: partly run here,
      they are imported anew where a worker needs them;
    * torch runs one CPU thread (a thread pool the caller started is not in this copy of it).
    """
    code = 1
    try:
        isolate(commands, events, log_path)
        os.environ["TILETUNE_IN_WORKER"] = "1"
        for name in forget_import_locks():
            # a module of the caller's whose import was under way when it forked (the one that imported
            # tiletune, and what imported that one) holds only what ran before that line here: forgotten,
            # so that a worker needing it (a plan defined there) imports it whole, as a fresh process would
            if name != "tiletune" and not name.startswith("tiletune."):
                sys.modules.pop(name, None)
        torch = sys.modules.get("torch")
        if torch is not None:
            try:
                torch.set_num_threads(1)
            except Exception:  # noqa: BLE001 - a torch without it
                pass
        code = 0
        serve(skip)
    except BaseException:  # noqa: BLE001 - never return into the caller's code
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
