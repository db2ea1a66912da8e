"""The GPU's own word on a fault: Xid events read through NVML.

A kernel that reads an illegal address is usually reported to its process within a few tenths of a
second, but not always: while the host is busy (a cold tune compiling on every core) the report can
come after the check's kernel deadline, and the watchdog would take the fault for a kernel that never
ends. The driver logs the fault as an Xid event when the GPU raises it, before the process hears of
it; NVML delivers those events to any process that registered for them. :class:`XidWatch` registers
for one GPU's critical Xid events; the worker client marks the moment a check's kernel is launched
and, when the kernel's deadline passes without an answer, asks whether a memory-fault Xid came since:
if one did, the kernel faulted and the worker is given a grace to report it (a verdict of fault, not
of hang).

Needs ``pynvml`` (the ``nvidia-ml-py`` package) and a driver that lets this process register for
Xid events; where either is missing :func:`watch_for` returns None and nothing changes. Events of
every process on the GPU arrive here: a fault of another process's kernel during the check also
counts (it only grants the grace, and the verdict says which Xid it was).
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

logger = logging.getLogger("tiletune")

__all__ = ["FAULT_XIDS", "XidWatch", "watch_for"]

#: Xids of a kernel's own memory fault: 13 (graphics engine exception: an out-of-range address, a
#: trap, a misaligned access reported by the SM), 31 (the MMU's page fault: an illegal address). Not
#: 45 (channels removed: logged when a process is killed while its kernel runs, as the watchdog does
#: with a kernel that never ends) nor 43 (often paired with 45).
FAULT_XIDS = frozenset({13, 31})


class XidWatch:
    """Critical Xid events of one GPU since the last :meth:`mark`."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nv = nvml
        self._set = nvml.nvmlEventSetCreate()
        nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._set)
        self._lock = threading.Lock()
        #: every Xid read, in order (for the session's stats)
        self.seen: list[int] = []

    def _drain(self) -> list[int]:
        got: list[int] = []
        nv = self._nv
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        for _ in range(64):  # a bounded read: NVML queues a few events at most
            try:
                data = wait(self._set, 0)
            except Exception:  # NVMLError_Timeout: none left (or the set is gone)
                break
            got.append(int(getattr(data, "eventData", 0) or 0))
        self.seen.extend(got)
        return got

    def mark(self) -> None:
        """Forget the events so far (a check's kernel is launched now)."""
        with self._lock:
            self._drain()

    @property
    def proven(self) -> bool:
        """Whether this process has read a memory-fault Xid (:data:`FAULT_XIDS`) yet: the GPU's faults
        do reach it here, so a kernel past its deadline with no such Xid did not fault."""
        return any(x in FAULT_XIDS for x in self.seen)

    def faults(self) -> list[int]:
        """The memory-fault Xids (:data:`FAULT_XIDS`) since the last :meth:`mark`."""
        with self._lock:
            return [x for x in self._drain() if x in FAULT_XIDS]


_watches: dict[int, XidWatch | None] = {}
_lock = threading.Lock()


def _handle(nvml: Any, device_index: int) -> Any:
    torch = sys.modules.get("torch")  # NVML numbers GPUs differently from CUDA under CUDA_VISIBLE_DEVICES
    if torch is not None:
        try:
            p = torch.cuda.get_device_properties(device_index)
            bus = f"{int(p.pci_domain_id):08X}:{int(p.pci_bus_id):02X}:{int(p.pci_device_id):02X}.0"
            return nvml.nvmlDeviceGetHandleByPciBusId(bus)
        except Exception:
            pass
    return nvml.nvmlDeviceGetHandleByIndex(device_index)


def watch_for(device_index: int, nvml: Any = None) -> XidWatch | None:
    """This process's Xid watch of the GPU ``device_index`` (one per GPU, made on first use), or None
    where NVML, its events or this GPU's registration are not available. ``nvml``: the NVML module
    (``pynvml`` unless given)."""
    with _lock:
        if device_index in _watches:
            return _watches[device_index]
        watch: XidWatch | None = None
        try:
            if nvml is None:
                import pynvml as nvml  # type: ignore[no-redef]
            nvml.nvmlInit()
            watch = XidWatch(nvml, _handle(nvml, device_index))
        except Exception as exc:  # no pynvml, no driver, events not supported or not permitted
            logger.debug("tiletune: no Xid watch of GPU %d (%s)", device_index, exc)
            watch = None
        _watches[device_index] = watch
        return watch
