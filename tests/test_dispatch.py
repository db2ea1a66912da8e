"""The decorator, the tuning loop and the database together, on the CPU fake backend.

"Kernels" here are Python functions writing into CPU torch tensors, so the correctness gate and the
in-place protection run for real; timings come from a model with seeded noise.
"""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune.devices.backends import FakeBackend, SimulatedCandidate
from tiletune.records import Status

SPACE = tt.Space(TM=[32, 64, 128], TN=[32, 64], occupancy=[1, 2], baseline=dict(TM=64, TN=64, occupancy=1))


def model(cfg) -> float:
    # fastest: TM=128, TN=64, occupancy=2
    return 100.0 - 0.2 * cfg.TM - 0.1 * cfg.TN - 5.0 * (cfg.occupancy - 1)


def scale_kernel(x, y, factor):
    y.copy_(x * factor)


def make_op(backend, db=False, reference=True, **kw):
    @tt.autotune(SPACE, reference=(lambda x, y: x * 2) if reference else None, writes=["y"], db=db,
                 backend=backend, progress=False, **kw)
    def op(cfg, x, y):
        return tt.Launch(scale_kernel, (cfg.TM,), (x, y, 2.0))

    return op


def test_tunes_once_then_hits_cache():
    be = FakeBackend(model, noise=0.005)
    op = make_op(be)
    x, y = torch.randn(16), torch.empty(16)
    op(x, y)
    assert op.tuning_count == 1
    assert op.config_for(x, y) == SPACE.config(TM=128, TN=64, occupancy=2)
    torch.testing.assert_close(y, x * 2)
    n = len(be.launches)
    op(x, y)
    op(x, y)
    assert op.tuning_count == 1
    assert len(be.launches) == n + 2
    assert all(c == SPACE.config(TM=128, TN=64, occupancy=2) for c, _, _ in be.launches[n:])
    # a new shape is a new key
    op(torch.randn(8), torch.empty(8))
    assert op.tuning_count == 2


def test_result_records_every_candidate_with_samples():
    be = FakeBackend(model)
    op = make_op(be)
    x, y = torch.randn(4), torch.empty(4)
    op(x, y)
    (result,) = op.results.values()
    assert len(result.measurements) == 12
    assert result.measurements[0].is_baseline and result.measurements[0].config == SPACE.baseline("sm_90").as_dict()
    assert all(len(m.samples_us) >= 10 for m in result.measurements)
    assert result.winner == {"TM": 128, "TN": 64, "occupancy": 2}


def test_racing_spends_few_samples_on_losers():
    # one config is 10x faster than all others: the others are cut after their first batch
    be = FakeBackend(lambda c: 10.0 if (c.TM, c.TN, c.occupancy) == (32, 32, 2) else 100.0, noise=0.02)
    op = make_op(be)
    op(torch.randn(4), torch.empty(4))
    (result,) = op.results.values()
    losers = [m for m in result.measurements if m.config != {"TM": 32, "TN": 32, "occupancy": 2}]
    assert all(len(m.samples_us) == 10 for m in losers)
    assert sum(m.reason == "raced_out" for m in losers) >= len(losers) - 1
    assert result.winner == {"TM": 32, "TN": 32, "occupancy": 2}


def test_mismatching_candidate_is_never_chosen():
    def buggy(x, y, factor):
        y.copy_(x * factor)
        y[0] = 123.0  # wrong first element

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes="y", db=False, progress=False,
                 backend=FakeBackend(model))
    def op(cfg, x, y):
        # the fastest config has a bug
        k = buggy if (cfg.TM, cfg.occupancy) == (128, 2) else scale_kernel
        return tt.Launch(k, (1,), (x, y, 2.0))

    x, y = torch.randn(8), torch.empty(8)
    op(x, y)
    (result,) = op.results.values()
    bad = [m for m in result.measurements if m.status is Status.MISMATCH]
    assert {(m.config["TM"], m.config["occupancy"]) for m in bad} == {(128, 2)}
    assert "differ" in bad[0].reason
    assert (result.winner["TM"], result.winner["occupancy"]) != (128, 2)
    torch.testing.assert_close(y, x * 2)


