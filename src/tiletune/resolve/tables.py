"""Tuning tables: winners for common problem keys, consulted after the user's database.

A first call on a new shape tunes for seconds to a minute. A *tuning table* answers it at once:
a compact JSON file of winners for one device (name, architecture, SM count) and one set of
software versions (cuda-tile, tileiras), produced with ``tiletune db export --table`` from a tuning
database and loaded with ``tiletune db import --table`` (copied into the user's table folder) or
shipped inside the wheel (``tiletune/data/tables/``).

Precedence, for a key the op has not resolved in this process: the user's database, then the
user's tables, then the shipped tables, then tuning. A table answers only for exactly the identity
it was made for (the kernel's and plan's source hash, the space hash, the key, the device); a table
made for another device or other versions is skipped with one log line per table and device.
``TILETUNE_TABLES=0`` turns tables off. Nothing is written to the database when a table answers.

File format (``format: "tiletune-table"``, version 1)::

    {"format": "tiletune-table", "version": 1, "created": "2026-12-01T08:00:00Z",
     "device": {"name": "NVIDIA H200", "arch": "sm_90", "sm_count": 132},
     "versions": {"cuda_tile": "1.7.0", "tileiras": "13.4.92"},
     "entries": [{"name": "tiletune.rms_norm", "kernel_id": "...", "space_hash": "...",
                  "key": "<canonical JSON of the key>", "config": {...}, "median_us": 12.5}]}
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import pathlib
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from tiletune.errors import InvalidRecording, OutputError
from tiletune import jsonio as _io
from tiletune.records import DeviceInfo, TuningIdentity

if TYPE_CHECKING:  # pragma: no cover
    from tiletune.store import TuningDB

logger = logging.getLogger("tiletune")

__all__ = ["FORMAT", "TableEntry", "TableSource", "TuningTable", "family", "table_folders", "tables", "lookup", "install",
           "forget", "made_at_bounds", "left_to_the_race"]

FORMAT = "tiletune-table"
VERSION = 1
#: the software versions a table must match (the driver may differ: it does not change a winner's validity)
MATCHED_VERSIONS = ("cuda_tile", "tileiras")
SHIPPED = pathlib.Path(__file__).parent.parent / "data" / "tables"


@dataclass(frozen=True)
class TableEntry:
    """One winner of a table."""

    name: str
    kernel_id: str
    space_hash: str
    key: str
    config: dict[str, Any]
    median_us: float | None = None

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "kernel_id": self.kernel_id, "space_hash": self.space_hash,
                             "key": self.key, "config": dict(self.config)}
        if self.median_us is not None:
            d["median_us"] = self.median_us
        return d


def _versions_of(identity_versions: str) -> dict[str, str]:
    try:
        v = json.loads(identity_versions)
    except ValueError:
        return {}
    return {k: str(v[k]) for k in MATCHED_VERSIONS if isinstance(v, dict) and k in v}


class TuningTable:
    """A table of winners for one device and one set of versions."""

    def __init__(self, device: DeviceInfo, versions: Mapping[str, str], entries: Iterable[TableEntry],
                 created: str | None = None, source: str = "<memory>") -> None:
        self.device = device
        self.versions = {k: str(versions[k]) for k in MATCHED_VERSIONS if k in versions}
        self.created = created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.source = source
        self.entries: dict[tuple[str, str, str], TableEntry] = {}
        for e in entries:
            self.entries[(e.kernel_id, e.space_hash, e.key)] = e

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"<TuningTable {self.source}: {len(self)} entries for {self.device.name} {self.device.arch}>"

    def mismatch(self, identity: TuningIdentity) -> str | None:
        """Why this table cannot answer for ``identity``'s device and versions (None: it can)."""
        if self.device != identity.device:
            return f"made for {self.device.name} ({self.device.arch}, {self.device.sm_count} SMs)"
        have = _versions_of(identity.versions)
        differ = [k for k in MATCHED_VERSIONS if self.versions.get(k) != have.get(k)]
        if differ:
            return "made with " + ", ".join(f"{k} {self.versions.get(k)}" for k in differ)
        return None

    def serves_as_neighbours(self, identity: TuningIdentity) -> bool:
        """Whether this table, made for another device of ``identity``'s architecture with the same
        software versions, may offer its winners as neighbours' configs (never as exact answers): a
        config valid on one sm_90 part is valid on another, and a first guess tuned there beats the
        default config; like every neighbour's it is raced and checked on this device before it is served."""
        return (self.device != identity.device and self.device.arch == identity.device.arch
                and self.versions == {k: v for k, v in _versions_of(identity.versions).items()
                                      if k in MATCHED_VERSIONS})

    def lookup(self, identity: TuningIdentity) -> TableEntry | None:
        """The entry for exactly this identity (device and versions checked by :meth:`mismatch`)."""
        return self.entries.get((identity.kernel_id, identity.space_hash, identity.key))

    # ------------------------------------------------------------------------------------ files
    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "created": self.created, "device": self.device.as_dict(),
                "versions": dict(self.versions),
                "entries": [e.as_dict() for e in sorted(self.entries.values(), key=lambda e: (e.name, e.key))]}

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Write the table (gzip when the name ends in ``.gz``), atomically, standard JSON only."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        data = text.encode()
        if str(path).endswith(".gz"):
            data = gzip.compress(data, mtime=0)
        try:
            return _io.write_atomic(path, data)
        except _io.Problem as p:
            raise OutputError(str(path), p.problem) from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TuningTable":
        """Read and validate a table file; :class:`~tiletune.errors.InvalidRecording` names the field."""
        try:
            doc = _io.read_json(path)
            return cls._parse(doc, str(path))
        except _io.Problem as p:
            raise InvalidRecording(str(path), p.problem, p.field or None) from None

    @classmethod
    def _parse(cls, doc: Any, source: str) -> "TuningTable":
        d = _io.as_object(doc, "document")
        fmt = _io.need(d, "format", "document")
        if fmt != FORMAT:
            raise _io.Problem(f"not a tuning table (format {_io.show(fmt)}, expected {FORMAT!r})", "format")
        version = _io.as_int(_io.need(d, "version", "document"), "version")
        if version > VERSION:
            raise _io.Problem(f"written by a newer tiletune (table version {version}; this one reads {VERSION})",
                              "version")
        dev = _io.as_object(_io.need(d, "device", "document"), "device")
        device = DeviceInfo(name=_io.as_str(_io.need(dev, "name", "device"), "device.name"),
                            arch=_io.as_str(_io.need(dev, "arch", "device"), "device.arch"),
                            sm_count=_io.as_int(_io.need(dev, "sm_count", "device"), "device.sm_count"))
        vers = _io.as_object(_io.need(d, "versions", "document"), "versions")
        versions = {k: _io.as_str(v, f"versions.{k}") for k, v in vers.items()}
        created = _io.as_str(d["created"], "created") if "created" in d else None
        entries = []
        for i, raw in enumerate(_io.as_list(_io.need(d, "entries", "document"), "entries")):
            where = f"entries[{i}]"
            e = _io.as_object(raw, where)
            median = e.get("median_us")
            entries.append(TableEntry(
                name=_io.as_str(_io.need(e, "name", where), f"{where}.name"),
                kernel_id=_io.as_str(_io.need(e, "kernel_id", where), f"{where}.kernel_id"),
                space_hash=_io.as_str(_io.need(e, "space_hash", where), f"{where}.space_hash"),
                key=_io.as_str(_io.need(e, "key", where), f"{where}.key"),
                config=_io.as_config(_io.need(e, "config", where), f"{where}.config"),
                median_us=None if median is None else _io.as_time(median, f"{where}.median_us",
                                                                   limit=_io.MAX_TIME_US),
            ))
        return cls(device, versions, entries, created=created, source=source)

    @classmethod
    def from_db(cls, db: "TuningDB", name: str | None = None) -> "TuningTable":
        """The winners of a database as a table. The database must hold one device and one set of
        versions (of those a table matches); filter with ``name`` or export per device."""
        winners = db.winners(name=name)
        if not winners:
            raise ValueError(f"{db.where}: no tuning results{f' for {name!r}' if name else ''} to make a table of")
        devices = {w.identity.device for w in winners}
        versions = {json.dumps(_versions_of(w.identity.versions), sort_keys=True) for w in winners}
        if len(devices) > 1 or len(versions) > 1:
            raise ValueError(f"{db.where}: the results span {len(devices)} device(s) and {len(versions)} "
                             "version set(s); a table holds one of each (export from a database of one GPU)")
        entries = [TableEntry(w.identity.name, w.identity.kernel_id, w.identity.space_hash, w.identity.key,
                              dict(w.config), w.median_us) for w in winners]
        return cls(next(iter(devices)), json.loads(next(iter(versions))), entries)


