"""Worker life cycle (CPU): a quiet, leak-free exit, graceful ends, a probe that shares no CUDA memory,
the warm spares after a fault (ready for faults in quick succession, started in parallel, the dead
worker reaped off the critical path) and the watchdog that adapts to the kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cloudpickle")

import tiletune as tt
from tiletune.devices.backends import FakeBackend
from tiletune.records import Status
from tiletune.devices.workers import IsolatedBackend, IsolationOptions, WorkerProcess

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return True


EXIT_SCRIPT = textwrap.dedent(r'''
    import json, sys, time
    import torch, tiletune as tt
    from tiletune.devices.backends import FakeBackend
    from tiletune.devices.workers import client

    def kern(x, y):
        y.copy_(x * 2)

    be = FakeBackend(lambda c: 100.0 - c.K, noise=0.002, compile_s=0.01)

    @tt.autotune(tt.Space(K=[0, 1, 2, 3], baseline=dict(K=0)), reference=lambda x, y: x * 2, writes=["y"],
                 db=False, backend=be, progress=False, isolation="process")
    def op(cfg, x, y):
        return tt.Launch(kern, (1,), (x, y))

    x, y = torch.randn(8), torch.empty(8)
    op(x, y)
    assert torch.equal(y, x * 2)
    (w,) = [w for w in client._workers.values()]
    pids = [w.proc.pid]
    # a worker started in the background that has not connected yet when the interpreter exits (the
    # prestart race of issue 43): its socket's clean-up must not print a traceback
    slow = client.worker_for("slow", 0, lambda: client.WorkerProcess(
        "none", 0, command=[sys.executable, "-c", "import time; time.sleep(120)"]))
    slow.start_in_background()
    while slow.proc is None:
        time.sleep(0.01)
    pids.append(slow.proc.pid)
    for _ in range(500):  # the warm spare of the tuning's worker
        if w.spare is not None and w.spare.proc is not None:
            break
        time.sleep(0.01)
    if w.spare is not None and w.spare.proc is not None:
        pids.append(w.spare.proc.pid)
    print("PIDS", json.dumps(pids), flush=True)
''')


def test_exit_after_isolated_tuning_is_quiet_and_leaves_no_worker(tmp_path):
    script = tmp_path / "exit_probe.py"
    script.write_text(EXIT_SCRIPT)
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TILETUNE_WORKER_TRACE", None)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no FileNotFoundError from a socket finalizer, no CUDA IPC warning
    pids = json.loads(out.stdout.split("PIDS", 1)[1])
    assert len(pids) == 3  # worker, the slow starter, the spare
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids), pids
    assert time.perf_counter() - t0 < 120


def test_the_shipping_probe_creates_no_cuda_ipc_handle(monkeypatch):
    """The fail-early probe of open_session must not call torch's CUDA tensor reduction (each call
    creates an IPC handle that pins the tensor's memory until a consumer that never comes releases it)."""
    import torch.multiprocessing.reductions as reductions
    from tiletune.devices.workers import shipping

    calls = []
    monkeypatch.setattr(reductions, "reduce_tensor", lambda t: calls.append(t) or (_never, ()))

    class FakeCuda(torch.Tensor):  # a CPU tensor that says it lives on a GPU
        @property
        def is_cuda(self):  # noqa: D401
            return True

    t = torch.zeros(4).as_subclass(FakeCuda)
    payload = {"args": (t, 3), "plan": len}
    data = shipping.dumps(payload, probe=True)
    assert calls == [] and data
    shipping.dumps(payload)  # the real send shares it (and only then)
    assert len(calls) == 1


def _never():  # pragma: no cover - never loaded
    raise AssertionError


def test_open_session_probes_without_sharing(monkeypatch):
    from tiletune.devices.workers import session as session_mod

    seen = []
    real = session_mod.dumps
    monkeypatch.setattr(session_mod, "dumps", lambda obj, probe=False: seen.append(probe) or real(obj, probe=probe))
    be = FakeBackend(lambda c: 1.0)
    iso = IsolatedBackend(be, worker_spec=be)
    monkeypatch.setattr(session_mod, "WorkerSession", lambda *a, **k: "session")
    assert iso.open_session(len, (torch.zeros(2),), device_index=0, writes=(0,), reference=None, tolerance=None,
                            name="op") == "session"
    assert seen == [True]


