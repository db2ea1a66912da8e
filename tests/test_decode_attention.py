"""CPU tests of decode attention (issue 20): host helpers, launch plans, references, the KV-cache append,
a tile-by-tile torch emulation of the two cuTile kernels, and sm_90 compiles of every config.

The emulation (:func:`emulate_partial`, :func:`emulate_combine`) follows the kernels statement by
statement (same split bounds, key tiles of ``BLOCK_N``, running max with the ``-inf`` stand-in,
``P`` rounded to the input dtype, the same masks); it checks the algorithm and the index arithmetic on
a CPU. That the cuTile code computes what the emulation computes is checked by
``tests/test_gpu_decode_attention.py`` on a GPU.
"""

from __future__ import annotations

import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.tile")

from tiletune.kernels import decode_attention_kernels as dk  # noqa: E402
from tiletune.kernels import decode_attention_op as dop  # noqa: E402
from tiletune.devices.verify import compare_tensors, output_tolerance  # noqa: E402

NEG_INF = float("-inf")


def sdpa_bottom_right(q, k, v, lens, causal, scale):
    """float64 attention of q (B, H, Sq, D) over k/v[:, :, :lens[b]], bottom-right causal; float64."""
    bsz, h, sq, d = q.shape
    hkv = k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(bsz):
        n = int(lens[b])
        kk = k[b, :, :n].double().repeat_interleave(h // hkv, dim=0)
        vv = v[b, :, :n].double().repeat_interleave(h // hkv, dim=0)
        s = (q[b].double() @ kk.transpose(-1, -2)) * scale
        if causal:
            i = torch.arange(sq)[:, None]
            j = torch.arange(n)[None, :]
            s = s.masked_fill(j > n - sq + i, NEG_INF)
        out[b] = s.softmax(-1) @ vv
    return out


def make(bsz, h, hkv, sq, cap, d, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(bsz, h, sq, d, generator=g).to(dtype)
    k = torch.randn(bsz, hkv, cap, d, generator=g).to(dtype)
    v = torch.randn(bsz, hkv, cap, d, generator=g).to(dtype)
    return q, k, v


def emulate_block(q5, k, v, lens, ns, sp, b, hk, gi, causal, qk_scale_log2, BLOCK_N):
    """Torch mirror of ``_attend`` and the normalization for one block: ``(o, lse)`` of its
    ``(GB, QP, D)`` / ``(GB, QP)`` rows (padded heads and query tokens included)."""
    bsz, hkv, g, sq, d = q5.shape
    cap = k.shape[2]
    gb, qp, ngb = dk.decode_rows(g, sq)
    rows_n = gb * qp
    kv_len = min(max(int(lens[b]), 1), cap)
    per = -(-(-(-kv_len // dk.GRANULE)) // ns) * dk.GRANULE
    start = sp * per
    end = min(start + per, kv_len)
    t0, t1 = start // BLOCK_N, -(-end // BLOCK_N)
    mask_from = (max(kv_len - sq + 1, 0) if causal else kv_len) // BLOCK_N
    qt = torch.zeros(1, 1, gb, qp, d, dtype=q5.dtype)  # zero-padded tile load
    src = q5[b:b + 1, hk:hk + 1, gi * gb:(gi + 1) * gb, :qp]
    qt[:, :, :src.shape[2], :src.shape[3]] = src
    qt = qt.reshape(rows_n, d).float()
    qi = (torch.arange(rows_n) % qp).reshape(rows_n, 1)
    m_i = torch.full((rows_n, 1), NEG_INF)
    l_i = torch.zeros(rows_n, 1)
    acc = torch.zeros(rows_n, d)
    for t in range(t0, t1):
        kt = torch.zeros(BLOCK_N, d, dtype=k.dtype)
        seg = k[b, hk, t * BLOCK_N:(t + 1) * BLOCK_N]
        kt[:seg.shape[0]] = seg
        vt = torch.zeros(BLOCK_N, d, dtype=v.dtype)
        vt[:seg.shape[0]] = v[b, hk, t * BLOCK_N:(t + 1) * BLOCK_N]
        s = qt @ kt.float().T
        if t >= mask_from:
            offs_n = t * BLOCK_N + torch.arange(BLOCK_N).reshape(1, BLOCK_N)
            keep = offs_n < kv_len
            if causal:
                keep = keep & (offs_n <= kv_len - sq + qi)
            s = torch.where(keep, s, torch.tensor(NEG_INF))
        m_new = torch.maximum(m_i, s.amax(1, keepdim=True) * qk_scale_log2)
        m_use = torch.where(m_new == NEG_INF, torch.zeros(()), m_new)
        p = torch.exp2(s * qk_scale_log2 - m_use)
        alpha = torch.exp2(m_i - m_use)
        l_i = l_i * alpha + p.sum(1, keepdim=True)
        acc = p.to(q5.dtype).float() @ vt.float() + acc * alpha
        m_i = m_new
    seen = l_i > 0
    inv = torch.where(seen, 1.0 / torch.where(seen, l_i, torch.ones(())), torch.zeros(()))
    lse = m_i + torch.log2(torch.where(seen, l_i, torch.ones(())))
    return (acc * inv).reshape(gb, qp, d), lse.reshape(gb, qp)


def emulate_partial(q5, k, v, lens, ns, causal, qk_scale_log2, BLOCK_N):
    """Torch mirror of ``decode_partial_kernel_fn`` for every block of the grid."""
    bsz, hkv, g, sq, d = q5.shape
    gb, qp, ngb = dk.decode_rows(g, sq)
    po = torch.full((bsz * hkv * ns, g, sq, d), float("nan"))
    pl = torch.full((bsz * hkv * ns, g, sq), float("nan"))
    for u in range(bsz * hkv * ngb):
        gi, bh = u % ngb, u // ngb
        b, hk = bh // hkv, bh % hkv
        for sp in range(ns):
            o_t, l_t = emulate_block(q5, k, v, lens, ns, sp, b, hk, gi, causal, qk_scale_log2, BLOCK_N)
            row = bh * ns + sp
            gs = slice(gi * gb, min((gi + 1) * gb, g))
            n_g = gs.stop - gs.start
            po[row, gs] = o_t[:n_g, :sq]  # the store drops what lies outside the array
            pl[row, gs] = l_t[:n_g, :sq]
    return po, pl


def emulate_direct(q5, k, v, lens, causal, qk_scale_log2, BLOCK_N, out_dtype):
    """Torch mirror of ``decode_direct_kernel_fn``: one split, each block's ``(GB, QP, D)`` tile stored
    at tile ``(b, hk * (G // GB) + gi, 0, 0)`` of the ``(B, H, Sq, D)`` output (clipped)."""
    bsz, hkv, g, sq, d = q5.shape
    gb, qp, ngb = dk.decode_rows(g, sq)
    assert g % gb == 0
    out = torch.full((bsz, hkv * g, sq, d), float("nan"), dtype=out_dtype)
    for u in range(bsz * hkv * ngb):
        gi, bh = u % ngb, u // ngb
        b, hk = bh // hkv, bh % hkv
        o_t, _ = emulate_block(q5, k, v, lens, 1, 0, b, hk, gi, causal, qk_scale_log2, BLOCK_N)
        h0 = (hk * (g // gb) + gi) * gb
        rows = out[b, h0:h0 + gb, :qp]
        rows[...] = o_t[:rows.shape[0], :rows.shape[1]].to(out_dtype)
    return out


def emulate_direct_grouped(q5, k, v, lens, causal, qk_scale_log2, BLOCK_N, out_dtype):
    """Torch mirror of ``decode_direct_grouped_kernel_fn``: each block's ``(GB, QP, D)`` tile stored at
    ``(b, hk, gi)`` of the ``(B, Hkv, G, Sq, D)`` view, clipped to it (any ``G``); returns that view."""
    bsz, hkv, g, sq, d = q5.shape
    gb, qp, ngb = dk.decode_rows(g, sq)
    out = torch.full((bsz, hkv, g, sq, d), float("nan"), dtype=out_dtype)
    for u in range(bsz * hkv * ngb):
        gi, bh = u % ngb, u // ngb
        b, hk = bh // hkv, bh % hkv
        o_t, _ = emulate_block(q5, k, v, lens, 1, 0, b, hk, gi, causal, qk_scale_log2, BLOCK_N)
        rows = out[b, hk, gi * gb:(gi + 1) * gb, :qp]
        rows[...] = o_t[:rows.shape[0], :rows.shape[1]].to(out_dtype)
    return out


def emulate_combine(po, pl, o_shape, dtype):
    """Torch mirror of ``decode_combine_kernel_fn``."""
    bsz, h, sq, d = o_shape
    g = po.shape[1]
    hkv = h // g
    ns = po.shape[0] // (bsz * hkv)
    out = torch.empty(o_shape, dtype=dtype)
    for u in range(bsz * h):
        b, hh = u // h, u % h
        hk, gg = hh // g, hh % g
        base = (b * hkv + hk) * ns
        m = torch.full((sq, 1), NEG_INF)
        ls = torch.zeros(sq, 1)
        acc = torch.zeros(sq, d)
        for s in range(ns):
            lse = pl[base + s, gg].reshape(sq, 1)
            m_new = torch.maximum(m, lse)
            m_use = torch.where(m_new == NEG_INF, torch.zeros(()), m_new)
            a, w = torch.exp2(m - m_use), torch.exp2(lse - m_use)
            acc = acc * a + po[base + s, gg] * w
            ls = ls * a + w
            m = m_new
        seen = ls > 0
        out[b, hh] = (acc * torch.where(seen, 1.0 / torch.where(seen, ls, torch.ones(())), torch.zeros(()))).to(dtype)
    return out


# ---------------------------------------------------------------------------------------------
# host helpers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("g", [1, 2, 3, 4, 6, 8, 16, 32])
@pytest.mark.parametrize("sq", [1, 2, 3, 5, 8, 16])
def test_decode_rows(g, sq):
    gb, qp, ngb = dk.decode_rows(g, sq)
    assert qp >= sq and qp & (qp - 1) == 0 and gb & (gb - 1) == 0
    assert dk.MIN_ROWS <= gb * qp <= dk.MAX_ROWS
    assert ngb == -(-g // gb) and (ngb - 1) * gb < g <= ngb * gb
    if g * sq <= dk.MAX_ROWS:
        assert ngb == 1  # the whole group in one block: K/V read once per (batch, kv head)


def test_decode_rows_refuses_bad_sizes():
    for g, sq in ((0, 1), (4, 0), (4, 17)):
        with pytest.raises(ValueError):
            dk.decode_rows(g, sq)


def test_decode_splits():
    assert dk.decode_splits(8, 32768, 132) == 16  # B=1, Llama: 128 blocks, one wave of 132 SMs
    assert dk.decode_splits(64, 8192, 132) == 2  # B=8, Llama: 2 splits (128 blocks), not 5 (2.4 waves)
    assert dk.decode_splits(32, 8192, 132) == 4  # B=8, Qwen2.5 (4 kv heads)
    assert dk.decode_splits(512, 2048, 132) == 1  # B=64: enough row blocks already
    assert dk.decode_splits(256, 2048, 132) == 1  # B=32: two waves of row blocks, no split
    assert dk.decode_splits(8, 300, 132) == 2  # at most one split per granule of the capacity
    assert dk.decode_splits(1, 1, 132) == 1
    for units in (1, 3, 8, 64, 1024):
        for cap in (1, 255, 256, 257, 5000, 32768):
            ns = dk.decode_splits(units, cap, 132)
            assert 1 <= ns <= max(1, -(-cap // dk.GRANULE))
            assert ns == 1 or units * ns <= 132  # never a partial second wave


@pytest.mark.parametrize("kv_len", [1, 255, 256, 257, 1000, 4096, 32767])
@pytest.mark.parametrize("ns", [1, 2, 3, 7, 33])
def test_split_bounds_partition_the_keys(kv_len, ns):
    covered = []
    for sp in range(ns):
        a, b = dk.split_bounds(kv_len, ns, sp)
        assert a % dk.GRANULE == 0
        covered += list(range(a, max(a, b)))
    assert covered == list(range(kv_len))
    for bn in dk.DECODE_SPACE_PARAMS["BLOCK_N"]:
        assert dk.GRANULE % bn == 0  # split starts fall on key tile boundaries for every config


def test_space_size_and_baseline():
    cands = dop.DECODE_SPACE.candidates("sm_90")
    assert len(cands) <= 24
    assert cands[0].as_dict() == dk.DECODE_BASELINE
    assert len(dop.DECODE_COMBINE_SPACE.candidates("sm_90")) == 1


# ---------------------------------------------------------------------------------------------
# launch plans and prepare_decode
# ---------------------------------------------------------------------------------------------


def _kernel_params(fn):
    import inspect

    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize("h,hkv,sq", [(32, 8, 1), (16, 16, 1), (12, 2, 3), (64, 2, 16)])
def test_plans_grid_and_arguments(h, hkv, sq):
    bsz, cap, d = 3, 1000, 128
    q, k, v = make(bsz, h, hkv, sq, cap, d)
    lens = torch.tensor([1000, 17, 300], dtype=torch.int32)
    call = dop.prepare_decode(q, k, v, lens, True, 0.1, sms=132)
    q5, kk, vv, ll, po, pl, causal, c = call.partial_args
    g = h // hkv
    assert q5.shape == (bsz, hkv, g, sq, d) and q5.data_ptr() == q.data_ptr()
    assert po.shape == (bsz * hkv * call.splits, g, sq, d) and pl.shape == po.shape[:3]
    assert po.dtype == pl.dtype == torch.float32
    assert c == pytest.approx(0.1 * dk.LOG2E)
    cfg = dop.DECODE_SPACE.baseline("sm_90")
    kernel, grid, args = dop.decode_partial_plan(cfg, *call.partial_args)
    gb, qp, ngb = dk.decode_rows(g, sq)
    assert kernel is dk.decode_partial_kernel
    assert grid == (bsz * hkv * ngb, call.splits)
    assert len(args) == len(_kernel_params(dk.decode_partial_kernel_fn))
    assert args[:7] == call.partial_args[:6] + (c,) or args[:6] == call.partial_args[:6]
    assert args[7:] == (d, gb, qp, cfg.BLOCK_N, True, cfg.KV_LATENCY)
    kernel, grid, args = dop.decode_combine_plan(dop.DECODE_COMBINE_SPACE.baseline("sm_90"), *call.combine_args)
    assert kernel is dk.decode_combine_kernel and grid == (bsz * h,)
    assert len(args) == len(_kernel_params(dk.decode_combine_kernel_fn)) and args[3:] == (qp, d)


def test_plan_takes_the_int64_kernel_for_huge_caches():
    k = torch.empty((128, 8, 32768, 128), dtype=torch.bfloat16, device="meta")
    q5 = torch.empty((128, 8, 4, 1, 128), dtype=torch.bfloat16, device="meta")
    po = torch.empty((1024, 4, 1, 128), dtype=torch.float32, device="meta")
    pl = torch.empty((1024, 4, 1), dtype=torch.float32, device="meta")
    lens = torch.empty((128,), dtype=torch.int32, device="meta")
    kernel, _, _ = dop.decode_partial_plan(dop.DECODE_SPACE.baseline("sm_90"), q5, k, k, lens, po, pl, True, 1.0)
    assert kernel is dop.decode_partial_kernel_i64
    o = torch.empty((128, 32, 1, 128), dtype=torch.bfloat16, device="meta")
    kernel, _, _ = dop.decode_direct_plan(dop.DECODE_SPACE.baseline("sm_90"), q5, k, k, lens, o, True, 1.0)
    assert kernel is dop.decode_direct_kernel_i64


def _meta_call(bsz, h, hkv, sq, cap, sms, d=128, **kw):
    """``prepare_decode`` on meta tensors (no memory): the host's choices for a shape."""
    q = torch.empty((bsz, h, sq, d), dtype=torch.bfloat16, device="meta")
    k = torch.empty((bsz, hkv, cap, d), dtype=torch.bfloat16, device="meta")
    v = torch.empty((bsz, hkv, cap, d), dtype=torch.bfloat16, device="meta")
    lens = torch.empty((bsz,), dtype=torch.int32, device="meta")
    return dop.prepare_decode(q, k, v, lens, True, 0.125, sms=sms, **kw)


def test_without_direct_any_group_the_direct_kernel_needs_whole_group_slices(monkeypatch):
    monkeypatch.setattr(dop, "DIRECT_ANY_GROUP", False)
    seen = set()
    for g in (1, 2, 3, 4, 6, 7, 8, 12, 16, 24, 32):
        for sq in (1, 2, 3, 5, 8, 16):
            gb, _, ngb = dk.decode_rows(g, sq)
            for bsz, hkv, cap, sms in ((1, 8, 4096, 132), (64, 8, 4096, 132), (8, 2, 200, 132), (4, 4, 3000, 1)):
                ns = dk.decode_splits(bsz * hkv * ngb, cap, sms)
                call = _meta_call(bsz, hkv * g, hkv, sq, cap, sms)
                want = ns == 1 and g % gb == 0
                assert call.direct is want and dk.decode_direct(g, sq, ns) is want, (g, sq, bsz, hkv, cap, sms)
                assert call.splits == ns
                if want:
                    assert call.partial_args is None and call.combine_args is None
                    assert call.direct_args[4] is call.out
                else:
                    assert call.direct_args is None and call.partial_args[4].shape[0] == bsz * hkv * ns
                    assert call.combine_args[2] is call.out
                seen.add((ns == 1, want))
    assert seen == {(True, True), (True, False), (False, False)}  # both paths, and one split kept split
    # by hand: Llama B=64 fills 132 SMs with 512 blocks; Qwen's G=7 (GB=8) never stores whole slices
    assert _meta_call(64, 32, 8, 1, 4096, 132).direct
    assert not _meta_call(1, 32, 8, 1, 4096, 132).direct  # B=1: 33 splits
    qwen = _meta_call(64, 28, 4, 1, 4096, 64)
    assert qwen.splits == 1 and not qwen.direct
    assert not _meta_call(2, 24, 2, 16, 200, 132).direct  # G=12 x 16 tokens: GB=8, 12 % 8 != 0
    assert _meta_call(2, 48, 2, 16, 200, 132).direct  # G=24 x 16 tokens: three slices of 8 heads
    assert not _meta_call(64, 32, 8, 1, 4096, 132, allow_direct=False).direct
    assert _meta_call(64, 32, 8, 1, 4096, 132, allow_direct=False).splits == 1


def test_with_direct_any_group_every_one_split_call_is_direct(monkeypatch):
    """``DIRECT_ANY_GROUP``: one split is enough; a group that its slices do not tile (Qwen's G=7, G=12 x 16
    tokens) passes the grouped kernel the ``(B, Hkv, G, Sq, D)`` view of the output, the others the output."""
    monkeypatch.setattr(dop, "DIRECT_ANY_GROUP", True)
    for g in (1, 3, 4, 6, 7, 12, 24):
        for sq in (1, 3, 16):
            gb, _, ngb = dk.decode_rows(g, sq)
            for bsz, hkv, cap, sms in ((1, 8, 4096, 132), (64, 4, 4096, 132), (4, 4, 3000, 1)):
                ns = dk.decode_splits(bsz * hkv * ngb, cap, sms)
                call = _meta_call(bsz, hkv * g, hkv, sq, cap, sms)
                assert call.direct is (ns == 1) and dk.decode_direct(g, sq, ns, True) is (ns == 1)
                if not call.direct:
                    continue
                o_arg = call.direct_args[4]
                if g % gb:
                    assert o_arg.shape == (bsz, hkv, g, sq, 128) and o_arg._base is call.out
                else:
                    assert o_arg is call.out
    qwen = _meta_call(64, 28, 4, 1, 4096, 132)
    assert qwen.splits == 1 and qwen.direct and qwen.direct_args[4].dim() == 5
    assert not _meta_call(64, 28, 4, 1, 4096, 132, allow_direct=False).direct


@pytest.mark.parametrize("h,hkv,sq", [(28, 4, 1), (12, 2, 3), (24, 2, 16)])
def test_grouped_direct_plan_grid_and_arguments(monkeypatch, h, hkv, sq):
    from tiletune.op.hotpath import plan_recipe

    monkeypatch.setattr(dop, "DIRECT_ANY_GROUP", True)
    bsz, cap, d = 3, 200, 64
    q, k, v = make(bsz, h, hkv, sq, cap, d)
    lens = torch.tensor([200, 17, 100], dtype=torch.int32)
    call = dop.prepare_decode(q, k, v, lens, True, 0.1, sms=132)
    g = h // hkv
    gb, qp, ngb = dk.decode_rows(g, sq)
    assert g % gb and call.direct and call.splits == 1
    o5 = call.direct_args[4]
    assert o5.shape == (bsz, hkv, g, sq, d) and o5.data_ptr() == call.out.data_ptr() and o5.is_contiguous()
    cfg = dop.DECODE_SPACE.baseline("sm_90")
    kernel, grid, args = dop.decode_direct_plan(cfg, *call.direct_args)
    assert kernel is dk.decode_direct_grouped_kernel and grid == (bsz * hkv * ngb,)
    assert len(args) == len(_kernel_params(dk.decode_direct_grouped_kernel_fn))
    assert args[4] is o5 and args[6:] == (d, gb, qp, cfg.BLOCK_N, True, cfg.KV_LATENCY)
    assert plan_recipe(tuple(args), call.direct_args) is not None
    # the reference is shaped as the view and is the output's attention
    ref = dop.decode_direct_reference(*call.direct_args)
    assert ref.shape == o5.shape
    torch.testing.assert_close(ref.reshape(q.shape).double(),
                               sdpa_bottom_right(q, k, v, [200, 17, 100], True, 0.1), rtol=2e-2, atol=2e-2)
    big_k = torch.empty((128, 8, 32768, 128), dtype=torch.bfloat16, device="meta")  # 2^32 elements: int64
    big_q5 = torch.empty((128, 8, g, sq, 128), dtype=torch.bfloat16, device="meta")
    big_o5 = torch.empty((128, 8, g, sq, 128), dtype=torch.bfloat16, device="meta")
    big_lens = torch.empty((128,), dtype=torch.int32, device="meta")
    kernel, _, _ = dop.decode_direct_plan(cfg, big_q5, big_k, big_k, big_lens, big_o5, True, 1.0)
    assert kernel is dop.decode_direct_grouped_kernel_i64


@pytest.mark.parametrize("h,hkv,sq", [(32, 8, 1), (8, 8, 1), (32, 2, 16), (16, 1, 4)])
def test_direct_plan_grid_and_arguments(h, hkv, sq):
    from tiletune.op.hotpath import plan_recipe

    bsz, cap, d = 3, 200, 64  # a capacity within one granule: one split
    q, k, v = make(bsz, h, hkv, sq, cap, d)
    lens = torch.tensor([200, 17, 100], dtype=torch.int32)
    call = dop.prepare_decode(q, k, v, lens, True, 0.1, sms=132)
    g = h // hkv
    gb, qp, ngb = dk.decode_rows(g, sq)
    assert call.direct and call.splits == 1 and call.partial_args is None and call.combine_args is None
    q5, kk, vv, ll, o, causal, c = call.direct_args
    assert q5.shape == (bsz, hkv, g, sq, d) and q5.data_ptr() == q.data_ptr()
    assert kk is k and vv is v and ll is lens and causal is True and c == pytest.approx(0.1 * dk.LOG2E)
    assert o is call.out and o.shape == q.shape and o.dtype == q.dtype and o.is_contiguous()
    cfg = dop.DECODE_SPACE.baseline("sm_90")
    kernel, grid, args = dop.decode_direct_plan(cfg, *call.direct_args)
    assert kernel is dk.decode_direct_kernel and grid == (bsz * hkv * ngb,)
    assert len(args) == len(_kernel_params(dk.decode_direct_kernel_fn))
    assert all(a is b for a, b in zip(args[:5], call.direct_args[:5])) and args[5] == c
    assert args[6:] == (d, gb, qp, cfg.BLOCK_N, True, cfg.KV_LATENCY)
    # the tuned op's hot path replays it: tensors are the call's own arguments, the float passes through
    assert plan_recipe(tuple(args), call.direct_args) is not None
    for op in (dop.DECODE_DIRECT, dop.DECODE_PARTIAL):
        assert op.op(None).space is dop.DECODE_SPACE
    assert dop.DECODE_DIRECT.writes == ("o",)


def test_one_split_with_partial_group_slices_keeps_the_split_launches(monkeypatch):
    """G=7 (Qwen 28/4) with ``DIRECT_ANY_GROUP`` off: one split, yet the partial kernel (grid
    ``(B * Hkv, 1)``) and the combine."""
    monkeypatch.setattr(dop, "DIRECT_ANY_GROUP", False)
    bsz, h, hkv, cap, d = 2, 28, 4, 200, 64
    q, k, v = make(bsz, h, hkv, 1, cap, d)
    lens = torch.tensor([200, 3], dtype=torch.int32)
    call = dop.prepare_decode(q, k, v, lens, True, 0.1, sms=132)
    assert call.splits == 1 and not call.direct and call.direct_args is None
    cfg = dop.DECODE_SPACE.baseline("sm_90")
    kernel, grid, args = dop.decode_partial_plan(cfg, *call.partial_args)
    assert kernel is dk.decode_partial_kernel and grid == (bsz * hkv, 1)
    assert args[4].shape == (bsz * hkv, 7, 1, d)
    kernel, grid, _ = dop.decode_combine_plan(dop.DECODE_COMBINE_SPACE.baseline("sm_90"), *call.combine_args)
    assert kernel is dk.decode_combine_kernel and grid == (bsz * h,)
    q5 = call.partial_args[0]
    with pytest.raises(ValueError, match="split path"):
        dop.decode_direct_plan(cfg, q5, k, v, lens, call.out, True, 0.1)


# ---------------------------------------------------------------------------------------------
# references, emulation
# ---------------------------------------------------------------------------------------------

CASES = [
    # bsz, h, hkv, sq, cap, d, lens, causal
    (2, 4, 4, 1, 700, 64, [700, 300], False),  # MHA, lengths not multiples of a tile
    (2, 8, 2, 1, 1300, 128, [1300, 1], True),  # GQA 4, one sequence of a single key
    (1, 6, 2, 3, 600, 64, [513], True),  # G=3 (padded), 3 causal tokens
    (2, 4, 1, 16, 900, 64, [900, 16], True),  # G=4 x 16 tokens, a sequence exactly as long as the queries
    (1, 16, 1, 16, 520, 64, [520], False),  # G=16 x 16 tokens: two group slices
]


@pytest.mark.parametrize("case", CASES)
def test_references_combine_to_attention(case):
    bsz, h, hkv, sq, cap, d, lens, causal = case
    q, k, v = make(bsz, h, hkv, sq, cap, d)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    scale = 1.0 / math.sqrt(d)
    want = sdpa_bottom_right(q, k, v, lens, causal, scale)
    for sms in (1, 132):  # one split, many splits
        for allow_direct in (True, False):
            call = dop.prepare_decode(q, k, v, lens_t, causal, scale, sms=sms, allow_direct=allow_direct)
            if call.direct:
                out = dop.decode_direct_reference(*call.direct_args).reshape(call.out.shape)  # grouped: 5-D
            else:
                po, pl = dop.decode_partial_reference(*call.partial_args)
                assert torch.isfinite(po).all()
                out = dop.decode_combine_reference(po, pl, call.out)
            assert out.dtype == q.dtype
            torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("block_n", dk.DECODE_SPACE_PARAMS["BLOCK_N"])
def test_emulated_kernels_match_the_references(case, block_n):
    """The tiled algorithm passes the tuner's correctness gate for every key tile, and combines to SDPA."""
    bsz, h, hkv, sq, cap, d, lens, causal = case
    q, k, v = make(bsz, h, hkv, sq, cap, d, seed=1)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    scale = 1.0 / math.sqrt(d)
    call = dop.prepare_decode(q, k, v, lens_t, causal, scale, sms=132)
    assert call.splits > 1
    q5, kk, vv, ll, po, pl, cz, c = call.partial_args
    got_o, got_l = emulate_partial(q5, kk, vv, ll, call.splits, cz, c, block_n)
    want_o, want_l = dop.decode_partial_reference(*call.partial_args)
    tol = dop._partial_tolerance(*call.partial_args)
    assert compare_tensors(got_o, want_o, output_tolerance(tol, 0)) is None
    assert compare_tensors(got_l, want_l, output_tolerance(tol, 1)) is None
    if min(lens) <= dk.GRANULE:  # a short sequence among long ones: its later splits are empty
        assert torch.isneginf(want_l).any() and torch.isneginf(got_l).any()
    out = emulate_combine(got_o, got_l, call.out.shape, q.dtype)
    assert compare_tensors(out, dop.decode_combine_reference(got_o, got_l, call.out), dop._combine_tolerance()) is None
    want = sdpa_bottom_right(q, k, v, lens, causal, scale)
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


def test_reference_rejects_a_wrong_partial():
    """The gate is not vacuous: a partial computed without the causal mask fails it."""
    q, k, v = make(1, 8, 2, 4, 600, 64)
    lens_t = torch.tensor([600], dtype=torch.int32)
    call = dop.prepare_decode(q, k, v, lens_t, True, 0.125, sms=132)
    wrong = list(call.partial_args)
    wrong[6] = False
    bad_o, bad_l = dop.decode_partial_reference(*wrong)
    want_o, want_l = dop.decode_partial_reference(*call.partial_args)
    tol = dop._partial_tolerance(*call.partial_args)
    assert compare_tensors(bad_o, want_o, output_tolerance(tol, 0)) is not None
    assert compare_tensors(bad_l, want_l, output_tolerance(tol, 1)) is not None


@pytest.mark.parametrize("case", CASES)
def test_direct_reference_is_the_two_step_result(case):
    """The direct op's reference (one fused SDPA per run of sequences) is within its own tolerance of the
    one-split reference, which is bit for bit the combine of one split's partials, and of the combine of
    many splits."""
    bsz, h, hkv, sq, cap, d, lens, causal = case
    q, k, v = make(bsz, h, hkv, sq, cap, d, seed=2)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    scale = 1.0 / math.sqrt(d)
    one = dop.prepare_decode(q, k, v, lens_t, causal, scale, sms=1, allow_direct=False)
    many = dop.prepare_decode(q, k, v, lens_t, causal, scale, sms=132)
    assert one.splits == 1 and many.splits > 1
    q5, kk, vv, ll, _, _, cz, c = one.partial_args
    direct_args = (q5, kk, vv, ll, one.out, cz, c)
    got = dop.decode_direct_reference(*direct_args)
    assert got.dtype == q.dtype and got.shape == q.shape
    split = dop.split_direct_reference(*direct_args)
    assert torch.equal(split, dop.decode_combine_reference(*dop.decode_partial_reference(*one.partial_args), one.out))
    assert compare_tensors(got, split, dop._direct_tolerance(*direct_args)) is None
    assert (got.float() - split.float()).abs().max() <= 2 * (split.float().abs().max() * 2 ** -8)  # a rounding
    two_step = dop.decode_combine_reference(*dop.decode_partial_reference(*many.partial_args), many.out)
    assert compare_tensors(two_step, got, dop._direct_tolerance(*direct_args)) is None
    torch.testing.assert_close(got.double(), sdpa_bottom_right(q, k, v, lens, causal, scale), rtol=2e-2, atol=2e-2)


DIRECT_CASES = [c for c in CASES if c[1] // c[2] % dk.decode_rows(c[1] // c[2], c[3])[0] == 0] + [
    (1, 8, 2, 4, 200, 64, [2], True),  # 2 keys for 4 causal tokens: rows 0 and 1 see nothing (0)
    (1, 48, 2, 16, 300, 64, [277], True),  # G=24 x 16 tokens: three slices of 8 heads per kv head
]


@pytest.mark.parametrize("case", DIRECT_CASES)
@pytest.mark.parametrize("block_n", dk.DECODE_SPACE_PARAMS["BLOCK_N"])
def test_emulated_direct_kernel_passes_its_gate(case, block_n):
    """The direct kernel's tiles (P rounded to the input dtype, one rounding to the output) pass the
    direct op's gate for every key tile and land on every output element."""
    bsz, h, hkv, sq, cap, d, lens, causal = case
    q, k, v = make(bsz, h, hkv, sq, cap, d, seed=3)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    scale = 1.0 / math.sqrt(d)
    call = dop.prepare_decode(q, k, v, lens_t, causal, scale, sms=1)
    assert call.direct
    q5, kk, vv, ll, o, cz, c = call.direct_args
    got = emulate_direct(q5, kk, vv, ll, cz, c, block_n, q.dtype)
    assert not torch.isnan(got).any()  # every element stored
    want = dop.decode_direct_reference(*call.direct_args)
    assert compare_tensors(got, want, dop._direct_tolerance(*call.direct_args)) is None
    if causal and min(lens) < sq:
        n = min(lens)
        assert got[0, :, :sq - n].abs().sum() == 0 and want[0, :, :sq - n].abs().sum() == 0
    else:
        torch.testing.assert_close(got.double(), sdpa_bottom_right(q, k, v, lens, causal, scale),
                                   rtol=2e-2, atol=2e-2)


GROUPED_CASES = [c for c in CASES + DIRECT_CASES if c[1] // c[2] % dk.decode_rows(c[1] // c[2], c[3])[0]] + [
    (2, 28, 4, 1, 700, 128, [700, 5], True),  # Qwen2.5-7B's 28/4 heads (G=7), one token
    (1, 24, 2, 16, 300, 64, [277], False),  # G=12 x 16 tokens: a slice of 8 heads and one of 4
    (3, 10, 2, 5, 260, 64, [260, 5, 3], True),  # G=5, 5 causal tokens, a sequence shorter than the queries
]


@pytest.mark.parametrize("case", GROUPED_CASES)
@pytest.mark.parametrize("block_n", dk.DECODE_SPACE_PARAMS["BLOCK_N"])
def test_emulated_grouped_direct_kernel_passes_its_gate(monkeypatch, case, block_n):
    """The grouped direct kernel's tiles, stored at ``(b, hk, gi)`` of the output's grouped view, land on
    every output element once (the padded heads and tokens fall outside it) and pass the gate."""
    monkeypatch.setattr(dop, "DIRECT_ANY_GROUP", True)
    bsz, h, hkv, sq, cap, d, lens, causal = case
    q, k, v = make(bsz, h, hkv, sq, cap, d, seed=4)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    scale = 1.0 / math.sqrt(d)
    call = dop.prepare_decode(q, k, v, lens_t, causal, scale, sms=1)
    assert call.direct and call.direct_args[4].dim() == 5
    q5, kk, vv, ll, o5, cz, c = call.direct_args
    got = emulate_direct_grouped(q5, kk, vv, ll, cz, c, block_n, q.dtype)
    assert not torch.isnan(got).any()
    want = dop.decode_direct_reference(*call.direct_args)
    assert compare_tensors(got, want, dop._direct_tolerance(*call.direct_args)) is None
    full = sdpa_bottom_right(q, k, v, lens, causal, scale)
    seen = torch.ones(q.shape, dtype=torch.bool)
    if causal:  # a query with no visible key (a sequence shorter than the queries) is 0 in both
        for b, n in enumerate(lens):
            seen[b, :, :max(0, sq - n)] = False
        assert got.reshape(q.shape)[~seen].abs().sum() == 0
    torch.testing.assert_close(got.reshape(q.shape).double()[seen], full[seen], rtol=2e-2, atol=2e-2)


def test_direct_gate_rejects_a_wrong_output():
    """Not vacuous: an output computed without the causal mask, or one head's rows swapped, fails it."""
    q, k, v = make(2, 8, 2, 4, 600, 64)
    lens_t = torch.tensor([600, 90], dtype=torch.int32)
    call = dop.prepare_decode(q, k, v, lens_t, True, 0.125, sms=1)
    assert call.direct
    want = dop.decode_direct_reference(*call.direct_args)
    tol = dop._direct_tolerance(*call.direct_args)
    assert set(tol) == {"bfloat16"}
    wrong = list(call.direct_args)
    wrong[5] = False
    assert compare_tensors(dop.decode_direct_reference(*wrong), want, tol) is not None
    swapped = want.clone()
    swapped[:, [0, 1]] = want[:, [1, 0]]
    assert compare_tensors(swapped, want, tol) is not None


# ---------------------------------------------------------------------------------------------
# KV-cache append and argument checks
# ---------------------------------------------------------------------------------------------


def test_kv_cache_append_int_and_tensor_start():
    ck = torch.zeros(3, 2, 10, 4)
    cv = torch.zeros(3, 2, 10, 4)
    k = torch.randn(3, 2, 2, 4)
    v = torch.randn(3, 2, 2, 4)
    out = dop.kv_cache_append(ck, cv, k, v, 5)
    assert out[0] is ck and out[1] is cv
    assert torch.equal(ck[:, :, 5:7], k) and torch.equal(cv[:, :, 5:7], v)
    assert ck[:, :, :5].abs().sum() == 0 and ck[:, :, 7:].abs().sum() == 0
    ck.zero_()
    cv.zero_()
    start = torch.tensor([0, 3, 8])
    dop.kv_cache_append(ck, cv, k.transpose(1, 2).contiguous().transpose(1, 2), v, start)  # strided k
    for b, s0 in enumerate([0, 3, 8]):
        assert torch.equal(ck[b, :, s0:s0 + 2], k[b]) and torch.equal(cv[b, :, s0:s0 + 2], v[b])
        rest = torch.ones(10, dtype=torch.bool)
        rest[s0:s0 + 2] = False
        assert ck[b, :, rest].abs().sum() == 0


def test_kv_cache_append_errors():
    ck = torch.zeros(2, 2, 8, 4)
    k = torch.zeros(2, 2, 3, 4)
    with pytest.raises(ValueError, match="capacity"):
        dop.kv_cache_append(ck, ck.clone(), k, k.clone(), 6)
    with pytest.raises(ValueError, match="do not fit"):
        dop.kv_cache_append(ck, ck.clone(), torch.zeros(2, 3, 3, 4), torch.zeros(2, 3, 3, 4), 0)
    with pytest.raises(TypeError):
        dop.kv_cache_append(ck, ck.clone(), k, k.clone(), 1.5)
    with pytest.raises(TypeError, match="dtype"):
        dop.kv_cache_append(ck, ck.clone(), k.half(), k.half(), 0)
    with pytest.raises(ValueError, match="shape"):
        dop.kv_cache_append(ck, ck.clone(), k, k.clone(), torch.tensor([1]))


def test_decode_attention_argument_errors():
    q, k, v = make(2, 8, 2, 1, 64, 64)
    with pytest.raises(ValueError, match="query tokens"):
        dop.decode_attention(torch.zeros(2, 8, 17, 64, dtype=torch.bfloat16), k, v)
    with pytest.raises(ValueError, match="head dim"):
        dop.decode_attention(q[..., :32], k[..., :32], v[..., :32])
    with pytest.raises(ValueError, match="multiple"):
        dop.decode_attention(torch.zeros(2, 7, 1, 64, dtype=torch.bfloat16), k, v)
    with pytest.raises(TypeError, match="bfloat16"):
        dop.decode_attention(q.float(), k.float(), v.float())
    with pytest.raises(ValueError, match="scale"):
        dop.decode_attention(q, k, v, scale=0.0)
    with pytest.raises(ValueError, match="CUDA"):
        dop.decode_attention(q, k, v)
    with pytest.raises(ValueError, match="capacity"):
        dop._lengths_tensor("decode_attention", 65, 2, 64, 1, True, q.device)
    with pytest.raises(ValueError, match="shorter"):
        dop._lengths_tensor("decode_attention", 3, 2, 64, 4, True, q.device)
    with pytest.raises(ValueError, match="shape"):
        dop._lengths_tensor("decode_attention", torch.tensor([3]), 2, 64, 1, True, q.device)
    lens = dop._lengths_tensor("decode_attention", torch.tensor([3, 4]), 2, 64, 1, True, q.device)
    assert lens.dtype == torch.int32 and lens.tolist() == [3, 4]


def test_decode_attention_names_the_caches_in_the_checks_it_shares_with_attention():
    # the q/k/v checks of attention() (tiletune.kernels._attention_checks), with the caches' names;
    # the decode op reaches them on CPU tensors (it checks the device last)
    q, k, v = make(2, 8, 2, 1, 64, 64)
    with pytest.raises(TypeError, match=r"^decode_attention\(\): cache_v must be a torch tensor, got list$"):
        dop.decode_attention(q, k, v.tolist())
    with pytest.raises(ValueError, match=r"^decode_attention\(\): cache_k must be 4-D \(B, H, S, D\)"):
        dop.decode_attention(q, k[0], v)
    with pytest.raises(TypeError, match=r"^decode_attention\(\): q, cache_k, cache_v must share a dtype"):
        dop.decode_attention(q, k.half(), v)
    with pytest.raises(ValueError, match=r"^decode_attention\(\): cache_k and cache_v shapes differ"):
        dop.decode_attention(q, k, v[:, :, :32])
    with pytest.raises(ValueError, match=r"^decode_attention\(\): cache_k/cache_v of shape \(3, 2, 64, 64\) do not "
                                         r"match q of shape \(2, 8, 1, 64\) \(batch and head dim must agree\)$"):
        dop.decode_attention(q, *make(3, 8, 2, 1, 64, 64)[1:])
    with pytest.raises(ValueError, match=r"^decode_attention\(\): the caches hold no position"):
        dop.decode_attention(q, k[:, :, :0], v[:, :, :0])
    with pytest.raises(ValueError, match=r"^decode_attention\(\) expects q, cache_k, cache_v on one CUDA device"):
        dop.decode_attention(q, k, v)


# ---------------------------------------------------------------------------------------------
# sm_90 compiles (skipped without the TileIR assembler)
# ---------------------------------------------------------------------------------------------

_TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")


def _ccd():
    if _TOOLS not in sys.path:
        sys.path.insert(0, _TOOLS)
    import compile_check_decode as ccd

    return ccd


def _ok_or_skip(res):
    ok, _, size, err = res
    if not ok and "tileiras" in err.lower() and "not found" in err.lower():
        pytest.skip(f"no TileIR assembler: {err}")
    assert ok, err
    assert size > 1000


@pytest.mark.parametrize("cfg", [c.as_dict() for c in dop.DECODE_SPACE.candidates("sm_90")],
                         ids=lambda c: "-".join(str(v) for v in c.values()))
def test_every_decode_config_compiles_for_sm90(cfg):
    """Every config of the space on the Llama decode variant (bf16, GQA 32/8, D=128, one token)."""
    ccd = _ccd()
    _ok_or_skip(ccd.compile_partial(ccd.variants()[0], cfg))


@pytest.mark.parametrize("name", [v.name for v in _ccd().variants()])
def test_every_row_shape_compiles_for_sm90(name):
    """The baseline and the extreme configs of the partial kernel, and the combine kernel, on every variant."""
    ccd = _ccd()
    v = {x.name: x for x in ccd.variants()}[name]
    _ok_or_skip(ccd.compile_combine(v))
    cands = [c.as_dict() for c in dop.DECODE_SPACE.candidates("sm_90")]
    for cfg in (cands[0], min(cands, key=lambda c: c["BLOCK_N"]), max(cands, key=lambda c: (c["BLOCK_N"],
                                                                                           c["num_worker_warps"]))):
        _ok_or_skip(ccd.compile_partial(v, cfg))


#: (G, Sq, dtype, D) of the direct kernel's compiles: every G and Sq with bf16/D=128 and fp16/D=64, and
#: the other two pairings at G=4, Sq=4. G=7 never takes this kernel (7 % GB=8; the grouped kernel serves
#: it): it checks the kernel's padded-head tiles compile all the same.
DIRECT_COMPILES = [(g, sq, dt, d) for g in (1, 4, 8, 7) for sq in (1, 4, 16)
                   for dt, d in (("bfloat16", 128), ("float16", 64))] + [(4, 4, "bfloat16", 64), (4, 4, "float16", 128)]


@pytest.mark.parametrize("g,sq,dtype,d", DIRECT_COMPILES, ids=lambda x: str(x))
def test_direct_kernel_compiles_for_sm90(g, sq, dtype, d):
    import cuda.tile as ct

    ccd = _ccd()
    v = ccd.DecodeVariant(f"direct_g{g}_q{sq}", getattr(ct, dtype), 2, 2, g, sq, 777, d, sq > 1)
    _ok_or_skip(ccd.compile_direct(v, dict(dk.DECODE_BASELINE)))


@pytest.mark.parametrize("g,sq,dtype,d", [(7, 1, "bfloat16", 128), (6, 3, "float16", 64), (12, 16, "bfloat16", 64),
                                          (4, 1, "bfloat16", 128)], ids=lambda x: str(x))
def test_grouped_direct_kernel_compiles_for_sm90(g, sq, dtype, d):
    """The grouped direct kernel (5-D output view) for groups its slices do not tile, and for one they do."""
    import cuda.tile as ct

    ccd = _ccd()
    v = ccd.DecodeVariant(f"grouped_g{g}_q{sq}", getattr(ct, dtype), 2, 2, g, sq, 777, d, sq > 1)
    _ok_or_skip(ccd.compile_direct_grouped(v, dict(dk.DECODE_BASELINE)))


@pytest.mark.parametrize("name", ["llama", "gqa8_q16"])
def test_direct_kernel_extreme_configs_compile_for_sm90(name):
    """The smallest and largest key tiles (with 8 warps) and a latency hint, on the Llama decode shape
    and the widest block (8 heads x 16 tokens)."""
    ccd = _ccd()
    v = {x.name: x for x in ccd.variants()}[name]
    cands = [c.as_dict() for c in dop.DECODE_SPACE.candidates("sm_90")]
    picks = (min(cands, key=lambda c: c["BLOCK_N"]), max(cands, key=lambda c: (c["BLOCK_N"], c["num_worker_warps"])),
             next(c for c in cands if c["KV_LATENCY"] > 0))
    for cfg in picks:
        _ok_or_skip(ccd.compile_direct(v, cfg))


# ---------------------------------------------------------------------------------------------
# benchmarks/decoder_layer.py: rows and the torch layer (CPU)
# ---------------------------------------------------------------------------------------------


def _decoder_layer():
    """``benchmarks/decoder_layer.py`` as a module."""
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import decoder_layer

    return decoder_layer


def test_decoder_layer_rows_and_torch_layer_on_cpu(monkeypatch):
    dl = _decoder_layer()

    quick = dl.rows_for(True)
    assert len(quick) == 4 and {r[0] for r in quick} == {"prefill", "decode"}
    full = dl.rows_for(False)
    assert {r[1] for r in full if r[0] == "decode"} == {1, 8, 32, 64, 128}
    assert max(r[2] for r in full if r[0] == "decode") == 32768 and min(r[2] for r in full) == 512
    for name, val in (("HIDDEN", 256), ("HEADS", 4), ("KV_HEADS", 2), ("HEAD_DIM", 64), ("FFN", 512)):
        monkeypatch.setattr(dl, name, val)  # a small layer of the same structure (CPU time)
    w = dl.make_weights("cpu")
    for phase, s in (("prefill", 3), ("decode", 5)):
        st = dl.State(phase, 2, s, device="cpu")
        caches = st.caches() if phase == "decode" else (None, None)
        mod = dl.torch_module(w, st, *caches)
        with torch.no_grad():
            out = mod(st.x, st.cos, st.sin)
        assert out.shape == st.x.shape and torch.isfinite(out.float()).all()
        if phase == "decode":
            assert not torch.equal(mod.ck[:, :, s - 1], st.ck[:, :, s - 1])  # the new token's k was written
            assert torch.equal(mod.ck[:, :, :s - 1], st.ck[:, :, :s - 1])


def test_decoder_layer_static_inputs_for_reduce_overhead():
    """The static-input route gets copies of the layer's inputs (the other routes keep theirs unmarked),
    each marked as a static address for torch.compile's CUDA graphs."""
    dl = _decoder_layer()
    st = dl.State("decode", 2, 5, device="cpu")
    got = dl.static_inputs(st)
    for new, old in zip(got, (st.x, st.cos, st.sin)):
        assert new is not old and torch.equal(new, old) and new.data_ptr() != old.data_ptr()
        assert getattr(new, "_dynamo_static_input_type", None) is not None
        assert getattr(old, "_dynamo_static_input_type", None) is None


def test_attention_routes_short_queries_to_decode_and_the_switch_turns_it_off(monkeypatch):
    import tiletune.kernels.attention_op as attn_mod

    assert attn_mod.ROUTE_SHORT_QUERIES_TO_DECODE is True  # on since the decode GPU tests passed
    assert attn_mod._routes_to_decode(1, 4096) and attn_mod._routes_to_decode(16, 17)
    assert not attn_mod._routes_to_decode(17, 4096) and not attn_mod._routes_to_decode(8, 8)
    monkeypatch.setattr(attn_mod, "ROUTE_SHORT_QUERIES_TO_DECODE", False)
    assert not attn_mod._routes_to_decode(1, 4096)


def test_decoder_layer_times_its_variants_in_interleaved_rounds(monkeypatch):
    """Each variant is timed once per round, the order rotating, and reported as its median round."""
    dl = _decoder_layer()
    order, values = [], {"a": iter([5.0, 1.0, 3.0, 9.0, 2.0]), "b": iter([7.0] * 5), "c": iter([1.0, 2.0, 3.0, 4.0, 50.0])}
    fns = {name: name for name in values}

    def fake_gpu_us(fn, iters, warmup=3):
        order.append(fn)
        assert iters == 20  # 100 calls over 5 rounds
        return next(values[fn])

    monkeypatch.setattr(dl, "gpu_us", fake_gpu_us)
    got = dl.interleaved_us(fns, 100, rounds=5)
    assert got == {"a": 3.0, "b": 7.0, "c": 3.0}
    rounds = [order[i:i + 3] for i in range(0, 15, 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert [r[0] for r in rounds] == ["a", "b", "c", "a", "b"]  # nobody is always timed first or last


def test_decoder_layer_kernel_table_is_per_forward_and_keeps_the_total():
    dl = _decoder_layer()

    events = [("gemm", 10.0), ("norm", 2.0), ("gemm", 12.0), ("norm", 2.0)] * 2 + [("tiny", 0.5)] * 2
    rows = dl.kernel_table(events, forwards=2)
    assert [r["kernel"] for r in rows] == ["gemm", "norm", "tiny"]
    assert rows[0] == {"kernel": "gemm", "us": 22.0, "calls": 2.0}
    assert rows[2] == {"kernel": "tiny", "us": 0.5, "calls": 1.0}
    cut = dl.kernel_table(events, forwards=2, top=1)
    assert cut[0]["kernel"] == "gemm" and cut[1] == {"kernel": "(other kernels)", "us": 4.5, "calls": 3.0}
    assert sum(r["us"] for r in cut) == sum(us for _, us in events) / 2


def test_decoder_layer_timeline_splits_kernel_time_from_launch_gaps():
    """Two forwards of three kernels: idle time inside a forward, between forwards, and per position."""
    dl = _decoder_layer()
    fwd = [("gemm", 0.0, 10.0), ("norm", 12.0, 14.0), ("add", 15.0, 16.0)]
    events = fwd + [(n, a + 20.0, b + 20.0) for n, a, b in fwd]
    got = dl.timeline(list(reversed(events)), forwards=2)  # the profiler's order does not matter
    assert got["kernels_per_forward"] == 3
    assert got["span_us"] == 16.0 and got["kernel_us"] == 13.0 and got["gap_us"] == 3.0
    assert got["between_forwards_us"] == 4.0
    assert [(k["kernel"], k["us"], k["gap_before_us"]) for k in got["kernels"]] == \
        [("gemm", 10.0, 0.0), ("norm", 2.0, 2.0), ("add", 1.0, 1.0)]
    # overlapping kernels count once; an uneven split keeps the totals and drops the per-position table
    odd = dl.timeline([("a", 0.0, 10.0), ("b", 5.0, 12.0), ("c", 20.0, 21.0)], forwards=2)
    assert "kernels" not in odd and odd["kernels_per_forward"] == 1.5
    assert odd["span_us"] == 10.5 and odd["kernel_us"] == 6.5


def test_decoder_layer_timeline_parts_and_plot(tmp_path):
    """Kernels are filed by part of the layer (ours and Inductor's/cuBLAS's/cuDNN's names), idle time
    counted apart, and the stacked-bar PNG drawn from the rows that have timelines."""
    dl = _decoder_layer()
    assert dl.kernel_part("gemm_swap_kernel_Kt2_A3bf16") == "GEMM"
    assert dl.kernel_part("nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_NNT") == "GEMM"
    assert dl.kernel_part("void cublasLt::splitKreduce_kernel<32, 16>") == "GEMM"
    assert dl.kernel_part("decode_partial_kernel_fn_Kt2") == "attention"
    assert dl.kernel_part("void cudnn::fusion::lean_reduction_kernel<false>") == "attention"
    assert dl.kernel_part("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "norm"
    assert dl.kernel_part("kv_append_kernel_fn_Kt2") == "RoPE + KV cache"
    assert dl.kernel_part("triton_poi_fused__unsafe_view_mul_silu_slice_5") == "SwiGLU"
    assert dl.kernel_part("void at::native::vectorized_elementwise_kernel<8>") == "other"
    t = {"kernels": [{"kernel": "gemm_kernel", "us": 10.0, "gap_before_us": 0.0},
                     {"kernel": "rms_norm_kernel_fn", "us": 2.0, "gap_before_us": 0.5},
                     {"kernel": "gemm_kernel", "us": 5.0, "gap_before_us": 0.5}],
         "gap_us": 1.0, "between_forwards_us": 3.0}
    assert dl.timeline_parts(t) == {"GEMM": 15.0, "norm": 2.0, "idle": 4.0}
    rows = [{"phase": "decode", "B": 8, "S": 2048, "tiletune_us": 20.0, "compile_ro_us": 21.0,
             "replay_timeline": {"tiletune": t, "compile_ro": t}},
            {"phase": "prefill", "B": 1, "S": 512, "tiletune_us": 30.0}]  # no timeline: left out
    pytest.importorskip("matplotlib")
    assert dl.plot_timelines(rows, tmp_path / "t.png") and (tmp_path / "t.png").stat().st_size > 0
    assert not dl.plot_timelines(rows[1:], tmp_path / "none.png") and not (tmp_path / "none.png").exists()


def test_decoder_layer_timeline_plot_of_one_phase(tmp_path):
    """A run of prefill rows only draws its timelines (the legend comes from the panel that has bars)."""
    dl = _decoder_layer()
    pytest.importorskip("matplotlib")
    t = {"kernels": [{"kernel": "gemm_kernel", "us": 10.0, "gap_before_us": 0.0}], "gap_us": 0.0,
         "between_forwards_us": 1.0}
    rows = [{"phase": "prefill", "B": 1, "S": 512, "tiletune_us": 11.0, "replay_timeline": {"tiletune": t}}]
    assert dl.plot_timelines(rows, tmp_path / "p.png", sides=dl.TIMELINE_SIDES[:2], dpi=50)
    assert (tmp_path / "p.png").stat().st_size > 0


def _run_doc(date, rows, **extra):
    doc = {"benchmark": "decoder_layer", "date": date, "gpu": "NVIDIA H200", "arch": "sm_90", "driver": "580",
           "torch": "2.11", "versions": {"cuda_tile": "1.7.0"}, "layer": {"model": "llama3-8b"},
           "fused_mlp": False, "splitk": True, "quick": True, "wall_s": 10.0, "rows": rows}
    doc.update(extra)
    return doc


def _row(phase, b, s, us, **extra):
    return {"phase": phase, "B": b, "S": s, "tiletune_us": us, "first_forward_s": None, **extra}


def test_decoder_layer_merge_orders_rows_later_run_wins_and_lists_the_missing():
    dl = _decoder_layer()
    a = _run_doc("2026-12-01T21:33:00Z", [_row("decode", 8, 2048, 160.0, first_forward_s=0.15),
                                          _row("prefill", 1, 2048, 1500.0)])
    b = _run_doc("2026-12-01T21:39:00Z", [_row("decode", 1, 512, 140.0), _row("prefill", 1, 2048, 1490.0)],
                 quick=False)
    got = dl.merge_docs([b, a])  # given out of order: the later date wins a row measured twice
    assert [dl.row_label(r) for r in got["rows"]] == ["prefill:1:2048", "decode:1:512", "decode:8:2048"]
    assert got["rows"][0]["tiletune_us"] == 1490.0
    assert got["quick"] is False and got["date"] == b["date"] and "wall_s" not in got
    assert dl.merge_docs([a])["quick"] is True  # every run --quick
    assert [s["rows"] for s in got["merged_from"]] == [["decode:8:2048", "prefill:1:2048"],
                                                       ["decode:1:512", "prefill:1:2048"]]
    assert got["first_forward_rows"] == ["decode:8:2048"]
    full = {f"{p}:{bb}:{s}" for p, bb, s in dl.FULL_ROWS}
    assert set(got["rows_missing"]) == full - {"prefill:1:2048", "decode:1:512", "decode:8:2048"}
    with pytest.raises(ValueError, match="driver"):
        dl.merge_docs([a, _run_doc("2026-12-02T00:00:00Z", [], driver="590")])
    with pytest.raises(ValueError, match="nothing"):
        dl.merge_docs([])


def test_decoder_layer_summary_row_keeps_part_sums_and_the_merge_writes_detail(tmp_path):
    dl = _decoder_layer()
    t = {"kernels": [{"kernel": "gemm_kernel", "us": 10.0, "gap_before_us": 0.0},
                     {"kernel": "decode_partial_kernel_fn", "us": 4.0, "gap_before_us": 0.5}],
         "gap_us": 0.5, "between_forwards_us": 3.0}
    prof = {"tiletune": [{"kernel": "gemm_kernel", "us": 10.04, "calls": 1.0},
                         {"kernel": "rms_norm_kernel_fn", "us": 2.0, "calls": 1.0},
                         {"kernel": "gemm_kernel_b", "us": 1.0, "calls": 1.0}],
            "torch.compile": [{"kernel": "nvjet_sm90_x", "us": 9.0, "calls": 1.0}]}
    row = _row("decode", 8, 2048, 20.0, replay_timeline={"tiletune": t, "compile_ro": {}}, kernel_profile=prof)
    got = dl.summary_row(row)
    assert "replay_timeline" not in got and "kernel_profile" not in got and got["tiletune_us"] == 20.0
    assert got["parts_us"] == {"tiletune_replay": {"GEMM": 10.0, "attention": 4.0, "idle": 3.5},
                               "tiletune": {"GEMM": 11.0, "norm": 2.0}, "torch.compile": {"GEMM": 9.0}}
    assert "replay_timeline" in row  # the input row is left whole
    row_c = dict(row, compile_us=27.0)
    got_c = dl.summary_row(row_c)
    assert got_c["ceiling_vs_compile"] == 3.0  # 27 us over the 9 us of cuBLAS GEMM: other kernels free
    kv = 2 * 8 * dl.KV_HEADS * 2048 * dl.HEAD_DIM * 2
    assert got_c["kv_cache_bytes"] == kv and got_c["attention_tbps"] == round(kv / 4.0 / 1e6, 2)
    assert "kv_cache_bytes" not in dl.summary_row(dict(row_c, phase="prefill"))
    import gzip
    import json as _json
    src = tmp_path / "run.json"
    src.write_text(_json.dumps(_run_doc("2026-12-01T21:39:00Z", [row])))
    pytest.importorskip("matplotlib")
    path = dl.merge_results([src], tmp_path / "out")
    doc = _json.loads(path.read_text())
    assert path.name == "decoder_layer.json" and doc["detail"] == "decoder_layer_detail.json.gz"
    assert "replay_timeline" not in doc["rows"][0] and doc["rows"][0]["parts_us"]["tiletune"]["GEMM"] == 11.0
    detail = _json.loads(gzip.decompress((tmp_path / "out" / doc["detail"]).read_bytes()))
    assert detail["rows"][0]["replay_timeline"]["tiletune"] == t
    assert (tmp_path / "out" / "decoder_layer.png").exists() and (tmp_path / "out" / "decoder_layer_timeline.png").exists()
    # --replot of a merged file finds its timelines in the detail file
    (tmp_path / "out" / "decoder_layer_timeline.png").unlink()
    assert dl.main(["--replot", str(path)]) == 0
    assert (tmp_path / "out" / "decoder_layer_timeline.png").exists()


@pytest.mark.parametrize("cap,lens,kernels,h,any_group", [
    (700, [700, 300], ["partial", "combine"], 8, False),  # 3 splits: two launches, the split partials a temporary
    (200, [200, 90], ["direct"], 8, False),  # a capacity within one granule: one split, the direct kernel alone
    (200, [200, 90], ["partial", "combine"], 14, False),  # G=7, one split: the split path by default
    (200, [200, 90], ["direct_grouped"], 14, True),  # G=7 with DIRECT_ANY_GROUP: the grouped direct kernel
])
def test_decode_attention_replays_its_launches(monkeypatch, cap, lens, kernels, h, any_group):
    """After tuning and one recorded call, a call with the same signature skips the checks and
    preparation and replays the recorded launches: the partial and combine kernels (the split partials
    a per-call temporary), or the one direct kernel writing the output (the grouped kernel writing it
    through its ``(B, Hkv, G, Sq, D)`` view)."""
    import tiletune as tt
    from tiletune.devices.backends import FakeBackend
    from tiletune.kernels.library_op import LibraryOp

    def partial_kernel(q5, k, v, lens, po, pl, qk_scale_log2, d, gb, qp, block_n, causal, lat):
        want_o, want_l = dop.decode_partial_reference(q5, k, v, lens, po, pl, causal, qk_scale_log2)
        po.copy_(want_o)
        pl.copy_(want_l)

    def combine_kernel(po, pl, o, qp, d):
        o.copy_(dop.decode_combine_reference(po, pl, o))

    def direct_kernel(q5, k, v, lens, o, qk_scale_log2, d, gb, qp, block_n, causal, lat):
        o.copy_(dop.decode_direct_reference(q5, k, v, lens, o, causal, qk_scale_log2))

    def direct_grouped_kernel(q5, k, v, lens, o5, qk_scale_log2, d, gb, qp, block_n, causal, lat):
        assert o5.dim() == 5
        o5.copy_(dop.decode_direct_reference(q5, k, v, lens, o5, causal, qk_scale_log2))

    fakes = {"partial": partial_kernel, "combine": combine_kernel, "direct": direct_kernel,
             "direct_grouped": direct_grouped_kernel}
    prepared = {"n": 0}
    real_prepare = dop.prepare_decode

    def counted(*a, **kw):
        prepared["n"] += 1
        return real_prepare(*a, **kw)

    for name, fake in fakes.items():
        monkeypatch.setattr(dop, f"decode_{name}_kernel", fake)
    monkeypatch.setattr(dop, "check_cuda_device", lambda *a, **k: None)
    monkeypatch.setattr(dop, "prepare_decode", counted)
    monkeypatch.setattr(dop, "DIRECT_ANY_GROUP", any_group)
    be = FakeBackend(lambda cfg: 10.0, noise=0.0)
    LibraryOp.configure(backend=be, db=False, progress=False,
                        options=tt.TunerOptions(stopping=tt.StoppingRule(min_samples=1, max_samples=1)))
    dop.decode_attention.fastcall.clear()
    try:
        lens_t = torch.tensor(lens, dtype=torch.int32)
        for i in range(5):
            q, k, v = make(2, h, 2, 1, cap, 64, seed=i)
            n0 = len(be.launches)
            got = dop.decode_attention(q, k, v, lens_t, causal=True)
            want = sdpa_bottom_right(q, k, v, lens, True, 1.0 / math.sqrt(64))
            torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)
            if i >= 2:
                assert len(be.launches) - n0 == len(kernels)
        assert prepared["n"] == 2  # tune, learn; then three replays
        recipe = next(iter(dop.decode_attention.fastcall.recipes.values()))
        assert len(dop.decode_attention.fastcall.recipes) == 1
        assert recipe.source.count("_launch") == len(kernels)
        # the fake backend's hinted kernels are the kernels themselves: the recipe launches these, in order
        assert [recipe.__globals__[f"_kernel{i}"] for i in range(len(kernels))] == [fakes[n] for n in kernels]
        # an int length makes a new lengths tensor on every call: that signature keeps the slow path
        for _ in range(3):
            dop.decode_attention(q, k, v, cap, causal=False)
        assert len(dop.decode_attention.fastcall.recipes) == 1 and prepared["n"] == 5
    finally:
        LibraryOp.configure()
        dop.decode_attention.fastcall.clear()


def test_decoder_layer_models_set_the_layer_shapes(monkeypatch):
    dl = _decoder_layer()

    for name in ("MODEL", "HIDDEN", "HEADS", "KV_HEADS", "HEAD_DIM", "FFN", "ROPE_BASE"):
        monkeypatch.setattr(dl, name, getattr(dl, name))  # restored after the test
    dl.use_model("qwen2.5-7b")
    assert (dl.HIDDEN, dl.HEADS, dl.KV_HEADS, dl.HEAD_DIM, dl.FFN) == (3584, 28, 4, 128, 18944)
    assert dl.MODEL == "qwen2.5-7b" and dl.ROPE_BASE == 1e6
    cos_qwen, _ = dl.rope_table(64, device="cpu")
    dl.use_model("llama3-8b")
    assert (dl.HIDDEN, dl.HEADS, dl.KV_HEADS, dl.FFN, dl.ROPE_BASE) == (4096, 32, 8, 14336, 500000.0)
    cos_llama, _ = dl.rope_table(64, device="cpu")
    assert cos_qwen.shape == cos_llama.shape == (64, 128) and not torch.equal(cos_qwen, cos_llama)  # the base
    with pytest.raises(ValueError, match="unknown model"):
        dl.use_model("gpt-9")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("ns", [1, 3])
def test_references_in_bounded_runs_of_sequences_match_one_pass(monkeypatch, causal, ns):
    """The split references read the caches in runs of consecutive sequences of bounded size: runs of one
    sequence (the smallest budget) give what one pass over all of them gives, with lengths that make
    several groups, non-consecutive members and a sequence longer than the capacity."""
    g = torch.Generator().manual_seed(3)
    bsz, hkv, grp, sq, d, cap = 6, 2, 2, 2, 16, 700
    q5 = torch.randn(bsz, hkv, grp, sq, d, generator=g).to(torch.bfloat16)
    k = torch.randn(bsz, hkv, cap, d, generator=g).to(torch.bfloat16)
    v = torch.randn(bsz, hkv, cap, d, generator=g).to(torch.bfloat16)
    lens = torch.tensor([300, 9, 300, 300, 800, 9], dtype=torch.int32)
    whole = dop._split_attention(q5, k, v, lens, ns, causal, 0.125)
    assert dop._member_slices([0, 2, 3, 5], 1) == [[0], [2, 3], [5]]
    monkeypatch.setattr(dop, "REFERENCE_CHUNK_BYTES", 1)
    assert dop._member_slices([0, 2, 3, 5], 1) == [[0], [2], [3], [5]]
    runs = dop._split_attention(q5, k, v, lens, ns, causal, 0.125)
    for a, b in zip(whole, runs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    # a row with keys: a finite log-sum-exp; every sequence's first split sees keys
    assert torch.isfinite(whole[1].reshape(bsz, hkv, ns, grp, sq)[:, :, 0]).all()
