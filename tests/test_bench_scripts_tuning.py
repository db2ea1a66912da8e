"""CPU tests of ``benchmarks/tuning_speed.py`` (cold tuning) and the fault space of
``benchmarks/fault_matrix.py``: what decides what a GPU run measures, without a GPU.

Argument parsing, the alternation of the sides, the median / ratio / pick_gap arithmetic on fake
timings, the child code compiling, the cold environment, the 28-config fault space (12 good, 4 of
each fault) and the expected-verdict mapping.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
HELPERS = ROOT / "tests" / "helpers"
for p in (BENCH, HELPERS):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import fault_matrix  # noqa: E402
import tuning_speed as ts  # noqa: E402


# -- tuning_speed: arguments ------------------------------------------------------------------------

def test_defaults():
    a = ts.parse_args([])
    assert a.reps == 3 and not a.quick and a.out is None
    assert a.kernels == ("tilegym_matmul", "matmul", "rmsnorm")


def test_quick_is_one_rep_two_kernels_with_tilegym():
    a = ts.parse_args(["--quick"])
    assert a.reps == 1
    assert len(a.kernels) == 2 and "tilegym_matmul" in a.kernels


def test_explicit_reps_and_kernels():
    a = ts.parse_args(["--quick", "--reps", "2", "--kernels", "rmsnorm, matmul", "--out", "/tmp/x"])
    assert a.reps == 2 and a.kernels == ("rmsnorm", "matmul") and a.out == "/tmp/x"


@pytest.mark.parametrize("argv", [["--kernels", "softmaxx"], ["--reps", "0"]])
def test_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit):
        ts.parse_args(argv)


def test_full_run_covers_three_kernels_three_reps():
    a = ts.parse_args([])
    assert len(a.kernels) >= 3 and a.reps >= 3
    assert set(a.kernels) <= set(ts.SETUP) and set(ts.SETUP) <= set(ts.PROBLEMS)


# -- alternation --------------------------------------------------------------------------------

def test_sides_alternate():
    orders = [ts.side_order(r) for r in range(4)]
    assert orders[0] == ("exhaustive", "tiletune")
    assert orders[1] == ("tiletune", "exhaustive")
    assert orders[2] == orders[0] and orders[3] == orders[1]
    firsts = Counter(o[0] for o in (ts.side_order(r) for r in range(3)))
    assert firsts == {"exhaustive": 2, "tiletune": 1}


def test_measure_kernel_runs_sides_in_alternated_order(monkeypatch):
    calls = []

    def fake_side(kernel, side, timeout):
        calls.append(side)
        wall = {"exhaustive": 20.0, "tiletune": 4.0}[side] + len(calls) * 0.01
        pick = {"TM": 128} if side == "exhaustive" else {"TM": 256}
        return {"wall_s": wall, "process_s": wall + 5, "pick": pick, "pick_us": 100.0, "ok": 4, "failed": 0,
                "configs": 4, "stats": {"samples": 10, "worker_wait_s": 1.0, "isolation": "process"},
                "isolation": "process", "kernel_version": None}

    monkeypatch.setattr(ts, "run_side", fake_side)
    monkeypatch.setattr(ts, "retime", lambda k, picks, rounds, timeout: {ts.config_key(c): 100.0 + 10 * c["TM"] / 128
                                                                          for c in picks})
    row, breakdown = ts.measure_kernel("rmsnorm", 3, 5, 10.0)
    assert calls == ["exhaustive", "tiletune", "tiletune", "exhaustive", "exhaustive", "tiletune"]
    assert [r["first"] for r in row["reps"]] == ["exhaustive", "tiletune", "exhaustive"]
    assert row["configs"] == 4
    # exhaustive pick 110 us, tiletune pick 120 us: tiletune's pick is 9.09% slower
    assert row["pick_gap"] == pytest.approx(120 / 110 - 1)
    assert breakdown["samples"] == 10 and breakdown["worker_wait_s"] == 1.0 and breakdown["isolation"] == "process"


def test_a_failing_side_is_recorded_not_fatal(monkeypatch):
    def fake_side(kernel, side, timeout):
        if side == "tiletune":
            raise RuntimeError("child failed (1)")
        return {"wall_s": 10.0, "process_s": 15.0, "pick": {"a": 1}, "pick_us": 5.0, "ok": 1, "failed": 0,
                "configs": 1}

    monkeypatch.setattr(ts, "run_side", fake_side)
    monkeypatch.setattr(ts, "retime", lambda *a: {ts.config_key({"a": 1}): 5.0})
    row, _ = ts.measure_kernel("rmsnorm", 1, 1, 1.0)
    assert "child failed" in row["reps"][0]["tiletune_error"]
    assert row["exhaustive_s"] == 10.0 and row["tiletune_s"] is None and row["ratio"] is None
    assert row["pick_gap"] is None


# -- arithmetic ------------------------------------------------------------------------------------

def _rep(ex, tt, ex_pick, tt_pick, stats=None):
    return {"exhaustive_s": ex, "tiletune_s": tt, "exhaustive_process_s": ex + 5, "tiletune_process_s": tt + 6,
            "exhaustive_pick": ex_pick, "tiletune_pick": tt_pick, "tiletune_stats": stats or {}}


def test_medians_ratio_and_pick_gap():
    A, B, C = {"T": 1}, {"T": 2}, {"T": 3}
    reps = [_rep(20.0, 4.0, A, A, {"samples": 100, "check_s_sum": 1.0}),
            _rep(22.0, 6.0, A, B, {"samples": 300, "check_s_sum": 3.0}),
            _rep(18.0, 5.0, C, B, {"samples": 200, "check_s_sum": 2.0})]
    retimed = {ts.config_key(A): 100.0, ts.config_key(B): 102.0, ts.config_key(C): 98.0}
    row, bd = ts.summarize("matmul", 32, reps, retimed)
    assert row["exhaustive_s"] == 20.0 and row["tiletune_s"] == 5.0
    assert row["ratio"] == pytest.approx(0.25)  # median tiletune / median exhaustive
    assert row["exhaustive_process_s"] == 25.0 and row["tiletune_process_s"] == 11.0
    gaps = [r["pick_gap"] for r in row["reps"]]
    assert gaps == pytest.approx([0.0, 0.02, 102 / 98 - 1])
    assert row["pick_gap"] == pytest.approx(0.02)
    assert [r["ratio"] for r in row["reps"]] == pytest.approx([0.2, 6 / 22, 5 / 18])
    assert bd == {"samples": 200, "check_s_sum": 2.0}
    assert row["configs"] == 32 and row["kernel"] == "matmul"


def test_pick_gap_sign():
    assert ts.pick_gap(110.0, 100.0) == pytest.approx(0.10)  # tiletune's pick slower: positive
    assert ts.pick_gap(95.0, 100.0) == pytest.approx(-0.05)


def test_compile_trace_summary_spans_concurrency_and_waits():
    jobs = [  # two front ends in one child, one in another; two assemblers overlap for 1 s
        {"front_pid": 11, "front": [100.1, 100.3], "queued": 100.3, "asm": [100.3, 101.3], "bytecode": 10},
        {"front_pid": 11, "front": [100.3, 100.5], "queued": 100.5, "asm": [100.8, 101.8], "bytecode": 20},
        {"front_pid": 12, "front": [100.1, 100.4], "queued": 100.4, "asm": [100.4, 100.9], "bytecode": 30},
    ]
    got = ts.compile_trace_summary(jobs, call_at=100.0)
    assert got["jobs"] == 3 and got["front_procs"] == 2 and got["front_per_proc_max"] == 2
    assert got["front_first_start"] == 0.1 and got["front_last_end"] == 0.5 and got["front_sum_s"] == 0.7
    assert got["asm_first_start"] == 0.3 and got["asm_last_start"] == 0.8 and got["asm_last_end"] == 1.8
    assert got["asm_sum_s"] == 2.5 and got["asm_max_s"] == 1.0
    assert got["asm_mean_running"] == round(2.5 / 1.5, 3)
    assert got["queue_wait_sum_s"] == 0.3  # the second waited from 100.5 to 100.8
    assert got["bytecode_bytes"] == [10, 20, 30]
    assert ts.compile_trace_summary([], 5.0) == {"jobs": 0, "marks": []}
    assert ts.compile_trace_summary(jobs, None)["front_first_start"] == 0.0
    marks = [{"mark": "session_start", "t": 100.05, "pid": 7, "op": "x"}, {"mark": "miss", "t": 100.01, "pid": 7}]
    assert ts.compile_trace_summary(jobs, 100.0, marks)["marks"] == [["miss", 0.01, 7, {}],
                                                                    ["session_start", 0.05, 7, {"op": "x"}]]
    assert ts.compile_trace_summary([], 100.0, marks)["marks"][0] == ["miss", 0.01, 7, {}]


def test_distinct_picks_once_each_in_order():
    A, B = {"TM": 64, "TN": 128}, {"TN": 128, "TM": 128}
    reps = [_rep(1, 1, A, B), _rep(1, 1, dict(reversed(list(A.items()))), A), {"exhaustive_pick": None}]
    assert ts.distinct_picks(reps) == [A, B]


def test_median_even_count_and_none():
    assert ts.median([1.0, 3.0]) == 2.0
    assert ts.median([None, 4.0]) == 4.0
    assert ts.median([None]) is None


# -- the child code and its environment ------------------------------------------------------------

@pytest.mark.parametrize("kernel", sorted(ts.SETUP))
def test_child_code_compiles(kernel):
    for part in (ts.EXHAUSTIVE, ts.TILETUNE, ts.RETIME % (json.dumps([{"TM": 64}]), 3, 10)):
        compile(ts.SETUP[kernel] + part, f"<{kernel}>", "exec")


def test_tilegym_side_imports_tilegym_kernel_and_template():
    code = ts.SETUP["tilegym_matmul"]
    assert "from tilegym.ops.cutile.matmul import _matmul_kernel" in code
    assert "matmul_space(2)" in code
    from tiletune.space.templates import matmul_space

    assert len(matmul_space(2).candidates("sm_90")) == 38


def test_tiletune_side_times_definition_and_call():
    """The op is defined inside the timed region (its worker start-up is counted)."""
    body = ts.TILETUNE
    t0, define, call, t1 = (body.index(s) for s in ("t0 = time.perf_counter()", "tt.autotune(", "op(*ARGS)",
                                                    "wall = time.perf_counter() - t0"))
    assert t0 < define < call < t1
    assert "wait_for_worker" not in body


def test_cold_env_is_fresh_and_clean(monkeypatch):
    monkeypatch.setenv("TILETUNE_PINS", "/somewhere/pins.json")
    monkeypatch.setenv("TILETUNE_ISOLATION", "none")
    monkeypatch.setenv("CUDA_TILE_CACHE_DIR", "/shared/cache")
    e1, e2 = ts.cold_env(), ts.cold_env(TILETUNE_WORKER_PRESTART="0")
    for e in (e1, e2):
        assert "TILETUNE_PINS" not in e and "TILETUNE_ISOLATION" not in e
        assert e["TILETUNE_TABLES"] == "0"
        assert os.path.isdir(e["CUDA_TILE_CACHE_DIR"]) and not os.listdir(e["CUDA_TILE_CACHE_DIR"])
        assert not os.path.exists(e["TILETUNE_DB"])
    assert e1["CUDA_TILE_CACHE_DIR"] != e2["CUDA_TILE_CACHE_DIR"] and e1["TILETUNE_DB"] != e2["TILETUNE_DB"]
    assert e2["TILETUNE_WORKER_PRESTART"] == "0"


def test_frontend_cache_lives_in_the_cutile_cache_dir():
    """A fresh CUDA_TILE_CACHE_DIR is enough for tiletune's front-end cache to start empty."""
    from tiletune.devices import frontend_cache

    class _Cfg:
        cache_dir = "/tmp/some-cutile-cache"

    class _Ctx:
        config = _Cfg()

    assert frontend_cache.cache_folder(_Ctx()) == Path("/tmp/some-cutile-cache") / "tiletune-frontend"


