"""Nearest-neighbour serving: a key nothing stored answers gets the config of its nearest tuned
neighbour, checked once, at once.

The neighbours of a problem are the winners of the same op (kernel id and space hash), device and
architecture, in the tuning database and in the tuning tables, under any key. The nearest is the one
of the smallest distance within the problem's *family* (:mod:`tiletune.resolve.families`). For an op
that buckets its keys the distance is measured from the call's own sizes, not from its bucket's bound
(a stored key holds its bucket's bound: the size it was tuned at, for the tables' power-of-two grids).
Ties go to the larger neighbour (a config tuned for more work rarely starves a smaller problem; the other
way round it may leave the GPU idle). When the family has fewer members than the race takes, its *kin*
follow: keys that differ only in a flag (another value of ``causal``), nearest first.

The distinct configs of the nearest neighbours (``TILETUNE_NEAREST_RACE``, the space's default config
beside them, and for the library's ops up to ``TILETUNE_NEAREST_VARIANTS`` configs of the space next to the
nearest one's that a compile cache holds: :func:`variants`) race on the caller's arguments in this process
(the configs ran correctly on neighbours of the same kernel, and a worker's start would cost more than the
answer is worth): :func:`race` compiles the two nearest ones (together) and those of the others a compile
cache holds, times them on copies of the written arguments, and checks them fastest first; one that fails its
check is passed over. The answer is
provisional: the key is recorded as pending (:mod:`tiletune.resolve.pending`) and tuned later
(``tiletune tune --pending``, :meth:`tiletune.TunedOp.tune_pending`, or in the background).

``on_miss="default"`` answers the same way with the space's baseline config instead of a neighbour's, and
so does ``"nearest"`` when no neighbour of the family is known (yet) or none passes its check: a miss
never stalls the call. Only a default config that fails its check is tuned at once.

A call of an op with a *fallback* (``autotune(fallback=...)``: the library ops' torch versions) does not
wait for the compiler either: when no compile cache holds the nearest config (a fresh machine), the first
configs compile in the background and the answer is ``"fallback"`` (:mod:`tiletune.resolve.fallback`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterable, Mapping, NamedTuple, Sequence

from tiletune.errors import DatabaseError
from tiletune.resolve import fallback
from tiletune.resolve.families import KeyFeatures, distance, key_features
from tiletune.resolve.problem import Raced

if TYPE_CHECKING:  # pragma: no cover
    from tiletune.resolve.attempt import Attempt
    from tiletune.resolve.problem import Choice, Problem
    from tiletune.space.spaces import Config

logger = logging.getLogger("tiletune")

__all__ = ["KeyFeatures", "Neighbour", "NearestSource", "key_features", "distance", "nearest", "neighbours", "variants"]

#: cold-L2 timing samples per raced config (the median decides), at most
RACE_SAMPLES = 5
#: samples per raced config first: the leader and the configs whose samples overlap its get the rest
RACE_FIRST_SAMPLES = 3
#: a race whose first sample of every config takes at least this long (microseconds) is timed with fewer
#: samples (:data:`LONG_RACE_SAMPLES` first, :data:`LONG_RACE_SAMPLES` + 1 at most): launch noise is small
#: against such a kernel, and its samples cost GPU time on the call's path
LONG_RACE_US = 1000.0
LONG_RACE_SAMPLES = 2
#: a variant of the nearest config (a race's ``optional`` config) is served over the neighbours' configs only
#: when its race median is at least this much lower (a neighbour's config won a tuning; a variant has only
#: the race's few samples behind it)
VARIANT_MARGIN = 0.03


@dataclass(frozen=True)
class Neighbour:
    """A stored winner of the problem's op under another key."""

    key: str
    config: dict[str, Any]
    median_us: float | None
    source: str  # "database" or the table's file
    distance: float
    larger: bool  # at least as large as the problem in every size
    kin: bool = False  # of the family's kin only: another value of a flag (see :class:`KeyFeatures`)
    foreign: bool = False  # tuned on another device of this architecture (a table made for it)
    variant: bool = False  # a config of the space next to this neighbour's (:func:`variants`), not its own


