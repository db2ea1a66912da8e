"""The wire protocol between the caller and a tuning worker.

Caller -> worker: requests ``{"op", "id", ...}`` serialised with :mod:`tiletune.devices.workers.shipping`
(they carry plans and tensors). Worker -> caller: JSON objects only, so the caller never runs
anything a misbehaving worker sent; every reply is validated here before use, and a reply that does
not fit (garbage, wrong id, wrong types) is a protocol fault that ends that worker.

Replies: ``{"id": n, "ok": true, ...}`` or ``{"id": n, "ok": false, "error": str, "fatal": bool}``.
Asynchronous events carry ``"event"`` instead of ``"id"``: ``compiled`` (a compile result) and
``busy`` (a heartbeat while the request in flight is compiling, e.g. a candidate's first launch that
compiles it again: the caller's watchdog does not count that time) and ``phase`` (a check's kernel was
launched, or has run: :mod:`tiletune.devices.launch_marks`; the caller's watchdog re-arms).
``fatal`` means the worker's CUDA context is unusable (a sticky error) and the worker is exiting.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from tiletune.records import Status

__all__ = ["ProtocolError", "encode_reply", "decode_reply", "Reply", "CompiledEvent", "BusyEvent", "PhaseEvent",
           "candidate_wire", "WORKER_STATS"]

#: Counters a worker reports in its session-end reply (integers), merged into the session's stats.
WORKER_STATS = ("prefetch_hits", "prefetch_misses")

#: the phases a worker may report (those of :data:`tiletune.devices.launch_marks.PHASES`)
_PHASES = ("launched", "ran")

#: Statuses a worker may report for one candidate.
_STATUSES = {s.value: s for s in Status}


class ProtocolError(Exception):
    """A worker sent something that is not a valid reply."""


def encode_reply(msg: Mapping[str, Any]) -> bytes:
    """Worker side: one JSON message."""
    return json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()


@dataclass(frozen=True)
class Reply:
    """A validated reply to request ``id``."""

    id: int
    ok: bool
    body: Mapping[str, Any]
    error: str = ""
    fatal: bool = False


@dataclass(frozen=True)
class CompiledEvent:
    """A compile result streamed by the worker."""

    session: int
    order: int
    status: Status
    seconds: float
    reason: str
    cpu_s: float = 0.0  # CPU seconds the compile used (front end and assembler), 0 when unknown
    assembled: bool | None = None  # tileiras ran for it (no cache answered), None when unknown


@dataclass(frozen=True)
class BusyEvent:
    """A heartbeat: the request in flight is compiling (the watchdog restarts its count)."""

    what: str = "compiling"


@dataclass(frozen=True)
class PhaseEvent:
    """The request in flight (a check) reached ``what``: ``"launched"`` or ``"ran"``."""

    what: str


def _need(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in d:
        raise ProtocolError(f"reply lacks {key!r}: {str(d)[:200]}")
    v = d[key]
    if not isinstance(v, kind) or isinstance(v, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ProtocolError(f"reply field {key!r} has type {type(v).__name__}: {str(d)[:200]}")
    return v


def decode_reply(raw: bytes) -> Reply | CompiledEvent | BusyEvent | PhaseEvent:
    """Caller side: parse and validate one message (raises :class:`ProtocolError`)."""
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"undecodable reply ({exc}): {raw[:80]!r}") from exc
    if not isinstance(d, dict):
        raise ProtocolError(f"reply is not an object: {str(d)[:200]}")
    if "event" in d:
        if d["event"] == "busy":
            return BusyEvent(str(d.get("what", "compiling")))
        if d["event"] == "phase":
            what = d.get("what")
            if what not in _PHASES:
                raise ProtocolError(f"unknown phase {what!r}")
            return PhaseEvent(what)
        if d["event"] != "compiled":
            raise ProtocolError(f"unknown event {d['event']!r}")
        status = _STATUSES.get(_need(d, "status", str))
        if status is None:
            raise ProtocolError(f"unknown status {d['status']!r}")
        seconds = float(_need(d, "seconds", (int, float)))
        if not math.isfinite(seconds) or seconds < 0:
            raise ProtocolError(f"bad compile seconds {seconds!r}")
        return CompiledEvent(
            session=int(_need(d, "session", int)),
            order=int(_need(d, "order", int)),
            status=status,
            seconds=seconds,
            reason=str(d.get("reason", "")),
            cpu_s=_cpu_s(d.get("cpu_s", 0.0)),
            assembled=d.get("assembled") if isinstance(d.get("assembled"), bool) else None,
        )
    rid = _need(d, "id", int)
    ok = _need(d, "ok", bool)
    if ok:
        return Reply(rid, True, d)
    return Reply(rid, False, d, error=str(d.get("error", "unknown worker error")), fatal=bool(d.get("fatal", False)))


def _cpu_s(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ProtocolError(f"bad compile cpu seconds {v!r}")
    return float(v)


def samples_from(reply: Reply, n: int) -> list[float]:
    """The ``samples`` of a sample reply: ``n`` finite, non-negative floats (else ProtocolError)."""
    s = _need(reply.body, "samples", list)
    if len(s) != n:
        raise ProtocolError(f"asked for {n} samples, got {len(s)}")
    out = []
    for x in s:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
            raise ProtocolError(f"bad sample value {x!r}")
        out.append(float(x))
    return out


def status_from(reply: Reply) -> tuple[Status, str]:
    """``(status, reason)`` of a check reply."""
    status = _STATUSES.get(_need(reply.body, "status", str))
    if status is None:
        raise ProtocolError(f"unknown status {reply.body.get('status')!r}")
    return status, str(reply.body.get("reason", ""))


def candidate_wire(order: int, config: Any, is_baseline: bool) -> tuple[int, list[str], list[Any], list[str], bool]:
    """A candidate as plain data: (order, names, values, hint names, is_baseline)."""
    d = config.as_dict() if hasattr(config, "as_dict") else dict(config)
    names = list(d)
    values = [d[n] for n in names]
    hints = sorted(getattr(config, "_hint_names", ()))
    return order, names, values, hints, bool(is_baseline)
