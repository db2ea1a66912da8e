"""The default search (``strategy=None``): exhaustive for a small space, ``"auto"`` for a big one
(issue 16: "an auto default that picks by space size and type"), and big spaces need a budget."""

from __future__ import annotations

import math

import pytest

import tiletune as tt
import tiletune.engine.search
from tiletune.devices.backends import FakeBackend
from tiletune.errors import SpaceError
from tiletune.engine.search import DEFAULT_SEARCH_EVALS, EXHAUSTIVE_MAX_CONFIGS, default_search
from tiletune.space.strategies import Budget


def _kernel(n):  # a "kernel" for the fake backend
    return None


def _plan(cfg, n):
    return tt.Launch(_kernel, (1,), (n,))


def _time(cfg) -> float:
    return 10.0 + sum((math.log2(v) - 3) ** 2 for v in cfg.values())


def space(n_params: int) -> tt.Space:
    return tt.Space(constraints={"p0_p1": lambda c: c.p0 * c.p1 <= 256},
                    **{f"p{i}": [1, 2, 4, 8, 16, 32, 64, 128] for i in range(n_params)})


def test_default_search_by_size():
    small = space(3)  # 8^3 = 512 combinations, 344 valid
    assert small.size() <= EXHAUSTIVE_MAX_CONFIGS
    assert default_search(small, None, None) == ("exhaustive", Budget())
    assert default_search(small, None, Budget(max_seconds=5.0)) == ("exhaustive", Budget(max_seconds=5.0))
    # an evaluation budget smaller than the space: a search, not exhaustive order cut off at the budget
    assert default_search(small, None, Budget(max_evals=64)) == ("auto", Budget(max_evals=64))
    assert default_search(small, None, Budget(max_evals=small.size())) == \
        ("exhaustive", Budget(max_evals=small.size()))
    mid = space(4)  # 4096 combinations, 2752 valid: listed, too many to measure every one
    assert mid.size() > EXHAUSTIVE_MAX_CONFIGS and not mid.is_lazy()
    assert default_search(mid, None, None) == ("auto", Budget(max_evals=DEFAULT_SEARCH_EVALS))
    assert default_search(mid, None, Budget(max_evals=30)) == ("auto", Budget(max_evals=30))
    assert default_search(mid, None, Budget(max_seconds=9.0)) == ("auto", Budget(max_seconds=9.0))
    huge = space(10)  # 1.07e9 combinations: never listed
    assert huge.is_lazy() and default_search(huge, None, None) == ("auto", Budget(max_evals=DEFAULT_SEARCH_EVALS))


def _tune(sp: tt.Space, **kw):
    op = tt.autotune(sp, db=False, backend=FakeBackend(_time), progress=False, **kw)(_plan)
    op(8)
    (res,) = op.results.values()
    return res


def test_a_small_space_is_still_tuned_exhaustively():
    res = _tune(space(3))
    assert res.stats["strategy"] == "exhaustive" and res.stats["evaluations"] == space(3).size()


def test_a_big_space_is_tuned_with_auto_under_the_default_budget(monkeypatch):
    monkeypatch.setattr(tiletune.engine.search, "DEFAULT_SEARCH_EVALS", 40)
    res = _tune(space(4))
    assert res.stats["strategy"] == "auto" and res.stats["evaluations"] == 40
    res = _tune(space(4), budget=Budget(max_evals=24))
    assert res.stats["strategy"] == "auto" and res.stats["evaluations"] == 24


def test_a_space_too_big_to_list_is_tuned_lazily():
    res = _tune(space(10), budget=Budget(max_evals=48))
    assert res.stats["strategy"] == "auto" and res.stats["evaluations"] == 48
    assert res.stats["space_size"] == 8 ** 10  # the product of the value counts: nothing was listed
    assert res.winner["p0"] * res.winner["p1"] <= 256
    res = _tune(space(10), strategy="evolutionary", budget=Budget(max_evals=32))
    assert res.stats["strategy"] == "evolutionary" and res.stats["evaluations"] == 32


@pytest.mark.parametrize("strategy", ["random", "exhaustive"])
def test_a_named_strategy_on_a_space_too_big_to_list_needs_a_budget(strategy):
    op = tt.autotune(space(10), db=False, backend=FakeBackend(_time), progress=False, strategy=strategy)(_plan)
    with pytest.raises(SpaceError, match=r"the space has 1\.07e\+09 combinations of parameter values on .*"
                                         r"too many to search to the end: give a budget"):
        op(8)
