"""Simulated backends: the tuning loop without a GPU.

:class:`FakeBackend` answers from a timing model (a function of the config, plus seeded noise) and
runs "kernels" that are plain Python callables on CPU tensors, so the decorator, the correctness gate
and the in-place protection are exercised for real in CPU tests. :class:`SimulatedSession` keeps a
simulated clock: compilation is list-scheduled over ``workers`` parallel compilers and overlaps with
measurement, as in the live backend.
"""

from __future__ import annotations

import heapq
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

from tiletune.records import DeviceInfo, Status
from tiletune.space.spaces import Config
from tiletune.devices.verify import ArgGuard, Checker
from tiletune.devices.launch_marks import mark
from tiletune.devices.backends.base import Candidate, CheckOutcome, CompileOutcome, Launch, LaunchParts


@dataclass(frozen=True)
class SimulatedCandidate:
    """What a simulated backend knows about one config."""

    status: Status = Status.OK  # COMPILE_ERROR / LAUNCH_ERROR / MISMATCH / TIMEOUT to fail it
    reason: str = ""
    compile_s: float = 0.8


class TimingSource:
    """Where simulated samples come from. Subclasses: a model (fake) or a recording (replay)."""

    def describe(self, config: Config) -> SimulatedCandidate:
        """Failure status and compile time of a config."""
        raise NotImplementedError

    def draw(self, config: Config, n: int, rng: random.Random) -> list[float]:
        """``n`` samples in microseconds."""
        raise NotImplementedError


class ModelTiming(TimingSource):
    """Samples from ``model(config)`` (true time, us) with multiplicative lognormal noise."""

    def __init__(
        self,
        model: Callable[[Config], float],
        *,
        noise: float = 0.01,
        compile_s: Callable[[Config], float] | float = 0.8,
        failures: Callable[[Config], SimulatedCandidate | None] | None = None,
    ) -> None:
        self.model = model
        self.noise = noise
        self.compile_s = compile_s
        self.failures = failures

    def describe(self, config: Config) -> SimulatedCandidate:
        if self.failures is not None:
            f = self.failures(config)
            if f is not None:
                return f
        cs = self.compile_s(config) if callable(self.compile_s) else self.compile_s
        return SimulatedCandidate(compile_s=float(cs))

    def draw(self, config: Config, n: int, rng: random.Random) -> list[float]:
        mu = float(self.model(config))
        return [mu * rng.lognormvariate(0.0, self.noise) for _ in range(n)]


