"""GPU tests of ``kv_cache_append`` with a start tensor: the one-launch cuTile append against torch index writes,
positions outside the capacity skipped, layouts (strided rows, fused caches, padded head dims, other element
sizes), the recipe replay, one kernel per call under the profiler, and CUDA-graph capture.

Run on the GPU host: ``python -m pytest -m gpu -q tests/test_gpu_kv_cache.py``.

Every tuning session here uses the production plan, space, reference and gate with ``db=False``
(:func:`kv_op`); every session must pass the gate (:func:`_assert_all_passed`). Results are compared
bit for bit (``torch.equal`` on the whole caches: the rows written and every row left alone).
"""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("cuda.tile")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

import tiletune as tt  # noqa: E402

dop = importlib.import_module("tiletune.kernels.decode_attention_op")

DEV = "cuda"
FAST = tt.TunerOptions(stopping=tt.StoppingRule(min_samples=3, max_samples=6, max_seconds=0.05), batch=3,
                       showdown_rounds=1)

_ops: dict[str, tt.TunedOp] = {}


def _kv_op() -> tt.TunedOp:
    if "kv" not in _ops:
        lib = dop.KV_APPEND
        _ops["kv"] = tt.autotune(dop.KV_APPEND_SPACE, reference=lib.reference, inplace=list(lib.inplace),
                                 db=False, progress=False, options=FAST, buckets=lib.buckets,
                                 name=f"{lib.name}[test]")(lib.plan)
    return _ops["kv"]


@pytest.fixture
def kv_op(monkeypatch):
    """The library op KV_APPEND answers every call with a db=False tuned op; recipes learnt by earlier
    tests are dropped (a replay would launch another op's choice)."""
    from tiletune.kernels.fastcall import clear_recipes

    op = _kv_op()
    monkeypatch.setattr(dop.KV_APPEND, "op", lambda regime: op)
    clear_recipes()
    yield op
    clear_recipes()


def _assert_all_passed(op: tt.TunedOp, before: set) -> None:
    for key, res in op.results.items():
        if key not in before:
            assert res.successes and not res.failures, res.summary()


def _tensors(bsz, hkv, t, cap, d, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, device=DEV, dtype=torch.float32, generator=g).to(dtype)

    return rnd(bsz, hkv, cap, d), rnd(bsz, hkv, cap, d), rnd(bsz, hkv, t, d), rnd(bsz, hkv, t, d)


def _want(ck, cv, k, v, starts):
    """Torch index writes (slices per batch entry) of the positions inside [0, capacity), on copies."""
    ck, cv = ck.clone(), cv.clone()
    cap, t = ck.shape[2], k.shape[2]
    for b, s in enumerate(starts):
        lo, hi = max(0, -s), min(t, cap - s)
        if lo < hi:
            ck[b, :, s + lo:s + hi] = k[b, :, lo:hi]
            cv[b, :, s + lo:s + hi] = v[b, :, lo:hi]
    return ck, cv


def _starts(bsz, t, cap):
    """Per-batch starts: inside, ending exactly at the capacity, straddling it, negative, past it, 0, ..."""
    pattern = [5, cap - t, cap - 1, -1, 0, cap + 3, 123, -t + 1]
    return pattern[:bsz] if bsz <= len(pattern) else [pattern[i % len(pattern)] for i in range(bsz)]


# --------------------------------------------------------------------------------------------
# against torch index writes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bsz", [1, 2, 5, 8])
@pytest.mark.parametrize("hkv", [1, 8])
@pytest.mark.parametrize("d,dtype", [(128, torch.bfloat16), (64, torch.float16)])
@pytest.mark.parametrize("t", [1, 3, 17])
@pytest.mark.parametrize("sdt", [torch.int32, torch.int64])
def test_append_matches_index_writes(kv_op, bsz, hkv, d, dtype, t, sdt):
    before = set(kv_op.results)
    cap = 300  # not a power of two
    ck, cv, k, v = _tensors(bsz, hkv, t, cap, d, dtype, seed=bsz * 100 + t)
    starts = _starts(bsz, t, cap)
    want_k, want_v = _want(ck, cv, k, v, starts)
    out = dop.kv_cache_append(ck, cv, k, v, torch.tensor(starts, dtype=sdt, device=DEV))
    assert out[0] is ck and out[1] is cv
    torch.cuda.synchronize()
    assert torch.equal(ck, want_k) and torch.equal(cv, want_v)
    _assert_all_passed(kv_op, before)


