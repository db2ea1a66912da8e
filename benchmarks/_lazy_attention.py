"""An experimental attention kernel for ``probe_power.py``: the library's kernel (non-causal) with lazy
rescaling, the FlashAttention-4 idea. The output accumulator and the row sums are rescaled only when
some row's max rose by more than ``2**LAZY_THRESHOLD`` since the last rescale, so most key tiles skip
the ``acc * alpha`` multiply of every accumulator element. Exact: ``acc`` and ``l`` always share the max
they were scaled with, and the probabilities stay below ``2**LAZY_THRESHOLD``. Not the library's kernel.
"""

from __future__ import annotations

import math

import cuda.tile as ct

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

#: log2 of the factor a stale running max may lag the true one before the kernel rescales
LAZY_THRESHOLD = 8.0


@ct.kernel
def lazy_attention_kernel(Q, K, V, O, qk_scale_log2, HEAD_DIM: ConstInt, BLOCK_M: ConstInt, BLOCK_N: ConstInt,
                          CAUSAL: ConstBool, KV_LATENCY: ConstInt):
    """Non-causal attention, one ``BLOCK_M x HEAD_DIM`` output tile per block (``CAUSAL`` and
    ``KV_LATENCY`` are taken for the library plan's signature and ignored)."""
    H = Q.shape[1]
    group = H // K.shape[1]
    seq_k = K.shape[2]
    bh = ct.bid(1)
    b = bh // H
    h = bh % H
    hk = h // group
    bid_m = ct.bid(0)
    q = ct.load(Q, (b, h, bid_m, 0), shape=(1, 1, BLOCK_M, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO).reshape((BLOCK_M, HEAD_DIM))
    m_i = ct.full((BLOCK_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.zeros((BLOCK_M, 1), dtype=ct.float32)
    acc = ct.zeros((BLOCK_M, HEAD_DIM), dtype=ct.float32)
    mask_from = seq_k // BLOCK_N
    offs_n0 = ct.arange(BLOCK_N, dtype=ct.int32).reshape((1, BLOCK_N))
    for j in range(ct.cdiv(seq_k, BLOCK_N)):
        kt = ct.load(K, (b, hk, 0, j), shape=(1, 1, HEAD_DIM, BLOCK_N), order=(0, 1, 3, 2),
                     padding_mode=ct.PaddingMode.ZERO).reshape((HEAD_DIM, BLOCK_N))
        s = ct.mma(q, kt, ct.zeros((BLOCK_M, BLOCK_N), dtype=ct.float32))
        if j >= mask_from:
            s = ct.where(j * BLOCK_N + offs_n0 < seq_k, s, -math.inf)
        m_blk = ct.max(s, axis=1, keepdims=True) * qk_scale_log2
        if ct.max(m_blk - m_i) > LAZY_THRESHOLD:
            m_new = ct.maximum(m_i, m_blk)
            alpha = ct.exp2(m_i - m_new, flush_to_zero=True)
            l_i = l_i * alpha
            acc = acc * alpha
            m_i = m_new
        p = ct.exp2(s * qk_scale_log2 - m_i, flush_to_zero=True)
        l_i = l_i + ct.sum(p, axis=1, keepdims=True)
        v = ct.load(V, (b, hk, j, 0), shape=(1, 1, BLOCK_N, HEAD_DIM),
                    padding_mode=ct.PaddingMode.ZERO).reshape((BLOCK_N, HEAD_DIM))
        acc = ct.mma(p.astype(Q.dtype), v, acc)
    out = acc * (1.0 / l_i)
    ct.store(O, (b, h, bid_m, 0), out.astype(O.dtype).reshape((1, 1, BLOCK_M, HEAD_DIM)))