def test_import_is_cpu_safe():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import tuning_speed, json; "
            "print(json.dumps([m for m in ('torch', 'cuda.tile') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


# -- the fault space -----------------------------------------------------------------------------------

def _space_rows():
    from fault_kernels import SPACE_FAULTS, fault_space

    return [{**c.as_dict(), "fault": SPACE_FAULTS[c.MODE]} for c in fault_space().configs("sm_90")]


def test_fault_space_has_28_configs_12_4_4_4_4():
    rows = _space_rows()
    assert len(rows) == 28
    assert Counter(r["fault"] for r in rows) == {"good": 12, "illegal_read": 4, "endless_loop": 4,
                                                 "tail_wrong": 4, "write_past_end": 4}
    assert len({fault_matrix.config_label(r) for r in rows}) == 28


def test_fault_space_baseline_is_good_and_tail_is_partial():
    from fault_kernels import SPACE_T, fault_space

    base = fault_space().baseline("sm_90")
    assert base.MODE == 0
    n = (1 << 22) + 77  # the benchmark's default length
    assert all(n % t for t in SPACE_T)
    assert "(1 << 22) + 77" in fault_matrix.SPACE_CHILD


def test_expected_verdicts_cover_every_fault():
    from fault_kernels import SPACE_FAULTS

    assert set(fault_matrix.EXPECTED) == set(SPACE_FAULTS.values())
    assert fault_matrix.EXPECTED["good"] == ("ok",)
    assert fault_matrix.EXPECTED["illegal_read"] == ("launch_error",)
    assert fault_matrix.EXPECTED["endless_loop"] == ("timeout",)
    assert fault_matrix.EXPECTED["tail_wrong"] == ("mismatch",)
    assert set(fault_matrix.EXPECTED["write_past_end"]) == {"mismatch", "launch_error"}
    for fault, statuses in fault_matrix.EXPECTED.items():
        assert ("ok" in statuses) == (fault == "good")


