"""Replay of recorded H200 sessions, recording files, the demo and the command line (no GPU)."""

from __future__ import annotations

import gzip
import json

import pytest

torch = pytest.importorskip("torch")
from typer.testing import CliRunner

import tiletune as tt
from tiletune.devices.backends import FakeBackend
from tiletune.lab.recordings.replay import ReplayBackend
from tiletune.cli import app
from tiletune.lab.demo import DemoRow, ShapeOnly, packaged_recordings, run_replay
from tiletune.lab.recordings import Recording, save_recording
from tiletune.records import DeviceInfo, Measurement, Status

try:  # the demo's matmul and RMSNorm plans import cuda.tile (no GPU needed)
    import cuda.tile  # noqa: F401

    HAVE_CUTILE = True
except Exception:  # pragma: no cover - depends on the environment
    HAVE_CUTILE = False

needs_cutile = pytest.mark.skipif(not HAVE_CUTILE, reason="the demo's kernels import cuda.tile")

OP_OF = {"tiletune.matmul": "matmul", "tiletune.rms_norm": "rms_norm"}


@pytest.fixture(scope="module")
def recordings():
    """``{demo op name: Recording}`` of the packaged recordings."""
    recs = [Recording.load(p) for p in packaged_recordings()]
    return {OP_OF[r.name]: r for r in recs}


@pytest.fixture(scope="module")
def rows():
    if not HAVE_CUTILE:
        pytest.skip("the demo's kernels import cuda.tile")
    return run_replay(seed=0)


def recorded_median(rec: Recording, config) -> float:
    m = rec.get(config)
    assert m is not None, f"{config} is not in the recording"
    return m.median_us


# ---------------------------------------------------------------------------------------------
# packaged recordings and the demo


def test_packaged_recordings_are_the_h200_matmul_and_rmsnorm(recordings):
    assert sorted(p.name for p in packaged_recordings()) == [
        "h200_matmul_bf16_4096.json.gz",
        "h200_rmsnorm_bf16_16384x4096.json.gz",
    ]
    mm, rn = recordings["matmul"], recordings["rms_norm"]
    assert len(mm.measurements) == 32 and len(rn.measurements) == 4
    assert mm.device == rn.device == DeviceInfo("NVIDIA H200", "sm_90", 132)
    assert [m.is_baseline for m in mm.measurements].count(True) == 1
    assert mm.key[0] == {"contiguous": True, "dtype": "bfloat16", "shape": [4096, 4096]}


@needs_cutile
def test_replay_winners_are_among_the_fastest_recorded(rows, recordings):
    assert [r.op for r in rows] == ["matmul", "rms_norm"]
    for row in rows:
        rec = recordings[row.op]
        ok = [m for m in rec.measurements if not m.status.failed]
        best = min(m.median_us for m in ok)
        assert recorded_median(rec, row.winner) <= 1.03 * best, (row.winner, best)
        assert row.configs == len(rec.measurements) and row.ok == len(ok) and row.failed == 0
        assert row.mode == "replay"
        base = next(m for m in rec.measurements if m.is_baseline)
        assert row.baseline_us is not None and row.baseline_us > 0.9 * base.median_us
        # the winner's time comes from the recorded samples
        samples = rec.get(row.winner).samples_us
        assert min(samples) <= row.winner_us <= max(samples)
    assert rows[0].problem == "bfloat16 4096x4096x4096"
    assert rows[1].problem == "bfloat16 16384x4096"


@needs_cutile
def test_replay_is_deterministic_for_a_seed(rows):
    again = run_replay(seed=0)
    assert again == rows
    assert all(isinstance(r, DemoRow) for r in again)


@needs_cutile
def test_simulated_tuning_time_reflects_parallel_compilation(rows, recordings):
    for row in rows:
        compile_s = [m.compile_s for m in recordings[row.op].measurements]
        assert row.tuning_s > 0
        assert row.tuning_s >= max(compile_s)  # nothing is measured before its compile finishes
        assert row.tuning_s < sum(compile_s)  # 16 simulated compile workers
    mm = rows[0]
    assert mm.tuning_s < 0.5 * sum(recordings["matmul"].measurements[i].compile_s for i in range(32))


def test_replay_backend_reports_the_recorded_device(recordings):
    be = ReplayBackend(packaged_recordings()[0])
    assert be.device_info(0) == recordings["matmul"].device
    assert dict(be.versions())["cuda_tile"] == recordings["matmul"].versions["cuda_tile"]
    assert be.name == "replay" and be.arg_device(()) == 0


# ---------------------------------------------------------------------------------------------
# recording files


