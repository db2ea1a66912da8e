"""Tests for tiletune.stats (pure statistics; no GPU)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from tiletune.stats import (
    EXACT_BINOMIAL_MAX_N,
    Entry,
    SampleSummary,
    StoppingRule,
    hopeless,
    median_ci_ranks,
    raced_out,
    rank,
    summarize,
)


def make_summary(
    median: float,
    rel_halfwidth: float = 0.0,
    n: int = 50,
) -> SampleSummary:
    """A synthetic summary with a symmetric CI of the given relative half-width."""
    hw = median * rel_halfwidth
    return SampleSummary(
        n=n,
        median=median,
        mean=median,
        minimum=median - hw,
        mad=hw,
        ci_low=median - hw,
        ci_high=median + hw,
        rel_halfwidth=rel_halfwidth,
    )


# ----------------------------------------------------------------------------- summarize


def test_summarize_basic_fields():
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0, 100.0])
    assert s.n == 6
    assert s.median == pytest.approx(3.5)
    assert s.mean == pytest.approx(115.0 / 6)
    assert s.minimum == 1.0
    # |x - 3.5| = 1.5, 2.5, 0.5, 1.5, 0.5, 96.5 -> median 1.5
    assert s.mad == pytest.approx(1.5 * 1.4826)


def test_summarize_empty_raises():
    with pytest.raises(ValueError):
        summarize([])


@pytest.mark.parametrize("bad", [[1.0, float("nan")], [1.0, float("inf")]])
def test_summarize_nonfinite_raises(bad):
    with pytest.raises(ValueError):
        summarize(bad)


@pytest.mark.parametrize("conf", [0.0, 1.0, -0.5, 1.5])
def test_summarize_bad_confidence_raises(conf):
    with pytest.raises(ValueError):
        summarize([1.0, 2.0, 3.0], confidence=conf)


@pytest.mark.parametrize("n", [1, 2])
def test_tiny_n_infinite_ci(n):
    s = summarize([10.0 + i for i in range(n)])
    assert s.ci_low == -math.inf and s.ci_high == math.inf
    assert s.rel_halfwidth == math.inf
    assert s.halfwidth == math.inf


@pytest.mark.parametrize("n", [3, 4, 5])
def test_small_n_falls_back_to_min_max(n):
    xs = [float(v) for v in (7, 3, 9, 5, 1)[:n]]
    s = summarize(xs)
    assert (s.ci_low, s.ci_high) == (min(xs), max(xs))
    assert math.isfinite(s.rel_halfwidth)


def test_known_order_statistic_ranks():
    # Textbook values for a 95% median CI: n=6 -> (1, 6), n=10 -> (2, 9), n=20 -> (6, 15)
    assert median_ci_ranks(5, 0.95) is None
    assert median_ci_ranks(6, 0.95) == (1, 6)
    assert median_ci_ranks(10, 0.95) == (2, 9)
    assert median_ci_ranks(20, 0.95) == (6, 15)
    s = summarize([float(v) for v in range(1, 11)])  # 1..10
    assert (s.ci_low, s.ci_high) == (2.0, 9.0)


def _exact_ranks(n: int, confidence: float) -> tuple[int, int] | None:
    tail = Fraction(1) - Fraction(confidence)
    tail /= 2
    best = 0
    cdf = Fraction(0)
    for k in range(0, (n + 1) // 2):
        cdf += Fraction(math.comb(n, k), 2**n)
        if cdf > tail:
            break
        best = k + 1
    return None if best < 1 else (best, n - best + 1)


@pytest.mark.parametrize("n", [3, 7, 11, 25, 60, 137, 400, 999])
@pytest.mark.parametrize("conf", [0.9, 0.95, 0.99])
def test_ranks_match_independent_exact_binomial(n, conf):
    assert median_ci_ranks(n, conf) == _exact_ranks(n, conf)


@pytest.mark.parametrize("n", [EXACT_BINOMIAL_MAX_N + 1, 2000, 5000])
def test_normal_approximation_close_to_exact(n):
    lo, hi = median_ci_ranks(n, 0.95)
    exact_lo, _ = _exact_ranks(n, 0.95)
    assert hi == n - lo + 1
    assert abs(lo - exact_lo) <= 1


@pytest.mark.parametrize("n", [50, 2000])
def test_ci_coverage_lognormal(n):
    # Lognormal(mu, sigma) has median exp(mu); 95% CI should cover it ~95% of the time.
    rng = np.random.default_rng(12345 + n)
    true_median = math.exp(math.log(20.0))
    trials = 400
    covered = 0
    for _ in range(trials):
        xs = rng.lognormal(mean=math.log(20.0), sigma=0.5, size=n)
        s = summarize(xs)
        covered += s.ci_low <= true_median <= s.ci_high
    assert 0.90 * trials <= covered <= 0.99 * trials


def test_ci_contains_median_and_ordered():
    rng = np.random.default_rng(0)
    xs = rng.lognormal(3.0, 0.3, size=101)
    s = summarize(xs)
    assert s.minimum <= s.ci_low <= s.median <= s.ci_high <= xs.max()
    assert s.halfwidth == pytest.approx((s.ci_high - s.ci_low) / 2)
    assert s.rel_halfwidth == pytest.approx(s.halfwidth / s.median)


def test_rel_halfwidth_shrinks_with_n():
    rng = np.random.default_rng(7)
    widths = []
    for n in (10, 40, 160, 640, 2560):
        # average over a few draws so the monotonic trend is not luck
        widths.append(np.mean([summarize(rng.lognormal(3.0, 0.4, size=n)).rel_halfwidth for _ in range(20)]))
    assert all(a > b for a, b in zip(widths, widths[1:]))
    # roughly 1/sqrt(n): 256x more samples -> ~16x narrower
    assert widths[0] / widths[-1] > 8


def test_rel_halfwidth_inf_for_nonpositive_median():
    s = summarize([0.0] * 10)
    assert s.rel_halfwidth == math.inf
    assert s.halfwidth == 0.0


def test_stopping_continue_below_min_samples_even_if_converged():
    rule = StoppingRule(min_samples=10)
    assert rule.decide(make_summary(100.0, 0.0, n=9), spent_s=0.01) is None


def test_stopping_max_seconds_overrides_min_samples():
    rule = StoppingRule(min_samples=10, max_seconds=1.0)
    assert rule.decide(make_summary(100.0, 0.5, n=2), spent_s=1.0) == "max_seconds"
    assert rule.decide(make_summary(100.0, 0.5, n=2), spent_s=0.99) is None


def test_stopping_converged():
    rule = StoppingRule(rel_ci=0.01, abs_ci_us=0.0)
    assert rule.decide(make_summary(100.0, 0.009, n=20), spent_s=0.1) == "converged"
    assert rule.decide(make_summary(100.0, 0.011, n=20), spent_s=0.1) is None


def test_stopping_abs_converged():
    rule = StoppingRule(rel_ci=0.01, abs_ci_us=0.25)
    # 5 us kernel, 4% relative half-width = 0.2 us absolute
    assert rule.decide(make_summary(5.0, 0.04, n=20), spent_s=0.1) == "abs_converged"
    # 10 us kernel, 4% = 0.4 us -> keep going
    assert rule.decide(make_summary(10.0, 0.04, n=20), spent_s=0.1) is None


def test_stopping_max_samples():
    rule = StoppingRule(max_samples=400)
    assert rule.decide(make_summary(100.0, 0.05, n=400), spent_s=0.1) == "max_samples"
    assert rule.decide(make_summary(100.0, 0.05, n=399), spent_s=0.1) is None


def test_stopping_with_real_summary_infinite_ci_does_not_converge():
    rule = StoppingRule(min_samples=1)
    s = summarize([3.0, 3.0])  # n < 3 -> infinite CI
    assert rule.decide(s, spent_s=0.0) is None


@pytest.mark.parametrize(
    "kwargs",
    [dict(min_samples=0), dict(min_samples=20, max_samples=10), dict(rel_ci=-0.1), dict(max_seconds=0.0)],
)
def test_stopping_rule_validation(kwargs):
    with pytest.raises(ValueError):
        StoppingRule(**kwargs)


# ----------------------------------------------------------------------------- racing


def test_raced_out_clear_loser():
    best = make_summary(100.0, 0.01, n=20)  # CI [99, 101]
    cand = make_summary(110.0, 0.01, n=20)  # CI [108.9, 111.1]
    assert raced_out(cand, best)


def test_raced_out_overlapping_or_within_margin():
    best = make_summary(100.0, 0.01, n=20)  # ci_high 101 -> threshold 103.02
    assert not raced_out(make_summary(103.0, 0.0, n=20), best)
    assert raced_out(make_summary(103.1, 0.0, n=20), best)
    assert not raced_out(make_summary(104.0, 0.05, n=20), best)  # ci_low 98.8 overlaps


def test_raced_out_requires_five_samples():
    best = make_summary(100.0, 0.01, n=20)
    cand = make_summary(200.0, 0.01, n=20)
    assert raced_out(cand, best)
    assert not raced_out(make_summary(200.0, 0.01, n=4), best)
    assert not raced_out(cand, make_summary(100.0, 0.01, n=4))


def test_hopeless():
    best = make_summary(10.0, n=3)
    assert hopeless(make_summary(31.0, n=3), best)
    assert not hopeless(make_summary(29.0, n=3), best)
    assert not hopeless(make_summary(31.0, n=2), best)
    assert not hopeless(make_summary(31.0, n=3), make_summary(10.0, n=2))
    assert hopeless(make_summary(21.0, n=3), best, factor=2.0)


# ----------------------------------------------------------------------------- rank


def test_rank_clear_winner():
    entries = [
        Entry(0, True, make_summary(100.0, 0.002)),
        Entry(1, False, make_summary(80.0, 0.002)),
        Entry(2, False, make_summary(90.0, 0.002)),
    ]
    r = rank(entries)
    assert r.winner.ident == 1
    assert r.fastest.ident == 1
    assert [e.ident for e in r.tied] == [1]
    assert [e.ident for e in r.ordered] == [1, 2, 0]


def test_rank_tie_prefers_the_baseline_only_inside_the_smallest_band():
    entries = [
        Entry(0, False, make_summary(100.0, 0.01)),
        Entry(1, False, make_summary(99.0, 0.01)),
        Entry(2, True, make_summary(100.5, 0.01)),  # band 2%: 99 * 1.02 = 100.98 -> tied, but 1.5% slower
    ]
    r = rank(entries)
    assert r.fastest.ident == 1
    assert {e.ident for e in r.tied} == {0, 1, 2}
    assert r.winner.ident == 1  # a tie is no reason to give up 1.5%
    entries[2] = Entry(2, True, make_summary(99.4, 0.01))  # 0.4% slower: inside min_band 0.5%
    assert rank(entries).winner.ident == 2
    assert rank(entries, min_band=0.003).winner.ident == 1  # 0.4% > 0.3%


def test_rank_tie_without_baseline_picks_the_fastest():
    entries = [
        Entry(3, False, make_summary(99.0, 0.01)),
        Entry(5, False, make_summary(100.0, 0.01)),
        Entry(1, False, make_summary(100.5, 0.01)),
        Entry(2, False, make_summary(101.5, 0.01)),  # just outside 99 * 1.02 = 100.98
        Entry(0, True, make_summary(120.0, 0.01)),  # baseline, but clearly slower
    ]
    r = rank(entries)
    assert r.fastest.ident == 3
    assert {e.ident for e in r.tied} == {1, 3, 5}
    assert r.winner.ident == 3
    # equal medians: the smaller ident, whatever the order of the entries
    same = [Entry(7, False, make_summary(99.0, 0.01)), Entry(4, False, make_summary(99.0, 0.01))]
    assert rank(same).winner.ident == 4 and rank(same[::-1]).winner.ident == 4


def test_rank_min_band_applies_to_noiseless_entries():
    entries = [Entry(0, True, make_summary(100.4, 0.0)), Entry(1, False, make_summary(100.0, 0.0))]
    assert rank(entries).winner.ident == 0  # 0.4% < min_band 0.5%
    entries = [Entry(0, True, make_summary(100.6, 0.0)), Entry(1, False, make_summary(100.0, 0.0))]
    assert rank(entries).winner.ident == 1  # 0.6% > min_band


def test_rank_band_clamped_by_max_band():
    # Baseline 5% slower with huge noise: unclamped band (0.5 + 0.002) would tie it.
    entries = [
        Entry(0, True, make_summary(105.0, 0.5)),
        Entry(1, False, make_summary(100.0, 0.002)),
    ]
    r = rank(entries)
    assert r.winner.ident == 1
    assert [e.ident for e in r.tied] == [1]
    # ...but 2.9% slower is still within max_band 3%: tied (the faster one still wins)
    entries[0] = Entry(0, True, make_summary(102.9, 0.5))
    assert sorted(e.ident for e in rank(entries).tied) == [0, 1] and rank(entries).winner.ident == 1
    # and an infinite half-width also clamps to max_band
    entries[0] = Entry(0, True, dataclasses.replace(make_summary(102.9), rel_halfwidth=math.inf))
    assert sorted(e.ident for e in rank(entries).tied) == [0, 1]
    entries[0] = Entry(0, True, dataclasses.replace(make_summary(105.0), rel_halfwidth=math.inf))
    assert [e.ident for e in rank(entries).tied] == [1]


def test_rank_equal_medians_fastest_by_ident():
    entries = [Entry(4, False, make_summary(50.0)), Entry(2, False, make_summary(50.0))]
    r = rank(entries)
    assert r.fastest.ident == 2
    assert [e.ident for e in r.ordered] == [2, 4]


def test_rank_deterministic_under_permutation():
    rng = np.random.default_rng(3)
    entries = []
    for i in range(6):
        xs = rng.lognormal(math.log(100.0 + 0.3 * i), 0.02, size=60)
        entries.append(Entry(i, i == 4, summarize(xs)))
    reference = rank(entries)
    assert len(reference.tied) >= 2  # the scenario actually exercises the tie-break
    for perm in itertools.permutations(entries):
        assert rank(list(perm)) == reference


def test_rank_errors():
    with pytest.raises(ValueError):
        rank([])
    with pytest.raises(ValueError):
        rank([Entry(0, False, make_summary(1.0)), Entry(0, True, make_summary(2.0))])
    with pytest.raises(ValueError):
        rank([Entry(0, False, make_summary(1.0))], min_band=0.05, max_band=0.01)


# ----------------------------------------------------------------------------- mutation-testing gaps (issue 21)


def test_rank_uses_the_median_not_the_mean():
    # A is faster in the median, but a few preempted samples drag its mean far above B's;
    # B is steady and slower in the median. Ranking by the mean would pick B.
    a = summarize([100.0] * 45 + [1000.0] * 5)
    b = summarize([110.0] * 50)
    assert a.median < b.median and a.mean > b.mean  # the scenario: the two statistics disagree
    r = rank([Entry(0, False, b), Entry(1, False, a)])
    assert r.fastest.ident == 1 and r.winner.ident == 1
    assert [e.ident for e in r.ordered] == [1, 0]
    # and the baseline does not win on its mean either
    assert rank([Entry(0, True, b), Entry(1, False, a)]).winner.ident == 1


def test_summarize_computes_in_float64():
    # float32 input must not be summed in float32: (sorted) 1 + 1 + 1 + 2**24 rounds to 2**24 + 4 there
    xs = np.array([2.0**24, 1.0, 1.0, 1.0], dtype=np.float32)
    s = summarize(xs)
    assert s.mean == (2.0**24 + 3.0) / 4
    assert isinstance(s.median, float) and isinstance(s.mean, float)


def test_summarize_passes_its_confidence_to_the_ranks():
    xs = [float(v) for v in range(1, 11)]
    assert (summarize(xs, confidence=0.95).ci_low, summarize(xs, confidence=0.95).ci_high) == (2.0, 9.0)
    assert (summarize(xs, confidence=0.99).ci_low, summarize(xs, confidence=0.99).ci_high) == (1.0, 10.0)
    assert (summarize(xs, confidence=0.5).ci_low, summarize(xs, confidence=0.5).ci_high) == (4.0, 7.0)


def test_rel_halfwidth_for_a_median_below_one():
    s = summarize([0.4, 0.5, 0.6, 0.5, 0.5, 0.45, 0.55])  # sub-microsecond samples
    assert s.median == 0.5
    assert s.rel_halfwidth == pytest.approx((s.ci_high - s.ci_low) / 2 / 0.5)
    assert math.isfinite(s.rel_halfwidth)


def test_error_messages_name_the_problem():
    with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\), got 1.5"):
        median_ci_ranks(10, 1.5)
    with pytest.raises(ValueError, match=r"n must be >= 1, got 0"):
        median_ci_ranks(0)
    with pytest.raises(ValueError, match=r"^summarize\(\) needs at least one sample$"):
        summarize([])
    with pytest.raises(ValueError, match=r"^samples must be finite$"):
        summarize([1.0, math.nan])
    with pytest.raises(ValueError, match=r"^min_samples must be >= 1, got 0$"):
        StoppingRule(min_samples=0)
    with pytest.raises(ValueError, match=r"^max_samples \(10\) must be >= min_samples \(20\)$"):
        StoppingRule(min_samples=20, max_samples=10)
    with pytest.raises(ValueError, match=r"^rel_ci and abs_ci_us must be >= 0$"):
        StoppingRule(abs_ci_us=-1.0)
    with pytest.raises(ValueError, match=r"^max_seconds must be > 0, got 0.0$"):
        StoppingRule(max_seconds=0.0)
    with pytest.raises(ValueError, match=r"^rank\(\) needs at least one entry$"):
        rank([])
    with pytest.raises(ValueError, match=r"^need 0 <= min_band <= max_band, got 0.05, 0.01$"):
        rank([Entry(0, False, make_summary(1.0))], min_band=0.05, max_band=0.01)
    with pytest.raises(ValueError, match=r"^need 0 <= min_band"):
        rank([Entry(0, False, make_summary(1.0))], min_band=-0.01, max_band=0.01)
    with pytest.raises(ValueError, match=r"^entry idents must be unique$"):
        rank([Entry(0, False, make_summary(1.0)), Entry(0, True, make_summary(2.0))])


def test_stopping_rule_accepts_its_boundaries():
    StoppingRule(min_samples=5, max_samples=5)  # equal is fine
    StoppingRule(rel_ci=0.0, abs_ci_us=0.0)  # zero targets mean "never converge early"
    with pytest.raises(ValueError):
        StoppingRule(rel_ci=-1e-9)


def test_stopping_thresholds_are_inclusive():
    rule = StoppingRule(rel_ci=0.25, abs_ci_us=0.0, min_samples=1)
    assert rule.decide(make_summary(8.0, 0.25, n=20), spent_s=0.0) == "converged"  # exactly at rel_ci
    rule = StoppingRule(rel_ci=0.0, abs_ci_us=0.5, min_samples=1)
    assert rule.decide(make_summary(4.0, 0.125, n=20), spent_s=0.0) == "abs_converged"  # half-width 0.5


def test_raced_out_boundaries():
    best = make_summary(100.0, 0.0, n=5)
    assert raced_out(make_summary(200.0, 0.0, n=5), best)  # five samples each are enough
    assert not raced_out(make_summary(200.0, 0.0, n=4), best)
    assert not raced_out(make_summary(200.0, 0.0, n=5), make_summary(100.0, 0.0, n=4))
    # exactly at the margin: not (yet) raced out
    assert not raced_out(make_summary(150.0, 0.0, n=5), best, margin=0.5)
    assert raced_out(make_summary(150.0, 0.0, n=5), best, margin=0.25)
    # an undefined interval never races a candidate out
    open_low = dataclasses.replace(make_summary(500.0, 0.0, n=5), ci_low=-math.inf)
    assert not raced_out(open_low, best)
    open_high = dataclasses.replace(best, ci_high=math.inf)
    assert not raced_out(make_summary(500.0, 0.0, n=5), open_high)


def test_hopeless_is_strict_at_the_factor():
    best = make_summary(10.0, n=3)
    assert not hopeless(make_summary(30.0, n=3), best)  # exactly 3x: still measured
    assert hopeless(make_summary(30.5, n=3), best)


def test_rank_band_edge_is_tied_and_equal_bands_are_valid():
    entries = [Entry(0, True, make_summary(150.0)), Entry(1, False, make_summary(100.0))]
    # min_band == max_band == 0.5: 150 is exactly at the edge of 100's band -> tied -> baseline
    assert rank(entries, min_band=0.5, max_band=0.5).winner.ident == 0
    assert rank(entries, min_band=0.25, max_band=0.25).winner.ident == 1
    # min_band 0 is valid: no band at all
    assert rank([Entry(0, True, make_summary(100.5)), Entry(1, False, make_summary(100.0))],
                min_band=0.0, max_band=0.0).winner.ident == 1


def test_summary_median_and_mad_equal_numpys_without_importing_numpy_ma():
    import subprocess
    import sys

    import numpy as np

    from tiletune.stats import MAD_SCALE, summarize

    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 4, 7, 10, 51, 100):
        x = rng.lognormal(3.0, 0.2, size=n)
        s = summarize(list(x))
        assert s.median == float(np.median(x))
        assert s.mad == float(np.median(np.abs(x - np.median(x)))) * MAD_SCALE
    code = ("import sys; from tiletune.stats import summarize; summarize([3.0, 1.0, 2.0, 5.0]); "
            "print('numpy.ma' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]
