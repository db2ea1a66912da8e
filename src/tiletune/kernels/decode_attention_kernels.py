"""Decode attention (split-KV, "flash-decoding") written in cuTile, plus its host-side helpers.

A few query tokens (``Sq`` in 1..16) attend to a long key/value cache. The work is split two ways:

* **GQA-aware rows.** One block serves one ``(batch, kv head)`` pair (and one group slice, below):
  the ``G = H / Hkv`` query heads of the group times the ``Sq`` query tokens form the ``M``
  dimension of the tensor-core MMA (``GB * QP`` rows, powers of two, zero padded), so a key/value
  tile is read from memory once for the whole group. Groups wider than ``MAX_ROWS`` rows are cut
  into ``NGB = cdiv(G, GB)`` slices, one block each.
* **Split KV.** The cache positions ``[0, len_b)`` of batch entry ``b`` are cut into ``NS`` splits
  (``NS`` = grid dimension 1, chosen by the caller from the cache capacity and the SM count). Split
  boundaries are multiples of :data:`GRANULE` keys, computed from ``len_b`` alone
  (:func:`split_bounds`), so they do not depend on ``BLOCK_N`` (which divides the granule): a
  config's partial results are checkable against one reference. Splits are balanced over the
  *actual* length, so a cache allocated for 32k positions holding 600 costs 600 positions of work.

Kernels:

1. :func:`decode_partial_kernel` (grid ``(B * Hkv * NGB, NS)``): for its rows and split, the online
   softmax of FlashAttention (fp32 scores from ``ct.mma``, ``exp2`` with the scale folded into
   ``log2(e)``, ``P`` rounded to the input dtype before ``P @ V``), then writes the normalized partial
   output ``o_s = acc / l`` (fp32) and its log-sum-exp in base 2, ``lse_s = m + log2(l)`` (``-inf``
   and ``o_s = 0`` for a split with no visible key).
2. :func:`decode_combine_kernel` (grid ``(B * H,)``): ``O = sum_s o_s 2^(lse_s - M) / sum_s
   2^(lse_s - M)``, ``M = max_s lse_s``, rounded to the output dtype.
3. :func:`decode_direct_kernel` (grid ``(B * Hkv * NGB,)``), instead of both when ``NS == 1`` and
   ``G % GB == 0`` (:func:`decode_direct`; a large batch fills the GPU without splitting): the same
   loop over the whole cache, storing ``acc / l`` rounded to the output dtype straight into ``O``
   (no partials, no combine launch). :func:`decode_direct_grouped_kernel` does the same for any ``G``
   (Qwen2.5's 7 query heads per kv head) by storing through the ``(B, Hkv, G, Sq, D)`` view of ``O``.

The partial and direct kernels share the loop (:func:`_attend`) and the block decomposition
(:func:`_block_rows`).

Masking: key ``j`` of batch entry ``b`` is visible to every row iff ``j < len_b``; with ``CAUSAL``
query token ``i`` (of ``Sq``, the *last* ``Sq`` positions of the sequence: bottom-right aligned, the
decode convention) sees keys ``j <= len_b - Sq + i``. Only the key tiles that may hold a masked key
compute the mask. A row with no visible key in a split (possible with ``CAUSAL`` and ``Sq > 1``)
keeps ``m = -inf`` and contributes nothing: ``exp2`` arguments use a finite stand-in for ``-inf``
maxima, so no ``-inf - -inf`` appears. ``len_b`` is read from a device tensor (CUDA-graph friendly)
and clamped to ``[1, capacity]``.
"""

from __future__ import annotations

import math

import cuda.tile as ct
from tiletune.space.templates import param as _param

__all__ = [
    "DECODE_BASELINE",
    "DECODE_HEAD_DIMS",
    "DECODE_MAX_Q",
    "DECODE_SPACE_PARAMS",
    "GRANULE",
    "LOG2E",
    "MAX_ROWS",
    "decode_combine_kernel",
    "decode_combine_kernel_fn",
    "decode_direct",
    "decode_direct_grouped_kernel",
    "decode_direct_grouped_kernel_fn",
    "decode_direct_kernel",
    "decode_direct_kernel_fn",
    "decode_hints",
    "decode_partial_kernel",
    "decode_partial_kernel_fn",
    "decode_rows",
    "decode_splits",
    "split_bounds",
]

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
ZERO = ct.PaddingMode.ZERO

