"""Shrink a space to the few configs that matter (``tiletune shrink OP``).

Input: per-config measurements over many problem keys, per architecture: the tuning database's
records of one op (every session stores every measured config with its samples; a key's newest
identity per architecture is used, its sessions' samples merged per config), or recordings
(:mod:`tiletune.lab.recordings`; each is one key, recordings of one op combine). A config failed or not
measured on a key does not cover that key.

Goal, per architecture: the smallest set of configs whose best on every key is within
``tolerance`` (default 2%) of that key's best over the full space, at most ``max_configs`` (8).

Method (documented, deterministic):

1. A config *covers* a key when its median is within ``tolerance`` of the key's best. Configs
   whose covered keys are a subset of another config's are dropped (dominated; of equal ones the
   one with the lower mean time ratio to the best stays).
2. **Greedy set cover**: repeatedly take the config covering most uncovered keys (ties: the lowest
   mean ratio to the best over all keys). Greedy is within a factor ``ln(keys) + 1`` of optimal.
3. **Exact check**: for every size below greedy's, all combinations of the remaining configs are
   tried while there are at most ``exact_limit`` (200k) of them; the smallest size with a cover
   wins. At the final size, among the covers found (or by swapping one config at a time when
   enumeration is too large) the set with the lowest worst loss, then mean loss, is kept
   (**improvement**). ``method`` says which of these ran and whether the size is proven minimal.
4. When no cover fits in ``max_configs``, the configs minimising the worst loss (then the mean) are
   chosen greedily and improved by swaps; ``met`` is False and the worst loss exceeds the tolerance.

The loss of a key is ``min over chosen configs of t(config) / t(best) - 1``. The shrunk space's
baseline is the original baseline when it was chosen, else the chosen config with the lowest mean
ratio. :func:`space_code` prints the result as a :class:`tiletune.Space` definition;
:func:`verify_replay` A/B-tests it on CPU by replaying the measurements (tuning over the shrunk space
vs each key's full-space best, :func:`tiletune.lab.ab.ab`); on a GPU the same A/B runs live
(``benchmarks/ab_shrink.py``).
"""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from tiletune.records import DeviceInfo, Measurement, Status, canonical_json

__all__ = ["KeyTable", "ShrinkResult", "shrink", "space_hashes", "tables_by_space", "tables_from_db",
           "tables_from_recordings", "space_code",
           "build_space", "verify_replay"]

#: combinations tried at most by the exact check at one size
EXACT_LIMIT = 200_000


@dataclass
class KeyTable:
    """Medians of configs over keys on one architecture (``inf``: failed or not measured)."""

    arch: str
    names: list[str]  # parameter names, in order
    keys: list[str]  # key labels
    configs: list[dict[str, Any]]
    times: list[list[float]]  # [key][config], microseconds
    baseline: dict[str, Any] | None = None
    hint_names: tuple[str, ...] = ()
    sources: list[Any] = field(default_factory=list)  # per key: what a replay needs (Recording)
    device: DeviceInfo | None = None


@dataclass
class ShrinkResult:
    """The chosen configs of one architecture and their per-key losses."""

    arch: str
    configs: list[dict[str, Any]]
    baseline: dict[str, Any]
    losses: dict[str, float]  # key -> loss (0.013 = 1.3% slower than the key's best)
    tolerance: float
    met: bool
    method: str
    configs_before: int
    keys: int
    names: list[str]
    hint_names: tuple[str, ...] = ()

    @property
    def worst_loss(self) -> float:
        return max(self.losses.values()) if self.losses else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"arch": self.arch, "keys": self.keys, "configs_before": self.configs_before,
                "configs_after": len(self.configs), "tolerance": self.tolerance, "met": self.met,
                "worst_loss": self.worst_loss, "method": self.method, "baseline": self.baseline,
                "configs": self.configs, "losses": self.losses}


# ------------------------------------------------------------------------------------------- inputs


