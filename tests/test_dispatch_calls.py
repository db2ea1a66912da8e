"""The call contract of a tuned op: keyword arguments, return values, ``bind``, and keys first met
while a CUDA graph is being captured (fake backend, CPU tensors)."""

from __future__ import annotations

import gc
import logging

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune.devices.backends import FakeBackend
from tiletune.store import TuningDB

SPACE = tt.Space(TM=[32, 64, 128], occupancy=[1, 2], baseline=dict(TM=64, occupancy=1))
BEST = dict(TM=128, occupancy=2)


def model(cfg) -> float:
    return 100.0 - 0.2 * cfg.TM - 5.0 * (cfg.occupancy - 1)


def scale_kernel(x, y, factor):
    y.copy_(x * factor)


def make_op(backend, db=False, **kw):
    @tt.autotune(SPACE, reference=lambda x, y, factor=2.0: x * factor, writes=["y"], db=db, backend=backend,
                 progress=False, **kw)
    def op(cfg, x, y, factor=2.0):
        return tt.Launch(scale_kernel, (cfg.TM,), (x, y, factor))

    return op


# ---------------------------------------------------------------------------------------------- kwargs


def test_keyword_arguments_bind_to_the_plan_signature():
    be = FakeBackend(model, noise=0.0)
    op = make_op(be)
    x, y = torch.randn(16), torch.empty(16)
    out = op(x, y=y)
    assert out is y
    torch.testing.assert_close(y, x * 2)
    # the same key as the positional call: no second tuning
    op(x, y)
    op(y=y, x=x)
    assert op.tuning_count == 1
    # a defaulted parameter passed by keyword is filled in positionally
    y2 = torch.empty(16)
    op(x, y2, factor=3.0)
    torch.testing.assert_close(y2, x * 3)
    assert be.launches[-1][2][2] == 3.0


def test_bad_keyword_arguments_name_the_op():
    op = make_op(FakeBackend(model))
    x, y = torch.randn(4), torch.empty(4)
    with pytest.raises(TypeError, match=r"op\(\).*unexpected keyword argument 'z'"):
        op(x, y, z=1)
    with pytest.raises(TypeError, match=r"op\(\).*multiple values for argument 'x'"):
        op(x, y, x=x)
    with pytest.raises(TypeError, match=r"op\(\).*missing a required argument: 'y'"):
        op(x=x)


def test_keyword_only_plan_parameters_are_refused():
    @tt.autotune(SPACE, backend=FakeBackend(model), db=False, progress=False)
    def op(cfg, x, *, flag=False):
        return tt.Launch(lambda t: None, (1,), (x,))

    with pytest.raises(TypeError, match="keyword-only"):
        op(torch.zeros(2), flag=True)


# ---------------------------------------------------------------------------------------------- returns


def test_returns_written_arguments_in_parameter_order():
    be = FakeBackend(model, noise=0.0)

    def two_kernel(x, a, b):
        a.copy_(x + 1)
        b.copy_(x - 1)

    @tt.autotune(SPACE, reference=lambda x, b, a: (x - 1, x + 1), writes=["b", "a"], db=False, backend=be,
                 progress=False)
    def op2(cfg, x, a, b):
        return tt.Launch(two_kernel, (1,), (x, a, b))

    x, a, b = torch.randn(8), torch.empty(8), torch.empty(8)
    first = op2(x, a, b)  # tuning call
    again = op2(x, a, b)  # cached call
    for got in (first, again):
        assert isinstance(got, tuple) and got[0] is a and got[1] is b
    torch.testing.assert_close(a, x + 1)


def test_returns_none_without_outputs_and_inplace_arguments_are_outputs():
    be = FakeBackend(model, noise=0.0)

    @tt.autotune(SPACE, db=False, backend=be, progress=False)
    def nothing(cfg, x):
        return tt.Launch(lambda t: None, (1,), (x,))

    assert nothing(torch.zeros(2)) is None
    assert nothing(torch.zeros(2)) is None

    def add_one(x):
        x.add_(1)

    @tt.autotune(SPACE, reference=lambda x: x + 1, inplace=["x"], db=False, backend=be, progress=False)
    def bump(cfg, x):
        return tt.Launch(add_one, (1,), (x,))

    x = torch.zeros(4)
    assert bump(x) is x
    assert bump(x) is x
    torch.testing.assert_close(x, torch.full((4,), 2.0))


