"""Persistent fused gate-up GEMM + SwiGLU ``Y = silu(A @ BG) * (A @ BU)`` in cuTile, plus its space.

The MLP of a Llama-style decoder layer computes ``swiglu(x @ w_gate_up)``: a GEMM that writes an
``M x 2N`` intermediate, then an elementwise pass that reads it back. This kernel does both at once:
per ``TM x TN`` tile of the ``M x N`` result it keeps two float32 accumulators over the ``K`` loop,
``A @ BG[:, cols]`` (gate) and ``A @ BU[:, cols]`` (up), and stores ``silu(gate) * up`` rounded to the
output's dtype. The intermediate never reaches memory.

* Modelled on :func:`tiletune.kernels.gemm_kernels.gemm_kernel` (which is left untouched: its source
  is part of the shipped tuning table's identity): persistent grid of
  ``min(num_tiles, NUM_SMS * occupancy)`` blocks, ``GROUP_M`` swizzle of the tile order, one
  :func:`cuda.tile.load` per tile (TMA on sm_90+), zero-padded edge tiles, clipped stores.
* Operands are 2-D: ``A`` is ``M x K`` row-major; the gate and up weights arrive as two separate
  arrays ``BG`` and ``BU`` (the op passes the two halves of one ``gate_up`` weight as views, as
  :mod:`tiletune.kernels.glu` does with its input), each ``K x N`` row-major, or ``N x K`` with
  ``TRANS_B`` (the ``x @ W.T`` layout of linear layers, read in transposed order). Passing the
  halves as arrays of their own makes the edge tiles of each half zero padded on their own, so
  ``N`` need not be a multiple of ``TN``.
* bfloat16 / float16 inputs only (:func:`cuda.tile.mma` with float32 accumulation); the activation
  is glu.py's SiLU, ``g / (1 + exp2(-g * log2(e)))`` in float32 with approximate division, applied
  to the float32 accumulators (the unfused route rounds ``gate`` and ``up`` to the input dtype
  first; the fused one does not, so it is at least as close to the exact result).

Space (:func:`gemm_swiglu_space`): the matmul template's parameters
(:func:`tiletune.space.templates.matmul_params`) under constraints for two accumulators and two ``B``
tiles per pipeline stage, without the tiles that spilled in the sm_90 compile probe
(:func:`gemm_swiglu_constraints`): 18 configurations for 16-bit inputs, every one compiling for sm_90
(``tools/compile_check_gemm_glu.py``).
"""

from __future__ import annotations

from typing import Any

import cuda.tile as ct

from tiletune.space.spaces import Space
from tiletune.space.templates import matmul_params
from tiletune.space.templates import param as _param
from tiletune.kernels.gemm_kernels import _tile_coords
from tiletune.kernels.glu import _sigmoid_mul

__all__ = [
    "GEMM_SWIGLU_BASELINE",
    "GEMM_SWIGLU_SPACE_PARAMS",
    "dual_acc_fits",
    "dual_regs_fit",
    "dual_shape",
    "dual_stage_fits",
    "dual_warps_fit",
    "gemm_swiglu_args",
    "gemm_swiglu_constraints",
    "gemm_swiglu_grid",
    "gemm_swiglu_hints",
    "gemm_swiglu_kernel",
    "gemm_swiglu_num_tiles",
    "gemm_swiglu_space",
]

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

#: fp32 accumulator values the CTAs of one SM may hold (the GEMM template's ``256 * 128`` budget).
ACC_VALUES_PER_SM = 256 * 128
#: bytes of one pipeline stage (``A`` tile + both ``B`` tiles), as the GEMM template's 48 KiB.
STAGE_BYTES = 49152

#: The matmul template's parameters for 16-bit inputs (``TM``, ``TN`` in {64, 128, 256}, ``TK`` in
#: {32, 64, 128}, ``GROUP_M`` 8, ``LAT`` 0, ``occupancy`` 1-2, ``num_worker_warps`` 4 / 8).
GEMM_SWIGLU_SPACE_PARAMS = matmul_params(2)

#: Hand-picked config, measured first: 128x128 tiles (two 128x128 fp32 accumulators, the whole
#: register budget of one CTA), two consumer warpgroups, 64 deep (one 48 KiB stage).
GEMM_SWIGLU_BASELINE = dict(TM=128, TN=128, TK=64, GROUP_M=8, LAT=0, occupancy=1, num_worker_warps=8)


def dual_acc_fits(cfg: Any) -> bool:
    """``2 * TM * TN * occupancy <= 256 * 128``: both fp32 accumulators of every co-resident CTA fit
    the register budget of the GEMM template's ``acc_fits``."""
    return 2 * cfg.TM * cfg.TN * cfg.occupancy <= ACC_VALUES_PER_SM