#: ``log2(e)``: the kernels receive ``scale * LOG2E``.
LOG2E = 1.0 / math.log(2.0)
#: Head dimensions the kernels are built and checked for.
DECODE_HEAD_DIMS = (64, 128)
#: Most query tokens per call (``Sq``) the decode kernel takes.
DECODE_MAX_Q = 16
#: Split boundaries are multiples of this many keys (a multiple of every ``BLOCK_N`` of the space).
GRANULE = 256
#: Most MMA rows (query heads of a group slice x padded query tokens) per block.
MAX_ROWS = 128
#: Fewest MMA rows: smaller row counts are padded with zero query tokens.
MIN_ROWS = 16

#: The op's tuning space (24 configs): key tile, K/V load latency hint, occupancy, worker warps.
DECODE_SPACE_PARAMS = dict(
    BLOCK_N=[64, 128, 256],
    KV_LATENCY=[0, 3],
    occupancy=[1, 2],
    num_worker_warps=[4, 8],
)
#: Measured first by the tuner.
DECODE_BASELINE = dict(BLOCK_N=128, KV_LATENCY=0, occupancy=2, num_worker_warps=4)


def _kv_tile_t(K, b, hk, t, HEAD_DIM, BLOCK_N, KV_LATENCY):
    """``K_t^T`` (``HEAD_DIM x BLOCK_N``), read from the ``(cap, D)`` layout in transposed order."""
    if KV_LATENCY > 0:
        kt = ct.load(K, (b, hk, 0, t), shape=(1, 1, HEAD_DIM, BLOCK_N), order=(0, 1, 3, 2),
                     padding_mode=ZERO, latency=KV_LATENCY)
    else:
        kt = ct.load(K, (b, hk, 0, t), shape=(1, 1, HEAD_DIM, BLOCK_N), order=(0, 1, 3, 2), padding_mode=ZERO)
    return kt.reshape((HEAD_DIM, BLOCK_N))


def _kv_tile(V, b, hk, t, HEAD_DIM, BLOCK_N, KV_LATENCY):
    if KV_LATENCY > 0:
        v = ct.load(V, (b, hk, t, 0), shape=(1, 1, BLOCK_N, HEAD_DIM), padding_mode=ZERO, latency=KV_LATENCY)
    else:
        v = ct.load(V, (b, hk, t, 0), shape=(1, 1, BLOCK_N, HEAD_DIM), padding_mode=ZERO)
    return v.reshape((BLOCK_N, HEAD_DIM))


def _block_rows(Q, K, GB):
    """``(b, hk, gi, bh)`` of this block: ``bid(0) = bh * NGB + gi`` with ``bh = b * Hkv + hk``."""
    hkv = K.shape[1]
    ngb = ct.cdiv(Q.shape[2], GB)
    u = ct.bid(0)
    gi = u % ngb
    bh = u // ngb
    return bh // hkv, bh % hkv, gi, bh


