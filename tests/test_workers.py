"""Tuning in worker processes (CPU): fake kernels that raise, exit, hang, kill themselves or make the
worker send garbage must each fail alone, while the search finishes with the right winner and the
caller's tensors stay untouched.

The workers here are real child processes (``python -m tiletune.devices.workers.worker_main``) hosting a
shipped :class:`~tiletune.devices.backends.FakeBackend`; the "kernels" are Python functions run there.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cloudpickle")

import tiletune as tt
from tiletune.devices.backends import FakeBackend
from tiletune.records import Status
from tiletune.devices.workers import IsolatedBackend, IsolationOptions, WorkerFault, WorkerProcess
from tiletune.devices.workers.protocol import ProtocolError, decode_reply

SPACE = tt.Space(K=[0, 1, 2, 3, 4, 5, 6, 7], baseline=dict(K=0))
#: one warm spare, not up to four: each is a Python importing torch (about a CPU-second here), and these
#: tests are about what a fault does to its candidate (the spares have their own, test_worker_lifecycle)
FAST = IsolationOptions(watchdog_factor=20.0, watchdog_floor_s=1.0, first_watchdog_s=4.0, start_spares=1,
                        max_spares=1)


def model(cfg) -> float:
    return 100.0 - 5.0 * cfg.K  # K=7 would be fastest, K=6 next


def good_kernel(x, y):
    y.copy_(x * 2)


def wrong_kernel(x, y):
    y.copy_(x * 2 + 1)


def raising_kernel(x, y):
    raise RuntimeError("boom from the kernel")


def exiting_kernel(x, y):
    os._exit(7)


def hanging_kernel(x, y):
    time.sleep(3600)


def sigkill_kernel(x, y):
    os.kill(os.getpid(), signal.SIGKILL)


def scribbling_kernel(x, y):
    x.fill_(-1.0)  # a wild write into an input: must only hit the worker's copy
    y.copy_(x * 2)


BAD = {
    1: raising_kernel,
    2: exiting_kernel,
    3: hanging_kernel,
    4: sigkill_kernel,
    5: wrong_kernel,
    6: scribbling_kernel,
}


def plan(cfg, x, y):
    return tt.Launch(BAD.get(cfg.K, good_kernel), (1,), (x, y))


def make_op(bad: dict[int, object] | None = None, options: IsolationOptions = FAST, **kw):
    be = FakeBackend(model, noise=0.002)
    iso = IsolatedBackend(be, worker_spec=be, options=options)

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False, backend=iso, progress=False,
                 isolation="none", **kw)
    def op(cfg, x, y):
        return plan(cfg, x, y)

    return op, be


@pytest.mark.parametrize("start", ["forked", pytest.param("spawned", marks=pytest.mark.spawned_workers)])
def test_every_fault_is_a_failed_candidate_and_the_winner_is_correct(start):
    """Both ways a worker starts: forked by the zygote (a GPU host) and a fresh interpreter (no GPU seen)."""
    op, be = make_op()
    x = torch.randn(64)
    x0 = x.clone()
    y = torch.full((64,), 123.0)
    t0 = time.perf_counter()
    op(x, y)
    wall = time.perf_counter() - t0
    (result,) = op.results.values()
    by_k = {m.config["K"]: m for m in result.measurements}
    assert by_k[1].status is Status.LAUNCH_ERROR and "boom from the kernel" in by_k[1].reason
    assert by_k[2].status is Status.LAUNCH_ERROR and "exit code 7" in by_k[2].reason
    assert by_k[3].status is Status.TIMEOUT and "watchdog" in by_k[3].reason
    assert by_k[4].status is Status.LAUNCH_ERROR and "SIGKILL" in by_k[4].reason
    assert by_k[5].status is Status.MISMATCH
    # the scribbler wrote into its input: wrong output there, and the caller's x is never touched
    assert by_k[6].status is Status.MISMATCH and "wrote into read-only argument(s) [0]" in by_k[6].reason
    assert by_k[0].status is Status.OK and by_k[7].status is Status.OK
    assert result.winner == {"K": 7}
    assert len(result.measurements) == 8  # nothing lost
    # the caller's input is intact, the output holds exactly the winner's result, launched here
    assert torch.equal(x, x0)
    torch.testing.assert_close(y, x0 * 2)
    assert [c.as_dict() for c, _, _ in be.launches] == [{"K": 7}]
    assert result.stats["isolation"] == "process"
    assert result.stats["worker_restarts"] == 3  # exit, hang, SIGKILL
    assert wall < 60
    from conftest import RUNNER_ZYGOTE

    if RUNNER_ZYGOTE is None:
        assert result.stats["worker_forked"] is (start == "forked"), result.stats


def test_only_verified_configs_ever_run_in_the_caller():
    op, be = make_op()
    x, y = torch.randn(8), torch.empty(8)
    op(x, y)
    op(x, y)
    assert {c["K"] for c, _, _ in be.launches} == {7}


def test_all_failing_raises_with_every_reason():
    space = tt.Space(K=[1, 2, 5], baseline=dict(K=1))
    be = FakeBackend(model)
    iso = IsolatedBackend(be, worker_spec=be, options=FAST)

    @tt.autotune(space, reference=lambda x, y: x * 2, writes=["y"], db=False, backend=iso, progress=False)
    def op(cfg, x, y):
        return plan(cfg, x, y)

    with pytest.raises(tt.AllCandidatesFailed) as info:
        op(torch.randn(4), torch.empty(4))
    text = str(info.value)
    assert "boom" in text and "exit code 7" in text and "mismatch" in text


def test_unshippable_plan_falls_back_with_one_warning():
    import threading

    lock = threading.Lock()  # cannot be pickled: the plan closes over it
    be = FakeBackend(model)

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False, backend=be, progress=False,
                 isolation="process")
    def op(cfg, x, y):
        with lock:
            return tt.Launch(good_kernel, (1,), (x, y))

    with pytest.warns(RuntimeWarning, match="cannot be tuned in a worker process") as rec:
        op(torch.randn(4), torch.empty(4))
        op(torch.randn(5), torch.empty(5))
    assert len([w for w in rec if "worker process" in str(w.message)]) == 1
    assert op.tuning_count == 2


def test_isolation_argument_and_environment(monkeypatch):
    with pytest.raises(ValueError, match="isolation"):
        tt.autotune(SPACE, backend=FakeBackend(model), isolation="threads")(plan)
    monkeypatch.setenv("TILETUNE_ISOLATION", "bogus")
    with pytest.raises(ValueError, match="TILETUNE_ISOLATION"):
        tt.autotune(SPACE, backend=FakeBackend(model))(plan)
    monkeypatch.setenv("TILETUNE_ISOLATION", "none")
    assert tt.autotune(SPACE, backend=FakeBackend(model))(plan).isolation == "none"
    monkeypatch.delenv("TILETUNE_ISOLATION")
    assert tt.autotune(SPACE, backend=FakeBackend(model), isolation="process")(plan).isolation == "process"


GARBAGE_WORKER = r"""
import os, sys, json
from multiprocessing.connection import Client
conn = Client(os.environ["TILETUNE_WORKER_ADDRESS"], family="AF_UNIX",
              authkey=bytes.fromhex(os.environ["TILETUNE_WORKER_AUTHKEY"]))