def neighbours(key_json: str, stored: Iterable[tuple[Any, ...]], sizes_json: str | None = None) -> list[Neighbour]:
    """The stored winners ``(key, config, median_us, source[, foreign])`` of the problem's family, nearest first
    (ties: the larger neighbour first, then the key's text, so every process orders them alike); after
    them the family's kin, ordered alike: keys that differ from the problem's only in a flag (a non-causal
    attention whose table holds causal entries only). A kin's config is a better first guess than the
    default config (the same kernel at the same sizes), but never preferred to a true neighbour's; like
    every neighbour's config it is raced and checked on the caller's arguments before it is served.
    Winners tuned on another device of this architecture (``foreign``) come after this device's, in the
    same order: a first guess where this device knows none, never preferred to what was tuned here.

    ``sizes_json``: the problem's key with its own sizes where the op buckets them
    (:attr:`~tiletune.resolve.problem.Problem.sizes_json`), the point distances are measured from: a GEMM
    of 1,058 rows is the 2,048-row bucket's key, and its nearest neighbour is the 1,024-row entry; the
    2,048-row entry (the bucket key's own, tuned at its bound, which a shipped table leaves to the race off the
    bound: :func:`tiletune.resolve.tables.left_to_the_race`) is a neighbour too, at its distance. Default:
    ``key_json``."""
    mine = key_features(key_json)
    if mine is None:
        return []
    exact = sizes_json is None or sizes_json == key_json
    if not exact:
        own = key_features(sizes_json)
        if own is not None and own.signature == mine.signature:
            mine = own
    out: dict[str, Neighbour] = {}
    for key, config, median, source, *rest in stored:
        foreign = bool(rest and rest[0])
        if (key == key_json and not foreign and exact) or key in out:
            continue  # the key itself is no neighbour, unless tuned elsewhere or at its bucket's bound, off the call
        f = key_features(key)
        if f is None or len(f.sizes) != len(mine.sizes):
            continue
        if f.signature != mine.signature and f.kin != mine.kin:
            continue
        out[key] = Neighbour(key, dict(config), median, source, distance(mine.sizes, f.sizes),
                             all(b >= a for a, b in zip(mine.sizes, f.sizes)), f.signature != mine.signature,
                             foreign)
    return sorted(out.values(), key=lambda n: (n.foreign, n.kin, round(n.distance, 9), not n.larger, n.key))


def _stored(problem: "Problem") -> list[tuple[str, dict[str, Any], float | None, str, bool]]:
    """The op's winners on this device: the database's, then the tables'; then the winners of tables made
    for another device of this architecture (foreign: see :func:`tiletune.resolve.tables.family`)."""
    from tiletune.resolve import tables

    ident = problem.identity
    out: list[tuple[str, dict[str, Any], float | None, str, bool]] = []
    db = problem.database.db
    if db is not None:
        try:
            for w in db.winners(kernel_id=ident.kernel_id):
                wi = w.identity
                if wi.space_hash == ident.space_hash and wi.device == ident.device:
                    out.append((wi.key, dict(w.config), w.median_us, "database", False))
        except DatabaseError as exc:
            problem.database.failed(db, exc, problem.name)
    for entry, table in tables.family(ident):
        out.append((entry.key, dict(entry.config), entry.median_us, table.source, table.device != ident.device))
    return out


def nearest(problem: "Problem") -> list[Neighbour]:
    """The problem's stored neighbours, nearest first."""
    return neighbours(problem.identity.key, _stored(problem), problem.sizes_json)


def variants(problem: "Problem", cfg: "Config", taken: Sequence["Config"], limit: int) -> list["Config"]:
    """Up to ``limit`` configs of the problem's space next to ``cfg``: those that differ from it in one
    parameter, then in two, and so on (space order within each), leaving out ``taken``; none on a space too
    big to list.

    Raced only for ops whose ``race_variants`` is set (the library's): a variant may never have run on any
    shape, and the race launches it unchecked in the caller's process (on the guard bands' twins, which catch
    a stray write but not an illegal address: a kernel that faults there takes the process's CUDA context)."""
    space = problem.spec.space
    if limit <= 0 or space.is_lazy(problem.arch):
        return []
    names = tuple(cfg)
    ranked = []
    for i, other in enumerate(space.candidates(problem.arch)):
        if tuple(other) != names or other == cfg or other in taken:
            continue
        ranked.append((sum(other[k] != cfg[k] for k in names), i, other))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [other for _, _, other in ranked[:limit]]


def check_once(problem: "Problem", cfg: "Config") -> str | None:
    """Compile and check ``cfg`` on the problem's arguments in this process (the caller's arguments are
    saved and restored by the session); None when it passes, else why not."""
    return race(problem, [cfg]).why.get(0)


