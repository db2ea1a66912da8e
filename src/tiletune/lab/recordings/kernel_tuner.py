"""Import of Kernel Tuner's JSON cache files as tiletune recording documents.

:func:`read_cache` turns a cache file into a ``tiletune-recording`` document (:func:`cache_document`
does it for an already parsed file); :meth:`tiletune.lab.recordings.Recording.from_kernel_tuner_cache`
loads it as a :class:`Recording`.

Validation: every field the import uses is checked and a bad one raises
:class:`~tiletune.errors.InvalidRecording` naming it (``cache["32,1"].times[2]: expected a finite
positive number, got "abc"``). A cache entry's ``time`` is a Kernel Tuner error string (a failed
config: normal in a cache, imported as a failure), a number of milliseconds > 0, or a number >= 1e19
(old caches wrote 1e20 for a failed config: imported as a failure). ``times`` (when the ``time`` is
a time) is a list of milliseconds > 0 (an empty list means "use ``time``"); ``compile_time`` a number
of milliseconds >= 0 or null. Kernel times of 0 are refused: no kernel runs in zero time.

Both times are kept: ``times`` become each config's samples (``samples_us``) and ``time`` its
``time_us``; the document's ``truth`` is ``"time"``, the value Kernel Tuner scores (its ``time`` is the
mean of ``times`` for the default objective, or whatever its ``objective`` made it), so a search scored
on the import agrees with Kernel Tuner's on the same cache. ``truth_us(cfg, "times-median")`` gives the
median of the samples instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from tiletune.errors import InvalidRecording
from tiletune.records import Status
from tiletune import jsonio as _io
from tiletune.jsonio import Problem, as_config, as_list, as_object, as_scalar, as_str, as_time, as_times, join, need, opt_str
from tiletune.lab.recordings.header import headed

#: Kernel Tuner's error markers (the ``time`` of a cache entry) and what they become here.
#: ``InvalidConfig`` marks a config that breaks the space's restrictions: not part of the space.
#: Any other string is imported as a launch error with the string as its reason.
_KT_ERRORS: dict[str, Status | None] = {
    "InvalidConfig": None,
    "CompilationFailedConfig": Status.COMPILE_ERROR,
    "RuntimeFailedConfig": Status.LAUNCH_ERROR,
}

#: A ``time`` at or above this marks a failed config (old caches wrote 1e20).
_OLD_FAILURE_MARK = 1e19
#: Milliseconds must be below this (:data:`tiletune.jsonio.MAX_TIME_US`).
_MAX_MS = _io.MAX_TIME_US / 1e3


def is_cache(doc: Any) -> bool:
    """Whether a JSON document looks like a Kernel Tuner cache file (it has ``cache`` and ``tune_params``)."""
    return isinstance(doc, Mapping) and "cache" in doc and "tune_params" in doc


def read_cache(path: str | os.PathLike, *, name: str | None = None, arch: str = "unknown") -> dict[str, Any]:
    """The recording document of a Kernel Tuner JSON cache file (also an unterminated one).

    ``time`` and ``times`` (milliseconds) become the samples in microseconds, ``compile_time``
    (ms) the compile seconds. ``CompilationFailedConfig`` becomes a compile error,
    ``RuntimeFailedConfig`` a launch error; ``InvalidConfig`` entries (restriction failures)
    are left out, so they are invalid in :meth:`Recording.space_from_params`. Device and kernel
    names come from the file (``"unknown"`` when absent); the architecture from ``arch``.
    Raises :class:`~tiletune.errors.InvalidRecording` naming the file and the field.
    """
    try:
        doc = _io.read_json(path, allow_open_kt_cache=True)
    except Problem as p:
        raise InvalidRecording(str(path), p.problem, p.field) from None
    return cache_document(doc, path, name=name, arch=arch)


def cache_document(
    doc: Any, path: str | os.PathLike, *, name: str | None = None, arch: str = "unknown"
) -> dict[str, Any]:
    """:func:`read_cache` of an already parsed file (``path`` names it in messages)."""
    try:
        return _document(doc, path, name, arch)
    except Problem as p:
        raise InvalidRecording(str(path), p.problem, p.field) from None


def _document(doc: Any, path: str | os.PathLike, name: str | None, arch: str) -> dict[str, Any]:
    top = as_object(doc, "document")
    if "cache" not in top:
        raise Problem("not a Kernel Tuner cache file (no 'cache' object)")
    cache = as_object(top["cache"], "cache")
    raw_params = as_object(need(top, "tune_params", "document"), "tune_params", nonempty=True)
    tune_params: dict[str, list[Any]] = {}
    for k, values in raw_params.items():
        where = join("tune_params", k)
        vs = as_list(values, where, nonempty=True, what="list of values")
        tune_params[k] = [as_scalar(v, join(where, i)) for i, v in enumerate(vs)]
    if "tune_params_keys" in top:
        keys = [as_str(k, f"tune_params_keys[{i}]") for i, k in enumerate(
            as_list(top["tune_params_keys"], "tune_params_keys", nonempty=True, what="list of parameter names"))]
        for i, k in enumerate(keys):
            if k not in tune_params:
                raise Problem(f"{_io.show(k)} is not a key of tune_params", f"tune_params_keys[{i}]")
    else:
        keys = list(tune_params)
    params = {k: tune_params[k] for k in keys}
    measurements: list[dict[str, Any]] = []
    invalid = 0
    recorded: str | None = None
    for i, (ckey, raw_entry) in enumerate(cache.items()):
        where = join("cache", ckey)
        entry = as_object(raw_entry, where)
        stamp = entry.get("timestamp")  # absent or null: not known
        if stamp is not None:
            recorded = recorded or as_str(stamp, join(where, "timestamp")) or None
        config = _kt_config(ckey, entry, keys, params, where)
        t = need(entry, "time", where)
        compile_ms = entry.get("compile_time")
        compile_s = None
        if compile_ms is not None:
            compile_s = round(as_time(compile_ms, join(where, "compile_time"), limit=_MAX_MS, positive=False) / 1e3, 4)
        rec: dict[str, Any] = {"config": config, "order": i, "compile_s": compile_s, "samples_us": []}
        if isinstance(t, str):
            status = _KT_ERRORS.get(t, Status.LAUNCH_ERROR)
            if status is None:
                invalid += 1
                continue
            rec.update(status=status.value, reason=t)
        elif _io.is_number(t) and t >= _OLD_FAILURE_MARK:  # old caches wrote 1e20 for failed configs
            rec.update(status=Status.LAUNCH_ERROR.value, reason=f"recorded as failed (time {t!r})")
        else:
            if not _io.is_number(t) or t <= 0:
                raise Problem("expected a finite positive number (milliseconds) or a Kernel Tuner error string, "
                              f"got {_io.show(t)}", join(where, "time"))
            ms = [as_time(t, join(where, "time"), limit=_MAX_MS)]
            if "times" in entry:
                twhere = join(where, "times")
                times = as_list(entry["times"], twhere, what="list of times")
                if times:
                    ms = as_times(times, twhere, limit=_MAX_MS)
            rec.update(status=Status.OK.value, reason="", samples_us=[_us(x) for x in ms],
                       time_us=_us(as_time(t, join(where, "time"), limit=_MAX_MS)))
        measurements.append(rec)
    kernel = opt_str(top, "kernel_name", "", "unknown")
    return headed(
        recorded=recorded or "unknown",
        name=name or kernel,
        key={"kernel": kernel, "problem_size": top.get("problem_size", "unknown"),
                "objective": opt_str(top, "objective", "", "time")},
        device={"name": opt_str(top, "device_name", "", "unknown"), "arch": arch, "sm_count": 0},
        versions={"kernel_tuner_cache_schema": opt_str(top, "schema_version", "", "unknown")},
        space={"params": params, "invalid_configs": invalid, "imported_from": "kernel_tuner_cache"},
        note=f"imported from the Kernel Tuner cache {Path(path).name}",
        truth="time",
        measurements=measurements,
    )


def _us(ms: float) -> float:
    """Milliseconds to microseconds, rounded to 0.1 ns (never to 0)."""
    us = round(ms * 1e3, 4)
    return us if us > 0 else ms * 1e3


def _kt_config(
    ckey: str, entry: Mapping[str, Any], keys: Sequence[str], params: Mapping[str, Sequence[Any]], where: str
) -> dict[str, Any]:
    """The config of a Kernel Tuner cache entry: its parameter fields, else parsed from its key."""
    if all(k in entry for k in keys):
        return as_config({k: entry[k] for k in keys}, where)
    parts = ckey.split(",")
    if len(parts) != len(keys):
        raise Problem(f"the cache key does not have {len(keys)} values ({', '.join(keys)})", where)
    out: dict[str, Any] = {}
    for k, text in zip(keys, parts):
        match = [v for v in params.get(k, ()) if str(v) == text]
        if not match:
            raise Problem(f"{text!r} in the cache key is not a value of {k!r}", where)
        out[k] = match[0]
    return out
