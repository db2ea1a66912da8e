"""CPU tests of ``benchmarks/nearest_quality.py``: what decides what its GPU run measures.

* seeded shape draws: deterministic, seed-dependent, a smaller run a prefix of a larger one, token
  counts and sequence lengths off the powers of two and in their ranges, dimensions from the models,
  round-robin over the families;
* the choice log, the kernels of a recorded call and their pairing, with stand-in ops;
* the interleaved timing and the ratio arithmetic (per-round ratios, their median; identical configs);
* the family summary (median, worst, sources) and ``main`` end to end with fake measurements: the JSON
  schema, the budget stop, a failing shape.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import nearest_quality as nq  # noqa: E402
from offgrid import MODEL_DIMS, projection  # noqa: E402


@pytest.fixture(autouse=True)
def _environment_restored():
    """``main`` sets its process's tiletune variables (a benchmark process of its own on the GPU host):
    in this test process they are put back after each test."""
    import os

    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


# --------------------------------------------------------------------------------------------
# shapes
# --------------------------------------------------------------------------------------------


def test_draws_are_seeded_and_deterministic():
    a, skipped_a = nq.plan(nq.FAMILIES, 40, 0)
    b, skipped_b = nq.plan(nq.FAMILIES, 40, 0)
    assert a == b and skipped_a == skipped_b
    c, _ = nq.plan(nq.FAMILIES, 40, 1)
    assert c != a
    for f in nq.FAMILIES:  # a smaller run is the prefix of a larger one
        assert nq.draw_family(f, 10, 3)[0] == nq.draw_family(f, 25, 3)[0][:10]


def test_plan_is_round_robin():
    rows, _ = nq.plan(list(nq.DEFAULT_FAMILIES), 7, 0)
    assert len(rows) == 7 * len(nq.DEFAULT_FAMILIES)
    for i, row in enumerate(rows):
        assert row["family"] == nq.DEFAULT_FAMILIES[i % len(nq.DEFAULT_FAMILIES)]


def test_shapes_are_off_the_grid_and_from_the_models():
    rows, skipped = nq.plan(nq.FAMILIES, 40, 0)
    assert len(rows) == 40 * len(nq.FAMILIES)
    models_128 = {m for m, d in MODEL_DIMS.items() if d["head_dim"] == 128}
    assert models_128 == {"llama3-8b", "mistral-7b", "qwen2.5-7b"}
    seen_models: dict[str, set] = {}
    for s in rows:
        f, m = s["family"], MODEL_DIMS[s["model"]]
        seen_models.setdefault(f, set()).add(s["model"])
        assert nq.why_not(s) is None
        if f in ("attention", "rope"):
            assert s["model"] in models_128 and s["D"] == 128
            assert s["H"] == m["heads"] and s["Hkv"] == m["kv_heads"]
        if f == "attention":
            assert nq.SEQ[0] <= s["S"] <= nq.SEQ[1] and not nq.is_pow2(s["S"])
            assert 1 <= s["B"] <= 4
            continue
        if f == "rope":
            assert 1 <= s["S"] <= 8192 and not nq.is_pow2(s["S"])
            continue
        assert 1 < s["M"] <= 8192 and not nq.is_pow2(s["M"]), s
        if f in ("rms_norm", "rms_norm_residual", "layer_norm"):
            assert s["H"] == m["hidden"]
        elif f in ("swiglu", "geglu"):
            assert s["I"] == m["ffn"]
        elif f in ("softmax", "cross_entropy"):
            assert s["V"] == m["vocab"]
            assert s["M"] * s["V"] <= nq.ELEMENT_CAP
        elif f == "matmul_linear":
            assert s["proj"] in nq.PROJECTIONS and (s["N"], s["K"]) == projection(m, s["proj"])
    for f in ("rms_norm", "swiglu", "softmax", "matmul_linear"):
        assert len(seen_models[f]) >= 4, (f, seen_models[f])  # the draw spreads over the models
    for s in skipped:
        assert s["reason"] and nq.why_not(s["shape"]) == s["reason"]
    # log-uniform: small and large token counts both occur
    ms = [s["M"] for s in rows if "M" in s]
    assert min(ms) < 64 and max(ms) > 2048


def test_off_pow2_draw_never_returns_a_power_of_two():
    import random

    r = random.Random(5)
    got = [nq.log_uniform_off_pow2(r, 1, 8192) for _ in range(3000)]
    assert not any(nq.is_pow2(n) for n in got)
    assert min(got) >= 3 and max(got) <= 8191
    assert nq.is_pow2(1) and nq.is_pow2(4096) and not nq.is_pow2(3) and not nq.is_pow2(0)


def test_parse_args_defaults_and_refusals():
    a = nq.parse_args([])
    assert a.per_family == 40 and a.budget_s == 360.0 and a.seed == 0 and a.rounds == 3
    assert a.families == list(nq.DEFAULT_FAMILIES) and "rope" not in a.families
    assert nq.parse_args(["--families", "rope,attention"]).families == ["rope", "attention"]
    assert nq.parse_args(["--families", "extra"]).families == list(nq.EXTRA_FAMILIES)
    assert nq.parse_args(["--families", "all"]).families == list(nq.FAMILIES)
    assert nq.parse_args(["--families", "default,cross_entropy"]).families == [*nq.DEFAULT_FAMILIES, "cross_entropy"]
    assert set(nq.DEFAULT_FAMILIES) | set(nq.EXTRA_FAMILIES) == set(nq.FAMILIES)
    for bad in (["--families", "gemm"], ["--per-family", "0"], ["--families", "rope,rope"], ["--rounds", "0"],
                ["--families", "all,rope"]):
        with pytest.raises(SystemExit):
            nq.parse_args(bad)


# --------------------------------------------------------------------------------------------
# choices and kernels, with stand-in ops
# --------------------------------------------------------------------------------------------


class FakeConfig:
    def __init__(self, **values):
        self.values = values

    def as_dict(self):
        return dict(self.values)


class FakeOp:
    """A tuned op as the script uses it: name, key_of, known_config, launch_parts."""

    def __init__(self, name, configs):
        self.name = name
        self.configs = configs  # key -> config
        self.launched: list = []

    def key_of(self, *args):
        return ("key", args[0])

    def known_config(self, *args):
        return self.configs.get(self.key_of(*args))

    def launch_parts(self, cfg, args):
        def launch(stream, grid, kernel, kargs):
            self.launched.append((stream, grid, kernel, kargs))

        return (launch, lambda dev: f"stream{dev}", ("kernel", cfg.as_dict()["T"]), 0), (2,), tuple(args)


class FakeProblem:
    def __init__(self, name, key):
        self.name, self.key = name, key


class FakeChoice:
    def __init__(self, cfg, source, neighbour=None):
        self.config, self.source, self.neighbour, self.provisional = cfg, source, neighbour, source == "nearest"


def test_choice_log_and_kernels_of():
    op = FakeOp("tiletune.gemm_splitk", {("key", 7): FakeConfig(T=64), ("key", 8): FakeConfig(T=32)})
    other = FakeOp("tiletune.reduce", {("key", 9): FakeConfig(T=1)})
    log = nq.ChoiceLog()
    neighbour = json.dumps([{"shape": [1, 512, 4096], "dtype": "bfloat16"}, True])
    log(op="tiletune.gemm_splitk", problem=FakeProblem("tiletune.gemm_splitk", ("key", 7)),
        choice=FakeChoice(FakeConfig(T=64), "nearest", neighbour))
    log(op="tiletune.reduce", problem=FakeProblem("tiletune.reduce", ("key", 9)),
        choice=FakeChoice(FakeConfig(T=1), "table"))
    ks = nq.kernels_of([(op, None, (7, "x")), (other, None, (9,)), (op, ("key", 8), (8,))], log)
    assert [k["name"] for k in ks] == ["tiletune.gemm_splitk", "tiletune.reduce", "tiletune.gemm_splitk"]
    assert [k["source"] for k in ks] == ["nearest", "table", "bucket"]  # the third key had no choice of its own
    assert [k["config"].as_dict() for k in ks] == [{"T": 64}, {"T": 1}, {"T": 32}]
    assert nq.key_shapes(ks[0]["neighbour"]) == [[1, 512, 4096]]
    assert nq.combined_source([k["source"] for k in ks]) == "nearest+table+bucket"
    assert nq.combined_source(["table", "table"]) == "table" and nq.combined_source([]) == "none"
    with pytest.raises(RuntimeError):
        nq.kernels_of([(op, None, (99,))], log)


def test_choice_log_subscribes_only_inside_its_block():
    from tiletune import events

    log = nq.ChoiceLog()
    with log:
        events.emit("choice", op="a", problem=FakeProblem("a", 1), choice=FakeChoice(FakeConfig(T=1), "tuned"))
    events.emit("choice", op="a", problem=FakeProblem("a", 2), choice=FakeChoice(FakeConfig(T=1), "tuned"))
    assert [(n, k, i["source"]) for n, k, i in log.items] == [("a", 1, "tuned")]


def test_launcher_issues_the_hot_path_launch():
    op = FakeOp("k", {})
    run = nq.launcher(op, FakeConfig(T=16), (1, 2))
    run()
    assert op.launched == [("stream0", (2,), ("kernel", 16), (1, 2))]


# --------------------------------------------------------------------------------------------
# timing and ratios
# --------------------------------------------------------------------------------------------


def scripted_bench(times: dict):
    """A bench function that returns, per launch function, its next scripted time (us)."""
    it = {k: iter(v) for k, v in times.items()}
    calls: list = []

    def bench(fn):
        calls.append(fn)
        return next(it[fn])

    return bench, calls


def test_time_pair_interleaves_and_takes_the_median_of_round_ratios():
    def s():
        pass

    def t():
        pass

    bench, calls = scripted_bench({s: [12.0, 11.0, 30.0, 12.0, 13.0], t: [10.0, 10.0, 10.0, 12.0, 10.0]})
    got = nq.time_pair([s], [t], bench, rounds=5)
    assert calls == [s, t] * 5  # A B A B ...
    assert got["round_ratios"] == [1.2, 1.1, 3.0, 1.0, 1.3]
    assert got["ratio"] == pytest.approx(1.2)  # the median of the rounds' ratios, not the ratio of medians
    assert got["served_us"] == 12.0 and got["tuned_us"] == 10.0


def test_time_pair_sums_the_kernels_of_a_call():
    fns = [lambda: None for _ in range(4)]
    s1, s2, t1, t2 = fns
    bench, calls = scripted_bench({s1: [5.0] * 3, s2: [7.0] * 3, t1: [4.0] * 3, t2: [4.0] * 3})
    got = nq.time_pair([s1, s2], [t1, t2], bench, rounds=3)
    assert calls == [s1, t1, s2, t2] * 3
    assert got["served_us"] == 12.0 and got["tuned_us"] == 8.0 and got["ratio"] == 1.5


def _kernel(op, cfg, args, source="nearest"):
    return {"op": op, "name": op.name, "args": args, "config": cfg, "source": source, "neighbour": None}


def test_compare_times_both_configs_on_the_tuned_calls_arguments():
    op_s, op_t = FakeOp("tiletune.gemm", {}), FakeOp("tiletune.gemm", {})
    served = [_kernel(op_s, FakeConfig(T=64), ("served-args",))]
    tuned = [_kernel(op_t, FakeConfig(T=128), ("tuned-args",), "tuned")]
    made: list = []

    def make(op, cfg, args):
        made.append((op, cfg.as_dict(), args))
        return lambda: None

    times = iter([20.0, 10.0] * 5)
    row = nq.compare({}, served, tuned, lambda fn: next(times), 5, make_launcher=make)
    assert made == [(op_t, {"T": 64}, ("tuned-args",)), (op_t, {"T": 128}, ("tuned-args",))]
    assert row["paired"] and not row["identical"] and row["ratio"] == 2.0
    assert row["served_us"] == 20.0 and row["tuned_us"] == 10.0
    assert row["tuned_config"] == {"T": 128}
    assert row["kernels"] == [{"op": "tiletune.gemm", "source": "nearest", "served_config": {"T": 64},
                               "tuned_config": {"T": 128}, "neighbour": None, "raced": None, "tuning": None}]
    assert row["timing_s"] >= 0


def _raced(T, verdict, median, neighbour=None, distance=None):
    from tiletune.resolve.problem import Raced

    return Raced(FakeConfig(T=T), neighbour, distance, median, verdict)


@pytest.mark.parametrize("ratio,replayed", [(2.0, True), (1.05, False)])
def test_a_slow_served_row_has_its_race_replayed_by_the_bench(ratio, replayed):
    """Served over RACE_REPLAY_RATIO slower than tuned: every config the race compiled is timed again on the
    tuned call's arguments (the one that failed its check and the one never compiled are not)."""
    op_s, op_t = FakeOp("tiletune.softmax", {}), FakeOp("tiletune.softmax", {})
    near = json.dumps([{"shape": [11, 32064], "dtype": "bfloat16"}, True])
    race = (_raced(64, "served", 9.5, near, 0.25), _raced(128, "failed: mismatch: off", 8.0, near, 0.5),
            _raced(256, "slower", 11.0, near, 1.0), _raced(512, "not compiled", None, near, 2.0),
            _raced(32, "slower", float("inf")))
    served = [dict(_kernel(op_s, FakeConfig(T=64), ("served-args",)), raced=race)]
    tuned = [_kernel(op_t, FakeConfig(T=512), ("tuned-args",), "tuned")]
    made: list = []
    bench_us = {64: 20.0 * ratio, 512: 20.0, 256: 30.0, 32: 40.0}

    def make(op, cfg, args):
        made.append((cfg.as_dict()["T"], args))
        return lambda: bench_us[cfg.as_dict()["T"]]

    row = nq.compare({}, served, tuned, lambda fn: fn(), 3, make_launcher=make)
    got = row["kernels"][0]["raced"]
    assert [r["verdict"] for r in got] == ["served", "failed: mismatch: off", "slower", "not compiled", "slower"]
    assert [r["race_us"] for r in got] == [9.5, 8.0, 11.0, None, None]  # never timed: no median
    assert got[0]["neighbour"] == [[11, 32064]] and got[0]["distance"] == 0.25 and got[4]["neighbour"] is None
    assert row["ratio"] == pytest.approx(ratio)
    if replayed:
        assert [r.get("bench_us") for r in got] == [40.0, None, 30.0, None, 40.0]
        assert all(args == ("tuned-args",) for _, args in made)
    else:
        assert all("bench_us" not in r for r in got)