def _median(samples: Sequence[float]) -> float:
    s = sorted(samples)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _table(arch: str, per_key: list[tuple[str, list[Measurement], Any]], device: DeviceInfo | None) -> KeyTable:
    names: list[str] = []
    index: dict[str, int] = {}
    configs: list[dict[str, Any]] = []
    samples: list[dict[int, list[float]]] = []
    baseline = None
    for _, ms, _ in per_key:
        got: dict[int, list[float]] = {}
        for m in ms:
            c = canonical_json(dict(m.config))
            if c not in index:
                index[c] = len(configs)
                configs.append(dict(m.config))
                for n in m.config:
                    if n not in names:
                        names.append(n)
            if m.is_baseline and baseline is None:
                baseline = dict(m.config)
            if m.status is Status.OK and m.samples_us:
                got.setdefault(index[c], []).extend(m.samples_us)
        samples.append(got)
    times = [[_median(g[j]) if j in g else math.inf for j in range(len(configs))] for g in samples]
    from tiletune.space.spaces import HINT_NAMES

    return KeyTable(arch=arch, names=names, keys=[k for k, _, _ in per_key], configs=configs, times=times,
                    baseline=baseline, hint_names=tuple(n for n in names if n in HINT_NAMES),
                    sources=[s for _, _, s in per_key], device=device)


def _key_counts(winners: Iterable[Any]) -> dict[str, int]:
    """Space hash -> number of (arch, key) pairs among ``winners``, in hash order."""
    keys: dict[str, set] = {}
    for w in winners:
        keys.setdefault(w.identity.space_hash, set()).add((w.identity.device.arch, w.identity.key))
    return {h: len(k) for h, k in sorted(keys.items())}


def space_hashes(db: Any, name: str) -> dict[str, int]:
    """The spaces op ``name`` was tuned over in a tuning database: space hash -> number of keys.

    A library op may tune different key regimes over different spaces (e.g. few rows vs many); each
    space is shrunk on its own."""
    return _key_counts(db.winners(name=name))


def _tables(db: Any, winners: Iterable[Any]) -> dict[str, KeyTable]:
    """Per architecture, the table of ``winners`` (one space): a key's newest identity per architecture."""
    newest: dict[tuple[str, str], Any] = {}
    for w in winners:  # oldest first
        newest[(w.identity.device.arch, w.identity.key)] = w
    by_arch: dict[str, list[tuple[str, list[Measurement], Any]]] = {}
    devices: dict[str, DeviceInfo] = {}
    for (arch, key), w in sorted(newest.items()):
        ms = db.measurements(w.identity)
        by_arch.setdefault(arch, []).append((key, ms, ms))
        devices[arch] = w.identity.device
    return {a: _table(a, rows, devices[a]) for a, rows in by_arch.items()}


def tables_from_db(db: Any, name: str, space: str | None = None) -> dict[str, KeyTable]:
    """Per architecture, the per-config medians of op ``name`` over its keys in a tuning database
    (a key's newest identity per architecture; its sessions' samples merged).

    ``space``: the space hash (or a prefix of it) to shrink, required when the op was tuned over
    several spaces (:func:`space_hashes`); their configs are not comparable."""
    winners = db.winners(name=name)
    if not winners:
        raise ValueError(f"{db.where}: no tuning results for {name!r}")
    hashes = _key_counts(winners)
    if space is not None:
        chosen = [h for h in hashes if h.startswith(space)]
        if len(chosen) != 1:
            raise ValueError(f"{db.where}: {name!r} has {'no' if not chosen else 'several'} space(s) matching "
                             f"{space!r}; its spaces: {', '.join(f'{h[:12]} ({n} keys)' for h, n in hashes.items())}")
        winners = [w for w in winners if w.identity.space_hash == chosen[0]]
    elif len(hashes) > 1:
        raise ValueError(f"{db.where}: {name!r} was tuned over {len(hashes)} spaces "
                         f"({', '.join(f'{h[:12]}: {n} keys' for h, n in hashes.items())}); shrink one at a time "
                         "(space=HASH, or the CLI's --space)")
    return _tables(db, winners)


def tables_by_space(db: Any, name: str) -> dict[str, dict[str, KeyTable]]:
    """:func:`tables_from_db` for every space op ``name`` was tuned over, from one read of its
    winners: space hash -> per-architecture tables ({} when the op has no results)."""
    by_space: dict[str, list[Any]] = {}
    for w in db.winners(name=name):  # oldest first, kept so within each space
        by_space.setdefault(w.identity.space_hash, []).append(w)
    return {h: _tables(db, ws) for h, ws in sorted(by_space.items())}