class RaceResult(NamedTuple):
    """What :func:`race` found: ``won`` the index of the config to serve (it passed its check) or None;
    ``why`` ``{index: why it failed}`` for the configs compiled that failed (to compile, launch or check);
    ``compiled`` the indices compiled (or answered by a compile cache); ``skipped`` those never compiled
    (in no compile cache, and not needed: a config compiled before them passed); ``checked`` the indices
    checked, in order; ``medians`` ``{index: median of its race samples (us)}`` for the configs timed."""

    won: int | None
    why: dict[int, str]
    compiled: tuple[int, ...]
    skipped: tuple[int, ...]
    checked: tuple[int, ...]
    medians: Mapping[int, float] = MappingProxyType({})

    def verdict(self, i: int) -> str:
        """What became of config ``i``: ``"served"``, ``"failed: ..."``, ``"slower"`` (compiled, not
        served) or ``"not compiled"``."""
        if i == self.won:
            return "served"
        if i in self.why:
            return f"failed: {self.why[i]}"
        return "slower" if i in self.compiled else "not compiled"


def race(problem: "Problem", cfgs: Sequence["Config"], samples: int | None = None, *,
         cold: int = 1, spares: bool = False, optional: int = 0) -> RaceResult:
    # ``cold=0``: only what a compile cache holds is compiled and raced; nothing else is compiled
    """Serve the fastest of ``cfgs`` that passes its check on the problem's arguments, in this process.

    1. **Compile** together (in parallel) the first ``cold`` configs, and the others only when the front-end
       cache holds them (no front end, no ``tileiras`` run for a config that is only raced). Should none of
       those pass, the skipped ones are compiled and raced in turn.
    2. **Time first** the compiled configs (interleaved cold-L2 samples: :data:`RACE_FIRST_SAMPLES` each,
       up to ``samples`` (default :data:`RACE_SAMPLES`) for the leader and those whose samples overlap
       its), launched where they cannot touch the caller's memory (the session's ``race_samples``: the
       guard bands' twins of the written arguments).
    3. **Check** them fastest first, and serve the first that passes: one check when the fastest is
       right, and only a checked config is ever served. A session that cannot time unchecked configs
       apart from the caller's tensors checks each first and times those that pass.

    A single compiled config is checked and not timed. ``spares``: the configs after the first ``cold``
    are not raced at all, only compiled (and raced) when none of the first passes. ``optional``: the last
    ``optional`` configs are raced only when a compile cache holds them, and never compiled (left out on a
    session that cannot tell). The caller's arguments are saved and restored by the session."""
    from tiletune.devices.backends.base import Candidate
    from tiletune.resolve.tune import session_kwargs

    plan = problem.spec.plan if getattr(problem.backend, "ships_plan", False) else problem.plans
    session = problem.backend.open_session(plan, problem.args, **session_kwargs(problem))  # type: ignore[arg-type]
    cands = [Candidate(cfg, i, is_baseline=(i == 0)) for i, cfg in enumerate(cfgs)]
    n = RACE_SAMPLES if samples is None else max(1, int(samples))
    why: dict[int, str] = {}
    checked: list[int] = []
    compiled: list[int] = []
    medians: dict[int, float] = {}
    try:
        cold = max(0, cold)
        only_cached = bool(getattr(session, "compiles_only_cached", False))
        split = len(cands) - min(len(cands), max(0, optional))
        extra = cands[split:] if only_cached else []  # the optional configs: raced only when a cache holds them
        dropped = [] if only_cached else cands[split:]
        cands = cands[:split]
        if spares and cold:
            ready, skipped = _compile(session, cands[:cold] + extra, {c.order for c in extra}, why)
            skipped = [c for c in skipped if c.order < split] + cands[cold:]
        else:
            if not cold and not only_cached:
                return RaceResult(None, {}, (), tuple(c.order for c in cands + dropped), ())  # cannot tell
            lazy = {c.order for c in cands[cold:] + extra} if only_cached else set()
            ready, skipped = _compile(session, cands + extra, lazy, why)
        compiled.extend(c.order for c in ready)
        won = _pick(session, ready, n, why, checked, medians, split)
        retry = [c for c in skipped if c.order < split]  # an optional config is never compiled for a race
        if won is None and retry and cold:
            ready, _ = _compile(session, retry, set(), why)
            compiled.extend(c.order for c in ready)
            won = _pick(session, ready, n, why, checked, medians)
            skipped = [c for c in skipped if c.order >= split]
        return RaceResult(won, why, tuple(compiled), tuple(c.order for c in [*skipped, *dropped]), tuple(checked),
                          MappingProxyType(medians))
    finally:
        session.finish(None)