def test_compare_identical_configs_have_ratio_one_and_are_timed_once():
    op = FakeOp("tiletune.rms_norm", {})
    served = [_kernel(op, FakeConfig(T=1), ("a",), "table")]
    tuned = [_kernel(op, FakeConfig(T=1), ("a",), "tuned")]
    n = []

    def bench(fn):
        n.append(fn)
        return 3.5

    row = nq.compare({}, served, tuned, bench, 5, make_launcher=lambda op, cfg, args: (lambda: None))
    assert row["identical"] and row["ratio"] == 1.0 and row["served_us"] == row["tuned_us"] == 3.5
    assert len(n) == 1


def test_compare_unpaired_calls_time_each_calls_own_launches():
    a, b, c = FakeOp("x", {}), FakeOp("y", {}), FakeOp("x", {})
    served = [_kernel(a, FakeConfig(T=1), ("s1",)), _kernel(b, FakeConfig(T=2), ("s2",))]
    tuned = [_kernel(c, FakeConfig(T=3), ("t1",), "tuned")]
    made = []

    def make(op, cfg, args):
        made.append((op.name, args))
        return lambda: None

    row = nq.compare({}, served, tuned, lambda fn: 1.0, 2, make_launcher=make)
    assert not row["paired"] and not row["identical"]
    assert made == [("x", ("s1",)), ("y", ("s2",)), ("x", ("t1",))]
    assert row["ratio"] == 2.0  # two served kernels of 1 us against one tuned kernel of 1 us
    assert row["tuned_config"] == {"T": 3}
    assert row["kernels"][1]["tuned_config"] is None


