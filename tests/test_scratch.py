"""``tiletune.kernels._scratch``: placeholders are kept only where memory may outlive the call."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.tile")

from tiletune.kernels import fastcall  # noqa: E402
from tiletune.kernels import _scratch  # noqa: E402


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(_scratch, "_placeholders", {})


def test_placeholders_are_cached_and_constant_where_keepable():
    cpu = torch.device("cpu")
    a = _scratch.placeholder(cpu, torch.bfloat16, (1,))
    assert a is _scratch.placeholder(cpu, torch.bfloat16, (1,))
    assert a.shape == (1,) and a.dtype == torch.bfloat16 and id(a) in fastcall._constants
    b = _scratch.placeholder(cpu, torch.bfloat16, (1, 1))
    c = _scratch.placeholder(cpu, torch.float32, (1,))
    assert len({id(a), id(b), id(c)}) == 3 and b.shape == (1, 1) and c.dtype == torch.float32


def test_placeholders_are_fresh_where_memory_belongs_to_a_graph(monkeypatch):
    monkeypatch.setattr(_scratch, "keepable", lambda device: False)
    cpu = torch.device("cpu")
    a = _scratch.placeholder(cpu, torch.float16, (1,))
    b = _scratch.placeholder(cpu, torch.float16, (1,))
    assert a is not b and _scratch._placeholders == {}
    assert id(a) not in fastcall._constants and id(b) not in fastcall._constants


def test_keepable_rule(monkeypatch):
    assert _scratch.keepable(torch.device("cpu"))
    cuda = torch.device("cuda", 0)
    state = {"stream": 0, "capturing": False}
    monkeypatch.setattr(_scratch, "current_raw_stream", lambda dev: state["stream"])
    monkeypatch.setattr(_scratch, "_default_raw_stream", lambda dev: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])
    assert _scratch.keepable(cuda)
    state["stream"] = 12345  # a side stream: torch.cuda.graph's, or reduce-overhead's graph trees'
    assert not _scratch.keepable(cuda)
    state.update(stream=0, capturing=True)  # capture on the default stream
    assert not _scratch.keepable(cuda)


# ------------------------------------------------------------------------------ one-launch reductions


@pytest.fixture
def reductions(monkeypatch):
    monkeypatch.setattr(_scratch, "_reductions", {})


def test_reduction_scratch_is_kept_zeroed_and_constant_where_keepable(reductions):
    cpu = torch.device("cpu")
    part, sem = _scratch.reduction_scratch(cpu, 1024)
    assert part.shape == (1024,) and part.dtype == torch.float32 and float(part.abs().sum()) == 0.0
    assert sem.shape == (1,) and sem.dtype == torch.int32 and int(sem) == 0
    again = _scratch.reduction_scratch(cpu, 1024)
    assert again[0] is part and again[1] is sem
    assert id(part) in fastcall._constants and id(sem) in fastcall._constants
    other = _scratch.reduction_scratch(cpu, 2048)
    assert other[0].shape == (2048,) and other[0] is not part and other[1] is not sem


def test_reduction_scratch_is_per_call_where_memory_belongs_to_a_graph(reductions, monkeypatch):
    monkeypatch.setattr(_scratch, "keepable", lambda device: False)
    cpu = torch.device("cpu")
    part, sem = _scratch.reduction_scratch(cpu, 1024)
    part2, sem2 = _scratch.reduction_scratch(cpu, 1024)
    assert part2 is not part and sem2 is not sem and int(sem) == 0 and int(sem2) == 0
    assert _scratch._reductions == {} and id(sem) not in fastcall._constants


def test_on_default_stream_precheck(monkeypatch):
    class Dev:
        def __init__(self, index):
            self.index = index

        def get_device(self):
            return self.index

    assert _scratch.on_default_stream(Dev(-1))  # not on a GPU: nothing to race with
    state = {"now": 5}
    monkeypatch.setattr(_scratch, "_default_raw_stream", lambda dev: 5)
    monkeypatch.setattr(_scratch, "current_raw_stream", lambda dev: state["now"])
    assert _scratch.on_default_stream(Dev(0))
    state["now"] = 77  # a side stream (a graph capture's): the recipe's kept counter must not be shared
    assert not _scratch.on_default_stream(Dev(0))


def _ce_problem(m=6, v=300, ignore=(2,)):
    from tiletune.kernels import cross_entropy_op as ce

    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(m, v, generator=g) * 3).to(torch.bfloat16)
    target = torch.randint(0, v, (m,), generator=g)
    for i in ignore:
        target[i] = -100
    return ce, ce.prepare_cross_entropy(logits, target, True)


def test_cross_entropy_gate_checks_the_loss_gradient_and_counter():
    """The fused op's candidates are checked on the mean loss, the gradient and the counter (left at
    zero); the block partials are declared written (saved and restored), their values not compared."""
    from tiletune.devices.verify import SCRATCH, ArgGuard, Checker

    ce, prep = _ce_problem()
    args = prep.args
    loss, grad, part, sem = args[2], args[3], args[4], args[5]
    guard = ArgGuard(args, outputs=(2, 3), inplace=(4, 5))
    checker = Checker(ce.cross_entropy_grad_reference, guard, ce._tolerance(*args))
    want_loss, want_grad, want_part, _ = ce.cross_entropy_grad_reference(*args)
    assert want_part is SCRATCH
    assert want_loss.shape == (1,)

    def run(loss_value, counter=0, part_value=0.0):
        guard.prepare_checked_run()
        loss.copy_(loss_value)
        grad.copy_(want_grad)
        sem.fill_(counter)
        part.fill_(part_value)
        return checker.compare()

    assert run(want_loss) is None
    assert run(want_loss, part_value=1e30) is None  # scratch: its values are not compared
    assert "argument 4" in run(want_loss, part_value=float("nan"))  # but a NaN there is a bug
    assert "argument 5" in run(want_loss, counter=1)  # a counter left behind corrupts the next launch
    assert "argument 2" in run(want_loss * (1 + 1e-3))


def test_cross_entropy_plan_refuses_more_blocks_than_partial_slots(monkeypatch):
    from tiletune.kernels import _membound
    from tiletune.space.spaces import Config

    ce, prep = _ce_problem(m=4096, v=8)
    monkeypatch.setattr(_membound, "sm_count", lambda dev: 132)
    monkeypatch.setattr(ce, "persistent_grid", lambda m, dev, occ, frac=1.0: (132 * occ,))
    cfg = Config(dict(TM=1, CHUNK=4096, occupancy=4, LAT=10, STORE_TMA=False, GRID_FRAC=1.0))
    args = prep.args
    assert ce.cross_entropy_grad_plan(cfg, *args).grid == (528,)
    assert ce.partial_slots(torch.device("cpu")) == 8192 == args[4].shape[0]  # 256 nominal SMs x 32
    most = Config(dict(TM=1, CHUNK=4096, occupancy=32, LAT=10, STORE_TMA=False, GRID_FRAC=1.0))
    assert ce.cross_entropy_grad_plan(most, *args).grid == (4224,)  # 132 SMs x 32
    monkeypatch.setattr(ce, "persistent_grid", lambda m, dev, occ, frac=1.0: (256 * occ,))
    big = Config(dict(TM=1, CHUNK=4096, occupancy=64, LAT=10, STORE_TMA=False, GRID_FRAC=1.0))
    with pytest.raises(ValueError, match="partial slots"):
        ce.cross_entropy_grad_plan(big, *args)