mode = os.environ["GARBAGE_MODE"]
while True:
    raw = conn.recv_bytes()
    if mode == "bytes":
        conn.send_bytes(b"\x80\x04garbage")
    elif mode == "json":
        conn.send_bytes(json.dumps({"id": "seven", "ok": 1}).encode())
    elif mode == "wrong_id":
        conn.send_bytes(json.dumps({"id": 99999, "ok": True}).encode())
"""


@pytest.mark.parametrize("mode", ["bytes", "json", "wrong_id"])
def test_garbage_from_a_worker_is_a_protocol_fault(mode):
    w = WorkerProcess("none", 0, command=[sys.executable, "-c", GARBAGE_WORKER], env={"GARBAGE_MODE": mode})
    with pytest.raises(WorkerFault) as info:
        w.start()
    assert info.value.kind == "protocol"
    assert not w.alive  # killed


def test_worker_that_never_connects_times_out(monkeypatch):
    import tiletune.devices.workers.client as client

    monkeypatch.setattr(client, "START_TIMEOUT_S", 1.0)
    w = WorkerProcess("none", 0, command=[sys.executable, "-c", "import time; time.sleep(60)"])
    t0 = time.perf_counter()
    with pytest.raises(WorkerFault) as info:
        w.start()
    assert info.value.kind == "timeout" and time.perf_counter() - t0 < 10
    assert not w.alive


def test_worker_that_dies_at_start_reports_its_output():
    w = WorkerProcess("none", 0, command=[sys.executable, "-c", "import sys; print('no cuda here'); sys.exit(4)"])
    with pytest.raises(WorkerFault) as info:
        w.start()
    assert info.value.kind == "died" and "exit code 4" in str(info.value) and "no cuda here" in str(info.value)


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        b'{"ok": true}',
        b'{"id": 1, "ok": "yes"}',
        b'{"event": "compiled", "session": 1, "order": 0, "status": "fine", "seconds": 0.1}',
        b'{"event": "compiled", "session": 1, "order": 0, "status": "ok", "seconds": -1}',
        b'{"event": "exploded"}',
    ],
)
def test_decode_reply_rejects_garbage(raw):
    with pytest.raises(ProtocolError):
        decode_reply(raw)


def test_samples_are_validated():
    from tiletune.devices.workers.protocol import Reply, samples_from

    assert samples_from(Reply(1, True, {"samples": [1.0, 2]}), 2) == [1.0, 2.0]
    for bad in ([1.0], [1.0, -2.0], [1.0, "x"], [True, 1.0]):
        with pytest.raises(ProtocolError):
            samples_from(Reply(1, True, {"samples": bad}), 2)


def test_shipping_round_trips_tensor_layout():
    from tiletune.devices.workers.shipping import dumps, loads, own_copy

    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    view = base[1:5, 2:9].t()  # strided, offset, not contiguous
    got = loads(dumps(view))
    assert got.shape == view.shape and got.stride() == view.stride()
    assert got.storage_offset() == view.storage_offset()
    assert torch.equal(got, view)
    mine = own_copy(got)
    mine.fill_(0)
    assert torch.equal(got, view)  # the copy owns its memory
    bf = torch.randn(5).to(torch.bfloat16)
    assert torch.equal(loads(dumps(bf)), bf)


def test_plan_the_worker_cannot_import_falls_back_with_one_warning():
    import types

    mod = types.ModuleType("tiletune_test_only_in_caller")
    mod.__file__ = "/nonexistent/tiletune_test_only_in_caller.py"
    sys.modules[mod.__name__] = mod
    try:
        def kernel_plan(cfg, x, y):
            return tt.Launch(good_kernel, (1,), (x, y))

        kernel_plan.__module__ = mod.__name__
        kernel_plan.__qualname__ = "kernel_plan"
        mod.kernel_plan = tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False,
                                      backend=FakeBackend(model), progress=False, isolation="process")(kernel_plan)
        op = mod.kernel_plan
        with pytest.warns(RuntimeWarning, match="cannot load request"):
            op(torch.randn(4), torch.empty(4))
        assert op.tuning_count == 1
    finally:
        del sys.modules[mod.__name__]


def test_sticky_cuda_errors_are_recognised():
    from tiletune.devices.workers.worker_main import sticky_error

    assert sticky_error("AcceleratorError: CUDA error: an illegal memory access was encountered")
    assert sticky_error("RuntimeError: CUDA error: misaligned address")
    assert sticky_error("RuntimeError: operation not supported on global/shared address space")
    assert not sticky_error("TileCompilerExecutionError: failed to compile Tile IR program")
    assert not sticky_error("ValueError: grid must be positive")


NOTEBOOK_CELL = '''
from __future__ import annotations
import cuda.tile as ct
ConstInt = ct.Constant[int]

@ct.kernel(occupancy=2)
def cell_kernel(X, Y, TILE: ConstInt):
    t = ct.load(X, index=(ct.bid(0),), shape=(TILE,))
    ct.store(Y, index=(ct.bid(0),), tile=t * 2)

def cell_plan(cfg, x, y):
    return (cell_kernel, (1,), (x, y, cfg.TILE))
'''

CHECK_IN_FRESH_PROCESS = r"""
import inspect, sys
from tiletune.devices.workers.shipping import loads
plan = loads(sys.stdin.buffer.read())
k = plan.__globals__["cell_kernel"]
src = inspect.getsource(k._pyfunc)
assert "t * 2" in src, src
assert k._compiler_options.occupancy == 2
print("ANNOT", k._pyfunc.__annotations__["TILE"])
"""


def test_a_kernel_from_a_notebook_cell_ships_with_its_source_and_annotations():
    """A plan and kernel defined in a notebook cell (source only in linecache, string annotations)
    are rebuilt in a fresh interpreter with the source cuTile parses and evaluated annotations."""
    pytest.importorskip("cuda.tile")
    import linecache
    import subprocess

    from tiletune.devices.workers.shipping import dumps

    filename = "<ipython-input-7-tiletune-test>"
    linecache.cache[filename] = (len(NOTEBOOK_CELL), None, NOTEBOOK_CELL.splitlines(True), filename)
    ns: dict = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_CELL, filename, "exec"), ns)
    data = dumps(ns["cell_plan"])
    out = subprocess.run([sys.executable, "-c", CHECK_IN_FRESH_PROCESS], input=data, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert b"ANNOT typing.Annotated[int" in out.stdout


class _CompileCrashSession:
    """A simulated session whose compiler takes its process down (or hangs) on one config."""

    def __init__(self, inner, mode: str) -> None:
        self.inner, self.mode = inner, mode

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def compile(self, candidates):
        for c in candidates:
            if c.config["K"] == 2:
                if self.mode == "exit":
                    os._exit(9)  # the compiler crashed and took the worker with it
                time.sleep(3600)  # the compiler hangs
        yield from self.inner.compile(candidates)


class CompileCrashBackend(FakeBackend):
    def __init__(self, mode: str) -> None:
        super().__init__(model, noise=0.002)
        self.mode = mode

    def open_session(self, *a, **k):
        return _CompileCrashSession(super().open_session(*a, **k), self.mode)


@pytest.mark.parametrize("mode", ["exit", "hang"])
def test_a_compiler_that_crashes_or_hangs_the_worker_fails_only_its_config(mode):
    from tiletune.devices.workers.session import IsolationOptions as Opts

    be = CompileCrashBackend(mode)
    # a hung compile costs the compile limit twice (the batch, then the culprit alone): 2 s, not 3 (the
    # fake's compiles answer at once); one spare, as FAST
    iso = IsolatedBackend(be, worker_spec=be, options=Opts(first_watchdog_s=4.0, compile_timeout_s=0.5,
                                                           compile_slack_s=1.5, start_spares=1, max_spares=1))

    @tt.autotune(tt.Space(K=[0, 1, 2, 3], baseline=dict(K=0)), reference=lambda x, y: x * 2, writes=["y"],
                 db=False, backend=iso, progress=False)
    def op(cfg, x, y):
        return tt.Launch(good_kernel, (1,), (x, y))

    x, y = torch.randn(8), torch.empty(8)
    op(x, y)
    (res,) = op.results.values()
    by_k = {m.config["K"]: m for m in res.measurements}
    assert by_k[2].status in (Status.COMPILE_ERROR, Status.TIMEOUT) and "compiling took the worker down" in by_k[2].reason
    assert all(by_k[k].status is Status.OK for k in (0, 1, 3))
    assert res.winner == {"K": 3}
    torch.testing.assert_close(y, x * 2)


_first_launch_done: set = set()


def slow_first_launch_kernel(x, y):
    """Its first launch in a process takes 2.5 s (a cubin compiled again at first launch, marked as a compile
    the way PrefetchKernel marks cuTile's own compile), later ones none."""
    from tiletune.devices.compile_pool import compiling

    if os.getpid() not in _first_launch_done:
        _first_launch_done.add(os.getpid())
        with compiling():
            time.sleep(2.5)
    y.copy_(x * 2)


def slow_first_plan(cfg, x, y):
    kernel = {3: hanging_kernel, 5: slow_first_launch_kernel}.get(cfg.K, good_kernel)
    return tt.Launch(kernel, (1,), (x, y))


def test_a_slow_first_launch_is_not_taken_for_a_hang():
    """A check is a candidate's first launch in the worker and may compile there once more (seen on the
    H200: 1.4-2.7 s per decode-attention config, beyond a sample's 2 s watchdog): it gets the compile
    allowance, while a kernel that never returns still times out."""
    be = FakeBackend(model, noise=0.002)
    iso = IsolatedBackend(be, worker_spec=be, options=FAST)
    op = tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False, backend=iso, progress=False,
                     isolation="none")(slow_first_plan)
    x = torch.randn(64)
    y = torch.empty(64)
    op(x, y)
    (result,) = op.results.values()
    by_k = {m.config["K"]: m for m in result.measurements}
    assert by_k[5].status is Status.OK, by_k[5].reason  # a sample's deadline here is about 1 s
    assert by_k[3].status is Status.TIMEOUT and "watchdog" in by_k[3].reason
    assert max(result.stats["check_s"]) >= 2.5  # the worker reports each check's time