# --------------------------------------------------------------------------------------------
# summary and main
# --------------------------------------------------------------------------------------------


def test_summarize_median_worst_and_sources():
    rows = [
        {"family": "softmax", "served_source": "nearest", "ratio": 1.10},
        {"family": "softmax", "served_source": "nearest", "ratio": 1.00, "identical": True},
        {"family": "softmax", "served_source": "table", "ratio": 0.98},
        {"family": "softmax", "served_source": "nearest+bucket", "ratio": 1.60},
        {"family": "softmax", "served_source": "tuned", "ratio": None, "no_neighbour": True},
        {"family": "softmax", "error": "RuntimeError: boom"},
        {"family": "attention", "served_source": "nearest", "ratio": 1.2},
    ]
    s = {f["op"]: f for f in nq.summarize(rows, ["softmax", "attention", "rope"])}
    sm = s["softmax"]
    assert sm["n_shapes"] == 4 and sm["rows"] == 6
    assert sm["median_ratio"] == pytest.approx(1.05) and sm["worst_ratio"] == 1.6 and sm["best_ratio"] == 0.98
    assert sm["median_ratio_nearest"] == pytest.approx(1.1) and sm["n_nearest"] == 3
    assert sm["served_sources"] == {"error": 1, "nearest": 2, "nearest+bucket": 1, "table": 1, "tuned": 1}
    assert sm["no_neighbour"] == 1 and sm["identical"] == 1 and sm["errors"] == 1 and sm["within_5pct"] == 2
    assert s["attention"]["median_ratio"] == 1.2 and s["attention"]["worst_ratio"] == 1.2
    assert s["rope"] == {**s["rope"], "n_shapes": 0, "median_ratio": None, "worst_ratio": None, "served_sources": {}}


