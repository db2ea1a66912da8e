"""The miss path as values (tiletune.resolve): the chain asks its sources in order and stores once per
tuned key; nearest-neighbour serving answers an unseen shape of a known family with a tuned neighbour's
config, records it as pending, and tune_pending / `tiletune tune --pending` tune it; on_miss policies."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune import events
from tiletune.devices.backends import FakeBackend, FakeCompilingBackend, SimulatedCandidate
from tiletune.resolve import pending
from tiletune.resolve.chain import Attempt, Chain, default_sources
from tiletune.resolve.nearest import distance, key_features, neighbours
from tiletune.resolve.problem import SOURCES, Choice
from tiletune.store import TuningDB

SPACE = tt.Space(K=list(range(6)), baseline=dict(K=0))


def _kernel(x, y):
    y.copy_(x * 2)


def _plan(cfg, x, y):
    return tt.Launch(_kernel, (1,), (x, y))


def _op(db, *, on_miss="tune", truth=None, failures=None, backend=None, **kw):
    truth = truth or (lambda c: 10.0 + c.K)
    return tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=db,
                       backend=backend or FakeBackend(truth, failures=failures),
                       progress=False, on_miss=on_miss, **kw)(_plan)


class Spy:
    def __init__(self, inner, log):
        self.inner, self.log, self.name = inner, log, inner.name

    def get(self, problem, attempt):
        self.log.append(self.name)
        return self.inner.get(problem, attempt)


# ---------------------------------------------------------------------- the chain


def test_the_chain_visits_its_sources_in_order_and_stores_once_per_tuned_key(tmp_path, monkeypatch):
    db = TuningDB(tmp_path / "t.db")
    stored = []
    real = TuningDB.record_session
    monkeypatch.setattr(TuningDB, "record_session", lambda self, *a, **k: (stored.append(a[0].key), real(self, *a, **k))[1])
    op = _op(db)
    x, y = torch.randn(8), torch.empty(8)
    key = op.key_of(x, y)
    log: list[str] = []
    chain = Chain([Spy(s, log) for s in default_sources()])
    assert chain.names == ("capture", "disabled", "single", "pin", "database", "table", "nearest", "peer", "tuned")
    attempt = Attempt()
    choice = chain.resolve(op.problem((x, y), key), attempt)
    assert log == list(chain.names)  # nothing answered before the tune source
    assert attempt.visited == list(chain.names)
    assert choice.source == "tuned" and choice.config["K"] == 0 and choice.result is not None
    assert len(stored) == 1 and attempt.stored == 1
    # the same key again: the database answers, nothing after it is asked, nothing is stored
    log.clear()
    again = chain.resolve(op.problem((x, y), key))
    assert again.source == "database" and again.config == choice.config
    assert log == ["capture", "disabled", "single", "pin", "database"]
    assert len(stored) == 1


def test_a_tuned_op_stores_each_key_once_and_emits_its_choices(tmp_path, monkeypatch):
    seen = []
    listener = events.subscribe("choice", lambda op, problem, choice: seen.append((op, choice.source)))
    try:
        stored = []
        real = TuningDB.record_session
        monkeypatch.setattr(TuningDB, "record_session",
                            lambda self, *a, **k: (stored.append(a[0].key), real(self, *a, **k))[1])
        op = _op(tmp_path / "t.db", name="chain.op")
        for n in (8, 8, 16, 16, 8):
            op(torch.randn(n), torch.empty(n))
        assert len(stored) == 2 and len(set(stored)) == 2 and op.tuning_count == 2
        assert seen == [("chain.op", "tuned"), ("chain.op", "tuned")]
    finally:
        events.unsubscribe("choice", listener)


def test_a_choice_names_a_known_source():
    cfg = SPACE.candidates("sm_90")[0]
    assert Choice(cfg, "tuned").source == "tuned"
    with pytest.raises(ValueError, match="unknown source"):
        Choice(cfg, "guess")
    assert SOURCES.index("nearest") < SOURCES.index("peer") < SOURCES.index("tuned")


def test_on_miss_is_checked_at_the_decorator_and_by_the_environment(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="on_miss='sometimes'"):
        _op(False, on_miss="sometimes")
    monkeypatch.setenv("TILETUNE_ON_MISS", "often")
    from tiletune import settings

    with pytest.raises(ValueError, match="TILETUNE_ON_MISS"):
        settings.on_miss()


# ---------------------------------------------------------------------- nearest: the distance


def test_key_features_line_up_sizes_and_keep_everything_else_in_the_signature():
    a = json.dumps([{"shape": [300, 4096], "dtype": "bfloat16", "contiguous": True}, True, {"type": "float"}])
    b = json.dumps([{"shape": [512, 4096], "dtype": "bfloat16", "contiguous": True}, True, {"type": "float"}])
    c = json.dumps([{"shape": [512, 4096], "dtype": "float16", "contiguous": True}, True, {"type": "float"}])
    d = json.dumps([{"shape": [512, 4096], "dtype": "bfloat16", "contiguous": True}, False, {"type": "float"}])
    fa, fb, fc, fd = (key_features(k) for k in (a, b, c, d))
    assert fa[0] == fb[0] and fa[1] == (300.0, 4096.0)
    assert fc[0] != fa[0] and fd[0] != fa[0]  # another dtype, another flag: another family
    assert distance(fa[1], fb[1]) == pytest.approx(abs(__import__("math").log2(301 / 513)))
    assert key_features("not json") is None


def test_strided_views_are_their_own_layout():
    contiguous = json.dumps([{"shape": [4, 8], "dtype": "bfloat16", "contiguous": True}])
    row_major = json.dumps([{"shape": [4, 8], "dtype": "bfloat16", "contiguous": False, "strides": [16, 1]}])
    col_major = json.dumps([{"shape": [4, 8], "dtype": "bfloat16", "contiguous": False, "strides": [1, 4]}])
    sigs = {key_features(k)[0] for k in (contiguous, row_major, col_major)}
    assert len(sigs) == 3


def test_neighbours_are_ordered_nearest_first_ties_to_the_larger():
    def key(m):
        return json.dumps([{"shape": [m, 64], "dtype": "bfloat16", "contiguous": True}])

    stored = [(key(64), {"K": 1}, 5.0, "db"), (key(256), {"K": 2}, 9.0, "db"), (key(1024), {"K": 3}, 30.0, "db"),
              (json.dumps([{"shape": [128, 64], "dtype": "float32", "contiguous": True}]), {"K": 4}, 1.0, "db")]
    got = neighbours(key(127), stored)
    assert [n.config["K"] for n in got] == [1, 2, 3]  # float32 is another family
    # log2(1 + 3) = 2 lies one unit from log2(1 + 1) and from log2(1 + 7): a tie goes to the larger
    tie = neighbours(key(3), [(key(1), {"K": 1}, 1.0, "db"), (key(7), {"K": 2}, 1.0, "db")])
    assert tie[0].config["K"] == 2 and tie[0].larger
    assert neighbours(key(64), [(key(64), {"K": 1}, 5.0, "db")]) == []  # the key itself is no neighbour


def test_a_bucketed_key_measures_its_distances_from_the_calls_own_sizes():
    """A GEMM of 1,058 rows keys as the 2,048-row bucket; from the bucket's bound the 2,048-row entry is the
    nearest, from the call's own rows the 1,024-row one (as measured on an H100, 2026-12-07: the 1,024-row
    entry's config ran 76.5 us on 1058x4608x3584, the 2,048-row entry's 86.4 us)."""
    def key(m, n=4096, k=4096):
        return json.dumps([{"bucketed": True}, {"problem": "gemm", "M": m, "N": n, "K": k, "layout": "nt"}],
                          sort_keys=True)

    stored = [(key(1024), {"K": 1}, 50.0, "h200.json"), (key(2048), {"K": 2}, 95.0, "h200.json"),
              (key(4096), {"K": 3}, 180.0, "h200.json")]
    bucket, own = key(2048, 4608, 3584), key(1058, 4608, 3584)
    assert [n.config["K"] for n in neighbours(bucket, stored)] == [2, 1, 3]
    got = neighbours(bucket, stored, own)
    assert [n.config["K"] for n in got] == [1, 2, 3]
    assert got[0].distance == pytest.approx(distance([1058, 4608, 3584], [1024, 4096, 4096]))
    assert not got[0].larger  # 1,024 rows are fewer than the call's 1,058
    # the bucket's own key is a neighbour off its bound (its entry was tuned at 2,048 rows, not at the call's
    # 1,500: a shipped table leaves such a call to the race), never at the bound; sizes of another structure
    # are ignored
    assert [n.config["K"] for n in neighbours(key(2048), stored, key(1500))] == [2, 1, 3]
    assert [n.config["K"] for n in neighbours(key(2048), stored, key(2048))] == [1, 3]
    other = json.dumps([{"bucketed": True}, {"problem": "gemm", "M": 1058}], sort_keys=True)
    assert [n.config["K"] for n in neighbours(bucket, stored, other)] == [2, 1, 3]


def test_bucket_keys_in_their_exact_form_keep_the_structure_and_the_calls_sizes():
    from tiletune.buckets import Buckets
    from tiletune.kernels._keys import ProblemKey, rounded

    b = Buckets({"x": {0: "pow2"}}).resolve(["x", "n"])
    x = torch.empty(1058, 64)
    assert b.key_json((x, 3)) == [{"bucketed": True}, {"shape": [2048, 64], "dtype": "float32", "contiguous": True}, 3]
    assert b.exact_key_json((x, 3)) == [{"bucketed": True}, {"shape": [1058, 64], "dtype": "float32",
                                                              "contiguous": True}, 3]

    def describe(args, exact=False):
        return {"M": rounded(args[0].shape[0], exact=exact), "grid": rounded(args[0].shape[1], (16, 256), exact)}

    pk = ProblemKey("demo", describe, {"M": "pow2", "grid": [16, 256]})
    assert pk.key_json((x,)) == [{"bucketed": True}, {"problem": "demo", "M": 2048, "grid": 256}]
    assert pk.exact_key_json((x,)) == [{"bucketed": True}, {"problem": "demo", "M": 1058, "grid": 64}]


def test_a_problem_of_a_bucketed_op_is_served_by_the_neighbour_nearest_its_own_sizes(tmp_path):
    path = tmp_path / "t.db"
    buckets = tt.Buckets({"x": {0: "pow2"}, "y": {0: "pow2"}})
    tuner = _op(path, name="nn.b", truth=lambda c: 10.0 + abs(c.K - 1), buckets=buckets)  # K=1 at 64 rows
    tuner(torch.randn(64), torch.empty(64))
    tuner2 = _op(path, name="nn.b", truth=lambda c: 10.0 + abs(c.K - 4), buckets=buckets)  # K=4 at 256 rows
    tuner2(torch.randn(256), torch.empty(256))
    seen = []
    listener = events.subscribe("choice", lambda op, problem, choice: seen.append((problem, choice)))
    try:
        server = _op(path, name="nn.b", on_miss="nearest", truth=lambda c: 10.0, buckets=buckets)
        x, y = torch.randn(66), torch.empty(66)  # the 128-row bucket: from 128, 64 and 256 tie (the larger
        # would win); from 66, 64 is nearest
        server(x, y)
    finally:
        events.unsubscribe("choice", listener)
    ((problem, choice),) = seen
    assert '"shape":[128]' in problem.key_json and '"shape":[66]' in problem.sizes_json
    assert choice.source == "nearest" and choice.config["K"] == 1 and '"shape":[64]' in choice.neighbour
    assert torch.equal(y, x * 2)


@pytest.mark.parametrize("where,on_miss", [("shipped", "nearest"), ("shipped", "tune"), ("user", "nearest")])
def test_a_shipped_tables_bucket_entry_races_its_neighbours_off_the_bound(tmp_path, private_tables, where, on_miss):
    """A bucket is bounded above: 1,058 rows key as the 2,048-row bucket, whose shipped entry was tuned at
    2,048 rows; the 1,024-row entry lies nearer the call, yet neither is reliably the faster there. Off the
    bound, an op that races its neighbours (``on_miss="nearest"``) gets the race's answer, the bucket's entry
    among the configs raced; at the bound the table answers. An op that tunes its misses keeps the table's
    bucket entry, and so does a user's table (an export of a database: a bucket's winner may have been tuned
    anywhere in the bucket)."""
    from tiletune.resolve import tables

    shipped = private_tables
    buckets = tt.Buckets({"x": {0: "pow2"}, "y": {0: "pow2"}})
    seen: list = []
    listener = events.subscribe("choice", lambda op, problem, choice: seen.append(choice))
    try:
        source = tmp_path / "source.db"
        _op(source, name="tb.b", truth=lambda c: 10.0 + abs(c.K - 1), buckets=buckets)(
            torch.randn(1024), torch.empty(1024))  # K=1 at 1,024 rows
        _op(source, name="tb.b", truth=lambda c: 10.0 + abs(c.K - 4), buckets=buckets)(
            torch.randn(2048), torch.empty(2048))  # K=4 at 2,048 rows
        made = tables.TuningTable.from_db(TuningDB(source))
        if where == "shipped":
            made.save(shipped / "h.json")
        else:
            tables.install(made.save(tmp_path / "t.json"))
        tables.forget()
        seen.clear()
        for rows in (1058, 1500, 2048):
            x, y = torch.randn(rows), torch.empty(rows)
            # on this GPU K=4 (the 2,048-row entry's) is the faster everywhere, K=1 nearer 1,058 rows
            _op(tmp_path / f"fresh{rows}.db", name="tb.b", on_miss=on_miss, truth=lambda c: 10.0 + abs(c.K - 4),
                buckets=buckets)(x, y)
            assert torch.equal(y, x * 2)
    finally:
        events.unsubscribe("choice", listener)
        tables.forget()
    assert [c.config["K"] for c in seen] == [4, 4, 4]
    if where == "user" or on_miss == "tune":
        assert [c.source for c in seen] == ["table"] * 3 and not any(c.provisional for c in seen)
        return
    assert [c.source for c in seen] == ["nearest", "nearest", "table"]
    assert seen[0].provisional and seen[1].provisional and not seen[2].provisional
    # at 1,058 rows the nearer 1,024-row entry's config came first, raced against the bucket entry's, and lost
    assert '"shape":[1024]' in seen[0].raced[0].neighbour and seen[0].raced[0].verdict == "slower"
    assert [r.verdict for r in seen[0].raced if r.config["K"] == 4] == ["served"]
    assert seen[0].neighbour is not None and '"shape":[2048]' in seen[0].neighbour


def test_winners_tuned_on_another_device_follow_this_devices_and_may_share_the_key():
    def key(m):
        return json.dumps([{"shape": [m, 64], "dtype": "bfloat16", "contiguous": True}])

    stored = [(key(100), {"K": 1}, 1.0, "h200.json", True),  # the very key, tuned on another device
              (key(2000), {"K": 2}, 1.0, "database", False),  # this device's, far
              (key(90), {"K": 3}, 1.0, "h200.json", True)]
    got = neighbours(key(100), stored)
    assert [(n.config["K"], n.foreign) for n in got] == [(2, False), (1, True), (3, True)]
    assert got[1].distance == 0.0
    # this device's winner of the key is the answer itself (never a neighbour), a foreign one at it is not
    assert neighbours(key(100), [(key(100), {"K": 1}, 1.0, "database", False)]) == []


def test_keys_that_differ_only_in_a_flag_are_kin_and_follow_the_family():
    def key(m, causal):
        return json.dumps([{"shape": [m, 64], "dtype": "bfloat16", "contiguous": True}, causal])

    a, b = key_features(key(100, True)), key_features(key(100, False))
    assert a.signature != b.signature and a.kin == b.kin and a.sizes == b.sizes
    other_dtype = json.dumps([{"shape": [100, 64], "dtype": "float16", "contiguous": True}, True])
    assert key_features(other_dtype).kin != a.kin  # a dtype is no flag
    stored = [(key(100, False), {"K": 1}, 1.0, "db"),  # kin at distance 0
              (key(4096, True), {"K": 2}, 1.0, "db"),  # family, far
              (key(3000, False), {"K": 3}, 1.0, "db"),  # kin, far
              (other_dtype, {"K": 4}, 1.0, "db")]
    got = neighbours(key(100, True), stored)
    assert [(n.config["K"], n.kin) for n in got] == [(2, False), (1, True), (3, True)]
    # with no member of its own family, the kin answer (nearest first)
    only_kin = neighbours(key(120, True), stored[:1] + stored[2:])
    assert [n.config["K"] for n in only_kin] == [1, 3] and all(n.kin for n in only_kin)


def test_a_flag_nobody_tuned_is_served_its_kins_config_not_the_default(tmp_path):
    path = tmp_path / "t.db"
    space = tt.Space(K=list(range(6)), baseline=dict(K=0))

    def op(on_miss, truth):
        return tt.autotune(space, reference=lambda x, y, flag: x * 2, writes=["y"], db=path,
                           backend=FakeBackend(truth), progress=False, on_miss=on_miss, name="nn.kin")(
            lambda cfg, x, y, flag: tt.Launch(_kernel, (1,), (x, y)))

    op("tune", lambda c: 10.0 + abs(c.K - 3))(torch.randn(64), torch.empty(64), True)  # K=3 for flag=True
    server = op("nearest", lambda c: 10.0 + abs(c.K - 3))
    x, y = torch.randn(100), torch.empty(100)
    server(x, y, False)  # flag=False: no family member, its kin (flag=True) answers
    assert server.tuning_count == 0 and server.config_for(x, y, False)["K"] == 3
    assert torch.equal(y, x * 2)


# ---------------------------------------------------------------------- nearest: serving


def test_an_unseen_shape_is_served_by_its_nearest_tuned_neighbour_and_recorded_as_pending(tmp_path):
    path = tmp_path / "t.db"
    tuner = _op(path, name="nn.op", truth=lambda c: 10.0 + abs(c.K - 3))  # K=3 wins
    tuner(torch.randn(64), torch.empty(64))
    tuner(torch.randn(4096), torch.empty(4096))
    assert tuner.tuning_count == 2
    seen = []
    listener = events.subscribe("choice", lambda op, problem, choice: seen.append(choice))
    try:
        server = _op(path, name="nn.op", on_miss="nearest", truth=lambda c: 10.0 + abs(c.K - 5))
        x = torch.randn(100)
        y = torch.empty(100)
        server(x, y)
    finally:
        events.unsubscribe("choice", listener)
    assert server.tuning_count == 0  # answered at once
    (choice,) = seen
    assert choice.source == "nearest" and choice.provisional and choice.config["K"] == 3
    assert '"shape":[64]' in choice.neighbour  # 100 is nearer 64 than 4096
    assert torch.equal(y, x * 2)
    key = server.key_of(x, y)
    assert server.provisional == [key]
    entries = pending.read(pending.pending_path(server.db))
    assert len(entries) == 1 and entries[0]["name"] == "nn.op" and entries[0]["source"] == "nearest"
    assert entries[0]["args"][0]["tensor"]["shape"] == [100]
    # tuned later, on fresh tensors of the recorded shape: the pending entry is gone, the config swapped in
    done = server.tune_pending()
    assert done == {key: server.config_for(x, y)} and done[key]["K"] == 5
    assert server.provisional == [] and server.tuning_count == 1
    assert pending.read(pending.pending_path(server.db)) == []


def test_a_neighbour_that_fails_its_check_is_passed_over(tmp_path):
    path = tmp_path / "t.db"
    _op(path, name="nn.bad", truth=lambda c: 10.0 + abs(c.K - 2))(torch.randn(64), torch.empty(64))  # K=2
    _op(path, name="nn.bad", truth=lambda c: 10.0 + abs(c.K - 4))(torch.randn(8192), torch.empty(8192))  # K=4

    def failures(c):  # on this process's backend K=2 is wrong: the nearer neighbour fails its check
        return SimulatedCandidate(tt.Status.MISMATCH) if c.K == 2 else None

    server = _op(path, name="nn.bad", on_miss="nearest", failures=failures, truth=lambda c: 10.0 + abs(c.K - 4))
    server(torch.randn(100), torch.empty(100))
    assert server.config_for(torch.randn(100), torch.empty(100))["K"] == 4 and server.tuning_count == 0


def test_the_nearest_configs_race_on_the_callers_arguments(tmp_path):
    """The nearest neighbour's config is not taken blindly: the distinct configs of the nearest
    neighbours and the default config are timed on the new shape and the fastest is served."""
    path = tmp_path / "t.db"
    _op(path, name="nn.race", truth=lambda c: 10.0 + abs(c.K - 2))(torch.randn(64), torch.empty(64))  # K=2, nearer
    _op(path, name="nn.race", truth=lambda c: 10.0 + abs(c.K - 4))(torch.randn(8192), torch.empty(8192))  # K=4
    fast4 = _op(path, name="nn.race", on_miss="nearest", truth=lambda c: 10.0 + abs(c.K - 4))
    fast4(torch.randn(100), torch.empty(100))
    assert fast4.config_for(torch.randn(100), torch.empty(100))["K"] == 4 and fast4.tuning_count == 0
    fast2 = _op(path, name="nn.race", on_miss="nearest", truth=lambda c: 10.0 + abs(c.K - 2))
    fast2(torch.randn(101), torch.empty(101))
    assert fast2.config_for(torch.randn(101), torch.empty(101))["K"] == 2
    default = _op(path, name="nn.race", on_miss="nearest")  # K=0, the default config, is fastest here
    default(torch.randn(102), torch.empty(102))
    assert default.config_for(torch.randn(102), torch.empty(102))["K"] == SPACE.baseline("sm_90")["K"]
    assert default.tuning_count == 0


def test_without_a_neighbour_nearest_serves_the_default_config(tmp_path):
    server = _op(tmp_path / "t.db", name="nn.none", on_miss="nearest")
    x, y = torch.randn(100), torch.empty(100)
    server(x, y)
    assert server.tuning_count == 0 and server.config_for(x, y)["K"] == 0 and len(server.provisional) == 1
    assert torch.equal(y, x * 2)


def test_a_default_config_that_fails_its_check_is_tuned(tmp_path):
    server = _op(tmp_path / "t.db", name="nn.nodefault", on_miss="nearest",
                 failures=lambda c: SimulatedCandidate(tt.Status.MISMATCH) if c.K == 0 else None)
    server(torch.randn(100), torch.empty(100))
    assert server.tuning_count == 1 and server.provisional == []


def test_on_miss_default_serves_the_baseline_at_once(tmp_path):
    op = _op(tmp_path / "t.db", name="nn.default", on_miss="default", truth=lambda c: 10.0 + abs(c.K - 5))
    x, y = torch.randn(32), torch.empty(32)
    op(x, y)
    assert op.tuning_count == 0 and op.config_for(x, y)["K"] == 0 and len(op.provisional) == 1
    assert op.tune(x, y)["K"] == 5 and op.provisional == [] and op.tuning_count == 1


def test_a_fill_tunes_exactly_even_for_nearest_ops(tmp_path):
    from tiletune.resolve.chain import miss_scope

    path = tmp_path / "t.db"
    _op(path, name="nn.fill")(torch.randn(64), torch.empty(64))
    op = _op(path, name="nn.fill", on_miss="nearest")
    with miss_scope(on_miss="tune"):
        op(torch.randn(100), torch.empty(100))
    assert op.tuning_count == 1 and op.provisional == []


def test_the_environment_overrides_an_ops_policy(tmp_path, monkeypatch):
    path = tmp_path / "t.db"
    _op(path, name="nn.env")(torch.randn(64), torch.empty(64))
    monkeypatch.setenv("TILETUNE_ON_MISS", "tune")
    op = _op(path, name="nn.env", on_miss="nearest")
    op(torch.randn(100), torch.empty(100))
    assert op.tuning_count == 1


# ---------------------------------------------------------------------- the layout


SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "tiletune"


def test_at_most_fifteen_top_level_modules():
    modules = sorted(p.name for p in SRC.glob("*.py"))
    assert len(modules) <= 15, modules


def test_no_private_access_to_a_tuned_op_outside_op():
    pattern = re.compile(r"\bop\._[a-z]")
    offenders = []
    for p in SRC.rglob("*.py"):
        if p.relative_to(SRC).parts[0] == "op":
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{p.relative_to(SRC)}:{i}: {line.strip()}")
    assert offenders == []


def test_the_import_contracts_hold():
    lint = pathlib.Path(sys.executable).parent / "lint-imports"
    if not lint.exists():
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    root = SRC.parent.parent
    env = dict(os.environ, PYTHONPATH=str(root / "src"))
    r = subprocess.run([str(lint)], cwd=root, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def _module_imports() -> dict[str, set[str]]:
    """``module -> the tiletune modules it imports``, read from the source (every import: at the top, in
    functions and under ``TYPE_CHECKING``; ``from pkg import mod`` counts as importing ``pkg.mod``).
    A package's ``__init__`` is left out: it hands names on (its imports are its submodules')."""
    import ast

    names: dict[pathlib.Path, str] = {}
    for p in SRC.rglob("*.py"):
        parts = ("tiletune",) + p.relative_to(SRC).with_suffix("").parts
        if parts[-1] != "__init__":
            names[p] = ".".join(parts)
    known = set(names.values())
    graph: dict[str, set[str]] = {}
    for p, mod in names.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)
        graph[mod] = {d for d in deps if d in known and d != mod}
    return graph


def test_no_two_modules_import_each_other_even_through_others():
    """The miss path as one-way data: no import cycle between modules, inside a package or across."""
    graph = _module_imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []


# ---------------------------------------------------------------------- nearest: fallback while compiling


@pytest.fixture
def fallback_on(monkeypatch):
    """The fallback as a user gets it (a benchmark's main() run in-process may have set TILETUNE_FALLBACK)."""
    monkeypatch.delenv("TILETUNE_FALLBACK", raising=False)
    monkeypatch.delenv("TILETUNE_ON_MISS", raising=False)


def _fb_op(path, backend, *, on_miss="nearest", calls=None):
    calls = [] if calls is None else calls

    def fallback(x, y):
        calls.append(x.shape[0])
        y.copy_(x * 2)

    return _op(path, backend=backend, on_miss=on_miss, name="nn.fb", fallback=fallback), calls


def test_a_new_key_whose_config_nothing_compiled_runs_the_fallback_while_it_compiles(tmp_path, fallback_on):
    import threading

    path = tmp_path / "t.db"
    _op(path, name="nn.fb", truth=lambda c: 10.0 + abs(c.K - 3))(torch.randn(64), torch.empty(64))  # K=3 stored
    gate = threading.Event()
    backend = FakeCompilingBackend(lambda c: 10.0 + abs(c.K - 3), cached=lambda c: False, ahead_gate=gate)
    server, calls = _fb_op(path, backend)
    x, y = torch.randn(100), torch.empty(100)
    server(x, y)  # nothing compiled holds K=3: it compiles in the background, the fallback answers
    assert calls == [100] and torch.equal(y, x * 2)
    assert [[c.K for c in cfgs] for cfgs in backend.ahead] == [[3, 0]]  # the nearest's config, then the default
    assert server.tuning_count == 0 and backend.launches == [] and backend.compiled == []
    sessions = len(backend.sessions)
    y2 = torch.empty(100)
    server(x, y2)  # still compiling: the fallback again, without asking the chain
    assert calls == [100, 100] and torch.equal(y2, x * 2) and len(backend.sessions) == sessions
    assert not tt.wait_for_compiles(0.05)
    gate.set()
    assert tt.wait_for_compiles(5)
    y3 = torch.empty(100)
    server(x, y3)  # compiled: the nearest config launches from now on, provisionally
    assert calls == [100, 100] and torch.equal(y3, x * 2)
    assert server.config_for(x, y3)["K"] == 3 and server.provisional == [server.key_of(x, y3)]
    assert [c.K for c, _, _ in backend.launches][-1] == 3 and server.tuning_count == 0


def test_config_for_and_bind_never_fall_back(tmp_path, fallback_on):
    import threading

    path = tmp_path / "t.db"
    _op(path, name="nn.fb", truth=lambda c: 10.0 + abs(c.K - 3))(torch.randn(64), torch.empty(64))
    backend = FakeCompilingBackend(lambda c: 10.0 + abs(c.K - 3), cached=lambda c: False, ahead_gate=threading.Event())
    server, calls = _fb_op(path, backend)
    x, y = torch.randn(100), torch.empty(100)
    assert server.config_for(x, y)["K"] == 3  # a config is asked for: compiled now, no fallback
    assert calls == [] and backend.ahead == []


def test_the_fallback_is_off_when_a_compile_cache_holds_the_config_or_when_turned_off(tmp_path, monkeypatch, fallback_on):
    import threading

    path = tmp_path / "t.db"
    _op(path, name="nn.fb", truth=lambda c: 10.0 + abs(c.K - 3))(torch.randn(64), torch.empty(64))
    warm = FakeCompilingBackend(lambda c: 10.0 + abs(c.K - 3), cached=lambda c: c.K == 3, ahead_gate=threading.Event())
    server, calls = _fb_op(path, warm)
    x, y = torch.randn(100), torch.empty(100)
    server(x, y)
    assert calls == [] and warm.ahead == [] and server.config_for(x, y)["K"] == 3
    monkeypatch.setenv("TILETUNE_FALLBACK", "0")
    cold = FakeCompilingBackend(lambda c: 10.0 + abs(c.K - 3), cached=lambda c: False, ahead_gate=threading.Event())
    server, calls = _fb_op(path, cold)
    server(torch.randn(101), torch.empty(101))
    assert calls == [] and cold.ahead == [] and cold.compiled  # compiled at once, as without a fallback


def test_without_a_neighbour_the_default_config_compiles_while_the_fallback_runs(tmp_path, fallback_on):
    backend = FakeCompilingBackend(lambda c: 10.0 + c.K, cached=lambda c: False)  # the compile finishes at once
    server, calls = _fb_op(tmp_path / "t.db", backend, on_miss="default")
    x, y = torch.randn(100), torch.empty(100)
    server(x, y)
    assert calls == [100] and [[c.K for c in cfgs] for cfgs in backend.ahead] == [[0]] and torch.equal(y, x * 2)
    server(x, y)  # compiled: the default config, checked once, provisionally
    assert calls == [100] and server.config_for(x, y)["K"] == 0 and len(server.provisional) == 1


def test_a_fallback_must_be_callable():
    with pytest.raises(TypeError, match="fallback must be a callable"):
        tt.autotune(SPACE, fallback="torch")(lambda cfg, x: None)


def test_a_key_falls_back_once_even_when_its_background_compile_reached_no_cache(tmp_path, fallback_on):
    path = tmp_path / "t.db"
    _op(path, name="nn.fb", truth=lambda c: 10.0 + abs(c.K - 3))(torch.randn(64), torch.empty(64))
    backend = FakeCompilingBackend(lambda c: 10.0 + abs(c.K - 3), cached=lambda c: False)
    backend.compile_ahead = lambda *a, **k: type("Lost", (), {"done": True, "wait": lambda self, t=None: True})()
    server, calls = _fb_op(path, backend)
    x, y = torch.randn(100), torch.empty(100)
    server(x, y)  # falls back; its compile is lost (nothing reached a cache)
    server(x, y)  # not again: the key compiles now and launches its config
    assert calls == [100] and server.config_for(x, y)["K"] == 3 and torch.equal(y, x * 2)


def test_a_single_config_op_falls_back_while_its_one_config_compiles(tmp_path, fallback_on):
    """``tune_single=False`` (one config, launched without a session): uncompiled, the fallback runs while
    it compiles; compiled, it launches at once."""
    import threading

    one = tt.Space(K=[4])
    gate = threading.Event()
    backend = FakeCompilingBackend(lambda c: 10.0, cached=lambda c: False, ahead_gate=gate)
    calls = []

    def fb(x, y):
        calls.append(1)
        y.copy_(x * 2)

    op = tt.autotune(one, reference=lambda x, y: x * 2, writes=["y"], db=tmp_path / "t.db", backend=backend,
                     progress=False, on_miss="nearest", tune_single=False, fallback=fb, name="nn.one")(_plan)
    x, y = torch.randn(10), torch.empty(10)
    op(x, y)
    assert calls == [1] and torch.equal(y, x * 2) and backend.ahead == [[one.configs("sm_90")[0]]]
    gate.set()
    assert tt.wait_for_compiles(5)
    y2 = torch.empty(10)
    op(x, y2)
    assert calls == [1] and torch.equal(y2, x * 2) and op.config_for(x, y2)["K"] == 4 and backend.launches


def test_a_tuned_keys_time_outside_its_session_is_recorded_in_its_stats():
    """``miss_s`` (the miss's start to the chain's answer, the tuning inside it), ``store_s``, and the
    caller's ``install_s`` / ``first_launch_s`` of the winner: where a first call's time went around
    its session."""
    import torch

    import tiletune as tt
    from tiletune.devices.backends import FakeBackend

    be = FakeBackend(lambda c: 10.0 + c.K, noise=0.002, compile_s=0.0)

    def kern(x, y):
        y.copy_(x * 2)

    op = tt.autotune(tt.Space(K=[0, 1, 2], baseline=dict(K=0)), reference=lambda x, y: x * 2, writes=["y"],
                     db=False, backend=be, progress=False)(lambda cfg, x, y: tt.Launch(kern, (1,), (x, y)))
    x, y = torch.randn(16), torch.empty(16)
    op(x, y)
    (r,) = op.results.values()
    assert r.stats["miss_s"] >= r.wall_s > 0
    assert r.stats["store_s"] >= 0 and r.stats["install_s"] >= 0 and r.stats["first_launch_s"] >= 0
    assert torch.equal(y, x * 2)


@pytest.mark.parametrize("where", ["database", "table"])
def test_a_database_or_table_answer_that_nothing_compiled_runs_the_fallback_while_it_compiles(
        tmp_path, monkeypatch, fallback_on, where, private_tables):
    """A fresh machine (no compile cache) with a database record or a table entry for the key: the first
    call does not wait for the compiler (the fallback answers while the record's config compiles); once
    compiled, the record's config launches; a compile cache that holds it launches it at once."""
    import threading

    from tiletune.resolve import tables

    try:
        source = tmp_path / "source.db"
        _op(source, name="nn.fb", truth=lambda c: 10.0 + abs(c.K - 3))(torch.randn(64), torch.empty(64))  # K=3
        if where == "table":
            tables.install(tables.TuningTable.from_db(TuningDB(source)).save(tmp_path / "t.json"))
            db = tmp_path / "fresh.db"
        else:
            db = source
        gate = threading.Event()
        backend = FakeCompilingBackend(lambda c: 10.0 + abs(c.K - 3), cached=lambda c: False, ahead_gate=gate)
        server, calls = _fb_op(db, backend)
        log: list[str] = []
        server_chain = Chain([Spy(s, log) for s in default_sources()])
        x, y = torch.randn(64), torch.empty(64)
        with monkeypatch.context() as m:
            m.setattr("tiletune.resolve.chain._default", server_chain)
            server(x, y)
        assert log[-1] == where  # the source that found the config answered with the fallback
        assert calls == [64] and torch.equal(y, x * 2) and [[c.K for c in cfgs] for cfgs in backend.ahead] == [[3]]
        assert backend.launches == [] and server.tuning_count == 0
        gate.set()
        assert tt.wait_for_compiles(5)
        y2 = torch.empty(64)
        server(x, y2)  # compiled: the record's config launches from now on
        assert calls == [64] and torch.equal(y2, x * 2) and [c.K for c, _, _ in backend.launches] == [3]
        assert server.tuning_count == 0 and server.provisional == []
        warm = FakeCompilingBackend(lambda c: 10.0 + abs(c.K - 3), cached=lambda c: c.K == 3)
        server, calls = _fb_op(db, warm)
        server(x, torch.empty(64))  # a compile cache holds it: launched at once, no fallback
        assert calls == [] and warm.ahead == [] and [c.K for c, _, _ in warm.launches] == [3]
    finally:
        tables.forget()
