"""Nearest-neighbour serving: a key nothing stored answers gets the config of its nearest tuned
neighbour, checked once, at once.

The neighbours of a problem are the winners of the same op (kernel id and space hash), device and
architecture, in the tuning database and in the tuning tables, under any key. Two stored keys are of
one *family* when they have the same structure: the same arguments, dtypes, layouts (contiguity and
the order of strides) and the same non-size values (flags, strings, dtypes, non-positive ints). The
distance between two keys of a family is the sum over their sizes (tensor dimensions and positive
ints) of ``|log2(1 + a) - log2(1 + b)|``: a neighbour twice as large in one dimension is one unit
away, whatever the dimension's scale. Ties go to the larger neighbour (a config tuned for more work
rarely starves a smaller problem; the other way round it may leave the GPU idle).

The neighbour's config is compiled and checked once on the caller's arguments (in this process:
the config ran correctly on a neighbour of the same kernel, and a worker's start would cost more than
the answer is worth); one that fails its check is passed over for the next nearest. The answer is
provisional: the key is recorded as pending (:mod:`tiletune.resolve.pending`) and tuned later
(``tiletune tune --pending``, :meth:`tiletune.TunedOp.tune_pending`, or in the background).

``on_miss="default"`` answers the same way with the space's baseline config instead of a neighbour's, and
so does ``"nearest"`` when no neighbour of the family is known (yet) or none passes its check: a miss
never stalls the call. Only a default config that fails its check is tuned at once.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from tiletune.errors import DatabaseError

if TYPE_CHECKING:  # pragma: no cover
    from tiletune.resolve.attempt import Attempt
    from tiletune.resolve.problem import Choice, Problem
    from tiletune.space.spaces import Config

logger = logging.getLogger("tiletune")

__all__ = ["Neighbour", "NearestSource", "key_features", "distance", "nearest", "neighbours"]

#: How many distinct configs of the nearest neighbours are raced (compiled together, checked, timed on
#: the caller's arguments), with the space's default config beside them.
MAX_TRIED = 3
#: cold-L2 timing samples per raced config (the median decides)
RACE_SAMPLES = 5


def key_features(key_json: str) -> tuple[str, tuple[float, ...]] | None:
    """``(signature, sizes)`` of a stored key: keys with equal signatures are of one family, and
    their sizes line up. None for a key that is not JSON."""
    try:
        doc = json.loads(key_json)
    except (TypeError, ValueError):
        return None
    sig: list[Any] = []
    sizes: list[float] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if "shape" in x and isinstance(x["shape"], list):
                shape = [int(s) for s in x["shape"]]
                strides = x.get("strides")
                order = None
                if isinstance(strides, list) and len(strides) == len(shape):
                    order = sorted(range(len(strides)), key=lambda i: (-int(strides[i]), i))
                sig.append(("tensor", x.get("dtype"), bool(x.get("contiguous", True)), len(shape), order,
                            sorted(k for k in x if k not in ("shape", "strides", "dtype", "contiguous"))))
                sizes.extend(float(s) for s in shape)
                for k in sorted(x):
                    if k not in ("shape", "strides", "dtype", "contiguous"):
                        walk(x[k])
                return
            sig.append(("dict", sorted(x)))
            for k in sorted(x):
                walk(x[k])
            return
        if isinstance(x, list):
            sig.append(("list", len(x)))
            for v in x:
                walk(v)
            return
        if isinstance(x, bool) or x is None or isinstance(x, str):
            sig.append(("value", x))
            return
        if isinstance(x, int):
            if x > 0:
                sig.append("size")
                sizes.append(float(x))
            else:
                sig.append(("value", x))
            return
        if isinstance(x, float):
            sig.append(("float", x))
            return
        sig.append(("other", repr(x)))

    walk(doc)
    return json.dumps(sig, sort_keys=True, default=str), tuple(sizes)


def distance(a: Sequence[float], b: Sequence[float]) -> float:
    """The distance of two keys' sizes (same family): the sum of ``|log2(1+a) - log2(1+b)|``."""
    return sum(abs(math.log2(1.0 + x) - math.log2(1.0 + y)) for x, y in zip(a, b))


@dataclass(frozen=True)
class Neighbour:
    """A stored winner of the problem's op under another key."""

    key: str
    config: dict[str, Any]
    median_us: float | None
    source: str  # "database" or the table's file
    distance: float
    larger: bool  # at least as large as the problem in every size


def neighbours(key_json: str, stored: Iterable[tuple[str, dict[str, Any], float | None, str]]) -> list[Neighbour]:
    """The stored winners ``(key, config, median_us, source)`` of the problem's family, nearest first
    (ties: the larger neighbour first, then the key's text, so every process orders them alike)."""
    mine = key_features(key_json)
    if mine is None:
        return []
    sig, sizes = mine
    out: dict[str, Neighbour] = {}
    for key, config, median, source in stored:
        if key == key_json or key in out:
            continue
        f = key_features(key)
        if f is None or f[0] != sig or len(f[1]) != len(sizes):
            continue
        out[key] = Neighbour(key, dict(config), median, source, distance(sizes, f[1]),
                             all(b >= a for a, b in zip(sizes, f[1])))
    return sorted(out.values(), key=lambda n: (round(n.distance, 9), not n.larger, n.key))


def _stored(problem: "Problem") -> list[tuple[str, dict[str, Any], float | None, str]]:
    """The op's winners on this device: the database's, then the tables'."""
    from tiletune.resolve import tables

    ident = problem.identity
    out: list[tuple[str, dict[str, Any], float | None, str]] = []
    db = problem.database.db
    if db is not None:
        try:
            for w in db.winners(kernel_id=ident.kernel_id):
                wi = w.identity
                if wi.space_hash == ident.space_hash and wi.device == ident.device:
                    out.append((wi.key, dict(w.config), w.median_us, "database"))
        except DatabaseError as exc:
            problem.database.failed(db, exc, problem.name)
    for entry, table in tables.family(ident):
        out.append((entry.key, dict(entry.config), entry.median_us, table.source))
    return out