def _fake_measure(shape, tmp, index, rounds=5):
    f = shape["family"]
    if f == "softmax" and index >= 12:
        raise RuntimeError("boom")
    if f == "attention" and index % 2:
        return {"family": f, "shape": dict(shape), "served_source": "tuned", "served_config": {"BLOCK_M": 64},
                "tuned_config": {"BLOCK_M": 64}, "served_us": None, "tuned_us": None, "ratio": None,
                "no_neighbour": True}
    return {"family": f, "shape": dict(shape), "served_source": "nearest", "served_config": {"TM": 1},
            "tuned_config": {"TM": 2}, "served_us": 11.0, "tuned_us": 10.0, "ratio": 1.1, "no_neighbour": False}


def test_main_writes_the_schema(tmp_path, monkeypatch):
    monkeypatch.setenv("TILETUNE_DB", str(tmp_path / "x.db"))
    monkeypatch.setattr(nq, "measure", _fake_measure)
    assert nq.main(["--out", str(tmp_path), "--per-family", "4", "--seed", "3"]) == 0
    doc = json.loads((tmp_path / "nearest_quality.json").read_text())
    for key in ("seed", "gpu", "driver", "versions", "date", "families", "rows"):
        assert key in doc, key
    assert doc["seed"] == 3 and doc["complete"] and doc["rows_not_reached_in_budget"] == 0
    assert doc["date"].endswith("Z") and "tiletune_commit" in doc["versions"] and "torch" in doc["versions"]
    assert doc["benchmark"] == "nearest_quality"
    assert "h200-sm90.json" in doc["shipped_table"]
    assert len(doc["rows"]) == 4 * len(nq.DEFAULT_FAMILIES)
    assert [r["shape"] for r in doc["rows"]] == nq.plan(list(nq.DEFAULT_FAMILIES), 4, 3)[0]
    for r in doc["rows"]:
        if "error" in r:
            assert r["family"] == "softmax" and "traceback" in r
            continue
        for key in nq.ROW_KEYS:
            assert key in r, key
    fam = {f["op"]: f for f in doc["families"]}
    assert [f["op"] for f in doc["families"]] == list(nq.DEFAULT_FAMILIES)
    for f in doc["families"]:
        for key in ("op", "n_shapes", "median_ratio", "worst_ratio", "served_sources"):
            assert key in f, key
    assert fam["rms_norm"]["n_shapes"] == 4 and fam["rms_norm"]["median_ratio"] == pytest.approx(1.1)
    assert fam["rms_norm"]["served_sources"] == {"nearest": 4}
    assert fam["attention"]["n_shapes"] == 2 and fam["attention"]["no_neighbour"] == 2
    assert fam["attention"]["served_sources"] == {"nearest": 2, "tuned": 2}
    assert fam["softmax"]["errors"] == 2 and fam["softmax"]["n_shapes"] == 2
    assert fam["softmax"]["served_sources"] == {"error": 2, "nearest": 2}