class CountingBackend(FakeBackend):
    """A fake whose sessions carry the compile-ahead counters a cuTile session keeps."""

    def open_session(self, *args, **kwargs):
        session = super().open_session(*args, **kwargs)
        session.stats = {"prefetch_hits": 5, "prefetch_misses": 1, "not_forwarded": 9}
        return session


def test_the_worker_sessions_compile_ahead_counters_reach_the_result():
    """prefetch_hits / prefetch_misses of the worker's session come back when it closes (a mismatch
    between the signature compiled ahead and the launch shows up as misses in the caller's result)."""
    be = CountingBackend(model, noise=0.002)
    iso = IsolatedBackend(be, worker_spec=be, options=FAST)
    op = tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False, backend=iso, progress=False,
                     isolation="none")(lambda cfg, x, y: tt.Launch(good_kernel, (1,), (x, y)))
    op(torch.randn(16), torch.empty(16))
    (result,) = op.results.values()
    assert (result.stats["prefetch_hits"], result.stats["prefetch_misses"]) == (5, 1)
    assert "not_forwarded" not in result.stats


def test_phase_events_are_validated():
    from tiletune.devices.workers.protocol import PhaseEvent

    assert decode_reply(b'{"event":"phase","session":1,"what":"launched"}') == PhaseEvent("launched")
    assert decode_reply(b'{"event":"phase","session":1,"what":"ran"}') == PhaseEvent("ran")
    for bad in (b'{"event":"phase","what":"exploded"}', b'{"event":"phase"}', b'{"event":"phase","what":3}'):
        with pytest.raises(ProtocolError):
            decode_reply(bad)


