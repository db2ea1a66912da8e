"""A/B validation: a tuned op's pick against one fixed config, case by case (``tt.ab``, ``tiletune ab``).

For every case (one set of call arguments) the op resolves its config as a call would (database,
table, pin or tuning), then the pick (A) and the fixed config (B: the space's baseline, or any
config) are timed in one tuning session of the op's backend, so through the very harness tuning
uses (the live backend: a cold L2 before every sample, :class:`tiletune.devices.measure.ColdL2Timer`; the
fake and replay backends: their simulated samples). Both are first compiled and checked against
the op's reference like any candidate. Then ``rounds`` interleaved rounds (A B, B A, A B, ...) of
``batch`` samples each are taken, so drift (clocks, thermals, a neighbour's load) hits both alike.

The ratio is ``time(A) / time(B)`` (below 1: the pick is faster). Each round gives one ratio of the
two batch medians; the reported ratio is the median of the round ratios and its 95% interval is the
distribution-free order-statistic interval of that median (:func:`tiletune.stats.summarize`; ten
rounds give the 2nd and 9th smallest round ratios). The verdict:

* ``faster``: the interval lies below 1 and the ratio below ``1 - band``;
* ``slower``: the interval lies above 1 and the ratio above ``1 + band``;
* ``tied``: anything else (inside the noise band, or an interval that contains 1).

``band`` defaults to the tuner's smallest tie band (:attr:`TunerOptions.min_tie_band`, 1%). The
report's geomean is the geometric mean of the case ratios. :meth:`ABReport.save` writes JSON, and
:meth:`ABReport.plot` a PNG (needs matplotlib).

Library ops (``tiletune.kernels.rms_norm`` ...) are functions around a tuned op: give the function,
and each case's call is made once (it tunes on a new key) while the tuned op's launch is recorded;
the A/B then runs on that tuned op with the arguments it was launched with. A function that
launches more than one tuned op, or none, is refused.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from tiletune.devices.backends.base import Candidate
from tiletune.errors import TiletuneError
from tiletune.records import Status
from tiletune.space.spaces import Config
from tiletune.stats import summarize

__all__ = ["ABCase", "ABRow", "ABReport", "ab", "against_config", "geomean", "verdict"]

VERDICTS = ("faster", "tied", "slower")


@dataclass(frozen=True)
class ABCase:
    """One case: positional and keyword arguments of a call, and a label for reports."""

    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    label: str | None = None


@dataclass(frozen=True)
class ABRow:
    """The A/B result of one case.

    ``ratio`` is time(pick) / time(against) (median of the round ratios), ``ci_low``/``ci_high`` its
    95% interval; ``pick_us``/``against_us`` the medians of all samples of each.
    """

    case: str
    op: str
    pick: dict[str, Any]
    against: dict[str, Any]
    against_label: str
    ratio: float
    ci_low: float
    ci_high: float
    verdict: str
    pick_us: float
    against_us: float
    rounds: int
    samples: int
    same_config: bool

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def geomean(values: Iterable[float]) -> float | None:
    """Geometric mean of positive values (None for none)."""
    xs = [float(v) for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


@dataclass
class ABReport:
    """Every case's row, the geomean of the ratios, and what the pick was compared against."""

    op: str
    against: str
    rows: list[ABRow]
    band: float
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def geomean(self) -> float | None:
        return geomean(r.ratio for r in self.rows)

    def counts(self) -> dict[str, int]:
        return {v: sum(1 for r in self.rows if r.verdict == v) for v in VERDICTS}

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "against": self.against, "band": self.band, "geomean": self.geomean,
                "verdicts": self.counts(), "meta": self.meta, "rows": [r.as_dict() for r in self.rows]}

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Write the report as JSON (standard JSON only)."""
        p = pathlib.Path(path)
        p.write_text(json.dumps(self.as_dict(), indent=1, allow_nan=False, default=str) + "\n")
        return p

    def plot(self, path: str | os.PathLike, title: str | None = None) -> pathlib.Path | None:
        """A PNG of the ratios with their intervals (None when matplotlib is missing)."""
        return plot_rows([(f"{r.op} {r.case}", r.ratio, r.ci_low, r.ci_high, r.verdict) for r in self.rows],
                         path, title or f"{self.op}: pick vs {self.against} (geomean {_fmt(self.geomean)})",
                         self.band)

    def table(self) -> str:
        """A plain-text table of the rows."""
        lines = [f"{'case':40s} {'ratio':>7s} {'95% CI':>17s} {'verdict':>8s} {'pick us':>10s} {'fixed us':>10s}"]
        for r in self.rows:
            lines.append(f"{r.case[:40]:40s} {r.ratio:7.3f} [{r.ci_low:6.3f}, {r.ci_high:6.3f}] {r.verdict:>8s} "
                         f"{r.pick_us:10.2f} {r.against_us:10.2f}")
        lines.append(f"geomean {_fmt(self.geomean)}; " + ", ".join(f"{k} {v}" for k, v in self.counts().items()))
        return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def plot_rows(rows: Sequence[tuple[str, float, float, float, str]], path: str | os.PathLike, title: str,
              band: float) -> pathlib.Path | None:
    """Horizontal dot plot of ``(label, ratio, ci_low, ci_high, verdict)`` rows; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    colours = {"faster": "tab:green", "tied": "tab:grey", "slower": "tab:red"}
    fig, ax = plt.subplots(figsize=(8, 0.8 + 0.32 * max(1, len(rows))))
    for i, (label, ratio, lo, hi, v) in enumerate(rows):
        lo = lo if math.isfinite(lo) else ratio
        hi = hi if math.isfinite(hi) else ratio
        ax.errorbar([ratio], [i], xerr=[[ratio - lo], [hi - ratio]], fmt="o", color=colours.get(v, "k"), capsize=3)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvspan(1 - band, 1 + band, color="0.9", zorder=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time(tuned pick) / time(fixed config)  (< 1: the pick is faster)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    p = pathlib.Path(path)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def verdict(ratio: float, ci_low: float, ci_high: float, band: float) -> str:
    """``faster`` / ``tied`` / ``slower`` (see the module docstring)."""
    if ci_high < 1.0 and ratio < 1.0 - band:
        return "faster"
    if ci_low > 1.0 and ratio > 1.0 + band:
        return "slower"
    return "tied"


def against_config(op: Any, against: Any, arch: str) -> tuple[Config, str]:
    """The fixed config ``against`` names for ``op`` on ``arch``, and its label.

    ``"baseline"``: the space's baseline (else its first valid config, as ``TILETUNE_DISABLE`` does);
    a :class:`Config` or a mapping of every parameter's value: that config (it need not be in the
    space: a config from another space of the same kernel, e.g. a full space's winner, is timed as is).
    """
    if isinstance(against, str):
        if against != "baseline":
            raise ValueError(f"against={against!r}: give 'baseline', a Config or a mapping of parameter values")
        return op.baseline(arch), "baseline"
    if isinstance(against, Config):
        return against, "config"
    if isinstance(against, Mapping):
        values = dict(against)
        names = set(op.space.names)
        if set(values) != names:
            missing, extra = sorted(names - set(values)), sorted(set(values) - names)
            raise ValueError(f"against: the config must give every parameter of {op.name}'s space"
                             + (f"; missing {', '.join(missing)}" if missing else "")
                             + (f"; unknown {', '.join(extra)}" if extra else ""))
        ordered = {n: values[n] for n in op.space.names}
        try:
            return op.space.config(arch, **ordered), "config"
        except TiletuneError:  # outside this space (another space of the same kernel): timed as is
            return Config(ordered), "config"
    raise TypeError(f"against must be 'baseline', a Config or a mapping, got {type(against).__name__}")


def _as_case(c: Any, i: int) -> ABCase:
    if isinstance(c, ABCase):
        return c
    if isinstance(c, Mapping) and "args" in c:
        return ABCase(tuple(c["args"]), dict(c.get("kwargs", {})), c.get("label"))
    if isinstance(c, tuple):
        return ABCase(c)
    if isinstance(c, list):
        return ABCase(tuple(c))
    raise TypeError(f"case {i}: expected an argument tuple, a mapping with 'args', or an ABCase, got {type(c).__name__}")


def describe_args(args: Sequence[Any], kwargs: Mapping[str, Any] | None = None) -> str:
    """A short label of call arguments: tensors as ``4096x4096:bf16``, others as repr."""
    def one(a: Any) -> str:
        shape = getattr(a, "shape", None)
        if shape is not None and hasattr(a, "dtype"):
            d = str(a.dtype).replace("torch.", "").replace("bfloat16", "bf16").replace("float", "fp")
            return "x".join(str(int(n)) for n in shape) + ":" + d
        return repr(a)

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in (kwargs or {}).items()]
    return ", ".join(parts)


