"""ColdL2Timer's held batches (no GPU: torch's CUDA calls are stand-ins that log what is enqueued): the spin
kernel goes first, between two events, sized by the batch, and only when asked; a batch the host enqueued in
more than the spin's time lengthens the spin of later batches; a missing spin kernel costs the samples nothing."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import pytest

from tiletune.devices import measure


class _Event:
    def __init__(self, log, enable_timing=True, ms=0.005):
        self.log = log
        self.ms = ms

    def record(self):
        self.log.append("record")

    def synchronize(self):
        self.log.append("sync")

    def elapsed_time(self, other):
        return self.ms  # every sample, and the spin, take this long on the "GPU"


@pytest.fixture(autouse=True)
def _fresh_hold(monkeypatch):
    """What a process learns of its host (the spin per launch) starts afresh in each test."""
    monkeypatch.setattr(measure.ColdL2Timer, "hold_per_launch", measure.HOLD_CYCLES_PER_LAUNCH)


def _timer(log, sleep=None, ms=0.005):
    def default_sleep(cycles):
        log.append(("sleep", cycles))

    cuda = SimpleNamespace(Event=lambda enable_timing=True: _Event(log, ms=ms), _sleep=sleep or default_sleep,
                           device=lambda dev: nullcontext())
    t = object.__new__(measure.ColdL2Timer)
    t.torch = SimpleNamespace(cuda=cuda)
    t.device = "cuda:0"
    t._buffer = SimpleNamespace(zero_=lambda: log.append("memset"))
    t._events = []
    t.backlog_cycles = 0
    return t


def _launch(log, name):
    return lambda: log.append(name)


def test_a_held_batch_queues_one_spin_sized_by_the_batch_before_anything_else():
    log = []
    got = _timer(log, ms=10.0).time_each([_launch(log, "a"), _launch(log, "b"), _launch(log, "a")], hold=True)
    assert got == [10_000.0] * 3
    assert log[:3] == ["record", ("sleep", 3 * measure.HOLD_CYCLES_PER_LAUNCH), "record"]
    assert log[3:] == ["memset", "record", "a", "record", "memset", "record", "b", "record",
                       "memset", "record", "a", "record", "sync"]


def test_the_spin_is_capped_and_absent_unless_asked():
    log = []
    t = _timer(log)
    t.time_each([_launch(log, "k")] * (measure.HOLD_MAX_CYCLES // measure.HOLD_CYCLES_PER_LAUNCH + 5), hold=True)
    assert log[1] == ("sleep", measure.HOLD_MAX_CYCLES)
    log.clear()
    t.time_each([_launch(log, "k")] * 2)
    assert not any(isinstance(x, tuple) for x in log) and log[0] == "memset"


def test_without_a_spin_kernel_the_samples_are_taken_all_the_same():
    log = []

    def broken(cycles):
        raise RuntimeError("no _sleep on this build")

    got = _timer(log, sleep=broken).time_each([_launch(log, "k")] * 2, hold=True)
    assert got == [5.0, 5.0] and log.count("k") == 2


@pytest.mark.parametrize("hold", [True, False])
def test_an_empty_batch_enqueues_nothing(hold):
    log = []
    assert _timer(log).time_each([], hold=hold) == [] and log == []


def test_a_batch_the_host_enqueued_within_its_spin_is_covered_and_changes_nothing():
    log = []
    t = _timer(log, ms=10.0)  # a 10 ms spin: three quick launches are enqueued well within it
    assert t.hold_covered is None
    t.time_each([_launch(log, "k")] * 3, hold=True)
    assert t.hold_covered is True and t.last_hold[1] == 10_000.0
    assert measure.ColdL2Timer.hold_per_launch == measure.HOLD_CYCLES_PER_LAUNCH


def test_a_host_slower_than_the_spin_lengthens_the_spin_of_later_batches_in_the_process():
    import time

    log = []

    def slow(name):
        def launch():
            time.sleep(0.002)  # 2 ms of host per launch, against a spin of 20 us on the "GPU"
            log.append(name)
        return launch

    t = _timer(log, ms=0.02)
    t.time_each([slow("k")] * 3, hold=True)
    assert t.hold_covered is False and t.last_hold[0] > 6000
    assert measure.ColdL2Timer.hold_per_launch == measure.HOLD_MAX_CYCLES_PER_LAUNCH  # wanted more: the cap
    log.clear()
    other = _timer(log, ms=0.02)  # another timer of the process (the next race's session) starts from it
    other.time_each([_launch(log, "k")] * 2, hold=True)
    assert log[1] == ("sleep", 2 * measure.HOLD_MAX_CYCLES_PER_LAUNCH)


def test_the_spin_learnt_is_what_the_host_needed_and_half_again():
    t = _timer([])
    t._learn_hold(host_us=300.0, spin_us=100.0, n=10)  # the host took 3x the spin
    assert measure.ColdL2Timer.hold_per_launch == int(measure.HOLD_CYCLES_PER_LAUNCH * 1.5 * 3)
    t._learn_hold(host_us=50.0, spin_us=100.0, n=10)  # covered: never shortened
    assert measure.ColdL2Timer.hold_per_launch == int(measure.HOLD_CYCLES_PER_LAUNCH * 1.5 * 3)
    assert t.hold_covered is True


def test_unreadable_spin_events_leave_the_samples_and_learn_nothing():
    log = []
    t = _timer(log, ms=0.02)
    calls = []

    class Odd(_Event):
        def elapsed_time(self, other):
            calls.append(1)
            if len(calls) == 1:  # the spin's pair is read first
                raise RuntimeError("event not recorded")
            return 0.02

    t.torch.cuda.Event = lambda enable_timing=True: Odd(log, ms=0.02)
    assert t.time_each([_launch(log, "k")] * 2, hold=True) == [20.0, 20.0]
    assert t.last_hold is None and t.hold_covered is None
