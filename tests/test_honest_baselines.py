"""CPU tests of the honest-baseline machinery of issue 14 (``benchmarks/_routes.py``) as the memory-bound
and attention benchmarks use it: route tables, best-route selection, the tie / verdict rule, a route
that raises or runs past its time limit, argument parsing. Fake timers and CPU tensors; no GPU."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import _routes  # noqa: E402
import kernels_compute as kc  # noqa: E402
import kernels_memory as km  # noqa: E402


class FakeTimer:
    """Each sample of a route is the number the callable returns."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def time(self, fn, n):
        return [float(fn())] * n


def _raise(msg="backend not supported"):
    def f():
        raise RuntimeError(msg)

    return f


# ---------------------------------------------------------------- _routes


def test_best_route_picks_the_fastest_and_skips_untimed():
    assert _routes.best_route({"eager": 12.0, "torch.compile": 9.5, "max": 9.7}) == "torch.compile"
    assert _routes.best_route({"a": 5.0, "b": 5.0}) == "a"  # the first listed on a tie
    assert _routes.best_route({"a": None, "b": 0.0, "c": 3.0}) == "c"
    assert _routes.best_route({}) is None


def test_time_routes_records_errors_and_falls_back_only_when_all_fail(monkeypatch):
    row: dict = {}
    best = _routes.time_routes(row, {"SDPA default": lambda: 10.0, "SDPA flash": lambda: 8.0,
                                     "SDPA cudnn": _raise()}, FakeTimer(), warmup=1, n=5,
                               fallback={"SDPA math": lambda: 1.0})
    assert best == "SDPA flash" == row["torch_best_route"]
    assert row["torch_routes"] == {"SDPA default": 10.0, "SDPA flash": 8.0}  # math not tried
    assert "backend not supported" in row["torch_route_errors"]["SDPA cudnn"]
    row = {}
    best = _routes.time_routes(row, {"SDPA flash": _raise()}, FakeTimer(), 1, 5, fallback={"SDPA math": lambda: 40.0})
    assert best == "SDPA math" and row["torch_routes"] == {"SDPA math": 40.0}
    row = {}
    assert _routes.time_routes(row, {"x": _raise()}, FakeTimer(), 1, 5) is None
    assert row["torch_best_route"] is None and row["torch_routes"] == {}


def test_first_calls_enforces_the_route_time_limit():
    def slow():
        time.sleep(2.0)  # a compile that never ends, cut by SIGALRM
        return 1.0

    row: dict = {}
    t0 = time.perf_counter()
    ok = _routes.first_calls(row, {"eager": lambda: 1.0, "torch.compile": slow, "bad": _raise("boom")}, limit_s=0.2)
    assert time.perf_counter() - t0 < 1.5
    assert list(ok) == ["eager"]
    assert "RouteTimeout" in row["torch_route_errors"]["torch.compile"]
    assert "boom" in row["torch_route_errors"]["bad"]
    assert "eager" in row["torch_route_first_call_s"]


def test_verdict_tie_rule():
    v = _routes.verdict
    assert v(None) is None
    assert v(1.0) == "win" and v(1.3, 100, 200, 300) == "win"
    assert v(0.99) == "loss"  # no bandwidths: no tie
    # both at >= 97% of copy: tie, though slower
    assert v(0.985, tiletune_gbps=3900, torch_best_gbps=3960, copy_gbps=4000) == "tie"
    # torch at copy speed, tiletune below 97%: loss
    assert v(0.95, tiletune_gbps=3800, torch_best_gbps=4000, copy_gbps=4000) == "loss"
    # tiletune at 97% but torch's best below 97% of copy: the tie rule does not apply
    assert v(0.99, tiletune_gbps=3880, torch_best_gbps=3870, copy_gbps=4000) == "loss"


def test_summarize_timer_checks():
    s = _routes.summarize_timer_checks([{"disagreement": 0.01, "within_tolerance": True}, {"error": "no triton"}])
    assert s == {"timer_check_rows": 1, "timer_check_max_disagreement": 0.01, "timer_check_ok": True}
    assert _routes.summarize_timer_checks([])["timer_check_ok"] is False


# ---------------------------------------------------------------- memory-bound benchmark


def test_memory_fill_row_fields_and_verdict():
    nbytes = 4_000_000  # 4 MB: 1 us = 4000 GB/s
    med = {"tiletune": 1.02, "copy": 1.0, "eager": 1.5, "torch.compile": 1.01,
           "torch.compile(max-autotune-no-cudagraphs)": 1.03}
    row = km.fill_row({}, med, ["eager", "torch.compile", "torch.compile(max-autotune-no-cudagraphs)"], nbytes)
    assert row["torch_best_route"] == "torch.compile" and row["torch_best_us"] == 1.01
    assert row["torch_routes"] == {"eager": 1.5, "torch.compile": 1.01, "torch.compile(max-autotune-no-cudagraphs)": 1.03}
    assert row["ratio"] == pytest.approx(1.01 / 1.02, abs=1e-4)
    assert row["copy_gbps"] == 4000.0 and row["pct_of_copy"] == pytest.approx(98.0, abs=0.1)
    assert row["verdict"] == "tie"
    assert row["eager_us"] == 1.5 and row["speedup_vs_eager"] == pytest.approx(1.5 / 1.02, abs=1e-3)
    slow = km.fill_row({}, {**med, "tiletune": 1.4}, ["eager", "torch.compile"], nbytes)
    assert slow["verdict"] == "loss"
    fast = km.fill_row({}, {**med, "tiletune": 0.9}, ["eager"], nbytes)
    assert fast["torch_best_route"] == "eager" and fast["verdict"] == "win"
    none = km.fill_row({}, {"tiletune": 1.0, "copy": 1.0}, ["eager"], nbytes)  # every route failed
    assert none["torch_best_route"] is None and none["ratio"] is None and none["verdict"] is None


