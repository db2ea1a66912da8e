"""Persistent GEMM ``C = A @ B`` written in cuTile, plus its (large) tuning space.

Unlike :mod:`tiletune.kernels.matmul_kernels` (one output tile per block), this kernel is
*persistent*: it is launched with ``min(num_tiles, NUM_SMS * occupancy)`` blocks and each block
walks the output tiles ``bid, bid + num_blocks, bid + 2 * num_blocks, ...``.  The linear tile id
is mapped to ``(tile_row, tile_col)`` with a ``GROUP_M`` swizzle: consecutive ids sweep a band of
``GROUP_M`` tile-rows column by column, so the tiles that are in flight at the same time share
``A`` row-panels and ``B`` column-panels in L2.

* ``A`` is ``M x K`` and ``B`` is ``K x N``, ``C`` is ``M x N`` row-major.  ``TRANS_A`` (constant)
  says ``A`` is given as its ``K x M`` row-major transpose (``a.t()`` of a contiguous tensor),
  ``TRANS_B`` that ``B`` is given as ``N x K`` (``b.t()`` of a contiguous tensor, the
  ``x @ W.T`` layout of linear layers): those operands are read with transposed-order
  :func:`cuda.tile.load` (``order=(1, 0)``), the others through
  :meth:`cuda.tile.Array.tiled_view` (TMA on sm_90+).
* Inputs bfloat16 or float16 (float32 runs on the tensor cores as tf32); accumulation in
  float32 with :func:`cuda.tile.mma`, cast to ``C``'s dtype on the store.
* Edge tiles are zero padded on load (zeros add nothing to the dot products) and clipped on
  store, so ``M``, ``N``, ``K`` need not be multiples of the tile sizes.
* Per-operand load hints: ``LAT_A`` / ``LAT_B`` are the ``latency=`` hints (1-10: how heavy the
  DRAM traffic is expected to be; 0 = let the compiler infer it) and ``ALLOW_TMA`` the
  ``allow_tma=`` flag of both loads.

Tuning space (:data:`GEMM_SPACE_PARAMS`): ``TM``, ``TN``, ``TK``, ``GROUP_M``, ``LAT`` (the
latency hint used for both operands: ``LAT_A = LAT_B = LAT``) are kernel constants;
``occupancy`` and ``num_worker_warps`` are cuTile hints (``occupancy`` also sizes the persistent
grid).  :data:`GEMM_CONSTRAINTS`:

* ``smem_fits``: one ``A`` + ``B`` stage (bf16) is at most 48 KiB: ``(TM + TN) * TK <= 24576``;
* ``acc_fits``: ``TM * TN * occupancy <= 256 * 128``: the fp32 accumulators of the CTAs that
  share an SM fit its register file (wider ones spill);
* ``warps_fit``: ``TM * TN == 256 * 128`` tiles need ``num_worker_warps=8`` (two consumer
  warpgroups; with 4 the 128 KiB accumulator spills, ~10x slower, see matmul_kernels).

That leaves 512 configs, all of which compile for sm_90 (``tools/compile_check_all.py``).
"""

from __future__ import annotations


import cuda.tile as ct
from ._config import param as _param

__all__ = [
    "GEMM_BASELINE",
    "GEMM_CONSTRAINTS",
    "GEMM_SPACE_PARAMS",
    "acc_fits",
    "gemm_args",
    "gemm_grid",
    "gemm_hints",
    "gemm_kernel",
    "gemm_num_tiles",
    "gemm_reference",
    "smem_fits",
    "warps_fit",
]

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

#: Tuning parameters and their candidate values (``occupancy``, ``num_worker_warps``: hints).
GEMM_SPACE_PARAMS = dict(
    TM=[64, 128, 256],
    TN=[64, 128, 256],
    TK=[32, 64, 128],
    GROUP_M=[8, 16],
    LAT=[0, 2, 4, 8],
    occupancy=[1, 2],
    num_worker_warps=[4, 8],
)

#: A sensible hand-picked config; measured first by the tuner.
GEMM_BASELINE = dict(TM=128, TN=256, TK=64, GROUP_M=8, LAT=0, occupancy=1, num_worker_warps=8)