def test_unwritten_output_is_caught_by_nan_poison():
    def lazy(x, y, factor):
        y[: len(y) // 2] = x[: len(y) // 2] * factor  # forgets the second half

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes="y", db=False, progress=False,
                 backend=FakeBackend(model))
    def op(cfg, x, y):
        return tt.Launch(lazy if cfg.TN == 64 else scale_kernel, (1,), (x, y, 2.0))

    x = torch.randn(8)
    y = x * 2  # already holds the right answer: only poisoning reveals the lazy kernel
    op(x, y)
    (result,) = op.results.values()
    bad = [m for m in result.measurements if m.status is Status.MISMATCH]
    assert bad and all(m.config["TN"] == 64 for m in bad) and "NaN" in bad[0].reason
    assert result.winner["TN"] == 32


def test_inplace_argument_holds_exactly_one_launch_after_tuning():
    def double_inplace(x):
        x.mul_(2.0)

    @tt.autotune(SPACE, reference=lambda x: x * 2, inplace="x", db=False, progress=False,
                 backend=FakeBackend(model))
    def op(cfg, x):
        return tt.Launch(double_inplace, (1,), (x,))

    x = torch.randn(32)
    original = x.clone()
    op(x)  # tuning ran the kernel dozens of times
    assert torch.equal(x, original * 2)
    (result,) = op.results.values()
    assert not result.failures  # every candidate saw pristine input during its check
    op(x)
    assert torch.equal(x, original * 4)


def test_failures_are_recorded_and_never_abort():
    def failures(cfg):
        if cfg.TM == 128:
            return SimulatedCandidate(Status.COMPILE_ERROR, "TileCompilerError: tile too large")
        if cfg.TN == 32 and cfg.TM == 32:
            return SimulatedCandidate(Status.TIMEOUT, "tileiras exceeded timeout 300s")
        return None

    op = make_op(FakeBackend(model, failures=failures))
    op(torch.randn(4), torch.empty(4))
    (result,) = op.results.values()
    statuses = {m.status for m in result.failures}
    assert statuses == {Status.COMPILE_ERROR, Status.TIMEOUT}
    assert len(result.failures) == 4 + 2
    assert result.winner["TM"] == 64


def test_all_failed_raises_one_error_listing_reasons():
    op = make_op(FakeBackend(model, failures=lambda c: SimulatedCandidate(Status.COMPILE_ERROR, f"bad {c.TM}")))
    x, y = torch.randn(4), torch.zeros(4)
    with pytest.raises(tt.AllCandidatesFailed) as info:
        op(x, y)
    assert len(info.value.measurements) == 12
    assert "bad 128" in str(info.value) and "compile_error" in str(info.value)
    assert torch.equal(y, torch.zeros(4))  # the caller's output was restored


def test_database_shares_results_across_op_instances(tmp_path):
    db = tt.TuningDB(tmp_path / "t.db")
    be = FakeBackend(model)
    first = make_op(be, db=db)
    x, y = torch.randn(4), torch.empty(4)
    first(x, y)
    assert first.tuning_count == 1
    second = make_op(be, db=tt.TuningDB(tmp_path / "t.db"))  # like a fresh process
    y2 = torch.empty(4)
    second(x, y2)
    assert second.tuning_count == 0
    assert second.config_for(x, y2) == first.config_for(x, y)
    torch.testing.assert_close(y2, x * 2)
    stored = db.measurements(next(iter(first.results.values())).identity)
    assert len(stored) == 12


def test_editing_the_kernel_invalidates_records(tmp_path):
    path = tmp_path / "t.db"
    be = FakeBackend(model)
    make_op(be, db=path)(torch.randn(4), torch.empty(4))

    def scale_kernel_v2(x, y, factor):  # an edited kernel
        y.copy_(factor * x)

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=path, backend=be, progress=False)
    def op(cfg, x, y):
        return tt.Launch(scale_kernel_v2, (cfg.TM,), (x, y, 2.0))

    op(torch.randn(4), torch.empty(4))
    assert op.tuning_count == 1


