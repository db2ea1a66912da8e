"""Campaigns: tune many ops x shapes x dtypes on every GPU of a host, or of a Ray cluster.

``tiletune campaign SPEC`` (or :func:`run_campaign`) expands a spec (:mod:`.spec`) into tasks, one
call each, and runs them on a pool of workers, one per GPU (:mod:`.pool`: local processes, or Ray
actors with ``--ray``, :mod:`.ray_pool`). Each worker (:mod:`.runner`) tunes on its own GPU with
its share of the host's cores for compiles, and compiles the candidates of its next tasks while the
GPU measures the current one. The results stream back into the caller's tuning database as they
arrive, and a report (:mod:`.report`: JSON, Markdown, PNGs) is written at the end.

Resumable: the workers start from the caller's winners, so a key the database holds is not tuned
again, and every finished task is in the database the moment it arrives; a campaign that is killed
(even with SIGKILL) and started again runs only what is missing.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tiletune.lab.campaign.report import build_rows, compare_picks, status_of, summarize, write_report
from tiletune.lab.campaign.spec import CampaignSpec, Task, load_campaign, parse_campaign, tasks_from_calls

__all__ = ["CampaignResult", "CampaignSpec", "Task", "compare_picks", "load_campaign", "parse_campaign",
           "run_campaign", "seed_document", "tasks_from_calls", "worker_slots"]


@dataclass
class CampaignResult:
    """What a campaign did: the report (also written to ``paths``) and the raw results."""

    report: dict[str, Any]
    results: list[dict[str, Any]] = field(default_factory=list)
    paths: list[pathlib.Path] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return int(self.report["failed"])


def worker_slots(gpus: str | int | None, device: str) -> list[str | None]:
    """The GPU of each local worker (a ``CUDA_VISIBLE_DEVICES`` value; None on the CPU).

    ``gpus``: None (every visible GPU; one worker on the CPU), a count (``2``: the first two visible
    GPUs; on the CPU, that many workers) or a comma-separated list of visible GPU indices
    (``"0,1"``; ``"3,"`` is GPU 3 alone)."""
    text = None if gpus is None else str(gpus).strip()
    listed = text is not None and "," in text
    try:
        picks = [int(p) for p in text.split(",") if p.strip()] if listed else None  # type: ignore[union-attr]
        count = int(text) if text is not None and not listed else None
    except ValueError:
        raise ValueError(f"--gpus {gpus!r}: expected a count (2) or GPU indices (0,1)") from None
    if (picks is not None and (not picks or min(picks) < 0 or len(set(picks)) != len(picks))) or (
            count is not None and count < 1):
        raise ValueError(f"--gpus {gpus!r}: expected a count >= 1 or distinct GPU indices >= 0")
    if not device.startswith("cuda"):
        return [None] * (len(picks) if picks is not None else (count or 1))
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else []
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    ids = ids[:n] if ids else [str(i) for i in range(n)]
    if not ids:
        raise ValueError("no CUDA GPU is visible; a campaign on the CPU (fake or replay backends) takes --device cpu")
    if picks is not None:
        bad = [p for p in picks if p >= len(ids)]
        if bad:
            raise ValueError(f"--gpus {gpus!r}: GPU {bad[0]} is not visible ({len(ids)} GPU(s) visible)")
        return [ids[p] for p in picks]
    if count is not None and count > len(ids):
        raise ValueError(f"--gpus {count}: only {len(ids)} GPU(s) visible")
    return ids[:count] if count is not None else ids


def seed_document(db: Any) -> str | None:
    """The caller's winners as a database export without measurements (what a worker starts from)."""
    winners = db.winners()
    if not winners:
        return None
    buf = io.StringIO()
    db.export_json(buf, session_ids=[w.session_id for w in winners])
    doc = json.loads(buf.getvalue())
    for s in doc["sessions"]:
        s["measurements"] = []
    return json.dumps(doc, allow_nan=False)


