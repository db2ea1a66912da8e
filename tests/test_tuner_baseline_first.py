"""Phase 1 checks the baseline before anything else while nothing is timed: its time sets the watchdog's
deadlines, so a config that never ends must not be the session's first check."""

from __future__ import annotations

import random

import tiletune as tt
from tiletune.devices.backends.base import Candidate
from tiletune.devices.backends.simulated import SimulatedCandidate, SimulatedSession, TimingSource
from tiletune.engine.tuner import TunerOptions, run_loop
from tiletune.stats import summarize

COMPILE_S = {"a": 0.1, "b": 0.2, "c": 0.9, "d": 0.3}  # the baseline "c" compiles last


class Timing(TimingSource):
    def describe(self, config):
        return SimulatedCandidate(compile_s=COMPILE_S[config.V])

    def draw(self, config, n, rng: random.Random):
        return [100.0 + 10 * "abcd".index(config.V) for _ in range(n)]


def run(baseline: str | None, incumbent=None):
    space = tt.Space(V=list("abcd"), baseline=dict(V=baseline) if baseline else None)
    cands = [Candidate(c, i, c.V == baseline) for i, c in enumerate(space.candidates())]
    session = SimulatedSession(Timing(), workers=4, seed=1)
    result = run_loop(session, cands, TunerOptions(showdown_rounds=0), incumbent=incumbent)
    name = {c.order: c.config.V for c in cands}
    return [name[o] for o in session.checked], result


def test_the_baseline_is_checked_first_though_it_compiles_last():
    checked, result = run("c")
    assert checked == ["c", "a", "b", "d"]  # compiled a, b, d, c
    assert result.winner.config.V == "a" and len(result.measurements) == 4


def test_without_a_baseline_checks_follow_the_compiles():
    checked, _ = run(None)
    assert checked == ["a", "b", "d", "c"]


def test_with_an_incumbent_timed_already_nothing_waits_for_the_baseline():
    checked, _ = run("c", incumbent=summarize([90.0] * 10))
    assert checked == ["a", "b", "d", "c"]
