"""The handle an op keeps on its tuning database (:class:`DatabaseHandle`), and how it is opened.

A database that cannot be used never breaks a tuned op: one that fails to open, or fails later
(locked, disk full, made read-only), is dropped and the op tunes and launches without storing
anything; one that can only be read (the file or its folder is not writable) still answers lookups,
and the op tunes the other keys without a lease and without storing them. Either way one
:class:`~tiletune.errors.DatabaseWarning` (a RuntimeWarning, through :func:`warnings.warn`) per
process and database path says what is wrong and what to do, before any tuning whose result could
not be stored. A database path that failed is not tried again in this process.

The chain's database source is :mod:`tiletune.resolve.database`; the lease that lets one process tune
a key while the others wait for its winner is the tune source's (:mod:`tiletune.resolve.tune`).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from typing import Any

from tiletune.devices import timeline
from tiletune.errors import DatabaseError, DatabaseWarning
from tiletune.records import TuningIdentity
from tiletune.store import TuningDB

logger = logging.getLogger("tiletune")

__all__ = ["DatabaseHandle", "open_database", "forget_database_problems"]

#: The warning when a tuned op's database cannot be opened, when it can only be read, and when it
#: fails later (``{error}`` is the exception's message, which names the path, the cause and the fix).
UNUSABLE_WARNING = ("tiletune: {error}. Tuned ops go on without this database: they tune every new problem key "
                    "and store nothing.")
READ_ONLY_WARNING = ("tiletune: {error}. Tuned ops use its records and tune the other problem keys without "
                     "storing the results.")
FAILED_WARNING = ("tiletune: {error}. Tuned ops go on without this database from now on: new tuning results are "
                  "not stored.")

_problems_lock = threading.Lock()
_warned: set[str] = set()  # database paths this process has warned about
_broken: set[str] = set()  # database paths that failed: not opened again by a tuned op


def _db_key(db: TuningDB) -> str:
    return f":memory:{id(db)}" if db.path is None else os.path.abspath(db.where)


def _warn_once(key: str, template: str, error: DatabaseError) -> None:
    with _problems_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(template.format(error=error), DatabaseWarning, stacklevel=2)


def forget_database_problems() -> None:
    """Forget which databases were warned about or dropped (for tests)."""
    with _problems_lock:
        _warned.clear()
        _broken.clear()


def open_database(arg: Any) -> TuningDB | None:
    """A tuned op's tuning database, opened now: ``arg`` is a :class:`TuningDB`, a path, or
    None / True (:func:`~tiletune.store.default_db_path`).

    Returns None when it cannot be used (after one :class:`~tiletune.errors.DatabaseWarning` per
    process and path; a path that failed before in this process is not opened again). A read-only
    database is returned (``db.read_only``), after its own warning: the op reads its records and
    stores nothing.
    """
    db = arg if isinstance(arg, TuningDB) else TuningDB(None if arg in (None, True) else arg)
    key = _db_key(db)
    with _problems_lock:
        if key in _broken:
            return None
    try:
        reason = db.read_only_reason  # opens it
    except DatabaseError as exc:
        with _problems_lock:
            _broken.add(key)
        _warn_once(key, UNUSABLE_WARNING, exc)
        return None
    if reason is not None:
        _warn_once(key, READ_ONLY_WARNING, reason)
    return db


class DatabaseHandle:
    """One op's tuning database: opened at first use, dropped for good when it fails.

    ``arg``: what ``autotune(db=...)`` was given (False: no database)."""

    def __init__(self, arg: Any) -> None:
        self.arg = arg
        self._db: TuningDB | None = None
        self.dropped = False
        self._lock = threading.Lock()

    @property
    def db(self) -> TuningDB | None:
        """The database, opened now; None without one (``db=False``) or once it failed."""
        if self._db is None and self.arg is not False and not self.dropped:
            with self._lock:
                if self._db is None and not self.dropped:
                    self._db = open_database(self.arg)
                    self.dropped = self._db is None
                    timeline.mark("database_opened", ok=not self.dropped)
        return self._db

    def failed(self, db: TuningDB, exc: DatabaseError, name: str = "") -> None:
        """``db`` failed while in use: drop it (the op goes on without storing), and stop using its
        path in this process; one warning per process and path."""
        key = _db_key(db)
        with _problems_lock:
            _broken.add(key)
        _warn_once(key, FAILED_WARNING, exc)
        logger.debug("%s: tuning database %s dropped: %s", name, db.where, exc)
        if self._db is db:
            self._db = None
            self.dropped = True

    def writable(self, db: TuningDB | None, name: str = "") -> bool:
        """Whether ``db`` may be written (not None, not read-only, not dropped)."""
        if db is None or db is not self._db:
            return False
        try:
            return not db.read_only
        except DatabaseError as exc:  # this thread's connection failed to open
            self.failed(db, exc, name)
            return False

    def lookup(self, identity: TuningIdentity, name: str = "") -> Any:
        """The record of ``identity``, or None (no database, or it failed)."""
        db = self.db
        if db is None:
            return None
        try:
            return db.lookup(identity)
        except DatabaseError as exc:
            self.failed(db, exc, name)
            return None
