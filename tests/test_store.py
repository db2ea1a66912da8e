"""Tests of the persistent tuning database (tiletune.store)."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import multiprocessing
import os
import pathlib
import sqlite3
import sys
import threading
import time

import pytest

from tiletune.errors import DatabaseError
from tiletune.records import DeviceInfo, Measurement, Status, TuningIdentity, canonical_json
from tiletune.store import (
    EXPORT_FORMAT,
    SCHEMA_VERSION,
    TuningDB,
    WinnerRecord,
    default_db_path,
)

H100 = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
VERSIONS = canonical_json({"cuda_tile": "1.7.0", "tileiras": "13.1", "driver": "580.1"})


def ident(kernel_id: str = "k0", *, key: object = None, name: str = "matmul", **over: object) -> TuningIdentity:
    base = dict(
        kernel_id=kernel_id,
        space_hash="s0",
        key=canonical_json(key if key is not None else {"M": 1024, "N": 1024, "dtype": "float16"}),
        device=H100,
        versions=VERSIONS,
        name=name,
    )
    base.update(over)
    return TuningIdentity(**base)  # type: ignore[arg-type]


def sample_measurements() -> list[Measurement]:
    return [
        Measurement(
            config={"TM": 64, "TN": 64, "swizzle": True},
            status=Status.OK,
            samples_us=(12.5, 12.25, 13.0),
            compile_s=0.75,
            order=0,
            is_baseline=True,
        ),
        Measurement(
            config={"TM": 128, "TN": 64, "swizzle": False},
            status=Status.OK,
            samples_us=(9.5, 9.75, 9.625, 10.0),
            compile_s=None,
            order=1,
        ),
        Measurement(
            config={"TM": 256, "TN": 256, "swizzle": True},
            status=Status.COMPILE_ERROR,
            reason="tileiras: error: tile too large\n  (shared memory 300 KB > 228 KB)\n",
            compile_s=1.5,
            order=2,
        ),
        Measurement(
            config={"TM": 32, "TN": 32, "swizzle": False},
            status=Status.MISMATCH,
            reason="max abs error 0.5 > tolerance 0.01 — ünïcode",
            samples_us=(30.0,),
            order=3,
        ),
        Measurement(config={"TM": 16, "TN": 16, "swizzle": False}, status=Status.TIMEOUT, reason="timed out", order=4),
    ]


WINNER = {"TM": 128, "TN": 64, "swizzle": False}
TIED = ({"TM": 64, "TN": 64, "swizzle": True},)


@pytest.fixture
def db(tmp_path: pathlib.Path):
    with TuningDB(tmp_path / "sub" / "dir" / "tuning.db") as d:
        yield d


# ---------------------------------------------------------------------- default path


def test_default_path_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    for var in ("TILETUNE_DB", "TILETUNE_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_db_path() == tmp_path / "home" / ".cache" / "tiletune" / "tuning.db"

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_db_path() == tmp_path / "xdg" / "tiletune" / "tuning.db"

    monkeypatch.setenv("TILETUNE_CACHE_DIR", str(tmp_path / "cache"))
    assert default_db_path() == tmp_path / "cache" / "tuning.db"

    monkeypatch.setenv("TILETUNE_DB", str(tmp_path / "exact.sqlite"))
    assert default_db_path() == tmp_path / "exact.sqlite"

    # Empty variables count as unset.
    monkeypatch.setenv("TILETUNE_DB", "")
    assert default_db_path() == tmp_path / "cache" / "tuning.db"
    monkeypatch.setenv("TILETUNE_CACHE_DIR", "")
    assert default_db_path() == tmp_path / "xdg" / "tiletune" / "tuning.db"


def test_none_path_uses_default_and_creates_parents(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    target = tmp_path / "a" / "b" / "t.db"
    monkeypatch.setenv("TILETUNE_DB", str(target))
    with TuningDB() as d:
        assert d.path == target
        assert not target.exists()  # opened lazily
        d.record_session(ident(), sample_measurements(), WINNER, 9.6875)
    assert target.is_file()
    with sqlite3.connect(target) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# ---------------------------------------------------------------------- record / lookup


@pytest.mark.parametrize("where", ["file", "memory"])
def test_record_lookup_round_trip(where: str, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db" if where == "file" else ":memory:"
    ms = sample_measurements()
    with TuningDB(path) as d:
        assert d.lookup(ident()) is None
        t0 = time.time()
        sid = d.record_session(ident(), ms, WINNER, 9.6875, tied=TIED)
        assert isinstance(sid, str) and len(sid) == 32 and int(sid, 16) >= 0

        rec = d.lookup(ident())
        assert isinstance(rec, WinnerRecord)
        assert rec.config == WINNER
        assert rec.median_us == 9.6875
        assert rec.session_id == sid
        assert rec.tied == TIED
        assert t0 - 1 <= rec.created <= time.time() + 1
        assert rec.identity == ident()

        got = d.measurements(ident())
        assert got == ms  # every field: config, status, reason, samples, compile_s (incl. None), order, baseline
        assert [m.as_dict() for m in got] == [m.as_dict() for m in ms]
        assert [Measurement.from_dict(m.as_dict()) for m in got] == ms
        assert got[1].compile_s is None and got[0].compile_s == 0.75
        assert got[2].reason == ms[2].reason and got[2].samples_us == ()
        assert got[0].is_baseline and not got[1].is_baseline
        assert d.measurements(session_id=sid) == ms
        assert d.measurements(kernel_id="k0") == ms
        assert d.measurements(kernel_id="other") == []

        st = d.stats()
        assert (st["sessions"], st["measurements"], st["winners"]) == (1, len(ms), 1)
        if where == "file":
            assert st["size_bytes"] > 0


def test_record_without_winner(db: TuningDB) -> None:
    ms = [Measurement(config={"TM": 1}, status=Status.LAUNCH_ERROR, reason="boom")]
    sid = db.record_session(ident(), ms, None, None)
    assert db.lookup(ident()) is None
    assert db.measurements(session_id=sid) == ms
    assert db.stats()["sessions"] == 1
    with pytest.raises(ValueError):
        db.record_session(ident(), ms, {"TM": 1}, None)


def test_reopen_persists(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    with TuningDB(path) as d:
        sid = d.record_session(ident(), sample_measurements(), WINNER, 9.6875, tied=TIED)
    with TuningDB(str(path)) as d:
        rec = d.lookup(ident())
        assert rec is not None and rec.session_id == sid and rec.config == WINNER
        assert d.measurements(ident()) == sample_measurements()


MISMATCHES = {
    "kernel_id (kernel edited)": dict(kernel_id="k1"),
    "space_hash": dict(space_hash="s1"),
    "key": dict(key=canonical_json({"M": 2048, "N": 1024, "dtype": "float16"})),
    "device name": dict(device=dataclasses.replace(H100, name="NVIDIA H200")),
    "device arch": dict(device=dataclasses.replace(H100, arch="sm_100")),
    "device sm_count": dict(device=dataclasses.replace(H100, sm_count=114)),
    "versions": dict(versions=canonical_json({"cuda_tile": "1.7.1", "tileiras": "13.1", "driver": "580.1"})),
}


@pytest.mark.parametrize("field", list(MISMATCHES))
def test_identity_mismatch_misses(db: TuningDB, field: str) -> None:
    db.record_session(ident(), sample_measurements(), WINNER, 9.6875)
    other = dataclasses.replace(ident(), **MISMATCHES[field])
    assert other.digest != ident().digest
    assert db.lookup(other) is None
    assert db.measurements(other) == []
    assert db.lookup(ident()) is not None  # the original still hits


def test_name_is_informational(db: TuningDB) -> None:
    db.record_session(ident(name="matmul"), sample_measurements(), WINNER, 9.6875)
    rec = db.lookup(ident(name="renamed"))
    assert rec is not None and rec.identity.name == "matmul"


def test_newest_session_wins(db: TuningDB) -> None:
    s1 = db.record_session(ident(), sample_measurements(), WINNER, 9.6875)
    second = [Measurement(config={"TM": 64, "TN": 128, "swizzle": True}, status=Status.OK, samples_us=(8.0,))]
    s2 = db.record_session(ident(name="matmul_v2"), second, {"TM": 64, "TN": 128, "swizzle": True}, 8.0)
    rec = db.lookup(ident())
    assert rec is not None
    expected = (s2, {"TM": 64, "TN": 128, "swizzle": True}, 8.0, ())
    assert (rec.session_id, rec.config, rec.median_us, rec.tied) == expected
    assert rec.identity.name == "matmul_v2"
    # Measurements of both sessions are kept, in insertion order.
    assert db.measurements(ident()) == sample_measurements() + second
    assert db.measurements(session_id=s1) == sample_measurements()
    assert len(db.winners()) == 1
    assert db.sessions() == [s1, s2]
    # A later, slower session still wins: newest, not fastest.
    s3 = db.record_session(ident(), second, WINNER, 50.0)
    rec = db.lookup(ident())
    assert rec is not None and (rec.session_id, rec.median_us) == (s3, 50.0)


def test_winners_filters_delete_clear(db: TuningDB) -> None:
    a, b, c = ident("ka", name="matmul"), ident("kb", name="softmax"), ident("ka", name="matmul", space_hash="s9")
    for i in (a, b, c):
        db.record_session(i, sample_measurements(), WINNER, 9.6875)
    assert len(db.winners()) == 3
    assert {w.identity.space_hash for w in db.winners(kernel_id="ka")} == {"s0", "s9"}
    assert [w.identity.kernel_id for w in db.winners(name="softmax")] == ["kb"]
    assert db.winners(kernel_id="kb", name="matmul") == []
    n = len(sample_measurements())

    assert db.delete(identity=c) == 1 + n
    assert db.lookup(c) is None and db.lookup(a) is not None
    assert db.delete(name="nothing-called-this") == 0
    assert db.delete(name="softmax") == 1 + n
    assert db.lookup(b) is None
    with pytest.raises(ValueError):
        db.delete()
    st = db.stats()
    assert (st["sessions"], st["measurements"], st["winners"]) == (1, n, 1)
    assert db.delete(kernel_id="ka") == 1 + n
    db.record_session(a, sample_measurements(), WINNER, 9.6875)
    assert db.clear() == 1 + n
    st = db.stats()
    assert (st["sessions"], st["measurements"], st["winners"]) == (0, 0, 0)


# ---------------------------------------------------------------------- export / import


def _fill(d: TuningDB) -> list[str]:
    sids = [
        d.record_session(ident("ka"), sample_measurements(), WINNER, 9.6875, tied=TIED),
        d.record_session(ident("ka"), sample_measurements()[:2], {"TM": 64, "TN": 64, "swizzle": True}, 12.5),
        d.record_session(ident("kb", name="softmax"), sample_measurements()[2:], None, None),
        d.record_session(ident("kc", key={"M": 7}), [], None, None),
    ]
    return sids


def _snapshot(d: TuningDB) -> dict:
    return {
        "sessions": d.sessions(),
        "winners": sorted(
            ((w.identity.digest, w.identity, w.config, w.median_us, w.session_id, w.created, w.tied) for w in d.winners()),
            key=lambda row: row[0],
        ),
        "measurements": {sid: d.measurements(session_id=sid) for sid in d.sessions()},
        "all": d.measurements(),
    }


def test_export_import_round_trip(tmp_path: pathlib.Path) -> None:
    src = TuningDB(tmp_path / "src.db")
    sids = _fill(src)
    out = tmp_path / "export.json"
    assert src.export_json(out) == 4
    doc = json.loads(out.read_text())
    assert doc["format"] == EXPORT_FORMAT and doc["version"] == 1 and isinstance(doc["exported"], str)
    assert [s["session_id"] for s in doc["sessions"]] == sids
    assert doc["sessions"][2]["winner"] is None and doc["sessions"][3]["measurements"] == []

    dst = TuningDB(tmp_path / "dst.db")
    assert dst.import_json(out) == 4
    assert _snapshot(dst) == _snapshot(src)
    for i in (ident("ka"), ident("kb"), ident("kc", key={"M": 7})):
        assert dst.lookup(i) == src.lookup(i)
    assert dst.lookup(ident("ka")).config == {"TM": 64, "TN": 64, "swizzle": True}  # the newer session's
    assert dst.stats()["measurements"] == src.stats()["measurements"]

    # Idempotent: importing again (file or stream) inserts nothing and changes nothing.
    assert dst.import_json(out) == 0
    assert dst.import_json(io.StringIO(out.read_text())) == 0
    assert _snapshot(dst) == _snapshot(src)

    # Export through a stream, filtered.
    buf = io.StringIO()
    assert src.export_json(buf, kernel_id="ka") == 2
    part = json.loads(buf.getvalue())
    assert [s["session_id"] for s in part["sessions"]] == sids[:2]
    buf = io.StringIO()
    assert src.export_json(buf, name="softmax") == 1
    mem = TuningDB(":memory:")
    assert mem.import_json(io.StringIO(buf.getvalue())) == 1
    assert mem.measurements() == sample_measurements()[2:]
    assert mem.winners() == []
    src.close(), dst.close(), mem.close()


def test_import_of_older_session_keeps_newer_winner(tmp_path: pathlib.Path) -> None:
    old = TuningDB(":memory:")
    old.record_session(ident(), sample_measurements(), {"TM": 1}, 99.0)
    buf = io.StringIO()
    old.export_json(buf)
    new = TuningDB(":memory:")
    sid = new.record_session(ident(), sample_measurements(), WINNER, 9.6875)
    assert new.import_json(io.StringIO(buf.getvalue())) == 1
    rec = new.lookup(ident())
    assert rec is not None and rec.session_id == sid and rec.config == WINNER
    assert new.stats()["sessions"] == 2


def _good_doc() -> dict:
    d = TuningDB(":memory:")
    _fill(d)
    buf = io.StringIO()
    d.export_json(buf)
    return json.loads(buf.getvalue())


def _mutate(path: str, value: object):
    def apply(doc: dict) -> dict:
        *parents, last = path.split(".")
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if value is _DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        return doc

    return apply


_DELETE = object()

MALFORMED = {
    "top level not an object": (lambda doc: [doc], "expected an object"),
    "wrong format": (_mutate("format", "pickle"), "format"),
    "missing format": (_mutate("format", _DELETE), "format"),
    "newer version": (_mutate("version", 2), "version"),
    "version as text": (_mutate("version", "1"), "version"),
    "missing sessions": (_mutate("sessions", _DELETE), "sessions"),
    "sessions not a list": (_mutate("sessions", {}), "sessions"),
    "session not an object": (_mutate("sessions.1", "x"), "sessions[1]"),
    "missing session_id": (_mutate("sessions.0.session_id", _DELETE), "session_id"),
    "empty session_id": (_mutate("sessions.0.session_id", ""), "session_id"),
    "created as text": (_mutate("sessions.0.created", "yesterday"), "created"),
    "missing identity": (_mutate("sessions.0.identity", _DELETE), "identity"),
    "missing kernel_id": (_mutate("sessions.0.identity.kernel_id", _DELETE), "kernel_id"),
    "key not a string": (_mutate("sessions.0.identity.key", {"M": 1}), "key"),
    "device missing arch": (_mutate("sessions.0.identity.device.arch", _DELETE), "arch"),
    "sm_count as float": (_mutate("sessions.0.identity.device.sm_count", 132.5), "sm_count"),
    "winner not an object": (_mutate("sessions.0.winner", [1, 2]), "winner"),
    "winner without median": (_mutate("sessions.0.winner_median_us", None), "winner_median_us"),
    "missing tied": (_mutate("sessions.0.tied", _DELETE), "tied"),
    "missing measurements": (_mutate("sessions.3.measurements", _DELETE), "sessions[3]"),
    "bad status": (_mutate("sessions.0.measurements.2.status", "exploded"), "measurements[2].status"),
    "config not an object": (_mutate("sessions.0.measurements.0.config", "TM=64"), "config"),
    "sample not a number": (_mutate("sessions.0.measurements.1.samples_us", [1.0, "2"]), "samples_us[1]"),
    "compile_s as text": (_mutate("sessions.0.measurements.1.compile_s", "fast"), "compile_s"),
    "order as bool": (_mutate("sessions.0.measurements.1.order", True), "order"),
    "baseline as int": (_mutate("sessions.0.measurements.0.is_baseline", 1), "is_baseline"),
    "missing reason": (_mutate("sessions.0.measurements.0.reason", _DELETE), "reason"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_import_rejected(tmp_path: pathlib.Path, case: str) -> None:
    mutate, fragment = MALFORMED[case]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mutate(_good_doc())))
    with TuningDB(tmp_path / "t.db") as d:
        with pytest.raises(DatabaseError) as info:
            d.import_json(bad)
        assert fragment in str(info.value)
        assert str(bad) in str(info.value)
        # All or nothing: the valid sessions before the broken one were not inserted either.
        assert d.stats()["sessions"] == 0


def test_good_doc_imports(tmp_path: pathlib.Path) -> None:
    # Control for the malformed cases: the unmodified document imports fine.
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_good_doc()))
    with TuningDB(":memory:") as d:
        assert d.import_json(good) == 4


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "not valid JSON"),
        ("{'format': 'tiletune-db'}", "not valid JSON"),
        ("__import__('os').system('false')", "not valid JSON"),
        ("[1, 2", "not valid JSON"),
    ],
)
def test_import_non_json_rejected(text: str, fragment: str) -> None:
    with TuningDB(":memory:") as d:
        with pytest.raises(DatabaseError, match=fragment):
            d.import_json(io.StringIO(text))


def test_import_missing_file(tmp_path: pathlib.Path) -> None:
    with TuningDB(":memory:") as d:
        with pytest.raises(DatabaseError, match="nope.json"):
            d.import_json(tmp_path / "nope.json")


# ---------------------------------------------------------------------- foreign files


def test_non_database_file_rejected(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "notes.db"
    content = "this is not a database, it is a text file with some words in it\n" * 100
    path.write_text(content)
    d = TuningDB(path)
    with pytest.raises(DatabaseError) as info:
        d.lookup(ident())
    assert str(path) in str(info.value) and "not an SQLite database" in str(info.value)
    with pytest.raises(DatabaseError):
        d.record_session(ident(), sample_measurements(), WINNER, 1.0)
    assert path.read_text() == content  # untouched


def test_foreign_sqlite_database_rejected(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        raw.execute("INSERT INTO users (name) VALUES ('ada')")
    raw.close()
    before = path.read_bytes()
    with pytest.raises(DatabaseError, match="not a tiletune"):
        TuningDB(path).stats()
    assert path.read_bytes() == before  # not switched to WAL, no tables added


def test_newer_schema_rejected(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    with TuningDB(path) as d:
        d.record_session(ident(), sample_measurements(), WINNER, 9.6875)
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(DatabaseError, match="newer") as info:
        TuningDB(path).lookup(ident())
    assert str(path) in str(info.value)


# ---------------------------------------------------------------------- concurrency

N_PROCS = 4
SESSIONS_PER_PROC = 25
MEAS_PER_SESSION = 10


def _writer_process(path: str, worker: int, go) -> None:  # runs in a spawned child
    go.wait(30)
    d = TuningDB(path)
    for s in range(SESSIONS_PER_PROC):
        i = ident(f"w{worker}", key={"s": s % 5}, name=f"op{worker}")
        ms = [
            Measurement(
                config={"w": worker, "s": s, "j": j}, status=Status.OK, samples_us=(float(j + 1), float(j + 2)), order=j
            )
            for j in range(MEAS_PER_SESSION)
        ]
        d.record_session(i, ms, {"w": worker, "s": s, "j": 0}, 1.5)
        assert d.lookup(i) is not None
    d.close()


def _check_complete(path: pathlib.Path, n_sessions: int) -> None:
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert raw.execute("SELECT count(*) FROM sessions").fetchone()[0] == n_sessions
        assert raw.execute("SELECT count(*) FROM measurements").fetchone()[0] == n_sessions * MEAS_PER_SESSION
        per_session = raw.execute(
            "SELECT s.session_id, s.n_measurements, count(m.id), min(m.ord), max(m.ord), count(DISTINCT m.ord) "
            "FROM sessions s LEFT JOIN measurements m USING (session_id) GROUP BY s.session_id"
        ).fetchall()
        assert len(per_session) == n_sessions
        for _sid, declared, count, lo, hi, distinct in per_session:
            n = MEAS_PER_SESSION
            assert (declared, count, lo, hi, distinct) == (n, n, 0, n - 1, n)
        # Each measurement belongs to exactly the session that wrote it (no interleaving).
        mixed = raw.execute(
            "SELECT count(*) FROM (SELECT session_id FROM measurements "
            "GROUP BY session_id HAVING count(DISTINCT json_extract(config, '$.s')) != 1 "
            "OR count(DISTINCT json_extract(config, '$.w')) != 1)"
        ).fetchone()[0]
        assert mixed == 0
    finally:
        raw.close()


_TORN_SESSIONS = (
    "SELECT count(*) FROM sessions s WHERE s.n_measurements != "
    "(SELECT count(*) FROM measurements m WHERE m.session_id = s.session_id)"
)


def _torn_sessions(path: pathlib.Path) -> int:
    """Sessions visible without all their measurements (one statement, so one snapshot)."""
    raw = sqlite3.connect(path, timeout=30)
    try:
        return raw.execute(_TORN_SESSIONS).fetchone()[0]
    except sqlite3.OperationalError:  # tables not created yet
        return 0
    finally:
        raw.close()


def test_concurrent_writer_processes(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "shared" / "tuning.db"  # fresh file: the processes also race to create it
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    procs = [ctx.Process(target=_writer_process, args=(str(path), w, go)) for w in range(N_PROCS)]
    for p in procs:
        p.start()
    go.set()
    # While they write, a reader must never see a half-written session.
    deadline = time.monotonic() + 60
    torn = 0
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        if path.exists():
            torn += _torn_sessions(path)
        time.sleep(0.002)
    for p in procs:
        p.join(60)
    assert torn == 0
    assert [p.exitcode for p in procs] == [0] * N_PROCS

    _check_complete(path, N_PROCS * SESSIONS_PER_PROC)
    with TuningDB(path) as d:
        # 5 distinct keys per worker -> 5 winners each; every winner is the newest session of its identity.
        assert len(d.winners()) == N_PROCS * 5
        for w in range(N_PROCS):
            for k in range(5):
                rec = d.lookup(ident(f"w{w}", key={"s": k}))
                assert rec is not None and rec.config == {"w": w, "s": SESSIONS_PER_PROC - 5 + k, "j": 0}
                assert len(d.measurements(ident(f"w{w}", key={"s": k}))) == (SESSIONS_PER_PROC // 5) * MEAS_PER_SESSION


def test_threads_share_one_object(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    d = TuningDB(path)
    n_threads, per_thread = 8, 15
    errors: list[BaseException] = []
    torn: list[int] = []
    barrier = threading.Barrier(n_threads + 1)

    def writer(t: int) -> None:
        try:
            barrier.wait()
            for s in range(per_thread):
                i = ident(f"t{t}", key={"s": s})
                ms = [
                    Measurement(config={"w": t, "s": s, "j": j}, status=Status.OK, samples_us=(1.0,), order=j)
                    for j in range(MEAS_PER_SESSION)
                ]
                d.record_session(i, ms, {"w": t, "s": s, "j": 0}, 1.0)
                assert d.lookup(i) is not None
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def reader() -> None:
        try:
            barrier.wait()
            for _ in range(50):
                d.stats()
                d.winners()
                torn.append(_torn_sessions(path))
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(torn) == 50 and sum(torn) == 0
    d.close()
    _check_complete(path, n_threads * per_thread)
    with TuningDB(path) as again:
        assert len(again.winners()) == n_threads * per_thread


def test_threads_share_memory_db() -> None:
    d = TuningDB(":memory:")
    errors: list[BaseException] = []

    def writer(t: int) -> None:
        try:
            for s in range(10):
                d.record_session(ident(f"t{t}", key={"s": s}), sample_measurements(), WINNER, 1.0)
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert d.stats()["sessions"] == 40  # one shared in-memory database, not one per thread
    assert d.stats()["measurements"] == 40 * len(sample_measurements())


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="needs fork")
def test_reopens_after_fork(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    d = TuningDB(path)
    d.record_session(ident("parent"), sample_measurements(), WINNER, 1.0)
    with d._connection() as parent_conn:
        pass
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            with d._connection() as child_conn:
                fresh = child_conn is not parent_conn
            d.record_session(ident("child"), sample_measurements(), WINNER, 2.0)
            code = 0 if fresh and d.lookup(ident("parent")) is not None else 2
        finally:
            os.write(w, bytes([code]))
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    code = os.read(r, 1)
    os.close(r)
    assert code == b"\x00" and os.waitstatus_to_exitcode(status) == 0
    # The parent's connection still works and sees the child's session.
    rec = d.lookup(ident("child"))
    assert rec is not None and rec.median_us == 2.0
    d.record_session(ident("parent2"), sample_measurements(), WINNER, 3.0)
    assert d.stats()["sessions"] == 3
    d.close()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    raw.close()


def test_no_pickle_in_store() -> None:
    import tiletune.store as store

    source = pathlib.Path(store.__file__).read_text()
    for forbidden in ("import pickle", "pickle.load", "marshal", "eval(", "exec("):
        assert forbidden not in source


# ---------------------------------------------------------------------- exact import messages (issue 21)

#: What the user reads for each malformed document, after "import file PATH: " (the messages name the
#: field and what was wrong with it; mutation testing showed fragments alone let them rot).
MALFORMED_MESSAGES = {
    "top level not an object": "document: expected an object, got list",
    "wrong format": "format is 'pickle', expected 'tiletune-db'",
    "missing format": "document: missing field 'format'",
    "newer version": "unsupported version 2 (this tiletune reads version 1)",
    "version as text": "unsupported version '1' (this tiletune reads version 1)",
    "missing sessions": "document: missing field 'sessions'",
    "sessions not a list": "sessions: expected a list, got dict",
    "session not an object": "sessions[1]: expected an object, got str",
    "missing session_id": "sessions[0]: missing field 'session_id'",
    "empty session_id": "sessions[0].session_id: must be a non-empty string of at most 128 characters",
    "created as text": "sessions[0].created: expected a number, got str",
    "missing identity": "sessions[0]: missing field 'identity'",
    "missing kernel_id": "sessions[0].identity: missing field 'kernel_id'",
    "key not a string": "sessions[0].identity.key: expected a string, got dict",
    "device missing arch": "sessions[0].identity.device: missing field 'arch'",
    "sm_count as float": "sessions[0].identity.device.sm_count: expected an integer, got float",
    "winner not an object": "sessions[0].winner: expected an object, got list",
    "winner without median": "sessions[0].winner_median_us: missing for the winner",
    "missing tied": "sessions[0]: missing field 'tied'",
    "missing measurements": "sessions[3]: missing field 'measurements'",
    "bad status": "sessions[0].measurements[2].status: 'exploded' is not one of "
                  "['compile_error', 'launch_error', 'mismatch', 'ok', 'timeout']",
    "config not an object": "sessions[0].measurements[0].config: expected an object, got str",
    "sample not a number": "sessions[0].measurements[1].samples_us[1]: expected a number, got str",
    "compile_s as text": "sessions[0].measurements[1].compile_s: expected a number, got str",
    "order as bool": "sessions[0].measurements[1].order: expected an integer, got bool",
    "baseline as int": "sessions[0].measurements[0].is_baseline: expected true or false, got int",
    "missing reason": "sessions[0].measurements[0]: missing field 'reason'",
}

MORE_MALFORMED = {
    "version as bool": (_mutate("version", True), "unsupported version True (this tiletune reads version 1)"),
    "session_id too long": (_mutate("sessions.0.session_id", "s" * 129),
                            "sessions[0].session_id: must be a non-empty string of at most 128 characters"),
    "session_id not a string": (_mutate("sessions.0.session_id", 7),
                                "sessions[0].session_id: expected a string, got int"),
    "created not finite": (_mutate("sessions.0.created", float("inf")),
                           "sessions[0].created: expected a finite number, got Infinity "
                           "(NaN and Infinity are not standard JSON)"),
    "median without winner": (lambda d: (d["sessions"][0].update(winner=None, winner_median_us=1.0), d)[1],
                              "sessions[0].winner_median_us: given without a winner"),
    "median as text": (_mutate("sessions.0.winner_median_us", "fast"),
                       "sessions[0].winner_median_us: expected a number, got str"),
    "tied entry not an object": (_mutate("sessions.0.tied", [3]), "sessions[0].tied[0]: expected an object, got int"),
    "tied not a list": (_mutate("sessions.0.tied", {}), "sessions[0].tied: expected a list, got dict"),
    "measurements not a list": (_mutate("sessions.0.measurements", {}),
                                "sessions[0].measurements: expected a list, got dict"),
    "measurement not an object": (_mutate("sessions.0.measurements.1", 5),
                                  "sessions[0].measurements[1]: expected an object, got int"),
    "samples not a list": (_mutate("sessions.0.measurements.1.samples_us", 5.0),
                           "sessions[0].measurements[1].samples_us: expected a list, got float"),
    "status not a string": (_mutate("sessions.0.measurements.0.status", 3),
                            "sessions[0].measurements[0].status: expected a string, got int"),
    "name not a string": (_mutate("sessions.0.identity.name", 3), "sessions[0].identity.name: expected a string, got int"),
    "identity not an object": (_mutate("sessions.0.identity", "x"), "sessions[0].identity: expected an object, got str"),
    "device not an object": (_mutate("sessions.0.identity.device", "H200"),
                             "sessions[0].identity.device: expected an object, got str"),
    "missing device": (_mutate("sessions.0.identity.device", _DELETE), "sessions[0].identity: missing field 'device'"),
    "missing device name": (_mutate("sessions.0.identity.device.name", _DELETE),
                            "sessions[0].identity.device: missing field 'name'"),
    "missing sm_count": (_mutate("sessions.0.identity.device.sm_count", _DELETE),
                         "sessions[0].identity.device: missing field 'sm_count'"),
    "missing space_hash": (_mutate("sessions.0.identity.space_hash", _DELETE),
                           "sessions[0].identity: missing field 'space_hash'"),
    "missing key": (_mutate("sessions.0.identity.key", _DELETE), "sessions[0].identity: missing field 'key'"),
    "missing versions": (_mutate("sessions.0.identity.versions", _DELETE),
                         "sessions[0].identity: missing field 'versions'"),
    "missing created": (_mutate("sessions.0.created", _DELETE), "sessions[0]: missing field 'created'"),
    "missing winner": (_mutate("sessions.0.winner", _DELETE), "sessions[0]: missing field 'winner'"),
    "missing version": (_mutate("version", _DELETE), "document: missing field 'version'"),
    "missing config": (_mutate("sessions.0.measurements.0.config", _DELETE),
                       "sessions[0].measurements[0]: missing field 'config'"),
    "missing status": (_mutate("sessions.0.measurements.0.status", _DELETE),
                       "sessions[0].measurements[0]: missing field 'status'"),
    "missing samples": (_mutate("sessions.0.measurements.0.samples_us", _DELETE),
                        "sessions[0].measurements[0]: missing field 'samples_us'"),
    "missing compile_s": (_mutate("sessions.0.measurements.0.compile_s", _DELETE),
                          "sessions[0].measurements[0]: missing field 'compile_s'"),
    "missing order": (_mutate("sessions.0.measurements.0.order", _DELETE),
                      "sessions[0].measurements[0]: missing field 'order'"),
    "missing is_baseline": (_mutate("sessions.0.measurements.0.is_baseline", _DELETE),
                            "sessions[0].measurements[0]: missing field 'is_baseline'"),
    "reason not a string": (_mutate("sessions.0.measurements.0.reason", None),
                            "sessions[0].measurements[0].reason: expected a string, got NoneType"),
}


def _exact_cases():
    cases = {name: (MALFORMED[name][0], msg) for name, msg in MALFORMED_MESSAGES.items()}
    cases.update(MORE_MALFORMED)
    return cases


@pytest.mark.parametrize("case", list(_exact_cases()))
def test_malformed_import_message_is_exact(tmp_path: pathlib.Path, case: str) -> None:
    mutate, message = _exact_cases()[case]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mutate(_good_doc())))
    with TuningDB(":memory:") as d:
        with pytest.raises(DatabaseError) as info:
            d.import_json(bad)
        assert str(info.value) == f"import file {bad}: {message}"
        assert d.stats()["sessions"] == 0


def test_every_malformed_case_has_its_exact_message() -> None:
    assert set(MALFORMED_MESSAGES) == set(MALFORMED)


def test_import_accepts_the_limits(tmp_path: pathlib.Path) -> None:
    doc = _good_doc()
    doc["sessions"][0]["session_id"] = "s" * 128  # the longest allowed id
    doc["sessions"][0]["created"] = 5  # an integer time is a number
    doc["sessions"][0]["measurements"][1]["compile_s"] = None  # no compile time recorded
    doc["sessions"][0]["identity"].pop("name", None)  # the name is optional
    good = tmp_path / "good.json"
    good.write_text(json.dumps(doc))
    with TuningDB(":memory:") as d:
        assert d.import_json(good) == 4
        assert "s" * 128 in d.sessions()


def test_export_to_an_unwritable_place_says_where(tmp_path: pathlib.Path) -> None:
    dest = tmp_path / "no-such-dir" / "out.json"
    with TuningDB(":memory:") as d:
        with pytest.raises(DatabaseError, match=rf"^cannot write export file {re.escape(str(dest))}: "):
            d.export_json(dest)
    assert not dest.parent.exists()


def test_export_leaves_no_temporary_file(tmp_path: pathlib.Path) -> None:
    dest = tmp_path / "out.json"
    with TuningDB(":memory:") as d:
        assert d.export_json(dest) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
    assert json.loads(dest.read_text(encoding="utf-8"))["sessions"] == []


# ---------------------------------------------------------------------- more mutation survivors (issue 21)


def test_sessions_and_delete_filter_by_kernel_id_and_name(db: TuningDB) -> None:
    a, b, c = ident("ka", name="matmul"), ident("kb", name="matmul"), ident("ka", name="softmax")
    sa, sb, sc = (db.record_session(i, sample_measurements(), WINNER, 9.5) for i in (a, b, c))
    assert set(db.sessions()) == {sa, sb, sc}
    assert set(db.sessions(kernel_id="ka")) == {sa, sc}
    assert db.sessions(name="matmul") == [sa, sb]  # in the order they were recorded
    assert db.sessions(kernel_id="ka", name="matmul") == [sa]
    n = len(sample_measurements())
    assert db.delete(kernel_id="kb") == 1 + n
    assert db.lookup(b) is None and db.lookup(a) is not None and db.lookup(c) is not None
    with pytest.raises(ValueError, match=r"^delete\(\) needs identity, kernel_id or name; use clear\(\) "
                                         r"to remove everything$"):
        db.delete()


def test_record_session_needs_the_winner_median(db: TuningDB) -> None:
    with pytest.raises(ValueError, match=r"^record_session: winner_median_us is required when a winner is given$"):
        db.record_session(ident(), sample_measurements(), WINNER, None)


def test_stats_fields_and_size_counts_the_wal(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    with TuningDB(path) as d:
        d.record_session(ident(), sample_measurements(), WINNER, 9.5)
        st = d.stats()
        assert st["path"] == str(path) and st["schema_version"] == SCHEMA_VERSION
        wal = pathlib.Path(str(path) + "-wal")
        on_disk = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
        assert st["size_bytes"] == on_disk and wal.exists() and wal.stat().st_size > 0
    with TuningDB(":memory:") as d:
        assert d.stats()["size_bytes"] == 0


def test_export_text_is_sorted_and_indented_by_one(tmp_path: pathlib.Path) -> None:
    with TuningDB(":memory:") as d:
        d.record_session(ident(), sample_measurements(), WINNER, 9.5, TIED)
        buf = io.StringIO()
        d.export_json(buf)
    text = buf.getvalue()
    doc = json.loads(text)
    assert text == json.dumps(doc, indent=1, sort_keys=True) + "\n"
    assert doc["exported"].endswith("+00:00")  # an aware UTC time


def test_import_from_streams_bytes_and_named_files(tmp_path: pathlib.Path) -> None:
    with TuningDB(":memory:") as d:
        buf = io.StringIO()
        d.record_session(ident(), sample_measurements(), WINNER, 9.5)
        d.export_json(buf)
    text = buf.getvalue()
    with TuningDB(":memory:") as d:
        assert d.import_json(io.BytesIO(text.encode("utf-8"))) == 1  # bytes are decoded as UTF-8
    with TuningDB(":memory:") as d:
        with pytest.raises(DatabaseError, match=r"^import file <stream>: not UTF-8 text: "):
            d.import_json(io.BytesIO(b"\xff\xfe{}"))
        with pytest.raises(DatabaseError, match=r"^import file <stream>: "):
            d.import_json(io.StringIO("[]"))
    named = tmp_path / "named.json"
    named.write_text(text, encoding="utf-8")
    with open(named, encoding="utf-8") as f, TuningDB(":memory:") as d:
        with pytest.raises(DatabaseError, match=rf"^import file {re.escape(str(named))}: cannot read it: "):
            class Broken(io.StringIO):
                name = str(named)

                def read(self, *a):
                    raise OSError("disk on fire")

            d.import_json(Broken())
        assert d.import_json(f) == 1


def test_import_skips_present_sessions_and_keeps_going(tmp_path: pathlib.Path) -> None:
    with TuningDB(":memory:") as d:
        d.record_session(ident("ka"), sample_measurements(), WINNER, 9.5)
        d.record_session(ident("kb"), sample_measurements(), WINNER, 9.5)
        buf = io.StringIO()
        d.export_json(buf)
    doc = json.loads(buf.getvalue())
    with TuningDB(":memory:") as d:
        first = {**doc, "sessions": doc["sessions"][:1]}
        assert d.import_json(io.StringIO(json.dumps(first))) == 1
        assert d.import_json(io.StringIO(json.dumps(doc))) == 1  # the present one is skipped, not the rest
        assert len(d.sessions()) == 2


def test_a_directory_as_database_path_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(DatabaseError, match=rf"^tuning database {re.escape(str(tmp_path))}: it is a directory, not a file; "):
        with TuningDB(tmp_path) as d:
            d.stats()


# ---------------------------------------------------------------------- opening: schema, migration, WAL, fork, close
# (fast tests of TuningDB.__init__, _connect, _classify, _enable_wal, _check_fork and close, written
# for the mutation run of issue 21: their other covering tests are test_leases' multi-process races)

import tiletune.store as _store  # noqa: E402

_V2_TABLES = {"sessions", "measurements", "winners", "leases", "progress"}
_INDEXES = {
    "measurements_digest", "measurements_kernel", "measurements_session",
    "sessions_digest", "sessions_kernel", "winners_kernel",
}


def _objects(path: pathlib.Path) -> tuple[set[str], set[str]]:
    raw = sqlite3.connect(path)
    try:
        rows = raw.execute("SELECT type, name FROM sqlite_master").fetchall()
    finally:
        raw.close()
    return {n for t, n in rows if t == "table"}, {n for t, n in rows if t == "index"}


def _pragmas(path: pathlib.Path) -> tuple[int, int, str]:
    raw = sqlite3.connect(path)
    try:
        return (raw.execute("PRAGMA application_id").fetchone()[0], raw.execute("PRAGMA user_version").fetchone()[0],
                raw.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        raw.close()


def test_init_is_lazy_and_names_its_path(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "a" / "t.db"
    d = TuningDB(str(path))  # a str path
    assert d.path == path and isinstance(d.path, pathlib.Path) and d.where == str(path)
    assert not path.parent.exists() and d._conns == {} and d._pid == os.getpid()
    assert not d._memory
    d.close()  # closing before first use is fine and creates nothing
    assert not path.parent.exists()
    m = TuningDB(":memory:")
    assert m._memory and m.path is None and m.where == ":memory:" and repr(m) == "TuningDB(':memory:')"
    assert TuningDB(pathlib.PurePath(":memory:"))._memory  # any os.PathLike spelling of ":memory:"


def test_fresh_file_gets_the_whole_schema_and_connection_settings(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    with TuningDB(path) as d:
        with d._connection() as conn:
            assert conn.row_factory is sqlite3.Row
            assert conn.isolation_level is None and not conn.in_transaction
            assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == _store.BUSY_TIMEOUT_MS
            assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert _pragmas(path) == (_store.APPLICATION_ID, SCHEMA_VERSION, "wal")
    tables, indexes = _objects(path)
    assert tables == _V2_TABLES and indexes >= _INDEXES


def test_empty_file_is_initialised(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    path.write_bytes(b"")
    with TuningDB(path) as d:
        d.record_session(ident(), sample_measurements(), WINNER, 9.6875)
        assert d.lookup(ident()) is not None
    assert _pragmas(path) == (_store.APPLICATION_ID, SCHEMA_VERSION, "wal")


def _make_v1(path: pathlib.Path) -> None:
    """A schema-version-1 database (before the leases and progress tables) holding one session."""
    with TuningDB(path) as d:
        d.record_session(ident(), sample_measurements(), WINNER, 9.6875)
    raw = sqlite3.connect(path)
    raw.execute("DROP TABLE leases")
    raw.execute("DROP TABLE progress")
    raw.execute("PRAGMA user_version = 1")
    raw.execute("PRAGMA journal_mode = DELETE")
    raw.close()


def test_version_1_database_is_migrated_keeping_its_rows(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    _make_v1(path)
    assert _pragmas(path) == (_store.APPLICATION_ID, 1, "delete")
    assert _objects(path)[0] == _V2_TABLES - {"leases", "progress"}
    with TuningDB(path) as d:
        rec = d.lookup(ident())
        assert rec is not None and rec.config == WINNER and rec.median_us == 9.6875
        assert d.stats()["measurements"] == len(sample_measurements())
        with d._connection() as conn:  # the new tables are usable
            conn.execute("INSERT INTO progress VALUES ('d', 'h', '{}', 1.0)")
            assert conn.execute("SELECT count(*) FROM leases").fetchone()[0] == 0
            assert not conn.in_transaction  # the migration committed
    assert _pragmas(path) == (_store.APPLICATION_ID, SCHEMA_VERSION, "wal")  # and switched to WAL
    assert _objects(path)[0] == _V2_TABLES


def test_failed_migration_leaves_the_file_as_it_was(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.db"
    _make_v1(path)
    monkeypatch.setattr(_store, "_SCHEMA", _store._SCHEMA + ("CREATE TABLE broken (",))
    with pytest.raises(DatabaseError, match=rf"^tuning database {re.escape(str(path))}: "):
        TuningDB(path).stats()
    assert _pragmas(path)[:2] == (_store.APPLICATION_ID, 1)  # rolled back: still version 1
    assert _objects(path)[0] == _V2_TABLES - {"leases", "progress"}
    monkeypatch.undo()
    with TuningDB(path) as d:  # and a later open migrates it
        assert d.lookup(ident()) is not None
    assert _pragmas(path)[:2] == (_store.APPLICATION_ID, SCHEMA_VERSION)


def _raw_file(path: pathlib.Path, app_id: int, version: int, table: bool) -> bytes:
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA application_id = {app_id}")
    raw.execute(f"PRAGMA user_version = {version}")
    if table:
        raw.execute("CREATE TABLE t (x)")
    raw.commit()
    raw.close()
    return path.read_bytes()


_UNTOUCHED = "tiletune leaves it untouched: point tiletune at another file (db= or TILETUNE_DB)"
_FOREIGN = ("tuning database {{p}}: it is an SQLite file of another application (application_id {app}), not a tiletune "
            "tuning database; " + _UNTOUCHED)


@pytest.mark.parametrize(
    "app_id, version, table, message",
    [
        (0, 0, True, _FOREIGN.format(app="0")),
        (0, 1, False, _FOREIGN.format(app="0")),
        (0x74744443, 2, True, _FOREIGN.format(app="1953776707")),
        (_store.APPLICATION_ID, 0, False, "tuning database {p}: it is marked as a tiletune tuning database but has "
         "invalid schema version 0; " + _UNTOUCHED),
        (_store.APPLICATION_ID, -1, True, "tuning database {p}: it is marked as a tiletune tuning database but has "
         "invalid schema version -1; " + _UNTOUCHED),
        (_store.APPLICATION_ID, SCHEMA_VERSION + 1, True, "tuning database {p}: it was written by a newer tiletune "
         "(schema version 3; this tiletune reads versions 1 to 2); tiletune leaves it untouched: upgrade tiletune, "
         "or point tiletune at another file (db= or TILETUNE_DB)"),
    ],
)
def test_classify_refuses_exactly(tmp_path: pathlib.Path, app_id: int, version: int, table: bool, message: str) -> None:
    path = tmp_path / "x.db"
    before = _raw_file(path, app_id, version, table)
    d = TuningDB(path)
    with pytest.raises(DatabaseError) as info:
        d.stats()
    assert str(info.value) == message.format(p=path)
    assert path.read_bytes() == before and _pragmas(path)[2] == "delete"  # not modified, not switched to WAL
    assert d._conns == {}  # the refused connection was not kept


def test_unreadable_file_message_is_exact(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "x.db"
    path.write_bytes(b"not a database at all " * 50)
    with pytest.raises(DatabaseError) as info:
        TuningDB(path).stats()
    assert str(info.value) == (f"tuning database {path}: not an SQLite database, or a damaged one (SQLite: file is not "
                               "a database); move it away (tiletune then starts a new one there), or point tiletune "
                               "at another file (db= or TILETUNE_DB)")


def test_classify_versions_and_its_own_snapshot(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    with TuningDB(path) as d:
        d.stats()
    conn = sqlite3.connect(path, isolation_level=None)
    d = TuningDB(path)
    assert d._classify(conn) == SCHEMA_VERSION and type(d._classify(conn)) is int
    assert not conn.in_transaction  # its own BEGIN is committed
    conn.execute("BEGIN")  # inside the caller's transaction it neither begins nor commits
    assert d._classify(conn) == SCHEMA_VERSION and conn.in_transaction
    conn.execute("COMMIT")
    conn.execute("PRAGMA user_version = 1")
    assert d._classify(conn) == 1
    conn.close()
    empty = sqlite3.connect(tmp_path / "e.db", isolation_level=None)
    assert d._classify(empty) == 0 and not empty.in_transaction
    empty.close()


def test_classify_reads_its_three_values_in_one_transaction(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    with TuningDB(path) as d:
        d.stats()
    conn = sqlite3.connect(path, isolation_level=None)
    seen: list[str] = []
    # (not counting the nested "-- PRAGMA TABLE_INFO" statements of pragma_table_info())
    conn.set_trace_callback(lambda sql: None if sql.startswith("--") else seen.append(sql.upper()))
    assert d._classify(conn) == SCHEMA_VERSION
    assert seen[0] == "BEGIN" and seen[-1] == "COMMIT" and len(seen) == 5  # a snapshot of all three reads
    seen.clear()
    conn.execute("BEGIN")
    seen.clear()
    d._classify(conn)  # inside the caller's transaction: no BEGIN or COMMIT of its own
    assert len(seen) == 3 and not any(s in ("BEGIN", "COMMIT") for s in seen)
    conn.execute("ROLLBACK")
    conn.close()


def test_enable_wal_switches_a_rollback_journal_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE t (x)")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    TuningDB._enable_wal(conn)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    TuningDB._enable_wal(conn)  # already WAL: nothing to do
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_enable_wal_retries_while_another_connection_holds_the_lock(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)  # "database is locked" at once, no busy wait
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        conn.execute("PRAGMA journal_mode = WAL")
    release = threading.Timer(0.2, lambda: holder.execute("COMMIT"))
    release.start()
    t0 = time.monotonic()
    TuningDB._enable_wal(conn)  # retries until the writer commits
    release.join()
    assert 0.15 < time.monotonic() - t0 < 5
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
    conn.close()
    holder.close()


def test_in_memory_database_is_not_switched_to_wal() -> None:
    with TuningDB(":memory:") as d:
        d.record_session(ident(), sample_measurements(), WINNER, 1.0)
        with d._connection() as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "memory"
            assert conn.execute("PRAGMA application_id").fetchone()[0] == _store.APPLICATION_ID
            assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_close_closes_every_connection_and_reopens_lazily(tmp_path: pathlib.Path) -> None:
    d = TuningDB(tmp_path / "t.db")
    d.record_session(ident(), sample_measurements(), WINNER, 1.0)
    with d._connection() as main_conn:
        pass
    other: list[sqlite3.Connection] = []

    def use() -> None:
        with d._connection() as c:
            other.append(c)

    t = threading.Thread(target=use)
    t.start()
    t.join()
    assert len(d._conns) == 2
    d.close()
    assert d._conns == {}
    for c in (main_conn, other[0]):
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            c.execute("SELECT 1")
    assert d.lookup(ident()) is not None  # a fresh connection
    with d._connection() as again:
        assert again is not main_conn
    d.close()
    d.close()  # twice is fine


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="needs fork")
def test_check_fork_orphans_the_parents_connections(tmp_path: pathlib.Path) -> None:
    d = TuningDB(tmp_path / "t.db")
    d.stats()
    with d._connection() as parent_conn:
        pass
    parent_lock = d._lock
    d._check_fork()  # same process: nothing changes
    assert d._conns and d._lock is parent_lock and parent_conn not in _store._FORK_ORPHANS
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            d.close()  # closes only the child's (none): the parent's connection stays open
            ok = (
                d._conns == {} and d._pid == os.getpid() and d._lock is not parent_lock
                and isinstance(d._lock, type(threading.RLock())) and parent_conn in _store._FORK_ORPHANS
            )
            parent_conn.execute("SELECT 1")  # not closed in the child
            code = 0 if ok else 2
        finally:
            os.write(w, bytes([code]))
            os._exit(code)
    os.close(w)
    os.waitpid(pid, 0)
    code = os.read(r, 1)
    os.close(r)
    assert code == b"\x00"
    assert d._conns and d._lock is parent_lock  # the parent's object is untouched
    assert d.stats()["sessions"] == 0
    d.close()


def test_a_file_in_the_way_of_the_folder_is_reported(tmp_path: pathlib.Path) -> None:
    (tmp_path / "f").write_text("x")
    path = tmp_path / "f" / "sub" / "t.db"
    with pytest.raises(DatabaseError, match=rf"^tuning database {re.escape(str(path))}: its folder "
                       rf"{re.escape(str(path.parent))} cannot be created: {re.escape(str(tmp_path / 'f'))} is a file, "
                       "not a folder; "):
        TuningDB(path).stats()
