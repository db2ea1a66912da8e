"""GPU tests of decode attention (issue 20): the split-KV cuTile kernels and the one-split direct kernel
against SDPA, the KV-cache append, ``K.attention`` routing short queries to the decode kernels, and
CUDA-graph replay.

Run on the GPU host: ``python -m pytest -m gpu -q tests/test_gpu_decode_attention.py`` (a few minutes
on an H200 with a cold cuTile cache: the full 24-config space of the partial and of the direct kernel
is compiled once each, in parallel; the sweeps use a 4-config subspace of the same plans, references
and gates).

Every tuning session here uses the production reference and correctness gate, with ``db=False``; every
config a session measures must pass the gate (:func:`_assert_all_passed`), and the winner's output is
compared with ``scaled_dot_product_attention`` in float32.
"""

from __future__ import annotations

import importlib
import math

import pytest


torch = pytest.importorskip("torch")
ct = pytest.importorskip("cuda.tile")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

import tiletune as tt  # noqa: E402

dop = importlib.import_module("tiletune.kernels.decode_attention_op")
attn_mod = importlib.import_module("tiletune.kernels.attention_op")
from tiletune.kernels.decode_attention_kernels import DECODE_BASELINE  # noqa: E402

F = torch.nn.functional
DEV = "cuda"

FAST = tt.TunerOptions(stopping=tt.StoppingRule(min_samples=3, max_samples=6, max_seconds=0.05), batch=3,
                       showdown_rounds=1)

#: 4 configs: the baseline, the smallest and largest key tiles, a latency hint with 8 warps.
PICKS = {(128, 0, 2, 4), (64, 0, 1, 4), (256, 0, 1, 8), (128, 3, 1, 8)}
SMALL_SPACE = tt.Space(BLOCK_N=[64, 128, 256], KV_LATENCY=[0, 3], occupancy=[1, 2], num_worker_warps=[4, 8],
                       constraints={"pick": lambda c: (c.BLOCK_N, c.KV_LATENCY, c.occupancy, c.num_worker_warps)
                                    in PICKS},
                       baseline=DECODE_BASELINE)

_ops: dict[str, tt.TunedOp] = {}

#: test op -> (library op, space): the partial and direct kernels over the full or the 4-config space
_KINDS = {"full": ("DECODE_PARTIAL", "DECODE_SPACE"), "small": ("DECODE_PARTIAL", None),
          "combine": ("DECODE_COMBINE", "DECODE_COMBINE_SPACE"),
          "direct-full": ("DECODE_DIRECT", "DECODE_SPACE"), "direct-small": ("DECODE_DIRECT", None)}


def _op(which: str) -> tt.TunedOp:
    if which not in _ops:
        lib, space = _KINDS[which]
        prod = getattr(dop, lib)
        space = SMALL_SPACE if space is None else getattr(dop, space)
        _ops[which] = tt.autotune(space, reference=prod.reference, writes=list(prod.writes), db=False,
                                  progress=False, tolerance=prod.tolerance, options=FAST,
                                  name=f"{prod.name}[test-{which}]")(prod.plan)
    return _ops[which]


def _use(monkeypatch, partial: tt.TunedOp, combine: tt.TunedOp, direct: tt.TunedOp) -> None:
    """The library ops DECODE_PARTIAL, DECODE_COMBINE and DECODE_DIRECT answer every call with these
    tuned ops.

    Recipes learnt so far are dropped: a replayed call would launch an earlier test's ops' choices."""
    from tiletune.kernels.fastcall import clear_recipes

    monkeypatch.setattr(dop.DECODE_PARTIAL, "op", lambda regime: partial)
    monkeypatch.setattr(dop.DECODE_COMBINE, "op", lambda regime: combine)
    monkeypatch.setattr(dop.DECODE_DIRECT, "op", lambda regime: direct)
    clear_recipes()


@pytest.fixture
def small_ops(monkeypatch):
    """The 4-config partial op (returned), the combine, and the 4-config direct op (``_ops["direct-small"]``)."""
    _use(monkeypatch, _op("small"), _op("combine"), _op("direct-small"))
    return _ops["small"]


