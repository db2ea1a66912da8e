"""Search strategies (ask/tell, CPU only): the contract every strategy keeps, and each one's behaviour."""

from __future__ import annotations

import math
import sys

import pytest

import tiletune as tt
from tiletune.errors import TiletuneError
from tiletune.space.strategies import (
    STRATEGY_NAMES,
    Budget,
    EvolutionaryStrategy,
    ModelStrategy,
    make_strategy,
)

SPACE = tt.Space(
    TM=[32, 64, 128, 256],
    TN=[32, 64, 128, 256],
    TK=[16, 32, 64],
    occupancy=tt.per_arch(sm_90=[1, 2], sm_100=[1, 2, 4], default=[1]),
    constraints={"tile_fits": lambda c: c.TM * c.TN <= 128 * 256},
    baseline=dict(TM=64, TN=64, TK=32, occupancy=1),
)


def model(cfg) -> float:
    """A smooth landscape with its optimum at TM=128, TN=256, TK=32, occupancy=2 (where it exists)."""
    return (
        100.0
        * (1 + abs(math.log2(cfg.TM / 128)))
        * (1 + 0.5 * abs(math.log2(cfg.TN / 256)))
        * (1 + 0.1 * abs(math.log2(cfg.TK / 32)))
        * (1 + 0.05 * abs(cfg.occupancy - 2))
    )


def drive(strategy, batch: int = 8, limit: int | None = None, fails=lambda c: False, value=model, until=None) -> list:
    """Ask/tell until the strategy is done (or ``limit`` proposals, or a batch with a proposal that
    satisfies ``until``); return the proposals in order (up to there the same as without ``until``)."""
    out = []
    while not strategy.done and (limit is None or len(out) < limit):
        got = strategy.ask(batch if limit is None else min(batch, limit - len(out)))
        assert got, "a strategy that is not done must propose something"
        out.extend(got)
        strategy.tell([(c, None if fails(c) else value(c)) for c in got])
        if until is not None and any(until(c) for c in got):
            break
    return out


@pytest.mark.parametrize("name", STRATEGY_NAMES)
@pytest.mark.parametrize("arch", ["sm_90", "sm_100", None])
def test_every_strategy_covers_the_valid_space_once_baseline_first(name, arch):
    s = make_strategy(name, SPACE, arch, seed=1)
    got = drive(s, batch=7)
    valid = SPACE.configs(arch)
    assert got[0] == SPACE.baseline(arch)
    assert len(got) == len(set(got)) == len(valid), "no repeats, nothing missing"
    assert set(got) == set(valid), "only valid configs of this architecture (constraints, per-arch values)"
    assert s.done and s.ask(5) == []


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_per_arch_values_are_honoured(name):
    s = make_strategy(name, SPACE, "sm_100", seed=0)
    got = drive(s, batch=16, limit=40)
    assert any(c.occupancy == 4 for c in got) or name == "exhaustive"
    s = make_strategy(name, SPACE, "sm_80", seed=0)  # default values: occupancy 1 only
    got = drive(s, batch=16, limit=40)
    assert {c.occupancy for c in got} == {1}
    assert all(c.TM * c.TN <= 128 * 256 for c in got)


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_same_seed_same_proposals(name):
    a = drive(make_strategy(name, SPACE, "sm_90", seed=7), batch=8, limit=48)
    b = drive(make_strategy(name, SPACE, "sm_90", seed=7), batch=8, limit=48)
    assert a == b
    if name != "exhaustive":
        c = drive(make_strategy(name, SPACE, "sm_90", seed=8), batch=8, limit=48)
        assert c != a


def test_baseline_first_even_when_asking_one_at_a_time():
    for name in STRATEGY_NAMES:
        s = make_strategy(name, SPACE, "sm_90", seed=3)
        first = s.ask(1)
        assert first == [SPACE.baseline("sm_90")]


def test_space_without_baseline():
    sp = tt.Space(a=[1, 2, 3], b=[1, 2])
    for name in STRATEGY_NAMES:
        got = drive(make_strategy(name, sp, None, seed=0), batch=4, value=lambda c: 1.0 + c.a + c.b)
        assert sorted(got, key=lambda c: (c.a, c.b)) == sp.configs()


def test_contract_errors():
    s = make_strategy("random", SPACE, "sm_90", seed=0)
    assert s.ask(0) == []
    with pytest.raises(ValueError):
        s.ask(-1)
    with pytest.raises(TiletuneError, match="never proposed"):
        s.tell([(SPACE.config("sm_90", TM=256, TN=128, TK=64, occupancy=2), 1.0)])
    (c,) = s.ask(1)
    with pytest.raises(TiletuneError, match="positive finite"):
        s.tell([(c, float("nan"))])
    with pytest.raises(TiletuneError, match="unknown strategy"):
        make_strategy("annealing", SPACE)
    with pytest.raises(ValueError):
        tt.autotune(SPACE, strategy="annealing")


