"""The persistent tuning database: SQLite (stdlib :mod:`sqlite3`), no server, no pickle.

One file holds every tuning session ever recorded on a machine:

* ``sessions``: one row per tuning session (its identity, its winner, how many measurements it has);
* ``measurements``: one row per measured (or failed) candidate of a session;
* ``winners``: one row per :attr:`TuningIdentity.digest`, the winner of the newest session;
* ``leases``: one row per digest being tuned right now, and ``progress``: the per-config results of
  a session not yet recorded (both used by :mod:`tiletune.resolve.leases`; ``progress`` rows of a digest are
  deleted when its session is recorded).

Every value is stored as plain SQL scalars or canonical JSON text, so the file can be inspected with
any SQLite tool and exported to / imported from a JSON document (:meth:`TuningDB.export_json`,
:meth:`TuningDB.import_json`).

Concurrency: the file is opened in WAL mode with a 30 s busy timeout; every write is one
``BEGIN IMMEDIATE`` transaction, so any number of threads and processes may record sessions into the
same file at once. A :class:`TuningDB` object keeps one connection per thread and reopens its
connections in a forked child (an SQLite connection must never cross a fork).

A file that cannot be used raises one of the precise :class:`~tiletune.errors.DatabaseError`
subclasses (:class:`~tiletune.errors.DatabaseUnavailable`, :class:`~tiletune.errors.DatabaseReadOnly`,
:class:`~tiletune.errors.DatabaseLocked`, :class:`~tiletune.errors.DatabaseCorrupt`,
:class:`~tiletune.errors.ForeignDatabase`, :class:`~tiletune.errors.NewerDatabase`), before anything
is written to it. A database that can be read but not written (the file or its folder is not
writable) is opened read-only (SQLite ``mode=ro``; ``immutable=1`` for a WAL file in a read-only
folder, which no one can be writing): lookups work and every write raises
:class:`~tiletune.errors.DatabaseReadOnly`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import pathlib
import sqlite3
import stat
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import IO, Any, Iterator, Mapping, Sequence, Union

from tiletune.errors import (
    DatabaseCorrupt,
    DatabaseError,
    DatabaseLocked,
    DatabaseReadOnly,
    DatabaseUnavailable,
    ForeignDatabase,
    NewerDatabase,
)
from tiletune.records import DeviceInfo, Measurement, Status, TuningIdentity, canonical_json, stable_hash

__all__ = [
    "EXPORT_FORMAT",
    "EXPORT_VERSION",
    "SCHEMA_VERSION",
    "TuningDB",
    "WinnerRecord",
    "default_db_path",
]

#: Version of the SQL schema, stored in ``PRAGMA user_version``. Version 2 added the ``leases`` and
#: ``progress`` tables; a version-1 file gains them (and keeps its data) the first time it is opened.
SCHEMA_VERSION = 2
#: ``PRAGMA application_id`` that marks a file as a tiletune database ("ttDB").
APPLICATION_ID = 0x74744442
#: ``format`` field of an export document.
EXPORT_FORMAT = "tiletune-db"
#: ``version`` field of an export document.
EXPORT_VERSION = 1
#: How long a writer waits for another writer's lock, in milliseconds.
BUSY_TIMEOUT_MS = 30_000

PathArg = Union[str, "os.PathLike[str]"]

# Inherited connections of a forked child are kept referenced here and never closed: closing (or
# garbage-collecting) an SQLite connection that crossed a fork is unsafe for the parent's file.
_FORK_ORPHANS: list[sqlite3.Connection] = []

_IDENTITY_COLUMNS = ('kernel_id', 'space_hash', '"key"', 'device', 'versions', 'digest', 'name')

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS sessions (
        session_id       TEXT PRIMARY KEY,
        created          REAL NOT NULL,
        kernel_id        TEXT NOT NULL,
        space_hash       TEXT NOT NULL,
        "key"            TEXT NOT NULL,
        device           TEXT NOT NULL,
        versions         TEXT NOT NULL,
        digest           TEXT NOT NULL,
        name             TEXT NOT NULL,
        winner           TEXT,
        winner_median_us REAL,
        tied             TEXT NOT NULL,
        n_measurements   INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS measurements (
        id           INTEGER PRIMARY KEY,
        session_id   TEXT NOT NULL,
        created      REAL NOT NULL,
        kernel_id    TEXT NOT NULL,
        space_hash   TEXT NOT NULL,
        "key"        TEXT NOT NULL,
        device       TEXT NOT NULL,
        versions     TEXT NOT NULL,
        digest       TEXT NOT NULL,
        name         TEXT NOT NULL,
        config       TEXT NOT NULL,
        config_hash  TEXT NOT NULL,
        status       TEXT NOT NULL,
        reason       TEXT NOT NULL,
        samples_us   TEXT NOT NULL,
        median_us    REAL,
        compile_s    REAL,
        ord          INTEGER NOT NULL,
        is_baseline  INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS winners (
        digest       TEXT PRIMARY KEY,
        kernel_id    TEXT NOT NULL,
        space_hash   TEXT NOT NULL,
        "key"        TEXT NOT NULL,
        device       TEXT NOT NULL,
        versions     TEXT NOT NULL,
        name         TEXT NOT NULL,
        config       TEXT NOT NULL,
        config_hash  TEXT NOT NULL,
        median_us    REAL NOT NULL,
        session_id   TEXT NOT NULL,
        created      REAL NOT NULL,
        tied         TEXT NOT NULL
    )""",
    # Schema version 2 (tiletune.resolve.leases): who is tuning a digest now, and the per-config results of
    # a session that is not recorded yet.
    """CREATE TABLE IF NOT EXISTS leases (
        digest       TEXT PRIMARY KEY,
        holder       TEXT NOT NULL,
        host         TEXT NOT NULL,
        pid          INTEGER NOT NULL,
        acquired     REAL NOT NULL,
        expires      REAL NOT NULL,
        name         TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS progress (
        digest       TEXT NOT NULL,
        config_hash  TEXT NOT NULL,
        measurement  TEXT NOT NULL,
        recorded     REAL NOT NULL,
        PRIMARY KEY (digest, config_hash)
    )""",
    "CREATE INDEX IF NOT EXISTS measurements_digest ON measurements(digest)",
    "CREATE INDEX IF NOT EXISTS measurements_kernel ON measurements(kernel_id)",
    "CREATE INDEX IF NOT EXISTS measurements_session ON measurements(session_id)",
    "CREATE INDEX IF NOT EXISTS sessions_digest ON sessions(digest)",
    "CREATE INDEX IF NOT EXISTS sessions_kernel ON sessions(kernel_id)",
    "CREATE INDEX IF NOT EXISTS winners_kernel ON winners(kernel_id)",
)


