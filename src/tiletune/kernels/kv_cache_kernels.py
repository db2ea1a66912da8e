"""KV-cache append written in cuTile: new key/value rows copied into preallocated caches at per-batch positions.

One launch writes both caches. Grid ``(B * Hkv * NC,)`` with ``NC = cdiv(T, CHUNK)``: block ``u`` serves
batch entry ``b``, kv head ``h`` and tokens ``[c * CHUNK, (c + 1) * CHUNK)`` of the ``T`` new ones
(``c = u % NC``, ``(b, h) = divmod(u // NC, Hkv)``; a one-dimensional grid, so neither ``T`` nor
``B * Hkv`` meets CUDA's 65535 limit on the other grid dimensions). For each of its tokens ``t`` it loads
the ``(1, 1, 1, DP)`` tile of ``K`` and of ``V`` at ``(b, h, t, 0)`` and stores it into the caches at
tile index ``(b, h, START[b] + t, 0)``: the tile is one position long, so its tile index is the position.
``DP`` is ``D`` rounded up to a power of two (the load pads with zeros, the store drops the columns
past ``D``: the only out-of-bounds elements the kernel ever stores).

``START[b]`` is read on the device (``ct.gather``; int32 or int64, the kernel is compiled for each):
a CUDA graph replays with whatever the tensor holds. Positions outside ``[0, capacity)`` are not
written: the token loop runs over the ``t`` with ``0 <= START[b] + t < capacity`` only (``START[b]`` is
first clamped to ``[-T, capacity]``, which keeps the arithmetic in 32 bits and changes no position
inside the range), so no row is stored out of bounds and nothing relies on the store's bounds check
along the sequence (nor on how it treats negative indices).

The kernel moves bits: the op passes the caches and the new rows as integer views of their element
size (:func:`tiletune.kernels.decode_attention_op.kv_append_bits`), so one kernel serves bfloat16, float16 and any other dtype, and
the tuner's correctness gate compares the copies exactly.
"""

from __future__ import annotations

import cuda.tile as ct

__all__ = ["KV_APPEND_CHUNK", "kv_append_kernel", "kv_append_kernel_fn"]

ConstInt = ct.Constant[int]
ZERO = ct.PaddingMode.ZERO

#: Tokens per block (the only parameter of the op's one-config space).
KV_APPEND_CHUNK = 16


def kv_append_kernel_fn(CK, CV, K, V, START, CHUNK: ConstInt, DP: ConstInt):
    """``CK[b, h, START[b] + t] = K[b, h, t]`` and the same for ``CV`` / ``V``, for every ``t`` of this
    block's chunk whose position lies in ``[0, capacity)``.

    Args:
        CK, CV: ``(B, Hkv, capacity, D)`` caches, written in place (one integer dtype for all four).
        K, V: ``(B, Hkv, T, D)`` new rows.
        START: ``(B,)`` int32 or int64 first positions (any value: positions outside the caches are
            skipped).
        CHUNK, DP (constant ints): tokens per block; ``D`` rounded up to a power of two.

    Grid: ``(B * Hkv * cdiv(T, CHUNK),)``.
    """
    hkv = K.shape[1]
    T = K.shape[2]
    cap = CK.shape[2]
    nc = ct.cdiv(T, CHUNK)
    u = ct.bid(0)
    c = u % nc
    bh = u // nc
    b = bh // hkv
    h = bh % hkv
    s = ct.minimum(ct.maximum(ct.gather(START, b), -T), cap).astype(ct.int32)
    t0 = c * CHUNK
    lo = ct.maximum(t0, -s)
    hi = ct.minimum(ct.minimum(t0 + CHUNK, T), cap - s)
    for t in range(lo, hi):
        ct.store(CK, (b, h, s + t, 0), ct.load(K, (b, h, t, 0), shape=(1, 1, 1, DP), padding_mode=ZERO))
        ct.store(CV, (b, h, s + t, 0), ct.load(V, (b, h, t, 0), shape=(1, 1, 1, DP), padding_mode=ZERO))


kv_append_kernel = ct.kernel(kv_append_kernel_fn)
