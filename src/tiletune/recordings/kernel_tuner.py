"""Import of Kernel Tuner's JSON cache files as tiletune recording documents.

:func:`read_cache` turns a cache file into a ``tiletune-recording`` document;
:meth:`tiletune.recordings.Recording.from_kernel_tuner_cache` loads it as a :class:`Recording`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import TiletuneError
from ..records import Status
from ._io import first_timestamp, read_json
from .format import FORMAT

#: Kernel Tuner's error markers (the ``time`` of a cache entry) and what they become here.
#: ``InvalidConfig`` marks a config that breaks the space's restrictions: not part of the space.
_KT_ERRORS: dict[str, Status | None] = {
    "InvalidConfig": None,
    "CompilationFailedConfig": Status.COMPILE_ERROR,
    "RuntimeFailedConfig": Status.LAUNCH_ERROR,
}


def is_cache(doc: Any) -> bool:
    """Whether a JSON document looks like a Kernel Tuner cache file."""
    return isinstance(doc, Mapping) and isinstance(doc.get("cache"), Mapping) and "tune_params" in doc


def read_cache(path: str | os.PathLike, *, name: str | None = None, arch: str = "unknown") -> dict[str, Any]:
    """The recording document of a Kernel Tuner JSON cache file (also an unterminated one).

    ``time`` and ``times`` (milliseconds) become the samples in microseconds, ``compile_time``
    (ms) the compile seconds. ``CompilationFailedConfig`` becomes a compile error,
    ``RuntimeFailedConfig`` a launch error; ``InvalidConfig`` entries (restriction failures)
    are left out, so they are invalid in :meth:`Recording.space_from_params`. Device and kernel
    names come from the file (``"unknown"`` when absent); the architecture from ``arch``.
    """
    doc = read_json(path, allow_open_kt_cache=True)
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
    return {
        "format": FORMAT,
        "version": 1,
        "recorded": str(first_timestamp(doc["cache"].values()) or "unknown"),
        "name": name or kernel,
        "key": {"kernel": kernel, "problem_size": doc.get("problem_size", "unknown"),
                "objective": doc.get("objective", "time")},
        "device": {"name": str(doc.get("device_name", "unknown")), "arch": arch, "sm_count": 0},
        "versions": {"kernel_tuner_cache_schema": str(doc.get("schema_version", "unknown"))},
        "space": {"params": params, "invalid_configs": invalid, "imported_from": "kernel_tuner_cache"},
        "note": f"imported from the Kernel Tuner cache {Path(path).name}",
        "measurements": measurements,
    }


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
