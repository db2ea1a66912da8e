"""CPU tests of benchmark scripts: the parts that decide what a GPU run measures.

``benchmarks/host_cost.py`` (issue 12, item 2): its row list covers every op of
``tiletune.kernels.__all__`` and both matmul weight layouts at M = 1, 8, 128; it imports only the
standard library at module level (cuda.tile and triton are not needed to read it); the summary and
table are pure; and the torch candidates of each row, built on CPU, agree with each other (and RoPE
with a float32 rotate-half reference), so a wrong torch formulation is caught before a GPU run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import host_cost  # noqa: E402


def _all_ops() -> list[str]:
    import tiletune.kernels as K

    return list(K.__all__)


def test_import_is_cpu_safe():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import host_cost, json; "
            "print(json.dumps([m for m in ('torch', 'triton', 'cuda.tile', 'tiletune') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_rows_cover_every_library_op():
    specs = host_cost.row_specs(quick=False)
    assert set(_all_ops()) <= {s["op"] for s in specs}
    assert {s["op"] for s in specs} <= set(_all_ops())
    names = [s["name"] for s in specs]
    assert len(names) == len(set(names)), [n for n, c in Counter(names).items() if c > 1]
    for s in specs:
        assert {"name", "op", "variant", "m", "shape", "dtype"} <= set(s)
        assert s["dtype"] == "bfloat16"


def test_rows_m_values():
    specs = host_cost.row_specs()
    ms: dict[tuple, set] = {}
    for s in specs:
        ms.setdefault((s["op"], s["variant"]), set()).add(s["m"])
    for op in ("rms_norm_residual", "layer_norm", "softmax", "swiglu", "geglu", "apply_rope_"):
        assert ms[(op, "")] == {1, 8, 128}, op
    assert ms[("rms_norm", "weight")] == {1, 8, 128}
    assert ms[("rms_norm", "no weight")] == {8}
    assert ms[("cross_entropy", "")] == {8, 128}
    assert ms[("attention", "causal")] == {None} and ms[("attention", "non-causal")] == {None}
    assert [s["causal"] for s in specs if s["op"] == "attention"] == [False, True]


def test_matmul_layouts_at_each_m():
    mm = [s for s in host_cost.row_specs() if s["op"] == "matmul"]
    got = {(s["layout"], s["m"]) for s in mm}
    assert got == {(lay, m) for lay in ("nk", "kn") for m in (1, 8, 128)}
    assert len(mm) == 6


def test_quick_rows():
    specs = host_cost.row_specs(quick=True)
    assert set(_all_ops()) <= {s["op"] for s in specs}
    assert {s["m"] for s in specs} <= {8, None}
    assert {s["layout"] for s in specs if s["op"] == "matmul"} == {"nk", "kn"}


def test_row_specs_is_pure():
    a, b = host_cost.row_specs(), host_cost.row_specs()
    assert a == b
    a[0]["m"] = -1
    assert host_cost.row_specs()[0]["m"] != -1


def test_calls_for_caps_queued_launches():
    assert host_cost.calls_for(None, 300) == 300
    assert host_cost.calls_for(1.0, 300) == 300
    assert host_cost.calls_for(12.0, 300) == host_cost.QUEUE_BUDGET // 12
    assert host_cost.calls_for(12.0, 300) * 12 <= host_cost.QUEUE_BUDGET
    assert host_cost.calls_for(1000.0, 300) == host_cost.MIN_CALLS
    assert host_cost.calls_for(0.5, 100) == 100


def _row(name_op, ratio, **kw):
    r = host_cost._row(name_op, "", 8, "8x4096")
    r.update(ratio=ratio, **kw)
    return r


def test_summarize_and_table():
    rows = [
        _row("rms_norm", 1.5, tiletune_host_us=15.0, torch_host_us=10.0, tiletune_gpu_us=2.0, torch_gpu_us=3.0,
             torch_route="F.rms_norm", agree=True),
        _row("softmax", 0.5, tiletune_host_us=5.0, torch_host_us=10.0, tiletune_gpu_us=None, torch_gpu_us=3.0,
             torch_route="torch.softmax", agree=False),
        _row("geglu", None, error="RuntimeError: boom\nsecond line"),
    ]
    s = host_cost.summarize(rows)
    assert s["max_ratio"] == 1.5 and s["max_ratio_row"] == "rms_norm M=8"
    assert s["rows_over_1"] == 1 and s["rows_over_1_names"] == ["rms_norm M=8"]
    assert s["n_rated"] == 2 and s["n_errors"] == 1 and s["n_disagree"] == 1
    assert s["geomean_ratio"] == pytest.approx((1.5 * 0.5) ** 0.5)
    assert host_cost.summarize([])["max_ratio"] is None
    text = host_cost.table(rows)
    lines = text.splitlines()
    assert len(lines) == 4
    assert "1.50" in lines[1] and "NO" in lines[2] and "ERROR: RuntimeError: boom" in lines[3]
    assert "second line" not in text


def test_summary_names_rows_whose_bare_launches_already_cost_more_than_torch():
    rows = [_row("softmax", 1.3, tiletune_host_us=8.0, torch_host_us=6.0, launch_floor_us=7.0, floor_ratio=7 / 6,
                 overhead_us=1.0),
            _row("rms_norm", 1.1, tiletune_host_us=11.0, torch_host_us=10.0, launch_floor_us=8.0, floor_ratio=0.8,
                 overhead_us=3.0),
            _row("swiglu", 0.6, tiletune_host_us=12.0, torch_host_us=20.0)]
    s = host_cost.summarize(rows)
    assert s["rows_over_1_floor_over_1"] == ["softmax M=8"]
    assert s["median_overhead_us"] == pytest.approx(2.0)
    assert "7.0" in host_cost.table(rows).splitlines()[1]


def test_launch_floor_replays_the_recorded_launches_bare():
    torch = pytest.importorskip("torch")
    import tiletune as tt
    from tiletune.kernels import fastcall
    from tiletune.devices.backends import FakeBackend

    be = FakeBackend(lambda cfg: 100.0 - cfg.TM, noise=0.0)

    def kernel(x, y, f):
        y.copy_(x * f)

    @tt.autotune(tt.Space(TM=[1, 2], baseline=dict(TM=1)), reference=lambda x, y, f: x * f, writes=["y"], db=False,
                 backend=be, progress=False, name="floor_scale")
    def plan(cfg, x, y, f):
        return tt.Launch(kernel, (cfg.TM,), (x, y, f))

    @fastcall.fast_op()
    def scale(x):
        y = torch.empty_like(x)
        plan(x, y, 3.0)
        return y

    x = torch.randn(8)
    scale(x)
    n = len(be.launches)
    floor, launches = host_cost.launch_floor(scale, (x,))
    assert launches == 1 and len(be.launches) == n + 1  # recording ran one call
    floor(x)
    floor(x)
    assert len(be.launches) == n + 3
    assert all(c == tt.Space(TM=[1, 2]).config(TM=2) for c, _, _ in be.launches[-2:])


@pytest.mark.parametrize("spec", host_cost.row_specs(quick=True), ids=lambda s: s["name"])
def test_torch_candidates_agree_on_cpu(spec):
    torch = pytest.importorskip("torch")
    case = host_cost.build_case(spec, device="cpu")
    assert callable(case["tiletune"]) and case["routes"]
    outs = {}
    for name, fn in case["routes"].items():
        args = case["make"](3)  # fresh inputs: the RoPE candidates rotate in place
        outs[name] = [t.float() for t in host_cost._flat(fn(*args))]
        if case["inplace"]:
            q, k = args[0], args[1]
            assert torch.equal(outs[name][0], q.float())
            assert torch.equal(outs[name][1], k.float())
    first = next(iter(outs.values()))
    for name, out in outs.items():
        assert len(out) == len(first), name
        for a, b in zip(out, first):
            torch.testing.assert_close(a, b, rtol=2e-2, atol=4e-2, msg=name)
    if spec["op"] == "apply_rope_":
        q, k, cos, sin = case["make"](3)
        qkv_before = q._base.clone()
        h = cos.shape[-1] // 2
        c, s = cos.float()[:, None, :], sin.float()[:, None, :]
        for x, got in zip((q, k), first):
            x = x.float()
            rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
            torch.testing.assert_close(got, x * c + rot * s, rtol=2e-2, atol=4e-2)
        # the candidates touch q and k only, not the rest of the qkv tensor (v)
        for fn in case["routes"].values():
            q2, k2, c2, s2 = case["make"](3)
            fn(q2, k2, c2, s2)
            nq, nk = q2.shape[2], k2.shape[2]
            assert torch.equal(q2._base[:, :, nq + nk:], qkv_before[:, :, nq + nk:])


def test_main_with_cpu_fakes(monkeypatch, tmp_path):
    """The whole driver on CPU: tiletune faked by the first torch candidate, no CUDA graphs; a row that
    fails records its error and the others still run; the result has the fields the issue asks for."""
    torch = pytest.importorskip("torch")
    from tiletune.kernels.library_op import LibraryOp

    configured = []
    written = {}
    monkeypatch.setenv("TILETUNE_DB", "unchanged")  # main sets both; monkeypatch restores them
    monkeypatch.setenv("TILETUNE_PROGRESS", "0")
    monkeypatch.setattr(LibraryOp, "configure", lambda **kw: configured.append(kw))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(host_cost, "gpu_time", lambda fn, args: {"gpu_us": 1.0, "launches_per_call": 4.0})
    real_build = host_cost.build_case

    def cpu_case(spec):
        case = real_build(spec, device="cpu")
        case["tiletune"] = next(iter(case["routes"].values()))
        return case

    monkeypatch.setattr(host_cost, "build_case", cpu_case)
    rope = next(s for s in host_cost.row_specs(quick=True) if s["op"] == "apply_rope_")
    bogus = host_cost._row("no_such_op", "", 8, "8x8")
    monkeypatch.setattr(host_cost, "row_specs", lambda quick=False: [rope, bogus])
    monkeypatch.setattr(host_cost, "write_result",
                        lambda name, data, out: written.update(name=name, data=data, out=out))
    assert host_cost.main(["--quick", "--calls", "20", "--rounds", "2", "--out", str(tmp_path)]) == 0
    import os

    db = os.environ["TILETUNE_DB"]
    assert db.endswith("tt.db") and len(configured) == 1
    assert configured[0]["db"] == db and configured[0]["progress"] is False
    assert configured[0]["options"].stopping.max_samples == 10  # short tuning measurements
    assert not Path(db).parent.exists()  # the temporary database is removed
    assert written["name"] == "host_cost" and written["out"] == str(tmp_path)
    data = written["data"]
    ok, bad = data["rows"]
    for key in ("op", "shape", "tiletune_host_us", "torch_host_us", "ratio", "tiletune_gpu_us", "torch_gpu_us",
                "torch_route"):
        assert key in ok and key in bad
    assert ok["agree"] is True and ok["ratio"] > 0 and ok["tiletune_gpu_us"] == 1.0
    assert ok["calls_per_batch"] == {"tiletune": 20, "torch": 20}
    assert set(ok["torch_routes_host_us"]) == set(real_build(rope, device="cpu")["routes"])
    assert ok["torch_route"] in ok["torch_routes_host_us"]
    assert bad["ratio"] is None and "no case for op" in bad["error"]
    assert data["n_errors"] == 1 and data["n_rated"] == 1 and "max_ratio" in data and "rows_over_1" in data
    assert "perf_counter" in data["method"]


# ---------------------------------------------------------------------------------------------
# benchmarks/configs_in_context.py (issue 20 diagnostics): the op table and the summary
# ---------------------------------------------------------------------------------------------


def test_configs_in_context_ops_name_library_ops_and_calls():
    import importlib

    import configs_in_context as cic

    for op, (module, attr, width) in cic.OPS.items():
        lib = getattr(importlib.import_module(f"tiletune.kernels.{module}"), attr)
        assert lib.name == f"tiletune.{op}" and width in ("n", "2n")
        assert callable(cic.op_call(op, None, {}))
    with pytest.raises(ValueError, match="unknown op"):
        cic.op_call("gelu", None, {})


def test_configs_in_context_summary():
    import configs_in_context as cic

    a, b, c = {"LAT": 0}, {"LAT": 10}, {"LAT": 5}
    rows = [{"config": a, "tuner_us": 2.6, "cold_us": 3.0, "warm_us": 2.0, "in_context_us": 2.8},
            {"config": b, "tuner_us": 2.5, "cold_us": 2.9, "warm_us": 9.0, "in_context_us": 10.5},
            {"config": c, "tuner_us": 2.7, "cold_us": 3.1, "warm_us": 2.1, "in_context_us": None}]
    got = cic.summarize(rows, b)
    assert got["tuner_pick"] == b
    assert got["best_tuner"] == {"config": b, "us": 2.5} and got["best_cold"]["config"] == b
    assert got["best_warm"]["config"] == a and got["best_in_context"] == {"config": a, "us": 2.8}
    assert got["pick_vs_best_in_context"] == pytest.approx(10.5 / 2.8)
    assert "pick_vs_best_in_context" not in cic.summarize(rows, c)  # the pick was not timed in context


# ---------------------------------------------------------------------------------------------
# benchmarks/probe_rows.py (issue 14 diagnostics): the space and the plan's launches
# ---------------------------------------------------------------------------------------------


def test_probe_rows_space_keeps_valid_variants_only():
    pytest.importorskip("cuda.tile")
    import probe_rows

    cands = [dict(c) for c in probe_rows.probe_space(1024).candidates("sm_90")]
    assert cands
    for c in cands:
        assert 8192 <= c["TM"] * 1024 * c["occupancy"] <= 65536
        if c["LIB"]:
            assert c["LOAD_TMA"] and not c["PF"]  # the library kernel has neither knob
        if c["PF"]:
            assert c["LOAD_TMA"] and c["PERSIST"]  # a prefetch needs a next row block
    assert {probe_rows.variant(c) for c in cands} == {
        "library kernel", "library kernel, a block per row block", "tma loads", "tma loads, a block per row block",
        "plain loads", "plain loads, a block per row block", "tma loads + prefetch"}


@pytest.mark.parametrize("op", ["layer_norm", "softmax", "rms_norm"])
def test_probe_rows_plans_launch_what_the_kernels_take(monkeypatch, op):
    """Each config's launch on meta tensors: argument count of the kernel, the library plan for LIB (one block
    per row block when not persistent), the probe kernel's constants in order otherwise."""
    pytest.importorskip("cuda.tile")
    import torch

    import probe_rows
    import tiletune.kernels._membound as mb
    from tiletune.kernels.norms import layer_norm_plan, rms_norm_plan
    from tiletune.kernels.softmax_op import softmax_plan

    monkeypatch.setattr(mb, "sm_count", lambda dev: 132)
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    lib = {"layer_norm": layer_norm_plan, "softmax": softmax_plan, "rms_norm": rms_norm_plan}[op]
    x = torch.empty(65536, 1024, dtype=torch.bfloat16, device="meta")
    w = torch.empty(1024, dtype=torch.bfloat16, device="meta")
    args = {"layer_norm": (x, w, w, torch.empty_like(x), 1e-5, True, True), "softmax": (x, torch.empty_like(x)),
            "rms_norm": (x, w, torch.empty_like(x), 1e-6, True)}[op]
    plan = probe_rows.make_plan(op, lib)
    assert list(probe_rows.inspect.signature(plan).parameters) == list(probe_rows.inspect.signature(lib).parameters)
    seen = set()
    for c in probe_rows.probe_space(1024).candidates("sm_90"):
        kernel, grid, kargs = plan(c, *args)
        n_params = len(kernel._annotated_function.parameter_annotations)
        assert len(kargs) == n_params
        units = 65536 // c.TM
        assert grid == ((min(units, 132 * c.occupancy),) if c.PERSIST else (units,))
        if c.LIB:
            assert kernel is lib(probe_rows._Cfg(TM=c.TM, CHUNK=0, occupancy=1, LAT=0, STORE_TMA=True), *args)[0]
        else:
            assert kernel is probe_rows.KERNELS[op] and tuple(kargs[-5:]) == (c.TM, 1024, c.LOAD_TMA, c.PF, c.STORE_TMA)
        seen.add(c.LIB)
    assert seen == {True, False}