def test_main_budget_stop_still_writes_every_family(tmp_path, monkeypatch):
    monkeypatch.setenv("TILETUNE_DB", str(tmp_path / "x.db"))
    monkeypatch.setattr(nq, "measure", _fake_measure)
    clock = iter(range(0, 100000, 10))
    monkeypatch.setattr(nq.time, "perf_counter", lambda: float(next(clock)))
    assert nq.main(["--out", str(tmp_path), "--budget-s", "95"]) == 0
    doc = json.loads((tmp_path / "nearest_quality.json").read_text())
    assert not doc["complete"]
    n = len(doc["rows"])
    assert len(nq.DEFAULT_FAMILIES) <= n < 40 * len(nq.DEFAULT_FAMILIES)
    assert doc["rows_not_reached_in_budget"] == 40 * len(nq.DEFAULT_FAMILIES) - n
    assert {r["family"] for r in doc["rows"]} == set(nq.DEFAULT_FAMILIES)


def test_main_restores_the_environment_reader(tmp_path, monkeypatch):
    import _common

    before = _common.environment
    monkeypatch.setattr(nq, "measure", _fake_measure)
    nq.main(["--out", str(tmp_path), "--per-family", "1", "--families", "rope"])
    assert _common.environment is before


def test_tuning_stats_keep_where_the_time_went():
    class Result:
        wall_s = 12.34567
        stats = {"strategy": "auto", "evaluations": 40, "space_size": 128, "phases": {"compile": 8.123456, "check": 1.0},
                 "compile_wall_s": 7.77777, "plan_calls": 99, "tied": [1, 2]}

    got = nq.tuning_stats(Result())
    assert got == {"wall_s": 12.346, "strategy": "auto", "evaluations": 40, "space_size": 128,
                   "phases": {"compile": 8.1235, "check": 1.0}, "compile_wall_s": 7.7778}
    assert nq.tuning_stats(None) is None