@dataclass
class SimulatedSession:
    """A tuning session whose clock and measurements are simulated."""

    source: TimingSource
    workers: int = 16
    seed: int = 0
    sample_overhead_us: float = 15.0  # cache flush + event pair per sample
    check_overhead_s: float = 0.002
    guard: ArgGuard | None = None
    checker: Checker | None = None
    run: Callable[[Candidate], None] | None = None  # executes the candidate for real (fake kernels)
    #: executes the candidate with its kernel arguments moved by ``move`` (the guard's
    #: :meth:`~tiletune.devices.verify.ArgGuard.checked_kernel_args`); False, nothing run, when they cannot be
    run_on: Callable[[Candidate, Callable[[Sequence[Any]], tuple[Any, ...] | None]], bool] | None = None
    #: ``config -> whether a compile cache holds it`` (``compile(..., only_cached=...)``); None: every config
    cached: Callable[[Config], bool] | None = None
    #: called with each config compiled (not answered by ``cached``)
    on_compile: Callable[[Config], None] | None = None
    _clock: float = 0.0
    _rng: random.Random = field(init=False)
    samples_drawn: int = 0
    #: orders of the candidates checked, compiled (skipped ones excluded) and timed, in order
    checked: list[int] = field(default_factory=list)
    compiled: list[int] = field(default_factory=list)
    timed: list[int] = field(default_factory=list)
    compiles_only_cached = True

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def clock(self) -> float:
        return self._clock

    def compile(self, candidates: Sequence[Candidate], only_cached: Collection[int] = ()) -> Iterator[CompileOutcome]:
        # List scheduling, candidates started in order, from the moment compile() is asked (a search
        # asks once per batch: the compilers of a later batch start when it is proposed, not at 0).
        free = [self._clock] * max(1, self.workers)
        heapq.heapify(free)
        done: list[tuple[float, int, Candidate, SimulatedCandidate]] = []
        for c in candidates:
            hit = self.cached is None or self.cached(c.config)
            if c.order in only_cached and not hit:
                yield CompileOutcome(c, Status.COMPILE_ERROR, 0.0, "not in a compile cache (skipped)", skipped=True)
                continue
            d = self.source.describe(c.config)
            if hit and self.cached is not None:
                d = SimulatedCandidate(d.status, d.reason, 0.0)  # answered by the cache
            else:
                if self.on_compile is not None:
                    self.on_compile(c.config)
            self.compiled.append(c.order)
            start = heapq.heappop(free)
            end = start + d.compile_s
            heapq.heappush(free, end)
            done.append((end, c.order, c, d))
        done.sort(key=lambda t: (t[0], t[1]))
        for end, _, c, d in done:
            self._clock = max(self._clock, end)
            status = d.status if d.status in (Status.COMPILE_ERROR, Status.TIMEOUT) else Status.OK
            yield CompileOutcome(c, status, d.compile_s, d.reason if status is not Status.OK else "", cpu_s=d.compile_s)

    def prepare(self, expected: Any = None) -> None:
        """Run a deferred reference now (a no-op when it has run), or take ``expected``, its answer computed
        elsewhere."""
        if self.checker is not None:
            if expected is not None:
                self.checker.set_expected(expected)
            else:
                self.checker.prepare()

    def check(self, candidate: Candidate) -> CheckOutcome:
        self.prepare()  # before the run: the reference reads the pristine inputs
        self._clock += self.check_overhead_s
        self.checked.append(candidate.order)
        d = self.source.describe(candidate.config)
        if d.status in (Status.LAUNCH_ERROR, Status.MISMATCH):
            return CheckOutcome(d.status, d.reason or d.status.value)
        if self.run is not None and self.guard is not None:
            banded = self.run_on is not None and bool(self.guard.banded)
            mark("launched")  # a fake kernel runs synchronously: its run is the kernel phase
            try:
                if banded:  # the kernel arguments moved onto the guard's banded twins of the written ones
                    banded = self.run_on(candidate, self.guard.checked_kernel_args)  # type: ignore[misc]
                if not banded:
                    self.guard.prepare_checked_run()
                    self.run(candidate)
            except Exception as exc:
                return CheckOutcome(Status.LAUNCH_ERROR, f"{type(exc).__name__}: {exc}")
            mark("ran")
            if banded:
                outside = self.guard.after_checked_run()
                if outside is not None:
                    return CheckOutcome(Status.MISMATCH, outside)
            if self.checker is not None:
                reason = self.checker.compare()
                if reason is not None:
                    return CheckOutcome(Status.MISMATCH, reason)
        return CheckOutcome(Status.OK)

    def sample(self, candidate: Candidate, n: int) -> list[float]:
        samples = self.source.draw(candidate.config, n, self._rng)
        self.samples_drawn += len(samples)
        self._clock += sum(samples) * 1e-6 + n * self.sample_overhead_us * 1e-6
        if self.run is not None:
            self.run(candidate)  # the real kernel runs too (it may scribble on outputs)
        return samples

    def race_samples(self, candidates: Sequence[Candidate], n: int) -> dict[int, list[float] | str] | None:
        """``n`` samples of each candidate, checked or not (see :class:`~.base.TuningSession`): a kernel that
        runs for real runs on the guard's twins of the written arguments, never on the caller's tensors;
        None when it cannot (a written argument without a twin)."""
        guard = self.guard
        if self.run is not None and guard is not None and (
                self.run_on is None or set(guard.banded) != {*guard.outputs, *guard.inplace}):
            return None
        out: dict[int, list[float] | str] = {}
        for c in candidates:
            d = self.source.describe(c.config)
            if d.status is Status.LAUNCH_ERROR:
                out[c.order] = f"launch_error: {d.reason or 'launch failed'}"
                continue
            if self.run_on is not None and guard is not None:
                try:
                    moved = self.run_on(c, guard.checked_kernel_args)
                except Exception as exc:
                    out[c.order] = f"launch_error: {type(exc).__name__}: {exc}"
                    continue
                if not moved:
                    return None
            samples = self.source.draw(c.config, n, self._rng)
            self.samples_drawn += len(samples)
            self._clock += sum(samples) * 1e-6 + n * self.sample_overhead_us * 1e-6
            self.timed.append(c.order)
            out[c.order] = samples
        return out

    def finish(self, winner: Candidate | None) -> None:
        if self.guard is not None:
            self.guard.restore()
        if winner is not None and self.run is not None:
            self.run(winner)


