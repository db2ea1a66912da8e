"""Tuning in worker processes: a candidate that faults, hangs or crashes never takes the caller down.

* :mod:`.client`: start, talk to (with deadlines), kill and replace a worker process.
* :mod:`.worker_main`: the worker itself (``python -m tiletune.devices.workers.worker_main``).
* :mod:`.session`: the caller's tuning session over a worker, which turns every fault into a failed
  candidate.
* :mod:`.shipping` and :mod:`.protocol`: what travels between them (live objects out, JSON back).
"""

from tiletune.devices.workers.client import WorkerFault, WorkerProcess, in_worker, prestart, shutdown_all, wait_for_worker
from tiletune.devices.workers.session import CandidateFault, IsolatedBackend, IsolationOptions, WorkerSession
from tiletune.devices.workers.shipping import IsolationUnavailable, Unshippable

__all__ = [
    "CandidateFault",
    "IsolatedBackend",
    "IsolationOptions",
    "IsolationUnavailable",
    "Unshippable",
    "WorkerFault",
    "WorkerProcess",
    "WorkerSession",
    "in_worker",
    "prestart",
    "shutdown_all",
    "wait_for_worker",
]