def _schema_columns() -> dict[str, frozenset[str]]:
    conn = sqlite3.connect(":memory:")
    try:
        for statement in _SCHEMA:
            conn.execute(statement)
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: frozenset(r[1] for r in conn.execute(f"PRAGMA table_info({t})")) for t in tables}
    finally:
        conn.close()


#: The columns of every table of the current schema (what :meth:`TuningDB._classify` checks).
_TABLE_COLUMNS = _schema_columns()
#: The tables each schema version has.
_VERSION_TABLES = {1: frozenset({"sessions", "measurements", "winners"}), 2: frozenset(_TABLE_COLUMNS)}

#: The alternative every fix offers.
_ELSEWHERE = "point tiletune at another file (db= or TILETUNE_DB)"


def _access(path: PathArg, mode: int) -> bool:
    """:func:`os.access` (a seam for tests: root passes every permission check)."""
    return os.access(path, mode)


def _sqlite_code(e: sqlite3.Error) -> str:
    """SQLite's (extended) error name of ``e``, such as ``SQLITE_READONLY_DIRECTORY`` (from the
    message where Python does not give it)."""
    name = getattr(e, "sqlite_errorname", None)
    if name:
        return str(name)
    text = str(e).lower()
    for fragment, code in (
        ("locked", "SQLITE_BUSY"), ("busy", "SQLITE_BUSY"), ("readonly", "SQLITE_READONLY"),
        ("disk is full", "SQLITE_FULL"), ("not a database", "SQLITE_NOTADB"), ("malformed", "SQLITE_CORRUPT"),
        ("unable to open", "SQLITE_CANTOPEN"), ("disk i/o error", "SQLITE_IOERR"),
    ):
        if fragment in text:
            return code
    return ""


def default_db_path() -> pathlib.Path:
    """Where the tuning database lives when no path is given.

    Precedence: ``$TILETUNE_DB`` (a file path), then ``$TILETUNE_CACHE_DIR/tuning.db``, then
    ``$XDG_CACHE_HOME/tiletune/tuning.db``, then ``~/.cache/tiletune/tuning.db``. Empty variables
    count as unset.
    """
    from tiletune import settings

    db, cache = settings.db_path(), settings.cache_dir()
    if db:
        return pathlib.Path(db).expanduser()
    if cache:
        return pathlib.Path(cache).expanduser() / "tuning.db"
    env = os.environ
    try:
        if env.get("XDG_CACHE_HOME"):
            return pathlib.Path(env["XDG_CACHE_HOME"]).expanduser() / "tiletune" / "tuning.db"
        return pathlib.Path.home() / ".cache" / "tiletune" / "tuning.db"
    except RuntimeError:  # pathlib: "Could not determine home directory."
        raise ValueError("cannot find a home directory for the default tuning database; set TILETUNE_DB "
                         "(the database file) or TILETUNE_CACHE_DIR (its folder)") from None


@dataclass(frozen=True)
class WinnerRecord:
    """The stored winner of the newest session of one tuning identity."""

    identity: TuningIdentity
    config: dict[str, Any]
    median_us: float
    session_id: str
    created: float  # unix time of the session
    tied: tuple[dict[str, Any], ...] = ()  # configs inside the winner's noise band


@dataclass(frozen=True)
class _Session:
    """One session as read from an export document (validated)."""

    session_id: str
    created: float
    identity: TuningIdentity
    winner: dict[str, Any] | None
    winner_median_us: float | None
    tied: tuple[dict[str, Any], ...]
    measurements: tuple[Measurement, ...]


