"""Replay backend: answers a tuning session from a recording of a real one.

A recording (``tiletune-recording`` JSON, gzip optional) holds, for one op and problem key on one
device, every measured config with its samples, compile time and failure reason. Replaying runs the
*same* tuning loop as live tuning: compile times are list-scheduled over the simulated compile
workers, samples are drawn (with replacement, seeded) from the recorded ones, and a simulated clock
advances by what the GPU and compilers would have spent.

Public recorded spaces can be imported: Kernel Tuner's JSON cache files
(:meth:`Recording.from_kernel_tuner_cache`) and the T4 auto-tuning results format
(:meth:`Recording.from_t4`); :func:`load_any` tells the three formats apart. A recording knows the
space it was measured over: :meth:`Recording.space_from_params` builds a tiletune :class:`Space`
whose valid configurations are exactly the recorded ones, so a search over it never proposes a
config the recording cannot answer.
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
from ..records import DeviceInfo, Measurement, Status, canonical_json, stable_hash
from ..space import Config, Space
from .base import Launch
from .simulated import SimulatedBackend, SimulatedCandidate, SimulatedSession, TimingSource

FORMAT = "tiletune-recording"

__all__ = [
    "FORMAT",
    "RecordedConfigs",
    "RecordedTiming",
    "Recording",
    "ReplayBackend",
    "load_any",
    "save_recording",
]

#: Kernel Tuner's error markers (the ``time`` of a cache entry) and what they become here.
#: ``InvalidConfig`` marks a config that breaks the space's restrictions: not part of the space.
_KT_ERRORS: dict[str, Status | None] = {
    "InvalidConfig": None,
    "CompilationFailedConfig": Status.COMPILE_ERROR,
    "RuntimeFailedConfig": Status.LAUNCH_ERROR,
}

#: T4 ``invalidity`` values and what they become (``constraints``: not part of the space).
_T4_STATUS: dict[str, Status | None] = {
    "correct": Status.OK,
    "constraints": None,
    "compile": Status.COMPILE_ERROR,
    "runtime": Status.LAUNCH_ERROR,
    "correctness": Status.MISMATCH,
    "timeout": Status.TIMEOUT,
}


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

    # ------------------------------------------------------------------ the recorded space
    @property
    def param_values(self) -> dict[str, list[Any]]:
        """``name -> values`` of the recorded space.

        From the recording's ``space["params"]`` when it has one (importers and recorders that
        know the space write it), else from the recorded configs: numbers sorted ascending, other
        values in the order first seen; parameters in the order of the first recorded config.
        """
        given = self.space.get("params") if isinstance(self.space, Mapping) else None
        if isinstance(given, Mapping) and given:
            return {str(k): list(v) for k, v in given.items()}
        names: list[str] = []
        seen: dict[str, list[Any]] = {}
        for m in self.measurements:
            for k, v in m.config.items():
                if k not in seen:
                    names.append(k)
                    seen[k] = []
                if not any(v == x and type(v) is type(x) for x in seen[k]):
                    seen[k].append(v)
        out: dict[str, list[Any]] = {}
        for k in names:
            vs = seen[k]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vs):
                vs = sorted(vs)
            out[k] = vs
        return out

    def space_from_params(self, baseline: Mapping[str, Any] | bool = True) -> Space:
        """A :class:`Space` over the recorded parameters whose valid configs are the recorded ones.

        Every recorded config (successful or failed) is valid; every combination never recorded
        (Kernel Tuner's ``InvalidConfig``, T4's ``constraints``, or simply not measured) is removed
        by the constraint ``"recorded"``. ``baseline=True`` takes the recorded baseline (if any),
        ``False`` none, or a dict of values.
        """
        params = self.param_values
        if not params:
            raise TiletuneError(f"{self.source}: the recording has no configs to build a space from")
        names = list(params)
        recorded = RecordedConfigs(names, [m.config for m in self.measurements])
        base: Mapping[str, Any] | None = None
        if baseline is True:
            flagged = [m for m in self.measurements if m.is_baseline]
            base = dict(flagged[0].config) if flagged else None
        elif isinstance(baseline, Mapping):
            base = dict(baseline)
        try:
            return Space(constraints={"recorded": recorded}, baseline=base, **params)
        except TiletuneError as exc:
            raise TiletuneError(f"{self.source}: cannot build a tiletune Space from the recording: {exc}") from exc

    # ------------------------------------------------------------------ importers
    @classmethod
    def from_kernel_tuner_cache(
        cls, path: str | os.PathLike, *, name: str | None = None, arch: str = "unknown"
    ) -> "Recording":
        """Import a Kernel Tuner JSON cache file (also an unterminated one, as Kernel Tuner leaves it).

        ``time`` and ``times`` (milliseconds) become the samples in microseconds, ``compile_time``
        (ms) the compile seconds. ``CompilationFailedConfig`` becomes a compile error,
        ``RuntimeFailedConfig`` a launch error; ``InvalidConfig`` entries (restriction failures)
        are left out, so they are invalid in :meth:`space_from_params`. Device and kernel names
        come from the file (``"unknown"`` when absent); the architecture from ``arch``.
        """
        doc = _read_json(path, allow_open_kt_cache=True)
        if not isinstance(doc, Mapping) or not isinstance(doc.get("cache"), Mapping):
            raise TiletuneError(f"{path}: not a Kernel Tuner cache file (no 'cache' object)")
        try:
            tune_params = {str(k): list(v) for k, v in doc["tune_params"].items()}
            keys = [str(k) for k in doc.get("tune_params_keys", list(tune_params))]
        except (KeyError, TypeError, AttributeError) as exc:
            raise TiletuneError(f"{path}: Kernel Tuner cache without usable 'tune_params': {exc}") from exc
        params = {k: tune_params[k] for k in keys if k in tune_params}
        measurements: list[dict[str, Any]] = []
        invalid = 0
        for i, (ckey, entry) in enumerate(doc["cache"].items()):
            if not isinstance(entry, Mapping):
                raise TiletuneError(f"{path}: cache entry {ckey!r} is not an object")
            config = _kt_config(str(ckey), entry, keys, params, path)
            t = entry.get("time")
            compile_ms = entry.get("compile_time")
            compile_s = round(float(compile_ms) / 1e3, 4) if isinstance(compile_ms, (int, float)) else None
            rec: dict[str, Any] = {"config": config, "order": i, "compile_s": compile_s, "samples_us": []}
            if isinstance(t, str):
                status = _KT_ERRORS.get(t, Status.LAUNCH_ERROR)
                if status is None:
                    invalid += 1
                    continue
                rec.update(status=status.value, reason=t)
            elif isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < 1e19:
                times = entry.get("times")
                ms = [float(x) for x in times] if isinstance(times, list) and times else [float(t)]
                rec.update(status=Status.OK.value, samples_us=[round(x * 1e3, 4) for x in ms if x > 0])
                if not rec["samples_us"]:
                    rec.update(status=Status.LAUNCH_ERROR.value, reason=f"no positive time ({t!r})")
            else:  # old caches wrote 1e20 for failed configs
                rec.update(status=Status.LAUNCH_ERROR.value, reason=f"recorded as failed (time {t!r})")
            measurements.append(rec)
        kernel = str(doc.get("kernel_name", "unknown"))
        out = {
            "format": FORMAT,
            "version": 1,
            "recorded": str(_first_timestamp(doc["cache"].values()) or "unknown"),
            "name": name or kernel,
            "key": {"kernel": kernel, "problem_size": doc.get("problem_size", "unknown"),
                    "objective": doc.get("objective", "time")},
            "device": {"name": str(doc.get("device_name", "unknown")), "arch": arch, "sm_count": 0},
            "versions": {"kernel_tuner_cache_schema": str(doc.get("schema_version", "unknown"))},
            "space": {"params": params, "invalid_configs": invalid, "imported_from": "kernel_tuner_cache"},
            "note": f"imported from the Kernel Tuner cache {Path(path).name}",
            "measurements": measurements,
        }
        return cls(out, str(path))

    @classmethod
    def from_t4(
        cls,
        path: str | os.PathLike,
        *,
        name: str | None = None,
        device: str = "unknown",
        arch: str = "unknown",
        params: Mapping[str, Sequence[Any]] | None = None,
    ) -> "Recording":
        """Import a T4 auto-tuning results file (``{"results": [...], "schema_version": ...}``).

        Each result's ``configuration`` is a config, ``times.runtimes`` (milliseconds) its samples
        (``measurements`` named ``time`` when there are none), ``times.compilation`` or
        ``times.compilation_time`` (ms) its compile time. ``invalidity`` maps ``correct`` to OK,
        ``compile``/``runtime``/``correctness``/``timeout`` to the matching failures, and leaves
        ``constraints`` out (invalid configs). A result with ``correctness`` 0 is a mismatch.
        The format names no device and no parameter value lists: pass ``device``/``arch``, and
        ``params`` if the space had values never measured.
        """
        doc = _read_json(path)
        results = doc.get("results") if isinstance(doc, Mapping) else None
        if not isinstance(results, list):
            raise TiletuneError(f"{path}: not a T4 results file (no 'results' list)")
        by_key: dict[str, dict[str, Any]] = {}
        invalid = 0
        for i, r in enumerate(results):
            if not isinstance(r, Mapping) or not isinstance(r.get("configuration"), Mapping):
                raise TiletuneError(f"{path}: result #{i} has no 'configuration' object")
            config = dict(r["configuration"])
            inv = str(r.get("invalidity", "correct"))
            status = _T4_STATUS.get(inv, Status.LAUNCH_ERROR)
            if status is None:
                invalid += 1
                continue
            times = r.get("times") if isinstance(r.get("times"), Mapping) else {}
            ms = [float(x) for x in times.get("runtimes") or [] if isinstance(x, (int, float)) and x > 0]
            if not ms:
                for m in r.get("measurements") or []:
                    if isinstance(m, Mapping) and m.get("name") == "time" and isinstance(m.get("value"), (int, float)):
                        ms = [float(m["value"])] if m["value"] > 0 else []
            corr = r.get("correctness", 1)
            if status is Status.OK and isinstance(corr, (int, float)) and corr == 0:
                status = Status.MISMATCH
            if status is Status.OK and not ms:
                status, inv = Status.LAUNCH_ERROR, "no runtimes recorded"
            comp = times.get("compilation", times.get("compilation_time"))
            rec = {
                "config": config,
                "status": status.value,
                "reason": "" if status is Status.OK else inv,
                "samples_us": [round(x * 1e3, 4) for x in ms] if status is Status.OK else [],
                "compile_s": round(float(comp) / 1e3, 4) if isinstance(comp, (int, float)) else None,
                "order": len(by_key),
            }
            k = canonical_json(config)
            prev = by_key.get(k)
            if prev is None:
                by_key[k] = rec
            elif prev["status"] == Status.OK.value and rec["status"] == Status.OK.value:
                prev["samples_us"].extend(rec["samples_us"])  # a config measured twice: pool the samples
        space: dict[str, Any] = {"invalid_configs": invalid, "imported_from": "t4"}
        if params is not None:
            space["params"] = {str(k): list(v) for k, v in params.items()}
        out = {
            "format": FORMAT,
            "version": 1,
            "recorded": str(_first_timestamp(results) or "unknown"),
            "name": name or Path(path).name.split(".")[0],
            "key": {"t4_file": Path(path).name},
            "device": {"name": device, "arch": arch, "sm_count": 0},
            "versions": {"t4_schema": str(doc.get("schema_version", "unknown"))},
            "space": space,
            "note": f"imported from the T4 results file {Path(path).name}",
            "measurements": list(by_key.values()),
        }
        return cls(out, str(path))


class RecordedConfigs:
    """Constraint of a recorded space: true for the configurations the recording holds.

    Its ``digest`` (a hash of the recorded configs) enters :attr:`Space.hash`, so two recordings
    with different config sets make spaces with different hashes.
    """

    def __init__(self, names: Sequence[str], configs: Sequence[Mapping[str, Any]]) -> None:
        self.names = tuple(names)
        keys = set()
        for c in configs:
            try:
                keys.add(tuple((type(c[n]) is bool, c[n]) for n in self.names))
            except KeyError:
                continue  # a config over other parameters never matches
        self._keys = frozenset(keys)
        self.digest = stable_hash(sorted(canonical_json(dict(c)) for c in configs))
        self.count = len(self._keys)

    def __call__(self, cfg: Config) -> bool:
        return tuple((type(cfg[n]) is bool, cfg[n]) for n in self.names) in self._keys


def load_any(path: str | os.PathLike, *, arch: str = "unknown", device: str = "unknown") -> Recording:
    """Load a tiletune recording, a Kernel Tuner cache file or a T4 results file (sniffed).

    ``arch`` (both importers) and ``device`` (T4, which names no device) describe where an
    imported file was measured; a tiletune recording carries its own.
    """
    doc = _read_json(path, allow_open_kt_cache=True)
    if isinstance(doc, Mapping):
        if doc.get("format") == FORMAT:
            return Recording(doc, str(path))
        if isinstance(doc.get("cache"), Mapping) and "tune_params" in doc:
            return Recording.from_kernel_tuner_cache(path, arch=arch)
        if isinstance(doc.get("results"), list):
            return Recording.from_t4(path, arch=arch, device=device)
    raise TiletuneError(
        f"{path}: not a tiletune recording, a Kernel Tuner cache file or a T4 results file"
    )


def _read_json(path: str | os.PathLike, allow_open_kt_cache: bool = False) -> Any:
    """JSON from a plain or gzip file. Kernel Tuner leaves caches unterminated while tuning runs."""
    try:
        raw = Path(path).read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise TiletuneError(f"{path}: cannot read ({type(exc).__name__}: {exc})") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        if allow_open_kt_cache and '"cache"' in text:
            body = text.rstrip().rstrip(",")
            for tail in ("}}", "}", ""):
                try:
                    return json.loads(body + tail)
                except ValueError:
                    continue
        raise TiletuneError(f"{path}: not valid JSON ({exc})") from exc


def _kt_config(
    ckey: str, entry: Mapping[str, Any], keys: Sequence[str], params: Mapping[str, Sequence[Any]], path: Any
) -> dict[str, Any]:
    """The config of a Kernel Tuner cache entry: its parameter fields, else parsed from its key."""
    if all(k in entry for k in keys):
        return {k: entry[k] for k in keys}
    parts = ckey.split(",")
    if len(parts) != len(keys):
        raise TiletuneError(f"{path}: cache key {ckey!r} does not have {len(keys)} values ({', '.join(keys)})")
    out: dict[str, Any] = {}
    for k, text in zip(keys, parts):
        match = [v for v in params.get(k, ()) if str(v) == text]
        if not match:
            raise TiletuneError(f"{path}: cache key {ckey!r}: {text!r} is not a value of {k!r}")
        out[k] = match[0]
    return out


def _first_timestamp(entries: Any) -> str | None:
    for e in entries:
        if isinstance(e, Mapping) and e.get("timestamp"):
            return str(e["timestamp"])
    return None


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