def _measured(status_of):
    return [{"config": {k: r[k] for k in ("T", "occupancy", "MODE")}, "fault": r["fault"],
             "status": status_of(r["fault"]), "reason": ""} for r in _space_rows()]


def test_verdicts_all_right():
    right = {"good": "ok", "illegal_read": "launch_error", "endless_loop": "timeout", "tail_wrong": "mismatch",
             "write_past_end": "mismatch"}
    v, ok = fault_matrix.verdicts(_measured(right.get))
    assert ok and len(v) == 28 and all(r["ok"] for r in v.values())


@pytest.mark.parametrize("fault,status", [("write_past_end", "ok"), ("good", "mismatch"),
                                          ("endless_loop", "launch_error"), ("illegal_read", "timeout"),
                                          ("tail_wrong", "ok")])
def test_verdicts_catch_a_wrong_status(fault, status):
    right = {"good": "ok", "illegal_read": "launch_error", "endless_loop": "timeout", "tail_wrong": "mismatch",
             "write_past_end": "launch_error"}
    v, ok = fault_matrix.verdicts(_measured(lambda f: status if f == fault else right[f]))
    assert not ok
    assert {r["fault"] for r in v.values() if not r["ok"]} == {fault}
    assert sum(not r["ok"] for r in v.values()) == (12 if fault == "good" else 4)