# ---------------------------------------------------------------------------------------------- bind


def test_bind_launches_the_tuned_config_on_fixed_arguments():
    be = FakeBackend(model, noise=0.0)
    op = make_op(be)
    x, y = torch.randn(16), torch.empty(16)
    run = op.bind(x, y)
    assert op.tuning_count == 1
    assert run.config == SPACE.config(**BEST)
    n = len(be.launches)
    y.zero_()
    assert run() is y
    torch.testing.assert_close(y, x * 2)
    assert len(be.launches) == n + 1
    cfg, grid, kargs = be.launches[-1]
    assert cfg == SPACE.config(**BEST) and grid == (128,) and kargs[0] is x and kargs[1] is y
    # binding a known key launches nothing and does not tune again
    op.bind(x, y)
    assert len(be.launches) == n + 1 and op.tuning_count == 1
    # (x, y, factor) is another key than (x, y): defaults are not part of a positional call's key
    run2 = op.bind(x, y, factor=5.0)
    assert op.tuning_count == 2
    run2()
    torch.testing.assert_close(y, x * 5)


def test_bind_of_a_database_hit_does_not_launch(tmp_path):
    db = TuningDB(tmp_path / "t.db")
    be = FakeBackend(model, noise=0.0)
    x, y = torch.randn(16), torch.empty(16)
    make_op(be, db=db)(x, y)
    be2 = FakeBackend(model, noise=0.0)
    op2 = make_op(be2, db=db)
    run = op2.bind(x, y)
    assert op2.tuning_count == 0 and be2.launches == []
    run()
    assert be2.launches[-1][0] == SPACE.config(**BEST)


# ---------------------------------------------------------------------------------------------- capture


def test_new_key_during_capture_launches_the_baseline_and_tunes_later(caplog):
    be = FakeBackend(model, noise=0.0)
    op = make_op(be)
    x, y = torch.randn(16), torch.empty(16)
    be.capturing = True
    with caplog.at_level(logging.WARNING, logger="tiletune"):
        assert op(x, y) is y
        op(x, y)
    assert op.tuning_count == 0
    assert [c for c, _, _ in be.launches] == [SPACE.config(TM=64, occupancy=1)] * 2
    assert sum("during CUDA graph capture" in r.getMessage() for r in caplog.records) == 1
    torch.testing.assert_close(y, x * 2)
    assert len(op.pending) == 1
    assert op.config_for(x, y) == SPACE.config(TM=64, occupancy=1)
    # the next call outside capture tunes, and launches the winner
    be.capturing = False
    op(x, y)
    assert op.tuning_count == 1 and op.pending == []
    assert be.launches[-1][0] == SPACE.config(**BEST)


def test_known_config_answers_from_memory_only():
    """``known_config`` never tunes or launches: None for a new key, the capture fallback for a pending
    one, the tuned config afterwards."""
    be = FakeBackend(model, noise=0.0)
    op = make_op(be)
    x, y = torch.randn(16), torch.empty(16)
    assert op.known_config(x, y) is None
    assert op.tuning_count == 0 and be.launches == []
    be.capturing = True
    op(x, y)
    assert op.known_config(x, y) == SPACE.config(TM=64, occupancy=1)
    be.capturing = False
    op(x, y)
    n = len(be.launches)
    assert op.known_config(x, y) == SPACE.config(**BEST) == op.known_config(x=x, y=y)
    assert op.known_config(torch.randn(8), torch.empty(8)) is None
    assert len(be.launches) == n and op.tuning_count == 1