def tables_from_recordings(recordings: Iterable[Any]) -> dict[str, KeyTable]:
    """Per architecture, the tables of recordings (paths or :class:`Recording` objects); each is one key."""
    from tiletune.lab.recordings import Recording, load_any

    by_arch: dict[str, list[tuple[str, list[Measurement], Any]]] = {}
    devices: dict[str, DeviceInfo] = {}
    for r in recordings:
        rec = r if isinstance(r, Recording) else load_any(r)
        names = list(rec.param_values)
        first = next((x for x in by_arch.get(rec.device.arch, [])), None)
        if first is not None and list(first[2].param_values) != names:
            raise ValueError(f"{rec.source}: its parameters ({', '.join(names)}) differ from "
                             f"{first[2].source}'s; shrink recordings of one kernel's space together")
        label = f"{rec.name} {canonical_json(rec.key)}" if rec.key is not None else os.path.basename(rec.source)
        by_arch.setdefault(rec.device.arch, []).append((label, list(rec.measurements), rec))
        devices[rec.device.arch] = rec.device
    if not by_arch:
        raise ValueError("no recordings given")
    return {a: _table(a, rows, devices[a]) for a, rows in by_arch.items()}


# ------------------------------------------------------------------------------------------- algorithm


def _losses(t: KeyTable, best: list[float], chosen: Sequence[int]) -> list[float]:
    out = []
    for k, row in enumerate(t.times):
        m = min((row[j] for j in chosen), default=math.inf)
        out.append(m / best[k] - 1.0 if math.isfinite(m) else math.inf)
    return out


def _score(t: KeyTable, best: list[float], chosen: Sequence[int]) -> tuple[float, float]:
    ls = _losses(t, best, chosen)
    return (max(ls) if ls else 0.0, sum(ls) / len(ls) if ls else 0.0)


def shrink(table: KeyTable, tolerance: float = 0.02, max_configs: int = 8,
           exact_limit: int = EXACT_LIMIT) -> ShrinkResult:
    """Choose the configs of one architecture (see the module docstring)."""
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    if isinstance(max_configs, bool) or not isinstance(max_configs, int) or max_configs < 1:
        raise ValueError(f"max_configs must be a positive int, got {max_configs!r}")
    t = table
    nk, nc = len(t.keys), len(t.configs)
    best = [min(row) for row in t.times]
    live = [k for k in range(nk) if math.isfinite(best[k])]
    if not live:
        raise ValueError(f"{t.arch}: no key has a successfully measured config")
    if len(live) < nk:  # keys without any measurement cannot be covered: left out
        t = KeyTable(t.arch, t.names, [t.keys[k] for k in live], t.configs, [t.times[k] for k in live],
                     t.baseline, t.hint_names, [t.sources[k] for k in live] if t.sources else [], t.device)
        best = [best[k] for k in live]
        nk = len(live)
    full = (1 << nk) - 1
    cover = [sum(1 << k for k in range(nk) if t.times[k][j] <= best[k] * (1 + tolerance)) for j in range(nc)]
    mean_ratio = [sum(min(t.times[k][j] / best[k], 1e6) for k in range(nk)) / nk for j in range(nc)]
    # dominance: keep configs whose cover is not inside another's (equal covers: lowest mean ratio)
    useful = [j for j in range(nc) if cover[j]]
    useful.sort(key=lambda j: (mean_ratio[j], j))
    kept: list[int] = []
    for j in useful:
        if not any((cover[j] | cover[i]) == cover[i] for i in kept):
            kept = [i for i in kept if (cover[i] | cover[j]) != cover[j]] + [j]
    # greedy
    chosen: list[int] = []
    left = full
    while left:
        j = max(kept, key=lambda i: (bin(cover[i] & left).count("1"), -mean_ratio[i], -i))
        chosen.append(j)
        left &= ~cover[j]
    method = "greedy"
    proven = len(chosen) == 1
    # exact check of smaller sizes, then the best set of the final size
    sizes_checked = True
    for s in range(1, len(chosen)):
        if math.comb(len(kept), s) > exact_limit:
            sizes_checked = False
            break
        found = [c for c in itertools.combinations(kept, s) if _or(cover, c) == full]
        if found:
            chosen = list(min(found, key=lambda c: (_score(t, best, c), c)))
            method = "exact"
            break
    else:
        if sizes_checked and len(chosen) > 1:
            method = "greedy (exact check: no smaller cover)"
    proven = proven or sizes_checked
    size = len(chosen)
    if size > 1 and math.comb(len(kept), size) <= exact_limit:
        found = [c for c in itertools.combinations(kept, size) if _or(cover, c) == full]
        if found:
            chosen = list(min(found, key=lambda c: (_score(t, best, c), c)))
            method += ", best of all covers of that size"
    elif size > 1:
        chosen = _swap(t, best, chosen, kept, lambda c: _or(cover, c) == full)
        method += ", improved by swaps"
    met = size <= max_configs
    if not met:  # no cover fits: minimise the worst loss with max_configs configs
        pool = [j for j in range(nc) if any(math.isfinite(t.times[k][j]) for k in range(nk))]
        chosen = []
        for _ in range(max_configs):
            j = min((i for i in pool if i not in chosen), key=lambda i: (_score(t, best, chosen + [i]), i))
            chosen.append(j)
        chosen = _swap(t, best, chosen, pool, lambda c: True)
        method = f"no cover within {max_configs} configs (greedy needs {size}): worst-loss greedy, improved by swaps"
    elif not proven:
        method += " (minimality not proven: too many combinations)"
    chosen_configs = [t.configs[j] for j in chosen]
    if t.baseline is not None and t.baseline in chosen_configs:
        base = dict(t.baseline)
    else:
        base = dict(t.configs[min(chosen, key=lambda j: (mean_ratio[j], j))])
    # chosen in space order (as the original space lists them), baseline first
    order = sorted(chosen, key=lambda j: j)
    configs = [dict(t.configs[j]) for j in order]
    losses = dict(zip(t.keys, _losses(t, best, chosen)))
    return ShrinkResult(arch=t.arch, configs=configs, baseline=base, losses=losses, tolerance=tolerance, met=met,
                        method=method, configs_before=sum(1 for j in range(nc) if any(
                            math.isfinite(t.times[k][j]) for k in range(nk))), keys=nk, names=list(t.names),
                        hint_names=t.hint_names)


