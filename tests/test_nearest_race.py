"""The race of a miss (tiletune.resolve.nearest.race), on the fake backend: the compiled configs are timed
first (on the guard bands' twins, never on the caller's tensors) and checked fastest first, so only the
winner is checked when it passes; of the configs no compile cache holds only the two nearest are compiled
(together); a clear leader stops the sampling early; a neighbour at distance 0 is not raced."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune.devices.backends import FakeBackend, SimulatedCandidate
from tiletune.resolve import nearest

SPACE = tt.Space(K=list(range(6)), baseline=dict(K=0))




def _kernel(x, y):
    y.copy_(x * 2)


def _op(db, backend, *, on_miss="nearest", name="race.op", kernel=_kernel):
    return tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=db, backend=backend, progress=False,
                       on_miss=on_miss, name=name)(lambda cfg, x, y: tt.Launch(kernel, (1,), (x, y)))


def _tuned(path, name="race.op", kernel=_kernel):
    """Neighbours: K=2 tuned at 64 elements, K=4 at 8192 (so 100 elements: K=2 nearest, K=4 next, K=0 default)."""
    _op(path, FakeBackend(lambda c: 10.0 + abs(c.K - 2)), on_miss="tune", name=name, kernel=kernel)(
        torch.randn(64), torch.empty(64))
    _op(path, FakeBackend(lambda c: 10.0 + abs(c.K - 4)), on_miss="tune", name=name, kernel=kernel)(
        torch.randn(8192), torch.empty(8192))


def _race_session(backend):
    """The session of the (one) race: the one that compiled a config as its first candidate's."""
    (s,) = [s for s in backend.sessions if s.compiled or s.checked]
    return s


def test_only_the_fastest_config_is_checked_when_it_passes(tmp_path):
    path = tmp_path / "t.db"
    _tuned(path)
    backend = FakeBackend(lambda c: 10.0 + abs(c.K - 4))  # K=4 (the second neighbour) is fastest here
    op = _op(path, backend)
    x, y = torch.randn(100), torch.empty(100)
    op(x, y)
    assert op.config_for(x, y)["K"] == 4 and op.tuning_count == 0
    s = _race_session(backend)
    assert sorted(set(s.timed)) == [0, 1, 2]  # K=2, K=4, the default K=0: all timed...
    assert s.checked == [1]  # ...and only the winner checked
    assert torch.equal(y, x * 2)


def test_a_winner_that_fails_its_check_falls_to_the_next_fastest(tmp_path):
    path = tmp_path / "t.db"
    _tuned(path)
    backend = FakeBackend(lambda c: 10.0 + abs(c.K - 4),  # K=4 fastest, then K=2, then K=0
                          failures=lambda c: SimulatedCandidate(tt.Status.MISMATCH) if c.K == 4 else None)
    op = _op(path, backend)
    x, y = torch.randn(100), torch.empty(100)
    op(x, y)
    assert op.config_for(x, y)["K"] == 2 and op.tuning_count == 0  # never the unchecked K=4
    assert _race_session(backend).checked == [1, 0]  # fastest first, until one passes
    assert torch.equal(y, x * 2)


def test_a_config_that_fails_to_launch_while_timed_is_passed_over(tmp_path):
    path = tmp_path / "t.db"
    _tuned(path)
    backend = FakeBackend(lambda c: 10.0 + abs(c.K - 4),
                          failures=lambda c: SimulatedCandidate(tt.Status.LAUNCH_ERROR, "illegal") if c.K == 4 else None)
    op = _op(path, backend)
    op(torch.randn(100), torch.empty(100))
    s = _race_session(backend)
    assert 1 not in s.timed and 1 not in s.checked and s.checked == [0]
    assert op.config_for(torch.randn(100), torch.empty(100))["K"] == 2


def test_unchecked_configs_are_timed_on_twins_never_on_the_callers_tensors(tmp_path):
    """The race launches configs that have not passed their check: on the guard bands' twins of the
    written arguments. The caller's output is written only by checked runs' results and the winner."""
    path = tmp_path / "t.db"
    y = torch.empty(100)
    seen = []

    def kernel(x, out):
        seen.append(out.untyped_storage().data_ptr() == y.untyped_storage().data_ptr())
        out.copy_(x * 2)

    _tuned(path, kernel=kernel)
    seen.clear()

    backend = FakeBackend(lambda c: 10.0 + abs(c.K - 4))
    op = _op(path, backend, kernel=kernel)
    x = torch.randn(100)
    op(x, y)
    s = _race_session(backend)
    assert len(set(s.timed)) == 3
    # three timing runs and one checked run, all on twins; then the winner's launch on the caller's output
    assert seen[:4] == [False] * 4 and seen[-1] is True
    assert torch.equal(y, x * 2)


