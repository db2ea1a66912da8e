"""Tests of tuning leases and per-config progress (tiletune.resolve.leases), with real processes."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

import tiletune
from tiletune.resolve.leases import (
    Lease,
    acquire_lease,
    clear_progress,
    lease_holder,
    progress,
    record_progress,
    wait_for_winner,
)
from tiletune.records import DeviceInfo, Measurement, Status, TuningIdentity, canonical_json
from tiletune.store import SCHEMA_VERSION, TuningDB

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs POSIX signals")

H100 = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)
VERSIONS = canonical_json({"cuda_tile": "1.7.0", "tileiras": "13.1", "driver": "580.1"})


def ident(kernel_id: str = "k0", *, name: str = "matmul") -> TuningIdentity:
    return TuningIdentity(
        kernel_id=kernel_id,
        space_hash="s0",
        key=canonical_json({"M": 1024, "N": 1024, "dtype": "float16"}),
        device=H100,
        versions=VERSIONS,
        name=name,
    )


def ident_arg(i: TuningIdentity) -> str:
    """An identity as a command-line argument for a child process."""
    return json.dumps(
        {"kernel_id": i.kernel_id, "space_hash": i.space_hash, "key": i.key, "device": i.device.as_dict(),
         "versions": i.versions, "name": i.name}
    )


def progress_measurement(j: int) -> Measurement:
    """The j-th per-config result written by the progress child (same formula in the child)."""
    return Measurement(
        config={"TM": 16 * (j + 1), "j": j},
        status=Status.OK if j % 7 else Status.COMPILE_ERROR,
        reason="" if j % 7 else f"error {j}",
        samples_us=(1.0 + j, 1.5 + j) if j % 7 else (),
        compile_s=0.25 * j,
        order=j,
        is_baseline=j == 0,
    )


# Child processes are `python -c` programs: a common preamble, then one body per role.
# The preamble loads tiletune's package without running its __init__ (which imports numpy and the
# dispatcher): the database modules need only the stdlib, and 8 children then start in a fraction of
# the time on a small machine.
_PREAMBLE = """
import importlib.util, json, os, pathlib, sys, time, types
_pkg = types.ModuleType("tiletune")
_pkg.__path__ = list(importlib.util.find_spec("tiletune").submodule_search_locations)
sys.modules["tiletune"] = _pkg
from tiletune.resolve.leases import acquire_lease, record_progress, wait_for_winner
from tiletune.records import DeviceInfo, Measurement, Status, TuningIdentity
from tiletune.store import TuningDB
_d = json.loads(sys.argv[2])
IDENT = TuningIdentity(kernel_id=_d["kernel_id"], space_hash=_d["space_hash"], key=_d["key"],
                       device=DeviceInfo.from_dict(_d["device"]), versions=_d["versions"], name=_d["name"])
db = TuningDB(sys.argv[1])
"""

_RACER = _PREAMBLE + """
me, n, sync = int(sys.argv[3]), int(sys.argv[4]), pathlib.Path(sys.argv[5])
db.stats()  # open (and create) the database before the race
(sync / f"ready{me}").touch()
while not (sync / "go").exists():
    time.sleep(0.002)
lease = acquire_lease(db, IDENT, ttl_s=10.0)
(sync / f"tried{me}").touch()
if lease is not None:
    with lease:
        while len(list(sync.glob("tried*"))) < n:  # hold it until every process has tried
            time.sleep(0.005)
        time.sleep(0.1)  # the others are polling now
        m = Measurement(config={"who": me}, status=Status.OK, samples_us=(1.0,))
        db.record_session(IDENT, [m], {"who": me}, 1.0)
    role, rec = "holder", db.lookup(IDENT)
else:
    role, rec = "waiter", wait_for_winner(db, IDENT, timeout_s=20.0, max_poll_s=0.1)
print(json.dumps({"me": me, "role": role, "winner": None if rec is None else rec.config}), flush=True)
"""

_HOLDER = _PREAMBLE + """
lease = acquire_lease(db, IDENT, ttl_s=float(sys.argv[3]))
print(json.dumps({"pid": os.getpid(), "holder": None if lease is None else lease.holder}), flush=True)
if sys.argv[4] == "sleep":
    time.sleep(60)
