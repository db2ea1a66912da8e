"""An experimental GEMM for products whose last wave of tiles is short: full waves unsplit, the tail split-K.

A persistent GEMM over ``T`` output tiles on ``P`` resident blocks runs ``ceil(T / P)`` rounds; when
``T / P`` is just past an integer (2,076 x 4,096 in 128 x 256 tiles: 272 tiles on 132 SMs, 2.06) the
last round keeps a few SMs busy for a whole tile's time while the rest idle. Here the first
``DP = floor(T / P) * P`` tiles run as in :func:`~tiletune.kernels.gemm_kernels.gemm_kernel` (one block, the
whole ``K`` loop, stored to ``C``), and each of the ``R = T - DP`` tail tiles is split along ``K`` into
``S`` units (``R * S <= P``: one short round), each storing its float32 partial to a workspace; the
last unit of a tile to arrive (an acquire-release counter per tail tile) sums the partials in split
order and stores the tile, as :func:`~tiletune.kernels.gemm_kernels.gemm_splitk_kernel` does.

Not a library op: ``benchmarks/probe_gemm_space.py`` tunes it beside the library's space to measure
whether the tail is where large-M rows lose to cuBLAS. The full waves run in their own loop, written as
:func:`~tiletune.kernels.gemm_kernels.gemm_kernel`'s (``range(num_k)``), and the tail units in a second
loop: a first form that ran every unit through one loop with computed K bounds and a runtime branch
around the store was much slower than the library's tuned GEMM even with no tail, and some of its configs
failed their checks (``docs/GPU-NOTES.md``, 2026-12-07). The offline compile of this form still spills at
large tiles: the partial tiles' generic stores to the workspace (``allow_tma=False``) cost the whole
kernel registers and pipeline stages, as in the library's split-K kernel. ``S`` is picked on the host per launch
(:func:`tail_plan_numbers`: at most ``TAIL_MAX``, the tuning parameter, and at least two ``K`` tiles per
unit), so one config adapts to each shape's tail.
"""

from __future__ import annotations

from typing import Any

import cuda.tile as ct
from tiletune.kernels.gemm_kernels import _load_a, _tile_coords, gemm_grid, gemm_num_tiles

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

#: ``TAIL_MAX`` values a probe space tries (1: no split, the tail tiles run whole like the others).
TAIL_MAX_VALUES = (1, 4, 8, 16)


def _k_step(A, B, acc, bz, bid_m, bid_n, k, TM: ConstInt, TN: ConstInt, TK: ConstInt, LAT_A: ConstInt,
            LAT_B: ConstInt, ALLOW_TMA: ConstBool, TRANS_A: ConstBool, TRANS_B: ConstBool, FAST_ACC: ConstBool):
    """``acc`` plus the product of K tile ``k`` of output tile ``(bid_m, bid_n)``, as ``gemm_kernel``'s loop body
    (fp32 inputs through the tensor cores as tf32)."""
    mma_dtype = ct.tfloat32 if A.dtype == ct.float32 else A.dtype
    a = _load_a(A, bz, bid_m, k, TM, TK, LAT_A, ALLOW_TMA, TRANS_A)
    b = _load_a(B, bz, k, bid_n, TK, TN, LAT_B, ALLOW_TMA, TRANS_B)
    if FAST_ACC:
        out = ct.mma(a.astype(mma_dtype), b.astype(mma_dtype), acc, use_fast_acc=True)
    else:
        out = ct.mma(a.astype(mma_dtype), b.astype(mma_dtype), acc)
    return out


def _store_c(C, SA, SB, acc, bz, bid_m, bid_n, TM: ConstInt, TN: ConstInt, SCALED: ConstBool):
    """Store a float32 output tile to ``C`` (times ``SA[0] * SB[0]`` with ``SCALED``) in ``C``'s dtype."""
    if SCALED:
        sa = ct.load(SA, (0,), shape=(1,)).reshape((1, 1))
        sb = ct.load(SB, (0,), shape=(1,)).reshape((1, 1))
        acc = acc * (sa * sb)
    ct.store(C, (bz, bid_m, bid_n), acc.astype(C.dtype).reshape((1, TM, TN)))


