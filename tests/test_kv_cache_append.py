"""CPU tests of ``kv_cache_append`` with a start tensor: the torch reference, the launch plan and its integer
views, a block-by-block torch emulation of the cuTile kernel, the library op's tuning and replay on a fake
backend, and sm_90 compiles of the kernel.

The emulation (:func:`emulate_append`) follows ``kv_append_kernel_fn`` statement by statement over the
plan's grid (same chunking, same clamp of ``start``, same loop bounds); that the cuTile code does what the
emulation does is checked by ``tests/test_gpu_kv_cache.py`` on a GPU.
"""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.tile")

from tiletune.op.hotpath import CudaArrayView  # noqa: E402
from tiletune.kernels import decode_attention_op as dop  # noqa: E402
from tiletune.kernels import kv_cache_kernels as kk  # noqa: E402
from tiletune.devices.verify import compare_tensors  # noqa: E402

INT32_MAX = 2**31 - 1


def make(bsz, hkv, t, cap, d, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    ck = torch.randn(bsz, hkv, cap, d, generator=g).to(dtype)
    cv = torch.randn(bsz, hkv, cap, d, generator=g).to(dtype)
    k = torch.randn(bsz, hkv, t, d, generator=g).to(dtype)
    v = torch.randn(bsz, hkv, t, d, generator=g).to(dtype)
    return ck, cv, k, v


def naive(ck, cv, k, v, starts):
    """Expected caches: a Python loop over (batch, token), positions outside [0, capacity) skipped."""
    ck, cv = ck.clone(), cv.clone()
    cap = ck.shape[2]
    for b, s0 in enumerate(starts):
        for t in range(k.shape[2]):
            p = int(s0) + t
            if 0 <= p < cap:
                ck[b, :, p] = k[b, :, t]
                cv[b, :, p] = v[b, :, t]
    return ck, cv


def _clamp32(x):
    return max(-(2**31), min(int(x), INT32_MAX))


def emulate_append(ck, cv, k, v, start, chunk, dp, grid):
    """Torch mirror of ``kv_append_kernel_fn`` for every block of ``grid`` (integer tensors, any device)."""
    hkv, t_len, cap, d = k.shape[1], k.shape[2], ck.shape[2], k.shape[3]
    nc = -(-t_len // chunk)
    assert grid == (k.shape[0] * hkv * nc,)
    assert dp >= d and dp & (dp - 1) == 0
    for u in range(grid[0]):
        c, bh = u % nc, u // nc
        b, h = bh // hkv, bh % hkv
        s = _clamp32(min(max(int(start[b]), -t_len), cap))  # clamped in START's dtype, then int32
        t0 = c * chunk
        lo = max(t0, -s)
        hi = min(min(t0 + chunk, t_len), cap - s)
        for t in range(lo, hi):
            assert 0 <= s + t < cap  # no store is ever out of bounds
            row_k = torch.zeros(dp, dtype=k.dtype)
            row_k[:d] = k[b, h, t]  # the padded load
            ck[b, h, s + t] = row_k[:d]  # the store drops the padding
            row_v = torch.zeros(dp, dtype=v.dtype)
            row_v[:d] = v[b, h, t]
            cv[b, h, s + t] = row_v[:d]


# ---------------------------------------------------------------------------------------------
# the reference
# ---------------------------------------------------------------------------------------------

REF_CASES = [
    # bsz, hkv, t, cap, d, starts
    (3, 2, 1, 10, 4, [0, 5, 9]),  # decode: one token each, the last one at the final position
    (3, 2, 3, 10, 8, [0, 3, 7]),  # T > 1, per-batch starts, the last run ends at the capacity
    (4, 1, 3, 10, 4, [8, 9, 10, 11]),  # capacity edge: 2, 1, 0, 0 tokens written
    (3, 2, 4, 10, 4, [-2, -4, -100]),  # negative starts: only the positions >= 0 are written
    (2, 8, 17, 64, 64, [0, 47]),  # 17 tokens (two chunks of the kernel), one run ending at the capacity
    (2, 3, 5, 9, 80, [INT32_MAX, -(2**31)]),  # extreme int32 values: nothing written
]


@pytest.mark.parametrize("case", REF_CASES)
@pytest.mark.parametrize("sdt", [torch.int32, torch.int64])
def test_reference_writes_the_rows_inside_the_capacity(case, sdt):
    bsz, hkv, t, cap, d, starts = case
    ck, cv, k, v = make(bsz, hkv, t, cap, d)
    want_k, want_v = naive(ck, cv, k, v, starts)
    start = torch.tensor(starts, dtype=sdt)
    out = dop.kv_append_reference(ck, cv, k, v, start)
    assert out[0] is ck and out[1] is cv  # in place, the caches returned
    assert torch.equal(ck, want_k) and torch.equal(cv, want_v)


def test_reference_with_huge_int64_starts_writes_nothing():
    ck, cv, k, v = make(2, 2, 3, 10, 4)
    want_k, want_v = ck.clone(), cv.clone()
    dop.kv_append_reference(ck, cv, k, v, torch.tensor([2**40, -(2**62)], dtype=torch.int64))
    assert torch.equal(ck, want_k) and torch.equal(cv, want_v)


def test_reference_on_integer_views_is_the_reference_on_the_caches():
    """The op's arguments are integer views: the reference writes the same bits through them."""
    ck, cv, k, v = make(3, 2, 3, 10, 8, torch.float16)
    starts = [1, 7, -1]
    want_k, want_v = naive(ck, cv, k, v, starts)
    bits = dop.kv_append_bits(ck.dtype)
    dop.kv_append_reference(ck.view(bits), cv.view(bits), k.view(bits), v.view(bits), torch.tensor(starts))
    assert torch.equal(ck, want_k) and torch.equal(cv, want_v)


# ---------------------------------------------------------------------------------------------
# host side: integer views, plan, space
# ---------------------------------------------------------------------------------------------


def test_bits_dtype_by_element_size():
    assert dop.kv_append_bits(torch.bfloat16) is torch.int16
    assert dop.kv_append_bits(torch.float16) is torch.int16
    assert dop.kv_append_bits(torch.float32) is torch.int32
    assert dop.kv_append_bits(torch.float64) is torch.int64
    assert dop.kv_append_bits(torch.float8_e4m3fn) is torch.int8
    assert dop.kv_append_bits(torch.uint8) is torch.int8
    assert dop.kv_append_bits(torch.complex128) is None  # 16 bytes: torch indexing instead


def test_space_is_one_config():
    cands = dop.KV_APPEND_SPACE.candidates("sm_90")
    assert [c.as_dict() for c in cands] == [{"CHUNK": kk.KV_APPEND_CHUNK}]
    assert dop.KV_APPEND.inplace == ("cache_k", "cache_v") and dop.KV_APPEND.writes == ()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_prepare_passes_integer_views_without_copies(dtype):
    ck, cv, k, v = make(2, 4, 3, 50, 64, dtype)
    k = k.transpose(1, 2).contiguous().transpose(1, 2)  # (B, T, Hkv, D) storage, as a projection gives it
    start = torch.tensor([3, 40], dtype=torch.int64)
    prep = dop.prepare_kv_cache_append(ck, cv, k, v, start)
    assert prep.family is dop.KV_APPEND and prep.regime is None
    assert prep.result[0] is ck and prep.result[1] is cv
    bits = dop.kv_append_bits(dtype)
    for view, orig in zip(prep.args[:4], (ck, cv, k, v)):
        assert view.dtype == bits and view.data_ptr() == orig.data_ptr()
        assert view.shape == orig.shape and view.stride() == orig.stride()
    assert prep.args[4] is start  # int64 as it is: no conversion launch


@pytest.mark.parametrize("bsz,hkv,t,d", [(1, 8, 1, 128), (8, 1, 3, 64), (3, 8, 17, 128), (2, 2, 16, 80),
                                         (5, 4, 33, 64)])
def test_plan_grid_and_arguments(bsz, hkv, t, d):
    ck, cv, k, v = make(bsz, hkv, t, 100, d)
    start = torch.zeros(bsz, dtype=torch.int32)
    cfg = dop.KV_APPEND_SPACE.candidates("sm_90")[0]
    kernel, grid, args = dop.kv_append_plan(cfg, ck, cv, k, v, start)
    chunk = kk.KV_APPEND_CHUNK
    assert kernel is kk.kv_append_kernel
    assert grid == (bsz * hkv * -(-t // chunk),)
    dp = 1 << (d - 1).bit_length()
    assert args == (ck, cv, k, v, start, chunk, dp)
    import inspect

    assert len(args) == len(inspect.signature(kk.kv_append_kernel_fn).parameters)


def test_plan_takes_the_int64_kernel_for_huge_caches():
    ck = torch.empty((64, 8, 32768, 128), dtype=torch.int16, device="meta")  # 2^31 elements
    k = torch.empty((64, 8, 1, 128), dtype=torch.int16, device="meta")
    start = torch.empty((64,), dtype=torch.int32, device="meta")
    cfg = dop.KV_APPEND_SPACE.candidates("sm_90")[0]
    kernel, grid, _ = dop.kv_append_plan(cfg, ck, ck, k, k, start)
    assert kernel is dop.kv_append_kernel_i64 and grid == (64 * 8,)
    small = torch.empty((64, 8, 4096, 128), dtype=torch.int16, device="meta")
    assert dop.kv_append_plan(cfg, small, small, k, k, start)[0] is kk.kv_append_kernel


# ---------------------------------------------------------------------------------------------
# emulation of the kernel
# ---------------------------------------------------------------------------------------------

EMU_CASES = REF_CASES + [
    (8, 8, 1, 33, 128, [0, 1, 2, 31, 32, 33, -1, 5]),
    (2, 1, 40, 50, 64, [15, -20]),  # three chunks, the last partial; chunks cut by both ends
    (1, 2, 16, 16, 64, [0]),  # exactly one full chunk filling the whole cache
]


@pytest.mark.parametrize("case", EMU_CASES)
@pytest.mark.parametrize("sdt", [torch.int32, torch.int64])
def test_emulated_kernel_matches_the_reference(case, sdt):
    bsz, hkv, t, cap, d, starts = case
    ck, cv, k, v = make(bsz, hkv, t, cap, d)
    start = torch.tensor(starts, dtype=sdt)
    want_k, want_v = dop.kv_append_reference(ck.clone(), cv.clone(), k, v, start)
    prep = dop.prepare_kv_cache_append(ck, cv, k, v, start)
    cfg = dop.KV_APPEND_SPACE.candidates("sm_90")[0]
    _, grid, args = dop.kv_append_plan(cfg, *prep.args)
    emulate_append(*args, grid)
    assert torch.equal(ck, want_k) and torch.equal(cv, want_v)


def test_gate_compares_the_copies_exactly_and_is_not_vacuous():
    """Integer views: one wrong bit fails the gate (no tolerance), the right copy passes."""
    ck, cv, k, v = make(2, 2, 3, 10, 8)
    start = torch.tensor([1, 6])
    prep = dop.prepare_kv_cache_append(ck, cv, k, v, start)
    want = dop.kv_append_reference(*(a.clone() for a in prep.args))
    got = dop.kv_append_reference(*(a.clone() for a in prep.args))
    assert compare_tensors(got[0], want[0]) is None and compare_tensors(got[1], want[1]) is None
    got[1][1, 0, 7, 3] ^= 1  # one bit of one written element
    assert "exact" in compare_tensors(got[1], want[1])
    wrong = dop.kv_append_reference(*(a.clone() for a in prep.args[:4]), start + 1)
    assert compare_tensors(wrong[0], want[0]) is not None


# ---------------------------------------------------------------------------------------------
# the public op: CPU path, int path, the library op on a fake backend, recipes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sdt", [torch.int32, torch.int64])
def test_cpu_caches_take_the_torch_path(sdt):
    ck, cv, k, v = make(4, 2, 3, 10, 4, torch.float32)
    starts = [0, 8, -1, 12]
    want_k, want_v = naive(ck, cv, k, v, starts)
    out = dop.kv_cache_append(ck, cv, k, v, torch.tensor(starts, dtype=sdt))
    assert out[0] is ck and out[1] is cv
    assert torch.equal(ck, want_k) and torch.equal(cv, want_v)


def test_argument_checks_are_kept():
    ck = torch.zeros(2, 2, 8, 4)
    k = torch.zeros(2, 2, 3, 4)
    with pytest.raises(TypeError, match=r"^kv_cache_append\(\): start must be an int or an int32/int64 tensor, "
                                        r"got torch.float32$"):
        dop.kv_cache_append(ck, ck.clone(), k, k.clone(), torch.zeros(2))
    with pytest.raises(TypeError, match="got bool"):
        dop.kv_cache_append(ck, ck.clone(), k, k.clone(), True)
    with pytest.raises(ValueError, match=r"a start tensor must have shape \(2,\), got \(2, 1\)"):
        dop.kv_cache_append(ck, ck.clone(), k, k.clone(), torch.zeros(2, 1, dtype=torch.int32))
    with pytest.raises(TypeError, match="'k' must be a torch.Tensor"):
        dop.kv_cache_append(ck, ck.clone(), [1], k.clone(), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="differ"):
        dop.kv_cache_append(ck, ck[:, :, :4].clone(), k, k.clone(), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="capacity 8"):
        dop.kv_cache_append(ck, ck.clone(), k, k.clone(), -1)  # an int start is still checked


def test_empty_calls_return_at_once(monkeypatch):
    monkeypatch.setattr(dop, "prepare_kv_cache_append", lambda *a: pytest.fail("nothing to launch"))
    monkeypatch.setattr(dop, "kv_append_reference", lambda *a: pytest.fail("nothing to write"))
    monkeypatch.setattr(dop, "_launches_kernel", lambda c: True)
    for shape_c, shape_k in (((2, 2, 8, 4), (2, 2, 0, 4)), ((0, 2, 8, 4), (0, 2, 3, 4)),
                             ((2, 0, 8, 4), (2, 0, 3, 4)), ((2, 2, 0, 4), (2, 2, 3, 4))):
        ck, k = torch.zeros(shape_c), torch.zeros(shape_k)
        start = torch.zeros(shape_c[0], dtype=torch.int32)
        out = dop.kv_cache_append(ck, ck.clone(), k, k.clone(), start)
        assert out[0] is ck


class _InterfaceBackend:
    """Makes a FakeBackend read kernel arguments by array interface, as the cuTile backend does (recipes
    then pass integer views as :class:`CudaArrayView` objects, which the emulation resolves)."""

    accepts_array_interface = True


def _resolver(tensors):
    """``as_tensor(x)``: ``x`` itself, or the strided integer view of one of ``tensors`` an array-interface
    object describes."""
    typestr = {"<i2": torch.int16, "<i4": torch.int32, "<i8": torch.int64, "|i1": torch.int8}

    def as_tensor(x):
        if not isinstance(x, CudaArrayView):
            return x
        iface = x.__cuda_array_interface__
        dt = typestr[iface["typestr"]]
        es = torch.empty((), dtype=dt).element_size()
        ptr = iface["data"][0]
        for base in tensors:
            lo = base.untyped_storage().data_ptr()
            if lo <= ptr < lo + base.untyped_storage().nbytes() and base.element_size() == es:
                flat = base.view(dt)
                off = (ptr - flat.data_ptr()) // es + flat.storage_offset()
                return flat.as_strided(iface["shape"], tuple(s // es for s in iface["strides"]), off)
        raise AssertionError("a view of no known tensor")

    return as_tensor


def test_library_op_tunes_checks_and_replays_one_launch(monkeypatch):
    """On a fake backend (CPU): the one config launches from the first call on, without a tuning session
    (``tune_single=False``: no copies of the caches), later calls with the signature replay the single
    launch (a recipe of array-interface views), and every call writes the right rows."""
    import tiletune as tt
    from tiletune.devices.backends import FakeBackend
    from tiletune.kernels.library_op import LibraryOp

    class Backend(_InterfaceBackend, FakeBackend):
        pass

    be = Backend(lambda cfg: 2.0, noise=0.0)
    live: list = []
    as_tensor = _resolver(live)

    def kernel(*kargs):
        emulate_append(*(as_tensor(a) for a in kargs[:5]), *kargs[5:], be.launches[-1][1])

    monkeypatch.setattr(dop, "kv_append_kernel", kernel)
    monkeypatch.setattr(dop, "_launches_kernel", lambda c: True)
    LibraryOp.configure(backend=be, db=False, progress=False,
                        options=tt.TunerOptions(stopping=tt.StoppingRule(min_samples=1, max_samples=1)))
    dop.kv_cache_append.fastcall.clear()
    prepared = {"n": 0}
    real_prepare = dop.prepare_kv_cache_append

    def counted(*a):
        prepared["n"] += 1
        return real_prepare(*a)

    monkeypatch.setattr(dop, "prepare_kv_cache_append", counted)
    try:
        for i in range(6):
            ck, cv, k, v = make(3, 2, 5, 40, 64, seed=i)
            live[:] = [ck, cv, k, v]
            starts = [i, 37, -2 + i]
            sdt = torch.int64 if i % 2 else torch.int32
            want_k, want_v = naive(ck, cv, k, v, starts)
            n0 = len(be.launches)
            out = dop.kv_cache_append(ck, cv, k, v, torch.tensor(starts, dtype=sdt))
            assert out[0] is ck and out[1] is cv
            assert torch.equal(ck, want_k) and torch.equal(cv, want_v), i
            assert len(be.launches) - n0 == 1  # every call, the first ones too: one launch, no session
            if i >= 4:
                assert isinstance(be.launches[-1][2][0], CudaArrayView)  # a replayed recipe
        op = dop.KV_APPEND.op(None)
        # the start dtype is part of the key: two keys, neither tuned
        assert op.tuning_count == 0 and op.results == {} and len(op._configs) == 2
        assert len(dop.kv_cache_append.fastcall.recipes) == 2  # one per start dtype
        assert prepared["n"] == 4  # two calls per signature (first launch, learn), then replays
        # an int start: the two copies, never recorded
        dop.kv_cache_append(ck, cv, k, v, 3)
        assert torch.equal(ck[:, :, 3:8], k)
        assert len(dop.kv_cache_append.fastcall.recipes) == 2
    finally:
        LibraryOp.configure()
        dop.kv_cache_append.fastcall.clear()


# ---------------------------------------------------------------------------------------------
# sm_90 compiles (skipped without the TileIR assembler)
# ---------------------------------------------------------------------------------------------

_TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")


def _cck():
    if _TOOLS not in sys.path:
        sys.path.insert(0, _TOOLS)
    import compile_check_kv as cck

    return cck


@pytest.mark.parametrize("name", [v.name for v in _cck().variants()])
def test_kernel_compiles_for_sm90(name):
    """bf16/fp16 caches (int16 views), D 64/128 (and 80, padded), int32 and int64 starts, the int64 twin."""
    cck = _cck()
    ok, _, size, err = cck.compile_variant({v.name: v for v in cck.variants()}[name])
    if not ok and "tileiras" in err.lower() and "not found" in err.lower():
        pytest.skip(f"no TileIR assembler: {err}")
    assert ok, err
    assert size > 1000