def test_without_twins_every_config_is_checked_before_it_is_timed(tmp_path):
    """An output the guard cannot band (it shares memory with another argument) makes the race check
    each config before timing it (the old order): nothing unchecked runs on the caller's memory."""
    path = tmp_path / "t.db"
    _tuned(path, name="race.alias")
    backend = FakeBackend(lambda c: 10.0 + abs(c.K - 4))
    op = _op(path, backend, name="race.alias")
    buf = torch.randn(200)
    x, y = buf[:100], buf[100:]  # y shares x's storage: no twin for it
    want = x * 2
    op(x, y)
    s = _race_session(backend)
    assert s.timed == [] and sorted(s.checked) == [0, 1, 2]
    assert op.config_for(x, y)["K"] == 4 and torch.equal(y, want)


def test_with_a_cold_compile_cache_the_two_nearest_configs_compile_together_and_race(tmp_path):
    """Nothing compiled yet: the two nearest configs compile together (in parallel, as the fallback's
    background compile does), so the nearest one is not served unraced; the default config is not compiled."""
    path = tmp_path / "t.db"
    _tuned(path)
    backend = FakeBackend(lambda c: 10.0 + abs(c.K - 4), cached=lambda c: False)
    op = _op(path, backend)
    x, y = torch.randn(100), torch.empty(100)
    op(x, y)
    assert [c["K"] for c in backend.compiled] == [2, 4]  # the nearest and the next; the default never compiled
    assert op.config_for(x, y)["K"] == 4 and op.tuning_count == 0 and len(op.provisional) == 1
    s = _race_session(backend)
    assert sorted(set(s.timed)) == [0, 1] and s.checked == [1]  # both timed, the faster one checked


def test_configs_a_compile_cache_holds_are_raced_beside_the_nearest(tmp_path):
    path = tmp_path / "t.db"
    _tuned(path)
    backend = FakeBackend(lambda c: 10.0 + abs(c.K - 4), cached=lambda c: c.K == 4)
    op = _op(path, backend)
    x, y = torch.randn(100), torch.empty(100)
    op(x, y)
    assert [c["K"] for c in backend.compiled] == [2]  # K=4 came from the cache, the default was skipped
    assert op.config_for(x, y)["K"] == 4
    assert sorted(set(_race_session(backend).timed)) == [0, 1]


def test_when_the_nearest_fails_cold_the_skipped_configs_are_compiled_next(tmp_path):
    path = tmp_path / "t.db"
    _tuned(path)
    backend = FakeBackend(lambda c: 10.0 + abs(c.K - 4), cached=lambda c: False,
                          failures=lambda c: SimulatedCandidate(tt.Status.MISMATCH) if c.K in (2, 4) else None)
    op = _op(path, backend)
    x, y = torch.randn(100), torch.empty(100)
    op(x, y)
    assert [c["K"] for c in backend.compiled] == [2, 4, 0]  # the two nearest fail: the default compiles next
    assert op.config_for(x, y)["K"] == 0 and op.tuning_count == 0 and torch.equal(y, x * 2)
    assert _race_session(backend).checked == [1, 0, 2]  # fastest first


def test_a_clear_leader_stops_the_sampling_early(tmp_path):
    path = tmp_path / "t.db"
    _tuned(path)
    clear = FakeBackend(lambda c: 10.0 + 5 * abs(c.K - 4), noise=0.001)  # 10, 20, 30 us
    _op(path, clear)(torch.randn(100), torch.empty(100))
    assert _race_session(clear).samples_drawn == 3 * nearest.RACE_FIRST_SAMPLES
    close = FakeBackend(lambda c: 10.0 + 1e-4 * abs(c.K - 4) + (10.0 if c.K == 0 else 0.0), noise=0.01)
    _op(path, close, name="race.op")(torch.randn(101), torch.empty(101))
    # K=4 and K=2 overlap: both get the full count; the default, far behind, keeps its first samples
    assert _race_session(close).samples_drawn == 2 * nearest.RACE_SAMPLES + nearest.RACE_FIRST_SAMPLES