def test_memory_interleaved_medians_drop_a_route_that_raises():
    errors: dict = {}
    med = km.timed_medians({"tiletune": lambda: 2.0, "copy": lambda: 1.0, "torch.compile": _raise("guard failure")},
                           FakeTimer(), rounds=3, per_round=2, errors=errors)
    assert med == {"tiletune": 2.0, "copy": 1.0}
    assert "guard failure" in errors["torch.compile"]
    with pytest.raises(RuntimeError):
        km.timed_medians({"x": _raise()}, FakeTimer(), 1, 1)


def test_memory_route_table_on_cpu(monkeypatch):
    """The route table of each op family: eager, both compile modes, the fused rms_norm kernel; every
    route computes what eager does (compile wrappers faked: no compiler on this host)."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    import torch.nn.functional as F

    x, w = torch.randn(8, 64), torch.randn(64)
    prob = {"torch_fn": lambda x, w: F.rms_norm(x, (64,), w, 1e-6), "args": (x, w)}
    routes = km.memory_torch_routes("rms_norm", prob)
    expected = {"eager", "torch.compile", "torch.compile(max-autotune-no-cudagraphs)"}
    if hasattr(torch, "_fused_rms_norm"):
        expected.add("torch._fused_rms_norm")
    assert set(routes) == expected
    ref = routes["eager"]()
    for name, fn in routes.items():
        torch.testing.assert_close(fn(), ref, msg=name)
    assert set(km.memory_torch_routes("rms_norm", prob, compile_modes=False)) == expected - set(km.COMPILE_ROUTES)
    sm = {"torch_fn": lambda x: torch.softmax(x, -1), "args": (x,)}
    assert set(km.memory_torch_routes("softmax", sm)) == {"eager", *km.COMPILE_ROUTES}
    logits, target = torch.randn(4, 10), torch.randint(0, 10, (4,))
    grad = {"torch_fn": F.cross_entropy, "args": (logits, target), "grad": True}
    loss, g = km.memory_torch_routes("cross_entropy_grad", grad)["eager"]()
    assert g.shape == logits.shape and loss.ndim == 0


def test_memory_compile_modes_are_passed(monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    km.memory_torch_routes("softmax", {"torch_fn": lambda x: x, "args": (torch.ones(2),)})
    assert {"dynamic": False} in seen and {"dynamic": False, "mode": "max-autotune-no-cudagraphs"} in seen


def test_memory_args_and_quick_rows():
    a = km.parse_args(["--quick"])
    assert a.deadline == 150.0 and a.route_limit_s == 45.0 and a.timer_check == 3
    rows = km.problems(a)
    assert 3 <= len(rows) <= 6 and all(op in km.SHAPES and shape in km.SHAPES[op] for op, shape, _ in rows)
    assert ("rms_norm", (4096, 8192), "bf16") in rows  # the 61%-of-copy row of issue 14
    assert km.problems(km.parse_args(["--quick", "--only", "softmax"])) == [("softmax", (65536, 1024), "bf16")]
    full = km.parse_args(["--timer-check", "0", "--route-limit-s", "5"])
    assert full.deadline is None and full.route_limit_s == 5.0 and full.timer_check == 0
    assert len(km.problems(full)) == sum(len(v) for v in km.SHAPES.values()) + len(km.FP32_TOO)
    with pytest.raises(SystemExit):
        km.problems(km.parse_args(["--only", "nope"]))
    with pytest.raises(SystemExit):
        km.problems(km.parse_args(["--dtypes", "int3"]))
    with pytest.raises(SystemExit):
        km.parse_args(["--timer-check", "-1"])


def test_memory_honest_summary_and_table():
    def r(op, ratio, verdict, mib=300.0, pct=95.0):
        return {"op": op, "shape": [4, 4], "dtype": "bfloat16", "ratio": ratio, "verdict": verdict,
                "working_set_mib": mib, "pct_of_copy": pct, "torch_best_route": "torch.compile",
                "tiletune_gbps": 1.0, "eager_gbps": 1.0, "speedup_vs_eager": 1.0, "copy_gbps": 4000.0,
                "timer_check": {"disagreement": 0.02, "within_tolerance": True}}

    rows = [r("rms_norm", 1.1, "win"), r("softmax", 0.98, "tie", pct=97.5), r("swiglu", 0.9, "loss", pct=85.0),
            {"op": "geglu", "shape": [2, 2], "dtype": "bfloat16", "error": "boom"}]
    h = km.summarize_honest(rows)
    assert (h["win"], h["tie"], h["loss"], h["rows_unrated"]) == (1, 1, 1, 1)
    assert h["losses"] == ["swiglu 4x4 bfloat16: 0.900x vs torch.compile"]
    assert h["met_every_row"] is False and h["min_pct_of_copy_256mib"] == 85.0 and h["met_pct_of_copy"] is False
    assert h["best_route_counts"] == {"torch.compile": 3} and h["timer_check_ok"] is True
    table = km.readme_table(rows, km.summarize(rows), {"gpu": "X"})
    assert "| torch.compile | 0.90x | loss |" in table and "| tie |" in table
    header = table.splitlines()[2]
    assert all(line.count("|") == header.count("|") for line in table.splitlines()[2:8] if line.startswith("| "))


# ---------------------------------------------------------------- attention rows


def test_attention_problems():
    full = kc.attention_problems(quick=False)
    assert len(full) == 40
    assert {(p["S"], p["Hkv"], p["D"], p["causal"]) for p in full} == {
        (s, h, d, c) for s in (1024, 2048, 4096, 8192, 16384) for h in (32, 8) for d in (64, 128)
        for c in (False, True)}
    assert all(p["B"] * p["S"] == kc.ATTN_TOKENS and p["H"] == 32 for p in full)
    quick = kc.attention_problems(quick=True)
    assert len(quick) == 4 and {p["Hkv"] for p in quick} == {8, 32} and {p["causal"] for p in quick} == {True, False}
    assert any(p["S"] == 4096 and p["Hkv"] == 8 and p["causal"] and p["D"] == 128 for p in quick)


def test_attention_route_table_on_cpu():
    q = torch.randn(1, 4, 16, 8)
    k, v = torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8)
    routes, fallback = kc.attention_torch_routes(q, k, v, causal=True)
    assert set(routes) == {f"SDPA {b}{t}" for b in ("default", "flash", "cudnn", "efficient")
                           for t in (", enable_gqa", ", expanded k/v")}
    assert set(fallback) == {"SDPA math, enable_gqa", "SDPA math, expanded k/v"}
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                           is_causal=True)
    for name in ("SDPA default, enable_gqa", "SDPA default, expanded k/v", *fallback):
        torch.testing.assert_close((routes | fallback)[name](), ref, msg=name)
    with pytest.raises(RuntimeError):  # cuDNN-only on CPU: no kernel; the benchmark records this as an error
        routes["SDPA cudnn, enable_gqa"]()
    row: dict = {}
    best = _routes.time_routes(row, routes, _CpuTimer(), warmup=0, n=1, fallback=fallback)
    assert best in row["torch_routes"] and "SDPA cudnn, enable_gqa" in row["torch_route_errors"]
    assert "SDPA math, enable_gqa" not in row["torch_routes"]  # other routes work: math is not timed
    mha, _ = kc.attention_torch_routes(q, q.clone(), q.clone(), causal=False)
    assert set(mha) == {"SDPA default", "SDPA flash", "SDPA cudnn", "SDPA efficient"}


class _CpuTimer:
    def time(self, fn, n):
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
        return out


def test_compute_measure_with_fakes(monkeypatch):
    """measure() of an attention row with CPU fakes: a failing backend is an error in the row, the best
    route is timed A/B against tiletune, ratio / verdict / torch_routes filled, timer check run."""
    q = torch.randn(1, 4, 16, 8)
    k, v = torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8)
    routes = {"SDPA default": lambda: torch.full((2,), 9.0), "SDPA flash": lambda: torch.full((2,), 7.0),
              "SDPA cudnn": _raise("cudnn: shape not supported")}
    tt = lambda: torch.full((2,), 7.0)  # noqa: E731
    monkeypatch.setattr(kc, "_setup_attention", lambda p: (tt, routes, {}, (q, k, v), None))
    monkeypatch.setattr(kc, "_tuned_ops", lambda mod: [])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **kw: None)
    monkeypatch.setattr(kc, "timer_check", lambda fn, us: {"disagreement": 0.0, "within_tolerance": True})

    class T:
        def time(self, fn, n):
            return [float(fn()[0])] * n

    args = argparse.Namespace(rounds=5, per_round=4, warmup=1, route_limit_s=10.0, b_transposed=False,
                              compile_routes=False, _timer_checks_left=1)
    p = kc.attention_problems(quick=True)[0]
    row = kc.measure(p, args, T())
    assert row["torch_best_route"] == "SDPA flash" and row["torch_best_us"] == 7.0
    assert row["ratio"] == 1.0 and row["verdict"] == "win" and row.get("error") is None
    assert set(row["torch_routes"]) == {"SDPA default", "SDPA flash"}
    assert "cudnn" in row["torch_route_errors"]["SDPA cudnn"]
    assert row["timer_check"]["within_tolerance"] and args._timer_checks_left == 0
    assert row["tiletune_us"] == 7.0  # the A/B median, not overwritten by a solo timing
