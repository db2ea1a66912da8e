"""Import of T4 auto-tuning results files as tiletune recording documents.

:func:`read_results` turns a results file into a ``tiletune-recording`` document;
:meth:`tiletune.recordings.Recording.from_t4` loads it as a :class:`Recording`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import TiletuneError
from ..records import Status, canonical_json
from ._io import first_timestamp, read_json
from .format import FORMAT

#: T4 ``invalidity`` values and what they become (``constraints``: not part of the space).
_T4_STATUS: dict[str, Status | None] = {
    "correct": Status.OK,
    "constraints": None,
    "compile": Status.COMPILE_ERROR,
    "runtime": Status.LAUNCH_ERROR,
    "correctness": Status.MISMATCH,
    "timeout": Status.TIMEOUT,
}


def is_results(doc: Any) -> bool:
    """Whether a JSON document looks like a T4 results file."""
    return isinstance(doc, Mapping) and isinstance(doc.get("results"), list)


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
    """
    doc = read_json(path)
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
    return {
        "format": FORMAT,
        "version": 1,
        "recorded": str(first_timestamp(results) or "unknown"),
        "name": name or Path(path).name.split(".")[0],
        "key": {"t4_file": Path(path).name},
        "device": {"name": device, "arch": arch, "sm_count": 0},
        "versions": {"t4_schema": str(doc.get("schema_version", "unknown"))},
        "space": space,
        "note": f"imported from the T4 results file {Path(path).name}",
        "measurements": list(by_key.values()),
    }