def test_long_kernels_are_raced_with_fewer_samples(tmp_path):
    """Configs whose first sample each exceeds LONG_RACE_US get LONG_RACE_SAMPLES, and the overlapping ones
    one more: the race's GPU time stays small against a prefill's long kernels; the fastest still wins."""
    path = tmp_path / "t.db"
    _tuned(path)
    close = FakeBackend(lambda c: 5000.0 + 1e-4 * abs(c.K - 4) + (5000.0 if c.K == 0 else 0.0), noise=0.01)
    op = _op(path, close, name="race.long")
    x, y = torch.randn(102), torch.empty(102)
    op(x, y)
    drawn = _race_session(close).samples_drawn  # the two close ones may get one more sample each
    assert 3 * nearest.LONG_RACE_SAMPLES <= drawn <= 2 * (nearest.LONG_RACE_SAMPLES + 1) + nearest.LONG_RACE_SAMPLES
    assert drawn < 3 * nearest.RACE_FIRST_SAMPLES  # fewer than a race of short kernels takes at least
    assert op.config_for(x, y)["K"] in (2, 4) and op.tuning_count == 0


def test_a_neighbour_at_distance_zero_is_served_without_a_race(tmp_path):
    """Another layout of the same sizes (strides of the same order): distance 0, the neighbour's config is
    checked alone; the others stay spares."""
    path = tmp_path / "t.db"
    _op(path, FakeBackend(lambda c: 10.0 + abs(c.K - 3)), on_miss="tune", name="race.zero")(
        torch.randn(4, 16)[:, :8], torch.empty(4, 8))
    _op(path, FakeBackend(lambda c: 10.0 + abs(c.K - 5)), on_miss="tune", name="race.zero")(
        torch.randn(64, 16)[:, :8], torch.empty(64, 8))
    backend = FakeBackend(lambda c: 10.0 + abs(c.K - 5))  # K=5 would win a race
    op = _op(path, backend, name="race.zero")
    x, y = torch.randn(4, 32)[:, :8], torch.empty(4, 8)
    op(x, y)
    assert op.config_for(x, y)["K"] == 3 and op.tuning_count == 0
    s = _race_session(backend)
    assert [c["K"] for c in backend.compiled] == [3] and s.checked == [0] and s.timed == []
    assert torch.equal(y, x * 2)


# ---------------------------------------------------------------------- variants of the nearest config

GRID = tt.Space(TM=[16, 32, 64], CHUNK=[1, 2, 4], baseline=dict(TM=16, CHUNK=1))


def _grid_op(db, backend, *, on_miss="nearest", variants=True):
    op = tt.autotune(GRID, reference=lambda x, y: x * 2, writes=["y"], db=db, backend=backend, progress=False,
                     on_miss=on_miss, name="race.grid")(lambda cfg, x, y: tt.Launch(_kernel, (1,), (x, y)))
    op.race_variants = variants  # as the library's ops set it
    return op


def test_variants_are_the_configs_next_to_the_nearest_one_one_parameter_first():
    from types import SimpleNamespace

    problem = SimpleNamespace(spec=SimpleNamespace(space=GRID), arch="sm_90")
    base = GRID.config(TM=32, CHUNK=2)
    got = nearest.variants(problem, base, [base, GRID.config(TM=32, CHUNK=1)], 8)
    # one parameter changed (TM 16, 64 at CHUNK 2; CHUNK 4 at TM 32; CHUNK 1 taken), then two, in space order
    assert [(c.TM, c.CHUNK) for c in got[:3]] == [(16, 2), (32, 4), (64, 2)]
    assert {(c.TM, c.CHUNK) for c in got[3:]} == {(16, 1), (16, 4), (64, 1), (64, 4)}
    assert len(nearest.variants(problem, base, [base], 2)) == 2 and nearest.variants(problem, base, [base], 0) == []


