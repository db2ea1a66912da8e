"""GPU timing with a cold L2 cache, kept outside the timed region.

Each sample is: clear the L2 by writing a buffer twice its size (a memset on the same stream),
record a start event, launch, record an end event. A batch of samples is enqueued at once and read
after one synchronisation, so the host never stalls the GPU between samples; the memset (~40 us on
an H200) also gives the host time to enqueue the next launch, so host launch latency does not leak
into the timed region of short kernels.

When the host side of the timed call can take longer than the memset (a Python wrapper, a busy or
shared host), ``backlog_us`` adds a GPU spin kernel (``torch.cuda._sleep``) after the memset: the
GPU waits on it while the host enqueues the call, so the events time the device work alone (the
"blocking kernel" of NVIDIA's nvbench). Host overhead is then measured separately (see
``benchmarks/dispatch_overhead.py``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

#: spin-kernel cycles queued per launch before a *held* batch (``time_each(..., hold=True)``), to start with:
#: about 60 us a launch at an H200's working clock (1980 MHz), longer while the clock is still low, so the host
#: enqueues the whole batch (a Python launch wrapper, the memset, two events: 25-60 us a sample) while the GPU
#: waits. A batch whose host outlasted its spin raises it for the process (:data:`HOLD_COVER`)
HOLD_CYCLES_PER_LAUNCH = 120_000
#: at most this many cycles per launch (about 0.5 ms at the working clock) ...
HOLD_MAX_CYCLES_PER_LAUNCH = 1_000_000
#: ... and this many in all (about 16 ms at the working clock)
HOLD_MAX_CYCLES = 32_000_000
#: a held batch is *covered* when the host enqueued it within this share of the spin's time on the GPU; past it,
#: its last samples may have been enqueued after the GPU reached them (the host's time in their events), and the
#: next held batch's spin is longer
HOLD_COVER = 0.8


def hold_cycles(n: int, per_launch: int) -> int:
    """Spin cycles before a held batch of ``n`` launches."""
    return min(HOLD_MAX_CYCLES, per_launch * n)


class ColdL2Timer:
    """Times a zero-argument launch function on one device and stream with a cold L2."""

    #: spin cycles per launch of a held batch, as this process has learnt them (see :data:`HOLD_COVER`)
    hold_per_launch = HOLD_CYCLES_PER_LAUNCH
    #: ``(host enqueue us, spin us)`` of this timer's last held batch, None before one (or without its events)
    last_hold: tuple[float, float] | None = None

    def __init__(self, device_index: int, flush: bool = True, backlog_us: float = 0.0) -> None:
        import torch

        self.torch = torch
        self.device = torch.device("cuda", device_index)
        props = torch.cuda.get_device_properties(self.device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 << 20)
        self.flush_bytes = 2 * l2 if flush else 0
        self._buffer = (
            torch.empty(self.flush_bytes // 4, dtype=torch.int32, device=self.device) if flush else None
        )
        self._events: list[tuple[Any, Any]] = []
        self.backlog_us = float(backlog_us)
        self.backlog_cycles = self._calibrate_sleep(self.backlog_us) if self.backlog_us > 0 else 0

    def _calibrate_sleep(self, us: float) -> int:
        """Spin-kernel cycles that last about ``us`` microseconds on this device at its working clock.

        ``torch.cuda._sleep`` counts SM clock cycles, so the GPU is kept busy first (an idle H200
        sits at 345 MHz, a working one near 1980 MHz: calibrated idle, the spin would be ~6x
        shorter under load); the shortest of a few probes is taken (the highest clock).
        """
        torch = self.torch
        probe = 1_000_000
        with torch.cuda.device(self.device):
            torch.cuda._sleep(probe)  # first call loads the kernel
            self.spin(0.1)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            best = float("inf")
            for _ in range(5):
                start.record()
                torch.cuda._sleep(probe)
                end.record()
                end.synchronize()
                best = min(best, start.elapsed_time(end) * 1000.0)
        return max(1, int(probe * us / max(best, 1e-3)))

    def _pairs(self, n: int) -> list[tuple[Any, Any]]:
        while len(self._events) < n:
            E = self.torch.cuda.Event
            self._events.append((E(enable_timing=True), E(enable_timing=True)))
        return self._events[:n]

    def time(self, launch: Callable[[], None], n: int) -> list[float]:
        """``n`` samples of ``launch`` in microseconds."""
        return self.time_each([launch] * n)

    def time_each(self, launches: Sequence[Callable[[], None]], hold: bool = False) -> list[float]:
        """One sample of each launch, in order, in microseconds (one synchronisation at the end).

        ``hold``: a spin kernel first (:attr:`hold_per_launch` cycles a launch) keeps the GPU waiting while
        the host enqueues the batch, so no sample's events enclose host time: without it a launch whose host
        side outlasts the memset (a small kernel behind a Python wrapper) is timed with the host's gap, and
        the batch's first sample, enqueued while the GPU is idle, with more of it. The spin is timed between
        two events: :attr:`hold_covered` then says whether the host enqueued the batch within it, and a
        batch it did not cover lengthens the spin of the process's later batches."""
        if not launches:
            return []
        pairs = self._pairs(len(launches))
        buf = self._buffer
        spin = None
        if hold and buf is not None:
            try:
                E = self.torch.cuda.Event
                spin = (E(enable_timing=True), E(enable_timing=True))
                with self.torch.cuda.device(self.device):
                    spin[0].record()
                    self.torch.cuda._sleep(hold_cycles(len(launches), type(self).hold_per_launch))
                    spin[1].record()
            except Exception:  # noqa: BLE001 - no spin kernel: the samples are taken as without the hold
                spin = None
        t0 = time.perf_counter()
        for (start, end), launch in zip(pairs, launches):
            if buf is not None:
                buf.zero_()
            if self.backlog_cycles:
                self.torch.cuda._sleep(self.backlog_cycles)
            start.record()
            launch()
            end.record()
        host_us = (time.perf_counter() - t0) * 1e6
        pairs[-1][1].synchronize()
        if spin is not None:
            try:
                spin_us = spin[0].elapsed_time(spin[1]) * 1000.0
            except Exception:  # noqa: BLE001 - the spin's events unreadable: the samples stand, nothing learnt
                spin_us = None
            if spin_us is not None:
                self._learn_hold(host_us, spin_us, len(launches))
        return [start.elapsed_time(end) * 1000.0 for start, end in pairs]

    @property
    def hold_covered(self) -> bool | None:
        """Whether the last held batch was enqueued within its spin (:data:`HOLD_COVER`); None: no held batch
        measured yet."""
        if self.last_hold is None:
            return None
        host_us, spin_us = self.last_hold
        return host_us <= HOLD_COVER * spin_us

    def _learn_hold(self, host_us: float, spin_us: float, n: int) -> None:
        """Record the batch's hold; where the host outlasted the spin, give later held batches of this process
        the spin the host needed, with half as much again to spare (within the caps)."""
        self.last_hold = (host_us, spin_us)
        if host_us <= HOLD_COVER * spin_us or spin_us <= 0.0:
            return
        cls = type(self)
        spun = hold_cycles(n, cls.hold_per_launch) / n  # cycles per launch this batch had
        want = int(spun * 1.5 * host_us / spin_us)
        cls.hold_per_launch = max(cls.hold_per_launch, min(HOLD_MAX_CYCLES_PER_LAUNCH, want))

    def spin(self, seconds: float = 0.05) -> None:
        """Keep the GPU busy for about ``seconds`` so its clocks leave their idle state before timing."""
        if self._buffer is None:
            return
        import time

        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for _ in range(32):
                self._buffer.zero_()
            self.torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Release the flush buffer."""
        self._buffer = None
        self._events.clear()
