"""Pinning: fixed configs per op and problem key, for reproducible deployments.

A pin says "op ``tiletune.rms_norm``, for keys matching this, on ``sm_90``, launch this config". A
pinned key is never tuned: the first time a process meets it, the pinned config is compiled and
checked against the op's reference once (in a tuning session, as tuning checks a candidate; the
caller's arguments are restored afterwards), then launched like a database hit. The lookup order of
a key a tuned op has not resolved yet is: **pins, then the user's tuning database, then tuning
tables, then tuning** (:mod:`tiletune.resolve.chain`).

Where pins come from, in precedence order:

1. :func:`pin` (``tt.pin(op, config, key=..., arch=...)``) in this process, newest first;
2. the pins file named by ``TILETUNE_PINS`` (read when first needed, re-read when the file changes).

Within each, a pin for an exact key comes before a ``key_regex`` pin, which comes before a pin for
every key; ties go to the earlier one. ``tiletune db export --pins FILE`` writes a pins file of a
database's winners (exact keys, one architecture each).

A pin that cannot be used is an error, never a silent fallback (a deployment that pins wants the
pinned config or a clear failure): a config that is not a valid config of the op's space on this
architecture, or one that fails to compile, fails the reference check or fails to launch, raises
:class:`PinError` naming the pin's source, the op, the key and the reason. Remove or fix the pin
(or unset ``TILETUNE_PINS``) to tune instead. ``TILETUNE_DISABLE=1`` still launches the baseline.

During a CUDA graph capture a pin is used only if it was verified earlier in this process (a check
cannot run inside a capture); otherwise the capture launches the baseline and the key is resolved,
pin first, at the next call outside capture (see :meth:`TunedOp.tune_pending`).

File format (JSON, ``format: "tiletune-pins"``, version 1)::

    {"format": "tiletune-pins", "version": 1,
     "pins": [{"op": "tiletune.rms_norm", "arch": "sm_90",
               "key": [[[8, 4096], [4096, 1], "torch.bfloat16", "cuda"], ...],
               "config": {"ROWS": 1, "occupancy": 2}},
              {"op": "tiletune.gemm", "key_regex": ".*bfloat16.*", "config": {...}},
              {"op": "tiletune.softmax", "config": {...}}]}

``key`` is the problem key as the database stores it (its JSON value or its canonical JSON text:
``tiletune db list`` shows it); ``key_regex`` a Python regular expression that must match the whole
canonical key text; neither: every key. ``arch`` (optional) restricts the pin to one architecture.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from tiletune.errors import SpaceError, TiletuneError
from tiletune.records import TuningIdentity, canonical_json, config_hash

if TYPE_CHECKING:  # pragma: no cover
    from tiletune.resolve.problem import Problem
    from tiletune.space.spaces import Config
    from tiletune.store import TuningDB

logger = logging.getLogger("tiletune")

__all__ = ["FORMAT", "Pin", "PinError", "PinFile", "PinSource", "active_pins", "clear_pins", "find_pin", "pin", "pinned_config",
           "verified_pin"]

FORMAT = "tiletune-pins"
VERSION = 1


class PinError(TiletuneError, ValueError):
    """A pin that cannot be used (invalid file, a config outside the space, a failed check)."""


@dataclass(frozen=True)
class Pin:
    """One pin: ``op`` (the tuned op's name), the config, which keys and which architecture."""

    op: str
    config: Mapping[str, Any]
    key: str | None = None  # canonical JSON of one exact key
    key_regex: str | None = None
    arch: str | None = None
    source: str = "tt.pin"
    index: int = 0  # position within its source (ties go to the earlier one)

    @property
    def specificity(self) -> int:
        """0: an exact key, 1: a regular expression, 2: every key."""
        return 0 if self.key is not None else (1 if self.key_regex is not None else 2)

    def matches(self, name: str, key_json: str, arch: str) -> bool:
        if self.op != name or (self.arch is not None and self.arch != arch):
            return False
        if self.key is not None:
            return self.key == key_json
        if self.key_regex is not None:
            return re.fullmatch(self.key_regex, key_json) is not None
        return True

    def describe(self) -> str:
        which = (f"key {self.key}" if self.key is not None else
                 f"keys matching {self.key_regex!r}" if self.key_regex is not None else "every key")
        return f"pin #{self.index} of {self.source} ({self.op}, {which}{f', {self.arch}' if self.arch else ''})"

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.op}
        if self.arch is not None:
            d["arch"] = self.arch
        if self.key is not None:
            d["key"] = json.loads(self.key)
        if self.key_regex is not None:
            d["key_regex"] = self.key_regex
        d["config"] = dict(self.config)
        return d


