"""Caller side of the zygote (:mod:`tiletune.devices.workers.zygote_main`): tuning workers forked from
a process that has imported torch and cuda.tile already.

A worker started from scratch imports both before it can open a session (seconds); forked from the
zygote it starts with them imported and pays for its CUDA context and its kernels' own packages
(imported as it starts, :func:`plan_modules`). That matters three times: the first tuning session
(the zygote starts when ``tiletune`` is imported on a machine with an NVIDIA GPU, so its imports
overlap the user's program), the warm spare that replaces a worker lost to a fault, and every later
replacement.

:func:`zygote` is the process-wide one (None where it cannot serve: no GPU, ``TILETUNE_WORKER_ZYGOTE=0``,
inside a worker). :meth:`Zygote.fork` asks for a worker and returns a :class:`ForkedProcess` (a
:class:`subprocess.Popen` look-alike) or None, and the caller then starts the worker from scratch: a
zygote that could not start, died, or whose imports made forking unsafe (CUDA touched, a thread
started) never blocks a worker, it only stops saving time. A caller whose environment changed since
the zygote started (variables that cuTile or torch read on import) gets a fresh zygote.

How the zygote starts (``TILETUNE_ZYGOTE_START``): by default as a fork of the process that imports
tiletune, where :func:`caller_fork_hazard` finds that safe (one Python thread, CUDA untouched, no GPU
device file open, at most :data:`FORK_MAX_PRIVATE_BYTES` of private memory): it then has the caller's
imports (torch, cuda.tile, the kernels' packages) in milliseconds. Otherwise, and with ``spawn``, as a
fresh interpreter that imports torch and cuda.tile itself (seconds, beside the program).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import types
from typing import Any, Callable, Iterable

from tiletune import settings

logger = logging.getLogger("tiletune")

__all__ = ["Zygote", "ForkedProcess", "zygote", "start_at_import", "plan_modules", "gpu_visible", "shutdown"]

#: Environment variables read when torch or cuda.tile is imported (the zygote's copies of those modules
#: keep what they read then): a caller whose values differ gets a fresh zygote.
IMPORT_TIME_PREFIXES = ("CUDA_TILE_", "TORCH_", "PYTORCH_")
IMPORT_TIME_NAMES = ("CUDA_HOME", "CUDA_PATH", "XDG_CACHE_HOME", "HOME", "LD_LIBRARY_PATH")


def import_time_env(env: dict[str, str] | os._Environ) -> tuple[tuple[str, str], ...]:
    """The variables of ``env`` that the zygote's imports may have read (sorted pairs)."""
    return tuple(sorted((k, v) for k, v in env.items()
                        if k.startswith(IMPORT_TIME_PREFIXES) or k in IMPORT_TIME_NAMES))