def test_disable_switch_uses_baseline_without_tuning(monkeypatch, tmp_path):
    monkeypatch.setenv("TILETUNE_DISABLE", "1")
    be = FakeBackend(model)
    op = make_op(be, db=tmp_path / "t.db")
    x, y = torch.randn(4), torch.empty(4)
    op(x, y)
    assert op.tuning_count == 0
    assert len(be.launches) == 1 and be.launches[0][0] == SPACE.baseline("sm_90")
    torch.testing.assert_close(y, x * 2)
    assert tt.TuningDB(tmp_path / "t.db").stats()["measurements"] == 0


def test_log_switch_logs_each_candidate_and_a_summary(monkeypatch, caplog):
    monkeypatch.setenv("TILETUNE_LOG", "1")
    op = make_op(FakeBackend(model))
    with caplog.at_level(logging.INFO, logger="tiletune"):
        op(torch.randn(4), torch.empty(4))
    lines = [r.getMessage() for r in caplog.records if r.name == "tiletune"]
    assert sum("median" in line for line in lines) == 12
    assert any("tuned" in line and "winner" in line for line in lines)


def test_ties_are_broken_towards_the_baseline_deterministically():
    # every config within 0.2% of each other: noise decides nothing, the baseline wins
    picks = set()
    for seed in range(5):
        be = FakeBackend(lambda c: 50.0 * (1 + 0.002 * (c.TM == 64)), noise=0.01, seed=seed)
        op = make_op(be)
        op(torch.randn(4), torch.empty(4))
        picks.add(tuple(op.config_for(torch.randn(4), torch.empty(4)).values()))
    assert picks == {(64, 64, 1)}


def test_user_key_function_and_bad_writes():
    be = FakeBackend(model)
    op = make_op(be, key=lambda x, y: ("len", x.shape[0] >= 8))
    op(torch.randn(8), torch.empty(8))
    op(torch.randn(16), torch.empty(16))
    assert op.tuning_count == 1
    with pytest.raises(ValueError, match="not an argument"):
        tt.autotune(SPACE, writes=["z"], backend=be)(lambda cfg, x, y: None)


def test_plan_returning_garbage_is_a_clear_error():
    @tt.autotune(SPACE, db=False, backend=FakeBackend(model), progress=False)
    def op(cfg, x):
        return 42

    with pytest.raises(tt.TiletuneError, match="must return tiletune.Launch"):
        op(torch.randn(2))


def test_callable_tolerance_is_evaluated_on_the_problem():
    """A tolerance callable sees the op's arguments: a loose bound for big inputs, a tight one for small."""

    def noisy(x, y, factor):
        y.copy_(x * factor + 0.01)  # off by 0.01 everywhere

    seen = []

    def tol(x, y):
        seen.append(tuple(x.shape))
        return {"float32": (0.0, 0.02 if x.numel() > 8 else 0.001)}

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes="y", db=False, progress=False, tolerance=tol,
                 backend=FakeBackend(model))
    def op(cfg, x, y):
        return tt.Launch(noisy if cfg.TM == 128 else scale_kernel, (1,), (x, y, 2.0))

    op(torch.randn(16), torch.empty(16))  # loose: every config passes, the fastest (TM=128) wins
    op(torch.randn(8), torch.empty(8))  # tight: TM=128 is a mismatch
    assert seen == [(16,), (8,)]
    loose, tight = op.results.values()
    assert loose.winner["TM"] == 128 and not any(m.status is Status.MISMATCH for m in loose.measurements)
    bad = {m.config["TM"] for m in tight.measurements if m.status is Status.MISMATCH}
    assert bad == {128} and tight.winner["TM"] != 128


def test_tolerance_of_the_wrong_type_is_refused():
    with pytest.raises(TypeError, match="tolerance must be"):
        tt.autotune(SPACE, tolerance=[(0.1, 0.1)], backend=FakeBackend(model))(lambda cfg, x: None)

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes="y", db=False, progress=False,
                 tolerance=lambda x, y: 0.1, backend=FakeBackend(model))
    def op(cfg, x, y):
        return tt.Launch(scale_kernel, (1,), (x, y, 2.0))

    with pytest.raises(TypeError, match="not a mapping"):
        op(torch.randn(4), torch.empty(4))
