"""Robust statistics for the timing harness (pure Python + numpy; no GPU, no torch).

GPU kernel timings are noisy and right-skewed (clock changes, preemption, cache
effects), so everything here is built on the **median** and on order
statistics rather than on the mean and a normal model:

* :func:`summarize` turns a batch of samples (microseconds) into a
  :class:`SampleSummary` with a distribution-free confidence interval for the
  median.
* :class:`StoppingRule` decides when a candidate has been measured enough.
* :func:`raced_out` and :func:`hopeless` let the tuner drop candidates early.
* :func:`rank` picks the fastest median (the baseline where it is within the
  smallest band of it), and reports the entries inside each other's noise as tied.

Median confidence interval
--------------------------
For ``n`` i.i.d. samples from a continuous distribution with median ``m``, the
number ``B`` of samples below ``m`` is ``Binomial(n, 1/2)``. With sorted samples
``x(1) <= ... <= x(n)`` and ``u = n - l + 1``::

    P(x(l) <= m <= x(u)) = 1 - 2 * P(B <= l - 1)

We pick the largest ``l >= 1`` with ``P(B <= l - 1) <= (1 - confidence) / 2``,
so the coverage is *at least* ``confidence`` (conservative). The binomial CDF is
computed exactly with integer arithmetic (successive ``math.comb`` terms) for
``n <= EXACT_BINOMIAL_MAX_N``; above that the normal approximation
``l = floor((n - z * sqrt(n)) / 2)`` with ``z = Phi^-1((1 + confidence) / 2)``
(from :class:`statistics.NormalDist`) is used, whose error is negligible at
those sizes. Ranks are cached per ``(n, confidence)`` so repeated calls after
every batch cost only the sort.

When no ``l >= 1`` satisfies the bound (e.g. ``n = 5`` at 95 %), the interval
falls back to ``[min, max]``; for ``n < 3`` it is ``(-inf, +inf)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Any, Sequence

import numpy as np

__all__ = [
    "EXACT_BINOMIAL_MAX_N",
    "MAD_SCALE",
    "Entry",
    "Ranking",
    "SampleSummary",
    "StoppingRule",
    "hopeless",
    "median_ci_ranks",
    "raced_out",
    "rank",
    "summarize",
]

#: Scale factor making the MAD a consistent estimator of the standard deviation for normal data.
MAD_SCALE = 1.4826

#: Largest ``n`` for which the median-CI ranks use the exact binomial CDF (normal approximation above).
EXACT_BINOMIAL_MAX_N = 1000

STOP_CONVERGED = "converged"
STOP_ABS_CONVERGED = "abs_converged"
STOP_MAX_SAMPLES = "max_samples"
STOP_MAX_SECONDS = "max_seconds"


@dataclass(frozen=True)
class SampleSummary:
    """Robust summary of one candidate's timing samples (all times in microseconds).

    Attributes:
        n: number of samples.
        median: sample median.
        mean: arithmetic mean (reported only; decisions use the median).
        minimum: smallest sample.
        mad: median absolute deviation from the median, scaled by :data:`MAD_SCALE` (1.4826).
        ci_low: lower end of the distribution-free confidence interval for the median
            (``-inf`` when ``n < 3``).
        ci_high: upper end of that interval (``+inf`` when ``n < 3``).
        rel_halfwidth: ``(ci_high - ci_low) / 2 / median``; ``inf`` when undefined
            (infinite interval or non-positive median).
    """

    n: int
    median: float
    mean: float
    minimum: float
    mad: float
    ci_low: float
    ci_high: float
    rel_halfwidth: float

    @property
    def halfwidth(self) -> float:
        """Absolute half-width ``(ci_high - ci_low) / 2`` of the median CI (``inf`` when undefined)."""
        width = self.ci_high - self.ci_low
        return width / 2.0 if math.isfinite(width) else math.inf


def _check_confidence(confidence: float) -> None:
    if not (0.0 < confidence < 1.0):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


@lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int] | None:
    """1-based order-statistic ranks ``(l, u)`` of a ``confidence`` CI for the median of ``n`` samples.

    ``u = n - l + 1`` and ``P(x(l) <= median <= x(u)) >= confidence`` for continuous data.
    Exact binomial CDF for ``n <= EXACT_BINOMIAL_MAX_N``, normal approximation above
    (see the module docstring). Returns ``None`` when no interval can be formed at
    this confidence (too few samples).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    _check_confidence(confidence)
    tail = (1.0 - confidence) / 2.0
    if n <= EXACT_BINOMIAL_MAX_N:
        # Largest l with P(B <= l-1) <= tail, B ~ Binomial(n, 1/2): accumulate C(n, k) exactly.
        limit = tail * 2.0**n  # compare integer counts with tail * 2^n
        cum = 0
        term = 1  # C(n, 0)
        l = 0
        for k in range(0, (n + 1) // 2):
            cum += term
            if cum > limit:
                break
            l = k + 1
            term = term * (n - k) // (k + 1)
    else:
        z = NormalDist().inv_cdf(1.0 - tail)
        l = int(math.floor((n - z * math.sqrt(n)) / 2.0))
    if l < 1:
        return None
    return l, n - l + 1


def _sorted_median(x: Any) -> float:
    """The median of a sorted, non-empty float64 array: ``np.median``'s value (the two middle values' mean
    for an even count) without its first call's import of ``numpy.ma`` (tens of ms on a tuning's path)."""
    n = int(x.size)
    mid = n // 2
    return float(x[mid]) if n % 2 else float((x[mid - 1] + x[mid]) / 2.0)


def summarize(samples: Sequence[float], confidence: float = 0.95) -> SampleSummary:
    """Summarize timing samples (microseconds) into a :class:`SampleSummary`.

    The median CI comes from order statistics (see :func:`median_ci_ranks`): with too
    few samples for the requested confidence it is ``[min, max]``, and for ``n < 3``
    it is ``(-inf, +inf)``. Cost is one ``numpy`` sort, fine for thousands of samples.

    Raises:
        ValueError: if ``samples`` is empty, contains non-finite values, or
            ``confidence`` is not in ``(0, 1)``.
    """
    _check_confidence(confidence)
    x = np.sort(np.asarray(samples, dtype=np.float64).ravel())
    n = int(x.size)
    if n == 0:
        raise ValueError("summarize() needs at least one sample")
    if not np.all(np.isfinite(x)):
        raise ValueError("samples must be finite")
    median = _sorted_median(x)
    mad = _sorted_median(np.sort(np.abs(x - median))) * MAD_SCALE
    if n < 3:
        ci_low, ci_high = -math.inf, math.inf
    else:
        ranks = median_ci_ranks(n, confidence)
        if ranks is None:
            ci_low, ci_high = float(x[0]), float(x[-1])
        else:
            ci_low, ci_high = float(x[ranks[0] - 1]), float(x[ranks[1] - 1])
    width = ci_high - ci_low
    rel = width / 2.0 / median if (math.isfinite(width) and median > 0.0) else math.inf
    return SampleSummary(
        n=n,
        median=median,
        mean=float(x.mean()),
        minimum=float(x[0]),
        mad=mad,
        ci_low=ci_low,
        ci_high=ci_high,
        rel_halfwidth=rel,
    )


@dataclass(frozen=True)
class StoppingRule:
    """When to stop measuring one candidate.

    Attributes:
        rel_ci: stop (``"converged"``) once ``rel_halfwidth <= rel_ci``.
        min_samples: never stop with fewer samples, unless the time budget is spent.
        max_samples: stop (``"max_samples"``) once this many samples were taken.
        max_seconds: stop (``"max_seconds"``) once ``spent_s >= max_seconds``; ``spent_s``
            is the GPU time spent on this candidate (sum of samples, in seconds) or
            the wall time, as the caller chooses.
        abs_ci_us: stop (``"abs_converged"``) once the absolute CI half-width, in
            microseconds, is ``<= abs_ci_us`` (useful for very short kernels).
    """

    rel_ci: float = 0.01
    min_samples: int = 10
    max_samples: int = 400
    max_seconds: float = 1.0
    abs_ci_us: float = 0.25

    def __post_init__(self) -> None:
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {self.min_samples!r}")
        if self.max_samples < self.min_samples:
            raise ValueError(
                f"max_samples ({self.max_samples!r}) must be >= min_samples ({self.min_samples!r})"
            )
        if not self.rel_ci >= 0.0 or not self.abs_ci_us >= 0.0:
            raise ValueError("rel_ci and abs_ci_us must be >= 0")
        if not self.max_seconds > 0.0:
            raise ValueError(f"max_seconds must be > 0, got {self.max_seconds!r}")

    def decide(self, summary: SampleSummary, spent_s: float) -> str | None:
        """Return ``None`` to keep measuring, else the reason to stop.

        Reasons, checked in this order: ``"max_seconds"`` (applies even below
        ``min_samples``), then, only once ``summary.n >= min_samples``:
        ``"converged"``, ``"abs_converged"``, ``"max_samples"``.
        """
        if spent_s >= self.max_seconds:
            return STOP_MAX_SECONDS
        if summary.n < self.min_samples:
            return None
        if summary.rel_halfwidth <= self.rel_ci:
            return STOP_CONVERGED
        if summary.halfwidth <= self.abs_ci_us:
            return STOP_ABS_CONVERGED
        if summary.n >= self.max_samples:
            return STOP_MAX_SAMPLES
        return None


def raced_out(candidate: SampleSummary, best: SampleSummary, margin: float = 0.02) -> bool:
    """True when ``candidate`` clearly cannot beat ``best``.

    That is ``candidate.ci_low > best.ci_high * (1 + margin)``: the candidate's median CI lies
    entirely above the best's, with a relative margin. Requires ``n >= 5`` for both;
    returns False otherwise (or if either bound is not finite).
    """
    if candidate.n < 5 or best.n < 5:
        return False
    if not (math.isfinite(candidate.ci_low) and math.isfinite(best.ci_high)):
        return False
    return candidate.ci_low > best.ci_high * (1.0 + margin)


def hopeless(candidate: SampleSummary, best: SampleSummary, factor: float = 3.0) -> bool:
    """Cheap early cut: True when ``candidate.median > factor * best.median`` and both have ``n >= 3``."""
    if candidate.n < 3 or best.n < 3:
        return False
    return candidate.median > factor * best.median


@dataclass(frozen=True)
class Entry:
    """One measured candidate for :func:`rank`.

    Attributes:
        ident: position in the candidate order (0 = first); must be unique within a ranking.
        is_baseline: whether this is the baseline (default / current) configuration.
        summary: its timing summary.
    """

    ident: int
    is_baseline: bool
    summary: SampleSummary


@dataclass(frozen=True)
class Ranking:
    """Result of :func:`rank`.

    Attributes:
        winner: the chosen entry: the baseline if its median is within ``min_band`` of the fastest's,
            else the fastest.
        fastest: the entry with the smallest median (ties broken by smaller ident).
        tied: entries within their tie band of ``fastest`` (including it), sorted by ``(median, ident)``.
        ordered: all entries sorted by ``(median, ident)``.
    """

    winner: Entry
    fastest: Entry
    tied: tuple[Entry, ...]
    ordered: tuple[Entry, ...]


def _order_key(e: Entry) -> tuple[float, int]:
    return (e.summary.median, e.ident)


def rank(entries: Sequence[Entry], min_band: float = 0.005, max_band: float = 0.03) -> Ranking:
    """Rank entries by median with a noise-aware tie band and a deterministic tie-break.

    For each entry ``c`` the band is
    ``clamp(fastest.rel_halfwidth + c.rel_halfwidth, min_band, max_band)`` (an infinite
    half-width clamps to ``max_band``), and ``c`` is tied with the fastest when
    ``c.median <= fastest.median * (1 + band)``. The winner is the baseline if its median is
    within ``min_band`` of the fastest's (smallest ident if several baselines are), else the
    fastest entry (smallest median, then smallest ident): the tied set says which entries the
    measurement cannot tell apart, not which one to prefer. The result does not depend on the
    order of ``entries``.

    Raises:
        ValueError: if ``entries`` is empty, idents are not unique, or the bands are invalid.
    """
    if not entries:
        raise ValueError("rank() needs at least one entry")
    if not (0.0 <= min_band <= max_band):
        raise ValueError(f"need 0 <= min_band <= max_band, got {min_band!r}, {max_band!r}")
    idents = [e.ident for e in entries]
    if len(set(idents)) != len(idents):
        raise ValueError("entry idents must be unique")
    ordered = tuple(sorted(entries, key=_order_key))
    fastest = ordered[0]
    best_rel = fastest.summary.rel_halfwidth
    tied: list[Entry] = []
    for c in ordered:
        band = min(max(best_rel + c.summary.rel_halfwidth, min_band), max_band)
        if c is fastest or c.summary.median <= fastest.summary.median * (1.0 + band):
            tied.append(c)
    # the baseline keeps its place only inside the smallest band (a difference no measurement here
    # resolves); anywhere else in the noise band the faster median wins: preferring the baseline (or
    # the first in candidate order) across the whole band gave up to max_band of speed on every pick
    near = fastest.summary.median * (1.0 + min_band)
    baselines = [e for e in tied if e.is_baseline and e.summary.median <= near]
    winner = min(baselines, key=lambda e: e.ident) if baselines else fastest
    return Ranking(winner=winner, fastest=fastest, tied=tuple(tied), ordered=ordered)
