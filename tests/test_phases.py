"""Where a tuning session's time goes (issue 41 item 2): TuneResult.stats["phases"] and one INFO line."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune.devices.backends import FakeBackend
from tiletune.engine.tuner import PHASES, PhaseTimer

SPACE = tt.Space(K=[0, 1, 2, 3, 4, 5, 6, 7], baseline=dict(K=0))


def _kernel(x, y):
    y.copy_(x * 2)


def _check_phases(ph: dict, wall_s: float | None = None) -> None:
    for k in PHASES + ("wall_s", "compile_wall_s", "compile_cpu_s"):
        assert k in ph and ph[k] >= 0, (k, ph)
    assert sum(ph[k] for k in PHASES) <= ph["wall_s"] + 1e-3
    assert abs(sum(ph[k] for k in PHASES) - ph["wall_s"]) <= 1e-3  # idle is the rest
    if wall_s is not None:
        assert ph["wall_s"] <= wall_s + 1e-3


def test_a_fake_tuning_reports_its_phases_and_logs_them(caplog):
    be = FakeBackend(lambda c: 100.0 - 5.0 * c.K, noise=0.002, compile_s=lambda c: 0.5 + 0.1 * c.K, workers=4)

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False, backend=be, progress=False,
                 isolation="none")
    def op(cfg, x, y):
        return tt.Launch(_kernel, (1,), (x, y))

    with caplog.at_level(logging.INFO, logger="tiletune"):
        op(torch.randn(8), torch.empty(8))
    (res,) = op.results.values()
    ph = res.stats["phases"]
    _check_phases(ph)
    # simulated clock: 8 configs of 0.5-1.2 s on 4 compilers, timing in microseconds per sample
    assert ph["compile_s"] > 0 and ph["timing_s"] > 0 and ph["check_s"] > 0
    assert ph["compile_cpu_s"] == pytest.approx(sum(0.5 + 0.1 * k for k in range(8)))
    assert ph["compile_wall_s"] >= ph["compile_s"] and ph["compiled"] == 8
    assert ph["worker_start_s"] == 0.0
    lines = [r.getMessage() for r in caplog.records if "worker start" in r.getMessage()]
    assert len(lines) == 1 and "compile wait" in lines[0] and "timing" in lines[0]


@pytest.mark.spawned_workers
def test_an_isolated_tuning_reports_worker_start_and_real_time():
    from tiletune.devices.workers import IsolatedBackend, IsolationOptions

    be = FakeBackend(lambda c: 100.0 - 5.0 * c.K, noise=0.002, compile_s=0.01)
    iso = IsolatedBackend(be, worker_spec=be, options=IsolationOptions(spare=False))
    op = tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False, backend=iso, progress=False,
                     isolation="none")(lambda cfg, x, y: tt.Launch(_kernel, (1,), (x, y)))
    op(torch.randn(8), torch.empty(8))
    (res,) = op.results.values()
    ph = res.stats["phases"]
    _check_phases(ph, res.wall_s)
    assert ph["worker_start_s"] > 0.1  # a cold worker: importing torch in a fresh interpreter
    assert ph["compile_cpu_s"] == pytest.approx(0.08)  # the worker's simulated compiles, 8 x 0.01
    assert ph["check_s"] > 0 and ph["timing_s"] > 0


def test_phase_timer_forwards_and_counts():
    from tiletune.devices.backends.base import Candidate
    from tiletune.devices.backends.simulated import ModelTiming, SimulatedSession

    s = SimulatedSession(ModelTiming(lambda c: 10.0, compile_s=1.0), workers=2)
    t = PhaseTimer(s)
    assert t.workers == 2  # forwarded
    cands = [Candidate(SPACE.config("sm_90", K=k), k, k == 0) for k in range(4)]
    outs = list(t.compile(cands))
    assert len(outs) == 4 and t.compile_s == pytest.approx(2.0) and t.compile_wall_s == pytest.approx(2.0)
    t.sample(cands[0], 5)
    assert t.timing_s > 0
    _check_phases(t.phases())


def _isolated_op(local, spec):
    from tiletune.devices.workers import IsolatedBackend, IsolationOptions

    iso = IsolatedBackend(local, worker_spec=spec, options=IsolationOptions(spare=False))
    op = tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False, backend=iso, progress=False,
                     isolation="none")(lambda cfg, x, y: tt.Launch(_kernel, (1,), (x, y)))
    return iso, op


@pytest.mark.spawned_workers
def test_a_worker_started_in_the_background_counts_as_worker_start_not_idle():
    """A worker started before the session (prestart, when the op is defined) holds its lock until it is
    up: the session waiting for it is worker start time."""
    be = FakeBackend(lambda c: 100.0 - 5.0 * c.K, noise=0.002, compile_s=0.01)
    iso, op = _isolated_op(be, be)
    iso.worker(0).start_in_background()
    op(torch.randn(8), torch.empty(8))
    (res,) = op.results.values()
    ph = res.stats["phases"]
    _check_phases(ph, res.wall_s)
    assert ph["worker_start_s"] > 0.1 and ph["worker_start_s"] > ph["idle_s"]


class _AheadFake:
    """Stands for compile_pool.AheadCompile: what the caller compiled while the worker started."""

    def __init__(self, configs):
        self.configs = list(configs)
        self.finished = self.stopped = 0

    def stop(self):
        self.stopped += 1

    def finish(self, timeout):
        self.finished += 1
        return {"ahead_jobs": len(self.configs), "ahead_compiled": len(self.configs), "ahead_cpu_s": 2.5,
                "ahead_wait_s": 0.0}


class _AheadBackend(FakeBackend):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.ahead: list[_AheadFake] = []

    def compile_ahead(self, plan, args, configs, device_index):
        got = _AheadFake(configs)
        plan(self.ahead_probe_cfg(configs), *args)  # the raw plan and the caller's arguments
        self.ahead.append(got)
        return got

    @staticmethod
    def ahead_probe_cfg(configs):
        return list(configs)[0]


def test_the_caller_compiles_the_space_ahead_while_the_worker_starts():
    local = _AheadBackend(lambda c: 100.0 - 5.0 * c.K, noise=0.002, compile_s=0.01)
    spec = FakeBackend(lambda c: 100.0 - 5.0 * c.K, noise=0.002, compile_s=0.01)
    _, op = _isolated_op(local, spec)
    op(torch.randn(8), torch.empty(8))
    (res,) = op.results.values()
    (ahead,) = local.ahead
    assert sorted(c.K for c in ahead.configs) == list(range(8)) and ahead.stopped == 1 and ahead.finished == 1
    assert res.stats["ahead_jobs"] == 8 and res.stats["ahead_cpu_s"] == 2.5
    ph = res.stats["phases"]
    _check_phases(ph, res.wall_s)
    assert ph["compile_cpu_s"] == pytest.approx(0.08 + 2.5)  # the worker's 8 x 0.01 and the caller's


def test_a_ready_worker_gets_no_compiles_ahead():
    """A worker already up compiles at once, pipelined with its checks: compiling ahead would only delay it."""
    local = _AheadBackend(lambda c: 100.0 - 5.0 * c.K, noise=0.002, compile_s=0.01)
    spec = FakeBackend(lambda c: 100.0 - 5.0 * c.K, noise=0.002, compile_s=0.01)
    iso, op = _isolated_op(local, spec)
    w = iso.worker(0)
    w.start()
    assert w.ready
    op(torch.randn(8), torch.empty(8))
    (res,) = op.results.values()
    assert local.ahead == [] and "ahead_jobs" not in res.stats
