"""Tiled matrix multiplication ``C = A @ B`` written in cuTile, plus its tuning space.

The kernel is the classic "one output tile per block" GEMM:

* ``A`` is ``M x K``, ``B`` is ``K x N``, ``C`` is ``M x N``, all row-major (C-contiguous).
  Inputs are bfloat16 or float16 (float32 inputs also work: they are rounded to tf32 for the
  tensor cores).  Accumulation is float32 with :func:`cuda.tile.mma`; the result is cast to
  ``C``'s dtype on the final store.
* Each block computes a ``TM x TN`` tile of ``C`` and walks the K dimension in ``TK`` steps.
  ``A`` and ``B`` are read through :meth:`cuda.tile.Array.tiled_view` with tile-index loads,
  which lowers to TMA on sm_90+; partial edge tiles are zero padded, so ``M``, ``N`` and ``K``
  need not be multiples of the tile sizes (zero rows/columns add nothing to the dot products),
  and the store drops the out-of-bounds part of edge tiles.
* The grid is 1D with ``cdiv(M, TM) * cdiv(N, TN)`` blocks.  Block ids are remapped with a
  ``GROUP_M`` swizzle: consecutive blocks sweep a band of ``GROUP_M`` tile-rows column by
  column, so blocks that run concurrently share ``A`` row-panels and ``B`` column-panels in L2.

Tuning space: ``TM``/``TN``/``TK`` are kernel constants (kernel arguments), ``occupancy`` is a
compiler hint and is not a kernel argument.  Always build the hinted kernel with
``matmul_kernel.replace_hints(**matmul_hints(cfg))``: besides ``occupancy``, it gives the
``TM * TN >= 256 * 128`` tiles ``num_worker_warps=8``.  With cuTile's default on sm_90 (one
producer + one consumer warpgroup, 256 threads) a 128x256 / 256x128 fp32 accumulator does not fit
in one warpgroup's registers and spills (~45-80 TFLOP/s at 4096^3 bf16 on an H200); with 8 worker
warps (two consumer warpgroups, 384 threads, no spills) 128x256x64 ran at ~713 TFLOP/s, the best
config measured.  Smaller tiles keep the default (128x128x64: ~682 default vs ~635 with 8 warps).
"""

from __future__ import annotations


import cuda.tile as ct
from tiletune.space.templates import param as _param

__all__ = [
    "MATMUL_BASELINE",
    "MATMUL_GROUP_M",
    "MATMUL_SPACE_PARAMS",
    "MATMUL_WIDE_TILE_ELEMS",
    "MATMUL_WIDE_TILE_WORKER_WARPS",
    "matmul_args",
    "matmul_grid",
    "matmul_hints",
    "matmul_kernel",
    "matmul_reference",
    "tile_fits",
]

ConstInt = ct.Constant[int]

#: Default width (in tile-rows) of the L2 swizzle band; used when the config has no ``GROUP_M``.
MATMUL_GROUP_M = 8

#: Accumulator tiles of at least this many elements (``TM * TN``) get ``num_worker_warps`` =
#: :data:`MATMUL_WIDE_TILE_WORKER_WARPS` from :func:`matmul_hints` (see the module docstring).
MATMUL_WIDE_TILE_ELEMS = 256 * 128
MATMUL_WIDE_TILE_WORKER_WARPS = 8

#: Tuning parameters and their candidate values (``occupancy`` is a compiler hint).
MATMUL_SPACE_PARAMS = dict(TM=[64, 128, 256], TN=[64, 128, 256], TK=[32, 64], occupancy=[1, 2])

#: A sensible hand-picked config; the tuner's result should be compared against it.
MATMUL_BASELINE = dict(TM=128, TN=128, TK=64, occupancy=1)


def tile_fits(cfg) -> bool:
    """Constraint on the matmul space: the fp32 accumulator tile has at most 256*128 elements.

    ``TM * TN <= 32768`` keeps the accumulator within one block's register budget
    (128 KiB of fp32); with :data:`MATMUL_SPACE_PARAMS` this leaves 32 configurations.
    """
    return cfg.TM * cfg.TN <= 256 * 128