def test_choice_log_keeps_the_tuning_of_a_tuned_choice():
    class Result:
        wall_s, stats = 2.0, {"evaluations": 6}

    log = nq.ChoiceLog()
    choice = FakeChoice(FakeConfig(T=1), "tuned")
    choice.result = Result()
    log(op="x", problem=FakeProblem("x", ("key", "a")), choice=choice)
    log(op="y", problem=FakeProblem("y", ("key", "b")), choice=FakeChoice(FakeConfig(T=2), "nearest"))
    assert log.find("x", ("key", "a"))["tuning"] == {"wall_s": 2.0, "evaluations": 6}
    assert log.find("y", ("key", "b"))["tuning"] is None
    op = FakeOp("x", {("key", "a"): FakeConfig(T=1)})
    (k,) = nq.kernels_of([(op, None, ("a",))], log)
    assert k["tuning"] == {"wall_s": 2.0, "evaluations": 6} and k["source"] == "tuned"


def test_key_summary_names_a_problem_keys_sizes():
    key = json.dumps([{"bucketed": True}, {"problem": "gemm", "M": 512, "N": 4096, "K": 4096, "layout": "nt"}])
    assert nq.key_summary(key) == {"problem": "gemm", "M": 512, "N": 4096, "K": 4096, "layout": "nt"}
    shaped = json.dumps([{"shape": [8, 4096], "dtype": "bfloat16"}, {"shape": [4096], "dtype": "bfloat16"}])
    assert nq.key_summary(shaped) == [[8, 4096], [4096]]
    assert nq.key_summary(None) is None and nq.key_summary("not json") is None


def test_measure_times_the_row_even_when_it_fails(monkeypatch, tmp_path):
    def boom(row, shape, tmp, index, rounds):
        row["served_first_call_s"] = 0.5
        raise RuntimeError("no GPU")

    monkeypatch.setattr(nq, "_measure", boom)
    with pytest.raises(RuntimeError):
        nq.measure({"family": "rms_norm", "model": "llama3-8b", "M": 3, "H": 4096}, tmp_path, 0)
    row = {}

    def ok(r, shape, tmp, index, rounds):
        r.update(ratio=1.0)
        row.update(r)
        return r

    monkeypatch.setattr(nq, "_measure", ok)
    got = nq.measure({"family": "rms_norm", "model": "llama3-8b", "M": 3, "H": 4096}, tmp_path, 0)
    assert got["ratio"] == 1.0 and got["row_s"] >= 0 and got["family"] == "rms_norm"