def dual_warps_fit(cfg: Any) -> bool:
    """Two accumulators of ``2 * TM * TN >= 256 * 128`` values need two consumer warpgroups
    (``num_worker_warps=8``), as ``warps_fit`` asks of a single 256x128 accumulator."""
    return 2 * cfg.TM * cfg.TN < ACC_VALUES_PER_SM or cfg.num_worker_warps == 8


def dual_stage_fits(elem_bytes: int = 2) -> Any:
    """Constraint: one ``A`` tile and two ``B`` tiles of ``elem_bytes``-byte elements per stage fit
    the template's 48 KiB: ``(TM + 2 * TN) * TK * elem_bytes <= 49152``."""

    def fits(cfg: Any) -> bool:
        return (cfg.TM + 2 * cfg.TN) * cfg.TK * elem_bytes <= STAGE_BYTES

    fits.__doc__ = f"One A + two B tiles of {elem_bytes}-byte elements per stage are at most 48 KiB."
    return fits


def dual_shape(cfg: Any) -> bool:
    """Two consumer warpgroups only where the two accumulators together hold at least 128x128 values
    (smaller tiles would leave each warpgroup a sliver of the MMA)."""
    return cfg.num_worker_warps == 4 or 2 * cfg.TM * cfg.TN >= 128 * 128


def dual_regs_fit(cfg: Any) -> bool:
    """What the sm_90 compile probe (``tools/compile_check_gemm_glu.py --resources``, tileiras 13.4)
    showed spilling: at occupancy 2 every tile larger than 64x64 (two accumulators at the full
    ``256 * 128`` budget: 184-664 bytes of spill stack per thread), and 64x256 tiles (632 bytes with
    two consumer warpgroups). Those are dropped; the one remaining spiller (64x128x32, occupancy 1,
    4 warps) stays beside its spill-free 64-deep neighbour, as the templates keep such configs."""
    if cfg.occupancy > 1 and cfg.TM * cfg.TN > 64 * 64:
        return False
    return not (cfg.TM == 64 and cfg.TN == 256)


def gemm_swiglu_constraints(elem_bytes: int = 2) -> dict[str, Any]:
    """The space's constraints: :func:`dual_stage_fits`, :func:`dual_acc_fits`, :func:`dual_warps_fit`,
    :func:`dual_shape` and :func:`dual_regs_fit`."""
    return {"stage_fits": dual_stage_fits(elem_bytes), "acc_fits": dual_acc_fits, "warps_fit": dual_warps_fit,
            "shape": dual_shape, "regs_fit": dual_regs_fit}


def gemm_swiglu_space() -> Space:
    """The fused op's space for 16-bit inputs: :data:`GEMM_SWIGLU_SPACE_PARAMS` under
    :func:`gemm_swiglu_constraints`, baseline :data:`GEMM_SWIGLU_BASELINE`."""
    return Space(**GEMM_SWIGLU_SPACE_PARAMS, constraints=gemm_swiglu_constraints(2), baseline=GEMM_SWIGLU_BASELINE)


def _load_tile(X, i, j, T0: ConstInt, T1: ConstInt, LAT: ConstInt, ALLOW_TMA: ConstBool, TRANS: ConstBool):
    """The ``(T0, T1)`` tile ``(i, j)`` of the 2-D ``X`` (``X`` holds the transpose with ``TRANS``)."""
    if TRANS:
        order = (1, 0)
    else:
        order = (0, 1)
    if LAT > 0:
        t = ct.load(X, (i, j), shape=(T0, T1), order=order, padding_mode=ct.PaddingMode.ZERO,
                    latency=LAT, allow_tma=ALLOW_TMA)
    else:
        t = ct.load(X, (i, j), shape=(T0, T1), order=order, padding_mode=ct.PaddingMode.ZERO,
                    allow_tma=ALLOW_TMA)
    return t