def test_tune_pending_uses_live_arguments_or_fresh_ones():
    be = FakeBackend(model, noise=0.0)
    op = make_op(be)
    x, y = torch.randn(16), torch.empty(16)
    be.capturing = True
    op(x, y)
    op(torch.randn(8), torch.empty(8))  # arguments die right away
    gc.collect()
    assert len(op.pending) == 2
    be.capturing = False
    tuned = op.tune_pending()
    assert len(tuned) == 2 and all(c == SPACE.config(**BEST) for c in tuned.values())
    assert op.pending == [] and op.tuning_count == 2
    # the live arguments were restored after tuning (the session writes the winner's result)
    torch.testing.assert_close(y, x * 2)
    n = op.tuning_count
    op(torch.randn(8), torch.empty(8))
    assert op.tuning_count == n  # the fresh-tensor tuning serves the real key


def test_database_record_is_used_during_capture_without_pending(tmp_path):
    db = TuningDB(tmp_path / "t.db")
    x, y = torch.randn(16), torch.empty(16)
    make_op(FakeBackend(model, noise=0.0), db=db)(x, y)
    be = FakeBackend(model, noise=0.0)
    be.capturing = True
    op = make_op(be, db=db)
    op(x, y)
    assert op.pending == [] and op.tuning_count == 0
    assert be.launches[-1][0] == SPACE.config(**BEST)


def test_capture_never_tunes_even_with_the_tuned_key_cached_elsewhere():
    be = FakeBackend(model, noise=0.0)
    op = make_op(be)
    x, y = torch.randn(16), torch.empty(16)
    op(x, y)  # tuned outside capture
    be.capturing = True
    op(x, y)  # a known key: the tuned config, no pending
    op(torch.randn(4), torch.empty(4))  # new key: pending
    assert op.tuning_count == 1 and len(op.pending) == 1
    assert be.launches[-1][0] == SPACE.config(TM=64, occupancy=1)


def test_cache_clear_forgets_pending_keys():
    be = FakeBackend(model, noise=0.0)
    op = make_op(be)
    be.capturing = True
    op(torch.randn(4), torch.empty(4))
    op.cache_clear()
    assert op.pending == []


# ------------------------------------------------------------------------------------ one-config spaces


def _one_config_op(backend, space, db=False, **kw):
    @tt.autotune(space, reference=lambda x, y: x * 2.0, writes=["y"], db=db, backend=backend, progress=False, **kw)
    def op(cfg, x, y):
        return tt.Launch(scale_kernel, (cfg.TM,), (x, y, 2.0))

    return op


def test_tune_single_false_launches_a_one_config_space_without_a_session(tmp_path):
    """No tuning session (so no copies of the arguments, no record), the one config launched at once,
    outside and inside a capture; every other key too."""
    one = tt.Space(TM=[64], occupancy=[1, 2], constraints=[lambda c: c.occupancy == 1])
    db = TuningDB(tmp_path / "t.db")
    be = FakeBackend(model, noise=0.0)
    op = _one_config_op(be, one, db=db, tune_single=False)
    x, y = torch.randn(16), torch.empty(16)
    assert op(x, y) is y
    torch.testing.assert_close(y, x * 2)
    assert op.tuning_count == 0 and op.results == {}
    assert [c for c, _, _ in be.launches] == [one.config(TM=64, occupancy=1)]
    assert op.known_config(x, y) == one.config(TM=64, occupancy=1)
    assert db.winners() == [] and db.sessions() == []
    be.capturing = True
    op(torch.randn(8), torch.empty(8))
    assert op.pending == [] and op.tuning_count == 0


def test_tune_single_false_still_tunes_a_space_of_several_configs():
    be = FakeBackend(model, noise=0.0)
    op = make_op(be, tune_single=False)
    op(torch.randn(16), torch.empty(16))
    assert op.tuning_count == 1 and be.launches[-1][0] == SPACE.config(**BEST)


def test_a_one_config_space_is_checked_by_default():
    be = FakeBackend(model, noise=0.0)
    op = _one_config_op(be, tt.Space(TM=[64], occupancy=[1]))
    op(torch.randn(16), torch.empty(16))
    assert op.tuning_count == 1