def test_launch_marks_reach_only_a_listener_and_never_raise():
    from tiletune.devices import launch_marks

    got = []
    launch_marks.mark("launched")  # nobody listens: nothing happens
    launch_marks.listen(got.append)
    try:
        launch_marks.mark("launched")
        launch_marks.mark("ran")
    finally:
        launch_marks.listen(None)
    launch_marks.mark("ran")
    assert got == ["launched", "ran"]

    def broken(what):
        raise OSError("the caller is gone")

    launch_marks.listen(broken)
    try:
        launch_marks.mark("launched")  # swallowed: a lost mark only leaves the longer deadline
    finally:
        launch_marks.listen(None)


def test_a_new_worker_warms_the_checking_path_of_every_common_dtype():
    """warm_checks runs a checked run's guard, reference comparison and mismatch path per dtype (here on
    the CPU: the same code a worker runs on its GPU at start) and says what it warmed."""
    from tiletune.devices.workers.worker_main import WARM_DTYPES, warm_checks

    spent = warm_checks(torch, "cpu")
    assert set(spent) == set(WARM_DTYPES)
    assert all(s >= 0 for s in spent.values())
    assert warm_checks(torch, "cpu", ("not_a_dtype", "float32")).keys() == {"float32"}


def test_compiled_events_say_whether_the_assembler_ran():
    ev = decode_reply(b'{"event":"compiled","session":1,"order":2,"status":"ok","seconds":0.1,"assembled":true}')
    assert ev.assembled is True
    ev = decode_reply(b'{"event":"compiled","session":1,"order":2,"status":"ok","seconds":0.1,"assembled":"yes"}')
    assert ev.assembled is None  # not a bool: unknown
    ev = decode_reply(b'{"event":"compiled","session":1,"order":2,"status":"ok","seconds":0.1}')
    assert ev.assembled is None


