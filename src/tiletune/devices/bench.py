"""``tiletune.devices.bench(fn, *args)``: the tuner's measurement harness as a public benchmark utility.

Times ``fn(*args)`` on the GPU the way tiletune times candidates, and returns every sample with robust
statistics (:class:`BenchResult`)::

    import tiletune as tt

    r = tt.bench(torch.matmul, a, b)                      # cold L2: the cache is flushed before each sample
    r = tt.bench(torch.matmul, a, b, workspaces=8)        # 8 argument sets (clones of a, b) cycled in order
    r = tt.bench(my_op, x, graph=True)                    # each sample replays a captured CUDA graph
    print(r)            # median 12.31 us [12.27, 12.36] 95% CI, n=60 (converged)
    r.samples_us, r.median_us, r.ci_low_us, r.flags

What a sample is (:class:`tiletune.devices.measure.ColdL2Timer`): a memset of twice the L2 size (cold L2,
unless ``flush_l2=False``), a GPU spin of ``backlog_us`` (the "blocking kernel" of nvbench: the host
enqueues the call while the GPU waits, so host cost stays out of the timed region), a start event,
the call, an end event. Samples are enqueued in batches and read after one synchronisation.

* **warm-up**: ``warmup`` untimed calls first (compilation, caches, clocks up).
* **rotating workspaces** (``workspaces=N``): ``N`` argument sets, made by ``make_workspace(i)`` or by
  cloning the tensors of ``args``; sample ``k`` uses set ``k % N``. With more than one set the L2 is
  not flushed by default: the rotation is what keeps it cold once ``N`` sets exceed the L2.
* **CUDA graphs** (``graph=True``): one graph per argument set is captured after the warm-up and
  each sample replays one (what a graph-deployed model sees: no launch cost at all).
* **adaptive stopping**: batches of ``batch`` samples until the median's confidence interval is
  tight (:class:`tiletune.StoppingRule`, the tuner's rule), or a fixed ``samples=n``.
* **clocks and power** (read-only, through ``pynvml`` from ``nvidia-ml-py`` when it is installed):
  after each batch the SM clock, the power draw and the clock-event reasons are read; samples of a
  batch during which the GPU reported power or thermal slowdown are flagged ``throttled``.

The device timer and the NVML probe are injectable (``timer=``, ``probe=``), so the harness runs on
a CPU with a simulated timing source (the tests do).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from tiletune.errors import NoBackendError
from tiletune.stats import SampleSummary, StoppingRule, summarize

__all__ = ["BenchResult", "ClockReading", "DeviceTimer", "NvmlProbe", "bench", "capture_graph", "nvml_probe",
           "warm_on_side_stream"]

#: NVML clock-event reason bits that mean the GPU slowed itself down (power or thermal limits):
#: software power cap, hardware slowdown, software / hardware thermal slowdown, power brake.
THROTTLE_REASONS: dict[int, str] = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


class DeviceTimer(Protocol):
    """What :func:`bench` needs from a timing source (:class:`tiletune.devices.measure.ColdL2Timer` on a GPU)."""

    def time_each(self, launches: Sequence[Callable[[], None]], hold: bool = False) -> list[float]:
        """One sample per launch, in order, in microseconds (``hold``: the device waits while the host
        enqueues them all)."""

    def spin(self, seconds: float = 0.05) -> None:
        """Keep the device busy for about ``seconds`` (clocks leave their idle state)."""

    def close(self) -> None:
        """Release what the timer holds."""


@dataclass(frozen=True)
class ClockReading:
    """One NVML reading: SM clock (MHz), power draw (W) and the slowdown reasons active."""

    sm_mhz: float | None
    power_w: float | None
    reasons: tuple[str, ...] = ()

    @property
    def throttled(self) -> bool:
        """Whether the GPU reported a power or thermal slowdown."""
        return bool(self.reasons)


class NvmlProbe:
    """Read-only NVML readings of one GPU (needs ``pynvml``, from the ``nvidia-ml-py`` package)."""

    def __init__(self, device_index: int) -> None:
        import pynvml

        self._nv = pynvml
        pynvml.nvmlInit()
        self._handle = self._find(device_index)

    def _find(self, device_index: int) -> Any:
        nv = self._nv
        try:  # NVML numbers GPUs differently from CUDA under CUDA_VISIBLE_DEVICES: match the PCI address
            import torch

            p = torch.cuda.get_device_properties(device_index)
            bus = f"{int(p.pci_domain_id):08X}:{int(p.pci_bus_id):02X}:{int(p.pci_device_id):02X}.0"
            return nv.nvmlDeviceGetHandleByPciBusId(bus)
        except Exception:
            return nv.nvmlDeviceGetHandleByIndex(device_index)

    def read(self) -> ClockReading:
        """The current SM clock, power draw and slowdown reasons (None where NVML does not say)."""
        nv, h = self._nv, self._handle
        mhz = power = None
        try:
            mhz = float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        except Exception:
            pass
        try:
            power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        except Exception:
            pass
        bits = 0
        for getter in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(nv, getter, None)
            if fn is not None:
                try:
                    bits = int(fn(h))
                    break
                except Exception:
                    continue
        return ClockReading(mhz, power, tuple(name for bit, name in THROTTLE_REASONS.items() if bits & bit))

    def close(self) -> None:
        """Shut NVML down (it counts its users)."""
        try:
            self._nv.nvmlShutdown()
        except Exception:
            pass


def nvml_probe(device_index: int) -> NvmlProbe | None:
    """An :class:`NvmlProbe`, or None when ``pynvml`` is missing or NVML does not start."""
    try:
        return NvmlProbe(device_index)
    except Exception:
        return None


@dataclass(frozen=True)
class BenchResult:
    """What :func:`bench` measured. Times in microseconds.

    Attributes:
        samples_us: every timed sample, in order.
        median_us, mean_us, min_us: statistics of the samples.
        ci_low_us, ci_high_us: the distribution-free confidence interval of the median
            (``confidence``; :func:`tiletune.stats.summarize`).
        rel_ci: the interval's half-width relative to the median.
        mad_us: the median absolute deviation (scaled to a standard deviation).
        n: the number of samples.
        stop: why sampling stopped (``converged``, ``abs_converged``, ``max_samples``, ``max_seconds``).
        flags: ``throttled`` (some sample ran while the GPU reported a slowdown), ``not_converged``
            (stopped by a limit, not by the interval), ``clock_changed`` (the SM clock moved by more
            than 5% between readings).
        throttled: per sample, whether it was in a batch with a slowdown reported.
        readings: one NVML reading per batch (empty without NVML).
        mode: ``cold_l2`` (flushed), ``workspaces`` (rotating sets, no flush) or ``warm``.
        workspaces: the number of argument sets cycled.
        graph: whether samples replayed CUDA graphs.
        warmup, backlog_us, confidence: the settings used.
        device: the device's name.
    """

    samples_us: tuple[float, ...]
    median_us: float
    mean_us: float
    min_us: float
    ci_low_us: float
    ci_high_us: float
    rel_ci: float
    mad_us: float
    n: int
    stop: str
    flags: tuple[str, ...]
    throttled: tuple[bool, ...]
    readings: tuple[ClockReading, ...] = ()
    mode: str = "cold_l2"
    workspaces: int = 1
    graph: bool = False
    warmup: int = 0
    backlog_us: float = 0.0
    confidence: float = 0.95
    device: str = ""

    @property
    def summary(self) -> SampleSummary:
        """The samples' :class:`~tiletune.stats.SampleSummary`."""
        return summarize(self.samples_us, self.confidence)

    @property
    def sm_clock_mhz(self) -> float | None:
        """Median SM clock over the readings (None without NVML)."""
        v = [r.sm_mhz for r in self.readings if r.sm_mhz is not None]
        return statistics.median(v) if v else None

    @property
    def power_w(self) -> float | None:
        """Median power draw over the readings (None without NVML)."""
        v = [r.power_w for r in self.readings if r.power_w is not None]
        return statistics.median(v) if v else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict of everything above (readings as dicts, infinities as None)."""
        out: dict[str, Any] = {}
        for k in self.__dataclass_fields__:
            v = getattr(self, k)
            if k == "readings":
                v = [{"sm_mhz": r.sm_mhz, "power_w": r.power_w, "reasons": list(r.reasons)} for r in v]
            elif isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, float) and not math.isfinite(v):
                v = None
            out[k] = v
        out["sm_clock_mhz"] = self.sm_clock_mhz
        out["power_w"] = self.power_w
        return out

    def __str__(self) -> str:
        ci = (f" [{self.ci_low_us:.2f}, {self.ci_high_us:.2f}] {self.confidence:.0%} CI"
              if math.isfinite(self.ci_low_us) and math.isfinite(self.ci_high_us) else "")
        flags = f", {', '.join(self.flags)}" if self.flags else ""
        return f"median {self.median_us:.2f} us{ci}, n={self.n} ({self.stop}{flags})"


# --------------------------------------------------------------------------------------------
# argument checks and workspaces
# --------------------------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "clone") and hasattr(x, "is_cuda")


def _clone(x: Any) -> Any:
    return x.clone() if _is_tensor(x) else x


def _argument_sets(args: tuple[Any, ...], workspaces: int | None,
                   make_workspace: Callable[[int], Any] | None) -> list[tuple[Any, ...]]:
    if workspaces is None:
        if make_workspace is not None:
            raise ValueError("bench: make_workspace= needs workspaces=N (the number of argument sets to make)")
        return [args]
    if not _is_int(workspaces) or workspaces < 1:
        raise ValueError(f"bench: workspaces must be an int >= 1, got {workspaces!r}")
    if make_workspace is not None:
        if not callable(make_workspace):
            raise TypeError(f"bench: make_workspace must be callable (index -> tuple of arguments), "
                            f"got {type(make_workspace).__name__}")
        if args:
            raise ValueError("bench: give the arguments either positionally or through make_workspace=, not both")
        sets = []
        for i in range(workspaces):
            made = make_workspace(i)
            if not isinstance(made, (tuple, list)):
                raise TypeError(f"bench: make_workspace({i}) must return a tuple of arguments for fn, "
                                f"got {type(made).__name__}")
            sets.append(tuple(made))
        return sets
    if workspaces > 1 and not any(_is_tensor(a) for a in args):
        raise ValueError(f"bench: workspaces={workspaces} clones the tensor arguments, but none of the "
                         "arguments is a torch tensor; pass make_workspace= to build the sets")
    return [args] + [tuple(_clone(a) for a in args) for _ in range(workspaces - 1)]


def _rule(stopping: StoppingRule | None, samples: int | None) -> StoppingRule:
    if stopping is not None and samples is not None:
        raise ValueError("bench: give stopping= (adaptive) or samples= (a fixed count), not both")
    if samples is not None:
        if not _is_int(samples) or samples < 1:
            raise ValueError(f"bench: samples must be an int >= 1, got {samples!r}")
        return StoppingRule(rel_ci=0.0, abs_ci_us=0.0, min_samples=samples, max_samples=samples, max_seconds=1e9)
    if stopping is None:
        return StoppingRule()
    if not isinstance(stopping, StoppingRule):
        raise TypeError(f"bench: stopping must be a tiletune.StoppingRule, got {type(stopping).__name__}")
    return stopping


def _device_index(sets: Sequence[tuple[Any, ...]], device: Any) -> int:
    import torch

    if device is not None:
        d = torch.device(device) if not _is_int(device) else torch.device("cuda", device)
        if d.type != "cuda":
            raise ValueError(f"bench: device must be a CUDA device, got {device!r}")
        return d.index if d.index is not None else torch.cuda.current_device()
    for a in sets[0]:
        if _is_tensor(a) and a.is_cuda:
            return int(a.device.index)
    return int(torch.cuda.current_device())


def warm_on_side_stream(call: Callable[[], Any], times: int = 1) -> None:
    """Run ``call`` ``times`` times on a fresh side stream, ordered after the current stream's work and
    before its later work: the warm-up torch asks for before a CUDA graph capture."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(times):
            call()
    torch.cuda.current_stream().wait_stream(side)


