"""Backends: where candidates compile, run and are timed (live cuTile, or simulated)."""

from __future__ import annotations

from .base import Backend, Candidate, CheckOutcome, CompileOutcome, Launch, TuningSession
from .simulated import FakeBackend, ModelTiming, SimulatedCandidate, SimulatedSession, TimingSource

_default: Backend | None = None


def prewarm_default() -> None:
    """Warm up the default (cuTile) backend's one-off costs in the background, if cuTile is here."""
    import importlib.util

    if importlib.util.find_spec("cuda.tile") is not None:
        from .cutile import prewarm

        prewarm()


def default_backend() -> Backend:
    """The live cuTile backend (created once per process). Raises NoBackendError without a GPU."""
    global _default
    if _default is None:
        from .cutile import CutileBackend

        _default = CutileBackend()
    return _default


__all__ = [
    "Backend",
    "Candidate",
    "CheckOutcome",
    "CompileOutcome",
    "FakeBackend",
    "Launch",
    "ModelTiming",
    "SimulatedCandidate",
    "SimulatedSession",
    "TimingSource",
    "TuningSession",
    "default_backend",
    "prewarm_default",
]
