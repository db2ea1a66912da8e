"""CUDA IPC life cycle of the tuning workers (CPU): the caller shares staging copies, never its own
memory; the worker drops its views of them when it opens a session, what a session held when it
closes and everything before it exits; the caller collects torch's limbo after the worker's replies
and at shutdown. Tensors that claim to live on a GPU stand in for CUDA ones; the real thing is
tests/test_gpu_ipc.py."""

from __future__ import annotations

import gc
import json
import weakref

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cloudpickle")

import tiletune as tt
from tiletune.devices.backends import FakeBackend
from tiletune.devices.workers import IsolatedBackend, IsolationOptions, client, shipping
from tiletune.devices.workers import session as session_mod
from tiletune.devices.workers.worker_main import Worker


class FakeCuda(torch.Tensor):  # a CPU tensor that says it lives on a GPU
    @property
    def is_cuda(self):  # noqa: D401
        return True


def _as_is(t):
    """Stands in for torch's rebuild of a shared CUDA tensor (the tensor travels as CPU bytes)."""
    return t


@pytest.fixture
def shares(monkeypatch):
    """torch's CUDA reduction replaced by a recorder: the tensors that would get an IPC handle."""
    import torch.multiprocessing.reductions as reductions

    shared: list = []
    monkeypatch.setattr(reductions, "reduce_tensor", lambda t: shared.append(t) or (_as_is, (t,)))
    return shared


def test_a_send_shares_staging_copies_never_the_callers_memory(shares):
    base = torch.arange(16, dtype=torch.float32)
    x = base.as_subclass(FakeCuda)
    tail = base[4:].as_subclass(FakeCuda)  # a view of the same memory
    payload = {"args": (x, tail, 3)}
    assert shipping.dumps(payload, probe=True) and shares == []  # a probe shares nothing
    data = shipping.dumps(payload)
    assert len(shares) == 2
    caller_ptr = base.untyped_storage().data_ptr()
    ptrs = {t.untyped_storage().data_ptr() for t in shares}
    assert caller_ptr not in ptrs
    assert len(ptrs) == 1  # one staging copy per storage: the view still shares memory with x
    assert [t.storage_offset() for t in shares] == [0, 4]
    assert torch.equal(shares[0], base) and torch.equal(shares[1], base[4:])
    loaded = shipping.loads(data)
    assert torch.equal(loaded["args"][0], base) and loaded["args"][2] == 3


def test_staging_keeps_requires_grad_and_parameters(shares):
    p = torch.nn.Parameter(torch.randn(4).as_subclass(FakeCuda))
    leaf = torch.randn(3, requires_grad=True)
    nonleaf = (leaf * 2).as_subclass(FakeCuda)  # torch refuses to share a non-leaf that requires grad
    shipping.dumps({"args": (p, nonleaf)})
    sp, sn = shares
    assert isinstance(sp, torch.nn.Parameter) and sp.requires_grad
    assert sn.is_leaf and sn.requires_grad
    assert torch.equal(sn.detach(), nonleaf.detach())


def test_rebuilt_shares_are_counted_while_alive(shares):
    t = torch.ones(8).as_subclass(FakeCuda)
    before = shipping.held_shares()
    got = shipping.loads(shipping.dumps({"args": (t,)}))
    assert shipping.held_shares() == before + 1
    del got
    assert shipping.held_shares() == before


def test_collect_shared_runs_ipc_collect_only_once_cuda_is_initialized(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: calls.append(1))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert shipping.collect_shared() is False and calls == []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert shipping.collect_shared() is True and calls == [1]

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "ipc_collect", broken)
    assert shipping.collect_shared() is False  # clean-up never raises


# -- the worker ----------------------------------------------------------------------------------


class _Conn:
    """A worker's connection: requests queued in, replies recorded."""

    def __init__(self, *requests: dict) -> None:
        self.inbox = [i.to_bytes(8, "little", signed=True) + shipping.dumps(r) for i, r in enumerate(requests, 1)]
        self.sent: list[dict] = []

    def recv_bytes(self) -> bytes:
        if not self.inbox:
            raise EOFError
        return self.inbox.pop(0)

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(json.loads(data))


class _Session:
    """A backend session that holds its arguments and reference in a reference cycle (as a real one
    may), so only the garbage collector frees it once dropped."""

    def __init__(self, args, reference) -> None:
        self.args, self.reference, self.me = args, reference, self
        self.stats = {"prefetch_hits": 2}

    def finish(self, winner) -> None:
        pass


OPENED: list = []  # weak references to the sessions the backends below opened (in any copy of them)


class _Backend:
    def open_session(self, plan, args, *, device_index, writes, inplace, reference, tolerance, name):
        s = _Session(args, reference)
        OPENED.append(weakref.ref(s))
        return s


class _Holder:
    """A reference that holds a tensor (as one shipped by value that captured a CUDA tensor does)."""

    def __init__(self, t) -> None:
        self.t = t

    def __call__(self, *a):
        return self.t


def _open_msg(backend, args, reference=None) -> dict:
    return {"op": "open", "session": 1, "backend": backend, "args": args, "plan": lambda cfg, *a: None,
            "writes": (0,), "inplace": (), "reference": reference, "tolerance": None, "device_index": 0,
            "name": "op"}