@ct.kernel
def gemm_swiglu_kernel(A, BG, BU, C,
                       TM: ConstInt,
                       TN: ConstInt,
                       TK: ConstInt,
                       GROUP_M: ConstInt,
                       LAT_A: ConstInt,
                       LAT_B: ConstInt,
                       ALLOW_TMA: ConstBool,
                       TRANS_B: ConstBool):
    """Persistent ``C = silu(A @ BG) * (A @ BU)``: each block loops over output tiles (grouped order).

    Args:
        A: ``M x K`` row-major, bfloat16 or float16.
        BG, BU: the gate and up weights, ``K x N`` row-major each (``N x K`` with ``TRANS_B``), ``A``'s
            dtype; row strides may be larger than the rows (views of one ``gate_up`` weight).
        C: ``M x N`` row-major output; receives ``silu(gate) * up`` (float32) cast to its dtype.
        TM, TN, TK (constant ints, powers of two): tile sizes.
        GROUP_M (constant int): tile-rows per L2 swizzle band.
        LAT_A, LAT_B (constant ints): ``latency=`` hints of the A / B loads (1-10), 0 for none.
        ALLOW_TMA (constant bool): ``allow_tma=`` of the loads.
        TRANS_B (constant bool): ``BG`` / ``BU`` hold ``N x K`` matrices.

    Launch with ``(min(num_tiles, NUM_SMS * occupancy),)`` blocks (:func:`gemm_swiglu_grid`); any
    grid size >= 1 is correct.
    """
    M = C.shape[0]
    N = C.shape[1]
    K = A.shape[1]
    num_m = ct.cdiv(M, TM)
    num_n = ct.cdiv(N, TN)
    num_k = ct.cdiv(K, TK)
    num_tiles = num_m * num_n

    for tile in range(ct.bid(0), num_tiles, ct.num_blocks(0)):
        bid_m, bid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        acc_g = ct.zeros((TM, TN), dtype=ct.float32)
        acc_u = ct.zeros((TM, TN), dtype=ct.float32)
        for k in range(num_k):
            a = _load_tile(A, bid_m, k, TM, TK, LAT_A, ALLOW_TMA, False)
            bg = _load_tile(BG, k, bid_n, TK, TN, LAT_B, ALLOW_TMA, TRANS_B)
            bu = _load_tile(BU, k, bid_n, TK, TN, LAT_B, ALLOW_TMA, TRANS_B)
            acc_g = ct.mma(a, bg, acc_g)
            acc_u = ct.mma(a, bu, acc_u)
        # silu(g) * u in float32 (glu.py's SiLU); out-of-bounds rows/columns are dropped by the store
        y = _sigmoid_mul(acc_g, acc_g) * acc_u
        ct.store(C, (bid_m, bid_n), y.astype(C.dtype))


# --------------------------------------------------------------------------------------------
# host-side helpers
# --------------------------------------------------------------------------------------------


def gemm_swiglu_num_tiles(cfg: Any, M: int, N: int) -> int:
    """Number of ``TM x TN`` tiles of the ``M x N`` result."""
    tm, tn = int(_param(cfg, "TM")), int(_param(cfg, "TN"))
    return -(-int(M) // tm) * -(-int(N) // tn)


def gemm_swiglu_grid(cfg: Any, M: int, N: int, num_sms: int) -> tuple[int]:
    """Persistent grid: ``(min(num_tiles, num_sms * occupancy),)``, at least 1 block."""
    occ = int(_param(cfg, "occupancy", 1))
    return (max(1, min(gemm_swiglu_num_tiles(cfg, M, N), int(num_sms) * occ)),)


def gemm_swiglu_hints(cfg: Any) -> dict:
    """cuTile hints of a config: ``occupancy`` and ``num_worker_warps`` (8 by default where the two
    accumulators need it, :func:`dual_warps_fit`)."""
    hints = {"occupancy": int(_param(cfg, "occupancy", 1))}
    nww = _param(cfg, "num_worker_warps")
    if nww is None and 2 * int(_param(cfg, "TM")) * int(_param(cfg, "TN")) >= ACC_VALUES_PER_SM:
        nww = 8
    if nww is not None:
        hints["num_worker_warps"] = int(nww)
    return hints


def gemm_swiglu_args(cfg: Any, a: Any, bg: Any, bu: Any, c: Any, trans_b: bool = False) -> tuple:
    """Kernel arguments of :func:`gemm_swiglu_kernel`, in order:
    ``(a, bg, bu, c, TM, TN, TK, GROUP_M, LAT_A, LAT_B, ALLOW_TMA, TRANS_B)``. ``LAT_A`` / ``LAT_B``
    from ``cfg.LAT_A`` / ``cfg.LAT_B`` if present, else ``cfg.LAT`` (default 0); ``ALLOW_TMA`` from
    ``cfg.ALLOW_TMA`` (default True); ``GROUP_M`` default 8."""
    lat = int(_param(cfg, "LAT", 0))
    return (a, bg, bu, c,
            int(_param(cfg, "TM")), int(_param(cfg, "TN")), int(_param(cfg, "TK")),
            int(_param(cfg, "GROUP_M", 8)),
            int(_param(cfg, "LAT_A", lat)), int(_param(cfg, "LAT_B", lat)),
            bool(_param(cfg, "ALLOW_TMA", True)), bool(trans_b))
