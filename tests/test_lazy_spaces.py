"""Big spaces, lazily (issue 16, item 3): a space of 10^9 configs is searched without enumerating it.

Above :data:`tiletune.space.lazy.LAZY_THRESHOLD` combinations, strategies work on ``Space.lazy``: size from
the value counts, random valid configs by rejection, neighbours by index arithmetic, constraints per
config. Small spaces keep the exact pool (same picks for the same seeds: the other strategy tests pin
them). The memory test runs each strategy in a fresh process (``benchmarks/lazy_spaces.py``) and reads
its peak resident memory.
"""

from __future__ import annotations

import functools
import math
import random
import sys
from pathlib import Path

import pytest

from tiletune.errors import SpaceError
from tiletune.space.lazy import LAZY_THRESHOLD, LazySpace
from tiletune.space.spaces import Space
from tiletune.space.strategies import make_strategy
from tiletune.space.strategies.base import LazyPool

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import lazy_spaces  # noqa: E402

VALUES = [1, 2, 4, 8, 16, 32, 64, 128]


@functools.lru_cache(maxsize=None)
def isolated(strategy: str) -> dict:
    return lazy_spaces.run_isolated(strategy, 10, 240, 16, 0, timeout=300)


@functools.lru_cache(maxsize=1)
def random_run() -> dict:
    """The random search's run, once per test process (seeded: every run of it is the same)."""
    return isolated("random")


def big(n_params: int = 10) -> Space:
    return lazy_spaces.make_space(n_params)


def small() -> Space:
    return Space(a=[1, 2, 4, 8], b=[1, 2, 3], c=["x", "y"], d=[True, False],
                 constraints={"ab": lambda c: c.a * c.b <= 12, "cd": lambda c: not (c.c == "y" and c.d)},
                 baseline=dict(a=1, b=1, c="x", d=True))


def test_size_and_threshold_without_enumerating():
    sp = big()
    assert sp.product_size() == 8 ** 10 > LAZY_THRESHOLD
    assert sp.is_lazy() and not small().is_lazy()
    view = sp.lazy()
    assert view is sp.lazy() and isinstance(view, LazySpace) and len(view) == 8 ** 10
    with pytest.raises(SpaceError, match=r"1\.07e\+09 combinations .* too many to list .* Space\.lazy"):
        sp.configs()


def test_lazy_view_matches_the_enumeration_on_a_small_space():
    sp = small()
    view = sp.lazy()
    assert list(view) == sp.configs()
    for cfg in sp.configs():
        assert cfg in view
        assert view.neighbours(cfg) == sp.neighbours(cfg)
        assert view.encode(cfg) == sp.encode(cfg)
    bad = dict(a=8, b=3, c="x", d=True)  # breaks "ab"
    assert bad not in view and dict(a=3, b=1, c="x", d=True) not in view  # 3 is not a value
    assert view.neighbours(bad) == sp.neighbours(bad)  # a config that breaks a constraint has neighbours
    got = view.sample(random.Random(1), 5)
    assert len(set(got)) == 5 and all(c in set(sp.configs()) for c in got)
    assert len(view.sample(random.Random(1), 100)) == len(sp.configs())  # fewer when the space is smaller


def test_space_methods_go_lazy_above_the_threshold():
    sp = big()
    rng = random.Random(0)
    got = sp.sample(rng, n=50)
    assert len(set(got)) == 50 and all(c.p0 * c.p1 <= 256 for c in got)
    cfg = got[0]
    neigh = sp.neighbours(cfg)
    assert neigh and all(c.p0 * c.p1 <= 256 for c in neigh)
    assert all(sum(a != b for a, b in zip(c.values(), cfg.values())) == 1 for c in neigh)
    assert sp.encode(cfg) == [math.log2(v) for v in cfg.values()]


def test_strategies_on_a_lazy_space_propose_valid_distinct_configs():
    sp = big()
    for name in ("exhaustive", "random", "evolutionary", "local", "auto"):
        s = make_strategy(name, sp, None, 3)
        assert s.lazy is not None and isinstance(s.pool, LazyPool)
        seen = set()
        for _ in range(8):
            cfgs = s.ask(8)
            assert cfgs
            for c in cfgs:
                assert c.p0 * c.p1 <= 256 and c not in seen and c in s.valid
                seen.add(c)
            s.tell([(c, lazy_spaces.objective(c)) for c in cfgs])
        assert not s.done


def test_small_spaces_stay_exact():
    s = make_strategy("random", small(), None, 0)
    assert s.lazy is None and isinstance(s.pool, list) and s.pool[0] == small().baseline()


def test_lazy_search_is_deterministic_for_a_seed():
    def run(name: str) -> list:
        s = make_strategy(name, big(), None, 7)
        out = []
        for _ in range(6):
            cfgs = s.ask(4)
            s.tell([(c, lazy_spaces.objective(c)) for c in cfgs])
            out += cfgs
        return out

    for name in ("random", "evolutionary", "hybrid"):
        assert run(name) == run(name)


def test_too_sparse_a_space_says_so():
    sp = Space(constraints={"needle": lambda c: all(c[f"p{i}"] == 128 for i in range(10))},
               **{f"p{i}": VALUES for i in range(10)})
    with pytest.raises(SpaceError, match=r"1\.07e\+09 combinations \(default values\) and its constraints "
                                         r"\(needle\) accepted none of \d+ random ones: too few valid configs"):
        make_strategy("random", sp, None, 0).ask(2)


@pytest.mark.parametrize("strategy", ["random", "evolutionary", "model", "hybrid", "auto"])
def test_a_billion_configs_in_under_500_mb(strategy):
    """A few hundred evaluations on 8^10 = 1.07e9 combinations (one constraint), in a fresh process:
    every proposal valid and new, peak memory under 500 MB (imports included)."""
    r = random_run() if strategy == "random" else isolated(strategy)
    assert "error" not in r, r
    assert r["lazy"] and r["combinations"] == 8 ** 10
    assert r["evaluations"] == 240 and r["invalid_proposed"] == 0 and r["repeated_proposals"] == 0
    assert r["peak_rss_mb"] < 500, r
    if strategy != "random":  # the searches find what random search does not (the optimum is 1.0)
        rnd = random_run()
        assert r["best"] < rnd["best"], (r, rnd)
