"""Import of T4 auto-tuning results files as tiletune recording documents.

:func:`read_results` turns a results file into a ``tiletune-recording`` document
(:func:`results_document` does it for an already parsed file);
:meth:`tiletune.lab.recordings.Recording.from_t4` loads it as a :class:`Recording`.

Validation: every field the import uses is checked and a bad one raises
:class:`~tiletune.errors.InvalidRecording` naming it (``results[3].times.runtimes[2]: expected a
finite positive number, got "abc"``). The runtimes of a correct result (and its ``time``
measurement, used when it has no runtimes) must be milliseconds > 0; the compile time milliseconds
>= 0 or null. The runtimes and measurements of a failed result are not imported and not checked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from tiletune.errors import InvalidRecording
from tiletune.records import Status, canonical_json
from tiletune import jsonio as _io
from tiletune.jsonio import Problem, as_config, as_list, as_object, as_str, as_time, as_times, join, opt_str
from tiletune.lab.recordings.header import headed

#: T4 ``invalidity`` values and what they become (``constraints``: not part of the space).
#: Any other value is imported as a launch error with the value as its reason.
_T4_STATUS: dict[str, Status | None] = {
    "correct": Status.OK,
    "constraints": None,
    "compile": Status.COMPILE_ERROR,
    "runtime": Status.LAUNCH_ERROR,
    "correctness": Status.MISMATCH,
    "timeout": Status.TIMEOUT,
}

#: Milliseconds must be below this (:data:`tiletune.jsonio.MAX_TIME_US`).
_MAX_MS = _io.MAX_TIME_US / 1e3


def is_results(doc: Any) -> bool:
    """Whether a JSON document looks like a T4 results file (it has ``results``)."""
    return isinstance(doc, Mapping) and "results" in doc


def read_results(
    path: str | os.PathLike,
    *,
    name: str | None = None,
    device: str = "unknown",
    arch: str = "unknown",
    params: Mapping[str, Sequence[Any]] | None = None,
) -> dict[str, Any]:
    """The recording document of a T4 results file (``{"results": [...], "schema_version": ...}``).

    Each result's ``configuration`` is a config, ``times.runtimes`` (milliseconds) its samples
    (``measurements`` named ``time`` when there are none), ``times.compilation`` or
    ``times.compilation_time`` (ms) its compile time. ``invalidity`` maps ``correct`` to OK,
    ``compile``/``runtime``/``correctness``/``timeout`` to the matching failures, and leaves
    ``constraints`` out (invalid configs). A result with ``correctness`` 0 is a mismatch.
    The format names no device and no parameter value lists: pass ``device``/``arch``, and
    ``params`` if the space had values never measured.
    Raises :class:`~tiletune.errors.InvalidRecording` naming the file and the field.
    """
    try:
        doc = _io.read_json(path)
    except Problem as p:
        raise InvalidRecording(str(path), p.problem, p.field) from None
    return results_document(doc, path, name=name, device=device, arch=arch, params=params)


def results_document(
    doc: Any,
    path: str | os.PathLike,
    *,
    name: str | None = None,
    device: str = "unknown",
    arch: str = "unknown",
    params: Mapping[str, Sequence[Any]] | None = None,
) -> dict[str, Any]:
    """:func:`read_results` of an already parsed file (``path`` names it in messages)."""
    try:
        return _document(doc, path, name, device, arch, params)
    except Problem as p:
        raise InvalidRecording(str(path), p.problem, p.field) from None


def _document(
    doc: Any, path: str | os.PathLike, name: str | None, device: str, arch: str,
    params: Mapping[str, Sequence[Any]] | None,
) -> dict[str, Any]:
    top = as_object(doc, "document")
    if "results" not in top:
        raise Problem("not a T4 results file (no 'results' list)")
    results = as_list(top["results"], "results")
    by_key: dict[str, dict[str, Any]] = {}
    invalid = 0
    recorded: str | None = None
    for i, raw in enumerate(results):
        where = f"results[{i}]"
        r = as_object(raw, where)
        if "configuration" not in r:
            raise Problem("missing field 'configuration'", where)
        config = as_config(r["configuration"], join(where, "configuration"))
        stamp = r.get("timestamp")  # absent or null: not known
        if stamp is not None:
            recorded = recorded or as_str(stamp, join(where, "timestamp")) or None
        inv = opt_str(r, "invalidity", where, "correct")
        status = _T4_STATUS.get(inv, Status.LAUNCH_ERROR)
        if status is None:
            invalid += 1
            continue
        times = as_object(r["times"], join(where, "times")) if "times" in r else {}
        twhere = join(where, "times")
        comp_key = "compilation" if "compilation" in times else "compilation_time"
        comp = times.get(comp_key)
        compile_s = None
        if comp is not None:
            compile_s = round(as_time(comp, join(twhere, comp_key), limit=_MAX_MS, positive=False) / 1e3, 4)
        corr = r.get("correctness", 1)
        if not _io.is_number(corr):
            raise Problem(f"expected a number, got {_io.show(corr)}", join(where, "correctness"))
        if status is Status.OK and corr == 0:
            status = Status.MISMATCH
        ms: list[float] = []
        if status is Status.OK:
            rwhere = join(twhere, "runtimes")
            runtimes = as_list(times["runtimes"], rwhere) if "runtimes" in times else []
            ms = as_times(runtimes, rwhere, limit=_MAX_MS)
            if not ms and "measurements" in r:
                mwhere = join(where, "measurements")
                for j, m in enumerate(as_list(r["measurements"], mwhere)):
                    m = as_object(m, join(mwhere, j))
                    if m.get("name") == "time":
                        ms = [as_time(m.get("value"), join(join(mwhere, j), "value"), limit=_MAX_MS)]
                        break
            if not ms:
                status, inv = Status.LAUNCH_ERROR, "no runtimes recorded"
        rec = {
            "config": config,
            "status": status.value,
            "reason": "" if status is Status.OK else inv,
            "samples_us": [_us(x) for x in ms] if status is Status.OK else [],
            "compile_s": compile_s,
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
    return headed(
        recorded=recorded or "unknown",
        name=name or Path(path).name.split(".")[0],
        key={"t4_file": Path(path).name},
        device={"name": device, "arch": arch, "sm_count": 0},
        versions={"t4_schema": opt_str(top, "schema_version", "", "unknown")},
        space=space,
        note=f"imported from the T4 results file {Path(path).name}",
        measurements=list(by_key.values()),
    )


def _us(ms: float) -> float:
    """Milliseconds to microseconds, rounded to 0.1 ns (never to 0)."""
    us = round(ms * 1e3, 4)
    return us if us > 0 else ms * 1e3