@pytest.fixture
def no_auto_gc():
    """Automatic collections off: what is freed is freed by the code under test."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def test_the_worker_drops_the_arguments_views_even_when_copying_fails(monkeypatch):
    def boom(t):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(shipping, "own_copy", boom)
    msg = _open_msg(_Backend(), (torch.zeros(4),))
    with pytest.raises(RuntimeError):
        Worker(_Conn()).op_open(msg)
    assert "args" not in msg


def test_close_frees_what_the_session_held_and_reports_no_share(shares, no_auto_gc):
    captured = shipping.loads(shipping.dumps(torch.ones(4).as_subclass(FakeCuda)))  # a share, as a worker gets it
    held0 = shipping.held_shares()
    reference = _Holder(captured)
    del captured
    OPENED.clear()
    w = Worker(_Conn())
    assert w.op_open(_open_msg(_Backend(), (torch.zeros(4),), reference))["ok"]
    del reference
    (alive,) = OPENED
    assert alive() is not None and shipping.held_shares() == held0
    reply = w.op_close({"op": "close", "session": 1})
    assert reply["ok"] and reply["stats"] == {"prefetch_hits": 2}
    assert reply["shares_held"] == held0 - 1 == shipping.held_shares()
    assert alive() is None  # the session, its arguments and its reference are gone


def test_exit_drops_every_session_before_answering(shares, no_auto_gc):
    OPENED.clear()
    held0 = shipping.held_shares()
    # the reference is shipped with a CUDA tensor inside: the worker holds that share for the session
    conn = _Conn(_open_msg(_Backend(), (torch.zeros(4),), _Holder(torch.ones(4).as_subclass(FakeCuda))),
                 {"op": "exit"})
    w = Worker(conn)
    w.serve()  # returns on exit
    opened, bye = conn.sent
    assert opened["ok"] and bye["ok"]
    assert bye["shares_held"] == held0 == shipping.held_shares()
    assert w.sessions == {}
    (alive,) = OPENED
    assert alive() is None


# -- the caller ----------------------------------------------------------------------------------


def test_a_session_collects_after_opening_and_after_closing(monkeypatch):
    collected = []
    monkeypatch.setattr(session_mod, "collect_shared", lambda: collected.append(1) or True)
    be = FakeBackend(lambda c: 100.0 - c.K, noise=0.002, compile_s=0.01)
    iso = IsolatedBackend(be, worker_spec=be, options=IsolationOptions(spare=False))

    def kern(x, y):
        y.copy_(x * 2)

    op = tt.autotune(tt.Space(K=[0, 1], baseline=dict(K=0)), reference=lambda x, y: x * 2, writes=["y"], db=False,
                     backend=iso, progress=False, isolation="none")(lambda cfg, x, y: tt.Launch(kern, (1,), (x, y)))
    try:
        x, y = torch.randn(8), torch.empty(8)
        op(x, y)
        (res,) = op.results.values()
        assert res.stats["isolation"] == "process"
        assert res.stats["shares_held"] == 0
        assert len(collected) == 2  # the open's reply, the close's
    finally:
        iso.worker(0).close()


def test_shutdown_collects_after_the_workers_have_exited(monkeypatch):
    order = []
    monkeypatch.setattr(client, "collect_shared", lambda: order.append("collect") or True)

    class Closing:
        def close(self, timeout: float = 2.0, final: bool = False) -> int:
            order.append("close")
            return 0

    client.worker_for("ipc-test", 0, Closing)
    client.shutdown_all(final=False)
    assert order == ["close", "collect"]


class _DeferringSession(_Session):
    def __init__(self, args, reference, defer) -> None:
        super().__init__(args, reference)
        self.ran = [] if defer else [reference(*args)]

    def prepare(self) -> None:
        if not self.ran:
            self.ran.append(self.reference(*self.args))


class _DeferringBackend:
    defers_reference = True

    def open_session(self, plan, args, *, device_index, writes, inplace, reference, tolerance, name,
                     defer_reference=False):
        return _DeferringSession(args, reference, defer_reference)


def test_an_open_that_defers_the_reference_runs_it_at_prepare_only():
    """The caller opens with ``defer_reference`` and sends ``prepare`` once its first compiles are sent: the
    reference runs then (while they compile), not at the open; a backend that cannot defer runs it at the
    open, and ``prepare`` is then a no-op."""
    calls = []

    def reference(*a):
        calls.append(a)
        return a[0]

    w = Worker(_Conn())
    assert w.op_open(dict(_open_msg(_DeferringBackend(), (torch.zeros(4),), reference), defer_reference=True))["ok"]
    assert calls == []
    reply = w.op_prepare({"op": "prepare", "session": 1})
    assert reply["ok"] and len(calls) == 1 and reply["seconds"] >= 0
    assert w.op_prepare({"op": "prepare", "session": 1})["ok"] and len(calls) == 1
    w.op_close({"op": "close", "session": 1})
    assert w.op_open(_open_msg(_DeferringBackend(), (torch.zeros(4),), reference))["ok"]  # not asked: at the open
    assert len(calls) == 2
    assert w.op_open(dict(_open_msg(_Backend(), (torch.zeros(4),), reference), defer_reference=True))["ok"]
    assert w.op_prepare({"op": "prepare", "session": 1})["ok"]  # a backend without deferral: nothing to run