# ---------------------------------------------------------------------------------------------
# benchmarks/kernels_compute.py --combine: a re-measured row replaces the older one
# ---------------------------------------------------------------------------------------------


def test_kernels_compute_combine_takes_the_latest_measurement_of_a_row(tmp_path, monkeypatch):
    import kernels_compute as kc

    def row(op, shape, ratio):
        return {"op": op, "shape": shape, "dtype": "bfloat16", "sweep": True, "ratio": ratio, "flops": 1.0, "params": {},
                "tiletune_us": 1.0, "torch_us": ratio, "tiletune_tflops": 1.0, "torch_tflops": 1.0 / ratio}

    old = {"date": "2026-12-01T19:54:19Z", "gpu": "H200",
           "combined_from": [{"file": "kc_gemm.json", "only": "gemm"}, {"file": "kc_att.json", "only": "attention"}],
           "rows": [row("gemm", "16x4096x4096", 1.07), row("attention", "A", 0.99), row("attention", "D64", 0.743)]}
    new = {"date": "2026-12-02T00:24:45Z", "gpu": "H200", "only": "attention", "rows": [row("attention", "D64", 0.999)]}
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    monkeypatch.setattr(kc, "plot", lambda rows, out: [])
    assert kc.combine([str(tmp_path / "old.json"), str(tmp_path / "new.json")], tmp_path / "out") == 0
    doc = json.loads((tmp_path / "out" / "kernels_compute.json").read_text())
    assert [(r["shape"], r["ratio"]) for r in doc["rows"]] == [("16x4096x4096", 1.07), ("A", 0.99), ("D64", 0.999)]
    assert doc["attention_planned"] == 2 and doc["gemm_planned"] == 1
    assert [s["file"] for s in doc["combined_from"]] == ["kc_gemm.json", "kc_att.json", "new.json"]
    assert doc["replaced"] == [{"op": "attention", "shape": "D64", "dtype": "bfloat16", "from": "new.json",
                                "date": "2026-12-02T00:24:45Z"}]