def gpu_visible() -> bool:
    """Whether an NVIDIA GPU is visible to this process, read without CUDA (the driver's files)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return os.path.exists("/dev/nvidia0")


class _Signalled:
    """``send_signal`` / ``kill`` / ``terminate`` of a :class:`subprocess.Popen` look-alike with a ``pid``
    and a ``poll`` (a process that has ended is not signalled)."""

    pid: int

    def poll(self) -> int | None:  # pragma: no cover - defined by each subclass
        raise NotImplementedError

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        import signal

        self.send_signal(signal.SIGTERM)


class ForkedProcess(_Signalled):
    """A worker forked by the zygote, seen as a :class:`subprocess.Popen`: ``pid``, ``poll``,
    ``wait``, ``kill``, ``terminate``, ``returncode``. The zygote reaps it and reports its exit status;
    should the zygote itself be gone, a process that no longer exists counts as ended (status 1)."""

    def __init__(self, pid: int, owner: "Zygote") -> None:
        self.pid = pid
        self.owner = owner
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self.owner.exit_status(self.pid)
            if code is not None:
                self.returncode = code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout or 0.0)
            self.owner.wait_exit(self.pid, 0.05 if left is None else min(0.05, left))
        assert self.returncode is not None
        return self.returncode


#: The most private memory (``RssAnon``) a process may hold and still be forked into the zygote: the
#: zygote keeps every page of it alive for the life of the process (a large tensor the caller frees later
#: would stay in memory), so a process holding more gets a fresh interpreter instead.
FORK_MAX_PRIVATE_BYTES = 3 << 29  # 1.5 GiB


def _private_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def caller_fork_hazard() -> str:
    """Why this process may not be forked into the zygote now ("" when it may): not Linux, a Python
    thread besides this one (a lock it holds would stay held in the copy), CUDA initialised or a GPU
    device file open (a copy could never use CUDA), too much private memory
    (:data:`FORK_MAX_PRIVATE_BYTES`), interpreter shutting down. Native threads that libraries start on
    import (OpenBLAS's pool) are tolerated, as the spawned zygote tolerates those of ``import torch``."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return "not Linux"
    if sys.is_finalizing():
        return "the interpreter is exiting"
    if threading.active_count() > 1:
        return f"{threading.active_count()} Python threads run"
    from tiletune.devices.workers.zygote_main import fork_hazards

    hazard = fork_hazards(allowed_threads=1 << 30)  # CUDA state, GPU device files (threads judged above)
    if hazard:
        return hazard
    private = _private_bytes()
    if private > FORK_MAX_PRIVATE_BYTES:
        return f"{private >> 20} MiB of private memory"
    return ""


class _CallerFork(_Signalled):
    """The zygote forked from this process, seen as the :class:`subprocess.Popen` the spawned one is:
    ``pid``, ``stdin`` (commands), ``stdout`` (events), ``poll``, ``wait``, ``kill``."""

    def __init__(self, pid: int, stdin: Any, stdout: Any) -> None:
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped by someone else (a SIGCHLD handler of the program's)
                    self.returncode = 1
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["tiletune-zygote"], timeout or 0.0)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode


def _fork_caller(log_path: str, skip: set[str]) -> _CallerFork:
    """Fork this process into the zygote (:func:`tiletune.devices.workers.zygote_main.serve_forked`)."""
    import warnings

    from tiletune.devices.workers import zygote_main

    cmd_r, cmd_w = os.pipe()
    ev_r, ev_w = os.pipe()
    try:
        with warnings.catch_warnings():  # Python 3.12 warns of native threads (OpenBLAS's): tolerated, see above
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except BaseException:
        for fd in (cmd_r, cmd_w, ev_r, ev_w):
            os.close(fd)
        raise
    if pid == 0:  # pragma: no cover - the child never returns (covered through its behaviour in tests)
        zygote_main.serve_forked(cmd_r, ev_w, log_path, skip)
    os.close(cmd_r)
    os.close(ev_w)
    return _CallerFork(pid, os.fdopen(cmd_w, "wb"), os.fdopen(ev_r, "rb"))


class Zygote:
    """One zygote process and the thread that reads its events."""

    def __init__(self, env: dict[str, str] | None = None, skip: Iterable[str] = ()) -> None:
        self.skip = set(skip)
        self.env_key = import_time_env(os.environ if env is None else env)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._tokens = itertools.count(1)
        self._replies: dict[int, dict] = {}
        self._exits: dict[int, int] = {}
        self.ready = False
        self.dead = False
        self.hazard = ""  # why the zygote refuses forks ("" while it forks)
        self.hazard_module = ""
        self.info: dict[str, Any] = {}
        self.forks = 0
        self._log_dir = tempfile.mkdtemp(prefix="tiletune-zygote-")
        self.log_path = os.path.join(self._log_dir, "zygote.log")
        env_now = dict(os.environ if env is None else env)
        env_now["TILETUNE_IN_WORKER"] = "1"
        env_now["TILETUNE_WORKER_SYSPATH"] = json.dumps([p for p in sys.path if p])
        if self.skip:
            env_now["TILETUNE_ZYGOTE_SKIP"] = ",".join(sorted(self.skip))
        root = os.path.dirname(os.path.dirname(os.path.abspath(settings.__file__)))
        env_now["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env_now.get("PYTHONPATH", "").split(os.pathsep) if p])
        env_now.setdefault("PYTHONUNBUFFERED", "1")
        self.started_by = "spawn"  # or "fork": a fork of this process (its imports done already)
        self.fork_refused = ""  # why this process could not be forked (when that was wanted)
        self.proc: Any = None
        try:
            start = settings.zygote_start()
        except ValueError:  # an invalid TILETUNE_ZYGOTE_START (settings reports it): the safe way
            start = "spawn"
        if start == "fork" and env is None:
            self.fork_refused = caller_fork_hazard()
            if not self.fork_refused:
                self.proc = _fork_caller(self.log_path, self.skip)
                self.started_by = "fork"
        if self.proc is None:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen([sys.executable, "-m", "tiletune.devices.workers.zygote_main"],
                                             env=env_now, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                             cwd=os.getcwd(), start_new_session=True)
        self._reader = threading.Thread(target=self._read, name="tiletune-zygote-events", daemon=True)
        self._reader.start()

    # -- events --------------------------------------------------------------------------------
    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        try:
            for line in out:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                self._on_event(ev)
        except (OSError, ValueError):
            pass
        with self._lock:
            self.dead = True
            self._changed.notify_all()

    def _on_event(self, ev: dict) -> None:
        kind = ev.get("event")
        with self._lock:
            if ev.get("hazard"):
                self.hazard, self.hazard_module = str(ev["hazard"]), str(ev.get("hazard_module", ""))
            if kind == "ready":
                self.ready = True
                self.info = ev
            elif kind in ("forked", "refused"):
                self._replies[int(ev["token"])] = ev
            elif kind == "exit":
                self._exits[int(ev["pid"])] = int(ev["status"])
            self._changed.notify_all()
        if kind == "ready" and ev.get("hazard"):
            logger.debug("tiletune zygote: forking is unsafe after importing %s (%s); workers start from scratch",
                         ev.get("hazard_module"), ev.get("hazard"))

    def _send(self, cmd: dict) -> bool:
        data = (json.dumps(cmd) + "\n").encode()
        try:
            with self._write_lock:  # not the state lock: a full pipe must not stop the event reader
                if self.dead:
                    return False
                assert self.proc.stdin is not None
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            return True
        except (OSError, ValueError):
            with self._lock:
                self.dead = True
                self._changed.notify_all()
            return False

    # -- what the caller asks --------------------------------------------------------------------
    @property
    def usable(self) -> bool:
        """Alive and not known to refuse forks."""
        return not self.dead and not self.hazard and self.proc.poll() is None

    def fork(self, env: dict[str, str], cwd: str, log_path: str, timeout: float) -> ForkedProcess | None:
        """A worker forked with ``env`` in ``cwd``, its output in ``log_path``; None when the zygote
        cannot (dead, unsafe, a changed environment, no answer within ``timeout`` seconds)."""
        if not self.usable or import_time_env(env) != self.env_key:
            return None
        token = next(self._tokens)
        if not self._send({"op": "fork", "token": token, "env": env, "cwd": cwd, "log": log_path}):
            return None
        deadline = time.monotonic() + timeout
        with self._lock:
            while token not in self._replies and not self.dead:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None  # a fork answered later is reaped by the zygote when it ends
                self._changed.wait(min(left, 0.5))
            reply = self._replies.pop(token, None)
        if reply is None or reply.get("event") != "forked":
            return None
        self.forks += 1
        return ForkedProcess(int(reply["pid"]), self)

    def exit_status(self, pid: int) -> int | None:
        with self._lock:
            code = self._exits.get(pid)
            dead = self.dead
        if code is not None:
            return code
        if dead:  # nobody reports it any more: gone counts as ended
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return 1
            except PermissionError:
                return None
        return None

    def wait_exit(self, pid: int, timeout: float) -> None:
        with self._lock:
            if pid not in self._exits and not self.dead:
                self._changed.wait(timeout)
        if self.dead:
            time.sleep(min(timeout, 0.05))

    def close(self) -> None:
        """End the zygote at once (it holds nothing worth a wait; a program that never tuned must not
        wait for its imports at exit); the workers it forked are not affected."""
        with self._lock:
            stdin = self.proc.stdin
            self.dead = True
            self._changed.notify_all()
        try:
            if stdin is not None:
                stdin.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass
        if not settings.worker_trace():
            import shutil

            shutil.rmtree(self._log_dir, ignore_errors=True)


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()
_skip: set[str] = set()  # modules that made a zygote unsafe: later zygotes skip them
_closed = False


def _wanted() -> bool:
    if _closed or settings.in_worker():
        return False
    mode = settings.worker_zygote()
    if mode == "auto":
        return gpu_visible()
    return mode == "on"


def zygote(start: bool = True) -> Zygote | None:
    """The process-wide zygote (started when ``start`` and wanted; replaced when it died, became
    unsafe or the environment it was started with changed), or None."""
    global _zygote
    try:
        if not _wanted():
            return None
    except ValueError:  # an invalid TILETUNE_WORKER_ZYGOTE: workers start from scratch (settings reports it)
        return None
    with _zygote_lock:
        z = _zygote
        if z is not None and z.usable and z.env_key == import_time_env(os.environ):
            return z
        if not start:
            return None
        if z is not None:
            if z.hazard_module and z.hazard_module not in ("torch", "torch.multiprocessing"):
                _skip.add(z.hazard_module)
            elif z.hazard:  # torch itself: no zygote can serve here
                return None
            threading.Thread(target=z.close, daemon=True).start()
        try:
            _zygote = Zygote(skip=_skip)
        except OSError as exc:
            logger.debug("tiletune zygote: could not start (%s)", exc)
            _zygote = None
        return _zygote


def start_at_import() -> None:
    """Start the zygote when ``tiletune`` is imported, on a machine with an NVIDIA GPU (a no-op
    elsewhere, inside workers, or with ``TILETUNE_WORKER_PRESTART=0`` / ``TILETUNE_WORKER_ZYGOTE=0``)."""
    try:
        if settings.worker_prestart():
            zygote()
    except Exception:  # noqa: BLE001 - never fail an import over a speed-up
        pass


def _imported_by_name(fn: Any) -> bool:
    """Whether a worker gets the function ``fn`` by importing its module (cloudpickle's rule: a function
    bound to its name in an imported module other than ``__main__``; tiletune's: a plan bound there under
    ``@tt.autotune``), rather than by value. A name not bound yet counts as bound: a plan being decorated
    is bound to its name once its op is made."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or ""
    if not module or module in ("__main__", "__mp_main__") or not qualname or "<" in qualname:
        return False
    obj: Any = sys.modules.get(module)
    if obj is None:
        return False
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except Exception:  # noqa: BLE001 - not bound (yet)
            return True
    return obj is fn or getattr(obj, "plan", None) is fn


def plan_modules(functions: Iterable[Callable[..., Any] | None], limit: int = 64) -> list[str]:
    """The modules a worker imports to load these functions (a plan, its reference...): their own
    modules and those of the objects their code names (kernels, helpers), following functions of the
    same module (such as ``__main__``) one level at a time; ``__main__`` and builtins left out.

    A function the worker gets by value (a script's, a notebook's, a closure) brings no import of its own
    module, and a cuTile kernel it names travels by value (:mod:`tiletune.devices.workers.shipping`, unless
    ``TILETUNE_SHIP_KERNELS=reference``): that kernel's module is not listed either, only the modules its
    code names. A function imported by name brings its module, and with it the kernels it names."""
    mods: list[str] = []
    seen_code: set[int] = set()
    kernel_cls = None
    try:
        from tiletune.devices.workers.shipping import _cutile_kernel_class

        if settings.ship_kernels() == "value":
            kernel_cls = _cutile_kernel_class()
    except ValueError:  # an invalid TILETUNE_SHIP_KERNELS: list as for kernels by reference (dumps reports it)
        pass

    def add(name: str | None) -> None:
        if name and name not in ("__main__", "builtins", "__mp_main__") and name in sys.modules and name not in mods:
            mods.append(name)

    def codes(code: types.CodeType) -> Iterable[types.CodeType]:
        yield code
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                yield from codes(c)

    # (function, home): home is the globals of the by-value kernel whose pickle the function is part of
    # (a function of that kernel's module goes by value with it), else None
    todo: list[tuple[Any, Any]] = [(f, None) for f in functions if f is not None]
    while todo and len(mods) < limit:
        fn, home = todo.pop(0)
        fn = getattr(fn, "__func__", fn)
        code = getattr(fn, "__code__", None)
        if code is None:
            add(getattr(fn, "__module__", None))
            continue
        if id(code) in seen_code:
            continue
        seen_code.add(id(code))
        by_value = home is not None or not _imported_by_name(fn)
        if not by_value:
            add(getattr(fn, "__module__", None))
        g = getattr(fn, "__globals__", {})
        for c in codes(code):
            for name in c.co_names:
                obj = g.get(name)
                if obj is None:
                    continue
                if isinstance(obj, types.ModuleType):
                    add(obj.__name__)
                elif isinstance(obj, types.FunctionType):
                    if home is not None and (obj.__globals__ is home or obj.__module__ == fn.__module__):
                        todo.append((obj, home))  # pickled by value with its kernel
                    elif obj.__globals__ is g:
                        todo.append((obj, None))
                    else:
                        add(obj.__module__)
                elif by_value and kernel_cls is not None and isinstance(obj, kernel_cls):
                    pyfunc = getattr(obj, "_pyfunc", None)
                    if isinstance(pyfunc, types.FunctionType):
                        todo.append((pyfunc, pyfunc.__globals__))  # by value: its module is not imported
                elif not isinstance(obj, (int, float, str, bytes, tuple)):
                    add(getattr(obj, "__module__", None))
                    inner = getattr(obj, "_pyfunc", None) or getattr(obj, "__wrapped__", None)  # a cuTile kernel
                    if isinstance(inner, types.FunctionType):
                        add(inner.__module__)
    return mods[:limit]


def shutdown() -> None:
    """Close the zygote; no zygote starts afterwards. Called at interpreter exit after the workers
    closed (:func:`tiletune.devices.workers.client.shutdown_all`); a zygote nobody closes leaves when
    its caller's end of the pipe closes."""
    global _zygote, _closed
    with _zygote_lock:
        _closed = True
        z, _zygote = _zygote, None
    if z is not None:
        z.close()