def test_variants_a_compile_cache_holds_join_the_race_and_can_win_it(tmp_path, monkeypatch):
    """The neighbours' winner TM=16 CHUNK=1; on the new shape CHUNK=2 is faster: a config no neighbour holds,
    one parameter from the nearest one's, raced because a compile cache holds it, and served."""
    monkeypatch.delenv("TILETUNE_NEAREST_VARIANTS", raising=False)
    path = tmp_path / "t.db"
    _grid_op(path, FakeBackend(lambda c: 10.0 + abs(c.CHUNK - 1) + abs(c.TM - 16) / 16), on_miss="tune")(
        torch.randn(64), torch.empty(64))
    backend = FakeBackend(lambda c: 10.0 + abs(c.CHUNK - 2) + abs(c.TM - 16) / 16,
                          cached=lambda c: (c.TM, c.CHUNK) in {(16, 2), (64, 4)})
    op = _grid_op(path, backend)
    x, y = torch.randn(100), torch.empty(100)
    op(x, y)
    assert (op.config_for(x, y)["TM"], op.config_for(x, y)["CHUNK"]) == (16, 2) and op.tuning_count == 0
    assert [(c["TM"], c["CHUNK"]) for c in backend.compiled] == [(16, 1)]  # no variant compiled for the race
    assert torch.equal(y, x * 2)
    s = _race_session(backend)
    assert len(set(s.timed)) == 3 and len(s.checked) == 1  # the nearest and the two cached variants; one check


def test_variants_are_raced_only_for_ops_that_ask_for_them(tmp_path):
    """A user's op (``race_variants`` off, the default) races its neighbours' configs alone: a variant may never
    have run, and a kernel of the user's that faults would take the caller's CUDA context with it."""
    path = tmp_path / "t.db"
    _grid_op(path, FakeBackend(lambda c: 10.0 + abs(c.CHUNK - 1) + abs(c.TM - 16) / 16), on_miss="tune")(
        torch.randn(64), torch.empty(64))
    backend = FakeBackend(lambda c: 10.0 + abs(c.CHUNK - 2) + abs(c.TM - 16) / 16)  # every config cached
    op = _grid_op(path, backend, variants=False)
    assert tt.autotune(GRID)(lambda cfg, x: None).race_variants is False
    x, y = torch.randn(100), torch.empty(100)
    op(x, y)
    assert op.config_for(x, y)["CHUNK"] == 1 and op.tuning_count == 0
    s = _race_session(backend)  # the nearest alone (the default is the same config): checked, nothing timed
    assert s.compiled == [0] and s.checked == [0] and s.timed == []
    from tiletune.kernels.softmax_op import SOFTMAX

    library = SOFTMAX.op(("chunked", True))  # a library op races its variants (its kernels do not fault)
    assert library.race_variants is True and library.spec().race_variants is True


def test_variants_are_not_raced_when_set_to_zero_or_when_no_cache_holds_them(tmp_path, monkeypatch):
    path = tmp_path / "t.db"
    _grid_op(path, FakeBackend(lambda c: 10.0 + abs(c.CHUNK - 1) + abs(c.TM - 16) / 16), on_miss="tune")(
        torch.randn(64), torch.empty(64))
    monkeypatch.setenv("TILETUNE_NEAREST_VARIANTS", "0")
    backend = FakeBackend(lambda c: 10.0 + abs(c.CHUNK - 2))
    op = _grid_op(path, backend)
    x, y = torch.randn(100), torch.empty(100)
    op(x, y)
    assert op.config_for(x, y)["CHUNK"] == 1 and op.tuning_count == 0
    monkeypatch.delenv("TILETUNE_NEAREST_VARIANTS")
    cold = FakeBackend(lambda c: 10.0 + abs(c.CHUNK - 2), cached=lambda c: False)
    op = _grid_op(path, cold)
    x, y = torch.randn(200), torch.empty(200)
    op(x, y)
    assert op.config_for(x, y)["CHUNK"] == 1 and [(c["TM"], c["CHUNK"]) for c in cold.compiled] == [(16, 1)]


# ---------------------------------------------------------------------- the live session's race_samples