def run_campaign(
    spec: CampaignSpec,
    *,
    db: Any = None,
    gpus: str | int | None = None,
    ray: bool | str | None = None,
    ray_init: Mapping[str, Any] | None = None,
    lookahead: int = 2,
    precompile: bool = True,
    compile_workers: int | None = None,
    out: str | os.PathLike | None = None,
    progress: bool | None = None,
    on_result: Callable[[dict[str, Any], Task], None] | None = None,
    on_ready: Callable[[int, dict[str, Any]], None] | None = None,
) -> CampaignResult:
    """Run a campaign (see the module docstring) and return its report.

    Args:
        spec: the tasks (:func:`load_campaign`, :func:`parse_campaign`).
        db: the caller's :class:`~tiletune.store.TuningDB`, a path, or None (the default database).
        gpus: the workers: see :func:`worker_slots`; with ``ray``, a count of actors (default: every
            GPU of the cluster; on a cluster without GPUs, one actor).
        ray: None/False: local worker processes; True: Ray (``RAY_ADDRESS``, or a new local cluster,
            or the session the caller initialised); a string: the address of a Ray cluster.
        ray_init: keyword arguments of ``ray.init`` when this call starts Ray (tests: ``num_gpus``).
        lookahead: tasks each worker holds beyond the running one (compiled ahead).
        precompile: compile the reserved tasks' candidates ahead (CUDA only).
        compile_workers: compile processes per worker (default: the host's cores / workers).
        out: a folder for ``campaign.json``, ``campaign.md`` and the PNGs.
        progress: force the progress bar on or off (default: on interactive terminals).
        on_result: called with each task's result (JSON) and task, as they arrive.
        on_ready: called with each worker's slot and description when it has started.
    """
    from tiletune.devices.compile_pool import cpu_count
    from tiletune.engine.progress import tuning_progress
    from tiletune.store import TuningDB

    if lookahead < 0:
        raise ValueError(f"lookahead must be >= 0, got {lookahead}")
    database = db if isinstance(db, TuningDB) else TuningDB(db)
    database.check()
    tasks = list(spec.tasks)
    setup: dict[str, Any] = {"device": spec.device, "seed_doc": seed_document(database), "precompile": precompile,
                             "compile_workers": compile_workers, "sys_path": [p for p in sys.path if p]}
    if ray:
        from tiletune.lab.campaign.ray_pool import RayPool, connect

        connect(ray if isinstance(ray, str) else None, **dict(ray_init or {}))
        cluster = RayPool.cluster_gpus()
        text = None if gpus is None else str(gpus).strip()
        if text is not None and not text.isdigit():
            raise ValueError(f"--gpus {gpus!r}: with --ray, give a count of GPU actors (Ray places them)")
        size = int(text) if text else max(1, cluster)
        if cluster and size > cluster:
            raise ValueError(f"--gpus {size}: the Ray cluster has {cluster} GPU(s)")
        pool: Any = RayPool(size, setup, gpus_per_actor=1.0 if cluster else 0.0)
    else:
        from tiletune.lab.campaign.pool import LocalPool

        slots = worker_slots(gpus, spec.device)
        if compile_workers is None:
            setup["compile_workers"] = max(1, cpu_count() // len(slots))  # the host's cores, split
        pool = LocalPool(slots, setup)
    infos: dict[int, dict[str, Any]] = {}
    done = 0
    t0 = time.perf_counter()
    try:
        with tuning_progress("campaign", len(tasks), progress) as bar:

            def got(result: dict[str, Any], task: Task) -> None:
                nonlocal done
                done += 1
                if result.get("sessions"):
                    database.import_json(io.StringIO(result["sessions"]))  # into the caller's database now
                if on_result is not None:
                    on_result(result, task)
                if bar is not None:
                    bar(f"{status_of(result)} {task.id}", done, len(tasks))

            def ready(slot: int, info: dict[str, Any]) -> None:
                infos[slot] = info
                if on_ready is not None:
                    on_ready(slot, info)

            from tiletune.lab.campaign.pool import schedule

            results = schedule(pool, tasks, lookahead=lookahead, on_result=got, on_ready=ready)
    finally:
        pool.close()
    wall = time.perf_counter() - t0
    rows = build_rows(tasks, results, database)
    counts = {k: sum(1 for r in rows if r["status"] == k) for k in ("tuned", "stored", "reused", "failed")}
    report = {"name": spec.name, "spec": spec.source, "database": database.where, "device": spec.device,
              "ray": bool(ray), "tasks": len(tasks), **counts, "wall_s": round(wall, 3),
              "workers": [infos[i] for i in sorted(infos)], "per_op": summarize(rows), "rows": rows}
    paths = write_report(report, out) if out is not None else []
    return CampaignResult(report, list(results), paths)