def nearest(problem: "Problem") -> list[Neighbour]:
    """The problem's stored neighbours, nearest first."""
    return neighbours(problem.identity.key, _stored(problem))


def check_once(problem: "Problem", cfg: "Config") -> str | None:
    """Compile and check ``cfg`` on the problem's arguments in this process (the caller's arguments are
    saved and restored by the session); None when it passes, else why not."""
    _, why = race(problem, [cfg])
    return why.get(0)


def race(problem: "Problem", cfgs: Sequence["Config"], samples: int | None = None) -> tuple[int | None, dict[int, str]]:
    """Compile ``cfgs`` together (in parallel), check each on the problem's arguments in this process,
    and when more than one passes, time each with ``samples`` cold-L2 samples (default
    :data:`RACE_SAMPLES`): ``(index of the fastest passing config or None, {index: why it failed})``.
    The caller's arguments are saved and restored by the session."""
    from tiletune.devices.backends.base import Candidate
    from tiletune.records import Status
    from tiletune.resolve.tune import session_kwargs

    plan = problem.spec.plan if getattr(problem.backend, "ships_plan", False) else problem.plans
    session = problem.backend.open_session(plan, problem.args, **session_kwargs(problem))  # type: ignore[arg-type]
    cands = [Candidate(cfg, i, is_baseline=(i == 0)) for i, cfg in enumerate(cfgs)]
    why: dict[int, str] = {}
    passed: list[Any] = []
    try:
        compiled = set()
        for outcome in session.compile(cands):
            if outcome.status is Status.OK:
                compiled.add(outcome.candidate.order)
            else:
                why[outcome.candidate.order] = \
                    f"compile: {(outcome.reason or outcome.status.value).strip().splitlines()[0][:200]}"
        for c in cands:
            if c.order not in compiled:
                continue
            check = session.check(c)
            if check.status is Status.OK:
                passed.append(c)
            else:
                why[c.order] = f"{check.status.value}: {(check.reason or '').strip()[:200]}"
        if len(passed) <= 1:
            return (passed[0].order if passed else None), why
        n = RACE_SAMPLES if samples is None else samples
        best, best_t = None, math.inf
        for c in passed:
            got = sorted(session.sample(c, n))
            t = got[len(got) // 2] if got else math.inf
            if t < best_t:
                best, best_t = c.order, t
        return (best if best is not None else passed[0].order), why
    finally:
        session.finish(None)


class NearestSource:
    """``on_miss="nearest"``: the nearest stored neighbour's config, checked once (none: as ``"default"``);
    ``on_miss="default"``: the baseline config, checked once. Both are provisional (the key is recorded as
    pending)."""

    name = "nearest"

    def get(self, problem: "Problem", attempt: "Attempt") -> "Choice | None":
        from tiletune.resolve.problem import Choice

        if problem.policy == "default":
            return self._default(problem)
        if problem.policy != "nearest":
            return None
        from tiletune import settings

        t0 = time.perf_counter()
        race_size = settings.nearest_race()
        # the distinct configs of the nearest neighbours, nearest first: raced on the caller's arguments
        # (a neighbour's config can sit badly on this shape, e.g. one more wave of tiles), the space's
        # default config among them as a fallback that does not depend on any neighbour
        picks: list[tuple["Config", Neighbour | None]] = []
        for n in nearest(problem):
            cfg = problem.config_from(n.config)
            if cfg is None or any(cfg == c for c, _ in picks):
                continue
            picks.append((cfg, n))
            if len(picks) >= max(1, race_size):
                break
        if not picks:
            return self._default(problem)  # no tuned neighbour of this family (yet): the default config
        base = problem.spec.baseline(problem.arch)
        if race_size > 1 and all(base != c for c, _ in picks):
            picks.append((base, None))
        won, why = race(problem, [c for c, _ in picks])
        for i, reason in sorted(why.items()):
            n = picks[i][1]
            logger.info("%s: the config %s of %s failed its check (%s)", problem.name, picks[i][0],
                        f"neighbour {n.key}" if n is not None else "the default", reason)
        if won is not None:
            cfg, n = picks[won]
            if n is None:
                logger.info("%s: no neighbour's config of %s passed or beat the default config %s, "
                            "provisionally", problem.name, problem.identity.key, cfg)
                return Choice(cfg, "default", provisional=True)
            logger.info("%s: nearest neighbour of %s is %s (%s, distance %.2f) -> %s in %.2f s (raced %d)",
                        problem.name, problem.identity.key, n.key, n.source, n.distance, cfg,
                        time.perf_counter() - t0, len(picks))
            return Choice(cfg, "nearest", provisional=True, neighbour=n.key)
        if race_size <= 1:
            return self._default(problem)  # the nearest one failed its check: the default config, checked
        return None  # every config failed its check, the default's too: tune

    @staticmethod
    def _default(problem: "Problem") -> "Choice | None":
        from tiletune.resolve.problem import Choice

        cfg = problem.spec.baseline(problem.arch)
        why = check_once(problem, cfg)
        if why is not None:
            logger.info("%s: the default config %s failed its check on %s (%s); tuning", problem.name, cfg,
                        problem.identity.key, why)
            return None
        logger.info("%s: no tuned neighbour of %s; the default config %s, provisionally", problem.name,
                    problem.identity.key, cfg)
        return Choice(cfg, "default", provisional=True)