def _cutile_session(args, writes, plan, launched, *, inplace=(), fail=()):
    """A CutileSession without a GPU: its launch, stream, timer and synchronisation are stand-ins; the guard
    is the real one (CPU tensors)."""
    from types import SimpleNamespace

    from tiletune.devices.backends.cutile import CutileSession
    from tiletune.devices.verify import ArgGuard

    def launch(stream, grid, kernel, kargs):
        if kernel in fail:
            raise RuntimeError(f"launch of {kernel} failed")
        launched.append((kernel, kargs))

    class Timer:
        def __init__(self):
            self.batches = []
            self.uncovered = 0  # how many next batches the "host" enqueues slower than their spin
            self.hold_covered = None
            self.warmups, self.holds, self.warmup_us = [], [], 6.0

        def spin(self, seconds=0.05):
            pass

        def time(self, fn, n):  # unheld: only a candidate's warm-up samples, discarded
            self.warmups.append(n)
            return [self.warmup_us] * n

        def time_each(self, fns, hold=False):
            self.holds.append(hold)
            self.batches.append(len(fns))
            self.hold_covered = self.uncovered <= 0
            self.uncovered -= 1
            out = []
            for fn in fns:
                before = len(launched)
                fn()
                out.append(float(launched[before][0][1:]))  # kernel "k7" takes 7 us
            return out

    s = object.__new__(CutileSession)
    s.backend = SimpleNamespace(ct=SimpleNamespace(launch=launch), _raw_stream=lambda dev: None,
                                hinted=SimpleNamespace(get=lambda kernel, hints: kernel))
    s.torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda dev: None))
    s.plan, s.args, s.dev = plan, args, 0
    s.guard = ArgGuard(args, writes, inplace)
    s.timer = Timer()
    s._kernels, s._race_warm, s.stats = {}, set(), {}
    s._launchers, s._warm, s._long = {}, set(), set()
    return s


def test_the_live_session_times_unchecked_configs_on_twins_interleaved():
    from tiletune.devices.backends.base import Candidate

    x, y = torch.randn(64), torch.zeros(64)
    launched = []
    s = _cutile_session((x, y), (1,), lambda cfg, x, y: tt.Launch(f"k{cfg.K}", (1,), (x, y)), launched)
    cands = [Candidate(SPACE.config(K=k), i) for i, k in enumerate((5, 2, 3))]
    got = s.race_samples(cands, 3)
    assert got == {0: [5.0] * 3, 1: [2.0] * 3, 2: [3.0] * 3}
    assert s.timer.batches == [9] and s.timer.holds == [True]  # one held batch, one synchronisation
    assert [k for k, _ in launched] == ["k5", "k2", "k3"] + ["k5", "k2", "k3"] * 3  # warm-ups, then rounds
    for _, kargs in launched:  # never the caller's output: its twin, same shape and strides
        assert kargs[0] is x and kargs[1].untyped_storage().data_ptr() != y.untyped_storage().data_ptr()
        assert kargs[1].shape == y.shape and kargs[1].stride() == y.stride()
    assert torch.equal(y, torch.zeros(64))
    launched.clear()
    assert s.race_samples(cands[1:], 2) == {1: [2.0] * 2, 2: [3.0] * 2}
    assert len(launched) == 4  # no second warm-up


def test_a_race_batch_the_host_outlasted_its_spin_is_taken_again_once():
    from tiletune.devices.backends.base import Candidate

    x, y = torch.randn(64), torch.zeros(64)
    launched = []
    s = _cutile_session((x, y), (1,), lambda cfg, x, y: tt.Launch(f"k{cfg.K}", (1,), (x, y)), launched)
    s.timer.uncovered = 1
    cands = [Candidate(SPACE.config(K=k), i) for i, k in enumerate((5, 2))]
    assert s.race_samples(cands, 3) == {0: [5.0] * 3, 1: [2.0] * 3}
    assert s.timer.batches == [6, 6] and s.stats["race_hold_retakes"] == 1
    s.timer.uncovered = 5  # still uncovered after the retake: its samples are kept (one retake per batch)
    assert s.race_samples(cands, 2) == {0: [5.0] * 2, 1: [2.0] * 2}
    assert s.timer.batches == [6, 6, 4, 4] and s.stats["race_hold_retakes"] == 2


def test_tuning_samples_are_held_batches_after_unheld_warm_ups():
    """A tuning session's samples (``sample``) are held like the race's: a small kernel's sample would otherwise
    hold the host's launch whenever the host falls behind (the worker's compile threads share its interpreter)."""
    from tiletune.devices.backends import cutile
    from tiletune.devices.backends.base import Candidate

    x, y = torch.randn(64), torch.zeros(64)
    launched = []
    s = _cutile_session((x, y), (1,), lambda cfg, x, y: tt.Launch(f"k{cfg.K}", (1,), (x, y)), launched)
    c = Candidate(SPACE.config(K=3), 0)
    assert s.sample(c, 4) == [3.0] * 4 and s.sample(c, 2) == [3.0] * 2
    assert s.timer.warmups == [2] and s.timer.batches == [4, 2]  # one warm-up, then held batches
    assert s.timer.holds == [True, True]
    # a kernel whose warm-ups took 250 us or more keeps the GPU ahead of the host: its batches are not held
    s.timer.warmup_us = cutile.UNHELD_FROM_US
    long = Candidate(SPACE.config(K=5), 1)
    s.sample(long, 3)
    s.sample(c, 2)
    assert s.timer.holds == [True, True, False, True]


