"""Guard bands (CPU): a candidate that writes outside its written arguments' elements fails its check.

The checked run of a candidate writes into twins of the written (and in-place) tensors laid out like the
originals inside a sentinel-filled buffer (:class:`tiletune.devices.verify.GuardBand`); bytes before, after
or between the elements that change fail the candidate ("wrote outside argument 1: ... past its end"), so
it is never timed and never wins, and its final launch never overwrites the caller's memory next to its
output. Here the "kernels" are Python functions on CPU tensors, in this process (FakeBackend) and in a
worker process (a shipped FakeBackend).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune.devices.backends import FakeBackend
from tiletune.devices.verify import GUARD_ALIGN, GUARD_BYTE, ArgGuard, Checker, GuardBand, guard_pad_bytes
from tiletune.records import Status

CANARY = 12345.0


# -- kernels (module level: shipped by reference to the worker) -----------------------------------
def good_kernel(x, y):
    y.copy_(x * 2)


def past_end_kernel(x, y):
    y.copy_(x * 2)
    y.as_strided((y.numel() + 1,), (1,))[-1] = -1.0  # one element past the end (a tile not masked)


def before_start_kernel(x, y):
    y.copy_(x * 2)
    torch.as_strided(y, (1,), (1,), y.storage_offset() - 1).fill_(-1.0)


def gap_kernel(x, y):  # y: a (rows, 3) view of a (rows, 6) buffer
    y.copy_(x * 2)
    y.as_strided((y.shape[0], 6), (6, 1))[0, 4] = -1.0


def _run_checked(guard: ArgGuard, kernel, kargs) -> str | None:
    moved = guard.checked_kernel_args(kargs)
    assert moved is not None
    kernel(*moved)
    return guard.after_checked_run()


# -- the helper --------------------------------------------------------------------------------
def test_pad_is_a_multiple_of_the_alignment_and_bounded():
    assert guard_pad_bytes(0) == 1 << 20
    assert guard_pad_bytes(40 << 20) == 10 << 20
    assert guard_pad_bytes(1 << 40) == 64 << 20
    assert all(guard_pad_bytes(n) % GUARD_ALIGN == 0 for n in (0, 1, 12345, 7 << 20))


def test_the_twin_has_the_layout_of_the_original():
    base = torch.zeros(5, 8)
    y = base[1:, 2:5]
    band = GuardBand(y)
    v = band.arm()
    assert v.shape == y.shape and v.stride() == y.stride() and v.dtype == y.dtype
    assert (v.data_ptr() - band.buf.data_ptr()) == band.lead and band.lead >= band.pad
    assert band.lead % GUARD_ALIGN == y.data_ptr() % GUARD_ALIGN  # same offset modulo 256
    assert bool((band.buf == GUARD_BYTE).all())
    v.copy_(torch.randn(4, 3))
    assert band.damage() is None  # the elements are not bands


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8,
                                   torch.int64, torch.bool, torch.complex64, torch.complex128])
def test_every_dtype_writes_inside_pass_and_outside_fails(dtype):
    y = torch.zeros(7, 3, dtype=dtype)[:, :2]
    band = GuardBand(y)
    v = band.arm()
    v.copy_(torch.ones(7, 2, dtype=dtype))
    assert band.damage() is None
    band.arm()
    v.as_strided((v.numel() * 10,), (1,))[-1] = 1  # within the twin's after-band
    assert "past its end" in band.damage()


def test_contiguous_output_inside_passes_past_end_fails_and_results_come_back():
    x, y = torch.randn(10), torch.full((10,), 7.0)
    guard = ArgGuard((x, y), outputs=(1,))
    checker = Checker(lambda x, y: x * 2, guard)
    assert guard.banded == (1,)
    assert _run_checked(guard, good_kernel, (x, y)) is None
    assert checker.compare() is None and torch.equal(y, x * 2)  # the twin's result copied back
    reason = _run_checked(guard, past_end_kernel, (x, y))
    assert reason == "wrote outside argument 1: 4 bytes past its end (up to +4 bytes)"


def test_before_the_start_and_between_strided_rows_are_caught():
    x = torch.randn(10)
    y = torch.zeros(14)[4:]
    guard = ArgGuard((x, y), outputs=(1,))
    assert "4 bytes before its start" in _run_checked(guard, before_start_kernel, (x, y))
    x2 = torch.randn(5, 3)
    y2 = torch.zeros(5, 6)[:, :3]
    guard2 = ArgGuard((x2, y2), outputs=(1,))
    assert "between its elements" in _run_checked(guard2, gap_kernel, (x2, y2))
    assert _run_checked(guard2, good_kernel, (x2, y2)) is None


def test_the_output_is_poisoned_and_an_unwritten_element_still_fails_the_checker():
    x, y = torch.randn(6), torch.zeros(6)
    guard = ArgGuard((x, y), outputs=(1,))
    checker = Checker(lambda x, y: x * 2, guard)

    def half(x, y):
        y[:3] = x[:3] * 2

    assert _run_checked(guard, half, (x, y)) is None
    assert "NaN" in checker.compare()


def test_in_place_argument_starts_from_its_saved_contents():
    y = torch.arange(8.0)
    guard = ArgGuard((y,), outputs=(), inplace=(0,))
    checker = Checker(lambda y: y + 1, guard)
    seen = []

    def add_one(y):
        seen.append(y.clone())
        y.add_(1)

    for _ in range(2):  # the twin is restored from the saved contents before every checked run
        assert _run_checked(guard, add_one, (y,)) is None
        assert checker.compare() is None
    assert all(torch.equal(s, torch.arange(8.0)) for s in seen)

    def add_one_and_past(y):
        y.add_(1)
        y.as_strided((9,), (1,))[8] = 0.0

    assert "argument 0: 4 bytes past its end" in _run_checked(guard, add_one_and_past, (y,))


def test_kernel_arguments_that_view_an_output_move_onto_its_twin():
    x, y = torch.randn(4, 4), torch.zeros(4, 4)
    guard = ArgGuard((x, y), outputs=(1,))
    moved = guard.checked_kernel_args((x.view(-1), (y.view(-1)[4:],), 3))
    flat, (tail,), three = moved
    assert flat is not None and three == 3
    assert tail.data_ptr() == guard._bands[1].view.data_ptr() + 16
    assert moved[0].data_ptr() == x.data_ptr()  # an input stays where it is


def test_arguments_that_share_memory_run_in_place():
    base = torch.zeros(8)
    x, y = base[:4], base[4:]
    guard = ArgGuard((x, y), outputs=(1,))
    assert guard.banded == ()
    assert guard.checked_kernel_args((x, y)) is None


def test_a_kernel_argument_beyond_the_twin_runs_in_place():
    base = torch.zeros(3 << 20)
    y = base[: 1 << 10]
    guard = ArgGuard((torch.randn(4), y), outputs=(1,))
    assert guard.checked_kernel_args((base,)) is None  # the whole 12 MiB buffer does not fit the twin
    assert guard.checked_kernel_args((y,)) is not None


# -- end to end ------------------------------------------------------------------------------
SPACE = tt.Space(K=[0, 1, 2], baseline=dict(K=0))
KERNELS = {0: good_kernel, 1: good_kernel, 2: past_end_kernel}


def model(cfg) -> float:
    return 100.0 - 10.0 * cfg.K  # the faulty K=2 would be fastest


def plan(cfg, x, y):
    return tt.Launch(KERNELS[cfg.K], (1,), (x, y))


def _caller_tensors(n: int = 64):
    x = torch.randn(n)
    buf = torch.full((n + 16,), CANARY)
    return x, buf, buf[:n]


def _assert_past_end_fails(op, be, x, buf, y):
    n = y.numel()
    op(x, y)
    (result,) = op.results.values()
    by_k = {m.config["K"]: m for m in result.measurements}
    assert by_k[2].status is Status.MISMATCH, by_k[2]
    assert "wrote outside argument 1: 4 bytes past its end" in by_k[2].reason
    assert not by_k[2].samples_us  # never timed
    assert result.winner == {"K": 1}
    assert bool((buf[n:] == CANARY).all())  # the caller's memory next to its output is intact
    torch.testing.assert_close(y, x * 2)
    assert all(c["K"] != 2 or args[1].data_ptr() != y.data_ptr() for c, _, args in be.launches)


def test_in_process_a_write_past_the_end_fails_its_check_and_never_wins():
    be = FakeBackend(model, noise=0.002)

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False, backend=be, progress=False)
    def op(cfg, x, y):
        return plan(cfg, x, y)

    _assert_past_end_fails(op, be, *_caller_tensors())


def test_in_a_worker_a_write_past_the_end_fails_its_check_and_never_wins():
    pytest.importorskip("cloudpickle")
    from tiletune.devices.workers import IsolatedBackend, IsolationOptions

    be = FakeBackend(model, noise=0.002)
    # no spares: no candidate here takes its worker down, and each spare is a Python importing torch
    iso = IsolatedBackend(be, worker_spec=be, options=IsolationOptions(watchdog_factor=20.0, watchdog_floor_s=1.0,
                                                                       first_watchdog_s=4.0, spare=False))

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False, backend=iso, progress=False)
    def op(cfg, x, y):
        return plan(cfg, x, y)

    x, buf, y = _caller_tensors()
    _assert_past_end_fails(op, be, x, buf, y)
    assert [c.as_dict() for c, _, _ in be.launches] == [{"K": 1}]  # only the winner ran in the caller


@pytest.mark.parametrize("dtype,offset", [(torch.float16, 1), (torch.int8, 3), (torch.float32, 1),
                                          (torch.float64, 0)])
def test_one_element_either_side_of_a_dense_view_is_caught_at_any_offset(dtype, offset):
    y = torch.zeros(40, dtype=dtype)[offset:offset + 13]
    band = GuardBand(y)
    assert band.dense
    for where, word in ((13, "past its end"), (-1, "before its start")):
        v = band.arm()
        v.copy_(torch.ones(13, dtype=dtype))
        assert band.damage() is None
        torch.as_strided(v, (1,), (1,), v.storage_offset() + where).fill_(1)
        assert word in band.damage()


def test_bands_that_cannot_be_made_are_given_up(monkeypatch):
    import tiletune.devices.verify as verify

    def no_memory(self, t):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(verify.GuardBand, "__init__", no_memory)
    x, y = torch.randn(4), torch.zeros(4)
    guard = ArgGuard((x, y), outputs=(1,))
    assert guard.checked_kernel_args((x, y)) is None
    assert guard.banded == () and "out of memory" in guard.band_error