def test_budget_validation():
    assert Budget().unlimited and not Budget(max_evals=3).unlimited
    for bad in (dict(max_evals=0), dict(max_evals=2.5), dict(max_evals=True), dict(max_seconds=0),
                dict(max_seconds=float("inf"))):
        with pytest.raises(ValueError):
            Budget(**bad)
    assert tt.Budget is Budget


@pytest.mark.parametrize("name", ["evolutionary", "model"])
def test_guided_strategies_beat_space_order_on_a_smooth_landscape(name):
    best = min(model(c) for c in SPACE.configs("sm_90"))
    hits = []
    for seed in range(5):
        got = drive(make_strategy(name, SPACE, "sm_90", seed=seed), batch=8, limit=len(SPACE.configs("sm_90")),
                    until=lambda c: model(c) <= 1.05 * best)
        hits.append(next(i for i, c in enumerate(got) if model(c) <= 1.05 * best) + 1)
    assert sorted(hits)[2] <= 40, hits  # median; the space has 108 configs with 3 within 5%


def test_evolutionary_never_breeds_from_failures_and_replaces_them():
    fails = lambda c: c.TM == 256 or c.TK == 16  # noqa: E731  a third of the space fails
    s = EvolutionaryStrategy(SPACE, "sm_90", seed=2, population=6)
    first = s.ask(6)
    s.tell([(c, None if fails(c) else model(c)) for c in first])
    n_ok = sum(not fails(c) for c in first)
    if n_ok < 6:  # the failures are replaced by fresh configs before anything is bred
        second = s.ask(6)
        assert len(second) >= 6 - n_ok and not set(second) & set(first)
        s.tell([(c, None if fails(c) else model(c)) for c in second])
    got = first + drive(s, batch=6, limit=60, fails=fails)
    assert len(got) == len(set(got))
    members = s.members()
    assert len(members) == 6
    assert all(not fails(c) for _, c in members), "failed configs never become parents"
    assert [v for v, _ in members] == sorted(v for v, _ in members)
    assert s.bred > 0
    ok = [c for c in s.history if not fails(c)]
    assert min(model(c) for c in ok) <= 1.05 * min(model(c) for c in SPACE.configs("sm_90") if not fails(c))


def test_evolutionary_survives_an_all_failing_start():
    sp = tt.Space(a=list(range(8)), b=list(range(8)))
    s = EvolutionaryStrategy(sp, None, seed=0, population=4)
    got = drive(s, batch=4, limit=64, fails=lambda c: c.a < 6, value=lambda c: 10.0 - c.a + c.b)
    assert len(got) == 64 == len(set(got))  # the whole space, no stall, no repeat


def test_evolutionary_options_are_checked():
    with pytest.raises(ValueError):
        EvolutionaryStrategy(SPACE, "sm_90", population=1)
    with pytest.raises(ValueError):
        EvolutionaryStrategy(SPACE, "sm_90", mutation=1.5)


def test_model_strategy_starts_small_then_uses_the_model():
    s = ModelStrategy(SPACE, "sm_90", seed=0, n_init=6)
    first = s.ask(16)
    assert len(first) == 6  # the initial design, baseline included
    s.tell([(c, model(c)) for c in first])
    second = s.ask(16)
    assert len(second) == 16 and s.fits == 1
    # exploitation first: the first proposals are predicted fast
    assert model(second[0]) <= sorted(model(c) for c in SPACE.configs("sm_90"))[len(SPACE.configs("sm_90")) // 2]


def test_model_strategy_handles_failures():
    fails = lambda c: c.TN == 256  # noqa: E731  the fastest region fails
    s = ModelStrategy(SPACE, "sm_90", seed=0)
    got = drive(s, batch=8, limit=50, fails=fails)
    assert len(got) == len(set(got))
    ok_best = min(model(c) for c in SPACE.configs("sm_90") if not fails(c))
    assert min(model(c) for c in got if not fails(c)) <= 1.05 * ok_best


def test_model_strategy_needs_scikit_learn(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.ensemble", None)  # import fails
    with pytest.raises(TiletuneError, match="scikit-learn"):
        make_strategy("model", SPACE, "sm_90")


def test_looking_up_one_builtin_imports_only_its_module():
    """A first miss that searches exhaustively imports no other strategy's module (the surrogate's, the
    portfolio's); listing the names imports them all, in the builtins' order."""
    import subprocess

    code = ("import sys; from tiletune.space.strategies.registry import resolve_strategy, strategy_names\n"
            "c = resolve_strategy('exhaustive')\n"
            "lazy = [m for m in ('local', 'portfolio', 'surrogate') if 'tiletune.space.strategies.' + m in sys.modules]\n"
            "print(c.__name__, lazy, list(strategy_names())[:3],"
            " all('tiletune.space.strategies.' + m in sys.modules for m in ('local', 'portfolio', 'surrogate')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == "ExhaustiveStrategy [] ['exhaustive', 'random', 'evolutionary'] True"
