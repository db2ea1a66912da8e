"""Backends: where candidates compile, run and are timed (live cuTile, or simulated)."""

from __future__ import annotations

from tiletune.devices.backends.base import Backend, Candidate, CheckOutcome, CompileOutcome, Launch, TuningSession
from tiletune.devices.backends.simulated import FakeBackend, FakeCompilingBackend, ModelTiming, SimulatedCandidate, SimulatedSession, TimingSource

_default: Backend | None = None


def prewarm_default() -> None:
    """Warm up the default (cuTile) backend's one-off costs in the background, if cuTile is here."""
    import importlib.util

    if importlib.util.find_spec("cuda.tile") is not None:
        from tiletune.devices.backends.cutile import prewarm

        prewarm()


def default_backend() -> Backend:
    """The live cuTile backend (created once per process). Raises NoBackendError without a GPU."""
    global _default
    if _default is None:
        from tiletune.devices.backends.cutile import CutileBackend

        _default = CutileBackend()
    return _default


__all__ = [
    "Backend",
    "Candidate",
    "CheckOutcome",
    "CompileOutcome",
    "FakeBackend",
    "FakeCompilingBackend",
    "Launch",
    "ModelTiming",
    "SimulatedCandidate",
    "SimulatedSession",
    "TimingSource",
    "TuningSession",
    "default_backend",
    "prewarm_default",
]
