"""Tuning tables (tiletune.resolve.tables): precedence after the database, exact identities, device and
version mismatches, the file format's validation and the CLI's export/import (fake backend, CPU)."""

from __future__ import annotations

import json
import logging

import pytest

torch = pytest.importorskip("torch")
from typer.testing import CliRunner  # noqa: E402

import tiletune as tt  # noqa: E402
from tiletune.resolve import tables  # noqa: E402
from tiletune.devices.backends import FakeBackend  # noqa: E402
from tiletune.cli import app  # noqa: E402
from tiletune.errors import InvalidRecording  # noqa: E402
from tiletune.records import DeviceInfo  # noqa: E402
from tiletune.store import TuningDB  # noqa: E402

SPACE = tt.Space(TM=[32, 64, 128], baseline=dict(TM=64))
BEST = SPACE.config(TM=128)


def model(cfg) -> float:
    return 100.0 - 0.2 * cfg.TM


def double(x, y):
    y.copy_(x * 2)


def plan(cfg, x, y):
    return tt.Launch(double, (cfg.TM,), (x, y))


def make_op(be, db=False):
    return tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=db, backend=be, progress=False,
                       name="double")(plan)


@pytest.fixture(autouse=True)
def folders(tmp_path, monkeypatch, private_tables):
    """A private user table folder (via TILETUNE_CACHE_DIR) and an empty shipped folder."""
    monkeypatch.delenv("TILETUNE_DB", raising=False)
    yield tmp_path


def tuned_db(tmp_path, shapes=(16,)):
    db = TuningDB(tmp_path / "source.db")
    op = make_op(FakeBackend(model, noise=0.0), db=db)
    for n in shapes:
        op(torch.randn(n), torch.empty(n))
    return db


def table_file(tmp_path, db, config=None, device=None, versions=None, name="t.json"):
    t = tables.TuningTable.from_db(db)
    if config is not None or device is not None or versions is not None:
        entries = [tables.TableEntry(e.name, e.kernel_id, e.space_hash, e.key, config or e.config, e.median_us)
                   for e in t.entries.values()]
        t = tables.TuningTable(device or t.device, versions or t.versions, entries)
    return t.save(tmp_path / name)


def test_a_table_answers_a_cold_key_without_tuning(folders):
    path = table_file(folders, tuned_db(folders))
    tables.install(path)
    be = FakeBackend(model, noise=0.0)
    op = make_op(be, db=TuningDB(folders / "fresh.db"))
    x = torch.randn(16)
    torch.testing.assert_close(op(x, torch.empty(16)), x * 2)
    assert op.tuning_count == 0 and be.launches[-1][0] == BEST
    # nothing was written to the user's database
    assert TuningDB(folders / "fresh.db").winners() == []
    # a key the table does not hold is tuned
    op(torch.randn(8), torch.empty(8))
    assert op.tuning_count == 1


def test_the_database_wins_over_tables_and_user_tables_over_shipped(folders):
    db = tuned_db(folders)
    # shipped says TM=32, the user's table says TM=64, the user's database says TM=128
    table_file(tables.SHIPPED, db, config={"TM": 32}, name="shipped.json")
    tables.forget()  # tables are read once per process
    be = FakeBackend(model, noise=0.0)
    make_op(be)(torch.randn(16), torch.empty(16))
    assert be.launches[-1][0] == SPACE.config(TM=32)
    tables.install(table_file(folders, db, config={"TM": 64}, name="mine.json"))
    be = FakeBackend(model, noise=0.0)
    make_op(be)(torch.randn(16), torch.empty(16))
    assert be.launches[-1][0] == SPACE.config(TM=64)
    be = FakeBackend(model, noise=0.0)
    make_op(be, db=db)(torch.randn(16), torch.empty(16))
    assert be.launches[-1][0] == BEST


def test_other_device_or_versions_fall_back_to_tuning_with_one_line(folders, caplog):
    db = tuned_db(folders, shapes=(16, 8))
    tables.install(table_file(folders, db, device=DeviceInfo("NVIDIA B200", "sm_100", 148), name="b200.json"))
    tables.install(table_file(folders, db, versions={"cuda_tile": "9.9", "tileiras": "fake"}, name="old.json"))
    be = FakeBackend(model, noise=0.0)
    op = make_op(be)
    with caplog.at_level(logging.WARNING, logger="tiletune"):
        op(torch.randn(16), torch.empty(16))
        op(torch.randn(8), torch.empty(8))
    assert op.tuning_count == 2
    lines = [r.getMessage() for r in caplog.records if "tuning table" in r.getMessage()]
    assert len(lines) == 2, lines
    assert any("made for NVIDIA B200 (sm_100, 148 SMs)" in m and "not used" in m for m in lines)
    assert any("made with cuda_tile 9.9" in m for m in lines)


