"""Call guards (tiletune.op.guards) and the hot paths that use them: a guard passes only calls with the
same key, and a tuned op or a library op never launches a stale entry through one (CPU tensors)."""

from __future__ import annotations

import itertools
import threading

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune.op import tuned_op as dispatch
from tiletune.kernels import fastcall
from tiletune.op import guards
from tiletune.devices.backends import FakeBackend
from tiletune.keys import _BY_VALUE, default_key

pytestmark = pytest.mark.skipif(not guards.guards_available(), reason="this torch has no TensorGuards")


def by_key(t: type) -> bool:
    return t in _BY_VALUE


def variants() -> list[tuple]:
    """Argument tuples that differ from each other in one way each (or not at all)."""
    x = torch.randn(4, 8)
    return [
        (x, torch.empty(4, 8), 2.0),
        (torch.randn(4, 8), torch.randn(4, 8), 3.5),  # same key: new tensors, another float
        (x, torch.empty(4, 8), 2),  # an int where a float was
        (x, torch.empty(4, 8), True),
        (x, torch.empty(4, 8), 1),
        (x, torch.empty(4, 8, dtype=torch.float64), 2.0),
        (x, torch.empty(8, 4).t(), 2.0),  # strides
        (x, torch.empty(4, 9), 2.0),
        (x, torch.empty(4, 8)),  # length
        (x, torch.empty(4, 8), 2.0, None),
        (x, torch.empty(4, 8), "a"),
        (x, torch.empty(4, 8), "b"),
        (x, torch.empty(4, 8, requires_grad=True), 2.0),
        (x, 3, 2.0),
        (x, torch.nn.Parameter(torch.empty(4, 8)), 2.0),
        (x, torch.empty(4, 8), torch.float32),
        (x, torch.empty(4, 8), torch.float16),
    ]


def test_a_passing_guard_means_the_same_default_key():
    vs = variants()
    passed = 0
    for a, b in itertools.product(vs, vs):
        check = guards.call_guard(a, by_key)
        assert check is not None
        if check(b):
            passed += 1
            assert default_key(a) == default_key(b), (a, b)
    # and it does pass where it should: each tuple against itself, the first two against each other
    assert passed >= len(vs) + 2
    assert guards.call_guard(vs[0], by_key)(vs[1])


def test_a_guard_rejects_each_kind_of_difference():
    x, y = torch.randn(4, 8), torch.empty(4, 8)
    check = guards.call_guard((x, y, 2, 0.5), by_key)
    assert check((torch.randn(4, 8), torch.empty(4, 8), 2, 7.0))  # floats by type only
    for other in [(x, y, 3, 0.5), (x, y, 2.0, 0.5), (x, y, True, 0.5), (x, y, 2, 1), (x, y.double(), 2, 0.5),
                  (x, y[:, :4], 2, 0.5), (x, y.t(), 2, 0.5), (x, y, 2), (x, y, 2, 0.5, 0), (y.view(32), y, 2, 0.5)]:
        assert not check(other), other


def test_by_value_everything_holds_floats_by_value_too():
    x = torch.randn(4)
    check = guards.call_guard((x, 0.5), lambda t: True)
    assert check((torch.randn(4), 0.5)) and not check((x, 0.25))


def test_no_guard_for_tensor_likes_or_values_that_do_not_equal_themselves():
    class Like:
        shape, dtype = (4,), "float32"

        def stride(self):
            return (1,)

    assert guards.call_guard((Like(),), by_key) is None
    assert guards.call_guard((torch.randn(2), float("nan")), lambda t: True) is None
    assert guards.call_guard((torch.randn(2), float("nan")), by_key) is not None  # floats by type: fine


def test_guard_table_keeps_a_few_guards_per_first_shape_and_starts_over_when_full(monkeypatch):
    table: guards.GuardTable[str] = guards.GuardTable()
    x = torch.randn(4, 8)
    ws = [torch.randn(8, n) for n in (16, 32, 48, 64, 80)]
    for i, w in enumerate(ws):
        table.remember((x, w), guards.call_guard((x, w), by_key), f"w{i}")
    assert table.lookup((torch.randn(4, 8), torch.randn(8, 80))) == "w4"
    assert table.lookup((x, torch.randn(8, 32))) == "w1"
    assert table.lookup((x, torch.randn(8, 16))) is None  # the oldest of five went (4 per selector)
    assert table.lookup((torch.randn(5, 8), torch.randn(8, 32))) is None
    assert table.lookup(()) is None and table.lookup((3, 4)) is None
    monkeypatch.setattr(guards, "MAX_SELECTORS", 2)
    for m in (1, 2, 3):
        a = (torch.randn(m, 8),)
        table.remember(a, guards.call_guard(a, by_key), m)
    assert len(table.rows) <= 2
    table.clear()
    assert table.lookup((x, ws[4])) is None


# ------------------------------------------------------------------------------------- tuned ops

SPACE = tt.Space(TM=[32, 64, 128], baseline=dict(TM=64))


def scale_kernel(x, y, factor):
    y.copy_(x * factor)


def make_op(be):
    @tt.autotune(SPACE, reference=lambda x, y, factor=2.0: x * factor, writes=["y"], db=False, backend=be,
                 progress=False)
    def op(cfg, x, y, factor=2.0):
        return tt.Launch(scale_kernel, (cfg.TM,), (x, y, factor))

    return op