def test_close_sends_exit_and_the_worker_exits_with_code_0():
    be = FakeBackend(lambda c: 1.0)
    w = WorkerProcess(be, 0)
    w.start()
    proc = w.proc
    t0 = time.perf_counter()
    assert w.close() == 0
    assert proc.returncode == 0 and w.graceful_exits == 1
    assert time.perf_counter() - t0 < 2.0  # it left on the request, no SIGTERM wait
    assert not w.alive


def test_close_of_a_worker_that_never_connected_terminates_it():
    w = WorkerProcess("none", 0, command=[sys.executable, "-c", "import time; time.sleep(120)"])
    w.start_in_background()
    while w.proc is None:
        time.sleep(0.01)
    proc = w.proc
    w.close(final=True)
    assert proc.poll() is not None and proc.returncode != 0
    w.start_in_background()  # closed for good: nothing starts any more
    time.sleep(0.3)
    assert w.proc is None or w.proc.poll() is not None


def good_kernel(x, y):
    y.copy_(x * 2)


def hanging_kernel(x, y):
    time.sleep(3600)


def exiting_kernel(x, y):
    os._exit(7)


def _plan_with(bad: dict):
    def plan(cfg, x, y):
        return tt.Launch(bad.get(cfg.K, good_kernel), (1,), (x, y))

    return plan


def _isolated_op(bad: dict, options: IsolationOptions, ks=(0, 1, 2, 3, 4, 5)):
    # later configs finish compiling later: the baseline (K=0) is measured before the faulty ones run
    be = FakeBackend(lambda c: 100.0 - 5.0 * c.K, noise=0.002, compile_s=lambda c: 0.5 + 0.1 * c.K)
    iso = IsolatedBackend(be, worker_spec=be, options=options)
    op = tt.autotune(tt.Space(K=list(ks), baseline=dict(K=0)), reference=lambda x, y: x * 2, writes=["y"],
                     db=False, backend=iso, progress=False, isolation="none")(_plan_with(bad))
    return op, iso


#: for the tests of one or two faults that are not about how many spares a session keeps: the one warm
#: spare (_warm) and its replacement, not up to four (each is a Python importing torch, a CPU-second here)
ONE_SPARE = dict(start_spares=1, max_spares=1)


def _warm(iso: IsolatedBackend) -> WorkerProcess:
    """Start the worker and its spare and wait until both answer (start-up is not what is measured)."""
    w = iso.worker(0)
    w.ensure()
    w.keep_spare()
    assert w.spare is not None and w.spare.wait_ready(120)
    return w


def test_a_hang_costs_about_the_adaptive_watchdog_not_the_first_one():
    """After the baseline is timed (about 100 us), a kernel that never returns is killed about
    kernel_floor_s after its launch (the worker reports the launch; the kernel phase's deadline is
    max(kernel_floor_s, factor x the slowest median)), not after first_watchdog_s, nor after the
    generous slack of the phases around the kernel (check_slack_s)."""
    opts = IsolationOptions(first_watchdog_s=30.0, watchdog_floor_s=0.5, kernel_floor_s=0.3, check_slack_s=3.0,
                            check_slack_min_s=0.1, check_slack_factor=4.0, **ONE_SPARE)
    op, iso = _isolated_op({3: hanging_kernel}, opts)
    w = _warm(iso)
    x, y = torch.randn(16), torch.empty(16)
    op(x, y)
    (res,) = op.results.values()
    by_k = {m.config["K"]: m for m in res.measurements}
    assert by_k[3].status is Status.TIMEOUT and "watchdog" in by_k[3].reason
    assert "of its kernel's launch" in by_k[3].reason
    (fault,) = res.stats["faults"]
    assert fault["kind"] == "timeout" and fault["phase"] == "launched", fault
    assert fault["deadline_s"] >= 0.3, fault
    assert 0.3 <= fault["waited_s"] < fault["launched_s"] + fault["deadline_s"] + 0.4, fault
    assert fault["waited_s"] < 1.5, fault  # far below check_slack_s (3 s)
    assert res.winner == {"K": 5}
    assert res.stats["spares_used"] == 1 and w.spares_used == 1
    assert len(res.stats["check_load_s"]) == len(res.stats["check_s"])  # every answered check reported its launch
    torch.testing.assert_close(y, x * 2)


