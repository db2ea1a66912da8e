"""Campaign workers as Ray actors: one per GPU of a Ray cluster (``tiletune campaign --ray``).

Each actor holds one GPU (``num_gpus=1``; Ray sets its ``CUDA_VISIBLE_DEVICES``) and hosts the same
:class:`~tiletune.lab.campaign.runner.CampaignRunner` as a local worker process, with the cores of its
node split between the GPUs of that node for compiles. Tasks and results travel as JSON; the
tuning sessions an actor records come back as database exports and go into the caller's database.

On a cluster without GPUs (CPU tests with the fake or replay backends) the actors hold none.
Ray is an optional dependency (``pip install 'tiletune[ray]'``); nothing else imports this module.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

from tiletune.lab.campaign.pool import Event

__all__ = ["RayPool", "connect"]


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError("--ray needs Ray: pip install 'tiletune[ray]'") from None
    return ray


def connect(address: str | None, **init: Any) -> Any:
    """Ray, initialised: the caller's session if it started one, else ``ray.init(address, **init)``
    (address None: ``RAY_ADDRESS`` or a new local cluster)."""
    ray = _ray()
    if not ray.is_initialized():
        src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        # local actors import the same tiletune as the caller (a cluster's other nodes have their own)
        path = src + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
        kwargs = dict(include_dashboard=False, logging_level="WARNING", runtime_env={"env_vars": {"PYTHONPATH": path}})
        kwargs.update(init)
        ray.init(address=address, **kwargs)
    return ray


class _Actor:
    """The actor: a CampaignRunner on the GPU Ray gave it."""

    def __init__(self, setup: dict[str, Any]) -> None:
        import ray

        setup = dict(setup)
        if setup.get("compile_workers") is None:  # this node's cores, split between its GPUs
            node = ray.get_runtime_context().get_node_id()
            res = next((n.get("Resources", {}) for n in ray.nodes() if n.get("NodeID") == node), {})
            from tiletune.devices.compile_pool import cpu_count

            setup["compile_workers"] = max(1, int(res.get("CPU", cpu_count())) // max(1, int(res.get("GPU", 1))))
        from tiletune.lab.campaign.runner import CampaignRunner

        self.runner = CampaignRunner(setup)

    def info(self) -> dict[str, Any]:
        return self.runner.info()

    def run(self, task: dict[str, Any], upcoming: list[dict[str, Any]]) -> dict[str, Any]:
        return self.runner.run(task, upcoming)


class RayPool:
    """``size`` campaign actors on a Ray cluster (see the module docstring)."""

    def __init__(self, size: int, setup: dict[str, Any], *, gpus_per_actor: float = 1.0) -> None:
        self.ray = _ray()
        self.size = size
        self.setup = setup
        self.events: "queue.Queue[Event]" = queue.Queue()
        self.gpus_per_actor = gpus_per_actor
        self.actors: dict[int, Any] = {}
        self._cls = self.ray.remote(_Actor)

    @staticmethod
    def cluster_gpus() -> int:
        """GPUs of the connected cluster (0 without any)."""
        import ray

        return int(ray.cluster_resources().get("GPU", 0))

    def _wait(self, slot: int, ref: Any, kind: str, actor: Any) -> None:
        def run() -> None:
            try:
                value = self.ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - an actor that died or failed to start
                if self.actors.get(slot) is actor:
                    self.events.put((slot, "died" if kind == "result" else "failed", f"{type(exc).__name__}: {exc}"))
                return
            self.events.put((slot, kind, value))

        threading.Thread(target=run, name=f"tiletune-ray-{kind}{slot}", daemon=True).start()

    def start(self, slot: int) -> None:
        old = self.actors.pop(slot, None)
        if old is not None:
            self.ray.kill(old)
        actor = self._cls.options(num_gpus=self.gpus_per_actor, num_cpus=0).remote(dict(self.setup, worker=slot))
        self.actors[slot] = actor
        self._wait(slot, actor.info.remote(), "ready", actor)

    def submit(self, slot: int, task: dict[str, Any], upcoming: list[dict[str, Any]]) -> None:
        actor = self.actors[slot]
        self._wait(slot, actor.run.remote(task, upcoming), "result", actor)

    def close(self) -> None:
        for actor in self.actors.values():
            try:
                self.ray.kill(actor)
            except Exception:  # noqa: BLE001 - best effort at the end
                pass
        self.actors.clear()
