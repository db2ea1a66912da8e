"""The search driver on recorded spaces (CPU): budgets, repeats, determinism, failures, and one loop
for live and replayed tuning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tiletune as tt
import tiletune.op.tuned_op
import tiletune.engine.search
from tiletune.devices.backends import FakeBackend
from tiletune.lab.recordings.replay import RecordedTiming, ReplayBackend
from tiletune.devices.backends.simulated import SimulatedCandidate, SimulatedSession
from tiletune.lab.recordings import Recording
from tiletune.records import Status
from tiletune.engine.search import run_search
from tiletune.space.strategies import STRATEGY_NAMES, Budget, make_strategy
from tiletune.lab.strategy_eval import load_truth, random_expected_evals, run_one, summarize_runs
from tiletune.engine.tuner import TunerOptions

DATA = Path(__file__).parent / "data"
SPACES = sorted(DATA.glob("synthetic_*.json.gz"))


@pytest.fixture(scope="module")
def gemm():
    return load_truth(DATA / "synthetic_gemm.json.gz")


@pytest.fixture(scope="module")
def attention():
    return load_truth(DATA / "synthetic_attention.json.gz")


def session_for(truth, seed=0, workers=16):
    return SimulatedSession(RecordedTiming(truth.recording), workers=workers, seed=seed)


def test_synthetic_spaces_are_big_and_honestly_labelled():
    assert len(SPACES) == 3
    for p in SPACES:
        t = load_truth(p)
        assert t.n_valid >= 300 and t.n_configs >= t.n_valid
        assert "SYNTHETIC" in t.recording.note
        assert t.space.size(t.arch) == t.n_configs == len(t.recording.measurements)
        assert t.space.baseline(t.arch) is not None


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_eval_budget_is_exact_and_nothing_repeats(gemm, name):
    s = make_strategy(name, gemm.space, gemm.arch, seed=1)
    res = run_search(session_for(gemm), s, Budget(max_evals=37))
    assert len(res.evaluations) == len(res.measurements) == 37 and res.stopped == "max_evals"
    configs = [e.config for e in res.evaluations]
    assert len(set(configs)) == 37
    assert all(c in gemm.truth for c in configs), "only configs of the space"
    assert configs[0] == gemm.space.baseline(gemm.arch)
    assert [e.index for e in res.evaluations] == list(range(37))
    assert [m.order for m in res.measurements] == list(range(37))
    assert [e.batch for e in res.evaluations][-1] == res.batches - 1
    # batches of the compile workers (16) except the first of a model-based search and the last one
    assert max(sum(e.batch == b for e in res.evaluations) for b in range(res.batches)) == 16


@pytest.mark.parametrize("name", ["random", "evolutionary", "model"])
def test_seconds_budget_is_honoured(gemm, name):
    unlimited = run_search(session_for(gemm), make_strategy(name, gemm.space, gemm.arch, seed=0), Budget(max_evals=120))
    limit = unlimited.wall_s / 3
    res = run_search(session_for(gemm), make_strategy(name, gemm.space, gemm.arch, seed=0), Budget(max_seconds=limit))
    assert res.stopped == "max_seconds"
    assert len(res.evaluations) < len(unlimited.evaluations)
    longest_compile = max(m.compile_s or 0.0 for m in gemm.recording.measurements)
    assert res.wall_s <= limit + longest_compile + 0.5
    # nothing is measured after the deadline: configs compiled too late are marked, not timed
    late = [e for e in res.evaluations if e.status is Status.TIMEOUT]
    assert all(m.reason == "tuning time budget exhausted" for m in res.measurements if m.status is Status.TIMEOUT)
    assert all(e.median_us is None for e in late)


def test_compile_of_a_later_batch_starts_when_it_is_proposed(gemm):
    res = run_search(session_for(gemm), make_strategy("random", gemm.space, gemm.arch, seed=0), Budget(max_evals=32))
    first = [e.known_at_s for e in res.evaluations if e.batch == 0]
    second = [e.known_at_s for e in res.evaluations if e.batch == 1]
    assert min(second) > max(first)  # batch 1 compiles after batch 0 was measured, not "in the past"
    fastest_compile = min(m.compile_s for m in gemm.recording.measurements if m.compile_s)
    assert min(second) >= max(first) + fastest_compile


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_search_is_deterministic_under_a_seed(attention, name):
    runs = [run_search(session_for(attention, seed=5), make_strategy(name, attention.space, attention.arch, seed=5),
                       Budget(max_evals=40)) for _ in range(2)]
    a, b = ([(e.config, e.status, e.median_us, e.known_at_s) for e in r.evaluations] for r in runs)
    assert a == b
    assert runs[0].winner == runs[1].winner and runs[0].wall_s == runs[1].wall_s


def test_failures_are_tolerated_and_told_as_none(attention):
    s = make_strategy("evolutionary", attention.space, attention.arch, seed=0)
    res = run_search(session_for(attention), s, Budget(max_evals=200))
    failed = [e for e in res.evaluations if e.status is not Status.OK]
    assert failed, "the attention space has compile and launch failures"
    assert all(e.median_us is None and s.results[e.config] is None for e in failed)
    assert all(attention.truth[e.config] is None for e in failed)
    assert all(s.results[c] is not None for _, c in s.members())
    assert res.winner is not None and res.winner.config not in {e.config for e in failed}


def test_winner_is_ranked_over_all_batches(gemm):
    res = run_search(session_for(gemm), make_strategy("random", gemm.space, gemm.arch, seed=3), Budget(max_evals=64))
    assert res.batches == 4
    best_true = min(gemm.truth[e.config] for e in res.evaluations if gemm.truth[e.config] is not None)
    assert gemm.truth[res.winner.config] <= 1.03 * best_true
    assert res.winner in res.tied and res.winner_median_us == pytest.approx(
        min(e.median_us for e in res.evaluations if e.median_us is not None), rel=0.03)


def test_racing_uses_the_incumbent_from_earlier_batches(gemm):
    res = run_search(session_for(gemm), make_strategy("exhaustive", gemm.space, gemm.arch, seed=0), Budget(max_evals=96))
    later = [m for m, e in zip(res.measurements, res.evaluations) if e.batch > 0 and m.status is Status.OK]
    assert any(m.reason == "raced_out" for m in later)
    assert sum(len(m.samples_us) for m in later) < 30 * len(later)


def test_stop_when_ends_the_search(gemm):
    target = 1.05 * gemm.optimum_us
    res = run_search(session_for(gemm), make_strategy("random", gemm.space, gemm.arch, seed=0), Budget(),
                     stop_when=lambda ev: any((gemm.truth[e.config] or 1e99) <= target for e in ev))
    assert res.stopped == "stop_when"
    hits = [i for i, e in enumerate(res.evaluations) if (gemm.truth[e.config] or 1e99) <= target]
    assert hits and hits[0] >= len(res.evaluations) - 16  # it stopped after the batch that found one


# ----------------------------------------------------------------------------------------------
# one loop for live and replayed tuning


def _plan(cfg, n):
    return tt.Launch(_kernel, (1,), (n,))


def _kernel(n):  # a "kernel" for the fake and replay backends
    return None


def _spy(monkeypatch):
    calls = {"run_loop": 0, "run_search": 0}
    real_loop, real_search = tiletune.engine.tuner.run_loop, tiletune.engine.search.run_search

    def loop(*a, **k):
        calls["run_loop"] += 1
        return real_loop(*a, **k)

    def search(*a, **k):
        calls["run_search"] += 1
        return real_search(*a, **k)

    monkeypatch.setattr(tiletune.engine.search, "run_loop", loop)
    monkeypatch.setattr(tiletune.engine.search, "run_search", search)
    return calls


@pytest.mark.parametrize("strategy", [None, "random", "evolutionary", "model"])
def test_live_and_replay_tuning_take_the_same_code_path(gemm, monkeypatch, strategy):
    budget = None if strategy is None else Budget(max_evals=40)
    truth_model = lambda cfg: gemm.truth[cfg] or 1e9  # noqa: E731
    fails = lambda cfg: None if gemm.truth[cfg] is not None else SimulatedCandidate(Status.COMPILE_ERROR)  # noqa: E731
    seen = {}
    for kind, backend in (("fake", FakeBackend(truth_model, failures=fails)), ("replay", ReplayBackend(gemm.recording))):
        calls = _spy(monkeypatch)
        op = tt.autotune(gemm.space, db=False, backend=backend, progress=False, strategy=strategy, budget=budget,
                         seed=4)(_plan)
        op(128)
        (res,) = op.results.values()
        seen[kind] = (dict(calls), res)
    for kind, (calls, res) in seen.items():
        if strategy is None:  # exhaustive is a strategy on the same pipeline: the whole space in one batch
            assert calls == {"run_loop": 1, "run_search": 1}, kind
            assert res.stats["evaluations"] == gemm.n_configs and res.stats["strategy"] == "exhaustive"
        else:
            assert calls["run_search"] == 1 and calls["run_loop"] == res.stats["batches"] >= 3, kind
            assert res.stats["strategy"] == strategy and res.stats["evaluations"] == 40
            assert len(res.measurements) == 40
    if strategy is not None:
        # the same strategy with the same seed sees nearly the same medians (model vs recorded samples)
        fake, replay = (seen[k][1] for k in ("fake", "replay"))
        assert fake.measurements[0].config == replay.measurements[0].config == dict(gemm.space.baseline(gemm.arch))


@pytest.mark.parametrize("name", ["random", "evolutionary", "model"])
def test_evaluation_runs_are_the_decorator_path(gemm, name):
    """The evaluation (run_one) and the decorator over a ReplayBackend propose and measure identically."""
    run = run_one(gemm, name, seed=3)
    op = tt.autotune(gemm.space, db=False, backend=ReplayBackend(gemm.recording, seed=3), progress=False,
                     strategy=name, budget=Budget(max_evals=run.evaluations), seed=3)(_plan)
    op(64)
    (res,) = op.results.values()
    configs = [dict(m.config) for m in res.measurements]
    assert len(configs) == run.evaluations
    best, curve = float("inf"), []
    for c in configs:
        v = gemm.truth[gemm.space.config(gemm.arch, **c)]
        best = min(best, v if v is not None else best)
        curve.append(best / gemm.optimum_us)
    assert tuple(curve) == run.curve
    assert res.stats["session_clock_s"] == pytest.approx(run.session_s)


def test_summary_rows_have_the_result_schema(gemm):
    runs = [run_one(gemm, "evolutionary", seed) for seed in range(3)]
    row = summarize_runs(gemm, "evolutionary", runs)
    for key in ("space", "n_valid", "strategy", "median_evals_to_5pct", "median_evals_to_1pct",
                "random_expected_evals_to_5pct", "evals_to_5pct_ci95", "median_seconds_to_5pct"):
        assert key in row
    assert row["n_valid"] == gemm.n_valid and row["space"] == "synthetic_gemm"
    assert row["random_expected_evals_to_5pct"] == pytest.approx(
        (gemm.n_configs + 1) / (gemm.within(0.05) + 1), abs=1e-3)
    lo, hi = row["evals_to_5pct_ci95"]
    assert lo <= row["median_evals_to_5pct"] <= hi
    assert row["median_evals_to_5pct"] <= row["median_evals_to_1pct"]
    json.dumps(row)


def test_random_expectation_formula():
    assert random_expected_evals(1, 1) == 1.0
    assert random_expected_evals(9, 1) == 5.0
    assert random_expected_evals(100, 100) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        random_expected_evals(5, 0)


def test_decorator_budget_in_seconds_and_in_evals_together(gemm):
    op = tt.autotune(gemm.space, db=False, backend=ReplayBackend(gemm.recording), progress=False,
                     strategy="random", budget=Budget(max_evals=500, max_seconds=6.0))(_plan)
    op(32)
    (res,) = op.results.values()
    assert res.stats["stopped"] == "max_seconds" and res.stats["evaluations"] < 500
    assert res.stats["session_clock_s"] <= 6.0 + 3.0
    # exhaustive with a seconds budget keeps the one-shot loop, and honours the budget too
    op = tt.autotune(gemm.space, db=False, backend=ReplayBackend(gemm.recording), progress=False,
                     budget=Budget(max_seconds=6.0), options=TunerOptions())(_plan)
    op(32)
    (res,) = op.results.values()
    assert res.stats["strategy"] == "exhaustive"
    assert any(m.status is Status.TIMEOUT for m in res.measurements)


def test_recording_answers_only_recorded_configs(gemm):
    rec: Recording = gemm.recording
    assert all(rec.get(c) is not None for c in gemm.truth)