def test_tuned_op_serves_repeated_keys_through_their_guards_and_never_a_stale_entry():
    be = FakeBackend(lambda cfg: 100.0 - 0.2 * cfg.TM, noise=0.0)
    op = make_op(be)
    shapes = [(16,), (32,), (16,)]
    for n in shapes * 3:
        x, y = torch.randn(*n), torch.empty(*n)
        op(x, y, 3.0)
        torch.testing.assert_close(y, x * 3.0)
    assert op.tuning_count == 2
    assert len(op._fast.rows) == 2
    calls = []
    real_key = op._key
    op._key = lambda a: calls.append(1) or real_key(a)
    x, y = torch.randn(16), torch.empty(16)
    op(x, y, 5.0)  # the guard answers: no key built
    torch.testing.assert_close(y, x * 5.0)
    assert calls == []
    op(x.double(), y.double(), 5.0)  # a new key: built, tuned
    assert calls and op.tuning_count == 3
    # a changed choice: the guards go with the old entries
    launches = len(be.launches)
    op.cache_clear()
    assert op._fast.rows == {}
    op(x, y, 2.0)
    assert len(be.launches) > launches


def test_tuned_op_guards_step_aside_for_launch_recorders_and_user_keys():
    be = FakeBackend(lambda cfg: 1.0, noise=0.0)
    op = make_op(be)
    x, y = torch.randn(8), torch.empty(8)
    op(x, y)
    op(x, y)
    assert op._fast.rows
    rec: list = []
    dispatch._recorders[threading.get_ident()] = rec
    try:
        op(x, y)
    finally:
        dispatch._recorders.pop(threading.get_ident())
    assert rec and rec[0][0] is op  # the recorder saw the launch with its key

    @tt.autotune(SPACE, reference=lambda x, y, factor=2.0: x * factor, writes=["y"], db=False, backend=be,
                 progress=False, key=lambda x, y, factor=2.0: (x.shape[0], factor))
    def keyed(cfg, x, y, factor=2.0):
        return tt.Launch(scale_kernel, (cfg.TM,), (x, y, factor))

    keyed(x, y, 2.0)
    keyed(x, y, 2.0)
    assert keyed._fast.rows == {}  # a user key may read what a guard does not check


# ------------------------------------------------------------------------------------- library ops


def test_library_op_replays_through_guards_and_checks_precheck_on_every_hit():
    be = FakeBackend(lambda cfg: 100.0 - 0.2 * cfg.TM, noise=0.0)
    allowed = {"ok": True}

    @tt.autotune(SPACE, reference=lambda x, y, eps: x * eps, writes=["y"], db=False, backend=be, progress=False,
                 name="g_scale")
    def plan(cfg, x, y, eps):
        return tt.Launch(scale_kernel, (cfg.TM,), (x, y, eps))

    slow = {"n": 0}

    @fastcall.fast_op(precheck=lambda x, eps=1.0: allowed["ok"])
    def scale(x, eps=1.0):
        slow["n"] += 1
        if not allowed["ok"]:
            raise RuntimeError("refused")
        y = torch.empty_like(x)
        plan(x, y, float(eps))
        return y

    for _ in range(4):
        x = torch.randn(16)
        torch.testing.assert_close(scale(x, 0.5), x * 0.5)
    assert slow["n"] == 2 and scale.fastcall.guards.rows
    x = torch.randn(16)
    torch.testing.assert_close(scale(x, 0.25), x * 0.25)  # a float by value: another signature
    assert slow["n"] == 3
    allowed["ok"] = False
    with pytest.raises(RuntimeError, match="refused"):
        scale(torch.randn(16), 0.5)
    allowed["ok"] = True
    fastcall.clear_recipes()
    assert scale.fastcall.guards.rows == {}
    n = slow["n"]
    scale(torch.randn(16), 0.5)
    assert slow["n"] == n + 1


def test_a_replaced_entry_is_never_remembered():
    """A slow-path call that fetched an entry just before another thread replaced it must not put the old
    entry behind a guard (it would be launched until the next change)."""
    be = FakeBackend(lambda cfg: 100.0 - 0.2 * cfg.TM, noise=0.0)
    op = make_op(be)
    x, y = torch.randn(8), torch.empty(8)
    op(x, y)
    key = default_key((x, y))
    stale = op._cache[key]
    op._cache[key] = lambda a: None  # another thread installed a new entry meanwhile
    op._fast.clear()
    op._remember(key, (x, y), stale)
    assert op._fast.rows == {}
    op._remember(key, (x, y), op._cache[key])
    assert op._fast.rows


def test_a_key_guard_is_built_once_and_the_cache_is_bounded(monkeypatch):
    table: guards.GuardTable[str] = guards.GuardTable()
    x = torch.randn(4)
    built = []
    real = guards.call_guard
    monkeypatch.setattr(guards, "call_guard", lambda a, bv: built.append(1) or real(a, bv))
    c1 = table.check_for("k", (x,), by_key)
    table.clear()  # values go, guards stay: a key's guard depends on the key only
    assert table.check_for("k", (torch.randn(4),), by_key) is c1 and len(built) == 1
    monkeypatch.setattr(guards, "MAX_CHECKS", 2)
    for k in ("a", "b", "c"):
        table.check_for(k, (x,), by_key)
    assert len(table.checks) <= 2


def test_record_launches_returns_the_result_and_each_launch_and_refuses_nesting():
    be = FakeBackend(lambda cfg: 1.0, noise=0.0)
    op = make_op(be)
    x, y = torch.randn(8), torch.empty(8)
    op(x, y)

    def twice(a, b):
        op(a, b)
        op(a, b)
        return "done"

    result, rec = dispatch.record_launches(twice, x, b=y)
    assert result == "done" and [r[0] for r in rec] == [op, op] and rec[0][1] == default_key((x, y))
    assert threading.get_ident() not in dispatch._recorders
    with pytest.raises(RuntimeError, match="already recording"):
        dispatch.record_launches(lambda: dispatch.record_launches(twice, x, y))
    assert threading.get_ident() not in dispatch._recorders
