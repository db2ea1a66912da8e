"""Honest torch baselines (issue 14, item 1), shared by ``kernels_compute.py`` and ``kernels_memory.py``.

A row of those benchmarks compares tiletune with the fastest torch route a user could pick, not one
chosen torch call. This module holds what both need and nothing GPU-specific at import time:

* :func:`time_routes` times every route alone (first call excluded: ``torch.compile`` compiles and
  autotunes then, under a per-route time limit) and records ``torch_routes`` (route -> us),
  ``torch_route_errors`` and the best route; a route that raises or runs out of time is an error
  in the row, never the end of the sweep.
* :func:`first_calls` runs only the first (compiling) call of each route, with the same error and
  time-limit handling, for callers that time the survivors themselves (interleaved with tiletune).
* :func:`best_route`, :func:`verdict` (win / tie / loss, with the copy-bandwidth tie rule of the
  memory-bound rows) and :func:`timer_check` (``triton.testing.do_bench`` next to our timer).
"""

from __future__ import annotations

import signal
import statistics
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

#: largest disagreement between our timer and ``triton.testing.do_bench`` that counts as agreement
TIMER_CHECK_TOLERANCE = 0.03
#: where the fastest torch route reaches this fraction of the copy bandwidth, tiletune reaching it too
#: is a tie (the op runs at the memory's speed; 1.0x is then noise)
TIE_FRACTION_OF_COPY = 0.97

Route = Callable[[], Any]


class RouteTimeout(Exception):
    """A route's first call (a ``torch.compile`` compile) ran past its time limit."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`RouteTimeout` in the block after ``seconds`` (SIGALRM; main thread only: elsewhere,
    and for ``None`` / ``<= 0``, no limit is set and the caller checks the elapsed time afterwards)."""
    if not seconds or seconds <= 0 or threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "setitimer"):
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise RouteTimeout(f"first call ran past the {seconds:g} s route limit")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:1000]


def _sync() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except ImportError:  # pragma: no cover - torch is always there in the benchmarks
        pass


def first_calls(row: dict[str, Any], routes: dict[str, Route], limit_s: float | None = None) -> dict[str, Route]:
    """Run each route once (``torch.compile`` compiles then), each under ``limit_s`` seconds; record
    ``torch_route_first_call_s`` and, for a route that raises or runs past the limit,
    ``torch_route_errors[route]``. Return the routes that worked, in their order."""
    ok: dict[str, Route] = {}
    for name, fn in routes.items():
        t0 = time.perf_counter()
        try:
            with time_limit(limit_s):
                fn()
                _sync()
            took = time.perf_counter() - t0
            row.setdefault("torch_route_first_call_s", {})[name] = round(took, 3)
            if limit_s and limit_s > 0 and took > limit_s:  # no SIGALRM (not the main thread)
                raise RouteTimeout(f"first call took {took:.1f} s, past the {limit_s:g} s route limit")
            ok[name] = fn
        except Exception as exc:
            row.setdefault("torch_route_errors", {})[name] = _error(exc)
    return ok


def best_route(us: dict[str, float]) -> str | None:
    """The fastest route (the first listed on a tie); None when none was timed."""
    timed = {k: v for k, v in us.items() if v is not None and v > 0}
    return min(timed, key=lambda k: (timed[k], list(timed).index(k))) if timed else None


def time_routes(row: dict[str, Any], routes: dict[str, Route], timer: Any, warmup: int, n: int,
                limit_s: float | None = None, fallback: dict[str, Route] | None = None) -> str | None:
    """Time every torch route alone (cold L2 medians of ``n`` samples after ``warmup``; the first call is
    excluded and limited to ``limit_s``: :func:`first_calls`). Record ``torch_routes`` (route -> us),
    ``torch_route_errors``, ``torch_route_first_call_s`` and ``torch_best_route``; return the best
    route's name, None if every route failed. ``fallback`` routes (e.g. SDPA's math backend) are
    tried only when every route in ``routes`` failed."""
    us: dict[str, float] = {}
    for group in (routes, fallback or {}):
        for name, fn in first_calls(row, group, limit_s).items():
            try:
                timer.time(fn, warmup)
                us[name] = statistics.median(timer.time(fn, n))
            except Exception as exc:
                row.setdefault("torch_route_errors", {})[name] = _error(exc)
        if us:
            break
    row["torch_routes"] = us
    row["torch_best_route"] = best_route(us)
    return row["torch_best_route"]


def verdict(ratio: float | None, tiletune_gbps: float | None = None, torch_best_gbps: float | None = None,
            copy_gbps: float | None = None, tie_fraction: float = TIE_FRACTION_OF_COPY) -> str | None:
    """``win`` when tiletune is at least as fast as the best torch route (``ratio >= 1``); ``tie`` when it
    is slower but both run at >= ``tie_fraction`` of the copy bandwidth of the same bytes (memory-bound
    rows; without bandwidths no tie); else ``loss``. None when the row has no ratio."""
    if ratio is None:
        return None
    if ratio >= 1.0:
        return "win"
    if tiletune_gbps and torch_best_gbps and copy_gbps and torch_best_gbps >= tie_fraction * copy_gbps \
            and tiletune_gbps >= tie_fraction * copy_gbps:
        return "tie"
    return "loss"


def timer_check(fn: Route, ours_us: float, tolerance: float = TIMER_CHECK_TOLERANCE) -> dict[str, Any]:
    """``fn`` timed by ``triton.testing.do_bench`` (L2 flushed between runs, median) next to this
    benchmark's median: the disagreement ``|do_bench / ours - 1|`` and whether it is within
    ``tolerance``."""
    try:
        from triton.testing import do_bench
    except Exception as exc:  # triton is optional
        return {"error": f"triton.testing unavailable: {exc}"}
    try:
        ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
    except TypeError:  # older triton: no return_mode
        ms = do_bench(fn, warmup=25, rep=200, quantiles=[0.5])
        ms = ms[0] if isinstance(ms, (list, tuple)) else ms
    except Exception as exc:
        return {"error": _error(exc)}
    theirs = float(ms) * 1000.0
    dis = abs(theirs / ours_us - 1.0)
    return {"do_bench_us": theirs, "ours_us": ours_us, "disagreement": dis, "within_tolerance": dis <= tolerance,
            "tolerance": tolerance}


def summarize_timer_checks(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """``timer_check_rows``, ``timer_check_max_disagreement``, ``timer_check_ok`` over the checks that ran."""
    ran = [c for c in checks if isinstance(c, dict) and c.get("disagreement") is not None]
    return {"timer_check_rows": len(ran),
            "timer_check_max_disagreement": max((c["disagreement"] for c in ran), default=None),
            "timer_check_ok": bool(ran) and all(c["within_tolerance"] for c in ran)}
