"""CPU tests of the pure parts of ``benchmarks/strategies_public.py`` (issue 16): parsing a Kernel Tuner
cache, the restriction check, the metrics and targets, and a tiletune run on a tiny synthetic space."""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import strategies_public as sp  # noqa: E402


def _tiny_cache(tmp_path: Path) -> Path:
    """A 3x3 space: x in {1, 2, 4}, y in {1, 2, 3}; x*y > 8 is invalid; (4, 2) fails to compile."""
    cache = {}
    for x in (1, 2, 4):
        for y in (1, 2, 3):
            key = f"{x},{y}"
            if x * y > 8:
                t = "InvalidConfig"
            elif (x, y) == (4, 2):
                t = "CompilationFailedConfig"
            else:
                t = 1.0 + abs(x - 2) + abs(y - 2) * 0.5
            cache[key] = {"x": x, "y": y, "time": t, "times": [t] if not isinstance(t, str) else []}
    doc = {"device_name": "Fake GPU", "kernel_name": "k", "problem_size": [8], "tune_params_keys": ["x", "y"],
           "tune_params": {"x": [1, 2, 4], "y": [1, 2, 3]}, "objective": "time", "cache": cache}
    d = tmp_path / "cachefiles" / "tiny_kernel"
    d.mkdir(parents=True)
    p = d / "FAKE.json.gz"
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    k = tmp_path / "kernels"
    k.mkdir()
    (k / "tiny_kernel.json").write_text(json.dumps(
        {"ConfigurationSpace": {"Conditions": [{"Expression": "x*y <= 8"}]}}))
    return p


def test_parse_kt_cache(tmp_path):
    space = sp.load_hub_space(_tiny_cache(tmp_path))
    assert space.name == "tiny_kernel/FAKE"
    assert space.n_configs == 8  # (4, 3) is InvalidConfig: not in the space
    assert space.n_valid == 7  # (4, 2) failed: in the space, no time
    truth = dict(zip(space.configs, space.times))
    assert truth[(4, 2)] is None
    assert truth[(2, 2)] == pytest.approx(1.0)
    assert space.optimum == pytest.approx(1.0)
    assert space.restrictions == ["x*y <= 8"]  # the hub's expressions give exactly the cache's configs
    assert space.within(0.5) == 3 and space.random_expected(0.5) == pytest.approx(9 / 4)


def test_restrictions_that_do_not_match_are_dropped(tmp_path):
    space = sp.load_hub_space(_tiny_cache(tmp_path))
    assert sp.restrictions_match(space, ["x*y <= 8"])
    assert not sp.restrictions_match(space, ["x*y <= 12"])  # would let KT propose (4, 3)
    assert not sp.restrictions_match(space, ["x <= 2"])  # would drop configs of the cache


def test_key_parsing_without_param_fields():
    doc = {"tune_params_keys": ["a", "b"], "tune_params": {"a": [1, 2], "b": ["u", "v"]},
           "cache": {"1,u": {"time": 2.0}, "2,v": {"time": 1.0}, "2,u": {"time": "RuntimeFailedConfig"}}}
    space = sp.parse_kt_cache(doc, "x")
    assert space.configs == [(1, "u"), (2, "v"), (2, "u")]
    assert space.times == [2.0, 1.0, None]


def test_write_kt_cache_round_trip(tmp_path):
    space = sp.load_hub_space(_tiny_cache(tmp_path))
    path = sp.write_kt_cache(space, tmp_path / "kt")
    back = sp.parse_kt_cache(json.loads(Path(path).read_text()), "again")
    assert sorted(zip(back.configs, back.times), key=str) == sorted(zip(space.configs, space.times), key=str)


def test_metrics():
    opt = 1.0
    assert sp.evals_to([3.0, None, 1.04, 1.0], opt, 0.05) == 3
    assert sp.evals_to([3.0, None, 1.04, 1.0], opt, 0.01) == 4
    assert sp.evals_to([3.0, None], opt, 0.05) is None
    assert sp.median_evals([1, 2, 3]) == 2
    assert sp.median_evals([1, 2, 3, 4]) == 2.5
    assert sp.median_evals([1, None, None]) is None  # more than half missed: infinite
    assert sp.median_evals([1, 2, None]) == 2
    assert sp.reach_rate([1, None, 3, None]) == 0.5


def _row(space, tuner, strategy, med, reach, kind="public", exp5=50.0):
    return {"space": space, "kind": kind, "tuner": tuner, "strategy": strategy, "seeds": 10,
            "median_evals_5pct": med, "reach_5pct": reach, "random_expected_5pct": exp5}


def test_kt_best_and_targets():
    rows = [
        _row("a", "kernel_tuner", "ga", 40.0, 0.9), _row("a", "kernel_tuner", "sa", 40.0, 1.0),
        _row("a", "kernel_tuner", "rs", None, 0.3), _row("a", "tiletune", "auto", 20.0, 1.0, exp5=300.0),
        _row("b", "kernel_tuner", "ga", 8.0, 1.0), _row("b", "tiletune", "auto", 9.0, 1.0),
        _row("c", "kernel_tuner", "ga", 100.0, 0.9), _row("c", "tiletune", "auto", None, 0.4, exp5=1000.0),
    ]
    sp.attach_kt_best(rows)
    a = [r for r in rows if r["space"] == "a" and r["tuner"] == "tiletune"][0]
    assert a["kt_best_strategy"] == "sa" and a["kt_median_evals_5pct"] == 40.0  # ties broken by reach
    t = sp.targets(rows, "auto", budget=500, expected_public=4)
    assert t["beats_kt_best"] == 1  # a only: b needs more evals, c misses
    assert not t["beats_kt_best_met"]
    # geomean over spaces where KT best needs > 10: a (20/40) and c (501/100)
    assert t["geomean_spaces"] == 2
    assert t["geomean_ratio_vs_kt_best"] == pytest.approx(math.sqrt(0.5 * 5.01), rel=1e-3)
    assert [v["space"] for v in t["vs_random"]] == ["a", "c"]
    assert t["vs_random"][0]["meets"] and not t["vs_random"][1]["meets"]


def test_tiletune_run_on_tiny_space(tmp_path):
    space = sp.load_hub_space(_tiny_cache(tmp_path))
    runs = [sp.run_tiletune(space, "random", seed, budget=20) for seed in range(5)]
    for times in runs:
        assert 1 <= len(times) <= space.n_configs
        assert sp.evals_to(times, space.optimum, 0.01) == len(times)  # stops at the optimum
    row = sp.summarize(space, "tiletune", "random", runs)
    assert row["reach_5pct"] == 1.0 and row["n_valid"] == 7 and row["seeds"] == 5
    budgeted = sp.run_tiletune(space, "random", 3, budget=2)
    assert len(budgeted) <= 2
