"""Workers of a campaign and the scheduler that feeds them.

A pool holds one worker per GPU. Its workers are either local processes
(:class:`LocalPool`: ``python -m tiletune.lab.campaign.worker_main``, ``CUDA_VISIBLE_DEVICES`` naming
one GPU each) or Ray actors holding one GPU each (:class:`tiletune.lab.campaign.ray_pool.RayPool`).
Either way a worker hosts a :class:`~tiletune.lab.campaign.runner.CampaignRunner`, takes one task at a
time and answers with JSON, and every event (a worker ready, a result, a worker gone) arrives on one
queue, so :func:`schedule` is the same for both.

Scheduling: every worker holds its running task plus up to ``lookahead`` reserved ones (the next
tasks it will run, which it compiles ahead). A worker that finishes takes its first reserved task
and reserves the next from the queue; when the queue is empty, an idle worker takes the last
reserved task of the busiest other worker. A worker that dies fails the task it was running (with
its log's last lines), its reserved tasks go back to the queue, and a new worker takes its place
(at most ``max_restarts`` times per slot).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from tiletune.lab.campaign.spec import Task

logger = logging.getLogger("tiletune")

__all__ = ["Pool", "LocalPool", "schedule", "Event"]

#: ``(slot index, kind, payload)``; kind is "ready", "result", "died" or "failed" (setup failed).
Event = tuple[int, str, Any]


class Pool(Protocol):
    """Workers that each run one task at a time; their events go to ``events``."""

    events: "queue.Queue[Event]"
    size: int

    def start(self, slot: int) -> None:
        """Start (or restart) the worker of ``slot``; a "ready" or "failed" event follows."""

    def submit(self, slot: int, task: dict[str, Any], upcoming: list[dict[str, Any]]) -> None:
        """Run ``task`` on the worker of ``slot``; a "result" or "died" event follows."""

    def close(self) -> None:
        """Stop every worker."""


class LocalPool:
    """One worker process per GPU of this host."""

    def __init__(self, gpus: Sequence[str | None], setup: dict[str, Any], log_dir: str | None = None) -> None:
        self.gpus = list(gpus)
        self.size = len(self.gpus)
        self.setup = setup
        self.events: "queue.Queue[Event]" = queue.Queue()
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="tiletune-campaign-logs-")
        self.procs: dict[int, subprocess.Popen] = {}
        self._locks = collections.defaultdict(threading.Lock)

    def log_path(self, slot: int) -> str:
        return os.path.join(self.log_dir, f"worker{slot}.log")

    def start(self, slot: int) -> None:
        self._kill(slot)
        env = dict(os.environ)
        if self.gpus[slot] is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.gpus[slot])
        env.setdefault("PYTHONUNBUFFERED", "1")
        src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")  # this tiletune
        log = open(self.log_path(slot), "ab")
        try:
            proc = subprocess.Popen([sys.executable, "-m", "tiletune.lab.campaign.worker_main"], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=os.getcwd())
        finally:
            log.close()
        self.procs[slot] = proc
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(dict(self.setup, worker=slot)) + "\n").encode())
        proc.stdin.flush()
        threading.Thread(target=self._read, args=(slot, proc), name=f"tiletune-campaign-read{slot}",
                         daemon=True).start()

    def _read(self, slot: int, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if "ready" in msg:
                self.events.put((slot, "ready", msg["ready"]))
            elif "result" in msg:
                self.events.put((slot, "result", msg["result"]))
            elif "failed" in msg:
                self.events.put((slot, "failed", msg["failed"] + "\n" + str(msg.get("trace", ""))))
        code = proc.wait()
        if self.procs.get(slot) is proc:  # not a worker we replaced or stopped on purpose
            why = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            self.events.put((slot, "died", f"the worker process ended ({why}){self._tail(slot)}"))

    def _tail(self, slot: int, lines: int = 8) -> str:
        try:
            with open(self.log_path(slot), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4000))
                text = f.read().decode("utf-8", "replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        return ("\n  worker log: " + "\n  ".join(text)) if text else ""

    def submit(self, slot: int, task: dict[str, Any], upcoming: list[dict[str, Any]]) -> None:
        proc = self.procs[slot]
        try:
            assert proc.stdin is not None
            with self._locks[slot]:
                proc.stdin.write((json.dumps({"run": task, "upcoming": upcoming}) + "\n").encode())
                proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the reader reports the death

    def _kill(self, slot: int) -> None:
        proc = self.procs.pop(slot, None)
        if proc is None:
            return
        if proc.poll() is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass

    def close(self) -> None:
        for slot, proc in list(self.procs.items()):
            try:
                assert proc.stdin is not None
                proc.stdin.write(b'{"exit": true}\n')
                proc.stdin.close()
            except (BrokenPipeError, OSError, ValueError):
                pass
        deadline = time.monotonic() + 30
        for slot in list(self.procs):
            proc = self.procs[slot]
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self._kill(slot)


@dataclass
class _Slot:
    index: int
    info: dict[str, Any] | None = None
    running: Task | None = None
    reserved: list[Task] = field(default_factory=list)
    restarts: int = 0
    alive: bool = False


def schedule(pool: Pool, tasks: Sequence[Task], *, lookahead: int = 1, max_restarts: int = 2,
             on_result: Callable[[dict[str, Any], Task], None] | None = None,
             on_ready: Callable[[int, dict[str, Any]], None] | None = None,
             start_timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """Run every task on the pool (see the module docstring); returns the results in task order.
    ``on_result(result, task)`` is called as each result arrives (in the caller's thread)."""
    todo = collections.deque(tasks)
    results: dict[str, dict[str, Any]] = {}
    slots = [_Slot(i) for i in range(pool.size)]
    for s in slots:
        pool.start(s.index)
    starting = {s.index for s in slots}
    start_deadline = time.monotonic() + start_timeout_s

    def finish(task: Task, result: dict[str, Any]) -> None:
        results[task.id] = result
        if on_result is not None:
            on_result(result, task)

    def feed(s: _Slot) -> None:
        if not s.alive or s.running is not None:
            return
        if not s.reserved and not todo:  # steal the last reserved task of the busiest worker
            donors = [d for d in slots if d.alive and d.reserved]
            if donors:
                s.reserved.append(max(donors, key=lambda d: len(d.reserved)).reserved.pop())
        if s.reserved:
            s.running = s.reserved.pop(0)
        elif todo:
            s.running = todo.popleft()
        else:
            return
        while len(s.reserved) < lookahead and todo:
            s.reserved.append(todo.popleft())
        pool.submit(s.index, s.running.as_json(), [t.as_json() for t in s.reserved])

    def release(s: _Slot, why: str) -> None:
        if s.running is not None:
            finish(s.running, {"id": s.running.id, "worker": s.index, "ok": False, "error": why, "resolved": [],
                               "sessions": None, "start": time.time(), "end": time.time(), "seconds": 0.0})
            s.running = None
        todo.extendleft(reversed(s.reserved))
        s.reserved = []
        s.alive = False

    while len(results) < len(tasks):
        if not any(s.alive for s in slots) and not starting:
            for t in list(todo):
                finish(t, {"id": t.id, "worker": None, "ok": False, "error": "no campaign worker is left",
                           "resolved": [], "sessions": None, "start": time.time(), "end": time.time(),
                           "seconds": 0.0})
            todo.clear()
            break
        try:
            index, kind, payload = pool.events.get(timeout=1.0)
        except queue.Empty:
            if starting and time.monotonic() > start_deadline:
                for i in list(starting):
                    logger.warning("tiletune campaign: worker %d did not start within %.0f s", i, start_timeout_s)
                starting.clear()
            continue
        s = slots[index]
        if kind == "ready":
            starting.discard(index)
            s.info, s.alive = payload, True
            if on_ready is not None:
                on_ready(index, payload)
        elif kind == "result":
            task = s.running
            s.running = None
            if task is not None and payload.get("id") == task.id:
                finish(task, payload)
        elif kind in ("died", "failed"):
            starting.discard(index)
            was_alive = s.alive
            release(s, f"campaign worker {index} {'died' if kind == 'died' else 'could not start'}: {payload}")
            logger.warning("tiletune campaign: worker %d %s: %s", index, kind, str(payload).splitlines()[0])
            if was_alive and s.restarts < max_restarts:  # a worker that never started is not retried
                s.restarts += 1
                pool.start(index)
                starting.add(index)
        for slot in slots:
            feed(slot)
    return [results[t.id] for t in tasks]
