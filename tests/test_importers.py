"""Importing public recorded spaces: Kernel Tuner cache files and T4 results files (CPU only)."""

from __future__ import annotations

import gzip
import json

import pytest
from typer.testing import CliRunner

from tiletune.devices.backends.base import Candidate
from tiletune.lab.recordings.replay import RecordedTiming
from tiletune.devices.backends.simulated import SimulatedSession
from tiletune.cli import app
from tiletune.errors import TiletuneError
from tiletune.lab.recordings import Recording, load_any
from tiletune.records import Status
from tiletune.engine.search import run_search
from tiletune.space.strategies import Budget, make_strategy
from tiletune.lab.strategy_eval import load_truth, run_one

# A Kernel Tuner cache as Kernel Tuner writes it (schema 1.1.0): param fields in every entry, times in
# ms, compile_time in ms, error strings for failed configs. block_size_x=64,y=4 broke a restriction.
KT_CACHE = """{
"schema_version": "1.1.0",
"device_name": "NVIDIA A100-PCIE-40GB",
"kernel_name": "vector_add",
"problem_size": [1000000],
"tune_params_keys": ["block_size_x", "block_size_y"],
"tune_params": {"block_size_x": [32, 64, 128], "block_size_y": [1, 2, 4]},
"objective": "time",
"cache": {
"32,1": {"block_size_x": 32, "block_size_y": 1, "time": 0.25, "times": [0.26, 0.25, 0.25, 0.24], "compile_time": 812.5, "verification_time": 0, "benchmark_time": 12.0, "strategy_time": 0, "framework_time": 1.0, "timestamp": "2024-01-02 10:00:00+00:00"},
"32,2": {"block_size_x": 32, "block_size_y": 2, "time": 0.20, "times": [0.2, 0.21, 0.19], "compile_time": 790.0, "verification_time": 0, "benchmark_time": 12.0, "strategy_time": 0, "framework_time": 1.0, "timestamp": "2024-01-02 10:00:01+00:00"},
"64,1": {"block_size_x": 64, "block_size_y": 1, "time": 0.125, "compile_time": 801.0, "verification_time": 0, "benchmark_time": 12.0, "strategy_time": 0, "framework_time": 1.0, "timestamp": "2024-01-02 10:00:02+00:00"},
"64,2": {"block_size_x": 64, "block_size_y": 2, "time": "CompilationFailedConfig", "compile_time": 300.0, "verification_time": 0, "benchmark_time": 0, "strategy_time": 0, "framework_time": 1.0, "timestamp": "2024-01-02 10:00:03+00:00"},
"64,4": {"block_size_x": 64, "block_size_y": 4, "time": "InvalidConfig", "compile_time": 0, "verification_time": 0, "benchmark_time": 0, "strategy_time": 0, "framework_time": 0, "timestamp": "2024-01-02 10:00:04+00:00"},
"128,1": {"block_size_x": 128, "block_size_y": 1, "time": "RuntimeFailedConfig", "compile_time": 805.0, "verification_time": 0, "benchmark_time": 0, "strategy_time": 0, "framework_time": 1.0, "timestamp": "2024-01-02 10:00:05+00:00"}
}
}
"""

# The same cache as Kernel Tuner leaves it while tuning (unterminated, trailing comma), old style:
# no parameter fields in the entries, only the "v1,v2" key.
KT_OPEN_CACHE = """{
"device_name": "Testing",
"kernel_name": "convolution_kernel",
"tune_params_keys": ["block_size_x", "block_size_y"],
"tune_params": {"block_size_x": [16, 32], "block_size_y": [1, 2]},
"cache": {
"16,1": {"time": 3.875, "times": [3.9, 3.87, 3.86], "compile_time": 918.6},
"32,2": {"time": 3.641, "compile_time": 842.0},
"""

