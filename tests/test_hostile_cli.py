"""Hostile input to the command line and to ``strategy=``: one error line, exact exit codes, nothing
changed; text from files reaches the terminal escaped (issue 15)."""

from __future__ import annotations

import hashlib
import re
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tiletune
from tiletune import cli
from tiletune.cli import app
from tiletune.records import DeviceInfo, Measurement, Status, TuningIdentity, canonical_json
from tiletune.store import TuningDB
from tiletune.space.strategies import STRATEGIES, STRATEGY_NAMES, Strategy, make_strategy, register, strategy_names
from tiletune.terminal import escape_controls, safe

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
RMSNORM_REC = REPO / "src" / "tiletune" / "data" / "h200_rmsnorm_bf16_16384x4096.json.gz"
HOSTILE = "[/bold]x\x1b[31m"
DEBUG_HINT = "rerun with --debug (or TILETUNE_DEBUG=1) for the full traceback"


def run(*args: str, env: dict[str, str] | None = None, input: str | None = None):
    return runner.invoke(app, list(args), env={"COLUMNS": "250", **(env or {})}, input=input)


def one_error(result, code: int, message: str | re.Pattern, hint: str | re.Pattern | None = None) -> None:
    """``result`` failed with ``code``, printing only ``error: message`` (and ``hint: ...``) on stderr."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == (1 if hint is None else 2), result.stderr
    assert lines[0].startswith("error: ")
    if isinstance(message, re.Pattern):
        assert message.fullmatch(lines[0][len("error: "):]), lines[0]
    else:
        assert lines[0] == f"error: {message}"
    if hint is not None:
        assert lines[1].startswith("hint: ")
        if isinstance(hint, re.Pattern):
            assert hint.fullmatch(lines[1][len("hint: "):]), lines[1]
        else:
            assert lines[1] == f"hint: {hint}"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


DEVICE = DeviceInfo(name="NVIDIA H100 80GB HBM3", arch="sm_90", sm_count=132)


def identity(name: str = "matmul", device: DeviceInfo = DEVICE, key: object = None) -> TuningIdentity:
    return TuningIdentity(kernel_id="k0", space_hash="s0", key=canonical_json(key or {"M": 1024}),
                          device=device, versions=canonical_json({"cuda_tile": "1.7.0"}), name=name)


def measurements(config: dict) -> list[Measurement]:
    return [Measurement(config=config, status=Status.OK, samples_us=(9.5, 9.75, 9.6), order=0, is_baseline=True)]


@pytest.fixture
def db_file(tmp_path: Path) -> Path:
    """A database with one stored winner."""
    path = tmp_path / "tuning.db"
    with TuningDB(path) as db:
        db.record_session(identity(), measurements({"TM": 128}), {"TM": 128}, 9.6)
    return path


def records(path: Path) -> list:
    with TuningDB(path) as db:
        return [(w.identity, w.config, w.median_us) for w in db.winners()]


@pytest.fixture
def hostile_export(tmp_path: Path) -> Path:
    """A valid ``tiletune db export`` file whose op name, device name and config carry markup and ESC."""
    src = tmp_path / "hostile-src.db"
    with TuningDB(src) as db:
        dev = DeviceInfo(name="[link=http://evil]GPU\x1b]0;title\x07", arch="sm_90", sm_count=1)
        cfg = {"TM": "[bold red]64\x1b[2J"}
        db.record_session(identity(HOSTILE, dev, {"M": "[/]\x9b"}), measurements(cfg), cfg, 1.5)
        out = tmp_path / "hostile.json"
        assert db.export_json(out) == 1
    return out


@pytest.fixture
def custom_strategy():
    """A strategy registered as "hostile-mine" for the test only."""

    class MineStrategy(Strategy):
        made: list[bool] = []

        def __init__(self, space, arch=None, seed=0, *, reverse=False):
            super().__init__(space, arch, seed)
            self.reverse = reverse
            type(self).made.append(reverse)

        def _propose(self, n):
            pool = self._unseen()
            return (pool[::-1] if self.reverse else pool)[:n]

    register("hostile-mine")(MineStrategy)
    try:
        yield MineStrategy
    finally:
        STRATEGIES.pop("hostile-mine", None)


# ---------------------------------------------------------------------------------------- usage


def test_unknown_command():
    one_error(run("frob"), 2, "No such command 'frob'.", "run 'root --help'")


def test_unknown_option():
    one_error(run("db", "list", "--frob"), 2, "No such option: --frob", "run 'root db list --help'")


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and result.stdout == f"tiletune {tiletune.__version__}\n" and result.stderr == ""


def test_every_option_and_argument_has_help():
    import typer.main

    missing = []

    def walk(cmd, path):
        for p in cmd.params:
            if not (getattr(p, "help", None) or "").strip():
                missing.append(f"{path} {p.name}")
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "tiletune")
    assert missing == []


@pytest.mark.parametrize("option", ["--seeds", "--exhaustive-seeds", "--workers", "--batch", "--budget"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_strategies_refuses_nonsensical_numbers(option, value):
    result = run("strategies", str(RMSNORM_REC), option, value)
    one_error(result, 2, re.compile(re.escape(f"Invalid value for '{option}': ")
                                    + rf"(Input should be greater than or equal to 1|{value} is not in the range x>=1)\.?"),
              "run 'root strategies --help'")
    assert result.stdout == ""  # no table of None


def test_strategies_refuses_a_budget_that_is_not_a_number():
    one_error(run("strategies", str(RMSNORM_REC), "--budget", "lots"), 2,
              re.compile(re.escape("Invalid value for '--budget': ") + r"(Input should be a valid integer.*|"
                         r"'lots' is not a valid integer)\.?"), "run 'root strategies --help'")


@pytest.mark.parametrize("value", ["median", "", "TIME", "time,times-median"])
def test_strategies_refuses_an_unknown_truth(value):
    result = run("strategies", str(RMSNORM_REC), "--truth", value)
    one_error(result, 2, f"--truth {value!r}: expected one of time, times-median")
    assert result.stdout == ""


def test_strategies_refuses_a_truth_the_recording_does_not_have():
    result = run("strategies", str(RMSNORM_REC), "--truth", "time")
    one_error(result, 2, f"--truth time: {RMSNORM_REC} cannot be scored by 'time' (the single time recorded per "
                         "config (Kernel Tuner's 'time' field, as Kernel Tuner scores it)): it records only "
                         "times-median",
              "leave out --truth to use each file's own")
    assert result.stdout == ""


def test_demo_refuses_a_negative_budget():
    one_error(run("demo", "--replay", "--budget-evals", "-1"), 2,
              re.compile(r"Invalid value for '--budget-evals': (Input should be greater than or equal to 1|"
                         r"-1 is not in the range x>=1)\.?"), "run 'root demo --help'")


def test_strategies_refuses_an_unknown_strategy():
    names = ", ".join(strategy_names())
    one_error(run("strategies", str(RMSNORM_REC), "-s", "annealing"), 2,
              f"unknown strategy 'annealing'; registered strategies: {names} "
              "(or a Strategy subclass or instance, or 'package.module:Name')")


def test_strategies_refuses_a_strategy_named_twice():
    one_error(run("strategies", str(RMSNORM_REC), "-s", "random", "-s", "random"), 2,
              "--strategy random is given twice", "name each strategy once")


def test_strategies_refuses_a_missing_recording(tmp_path):
    missing = tmp_path / "nope.json"
    one_error(run("strategies", str(missing)), 2,
              re.compile(rf"Invalid value for '(RECORDINGS\.\.\.|recordings)': [Ff]ile '{re.escape(str(missing))}' "
                         r"does not exist\."), "run 'root strategies --help'")


def test_demo_record_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "_gpu_available", lambda: False)
    out = tmp_path / "rec"
    one_error(run("demo", "--record", str(out)), 2,
              "--record cannot record without a GPU: it records live tuning sessions, and no GPU was found",
              "run it on a machine with a CUDA GPU, or leave out --record")
    assert not out.exists()


def test_demo_record_with_replay(tmp_path):
    out = tmp_path / "rec"
    one_error(run("demo", "--replay", "--record", str(out)), 2,
              "--record cannot record without a GPU: it records live tuning sessions and --replay was given",
              "run it on a machine with a CUDA GPU, or leave out --record or --replay")
    assert not out.exists()


def test_demo_refuses_an_unknown_strategy_before_running():
    result = run("demo", "--replay", "--strategy", "annealing")
    one_error(result, 2, re.compile(r"unknown strategy 'annealing'; registered strategies: .*"))
    assert result.stdout == ""


def test_demo_json_into_a_missing_folder(tmp_path):
    out = tmp_path / "no" / "rows.json"
    one_error(run("demo", "--replay", "--json", str(out)), 2,
              f"--json {out}: folder {out.parent} does not exist", "create it first, or choose another path")


# ---------------------------------------------------------------------------------------- errors


def test_unexpected_exception_is_one_line_with_its_class(db_file, monkeypatch):
    def boom(self, **kw):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(TuningDB, "winners", boom)
    one_error(run("db", "list", "--path", str(db_file)), 1, "ZeroDivisionError: boom", f"unexpected error; {DEBUG_HINT}")


@pytest.mark.parametrize("how", ["--debug first", "--debug last", "TILETUNE_DEBUG"])
def test_debug_shows_the_traceback(db_file, monkeypatch, how):
    def boom(self, **kw):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(TuningDB, "winners", boom)
    args = ["db", "list", "--path", str(db_file)]
    env = {}
    if how == "--debug first":
        args.insert(0, "--debug")
    elif how == "--debug last":
        args.append("--debug")
    else:
        env["TILETUNE_DEBUG"] = " Yes "
    result = run(*args, env=env)
    assert result.exit_code == 1
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert result.stderr.rstrip().endswith("ZeroDivisionError: boom")
    assert "error: " not in result.stderr


def test_library_errors_are_one_line_even_when_multiline(monkeypatch, db_file):
    from tiletune.errors import AllCandidatesFailed

    def fail(self, **kw):
        raise AllCandidatesFailed("op", [])

    monkeypatch.setattr(TuningDB, "winners", fail)
    one_error(run("db", "list", "--path", str(db_file)), 1, "tiletune: every candidate of 'op' failed (0 tried):")


def test_os_errors_are_one_line(monkeypatch, db_file):
    def denied(self, **kw):
        raise PermissionError(13, "Permission denied", "/some/file")

    monkeypatch.setattr(TuningDB, "winners", denied)
    one_error(run("db", "list", "--path", str(db_file)), 2, "Permission denied: /some/file")


def test_sqlite_errors_are_one_line(monkeypatch, db_file):
    import sqlite3

    def locked(self, **kw):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(TuningDB, "winners", locked)
    one_error(run("db", "list", "--path", str(db_file)), 1, "database error: database is locked",
              "check that --path (or TILETUNE_DB) names a tiletune tuning database")


# ---------------------------------------------------------------------------------------- databases


@pytest.mark.parametrize("command", [["db", "list"], ["db", "stats"], ["db", "clear", "--yes"]])
def test_reading_a_missing_database_neither_works_nor_creates_it(tmp_path, command):
    path = tmp_path / "missing.db"
    one_error(run(*command, "--path", str(path)), 2, f"no tuning database at {path}",
              "check --path; tuning or 'tiletune db import' creates a database")
    assert not path.exists()


def test_missing_database_named_by_the_environment(tmp_path):
    path = tmp_path / "env.db"
    one_error(run("db", "list", env={"TILETUNE_DB": str(path)}), 2, f"no tuning database at {path}",
              "check TILETUNE_DB; tuning or 'tiletune db import' creates a database")
    assert not path.exists()


def test_a_directory_as_database(tmp_path):
    one_error(run("db", "list", "--path", str(tmp_path)), 2, f"{tmp_path} is a directory, not a tuning database file",
              f"--path takes the database file itself, e.g. {tmp_path / 'tuning.db'}")


def test_a_text_file_as_database(tmp_path):
    path = tmp_path / "notdb.txt"
    path.write_text("hello, not a database\n")
    before = digest(path)
    one_error(run("db", "list", "--path", str(path)), 2,
              re.compile(rf"tuning database {re.escape(str(path))}: not an SQLite database.*"), re.compile(r".+"))
    assert digest(path) == before


def test_import_into_a_text_file_changes_nothing(tmp_path, hostile_export):
    path = tmp_path / "notdb.txt"
    path.write_text("hello, not a database\n")
    before = digest(path)
    result = run("db", "import", str(hostile_export), "--path", str(path))
    one_error(result, 2, re.compile(rf"tuning database {re.escape(str(path))}: not an SQLite database.*"),
              re.compile(r".+"))
    assert digest(path) == before


def test_import_of_a_missing_file(db_file, tmp_path):
    before = records(db_file)
    missing = tmp_path / "nope.json"
    one_error(run("db", "import", str(missing), "--path", str(db_file)), 2,
              re.compile(rf"Invalid value for '(SRC|src)': [Ff]ile '{re.escape(str(missing))}' does not exist\."),
              "run 'root db import --help'")
    assert records(db_file) == before


@pytest.mark.parametrize("text", ["{not json", '{"format": "tiletune-db", "version": 1, "sessions": [{"x": 1}]}',
                                  "\x1b[2J\x00garbage"])
def test_import_of_an_invalid_file(db_file, tmp_path, text):
    before = records(db_file)
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    result = run("db", "import", str(bad), "--path", str(db_file))
    one_error(result, 2, re.compile(rf"import file {re.escape(str(bad))}: .+"))
    assert "\x1b" not in result.output and "\x00" not in result.output
    assert records(db_file) == before


def test_export_to_a_missing_folder(db_file, tmp_path):
    before = digest(db_file)
    dest = tmp_path / "missing" / "out.json"
    one_error(run("db", "export", str(dest), "--path", str(db_file)), 2,
              f"DEST {dest}: folder {dest.parent} does not exist", "create it first, or choose another path")
    assert not dest.parent.exists() and digest(db_file) == before


def test_export_to_a_directory(db_file, tmp_path):
    one_error(run("db", "export", str(tmp_path), "--path", str(db_file)), 2,
              f"DEST {tmp_path} is a directory; give the file to write")


def test_clear_without_confirmation_deletes_nothing(db_file):
    before = records(db_file)
    result = run("db", "clear", "--path", str(db_file), input="")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-2:] == ["error: not confirmed: nothing was deleted",
                                               "hint: pass --yes to delete without the question"]
    assert records(db_file) == before


def test_control_characters_in_a_path_are_escaped(tmp_path):
    path = tmp_path / "x\x1b[2Jy.db"
    result = run("db", "list", "--path", str(path))
    one_error(result, 2, f"no tuning database at {tmp_path}/x\\x1b[2Jy.db",
              "check --path; tuning or 'tiletune db import' creates a database")
    assert "\x1b" not in result.output


# ---------------------------------------------------------------------------------------- escaping


def test_markup_and_escapes_from_an_imported_file(tmp_path, hostile_export):
    dest = tmp_path / "dest.db"
    result = run("db", "import", str(hostile_export), "--path", str(dest))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("imported 1 new session(s)")
    result = run("db", "list", "--path", str(dest))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", out)  # no raw control character reached the terminal
    assert "[/bold]x\\x1b[31m" in out  # the op name, shown literally
    assert "[link=http://evil]GPU\\x1b]0;title\\x07" in out  # the device name
    assert '"[bold red]64\\u001b[2J"' in out  # the config, as JSON
    (w,) = TuningDB(dest).winners()
    assert w.identity.name == HOSTILE  # stored as given; only the display is escaped


def test_hostile_names_in_a_list_filter(tmp_path, hostile_export):
    dest = tmp_path / "dest.db"
    assert run("db", "import", str(hostile_export), "--path", str(dest)).exit_code == 0
    result = run("db", "list", "--path", str(dest), "--name", "[/x]\x1b[5m")
    assert result.exit_code == 0
    assert "no stored winners named '[/x]\\x1b[5m'" in result.stdout and "\x1b" not in result.stdout


@pytest.mark.parametrize(("raw", "shown"), [
    ("plain", "plain"),
    ("\x1b[31mred", "\\x1b[31mred"),
    ("a\nb\tc\rd", "a\\nb\\tc\\rd"),
    ("\x00\x7f\x9b", "\\x00\\x7f\\x9b"),
    ("evil\u202eexe.txt", "evil\\u202eexe.txt"),
    ("ünïcode ✓", "ünïcode ✓"),
])
def test_escape_controls(raw, shown):
    assert escape_controls(raw) == shown


def test_safe_escapes_markup_too():
    from rich.console import Console

    console = Console(record=True, width=200, color_system=None)
    console.print(safe(HOSTILE + " [bold]b[/bold] [link=x]l[/link]"))
    assert console.export_text().rstrip("\n") == "[/bold]x\\x1b[31m [bold]b[/bold] [link=x]l[/link]"


# ---------------------------------------------------------------------------------------- environment


def test_invalid_boolean_variable_refused(db_file):
    one_error(run("db", "list", "--path", str(db_file), env={"TILETUNE_PROGRESS": "maybe"}), 2,
              "TILETUNE_PROGRESS='maybe' is not a boolean; use 1/true/yes/on or 0/false/no/off (or empty)",
              "fix or unset the variable; 'tiletune doctor' lists them")


def test_invalid_log_variable_refused(db_file):
    one_error(run("db", "list", "--path", str(db_file), env={"TILETUNE_LOG": "verbose"}), 2,
              "TILETUNE_LOG='verbose' is not a log level; use debug/info/warning/error, 1/true/yes/on (info) or "
              "0/false/no/off (or empty)",
              "fix or unset the variable; 'tiletune doctor' lists them")


def test_invalid_number_variable_refused(db_file):
    one_error(run("db", "list", "--path", str(db_file), env={"TILETUNE_WATCHDOG_S": "20s"}), 2,
              "TILETUNE_WATCHDOG_S='20s' is not a number; expected a number > 0, e.g. 20",
              "fix or unset the variable; 'tiletune doctor' lists them")


def test_invalid_debug_variable_refused():
    one_error(run("--version", env={"TILETUNE_DEBUG": "verbose"}), 2,
              "TILETUNE_DEBUG='verbose' is not a boolean; use 1/true/yes/on or 0/false/no/off (or empty)")


def test_doctor_reports_invalid_variables(tmp_path):
    result = run("doctor", env={"TILETUNE_DB": str(tmp_path / "d.db"), "TILETUNE_PROGRESS": "sometimes"})
    assert result.exit_code == 0, result.output
    assert "TILETUNE_PROGRESS='sometimes' is not a boolean" in result.stdout


# ---------------------------------------------------------------------------------------- strategies


SPACE = tiletune.Space(TM=[32, 64, 128], occupancy=[1, 2], baseline=dict(TM=64, occupancy=1))


def _op(strategy, **kw):
    torch = pytest.importorskip("torch")
    from tiletune.devices.backends import FakeBackend

    def kernel(x, y):
        y.copy_(x * 2)

    op = tiletune.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False, progress=False,
                           backend=FakeBackend(lambda c: 100.0 - 0.2 * c.TM - 5.0 * c.occupancy, noise=0.002),
                           strategy=strategy, **kw)(lambda cfg, x, y: tiletune.Launch(kernel, (cfg.TM,), (x, y)))
    op(torch.randn(8), torch.empty(8))
    (res,) = op.results.values()
    return res


def test_registered_strategy_by_name(custom_strategy):
    assert "hostile-mine" in STRATEGY_NAMES and "hostile-mine" in strategy_names()
    res = _op("hostile-mine")
    assert res.stats["strategy"] == "hostile-mine" and custom_strategy.made == [False]
    assert res.winner == {"TM": 128, "occupancy": 2}


def test_strategy_class_and_instance(custom_strategy):
    res = _op(custom_strategy)
    assert res.stats["strategy"] == "hostile-mine"
    template = custom_strategy(SPACE, None, 0, reverse=True)
    res = _op(template, budget=tiletune.Budget(max_evals=2))
    assert custom_strategy.made == [False, True, True]  # the class, the template, a fresh copy with its options
    assert [m.config for m in res.measurements] == [{"TM": 64, "occupancy": 1}, {"TM": 128, "occupancy": 2}]
    assert template.history == []  # the template itself never searches


def test_unregistered_strategy_class_is_named_after_itself():
    class Backwards(Strategy):
        def _propose(self, n):
            return self._unseen()[::-1][:n]

    assert _op(Backwards).stats["strategy"] == "Backwards"
    assert "Backwards" not in STRATEGY_NAMES


def test_unknown_strategy_lists_the_registered_names(custom_strategy):
    from tiletune.space.strategies import StrategyError

    names = ", ".join(strategy_names())
    assert "hostile-mine" in names
    with pytest.raises(StrategyError) as err:
        tiletune.autotune(SPACE, strategy="annealing")
    assert str(err.value) == (f"unknown strategy 'annealing'; registered strategies: {names} "
                              "(or a Strategy subclass or instance, or 'package.module:Name')")
    assert isinstance(err.value, ValueError) and isinstance(err.value, tiletune.TiletuneError)


@pytest.mark.parametrize("bad", [42, object(), Strategy, dict])
def test_things_that_are_not_strategies_are_refused(bad):
    from tiletune.space.strategies import StrategyError

    with pytest.raises(StrategyError, match="strategy must be a registered name, a Strategy subclass or a "
                                            "Strategy instance"):
        tiletune.autotune(SPACE, strategy=bad)


def test_register_refuses_a_taken_name_and_non_strategies(custom_strategy):
    class Other(Strategy):
        def _propose(self, n):
            return self._unseen()[:n]

    with pytest.raises(ValueError, match="strategy name 'random' is already registered to "
                                         "tiletune.space.strategies.simple.RandomStrategy"):
        register("random")(Other)
    with pytest.raises(TypeError, match="decorates a tiletune Strategy subclass"):
        register("not-a-class")(dict)
    with pytest.raises(ValueError, match="strategy name must be a non-empty string"):
        register("a:b")
    assert STRATEGIES["random"].__name__ == "RandomStrategy"


def test_cli_takes_a_strategy_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "hostile_plugin.py").write_text(textwrap.dedent("""
        from tiletune.space.strategies import Strategy

        class Backwards(Strategy):
            def _propose(self, n):
                return self._unseen()[::-1][:n]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        result = run("strategies", str(RMSNORM_REC), "-s", "hostile_plugin:Backwards", "--seeds", "2")
        assert result.exit_code == 0, result.output
        assert "hostile_plugin:Backwards" in result.stdout
        s = make_strategy("hostile_plugin:Backwards", SPACE, None, 0)
        assert type(s).__name__ == "Backwards"
    finally:
        sys.modules.pop("hostile_plugin", None)
    one_error(run("strategies", str(RMSNORM_REC), "-s", "hostile_plugin:Nope"), 2,
              "unknown strategy 'hostile_plugin:Nope': 'hostile_plugin' has no 'Nope'")
    sys.modules.pop("hostile_plugin", None)


