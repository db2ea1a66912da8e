"""The final interleaved showdown protects the choice against drift during a session."""

from __future__ import annotations

import random

import tiletune as tt
from tiletune.devices.backends.base import Candidate
from tiletune.devices.backends.simulated import SimulatedCandidate, SimulatedSession, TimingSource
from tiletune.engine.tuner import TunerOptions, run_loop

SPACE = tt.Space(V=["a", "b", "c"], baseline=dict(V="a"))
TRUE_US = {"a": 100.0, "b": 97.0, "c": 150.0}


class DriftingTiming(TimingSource):
    """True times, but the first ``boosted`` samples of the session run 10% fast (clocks, then throttle)."""

    def __init__(self, boosted: int) -> None:
        self.boosted = boosted
        self.drawn = 0

    def describe(self, config):
        return SimulatedCandidate(compile_s=0.1)

    def draw(self, config, n, rng: random.Random):
        out = []
        for _ in range(n):
            factor = 0.9 if self.drawn < self.boosted else 1.0
            out.append(TRUE_US[config.V] * factor * rng.lognormvariate(0, 0.002))
            self.drawn += 1
        return out


def run(rounds: int):
    cands = [Candidate(c, i, i == 0) for i, c in enumerate(SPACE.candidates())]
    session = SimulatedSession(DriftingTiming(boosted=10), workers=1, seed=1)
    return run_loop(session, cands, TunerOptions(showdown_rounds=rounds))


def test_without_showdown_drift_picks_the_early_candidate():
    assert run(0).winner.config.V == "a"  # the baseline was measured while clocks were boosted


def test_showdown_picks_the_truly_fastest():
    res = run(4)
    assert res.winner.config.V == "b"
    by = {m.config["V"]: m for m in res.measurements}
    assert len(by["c"].samples_us) == 10  # far behind: not re-measured
    assert len(by["a"].samples_us) > 10 and len(by["b"].samples_us) > 10