@ct.kernel
def gemm_tail_kernel(A, B, C, SA, SB, WS, SEM, DP_TILES, TAIL_S,
                     TM: ConstInt,
                     TN: ConstInt,
                     TK: ConstInt,
                     GROUP_M: ConstInt,
                     LAT_A: ConstInt,
                     LAT_B: ConstInt,
                     ALLOW_TMA: ConstBool,
                     TRANS_A: ConstBool,
                     TRANS_B: ConstBool,
                     SCALED: ConstBool,
                     FAST_ACC: ConstBool):
    """Persistent ``C[b] = A[b] @ B[b]``: tiles ``< DP_TILES`` whole, each later tile in ``TAIL_S`` K-splits.

    Args:
        A, B, C, SA, SB: as for :func:`~tiletune.kernels.gemm_kernels.gemm_kernel`.
        WS: float32 workspace ``(TAIL_S * R, TM, TN)``, ``R`` the tail tiles (``num_tiles - DP_TILES``);
            slot ``split * R + r`` holds split ``split`` of tail tile ``r``.
        SEM: int32 counters, at least ``R``, all zero on entry (left all zero on exit).
        DP_TILES (runtime int): tiles computed whole (a multiple of the grid size, or all tiles).
        TAIL_S (runtime int >= 1): units per tail tile.
        the constants: as for ``gemm_kernel``.

    Any grid size >= 1 is correct (no unit waits for another).
    """
    BATCH = C.shape[0]
    M = C.shape[1]
    N = C.shape[2]
    if TRANS_A:
        K = A.shape[1]
    else:
        K = A.shape[2]
    num_m = ct.cdiv(M, TM)
    num_n = ct.cdiv(N, TN)
    num_k = ct.cdiv(K, TK)
    per_batch = num_m * num_n
    num_tiles = BATCH * per_batch
    tail_tiles = num_tiles - DP_TILES

    # the full waves: exactly gemm_kernel's loop (its K loop has a constant start and the tile count as end)
    for tile in range(ct.bid(0), DP_TILES, ct.num_blocks(0)):
        bz = tile // per_batch
        bid_m, bid_n = _tile_coords(tile % per_batch, num_m, num_n, GROUP_M)
        acc = ct.zeros((TM, TN), dtype=ct.float32)
        for k in range(num_k):
            acc = _k_step(A, B, acc, bz, bid_m, bid_n, k, TM, TN, TK, LAT_A, LAT_B, ALLOW_TMA, TRANS_A, TRANS_B,
                          FAST_ACC)
        _store_c(C, SA, SB, acc, bz, bid_m, bid_n, TM, TN, SCALED)

    # the short last wave: each tail tile in TAIL_S units along K; a block's units start after its whole tiles
    k_per = ct.cdiv(num_k, TAIL_S)
    for t in range(ct.bid(0), tail_tiles * TAIL_S, ct.num_blocks(0)):
        r = t // TAIL_S
        split = t % TAIL_S
        tile = DP_TILES + r
        bz = tile // per_batch
        bid_m, bid_n = _tile_coords(tile % per_batch, num_m, num_n, GROUP_M)
        k_lo = split * k_per
        k_hi = min(k_lo + k_per, num_k)
        acc = ct.zeros((TM, TN), dtype=ct.float32)
        for k in range(k_lo, k_hi):
            acc = _k_step(A, B, acc, bz, bid_m, bid_n, k, TM, TN, TK, LAT_A, LAT_B, ALLOW_TMA, TRANS_A, TRANS_B,
                          FAST_ACC)
        ct.store(WS, (split * tail_tiles + r, 0, 0), acc.reshape((1, TM, TN)), allow_tma=False)
        arrived = ct.atomic_add(SEM, r, 1, memory_order=ct.MemoryOrder.ACQ_REL, memory_scope=ct.MemoryScope.DEVICE)
        if arrived == TAIL_S - 1:
            total = ct.zeros((TM, TN), dtype=ct.float32)
            for s in range(TAIL_S):
                part = ct.load(WS, (s * tail_tiles + r, 0, 0), shape=(1, TM, TN), allow_tma=False)
                total = total + part.reshape((TM, TN))
            _store_c(C, SA, SB, total, bz, bid_m, bid_n, TM, TN, SCALED)
            ct.atomic_xchg(SEM, r, 0, memory_order=ct.MemoryOrder.RELAXED, memory_scope=ct.MemoryScope.DEVICE)