class TuningDB:
    """The tuning database in one SQLite file.

    ``path`` is a file path, ``":memory:"`` (a private in-memory database, for tests) or ``None``
    (:func:`default_db_path`). The file and its parent folders are created on first use (:meth:`check`
    opens it at once). Every error is raised as :class:`~tiletune.errors.DatabaseError` naming the
    file; a file that cannot be used raises the subclass that names the cause (see :mod:`tiletune.errors`),
    and a file that can be read but not written is opened read-only (:attr:`read_only`).
    """

    def __init__(self, path: PathArg | None = None) -> None:
        self._memory = path is not None and os.fspath(path) == ":memory:"
        self.path: pathlib.Path | None = (
            None if self._memory else pathlib.Path(os.fspath(path) if path is not None else default_db_path())
        )
        self._lock = threading.RLock()
        self._conns: dict[int, sqlite3.Connection] = {}
        self._pid = os.getpid()
        #: Why the file is opened read-only (None: read-write, or not opened yet).
        self._read_only: DatabaseReadOnly | None = None

    # ------------------------------------------------------------------ connections

    def check(self) -> "TuningDB":
        """Open the database now (this thread's connection) and return self; raises the precise
        :class:`~tiletune.errors.DatabaseError` subclass when it cannot be used."""
        with self._connection():
            pass
        return self

    @property
    def read_only(self) -> bool:
        """Whether the database is open read-only (it opens it, like :meth:`check`): lookups work,
        writes raise :class:`~tiletune.errors.DatabaseReadOnly` (see :attr:`read_only_reason`)."""
        self.check()
        return self._read_only is not None

    @property
    def read_only_reason(self) -> DatabaseReadOnly | None:
        """The error a write raises when the database is open read-only (it says why and what to do),
        else None."""
        self.check()
        return self._read_only

    @property
    def where(self) -> str:
        """The database file as text (``":memory:"`` for an in-memory database)."""
        return ":memory:" if self.path is None else str(self.path)

    def __repr__(self) -> str:
        return f"TuningDB({self.where!r})"

    def __enter__(self) -> "TuningDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close this object's connections (it reopens lazily if used again)."""
        self._check_fork()
        with self._lock:
            conns = list(self._conns.values())
            self._conns.clear()
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _check_fork(self) -> None:
        pid = os.getpid()
        if pid != self._pid:
            # A forked child: the parent's connections (and a lock a parent thread may have held)
            # must not be used here. Keep the old connections referenced so they are never closed.
            _FORK_ORPHANS.extend(self._conns.values())
            self._conns = {}
            self._lock = threading.RLock()
            self._pid = pid

    @contextlib.contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as e:
            raise self._sqlite_error(e) from e

    def _sqlite_error(self, e: sqlite3.Error) -> DatabaseError:
        """The DatabaseError (subclass naming the cause where SQLite tells it) for an SQLite error."""
        code, where = _sqlite_code(e), self.where
        if code.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            return DatabaseLocked(
                where, f"another connection has held its lock for more than {BUSY_TIMEOUT_MS / 1000:g} s (SQLite: {e})",
                f"retry when that process is done with it, or {_ELSEWHERE}",
            )
        if code.startswith("SQLITE_READONLY"):
            return DatabaseReadOnly(
                where, f"SQLite cannot write it ({e})",
                f"make the file and its folder writable, or {_ELSEWHERE}",
            )
        if code.startswith("SQLITE_FULL"):
            return DatabaseUnavailable(where, f"the disk is full (SQLite: {e})", f"free some space, or {_ELSEWHERE}")
        if code.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")):
            return DatabaseCorrupt(
                where, f"not an SQLite database, or a damaged one (SQLite: {e})",
                f"move it away (tiletune then starts a new one there), or {_ELSEWHERE}",
            )
        if code.startswith("SQLITE_CANTOPEN"):
            return DatabaseUnavailable(
                where, f"SQLite cannot open it ({e})",
                f"check that the file and its folder exist and are accessible, or {_ELSEWHERE}",
            )
        if code.startswith("SQLITE_IOERR"):
            return DatabaseUnavailable(where, f"an I/O error (SQLite: {e})", f"check the disk, or {_ELSEWHERE}")
        return DatabaseError(f"tuning database {where}: {e}")

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        self._check_fork()
        if self._memory:
            # One shared connection (each connection to ":memory:" is a separate database).
            with self._lock:
                conn = self._conns.get(0)
                if conn is None:
                    conn = self._conns[0] = self._connect()
                with self._translate():
                    yield conn
            return
        key = threading.get_ident()
        with self._lock:
            conn = self._conns.get(key)
        if conn is None:
            conn = self._connect()
            with self._lock:
                self._conns[key] = conn
        with self._translate():
            yield conn

    @contextlib.contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        with self._connection() as conn:
            reason = self._read_only
            if reason is not None and begin != "BEGIN":
                raise DatabaseReadOnly(reason.path or self.where, reason.problem or "", reason.fix or "")
            conn.execute(begin)
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise

    def _drop_thread_connection(self) -> None:
        """Close the calling thread's own connection, if it has one (for a helper thread that ends,
        such as a lease heartbeat). The shared connection of an in-memory database is kept."""
        self._check_fork()
        if self._memory:
            return
        with self._lock:
            conn = self._conns.pop(threading.get_ident(), None)
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _write(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return self._transaction("BEGIN IMMEDIATE")

    def _read(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return self._transaction("BEGIN")

    def _connect(self) -> sqlite3.Connection:
        if self.path is None:
            return self._initialise(self._open(":memory:"), wal=False)
        path, where = self.path, self.where
        folder = path.parent
        self._make_folder(folder)
        try:
            st: os.stat_result | None = os.stat(path)
        except FileNotFoundError:
            st = None
        except OSError as e:
            raise DatabaseUnavailable(
                where, f"cannot reach it ({e.strerror})", f"make it and its folder accessible, or {_ELSEWHERE}"
            ) from e
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise DatabaseUnavailable(
                where, "it is a directory, not a file",
                f"pass a file path such as {path / 'tuning.db'}, or move the directory away",
            )
        folder_writable = _access(folder, os.W_OK)
        if st is None:
            if not folder_writable:
                raise DatabaseUnavailable(
                    where, f"it does not exist and cannot be created: permission denied on its folder {folder}",
                    f"make the folder writable, or {_ELSEWHERE}",
                )
            reason = None
        elif not _access(path, os.R_OK):
            raise DatabaseUnavailable(
                where, "permission denied: the file cannot be read",
                f"make it readable and writable (chmod u+rw {path}), or {_ELSEWHERE}",
            )
        elif not _access(path, os.W_OK):
            reason = DatabaseReadOnly(
                where, "the file is read-only: its records can be read but no tuning result can be stored",
                f"make it writable (chmod u+w {path}), or {_ELSEWHERE}",
            )
        elif not folder_writable:
            reason = DatabaseReadOnly(
                where, f"its folder {folder} is not writable (SQLite keeps its journal next to the file): its "
                "records can be read but no tuning result can be stored",
                f"make the folder writable, or {_ELSEWHERE}",
            )
        else:
            reason = None
        if reason is None:
            conn = self._open(str(path))
            try:
                conn = self._initialise(conn, wal=True)
                self._read_only = None
                return conn
            except DatabaseReadOnly as e:
                # writable as far as the permissions tell, but SQLite disagrees (e.g. a read-only
                # mount or a server that maps root to nobody): read-only then
                reason = e
        conn = self._open_read_only(reason)
        self._read_only = reason
        return conn

    def _make_folder(self, folder: pathlib.Path) -> None:
        """Create the database's folder (and its parents) if it is missing, or say why it cannot be."""
        if folder.is_dir():
            return
        where = self.where
        fix = f"create it yourself, or {_ELSEWHERE}"
        ancestor = folder
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if ancestor.exists() and not ancestor.is_dir():
            raise DatabaseUnavailable(
                where, f"its folder {folder} cannot be created: {ancestor} is a file, not a folder",
                f"move {ancestor} away, or {_ELSEWHERE}",
            )
        if ancestor.is_dir() and not _access(ancestor, os.W_OK):
            raise DatabaseUnavailable(
                where, f"its folder {folder} does not exist and cannot be created: permission denied on {ancestor}", fix
            )
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DatabaseUnavailable(
                where, f"its folder {folder} does not exist and cannot be created ({e.strerror or e})", fix
            ) from e

    def _open(self, target: str, uri: bool = False) -> sqlite3.Connection:
        with self._translate():
            conn = sqlite3.connect(
                target, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False, uri=uri
            )
        try:
            with self._translate():
                conn.row_factory = sqlite3.Row
                conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            raise
        return conn

    def _initialise(self, conn: sqlite3.Connection, wal: bool) -> sqlite3.Connection:
        """Classify the file (refusing it unchanged if it is not a usable tiletune database), switch
        it to WAL, create or migrate its schema; closes ``conn`` on failure."""
        try:
            with self._translate():
                version = self._classify(conn)
                if wal:
                    self._enable_wal(conn)
                conn.execute("PRAGMA synchronous = NORMAL")
                if version < SCHEMA_VERSION:
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        # Another process may have initialised or migrated it meanwhile.
                        version = self._classify(conn)
                        if version < SCHEMA_VERSION:
                            # Every statement is IF NOT EXISTS: on an empty file this creates the whole
                            # schema, on an older one only what later versions added (rows are kept).
                            for statement in _SCHEMA:
                                conn.execute(statement)
                            if version == 0:
                                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                        conn.execute("COMMIT")
                    except BaseException:
                        if conn.in_transaction:
                            with contextlib.suppress(sqlite3.Error):
                                conn.execute("ROLLBACK")
                        raise
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            raise
        return conn

    def _open_read_only(self, reason: DatabaseReadOnly) -> sqlite3.Connection:
        """A read-only connection (the file is classified, never modified). A WAL file in a folder
        no one can write has no -shm file and cannot get one: it is opened ``immutable`` then (safe
        while no -wal file exists, for no one can write one). An empty file reads as an empty
        in-memory database."""
        assert self.path is not None
        base = "file:" + urllib.parse.quote(os.path.abspath(self.path)) + "?mode=ro"
        conn = self._open(base, uri=True)
        try:
            version = self._classify(conn)
        except DatabaseUnavailable as e:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            cause = e.__cause__
            code = _sqlite_code(cause) if isinstance(cause, sqlite3.Error) else ""
            if not code.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")):
                raise
            if os.path.exists(f"{self.path}-wal"):
                raise DatabaseUnavailable(
                    self.where, f"it is in WAL mode with a -wal file and its folder {self.path.parent} is not "
                    f"writable, so SQLite cannot open it even read-only ({cause})",
                    f"make the folder writable, or {_ELSEWHERE}",
                ) from e
            conn = self._open(base + "&immutable=1", uri=True)
            try:
                version = self._classify(conn)
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
                raise
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            raise
        if version == 0:  # an empty file: nothing to read
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            conn = self._initialise(self._open(":memory:"), wal=False)
        return conn

    def _classify(self, conn: sqlite3.Connection) -> int:
        """The schema version of a tiletune database: 0 for an empty file (to be initialised), 1 up
        to :data:`SCHEMA_VERSION` for a database to use (migrated first if older).

        Raises the precise DatabaseError for anything else (not SQLite: DatabaseCorrupt; another
        application's file, or tiletune's mark on other tables: ForeignDatabase; a newer tiletune's:
        NewerDatabase), before the file is modified in any way.
        """
        own_txn = not conn.in_transaction
        try:
            if own_txn:  # read the three values from one snapshot
                conn.execute("BEGIN")
            try:
                app_id = conn.execute("PRAGMA application_id").fetchone()[0]
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                objects = conn.execute(
                    "SELECT m.type, m.name, p.name FROM sqlite_master AS m "
                    "LEFT JOIN pragma_table_info(m.name) AS p ON m.type = 'table'"
                ).fetchall()
            finally:
                if own_txn and conn.in_transaction:
                    conn.execute("COMMIT")
        except sqlite3.Error as e:
            raise self._sqlite_error(e) from e
        where = self.where
        untouched = f"tiletune leaves it untouched: {_ELSEWHERE}"
        if app_id == 0 and version == 0 and not objects:
            return 0
        if app_id != APPLICATION_ID:
            raise ForeignDatabase(
                where, f"it is an SQLite file of another application (application_id {app_id}), not a tiletune "
                "tuning database", untouched,
            )
        if version > SCHEMA_VERSION:
            raise NewerDatabase(
                where, f"it was written by a newer tiletune (schema version {version}; this tiletune reads "
                f"versions 1 to {SCHEMA_VERSION})", f"tiletune leaves it untouched: upgrade tiletune, or {_ELSEWHERE}",
            )
        if version < 1:
            raise ForeignDatabase(
                where, f"it is marked as a tiletune tuning database but has invalid schema version {version}",
                untouched,
            )
        columns: dict[str, set[str]] = {}
        for kind, table, column in objects:
            if kind == "table" and not str(table).startswith("sqlite_"):
                columns.setdefault(table, set()).update(() if column is None else (column,))
        missing = sorted(_VERSION_TABLES[int(version)] - set(columns))
        odd = sorted(t for t, cols in columns.items() if t in _TABLE_COLUMNS and cols != _TABLE_COLUMNS[t])
        if missing or odd:
            detail = "; ".join(
                ([f"no table {', '.join(missing)}"] if missing else [])
                + ([f"other columns in table {', '.join(odd)}"] if odd else [])
            )
            raise ForeignDatabase(
                where, f"it is marked as a tiletune tuning database (schema version {version}) but its tables are "
                f"not tiletune's ({detail})", untouched,
            )
        return int(version)

    @staticmethod
    def _enable_wal(conn: sqlite3.Connection) -> None:
        if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
            return
        # Switching the journal mode can report "database is locked" without waiting for the busy
        # handler when several processes open a new file at once, so retry for a while.
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL").fetchone()
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e).lower() and "busy" not in str(e).lower():
                    raise
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    # ------------------------------------------------------------------ writing

    def record_session(
        self,
        identity: TuningIdentity,
        measurements: Sequence[Measurement],
        winner: Mapping[str, Any] | None,
        winner_median_us: float | None,
        tied: Sequence[Mapping[str, Any]] = (),
    ) -> str:
        """Store one tuning session in one transaction and return its new session id (uuid4 hex).

        ``winner`` (with ``winner_median_us``) becomes the identity's stored winner unless a newer
        session already holds it; ``winner=None`` records measurements only.
        """
        if winner is not None and winner_median_us is None:
            raise ValueError("record_session: winner_median_us is required when a winner is given")
        session = _Session(
            session_id=uuid.uuid4().hex,
            created=time.time(),
            identity=identity,
            winner=None if winner is None else dict(winner),
            winner_median_us=None if winner is None else float(winner_median_us),  # type: ignore[arg-type]
            tied=tuple(dict(t) for t in tied),
            measurements=tuple(measurements),
        )
        rows = _session_rows(session)  # serialise before taking the write lock
        with self._write() as conn:
            _insert_rows(conn, *rows)
            # The session is complete: its per-config progress (tiletune.resolve.leases) is no longer needed.
            conn.execute("DELETE FROM progress WHERE digest = ?", (identity.digest,))
        return session.session_id

    def delete(
        self,
        identity: TuningIdentity | None = None,
        kernel_id: str | None = None,
        name: str | None = None,
    ) -> int:
        """Remove the sessions, measurements and winners matching every given filter.

        Returns the number of winner and measurement rows removed. At least one filter is required
        (use :meth:`clear` to empty the database).
        """
        if identity is None and kernel_id is None and name is None:
            raise ValueError("delete() needs identity, kernel_id or name; use clear() to remove everything")
        where, params = _where(identity=identity, kernel_id=kernel_id, name=name)
        with self._write() as conn:
            n = conn.execute(f"DELETE FROM winners WHERE {where}", params).rowcount
            n += conn.execute(f"DELETE FROM measurements WHERE {where}", params).rowcount
            conn.execute(f"DELETE FROM sessions WHERE {where}", params)
        return n

    def clear(self) -> int:
        """Remove everything (leases and progress rows included); returns the number of winner and
        measurement rows removed."""
        with self._write() as conn:
            n = conn.execute("DELETE FROM winners").rowcount
            n += conn.execute("DELETE FROM measurements").rowcount
            conn.execute("DELETE FROM sessions")
            conn.execute("DELETE FROM leases")
            conn.execute("DELETE FROM progress")
        return n

    # ------------------------------------------------------------------ reading

    def lookup(self, identity: TuningIdentity) -> WinnerRecord | None:
        """The stored winner for ``identity`` (all identity fields but ``name`` must match), or None."""
        where, params = _where(identity=identity)
        with self._connection() as conn:
            row = conn.execute(f"SELECT * FROM winners WHERE {where}", params).fetchone()
        return None if row is None else _winner_from_row(row)

    def winners(self, kernel_id: str | None = None, name: str | None = None) -> list[WinnerRecord]:
        """All stored winners matching the given filters, oldest first."""
        where, params = _where(kernel_id=kernel_id, name=name)
        with self._connection() as conn:
            rows = conn.execute(
                f"SELECT * FROM winners WHERE {where} ORDER BY created, digest", params
            ).fetchall()
        return [_winner_from_row(r) for r in rows]

    def measurements(
        self,
        identity: TuningIdentity | None = None,
        *,
        kernel_id: str | None = None,
        session_id: str | None = None,
    ) -> list[Measurement]:
        """Stored measurements matching every given filter, in insertion order."""
        where, params = _where(identity=identity, kernel_id=kernel_id, session_id=session_id)
        with self._connection() as conn:
            rows = conn.execute(f"SELECT * FROM measurements WHERE {where} ORDER BY id", params).fetchall()
        return [_measurement_from_row(r) for r in rows]

    def sessions(self, kernel_id: str | None = None, name: str | None = None) -> list[str]:
        """Ids of the stored sessions matching the given filters, oldest first."""
        where, params = _where(kernel_id=kernel_id, name=name)
        with self._connection() as conn:
            rows = conn.execute(
                f"SELECT session_id FROM sessions WHERE {where} ORDER BY created, rowid", params
            ).fetchall()
        return [r[0] for r in rows]

    def stats(self) -> dict[str, Any]:
        """Counts of sessions, measurements, winners, leases (rows, expired ones included) and
        progress rows (per-config results of unfinished sessions), and the size of the file(s) in
        bytes."""
        with self._read() as conn:
            present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            counts = {  # a read-only version-1 file has no leases and progress tables
                table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] if table in present else 0
                for table in ("sessions", "measurements", "winners", "leases", "progress")
            }
        size = 0
        if self.path is not None:
            for suffix in ("", "-wal"):
                with contextlib.suppress(OSError):
                    size += os.path.getsize(str(self.path) + suffix)
        return {"path": self.where, "schema_version": SCHEMA_VERSION, **counts, "size_bytes": size}

    # ------------------------------------------------------------------ export / import

    def export_json(
        self,
        dest: PathArg | IO[str],
        *,
        name: str | None = None,
        kernel_id: str | None = None,
        session_ids: Sequence[str] | None = None,
    ) -> int:
        """Write the matching sessions (identity, winner, measurements) as a JSON document.

        Filters: ``name``, ``kernel_id`` and ``session_ids`` (only these sessions; a campaign worker
        sends the sessions it just recorded back to its caller this way).

        The document is ``{"format": "tiletune-db", "version": 1, "exported": <ISO time>,
        "sessions": [...]}``, standard JSON: a stored NaN or Infinity (an import never stores one)
        raises :class:`~tiletune.errors.ExportError` naming the field, and nothing is written.
        ``dest`` is a path or a text stream. A path is written atomically (a temporary file in its
        folder, then :func:`os.replace`); its folder must exist (it is not created) and it may not be
        the database file (:class:`~tiletune.errors.ExportError`). Returns the number of sessions
        written.
        """
        from tiletune.errors import ExportError
        from tiletune import jsonio as _io

        to_stream = hasattr(dest, "write")
        target = str(getattr(dest, "name", "<stream>")) if to_stream else os.fspath(dest)  # type: ignore[arg-type]
        own_files = [] if self.path is None else [str(self.path) + s for s in ("", "-wal", "-shm")]
        if not to_stream:
            try:
                _io.check_destination(target, own_files)
            except _io.Problem as e:
                raise ExportError(target, e.problem.replace("input file", "database file")) from None
        where, params = _where(kernel_id=kernel_id, name=name, session_ids=session_ids)
        with self._read() as conn:
            srows = conn.execute(
                f"SELECT * FROM sessions WHERE {where} ORDER BY created, rowid", params
            ).fetchall()
            mrows = conn.execute(f"SELECT * FROM measurements WHERE {where} ORDER BY id", params).fetchall()
        by_session: dict[str, list[dict[str, Any]]] = {r["session_id"]: [] for r in srows}
        for r in mrows:
            if r["session_id"] in by_session:
                by_session[r["session_id"]].append(_measurement_from_row(r).as_dict())
        sessions = []
        for r in srows:
            ident = _identity_from_row(r)
            sessions.append(
                {
                    "session_id": r["session_id"],
                    "created": r["created"],
                    "identity": ident.as_dict(),
                    "winner": None if r["winner"] is None else json.loads(r["winner"]),
                    "winner_median_us": r["winner_median_us"],
                    "tied": json.loads(r["tied"]),
                    "measurements": by_session[r["session_id"]],
                }
            )
        doc = {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "exported": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "sessions": sessions,
        }
        try:
            text = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n"
        except ValueError:
            field = _io.find_non_finite(doc) or "document"
            raise ExportError(
                target, f"{field}: the database holds a NaN or Infinity, which standard JSON cannot represent"
            ) from None
        if to_stream:
            dest.write(text)  # type: ignore[union-attr]
        else:
            _atomic_write(pathlib.Path(target), text, own_files)
        return len(sessions)

    def import_json(self, src: PathArg | IO[str]) -> int:
        """Read an export document and insert its sessions; returns how many were inserted.

        The whole document is read (at most :data:`tiletune.jsonio.MAX_FILE_BYTES`, JSON
        nested at most :data:`~tiletune.jsonio.MAX_DEPTH` deep, no NaN/Infinity, integers in
        64 bits) and validated before anything is written; a malformed document raises
        :class:`~tiletune.errors.InvalidImport` naming the file and the field, and changes nothing.
        Times must be finite (samples and winner medians > 0 microseconds, compile seconds >= 0,
        ``created`` >= 0); each session keeps its stored ``created`` time. The sessions are inserted in
        one transaction. Sessions whose id is already present are skipped, so importing the same file
        twice is harmless. An imported winner replaces the stored one only if its session is newer.
        """
        from tiletune.errors import InvalidImport
        from tiletune import jsonio as _io

        if hasattr(src, "read"):
            origin = str(getattr(src, "name", "<stream>"))
        else:
            origin = os.fspath(src)  # type: ignore[arg-type]
        try:
            if hasattr(src, "read"):
                data = _io.read_stream(src)
            else:
                data = _io.read_bytes(origin)
            text = _io.decode_text(data) if isinstance(data, bytes) else data
            doc = _io.parse_json(text)
        except _io.Problem as e:
            raise InvalidImport(origin, e.problem, e.field) from None
        sessions = _parse_document(doc, origin)
        prepared = [(s.session_id, _session_rows(s)) for s in sessions]
        inserted = 0
        with self._write() as conn:
            for session_id, rows in prepared:
                if conn.execute("SELECT 1 FROM sessions WHERE session_id = ?", (session_id,)).fetchone():
                    continue
                _insert_rows(conn, *rows)
                inserted += 1
        return inserted


