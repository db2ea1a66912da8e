"""Replay backend: answers a tuning session from a recording of a real one.

Replaying runs the *same* tuning loop as live tuning: compile times are list-scheduled over the
simulated compile workers, samples are drawn (with replacement, seeded) from the recorded ones, and
a simulated clock advances by what the GPU and compilers would have spent.

The recording format and the importers of public recorded spaces (Kernel Tuner caches, T4 results)
live in :mod:`tiletune.lab.recordings`. For compatibility this module re-exports their public names
(``FORMAT``, ``RecordedConfigs``, ``Recording``, ``load_any``, ``save_recording``), so code that
imports them from ``tiletune.lab.recordings.replay`` keeps working; new code imports them from
:mod:`tiletune.lab.recordings`.
"""

from __future__ import annotations

import os
import random
from typing import Any, Callable, Mapping, Sequence

from tiletune.records import Status
from tiletune.lab.recordings import FORMAT, RecordedConfigs, Recording, load_any, save_recording  # re-exported (compatibility)
from tiletune.space.spaces import Config
from tiletune.devices.backends.base import Launch
from tiletune.devices.backends.simulated import SimulatedBackend, SimulatedCandidate, SimulatedSession, TimingSource

__all__ = [
    "FORMAT",
    "RecordedConfigs",
    "RecordedTiming",
    "Recording",
    "ReplayBackend",
    "load_any",
    "save_recording",
]


class RecordedTiming(TimingSource):
    """A :class:`TimingSource` backed by a :class:`Recording`. Unrecorded configs fail to compile."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording

    def describe(self, config: Config) -> SimulatedCandidate:
        m = self.recording.get(config)
        if m is None:
            return SimulatedCandidate(Status.COMPILE_ERROR, "config not in the recording", 0.0)
        if m.status is Status.OK and not m.samples_us:
            return SimulatedCandidate(Status.TIMEOUT, "recorded without samples", m.compile_s or 0.0)
        return SimulatedCandidate(m.status, m.reason if m.status.failed else "", m.compile_s or 0.0)

    def draw(self, config: Config, n: int, rng: random.Random) -> list[float]:
        m = self.recording.get(config)
        assert m is not None and m.samples_us
        return [rng.choice(m.samples_us) for _ in range(n)]


class ReplayBackend(SimulatedBackend):
    """Replays a recording through the tuning loop (no GPU). Launches are recorded, not executed."""

    name = "replay"

    def __init__(self, recording: Recording | str | os.PathLike, *, workers: int = 16, seed: int = 0) -> None:
        self.recording = recording if isinstance(recording, Recording) else Recording.load(recording)
        self.device = self.recording.device
        self._versions = dict(self.recording.versions)
        self.workers = workers
        self.seed = seed
        self.launches: list[tuple[Config, tuple[int, ...]]] = []
        self.sessions: list[SimulatedSession] = []

    def _execute(self, config: Config, spec: Launch) -> None:
        self.launches.append((config, tuple(spec.grid)))  # replayed launches run nothing

    def open_session(
        self,
        plan: Callable[..., Launch],
        args: tuple[Any, ...],
        *,
        device_index: int,
        writes: Sequence[int],
        inplace: Sequence[int] = (),
        reference: Callable[..., Any] | None,
        tolerance: Mapping[str, tuple[float, float]] | None,
        name: str,
    ) -> SimulatedSession:
        session = SimulatedSession(RecordedTiming(self.recording), workers=self.workers, seed=self.seed)
        self.sessions.append(session)
        return session