class SlowVersionsBackend(FakeBackend):
    """A fake whose versions() fails: reading cuTile's versions (compiler import, tileiras) is slow."""

    def versions(self):
        raise RuntimeError("versions read on the worker's start path")


def test_a_worker_start_does_not_read_the_toolchain_versions():
    be = SlowVersionsBackend(model, noise=0.002)
    w = WorkerProcess(be)
    try:
        w.start()
        assert w.ready and "pid" in w.info and "versions" not in w.info
    finally:
        w.close()


class _StartingWorker:
    """A worker that has not answered yet, forked by the zygote or started from scratch."""

    def __init__(self, forked: bool) -> None:
        self.ready, self.forked = False, forked


class _AheadRecorder(FakeBackend):
    def __init__(self) -> None:
        super().__init__(model)
        self.asked: list[int] = []

    def compile_ahead(self, plan, args, configs, device_index, keep=False):
        self.asked.append(len(configs))
        return None


def _plan(cfg, x, y):
    return tt.Launch(good_kernel, (1,), (x, y))


@pytest.mark.parametrize("forked,n,wanted", [(False, 32, True), (True, 4, True), (True, 5, False), (False, 2, True)])
def test_the_caller_compiles_ahead_only_what_a_starting_worker_would_wait_for(monkeypatch, forked, n, wanted):
    """A worker started from scratch takes seconds: the caller compiles every config meanwhile. One forked
    by the zygote answers within a few tenths of a second and forks its front ends: the caller (front ends
    one at a time) compiles ahead only a small space, else the worker would wait for its assemblies."""
    from tiletune.devices.workers import session as session_mod

    local = _AheadRecorder()
    iso = IsolatedBackend(local, worker_spec=local, options=FAST)
    monkeypatch.setattr(iso, "worker", lambda device_index: _StartingWorker(forked))
    monkeypatch.setattr(session_mod, "WorkerSession", lambda worker, payload, options, ahead=None: "session")
    got = iso.open_session(_plan, (torch.zeros(2), torch.zeros(2)), device_index=0, writes=(1,), reference=None,
                           tolerance=None, name="t", ahead=[object()] * n)
    assert got == "session"
    assert local.asked == ([n] if wanted else [])