# ---------------------------------------------------------------------- row helpers


def _identity_values(identity: TuningIdentity) -> tuple[Any, ...]:
    """Values of the identity columns, in the order of ``_IDENTITY_COLUMNS``."""
    return (
        identity.kernel_id,
        identity.space_hash,
        identity.key,
        canonical_json(identity.device.as_dict()),
        identity.versions,
        identity.digest,
        identity.name,
    )


def _where(
    *,
    identity: TuningIdentity | None = None,
    kernel_id: str | None = None,
    name: str | None = None,
    session_id: str | None = None,
    session_ids: Sequence[str] | None = None,
) -> tuple[str, list[Any]]:
    """An SQL condition (AND of the given filters; ``1`` for none) and its parameters."""
    clauses: list[str] = []
    params: list[Any] = []
    if identity is not None:
        # The digest uses the index; the explicit columns make a digest collision harmless.
        values = _identity_values(identity)
        for column, value in zip(_IDENTITY_COLUMNS[:-1], values[:-1]):
            clauses.append(f"{column} = ?")
            params.append(value)
    if kernel_id is not None:
        clauses.append("kernel_id = ?")
        params.append(kernel_id)
    if name is not None:
        clauses.append("name = ?")
        params.append(name)
    if session_id is not None:
        clauses.append("session_id = ?")
        params.append(session_id)
    if session_ids is not None:
        clauses.append(f"session_id IN ({', '.join('?' * len(session_ids))})" if session_ids else "0")
        params.extend(session_ids)
    return (" AND ".join(clauses) or "1"), params