def test_after_a_crash_the_warm_spare_takes_over_at_once():
    op, iso = _isolated_op({2: exiting_kernel, 4: exiting_kernel}, IsolationOptions(first_watchdog_s=30.0, **ONE_SPARE))
    w = _warm(iso)
    starts0 = len(w.start_s)
    x, y = torch.randn(16), torch.empty(16)
    t0 = time.perf_counter()
    op(x, y)
    wall = time.perf_counter() - t0
    (res,) = op.results.values()
    by_k = {m.config["K"]: m for m in res.measurements}
    assert by_k[2].status is Status.LAUNCH_ERROR and "exit code 7" in by_k[2].reason
    assert by_k[4].status is Status.LAUNCH_ERROR
    assert res.winner == {"K": 5}
    assert res.stats["worker_restarts"] == 2
    assert res.stats["spares_used"] >= 1 and w.spares_used >= 1  # the counter on the client
    # the first take-over found its spare ready: no cold start (importing torch takes seconds)
    assert w.start_s[starts0] < 0.5, w.start_s
    # the candidates still to run were compiled again in the new worker (none by an assembler: a fake)
    assert res.stats["recompiled"] >= 1 and res.stats["recompiled_assembled"] == 0, res.stats
    assert wall < 30


def test_two_faults_in_quick_succession_are_each_answered_by_a_ready_spare():
    """Two crashes one right after the other: each is answered by a spare started ahead (no cold start
    on the critical path), each fault's cost is in the stats, and the spares kept grow with the faults
    (back to one when the session ends)."""
    op, iso = _isolated_op({2: exiting_kernel, 3: exiting_kernel}, IsolationOptions(first_watchdog_s=30.0,
                                                                                    max_spares=3))
    w = _warm(iso)
    w.keep_spares(2)
    assert all(sp.wait_ready(120) for sp in w.spares) and len(w.spares) == 2
    starts0 = len(w.start_s)
    x, y = torch.randn(16), torch.empty(16)
    op(x, y)
    (res,) = op.results.values()
    by_k = {m.config["K"]: m for m in res.measurements}
    assert by_k[2].status is Status.LAUNCH_ERROR and by_k[3].status is Status.LAUNCH_ERROR
    assert {k: m.status for k, m in by_k.items() if k not in (2, 3)} == {k: Status.OK for k in (0, 1, 4, 5)}
    assert res.winner == {"K": 5}
    torch.testing.assert_close(y, x * 2)
    faults = res.stats["faults"]
    assert [f["order"] for f in faults] == [2, 3] and res.stats["spares_used"] == 2
    for f in faults:
        assert f["spare"] is True and f["spare_wait_s"] < 0.5, f  # a cold start takes seconds
        assert f["lost_s"] < f["start_s"] + f["open_s"] + 0.05, f
    assert all(s < 0.5 for s in w.start_s[starts0:]), w.start_s  # both take-overs found their spare ready
    assert res.stats["spares_max"] == 3
    assert len(w.spares) == 2  # the session's extra spares were let go (start_spares stay for the next one)


@pytest.mark.spawned_workers
def test_keep_spares_starts_them_in_parallel():
    """Spares start side by side: every child exists long before one start (importing torch) is over."""
    w = WorkerProcess(FakeBackend(lambda c: 1.0), 0)
    try:
        w.keep_spares(3)
        assert len(w.spares) == 3
        t0 = time.monotonic()
        while not all(sp.proc is not None for sp in w.spares) and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        spawned = time.monotonic() - t0
        assert all(sp.proc is not None for sp in w.spares)
        assert all(sp.wait_ready(120) for sp in w.spares)
        one_start = min(s for sp in w.spares for s in sp.start_s)
        assert spawned < one_start / 2, (spawned, one_start)  # in sequence the third waits for two starts
        w.keep_spares(1)  # trimmed: two are closed
        assert len(w.spares) == 1 and w.spare.alive
    finally:
        w.close(final=True)


