"""ColdL2Timer's held batches (no GPU: torch's CUDA calls are stand-ins that log what is enqueued): the spin
kernel goes first, sized by the batch, and only when asked; a missing spin kernel costs the samples nothing."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import pytest

from tiletune.devices import measure


class _Event:
    def __init__(self, log, enable_timing=True):
        self.log = log

    def record(self):
        self.log.append("record")

    def synchronize(self):
        self.log.append("sync")

    def elapsed_time(self, other):
        return 0.005  # ms


def _timer(log, sleep=None):
    def default_sleep(cycles):
        log.append(("sleep", cycles))

    cuda = SimpleNamespace(Event=lambda enable_timing=True: _Event(log), _sleep=sleep or default_sleep,
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
    got = _timer(log).time_each([_launch(log, "a"), _launch(log, "b"), _launch(log, "a")], hold=True)
    assert got == [5.0, 5.0, 5.0]
    assert log[0] == ("sleep", 3 * measure.HOLD_CYCLES_PER_LAUNCH)
    assert log[1:] == ["memset", "record", "a", "record", "memset", "record", "b", "record",
                       "memset", "record", "a", "record", "sync"]


def test_the_spin_is_capped_and_absent_unless_asked():
    log = []
    t = _timer(log)
    t.time_each([_launch(log, "k")] * (measure.HOLD_MAX_CYCLES // measure.HOLD_CYCLES_PER_LAUNCH + 5), hold=True)
    assert log[0] == ("sleep", measure.HOLD_MAX_CYCLES)
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