def test_kernels_compute_splitk_evals_sets_the_split_k_budget_before_first_use(monkeypatch):
    import argparse

    import kernels_compute as kc
    from tiletune.kernels import gemm

    monkeypatch.setattr(gemm.GEMM_SPLITK, "budget", gemm.GEMM_SPLITK.budget)  # restored after the test

    def ns(**kw):
        return argparse.Namespace(**{"strategy": None, "max_evals": None, "tune_seconds": None,
                                     "splitk_evals": None, **kw})

    assert kc._apply_tuning_overrides(ns()) == {}
    assert gemm.GEMM_SPLITK.budget.max_evals == gemm.SPLITK_SEARCH_EVALS
    assert kc._apply_tuning_overrides(ns(splitk_evals=0)) == {"splitk_evals": "whole space"}
    assert gemm.GEMM_SPLITK.budget.unlimited
    assert kc._apply_tuning_overrides(ns(splitk_evals=12))["splitk_evals"] == 12
    assert gemm.GEMM_SPLITK.budget.max_evals == 12


def test_probe_timer_reads_the_calls_device_work_from_a_trace():
    import probe_timer

    def ev(cat, name, dur):
        return {"ph": "X", "cat": cat, "name": name, "dur": dur}

    trace = {"traceEvents": [
        ev("kernel", "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int> >", 40.0),
        ev("kernel", "spin_kernel(long)", 100.0),
        ev("gpu_memset", "Memset (Device)", 30.0),
        ev("cpu_op", "aten::mm", 9.0),
        # two samples of a two-kernel call, and a plain device-to-device copy
        ev("kernel", "gemm_splitk", 7.0), ev("kernel", "splitk_reduce", 2.0),
        ev("kernel", "gemm_splitk", 7.5), ev("kernel", "splitk_reduce", 2.0),
        ev("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 12.5),
    ]}
    assert probe_timer.work_from_trace(trace) == pytest.approx(7.25 + 2.0 + 12.5)
    assert probe_timer.work_from_trace({"traceEvents": trace["traceEvents"][:4]}) is None


def test_probe_attention_rows_parse_and_refuse_bad_input():
    import probe_attention

    assert probe_attention.parse_rows(probe_attention.DEFAULT_ROWS) == [(16, 32, 32, 1024, 64, True)]
    assert probe_attention.parse_rows("2:32:8192:128:0, 1:8:512:64:1") == [(2, 32, 32, 8192, 128, False),
                                                                         (1, 8, 8, 512, 64, True)]
    # six fields: grouped-query attention
    assert probe_attention.parse_rows("3:28:4:700:128:1") == [(3, 28, 4, 700, 128, True)]
    for bad in ("", "1:2:3", "1:32:1024:96:1", "0:32:1024:64:1", "1:32:1024:64:2", "1:32:6:700:128:1",
                "1:32:0:700:128:1", "1:32:8:x:128:1"):
        with pytest.raises(ValueError):
            probe_attention.parse_rows(bad)


def test_measurement_rows_of_a_tuning_result():
    from types import SimpleNamespace as NS

    from _common import measurement_rows

    def meas(us, cfg, failed, reason=""):
        return NS(median_us=us, config=cfg, status=NS(value="failed" if failed else "ok", failed=failed), reason=reason)

    res = NS(measurements=[meas(10.0, {"TM": 1}, False), meas(None, {"TM": 2}, True, "x" * 300)])
    rows = measurement_rows(res, lambda us: {"gbps": round(100 / us, 1)}, lambda cfg: {"wide": cfg["TM"] > 1})
    assert rows[0] == {"config": {"TM": 1}, "wide": False, "status": "ok", "median_us": 10.0, "gbps": 10.0, "reason": ""}
    assert rows[1]["median_us"] is None and rows[1]["gbps"] is None and rows[1]["wide"] is True
    assert rows[1]["reason"] == "x" * 200


def test_sustained_timing_summary_and_arguments():
    import sustained_timing as st

    times = {"single": {"tiletune": [10.0, 12.0, 11.0], "torch": [11.0, 11.0, 13.0]},
             "back_to_back": {"tiletune": [20.0], "torch": [10.0]},
             "alternating": {"tiletune": [], "torch": [5.0]}}
    s = st.summarize(times)
    assert s["single"] == {"tiletune_us": 11.0, "torch_us": 11.0, "ratio": 1.0}
    assert s["back_to_back"]["ratio"] == 0.5
    assert "ratio" not in s["alternating"] and s["alternating"]["torch_us"] == 5.0
    with pytest.raises(SystemExit):
        st.main(["--only", "nope"])
    with pytest.raises(SystemExit):
        st.main(["--calls", "0"])
    with pytest.raises(ValueError):
        st.build("nope")


def test_ranked_ok_and_do_bench_rounds(monkeypatch):
    from types import SimpleNamespace as NS

    import _common

    rows = [{"median_us": 5.0, "status": "ok"}, {"median_us": None, "status": "failed"},
            {"median_us": 2.0, "status": "failed"}, {"median_us": 3.0, "status": "ok"}]
    assert [r["median_us"] for r in _common.ranked_ok(rows)] == [3.0, 5.0]
    calls = []
    fake = NS(do_bench=lambda fn, warmup, rep: calls.append((fn(), warmup, rep)) or {"a": 0.002, "b": 0.004}[fn()])
    monkeypatch.setitem(sys.modules, "triton", NS(testing=fake))
    monkeypatch.setitem(sys.modules, "triton.testing", fake)
    assert _common.do_bench_rounds({"a": lambda: "a", "b": lambda: "b"}, rounds=3, warmup=7, rep=9) == \
        {"a": 2.0, "b": 4.0}
    assert calls == [("a", 7, 9), ("b", 7, 9)] * 3  # interleaved rounds


def test_failure_fields_bound_and_report(capsys):
    import _common

    try:
        raise RuntimeError("first line\n" + "x" * 5000)
    except RuntimeError as exc:
        fields = _common.failure_fields(exc)
        quiet = _common.failure_fields(exc, report=False)
    assert set(fields) == {"error", "traceback"} and fields == quiet
    assert fields["error"].startswith("RuntimeError: first line") and len(fields["error"]) == 2000
    assert len(fields["traceback"]) == 3000 and fields["traceback"].endswith("x\n")  # the tail of a long one
    assert capsys.readouterr().out == "    ERROR RuntimeError: first line\n"
    try:
        raise ValueError("short")
    except ValueError as exc:
        tb = _common.failure_fields(exc, report=False)["traceback"]
    assert "raise ValueError" in tb and tb.endswith("ValueError: short\n")


# benchmarks/probe_power.py (issue 14 diagnostics): rows, block lengths, rankings
def test_probe_power_rows_blocks_and_ranks():
    import probe_power

    assert probe_power.parse_rows("2:32:32:8192:128:0, 1:32:8:16384:128:1") == [
        (2, 32, 32, 8192, 128, False), (1, 32, 8, 16384, 128, True)]
    for bad in ("2:32:32:8192:128", "2:32:5:8192:128:0", "2:32:32:8192:96:0", "2:32:32:8192:128:2", ""):
        with pytest.raises(ValueError):
            probe_power.parse_rows(bad)
    assert probe_power.block_calls(3500.0, 200.0) == 57
    assert probe_power.block_calls(1e6, 200.0) == 3
    assert probe_power.rank({"a": 3.0, "b": 1.0, "c": 2.0}) == ["b", "c", "a"]
    with pytest.raises(SystemExit):
        probe_power.main(["--rounds", "0"])


def test_host_cost_combine_takes_the_latest_row_in_row_order(tmp_path):
    import json

    specs = host_cost.row_specs()
    first, second = specs[0]["name"], specs[1]["name"]

    def doc(date, names, ratio):
        return {"date": date, "settings": {"only": None}, "rows": [
            {"name": n, "ratio": ratio, "tiletune_host_us": ratio, "torch_host_us": 1.0} for n in names]}

    (tmp_path / "a.json").write_text(json.dumps(doc("2026-12-02T01:00:00Z", [second, first], 1.5)))
    (tmp_path / "b.json").write_text(json.dumps(doc("2026-12-02T02:00:00Z", [second], 0.5)))
    path = host_cost.combine([str(tmp_path / "b.json"), str(tmp_path / "a.json")], str(tmp_path / "out"))
    out = json.loads(path.read_text())
    assert [r["name"] for r in out["rows"]] == [first, second]
    assert [r["ratio"] for r in out["rows"]] == [1.5, 0.5]
    assert out["rows_over_1"] == 1 and len(out["combined_from"]) == 2


def test_run_rows_keeps_going_after_a_failing_row(capsys):
    from _common import run_rows

    def probe(row):
        if row == (2,):
            raise RuntimeError("boom")
        return {"v": row[0]}

    results, wall = run_rows([(1,), (2,), (3,)], probe, lambda r: [f"v={r['v']}"])
    assert [r.get("v") for r in results] == [1, None, 3]
    assert results[1]["row"] == [2] and "RuntimeError: boom" in results[1]["error"]
    out = capsys.readouterr().out
    assert "v=1" in out and "v=3" in out and "ERROR RuntimeError: boom" in out and wall >= 0


def test_run_rows_hands_over_the_rows_done_before_each_next_row():
    """A probe cut short by its time limit keeps the rows it finished: run_probe writes them after each row."""
    from _common import run_rows

    seen = []
    run_rows([(1,), (2,), (3,)], lambda row: {"v": row[0]}, lambda r: [],
             after_row=lambda done, wall: seen.append([r["v"] for r in done]))
    assert seen == [[1], [1, 2]]  # the last row's results are the caller's to write


def test_probe_power_refuses_unknown_kernels_and_causal_lazy_rows():
    import probe_power

    with pytest.raises(SystemExit):
        probe_power.main(["--kernels", "library,nope"])
    with pytest.raises(SystemExit):
        probe_power.main(["--hot-top", "-1"])
    assert probe_power.KERNELS == ("library", "lazy")


def _write_csv(path: Path, rows: list[list[str]], noise: str = "") -> str:
    import csv
    import io

    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    path.write_text(noise + buf.getvalue())
    return str(path)


def test_ncu_rows_attention_rows_parse_and_refuse_bad_input():
    import ncu_rows

    assert ncu_rows.parse_attention("4x32x8x4096x128c") == {
        "op": "attention", "B": 4, "H": 32, "Hkv": 8, "S": 4096, "D": 128, "causal": True, "dtype": "bfloat16"}
    assert ncu_rows.parse_attention("16x32x32x1024x64")["causal"] is False
    for bad in ("4x32x8x4096", "4x32x5x4096x128", "4x32x8x0x128c", "axbxcxdxe"):
        with pytest.raises(ValueError, match="attention row"):
            ncu_rows.parse_attention(bad)


def test_ncu_rows_summary_reads_ncus_csv_pages(tmp_path):
    """``ncu_rows.py --summarize``: ncu's details page (one row per metric, thousands separators, rule
    messages, NVTX range column, ncu's own log lines mixed in) and raw page (a units row first) become
    one dict per kernel launch, in ID order, with the leading warp stalls sorted."""
    import ncu_rows

    nvtx = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
    head = ["ID", "Process ID", "Process Name", "Host Name", nvtx, "Kernel Name", "Section Name", "Metric Name",
            "Metric Unit", "Metric Value", "Rule Name", "Rule Type", "Rule Description"]
    k0 = ["0", "1", "py", "h", '1 "<default domain>:softmax 8x8 tiletune:none"', "softmax_kernel_fn"]
    k1 = ["1", "1", "py", "h", '1 "<default domain>:softmax 8x8 torch.compile:none"', "triton_per_fused_softmax"]
    details = _write_csv(tmp_path / "d.csv", [
        head,
        k0 + ["GPU Speed Of Light Throughput", "Duration", "us", "65.89", "", "", ""],
        k0 + ["Launch Statistics", "Registers Per Thread", "register/thread", "32", "", "", ""],
        k0 + ["Occupancy", "Achieved Occupancy", "%", "82.44", "AchievedOccupancy", "OPT", "The difference between"],
        k0 + ["Occupancy", "Some Metric We Do Not Keep", "%", "1", "", "", ""],
        k1 + ["GPU Speed Of Light Throughput", "Duration", "us", "1,062.21", "", "", ""],
    ], noise="==PROF== Connected to process 1\n")
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    raw = _write_csv(tmp_path / "r.csv", [
        ["ID", "Kernel Name", "dram__bytes_read.sum", stall.format("long_scoreboard"), stall.format("barrier"),
         stall.format("wait")],
        ["", "", "Mbyte", "", "", ""],
        ["1", "triton_per_fused_softmax", "134.2", "4.19", "0.1", "1.23"],
        ["0", "softmax_kernel_fn", "134.25", "7.04", "1.52", "1.38"],
    ])
    k = ncu_rows.summarize(details, raw)
    assert [x["id"] for x in k] == ["0", "1"]
    assert k[0]["kernel"] == "softmax_kernel_fn" and "softmax 8x8 tiletune" in k[0]["nvtx"]
    assert (k[0]["duration"], k[0]["duration_unit"], k[0]["registers"], k[0]["achieved_occupancy_pct"]) == (
        65.89, "us", 32.0, 82.44)
    assert k[0]["rules"] == {"AchievedOccupancy": "The difference between"}
    assert k[1]["duration"] == 1062.21 and "torch.compile" in k[1]["nvtx"]
    assert k[0]["dram_read"] == 134.25 and k[1]["dram_read"] == 134.2
    assert list(k[0]["top_stalls"]) == ["long_scoreboard", "barrier", "wait"]
    assert list(k[1]["top_stalls"]) == ["long_scoreboard", "wait", "barrier"]


def test_gemm_call_gap_problems_parse_and_refuse_bad_input():
    sys.path.insert(0, str(BENCH.parent / "tools"))
    import gemm_call_gap

    assert gemm_call_gap.parse_problems("4096x4096x4096,16x1024x1024x1024") == [(1, 4096, 4096, 4096),
                                                                                 (16, 1024, 1024, 1024)]
    assert gemm_call_gap.parse_problems(None) == gemm_call_gap.PROBLEMS
    for bad in ("4096x4096", "0x8x8x8", "1x2x3x4x5"):
        with pytest.raises(SystemExit):
            gemm_call_gap.parse_problems(bad)


def test_route_of_record_reads_the_rows_fastest_torch_route(tmp_path, monkeypatch):
    """The probes compare against the committed sweep's fastest route of the same row; a row the sweep
    lacks (or a missing file) falls back to ``torch.compile``."""
    import kernels_memory

    (tmp_path / "kernels_memory.json").write_text(json.dumps({"rows": [
        {"op": "layer_norm", "shape": [65536, 1024], "torch_best_route": "torch.compile(max-autotune-no-cudagraphs)"},
        {"op": "softmax", "shape": [65536, 1024], "torch_best_route": None}]}))
    monkeypatch.setattr(kernels_memory, "DEFAULT_OUT", tmp_path)
    assert kernels_memory.route_of_record("layer_norm", (65536, 1024)) == "torch.compile(max-autotune-no-cudagraphs)"
    assert kernels_memory.route_of_record("layer_norm", [65536, 1024]) == "torch.compile(max-autotune-no-cudagraphs)"
    assert kernels_memory.route_of_record("layer_norm", (4096, 1024)) == "torch.compile"
    assert kernels_memory.route_of_record("softmax", (65536, 1024)) == "torch.compile"
    monkeypatch.setattr(kernels_memory, "DEFAULT_OUT", tmp_path / "absent")
    assert kernels_memory.route_of_record("layer_norm", (65536, 1024)) == "torch.compile"


def test_first_call_child_and_shape_follow_the_weight_layout():
    import first_call

    assert first_call._shape("matmul", 16) == "16x4096 4096x4096"
    assert first_call._shape("matmul", 16, linear=True) == "16x4096 4096x4096.t()"
    code = first_call.CHILD % {"op": "matmul", "m": 16, "profile": False, "linear": True}
    assert "llm_calls(['matmul'], [16], linear_weights=True)" in code
    compile(code, "child", "exec")  # the child program is valid Python


def test_probe_gemm_space_rows_parse_refuse_bad_input_and_count_waves():
    import probe_gemm_space as p

    assert p.parse_rows(p.DEFAULT_ROWS) == [(2076, 4096, 14336), (3000, 3584, 3584)]
    assert p.parse_rows(" 300:4096:14336 ,") == [(300, 4096, 14336)]
    for bad in ("", "1:2", "256:4096:4096", "3000:4095:4096", "3000:x:4096", "3000:4096:4"):
        with pytest.raises(ValueError):
            p.parse_rows(bad)
    # 2076 x 4096 in 128 x 256 tiles: 17 x 16 = 272 tiles over 132 SMs, just past two waves
    assert p.waves(2076, 4096, 128, 256, 132, 1) == pytest.approx(272 / 132)
    assert p.waves(2076, 4096, 128, 128, 132, 2) == pytest.approx(544 / 264)


def test_gemm_tail_splits_only_the_short_last_wave():
    from types import SimpleNamespace as NS

    pytest.importorskip("cuda.tile")
    import _gemm_tail as g

    # 2076 x 4096 in 128 x 256 tiles on 132 SMs: 272 tiles, 264 whole, 8 tail tiles split 16 ways (128 units)
    cfg = NS(TM=128, TN=256, TK=64, occupancy=1, TAIL_MAX=16)
    assert g.tail_plan_numbers(cfg, 2076, 4096, 14336, 132) == (132, 264, 16, 8)
    # the cap, and one round: 8 tail tiles x 8 splits
    assert g.tail_plan_numbers(NS(**{**vars(cfg), "TAIL_MAX": 8}), 2076, 4096, 14336, 132) == (132, 264, 8, 8)
    # a tail of 100 tiles gets one split per free block at most (132 // 100 = 1): no split, every tile whole
    assert g.tail_plan_numbers(cfg, 128 * 29, 256 * 8, 4096, 132) == (132, 232, 1, 0)
    # no tail (264 tiles = 2 rounds), and fewer tiles than blocks: every tile whole
    assert g.tail_plan_numbers(cfg, 128 * 33, 256 * 8, 4096, 132) == (132, 264, 1, 0)
    assert g.tail_plan_numbers(cfg, 128, 256 * 4, 4096, 132) == (4, 4, 1, 0)
    # at least two K tiles per unit: K = 256 has 4 tiles of 64, so at most 2 splits
    assert g.tail_plan_numbers(cfg, 2076, 4096, 256, 132) == (132, 264, 2, 8)
    # TAIL_MAX 1: the plain persistent GEMM
    assert g.tail_plan_numbers(NS(**{**vars(cfg), "TAIL_MAX": 1}), 2076, 4096, 14336, 132) == (132, 272, 1, 0)
    from tiletune.kernels.gemm import GEMM_SPACE

    assert len(g.tail_space().candidates("sm_90")) == len(g.TAIL_MAX_VALUES) * len(GEMM_SPACE.candidates("sm_90"))


def test_the_gpu_session_script_names_only_flags_and_tests_that_exist():
    """benchmarks/run_session_h200.sh is run on the GPU host, where a typo costs a device call: every
    ``python <script>.py --flag`` it runs names a flag that script (or benchmarks/_common.py) defines, and
    every test file and ``file::test`` it names exists."""
    import re

    root = Path(__file__).resolve().parent.parent
    text = re.sub(r"\\\n\s*", " ", (root / "benchmarks" / "run_session_h200.sh").read_text())
    common = (root / "benchmarks" / "_common.py").read_text()
    checked, bad = 0, []
    for m in re.finditer(r"python ([\w./-]+\.py)((?:\s+[^\s;|>&)]+)*)", text):
        script = root / "benchmarks" / m.group(1)
        if not script.exists():
            script = root / m.group(1)
        if not script.exists():
            bad.append(f"no script {m.group(1)}")
            continue
        src = script.read_text() + common
        for flag in set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", m.group(2))):
            checked += 1
            if f'"{flag}"' not in src and f"'{flag}'" not in src:
                bad.append(f"{m.group(1)} {flag}")
    for path, name in re.findall(r"(tests/test_\w+\.py)(?:::(\w+))?", text):
        checked += 1
        if not (root / path).exists():
            bad.append(f"no file {path}")
        elif name and not re.search(rf"^def {name}\(", (root / path).read_text(), flags=re.M):
            bad.append(f"no test {path}::{name}")
    assert checked > 100 and not bad, bad


def test_pytest_summary_reads_the_counts_and_the_failures_of_a_verbose_and_a_quiet_run(tmp_path):
    import gzip

    import pytest_summary

    verbose = ("tests/test_a.py::test_x PASSED [ 50%]\n"
               "tests/test_a.py::test_y[k-1] FAILED [100%]\n"
               "FAILED tests/test_a.py::test_y[k-1] - AssertionError: no tuning session ran\n"
               "=========== 1 failed, 1 passed, 3 deselected in 2.50s (0:00:02) ===========\n")
    quiet = "..s                                                  [100%]\n2 passed, 1 skipped, 4 warnings in 0.31s\n"
    (tmp_path / "v.txt.gz").write_bytes(gzip.compress(verbose.encode()))
    (tmp_path / "q.txt").write_text(quiet)
    out = tmp_path / "s.json"
    pytest_summary.main([f"v={tmp_path / 'v.txt.gz'}", f"q={tmp_path / 'q.txt'}", "--out", str(out), "--gpu", "G"])
    runs = json.loads(out.read_text())["runs"]
    assert {k: runs["v"][k] for k in ("passed", "failed", "deselected", "tests", "seconds")} == {
        "passed": 1, "failed": 1, "deselected": 3, "tests": 2, "seconds": 2.5}
    assert runs["v"]["failed_tests"] == ["tests/test_a.py::test_y[k-1]"]
    assert (runs["q"]["passed"], runs["q"]["skipped"], runs["q"]["failed"], runs["q"]["failed_tests"]) == (2, 1, 0, [])
    with pytest.raises(ValueError, match="no pytest summary"):
        pytest_summary.summarize("collected 0 items\n")