# ------------------------------------------------------------------------------------ lookup

_lock = threading.Lock()
_loaded: list[TuningTable] | None = None
_skipped: set[tuple[str, DeviceInfo]] = set()


def table_folders() -> list[pathlib.Path]:
    """Where tables are read from, in precedence order: the user's folder, then the shipped one."""
    from tiletune.store import default_db_path

    return [default_db_path().parent / "tables", SHIPPED]


def _files(folder: pathlib.Path) -> list[pathlib.Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")) and p.is_file())


def tables() -> list[TuningTable]:
    """Every readable table, user tables first (read once per process; :func:`forget` re-reads).
    A file that cannot be read is logged once and skipped."""
    global _loaded
    with _lock:
        if _loaded is None:
            out = []
            for folder in table_folders():
                for f in _files(folder):
                    try:
                        out.append(TuningTable.load(f))
                    except (InvalidRecording, OSError) as exc:
                        logger.warning("tiletune: tuning table %s skipped: %s", f, exc)
            _loaded = out
        return list(_loaded)


def forget() -> None:
    """Re-read the table folders at the next lookup."""
    global _loaded
    with _lock:
        _loaded = None
        _skipped.clear()


def lookup(identity: TuningIdentity) -> tuple[TableEntry, TuningTable] | None:
    """The first table entry for ``identity`` (user tables before shipped ones), or None."""
    from tiletune import settings

    if not settings.tables_enabled():
        return None
    for table in tables():
        why = table.mismatch(identity)
        if why is not None:
            mark = (table.source, identity.device)
            if mark not in _skipped and table.lookup(identity) is not None:
                _skipped.add(mark)
                logger.warning("tiletune: tuning table %s is %s; this is %s (%s) with %s: %s",
                               table.source, why, identity.device.name, identity.device.arch,
                               ", ".join(f"{k} {v}" for k, v in _versions_of(identity.versions).items()),
                               "its winners serve only as neighbours' configs, checked here"
                               if table.serves_as_neighbours(identity) else "not used")
            continue
        entry = table.lookup(identity)
        if entry is not None:
            return entry, table
    return None


def install(path: str | os.PathLike) -> pathlib.Path:
    """Validate a table file and copy it into the user's table folder (``tiletune db import --table``);
    returns where it went. A table of the same file name is replaced."""
    table = TuningTable.load(path)
    folder = table_folders()[0]
    folder.mkdir(parents=True, exist_ok=True)
    name = pathlib.Path(path).name
    dest = table.save(folder / (name if name.endswith((".json", ".json.gz")) else name + ".json"))
    forget()
    return dest


def family(identity: TuningIdentity, siblings: bool = True) -> list[tuple[TableEntry, TuningTable]]:
    """Every table entry of ``identity``'s kernel and space on its device and versions (any key): the
    tuned neighbours :mod:`tiletune.resolve.nearest` chooses from; then, with ``siblings``, the entries
    of the same kernel (``kernel_id``: its and its plan's source) in its *other* spaces.

    Sibling spaces are the regimes of one library op: the split-K GEMM has a space per (``K`` floor,
    token-tile cap, largest split), so a new ``N`` (a fused gate-up weight, another model's width) often
    lands in a regime with no entry at all, and was served the default config although the table held
    winners of the same kernel at nearby ``M``, ``N``, ``K`` (H200 nearest_quality runs: the matmul rows
    served ``default`` ran 1.07-1.17x their exact tuning). A sibling's config is a candidate only where it
    is one of this space's valid configs (the caller maps it with ``Problem.config_from``, which drops the
    others), and like every neighbour's it is compiled, checked and raced on the caller's arguments
    before it is served. The same space's entries come first, so at an equal key they win.

    Last come the entries of tables made for another device of the same architecture and versions
    (:meth:`TuningTable.serves_as_neighbours`: the shipped H200 table on an H100), in the same order:
    a user whose GPU no table was made for gets tuned first guesses rather than the default config."""
    from tiletune import settings

    if not settings.tables_enabled():
        return []
    groups: list[list[tuple[TableEntry, TuningTable]]] = [[], [], [], []]
    for table in tables():
        if table.mismatch(identity) is None:
            here = 0
        elif table.serves_as_neighbours(identity):
            here = 2
        else:
            continue
        for (kernel_id, space_hash, _key), entry in table.entries.items():
            if kernel_id != identity.kernel_id:
                continue
            if space_hash == identity.space_hash:
                groups[here].append((entry, table))
            elif siblings:
                groups[here + 1].append((entry, table))
    return [e for g in groups for e in g]


def made_at_bounds(table: TuningTable) -> bool:
    """Whether ``table``'s entries were tuned at their keys' own sizes (the buckets' bounds): the tables
    shipped with tiletune (``benchmarks/make_table.py`` tunes powers of two only). A table exported from a
    database (``tiletune db export --table``) may hold a bucket's winner tuned anywhere in the bucket."""
    try:
        return pathlib.Path(table.source).resolve().parent == SHIPPED.resolve()
    except (OSError, ValueError):
        return False


def left_to_the_race(problem: Any, table: TuningTable) -> bool:
    """Whether a shipped table's bucket entry should not answer this call, and the nearest-neighbour
    source's race should: the op serves misses from its neighbours, raced on the call's arguments
    (``on_miss="nearest"``, ``TILETUNE_NEAREST_RACE`` > 1), the table's entries were tuned at their buckets'
    bounds (:func:`made_at_bounds`), and the call's own sizes are not its bucket's bound.

    A bucket is bounded above: a GEMM of 1,521 rows keys as the 2,048-row bucket, whose entry was tuned at
    2,048 rows, and tile counts, waves and split decisions change inside a bucket. Neither that entry nor the
    one nearest the call's sizes is reliably the faster on the call (``benchmarks/probe_table_nearer.py``
    measures both), so both race there, with the other neighbours' configs, as for any unseen shape."""
    if getattr(problem, "policy", None) != "nearest" or problem.sizes_json == problem.identity.key:
        return False
    from tiletune import settings

    return settings.nearest_race() > 1 and made_at_bounds(table)


class TableSource:
    """The tuning tables' entry for exactly this identity (user tables, then the shipped ones); on a call
    that may fall back, the op's fallback while the entry's config compiles, when no cache holds it.

    A shipped entry does not answer a call inside its bucket but off its bound when the op races its
    neighbours (:func:`left_to_the_race`): the nearest-neighbour source does, with that entry among them."""

    name = "table"

    def get(self, problem: Any, attempt: Any) -> Any:
        from tiletune.resolve.problem import Choice

        hit = lookup(problem.identity)
        if hit is None:
            return None
        entry, table = hit
        if left_to_the_race(problem, table):
            logger.info("%s: tuning table %s holds the bucket of %s, tuned at its bound; the neighbours race",
                        problem.name, table.source, problem.sizes_json)
            return None
        cfg = problem.config_from(entry.config)
        if cfg is None:
            return None
        logger.info("%s: tuning table %s -> %s", problem.name, table.source, cfg)
        from tiletune.resolve import fallback

        return fallback.while_compiling(problem, cfg) or Choice(cfg, "table", median_us=entry.median_us)