@pytest.mark.parametrize("sdt", [torch.int32, torch.int64])
def test_extreme_starts_write_nothing(kv_op, sdt):
    ck, cv, k, v = _tensors(4, 8, 3, 64, 128)
    info = torch.iinfo(sdt)
    starts = [info.max, info.min, info.max - 1, info.min + 2]
    want_k, want_v = ck.clone(), cv.clone()
    dop.kv_cache_append(ck, cv, k, v, torch.tensor(starts, dtype=sdt, device=DEV))
    torch.cuda.synchronize()
    assert torch.equal(ck, want_k) and torch.equal(cv, want_v)


def test_layouts_strided_rows_fused_caches_padded_head_dim_other_dtypes(kv_op):
    bsz, hkv, t, cap = 3, 4, 5, 200
    starts = [0, 197, 50]
    start = torch.tensor(starts, device=DEV)
    # k/v as the projection gives them: (B, T, Hkv, D) storage viewed (B, Hkv, T, D); caches two halves of one buffer
    for d, dtype in ((128, torch.bfloat16), (80, torch.bfloat16), (64, torch.float32), (128, torch.float8_e4m3fn)):
        kv = torch.randn(2, bsz, hkv, cap, d, device=DEV).to(dtype)
        ck, cv = kv[0], kv[1]
        proj = torch.randn(bsz, t, 2 * hkv, d, device=DEV).to(dtype)
        k, v = proj[:, :, :hkv].transpose(1, 2), proj[:, :, hkv:].transpose(1, 2)
        want_k, want_v = _want(ck, cv, k, v, starts)
        dop.kv_cache_append(ck, cv, k, v, start)
        torch.cuda.synchronize()
        bits = dop.kv_append_bits(dtype)  # compare bits (float8 has no torch.equal on every build)
        assert torch.equal(ck.view(bits), want_k.view(bits)) and torch.equal(cv.view(bits), want_v.view(bits)), \
            (d, dtype)


# --------------------------------------------------------------------------------------------
# host path: one launch per call, recipes, CUDA graphs
# --------------------------------------------------------------------------------------------


def test_one_kernel_per_call_and_the_recipe_replays(kv_op):
    from torch.profiler import ProfilerActivity, profile

    bsz, hkv, cap, d = 8, 8, 4096, 128
    ck, cv, _, _ = _tensors(bsz, hkv, 1, cap, d)
    pos = torch.full((bsz,), 100, dtype=torch.int64, device=DEV)
    for i in range(4):  # tune, learn the recipe, replay
        proj = torch.randn(bsz, 1, 2 * hkv, d, device=DEV, dtype=torch.bfloat16)
        k, v = proj[:, :, :hkv].transpose(1, 2), proj[:, :, hkv:].transpose(1, 2)
        want_k, want_v = _want(ck, cv, k, v, pos.tolist())
        dop.kv_cache_append(ck, cv, k, v, pos)
        torch.cuda.synchronize()
        assert torch.equal(ck, want_k) and torch.equal(cv, want_v), i
        pos += 1
    fast = dop.kv_cache_append.fastcall
    assert len(fast.recipes) == 1, fast.refusals
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            dop.kv_cache_append(ck, cv, k, v, pos)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 5, kernels  # the torch path this replaced launched 5 kernels per call


@pytest.mark.parametrize("sdt", [torch.int32, torch.int64])
def test_append_replays_in_a_cuda_graph(kv_op, sdt):
    """Tuned once, the append is captured; starts and rows written in place are seen by the replays."""
    bsz, hkv, t, cap, d = 4, 8, 2, 512, 128
    ck, cv, k, v = _tensors(bsz, hkv, t, cap, d)
    start = torch.tensor([0, 10, 100, 510], dtype=sdt, device=DEV)
    dop.kv_cache_append(ck, cv, k, v, start)  # tunes
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dop.kv_cache_append(ck, cv, k, v, start)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dop.kv_cache_append(ck, cv, k, v, start)
    for new in ([1, 2, 3, 4], [511, -1, 600, 255], [0, 0, 0, 0]):
        start.copy_(torch.tensor(new, dtype=sdt))
        k.normal_()
        v.normal_()
        want_k, want_v = _want(ck, cv, k, v, new)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(ck, want_k) and torch.equal(cv, want_v), new