def test_the_worker_runs_the_reference_after_the_first_compiles_are_sent(monkeypatch, tmp_path):
    """The session opens with the reference deferred, sends its compiles, then ``prepare`` (the reference
    runs in the worker while they compile); every check comes after it, and the winner is still right."""
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("TILETUNE_COMPILE_TRACE", str(trace))
    be = FakeBackend(model, noise=0.002)
    iso = IsolatedBackend(be, worker_spec=be, options=FAST)
    op = tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False, backend=iso, progress=False,
                     isolation="none")(lambda cfg, x, y: tt.Launch(good_kernel, (1,), (x, y)))
    x = torch.randn(32)
    y = torch.empty(32)
    op(x, y)
    (result,) = op.results.values()
    torch.testing.assert_close(y, x * 2)
    assert result.stats["worker_restarts"] == 0 and len(result.stats["reference_s"]) == 1
    marks = [json.loads(line) for line in trace.read_text().splitlines()]
    worker = [m for m in marks if m.get("mark") in ("worker_recv", "worker_prepared")]
    ops = [m.get("op", m["mark"]) for m in worker]
    first_check = ops.index("check")
    assert ops[:4] == ["hello", "open", "compile", "prepare"] or ops[:3] == ["open", "compile", "prepare"], ops
    assert ops.index("worker_prepared") < first_check


def _reference_not_in_workers(x, y):
    from tiletune import settings

    if settings.in_worker():
        raise RuntimeError("this reference needs the caller's process")
    return x * 2


def test_a_reference_that_fails_only_in_the_worker_runs_in_the_caller_and_tuning_stays_isolated():
    be = FakeBackend(model, noise=0.002)
    iso = IsolatedBackend(be, worker_spec=be, options=FAST)
    op = tt.autotune(SPACE, reference=_reference_not_in_workers, writes=["y"], db=False, backend=iso,
                     progress=False, isolation="none")(lambda cfg, x, y: tt.Launch(good_kernel, (1,), (x, y)))
    x, y = torch.randn(16), torch.empty(16)
    op(x, y)
    (result,) = op.results.values()
    assert result.stats["isolation"] == "process"
    assert all(m.status is Status.OK for m in result.measurements)
    torch.testing.assert_close(y, x * 2)


def test_a_reference_that_fails_everywhere_raises_its_own_error():
    be = FakeBackend(model, noise=0.002)
    iso = IsolatedBackend(be, worker_spec=be, options=FAST)
    op = tt.autotune(SPACE, reference=lambda x, y: (x, y), writes=["y"], db=False, backend=iso, progress=False,
                     isolation="none")(lambda cfg, x, y: tt.Launch(good_kernel, (1,), (x, y)))
    with pytest.raises(ValueError, match=r"^the reference returned 2 value\(s\) but the op writes 1 argument"):
        op(torch.randn(16), torch.empty(16))