def test_verdicts_missing_config_is_wrong():
    rows = _measured(lambda f: fault_matrix.EXPECTED[f][0])
    space = [{**r["config"], "fault": r["fault"]} for r in rows]
    v, ok = fault_matrix.verdicts(rows[:-1], space)
    assert not ok and sum(r["status"] == "missing" for r in v.values()) == 1


def test_fault_space_child_compiles():
    compile(fault_matrix.SPACE_CHILD, "<fault_space>", "exec")
    assert "make_fault_space_op" in fault_matrix.SPACE_CHILD


def test_main_writes_after_every_kernel(monkeypatch, tmp_path):
    writes = []
    monkeypatch.setattr(ts, "measure_kernel", lambda k, reps, rounds, timeout: (
        {"kernel": k, "exhaustive_s": 2.0, "tiletune_s": 1.0, "ratio": 0.5, "pick_gap": 0.0}, {"k": k}))
    monkeypatch.setattr(ts, "write_result", lambda name, doc, out: writes.append(
        (name, [r["kernel"] for r in doc["rows"]], doc["complete"])))
    ts.main(["--kernels", "rmsnorm,matmul", "--reps", "1", "--out", str(tmp_path)])
    assert writes == [("tuning_speed_cold", ["rmsnorm"], False), ("tuning_speed_cold", ["rmsnorm", "matmul"], True)]


def test_compile_order_ab_alternates_the_orders_and_takes_medians(monkeypatch, tmp_path):
    calls = []

    def fake_side(kernel, side, timeout, **extra):
        assert side == "tiletune"
        calls.append(extra["TILETUNE_COMPILE_ORDER"])
        if len(calls) == 3:
            raise RuntimeError("child failed (1)")
        wall = {"largest": 4.0, "given": 5.0}[extra["TILETUNE_COMPILE_ORDER"]] + len(calls) * 0.01
        return {"wall_s": wall, "pick": {"TM": 128}, "pick_us": 100.0, "compile_trace": {"jobs": 32},
                "stats": {"phase_compile_wall_s": 1.0, "samples": 5, "outside_session_s": 0.5}}

    monkeypatch.setattr(ts, "run_side", fake_side)
    writes = []
    monkeypatch.setattr(ts, "write_result", lambda name, doc, out: writes.append((name, doc)))
    ts.main(["--order-ab", "--kernels", "matmul", "--reps", "3", "--out", str(tmp_path)])
    assert calls == ["largest", "given", "given", "largest", "largest", "given"]
    (name, doc), = writes
    (row,) = doc["rows"]
    assert name == "compile_order_ab" and doc["complete"]
    assert row["largest_s"] == pytest.approx(4.04) and row["given_s"] == pytest.approx((5.02 + 5.06) / 2)
    assert row["ratio"] == pytest.approx(row["largest_s"] / row["given_s"])
    assert "child failed" in row["runs"][2]["error"]
    assert row["runs"][0]["stats"] == {"phase_compile_wall_s": 1.0, "outside_session_s": 0.5}
    assert row["runs"][0]["compile_trace"] == {"jobs": 32}