def test_a_table_of_another_device_of_this_arch_offers_neighbours_never_exact_answers(folders, caplog):
    """The shipped H200 table on an H100: its winners are first guesses for the nearest-neighbour policy
    (raced and checked here), not answers; a table of another architecture offers nothing."""
    db = tuned_db(folders, shapes=(16,))  # the winner at 16: TM=128 on "Fake H200"
    tables.install(table_file(folders, db, device=DeviceInfo("Fake H100", "sm_90", 132), name="h100.json"))
    tables.install(table_file(folders, db, device=DeviceInfo("NVIDIA B200", "sm_100", 148), config={"TM": 32},
                              name="b200.json"))
    be = FakeBackend(model, noise=0.0)  # a "Fake H200": the tables above were made for other devices
    ident = db.winners()[0].identity
    assert [(t.device.name, e.config) for e, t in tables.family(ident)] == [("Fake H100", {"TM": 128})]
    assert tables.lookup(ident) is None  # never an exact answer
    got = []

    def hear(op=None, problem=None, choice=None, **_):
        got.append(choice)

    from tiletune import events

    op = tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=TuningDB(folders / "fresh.db"),
                     backend=be, progress=False, name="double", on_miss="nearest")(plan)
    events.subscribe("choice", hear)
    try:
        with caplog.at_level(logging.WARNING, logger="tiletune"):
            for n in (16, 24):  # the table's own key and a new one
                x = torch.randn(n)
                torch.testing.assert_close(op(x, torch.empty(n)), x * 2)
    finally:
        events.unsubscribe("choice", hear)
    assert op.tuning_count == 0
    assert [(c.source, c.config.as_dict()) for c in got] == [("nearest", {"TM": 128})] * 2
    lines = [r.getMessage() for r in caplog.records if "tuning table" in r.getMessage()]
    assert any("Fake H100" in m and "neighbours' configs" in m for m in lines), lines


def test_tables_can_be_turned_off(folders, monkeypatch):
    tables.install(table_file(folders, tuned_db(folders)))
    monkeypatch.setenv("TILETUNE_TABLES", "0")
    op = make_op(FakeBackend(model, noise=0.0))
    op(torch.randn(16), torch.empty(16))
    assert op.tuning_count == 1


def test_a_table_serves_a_key_met_during_capture(folders):
    tables.install(table_file(folders, tuned_db(folders)))
    be = FakeBackend(model, noise=0.0)
    be.capturing = True
    op = make_op(be)
    op(torch.randn(16), torch.empty(16))
    assert op.pending == [] and be.launches[-1][0] == BEST