"""

_PROGRESS = _PREAMBLE + """
for j in range(5000):
    m = Measurement(config={"TM": 16 * (j + 1), "j": j}, status=Status.OK if j % 7 else Status.COMPILE_ERROR,
                    reason="" if j % 7 else f"error {j}", samples_us=(1.0 + j, 1.5 + j) if j % 7 else (),
                    compile_s=0.25 * j, order=j, is_baseline=j == 0)
    record_progress(db, IDENT, m)
    print(j, flush=True)
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(pathlib.Path(tiletune.__file__).resolve().parents[1])  # works installed or from the checkout
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _child(code: str, *args: str) -> subprocess.Popen[str]:
    # -S: no site processing (startup costs less); the children need only the stdlib and tiletune,
    # which PYTHONPATH names.
    return subprocess.Popen(
        [sys.executable, "-S", "-c", code, *args], stdout=subprocess.PIPE, text=True, env=_env()
    )


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)  # reaped: its pid no longer exists
    assert proc.returncode == -signal.SIGKILL


def _raw(path: pathlib.Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path, timeout=30)
    try:
        with conn:
            return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


@pytest.fixture
def dbpath(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "tuning.db"


# ---------------------------------------------------------------------- leases across processes


def test_eight_processes_race_one_tunes_the_rest_wait(dbpath: pathlib.Path, tmp_path: pathlib.Path) -> None:
    n = 8
    sync = tmp_path / "sync"
    sync.mkdir()
    i = ident()
    procs = [_child(_RACER, str(dbpath), ident_arg(i), str(k), str(n), str(sync)) for k in range(n)]
    try:
        deadline = time.monotonic() + 30
        while len(list(sync.glob("ready*"))) < n and time.monotonic() < deadline:
            time.sleep(0.005)
        (sync / "go").touch()
        outs = [json.loads(p.communicate(timeout=30)[0]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * n
    holders = [o["me"] for o in outs if o["role"] == "holder"]
    assert len(holders) == 1  # exactly one process got the lease
    winner = {"who": holders[0]}
    assert [o["winner"] for o in outs] == [winner] * n  # every waiter got the holder's winner
    with TuningDB(dbpath) as d:
        assert len(d.sessions()) == 1  # tuned once
        assert d.stats()["leases"] == 0  # released


def test_sigkilled_holder_is_taken_over_at_once_on_this_host(dbpath: pathlib.Path) -> None:
    i = ident()
    proc = _child(_HOLDER, str(dbpath), ident_arg(i), "30", "sleep")
    try:
        info = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        assert info["holder"] is not None
        with TuningDB(dbpath) as d:
            row = lease_holder(d, i)
            assert row is not None and row["pid"] == info["pid"] and row["holder"] == info["holder"]
            assert acquire_lease(d, i) is None  # a live holder keeps it
            t0 = time.monotonic()
            assert wait_for_winner(d, i, timeout_s=0.3, poll_s=0.02) is None  # waits for the live holder
            assert time.monotonic() - t0 >= 0.3
            _kill(proc)
            t0 = time.monotonic()
            assert wait_for_winner(d, i, timeout_s=10) is None  # holder dead: returns at once
            assert time.monotonic() - t0 < 1.0
            lease = acquire_lease(d, i)  # 30 s ttl, but the holder's pid is dead on this host
            assert lease is not None
            with lease:
                row = lease_holder(d, i)
                assert row is not None and row["pid"] == os.getpid() and row["holder"] == lease.holder
            assert lease_holder(d, i) is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigkilled_foreign_holder_is_taken_over_only_after_expiry(dbpath: pathlib.Path) -> None:
    i = ident()
    ttl = 0.6
    proc = _child(_HOLDER, str(dbpath), ident_arg(i), str(ttl), "sleep")
    try:
        info = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        time.sleep(2 * ttl)  # the child's heartbeat keeps its lease alive past the ttl
        with TuningDB(dbpath) as d:
            row = lease_holder(d, i)
            assert row is not None and row["holder"] == info["holder"] and row["expires"] > time.time()
            assert acquire_lease(d, i) is None
            _kill(proc)
            _raw(dbpath, "UPDATE leases SET host = 'gpu-node-17.elsewhere' WHERE digest = ?", (i.digest,))
            expires = _raw(dbpath, "SELECT expires FROM leases")[0][0]
            attempts, lease, deadline = 0, None, time.monotonic() + 5
            while lease is None and time.monotonic() < deadline:
                lease = acquire_lease(d, i)
                attempts += 1
                if lease is None:
                    assert time.time() <= expires + 0.05  # refused only while the row is not expired
                    time.sleep(0.02)
            assert lease is not None and attempts > 1  # refused at first: a dead pid elsewhere means nothing
            assert time.time() > expires
            lease.release()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_holder_that_exits_without_release_does_not_hang(dbpath: pathlib.Path) -> None:
    i = ident()
    proc = _child(_HOLDER, str(dbpath), ident_arg(i), "30", "exit")
    out, _ = proc.communicate(timeout=15)  # the heartbeat thread is a daemon: the process ends
    assert proc.returncode == 0 and json.loads(out)["holder"] is not None
    with TuningDB(dbpath) as d:
        assert lease_holder(d, i) is not None  # row left behind, not expired
        lease = acquire_lease(d, i, heartbeat=False)  # but its pid is gone
        assert lease is not None
        lease.release()


# ---------------------------------------------------------------------- heartbeat, renew, release


def test_heartbeat_keeps_lease_past_ttl_and_renew_after_theft_fails(dbpath: pathlib.Path) -> None:
    a, b = ident("ka"), ident("kb")
    ttl = 0.45
    with TuningDB(dbpath) as d:
        kept = acquire_lease(d, a, ttl_s=ttl)
        control = acquire_lease(d, b, ttl_s=ttl, heartbeat=False)
        assert isinstance(kept, Lease) and isinstance(control, Lease)
        assert kept._thread is not None and kept._thread.daemon and kept._thread.is_alive()
        assert acquire_lease(d, a, ttl_s=ttl) is None  # not re-entrant
        time.sleep(3 * ttl)
        now = time.time()
        row = lease_holder(d, a)
        assert row is not None and row["holder"] == kept.holder and row["expires"] > now
        assert kept.expires > now
        assert lease_holder(d, b) is None  # expired without a heartbeat
        assert acquire_lease(d, a, ttl_s=ttl) is None  # the heartbeat's lease is still held

        thief = acquire_lease(d, b, ttl_s=ttl, heartbeat=False)  # expired: taken, though we are alive
        assert thief is not None and thief.holder != control.holder
        assert control.renew() is False and control.lost
        assert thief.renew() is True and not thief.lost
        control.release()  # must not delete the thief's row
        row = lease_holder(d, b)
        assert row is not None and row["holder"] == thief.holder
        thief.release()

        kept.release()
        assert not kept._thread.is_alive() and kept.released
        assert lease_holder(d, a) is None
        kept.release()  # idempotent
        assert kept.renew() is False
        again = acquire_lease(d, a, ttl_s=ttl)  # free again after release
        assert again is not None
        with again:
            pass
        assert again.released and lease_holder(d, a) is None
        assert d.stats()["leases"] == 0


# ---------------------------------------------------------------------- progress


def test_progress_of_a_sigkilled_process_is_kept_and_cleared_by_record_session(dbpath: pathlib.Path) -> None:
    i, other = ident("ki"), ident("ko")
    with TuningDB(dbpath) as d:
        record_progress(d, other, progress_measurement(3))
    proc = _child(_PROGRESS, str(dbpath), ident_arg(i))
    try:
        confirmed = [int(proc.stdout.readline()) for _ in range(25)]  # type: ignore[union-attr]
        _kill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert confirmed == list(range(25))
    assert _raw(dbpath, "PRAGMA integrity_check") == [("ok",)]
    with TuningDB(dbpath) as d:
        got = progress(d, i)
        assert 25 <= len(got) < 5000  # everything it confirmed, and it was killed mid-way
        assert got == [progress_measurement(j) for j in range(len(got))]  # no gaps, every field intact
        assert d.stats()["progress"] == len(got) + 1
        d.record_session(i, got, {"TM": 32, "j": 1}, 1.5)
        assert progress(d, i) == []  # the session is complete
        assert progress(d, other) == [progress_measurement(3)]  # another identity's are kept
        assert d.lookup(i) is not None and len(d.measurements(i)) == len(got)


def test_progress_upsert_order_and_clear(db_mem: TuningDB) -> None:
    i = ident()
    for j in (4, 0, 2):
        record_progress(db_mem, i, progress_measurement(j))
    stale = progress_measurement(2)
    assert [m.order for m in progress(db_mem, i)] == [0, 2, 4]
    newer = Measurement(config=stale.config, status=Status.TIMEOUT, reason="slow", order=2)
    record_progress(db_mem, i, newer)  # same config: replaces the earlier result
    assert progress(db_mem, i) == [progress_measurement(0), newer, progress_measurement(4)]
    assert db_mem.stats()["progress"] == 3
    assert clear_progress(db_mem, i) == 3 and progress(db_mem, i) == []
    record_progress(db_mem, i, progress_measurement(1))
    lease = acquire_lease(db_mem, i, heartbeat=False)
    assert lease is not None
    st = db_mem.stats()
    assert (st["progress"], st["leases"]) == (1, 1)
    db_mem.clear()
    st = db_mem.stats()
    assert (st["progress"], st["leases"]) == (0, 0)


@pytest.fixture
def db_mem() -> TuningDB:
    return TuningDB(":memory:")


# ---------------------------------------------------------------------- schema migration


def _make_version_1(path: pathlib.Path) -> tuple[TuningIdentity, str]:
    """A database file as tiletune with schema version 1 left it (same tables, minus the new two)."""
    i = ident()
    with TuningDB(path) as d:
        sid = d.record_session(i, [progress_measurement(1), progress_measurement(2)], {"TM": 32, "j": 1}, 2.5)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE leases")
    conn.execute("DROP TABLE progress")
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    tables = {r[0] for r in _raw(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"sessions", "measurements", "winners"}
    return i, sid


def test_version_1_database_is_migrated_and_keeps_its_data(dbpath: pathlib.Path) -> None:
    assert SCHEMA_VERSION == 2
    i, sid = _make_version_1(dbpath)
    with TuningDB(dbpath) as d:
        rec = d.lookup(i)
        assert rec is not None and rec.config == {"TM": 32, "j": 1} and rec.session_id == sid
        assert d.measurements(i) == [progress_measurement(1), progress_measurement(2)]
        st = d.stats()
        assert (st["sessions"], st["measurements"], st["winners"], st["leases"], st["progress"]) == (1, 2, 1, 0, 0)
        lease = acquire_lease(d, i, heartbeat=False)
        assert lease is not None
        record_progress(d, i, progress_measurement(5))
        assert progress(d, i) == [progress_measurement(5)]
        lease.release()
    assert _raw(dbpath, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    tables = {r[0] for r in _raw(dbpath, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"sessions", "measurements", "winners", "leases", "progress"}
    assert _raw(dbpath, "PRAGMA integrity_check") == [("ok",)]


def test_version_1_database_migrated_by_many_openers_at_once(dbpath: pathlib.Path) -> None:
    i, _ = _make_version_1(dbpath)
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def opener() -> None:
        try:
            barrier.wait()
            with TuningDB(dbpath) as d:  # a separate object (its own connection) per thread
                assert d.lookup(i) is not None
                record_progress(d, i, progress_measurement(threading.get_ident() % 1000))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=opener) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert _raw(dbpath, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    with TuningDB(dbpath) as d:
        assert d.stats()["winners"] == 1 and 1 <= d.stats()["progress"] <= 6


def test_no_pickle_in_leases() -> None:
    import tiletune.resolve.leases as leases

    source = pathlib.Path(leases.__file__).read_text()
    for forbidden in ("import pickle", "pickle.load", "marshal", "eval(", "exec("):
        assert forbidden not in source