def tail_plan_numbers(cfg: Any, m: int, n: int, k: int, num_sms: int, batch: int = 1) -> tuple[int, int, int, int]:
    """``(grid, DP_TILES, TAIL_S, R)`` of a launch: the persistent grid (:func:`gemm_grid`), the tiles run
    whole, the splits of each tail tile and the tail tiles. ``TAIL_S`` is the largest split up to
    ``cfg.TAIL_MAX`` with ``R * TAIL_S`` units fitting one round and at least two ``K`` tiles per unit;
    where that is 1 (or there is no tail) every tile runs whole (``DP_TILES`` = all, ``R`` = 0)."""
    grid = gemm_grid(cfg, m, n, num_sms, batch)[0]
    tiles = gemm_num_tiles(cfg, m, n, batch)
    dp = (tiles // grid) * grid
    tail = tiles - dp
    num_k = -(-int(k) // int(cfg.TK))
    s = min(int(cfg.TAIL_MAX), grid // tail if tail else 1, num_k // 2)
    if tail == 0 or s < 2:
        return grid, tiles, 1, 0
    return grid, dp, s, tail


_SMS: dict[Any, int] = {}


def tail_plan(cfg: Any, a: Any, b: Any, c: Any, scale_a: Any, scale_b: Any, trans_a: bool, trans_b: bool,
              scaled: bool) -> tuple:
    """Launch plan of :func:`gemm_tail_kernel` over :func:`~tiletune.kernels.gemm.matmul`'s arguments (3-D
    operands, ``c`` the output): a fresh workspace and zeroed counters per launch (a probe, not a library op)."""
    import torch

    from tiletune.devices.backends.base import Launch

    k = a.shape[1] if trans_a else a.shape[2]
    sms = _SMS.get(c.device.index)
    if sms is None:
        sms = _SMS[c.device.index] = torch.cuda.get_device_properties(c.device).multi_processor_count
    grid, dp, s, tail = tail_plan_numbers(cfg, c.shape[1], c.shape[2], k, sms, c.shape[0])
    ws = torch.empty((max(1, s * tail), cfg.TM, cfg.TN), dtype=torch.float32, device=c.device)
    sem = torch.zeros((max(1, tail),), dtype=torch.int32, device=c.device)
    lat = int(getattr(cfg, "LAT", 0))
    args = (a, b, c, scale_a, scale_b, ws, sem, int(dp), int(s),
            int(cfg.TM), int(cfg.TN), int(cfg.TK), int(getattr(cfg, "GROUP_M", 8)), lat, lat,
            True, bool(trans_a), bool(trans_b), bool(scaled), False)
    return Launch(gemm_tail_kernel, (grid,), args)


def tail_space() -> Any:
    """The matmul template's space (:func:`~tiletune.space.templates.matmul_space`, 16-bit) times
    :data:`TAIL_MAX_VALUES`."""
    from tiletune.space.spaces import Space
    from tiletune.space.templates import matmul_baseline, matmul_constraints, matmul_params

    return Space(**matmul_params(2), TAIL_MAX=list(TAIL_MAX_VALUES), constraints=matmul_constraints(2),
                 baseline=dict(matmul_baseline(2), TAIL_MAX=8))