def test_frontend_cache_benchmark_measures_the_three_first_launches(tmp_path):
    """benchmarks/frontend_cache.py: real compiles for sm_90 on the host (no GPU): a cold compile, cuTile's
    disk-cache hit and tiletune's front-end hit, each in a fresh process; the entry is a record of cuTile's key."""
    pytest.importorskip("cuda.tile")
    pytest.importorskip("cutile_cache")
    out = tmp_path / "fc.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "frontend_cache.py"), "--kernels", "layernorm",
                        "--reps", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["kernel"] == "layernorm" and row["frontend_hit"] is True
    assert row["frontend_cubin_bytes"] == 0 and row["cutile_cache_bytes"] > 0  # the cubin is stored once
    assert all(row[f"{m}_first_compile_s"] > 0 for m in ("cold", "disk", "frontend"))
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "frontend_cache.py"), "--kernels", "nope"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown kernels" in bad.stderr


def test_env_ab_alternates_the_values_of_any_variable(monkeypatch, tmp_path):
    calls = []

    def fake_side(kernel, side, timeout, **extra):
        assert side == "tiletune" and list(extra) == ["TILETUNE_COMPILE_WORKERS"]
        calls.append(extra["TILETUNE_COMPILE_WORKERS"])
        return {"wall_s": {"16": 2.0, "8": 1.6}[calls[-1]] + len(calls) * 0.01, "pick": {"TM": 128},
                "pick_us": 100.0, "stats": {"phase_compile_s": 1.0, "samples": 5}}

    monkeypatch.setattr(ts, "run_side", fake_side)
    writes = []
    monkeypatch.setattr(ts, "write_result", lambda name, doc, out: writes.append((name, doc)))
    ts.main(["--env-ab", "TILETUNE_COMPILE_WORKERS=16,8", "--kernels", "tilegym_matmul", "--reps", "2",
             "--out", str(tmp_path)])
    assert calls == ["16", "8", "8", "16"]
    (name, doc), = writes
    (row,) = doc["rows"]
    assert name == "env_ab_tiletune_compile_workers" and doc["values"] == ["16", "8"]
    assert row["16_s"] == pytest.approx((2.01 + 2.04) / 2) and row["8_s"] == pytest.approx((1.62 + 1.63) / 2)
    assert row["ratio"] == pytest.approx(row["16_s"] / row["8_s"])
    assert row["runs"][0]["stats"] == {"phase_compile_s": 1.0}


@pytest.mark.parametrize("spec", ["TILETUNE_COMPILE_WORKERS", "X=1", "X=1,1", "=1,2", "X=1,2,3", "X=,2"])
def test_env_ab_refuses_a_bad_spec(spec):
    with pytest.raises(SystemExit):
        ts.parse_args(["--env-ab", spec])


def test_before_compile_names_the_callers_steps_up_to_the_first_compile():
    marks = [{"mark": "miss", "t": 10.00, "pid": 7},
             {"mark": "worker_start", "t": 10.01, "pid": 7, "thread": "w"},  # another thread: not a step
             {"mark": "source", "t": 10.02, "pid": 7, "name": "database"},
             {"mark": "worker_main", "t": 10.05, "pid": 9},  # another process
             {"mark": "source", "t": 10.15, "pid": 7, "name": "table"},
             {"mark": "tune_lease_held", "t": 10.20, "pid": 7},
             {"mark": "session_compile_sent", "t": 10.30, "pid": 7},
             {"mark": "session_finish", "t": 11.00, "pid": 7}]
    assert ts.before_compile(marks) == [["miss", 0.02], ["source:database", 0.13], ["source:table", 0.05],
                                        ["tune_lease_held", 0.1]]
    assert ts.before_compile(marks[1:]) == []  # no miss marked
    got = ts.compile_trace_summary([], 9.0, marks)
    assert got["before_compile"][1] == ["source:database", 0.13]
