"""Tuning leases and per-config progress, kept in the tuning database (:class:`~tiletune.store.TuningDB`).

Two problems of tuning the same key from several processes, and of tuning processes that die:

* **Leases.** When several processes miss the same :class:`~tiletune.records.TuningIdentity` at once,
  one of them takes its lease (:func:`acquire_lease`) and tunes; the others call
  :func:`wait_for_winner` and use the winner it records. A lease names its holder (a uuid, the host
  name and the pid) and expires ``ttl_s`` seconds after its last renewal; a heartbeat thread renews
  it every ``ttl_s / 3`` seconds while the holder lives. A lease is taken over when it has expired,
  or at once when its holder ran on this host and its process no longer exists.
* **Progress.** A tuner records every finished candidate with :func:`record_progress` (one short
  transaction each, committed at once, so a SIGKILL loses nothing already recorded). A process that
  tunes the same identity later reads them back with :func:`progress` and measures only the rest.
  :meth:`TuningDB.record_session <tiletune.store.TuningDB.record_session>` deletes an identity's
  progress rows in the transaction that stores its session.

Typical use::

    rec = db.lookup(identity)
    while rec is None:
        lease = acquire_lease(db, identity)
        if lease is None:                       # someone else is tuning it
            rec = wait_for_winner(db, identity)  # None: its holder died; try to take over
            continue
        with lease:
            rec = db.lookup(identity)           # it may have finished just before we took the lease
            if rec is None:
                done = progress(db, identity)   # resume an interrupted session
                ...                             # measure the other configs, record_progress each
                db.record_session(identity, measurements, winner, median_us)
                rec = db.lookup(identity)

Every value is stored as plain SQL scalars or canonical JSON text; nothing is pickled. Times are
unix times (:func:`time.time`), compared across processes and hosts sharing one database file.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tiletune.errors import DatabaseError, DatabaseLocked
from tiletune.records import Measurement, TuningIdentity, canonical_json
from tiletune.store import TuningDB, WinnerRecord

__all__ = [
    "DEFAULT_TTL_S",
    "Lease",
    "acquire_lease",
    "clear_progress",
    "lease_holder",
    "progress",
    "record_progress",
    "wait_for_winner",
]

#: Default lifetime of a lease without renewal, in seconds.
DEFAULT_TTL_S = 30.0

_log = logging.getLogger(__name__)


def _hostname() -> str:
    return socket.gethostname()


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists (a zombie, dead but not reaped, counts as dead)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    except OSError:
        return True  # cannot tell: assume alive, the lease still expires
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return True  # no procfs (or it just exited): os.kill said it exists
    # "pid (comm) state ...": comm may contain spaces and parentheses, the state follows the last ')'.
    fields = stat[stat.rfind(")") + 1 :].split()
    return not (fields and fields[0] in ("Z", "X"))


def _holder_gone(row: sqlite3.Row | None, now: float, host: str) -> bool:
    """True when the lease row is absent, expired, or held by a dead process of this host."""
    if row is None or float(row["expires"]) < now:
        return True
    return row["host"] == host and not _pid_alive(int(row["pid"]))


@dataclass(eq=False)
class Lease:
    """A held lease on one tuning identity (by its :attr:`~tiletune.records.TuningIdentity.digest`).

    Made by :func:`acquire_lease`, which also starts its heartbeat: a daemon thread (with its own
    database connection) that calls :meth:`renew` every ``ttl_s / 3`` seconds until :meth:`release`
    or until the lease is lost to another holder. Use it as a context manager to release it on exit.
    """

    digest: str
    holder: str  # uuid4 hex, unique to this lease
    expires: float  # unix time, as of the last successful acquire or renew by this object
    db: TuningDB = field(repr=False)
    ttl_s: float = DEFAULT_TTL_S
    #: Set when a renewal found the lease in someone else's hands (the heartbeat then stops).
    lost: bool = field(default=False, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _released: bool = field(default=False, init=False, repr=False)

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called."""
        return self._released

    def renew(self) -> bool:
        """Push the expiry to ``now + ttl_s`` if this lease is still ours; False if it is not.

        A lease that expired but was not taken over is still ours and is renewed. False means
        another process took it (or it was released or cleared); :attr:`lost` is then set.
        """
        if self._released:
            return False
        expires = time.time() + self.ttl_s
        with self.db._write() as conn:
            n = conn.execute(
                "UPDATE leases SET expires = ? WHERE digest = ? AND holder = ?",
                (expires, self.digest, self.holder),
            ).rowcount
        if n == 1:
            self.expires = expires
            return True
        self.lost = True
        return False

    def release(self) -> None:
        """Stop the heartbeat and delete the lease row if it is still ours. Idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(5.0, self.ttl_s))
        if self._released:
            return
        self._released = True
        with self.db._write() as conn:
            conn.execute("DELETE FROM leases WHERE digest = ? AND holder = ?", (self.digest, self.holder))

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _start_heartbeat(self) -> None:
        thread = threading.Thread(
            target=self._heartbeat, name=f"tiletune-lease-{self.digest[:8]}", daemon=True
        )
        self._thread = thread
        thread.start()

    def _heartbeat(self) -> None:
        interval = self.ttl_s / 3.0
        try:
            while not self._stop.wait(interval):
                try:
                    if not self.renew():
                        if not self._released:
                            _log.warning("tiletune: lease on %s was taken over by another process", self.digest)
                        return
                except DatabaseLocked as e:  # a writer held the lock past the busy timeout: try again
                    _log.warning("tiletune: cannot renew the lease on %s: %s", self.digest, e)
                except DatabaseError as e:  # the database became unusable (read-only, disk full, ...)
                    _log.warning("tiletune: cannot renew the lease on %s (no more renewals): %s", self.digest, e)
                    return
        finally:
            self.db._drop_thread_connection()


def acquire_lease(
    db: TuningDB,
    identity: TuningIdentity,
    ttl_s: float = DEFAULT_TTL_S,
    *,
    heartbeat: bool = True,
) -> Lease | None:
    """Take the lease on ``identity`` for this process, or return None if a live holder has it.

    In one ``BEGIN IMMEDIATE`` transaction the lease is taken when there is no lease row, when the
    row expired (``expires < now``), or when its holder ran on this host (:func:`socket.gethostname`)
    and its process no longer exists. A process that already holds the lease gets None too (leases
    are not re-entrant). With ``heartbeat`` (the default) a daemon thread renews the lease every
    ``ttl_s / 3`` seconds until it is released.
    """
    if not ttl_s > 0:
        raise ValueError(f"acquire_lease: ttl_s must be positive, got {ttl_s!r}")
    digest = identity.digest
    host = _hostname()
    holder = uuid.uuid4().hex
    with db._write() as conn:
        now = time.time()
        row = conn.execute("SELECT * FROM leases WHERE digest = ?", (digest,)).fetchone()
        if not _holder_gone(row, now, host):
            return None
        expires = now + ttl_s
        conn.execute(
            "INSERT OR REPLACE INTO leases (digest, holder, host, pid, acquired, expires, name) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (digest, holder, host, os.getpid(), now, expires, identity.name or None),
        )
    lease = Lease(digest=digest, holder=holder, expires=expires, db=db, ttl_s=float(ttl_s))
    if heartbeat:
        lease._start_heartbeat()
    return lease


def lease_holder(db: TuningDB, identity: TuningIdentity) -> dict[str, Any] | None:
    """The current (not expired) lease row of ``identity`` as a dict, or None; for logs.

    Keys: ``digest``, ``holder``, ``host``, ``pid``, ``acquired``, ``expires``, ``name``. The holder
    may have died without the row having expired yet.
    """
    with db._connection() as conn:
        row = conn.execute(
            "SELECT * FROM leases WHERE digest = ? AND expires >= ?", (identity.digest, time.time())
        ).fetchone()
    return None if row is None else dict(row)


def wait_for_winner(
    db: TuningDB,
    identity: TuningIdentity,
    *,
    timeout_s: float | None = None,
    poll_s: float = 0.05,
    max_poll_s: float = 0.5,
) -> WinnerRecord | None:
    """Wait for the holder of ``identity``'s lease to record a winner, and return it.

    Polls :meth:`TuningDB.lookup`, sleeping ``poll_s`` at first and backing off to ``max_poll_s``.
    Returns None when the lease is gone (released, expired, or its holder died on this host) and
    still no winner is stored, so the caller may take the lease and tune itself; returns None too
    when ``timeout_s`` passes.
    """
    if poll_s <= 0 or max_poll_s <= 0:
        raise ValueError("wait_for_winner: poll_s and max_poll_s must be positive")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    host = _hostname()
    delay = min(poll_s, max_poll_s)
    while True:
        # Read the lease before the winner: a holder records its session before it releases, so a
        # lease seen gone here means that a winner it recorded is visible to the lookup below.
        with db._connection() as conn:
            row = conn.execute("SELECT * FROM leases WHERE digest = ?", (identity.digest,)).fetchone()
        gone = _holder_gone(row, time.time(), host)
        rec = db.lookup(identity)
        if rec is not None:
            return rec
        if gone:
            return None
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(delay, left))
        else:
            time.sleep(delay)
        delay = min(delay * 1.5, max_poll_s)


def record_progress(db: TuningDB, identity: TuningIdentity, measurement: Measurement) -> None:
    """Store one finished candidate of ``identity``'s unfinished session (replacing an earlier
    result for the same config), in its own transaction committed before this returns."""
    text = canonical_json(measurement.as_dict())
    with db._write() as conn:
        conn.execute(
            "INSERT INTO progress (digest, config_hash, measurement, recorded) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(digest, config_hash) DO UPDATE SET measurement = excluded.measurement, "
            "recorded = excluded.recorded",
            (identity.digest, measurement.config_hash, text, time.time()),
        )


def progress(db: TuningDB, identity: TuningIdentity) -> list[Measurement]:
    """The per-config results recorded for ``identity`` since its last recorded session, ordered
    by :attr:`Measurement.order` (then by config hash)."""
    with db._connection() as conn:
        rows = conn.execute(
            "SELECT config_hash, measurement FROM progress WHERE digest = ?", (identity.digest,)
        ).fetchall()
    items = []
    for config_hash, text in rows:
        try:
            m = Measurement.from_dict(json.loads(text))
        except (ValueError, KeyError, TypeError) as e:
            raise DatabaseError(
                f"tuning database {db.where}: malformed progress row for {identity.digest}/{config_hash}: {e}"
            ) from e
        items.append((m.order, config_hash, m))
    items.sort(key=lambda t: (t[0], t[1]))
    return [m for _, _, m in items]


def clear_progress(db: TuningDB, identity: TuningIdentity) -> int:
    """Delete ``identity``'s progress rows; returns how many were deleted."""
    with db._write() as conn:
        return int(conn.execute("DELETE FROM progress WHERE digest = ?", (identity.digest,)).rowcount)
