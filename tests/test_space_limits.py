"""Space: counting without listing, integers the database can hold, constraints that return bools (issue 43)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from tiletune import Space
from tiletune.errors import SpaceError
from tiletune.jsonio import INT_MAX, INT_MIN

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _million(constraints=None) -> Space:
    return Space(a=list(range(100)), b=list(range(100)), c=list(range(100)), constraints=constraints)


def test_a_million_config_space_with_a_constraint_is_counted_in_flat_memory():
    """Counted in a fresh process: its peak RSS grows < 50 MB (listing took ~1.1 GB; tracemalloc would
    slow the count six-fold, so the process's peak resident size is the measure)."""
    script = textwrap.dedent(f"""
        import resource, sys, time
        sys.path.insert(0, {SRC!r})
        from tiletune import Space
        sp = Space(a=list(range(100)), b=list(range(100)), c=list(range(100)),
                   constraints={{"even": lambda c: (c.a + c.b + c.c) % 2 == 0}})
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        n = sp.size()
        took = time.perf_counter() - t0
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(n, grew * 1024, took, len(sp._cache))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    n, grew, took, cached = out.stdout.split()
    assert int(n) == 500_000
    assert int(grew) < 50e6, f"peak RSS grew {int(grew) / 1e6:.1f} MB"
    assert float(took) < 120  # a few seconds; generous for a loaded machine
    assert int(cached) == 0  # nothing listed nor cached


def test_counting_streams_in_flat_python_memory():
    """tracemalloc on a 10^5-config space: the peak does not grow with the space."""
    sp = Space(a=list(range(100)), b=list(range(100)), c=list(range(10)),
               constraints={"even": lambda c: (c.a + c.b + c.c) % 2 == 0})
    tracemalloc.start()
    try:
        assert sp.size() == 50_000
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5e6, f"peak {peak / 1e6:.1f} MB"  # listing these 50,000 configs peaks near 40 MB


def test_size_without_constraints_is_the_product():
    assert _million().size() == 10**6
    big = Space(**{f"p{i}": list(range(10)) for i in range(10)})  # 10^10: once "too many to list"
    assert big.size() == 10**10


def test_small_spaces_still_list_and_cache():
    sp = Space(a=[1, 2, 4], b=[1, 2], constraints=[lambda c: c.a * c.b <= 4], baseline=dict(a=2, b=2))
    assert sp.size() == 5 and None in sp._cache
    assert sp.candidates()[0] == sp.baseline() and len(sp.candidates()) == 5


def test_an_empty_big_space_is_the_same_error_as_listing_it():
    sp = Space(a=list(range(100)), b=list(range(1000)), constraints=[lambda c: False])  # 10^5: streamed
    with pytest.raises(SpaceError, match=r"constraint 'constraint #0' removed all 100000 remaining"):
        sp.size()


@pytest.mark.parametrize("value", [2**80, INT_MAX + 1, INT_MIN - 1, np.uint64(2**64 - 1)])
def test_integers_beyond_64_bits_are_refused_when_the_space_is_made(value):
    with pytest.raises(SpaceError, match=r"parameter 'TM': integer \d+|-\d+ is out of range: it must fit in 64 bits"):
        Space(TM=[value, 1])


def test_integers_at_the_64_bit_bounds_are_accepted():
    assert Space(TM=[INT_MAX, INT_MIN, 1]).size() == 3


def test_integers_beyond_64_bits_in_per_arch_values_and_baselines():
    from tiletune import per_arch

    with pytest.raises(SpaceError, match="out of range"):
        Space(TM=per_arch([1], sm_90=[1, 2**64]))
    with pytest.raises(SpaceError, match="baseline parameter 'TM': integer .* out of range"):
        Space(TM=[1, 2], baseline=dict(TM=2**70))


@pytest.mark.parametrize("verdict", ["no", 0, 1, None, [], np.int64(1), 0.0])
def test_a_constraint_must_return_a_bool(verdict):
    sp = Space(TM=[1, 2], constraints={"wordy": lambda c: verdict})
    with pytest.raises(SpaceError, match=r"constraint 'wordy' returned .* a constraint must return True \(keep\) or "
                                         r"False \(drop\)"):
        sp.configs()


def test_numpy_bools_are_bools():
    sp = Space(TM=[1, 2, 4], constraints={"np": lambda c: np.int64(c.TM) < 4})  # np.bool_
    assert [c.TM for c in sp.configs()] == [1, 2]
    assert Space(TM=[1, 2], constraints=[lambda c: np.array([c.TM == 1])[0]]).size() == 1


def test_the_string_no_no_longer_keeps_every_config():
    with pytest.raises(SpaceError, match="constraint 'constraint #0' returned 'no' \\(str\\)"):
        Space(TM=[1, 2], constraints=[lambda c: "no"]).size()