def _attend(Q, K, V, LENS, qk_scale_log2, b, hk, gi, ns, sp,
            HEAD_DIM, GB, QP, BLOCK_N, CAUSAL, KV_LATENCY):
    """The online softmax of the rows of ``(b, hk, group slice gi)`` over split ``sp`` of ``ns``.

    Returns ``(acc, l, m)``, float32: the unnormalized output ``(GB * QP, HEAD_DIM)``, the row sums
    ``(GB * QP, 1)`` and the row maxima of the scaled scores in base 2 (``-inf`` and ``l = 0`` for a
    row with no visible key in the split).

    A kernel's tuning identity holds its own function's source, not this helper's: a change here
    that should invalidate tuning results must change the kernels' text too (e.g. their docstrings)."""
    cap = K.shape[2]
    sq = Q.shape[3]
    kv_len = ct.minimum(ct.maximum(ct.gather(LENS, b), 1), cap)
    per = ct.cdiv(ct.cdiv(kv_len, GRANULE), ns) * GRANULE  # keys per split, a multiple of GRANULE
    start = sp * per
    end = ct.minimum(start + per, kv_len)
    t0 = start // BLOCK_N
    t1 = ct.cdiv(end, BLOCK_N)  # <= t0 for a split past the end: no iteration
    if CAUSAL:
        mask_from = ct.maximum(kv_len - sq + 1, 0) // BLOCK_N
    else:
        mask_from = kv_len // BLOCK_N

    ROWS = GB * QP
    q = ct.load(Q, (b, hk, gi, 0, 0), shape=(1, 1, GB, QP, HEAD_DIM), padding_mode=ZERO)
    q = q.reshape((ROWS, HEAD_DIM))
    # last visible key of each row (query token i = row % QP): len - Sq + i with CAUSAL
    qi = (ct.arange(ROWS, dtype=ct.int32) % QP).reshape((ROWS, 1))
    offs_n0 = ct.arange(BLOCK_N, dtype=ct.int32).reshape((1, BLOCK_N))

    m_i = ct.full((ROWS, 1), -math.inf, dtype=ct.float32)
    l_i = ct.zeros((ROWS, 1), dtype=ct.float32)
    acc = ct.zeros((ROWS, HEAD_DIM), dtype=ct.float32)

    for t in range(t0, t1):
        kt = _kv_tile_t(K, b, hk, t, HEAD_DIM, BLOCK_N, KV_LATENCY)
        s = ct.mma(q, kt, ct.zeros((ROWS, BLOCK_N), dtype=ct.float32))
        if t >= mask_from:
            offs_n = t * BLOCK_N + offs_n0
            if CAUSAL:
                keep = (offs_n < kv_len) & (offs_n <= kv_len - sq + qi)
            else:
                keep = offs_n < kv_len
            s = ct.where(keep, s, -math.inf)
        m_new = ct.maximum(m_i, ct.max(s, axis=1, keepdims=True) * qk_scale_log2)
        m_use = ct.where(m_new == -math.inf, 0.0, m_new)  # a row with nothing visible yet stays at 0
        p = ct.exp2(s * qk_scale_log2 - m_use, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_use, flush_to_zero=True)
        l_i = l_i * alpha + ct.sum(p, axis=1, keepdims=True)
        v = _kv_tile(V, b, hk, t, HEAD_DIM, BLOCK_N, KV_LATENCY)
        acc = ct.mma(p.astype(Q.dtype), v, acc * alpha)
        m_i = m_new
    return acc, l_i, m_i


def _inverse(l_i):
    """``1 / l`` where ``l > 0``, else 0 (a row with nothing visible gives 0)."""
    seen = l_i > 0.0
    return ct.where(seen, 1.0 / ct.where(seen, l_i, 1.0), 0.0)


def decode_partial_kernel_fn(Q, K, V, LENS, PO, PL, qk_scale_log2,
                             HEAD_DIM: ConstInt, GB: ConstInt, QP: ConstInt, BLOCK_N: ConstInt,
                             CAUSAL: ConstBool, KV_LATENCY: ConstInt):
    """Partial attention of one ``(batch, kv head, group slice)`` over one split of the cache.

    Args:
        Q: ``(B, Hkv, G, Sq, D)`` queries (a view of ``(B, H, Sq, D)``), bfloat16 / float16.
        K, V: ``(B, Hkv, cap, D)`` key / value caches, same dtype.
        LENS: ``(B,)`` int32 valid lengths (positions ``< LENS[b]`` are attended; clamped to
            ``[1, cap]``).
        PO: ``(B * Hkv * NS, G, Sq, D)`` float32 partial outputs (row ``(b * Hkv + hk) * NS + s``).
        PL: ``(B * Hkv * NS, G, Sq)`` float32 partial log-sum-exps, base 2.
        qk_scale_log2 (runtime float32): ``softmax scale * log2(e)``, > 0.
        HEAD_DIM, GB, QP, BLOCK_N, KV_LATENCY (constant ints): ``D``; query heads per block; padded
            query tokens (power of two, ``>= Sq``); keys per tile (divides :data:`GRANULE`); ``latency=``
            hint of the K/V loads (0: none).
        CAUSAL (constant bool): query ``i`` sees keys ``<= len - Sq + i`` (bottom-right aligned).

    Grid: ``(B * Hkv * NGB, NS)`` with ``NGB = cdiv(G, GB)``.
    """
    b, hk, gi, bh = _block_rows(Q, K, GB)
    ns = ct.num_blocks(1)
    sp = ct.bid(1)
    acc, l_i, m_i = _attend(Q, K, V, LENS, qk_scale_log2, b, hk, gi, ns, sp,
                            HEAD_DIM, GB, QP, BLOCK_N, CAUSAL, KV_LATENCY)
    inv = _inverse(l_i)
    lse = m_i + ct.log2(ct.where(l_i > 0.0, l_i, 1.0))  # -inf where nothing was seen (m_i = -inf)
    row = bh * ns + sp
    ct.store(PO, (row, gi, 0, 0), (acc * inv).reshape((1, GB, QP, HEAD_DIM)))
    ct.store(PL, (row, gi, 0), lse.reshape((1, GB, QP)))


