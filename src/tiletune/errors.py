"""Exceptions raised by tiletune. All derive from :class:`TiletuneError`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from tiletune.records import Measurement


class TiletuneError(Exception):
    """Base class of every tiletune error."""


class SpaceError(TiletuneError, ValueError):
    """A search space or configuration is invalid (raised at definition time where possible)."""


class DatabaseError(TiletuneError):
    """The tuning database cannot be read or written, or an import file is malformed.

    The subclasses below name the cause of a database that cannot be used; each message has the form
    ``tuning database <path>: <what is wrong>; <what to do>`` and the parts are kept as attributes
    (``path``, ``problem``, ``fix``). A tuned op never raises them: it goes on without storing its
    results and says why once per process and database path (a :class:`DatabaseWarning`).
    """

    path: str | None = None
    problem: str | None = None
    fix: str | None = None


class _DatabaseProblem(DatabaseError):
    """Base of the precise database errors: ``tuning database <path>: <problem>; <fix>``."""

    def __init__(self, path: str, problem: str, fix: str) -> None:
        super().__init__(f"tuning database {path}: {problem}; {fix}")
        self.path, self.problem, self.fix = path, problem, fix

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.problem, self.fix))


class DatabaseUnavailable(_DatabaseProblem):
    """The database cannot be opened or written: its folder is missing and cannot be created, a
    directory stands at its path, permission is denied, the disk is full, an I/O error."""


class DatabaseReadOnly(DatabaseUnavailable):
    """The database can be read but not written (the file or its folder is not writable).
    :class:`~tiletune.store.TuningDB` opens it read-only: lookups work, writes raise this."""


class DatabaseLocked(DatabaseUnavailable):
    """Another connection held the database's lock for longer than the busy timeout."""


class DatabaseCorrupt(_DatabaseProblem):
    """The file is not an SQLite database, or a damaged one. Nothing is written to it."""


class ForeignDatabase(_DatabaseProblem):
    """An SQLite file of another application (or one marked as tiletune's whose tables are not
    tiletune's). Refused without modifying it."""


class NewerDatabase(_DatabaseProblem):
    """A tiletune database of a newer schema version than this tiletune reads. Refused without
    modifying it."""


class DatabaseWarning(RuntimeWarning):
    """Issued (once per process and database path) when a tuned op cannot use its tuning database,
    or can only read it: the op keeps working and stores nothing. Filter it with
    ``warnings.filterwarnings("ignore", category=tiletune.errors.DatabaseWarning)``."""


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


class InvalidRecording(TiletuneError, ValueError):
    """A recorded-space file (a tiletune recording, a Kernel Tuner cache file or a T4 results file)
    cannot be read or is malformed; nothing was written.

    The message is ``<file>: <field>: <problem>``, or ``<file>: <problem>`` when the problem is the
    whole file (unreadable, too large, not UTF-8, not JSON, nested too deeply, not a known format).
    ``field`` is a path into the document such as ``results[3].times.runtimes[2]`` or
    ``cache["32,1"].times[2]``. The parts are kept as ``file``, ``field`` (or None) and ``problem``.
    """

    def __init__(self, file: str, problem: str, field: str | None = None) -> None:
        super().__init__(f"{file}: {field}: {problem}" if field else f"{file}: {problem}")
        self.file, self.problem, self.field = file, problem, field

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.file, self.problem, self.field))


class InvalidImport(DatabaseError, ValueError):
    """A ``tiletune db import`` file (a :meth:`~tiletune.store.TuningDB.export_json` document) cannot
    be read or is malformed; the database is unchanged.

    The message is ``import file <file>: <field>: <problem>``, or ``import file <file>: <problem>``
    when the problem is the whole file; ``field`` is a path such as
    ``sessions[0].measurements[1].samples_us[2]``. The parts are kept as ``file``, ``field`` (or
    None) and ``problem``.
    """

    def __init__(self, file: str, problem: str, field: str | None = None) -> None:
        super().__init__(f"import file {file}: {field}: {problem}" if field else f"import file {file}: {problem}")
        self.file, self.problem, self.field = file, problem, field

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.file, self.problem, self.field))


class OutputError(TiletuneError):
    """An output file cannot be written: its folder is missing (it is not created), it is a folder,
    it is the input file itself (also through a link), or the write failed. Nothing was written:
    a file already at the path is unchanged. The message is ``cannot write <path>: <problem>``; the
    parts are kept as ``path`` and ``problem``."""

    _prefix = "cannot write"

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{self._prefix} {path}: {problem}")
        self.path, self.problem = path, problem

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.problem))


class ExportError(DatabaseError, OutputError):
    """``tiletune db export`` cannot write its file (see :class:`OutputError`), or the database holds a
    number standard JSON cannot represent (NaN or Infinity, never written by an import). Nothing was
    written. The message is ``cannot write export file <path>: <problem>``."""

    _prefix = "cannot write export file"