_SessionRows = tuple[tuple[Any, ...], list[tuple[Any, ...]], Union[tuple[Any, ...], None]]


def _session_rows(s: _Session) -> _SessionRows:
    """The sessions row, the measurement rows and the winners row (or None) of one session."""
    ident = _identity_values(s.identity)
    session_row = (
        s.session_id,
        s.created,
        *ident,
        None if s.winner is None else canonical_json(s.winner),
        s.winner_median_us,
        canonical_json([dict(t) for t in s.tied]),
        len(s.measurements),
    )
    mrows = []
    for m in s.measurements:
        config = dict(m.config)
        mrows.append(
            (
                s.session_id,
                s.created,
                *ident,
                canonical_json(config),
                stable_hash(config),
                Status(m.status).value,
                str(m.reason),
                canonical_json([float(x) for x in m.samples_us]),
                m.median_us,
                None if m.compile_s is None else float(m.compile_s),
                int(m.order),
                1 if m.is_baseline else 0,
            )
        )
    winner_row = None
    if s.winner is not None:
        winner_row = (
            ident[5],  # digest
            *ident[:5],
            ident[6],  # name
            canonical_json(s.winner),
            stable_hash(s.winner),
            s.winner_median_us,
            s.session_id,
            s.created,
            canonical_json([dict(t) for t in s.tied]),
        )
    return session_row, mrows, winner_row


