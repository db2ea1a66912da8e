"""Every ``TILETUNE_*`` environment variable, read in one place, at call time, with one rule.

Every reader in tiletune goes through the accessors below (``settings.log_enabled()``, ...), which
read ``os.environ`` each time they are called: setting a variable in a running process (or in a
test) takes effect at the next read.

**Booleans** follow one rule, case-insensitive, surrounding spaces ignored: true is ``1``, ``true``,
``yes``, ``on``; false is ``0``, ``false``, ``no``, ``off`` or the empty string; an unset variable
takes its default. Anything else raises :class:`ValueError` naming the variable and the accepted
values (``TILETUNE_LOG=maybe`` is an error, not "on" and not "off").

**Numbers** are decimal seconds or factors, finite and > 0; anything else raises
:class:`ValueError` naming the variable. **Counts** are decimal integers >= 1. An empty value counts
as unset.

===============================  ========  =========  ====================================================
Variable                         Type      Default    Meaning
===============================  ========  =========  ====================================================
TILETUNE_DB                      path      unset      The tuning database file (wins over
                                                      TILETUNE_CACHE_DIR).
TILETUNE_CACHE_DIR               path      unset      Folder of the default database (<dir>/tuning.db);
                                                      unset: $XDG_CACHE_HOME/tiletune or
                                                      ~/.cache/tiletune.
TILETUNE_LOG                     level     false      Log a line per candidate and a summary of each
                                                      tuning to stderr (the ``tiletune`` logger): a
                                                      boolean (true = ``info``) or a level, ``debug``,
                                                      ``info``, ``warning`` or ``error``.
TILETUNE_PROGRESS                bool      true       Progress bar while tuning (interactive terminals
                                                      only).
TILETUNE_DISABLE                 bool      false      Never tune: every op launches its baseline config
                                                      (or its first valid one).
TILETUNE_ISOLATION               choice    unset      Default ``isolation=``: ``process`` (also
                                                      1/true/yes/on) or ``none`` (also 0/false/no/off).
                                                      Unset: process for the live cuTile backend, none for
                                                      a backend object.
TILETUNE_PREWARM                 bool      true       Import cuTile's compiler in a background thread when
                                                      a tuned op is defined (not for library ops, made on
                                                      their first call).
TILETUNE_WORKER_PRESTART         bool      true       Start the GPU worker when the first isolated op is
                                                      defined (false: at its first tuning).
TILETUNE_WORKER_ZYGOTE           choice    auto       ``auto``, ``on`` or ``off`` (also the boolean words):
                                                      a process started on ``import tiletune`` that
                                                      imports torch and cuda.tile and forks tuning
                                                      workers, so a worker (first, spare or replacement)
                                                      skips those imports. auto: on where an NVIDIA GPU is
                                                      visible.
TILETUNE_ZYGOTE_START            choice    fork       How the zygote starts: ``fork`` (a fork of the
                                                      importing process where that is safe: one Python
                                                      thread, CUDA untouched, at most 1.5 GiB of private
                                                      memory; else a fresh interpreter) or ``spawn``
                                                      (always a fresh interpreter).
TILETUNE_ZYGOTE_IMPORTS          text      unset      Comma-separated packages the zygote imports beside
                                                      torch and cuda.tile (packages that do not touch the
                                                      GPU when imported; one that does is skipped).
TILETUNE_SHIP_KERNELS            choice    value      How a cuTile kernel that a plan shipped by value (a
                                                      script's, a closure's) names reaches a tuning worker:
                                                      ``value`` (its function and the helpers of its module
                                                      that it calls; its package is not imported there) or
                                                      ``reference`` (the worker imports its module).
TILETUNE_WORKER_START_TIMEOUT    seconds   180        How long a new worker may take to start (torch,
                                                      cuda.tile, CUDA context).
TILETUNE_WATCHDOG_S              seconds   20         Deadline of a worker request before anything of the
                                                      session was timed.
TILETUNE_WATCHDOG_FACTOR         factor    20         Afterwards a request may take max(0.5 s, this factor
                                                      x the expected time of its launches); a check's
                                                      kernel max(0.4 s, this factor x the slowest
                                                      median) from its launch.
TILETUNE_WORKER_TRACE            bool      false      Workers trace every request to their log, and the
                                                      log folder is kept.
TILETUNE_DEBUG                   bool      false      The ``tiletune`` command shows full tracebacks (same
                                                      as ``--debug``).
TILETUNE_TABLES                  bool      true       Consult tuning tables (the user's, then those shipped
                                                      with tiletune) for keys the database does not hold.
TILETUNE_BACKGROUND              bool      false      Tune keys answered provisionally (nearest neighbour,
                                                      default config) in a background thread.
TILETUNE_FALLBACK                bool      true       While a served config of an op with a fallback (the
                                                      library ops) compiles in the background, run the
                                                      op's torch fallback instead of waiting for it.
TILETUNE_ON_MISS                 choice    unset      tune, nearest or default: what every op does with a
                                                      key nothing stored answers (unset: each op's own).
TILETUNE_PINS                    path      unset      A pins file (tiletune.resolve.pins): fixed configs per op
                                                      and key, used before the database; never tuned.
TILETUNE_COMPILE_WORKERS         count     unset      Compile (``tileiras``) processes per tuning session;
                                                      unset: every core this process may use. A campaign
                                                      sets it to split the cores between its GPU workers.
TILETUNE_FRONTEND_PROCS          count     unset      Forked processes that run cuTile's front end when
                                                      several configs compile at once in a tuning worker
                                                      (1: in the worker); unset: as many as compile
                                                      processes.
TILETUNE_COMPILE_TRACE           path      unset      A file to which compile pools append one JSON line per
                                                      compiled config: when its front end and its
                                                      assembler ran (diagnostics).
TILETUNE_COMPILE_ORDER           choice    largest    Which configs of a session compile first (after its baseline): ``largest``
                                                      (the biggest tiles first, and the biggest bytecode
                                                      first among those waiting for an assembler, so the
                                                      slowest compiles do not start last) or ``given``
                                                      (the space's order).
TILETUNE_TIMER_BACKLOG_US        us        0          GPU spin queued before each tuning sample so a busy
                                                      host cannot leak into short kernels' samples (0:
                                                      off; the L2 flush alone covers the launch).
TILETUNE_FRONTEND_CACHE          bool      true       Keep each compiled kernel's cubin keyed by its code,
                                                      hints and launch signature (next to cuTile's disk
                                                      cache) so a fresh process skips cuTile's front end.
TILETUNE_COMPILE_FUSE            bool      true       Under ``torch.compile``, the memory-bound library ops
                                                      (norms, gated activations, RoPE) become torch
                                                      expressions that Inductor fuses with their
                                                      neighbours; false: every library op is its custom op.
                                                      Read when a graph is traced.
TILETUNE_NEAREST_RACE            count     3          Configs of the nearest neighbours a new shape races
                                                      (with the default config) on its own arguments
                                                      before one is served; 1: the nearest, checked only.
TILETUNE_NEAREST_VARIANTS        number    8          Configs of the space next to the nearest neighbour's
                                                      (one parameter changed first) that join that race
                                                      when a compile cache holds them (the library's ops
                                                      only); 0: none.
TILETUNE_IN_WORKER               bool      false      Internal: set to 1 inside tuning worker processes.
TILETUNE_WORKER_ADDRESS          text      internal   Internal: the socket a worker connects to.
TILETUNE_WORKER_AUTHKEY          text      internal   Internal: the worker's connection key (hex).
TILETUNE_WORKER_SYSPATH          JSON      internal   Internal: the caller's sys.path, for a worker.
TILETUNE_ZYGOTE_SKIP             text      internal   Internal: modules a new zygote does not import.
TILETUNE_WORKER_PRELOAD          JSON      internal   Internal: modules a new worker imports first.
===============================  ========  =========  ====================================================

:func:`check_all` reads every documented variable and returns the problems (the command line
refuses to start with an invalid one).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

__all__ = [
    "TRUE_WORDS",
    "FALSE_WORDS",
    "VARIABLES",
    "Variable",
    "flag",
    "seconds",
    "count",
    "text",
    "path",
    "check_all",
    "db_path",
    "cache_dir",
    "log_enabled",
    "log_level",
    "LOG_LEVELS",
    "progress_enabled",
    "disabled",
    "isolation",
    "prewarm",
    "worker_prestart",
    "worker_zygote",
    "zygote_start",
    "ship_kernels",
    "worker_start_timeout_s",
    "tables_enabled",
    "background",
    "on_miss",
    "pins_path",
    "compile_workers",
    "timer_backlog_us",
    "watchdog_s",
    "watchdog_factor",
    "worker_trace",
    "debug",
    "in_worker",
    "frontend_cache",
    "nearest_race",
    "nearest_variants",
    "compile_fuse",
]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")

_ACCEPTED_BOOL = "1/true/yes/on or 0/false/no/off (or empty)"


@dataclass(frozen=True)
class Variable:
    """One documented environment variable."""

    name: str
    type: str  # "bool", "level", "seconds", "factor", "count", "number" (>= 0), "path", "choice", "text"
    default: object
    meaning: str


VARIABLES: dict[str, Variable] = {
    v.name: v
    for v in (
        Variable("TILETUNE_DB", "path", None, "the tuning database file"),
        Variable("TILETUNE_CACHE_DIR", "path", None, "folder of the default tuning database"),
        Variable("TILETUNE_LOG", "level", False, "log tuning to stderr (a boolean or debug/info/warning/error)"),
        Variable("TILETUNE_PROGRESS", "bool", True, "progress bar on interactive terminals"),
        Variable("TILETUNE_DISABLE", "bool", False, "never tune: launch the baseline config"),
        Variable("TILETUNE_ISOLATION", "choice", None, "default isolation of the live backend"),
        Variable("TILETUNE_PREWARM", "bool", True, "import cuda.tile in the background"),
        Variable("TILETUNE_WORKER_PRESTART", "bool", True, "start the worker when an op is defined"),
        Variable("TILETUNE_WORKER_ZYGOTE", "choice", "auto", "fork workers from a process with their imports done"),
        Variable("TILETUNE_ZYGOTE_START", "choice", "fork", "the zygote forks from the importing process or spawns"),
        Variable("TILETUNE_SHIP_KERNELS", "choice", "value", "cuTile kernels travel to workers by value or reference"),
        Variable("TILETUNE_WORKER_START_TIMEOUT", "seconds", 180.0, "worker start-up deadline"),
        Variable("TILETUNE_WATCHDOG_S", "seconds", 20.0, "first worker request deadline"),
        Variable("TILETUNE_WATCHDOG_FACTOR", "factor", 20.0, "worker request deadline factor"),
        Variable("TILETUNE_WORKER_TRACE", "bool", False, "trace worker requests, keep worker logs"),
        Variable("TILETUNE_DEBUG", "bool", False, "full tracebacks from the command line"),
        Variable("TILETUNE_TABLES", "bool", True, "consult the user's and the shipped tuning tables"),
        Variable("TILETUNE_BACKGROUND", "bool", False, "tune provisionally answered keys in a background thread"),
        Variable("TILETUNE_FALLBACK", "bool", True, "run an op's torch fallback while its served config compiles"),
        Variable("TILETUNE_ON_MISS", "choice", None, "what every op does with a key nothing stored answers"),
        Variable("TILETUNE_PINS", "path", None, "pins file: fixed configs per op and key (tiletune.resolve.pins)"),
        Variable("TILETUNE_COMPILE_WORKERS", "count", None, "compile processes per tuning session"),
        Variable("TILETUNE_FRONTEND_PROCS", "count", None, "forked processes for cuTile's front end"),
        Variable("TILETUNE_COMPILE_TRACE", "path", None, "JSON lines of each compile's front end and assembler times"),
        Variable("TILETUNE_COMPILE_ORDER", "choice", "largest", "Compile the biggest tiles first, or in the space's order"),
        Variable("TILETUNE_TIMER_BACKLOG_US", "microseconds", 0.0, "GPU spin before each tuning sample (0: off)"),
        Variable("TILETUNE_FRONTEND_CACHE", "bool", True, "cubins keyed by kernel code, hints and signature"),
        Variable("TILETUNE_NEAREST_RACE", "count", 3, "neighbour configs raced on a new shape (1: the nearest only)"),
        Variable("TILETUNE_NEAREST_VARIANTS", "number", 8, "the nearest config's variants raced when compiled (0: none)"),
        Variable("TILETUNE_COMPILE_FUSE", "bool", True, "under torch.compile, norms, activations and RoPE fuse in Inductor"),
        Variable("TILETUNE_IN_WORKER", "bool", False, "internal: inside a tuning worker"),
        Variable("TILETUNE_WORKER_ADDRESS", "text", None, "internal: worker socket"),
        Variable("TILETUNE_WORKER_AUTHKEY", "text", None, "internal: worker connection key"),
        Variable("TILETUNE_WORKER_SYSPATH", "text", None, "internal: caller's sys.path (JSON)"),
        Variable("TILETUNE_ZYGOTE_SKIP", "text", None, "internal: modules the zygote does not import"),
        Variable("TILETUNE_WORKER_PRELOAD", "text", None, "internal: modules a new worker imports first (JSON)"),
        Variable("TILETUNE_ZYGOTE_IMPORTS", "text", None, "modules the zygote imports beside torch and cuda.tile"),
    )
}


# ---------------------------------------------------------------------------------- the rules


def parse_bool(name: str, raw: str) -> bool:
    """``raw`` (the value of ``name``) as a boolean under the one rule; ValueError otherwise."""
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean; use {_ACCEPTED_BOOL}")


def flag(name: str, default: bool = False) -> bool:
    """The boolean variable ``name`` (``default`` when unset)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    return parse_bool(name, raw)