def test_an_unreadable_table_is_skipped_with_a_warning(folders, caplog):
    user = tables.table_folders()[0]
    user.mkdir(parents=True)
    (user / "broken.json").write_text('{"format": "tiletune-table", "version": 1}')
    tables.forget()
    with caplog.at_level(logging.WARNING, logger="tiletune"):
        assert tables.tables() == []
    assert any("broken.json skipped" in r.getMessage() and "missing field 'device'" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("doc,message", [
    ({"format": "tiletune-recording"}, "format: not a tuning table"),
    ({"format": "tiletune-table", "version": 2}, "version: written by a newer tiletune"),
    ({"format": "tiletune-table", "version": 1, "device": {"name": "x", "arch": "sm_90", "sm_count": True},
      "versions": {}, "entries": []}, "device.sm_count: expected an integer"),
    ({"format": "tiletune-table", "version": 1, "device": {"name": "x", "arch": "sm_90", "sm_count": 1},
      "versions": {}, "entries": [{"name": "a", "kernel_id": "k", "space_hash": "s", "key": "[]",
                                   "config": {"TM": 1}, "median_us": -1}]}, "entries[0].median_us: expected a finite positive"),
])
def test_table_files_are_validated(folders, doc, message):
    f = folders / "bad.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(InvalidRecording, match=message.replace("[", r"\[").replace("]", r"\]")):
        tables.TuningTable.load(f)


def test_cli_export_and_import_a_table(folders):
    db = tuned_db(folders, shapes=(16, 8))
    runner = CliRunner()
    out = folders / "h200.json.gz"
    r = runner.invoke(app, ["db", "export", "--table", str(out), "--path", str(db.where)])
    assert r.exit_code == 0, r.output
    assert "2 winner(s)" in r.output
    r = runner.invoke(app, ["db", "import", "--table", str(out)])
    assert r.exit_code == 0, r.output
    assert (tables.table_folders()[0] / "h200.json.gz").exists()
    op = make_op(FakeBackend(model, noise=0.0))
    op(torch.randn(8), torch.empty(8))
    assert op.tuning_count == 0


def test_a_table_holds_one_device(folders):
    db = tuned_db(folders)
    other = make_op(FakeBackend(model, noise=0.0, device=DeviceInfo("Fake B200", "sm_100", 148)), db=db)
    other(torch.randn(16), torch.empty(16))
    with pytest.raises(ValueError, match="2 device"):
        tables.TuningTable.from_db(db)
    r = CliRunner().invoke(app, ["db", "export", "--table", str(folders / "x.json"), "--path", str(db.where)])
    assert r.exit_code == 2 and "2 device(s)" in r.output


def test_the_shipped_h200_table_loads_is_small_and_uses_the_current_bucket_key_format():
    import json as _json

    import pathlib

    import tiletune.resolve.tables
    from tiletune.resolve.tables import TuningTable

    shipped = pathlib.Path(tiletune.resolve.tables.__file__).parent.parent / "data" / "tables"  # SHIPPED is patched here
    files = sorted(p for p in shipped.iterdir() if p.name.endswith((".json", ".json.gz")))
    assert files, "no shipped table"
    for path in files:
        assert path.stat().st_size < 1 << 20
        table = TuningTable.load(path)
        assert table.device.arch == "sm_90" and len(table) > 0
        for entry in table.entries.values():
            assert entry.name.startswith("tiletune.")
            key = _json.loads(entry.key)
            if isinstance(key, list) and key and key[0] == {"bucketed": True}:
                # strides of a bucketed key are stored as ratios (tiletune.buckets._layout)
                assert not any(isinstance(d, dict) and "strides" in d for d in key), entry.key


# ------------------------------------------------------------------------------ sibling spaces (regimes)


def test_family_lists_the_same_spaces_entries_then_the_same_kernels_other_spaces(folders):
    db = tuned_db(folders, shapes=(16, 32))
    t = tables.TuningTable.from_db(db)
    (kid,) = {e.kernel_id for e in t.entries.values()}
    (space,) = {e.space_hash for e in t.entries.values()}
    mine = list(t.entries.values())
    sibling = tables.TableEntry("double", kid, "another-space", mine[0].key.replace("16", "64"), {"TM": 32}, 1.0)
    stranger = tables.TableEntry("other", "another-kernel", space, mine[0].key.replace("16", "8"), {"TM": 32}, 1.0)
    tables.install(tables.TuningTable(t.device, t.versions, [sibling, stranger, *mine]).save(folders / "s.json"))
    ident = db.winners()[0].identity
    got = [e for e, _ in tables.family(ident)]
    assert {e.key for e in got[:len(mine)]} == {e.key for e in mine}  # the same space first
    assert got[len(mine):] == [sibling]  # then the same kernel's other spaces; never another kernel
    assert [e for e, _ in tables.family(ident, siblings=False)] == got[:len(mine)]


def test_a_key_of_a_space_without_entries_is_served_a_sibling_spaces_winner(folders):
    """The split-K GEMM's case: one kernel, a space per regime; a regime nobody tuned took the default
    config although the table held the kernel's winners in other regimes."""
    tables.install(table_file(folders, tuned_db(folders, shapes=(16,))))  # SPACE's winner at 16: TM=128
    other_space = tt.Space(TM=[64, 128, 256], baseline=dict(TM=64))  # another regime of the same kernel
    be = FakeBackend(lambda cfg: 100.0 - 0.2 * min(cfg.TM, 128), noise=0.0)
    op = tt.autotune(other_space, reference=lambda x, y: x * 2, writes=["y"], db=TuningDB(folders / "fresh.db"),
                     backend=be, progress=False, name="double", on_miss="nearest")(plan)
    got = []

    def hear(op=None, problem=None, choice=None, **_):
        got.append(choice)

    from tiletune import events

    events.subscribe("choice", hear)
    try:
        x = torch.randn(24)
        torch.testing.assert_close(op(x, torch.empty(24)), x * 2)
    finally:
        events.unsubscribe("choice", hear)
    assert op.tuning_count == 0
    assert [(c.source, c.config.as_dict()) for c in got] == [("nearest", {"TM": 128})]