def _assert_all_passed(op: tt.TunedOp, before: set) -> None:
    new = [res for key, res in op.results.items() if key not in before]
    assert new, "no tuning session ran"
    for res in new:
        assert res.successes and not res.failures, res.summary()


def _inputs(bsz, h, hkv, sq, cap, d, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(bsz, h, sq, d, device=DEV, dtype=dtype, generator=g)
    k = torch.randn(bsz, hkv, cap, d, device=DEV, dtype=dtype, generator=g)
    v = torch.randn(bsz, hkv, cap, d, device=DEV, dtype=dtype, generator=g)
    return q, k, v


def _want(q, k, v, lens, causal, scale=None):
    """SDPA in float32 per batch entry over its first lens[b] positions, bottom-right causal."""
    bsz, h, sq, d = q.shape
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(bsz):
        n = int(lens[b])
        kk = k[b:b + 1, :, :n].float().repeat_interleave(h // k.shape[1], dim=1)
        vv = v[b:b + 1, :, :n].float().repeat_interleave(h // k.shape[1], dim=1)
        mask = None
        if causal:
            i = torch.arange(sq, device=q.device)[:, None]
            j = torch.arange(n, device=q.device)[None, :]
            mask = j <= n - sq + i
        out[b:b + 1] = F.scaled_dot_product_attention(q[b:b + 1].float(), kk, vv, attn_mask=mask, scale=scale)
    return out


def _check(o, want, dtype):
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    torch.testing.assert_close(o.float(), want, rtol=tol, atol=tol)


# --------------------------------------------------------------------------------------------
# every config of the production space passes the gate
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 32, 8, 1, 3000, 128, [3000, 2049, 700, 1], False),
                                   (2, 16, 4, 16, 1500, 64, [1500, 333], True),
                                   # Llama decode at batch 64: one split, the direct kernel
                                   (64, 32, 8, 1, 2048, 128, [2048 - 31 * i for i in range(64)], True)])
def test_every_config_of_the_space_passes_the_gate(monkeypatch, shape):
    bsz, h, hkv, sq, cap, d, lens, causal = shape
    _use(monkeypatch, _op("full"), _op("combine"), _op("direct-full"))
    q, k, v = _inputs(bsz, h, hkv, sq, cap, d)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEV)
    direct = dop.prepare_decode(q, k, v, lens_t, causal, 1.0 / math.sqrt(d)).direct
    assert direct == (bsz == 64)
    op = _op("direct-full" if direct else "full")
    before = set(op.results)
    o = dop.decode_attention(q, k, v, lens_t, causal=causal)
    _assert_all_passed(op, before)
    assert [len(r.measurements) for key, r in op.results.items() if key not in before] == [24]
    _check(o, _want(q, k, v, lens, causal), q.dtype)


# --------------------------------------------------------------------------------------------
# sweeps against SDPA (4-config space, every config gated)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("h,hkv", [(8, 8), (32, 8), (12, 2), (16, 1)])  # MHA, Llama GQA, G=6, MQA G=16
@pytest.mark.parametrize("sq", [1, 2, 5, 16])
@pytest.mark.parametrize("d,dtype", [(128, torch.bfloat16), (64, torch.float16)])
def test_decode_matches_sdpa(small_ops, h, hkv, sq, d, dtype):
    before = set(small_ops.results)
    cap = 1000 + 37  # not a multiple of any tile
    lens = [cap, 513, max(sq, 129)]
    q, k, v = _inputs(3, h, hkv, sq, cap, d, dtype, seed=sq)
    for causal in (True, False):
        lens_t = torch.tensor(lens, dtype=torch.int32, device=DEV)
        o = dop.decode_attention(q, k, v, lens_t, causal=causal)
        assert o.shape == q.shape and o.dtype == dtype
        _check(o, _want(q, k, v, lens, causal), dtype)
    o = dop.decode_attention(q, k, v, 700, causal=False, scale=0.05)  # an int length, a custom scale
    _check(o, _want(q, k, v, [700] * 3, False, scale=0.05), dtype)
    _assert_all_passed(small_ops, before)


def test_long_cache_many_splits(small_ops):
    q, k, v = _inputs(1, 32, 8, 1, 32768, 128)
    lens = [32768 - 5]
    o = dop.decode_attention(q, k, v, torch.tensor(lens, dtype=torch.int32, device=DEV))
    _check(o, _want(q, k, v, lens, True), q.dtype)