# A T4 results file (odgaard/TuningSchema, as Kernel Tuner's store_output_file writes it): times in ms.
T4 = {
    "schema_version": "1.0.0",
    "results": [
        {"timestamp": "2023-12-21 10:44:42+00:00", "configuration": {"block_size_x": 16, "tile_size_x": 1},
         "times": {"compilation": 661.5, "framework": 53.1, "search_algorithm": 0, "validation": 0,
                   "runtimes": [12.26, 12.25, 12.27]},
         "invalidity": "correct", "correctness": 1,
         "measurements": [{"name": "time", "value": 12.26, "unit": "ms"}], "objectives": ["time"]},
        {"timestamp": "2023-12-21 10:44:43+00:00", "configuration": {"block_size_x": 32, "tile_size_x": 1},
         "times": {"compilation_time": 640.0, "runtimes": []},
         "invalidity": "correct", "correctness": 1,
         "measurements": [{"name": "time", "value": 9.5, "unit": "ms"}], "objectives": ["time"]},
        {"configuration": {"block_size_x": 32, "tile_size_x": 2}, "times": {"compilation": 700.0, "runtimes": []},
         "invalidity": "compile", "correctness": 0, "measurements": [], "objectives": ["time"]},
        {"configuration": {"block_size_x": 16, "tile_size_x": 2}, "times": {"runtimes": []},
         "invalidity": "constraints", "correctness": 0, "measurements": [], "objectives": ["time"]},
        {"configuration": {"block_size_x": 8, "tile_size_x": 1}, "times": {"compilation": 650.0, "runtimes": [20.0]},
         "invalidity": "runtime", "correctness": 0, "measurements": [], "objectives": ["time"]},
        {"configuration": {"block_size_x": 8, "tile_size_x": 2}, "times": {"compilation": 650.0, "runtimes": [7.0]},
         "invalidity": "correct", "correctness": 0, "measurements": [], "objectives": ["time"]},
        {"configuration": {"block_size_x": 16, "tile_size_x": 1},
         "times": {"compilation": 650.0, "runtimes": [12.3]},
         "invalidity": "correct", "correctness": 1, "measurements": [], "objectives": ["time"]},
    ],
}


@pytest.fixture
def kt_path(tmp_path):
    p = tmp_path / "vector_add_A100.json"
    p.write_text(KT_CACHE)
    return p


@pytest.fixture
def t4_path(tmp_path):
    p = tmp_path / "conv_t4.json"
    p.write_text(json.dumps(T4))
    return p


def test_kernel_tuner_cache(kt_path):
    rec = Recording.from_kernel_tuner_cache(kt_path, arch="sm_80")
    assert rec.device.name == "NVIDIA A100-PCIE-40GB" and rec.device.arch == "sm_80"
    assert rec.name == "vector_add" and rec.key["problem_size"] == [1000000]
    assert rec.versions == {"kernel_tuner_cache_schema": "1.1.0"}
    assert rec.recorded.startswith("2024-01-02")
    assert len(rec.measurements) == 5  # InvalidConfig is not part of the space
    m = rec.get({"block_size_x": 32, "block_size_y": 1})
    assert m.status is Status.OK and m.samples_us == (260.0, 250.0, 250.0, 240.0) and m.median_us == 250.0
    assert m.compile_s == pytest.approx(0.8125)
    assert rec.get({"block_size_x": 64, "block_size_y": 1}).samples_us == (125.0,)  # "time" without "times"
    failed = rec.get({"block_size_x": 64, "block_size_y": 2})
    assert failed.status is Status.COMPILE_ERROR and failed.reason == "CompilationFailedConfig"
    assert rec.get({"block_size_x": 128, "block_size_y": 1}).status is Status.LAUNCH_ERROR
    assert rec.get({"block_size_x": 64, "block_size_y": 4}) is None
    assert rec.space["invalid_configs"] == 1


def test_kernel_tuner_space_from_params(kt_path):
    rec = Recording.from_kernel_tuner_cache(kt_path)
    space = rec.space_from_params()
    assert space.names == ("block_size_x", "block_size_y")
    assert space.values("block_size_y") == (1, 2, 4)  # the file's tune_params, not only the observed
    assert space.size() == 5 and space.baseline() is None
    assert {tuple(c.values()) for c in space.configs()} == {(32, 1), (32, 2), (64, 1), (64, 2), (128, 1)}
    # never-recorded and invalid configs are invalid in the space
    for bad in (dict(block_size_x=64, block_size_y=4), dict(block_size_x=128, block_size_y=4)):
        with pytest.raises(TiletuneError):
            space.config(None, **bad)