def _or(cover: Sequence[int], chosen: Iterable[int]) -> int:
    m = 0
    for j in chosen:
        m |= cover[j]
    return m


def _swap(t: KeyTable, best: list[float], chosen: list[int], pool: Sequence[int], ok: Any) -> list[int]:
    """Replace one config at a time while that lowers (worst loss, mean loss) and keeps ``ok``."""
    chosen = list(chosen)
    score = _score(t, best, chosen)
    improved = True
    while improved:
        improved = False
        for pos in range(len(chosen)):
            for j in pool:
                if j in chosen:
                    continue
                trial = chosen[:pos] + [j] + chosen[pos + 1:]
                if not ok(trial):
                    continue
                s = _score(t, best, trial)
                if s < score:
                    chosen, score, improved = trial, s, True
    return chosen


# ------------------------------------------------------------------------------------------- output


def _literal(v: Any) -> str:
    return repr(v)


def space_code(results: Mapping[str, ShrinkResult], name: str = "SHRUNK_SPACE", comment: str = "") -> str:
    """The shrunk configs as the code of a :class:`tiletune.Space` (per-architecture values when
    there are several architectures; a constraint keeps exactly the chosen combinations)."""
    archs, names, allowed = _allowed(results)
    first = results[archs[0]]
    lines = ["import tiletune as tt", ""]
    if comment:
        lines += [f"# {c}" for c in comment.splitlines()]
    tup = ", ".join(f"c.{n}" for n in names)
    lines.append(f"_{name}_CONFIGS = {{  # ({', '.join(names)})")
    for t in allowed:
        lines.append(f"    {t!r},")
    lines.append("}")
    lines.append(f"{name} = tt.Space(")

    def values(a: str, n: str) -> list[Any]:
        return _values(results[a], n)

    for n in names:
        if len(archs) == 1:
            lines.append(f"    {n}={values(archs[0], n)!r},")
        else:
            per = ", ".join(f"{a}={values(a, n)!r}" for a in archs)
            lines.append(f"    {n}=tt.per_arch({per}),")
    lines.append(f"    constraints={{\"shrunk\": lambda c: ({tup}{',' if len(names) == 1 else ''}) in _{name}_CONFIGS}},")
    if len(archs) == 1:
        lines.append(f"    baseline=dict({', '.join(f'{k}={v!r}' for k, v in first.baseline.items())}),")
    else:
        per = ", ".join(f"{a}=dict({', '.join(f'{k}={v!r}' for k, v in results[a].baseline.items())})" for a in archs)
        lines.append(f"    baseline=tt.per_arch({per}),")
    lines.append(")")
    return "\n".join(lines) + "\n"


def _allowed(results: Mapping[str, ShrinkResult]) -> tuple[list[str], list[str], list[tuple]]:
    """(architectures, parameter names, the chosen value tuples over every architecture)."""
    archs = sorted(results)
    names = list(results[archs[0]].names)
    bad = [n for n in names if not (isinstance(n, str) and n.isidentifier())]
    if bad:
        raise ValueError(f"shrink: parameter names must be identifiers, got {bad!r}")
    allowed: list[tuple] = []
    for a in archs:
        for c in results[a].configs:
            t = tuple(c.get(n) for n in names)
            if t not in allowed:
                allowed.append(t)
    return archs, names, allowed


