"""``tiletune strategies --budget N --no-baseline --truth time|times-median`` and the Kernel Tuner
importer keeping both ``time`` and ``times`` (issue 16, item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiletune.cli import app
from tiletune.lab.recordings import Recording, load_any
from tiletune.lab.strategy_eval import evaluate, load_truth

REPO = Path(__file__).resolve().parents[1]
MATMUL_REC = REPO / "src" / "tiletune" / "data" / "h200_matmul_bf16_4096.json.gz"  # 32 configs, a baseline
runner = CliRunner()

# Kernel Tuner's ``time`` is the mean of ``times``: config 1 has the best median (one slow outlier), config 2
# the best mean. Scored by ``time`` (as Kernel Tuner scores it) the optimum is config 2; by the median, 1.
KT = {
    "schema_version": "1.1.0", "device_name": "GPU X", "kernel_name": "k", "problem_size": [8],
    "tune_params_keys": ["bx"], "tune_params": {"bx": [1, 2, 3, 4]}, "objective": "time",
    "cache": {
        "1": {"bx": 1, "time": 7.0 / 3.0, "times": [1.0, 1.0, 5.0], "compile_time": 10.0},
        "2": {"bx": 2, "time": 2.0, "times": [2.0, 2.0, 2.0], "compile_time": 10.0},
        "3": {"bx": 3, "time": 3.0, "times": [3.0, 3.1, 2.9], "compile_time": 10.0},
        "4": {"bx": 4, "time": "RuntimeFailedConfig", "compile_time": 10.0},
    },
}


@pytest.fixture
def kt_path(tmp_path):
    p = tmp_path / "k_gpux.json"
    p.write_text(json.dumps(KT))
    return p


def run(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "250"})


def test_the_importer_keeps_time_and_times_and_names_time_as_the_truth(kt_path, tmp_path):
    rec = load_any(kt_path)
    assert rec.truth == "time" and rec.truths == ("time", "times-median")
    assert rec.get({"bx": 1}).samples_us == (1000.0, 1000.0, 5000.0)
    assert rec.truth_us({"bx": 1}) == pytest.approx(7000.0 / 3.0)  # the recording's own truth: time
    assert rec.truth_us({"bx": 1}, "times-median") == 1000.0
    assert rec.truth_us({"bx": 4}) is None and rec.truth_us({"bx": 4}, "times-median") is None
    with pytest.raises(ValueError, match="truth must be one of time, times-median"):
        rec.truth_us({"bx": 1}, "mean")
    # the imported recording keeps both, and says which one scores
    dest = tmp_path / "k.json.gz"
    res = run("recording", "import", str(kt_path), str(dest))
    assert res.exit_code == 0, res.output
    assert "scored by time (kept: time, times-median)" in " ".join(res.stdout.split())
    again = Recording.load(dest)
    assert again.truth == "time" and again.truth_us({"bx": 2}) == 2000.0
    assert again.truth_us({"bx": 1}, "times-median") == 1000.0
    # a tiletune recording holds samples only: its truth is their median
    own = Recording.load(MATMUL_REC)
    assert own.truth == "times-median" and own.truths == ("times-median",)


def test_a_recording_that_names_time_needs_a_time_per_successful_config(kt_path):
    from tiletune.lab.recordings import kernel_tuner

    doc = kernel_tuner.read_cache(kt_path)
    del doc["measurements"][0]["time_us"]
    with pytest.raises(ValueError, match=r"measurements\[0\]: a successful measurement needs a time_us"):
        Recording(doc)
    doc["truth"] = "mean"
    with pytest.raises(ValueError, match=r"truth: \"mean\" is not one of time, times-median"):
        Recording(doc)


@pytest.mark.parametrize("truth, optimum", [(None, 2000.0), ("time", 2000.0), ("times-median", 1000.0)])
def test_truth_picks_the_optimum(kt_path, tmp_path, truth, optimum):
    assert load_truth(kt_path, truth=truth).optimum_us == pytest.approx(optimum)
    out = tmp_path / "out"
    args = ["strategies", str(kt_path), "-s", "random", "--seeds", "2", "--out", str(out)]
    res = run(*args, *(["--truth", truth] if truth else []))
    assert res.exit_code == 0, res.output
    field = truth or "time"
    assert f"k_gpux: truth = {field} (" in res.stdout
    rows = json.loads((out / "strategies.json").read_text())
    assert rows[0]["truth"] == field and rows[0]["optimum_us"] == pytest.approx(optimum)
    assert rows[0]["evaluation"]["truth"] == (truth or "each file's own")


def test_budget_caps_every_run(tmp_path):
    rows, runs, _ = evaluate([MATMUL_REC], ["random"], seeds=6, max_evals=2, baseline=False)
    assert all(r.evaluations <= 2 for r in runs[("h200_matmul_bf16_4096", "random")])
    assert rows[0]["budget_evals"] == 2
    out = tmp_path / "out"
    res = run("strategies", str(MATMUL_REC), "-s", "random", "--seeds", "6", "--budget", "2", "--no-baseline",
              "--out", str(out))
    assert res.exit_code == 0, res.output
    row = json.loads((out / "strategies.json").read_text())[0]
    assert row["budget_evals"] == 2 and row["evaluation"]["budget_evals"] == 2
    lo, hi = row["evals_to_5pct_ci95"]
    assert hi is None or hi <= 2  # never more than the budget
    # without a budget every random run reaches the optimum eventually
    unlimited = evaluate([MATMUL_REC], ["random"], seeds=6, baseline=False)[0][0]
    assert unlimited["reached_1pct"] == 1.0 and row["reached_1pct"] < 1.0


def test_no_baseline_drops_the_recorded_baseline(tmp_path):
    kept, dropped = load_truth(MATMUL_REC), load_truth(MATMUL_REC, baseline=False)
    assert kept.space.baseline("sm_90") is not None and dropped.space.baseline("sm_90") is None
    # exhaustive search's first evaluation: the baseline when kept, else the first config in space order
    first = {}
    for baseline in (True, False):
        _, runs, (t,) = evaluate([MATMUL_REC], ["exhaustive"], seeds=1, max_evals=1, baseline=baseline)
        (r,) = runs[("h200_matmul_bf16_4096", "exhaustive")]
        first[baseline] = r.curve[0]
    assert first[True] == pytest.approx(kept.truth[kept.space.baseline("sm_90")] / kept.optimum_us)
    assert first[False] == pytest.approx(dropped.truth[dropped.space.configs("sm_90")[0]] / dropped.optimum_us)
    assert first[True] != first[False]
    for flag, word in (([], "kept"), (["--no-baseline"], "dropped")):
        out = tmp_path / word
        res = run("strategies", str(MATMUL_REC), "-s", "exhaustive", "--seeds", "1", "--budget", "1",
                  "--out", str(out), *flag)
        assert res.exit_code == 0, res.output
        assert f"baseline {word}; budget 1" in res.stdout
        row = json.loads((out / "strategies.json").read_text())[0]
        assert row["evaluation"]["baseline"] is (not flag)