def sample_measurements():
    return [
        Measurement({"T": 1}, Status.OK, "converged", (10.125, 10.25, 10.5), 0.75, order=0, is_baseline=True),
        Measurement({"T": 2}, Status.OK, "raced_out", (20.0, 21.5), 0.5, order=1),
        Measurement({"T": 3}, Status.COMPILE_ERROR, "TileCompilerError: too big", (), 1.25, order=2),
    ]


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_save_and_load_round_trip(tmp_path, suffix):
    path = tmp_path / f"rec{suffix}"
    dev = DeviceInfo("NVIDIA H200", "sm_90", 132)
    ms = sample_measurements()
    out = save_recording(path, name="op", key=[{"shape": [4], "dtype": "float32", "contiguous": True}, 3],
                         device=dev, versions={"cuda_tile": "1.7.0"}, measurements=ms,
                         space={"T": [1, 2, 3]}, note="hello")
    assert out == path
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == (suffix == ".json.gz")
    doc = json.loads(gzip.decompress(raw) if suffix.endswith(".gz") else raw)
    assert doc["format"] == "tiletune-recording" and doc["version"] == 1
    rec = Recording.load(path)
    assert rec.measurements == ms
    assert (rec.name, rec.device, rec.versions, rec.note, rec.space) == (
        "op", dev, {"cuda_tile": "1.7.0"}, "hello", {"T": [1, 2, 3]}
    )
    assert rec.key == [{"shape": [4], "dtype": "float32", "contiguous": True}, 3]
    assert rec.get({"T": 2}) == ms[1]
    assert rec.get(tt.Space(T=[1, 2, 3]).config(T=3)) == ms[2]
    assert rec.get({"T": 4}) is None


def test_saved_samples_are_rounded_to_nanoseconds(tmp_path):
    m = Measurement({"T": 1}, Status.OK, "", (1.23456, 2.0), 0.123456)
    path = save_recording(tmp_path / "r.json", name="op", key=[], device=DeviceInfo("d", "sm_90", 1),
                          versions={}, measurements=[m])
    (loaded,) = Recording.load(path).measurements
    assert loaded.samples_us == (1.235, 2.0) and loaded.compile_s == 0.1235


def test_a_file_that_is_not_a_recording_is_a_tiletune_error(tmp_path):
    other = tmp_path / "export.json"
    other.write_text(json.dumps({"format": "tiletune-db", "version": 1, "sessions": []}))
    with pytest.raises(tt.TiletuneError, match="not a tiletune recording"):
        Recording.load(other)
    future = tmp_path / "future.json.gz"
    future.write_bytes(gzip.compress(json.dumps({"format": "tiletune-recording", "version": 2}).encode()))
    with pytest.raises(tt.TiletuneError, match="not a tiletune recording"):
        Recording.load(future)
    with pytest.raises(tt.TiletuneError):
        ReplayBackend(other)


@pytest.mark.parametrize("text", ["not json at all", "[1, 2]"], ids=["text", "json-list"])
def test_a_non_json_file_is_a_tiletune_error(tmp_path, text):
    path = tmp_path / "junk.json"
    path.write_text(text)
    with pytest.raises(tt.TiletuneError):
        Recording.load(path)


def test_configs_missing_from_the_recording_become_compile_errors(tmp_path):
    space = tt.Space(T=[1, 2, 3, 4], baseline=dict(T=1))
    recorded = [
        Measurement({"T": 1}, Status.OK, "", tuple(50.0 + 0.01 * i for i in range(20)), 0.5, is_baseline=True),
        Measurement({"T": 2}, Status.OK, "", tuple(20.0 + 0.01 * i for i in range(20)), 0.5, order=1),
        Measurement({"T": 3}, Status.OK, "", (), 0.5, order=2),  # recorded without samples
    ]
    path = save_recording(tmp_path / "r.json.gz", name="op", key=[], device=DeviceInfo("H", "sm_90", 132),
                          versions={"cuda_tile": "x"}, measurements=recorded)
    be = ReplayBackend(path, seed=1)

    def k(x):
        raise AssertionError("replay never runs kernels")

    @tt.autotune(space, db=False, backend=be, progress=False)
    def op(cfg, x):
        return tt.Launch(k, (cfg.T,), (x,))

    x = ShapeOnly((8,), "float32")
    op(x)
    (res,) = op.results.values()
    by_t = {m.config["T"]: m for m in res.measurements}
    assert by_t[4].status is Status.COMPILE_ERROR and by_t[4].reason == "config not in the recording"
    assert by_t[3].status is Status.TIMEOUT and "without samples" in by_t[3].reason
    assert by_t[1].status is by_t[2].status is Status.OK
    assert res.winner == {"T": 2}
    assert 20.0 <= res.winner_median_us <= 20.2
    assert be.launches == []  # replay launches are recorded, and tuning left none
    op(x)
    assert be.launches == [(space.config(T=2), (2,))]


