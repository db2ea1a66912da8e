"""The worker side of a campaign: one :class:`CampaignRunner` per GPU runs tasks one at a time.

The same class runs in a local worker process (:mod:`tiletune.lab.campaign.worker_main`) and in a Ray
actor (:mod:`tiletune.lab.campaign.ray_pool`). It speaks JSON only: a task in, a result out.

* **Its own database.** The runner tunes into a private database in a temporary folder, seeded
  with the caller's winners, so a key the caller already holds is a database hit here (the campaign
  skips it) and everything the runner tunes comes back to the caller as a database export (JSON,
  validated by :meth:`~tiletune.store.TuningDB.import_json`), whichever host it ran on.
* **A task** is one call (:class:`~tiletune.lab.fill.Call`): its tensors are made on the runner's GPU,
  the call is made inside :func:`~tiletune.resolve.chain.miss_scope` with the task's strategy and budget,
  and every key it resolved (tuned, or found) is reported with its identity.
* **Compiles ahead.** With each task the caller names the next ones it reserved for this runner.
  Their tensors are allocated at once (no kernel runs), and a background thread finds the tuned op
  each of them will miss (:func:`~tiletune.op.tuned_op.first_launch`) and compiles its candidates into
  cuTile's disk cache on this runner's share of the host cores, while the GPU measures the current
  task. When their turn comes, their sessions find every cubin in the cache. A task waits for its own
  ahead-of-time compile to finish before it starts, so nothing is compiled twice.
"""

from __future__ import annotations

import io
import logging
import os
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from tiletune.lab.campaign.spec import Task

logger = logging.getLogger("tiletune")

__all__ = ["CampaignRunner", "precompile"]


@dataclass
class _Prepared:
    """A task's callable and its allocated (not yet filled) arguments."""

    task: Task
    fn: Any
    args: list[Any]
    kwargs: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    stats: dict[str, Any] = field(default_factory=dict)


def precompile(fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any], *, workers: int | None = None,
               strategy: Any = None, budget: Any = None) -> dict[str, Any]:
    """Compile the candidates of the first tuned op ``fn(*args, **kwargs)`` would tune, into cuTile's
    disk cache, without tuning or launching anything. Returns what it did (``{"jobs", "cached",
    "errors", "seconds"}``) or why it did nothing (``{"skipped": reason}``)."""
    from tiletune.devices.compile_pool import CompileJob, CompilePool
    from tiletune.op.tuned_op import first_launch

    t0 = time.perf_counter()
    hit = first_launch(fn, *args, **kwargs)
    if hit is None:
        return {"skipped": "the call reaches no tuned op"}
    if hit.key is not None:
        return {"skipped": "the key is cached in this process"}
    op, a = hit.op, hit.args
    backend = op.backend
    hinted = getattr(backend, "hinted", None)
    if hinted is None:
        return {"skipped": f"the {getattr(backend, 'name', '?')} backend compiles nothing ahead"}
    if (strategy or op.strategy or "exhaustive") != "exhaustive" or (budget or op.budget or None) is not None:
        return {"skipped": "a strategy or budget other than exhaustive: its proposals are not known ahead"}
    dev = backend.arg_device(a)
    arch = backend.device_info(dev).arch
    if op.bucket_config(*a) is not None:
        return {"skipped": "a tuned bucket"}
    if op.stored_config(*a) is not None:
        return {"skipped": "stored"}
    jobs = []
    for i, cfg in enumerate(op.space.candidates(arch)):
        try:
            spec = op.launch_spec(cfg, a)
            jobs.append(CompileJob(i, hinted.get(spec.kernel, cfg.hints), tuple(spec.args), arch))
        except Exception:  # noqa: BLE001 - the session reports a plan that rejects a config
            continue
    cached = errors = 0
    for r in CompilePool(workers).compile_all(jobs):
        cached += int(r.cached)
        errors += int(r.error is not None)
    return {"op": op.name, "jobs": len(jobs), "cached": cached, "errors": errors,
            "seconds": round(time.perf_counter() - t0, 3)}