def _insert_rows(
    conn: sqlite3.Connection,
    session_row: tuple[Any, ...],
    mrows: list[tuple[Any, ...]],
    winner_row: tuple[Any, ...] | None,
) -> None:
    conn.execute(
        'INSERT INTO sessions (session_id, created, kernel_id, space_hash, "key", device, versions, '
        "digest, name, winner, winner_median_us, tied, n_measurements) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        session_row,
    )
    conn.executemany(
        'INSERT INTO measurements (session_id, created, kernel_id, space_hash, "key", device, versions, '
        "digest, name, config, config_hash, status, reason, samples_us, median_us, compile_s, ord, "
        "is_baseline) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        mrows,
    )
    if winner_row is not None:
        # Newest session wins: an older (e.g. imported) session never replaces a newer winner.
        conn.execute(
            'INSERT INTO winners (digest, kernel_id, space_hash, "key", device, versions, name, config, '
            "config_hash, median_us, session_id, created, tied) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(digest) DO UPDATE SET kernel_id = excluded.kernel_id, "
            'space_hash = excluded.space_hash, "key" = excluded."key", device = excluded.device, '
            "versions = excluded.versions, name = excluded.name, config = excluded.config, "
            "config_hash = excluded.config_hash, median_us = excluded.median_us, "
            "session_id = excluded.session_id, created = excluded.created, tied = excluded.tied "
            "WHERE excluded.created >= winners.created",
            winner_row,
        )


