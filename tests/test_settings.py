"""``tiletune.settings``: every TILETUNE_* variable, one boolean rule, clear errors, read at call time."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from tiletune import settings
from tiletune.engine import progress

SRC = Path(__file__).resolve().parents[1] / "src" / "tiletune"
BOOL_ERROR = "{name}={raw!r} is not a boolean; use 1/true/yes/on or 0/false/no/off (or empty)"
LOG_ERROR = ("{name}={raw!r} is not a log level; use debug/info/warning/error, 1/true/yes/on (info) or "
             "0/false/no/off (or empty)")
BOOLEANS = {
    "TILETUNE_LOG": (settings.log_enabled, False),
    "TILETUNE_PROGRESS": (settings.progress_enabled, True),
    "TILETUNE_DISABLE": (settings.disabled, False),
    "TILETUNE_PREWARM": (settings.prewarm, True),
    "TILETUNE_WORKER_PRESTART": (settings.worker_prestart, True),
    "TILETUNE_WORKER_TRACE": (settings.worker_trace, False),
    "TILETUNE_DEBUG": (settings.debug, False),
    "TILETUNE_IN_WORKER": (settings.in_worker, False),
}
NUMBERS = {
    "TILETUNE_WORKER_START_TIMEOUT": (settings.worker_start_timeout_s, 180.0),
    "TILETUNE_WATCHDOG_S": (settings.watchdog_s, 20.0),
    "TILETUNE_WATCHDOG_FACTOR": (settings.watchdog_factor, 20.0),
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in settings.VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("name", sorted(BOOLEANS))
def test_booleans_default_when_unset(name):
    fn, default = BOOLEANS[name]
    assert fn() is default


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", " yes ", "On", "\tYES\n"])
@pytest.mark.parametrize("name", sorted(BOOLEANS))
def test_booleans_true_words(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    assert BOOLEANS[name][0]() is True


@pytest.mark.parametrize("raw", ["0", "false", "False", " no ", "OFF", "", "   "])
@pytest.mark.parametrize("name", sorted(BOOLEANS))
def test_booleans_false_words(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    assert BOOLEANS[name][0]() is False


@pytest.mark.parametrize("raw", ["maybe", "2", "y", "enable", "truee", "-1"])
@pytest.mark.parametrize("name", sorted(BOOLEANS))
def test_booleans_garbage_is_an_error(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError) as err:
        BOOLEANS[name][0]()
    expected = LOG_ERROR if name == "TILETUNE_LOG" else BOOL_ERROR  # TILETUNE_LOG also takes levels
    assert str(err.value) == expected.format(name=name, raw=raw)


@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_numbers(monkeypatch, name):
    fn, default = NUMBERS[name]
    assert fn() == default
    monkeypatch.setenv(name, " 2.5 ")
    assert fn() == 2.5
    monkeypatch.setenv(name, "")
    assert fn() == default


@pytest.mark.parametrize("raw", ["abc", "20s", "1,5", "0x10"])
@pytest.mark.parametrize("name", sorted(NUMBERS))
def test_numbers_garbage_is_an_error(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError) as err:
        NUMBERS[name][0]()
    assert str(err.value) == f"{name}={raw!r} is not a number; expected a number > 0, e.g. {NUMBERS[name][1]:g}"


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "-inf"])
def test_numbers_out_of_range_are_an_error(monkeypatch, raw):
    monkeypatch.setenv("TILETUNE_WATCHDOG_S", raw)
    with pytest.raises(ValueError) as err:
        settings.watchdog_s()
    assert str(err.value) == f"TILETUNE_WATCHDOG_S={raw!r} is out of range; expected a finite number > 0, e.g. 20"


def test_paths(monkeypatch):
    assert settings.db_path() is None and settings.cache_dir() is None
    monkeypatch.setenv("TILETUNE_DB", "  ")
    monkeypatch.setenv("TILETUNE_CACHE_DIR", "")
    assert settings.db_path() is None and settings.cache_dir() is None
    monkeypatch.setenv("TILETUNE_DB", "/tmp/x.db")
    monkeypatch.setenv("TILETUNE_CACHE_DIR", "~/c")
    assert settings.db_path() == "/tmp/x.db" and settings.cache_dir() == "~/c"


@pytest.mark.parametrize(("raw", "mode"), [("process", "process"), (" NONE ", "none"), ("off", "none"), ("0", "none"),
                                           ("false", "none"), ("1", "process"), ("on", "process"), ("", None)])
def test_isolation(monkeypatch, raw, mode):
    monkeypatch.setenv("TILETUNE_ISOLATION", raw)
    assert settings.isolation() == mode


def test_isolation_garbage(monkeypatch):
    from tiletune.op.tuned_op import _resolve_isolation

    monkeypatch.setenv("TILETUNE_ISOLATION", "thread")
    msg = ("TILETUNE_ISOLATION='thread': choose one of process, none "
           "(or 1/true/yes/on for process, 0/false/no/off for none)")
    with pytest.raises(ValueError, match=re.escape(msg)):
        settings.isolation()
    with pytest.raises(ValueError, match=re.escape(msg)):
        _resolve_isolation(None, None)
    monkeypatch.setenv("TILETUNE_ISOLATION", "off")
    assert _resolve_isolation(None, None) == "none"


# ---------------------------------------------------------------------------------------- readers


@pytest.fixture
def fresh_logging(monkeypatch):
    log = logging.getLogger("tiletune")
    monkeypatch.setattr(progress, "_log_configured", False)
    handlers, level = list(log.handlers), log.level
    yield log
    log.handlers[:] = handlers
    log.setLevel(level)


@pytest.mark.parametrize("raw", ["false", "0", "no", "", "OFF", " False "])
def test_log_false_keeps_logging_off(monkeypatch, fresh_logging, raw):
    before = list(fresh_logging.handlers)
    monkeypatch.setenv("TILETUNE_LOG", raw)
    progress.configure_logging_from_env()
    assert fresh_logging.handlers == before and progress._log_configured is False


def test_log_true_turns_logging_on(monkeypatch, fresh_logging):
    fresh_logging.handlers[:] = []
    monkeypatch.setenv("TILETUNE_LOG", "yes")
    progress.configure_logging_from_env()
    assert progress._log_configured is True and fresh_logging.level == logging.INFO
    assert len(fresh_logging.handlers) == 1


def test_log_garbage_is_an_error(monkeypatch, fresh_logging):
    monkeypatch.setenv("TILETUNE_LOG", "maybe")
    with pytest.raises(ValueError, match=re.escape(LOG_ERROR.format(name="TILETUNE_LOG", raw="maybe"))):
        progress.configure_logging_from_env()
    assert settings.check_all() == [LOG_ERROR.format(name="TILETUNE_LOG", raw="maybe")]


@pytest.mark.parametrize("raw, level", [("debug", logging.DEBUG), ("INFO", logging.INFO), (" Warning ", logging.WARNING),
                                        ("error", logging.ERROR), ("1", logging.INFO), ("on", logging.INFO)])
def test_log_levels(monkeypatch, fresh_logging, raw, level):
    fresh_logging.handlers[:] = []
    monkeypatch.setenv("TILETUNE_LOG", raw)
    assert settings.log_level() == level and settings.log_enabled() is True
    progress.configure_logging_from_env()  # TILETUNE_LOG=info used to raise ValueError at the first miss
    assert progress._log_configured is True and fresh_logging.level == level
    assert len(fresh_logging.handlers) == 1
    assert settings.check_all() == []


@pytest.mark.parametrize("raw", ["off", "", "0"])
def test_log_level_off(monkeypatch, raw):
    monkeypatch.setenv("TILETUNE_LOG", raw)
    assert settings.log_level() is None and settings.log_enabled() is False


def test_progress_is_read_at_call_time(monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    monkeypatch.setenv("TILETUNE_PROGRESS", "off")
    assert progress._interactive() is False
    monkeypatch.setenv("TILETUNE_PROGRESS", "sometimes")
    with pytest.raises(ValueError, match="TILETUNE_PROGRESS='sometimes' is not a boolean"):
        progress._interactive()


def test_watchdogs_are_read_when_options_are_made(monkeypatch):
    from tiletune.devices.workers.session import IsolationOptions

    assert (IsolationOptions().first_watchdog_s, IsolationOptions().watchdog_factor) == (20.0, 20.0)
    monkeypatch.setenv("TILETUNE_WATCHDOG_S", "3")
    monkeypatch.setenv("TILETUNE_WATCHDOG_FACTOR", "7.5")
    assert (IsolationOptions().first_watchdog_s, IsolationOptions().watchdog_factor) == (3.0, 7.5)
    monkeypatch.setenv("TILETUNE_WATCHDOG_FACTOR", "lots")
    with pytest.raises(ValueError, match="TILETUNE_WATCHDOG_FACTOR='lots' is not a number"):
        IsolationOptions()


def test_worker_switches_are_read_at_call_time(monkeypatch):
    from tiletune.devices.workers import client

    assert client.in_worker() is False and client._start_timeout_s() == 180.0
    monkeypatch.setenv("TILETUNE_IN_WORKER", "1")
    monkeypatch.setenv("TILETUNE_WORKER_START_TIMEOUT", "9")
    assert client.in_worker() is True and client._start_timeout_s() == 9.0
    monkeypatch.setattr(client, "START_TIMEOUT_S", 1.0)  # an explicit override wins
    assert client._start_timeout_s() == 1.0


def test_disable_switch(monkeypatch):
    torch = pytest.importorskip("torch")
    import tiletune as tt
    from tiletune.devices.backends import FakeBackend

    space = tt.Space(TM=[32, 64], baseline=dict(TM=64))

    def kernel(x, y):
        y.copy_(x)

    def make():
        return tt.autotune(space, db=False, progress=False, backend=FakeBackend(lambda c: 1.0 + c.TM),
                           writes=["y"])(lambda cfg, x, y: tt.Launch(kernel, (cfg.TM,), (x, y)))

    monkeypatch.setenv("TILETUNE_DISABLE", "Yes")
    op = make()
    op(torch.ones(2), torch.empty(2))
    assert op.tuning_count == 0 and op.config_for(torch.ones(2), torch.empty(2)).TM == 64
    monkeypatch.setenv("TILETUNE_DISABLE", "perhaps")
    with pytest.raises(ValueError, match="TILETUNE_DISABLE='perhaps' is not a boolean"):
        make()(torch.ones(3), torch.empty(3))
    monkeypatch.setenv("TILETUNE_DISABLE", "no")
    op = make()
    op(torch.ones(2), torch.empty(2))
    assert op.tuning_count == 1


def test_check_all_lists_every_invalid_variable(monkeypatch):
    assert settings.check_all() == []
    monkeypatch.setenv("TILETUNE_PREWARM", "nah")
    monkeypatch.setenv("TILETUNE_WATCHDOG_S", "x")
    assert settings.check_all() == [
        BOOL_ERROR.format(name="TILETUNE_PREWARM", raw="nah"),
        "TILETUNE_WATCHDOG_S='x' is not a number; expected a number > 0, e.g. 20",
    ]


# ---------------------------------------------------------------------------------------- one place


def test_every_variable_is_documented():
    doc = settings.__doc__ or ""
    for name in settings.VARIABLES:
        assert re.search(rf"^{name}\s+\S+\s+\S+\s+\S", doc, re.M), f"{name} has no row in the settings table"
    used = set()
    for path in SRC.rglob("*.py"):
        used.update(re.findall(r"TILETUNE_[A-Z_]+[A-Z]", path.read_text()))
    assert used - set(settings.VARIABLES) == set()


def test_only_the_settings_module_reads_tiletune_variables():
    # worker_main.py and zygote_main.py bootstrap a worker (the zygote) from the environment (address, key,
    # sys.path, modules to skip)
    allowed = {"settings.py", "worker_main.py", "zygote_main.py"}
    read = re.compile(r"""environ\.get\(\s*["']TILETUNE_|getenv\(\s*["']TILETUNE_|"""
                      r"""environ\[\s*["']TILETUNE_[A-Z_]+["']\s*\](?!\s*=[^=])""")
    readers = [f"{path.name}: {line.strip()}" for path in SRC.rglob("*.py") if path.name not in allowed
               for line in path.read_text().splitlines() if read.search(line)]
    assert readers == []


def test_compile_workers_is_a_count(monkeypatch):
    assert settings.compile_workers() is None
    monkeypatch.setenv("TILETUNE_COMPILE_WORKERS", " 8 ")
    assert settings.compile_workers() == 8
    from tiletune.devices.compile_pool import CompilePool

    assert CompilePool().workers == 8 and CompilePool(3).workers == 3
    for raw in ("0", "-2", "2.5", "many"):
        monkeypatch.setenv("TILETUNE_COMPILE_WORKERS", raw)
        with pytest.raises(ValueError, match=r"TILETUNE_COMPILE_WORKERS=.* is not a count; expected an integer >= 1"):
            settings.compile_workers()
    monkeypatch.setenv("TILETUNE_COMPILE_WORKERS", "")
    assert settings.compile_workers() is None


def test_timer_backlog_is_off_by_default_and_validated(monkeypatch):
    monkeypatch.delenv("TILETUNE_TIMER_BACKLOG_US", raising=False)
    assert settings.timer_backlog_us() == 0.0
    for off in ("", " ", "0", "0.0"):
        monkeypatch.setenv("TILETUNE_TIMER_BACKLOG_US", off)
        assert settings.timer_backlog_us() == 0.0
    monkeypatch.setenv("TILETUNE_TIMER_BACKLOG_US", " 40 ")
    assert settings.timer_backlog_us() == 40.0
    for bad in ("-5", "fast", "inf"):
        monkeypatch.setenv("TILETUNE_TIMER_BACKLOG_US", bad)
        with pytest.raises(ValueError, match="TILETUNE_TIMER_BACKLOG_US="):
            settings.timer_backlog_us()


def test_nearest_variants_is_a_number_zero_included(monkeypatch):
    monkeypatch.delenv("TILETUNE_NEAREST_VARIANTS", raising=False)
    assert settings.nearest_variants() == 8
    for raw, want in (("0", 0), (" 3 ", 3), ("", 8)):
        monkeypatch.setenv("TILETUNE_NEAREST_VARIANTS", raw)
        assert settings.nearest_variants() == want
    for bad in ("-1", "2.5", "all"):
        monkeypatch.setenv("TILETUNE_NEAREST_VARIANTS", bad)
        with pytest.raises(ValueError, match=r"TILETUNE_NEAREST_VARIANTS=.* is not a number; expected an integer >= 0"):
            settings.nearest_variants()
        assert any("TILETUNE_NEAREST_VARIANTS" in p for p in settings.check_all())