def _swizzle_2d(bid, num_bid_m, num_bid_n, GROUP_M):
    """Map a linear block id to ``(tile_row, tile_col)`` of ``C`` with grouped ordering.

    Blocks are laid out in bands of ``GROUP_M`` tile-rows; inside a band the id runs down a
    column of tiles first, then to the next column.  The last band may be narrower when the
    number of tile-rows is not a multiple of ``GROUP_M``.  (Device-side helper, inlined into
    the kernel by cuTile.)
    """
    num_bid_in_group = GROUP_M * num_bid_n
    group_id = bid // num_bid_in_group
    first_bid_m = group_id * GROUP_M
    group_size_m = min(num_bid_m - first_bid_m, GROUP_M)
    bid_m = first_bid_m + (bid % group_size_m)
    bid_n = (bid % num_bid_in_group) // group_size_m
    return bid_m, bid_n


@ct.kernel
def matmul_kernel(A, B, C,
                  TM: ConstInt,
                  TN: ConstInt,
                  TK: ConstInt,
                  GROUP_M: ConstInt):
    """Compute one ``TM x TN`` tile of ``C = A @ B`` per block (1D grid, grouped order).

    Args:
        A: ``M x K`` row-major array (bfloat16 / float16; float32 runs as tf32).
        B: ``K x N`` row-major array, same dtype as ``A``.
        C: ``M x N`` row-major output array; receives the fp32 accumulator cast to its dtype.
        TM, TN, TK (constant int, powers of two): tile sizes along M, N and K.
        GROUP_M (constant int): number of tile-rows per L2 swizzle band.

    Launch with a 1D grid of ``cdiv(M, TM) * cdiv(N, TN)`` blocks (see :func:`matmul_grid`).
    """
    M = A.shape[0]
    N = B.shape[1]
    num_bid_m = ct.cdiv(M, TM)
    num_bid_n = ct.cdiv(N, TN)
    bid_m, bid_n = _swizzle_2d(ct.bid(0), num_bid_m, num_bid_n, GROUP_M)

    # Tiled views: loads take tile indices, edge tiles are zero padded (TMA on sm_90+).
    a_tiles = A.tiled_view((TM, TK), padding_mode=ct.PaddingMode.ZERO)
    b_tiles = B.tiled_view((TK, TN), padding_mode=ct.PaddingMode.ZERO)

    # fp32 inputs go through the tensor cores as tf32; bf16/fp16 are used as they are.
    mma_dtype = ct.tfloat32 if A.dtype == ct.float32 else A.dtype

    acc = ct.zeros((TM, TN), dtype=ct.float32)
    for k in range(a_tiles.num_tiles(1)):
        a = a_tiles.load((bid_m, k)).astype(mma_dtype)
        b = b_tiles.load((k, bid_n)).astype(mma_dtype)
        acc = ct.mma(a, b, acc)

    # Out-of-bounds rows/columns of edge tiles are dropped by the store.
    ct.store(C, (bid_m, bid_n), acc.astype(C.dtype))


def matmul_grid(cfg, M: int, N: int) -> tuple[int]:
    """1D launch grid for ``matmul_kernel``: one block per ``TM x TN`` tile of ``C``."""
    tm, tn = _param(cfg, "TM"), _param(cfg, "TN")
    return (max(1, -(-M // tm) * -(-N // tn)),)


def matmul_hints(cfg) -> dict:
    """Compiler hints for a config, for ``matmul_kernel.replace_hints(**matmul_hints(cfg))``.

    ``{"occupancy": cfg.occupancy}``, plus ``num_worker_warps=8`` for ``TM * TN >= 256 * 128``
    (two consumer warpgroups share the accumulator; without it those tiles spill registers).
    """
    hints = {"occupancy": int(_param(cfg, "occupancy", 1))}
    if int(_param(cfg, "TM")) * int(_param(cfg, "TN")) >= MATMUL_WIDE_TILE_ELEMS:
        hints["num_worker_warps"] = MATMUL_WIDE_TILE_WORKER_WARPS
    return hints


def matmul_args(cfg, a, b, c) -> tuple:
    """Kernel arguments for ``matmul_kernel``, in order: ``(a, b, c, TM, TN, TK, GROUP_M)``.

    ``GROUP_M`` comes from the config when it has one, else :data:`MATMUL_GROUP_M`.
    ``occupancy`` is not a kernel argument (it is a hint, see :func:`matmul_hints`).
    """
    return (a, b, c,
            int(_param(cfg, "TM")), int(_param(cfg, "TN")), int(_param(cfg, "TK")),
            int(_param(cfg, "GROUP_M", MATMUL_GROUP_M)))


def matmul_reference(a, b, c=None):
    """Reference ``a @ b`` with torch: fp32 matmul, result cast to ``a.dtype``.

    ``c`` is accepted (and ignored, never written) so the reference can be called with the
    same tensors as the kernel.
    """
    return (a.float() @ b.float()).to(a.dtype)