def _identity_from_row(row: sqlite3.Row) -> TuningIdentity:
    return TuningIdentity(
        kernel_id=row["kernel_id"],
        space_hash=row["space_hash"],
        key=row["key"],
        device=DeviceInfo.from_dict(json.loads(row["device"])),
        versions=row["versions"],
        name=row["name"],
    )


def _winner_from_row(row: sqlite3.Row) -> WinnerRecord:
    return WinnerRecord(
        identity=_identity_from_row(row),
        config=json.loads(row["config"]),
        median_us=float(row["median_us"]),
        session_id=row["session_id"],
        created=float(row["created"]),
        tied=tuple(json.loads(row["tied"])),
    )


def _measurement_from_row(row: sqlite3.Row) -> Measurement:
    return Measurement(
        config=json.loads(row["config"]),
        status=Status(row["status"]),
        reason=row["reason"],
        samples_us=tuple(float(x) for x in json.loads(row["samples_us"])),
        compile_s=None if row["compile_s"] is None else float(row["compile_s"]),
        order=int(row["ord"]),
        is_baseline=bool(row["is_baseline"]),
    )


def _atomic_write(path: pathlib.Path, text: str, own_files: Sequence[str] = ()) -> None:
    """Write an export file atomically (:func:`tiletune.jsonio.write_atomic`)."""
    from tiletune.errors import ExportError
    from tiletune import jsonio as _io

    try:
        _io.write_atomic(path, text.encode("utf-8"), own_files)
    except _io.Problem as e:
        raise ExportError(str(path), e.problem.replace("input file", "database file")) from None


# ---------------------------------------------------------------------- import validation


class _Invalid(Exception):
    """A problem of an import document: ``problem`` and ``field`` (None: the whole document)."""

    def __init__(self, problem: str, field: str | None = None) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.problem, self.field = problem, field


def _need(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise _Invalid(f"missing field {key!r}", where)
    return d[key]


def _as_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"expected a string, got {type(value).__name__}", where)
    return value