def decode_direct_kernel_fn(Q, K, V, LENS, O, qk_scale_log2,
                            HEAD_DIM: ConstInt, GB: ConstInt, QP: ConstInt, BLOCK_N: ConstInt,
                            CAUSAL: ConstBool, KV_LATENCY: ConstInt):
    """Attention of one ``(batch, kv head, group slice)`` over the whole cache, stored into the output.

    The one-split case of :func:`decode_partial_kernel_fn` (same loop, same arguments but ``O`` for
    ``PO``/``PL``): the normalized output ``acc / l`` rounded to ``O``'s dtype, with no partials and
    no combine. Needs ``G % GB == 0``: a block's ``GB`` heads are then the ``GB``-row tile
    ``hk * (G / GB) + gi`` of ``O``'s head axis (the ``QP - Sq`` padded query rows are dropped by the
    store).

    Args:
        Q, K, V, LENS, qk_scale_log2, constants: as for :func:`decode_partial_kernel_fn`.
        O: ``(B, H, Sq, D)`` output, ``Q``'s dtype.

    Grid: ``(B * Hkv * NGB,)`` with ``NGB = G / GB``.
    """
    b, hk, gi, _ = _block_rows(Q, K, GB)
    acc, l_i, _ = _attend(Q, K, V, LENS, qk_scale_log2, b, hk, gi, 1, 0,
                          HEAD_DIM, GB, QP, BLOCK_N, CAUSAL, KV_LATENCY)
    out = (acc * _inverse(l_i)).astype(O.dtype)
    ct.store(O, (b, hk * (Q.shape[2] // GB) + gi, 0, 0), out.reshape((1, GB, QP, HEAD_DIM)))


def decode_direct_grouped_kernel_fn(Q, K, V, LENS, O5, qk_scale_log2,
                                    HEAD_DIM: ConstInt, GB: ConstInt, QP: ConstInt, BLOCK_N: ConstInt,
                                    CAUSAL: ConstBool, KV_LATENCY: ConstInt):
    """:func:`decode_direct_kernel_fn` for any group size: stores through the grouped view of the output.

    ``O5`` is the ``(B, Hkv, G, Sq, D)`` view of the ``(B, H, Sq, D)`` output (as ``Q`` is of the
    queries), so a block's ``GB``-head tile sits at ``(b, hk, gi)`` whether or not ``GB`` divides ``G``:
    with ``G = 7`` (Qwen2.5's 28/4 heads) the eighth, padded head of the tile falls outside the array and
    the store drops it, as it drops the padded query rows (and as the partial kernel's store drops both).

    Grid: ``(B * Hkv * NGB,)`` with ``NGB = cdiv(G, GB)``.
    """
    b, hk, gi, _ = _block_rows(Q, K, GB)
    acc, l_i, _ = _attend(Q, K, V, LENS, qk_scale_log2, b, hk, gi, 1, 0,
                          HEAD_DIM, GB, QP, BLOCK_N, CAUSAL, KV_LATENCY)
    out = (acc * _inverse(l_i)).astype(O5.dtype)
    ct.store(O5, (b, hk, gi, 0, 0), out.reshape((1, 1, GB, QP, HEAD_DIM)))


def decode_combine_kernel_fn(PO, PL, O, QP: ConstInt, HEAD_DIM: ConstInt):
    """``O[b, h] = combine over splits`` of the partial outputs of query head ``h``.

    Args:
        PO, PL: as written by :func:`decode_partial_kernel_fn` (``NS`` splits per ``(b, kv head)``).
        O: ``(B, H, Sq, D)`` output, bfloat16 / float16.
        QP, HEAD_DIM (constant ints): padded query tokens, ``D``.

    Grid: ``(B * H,)``.
    """
    bsz = O.shape[0]
    H = O.shape[1]
    G = PO.shape[1]
    hkv = H // G
    ns = PO.shape[0] // (bsz * hkv)
    u = ct.bid(0)
    b = u // H
    h = u % H
    hk = h // G
    g = h % G
    base = (b * hkv + hk) * ns

    m = ct.full((QP, 1), -math.inf, dtype=ct.float32)
    l_sum = ct.zeros((QP, 1), dtype=ct.float32)
    acc = ct.zeros((QP, HEAD_DIM), dtype=ct.float32)
    for s in range(ns):
        lse = ct.load(PL, (base + s, g, 0), shape=(1, 1, QP), padding_mode=ZERO).reshape((QP, 1))
        o = ct.load(PO, (base + s, g, 0, 0), shape=(1, 1, QP, HEAD_DIM), padding_mode=ZERO)
        m_new = ct.maximum(m, lse)
        m_use = ct.where(m_new == -math.inf, 0.0, m_new)
        a = ct.exp2(m - m_use, flush_to_zero=True)
        w = ct.exp2(lse - m_use, flush_to_zero=True)
        acc = acc * a + o.reshape((QP, HEAD_DIM)) * w
        l_sum = l_sum * a + w
        m = m_new
    out = acc * _inverse(l_sum)
    ct.store(O, (b, h, 0, 0), out.astype(O.dtype).reshape((1, 1, QP, HEAD_DIM)))


decode_partial_kernel = ct.kernel(decode_partial_kernel_fn)
decode_combine_kernel = ct.kernel(decode_combine_kernel_fn)
decode_direct_kernel = ct.kernel(decode_direct_kernel_fn)
decode_direct_grouped_kernel = ct.kernel(decode_direct_grouped_kernel_fn)


# --------------------------------------------------------------------------------------------
# host-side helpers (pure Python: tested on CPU)
# --------------------------------------------------------------------------------------------


def _pow2(n: int) -> int:
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def decode_rows(g: int, sq: int) -> tuple[int, int, int]:
    """``(GB, QP, NGB)`` for ``g`` query heads per kv head and ``sq`` query tokens.

    ``QP = pow2(Sq)``, raised so that ``GB * QP >= MIN_ROWS`` when the group is small; ``GB`` =
    query heads per block (``pow2(G)``, at most ``MAX_ROWS / QP``); ``NGB = cdiv(G, GB)`` blocks per
    ``(batch, kv head)``.
    """
    g, sq = int(g), int(sq)
    if g < 1 or not 1 <= sq <= DECODE_MAX_Q:
        raise ValueError(f"decode_rows: need G >= 1 and 1 <= Sq <= {DECODE_MAX_Q}, got G={g}, Sq={sq}")
    qp = _pow2(sq)
    gb = min(_pow2(g), max(1, MAX_ROWS // qp))
    if gb * qp < MIN_ROWS:
        qp = MIN_ROWS // gb
    return gb, qp, -(-g // gb)


def decode_splits(units: int, capacity: int, sms: int) -> int:
    """Splits of the KV axis for ``units`` = ``B * Hkv * NGB`` row blocks: as many as keep the grid within
    one block per SM (``units * splits <= sms``; one split once the row blocks alone fill the SMs), at
    most one split per :data:`GRANULE` keys of the cache ``capacity``.

    A grid that ends in a partial wave leaves SMs idle on its last wave, and each split adds partials
    to combine: ``benchmarks/decode_splits.py`` found the one-wave count fastest, or within 1% of the
    fastest, on every decode shape it swept on an H200 (``benchmarks/results/h200/decode_splits.json``),
    where a rule aiming at two blocks per SM lost up to 14% on some shapes."""
    units, capacity, sms = max(1, int(units)), max(1, int(capacity)), max(1, int(sms))
    return max(1, min(sms // units, -(-capacity // GRANULE)))


def decode_direct(g: int, sq: int, ns: int, any_group: bool = False) -> bool:
    """Whether a call with ``g`` query heads per kv head, ``sq`` query tokens and ``ns`` splits runs a
    direct kernel alone: one split (nothing to combine) and group slices that tile the head axis of the
    output (``G % GB == 0``, so a block's ``GB`` heads are one tile of ``O``:
    :func:`decode_direct_kernel_fn`), or any group with ``any_group``
    (:func:`decode_direct_grouped_kernel_fn`, which stores through the grouped view of the output)."""
    gb, _, _ = decode_rows(g, sq)
    return int(ns) == 1 and (bool(any_group) or int(g) % gb == 0)


def split_bounds(kv_len: int, ns: int, sp: int) -> tuple[int, int]:
    """Key range ``[start, end)`` of split ``sp`` of ``ns`` for a sequence of ``kv_len`` keys (as the
    kernel computes it; ``end <= start`` for an empty split)."""
    per = -(-(-(-int(kv_len) // GRANULE)) // int(ns)) * GRANULE
    start = int(sp) * per
    return start, min(start + per, int(kv_len))


def decode_hints(cfg) -> dict:
    """cuTile hints of a config (``occupancy``, ``num_worker_warps``)."""
    hints = {"occupancy": int(_param(cfg, "occupancy", 1))}
    nww = _param(cfg, "num_worker_warps")
    if nww is not None:
        hints["num_worker_warps"] = int(nww)
    return hints
