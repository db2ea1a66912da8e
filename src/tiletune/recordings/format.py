"""The tiletune recording document (``tiletune-recording`` JSON, gzip optional).

A recording holds, for one op and problem key on one device, every measured config with its
samples, compile time and failure reason. :func:`save_recording` writes one, :class:`Recording`
loads and validates one, :func:`load_any` also accepts the public formats the importers know
(:mod:`.kernel_tuner`, :mod:`.t4`). A recording knows the space it was measured over:
:meth:`Recording.space_from_params` builds a tiletune :class:`Space` whose valid configurations are
exactly the recorded ones (:class:`RecordedConfigs`), so a search over it never proposes a config
the recording cannot answer.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import TiletuneError
from ..records import DeviceInfo, Measurement, canonical_json, stable_hash
from ..space import Config, Space
from ._io import read_json

FORMAT = "tiletune-recording"

__all__ = ["FORMAT", "RecordedConfigs", "Recording", "load_any", "save_recording"]


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
        """Import a Kernel Tuner JSON cache file: see :func:`tiletune.recordings.kernel_tuner.read_cache`."""
        from .kernel_tuner import read_cache

        return cls(read_cache(path, name=name, arch=arch), str(path))

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
        """Import a T4 auto-tuning results file: see :func:`tiletune.recordings.t4.read_results`."""
        from .t4 import read_results

        return cls(read_results(path, name=name, device=device, arch=arch, params=params), str(path))


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
    from . import kernel_tuner, t4

    doc = read_json(path, allow_open_kt_cache=True)
    if isinstance(doc, Mapping):
        if doc.get("format") == FORMAT:
            return Recording(doc, str(path))
        if kernel_tuner.is_cache(doc):
            return Recording.from_kernel_tuner_cache(path, arch=arch)
        if t4.is_results(doc):
            return Recording.from_t4(path, arch=arch, device=device)
    raise TiletuneError(
        f"{path}: not a tiletune recording, a Kernel Tuner cache file or a T4 results file"
    )