def test_a_launch_that_fails_inside_a_timed_batch_sends_the_race_to_check_first():
    """A config whose warm-up launch ran but whose launch fails inside the timed batch: which config failed is not
    known there, so the session declines to time (None) and the race checks each config first, where a failure is
    the config's own; nothing reaches the caller."""
    from tiletune.devices.backends.base import Candidate

    x, y = torch.randn(64), torch.zeros(64)
    launched, calls = [], []
    s = _cutile_session((x, y), (1,), lambda cfg, x, y: tt.Launch(f"k{cfg.K}", (1,), (x, y)), launched)
    real = s.backend.ct.launch

    def flaky(stream, grid, kernel, kargs):
        calls.append(kernel)
        if kernel == "k4" and calls.count("k4") == 2:  # the warm-up passes, the first timed launch fails
            raise RuntimeError("launch failed")
        real(stream, grid, kernel, kargs)

    s.backend.ct.launch = flaky
    got = s.race_samples([Candidate(SPACE.config(K=4), 0), Candidate(SPACE.config(K=1), 1)], 2)
    assert got is None and "launch failed" in s.stats["race_batch_error"]


def test_the_live_session_reports_a_launch_failure_and_refuses_without_twins():
    from tiletune.devices.backends.base import Candidate

    x, y = torch.randn(64), torch.zeros(64)
    launched = []
    s = _cutile_session((x, y), (1,), lambda cfg, x, y: tt.Launch(f"k{cfg.K}", (1,), (x, y)), launched, fail={"k4"})
    got = s.race_samples([Candidate(SPACE.config(K=4), 0), Candidate(SPACE.config(K=1), 1)], 2)
    assert "launch of k4 failed" in got[0] and got[1] == [1.0, 1.0]
    # an output sharing the input's storage has no twin: nothing is launched, the race checks first
    buf = torch.randn(128)
    launched.clear()
    s = _cutile_session((buf[:64], buf[64:]), (1,), lambda cfg, x, y: tt.Launch(f"k{cfg.K}", (1,), (x, y)), launched)
    assert s.race_samples([Candidate(SPACE.config(K=1), 0)], 2) is None and launched == []


def test_the_choice_keeps_the_race_each_config_its_median_and_verdict(tmp_path):
    """A nearest choice names every config it weighed (neighbour, distance, race median, verdict): a served
    config slower than the tuned one can be traced to the race's timing or to a failed check."""
    from tiletune import events

    path = tmp_path / "t.db"
    _tuned(path)
    backend = FakeBackend(lambda c: 10.0 + abs(c.K - 4),  # K=4 fastest but wrong, then K=2, then the default K=0
                          failures=lambda c: SimulatedCandidate(tt.Status.MISMATCH, "off by one") if c.K == 4 else None)
    op = _op(path, backend)
    heard = []

    def listen(op=None, problem=None, choice=None, **_):
        heard.append(choice)

    events.subscribe("choice", listen)
    try:
        op(torch.randn(100), torch.empty(100))
    finally:
        events.unsubscribe("choice", listen)
    (choice,) = [c for c in heard if c.source == "nearest"]
    raced = choice.raced
    assert [r.config["K"] for r in raced] == [2, 4, 0]
    assert [r.verdict.split(":")[0] for r in raced] == ["served", "failed", "slower"]
    assert "mismatch" in raced[1].verdict and "off by one" in raced[1].verdict
    assert [r.median_us for r in raced] == pytest.approx([12.0, 10.0, 14.0], rel=0.01)  # the fake adds noise
    assert raced[0].neighbour == choice.neighbour and raced[2].neighbour is None and raced[2].distance is None
    assert 0 < raced[0].distance < raced[1].distance


def test_the_race_result_tells_what_became_of_each_config():
    got = nearest.RaceResult(1, {2: "mismatch: wrong"}, (0, 1, 2), (3,), (1,), {0: 5.0, 1: 4.0})
    assert [got.verdict(i) for i in range(4)] == ["slower", "served", "failed: mismatch: wrong", "not compiled"]
    assert nearest.RaceResult(None, {}, (), (0,), ()).medians == {}
