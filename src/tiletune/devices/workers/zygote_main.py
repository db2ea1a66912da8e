"""The zygote: a process that has imported torch and cuda.tile without touching the GPU, and forks
tuning workers on request.

A worker started from scratch spends seconds importing torch and cuda.tile before it can open a
session; forked from here it starts with them imported and pays for its CUDA context and its
kernels' packages only. Started by :mod:`tiletune.devices.workers.zygote` as
``python -m tiletune.devices.workers.zygote_main``; it talks to its caller over its standard input
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

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the wakeup descriptor
        t0 = time.perf_counter()
        extra = [m for m in os.environ.get("TILETUNE_ZYGOTE_IMPORTS", "").split(",") if m.strip()]
        done, failed = self.load(list(BASE_MODULES) + [m.strip() for m in extra])
        self.emit({"event": "ready", "pid": os.getpid(), "import_s": round(time.perf_counter() - t0, 3),
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


def main() -> None:
    os.environ["TILETUNE_IN_WORKER"] = "1"
    extra = os.environ.get("TILETUNE_WORKER_SYSPATH")
    if extra:
        for p in json.loads(extra):
            if p not in sys.path:
                sys.path.append(p)
    skip = {m for m in os.environ.get("TILETUNE_ZYGOTE_SKIP", "").split(",") if m}
    try:
        Zygote(skip).run()
    finally:
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