def test_summary_sums_where_each_familys_time_went():
    rows = [{"family": "matmul_linear", "ratio": 1.0, "row_s": 10.0, "tune_s": 8.0, "served_first_call_s": 0.5,
             "timing_s": 1.0},
            {"family": "matmul_linear", "ratio": 1.2, "row_s": 3.0, "tune_s": 2.0, "served_first_call_s": 0.2,
             "timing_s": None},
            {"family": "matmul_linear", "error": "x"}]
    (fam,) = nq.summarize(rows, ["matmul_linear"])
    assert fam["time_s"] == {"rows": 13.0, "served": 0.7, "tune": 10.0, "timing": 1.0}


@pytest.mark.parametrize("family", nq.FAMILIES)
def test_every_family_draws_sizes_and_a_label(family):
    shapes, _ = nq.draw_family(family, 40, 0)
    assert len(shapes) == 40
    for s in shapes:
        elems, flops = nq.size_of(s)
        assert 0 < elems <= nq.ELEMENT_CAP and 0 < flops <= nq.FLOP_CAP
        assert nq.shape_label(s).startswith(family + " ")


def test_main_with_every_family_writes_every_family(tmp_path, monkeypatch):
    monkeypatch.setenv("TILETUNE_DB", str(tmp_path / "x.db"))
    monkeypatch.setattr(nq, "measure", _fake_measure)
    assert nq.main(["--out", str(tmp_path), "--per-family", "2", "--families", "all"]) == 0
    doc = json.loads((tmp_path / "nearest_quality.json").read_text())
    assert [f["op"] for f in doc["families"]] == list(nq.FAMILIES)
    assert all(f["rows"] == 2 for f in doc["families"])
    assert [r["family"] for r in doc["rows"][:len(nq.FAMILIES)]] == list(nq.FAMILIES)  # round-robin


# --------------------------------------------------------------------------------------------
# with real tuned ops (the CPU FakeBackend): record_launches, the choice events, miss scopes
# --------------------------------------------------------------------------------------------


def test_served_and_tuned_phases_with_real_tuned_ops(tmp_path):
    torch = pytest.importorskip("torch")
    import tiletune as tt
    from tiletune.devices.backends import FakeBackend
    from tiletune.op.tuned_op import record_launches
    from tiletune.resolve.chain import miss_scope

    space = tt.Space(K=list(range(6)), baseline=dict(K=0))
    launched: list = []

    def kernel(x, y, k):
        launched.append(k)
        y.copy_(x * 2)

    def plan(cfg, x, y):
        return tt.Launch(kernel, (1,), (x, y, cfg.K))

    def make(db, best=3):  # one "library op": the same name, plan and space in every phase
        return tt.autotune(space, reference=lambda x, y: x * 2, writes=["y"], db=db, name="nq.op",
                           backend=FakeBackend(lambda c: 10.0 + abs(c.K - best)), progress=False,
                           on_miss="nearest")(plan)

    # a neighbour tuned on another shape, where the best K is 5, in the served database
    served_db = tt.TuningDB(tmp_path / "served.db")
    with miss_scope(on_miss="tune"):
        make(served_db, best=5)(torch.randn(64), torch.empty(64))

    x = torch.randn(100)
    served_op = make(served_db)
    with nq.ChoiceLog() as log, miss_scope(on_miss="nearest"):
        _, rec = record_launches(lambda: served_op(x, torch.empty(100)))
    served = nq.kernels_of(rec, log)
    assert [(k["name"], k["source"], k["config"].as_dict()) for k in served] == [("nq.op", "nearest", {"K": 5})]
    assert nq.key_shapes(served[0]["neighbour"]) == [[64], [64]]

    tuned_op = make(tt.TuningDB(tmp_path / "tuned.db"))
    with nq.ChoiceLog() as log2, miss_scope(on_miss="tune"):
        _, rec = record_launches(lambda: tuned_op(x, torch.empty(100)))
    tuned = nq.kernels_of(rec, log2)
    assert [(k["source"], k["config"].as_dict()) for k in tuned] == [("tuned", {"K": 3})]
    assert tuned[0]["op"] is tuned_op

    launched.clear()
    row = nq.compare({}, served, tuned, lambda fn: (fn(), 1.0)[1], 2)  # the real launcher, FakeBackend launches
    assert row["paired"] and not row["identical"] and row["ratio"] == 1.0
    assert row["kernels"][0]["served_config"] == {"K": 5} and row["tuned_config"] == {"K": 3}
    # served then tuned config, on the tuned call's arguments: compile pass, then A B per round
    assert launched == [5, 3, 5, 3, 5, 3]