def _compile(session: Any, cands: Sequence[Any], lazy: set[int], why: dict[int, str]) -> tuple[list[Any], list[Any]]:
    """``(compiled, skipped)`` candidates in their order; compile failures go to ``why``."""
    from tiletune.records import Status

    ok: set[int] = set()
    skipped: set[int] = set()
    outcomes = session.compile(cands, only_cached=lazy) if lazy else session.compile(cands)
    for outcome in outcomes:
        order = outcome.candidate.order
        if outcome.status is Status.OK:
            ok.add(order)
        elif getattr(outcome, "skipped", False):
            skipped.add(order)
        else:
            why[order] = f"compile: {(outcome.reason or outcome.status.value).strip().splitlines()[0][:200]}"
    return [c for c in cands if c.order in ok], [c for c in cands if c.order in skipped]


def _check(session: Any, cand: Any, why: dict[int, str], checked: list[int]) -> bool:
    from tiletune.records import Status

    checked.append(cand.order)
    check = session.check(cand)
    if check.status is Status.OK:
        return True
    why[cand.order] = f"{check.status.value}: {(check.reason or '').strip()[:200]}"
    return False


def _median(xs: Sequence[float]) -> float:
    got = sorted(xs)
    return got[len(got) // 2] if got else math.inf


def _time(session: Any, cands: Sequence[Any], n: int) -> dict[int, list[float] | str] | None:
    """Samples of unchecked candidates from ``session.race_samples``: :data:`RACE_FIRST_SAMPLES` each, then
    up to ``n`` for the leader (lowest median) and every candidate whose samples overlap the leader's (a
    clear winner stops early); fewer when one sample of each says they are long (:data:`LONG_RACE_US`).
    None when the session cannot time them apart from the caller's memory."""
    first = min(n, RACE_FIRST_SAMPLES)
    got = session.race_samples(cands, 1)
    if got is None:
        return None
    timed = {o: t for o, t in got.items() if not isinstance(t, str) and t}
    if timed and min(min(t) for t in timed.values()) >= LONG_RACE_US:  # long kernels: fewer samples
        first, n = min(first, LONG_RACE_SAMPLES), min(n, LONG_RACE_SAMPLES + 1)
    if first > 1 and timed:
        more = session.race_samples([c for c in cands if c.order in timed], first - 1)
        if more is None:
            return got
        for o, t in more.items():
            got[o] = t if isinstance(t, str) else [*got[o], *t]
    if n <= first:
        return got
    timed = {o: t for o, t in got.items() if not isinstance(t, str) and t}
    if len(timed) <= 1:
        return got
    lead = min(timed, key=lambda o: (_median(timed[o]), o))
    hi = max(timed[lead])
    close = [o for o, t in timed.items() if o != lead and min(t) <= hi]
    if not close:
        return got
    more = session.race_samples([c for c in cands if c.order in (lead, *close)], n - first)
    if more is None:
        return got
    for o, t in more.items():
        prev = got.get(o)
        got[o] = t if isinstance(t, str) or isinstance(prev, str) or prev is None else [*prev, *t]
    return got


def _pick(session: Any, cands: Sequence[Any], n: int, why: dict[int, str], checked: list[int],
          medians: dict[int, float], optional_from: int | None = None) -> int | None:
    """The order of the fastest of the compiled ``cands`` that passes its check (see :func:`race`), or None;
    the medians of the configs timed go to ``medians``. Candidates of order ``optional_from`` or later rank
    as :data:`VARIANT_MARGIN` slower than they ran."""
    def rank(median: float, order: int) -> float:
        return median * (1.0 + VARIANT_MARGIN) if optional_from is not None and order >= optional_from else median

    if not cands:
        return None
    if len(cands) == 1:
        return cands[0].order if _check(session, cands[0], why, checked) else None
    times = _time(session, cands, n) if hasattr(session, "race_samples") else None
    if times is None:  # check each first: only configs that passed are launched on the caller's tensors
        passed = [c for c in cands if _check(session, c, why, checked)]
        if len(passed) <= 1:
            return passed[0].order if passed else None
        for c in passed:
            medians[c.order] = _median(session.sample(c, n))
        return min(passed, key=lambda c: (rank(medians[c.order], c.order), c.order)).order
    ranked = []
    for c in cands:
        t = times.get(c.order)
        if isinstance(t, str):
            why[c.order] = t
        else:
            ranked.append((rank(_median(t or []), c.order), c.order, c))
            if t:
                medians[c.order] = _median(t)
    for _, _, c in sorted(ranked, key=lambda r: (r[0], r[1])):
        if _check(session, c, why, checked):
            return c.order
    return None


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
        # a neighbour tuned on this very size (distance 0: another layout of the same sizes, or an exact key
        # of this bucket) is not raced: the others are spares, compiled only should it fail its check
        same = (picks[0][1] is not None and picks[0][1].distance == 0.0 and not picks[0][1].kin
                and not picks[0][1].foreign)
        main = len(picks)
        if race_size > 1 and not same and problem.spec.race_variants:
            # the configs next to the nearest one's (a softmax over 32,064 columns may want the chunk that its
            # 32,768-column neighbour did not): raced when a compile cache holds them, never compiled for it
            first = picks[0][1]
            assert first is not None
            twin = replace(first, variant=True)
            picks.extend((cfg, twin) for cfg in variants(problem, picks[0][0], [c for c, _ in picks],
                                                         settings.nearest_variants()))
        cfgs = [c for c, _ in picks]
        optional = len(picks) - main
        got = None
        if fallback.may_fall_back(problem):
            # what compile caches hold, nothing compiled now
            got = race(problem, cfgs[:1] if same else cfgs, cold=0, optional=0 if same else optional)
            if 0 not in got.compiled:  # the nearest config is not compiled: it compiles in the background
                fell = fallback.fall_back(problem, cfgs[:min(main, fallback.AHEAD_CONFIGS)])
                if fell is not None:
                    return fell
                got = None
            elif got.won is None:
                got = None
        if got is None:
            # the two nearest configs compile together (in parallel: about the wall time of one), as the
            # fallback's background compile does, so a new shape whose nearest config compiles cold is raced
            # against the next one instead of served unraced; a same-size neighbour's config is compiled alone
            cold = 1 if same else min(main, fallback.AHEAD_CONFIGS)
            got = race(problem, cfgs, cold=cold, spares=same, optional=optional)
        won = got.won
        raced = tuple(Raced(cfg, n.key if n is not None else None, n.distance if n is not None else None,
                            got.medians.get(i), got.verdict(i), n is not None and n.variant)
                      for i, (cfg, n) in enumerate(picks))
        for i, reason in sorted(got.why.items()):
            n = picks[i][1]
            logger.info("%s: the config %s of %s failed its check (%s)", problem.name, picks[i][0],
                        f"neighbour {n.key}" if n is not None else "the default", reason)
        if won is not None:
            cfg, n = picks[won]
            if n is None:
                logger.info("%s: no neighbour's config of %s passed or beat the default config %s, "
                            "provisionally", problem.name, problem.identity.key, cfg)
                return Choice(cfg, "default", provisional=True, raced=raced)
            logger.info("%s: nearest %s of %s is %s (%s, distance %.2f) -> %s%s in %.2f s (raced %d of %d "
                        "configs, %d checked)", problem.name,
                        "kin (another flag)" if n.kin else "neighbour (tuned on another device)" if n.foreign
                        else "neighbour",
                        problem.identity.key, n.key, n.source, n.distance,
                        cfg, " (a variant of its config)" if n.variant else "", time.perf_counter() - t0,
                        len(got.compiled), len(picks), len(got.checked))
            return Choice(cfg, "nearest", provisional=True, neighbour=n.key, raced=raced)
        if race_size <= 1:
            return self._default(problem)  # the nearest one failed its check: the default config, checked
        return None  # every config failed its check, the default's too: tune

    @staticmethod
    def _default(problem: "Problem") -> "Choice | None":
        from tiletune.resolve.problem import Choice

        cfg = problem.spec.baseline(problem.arch)
        if fallback.may_fall_back(problem):
            got = race(problem, [cfg], cold=0)  # a compile cache holds it: checked; else it compiles meanwhile
            if not got.compiled:
                fell = fallback.fall_back(problem, [cfg])
                if fell is not None:
                    return fell
            elif got.won is not None:
                logger.info("%s: no tuned neighbour of %s; the default config %s, provisionally", problem.name,
                            problem.identity.key, cfg)
                return Choice(cfg, "default", provisional=True)
        why = check_once(problem, cfg)
        if why is not None:
            logger.info("%s: the default config %s failed its check on %s (%s); tuning", problem.name, cfg,
                        problem.identity.key, why)
            return None
        logger.info("%s: no tuned neighbour of %s; the default config %s, provisionally", problem.name,
                    problem.identity.key, cfg)
        return Choice(cfg, "default", provisional=True)