def test_strategy_names_is_a_live_view(custom_strategy):
    assert tuple(STRATEGY_NAMES)[:4] == ("exhaustive", "random", "evolutionary", "model")
    assert STRATEGY_NAMES[-1] == "hostile-mine" and len(STRATEGY_NAMES) == len(STRATEGIES)
    STRATEGIES.pop("hostile-mine")
    assert "hostile-mine" not in STRATEGY_NAMES
    register("hostile-mine")(custom_strategy)


def test_recording_import_keeps_the_date_and_never_overwrites_its_source(tmp_path):
    import gzip
    import json

    src = Path(__file__).parent / "data" / "synthetic_gemm.json.gz"
    recorded = json.loads(gzip.open(src).read())["recorded"]
    dest = tmp_path / "copy.json"
    r = run("recording", "import", str(src), str(dest))
    assert r.exit_code == 0, r.output
    assert json.loads(dest.read_text())["recorded"] == recorded
    # the destination is the source, through a link: refused, the source unchanged
    link = tmp_path / "link.json"
    link.symlink_to(dest)
    before = digest(dest)
    r = run("recording", "import", str(dest), str(link))
    one_error(r, 2, re.compile(r"cannot write .*link\.json: it is the input file .*copy\.json \(choose another destination\)"))
    assert digest(dest) == before