class SimulatedBackend:
    """What the fake and replay backends share: a fixed device, no GPU, launches recorded in
    :attr:`launches` (subclasses decide what a launch records or runs, in :meth:`_execute`)."""

    name = "simulated"
    #: set True to simulate a CUDA graph capture in progress (tests of the capture fallback)
    capturing: bool = False
    device: DeviceInfo
    _versions: dict[str, str]
    launches: list[Any]

    def device_info(self, device_index: int) -> DeviceInfo:
        return self.device

    def versions(self) -> Mapping[str, str]:
        return self._versions

    def arg_device(self, args: Sequence[Any]) -> int:
        return 0

    def stream_capturing(self, device_index: int) -> bool:
        return self.capturing

    def kernel_sources(self, kernel: Any) -> str:
        from tiletune.identity import function_source

        return function_source(getattr(kernel, "_pyfunc", kernel)) if callable(kernel) else repr(kernel)

    def _execute(self, config: Config, spec: Launch) -> None:
        raise NotImplementedError

    def launch_parts(self, config: Config, kernel: Any, device_index: int) -> LaunchParts:
        def launch(stream: Any, grid: tuple[int, ...], k: Any, kargs: tuple[Any, ...]) -> None:
            self._execute(config, Launch(k, grid, kargs))

        return LaunchParts(launch, lambda d: None, kernel, device_index)


class FakeAhead:
    """A background compile of :meth:`FakeBackend.compile_ahead`: done once its gate is set."""

    def __init__(self, gate: threading.Event | None, finish: Callable[[], None]) -> None:
        self._done = threading.Event()

        def run() -> None:
            if gate is not None:
                gate.wait()
            finish()
            self._done.set()

        if gate is None:
            run()
        else:
            threading.Thread(target=run, name="tiletune-fake-ahead", daemon=True).start()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def stop(self) -> None:
        pass

    def finish(self, timeout: float = 10.0) -> dict[str, float]:
        self._done.wait(timeout)
        return {}