def capture_graph(call: Callable[[], Any]) -> tuple[Any, Any]:
    """A CUDA graph of one ``call``, warmed up on a side stream first (:func:`warm_on_side_stream`).

    Returns ``(graph, output)``: the ``torch.cuda.CUDAGraph`` (``graph.replay()`` runs it again) and
    what the captured call returned (its tensors are the graph's static outputs). Nothing is
    synchronized after the capture.
    """
    import torch

    warm_on_side_stream(call)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    return graph, out


def _capture(call: Callable[[], Any]) -> Callable[[], None]:
    """A CUDA graph of one ``call`` (:func:`capture_graph`), synchronized; returns its replay."""
    import torch

    graph, _ = capture_graph(call)
    torch.cuda.synchronize()
    return graph.replay


# --------------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------------


def bench(
    fn: Callable[..., Any],
    *args: Any,
    workspaces: int | None = None,
    make_workspace: Callable[[int], Sequence[Any]] | None = None,
    flush_l2: bool | None = None,
    warmup: int = 3,
    graph: bool = False,
    stopping: StoppingRule | None = None,
    samples: int | None = None,
    batch: int = 10,
    confidence: float = 0.95,
    backlog_us: float = 100.0,
    nvml: bool = True,
    device: Any = None,
    timer: DeviceTimer | None = None,
    probe: Any = None,
) -> BenchResult:
    """Time ``fn(*args)`` on the GPU; see the module docstring for what a sample is.

    Args:
        fn: the callable to time (keyword arguments: bind them with ``functools.partial`` or a lambda).
        args: its arguments (the first argument set).
        workspaces: ``N`` argument sets cycled in order (sample ``k`` uses set ``k % N``).
        make_workspace: ``make_workspace(i) -> tuple`` builds set ``i`` (then give no ``args``);
            without it the tensors of ``args`` are cloned.
        flush_l2: flush the L2 before each sample; default: with one argument set only.
        warmup: untimed calls before sampling.
        graph: replay one captured CUDA graph per argument set instead of calling ``fn``.
        stopping: the adaptive rule (default :class:`tiletune.StoppingRule`: 1% relative CI, 10-400
            samples, 1 s of GPU time). ``samples=n``: exactly ``n`` samples instead.
        batch: samples enqueued per synchronisation.
        confidence: of the median's interval.
        backlog_us: GPU spin queued before each sample so host cost stays out of the timed region
            (0: none).
        nvml: read clocks and power through ``pynvml`` when it is importable.
        device: the CUDA device (default: the first CUDA tensor argument's, else the current one).
        timer, probe: injected timing source and clock probe (tests, simulations); ``probe.read()``
            returns a :class:`ClockReading`.

    Raises:
        TypeError, ValueError: bad arguments (one line saying which).
        NoBackendError: no timer was given and no CUDA device is available.
    """
    if not callable(fn):
        raise TypeError(f"bench: fn must be callable, got {type(fn).__name__}")
    for name, v, lo in (("warmup", warmup, 0), ("batch", batch, 1)):
        if not _is_int(v) or v < lo:
            raise ValueError(f"bench: {name} must be an int >= {lo}, got {v!r}")
    if not isinstance(backlog_us, (int, float)) or isinstance(backlog_us, bool) or not (
            math.isfinite(backlog_us) and backlog_us >= 0):
        raise ValueError(f"bench: backlog_us must be a finite number >= 0, got {backlog_us!r}")
    if not isinstance(confidence, float) or not 0.0 < confidence < 1.0:
        raise ValueError(f"bench: confidence must be a float in (0, 1), got {confidence!r}")
    if flush_l2 is not None and not isinstance(flush_l2, bool):
        raise TypeError(f"bench: flush_l2 must be True, False or None, got {flush_l2!r}")
    rule = _rule(stopping, samples)
    sets = _argument_sets(tuple(args), workspaces, make_workspace)
    n_sets = len(sets)
    flush = (n_sets == 1) if flush_l2 is None else flush_l2
    mode = "cold_l2" if flush else ("workspaces" if n_sets > 1 else "warm")

    own_timer = own_probe = False
    dev_name = "injected timer"
    if timer is None:
        try:
            import torch
        except ImportError:
            raise NoBackendError("tiletune.devices.bench needs torch with a CUDA device (or pass timer=)") from None
        if not torch.cuda.is_available():
            raise NoBackendError("tiletune.devices.bench needs a CUDA device; none is available (or pass timer=)")
        from tiletune.devices.measure import ColdL2Timer

        dev = _device_index(sets, device)
        dev_name = torch.cuda.get_device_name(dev)
        with torch.cuda.device(dev):
            timer = ColdL2Timer(dev, flush=flush, backlog_us=float(backlog_us))
        own_timer = True
        if probe is None and nvml:
            probe = nvml_probe(dev)
            own_probe = probe is not None
    elif graph:
        raise ValueError("bench: graph=True captures CUDA graphs and needs the CUDA timer (leave timer= out)")
    elif device is not None:
        dev_name = str(device)

    ctx: Any = contextlib.nullcontext()
    if own_timer:
        import torch

        ctx = torch.cuda.device(dev)
    try:
        with ctx:
            calls: list[Callable[[], None]] = [(lambda s=s: fn(*s)) for s in sets]
            if warmup:
                timer.time_each([calls[k % n_sets] for k in range(warmup)])
            if graph:
                calls = [_capture(c) for c in calls]
            spin = getattr(timer, "spin", None)
            if spin is not None:
                spin(0.05)
            out: list[float] = []
            throttled: list[bool] = []
            readings: list[ClockReading] = []
            while True:
                take = min(batch, rule.max_samples - len(out))
                k0 = len(out)
                got = [float(x) for x in timer.time_each([calls[(k0 + j) % n_sets] for j in range(take)])]
                if len(got) != take:
                    raise RuntimeError(f"bench: the timer returned {len(got)} samples for {take} launches")
                out += got
                reading = probe.read() if probe is not None else None
                if reading is not None:
                    readings.append(reading)
                throttled += [bool(reading is not None and reading.throttled)] * take
                summary = summarize(out, confidence)
                stop = rule.decide(summary, sum(out) * 1e-6)
                if stop is not None:
                    break
    finally:
        if own_timer:
            timer.close()
        if own_probe:
            probe.close()

    flags = []
    if any(throttled):
        flags.append("throttled")
    if stop in ("max_samples", "max_seconds") and samples is None:
        flags.append("not_converged")
    clocks = [r.sm_mhz for r in readings if r.sm_mhz]
    if clocks and max(clocks) > 1.05 * min(clocks):
        flags.append("clock_changed")
    return BenchResult(
        samples_us=tuple(out), median_us=summary.median, mean_us=summary.mean, min_us=summary.minimum,
        ci_low_us=summary.ci_low, ci_high_us=summary.ci_high, rel_ci=summary.rel_halfwidth, mad_us=summary.mad,
        n=summary.n, stop=stop, flags=tuple(flags), throttled=tuple(throttled), readings=tuple(readings),
        mode=mode, workspaces=n_sets, graph=bool(graph), warmup=warmup, backlog_us=float(backlog_us),
        confidence=confidence, device=dev_name,
    )