def _key_text(key: Any, where: str) -> str:
    """Canonical JSON of a key given as its JSON value or as its canonical text."""
    if isinstance(key, str):
        try:
            return canonical_json(json.loads(key))
        except ValueError:
            pass
    try:
        return canonical_json(key)
    except TypeError as exc:
        raise PinError(f"{where}.key: not a JSON value ({exc})") from None


def _make_pin(raw: Any, where: str, source: str, index: int) -> Pin:
    if not isinstance(raw, Mapping):
        raise PinError(f"{where}: expected an object, got {type(raw).__name__}")
    unknown = set(raw) - {"op", "config", "key", "key_regex", "arch", "device", "median_us"}
    if unknown:
        raise PinError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    op = raw.get("op")
    if not isinstance(op, str) or not op:
        raise PinError(f"{where}.op: expected the tuned op's name (a non-empty string)")
    config = raw.get("config")
    if not isinstance(config, Mapping) or not config:
        raise PinError(f"{where}.config: expected an object of parameter values")
    for k, v in config.items():
        if not isinstance(k, str) or not (v is None or isinstance(v, (bool, int, float, str))):
            raise PinError(f"{where}.config.{k}: expected a JSON scalar, got {type(v).__name__}")
    if "key" in raw and "key_regex" in raw:
        raise PinError(f"{where}: give key or key_regex, not both")
    key = _key_text(raw["key"], where) if "key" in raw else None
    regex = raw.get("key_regex")
    if regex is not None:
        if not isinstance(regex, str):
            raise PinError(f"{where}.key_regex: expected a string")
        try:
            re.compile(regex)
        except re.error as exc:
            raise PinError(f"{where}.key_regex: not a regular expression ({exc})") from None
    arch = raw.get("arch")
    if arch is not None and (not isinstance(arch, str) or not re.fullmatch(r"sm_\d+[a-z]?", arch)):
        raise PinError(f"{where}.arch: expected an architecture like 'sm_90', got {arch!r}")
    return Pin(op=op, config=dict(config), key=key, key_regex=regex, arch=arch, source=source, index=index)


