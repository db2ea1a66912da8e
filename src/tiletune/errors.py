"""Exceptions raised by tiletune. All derive from :class:`TiletuneError`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .records import Measurement


class TiletuneError(Exception):
    """Base class of every tiletune error."""


class SpaceError(TiletuneError, ValueError):
    """A search space or configuration is invalid (raised at definition time where possible)."""


class DatabaseError(TiletuneError):
    """The tuning database cannot be read or written, or an import file is malformed."""


class NoBackendError(TiletuneError, RuntimeError):
    """No backend can run here (for example cuTile or a GPU is missing)."""


class AllCandidatesFailed(TiletuneError, RuntimeError):
    """Every candidate of a tuning session failed; ``measurements`` holds each reason."""

    def __init__(self, name: str, measurements: "Sequence[Measurement]"):
        self.measurements = tuple(measurements)
        lines = [f"tiletune: every candidate of {name!r} failed ({len(self.measurements)} tried):"]
        for m in self.measurements:
            reason = m.reason.strip().splitlines()
            lines.append(f"  {dict(m.config)}: {m.status.value}: {reason[0][:160] if reason else ''}")
        super().__init__("\n".join(lines))