@pytest.mark.spawned_workers
def test_the_dead_worker_is_reaped_off_the_critical_path(monkeypatch):
    """A killed worker that takes long to be gone (on a GPU: its CUDA context's teardown) delays neither
    the fault's verdict nor the take-over; only timing waits for it (a kernel that hung would still
    run on the GPU)."""
    import subprocess as sp_mod

    slow_s = 1.5
    real_wait = sp_mod.Popen.wait

    def slow_reap(self, timeout=None):  # the reaping waits (SIGKILL to gone); status polls stay quick
        if timeout is None or timeout >= 30:
            time.sleep(slow_s)
        return real_wait(self, timeout)

    op, iso = _isolated_op({2: exiting_kernel}, IsolationOptions(first_watchdog_s=30.0, **ONE_SPARE))
    w = _warm(iso)
    monkeypatch.setattr(sp_mod.Popen, "wait", slow_reap)
    x, y = torch.randn(16), torch.empty(16)
    op(x, y)
    (res,) = op.results.values()
    by_k = {m.config["K"]: m for m in res.measurements}
    assert by_k[2].status is Status.LAUNCH_ERROR and "exit code 7" in by_k[2].reason
    assert res.winner == {"K": 5}
    (fault,) = res.stats["faults"]
    assert fault["spare"] is True and fault["lost_s"] < slow_s - 0.3, fault  # the kill did not wait for the reap
    assert res.stats["reap_s"] and res.stats["reap_s"][0] >= slow_s, res.stats.get("reap_s")
    # the next timing waited for the reap; the fault's lost time plus that wait covers it
    assert fault.get("reap_wait_s", 0.0) > 0.0, fault
    torch.testing.assert_close(y, x * 2)


_loaded_in: set = set()


class _SlowLoadSession:
    """A fake session whose first check in each process takes ``load_s`` before its kernel is launched
    (cuTile loading the modules of a new worker), later checks none."""

    def __init__(self, inner, load_s: float) -> None:
        self.inner, self.load_s = inner, load_s

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def check(self, candidate):
        if os.getpid() not in _loaded_in:
            _loaded_in.add(os.getpid())
            time.sleep(self.load_s)
        return self.inner.check(candidate)


class SlowLoadBackend(FakeBackend):
    load_s = 1.2

    def open_session(self, *args, **kwargs):
        return _SlowLoadSession(super().open_session(*args, **kwargs), self.load_s)


def test_a_slow_first_launch_in_a_new_worker_is_not_a_hang_and_a_hang_is_still_caught_fast():
    """The first check in each worker spends 1.2 s before its launch (more than the whole check's former
    deadline, kernel_floor_s + check_slack_s = 1.0 s here): its time before the launch gets check_slack_factor
    x the slowest seen in the session, so the checks after a take-over pass, while the endless kernel is
    still killed about kernel_floor_s after its launch."""
    be = SlowLoadBackend(lambda c: 100.0 - 5.0 * c.K, noise=0.002, compile_s=lambda c: 0.5 + 0.1 * c.K)
    opts = IsolationOptions(first_watchdog_s=30.0, watchdog_floor_s=0.5, kernel_floor_s=0.2, check_slack_s=0.5,
                            check_slack_factor=4.0, **ONE_SPARE)
    iso = IsolatedBackend(be, worker_spec=be, options=opts)
    op = tt.autotune(tt.Space(K=[0, 1, 2, 3, 4, 5], baseline=dict(K=0)), reference=lambda x, y: x * 2,
                     writes=["y"], db=False, backend=iso, progress=False, isolation="none")(
        _plan_with({3: hanging_kernel}))
    _warm(iso)
    x, y = torch.randn(16), torch.empty(16)
    op(x, y)
    (res,) = op.results.values()
    by_k = {m.config["K"]: m for m in res.measurements}
    assert {k: m.status for k, m in by_k.items()} == {0: Status.OK, 1: Status.OK, 2: Status.OK, 3: Status.TIMEOUT,
                                                     4: Status.OK, 5: Status.OK}, {k: m.reason for k, m in by_k.items()}
    (fault,) = res.stats["faults"]
    assert fault["phase"] == "launched" and fault["waited_s"] < 1.0, fault
    # the spare that took over paid its slow first launch again, and it was allowed
    assert len(res.stats["first_check_s"]) == 2 and min(res.stats["first_check_s"]) >= 1.2, res.stats["first_check_s"]
    assert max(res.stats["check_load_s"]) >= 1.2
    assert res.winner == {"K": 5}
    torch.testing.assert_close(y, x * 2)