class PinFile:
    """A pins file: :meth:`load` validates it (:class:`PinError` names the field), :meth:`save` writes it."""

    def __init__(self, pins: Sequence[Pin], source: str = "<memory>") -> None:
        self.pins = list(pins)
        self.source = source

    def __len__(self) -> int:
        return len(self.pins)

    @classmethod
    def parse(cls, doc: Any, source: str) -> "PinFile":
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
            raise PinError(f"pins file {source}: not a pins file (expected format {FORMAT!r})")
        version = doc.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version > VERSION or version < 1:
            raise PinError(f"pins file {source}: version {version!r} (this tiletune reads version {VERSION})")
        raw = doc.get("pins")
        if not isinstance(raw, list):
            raise PinError(f"pins file {source}: 'pins' must be a list")
        try:
            pins = [_make_pin(p, f"pins[{i}]", source, i) for i, p in enumerate(raw)]
        except PinError as exc:
            raise PinError(f"pins file {source}: {exc}") from None
        return cls(pins, source)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PinFile":
        from tiletune import jsonio as _io

        try:
            doc = _io.read_json(path)
        except _io.Problem as p:
            raise PinError(f"pins file {path}: {p.problem}") from None
        except OSError as exc:
            raise PinError(f"pins file {path}: {exc.strerror or exc}") from None
        return cls.parse(doc, str(path))

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "pins": [p.as_dict() for p in self.pins]}

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        from tiletune.errors import OutputError
        from tiletune import jsonio as _io

        data = (json.dumps(self.to_json(), indent=1, sort_keys=False, allow_nan=False) + "\n").encode()
        try:
            return _io.write_atomic(path, data)
        except _io.Problem as p:
            raise OutputError(str(path), p.problem) from None

    @classmethod
    def from_db(cls, db: "TuningDB", name: str | None = None) -> "PinFile":
        """Pins of a database's winners: one per op, exact key and architecture (the newest winner)."""
        winners = db.winners(name=name)
        if not winners:
            raise ValueError(f"{db.where}: no tuning results{f' for {name!r}' if name else ''} to pin")
        newest: dict[tuple[str, str, str], Any] = {}
        for w in winners:  # oldest first: later ones replace earlier ones
            newest[(w.identity.name, w.identity.key, w.identity.device.arch)] = w
        pins = [Pin(op=n, config=dict(w.config), key=k, arch=a, source=db.where, index=i)
                for i, ((n, k, a), w) in enumerate(sorted(newest.items(), key=lambda kv: kv[0]))]
        return cls(pins, db.where)


# ---------------------------------------------------------------------------------- active pins

_lock = threading.RLock()
_programmatic: list[Pin] = []
_file_cache: dict[str, tuple[float, int, PinFile]] = {}
_verified: set[tuple[str, str]] = set()  # (identity digest, config hash) checked in this process


def pin(op: Any, config: Mapping[str, Any], *, key: Any = None, key_regex: str | None = None,
        arch: str | None = None) -> Pin:
    """Pin ``config`` for ``op`` (a tuned op or its name) in this process.

    ``key``: one exact problem key (its JSON value or canonical text, as the database shows it);
    ``key_regex``: a regular expression over the canonical key text; neither: every key. ``arch``
    restricts it to one architecture. A newer ``tt.pin`` wins over an older one of equal
    specificity, and every ``tt.pin`` over the ``TILETUNE_PINS`` file. Keys a tuned op already
    resolved keep their config until ``op.cache_clear()`` (done here when ``op`` is a tuned op).
    """
    name = op if isinstance(op, str) else getattr(op, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"pin: op must be a tuned op or its name, got {type(op).__name__}")
    raw: dict[str, Any] = {"op": name, "config": dict(config)}
    if key is not None:
        raw["key"] = key
    if key_regex is not None:
        raw["key_regex"] = key_regex
    if arch is not None:
        raw["arch"] = arch
    with _lock:
        p = _make_pin(raw, "tt.pin", "tt.pin", -len(_programmatic))  # newest first
        _programmatic.append(p)
    if not isinstance(op, str) and hasattr(op, "cache_clear"):
        op.cache_clear()
    return p


def clear_pins() -> None:
    """Forget the :func:`pin` pins and the verified pins of this process (the file is re-read)."""
    with _lock:
        _programmatic.clear()
        _file_cache.clear()
        _verified.clear()