def test_kernel_tuner_cache_replays_through_the_search(kt_path):
    truth = load_truth(Recording.from_kernel_tuner_cache(kt_path))
    assert truth.arch is None and truth.optimum_us == 125.0 and truth.n_valid == 3 and truth.n_configs == 5
    for name in ("exhaustive", "random", "evolutionary", "model"):
        session = SimulatedSession(RecordedTiming(truth.recording), workers=2, seed=0)
        res = run_search(session, make_strategy(name, truth.space, None, seed=0), Budget())
        assert res.stopped == "exhausted" and len(res.evaluations) == 5
        assert dict(res.winner.config) == {"block_size_x": 64, "block_size_y": 1}
        statuses = {tuple(m.config.values()): m.status for m in res.measurements}
        assert statuses[(64, 2)] is Status.COMPILE_ERROR and statuses[(128, 1)] is Status.LAUNCH_ERROR
    run = run_one(truth, "random", seed=0)
    assert run.evals_to[0.05] is not None


def test_open_old_style_kernel_tuner_cache(tmp_path):
    p = tmp_path / "open.json"
    p.write_text(KT_OPEN_CACHE)
    rec = Recording.from_kernel_tuner_cache(p)
    assert [dict(m.config) for m in rec.measurements] == [
        {"block_size_x": 16, "block_size_y": 1}, {"block_size_x": 32, "block_size_y": 2}]
    assert rec.measurements[0].samples_us == (3900.0, 3870.0, 3860.0)
    assert rec.device.name == "Testing" and rec.device.arch == "unknown"
    assert rec.versions == {"kernel_tuner_cache_schema": "unknown"}
    gz = tmp_path / "open.json.gz"
    gz.write_bytes(gzip.compress(KT_OPEN_CACHE.encode()))
    assert len(load_any(gz).measurements) == 2


def test_kernel_tuner_cache_errors(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"cache": {"1,2,3": {"time": 1.0}}, "tune_params": {"a": [1], "b": [2]}, "tune_params_keys": ["a", "b"]}')
    with pytest.raises(TiletuneError, match="does not have 2 values"):
        Recording.from_kernel_tuner_cache(p)
    p.write_text('{"results": []}')
    with pytest.raises(TiletuneError, match="not a Kernel Tuner cache"):
        Recording.from_kernel_tuner_cache(p)
    p.write_text("{ not json")
    with pytest.raises(TiletuneError):
        load_any(p)


def test_t4_results(t4_path):
    rec = Recording.from_t4(t4_path, device="NVIDIA RTX A4000", arch="sm_86")
    assert rec.device.name == "NVIDIA RTX A4000" and rec.versions == {"t4_schema": "1.0.0"}
    assert rec.space["invalid_configs"] == 1
    by = {tuple(m.config.values()): m for m in rec.measurements}
    assert set(by) == {(16, 1), (32, 1), (32, 2), (8, 1), (8, 2)}
    ok = by[(16, 1)]
    assert ok.status is Status.OK and ok.samples_us == (12260.0, 12250.0, 12270.0, 12300.0)  # repeated: pooled
    assert ok.compile_s == pytest.approx(0.6615)
    assert by[(32, 1)].samples_us == (9500.0,) and by[(32, 1)].compile_s == pytest.approx(0.64)  # measurements
    assert by[(32, 2)].status is Status.COMPILE_ERROR and by[(32, 2)].reason == "compile"
    assert by[(8, 1)].status is Status.LAUNCH_ERROR and not by[(8, 1)].samples_us
    assert by[(8, 2)].status is Status.MISMATCH  # "correct" but correctness 0
    space = rec.space_from_params()
    assert space.values("block_size_x") == (8, 16, 32) and space.values("tile_size_x") == (1, 2)
    assert space.size() == 5  # (16, 2) broke a constraint
    truth = load_truth(rec)
    assert truth.optimum_us == 9500.0 and truth.n_valid == 2