def test_a_session_starts_its_spares_alongside_its_worker():
    """start_spares spares are started when the session opens (before a fault needs one)."""
    op, iso = _isolated_op({}, IsolationOptions(first_watchdog_s=30.0, start_spares=2), ks=(0, 1))
    w = iso.worker(0)
    assert w.starts == 0 and not w.spares
    op(torch.randn(8), torch.empty(8))
    assert len(w.spares) == 2 and all(sp.alive or sp._starting for sp in w.spares)


def test_prestart_waits_for_torch_and_a_quick_exit_is_silent():
    """Defining an op before torch is imported starts no side-thread import of torch (it raced the
    caller's first import and, in a process that ends at once, module teardown: tracebacks at exit)."""
    import subprocess
    import sys as _sys
    from pathlib import Path

    code = ("import sys, numpy as np, tiletune as tt\n"
            "op = tt.autotune(tt.Space(TM=[1, 2]))(lambda cfg, x: None)\n"
            "import threading\n"
            "assert not [t for t in threading.enumerate() if t.name == 'tiletune-worker-prestart']\n"
            "assert 'torch' not in sys.modules, 'prestart imported torch'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILETUNE_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
    got = subprocess.run([_sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stderr == ""


def test_a_kernel_launched_late_in_a_teardown_gets_only_what_is_left_of_it():
    """The kernel watchdog's allowance for a killed worker still being torn down is what is left of
    1.5x the slowest teardown so far, not that whole time again: on an H200, a worker killed with an
    unreported fault took 3.5 s to be gone, the spare's session open waited most of it out, and the
    next endless kernel was then given 8 s instead of about 1.5 s."""
    from types import SimpleNamespace

    from tiletune.devices.workers.session import WorkerSession

    def deadline(since, reap_s=(3.5,)):
        worker = SimpleNamespace(reaping_for_s=lambda: since, reap_s=list(reap_s))
        s = SimpleNamespace(options=IsolationOptions(first_watchdog_s=30.0), _slow_us=10.0, _best_us=10.0,
                            _kernel_max_s=0.001, _fatal_kernel_max_s=0.0, worker=worker, _xid=None)
        return WorkerSession._kernel_deadline(s)

    assert deadline(None) == pytest.approx(1.0)  # nothing torn down: the floor
    assert deadline(0.0) == pytest.approx(1.0 + 5.25)  # a teardown just begun: all of 1.5 x 3.5 s
    assert deadline(3.5) == pytest.approx(1.0 + 1.75)  # 3.5 s into it
    assert deadline(6.0) == pytest.approx(1.5)  # past the expectation: check_slack_s still


def test_reaping_for_s_times_the_oldest_teardown_still_running(monkeypatch):
    import subprocess as sp_mod

    w = WorkerProcess()
    assert w.reaping_for_s() is None
    proc = sp_mod.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    real_wait = sp_mod.Popen.wait

    def slow_wait(self, timeout=None):
        if timeout is not None and timeout >= 30:
            time.sleep(0.6)
        return real_wait(self, timeout)

    monkeypatch.setattr(sp_mod.Popen, "wait", slow_wait)
    w.proc = proc
    w.kill()
    time.sleep(0.2)
    since = w.reaping_for_s()
    assert since is not None and 0.15 <= since < 0.6, since
    w.wait_reaped(5.0)
    assert w.reaping_for_s() is None and w.reap_s and w.reap_s[-1] >= 0.6


def test_after_its_kernel_a_check_gets_check_after_s_for_its_reference_and_comparison():
    """A session's first mismatch runs comparison code (and loads kernels) seen there first: on an H200
    a wrong-result candidate was taken for a hang at 0.5 s after its kernel's end."""
    from types import SimpleNamespace

    from tiletune.devices.workers.session import WorkerSession

    s = WorkerSession.__new__(WorkerSession)
    s.options = IsolationOptions(first_watchdog_s=30.0)
    s._best_us = s._slow_us = 10.0
    s._kernel_max_s = s._fatal_kernel_max_s = s._load_max_s = s._after_max_s = s._check_max_s = 0.001
    s._checks_in_gen = 1
    s.worker = SimpleNamespace(reaping_for_s=lambda: None, reap_s=[])
    s._xid = None
    _, phases = s._check_watch()
    assert phases["ran"] == pytest.approx(s.options.check_after_s) and s.options.check_after_s >= 2.0
    s._after_max_s = 1.0
    assert s._check_watch()[1]["ran"] == pytest.approx(4.0)  # check_slack_factor x the slowest so far
