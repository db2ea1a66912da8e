"""What a backend is: the device-facing half of tuning.

The tuning loop (:mod:`tiletune.engine.tuner`) is the same for every backend. A backend opens a
:class:`TuningSession` for one problem (one op, one key, one device). The session compiles candidates
(possibly in parallel, yielding them as they finish), checks each against the reference, and returns
timing samples. The live cuTile backend does this on a GPU; the fake and replay backends answer from
models or recordings with a simulated clock, so the loop is tested on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Protocol, Sequence

from tiletune.records import DeviceInfo, Status
from tiletune.space.spaces import Config


@dataclass(frozen=True)
class Candidate:
    """One configuration to evaluate, with its position in the candidate order."""

    config: Config
    order: int
    is_baseline: bool = False


@dataclass(frozen=True)
class CompileOutcome:
    """Result of compiling one candidate: ``status`` is OK, COMPILE_ERROR or TIMEOUT."""

    candidate: Candidate
    status: Status
    seconds: float
    reason: str = ""
    cpu_s: float | None = None  # CPU seconds the compile used (front end + assembler), None if unknown
    #: asked with ``only_cached`` and in no cache: not compiled (status COMPILE_ERROR, so a consumer that
    #: does not look here never launches it)
    skipped: bool = False
    assembled: bool | None = None  # the assembler (tileiras) ran for it (not a cache hit), None if unknown


@dataclass(frozen=True)
class CheckOutcome:
    """Result of one correctness run: OK, LAUNCH_ERROR, MISMATCH or TIMEOUT."""

    status: Status
    reason: str = ""


class Launch(NamedTuple):
    """What a launch plan returns: the kernel, its grid and its kernel arguments.

    A plain ``(kernel, grid, args)`` tuple is accepted too. It is a named tuple, not a dataclass,
    because the plan runs on every call of a tuned op and must cost next to nothing.
    """

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]


class LaunchParts(NamedTuple):
    """How to launch one hinted kernel: ``launch(stream(device), grid, kernel, kernel_args)``.

    Handed out in pieces so the hot path composes them into a single closure.
    """

    launch: Callable[[Any, tuple[int, ...], Any, tuple[Any, ...]], None]
    stream: Callable[[int], Any]
    kernel: Any
    device: int


class TuningSession(Protocol):
    """One tuning problem on one device. Created by :meth:`Backend.open_session`.

    Optional members, used by the in-process race of a miss (:func:`tiletune.resolve.nearest.race`) when
    a session has them:

    * ``compiles_only_cached = True``: ``compile(candidates, only_cached=orders)`` compiles the candidates
      of those orders only when a compile cache holds them, and yields the others ``skipped``;
    * ``race_samples(candidates, n) -> {order: samples in us, or why the launch failed}``: ``n``
      cold-L2 samples of each compiled candidate, interleaved, whether or not it passed its check: the
      launches must not touch the caller's memory (the live backend launches on the guard bands' twins
      of the written arguments). None when the session cannot promise that: then every candidate is
      checked before it is timed.
    """

    def clock(self) -> float:
        """Seconds since the session opened (simulated for replay backends)."""

    def compile(self, candidates: Sequence[Candidate]) -> Iterator[CompileOutcome]:
        """Compile every candidate; yield outcomes as they complete (any order)."""

    def check(self, candidate: Candidate) -> CheckOutcome:
        """Run the compiled candidate once on poisoned outputs and compare with the reference."""

    def sample(self, candidate: Candidate, n: int) -> list[float]:
        """Return ``n`` timing samples in microseconds (cold L2, outside-of-sample work excluded)."""

    def finish(self, winner: Candidate | None) -> None:
        """Restore the user's arguments; if ``winner`` is given, launch it once on them."""


class Backend(Protocol):
    """A place where kernels run: the live cuTile GPU backend, or a simulated one."""

    name: str

    def device_info(self, device_index: int) -> DeviceInfo:
        """Name, architecture and SM count of a device."""

    def versions(self) -> Mapping[str, str]:
        """Software versions that tuning results depend on (cuda-tile, tileiras, driver)."""

    def arg_device(self, args: Sequence[Any]) -> int:
        """The device index the call's arguments live on."""

    # Optional: ``stream_capturing(device_index) -> bool``, True while the stream launches go to is
    # being captured into a CUDA graph; a tuned op then launches the database's record or the
    # baseline config instead of tuning (see TunedOp.tune_pending).

    def launch_parts(self, config: Config, kernel: Any, device_index: int) -> LaunchParts:
        """How to launch ``kernel`` with this config's hints (applied once, up front)."""

    def kernel_sources(self, kernel: Any) -> str:
        """The source text that identifies a kernel (for the tuning database's kernel id)."""

    def open_session(
        self,
        plan: Callable[..., Launch],
        args: tuple[Any, ...],
        *,
        device_index: int,
        writes: Sequence[int],
        inplace: Sequence[int],
        reference: Callable[..., Any] | None,
        tolerance: Mapping[str, tuple[float, float]] | None,
        name: str,
    ) -> TuningSession:
        """Open a session tuning ``plan`` on ``args`` (``writes``: positions of written arguments)."""