def seconds(name: str, default: float) -> float:
    """The number variable ``name``: finite and > 0 (``default`` when unset or empty)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number; expected a number > 0, e.g. {default:g}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={raw!r} is out of range; expected a finite number > 0, e.g. {default:g}")
    return value


def count(name: str) -> int | None:
    """The count variable ``name``: a decimal integer >= 1 (None when unset or empty)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    word = raw.strip()
    if not word.isdigit() or int(word) < 1:
        raise ValueError(f"{name}={raw!r} is not a count; expected an integer >= 1, e.g. 8")
    return int(word)


def text(name: str) -> str | None:
    """The text variable ``name``, surrounding spaces removed; None when unset or empty."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    return raw.strip()


def choice(name: str, choices: tuple[str, ...]) -> str:
    """The choice variable ``name``, lower-cased, one of ``choices`` (the first when unset); ValueError
    naming the variable and its choices otherwise."""
    raw = text(name)
    if raw is None:
        return choices[0]
    word = raw.lower()
    if word not in choices:
        raise ValueError(f"{name}={raw!r}: choose one of {', '.join(choices)} (or unset it)")
    return word


def path(name: str) -> str | None:
    """The path variable ``name`` (as :func:`text`); ValueError when its ``~`` or ``~user`` names no
    home directory (the path could not be expanded)."""
    value = text(name)
    if value is not None and value.startswith("~") and os.path.expanduser(value).startswith("~"):
        head = value.split("/", 1)[0].split(os.sep, 1)[0]
        raise ValueError(f"{name}={os.environ[name]!r}: cannot expand {head!r}, no such user or home directory; "
                         "give the full path")
    return value


# ---------------------------------------------------------------------------------- accessors


def db_path() -> str | None:
    """``TILETUNE_DB``: the tuning database file, or None (unset or empty)."""
    return path("TILETUNE_DB")


def cache_dir() -> str | None:
    """``TILETUNE_CACHE_DIR``: folder of the default database, or None (unset or empty)."""
    return path("TILETUNE_CACHE_DIR")


LOG_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}  # the values of logging.DEBUG, ...


def log_level() -> int | None:
    """``TILETUNE_LOG`` as a :mod:`logging` level, or None for off (the default).

    A level name (``debug``, ``info``, ``warning``, ``error``; case-insensitive) or a boolean: true
    (``1/true/yes/on``) is ``info``, false (``0/false/no/off``, empty) is off. Anything else raises
    :class:`ValueError` naming the variable and the accepted values.
    """
    raw = os.environ.get("TILETUNE_LOG")
    if raw is None:
        return None
    word = raw.strip().lower()
    if word in LOG_LEVELS:
        return LOG_LEVELS[word]
    if word in TRUE_WORDS:
        return LOG_LEVELS["info"]
    if word in FALSE_WORDS:
        return None
    raise ValueError(f"TILETUNE_LOG={raw!r} is not a log level; use debug/info/warning/error, "
                     f"1/true/yes/on (info) or 0/false/no/off (or empty)")


def log_enabled() -> bool:
    """``TILETUNE_LOG`` (default false): true for a true boolean or any level (:func:`log_level`)."""
    return log_level() is not None


def progress_enabled() -> bool:
    """``TILETUNE_PROGRESS`` (default true; the bar still needs an interactive terminal)."""
    return flag("TILETUNE_PROGRESS", True)


def disabled() -> bool:
    """``TILETUNE_DISABLE`` (default false): launch baselines, never tune."""
    return flag("TILETUNE_DISABLE", False)


ISOLATION_MODES = ("process", "none")


def isolation() -> str | None:
    """``TILETUNE_ISOLATION``: ``"process"``, ``"none"`` or None (unset or empty).

    ``1/true/yes/on`` mean ``process`` and ``0/false/no/off`` mean ``none``.
    """
    raw = os.environ.get("TILETUNE_ISOLATION")
    if raw is None or not raw.strip():
        return None
    word = raw.strip().lower()
    if word in ISOLATION_MODES:
        return word
    if word in TRUE_WORDS:
        return "process"
    if word in FALSE_WORDS:
        return "none"
    raise ValueError(f"TILETUNE_ISOLATION={raw!r}: choose one of process, none "
                     "(or 1/true/yes/on for process, 0/false/no/off for none)")


def prewarm() -> bool:
    """``TILETUNE_PREWARM`` (default true)."""
    return flag("TILETUNE_PREWARM", True)


def worker_prestart() -> bool:
    """``TILETUNE_WORKER_PRESTART`` (default true)."""
    return flag("TILETUNE_WORKER_PRESTART", True)


def worker_zygote() -> str:
    """``TILETUNE_WORKER_ZYGOTE``: ``auto`` (default), ``on`` (also 1/true/yes) or ``off`` (also 0/false/no)."""
    raw = text("TILETUNE_WORKER_ZYGOTE")
    if raw is None:
        return "auto"
    word = raw.strip().lower()
    if word == "auto":
        return "auto"
    if word in TRUE_WORDS:
        return "on"
    if word in FALSE_WORDS:
        return "off"
    raise ValueError(f"TILETUNE_WORKER_ZYGOTE={raw!r}: choose one of auto, on, off (or a boolean word)")


ZYGOTE_START_CHOICES = ("fork", "spawn")


def zygote_start() -> str:
    """``TILETUNE_ZYGOTE_START``: ``fork`` (default: the zygote is a fork of the process importing
    tiletune, where that is safe) or ``spawn`` (a fresh interpreter)."""
    return choice("TILETUNE_ZYGOTE_START", ZYGOTE_START_CHOICES)


SHIP_KERNELS_CHOICES = ("value", "reference")


def ship_kernels() -> str:
    """``TILETUNE_SHIP_KERNELS``: ``value`` (default) or ``reference``: how a cuTile kernel reached while
    shipping a plan to a worker travels (:mod:`tiletune.devices.workers.shipping`)."""
    return choice("TILETUNE_SHIP_KERNELS", SHIP_KERNELS_CHOICES)


def worker_start_timeout_s() -> float:
    """``TILETUNE_WORKER_START_TIMEOUT`` in seconds (default 180)."""
    return seconds("TILETUNE_WORKER_START_TIMEOUT", 180.0)


def watchdog_s() -> float:
    """``TILETUNE_WATCHDOG_S`` in seconds (default 20)."""
    return seconds("TILETUNE_WATCHDOG_S", 20.0)


def watchdog_factor() -> float:
    """``TILETUNE_WATCHDOG_FACTOR`` (default 20)."""
    return seconds("TILETUNE_WATCHDOG_FACTOR", 20.0)


def worker_trace() -> bool:
    """``TILETUNE_WORKER_TRACE`` (default false)."""
    return flag("TILETUNE_WORKER_TRACE", False)


def debug() -> bool:
    """``TILETUNE_DEBUG`` (default false)."""
    return flag("TILETUNE_DEBUG", False)


def tables_enabled() -> bool:
    """``TILETUNE_TABLES`` (default true)."""
    return flag("TILETUNE_TABLES", True)


def background() -> bool:
    """``TILETUNE_BACKGROUND`` (default false): tune provisionally answered keys in a background thread."""
    return flag("TILETUNE_BACKGROUND", False)


def fallback() -> bool:
    """``TILETUNE_FALLBACK`` (default true): while the config that answers a new key of an op with a
    fallback compiles in the background (nothing in a compile cache holds it), calls run the op's torch
    fallback instead of waiting for the compile."""
    return flag("TILETUNE_FALLBACK", True)


ON_MISS_CHOICES = ("tune", "nearest", "default")


def on_miss() -> str | None:
    """``TILETUNE_ON_MISS``: ``tune``, ``nearest`` or ``default`` for every op, or None (unset: each op's own)."""
    value = text("TILETUNE_ON_MISS")
    if value is None:
        return None
    value = value.strip().lower()
    if value not in ON_MISS_CHOICES:
        raise ValueError(f"TILETUNE_ON_MISS={value!r}: choose one of {', '.join(ON_MISS_CHOICES)} (or unset it)")
    return value


def pins_path() -> str | None:
    """``TILETUNE_PINS``: the pins file (:mod:`tiletune.resolve.pins`), or None (unset or empty)."""
    return path("TILETUNE_PINS")


def compile_workers() -> int | None:
    """``TILETUNE_COMPILE_WORKERS``: compile processes per tuning session, or None (every core)."""
    return count("TILETUNE_COMPILE_WORKERS")


COMPILE_ORDER_CHOICES = ("largest", "given")


def compile_order() -> str:
    """``TILETUNE_COMPILE_ORDER``: ``largest`` (default: longest compiles first) or ``given`` (the jobs' order)."""
    return choice("TILETUNE_COMPILE_ORDER", COMPILE_ORDER_CHOICES)


def compile_trace() -> str | None:
    """``TILETUNE_COMPILE_TRACE``: a file to which each compile pool appends one JSON line per compiled job
    (the process, when its front end and its assembler ran, and the bytecode's size), or None (unset)."""
    return path("TILETUNE_COMPILE_TRACE")


def frontend_procs() -> int | None:
    """``TILETUNE_FRONTEND_PROCS``: forked processes that run cuTile's front end when several configs compile
    at once (1: all in the compiling process), or None (as many as compile workers)."""
    return count("TILETUNE_FRONTEND_PROCS")


def timer_backlog_us() -> float:
    """``TILETUNE_TIMER_BACKLOG_US``: microseconds of GPU spin queued before each sample the tuner takes
    (:class:`tiletune.devices.measure.ColdL2Timer`'s ``backlog_us``); 0 (the default, also when unset or empty)
    turns it off."""
    raw = os.environ.get("TILETUNE_TIMER_BACKLOG_US")
    if raw is None or not raw.strip() or raw.strip() in ("0", "0.0"):
        return 0.0
    return seconds("TILETUNE_TIMER_BACKLOG_US", 50.0)


def frontend_cache() -> bool:
    """``TILETUNE_FRONTEND_CACHE`` (default true)."""
    return flag("TILETUNE_FRONTEND_CACHE", True)


def nearest_race() -> int:
    """``TILETUNE_NEAREST_RACE``: how many distinct configs of the nearest neighbours a new shape races
    (the default config beside them; the two nearest are compiled, the others raced when a compile cache
    holds them; timed on copies of its written arguments, then checked fastest first); 1: the nearest
    one only, checked, no timing (default 3)."""
    got = count("TILETUNE_NEAREST_RACE")
    return 3 if got is None else got


def nearest_variants() -> int:
    """``TILETUNE_NEAREST_VARIANTS``: how many configs of the space that differ from the nearest neighbour's
    (in one parameter first, then two, ...) join a new shape's race when a compile cache holds them (they are
    never compiled for the race); 0: none (default 8)."""
    raw = os.environ.get("TILETUNE_NEAREST_VARIANTS")
    if raw is None or not raw.strip():
        return 8
    word = raw.strip()
    if not word.isdigit():
        raise ValueError(f"TILETUNE_NEAREST_VARIANTS={raw!r} is not a number; expected an integer >= 0, e.g. 8")
    return int(word)


def compile_fuse() -> bool:
    """``TILETUNE_COMPILE_FUSE`` (default true): whether the memory-bound library ops lower to torch
    expressions while ``torch.compile`` traces (:mod:`tiletune.kernels.lowerings`)."""
    return flag("TILETUNE_COMPILE_FUSE", True)


def in_worker() -> bool:
    """``TILETUNE_IN_WORKER`` (default false; set by tiletune in its worker processes)."""
    return flag("TILETUNE_IN_WORKER", False)


_CHECKS = {
    "TILETUNE_DB": db_path,
    "TILETUNE_CACHE_DIR": cache_dir,
    "TILETUNE_LOG": log_enabled,
    "TILETUNE_PROGRESS": progress_enabled,
    "TILETUNE_DISABLE": disabled,
    "TILETUNE_ISOLATION": isolation,
    "TILETUNE_PREWARM": prewarm,
    "TILETUNE_WORKER_PRESTART": worker_prestart,
    "TILETUNE_WORKER_ZYGOTE": worker_zygote,
    "TILETUNE_ZYGOTE_START": zygote_start,
    "TILETUNE_SHIP_KERNELS": ship_kernels,
    "TILETUNE_WORKER_START_TIMEOUT": worker_start_timeout_s,
    "TILETUNE_WATCHDOG_S": watchdog_s,
    "TILETUNE_WATCHDOG_FACTOR": watchdog_factor,
    "TILETUNE_WORKER_TRACE": worker_trace,
    "TILETUNE_DEBUG": debug,
    "TILETUNE_IN_WORKER": in_worker,
    "TILETUNE_TABLES": tables_enabled,
    "TILETUNE_BACKGROUND": background,
    "TILETUNE_FALLBACK": fallback,
    "TILETUNE_ON_MISS": on_miss,
    "TILETUNE_PINS": pins_path,
    "TILETUNE_COMPILE_WORKERS": compile_workers,
    "TILETUNE_FRONTEND_PROCS": frontend_procs,
    "TILETUNE_COMPILE_TRACE": compile_trace,
    "TILETUNE_COMPILE_ORDER": compile_order,
    "TILETUNE_TIMER_BACKLOG_US": timer_backlog_us,
    "TILETUNE_COMPILE_FUSE": compile_fuse,
    "TILETUNE_NEAREST_RACE": nearest_race,
    "TILETUNE_NEAREST_VARIANTS": nearest_variants,
}


def check_all() -> list[str]:
    """Read every variable with an accessor; the error messages of the invalid ones (in name order)."""
    problems = []
    for name in sorted(_CHECKS):
        try:
            _CHECKS[name]()
        except ValueError as exc:
            problems.append(str(exc))
    return problems
