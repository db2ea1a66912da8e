"""Replay backend: answers a tuning session from a recording of a real one.

A recording (``tiletune-recording`` JSON, gzip optional) holds, for one op and problem key on one
device, every measured config with its samples, compile time and failure reason. Replaying runs the
*same* tuning loop as live tuning: compile times are list-scheduled over the simulated compile
workers, samples are drawn (with replacement, seeded) from the recorded ones, and a simulated clock
advances by what the GPU and compilers would have spent.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..errors import TiletuneError
from ..records import DeviceInfo, Measurement, Status, canonical_json
from ..space import Config
from .base import Launch, LaunchParts
from .simulated import SimulatedCandidate, SimulatedSession, TimingSource

FORMAT = "tiletune-recording"


def save_recording(
    path: str | os.PathLike,
    *,
    name: str,
    key: Any,
    device: DeviceInfo,
    versions: Mapping[str, str],
    measurements: Sequence[Measurement],
    space: Mapping[str, Any] | None = None,
    note: str = "",
) -> Path:
    """Write a recording (gzip-compressed when the path ends in ``.gz``)."""
    doc = {
        "format": FORMAT,
        "version": 1,
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "name": name,
        "key": key,
        "device": device.as_dict(),
        "versions": dict(versions),
        "space": dict(space or {}),
        "note": note,
        "measurements": [_compact(m) for m in measurements],
    }
    p = Path(path)
    text = json.dumps(doc, separators=(",", ":"))
    if p.suffix == ".gz":
        p.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        p.write_text(text)
    return p


def _compact(m: Measurement) -> dict[str, Any]:
    d = m.as_dict()
    d["samples_us"] = [round(x, 3) for x in m.samples_us]
    if d["compile_s"] is not None:
        d["compile_s"] = round(d["compile_s"], 4)
    return d


class Recording:
    """A loaded recording: configs -> recorded measurement."""

    def __init__(self, doc: Mapping[str, Any], source: str = "<memory>") -> None:
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT or doc.get("version") != 1:
            fmt = doc.get("format") if isinstance(doc, Mapping) else type(doc).__name__
            raise TiletuneError(f"{source}: not a tiletune recording (format {fmt!r}, version 1 expected)")
        try:
            self._load(doc, source)
        except (KeyError, TypeError, ValueError) as exc:
            raise TiletuneError(f"{source}: malformed tiletune recording: {type(exc).__name__}: {exc}") from exc

    def _load(self, doc: Mapping[str, Any], source: str) -> None:
        self.source = source
        self.name = str(doc.get("name", ""))
        self.key = doc.get("key")
        self.device = DeviceInfo.from_dict(doc["device"])
        self.versions = dict(doc.get("versions", {}))
        self.recorded = str(doc.get("recorded", ""))
        self.note = str(doc.get("note", ""))
        self.space = dict(doc.get("space", {}))
        self.measurements = [Measurement.from_dict(m) for m in doc["measurements"]]
        self._by_config = {canonical_json(dict(m.config)): m for m in self.measurements}

    @staticmethod
    def load(path: str | os.PathLike) -> "Recording":
        """Read a recording file (plain or gzip JSON)."""
        raw = Path(path).read_bytes()
        try:
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.decompress(raw)
            doc = json.loads(raw)
        except (OSError, ValueError, EOFError) as exc:
            raise TiletuneError(f"{path}: not a tiletune recording ({type(exc).__name__}: {exc})") from exc
        return Recording(doc, str(path))

    def get(self, config: Config | Mapping[str, Any]) -> Measurement | None:
        """The recorded measurement of a config, or None."""
        d = config.as_dict() if isinstance(config, Config) else dict(config)
        return self._by_config.get(canonical_json(d))


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


class ReplayBackend:
    """Replays a recording through the tuning loop (no GPU). Launches are recorded, not executed."""

    name = "replay"

    def __init__(self, recording: Recording | str | os.PathLike, *, workers: int = 16, seed: int = 0) -> None:
        self.recording = recording if isinstance(recording, Recording) else Recording.load(recording)
        self.workers = workers
        self.seed = seed
        self.launches: list[tuple[Config, tuple[int, ...]]] = []
        self.sessions: list[SimulatedSession] = []

    def device_info(self, device_index: int) -> DeviceInfo:
        return self.recording.device

    def versions(self) -> Mapping[str, str]:
        return self.recording.versions

    def arg_device(self, args: Sequence[Any]) -> int:
        return 0

    def kernel_sources(self, kernel: Any) -> str:
        from ..identity import function_source

        return function_source(getattr(kernel, "_pyfunc", kernel)) if callable(kernel) else repr(kernel)

    def launch_parts(self, config: Config, kernel: Any, device_index: int) -> LaunchParts:
        def launch(stream: Any, grid: tuple[int, ...], k: Any, kargs: tuple[Any, ...]) -> None:
            self.launches.append((config, tuple(grid)))

        return LaunchParts(launch, lambda d: None, kernel, device_index)

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