def _values(result: ShrinkResult, name: str) -> list[Any]:
    vs: list[Any] = []
    for c in result.configs:
        if c.get(name) not in vs:
            vs.append(c.get(name))
    try:
        return sorted(vs)
    except TypeError:
        return vs


def build_space(results: Mapping[str, ShrinkResult]) -> Any:
    """The shrunk :class:`tiletune.Space` itself (what :func:`space_code` prints), built directly from
    the values (stored data is never executed)."""
    from tiletune.space.spaces import Space, per_arch

    archs, names, allowed = _allowed(results)
    chosen = frozenset(allowed)

    def shrunk(c: Any) -> bool:
        return tuple(getattr(c, n) for n in names) in chosen

    if len(archs) == 1:
        params: dict[str, Any] = {n: _values(results[archs[0]], n) for n in names}
        baseline: Any = dict(results[archs[0]].baseline)
    else:
        params = {n: per_arch(**{a: _values(results[a], n) for a in archs}) for n in names}
        baseline = per_arch(**{a: dict(results[a].baseline) for a in archs})
    return Space(**params, constraints={"shrunk": shrunk}, baseline=baseline)


def verify_replay(table: KeyTable, result: ShrinkResult, *, rounds: int = 10, batch: int = 10,
                  seed: int = 0) -> dict[str, Any]:
    """A/B on CPU by replay: per key, tune over the shrunk space (replaying that key's measurements)
    and time its pick against the key's full-space best (:func:`tiletune.lab.ab.ab`); returns the rows
    and the geomean of the ratios. Needs per-key recordings (:func:`tables_from_recordings`) or
    database identities (:func:`tables_from_db`)."""
    from tiletune.lab.ab import ab, geomean
    from tiletune.devices.backends.base import Launch
    from tiletune.lab.recordings.replay import ReplayBackend
    from tiletune.op.tuned_op import autotune
    from tiletune.lab.recordings import Recording

    space = build_space({result.arch: result})
    best = [min(row) for row in table.times]
    rows = []
    for k, key in enumerate(table.keys):
        if not math.isfinite(best[k]):
            continue
        src = table.sources[k] if k < len(table.sources) else None
        if isinstance(src, Recording):
            rec = src
        else:
            rec = _recording_of(table, k)
        full_best = table.configs[min(range(len(table.configs)), key=lambda j: table.times[k][j])]
        backend = ReplayBackend(rec, seed=seed)
        op = autotune(space, db=False, backend=backend, progress=False, name=f"shrunk {key[:40]}")(
            lambda cfg: Launch(None, (1,), ()))
        rep = ab(op, [()], against=full_best, rounds=rounds, batch=batch, labels=[key])
        rows.append(rep.rows[0].as_dict())
    return {"rows": rows, "geomean": geomean(r["ratio"] for r in rows)}


def _recording_of(table: KeyTable, k: int) -> Any:
    from tiletune.lab.recordings import Recording

    src = table.sources[k] if k < len(table.sources) else None
    ms = []
    if isinstance(src, list) and all(isinstance(m, Measurement) for m in src):  # a database key's records
        merged: dict[str, dict[str, Any]] = {}
        for m in src:
            d = merged.setdefault(canonical_json(dict(m.config)), {"config": dict(m.config), "status": "ok",
                                                                   "samples_us": [], "order": m.order,
                                                                   "is_baseline": m.is_baseline})
            if m.status is Status.OK:
                d["samples_us"].extend(m.samples_us)
        ms = [d for d in merged.values() if d["samples_us"]]
    else:
        for j, c in enumerate(table.configs):
            v = table.times[k][j]
            if math.isfinite(v):
                ms.append({"config": c, "status": "ok", "samples_us": [v], "order": j,
                           "is_baseline": c == table.baseline})
    device = table.device or DeviceInfo("unknown", table.arch, 0)
    return Recording({"format": "tiletune-recording", "version": 1, "name": "shrink", "key": table.keys[k],
                      "device": device.as_dict(), "versions": {}, "measurements": ms})


def report_json(results: Mapping[str, ShrinkResult], source: str) -> str:
    """The results as a JSON document."""
    return json.dumps({"source": source, "archs": {a: r.as_dict() for a, r in results.items()}}, indent=1,
                      allow_nan=False, default=str)