def _tuned_launch(fn: Callable[..., Any], case: ABCase) -> tuple[Any, tuple[Any, ...]]:
    """Call a library function once with ``case`` and return the tuned op it launched and its arguments."""
    import threading

    from tiletune.op import tuned_op as dispatch

    if threading.get_ident() in dispatch.recorders:
        raise TiletuneError("tt.ab cannot run inside another recorded call")
    _, rec = dispatch.record_launches(fn, *case.args, **dict(case.kwargs))
    ops = {id(op): op for op, _, _ in rec}
    if len(ops) != 1:
        name = getattr(fn, "__name__", repr(fn))
        raise TiletuneError(f"{name}({describe_args(case.args, case.kwargs)}) launched "
                            f"{'no tuned op' if not ops else f'{len(ops)} different tuned ops'}; "
                            "A/B needs exactly one (pass the tuned op itself)")
    op, _, args = rec[-1]
    return op, tuple(args)


def ab(
    op: Any,
    cases: Iterable[Any],
    against: Any = "baseline",
    *,
    rounds: int = 10,
    batch: int = 10,
    band: float | None = None,
    labels: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ABReport:
    """A/B the tuned pick of ``op`` against one fixed config on each case.

    Args:
        op: a :class:`~tiletune.TunedOp`, or a function that launches exactly one tuned op per call
            (a library op such as ``tiletune.kernels.rms_norm``).
        cases: argument tuples (``(x, w)``), mappings ``{"args": [...], "kwargs": {...},
            "label": ...}`` or :class:`ABCase` objects.
        against: ``"baseline"`` (the space's baseline), a :class:`Config` or a mapping of parameter
            values (see :func:`against_config`).
        rounds: interleaved rounds per case (>= 3; ten give a 95% interval from the order statistics).
        batch: samples per config per round.
        band: the noise band of the verdict (default ``TunerOptions.min_tie_band``).
        labels: a label per case (default: the arguments' shapes and dtypes).
        progress: called with one line per finished case.

    Returns an :class:`ABReport`. A case whose pick or fixed config fails to compile, fails the
    correctness check, or fails while timed raises :class:`~tiletune.errors.TiletuneError` naming it.
    """
    from tiletune.op.tuned_op import TunedOp
    from tiletune.engine.tuner import TunerOptions

    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 3:
        raise ValueError(f"rounds must be an int >= 3, got {rounds!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    band = TunerOptions().min_tie_band if band is None else float(band)
    if not 0.0 <= band < 1.0:
        raise ValueError(f"band must be in [0, 1), got {band!r}")
    case_list = [_as_case(c, i) for i, c in enumerate(cases)]
    if not case_list:
        raise ValueError("ab() needs at least one case")
    if labels is not None and len(labels) != len(case_list):
        raise ValueError(f"labels: {len(labels)} label(s) for {len(case_list)} case(s)")
    rows: list[ABRow] = []
    against_label = against if isinstance(against, str) else "config"
    name = getattr(op, "name", None) or getattr(op, "__name__", "op")
    t0 = time.perf_counter()
    for i, case in enumerate(case_list):
        if isinstance(op, TunedOp):
            tuned = op
            args = op.bind_arguments(case.args, case.kwargs)
        elif callable(op):
            tuned, args = _tuned_launch(op, case)
        else:
            raise TypeError(f"ab() needs a tiletune.TunedOp or a function that launches one, got {type(op).__name__}")
        label = labels[i] if labels is not None else (case.label or describe_args(case.args, case.kwargs))
        row = _ab_case(tuned, args, against, rounds, batch, band, label)
        against_label = row.against_label
        rows.append(row)
        if progress is not None:
            progress(f"{row.op} {label}: ratio {row.ratio:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}] {row.verdict}")
    meta = {"rounds": rounds, "batch": batch, "seconds": round(time.perf_counter() - t0, 3)}
    return ABReport(op=str(name), against=against_label, rows=rows, band=band, meta=meta)


def _ab_case(op: Any, args: tuple[Any, ...], against: Any, rounds: int, batch: int, band: float,
             label: str) -> ABRow:
    from tiletune.resolve.tune import open_session

    backend = op.backend
    dev = backend.arg_device(args)
    arch = backend.device_info(dev).arch
    pick = op.config_for(*args)
    fixed, against_label = against_config(op, against, arch)
    session = open_session(op.problem(args, op.key_of(*args)))
    a = Candidate(pick, 0, is_baseline=False)
    b = Candidate(fixed, 1, is_baseline=True)
    try:
        for outcome in session.compile([a, b]):
            if outcome.status is not Status.OK:
                who = "the pick" if outcome.candidate.order == 0 else f"the fixed config ({against_label})"
                raise TiletuneError(f"{op.name} {label}: {who} {outcome.candidate.config} failed to compile: "
                                    f"{outcome.reason.strip().splitlines()[0] if outcome.reason.strip() else outcome.status.value}")
        for cand in (a, b):
            check = session.check(cand)
            if check.status is not Status.OK:
                who = "the pick" if cand.order == 0 else f"the fixed config ({against_label})"
                raise TiletuneError(f"{op.name} {label}: {who} {cand.config} failed its check: {check.status.value}: "
                                    f"{check.reason.strip().splitlines()[0] if check.reason.strip() else ''}")
        sa: list[float] = []
        sb: list[float] = []
        ratios: list[float] = []
        for r in range(rounds):
            order = (a, b) if r % 2 == 0 else (b, a)
            got: dict[int, list[float]] = {}
            for cand in order:
                try:
                    got[cand.order] = list(session.sample(cand, batch))
                except Exception as exc:
                    raise TiletuneError(f"{op.name} {label}: timing {cand.config} failed: {exc}") from exc
            sa.extend(got[0])
            sb.extend(got[1])
            ratios.append(_median(got[0]) / _median(got[1]))
    finally:
        session.finish(None)  # restores the caller's arguments
    s = summarize(ratios)
    lo = s.ci_low if math.isfinite(s.ci_low) else min(ratios)
    hi = s.ci_high if math.isfinite(s.ci_high) else max(ratios)
    return ABRow(
        case=label, op=op.name, pick=pick.as_dict(), against=fixed.as_dict(), against_label=against_label,
        ratio=s.median, ci_low=lo, ci_high=hi, verdict=verdict(s.median, lo, hi, band),
        pick_us=_median(sa), against_us=_median(sb), rounds=rounds, samples=len(sa) + len(sb),
        same_config=pick == fixed,
    )


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        raise ValueError("no samples")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
