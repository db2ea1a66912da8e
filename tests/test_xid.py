"""A kernel that outlives its deadline: a hang, or a fault the GPU reported (Xid) and the process has not
heard of yet (devices.xid, and the worker client's grace at the kernel's deadline)."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune.devices import xid
from tiletune.devices.backends import FakeBackend
from tiletune.devices.workers import IsolatedBackend, IsolationOptions, WorkerProcess
from tiletune.devices.workers import client
from tiletune.records import Status


# -- the watch, over a fake NVML ---------------------------------------------------------------------
class _Timeout(Exception):
    pass


class FakeNvml:
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.queue: list[int] = []
        self.registered: list[tuple] = []
        self.inits = 0

    def nvmlInit(self):
        self.inits += 1
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlEventSetCreate(self):
        return "set"

    def nvmlDeviceRegisterEvents(self, handle, types, evset):
        self.registered.append((handle, types, evset))

    def nvmlEventSetWait_v2(self, evset, timeout_ms):
        if not self.queue:
            raise _Timeout("Timeout")
        return type("Data", (), {"eventData": self.queue.pop(0)})()


def test_the_watch_reports_memory_faults_since_its_mark_only(monkeypatch):
    nv = FakeNvml()
    monkeypatch.setattr(xid, "_watches", {})
    w = xid.watch_for(3, nvml=nv)
    assert w is not None and nv.registered == [(("gpu", 3), 8, "set")]
    nv.queue[:] = [31]  # before the launch: another kernel's fault
    w.mark()
    assert w.faults() == []
    nv.queue[:] = [45, 31]  # a killed process's channels (45), then an illegal address (31)
    assert w.faults() == [31]
    nv.queue[:] = [43, 45]
    assert w.faults() == []  # neither is a kernel's own memory fault
    assert w.seen == [31, 45, 31, 43, 45]
    assert xid.watch_for(3, nvml=nv) is w and nv.inits == 1  # one per GPU per process


def test_no_nvml_means_no_watch(monkeypatch):
    monkeypatch.setattr(xid, "_watches", {})
    assert xid.watch_for(0, nvml=FakeNvml(fail_init=True)) is None
    assert xid.watch_for(0, nvml=FakeNvml()) is None  # the answer is kept: NVML is not tried on every check


# -- the verdicts, through a real worker process -------------------------------------------------------
def good_kernel(x, y):
    y.copy_(x * 2)


def late_fault_kernel(x, y):
    time.sleep(0.8)  # the GPU raised the fault at once; the process hears of it late
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def hanging_kernel(x, y):
    time.sleep(3600)


def _plan(bad):
    def plan(cfg, x, y):
        return tt.Launch(bad.get(cfg.K, good_kernel), (1,), (x, y))

    return plan


class _FaultingGpu:
    """An Xid watch that says a memory fault (Xid 31) came during every kernel."""

    def __init__(self) -> None:
        self.marks = 0
        self.seen = [13]  # read before the session

    def mark(self):
        self.marks += 1
        self.seen.append(31)

    proven = xid.XidWatch.proven

    def faults(self):
        return [31]


def _tune(bad, watch, monkeypatch, grace_s=3.0):
    monkeypatch.setattr(xid, "watch_for", lambda device_index, nvml=None: watch)
    monkeypatch.setattr(client, "FAULT_REPORT_GRACE_S", grace_s)
    be = FakeBackend(lambda c: 100.0 - 5.0 * c.K, noise=0.002, compile_s=lambda c: 0.3 + 0.05 * c.K)
    opts = IsolationOptions(first_watchdog_s=30.0, watchdog_floor_s=0.5, kernel_floor_s=0.3, check_slack_s=0.5,
                            start_spares=1, max_spares=1)
    iso = IsolatedBackend(be, worker_spec=be, options=opts)
    op = tt.autotune(tt.Space(K=[0, 1, 2], baseline=dict(K=0)), reference=lambda x, y: x * 2, writes=["y"],
                     db=False, backend=iso, progress=False, isolation="none")(_plan(bad))
    w: WorkerProcess = iso.worker(0)
    w.ensure()
    x, y = torch.randn(16), torch.empty(16)
    op(x, y)
    torch.testing.assert_close(y, x * 2)
    (res,) = op.results.values()
    return {m.config["K"]: m for m in res.measurements}, res.stats


def test_a_fault_reported_after_the_deadline_is_a_fault_when_the_gpu_said_so(monkeypatch):
    by_k, stats = _tune({2: late_fault_kernel}, _FaultingGpu(), monkeypatch)
    assert by_k[2].status is Status.LAUNCH_ERROR, by_k[2].reason
    assert "illegal memory access" in by_k[2].reason
    assert stats["xid_watch"] is True
    assert by_k[0].status is Status.OK and by_k[1].status is Status.OK
    assert stats["xids_seen"] and set(stats["xids_seen"]) == {31}  # the session's own, not the 13 before it


def test_without_the_gpus_word_the_same_kernel_is_a_hang(monkeypatch):
    by_k, stats = _tune({2: late_fault_kernel}, None, monkeypatch)
    assert by_k[2].status is Status.TIMEOUT, by_k[2].reason
    assert stats["xid_watch"] is False
    (fault,) = stats["faults"]
    assert fault["phase"] == "launched" and fault["waited_s"] < 0.8 and "xids" not in fault


def test_a_kernel_that_faulted_and_never_reports_is_killed_after_the_grace_as_a_fault(monkeypatch):
    t = time.perf_counter()
    by_k, stats = _tune({2: hanging_kernel}, _FaultingGpu(), monkeypatch, grace_s=0.5)
    assert by_k[2].status is Status.LAUNCH_ERROR, by_k[2].reason
    assert "Xid 31" in by_k[2].reason
    (fault,) = stats["faults"]
    assert fault["kind"] == "fatal" and fault["xids"] == [31]
    assert 0.8 <= fault["waited_s"] < 3.0, fault  # the kernel's deadline (0.3 s) and the grace (0.5 s)
    assert time.perf_counter() - t < 60


def test_once_the_gpus_faults_are_seen_here_an_endless_kernel_gets_the_floor_not_twice_the_slowest_report():
    """Without the GPU's word a kernel may run twice the slowest fault report so far (a late report is not a
    hang); once a memory-fault Xid has reached this process, the deadline is the floor and the Xid decides."""
    from types import SimpleNamespace

    from tiletune.devices.workers.session import WorkerSession

    nv = FakeNvml()
    watch = xid.XidWatch(nv, ("gpu", 0))

    def deadline(w):
        s = SimpleNamespace(options=IsolationOptions(first_watchdog_s=30.0), _slow_us=10.0, _best_us=10.0,
                            _kernel_max_s=0.001, _fatal_kernel_max_s=0.9, _xid=w,
                            worker=SimpleNamespace(reaping_for_s=lambda: None, reap_s=[]))
        return WorkerSession._kernel_deadline(s)

    assert deadline(None) == pytest.approx(1.8)
    assert not watch.proven and deadline(watch) == pytest.approx(1.8)  # registered, but no fault seen through it
    nv.queue[:] = [45]
    watch.mark()
    assert not watch.proven and deadline(watch) == pytest.approx(1.8)  # a killed process's Xid proves nothing
    nv.queue[:] = [31]
    watch.mark()  # the last fault's Xid, read when the next request is sent
    assert watch.proven and deadline(watch) == pytest.approx(1.0)


def test_the_grace_is_given_once_per_request_not_again_for_each_message_read_within_it(monkeypatch):
    """A worker whose kernel faulted may still send a message (a phase, a compile event) during the grace;
    after reading it the client waits out what is left of that grace, without asking the GPU again (its
    events were read) and without taking the empty answer for a hang."""
    from multiprocessing import Pipe

    from tiletune.devices.workers.client import WorkerFault

    monkeypatch.setattr(client, "FAULT_REPORT_GRACE_S", 0.4)
    w = WorkerProcess()
    ours, theirs = Pipe()
    asked = []

    class Gpu:
        def faults(self):
            asked.append(1)
            return [31] if len(asked) == 1 else []

    theirs.send_bytes(b"a message sent during the grace")
    t0 = time.monotonic()
    assert w._fault_reported_late(ours, "launched", Gpu(), 0.3) is True and w.xids == [31]
    ours.recv_bytes()
    assert w._fault_reported_late(ours, "ran", Gpu(), 0.3) is False  # not a launched kernel's deadline
    with pytest.raises(WorkerFault) as err:
        w._fault_reported_late(ours, "launched", Gpu(), 0.3)
    assert err.value.kind == "fatal" and "Xid 31" in str(err.value)
    assert len(asked) == 1 and 0.35 <= time.monotonic() - t0 < 2.0


def test_doctor_says_whether_the_gpus_fault_events_are_readable(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from tiletune.cli import app

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    env = {"TILETUNE_DB": str(tmp_path / "d.db"), "COLUMNS": "400"}
    monkeypatch.setattr(xid, "watch_for", lambda device_index, nvml=None: None)
    out = CliRunner().invoke(app, ["doctor"], env=env).output
    assert "GPU fault events" in out and "not readable" in out and "ruled a hang" in out
    monkeypatch.setattr(xid, "watch_for", lambda device_index, nvml=None: _FaultingGpu())
    out = CliRunner().invoke(app, ["doctor"], env=env).output
    assert "readable (NVML Xid events)" in out and "not readable" not in out