def test_t4_with_known_params_and_errors(t4_path, tmp_path):
    rec = Recording.from_t4(t4_path, params={"block_size_x": [8, 16, 32, 64], "tile_size_x": [1, 2]})
    assert rec.space_from_params().values("block_size_x") == (8, 16, 32, 64)
    p = tmp_path / "bad.json"
    p.write_text('{"results": [{"times": {}}]}')
    with pytest.raises(TiletuneError, match="configuration"):
        Recording.from_t4(p)


def test_load_any_tells_the_formats_apart(kt_path, t4_path, tmp_path):
    assert load_any(kt_path).space["imported_from"] == "kernel_tuner_cache"
    assert load_any(t4_path).space["imported_from"] == "t4"
    from tiletune.lab.demo import packaged_recordings

    assert load_any(packaged_recordings()[0]).name == "tiletune.matmul"
    p = tmp_path / "other.json"
    p.write_text('{"hello": 1}')
    with pytest.raises(TiletuneError, match="not a tiletune recording"):
        load_any(p)


def test_tiletune_recording_space_from_observed_configs():
    from tiletune.lab.demo import packaged_recordings

    rec = Recording.load(next(p for p in packaged_recordings() if "matmul" in p.name))
    space = rec.space_from_params()
    assert space.names == ("TM", "TN", "TK", "occupancy") and space.values("TM") == (64, 128, 256)
    assert space.size("sm_90") == 32 and dict(space.baseline("sm_90")) == {"TM": 128, "TN": 128, "TK": 64, "occupancy": 1}
    assert "occupancy" in space.hint_names
    assert space.hash != Recording.load(next(p for p in packaged_recordings() if "rmsnorm" in p.name)
                                        ).space_from_params().hash
    c = Candidate(space.baseline("sm_90"), 0, True)
    assert RecordedTiming(rec).describe(c.config).status is Status.OK


def test_cli_imports_and_evaluates(kt_path, tmp_path):
    runner = CliRunner()
    dest = tmp_path / "kt.json.gz"
    res = runner.invoke(app, ["recording", "import", str(kt_path), str(dest), "--arch", "sm_80"])
    assert res.exit_code == 0, res.output
    rec = Recording.load(dest)
    assert rec.device.arch == "sm_80" and len(rec.measurements) == 5
    assert rec.space_from_params().size("sm_80") == 5
    out = tmp_path / "eval"
    res = runner.invoke(app, ["strategies", str(dest), "--seeds", "3", "--exhaustive-seeds", "1", "-s", "random",
                              "-s", "evolutionary", "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    rows = json.loads((out / "strategies.json").read_text())
    assert [r["strategy"] for r in rows] == ["random", "evolutionary"]
    assert all(r["space"] == "kt" and r["n_valid"] == 3 for r in rows)
    assert (out / "strategies_kt.png").stat().st_size > 1000
    res = runner.invoke(app, ["strategies", str(dest), "-s", "annealing"])
    assert res.exit_code != 0


def test_demo_replay_takes_a_strategy():
    pytest.importorskip("torch")
    try:
        import cuda.tile  # noqa: F401  (the demo's kernels import it; no GPU needed)
    except Exception:  # pragma: no cover - depends on the environment
        pytest.skip("the demo's kernels import cuda.tile")
    runner = CliRunner()
    res = runner.invoke(app, ["demo", "--replay", "--strategy", "evolutionary", "--budget-evals", "12"],
                        env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "matmul" in res.output
    from tiletune.lab.demo import run_replay
    from tiletune.space.strategies import Budget

    rows = run_replay(strategy="model", budget=Budget(max_evals=12), seed=1)
    assert rows[0].configs == 12 and rows[1].configs == 4  # the RMSNorm space has only 4 configs
    res = runner.invoke(app, ["demo", "--replay", "--strategy", "annealing"])
    assert res.exit_code != 0