# ---------------------------------------------------------------------------------------------
# command line

SPACE = tt.Space(TM=[32, 64, 128], occupancy=[1, 2], baseline=dict(TM=64, occupancy=1))


def scale_kernel(x, y, factor):
    y.copy_(x * factor)


@pytest.fixture
def tuned_db(tmp_path):
    """A database file holding one session (6 measurements) of an op tuned on the fake backend."""
    path = tmp_path / "tuning.db"

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=path, name="cliop", progress=False,
                 backend=FakeBackend(lambda c: 100.0 - 0.3 * c.TM - 10.0 * c.occupancy, noise=0.002))
    def op(cfg, x, y):
        return tt.Launch(scale_kernel, (cfg.TM,), (x, y, 2.0))

    op(torch.randn(4), torch.empty(4))
    assert op.tuning_count == 1
    return path


runner = CliRunner()


@needs_cutile
def test_cli_demo_replay():
    result = runner.invoke(app, ["demo", "--replay"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "replaying" in result.output
    assert "h200_matmul_bf16_4096.json.gz" in result.output
    assert "TM=128 TN=128 TK=64 occupancy=2" in result.output and "occupancy=4" in result.output


@needs_cutile
def test_cli_demo_replay_writes_json_rows(tmp_path, recordings):
    out = tmp_path / "out.json"
    result = runner.invoke(app, ["demo", "--replay", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [r["op"] for r in rows] == ["matmul", "rms_norm"]
    assert [r["configs"] for r in rows] == [32, 4]
    for r in rows:
        assert r["mode"] == "replay" and r["tuning_s"] > 0
        rec = recordings[r["op"]]
        best = min(m.median_us for m in rec.measurements if not m.status.failed)
        assert recorded_median(rec, r["winner"]) <= 1.03 * best


def test_cli_db_stats_with_path_and_env(tuned_db):
    result = runner.invoke(app, ["db", "stats", "--path", str(tuned_db)])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    assert (stats["sessions"], stats["measurements"], stats["winners"]) == (1, 6, 1)
    assert stats["path"] == str(tuned_db) and stats["size_bytes"] > 0
    result = runner.invoke(app, ["db", "stats"], env={"TILETUNE_DB": str(tuned_db)})
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["measurements"] == 6


def test_cli_db_list(tuned_db):
    result = runner.invoke(app, ["db", "list", "--path", str(tuned_db)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "cliop" in result.output and "Fake H200" in result.output
    assert '{"TM": 128, "occupancy": 2}' in result.output
    result = runner.invoke(app, ["db", "list", "--path", str(tuned_db), "--name", "other"])
    assert result.exit_code == 0 and "cliop" not in result.output


def test_cli_db_export_import_clear(tuned_db, tmp_path):
    dest = tmp_path / "export.json"
    result = runner.invoke(app, ["db", "export", str(dest), "--path", str(tuned_db)])
    assert result.exit_code == 0, result.output
    assert "exported 1 session(s)" in result.output
    doc = json.loads(dest.read_text())
    assert doc["format"] == "tiletune-db" and len(doc["sessions"]) == 1
    (session,) = doc["sessions"]
    assert session["identity"]["name"] == "cliop" and len(session["measurements"]) == 6
    assert session["winner"] == {"TM": 128, "occupancy": 2}
    with pytest.raises(tt.TiletuneError, match="not a tiletune recording"):
        Recording.load(dest)  # an export is not a recording

    other = tmp_path / "other.db"
    result = runner.invoke(app, ["db", "import", str(dest)], env={"TILETUNE_DB": str(other)})
    assert result.exit_code == 0, result.output
    assert "imported 1 new session(s)" in result.output
    result = runner.invoke(app, ["db", "import", str(dest), "--path", str(other)])
    assert "imported 0 new session(s)" in result.output
    (w,) = tt.TuningDB(other).winners()
    assert w.config == {"TM": 128, "occupancy": 2} and w.identity.name == "cliop"

    result = runner.invoke(app, ["db", "clear", "--path", str(other), "--yes"])
    assert result.exit_code == 0, result.output
    assert "removed 7 row(s)" in result.output
    assert tt.TuningDB(other).stats()["sessions"] == 0


def test_cli_doctor(tmp_path):
    db = tmp_path / "d.db"
    result = runner.invoke(app, ["doctor"], env={"TILETUNE_DB": str(db), "COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for word in ("torch", "GPU", "parallel compile", "database"):
        assert word in result.output
    assert str(db) in result.output
    assert not db.exists()  # doctor reports the database, it does not create it