class FakeBackend(SimulatedBackend):
    """A CPU stand-in for the cuTile backend, for tests and demos.

    ``timing(config) -> microseconds`` is the true kernel time; ``failures(config)`` may return a
    :class:`SimulatedCandidate` with a failure status. Kernels are Python callables called as
    ``kernel(*kernel_args)`` (for example writing into CPU torch tensors); every launch is recorded
    in :attr:`launches` as ``(config, grid, args)``.
    """

    name = "fake"
    defers_reference = True  # open_session(defer_reference=True), as the cuTile backend

    def __init__(
        self,
        timing: Callable[[Config], float],
        *,
        noise: float = 0.01,
        compile_s: Callable[[Config], float] | float = 0.8,
        failures: Callable[[Config], SimulatedCandidate | None] | None = None,
        device: DeviceInfo = DeviceInfo("Fake H200", "sm_90", 132),
        versions: Mapping[str, str] | None = None,
        workers: int = 16,
        seed: int = 0,
        cached: Callable[[Config], bool] | None = None,
    ) -> None:
        """``cached(config)``: whether a compile cache holds the config before this backend compiles it
        (None: every config; otherwise what this backend compiled is cached from then on, see
        :attr:`compiled`)."""
        self.source = ModelTiming(timing, noise=noise, compile_s=compile_s, failures=failures)
        self.cached = cached
        #: the configs this backend compiled (not answered by ``cached``), in order
        self.compiled: list[Config] = []
        self.device = device
        self._versions = dict(versions or {"cuda_tile": "fake", "tileiras": "fake", "driver": "fake"})
        self.workers = workers
        self.seed = seed
        self.launches: list[tuple[Config, tuple[int, ...], tuple[Any, ...]]] = []
        self.sessions: list[SimulatedSession] = []

    def _execute(self, config: Config, spec: Launch) -> None:
        self.launches.append((config, tuple(spec.grid), tuple(spec.args)))
        if callable(spec.kernel):
            spec.kernel(*spec.args)

    def open_session(
        self,
        plan: Callable[..., Launch],
        args: tuple[Any, ...],
        *,
        device_index: int,
        writes: Sequence[int],
        inplace: Sequence[int] = (),
        reference: Callable[..., Any] | None,
        tolerance: Mapping[str, tuple[float, float]] | None,
        name: str,
        defer_reference: bool = False,
    ) -> SimulatedSession:
        """``defer_reference``: the reference runs at the session's ``prepare`` (or before its first check),
        as on the cuTile backend."""
        guard = ArgGuard(args, writes, inplace) if (writes or inplace) else None
        checker = Checker(reference, guard, tolerance, defer=defer_reference) if guard is not None else None

        def run(c: Candidate) -> None:
            self._execute(c.config, plan(c.config, *args))

        def run_on(c: Candidate, move: Callable[[Sequence[Any]], tuple[Any, ...] | None]) -> bool:
            spec = plan(c.config, *args)
            spec = spec if isinstance(spec, Launch) else Launch(*spec)
            kargs = move(spec.args)
            if kargs is None:
                return False
            self._execute(c.config, Launch(spec.kernel, spec.grid, kargs))
            return True

        cached = None
        if self.cached is not None:
            predicate = self.cached

            def cached(cfg: Config) -> bool:
                return predicate(cfg) or cfg in self.compiled

        session = SimulatedSession(
            self.source, workers=self.workers, seed=self.seed, guard=guard, checker=checker, run=run, run_on=run_on,
            cached=cached, on_compile=self.compiled.append,
        )
        self.sessions.append(session)
        return session


class FakeCompilingBackend(FakeBackend):
    """A :class:`FakeBackend` that also compiles ahead, in the background, as the cuTile backend does for a
    new key served by an op's fallback meanwhile (:meth:`compile_ahead`)."""

    def __init__(self, timing: Callable[[Config], float], *, ahead_gate: threading.Event | None = None,
                 **kwargs: Any) -> None:
        """``ahead_gate``: compiles started by :meth:`compile_ahead` finish when it is set (None: at once);
        the other arguments as for :class:`FakeBackend`."""
        super().__init__(timing, **kwargs)
        self.ahead_gate = ahead_gate
        #: the config lists :meth:`compile_ahead` was asked to compile, in order
        self.ahead: list[list[Config]] = []

    def is_compiled(self, plan: Callable[..., Any], args: Sequence[Any], cfg: Config, device_index: int) -> bool | None:
        """Whether the simulated compile cache holds ``cfg`` (:meth:`CutileBackend.is_compiled`)."""
        return self.cached is None or self.cached(cfg) or cfg in self.compiled

    def compile_ahead(self, plan: Callable[..., Any], args: Sequence[Any], configs: Sequence[Config],
                      device_index: int, keep: bool = False) -> FakeAhead:
        """Compile ``configs`` in the background (in the compile cache once done): the simulated
        :meth:`tiletune.devices.backends.cutile.CutileBackend.compile_ahead`."""
        cfgs = list(configs)
        self.ahead.append(cfgs)
        return FakeAhead(self.ahead_gate, lambda: self.compiled.extend(cfgs))
