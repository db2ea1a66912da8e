"""Work spread over forked processes (cuTile's front end for many configs at once): results come back from
other processes, failures as text, and whatever a child does not deliver is handed back to run in-process."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tiletune.devices import forked

pytestmark = pytest.mark.skipif(not forked.available(), reason="needs os.fork")


def test_every_index_is_computed_in_another_process():
    parent = os.getpid()
    got = list(forked.run_forked(20, lambda i: (i * i, os.getpid()), procs=4))
    assert sorted(d.index for d in got) == list(range(20))
    assert all(d.ok for d in got)
    assert {d.value[0] for d in got} == {i * i for i in range(20)}
    pids = {d.value[1] for d in got}
    assert parent not in pids and 1 <= len(pids) <= 4


def test_a_failure_comes_back_as_text():
    def compute(i):
        if i == 3:
            raise TypeError("tile shape 3 is not a power of two")
        return i

    got = {d.index: d for d in forked.run_forked(6, compute, procs=3)}
    assert got[3].ok is False and got[3].value == "TypeError: tile shape 3 is not a power of two"
    assert all(got[i].ok and got[i].value == i for i in (0, 1, 2, 4, 5))


def test_a_stuck_child_costs_time_not_results():
    def compute(i):
        if i == 0:
            time.sleep(60)  # a child deadlocked on a lock some thread held at the fork
        return i

    t = time.perf_counter()
    got = {d.index: d for d in forked.run_forked(5, compute, procs=2, timeout_s=1.0)}
    assert time.perf_counter() - t < 10
    assert got[0].ok is None  # undelivered: the caller runs it in-process
    assert all(got[i].ok and got[i].value == i for i in range(1, 5))


def test_a_value_that_cannot_travel_is_handed_back():
    got = {d.index: d for d in forked.run_forked(3, lambda i: threading.Lock() if i == 1 else i, procs=2)}
    assert got[1].ok is None and got[0].value == 0 and got[2].value == 2


def test_stop_hands_back_what_was_not_delivered():
    stop = threading.Event()
    stop.set()
    got = list(forked.run_forked(4, lambda i: time.sleep(5) or i, procs=2, stop=stop))
    assert sorted(d.index for d in got) == [0, 1, 2, 3] and all(d.ok is None for d in got)


def test_children_are_reaped():
    """Every child is waited for (none left a zombie); other children of this process (a tuning zygote
    an earlier test started) are not run_forked's business."""
    pids = {d.value for d in forked.run_forked(8, lambda i: os.getpid(), procs=4)}
    assert pids and os.getpid() not in pids
    for pid in pids:
        with pytest.raises(ChildProcessError):  # reaped: no longer a child of this process
            os.waitpid(pid, os.WNOHANG)