def _as_int(value: Any, where: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(f"expected an integer, got {type(value).__name__}", where)
    if value < low:
        raise _Invalid(f"expected an integer >= {low}, got {value}", where)
    return value


def _as_number(value: Any, where: str, *, positive: bool = False) -> float:
    """A finite number >= 0 (> 0 when ``positive``); booleans are refused."""
    from tiletune.jsonio import show

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Invalid(f"expected a number, got {type(value).__name__}", where)
    x = float(value)
    if not math.isfinite(x) or (x <= 0 if positive else x < 0):
        raise _Invalid(f"expected a finite {'positive' if positive else 'non-negative'} number, got {show(value)}", where)
    return x


def _as_dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Invalid(f"expected an object, got {type(value).__name__}", where)
    return value


def _as_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise _Invalid(f"expected a list, got {type(value).__name__}", where)
    return value


def _parse_document(doc: Any, origin: str) -> list[_Session]:
    """Validate a whole export document; raise InvalidImport naming the file and the first problem."""
    from tiletune.errors import InvalidImport

    try:
        top = _as_dict(doc, "document")
        fmt = _need(top, "format", "document")
        if fmt != EXPORT_FORMAT:
            raise _Invalid(f"format is {fmt!r}, expected {EXPORT_FORMAT!r}")
        version = _need(top, "version", "document")
        if isinstance(version, bool) or version != EXPORT_VERSION:
            raise _Invalid(f"unsupported version {version!r} (this tiletune reads version {EXPORT_VERSION})")
        raw_sessions = _as_list(_need(top, "sessions", "document"), "sessions")
        return [_parse_session(s, f"sessions[{i}]") for i, s in enumerate(raw_sessions)]
    except _Invalid as e:
        raise InvalidImport(origin, e.problem, e.field) from None


def _parse_session(raw: Any, where: str) -> _Session:
    s = _as_dict(raw, where)
    session_id = _as_str(_need(s, "session_id", where), f"{where}.session_id")
    if not session_id or len(session_id) > 128:
        raise _Invalid("must be a non-empty string of at most 128 characters", f"{where}.session_id")
    created = _as_number(_need(s, "created", where), f"{where}.created")
    ident_where = f"{where}.identity"
    ident = _as_dict(_need(s, "identity", where), ident_where)
    dev_where = f"{ident_where}.device"
    dev = _as_dict(_need(ident, "device", ident_where), dev_where)
    identity = TuningIdentity(
        kernel_id=_as_str(_need(ident, "kernel_id", ident_where), f"{ident_where}.kernel_id"),
        space_hash=_as_str(_need(ident, "space_hash", ident_where), f"{ident_where}.space_hash"),
        key=_as_str(_need(ident, "key", ident_where), f"{ident_where}.key"),
        device=DeviceInfo(
            name=_as_str(_need(dev, "name", dev_where), f"{dev_where}.name"),
            arch=_as_str(_need(dev, "arch", dev_where), f"{dev_where}.arch"),
            sm_count=_as_int(_need(dev, "sm_count", dev_where), f"{dev_where}.sm_count"),
        ),
        versions=_as_str(_need(ident, "versions", ident_where), f"{ident_where}.versions"),
        name=_as_str(ident.get("name", ""), f"{ident_where}.name"),
    )
    raw_winner = _need(s, "winner", where)
    winner = None if raw_winner is None else _as_config(raw_winner, f"{where}.winner")
    raw_median = s.get("winner_median_us")
    if winner is None:
        if raw_median is not None:
            raise _Invalid("given without a winner", f"{where}.winner_median_us")
        median = None
    else:
        if raw_median is None:
            raise _Invalid("missing for the winner", f"{where}.winner_median_us")
        median = _as_number(raw_median, f"{where}.winner_median_us", positive=True)
    tied = tuple(
        _as_config(t, f"{where}.tied[{j}]") for j, t in enumerate(_as_list(_need(s, "tied", where), f"{where}.tied"))
    )
    ms = tuple(
        _parse_measurement(m, f"{where}.measurements[{j}]")
        for j, m in enumerate(_as_list(_need(s, "measurements", where), f"{where}.measurements"))
    )
    return _Session(session_id, created, identity, winner, median, tied, ms)


def _as_config(value: Any, where: str) -> dict[str, Any]:
    """A configuration: an object of strings, finite numbers, booleans and nulls."""
    from tiletune.jsonio import is_number, join

    config = _as_dict(value, where)
    for k, v in config.items():
        if not (v is None or isinstance(v, (str, bool)) or is_number(v)):
            raise _Invalid(f"expected a number, string, boolean or null, got {type(v).__name__}", join(where, k))
    return config


_STATUSES = {s.value: s for s in Status}


def _parse_measurement(raw: Any, where: str) -> Measurement:
    m = _as_dict(raw, where)
    config = _as_config(_need(m, "config", where), f"{where}.config")
    status_text = _as_str(_need(m, "status", where), f"{where}.status")
    if status_text not in _STATUSES:
        raise _Invalid(f"{status_text!r} is not one of {sorted(_STATUSES)}", f"{where}.status")
    reason = _as_str(_need(m, "reason", where), f"{where}.reason")
    samples = tuple(
        _as_number(x, f"{where}.samples_us[{k}]", positive=True)
        for k, x in enumerate(_as_list(_need(m, "samples_us", where), f"{where}.samples_us"))
    )
    raw_compile = _need(m, "compile_s", where)
    compile_s = None if raw_compile is None else _as_number(raw_compile, f"{where}.compile_s")
    order = _as_int(_need(m, "order", where), f"{where}.order")
    is_baseline = _need(m, "is_baseline", where)
    if not isinstance(is_baseline, bool):
        raise _Invalid(f"expected true or false, got {type(is_baseline).__name__}", f"{where}.is_baseline")
    return Measurement(
        config=config,
        status=_STATUSES[status_text],
        reason=reason,
        samples_us=samples,
        compile_s=compile_s,
        order=order,
        is_baseline=is_baseline,
    )
