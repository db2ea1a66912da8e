"""The tiletune recording document (``tiletune-recording`` JSON, gzip optional).

A recording holds, for one op and problem key on one device, every measured config with its
samples, compile time and failure reason. :func:`save_recording` writes one, :class:`Recording`
loads and validates one, :func:`load_any` also accepts the public formats the importers know
(:mod:`.kernel_tuner`, :mod:`.t4`). A recording knows the space it was measured over:
:meth:`Recording.space_from_params` builds a tiletune :class:`Space` whose valid configurations are
exactly the recorded ones (:class:`RecordedConfigs`), so a search over it never proposes a config
the recording cannot answer.

**Ground truth.** What a config's recorded time is, when a recording is searched or scored, is named by
the document's ``truth`` field (:data:`TRUTHS`): ``"times-median"`` (the median of its samples, the
default and what tiletune's own recordings hold) or ``"time"`` (a single time per config kept from the
source as ``time_us`` on each measurement: a Kernel Tuner cache's ``time`` field, which Kernel Tuner's
own tuning and simulation mode score, while its ``times`` become the samples). An imported Kernel
Tuner cache keeps both and names ``time`` as its truth; :meth:`Recording.truth_us` reads either.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from tiletune.errors import InvalidRecording, OutputError, TiletuneError
from tiletune.records import DeviceInfo, Measurement, Status, canonical_json, stable_hash
from tiletune.space.spaces import Config, Space
from tiletune import jsonio as _io
from tiletune.jsonio import (
    Problem, as_config, as_int, as_list, as_object, as_scalar, as_str, as_time, as_times, join, need, opt_str,
)
from tiletune.lab.recordings.header import FORMAT, VERSION, headed


__all__ = ["FORMAT", "TRUTHS", "RecordedConfigs", "Recording", "import_recording", "load_any", "save_recording"]

#: The ground truths a recording can name (see the module docstring), and what each means.
TRUTHS: dict[str, str] = {
    "time": "the single time recorded per config (Kernel Tuner's 'time' field, as Kernel Tuner scores it)",
    "times-median": "the median of each config's recorded samples (a Kernel Tuner cache's 'times')",
}

_STATUSES = {s.value: s for s in Status}


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
    recorded: str | None = None,
    sources: Sequence[str | os.PathLike] = (),
    truth: str | None = None,
    times_us: Sequence[float | None] | None = None,
) -> Path:
    """Write a recording (gzip-compressed when the path ends in ``.gz``).

    ``recorded`` is when the measurements were taken (an importer passes the source's date; None:
    now, as ``YYYY-MM-DDTHH:MM:SSZ``). The document is validated as :class:`Recording` validates a
    file before anything is written, and written as standard JSON (no NaN or Infinity) atomically
    (a temporary file in the destination's folder, then :func:`os.replace`). The destination's folder
    must exist and the destination may not be one of ``sources`` (the files it was made from).
    Raises :class:`~tiletune.errors.OutputError` naming the destination (and the field of a value
    that cannot be written); nothing is written then.

    ``truth`` names the recording's ground truth (:data:`TRUTHS`; None: not written, which means
    ``"times-median"``); ``times_us`` (parallel to ``measurements``) the single time of each config that
    ``truth="time"`` scores (None where there is none).
    """
    doc = headed(
        recorded=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) if recorded is None else recorded,
        name=name,
        key=key,
        device=device.as_dict(),
        versions=dict(versions),
        space=dict(space or {}),
        note=note,
        measurements=[_compact(m) for m in measurements],
    )
    if truth is not None:
        doc["truth"] = truth
    if times_us is not None:
        for d, t in zip(doc["measurements"], times_us):
            if t is not None:
                d["time_us"] = _round_positive(t, 4)
    p = Path(path)
    try:
        _io.check_destination(p, sources)
        _validate(doc)
        text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
        data = text.encode()
        if p.suffix == ".gz":
            data = gzip.compress(data, mtime=0)
        _io.write_atomic(p, data, sources)
    except Problem as exc:
        raise OutputError(str(p), str(exc)) from None
    except ValueError:  # NaN or Infinity in a free-form field (key, space): standard JSON has neither
        where = _io.find_non_finite(doc) or "document"
        raise OutputError(str(p), f"{where}: standard JSON cannot represent NaN or Infinity") from None
    except TypeError as exc:  # a value JSON cannot hold
        raise OutputError(str(p), f"not JSON-serialisable: {exc}") from None
    return p


def _round_positive(x: float, digits: int) -> float:
    r = round(x, digits)
    return r if r > 0 else x


def _compact(m: Measurement) -> dict[str, Any]:
    d = m.as_dict()
    d["samples_us"] = [_round_positive(x, 3) for x in m.samples_us]
    if d["compile_s"] is not None:
        d["compile_s"] = round(d["compile_s"], 4)
    return d


def _validate(doc: Any) -> dict[str, Any]:
    """The checked fields of a recording document (raises :class:`Problem` naming the field)."""
    if not isinstance(doc, Mapping):
        raise Problem(f"expected an object, got {_io.show(doc)}", "document")
    fmt, version = doc.get("format"), doc.get("version")
    if fmt != FORMAT or isinstance(version, bool) or version != VERSION:
        raise Problem(f"not a tiletune recording (format {fmt!r}, version {version!r}; "
                      f"this tiletune reads format {FORMAT!r} version {VERSION})")
    dev = as_object(need(doc, "device", "document"), "device")
    device = DeviceInfo(
        name=as_str(need(dev, "name", "device"), "device.name"),
        arch=as_str(need(dev, "arch", "device"), "device.arch"),
        sm_count=as_int(need(dev, "sm_count", "device"), "device.sm_count"),
    )
    versions = dict(as_object(doc.get("versions", {}), "versions"))
    for k, v in versions.items():
        as_scalar(v, join("versions", k))
    space = dict(as_object(doc.get("space", {}), "space"))
    if "params" in space:
        pwhere = "space.params"
        for k, vs in as_object(space["params"], pwhere).items():
            vwhere = join(pwhere, k)
            for i, v in enumerate(as_list(vs, vwhere, nonempty=True, what="list of values")):
                as_scalar(v, join(vwhere, i))
    raw = as_list(need(doc, "measurements", "document"), "measurements")
    measurements = [_measurement(m, f"measurements[{i}]") for i, m in enumerate(raw)]
    times_us: list[float | None] = []
    for i, m in enumerate(raw):
        t = m.get("time_us")  # (m is an object: _measurement checked it)
        times_us.append(None if t is None else as_time(t, join(f"measurements[{i}]", "time_us"), limit=_io.MAX_TIME_US))
    truth = doc.get("truth", "times-median")
    if truth not in TRUTHS:
        raise Problem(f"{_io.show(truth)} is not one of {', '.join(TRUTHS)}", "truth")
    if truth == "time":
        for i, (m, t) in enumerate(zip(measurements, times_us)):
            if t is None and m.status is Status.OK:
                raise Problem("a successful measurement needs a time_us when the recording's truth is 'time'",
                              f"measurements[{i}]")
    return {
        "truth": truth,
        "times_us": times_us,
        "name": opt_str(doc, "name", "", ""),
        "key": doc.get("key"),
        "device": device,
        "versions": versions,
        "recorded": opt_str(doc, "recorded", "", ""),
        "note": opt_str(doc, "note", "", ""),
        "space": space,
        "measurements": measurements,
    }


def _measurement(raw: Any, where: str) -> Measurement:
    m = as_object(raw, where)
    config = as_config(need(m, "config", where), join(where, "config"))
    status = as_str(need(m, "status", where), join(where, "status"))
    if status not in _STATUSES:
        raise Problem(f"{_io.show(status)} is not one of {', '.join(sorted(_STATUSES))}", join(where, "status"))
    swhere = join(where, "samples_us")
    samples = tuple(as_times(m.get("samples_us", []), swhere, limit=_io.MAX_TIME_US))
    compile_s = m.get("compile_s")
    if compile_s is not None:
        compile_s = as_time(compile_s, join(where, "compile_s"), limit=_io.MAX_TIME_US / 1e6, positive=False)
    baseline = m.get("is_baseline", False)
    if not isinstance(baseline, bool):
        raise Problem(f"expected true or false, got {_io.show(baseline)}", join(where, "is_baseline"))
    return Measurement(
        config=config,
        status=_STATUSES[status],
        reason=opt_str(m, "reason", where, ""),
        samples_us=samples,
        compile_s=compile_s,
        order=as_int(m.get("order", 0), join(where, "order")),
        is_baseline=baseline,
    )


class Recording:
    """A loaded recording: configs -> recorded measurement.

    Every field is validated: a malformed document raises :class:`~tiletune.errors.InvalidRecording`
    naming ``source`` and the field (``measurements[3].samples_us[2]: expected a finite positive
    number, got "abc"``). Samples must be microseconds > 0, compile times seconds >= 0 or null,
    ``order`` and ``device.sm_count`` integers >= 0, configs objects of strings, numbers, booleans
    and nulls; ``recorded`` (when the measurements were taken) is kept as written.
    """

    def __init__(self, doc: Mapping[str, Any], source: str = "<memory>") -> None:
        try:
            checked = _validate(doc)
        except Problem as p:
            raise InvalidRecording(source, p.problem, p.field) from None
        self.source = source
        self.name: str = checked["name"]
        self.key = checked["key"]
        self.device: DeviceInfo = checked["device"]
        self.versions: dict[str, Any] = checked["versions"]
        self.recorded: str = checked["recorded"]
        self.note: str = checked["note"]
        self.space: dict[str, Any] = checked["space"]
        self.measurements: list[Measurement] = checked["measurements"]
        self._by_config = {canonical_json(dict(m.config)): m for m in self.measurements}
        #: the recording's ground truth (:data:`TRUTHS`): ``"time"`` or ``"times-median"``
        self.truth: str = checked["truth"]
        #: the single recorded time of each measurement (``time_us``; None where there is none)
        self.times_us: list[float | None] = checked["times_us"]
        self._time_by_config = {canonical_json(dict(m.config)): t
                                for m, t in zip(self.measurements, self.times_us) if t is not None}

    @staticmethod
    def load(path: str | os.PathLike) -> "Recording":
        """Read a recording file (plain or gzip JSON, within the limits of :mod:`tiletune.jsonio`)."""
        try:
            doc = _io.read_json(path)
        except Problem as p:
            raise InvalidRecording(str(path), p.problem, p.field) from None
        return Recording(doc, str(path))

    def get(self, config: Config | Mapping[str, Any]) -> Measurement | None:
        """The recorded measurement of a config, or None."""
        d = config.as_dict() if isinstance(config, Config) else dict(config)
        return self._by_config.get(canonical_json(d))

    @property
    def truths(self) -> tuple[str, ...]:
        """The ground truths this recording can give: ``"times-median"`` always, ``"time"`` when every
        successful measurement has a single recorded time (an imported Kernel Tuner cache)."""
        ok = [t for m, t in zip(self.measurements, self.times_us) if m.status is Status.OK]
        return ("time", "times-median") if ok and all(t is not None for t in ok) else ("times-median",)

    def truth_us(self, config: Config | Mapping[str, Any], truth: str | None = None) -> float | None:
        """The ground-truth time of a config (None: not recorded, failed, or no samples): by ``truth``
        (:data:`TRUTHS`; None: the recording's own :attr:`truth`)."""
        truth = self.truth if truth is None else truth
        if truth not in TRUTHS:
            raise ValueError(f"truth must be one of {', '.join(TRUTHS)}, got {truth!r}")
        m = self.get(config)
        if m is None or m.status is not Status.OK:
            return None
        if truth == "time":
            d = config.as_dict() if isinstance(config, Config) else dict(config)
            return self._time_by_config.get(canonical_json(d))
        return m.median_us if m.samples_us else None

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
        if not params or not self.measurements:
            raise InvalidRecording(self.source, "the recording has no configs to build a space from")
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
            raise InvalidRecording(self.source, f"cannot build a tiletune Space from the recording: {exc}") from exc

    # ------------------------------------------------------------------ importers
    @classmethod
    def from_kernel_tuner_cache(
        cls, path: str | os.PathLike, *, name: str | None = None, arch: str = "unknown"
    ) -> "Recording":
        """Import a Kernel Tuner JSON cache file: see :func:`tiletune.lab.recordings.kernel_tuner.read_cache`."""
        from tiletune.lab.recordings.kernel_tuner import read_cache

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
        """Import a T4 auto-tuning results file: see :func:`tiletune.lab.recordings.t4.read_results`."""
        from tiletune.lab.recordings.t4 import read_results

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
    imported file was measured; a tiletune recording carries its own. The file is read once, within
    the limits of :mod:`tiletune.jsonio`; any problem raises
    :class:`~tiletune.errors.InvalidRecording` naming the file and the field.
    """
    from tiletune.lab.recordings import kernel_tuner, t4

    try:
        doc = _io.read_json(path, allow_open_kt_cache=True)
    except Problem as p:
        raise InvalidRecording(str(path), p.problem, p.field) from None
    if not isinstance(doc, Mapping):
        raise InvalidRecording(str(path), f"expected an object, got {_io.show(doc)}", "document")
    if "format" in doc:
        return Recording(doc, str(path))
    if kernel_tuner.is_cache(doc):
        return Recording(kernel_tuner.cache_document(doc, path, arch=arch), str(path))
    if t4.is_results(doc):
        return Recording(t4.results_document(doc, path, arch=arch, device=device), str(path))
    raise InvalidRecording(str(path), "not a tiletune recording, a Kernel Tuner cache file or a T4 results file")


def import_recording(
    src: str | os.PathLike,
    dest: str | os.PathLike,
    *,
    arch: str = "unknown",
    device: str = "unknown",
) -> Recording:
    """Convert a recorded space (:func:`load_any`) to a tiletune recording at ``dest``; return it.

    What ``tiletune recording import`` does. The destination is checked first (its folder must
    exist; it may not be ``src``, also through a link: :class:`~tiletune.errors.OutputError`), then
    the source is read and validated completely and must make a space
    (:class:`~tiletune.errors.InvalidRecording`), and only then is ``dest`` written, atomically. The
    source's date (``recorded``: a tiletune recording's own, the first timestamp of a Kernel Tuner
    cache or T4 file, ``"unknown"`` without one) is kept.
    """
    try:
        _io.check_destination(dest, [src])
    except Problem as p:
        raise OutputError(str(dest), p.problem) from None
    rec = load_any(src, arch=arch, device=device)
    rec.space_from_params()  # it must make a space
    save_recording(dest, name=rec.name, key=rec.key, device=rec.device, versions=rec.versions,
                   measurements=rec.measurements, space=rec.space, note=rec.note, recorded=rec.recorded,
                   sources=[src], truth=rec.truth if rec.truth != "times-median" else None,
                   times_us=rec.times_us if any(t is not None for t in rec.times_us) else None)
    return rec
