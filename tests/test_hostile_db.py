"""Hostile tuning databases (issue 15): every unusable database gets its own exact error, and a tuned
op keeps working.

For each hostile database a tuned op (fake backend, CPU tensors) still writes correct outputs over
several calls and keys, warns exactly once (a ``DatabaseWarning``, a RuntimeWarning) with the exact
text, and leaves the file (its bytes and its records) as it was; direct ``TuningDB`` use raises the
exact exception class and message.

Running as root: root passes every permission check, so ``chmod`` alone makes nothing read-only.
As root the read-only, unreadable and uncreatable cases also deny the permission through
``tiletune.store._access`` (the seam over :func:`os.access` that TuningDB consults); SQLite then opens
the file with ``mode=ro`` exactly as for a real read-only file. What only real permissions show (SQLite
itself refusing, the ``immutable`` opening of a WAL file in a read-only folder) is tested by the
``real_permissions`` tests: directly when not root (skipped as root), and as root in a child process
run as user ``nobody`` through ``setpriv`` (skipped when not root or when that is not possible here).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import pickle
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
import warnings
from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt  # noqa: E402
import tiletune.store as _store  # noqa: E402
from tiletune.resolve import handle as database  # noqa: E402
from tiletune.devices.backends import FakeBackend  # noqa: E402
from tiletune.errors import (  # noqa: E402
    DatabaseCorrupt,
    DatabaseError,
    DatabaseLocked,
    DatabaseReadOnly,
    DatabaseUnavailable,
    DatabaseWarning,
    ForeignDatabase,
    NewerDatabase,
    TiletuneError,
)

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")

SPACE = tt.Space(TM=[32, 64, 128], TN=[32, 64], baseline=dict(TM=64, TN=64))
BEST = {"TM": 128, "TN": 64}

ELSEWHERE = "point tiletune at another file (db= or TILETUNE_DB)"
# the exception messages (another engineer maps them in the CLI and the README: keep them in sync)
E_RO_FILE = ("tuning database {p}: the file is read-only: its records can be read but no tuning result can be "
             "stored; make it writable (chmod u+w {p}), or " + ELSEWHERE)
E_RO_FOLDER = ("tuning database {p}: its folder {d} is not writable (SQLite keeps its journal next to the file): "
               "its records can be read but no tuning result can be stored; make the folder writable, or " + ELSEWHERE)
E_DIR = "tuning database {p}: it is a directory, not a file; pass a file path such as {p}/tuning.db, or move the directory away"
E_NOT_SQLITE = ("tuning database {p}: not an SQLite database, or a damaged one (SQLite: {sqlite}); move it away "
                "(tiletune then starts a new one there), or " + ELSEWHERE)
E_FOREIGN = ("tuning database {p}: it is an SQLite file of another application (application_id {app}), not a "
             "tiletune tuning database; tiletune leaves it untouched: " + ELSEWHERE)
E_STAMPED = ("tuning database {p}: it is marked as a tiletune tuning database (schema version {v}) but its tables "
             "are not tiletune's ({detail}); tiletune leaves it untouched: " + ELSEWHERE)
E_NEWER = ("tuning database {p}: it was written by a newer tiletune (schema version 3; this tiletune reads versions "
           "1 to 2); tiletune leaves it untouched: upgrade tiletune, or " + ELSEWHERE)
E_LOCKED = ("tuning database {p}: another connection has held its lock for more than 0.2 s (SQLite: database is "
            "locked); retry when that process is done with it, or " + ELSEWHERE)
E_FULL = "tuning database {p}: the disk is full (SQLite: database or disk is full); free some space, or " + ELSEWHERE
E_NO_FOLDER = ("tuning database {p}: its folder {d} does not exist and cannot be created: permission denied on {a}; "
               "create it yourself, or " + ELSEWHERE)
E_FILE_IN_THE_WAY = ("tuning database {p}: its folder {d} cannot be created: {f} is a file, not a folder; move {f} "
                     "away, or " + ELSEWHERE)
E_UNREADABLE = ("tuning database {p}: permission denied: the file cannot be read; make it readable and writable "
                "(chmod u+rw {p}), or " + ELSEWHERE)
E_CANNOT_CREATE = ("tuning database {p}: it does not exist and cannot be created: permission denied on its folder "
                   "{d}; make the folder writable, or " + ELSEWHERE)
# the warnings of a tuned op
W_UNUSABLE = "tiletune: {e}. Tuned ops go on without this database: they tune every new problem key and store nothing."
W_READ_ONLY = "tiletune: {e}. Tuned ops use its records and tune the other problem keys without storing the results."
W_FAILED = ("tiletune: {e}. Tuned ops go on without this database from now on: new tuning results are not "
            "stored.")


def model(cfg: Any) -> float:
    return 100.0 - 0.2 * cfg.TM - 0.1 * cfg.TN


def scale_kernel(x: Any, y: Any, factor: float) -> None:
    y.copy_(x * factor)


def make_op(db: Any, name: str = "scale") -> Any:
    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=db, backend=FakeBackend(model),
                 progress=False, name=name)
    def op(cfg, x, y):
        return tt.Launch(scale_kernel, (cfg.TM,), (x, y, 2.0))

    return op


SIZES = (4, 5, 4, 6, 5, 7)  # several keys, several calls of each


def run(op: Any, sizes: tuple[int, ...] = SIZES) -> None:
    """Call the op on several keys (each more than once); every call must write the right outputs."""
    for n in sizes:
        x, y = torch.randn(n), torch.full((n,), float("nan"))
        out = op(x, y)
        assert out is y and torch.equal(y, x * 2)


@contextlib.contextmanager
def db_warnings() -> Iterator[list[str]]:
    """The DatabaseWarning messages issued inside (every one: Python's own once-per-place filter is off)."""
    got: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield got
    got.extend(str(w.message) for w in caught if issubclass(w.category, DatabaseWarning))


def fingerprint(path: pathlib.Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def records(path: pathlib.Path) -> tuple[list[tuple[str, str]], int]:
    """(digest, winner config) of every winner and the number of sessions, read without touching the file."""
    uri = "file:" + os.path.abspath(path) + "?mode=ro&immutable=1"
    raw = sqlite3.connect(uri, uri=True)
    try:
        winners = sorted(raw.execute("SELECT digest, config FROM winners").fetchall())
        return winners, raw.execute("SELECT count(*) FROM sessions").fetchone()[0]
    finally:
        raw.close()


def tuned_db(path: pathlib.Path, sizes: tuple[int, ...] = (4,)) -> None:
    """A valid tiletune database at ``path`` holding the winners of the given sizes (closed, WAL mode)."""
    op = make_op(path)
    run(op, sizes)
    assert op.tuning_count == len(set(sizes))
    op.db.close()


def deny(monkeypatch: pytest.MonkeyPatch, path: pathlib.Path, mode: int) -> None:
    """Make ``path`` unwritable (``os.W_OK``) or unreadable (``os.R_OK``) for TuningDB: chmod, and as root
    (whom permissions do not stop) through ``tiletune.store._access`` as well."""
    before = path.stat().st_mode & 0o777
    if path.is_dir():
        path.chmod(0o555 if mode == os.W_OK else 0o000)
    else:
        path.chmod(0o444 if mode == os.W_OK else 0o000)
    _RESTORE.append((path, before))
    if ROOT:
        real = _store._access
        target = os.path.abspath(path)

        def access(p: Any, m: int) -> bool:
            if os.path.abspath(os.fspath(p)) == target and m & mode:
                return False
            return real(p, m)

        monkeypatch.setattr(_store, "_access", access)


_RESTORE: list[tuple[pathlib.Path, int]] = []


@pytest.fixture(autouse=True)
def _fresh_process_state() -> Iterator[None]:
    """Each test is a fresh process as far as warnings and dropped databases go; permissions restored."""
    database.forget_database_problems()
    yield
    database.forget_database_problems()
    while _RESTORE:
        path, mode = _RESTORE.pop()
        with contextlib.suppress(OSError):
            path.chmod(mode)


# ---------------------------------------------------------------------- read-only databases


def test_read_only_file_serves_its_record_without_tuning(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.db"
    tuned_db(path, (4,))
    before, recs = fingerprint(path), records(path)
    deny(monkeypatch, path, os.W_OK)
    with db_warnings() as got:
        op = make_op(path)
        run(op, (4, 4, 4))
        assert op.tuning_count == 0  # the stored winner, no tuning
        assert op.config_for(torch.randn(4), torch.empty(4)).as_dict() == BEST
    assert got == [W_READ_ONLY.format(e=E_RO_FILE.format(p=path))]
    assert op.db is not None and op.db.read_only
    assert fingerprint(path) == before and records(path) == recs


def test_read_only_file_tunes_new_keys_without_storing_and_warns_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.db"
    tuned_db(path, (4,))
    before, recs = fingerprint(path), records(path)
    deny(monkeypatch, path, os.W_OK)
    with db_warnings() as got:
        op, other = make_op(path), make_op(path, name="other")
        run(op)
        run(other, (8, 9, 8))
    assert op.tuning_count == 3 and other.tuning_count == 2  # keys 5, 6, 7 and 8, 9; key 4 from the file
    assert got == [W_READ_ONLY.format(e=E_RO_FILE.format(p=path))]  # once: two ops, five tuned keys
    assert fingerprint(path) == before and records(path) == recs


def test_read_only_file_direct_use_reads_and_refuses_writes(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.db"
    tuned_db(path, (4, 5))
    before, recs = fingerprint(path), records(path)
    deny(monkeypatch, path, os.W_OK)
    db = tt.TuningDB(path)
    assert db.read_only and str(db.read_only_reason) == E_RO_FILE.format(p=path)
    (w, _) = db.winners()
    assert w.config == BEST and db.lookup(w.identity) == w
    assert db.stats()["winners"] == 2 and len(db.sessions()) == 2
    message = E_RO_FILE.format(p=path)
    for write in (lambda: db.record_session(w.identity, [], BEST, 1.0), lambda: db.delete(name="scale"), db.clear):
        with pytest.raises(DatabaseReadOnly) as info:
            write()
        assert str(info.value) == message
        assert info.value.path == str(path) and info.value.fix.startswith("make it writable")
    db.close()
    assert fingerprint(path) == before and records(path) == recs


def test_read_only_folder_serves_its_record(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "t.db"
    tuned_db(path, (4,))
    assert _pragma(path, "journal_mode") == "wal"  # the WAL case: SQLite needs a -shm file next to it
    before, recs = fingerprint(path), records(path)
    deny(monkeypatch, folder, os.W_OK)
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert op.tuning_count == 3  # 5, 6, 7 tuned; 4 served
    assert got == [W_READ_ONLY.format(e=E_RO_FOLDER.format(p=path, d=folder))]
    with pytest.raises(DatabaseReadOnly) as info:
        tt.TuningDB(path).record_session(tt.TuningDB(path).winners()[0].identity, [], BEST, 1.0)
    assert str(info.value) == E_RO_FOLDER.format(p=path, d=folder)
    assert fingerprint(path) == before and records(path) == recs


def test_read_only_version_1_database_is_read_without_migrating(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.db"
    tuned_db(path, (4,))
    raw = sqlite3.connect(path)
    raw.execute("DROP TABLE leases")
    raw.execute("DROP TABLE progress")
    raw.execute("PRAGMA user_version = 1")
    raw.execute("PRAGMA journal_mode = DELETE")
    raw.close()
    before, recs = fingerprint(path), records(path)
    deny(monkeypatch, path, os.W_OK)
    with db_warnings() as got:
        op = make_op(path)
        run(op, (4, 4))
    assert op.tuning_count == 0 and got == [W_READ_ONLY.format(e=E_RO_FILE.format(p=path))]
    stats = tt.TuningDB(path).stats()
    assert (stats["winners"], stats["leases"], stats["progress"]) == (1, 0, 0)
    assert fingerprint(path) == before and records(path) == recs and _pragma(path, "user_version") == 1


def test_read_only_empty_file_reads_as_empty(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.db"
    path.write_bytes(b"")
    deny(monkeypatch, path, os.W_OK)
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert op.tuning_count == 4 and got == [W_READ_ONLY.format(e=E_RO_FILE.format(p=path))]
    assert tt.TuningDB(path).winners() == [] and path.read_bytes() == b""


def test_read_only_database_takes_no_lease_and_writes_no_progress(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.db"
    tuned_db(path, (4,))
    deny(monkeypatch, path, os.W_OK)
    import tiletune.resolve.leases as leases

    def no_lease(*a: Any, **k: Any) -> None:
        raise AssertionError("a read-only database must not be leased")

    monkeypatch.setattr(leases, "acquire_lease", no_lease)
    monkeypatch.setattr(leases, "record_progress", no_lease)
    with db_warnings() as got:
        op = make_op(path)
        run(op, (5, 5))
    assert op.tuning_count == 1 and len(got) == 1


def test_unreadable_file(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.db"
    tuned_db(path, (4,))
    deny(monkeypatch, path, os.R_OK)
    message = E_UNREADABLE.format(p=path)
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert op.tuning_count == 4 and op.db is None
    assert got == [W_UNUSABLE.format(e=message)]
    with pytest.raises(DatabaseUnavailable) as info:
        tt.TuningDB(path).stats()
    assert str(info.value) == message and type(info.value) is DatabaseUnavailable
    _RESTORE.pop()[0].chmod(0o644)
    assert len(records(path)[0]) == 1


# ---------------------------------------------------------------------- missing or misplaced paths


def test_missing_parent_folders_are_created(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "a" / "b" / "t.db"
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert got == [] and op.tuning_count == 4
    op.db.close()
    assert len(records(path)[0]) == 4  # stored


def test_missing_parent_folder_that_cannot_be_created(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    path = locked / "sub" / "t.db"
    deny(monkeypatch, locked, os.W_OK)
    message = E_NO_FOLDER.format(p=path, d=locked / "sub", a=locked)
    with db_warnings() as got:
        op = make_op(path)
        run(op)
        run(make_op(path, name="again"), (4,))
    assert got == [W_UNUSABLE.format(e=message)] and op.tuning_count == 4
    with pytest.raises(DatabaseUnavailable) as info:
        tt.TuningDB(path).lookup(op.results[next(iter(op.results))].identity)
    assert str(info.value) == message
    assert not (locked / "sub").exists()


def test_file_in_the_way_of_the_folder(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "f"
    blocker.write_text("keep me")
    path = blocker / "sub" / "t.db"
    message = E_FILE_IN_THE_WAY.format(p=path, d=blocker / "sub", f=blocker)
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert got == [W_UNUSABLE.format(e=message)] and op.tuning_count == 4
    with pytest.raises(DatabaseUnavailable) as info:
        tt.TuningDB(path).stats()
    assert str(info.value) == message and blocker.read_text() == "keep me"


def test_new_file_in_a_read_only_folder(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "t.db"
    deny(monkeypatch, folder, os.W_OK)
    message = E_CANNOT_CREATE.format(p=path, d=folder)
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert got == [W_UNUSABLE.format(e=message)] and op.tuning_count == 4
    with pytest.raises(DatabaseUnavailable) as info:
        tt.TuningDB(path).stats()
    assert str(info.value) == message and not path.exists()


def test_a_directory_at_the_path(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "db_dir"
    path.mkdir()
    (path / "keep.txt").write_text("x")
    message = E_DIR.format(p=path)
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert got == [W_UNUSABLE.format(e=message)] and op.tuning_count == 4 and op.db is None
    with pytest.raises(DatabaseUnavailable) as info:
        tt.TuningDB(path).stats()
    assert str(info.value) == message
    assert sorted(p.name for p in path.iterdir()) == ["keep.txt"]


def test_default_database_from_the_environment_is_degraded_too(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "db_dir"
    path.mkdir()
    monkeypatch.setenv("TILETUNE_DB", str(path))
    with db_warnings() as got:
        op = make_op(None)
        run(op)
    assert got == [W_UNUSABLE.format(e=E_DIR.format(p=path))] and op.tuning_count == 4


# ---------------------------------------------------------------------- files that are not tiletune databases


def test_corrupt_bytes(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    path.write_bytes(b"this is not a database\n" * 200)
    before = fingerprint(path)
    message = E_NOT_SQLITE.format(p=path, sqlite="file is not a database")
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert got == [W_UNUSABLE.format(e=message)] and op.tuning_count == 4
    with pytest.raises(DatabaseCorrupt) as info:
        tt.TuningDB(path).lookup(next(iter(op.results.values())).identity)
    assert str(info.value) == message
    assert fingerprint(path) == before


def test_truncated_database(tmp_path: pathlib.Path) -> None:
    good = tmp_path / "good.db"
    tuned_db(good, (4, 5))
    path = tmp_path / "t.db"
    path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    before = fingerprint(path)
    message = E_NOT_SQLITE.format(p=path, sqlite="database disk image is malformed")
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert got == [W_UNUSABLE.format(e=message)] and op.tuning_count == 4
    with pytest.raises(DatabaseCorrupt) as info:
        tt.TuningDB(path).stats()
    assert str(info.value) == message and fingerprint(path) == before


def test_empty_file_is_initialised(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    path.write_bytes(b"")
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert got == [] and op.tuning_count == 4
    op.db.close()
    assert len(records(path)[0]) == 4


def test_foreign_sqlite_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "app.sqlite"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    raw.execute("INSERT INTO users (name) VALUES ('ada')")
    raw.commit()
    raw.close()
    before = fingerprint(path)
    message = E_FOREIGN.format(p=path, app=0)
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert got == [W_UNUSABLE.format(e=message)] and op.tuning_count == 4
    with pytest.raises(ForeignDatabase) as info:
        tt.TuningDB(path).stats()
    assert str(info.value) == message
    assert fingerprint(path) == before and _pragma(path, "journal_mode") == "delete"  # no WAL switch
    assert _tables(path) == {"users"}


@pytest.mark.parametrize(
    "version, tables, detail",
    [
        (2, ["CREATE TABLE users (id INTEGER)"], "no table leases, measurements, progress, sessions, winners"),
        (1, ["CREATE TABLE sessions (a)", "CREATE TABLE measurements (b)"], "no table winners; other columns in "
         "table measurements, sessions"),
        (2, None, "other columns in table winners"),
    ],
    ids=["other-tables", "version-1-other-tables", "tiletune-tables-with-other-columns"],
)
def test_foreign_schema_stamped_as_tiletune(
    tmp_path: pathlib.Path, version: int, tables: list[str] | None, detail: str
) -> None:
    path = tmp_path / "t.db"
    if tables is None:  # tiletune's tables, one of them changed
        tuned_db(path, (4,))
        raw = sqlite3.connect(path)
        raw.execute("ALTER TABLE winners ADD COLUMN extra TEXT")
        raw.execute("PRAGMA journal_mode = DELETE")
        raw.close()
    else:
        raw = sqlite3.connect(path)
        for statement in tables:
            raw.execute(statement)
        raw.execute(f"PRAGMA application_id = {_store.APPLICATION_ID}")
        raw.execute(f"PRAGMA user_version = {version}")
        raw.commit()
        raw.close()
    before, objects = fingerprint(path), _tables(path)
    message = E_STAMPED.format(p=path, v=version, detail=detail)
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert got == [W_UNUSABLE.format(e=message)]
    with pytest.raises(ForeignDatabase) as info:
        tt.TuningDB(path).stats()  # `tiletune db stats` used to report success and switch it to WAL
    assert str(info.value) == message
    assert fingerprint(path) == before and _tables(path) == objects and _pragma(path, "journal_mode") == "delete"


def test_newer_tiletune_database(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    tuned_db(path, (4,))
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version = 3")
    raw.close()
    before, recs = fingerprint(path), records(path)
    message = E_NEWER.format(p=path)
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert got == [W_UNUSABLE.format(e=message)] and op.tuning_count == 4  # not even key 4 is read
    with pytest.raises(NewerDatabase) as info:
        tt.TuningDB(path).lookup(next(iter(op.results.values())).identity)
    assert str(info.value) == message
    assert fingerprint(path) == before and records(path) == recs


# ---------------------------------------------------------------------- failures at write time


@pytest.fixture
def short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_store, "BUSY_TIMEOUT_MS", 200)


def test_locked_wal_database_fails_at_write_and_is_not_retried(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, short_busy_timeout: None
) -> None:
    path = tmp_path / "t.db"
    tuned_db(path, (4,))
    recs = records(path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # WAL: readers go on, no writer gets in
    writes = _count_writes(monkeypatch)
    try:
        with db_warnings() as got:
            op = make_op(path)
            run(op)
            run(make_op(path, name="again"), (4, 8))
        assert op.tuning_count == 3  # 4 read from the file; 5, 6, 7 tuned
        assert got == [W_FAILED.format(e=E_LOCKED.format(p=path))]
        assert writes == [1]  # one write tried (the first lease); none again, by either op
        with pytest.raises(DatabaseLocked) as info:
            tt.TuningDB(path).record_session(next(iter(op.results.values())).identity, [], BEST, 1.0)
        assert str(info.value) == E_LOCKED.format(p=path)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert records(path) == recs


def test_locked_rollback_journal_database_fails_at_open(
    tmp_path: pathlib.Path, short_busy_timeout: None
) -> None:
    path = tmp_path / "t.db"
    tuned_db(path, (4,))
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA journal_mode = DELETE")
    raw.close()
    before, recs = fingerprint(path), records(path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("UPDATE winners SET median_us = median_us")  # an exclusive lock: readers wait too
    try:
        with db_warnings() as got:
            op = make_op(path)
            run(op)
        assert op.tuning_count == 4 and got == [W_UNUSABLE.format(e=E_LOCKED.format(p=path))]
        with pytest.raises(DatabaseLocked) as info:
            tt.TuningDB(path).stats()
        assert str(info.value) == E_LOCKED.format(p=path)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert fingerprint(path) == before and records(path) == recs


def test_disk_full_at_write_time(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.db"
    tuned_db(path, (4,))
    raw = sqlite3.connect(path)
    raw.execute("VACUUM")  # no free pages left
    raw.close()
    recs = records(path)
    real_open = _store.TuningDB._open

    def full_open(self: Any, target: str, uri: bool = False) -> sqlite3.Connection:
        conn = real_open(self, target, uri)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")  # SQLITE_FULL once the file would grow
        return conn

    monkeypatch.setattr(_store.TuningDB, "_open", full_open)
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert op.tuning_count == 3 and got == [W_FAILED.format(e=E_FULL.format(p=path))]
    assert op.db is None  # dropped: not tried again
    monkeypatch.undo()
    assert records(path) == recs


def test_a_failing_database_is_opened_once_per_process(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.db"
    path.write_bytes(b"garbage" * 100)
    opened: list[str] = []
    real = _store.TuningDB._connect

    def counting(self: Any) -> sqlite3.Connection:
        opened.append(self.where)
        return real(self)

    monkeypatch.setattr(_store.TuningDB, "_connect", counting)
    with db_warnings() as got:
        for name in ("a", "b", "c"):
            run(make_op(path, name=name))
        run(make_op(tt.TuningDB(path), name="d"))  # a TuningDB object of the same path
    assert opened == [str(path)] and len(got) == 1


def test_one_warning_per_path(tmp_path: pathlib.Path) -> None:
    paths = [tmp_path / "a.db", tmp_path / "b.db"]
    for p in paths:
        p.write_bytes(b"garbage" * 100)
    with db_warnings() as got:
        for p in paths * 2:
            run(make_op(p), (4, 5))
    assert got == [W_UNUSABLE.format(e=E_NOT_SQLITE.format(p=p, sqlite="file is not a database")) for p in paths]


def test_a_database_that_breaks_during_tuning(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.db"
    tuned_db(path, (4,))
    recs = records(path)

    def broken(self: Any, *a: Any, **k: Any) -> str:
        raise sqlite3.OperationalError("disk I/O error")

    with _store.TuningDB(path) as probe:  # the error mapping the op meets (the one raised below)
        with pytest.raises(DatabaseUnavailable) as info:
            with probe._translate():
                broken(None)
    message = str(info.value)
    assert message == f"tuning database {path}: an I/O error (SQLite: disk I/O error); check the disk, or {ELSEWHERE}"

    def record_session(self: Any, *a: Any, **k: Any) -> str:
        with self._translate():
            return broken(self)

    monkeypatch.setattr(_store.TuningDB, "record_session", record_session)
    with db_warnings() as got:
        op = make_op(path)
        run(op)
    assert op.tuning_count == 3 and got == [W_FAILED.format(e=message)] and op.db is None
    assert records(path) == recs
    assert tt.TuningDB(path).stats()["leases"] == 0  # the lease was released


# ---------------------------------------------------------------------- the exception classes


def test_exception_classes_hierarchy_attributes_and_pickling(tmp_path: pathlib.Path) -> None:
    for cls in (DatabaseUnavailable, DatabaseReadOnly, DatabaseLocked, DatabaseCorrupt, ForeignDatabase, NewerDatabase):
        assert issubclass(cls, DatabaseError) and issubclass(cls, TiletuneError)
        e = cls("/x/t.db", "the problem", "the fix")
        assert str(e) == "tuning database /x/t.db: the problem; the fix"
        assert (e.path, e.problem, e.fix) == ("/x/t.db", "the problem", "the fix")
        again = pickle.loads(pickle.dumps(e))
        assert type(again) is cls and str(again) == str(e) and again.fix == "the fix"
    assert issubclass(DatabaseReadOnly, DatabaseUnavailable) and issubclass(DatabaseLocked, DatabaseUnavailable)
    assert issubclass(DatabaseWarning, RuntimeWarning)
    assert str(DatabaseError("plain")) == "plain" and DatabaseError("plain").path is None


# ---------------------------------------------------------------------- real permissions


def _real_read_only_scenarios(base: pathlib.Path) -> list[str]:
    """Run as a user whom permissions stop; returns the problems found (empty: all good)."""
    problems: list[str] = []
    good = base / "good"
    good.mkdir()
    tuned_db(good / "t.db", (4,))
    for label, mode_path, mode in (("file", "rof/t.db", 0o444), ("folder", "rod", 0o555)):
        shutil.copytree(good, base / mode_path.split("/")[0])
        path = base / mode_path.split("/")[0] / "t.db"
        before = fingerprint(path)
        os.chmod(base / mode_path, mode)
        try:
            database.forget_database_problems()
            with db_warnings() as got:
                op = make_op(path)
                run(op)
            expected = (E_RO_FILE.format(p=path) if label == "file"
                        else E_RO_FOLDER.format(p=path, d=path.parent))
            if got != [W_READ_ONLY.format(e=expected)]:
                problems.append(f"{label}: warnings {got}")
            if op.tuning_count != 3:
                problems.append(f"{label}: tuned {op.tuning_count} keys, expected 3")
            if fingerprint(path) != before:
                problems.append(f"{label}: the file changed")
            if label == "folder" and sorted(p.name for p in path.parent.iterdir()) != ["t.db"]:
                problems.append(f"folder: files created {sorted(p.name for p in path.parent.iterdir())}")
            try:
                tt.TuningDB(path).clear()
                problems.append(f"{label}: clear() did not raise")
            except DatabaseReadOnly as e:
                if str(e) != expected:
                    problems.append(f"{label}: {e}")
        finally:
            os.chmod(base / mode_path, 0o755 if label == "folder" else 0o644)
    return problems


@pytest.mark.skipif(ROOT, reason="root passes every permission check (covered as root by the setpriv test)")
def test_real_permissions_read_only_file_and_folder(tmp_path: pathlib.Path) -> None:
    assert _real_read_only_scenarios(tmp_path) == []


_CHILD = textwrap.dedent(
    """
    import pathlib, sys
    sys.path.insert(0, sys.argv[2])
    import test_hostile_db as t
    print("IMPORTED", flush=True)
    problems = t._real_read_only_scenarios(pathlib.Path(sys.argv[1]))
    print("PROBLEMS", problems)
    sys.exit(1 if problems else 0)
    """
)


@pytest.mark.skipif(not ROOT, reason="runs an unprivileged child process; needs root")
def test_real_permissions_as_an_unprivileged_user() -> None:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv is not installed")
    drop = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    base = pathlib.Path(tempfile.mkdtemp(prefix="tiletune-hostile-"))
    try:
        base.chmod(0o777)
        tests_dir = pathlib.Path(__file__).resolve().parent
        env = dict(os.environ, HOME=str(base), PYTHONDONTWRITEBYTECODE="1")
        env.pop("TILETUNE_DB", None)
        child = subprocess.run([*drop, sys.executable, "-c", _CHILD, str(base), str(tests_dir)],
                               capture_output=True, text=True, env=env, timeout=300)
        if "IMPORTED" not in child.stdout:  # no separate probe: the child's own imports tell (a torch import less)
            pytest.skip(f"user 65534 cannot run this Python, tiletune and the tests here: {child.stderr.strip()[-300:]}")
        assert child.returncode == 0, child.stdout + child.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------------- helpers


def _pragma(path: pathlib.Path, name: str) -> Any:
    raw = sqlite3.connect("file:" + os.path.abspath(path) + "?mode=ro", uri=True)
    try:
        return raw.execute(f"PRAGMA {name}").fetchone()[0]
    finally:
        raw.close()


def _tables(path: pathlib.Path) -> set[str]:
    raw = sqlite3.connect("file:" + os.path.abspath(path) + "?mode=ro&immutable=1", uri=True)
    try:
        return {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        raw.close()


def _count_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A one-item list counting TuningDB write transactions begun (from now on)."""
    count = [0]
    real = _store.TuningDB._write
    lock = threading.Lock()

    def counting(self: Any) -> Any:
        with lock:
            count[0] += 1
        return real(self)

    monkeypatch.setattr(_store.TuningDB, "_write", counting)
    return count