def smem_fits(cfg) -> bool:
    """One bf16 ``A`` + ``B`` pipeline stage is at most 48 KiB: ``(TM + TN) * TK <= 24576``."""
    return (cfg.TM + cfg.TN) * cfg.TK <= 24576


def acc_fits(cfg) -> bool:
    """``TM * TN * occupancy <= 256 * 128``: the co-resident fp32 accumulators fit in registers."""
    return cfg.TM * cfg.TN * cfg.occupancy <= 256 * 128


def warps_fit(cfg) -> bool:
    """256x128 / 128x256 accumulators need two consumer warpgroups (``num_worker_warps=8``)."""
    return cfg.TM * cfg.TN < 256 * 128 or cfg.num_worker_warps == 8


#: ``Space(..., constraints=GEMM_CONSTRAINTS)``.
GEMM_CONSTRAINTS = {"smem_fits": smem_fits, "acc_fits": acc_fits, "warps_fit": warps_fit}


def _tile_coords(tile, num_m, num_n, GROUP_M):
    """Linear tile id -> ``(tile_row, tile_col)`` with grouped (L2-friendly) order."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows = min(num_m - first_m, GROUP_M)
    return first_m + tile % rows, (tile % per_group) // rows


@ct.kernel
def gemm_kernel(A, B, C,
                TM: ConstInt,
                TN: ConstInt,
                TK: ConstInt,
                GROUP_M: ConstInt,
                LAT_A: ConstInt,
                LAT_B: ConstInt,
                ALLOW_TMA: ConstBool,
                TRANS_A: ConstBool,
                TRANS_B: ConstBool):
    """Persistent ``C = A @ B``: each block loops over output tiles (grouped order).

    Args:
        A: ``M x K`` row-major (or ``K x M`` with ``TRANS_A``), bfloat16 / float16 / float32.
        B: ``K x N`` row-major (or ``N x K`` with ``TRANS_B``), same dtype as ``A``.
        C: ``M x N`` row-major output; receives the fp32 accumulator cast to its dtype.
        TM, TN, TK (constant ints, powers of two): tile sizes.
        GROUP_M (constant int): tile-rows per L2 swizzle band.
        LAT_A, LAT_B (constant ints): ``latency=`` hints of the A / B loads (1-10), 0 for none.
        ALLOW_TMA (constant bool): ``allow_tma=`` of both loads.
        TRANS_A, TRANS_B (constant bools): operand given transposed (see the module docstring).

    Launch with ``(min(num_tiles, NUM_SMS * occupancy),)`` blocks (:func:`gemm_grid`); any grid
    size >= 1 is correct.
    """
    M = C.shape[0]
    N = C.shape[1]
    if TRANS_A:
        K = A.shape[0]
    else:
        K = A.shape[1]
    num_m = ct.cdiv(M, TM)
    num_n = ct.cdiv(N, TN)
    num_k = ct.cdiv(K, TK)
    num_tiles = num_m * num_n

    a_tiles = A.tiled_view((TM, TK), padding_mode=ct.PaddingMode.ZERO)
    b_tiles = B.tiled_view((TK, TN), padding_mode=ct.PaddingMode.ZERO)
    # fp32 inputs go through the tensor cores as tf32; bf16/fp16 are used as they are.
    mma_dtype = ct.tfloat32 if A.dtype == ct.float32 else A.dtype

    for tile in range(ct.bid(0), num_tiles, ct.num_blocks(0)):
        bid_m, bid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        acc = ct.zeros((TM, TN), dtype=ct.float32)
        for k in range(num_k):
            # A tile (TM, TK)
            if TRANS_A:
                if LAT_A > 0:
                    a = ct.load(A, (bid_m, k), shape=(TM, TK), order=(1, 0),
                                padding_mode=ct.PaddingMode.ZERO, latency=LAT_A, allow_tma=ALLOW_TMA)
                else:
                    a = ct.load(A, (bid_m, k), shape=(TM, TK), order=(1, 0),
                                padding_mode=ct.PaddingMode.ZERO, allow_tma=ALLOW_TMA)
            else:
                if LAT_A > 0:
                    a = a_tiles.load((bid_m, k), latency=LAT_A, allow_tma=ALLOW_TMA)
                else:
                    a = a_tiles.load((bid_m, k), allow_tma=ALLOW_TMA)
            # B tile (TK, TN)
            if TRANS_B:
                if LAT_B > 0:
                    b = ct.load(B, (k, bid_n), shape=(TK, TN), order=(1, 0),
                                padding_mode=ct.PaddingMode.ZERO, latency=LAT_B, allow_tma=ALLOW_TMA)
                else:
                    b = ct.load(B, (k, bid_n), shape=(TK, TN), order=(1, 0),
                                padding_mode=ct.PaddingMode.ZERO, allow_tma=ALLOW_TMA)
            else:
                if LAT_B > 0:
                    b = b_tiles.load((k, bid_n), latency=LAT_B, allow_tma=ALLOW_TMA)
                else:
                    b = b_tiles.load((k, bid_n), allow_tma=ALLOW_TMA)
            acc = ct.mma(a.astype(mma_dtype), b.astype(mma_dtype), acc)
        # out-of-bounds rows/columns of edge tiles are dropped by the store
        ct.store(C, (bid_m, bid_n), acc.astype(C.dtype))


# --------------------------------------------------------------------------------------------
# host-side helpers
# --------------------------------------------------------------------------------------------


def gemm_num_tiles(cfg, M: int, N: int) -> int:
    """Number of ``TM x TN`` output tiles of an ``M x N`` result."""
    tm, tn = int(_param(cfg, "TM")), int(_param(cfg, "TN"))
    return -(-int(M) // tm) * -(-int(N) // tn)


def gemm_grid(cfg, M: int, N: int, num_sms: int) -> tuple[int]:
    """Persistent grid: ``(min(num_tiles, num_sms * occupancy),)``, at least 1 block."""
    occ = int(_param(cfg, "occupancy", 1))
    return (max(1, min(gemm_num_tiles(cfg, M, N), int(num_sms) * occ)),)


def gemm_hints(cfg) -> dict:
    """cuTile hints of a config: ``occupancy`` and ``num_worker_warps`` (when present).

    Without a ``num_worker_warps`` parameter, ``TM * TN >= 256 * 128`` tiles get 8 (see
    :func:`warps_fit`).  Use ``gemm_kernel.replace_hints(**gemm_hints(cfg))`` and cache the
    result (tiletune's backend does this from ``cfg.hints``).
    """
    hints = {"occupancy": int(_param(cfg, "occupancy", 1))}
    nww = _param(cfg, "num_worker_warps")
    if nww is None and int(_param(cfg, "TM")) * int(_param(cfg, "TN")) >= 256 * 128:
        nww = 8
    if nww is not None:
        hints["num_worker_warps"] = int(nww)
    return hints


def gemm_args(cfg, a, b, c, trans_a: bool = False, trans_b: bool = False) -> tuple:
    """Kernel arguments for ``gemm_kernel``, in order.

    ``(a, b, c, TM, TN, TK, GROUP_M, LAT_A, LAT_B, ALLOW_TMA, TRANS_A, TRANS_B)``.  ``LAT_A`` /
    ``LAT_B`` come from ``cfg.LAT_A`` / ``cfg.LAT_B`` if present, else ``cfg.LAT`` (default 0);
    ``ALLOW_TMA`` from ``cfg.ALLOW_TMA`` (default True); ``GROUP_M`` default 8.  With
    ``trans_a`` ``a`` is the ``K x M`` row-major transpose of A; with ``trans_b`` ``b`` is
    ``N x K`` row-major.
    """
    lat = int(_param(cfg, "LAT", 0))
    return (a, b, c,
            int(_param(cfg, "TM")), int(_param(cfg, "TN")), int(_param(cfg, "TK")),
            int(_param(cfg, "GROUP_M", 8)),
            int(_param(cfg, "LAT_A", lat)), int(_param(cfg, "LAT_B", lat)),
            bool(_param(cfg, "ALLOW_TMA", True)), bool(trans_a), bool(trans_b))


def gemm_reference(a, b, c=None):
    """Reference ``a @ b`` with torch in fp32, cast to ``c``'s dtype (``a``'s without ``c``)."""
    out_dtype = a.dtype if c is None else c.dtype
    return (a.float() @ b.float()).to(out_dtype)
