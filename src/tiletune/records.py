"""Immutable records shared by the tuner, the backends and the tuning database.

Everything here is plain data (frozen dataclasses of JSON-friendly values), so it can be stored in
SQLite, exported to JSON and compared in tests. Nothing is pickled.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the stable text form used for hashing and storage."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, (tuple, frozenset, set)):
        return list(value)
    raise TypeError(f"value of type {type(value).__name__} is not JSON serialisable: {value!r}")


def stable_hash(value: Any, length: int = 16) -> str:
    """A hex SHA-256 prefix of the canonical JSON of ``value``; identical across processes."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:length]


def config_hash(config: Mapping[str, Any]) -> str:
    """The stable hash of a configuration's ``name -> value`` mapping (a Config or a plain dict)."""
    return stable_hash(dict(config))


class Status(str, Enum):
    """Outcome of one candidate configuration."""

    OK = "ok"
    COMPILE_ERROR = "compile_error"
    LAUNCH_ERROR = "launch_error"
    MISMATCH = "mismatch"
    TIMEOUT = "timeout"

    @property
    def failed(self) -> bool:
        return self is not Status.OK


@dataclass(frozen=True)
class DeviceInfo:
    """The GPU a measurement belongs to."""

    name: str
    arch: str  # "sm_90"
    sm_count: int

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arch": self.arch, "sm_count": self.sm_count}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "DeviceInfo":
        return DeviceInfo(name=str(d["name"]), arch=str(d["arch"]), sm_count=int(d["sm_count"]))


@dataclass(frozen=True)
class TuningIdentity:
    """Everything a tuning result depends on. Two runs with equal identities may share results.

    ``key`` and ``versions`` are canonical JSON texts so the identity is hashable and storable.
    """

    kernel_id: str  # hash of the kernel's and the launch plan's source
    space_hash: str  # Space.hash
    key: str  # canonical JSON of the problem key
    device: DeviceInfo
    versions: str  # canonical JSON of {"cuda_tile": ..., "tileiras": ..., "driver": ...}
    name: str = ""  # human-readable op name, informational (not part of equality of stored rows)

    @property
    def digest(self) -> str:
        return stable_hash(
            [self.kernel_id, self.space_hash, self.key, self.device.as_dict(), self.versions], 32
        )

    def as_dict(self) -> dict[str, Any]:
        """The identity as the JSON object of a database export (``identity`` of a session)."""
        return {"kernel_id": self.kernel_id, "space_hash": self.space_hash, "key": self.key,
                "device": self.device.as_dict(), "versions": self.versions, "name": self.name}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "TuningIdentity":
        return TuningIdentity(kernel_id=str(d["kernel_id"]), space_hash=str(d["space_hash"]), key=str(d["key"]),
                              device=DeviceInfo.from_dict(d["device"]), versions=str(d["versions"]),
                              name=str(d.get("name", "")))


@dataclass(frozen=True)
class Measurement:
    """One measured (or failed) candidate: the unit stored in the tuning database."""

    config: Mapping[str, Any]  # parameter name -> value
    status: Status
    reason: str = ""
    samples_us: tuple[float, ...] = ()
    compile_s: float | None = None
    order: int = 0  # position in candidate order (baseline is 0)
    is_baseline: bool = False

    @property
    def config_hash(self) -> str:
        return config_hash(self.config)

    @property
    def median_us(self) -> float | None:
        if not self.samples_us:
            return None
        s = sorted(self.samples_us)
        n = len(s)
        return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": dict(self.config),
            "status": self.status.value,
            "reason": self.reason,
            "samples_us": list(self.samples_us),
            "compile_s": self.compile_s,
            "order": self.order,
            "is_baseline": self.is_baseline,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Measurement":
        return Measurement(
            config=dict(d["config"]),
            status=Status(d["status"]),
            reason=str(d.get("reason", "")),
            samples_us=tuple(float(x) for x in d.get("samples_us", ())),
            compile_s=None if d.get("compile_s") is None else float(d["compile_s"]),
            order=int(d.get("order", 0)),
            is_baseline=bool(d.get("is_baseline", False)),
        )


@dataclass(frozen=True)
class TuneResult:
    """What one tuning session produced."""

    identity: TuningIdentity
    winner: Mapping[str, Any]  # winning config values
    winner_median_us: float
    measurements: tuple[Measurement, ...]
    tied: tuple[Mapping[str, Any], ...] = ()  # configs inside the winner's noise band
    wall_s: float = 0.0
    from_database: bool = False
    #: Counters of the session: samples, strategy, evaluations, ...; ``phases``: where the time went
    #: (``wall_s`` = ``worker_start_s + compile_s + check_s + timing_s + idle_s``, with
    #: ``compile_wall_s`` and ``compile_cpu_s`` besides; see ``tiletune.engine.tuner.PhaseTimer``);
    #: a worker session adds ``worker_restarts``, ``spares_used``, ``spares_max``, ``reap_s`` and
    #: ``faults`` (each with ``waited_s``, ``lost_s``, ``spare``, ``spare_wait_s``, ``start_s``, ``open_s``,
    #: ``reap_wait_s``; see ``tiletune.devices.workers.session``); a key tuned on a call adds ``miss_s``
    #: (the miss's start to the chain's answer), ``store_s``, ``install_s`` and ``first_launch_s``.
    stats: Mapping[str, Any] = field(default_factory=dict)

    @property
    def failures(self) -> tuple[Measurement, ...]:
        return tuple(m for m in self.measurements if m.status.failed)

    @property
    def successes(self) -> tuple[Measurement, ...]:
        return tuple(m for m in self.measurements if not m.status.failed)

    def summary(self, top: int = 8) -> str:
        """A short human-readable table of the result."""
        ok = sorted(self.successes, key=lambda m: (m.median_us or float("inf"), m.order))
        lines = [
            f"{len(ok)} ok, {len(self.failures)} failed, winner {dict(self.winner)} "
            f"at {self.winner_median_us:.2f} us"
            + (" (from database)" if self.from_database else f" in {self.wall_s:.2f} s")
        ]
        for m in ok[:top]:
            mark = "*" if dict(m.config) == dict(self.winner) else " "
            lines.append(f" {mark} {dict(m.config)}: {m.median_us:.2f} us ({len(m.samples_us)} samples)")
        if len(ok) > top:
            lines.append(f"   ... {len(ok) - top} more")
        for m in self.failures[:top]:
            first = m.reason.strip().splitlines()[0] if m.reason.strip() else ""
            lines.append(f" x {dict(m.config)}: {m.status.value}: {first[:100]}")
        return "\n".join(lines)