def _file_pins() -> list[Pin]:
    from tiletune import settings

    path = settings.pins_path()
    if path is None:
        return []
    p = os.path.expanduser(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise PinError(f"TILETUNE_PINS={path}: {exc.strerror or exc}") from None
    with _lock:
        hit = _file_cache.get(p)
        if hit is not None and hit[0] == st.st_mtime and hit[1] == st.st_size:
            return hit[2].pins
        pf = PinFile.load(p)
        _file_cache[p] = (st.st_mtime, st.st_size, pf)
        return pf.pins


def active_pins() -> list[Pin]:
    """Every pin in force, in the order they are tried: ``tt.pin`` pins, then the file's, each by
    specificity (exact key, regex, every key) then position."""
    with _lock:
        prog = sorted(_programmatic, key=lambda p: (p.specificity, p.index))
    return prog + sorted(_file_pins(), key=lambda p: (p.specificity, p.index))


def find_pin(name: str, identity: TuningIdentity) -> Pin | None:
    """The first pin in force for this op name and identity (key and architecture), or None."""
    for p in active_pins():
        if p.matches(name, identity.key, identity.device.arch):
            return p
    return None


def _pinned_cfg(spec: Any, p: Pin, arch: str) -> "Config":
    values = dict(p.config)
    names = list(spec.space.names)
    if set(values) != set(names):
        missing, extra = sorted(set(names) - set(values)), sorted(set(values) - set(names))
        raise PinError(f"{p.describe()}: the config does not match {spec.name}'s space"
                       + (f" (missing {', '.join(missing)})" if missing else "")
                       + (f" (unknown {', '.join(extra)})" if extra else ""))
    try:
        cfg = spec.space.config(arch, **{n: values[n] for n in names})
    except SpaceError as exc:
        raise PinError(f"{p.describe()}: {exc}") from None
    if not spec.space.is_candidate(cfg, arch):
        raise PinError(f"{p.describe()}: {cfg} is not a valid config of {spec.name}'s space on {arch}")
    return cfg


def verified_pin(problem: "Problem") -> "Config | None":
    """The pinned config for the problem if a pin matches and it was verified in this process (what a
    call during CUDA graph capture may use), else None."""
    identity = problem.identity
    p = find_pin(problem.name, identity)
    if p is None:
        return None
    cfg = _pinned_cfg(problem.spec, p, problem.arch)
    with _lock:
        return cfg if (identity.digest, config_hash(cfg.as_dict())) in _verified else None


def pinned_config(problem: "Problem") -> "Config | None":
    """The pinned config of this key, verified (once per process and identity), or None without a pin.

    Raises :class:`PinError` when the pin's config is not in the space or fails its check.
    """
    identity = problem.identity
    p = find_pin(problem.name, identity)
    if p is None:
        return None
    cfg = _pinned_cfg(problem.spec, p, problem.arch)
    mark = (identity.digest, config_hash(cfg.as_dict()))
    with _lock:
        done = mark in _verified
    if not done:
        _verify(problem, p, cfg)
        with _lock:
            _verified.add(mark)
    logger.info("%s: %s -> %s", problem.name, p.describe(), cfg)
    return cfg


class PinSource:
    """A pin in force for the key (``tiletune.pin``, ``TILETUNE_PINS``): its config, verified once."""

    name = "pin"

    def get(self, problem: "Problem", attempt: Any) -> Any:
        from tiletune.resolve.problem import Choice

        cfg = pinned_config(problem)
        return None if cfg is None else Choice(cfg, "pin")


def _verify(problem: "Problem", p: Pin, cfg: "Config") -> None:
    """Compile and check ``cfg`` once in a tuning session (the caller's arguments are restored)."""
    from tiletune.devices.backends.base import Candidate
    from tiletune.records import Status
    from tiletune.resolve.tune import open_session

    name = problem.name
    t0 = time.perf_counter()
    session = open_session(problem)
    cand = Candidate(cfg, 0, is_baseline=True)
    try:
        for outcome in session.compile([cand]):
            if outcome.status is not Status.OK:
                raise PinError(f"{name}: {p.describe()}: {cfg} failed to compile: "
                               f"{_first_line(outcome.reason) or outcome.status.value}")
        check = session.check(cand)
        if check.status is not Status.OK:
            what = "does not match the reference" if check.status is Status.MISMATCH else f"failed ({check.status.value})"
            raise PinError(f"{name}: {p.describe()}: {cfg} {what}: {_first_line(check.reason)}")
    finally:
        session.finish(None)
    logger.info("%s: verified %s in %.2f s", name, p.describe(), time.perf_counter() - t0)


def _first_line(text: str) -> str:
    t = (text or "").strip()
    return t.splitlines()[0][:300] if t else ""