class CampaignRunner:
    """Runs campaign tasks on one GPU (see the module docstring).

    ``setup`` (JSON): ``worker`` (its index), ``device`` (``"cuda"`` or ``"cpu"``),
    ``compile_workers`` (cores for compiles, or None: all), ``seed_doc`` (a database export of the
    caller's winners, or None), ``sys_path`` (folders the ops are imported from) and ``precompile``
    (compile reserved tasks ahead, default true on CUDA).
    """

    def __init__(self, setup: Mapping[str, Any]) -> None:
        for p in setup.get("sys_path") or ():
            if p not in sys.path:
                sys.path.append(p)
        self.worker = int(setup.get("worker", 0))
        self.device = str(setup.get("device", "cuda"))
        self.tmp = tempfile.mkdtemp(prefix="tiletune-campaign-")
        db_path = os.path.join(self.tmp, "tuning.db")
        # every op this process makes uses the private database (ops open it at their first miss)
        os.environ["TILETUNE_DB"] = db_path
        os.environ["TILETUNE_PROGRESS"] = "0"
        self.compile_workers = setup.get("compile_workers")
        if self.compile_workers:
            os.environ["TILETUNE_COMPILE_WORKERS"] = str(int(self.compile_workers))
        try:
            import torch  # noqa: F401  (paid while starting, not by the first task)
        except ImportError:
            pass
        from tiletune.store import TuningDB

        self.db = TuningDB(db_path)
        seed = setup.get("seed_doc")
        self.seeded = self.db.import_json(io.StringIO(seed)) if seed else 0
        self.ahead = bool(setup.get("precompile", True)) and self.device.startswith("cuda")
        self._prepared: dict[str, _Prepared] = {}
        self._ahead_queue: list[_Prepared] = []
        self._ahead_cv = threading.Condition()
        if self.ahead:
            threading.Thread(target=self._ahead_loop, name="tiletune-campaign-ahead", daemon=True).start()
        if self.device.startswith("cuda"):
            from tiletune.devices.workers import prestart

            prestart()  # the isolated tuning worker of this GPU starts while the first task is prepared

    def info(self) -> dict[str, Any]:
        """Where this runner runs: host, pid, GPU (name and CUDA_VISIBLE_DEVICES), compile cores."""
        gpu_name = None
        if self.device.startswith("cuda"):
            try:
                import torch

                gpu_name = torch.cuda.get_device_name()
            except Exception as exc:  # noqa: BLE001 - reported, the first task fails with the reason
                gpu_name = f"unavailable: {exc}"
        from tiletune.devices.compile_pool import cpu_count

        return {"worker": self.worker, "host": socket.gethostname(), "pid": os.getpid(),
                "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu": gpu_name,
                "compile_workers": int(self.compile_workers or cpu_count()), "seeded_sessions": self.seeded}

    # ------------------------------------------------------------------ tasks
    def _prepare(self, task: Task) -> _Prepared:
        from tiletune.lab.fill import _allocate, resolve_op

        fn = resolve_op(task.call.op)
        args = [_allocate(a, self.device) for a in task.call.args]
        kwargs = {k: _allocate(v, self.device) for k, v in task.call.kwargs.items()}
        return _Prepared(task, fn, args, kwargs)

    def _fill(self, prep: _Prepared) -> None:
        import zlib

        from tiletune.lab.fill import _fill

        gen = None
        if any(isinstance(v, Mapping) and "shape" in v for v in (*prep.task.call.args, *prep.task.call.kwargs.values())):
            import torch

            # the data of a task depends on the campaign's seed and the task, not on which worker runs it
            seed = (prep.task.seed * 1_000_003 + zlib.crc32(prep.task.id.encode())) % 2**63
            gen = torch.Generator(device=self.device).manual_seed(seed)
        for a, spec in zip(prep.args, prep.task.call.args):
            _fill(a, spec, gen)
        for k, spec in prep.task.call.kwargs.items():
            _fill(prep.kwargs[k], spec, gen)

    def run(self, task_json: Mapping[str, Any], upcoming: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """Run one task (after its ahead-of-time compile, if any); prepare ``upcoming`` (reserved
        for this runner next) and queue their compiles. Returns the JSON result."""
        from tiletune.resolve.chain import miss_scope

        start = time.time()
        task = Task.from_json(task_json)
        result: dict[str, Any] = {"id": task.id, "worker": self.worker, "ok": False, "resolved": [], "sessions": None}
        keep = {task.id, *(str(u["id"]) for u in upcoming)}
        for tid in [t for t in self._prepared if t not in keep]:  # reassigned elsewhere
            self._prepared.pop(tid)
        before = set(self.db.sessions())
        try:
            prep = self._prepared.pop(task.id, None) or self._prepare(task)
            self._reserve(upcoming)
            if prep.stats:  # queued for an ahead-of-time compile: wait for it (nothing compiles twice)
                prep.done.wait()
                result["precompile"] = dict(prep.stats)
            self._fill(prep)
            with miss_scope(strategy=task.strategy, budget=task.budget, seed=task.seed, on_miss="tune",
                            strategy_options=task.strategy_options or None) as scope:
                try:
                    prep.fn(*prep.args, **prep.kwargs)
                    if self.device.startswith("cuda"):
                        import torch

                        torch.cuda.synchronize()
                    result["ok"] = True
                finally:
                    result["resolved"] = [
                        {"op": r.op, "identity": r.identity.as_dict(), "source": r.source, "config": r.config}
                        for r in scope.resolved]
        except Exception as exc:  # noqa: BLE001 - a failing task is reported, the campaign goes on
            result["error"] = f"{type(exc).__name__}: {exc}"
            result["trace"] = traceback.format_exc()[-3000:]
        new = [s for s in self.db.sessions() if s not in before]
        if new:
            buf = io.StringIO()
            self.db.export_json(buf, session_ids=new)
            result["sessions"] = buf.getvalue()
        result.update(start=start, end=time.time(), seconds=round(time.time() - start, 4))
        return result

    # ------------------------------------------------------------------ compiles ahead
    def _reserve(self, upcoming: Sequence[Mapping[str, Any]]) -> None:
        for u in upcoming:
            tid = str(u["id"])
            if tid in self._prepared:
                continue
            try:
                prep = self._prepare(Task.from_json(u))
            except Exception:  # noqa: BLE001 - the task fails with its reason when it runs
                continue
            self._prepared[tid] = prep
            if self.ahead:
                prep.stats["queued"] = True
                with self._ahead_cv:
                    self._ahead_queue.append(prep)
                    self._ahead_cv.notify()

    def _ahead_loop(self) -> None:
        while True:
            with self._ahead_cv:
                while not self._ahead_queue:
                    self._ahead_cv.wait()
                prep = self._ahead_queue.pop(0)
            t = prep.task
            if self._prepared.get(t.id) is not prep:  # reassigned to another runner meanwhile
                prep.done.set()
                continue
            try:
                prep.stats.update(precompile(prep.fn, prep.args, prep.kwargs, workers=self.compile_workers,
                                             strategy=t.strategy, budget=t.budget))
            except BaseException as exc:  # noqa: BLE001 - compiling ahead is an optimisation only
                prep.stats["skipped"] = f"{type(exc).__name__}: {exc}"
            finally:
                prep.done.set()