# --------------------------------------------------------------------------------------------
# one split: the direct kernel against SDPA and the split path
# --------------------------------------------------------------------------------------------


def _both_paths(q, k, v, lens, causal, sms=None):
    """``(direct call, output)`` and ``(split call, output)`` of one problem: the op's own choice, and the
    partial + combine launches forced (``allow_direct=False``) with the same splits."""
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEV)
    scale = 1.0 / math.sqrt(q.shape[-1])
    chosen = dop.prepare_decode(q, k, v, lens_t, causal, scale, sms=sms)
    split = dop.prepare_decode(q, k, v, lens_t, causal, scale, sms=sms, allow_direct=False)
    return (chosen, chosen.run()), (split, split.run())


@pytest.mark.parametrize("h,hkv,sq,d,dtype", [
    (32, 8, 1, 128, torch.bfloat16),  # Llama GQA 4
    (8, 8, 1, 64, torch.float16),  # MHA: 1 head x 16 padded tokens per block
    (32, 8, 5, 128, torch.bfloat16),  # G=4 x 5 causal tokens (8 padded)
    (64, 8, 16, 128, torch.bfloat16),  # G=8 x 16 tokens: 128 rows
    (32, 2, 16, 64, torch.float16),  # G=16 x 16 tokens: two slices of 8 heads per kv head
])
def test_direct_kernel_matches_sdpa_and_the_split_path(small_ops, h, hkv, sq, d, dtype):
    """``sms=1``: one split for any batch, so the op takes the direct kernel; the same problem through
    the partial and combine kernels (one split) agrees with it and with SDPA."""
    before = {name: set(_ops[name].results) for name in ("small", "direct-small")}
    cap = 1000 + 37
    lens = [cap, 513, max(sq, 129), 2]  # the last: fewer keys than causal tokens for Sq > 2 (rows of 0)
    q, k, v = _inputs(4, h, hkv, sq, cap, d, dtype, seed=sq + h)
    for causal in (True, False):
        (direct, o), (split, o_split) = _both_paths(q, k, v, lens, causal, sms=1)
        assert direct.direct and direct.splits == 1 and not split.direct and split.splits == 1
        assert o.shape == q.shape and o.dtype == dtype
        want = _want(q, k, v, lens, causal)
        if causal and sq > 2:
            assert o[3, :, :sq - 2].abs().sum() == 0 and o_split[3, :, :sq - 2].abs().sum() == 0
            want[3, :, :sq - 2] = 0  # SDPA gives NaN for a row that sees nothing; the op gives 0
        _check(o, want, dtype)
        _check(o_split, want, dtype)
        _check(o, o_split.float(), dtype)
    _assert_all_passed(_ops["direct-small"], before["direct-small"])
    _assert_all_passed(_ops["small"], before["small"])


def test_batch_64_takes_the_direct_kernel_with_the_real_sm_count(small_ops):
    """Llama decode at batch 64 (B * Hkv = 512 blocks) needs no split on the device: one launch, replayed
    from a one-launch fastcall recipe, equal to SDPA and to the split path."""
    bsz, h, hkv, cap, d = 64, 32, 8, 4096, 128
    q, k, v = _inputs(bsz, h, hkv, 1, cap, d)
    lens = [cap - 61 * i for i in range(bsz)]
    (direct, o), (split, o_split) = _both_paths(q, k, v, lens, True)
    assert direct.direct and direct.splits == 1 and split.splits == 1
    want = _want(q, k, v, lens, True)
    _check(o, want, q.dtype)
    _check(o_split, want, q.dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEV)
    for _ in range(3):  # tuned above; a recorded call; a replay
        o = dop.decode_attention(q, k, v, lens_t)
    _check(o, want, q.dtype)
    recipes = list(dop.decode_attention.fastcall.recipes.values())
    assert len(recipes) == 1 and recipes[0].source.count("_launch") == 1, [r.source for r in recipes]


