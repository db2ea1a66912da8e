"""Issue 17 items 2-4 on CPU: A/B (tt.ab), shrink (tiletune.lab.shrink) and pins (tt.pin, TILETUNE_PINS),
with the fake and replay backends."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune.lab import shrink as sh
from tiletune.lab.ab import ABReport, verdict
from tiletune.devices.backends import FakeBackend
from tiletune.resolve.pins import PinFile, clear_pins
from tiletune.store import TuningDB

SPACES = Path(__file__).resolve().parent.parent / "benchmarks" / "spaces"
SPACE = tt.Space(K=list(range(8)), baseline=dict(K=0))


def _kernel(x, y, k):
    y.copy_(x * 2 if k != 3 else x)  # K=3 is wrong


def _op(timing=lambda c: 10.0 + (c.K - 5) ** 2, db=False, seed=0):
    be = FakeBackend(timing, noise=0.01, seed=seed)

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=db, backend=be, progress=False)
    def op(cfg, x, y):
        return tt.Launch(_kernel, (1,), (x, y, cfg.K))

    return op, be


@pytest.fixture(autouse=True)
def _no_pins(monkeypatch):
    monkeypatch.delenv("TILETUNE_PINS", raising=False)
    clear_pins()
    yield
    clear_pins()


# ------------------------------------------------------------------------------------------------ A/B


def test_ab_pick_vs_baseline_is_faster_and_interleaved(tmp_path):
    op, be = _op()
    x, y = torch.randn(4), torch.empty(4)
    rep = tt.ab(op, [(x, y), (torch.randn(8), torch.empty(8))])
    assert [r.verdict for r in rep.rows] == ["faster", "faster"]
    r = rep.rows[0]
    assert r.pick == {"K": 5} and r.against == {"K": 0} and r.against_label == "baseline"
    assert r.ratio == pytest.approx(10 / 35, rel=0.02) and r.ci_low <= r.ratio <= r.ci_high < 1
    assert rep.geomean == pytest.approx(10 / 35, rel=0.02)
    assert r.samples == 2 * 10 * 10
    # the caller's output is restored by the A/B session (it holds the winner's one launch from tuning)
    assert torch.equal(y, x * 2)
    doc = json.loads(rep.save(tmp_path / "ab.json").read_text())
    assert doc["verdicts"] == {"faster": 2, "tied": 0, "slower": 0} and len(doc["rows"]) == 2
    pytest.importorskip("matplotlib")
    assert rep.plot(tmp_path / "ab.png").stat().st_size > 1000


def test_ab_same_config_is_tied_and_a_worse_fixed_config_is_slower_for_it():
    op, _ = _op()
    x, y = torch.randn(4), torch.empty(4)
    same = tt.ab(op, [(x, y)], against={"K": 5}).rows[0]
    assert same.same_config and same.verdict == "tied" and abs(same.ratio - 1) < 0.01
    # against a fixed config faster than the pick (the timing model changed after tuning): slower
    op2, be2 = _op()
    op2(x, y)
    be2.source.model = lambda c: 50.0 if c.K == 5 else 20.0
    assert tt.ab(op2, [(x, y)], against={"K": 1}).rows[0].verdict == "slower"


def test_ab_verdict_rules():
    assert verdict(0.9, 0.85, 0.95, 0.01) == "faster"
    assert verdict(0.995, 0.99, 0.999, 0.01) == "tied"  # inside the band
    assert verdict(0.9, 0.8, 1.02, 0.01) == "tied"  # interval contains 1
    assert verdict(1.1, 1.05, 1.2, 0.01) == "slower"


def test_ab_through_a_function_that_launches_the_tuned_op():
    op, _ = _op()

    def double(x):
        y = torch.empty_like(x)
        op(x, y)
        return y

    rep = tt.ab(double, [(torch.randn(16),)])
    assert rep.rows[0].op == op.name and rep.rows[0].verdict == "faster"
    with pytest.raises(tt.TiletuneError, match="launched no tuned op"):
        tt.ab(lambda x: x, [(torch.randn(4),)])


def test_ab_refuses_bad_input():
    op, _ = _op()
    x, y = torch.randn(4), torch.empty(4)
    with pytest.raises(ValueError, match="missing K"):
        tt.ab(op, [(x, y)], against={"Q": 1})
    with pytest.raises(ValueError, match="against='best'"):
        tt.ab(op, [(x, y)], against="best")
    with pytest.raises(ValueError, match="rounds"):
        tt.ab(op, [(x, y)], rounds=2)
    with pytest.raises(ValueError, match="at least one case"):
        tt.ab(op, [])
    with pytest.raises(tt.TiletuneError, match="failed its check"):  # K=3 computes the wrong thing
        tt.ab(op, [(x, y)], against={"K": 3})


# ------------------------------------------------------------------------------------------------ shrink


def _table(covers_ms: list[list[float]]) -> sh.KeyTable:
    configs = [{"C": j} for j in range(len(covers_ms[0]))]
    return sh.KeyTable(arch="sm_90", names=["C"], keys=[f"k{i}" for i in range(len(covers_ms))],
                       configs=configs, times=covers_ms, baseline={"C": 0})


def test_shrink_exact_check_beats_greedy():
    # keys 0..5; config 1 = {0,1,2}, config 2 = {3,4,5}, config 3 = {1,2,3,4} (greedy's first pick);
    # config 0 (baseline) is 10% off everywhere. Greedy needs 3 configs, the exact check finds 2.
    fast, slow = 1.0, 1.1
    cover = {1: {0, 1, 2}, 2: {3, 4, 5}, 3: {1, 2, 3, 4}}
    times = [[slow] + [fast if k in cover[j] else slow for j in (1, 2, 3)] for k in range(6)]
    res = sh.shrink(_table(times), tolerance=0.02)
    assert sorted(c["C"] for c in res.configs) == [1, 2]
    assert res.method.startswith("exact") and res.met and res.worst_loss == 0.0
    assert res.keys == 6 and res.configs_before == 4


def test_shrink_reports_the_worst_loss_when_no_cover_fits():
    n = 5  # every key has its own best config; the others are 5% slower
    times = [[1.0 if j == k else 1.05 for j in range(n)] for k in range(n)]
    res = sh.shrink(_table(times), tolerance=0.02, max_configs=3)
    assert not res.met and len(res.configs) == 3
    assert res.worst_loss == pytest.approx(0.05)
    assert sorted(res.losses.values()).count(0.0) == 3
    ok = sh.shrink(_table(times), tolerance=0.06)  # within 6%: any one config covers every key
    assert ok.met and len(ok.configs) == 1


def test_shrink_ignores_failed_configs_and_prints_a_space_with_exactly_the_chosen_configs():
    inf = math.inf
    times = [[2.0, 1.0, inf, 1.5], [2.0, inf, 1.0, 1.5], [1.0, 3.0, 3.0, 1.01]]
    res = sh.shrink(_table(times), tolerance=0.02)
    assert sorted(c["C"] for c in res.configs) == [0, 1, 2] or sorted(c["C"] for c in res.configs) == [1, 2, 3]
    assert res.worst_loss <= 0.02
    space = sh.build_space({"sm_90": res})
    assert sorted(c.C for c in space.configs("sm_90")) == sorted(c["C"] for c in res.configs)
    assert "tt.Space(" in sh.space_code({"sm_90": res})


def test_shrink_on_the_recordings_with_replay_verification():
    for p in sorted(SPACES.glob("*.json.gz")):
        tables = sh.tables_from_recordings([p])
        (arch, table), = tables.items()
        res = sh.shrink(table)
        assert res.keys == 1 and len(res.configs) == 1 and res.worst_loss <= 0.02 and res.configs_before >= 300
        v = sh.verify_replay(table, res, rounds=5, batch=5)
        assert 0.9 < v["geomean"] < 1.1 + res.tolerance


def test_shrink_from_a_database_over_several_keys(tmp_path):
    db = TuningDB(tmp_path / "t.db")
    # the best K grows with the size: K=2 for 4 elements, K=5 for 8, K=6 for 16 and 32
    best = {4: 2, 8: 5, 16: 6, 32: 6}
    sizes: dict[str, int] = {}

    def timing(c):
        return 10.0 + (c.K - best[sizes["n"]]) ** 2

    op, be = _op(timing=timing, db=db)
    for n in best:
        sizes["n"] = n
        op(torch.randn(n), torch.empty(n))
    tables = sh.tables_from_db(db, op.name)
    res = sh.shrink(tables["sm_90"])
    assert res.keys == 4 and sorted(c["K"] for c in res.configs) == [2, 5, 6]
    assert res.worst_loss <= 0.02
    # replaying the database's own samples: the shrunk space's pick vs each key's best
    assert sh.verify_replay(tables["sm_90"], res, rounds=5, batch=5)["geomean"] == pytest.approx(1.0, abs=0.03)


def test_shrink_cli_on_a_recording(tmp_path):
    from typer.testing import CliRunner

    from tiletune.cli import app

    out = tmp_path / "s.json"
    res = CliRunner().invoke(app, ["shrink", "--recording", str(SPACES / "h200_gemm_bf16_4096.json.gz"),
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "tt.Space(" in res.output and "512 -> 1 config" in res.output
    doc = json.loads(out.read_text())
    assert doc["archs"]["sm_90"]["configs_after"] == 1 and "ab_replay" in doc["archs"]["sm_90"]


# ------------------------------------------------------------------------------------------------ pins


def test_pin_skips_tuning_and_is_verified_once():
    op, be = _op()
    tt.pin(op, {"K": 2})
    x, y = torch.randn(4), torch.empty(4)
    op(x, y)
    assert op.config_for(x, y).K == 2 and op.tuning_count == 0
    assert torch.equal(y, x * 2)
    assert len(be.sessions) == 1  # the one check
    op.cache_clear()
    op(x, y)
    assert len(be.sessions) == 1  # verified once per process and identity


def test_a_failing_pin_is_a_clear_error():
    op, _ = _op()
    x, y = torch.randn(4), torch.empty(4)
    tt.pin(op, {"K": 3})
    with pytest.raises(tt.PinError, match="does not match the reference"):
        op(x, y)
    clear_pins()
    tt.pin(op, {"K": 9})
    with pytest.raises(tt.PinError, match="not among its values"):
        op(x, y)
    clear_pins()
    op.cache_clear()
    op(x, y)  # without pins: tuned
    assert op.config_for(x, y).K == 5 and op.tuning_count == 1


def test_pins_come_before_the_database_and_match_keys(tmp_path, monkeypatch):
    db = TuningDB(tmp_path / "t.db")
    op, _ = _op(db=db)
    x, y = torch.randn(4), torch.empty(4)
    op(x, y)  # K=5 stored
    (w,) = db.winners()
    pins = {"format": "tiletune-pins", "version": 1, "pins": [
        {"op": op.name, "key": json.loads(w.identity.key), "config": {"K": 1}},
        {"op": op.name, "key_regex": ".*\\[16\\].*", "config": {"K": 4}},
        {"op": op.name, "arch": "sm_80", "config": {"K": 7}},
    ]}
    f = tmp_path / "pins.json"
    f.write_text(json.dumps(pins))
    monkeypatch.setenv("TILETUNE_PINS", str(f))
    op.cache_clear()
    assert op.config_for(x, y).K == 1  # the exact-key pin wins over the database record
    assert op.config_for(torch.randn(16), torch.empty(16)).K == 4  # the regex pin
    assert op.config_for(torch.randn(8), torch.empty(8)).K == 5  # no pin for this arch and key: tuned
    tt.pin(op, {"K": 6}, key=w.identity.key)  # tt.pin wins over the file
    assert op.config_for(x, y).K == 6


def test_pins_file_errors_and_export(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from tiletune.cli import app

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "tiletune-pins", "version": 1, "pins": [{"op": "x", "config": {}}]}))
    with pytest.raises(tt.PinError, match=r"pins\[0\].config"):
        PinFile.load(bad)
    op, _ = _op(db=TuningDB(tmp_path / "t.db"))
    for n in (4, 8):
        op(torch.randn(n), torch.empty(n))
    dest = tmp_path / "pins.json"
    res = CliRunner().invoke(app, ["db", "export", str(dest), "--pins", "--path", str(tmp_path / "t.db")])
    assert res.exit_code == 0, res.output
    pf = PinFile.load(dest)
    assert len(pf) == 2 and {p.arch for p in pf.pins} == {"sm_90"} and all(p.key for p in pf.pins)
    # a fresh op (same name) follows the exported pins without tuning
    op2, be2 = _op(timing=lambda c: 10.0 + c.K)  # this timing would pick K=0
    monkeypatch.setenv("TILETUNE_PINS", str(dest))
    assert op2.config_for(torch.randn(8), torch.empty(8)).K == 5 and op2.tuning_count == 0
    monkeypatch.setenv("TILETUNE_PINS", str(tmp_path / "missing.json"))
    op2.cache_clear()
    with pytest.raises(tt.PinError, match="TILETUNE_PINS"):
        op2(torch.randn(8), torch.empty(8))


def _result(arch, configs, names=("A", "B")):
    return sh.ShrinkResult(arch=arch, configs=[dict(c) for c in configs], baseline=dict(configs[0]), losses={},
                           tolerance=0.02, met=True, method="greedy", configs_before=9, keys=1, names=list(names))


def test_build_space_matches_the_printed_code_without_executing_stored_data(tmp_path):
    one = {"sm_90": _result("sm_90", [{"A": 1, "B": 4}, {"A": 2, "B": 8}])}
    two = {**one, "sm_100": _result("sm_100", [{"A": 2, "B": 4}])}
    for results in (one, two):
        built = sh.build_space(results)
        path = tmp_path / f"shrunk_{len(results)}.py"
        path.write_text(sh.space_code(results, "S"))
        ns: dict = {}
        exec(compile(path.read_text(), str(path), "exec"), ns)  # the printed code, as a user would run it
        for arch in results:
            assert [c.as_dict() for c in built.configs(arch)] == [c.as_dict() for c in ns["S"].configs(arch)]
            assert {tuple(sorted(c.as_dict().items())) for c in built.configs(arch)} <= \
                {tuple(sorted(c.items())) for r in results.values() for c in r.configs}
    # a parameter name read from a database is data, never code
    evil = {"sm_90": _result("sm_90", [{"A": 1, "x=__import__('os')": 2}], names=("A", "x=__import__('os')"))}
    with pytest.raises(ValueError, match="identifiers"):
        sh.build_space(evil)
    with pytest.raises(ValueError, match="identifiers"):
        sh.space_code(evil)


def test_shrink_separates_the_spaces_of_one_op_name(tmp_path):
    """A library op tunes its key regimes over different spaces under one name (seen in the H200
    campaign's database: rms_norm had a few-rows space and a many-rows one, with different
    parameters): each space is shrunk on its own, never one table mixing configs of both."""
    from typer.testing import CliRunner

    from tiletune.cli import app

    db = TuningDB(tmp_path / "t.db")
    wide = tt.Space(K=[0, 1, 2, 3, 4, 5, 6, 7], W=[1, 2], baseline=dict(K=0, W=1))
    be = FakeBackend(lambda c: 10.0 + (c.K - 5) ** 2 + getattr(c, "W", 1), noise=0.01, seed=0)

    def make(space):
        @tt.autotune(space, reference=lambda x, y: x * 2, writes=["y"], db=db, backend=be, progress=False,
                     name="test.two_spaces")
        def op(cfg, x, y):
            return tt.Launch(_kernel, (1,), (x, y, cfg.K))

        return op

    small, big = make(SPACE), make(wide)
    for n in (4, 8):
        small(torch.randn(n), torch.empty(n))
    for n in (16, 32, 64):
        big(torch.randn(n), torch.empty(n))
    hashes = sh.space_hashes(db, "test.two_spaces")
    assert sorted(hashes.values()) == [2, 3]
    with pytest.raises(ValueError, match="2 spaces"):
        sh.tables_from_db(db, "test.two_spaces")
    for h, n in hashes.items():
        (table,) = sh.tables_from_db(db, "test.two_spaces", h[:10]).values()
        assert len(table.keys) == n
        assert set(table.names) == ({"K", "W"} if n == 3 else {"K"})
    out = tmp_path / "s.json"
    res = CliRunner().invoke(app, ["shrink", "test.two_spaces", "--path", str(db.where), "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.count("tt.Space(") == 2 and "each is shrunk on its own" in res.output
    assert set(json.loads(out.read_text())["spaces"]) == set(hashes)
    one = CliRunner().invoke(app, ["shrink", "test.two_spaces", "--path", str(db.where), "--space",
                                   next(iter(hashes))[:8]])
    assert one.exit_code == 0 and one.output.count("tt.Space(") == 1, one.output
    bad = CliRunner().invoke(app, ["shrink", "test.two_spaces", "--path", str(db.where), "--space", "zzzz"])
    assert bad.exit_code != 0 and "no space" in bad.output
