"""The first one-launch cross-entropy loss kernel, with TMA logit loads, withdrawn on 2026-12-02
(fixture of ``probe_ce_tail.py``).

It finishes the mean in its own launch: every row's term goes to a scratch slot, every block counts
its arrival on an int32 counter, and the last block sums the slots in row order and resets the
counter. Its loss comes out wrong on every launch at many (shape, config) pairs when the logits are
loaded through TMA, and never when they are not (``probe_ce_tail.json.gz``, cuda-tile 1.7.0, tileiras
13.4). The library kernel (``tiletune.kernels.cross_entropy_op``) is one launch with plain loads.
Not a library kernel: kept to reproduce that and as the TMA timing reference.
"""

import math

import cuda.tile as ct

from tiletune.kernels._tile_ops import load_zero_padded as _ld

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
LOG2E = 1.4426950408889634
COUNT_TILE = 1024
ROW_TILE = 1024


def cross_entropy_kernel_fn(L, T, LOSS, G, ROWS, SEM, ignore_index, TV: ConstInt, WITH_GRAD: ConstBool,
                            EVEN: ConstBool, LAT: ConstInt, STORE_TMA: ConstBool):
    """``LOSS[0] = sum_i (logsumexp(L[i]) - L[i, T[i]]) / n_valid`` over the rows whose target is not
    ``ignore_index`` and, with ``WITH_GRAD``, ``G[i] = (softmax(L[i]) - onehot(T[i])) / n_valid`` (0 on
    ignored rows), in one launch.

    ``TV``: columns per chunk; ``EVEN``: ``V % TV == 0`` (no padding columns to mask). ``ROWS``:
    float32 scratch of at least ``M`` slots; ``SEM``: one int32 counter, zero on entry and left zero
    on exit. Each row's term goes to ``ROWS[i]`` (a generic store, no TMA, so the acquire-release
    atomic below orders it); each block then increments ``SEM[0]``, and the block that sees
    ``num_blocks - 1`` there sums ``ROWS[0:M]`` in row order (the same bits whichever block came last,
    whatever the grid), stores it to ``LOSS`` and resets the counter.
    """
    M = L.shape[0]
    V = L.shape[1]
    nch = ct.cdiv(V, TV)
    cols = ct.arange(TV, dtype=ct.int32).reshape((1, TV))

    # n_valid: every block counts the valid targets itself (M * 8 bytes, read from L2)
    cidx = ct.arange(COUNT_TILE, dtype=ct.int32).reshape((1, COUNT_TILE))
    cnt = ct.zeros((1, COUNT_TILE), dtype=ct.float32)
    for i in range(ct.cdiv(M, COUNT_TILE)):
        t = ct.load(T, (i,), shape=(COUNT_TILE,), padding_mode=ct.PaddingMode.ZERO).reshape((1, COUNT_TILE))
        ok = (t != ignore_index) & (cidx + i * COUNT_TILE < M)
        cnt = cnt + ct.where(ok, 1.0, 0.0)
    inv_count = 1.0 / ct.maximum(ct.sum(cnt, axis=1, keepdims=True), 1.0)

    for row in range(ct.bid(0), M, ct.num_blocks(0)):
        tgt = ct.load(T, (row,), shape=(1,)).reshape((1, 1))
        scale = ct.where(tgt != ignore_index, inv_count, 0.0)
        tgt32 = tgt.astype(ct.int32)
        m = ct.full((1, 1), -math.inf, dtype=ct.float32)
        s = ct.zeros((1, 1), dtype=ct.float32)
        # the target's logit: one gathered element (0 for ignored or out-of-range targets)
        tl = ct.gather(L, (row, tgt32)).astype(ct.float32)
        for c in range(nch):
            x = _ld(L, (row, c), (1, TV), LAT).astype(ct.float32)
            if not EVEN:
                x = ct.where(cols + c * TV < V, x, -math.inf)
            m_new = ct.maximum(m, ct.max(x, axis=1, keepdims=True))
            s = s * ct.exp2((m - m_new) * LOG2E, flush_to_zero=True) + ct.sum(
                ct.exp2((x - m_new) * LOG2E, flush_to_zero=True), axis=1, keepdims=True)
            m = m_new
        lse = m + ct.log(s)
        ct.store(ROWS, (row,), ((lse - tl) * scale).reshape((1,)), allow_tma=False)
        if WITH_GRAD:
            for c in range(nch):
                x = _ld(L, (row, c), (1, TV), LAT).astype(ct.float32)
                cc = cols + c * TV
                p = ct.exp2((x - lse) * LOG2E, flush_to_zero=True) * scale
                g = p - ct.where(cc == tgt32, scale, 0.0)
                ct.store(G, (row, c), g.astype(G.dtype), allow_tma=STORE_TMA)

    # the mean, in this launch: the last block to arrive sums every row's term in row order
    arrived = ct.atomic_add(SEM, 0, 1, memory_order=ct.MemoryOrder.ACQ_REL, memory_scope=ct.MemoryScope.DEVICE)
    if arrived == ct.num_blocks(0) - 1:
        ridx = ct.arange(ROW_TILE, dtype=ct.int32).reshape((1, ROW_TILE))
        total = ct.zeros((1, ROW_TILE), dtype=ct.float32)
        for i in range(ct.cdiv(M, ROW_TILE)):
            part = ct.load(ROWS, (i,), shape=(ROW_TILE,), padding_mode=ct.PaddingMode.ZERO,
                           allow_tma=False).reshape((1, ROW_TILE))
            total = total + ct.where(ridx + i * ROW_TILE < M, part, 0.0)
        ct.store(LOSS, (0,), ct.sum(total, axis=1), allow_tma=False)
        ct.atomic_xchg(SEM, 0, 0, memory_order=ct.MemoryOrder.RELAXED, memory_scope=ct.MemoryScope.DEVICE)