@pytest.mark.parametrize("bsz,sms", [(3, 1), (64, None)])
def test_qwen_group_of_7_without_the_grouped_kernel_keeps_the_split_path(small_ops, monkeypatch, bsz, sms):
    """G=7 (Qwen2.5 28/4 heads) with ``DIRECT_ANY_GROUP`` off: GB=8 heads per block would spill into the
    next kv head's, so even one split goes through the partial and combine kernels."""
    monkeypatch.setattr(dop, "DIRECT_ANY_GROUP", False)
    h, hkv, cap, d = 28, 4, 1500, 128
    q, k, v = _inputs(bsz, h, hkv, 1, cap, d, seed=7)
    lens = [cap - 23 * i for i in range(bsz)]
    (chosen, o), _ = _both_paths(q, k, v, lens, True, sms=sms)
    assert not chosen.direct and chosen.partial_args is not None
    if sms == 1:
        assert chosen.splits == 1
    _check(o, _want(q, k, v, lens, True), q.dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEV)
    _check(dop.decode_attention(q, k, v, lens_t), _want(q, k, v, lens, True), q.dtype)


@pytest.mark.parametrize("bsz,h,hkv,sq,d,dtype,sms", [
    (64, 28, 4, 1, 128, torch.bfloat16, None),  # Qwen2.5-7B decode at batch 64: one split on the device
    (3, 28, 4, 1, 128, torch.bfloat16, 1),  # the same group, a small batch
    (4, 12, 2, 3, 64, torch.float16, 1),  # G=6 x 3 causal tokens (8 x 4 padded rows)
    (2, 24, 2, 16, 64, torch.bfloat16, 1),  # G=12 x 16 tokens: a slice of 8 heads and one of 4
    (4, 10, 2, 1, 128, torch.bfloat16, 1),  # G=5
])
def test_grouped_direct_kernel_serves_any_group(small_ops, monkeypatch, bsz, h, hkv, sq, d, dtype, sms):
    """``DIRECT_ANY_GROUP``: a group its slices do not tile takes the grouped direct kernel (one launch,
    the output's ``(B, Hkv, G, Sq, D)`` view), equal to SDPA and to the split path, every config of the
    4-config space passing the gate; the padded heads and tokens never land in the output (the next kv
    head's rows and the tensor past the output stay intact); replayed from a one-launch recipe. This test
    gates turning ``DIRECT_ANY_GROUP`` on."""
    monkeypatch.setattr(dop, "DIRECT_ANY_GROUP", True)
    before = set(_ops["direct-small"].results)
    cap = 1500 + 11
    q, k, v = _inputs(bsz, h, hkv, sq, cap, d, dtype, seed=bsz + h + sq)
    lens = [max(1, cap - 37 * i) for i in range(bsz)]
    wants = {}
    for causal in (True, False):
        (direct, o), (split, o_split) = _both_paths(q, k, v, lens, causal, sms=sms)
        assert direct.direct and direct.direct_args[4].dim() == 5 and not split.direct
        want = wants[causal] = _want(q, k, v, lens, causal)
        _check(o, want, dtype)
        _check(o_split, want, dtype)
        _check(o, o_split.float(), dtype)
    _assert_all_passed(_ops["direct-small"], before)
    # the store keeps to the output: a guard band after it in the same allocation stays untouched
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEV)
    call = dop.prepare_decode(q, k, v, lens_t, True, 1.0 / math.sqrt(d), sms=sms)
    band = torch.empty(2 * q.numel(), dtype=dtype, device=DEV).fill_(7.0)
    o5 = band[:q.numel()].view(bsz, hkv, h // hkv, sq, d)
    dop.DecodeCall(None, None, band[:q.numel()].view(q.shape), 1, direct_args=call.direct_args[:4] + (o5,)
                   + call.direct_args[5:]).run()
    _check(band[:q.numel()].view(q.shape), wants[True], dtype)
    assert (band[q.numel():] == 7.0).all()
    dop.decode_attention.fastcall.clear()
    for _ in range(3):  # tuned above; a recorded call; a replay
        o = dop.decode_attention(q, k, v, lens_t)
    _check(o, wants[True], dtype)
    if sms is None:  # the device's SM count: the op's own choice is the grouped kernel, one launch
        recipes = list(dop.decode_attention.fastcall.recipes.values())
        assert len(recipes) == 1 and recipes[0].source.count("_launch") == 1, [r.source for r in recipes]


# --------------------------------------------------------------------------------------------
# KV-cache append + decode, routing, CUDA graphs
# --------------------------------------------------------------------------------------------


def test_kv_cache_append_then_decode(small_ops, monkeypatch):
    lib = dop.KV_APPEND  # the start-tensor append: its library op tuned without a database, like the others here
    kv = tt.autotune(dop.KV_APPEND_SPACE, reference=lib.reference, inplace=list(lib.inplace), db=False,
                     progress=False, options=FAST, name=f"{lib.name}[test]")(lib.plan)
    monkeypatch.setattr(lib, "op", lambda regime: kv)
    bsz, hkv, h, cap, d = 2, 4, 16, 600, 128
    _, ck, cv = _inputs(bsz, h, hkv, 1, cap, d)
    k_new = torch.randn(bsz, hkv, 3, d, device=DEV, dtype=torch.bfloat16)
    v_new = torch.randn(bsz, hkv, 3, d, device=DEV, dtype=torch.bfloat16)
    ref_k, ref_v = ck.clone(), cv.clone()
    start = torch.tensor([100, 411], device=DEV)
    dop.kv_cache_append(ck, cv, k_new, v_new, start)
    for b, s0 in enumerate([100, 411]):
        ref_k[b, :, s0:s0 + 3] = k_new[b]
        ref_v[b, :, s0:s0 + 3] = v_new[b]
    assert torch.equal(ck, ref_k) and torch.equal(cv, ref_v)
    dop.kv_cache_append(ck, cv, k_new, v_new, 200)
    ref_k[:, :, 200:203], ref_v[:, :, 200:203] = k_new, v_new
    assert torch.equal(ck, ref_k) and torch.equal(cv, ref_v)
    q = torch.randn(bsz, h, 3, d, device=DEV, dtype=torch.bfloat16)
    lens = (start + 3).to(torch.int32)
    o = dop.decode_attention(q, ck, cv, lens, causal=True)
    _check(o, _want(q, ref_k, ref_v, [103, 414], True), q.dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_routes_short_queries_to_decode(small_ops, monkeypatch, causal):
    calls = []
    real = dop.prepare_decode

    def spy(*a, **kw):
        calls.append(a[0].shape)
        return real(*a, **kw)

    monkeypatch.setattr(attn_mod, "prepare_decode", spy)
    monkeypatch.setattr(attn_mod, "ROUTE_SHORT_QUERIES_TO_DECODE", True)  # the default; set so this test does not depend on it
    q, k, v = _inputs(2, 16, 4, 4, 1200, 64)
    o = attn_mod.attention(q, k, v, causal=causal)
    assert calls == [q.shape]
    want = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(4, 1),
                                          v.float().repeat_interleave(4, 1), is_causal=causal)  # top-left
    _check(o, want, q.dtype)
    for sq, sk in ((17, 1200), (8, 8)):  # more than 16 queries, or no more keys than queries: FlashAttention
        assert not attn_mod._routes_to_decode(sq, sk)
    assert attn_mod._routes_to_decode(16, 17) and attn_mod._routes_to_decode(1, 2)


@pytest.mark.parametrize("bsz", [4, 64])  # split KV; one split (the direct kernel)
def test_decode_replays_in_a_cuda_graph(small_ops, bsz):
    """Tuned once, the decode step is captured; new lengths written in place are seen by replays."""
    h, hkv, cap, d = 32, 8, 2048, 128
    q, k, v = _inputs(bsz, h, hkv, 1, cap, d)
    lens = torch.tensor(([2048, 1000, 77, 1500] * 16)[:bsz], dtype=torch.int32, device=DEV)
    assert dop.prepare_decode(q, k, v, lens, True, 1.0 / math.sqrt(d)).direct == (bsz == 64)
    dop.decode_attention(q, k, v, lens)  # tunes
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dop.decode_attention(q, k, v, lens)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = dop.decode_attention(q, k, v, lens)
    for new in (([5, 2048, 300, 1001] * 16)[:bsz], [1] * bsz):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        g.replay()
        torch.cuda.synchronize()
        _check(out, _want(q, k, v, new, True), q.dtype)
