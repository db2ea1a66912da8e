"""Persistent batched GEMM ``C[i] = A[i] @ B[i]`` written in cuTile, plus its tuning spaces.

Unlike :mod:`tiletune.lab.examples.matmul_kernels` (one output tile per block), this kernel is
*persistent*: it is launched with ``min(num_tiles, NUM_SMS * occupancy)`` blocks and each block
walks the output tiles ``bid, bid + num_blocks, bid + 2 * num_blocks, ...`` of all batch entries.
Within a batch entry the linear tile id is mapped to ``(tile_row, tile_col)`` with a ``GROUP_M``
swizzle: consecutive ids sweep a band of ``GROUP_M`` tile-rows column by column, so the tiles that
are in flight at the same time share ``A`` row-panels and ``B`` column-panels in L2.

* Operands are 3-D, batch first (a 2-D problem is a batch of one): ``A`` is ``BATCH x M x K``,
  ``B`` is ``BATCH x K x N``, ``C`` is ``BATCH x M x N`` row-major.  ``TRANS_A`` (constant) says
  ``A`` holds ``K x M`` row-major matrices (``a.transpose(-1, -2)`` of a contiguous tensor),
  ``TRANS_B`` that ``B`` holds ``N x K`` ones (the ``x @ W.T`` layout of linear layers); every
  tile is one :func:`cuda.tile.load` (TMA on sm_90+), in transposed order (``order=(0, 2, 1)``)
  for a transposed operand.
* Inputs bfloat16, float16, float32 (run on the tensor cores as tf32) or float8_e4m3fn;
  accumulation in float32 with :func:`cuda.tile.mma`; with ``SCALED`` the accumulator is
  multiplied by the per-tensor scales ``SA[0] * SB[0]`` (fp8); cast to ``C``'s dtype on the store.
* Edge tiles are zero padded on load (zeros add nothing to the dot products) and clipped on
  store, so ``M``, ``N``, ``K`` need not be multiples of the tile sizes.
* Per-operand load hints: ``LAT_A`` / ``LAT_B`` are the ``latency=`` hints (1-10: how heavy the
  DRAM traffic is expected to be; 0 = let the compiler infer it) and ``ALLOW_TMA`` the
  ``allow_tma=`` flag of both loads.

Tuning parameters: ``TM``, ``TN``, ``TK``, ``GROUP_M``, ``LAT`` (the latency hint used for both
operands: ``LAT_A = LAT_B = LAT``) are kernel constants; ``occupancy`` and ``num_worker_warps`` are
cuTile hints (``occupancy`` also sizes the persistent grid).

* :data:`GEMM_FULL_SPACE_PARAMS` with :data:`GEMM_CONSTRAINTS` is the 512-config space recorded
  exhaustively on the H200: ``smem_fits`` (one bf16 ``A`` + ``B`` stage is at most 48 KiB),
  ``acc_fits`` (``TM * TN * occupancy <= 256 * 128``: the fp32 accumulators of the CTAs sharing
  an SM fit its register file), ``warps_fit`` (``TM * TN == 256 * 128`` tiles need
  ``num_worker_warps=8``: with 4 the accumulator spills, ~10x slower).
* :data:`GEMM_SPACE_PARAMS`, :data:`GEMM_TF32_SPACE_PARAMS`, :data:`GEMM_FP8_SPACE_PARAMS` with
  :func:`library_constraints` are the library ops' 38-config spaces per input width (the K depth
  scales with the element size); all of them compile for sm_90 (``tools/compile_check_all.py``).
"""

from __future__ import annotations


import cuda.tile as ct

from tiletune.space.spaces import Space
from tiletune.space.templates import acc_fits, matmul_baseline, matmul_constraints, matmul_params, stage_fits, warps_fit
from tiletune.space.templates import param as _param

__all__ = [
    "GEMM_BASELINE",
    "GEMM_CONSTRAINTS",
    "GEMM_FP8_BASELINE",
    "GEMM_FP8_SPACE_PARAMS",
    "GEMM_FULL_SPACE_PARAMS",
    "GEMM_SPACE_PARAMS",
    "GEMM_TF32_BASELINE",
    "GEMM_TF32_SPACE_PARAMS",
    "SPLITK_MAX_M",
    "SPLITK_MAX_WORKSPACE",
    "SPLIT_K_VALUES",
    "SWAP_NARROW_TN",
    "gemm_splitk_kernel",
    "gemm_swap_kernel",
    "library_constraints",
    "narrow_result",
    "pow2_ceil",
    "pow2_floor",
    "splitk_args",
    "splitk_grid",
    "splitk_regime",
    "splitk_sem_count",
    "splitk_space",
    "splitk_space_params",
    "splitk_units",
    "swap_grid",
    "stage_fits",
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

#: The full recorded space (``benchmarks/spaces/h200_gemm_bf16_4096.json.gz``): 512 configs after
#: :data:`GEMM_CONSTRAINTS` (``occupancy``, ``num_worker_warps``: hints).
GEMM_FULL_SPACE_PARAMS = dict(
    TM=[64, 128, 256],
    TN=[64, 128, 256],
    TK=[32, 64, 128],
    GROUP_M=[8, 16],
    LAT=[0, 2, 4, 8],
    occupancy=[1, 2],
    num_worker_warps=[4, 8],
)

#: The library ops' spaces per input width, from the matmul template
#: (:func:`tiletune.space.templates.matmul_space`): 38 configs each.
GEMM_SPACE_PARAMS = matmul_params(2)
GEMM_TF32_SPACE_PARAMS = matmul_params(4)
GEMM_FP8_SPACE_PARAMS = matmul_params(1)

#: Hand-picked configs, measured first by the tuner (the 16-bit one also for the full space).
GEMM_BASELINE = matmul_baseline(2)
GEMM_TF32_BASELINE = matmul_baseline(4)
GEMM_FP8_BASELINE = matmul_baseline(1)

#: ``library_constraints(elem_bytes)``: the template's constraints for one input width.
library_constraints = matmul_constraints


def smem_fits(cfg) -> bool:
    """One bf16 ``A`` + ``B`` pipeline stage is at most 48 KiB: ``(TM + TN) * TK <= 24576``."""
    return (cfg.TM + cfg.TN) * cfg.TK <= 24576


#: ``Space(..., constraints=GEMM_CONSTRAINTS)``: the full space's constraints.
GEMM_CONSTRAINTS = {"smem_fits": smem_fits, "acc_fits": acc_fits, "warps_fit": warps_fit}


def _tile_coords(tile, num_m, num_n, GROUP_M):
    """Linear tile id -> ``(tile_row, tile_col)`` with grouped (L2-friendly) order."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows = min(num_m - first_m, GROUP_M)
    return first_m + tile % rows, (tile % per_group) // rows


def _load_a(A, b, i, k, TM: ConstInt, TK: ConstInt, LAT: ConstInt, ALLOW_TMA: ConstBool, TRANS: ConstBool):
    """The ``(TM, TK)`` tile ``(i, k)`` of batch ``b`` of ``A`` (``BATCH x M x K``, or ``BATCH x K x M``)."""
    if TRANS:
        order = (0, 2, 1)
    else:
        order = (0, 1, 2)
    if LAT > 0:
        t = ct.load(A, (b, i, k), shape=(1, TM, TK), order=order, padding_mode=ct.PaddingMode.ZERO,
                    latency=LAT, allow_tma=ALLOW_TMA)
    else:
        t = ct.load(A, (b, i, k), shape=(1, TM, TK), order=order, padding_mode=ct.PaddingMode.ZERO,
                    allow_tma=ALLOW_TMA)
    return t.reshape((TM, TK))


@ct.kernel
def gemm_kernel(A, B, C, SA, SB,
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
    """Persistent batched ``C[b] = A[b] @ B[b]``: each block loops over output tiles (grouped order).

    Args:
        A: ``BATCH x M x K`` row-major (``BATCH x K x M`` with ``TRANS_A``); bfloat16, float16,
            float32 (run as tf32) or float8_e4m3fn.
        B: ``BATCH x K x N`` row-major (``BATCH x N x K`` with ``TRANS_B``), same dtype as ``A``.
        C: ``BATCH x M x N`` row-major output; receives the fp32 accumulator (times the scales
            with ``SCALED``) cast to its dtype.
        SA, SB: one-element float32 arrays, the per-tensor scales of ``A`` and ``B`` (read only
            with ``SCALED``; any one-element float32 array otherwise).
        TM, TN, TK (constant ints, powers of two): tile sizes.
        GROUP_M (constant int): tile-rows per L2 swizzle band.
        LAT_A, LAT_B (constant ints): ``latency=`` hints of the A / B loads (1-10), 0 for none.
        ALLOW_TMA (constant bool): ``allow_tma=`` of both loads.
        TRANS_A, TRANS_B (constant bools): operand given transposed (see the module docstring).
        SCALED (constant bool): multiply the accumulator by ``SA[0] * SB[0]`` before the store.
        FAST_ACC (constant bool): ``use_fast_acc`` of the fp8 ``mma`` (Hopper; ignored otherwise).

    Launch with ``(min(BATCH * num_tiles, NUM_SMS * occupancy),)`` blocks (:func:`gemm_grid`);
    any grid size >= 1 is correct.
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
    # fp32 inputs go through the tensor cores as tf32; bf16/fp16/fp8 are used as they are.
    mma_dtype = ct.tfloat32 if A.dtype == ct.float32 else A.dtype

    for tile in range(ct.bid(0), num_tiles, ct.num_blocks(0)):
        bz = tile // per_batch
        bid_m, bid_n = _tile_coords(tile % per_batch, num_m, num_n, GROUP_M)
        acc = ct.zeros((TM, TN), dtype=ct.float32)
        for k in range(num_k):
            a = _load_a(A, bz, bid_m, k, TM, TK, LAT_A, ALLOW_TMA, TRANS_A)
            # B tile (TK, TN): the "A" of the transposed problem with the roles of the dims swapped
            b = _load_a(B, bz, k, bid_n, TK, TN, LAT_B, ALLOW_TMA, TRANS_B)
            if FAST_ACC:
                acc = ct.mma(a.astype(mma_dtype), b.astype(mma_dtype), acc, use_fast_acc=True)
            else:
                acc = ct.mma(a.astype(mma_dtype), b.astype(mma_dtype), acc)
        if SCALED:
            sa = ct.load(SA, (0,), shape=(1,)).reshape((1, 1))
            sb = ct.load(SB, (0,), shape=(1,)).reshape((1, 1))
            acc = acc * (sa * sb)
        # out-of-bounds rows/columns of edge tiles are dropped by the store
        ct.store(C, (bz, bid_m, bid_n), acc.astype(C.dtype).reshape((1, TM, TN)))


@ct.kernel
def gemm_swap_kernel(A, B, C, SA, SB,
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
    """``C[b] = A[b] @ B[b]`` computed as its transpose ``C[b]^T = B[b]^T @ A[b]^T`` (swap-AB), for few rows.

    The same operands, layouts and constants as :func:`gemm_kernel`, but the tensor-core tile's ``M``
    side (``TM``) runs along ``N`` and its ``N`` side (``TN``, which may be 16 or 32) along ``M``: a
    product of a few tokens by a wide weight fills the MMA with weight rows instead of padding 8 tokens
    to 64, and gets ``N / TM`` blocks instead of ``N / TN`` of a plain tile. Operand tiles are loaded in
    transposed order, the output tile is stored through ``order=(0, 2, 1)`` (``C`` stays ``BATCH x M x
    N`` row-major). Persistent like :func:`gemm_kernel`: launch ``min(tiles, NUM_SMS * occupancy)``
    blocks (:func:`swap_grid`); any grid size >= 1 is correct.
    """
    BATCH = C.shape[0]
    M = C.shape[1]
    N = C.shape[2]
    if TRANS_A:
        K = A.shape[1]
    else:
        K = A.shape[2]
    num_m = ct.cdiv(N, TM)  # tile rows of C^T: weight columns
    num_n = ct.cdiv(M, TN)  # tile columns of C^T: tokens
    num_k = ct.cdiv(K, TK)
    per_batch = num_m * num_n
    num_tiles = BATCH * per_batch
    mma_dtype = ct.tfloat32 if A.dtype == ct.float32 else A.dtype

    for tile in range(ct.bid(0), num_tiles, ct.num_blocks(0)):
        bz = tile // per_batch
        bid_m, bid_n = _tile_coords(tile % per_batch, num_m, num_n, GROUP_M)
        acc = ct.zeros((TM, TN), dtype=ct.float32)
        for k in range(num_k):
            # B^T tile (TM, TK): B read in the other order than gemm_kernel reads it
            w = _load_a(B, bz, bid_m, k, TM, TK, LAT_B, ALLOW_TMA, not TRANS_B)
            # A^T tile (TK, TN)
            x = _load_a(A, bz, k, bid_n, TK, TN, LAT_A, ALLOW_TMA, not TRANS_A)
            if FAST_ACC:
                acc = ct.mma(w.astype(mma_dtype), x.astype(mma_dtype), acc, use_fast_acc=True)
            else:
                acc = ct.mma(w.astype(mma_dtype), x.astype(mma_dtype), acc)
        if SCALED:
            sa = ct.load(SA, (0,), shape=(1,)).reshape((1, 1))
            sb = ct.load(SB, (0,), shape=(1,)).reshape((1, 1))
            acc = acc * (sa * sb)
        ct.store(C, (bz, bid_m, bid_n), acc.astype(C.dtype).reshape((1, TM, TN)), order=(0, 2, 1))


# --------------------------------------------------------------------------------------------
# host-side helpers
# --------------------------------------------------------------------------------------------


def gemm_num_tiles(cfg, M: int, N: int, batch: int = 1) -> int:
    """Number of ``TM x TN`` output tiles of a ``batch x M x N`` result."""
    tm, tn = int(_param(cfg, "TM")), int(_param(cfg, "TN"))
    return int(batch) * -(-int(M) // tm) * -(-int(N) // tn)


def gemm_grid(cfg, M: int, N: int, num_sms: int, batch: int = 1) -> tuple[int]:
    """Persistent grid: ``(min(num_tiles, num_sms * occupancy),)``, at least 1 block."""
    occ = int(_param(cfg, "occupancy", 1))
    return (max(1, min(gemm_num_tiles(cfg, M, N, batch), int(num_sms) * occ)),)


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


def gemm_args(cfg, a, b, c, scale_a, scale_b, trans_a: bool = False, trans_b: bool = False,
              scaled: bool = False) -> tuple:
    """Kernel arguments for ``gemm_kernel``, in order.

    ``(a, b, c, scale_a, scale_b, TM, TN, TK, GROUP_M, LAT_A, LAT_B, ALLOW_TMA, TRANS_A, TRANS_B,
    SCALED, FAST_ACC)``.  ``a``, ``b``, ``c`` are 3-D (batch first; a 2-D problem is a batch of
    one), ``scale_a`` / ``scale_b`` one-element float32 tensors.  ``LAT_A`` / ``LAT_B`` come from
    ``cfg.LAT_A`` / ``cfg.LAT_B`` if present, else ``cfg.LAT`` (default 0); ``ALLOW_TMA`` from
    ``cfg.ALLOW_TMA`` (default True); ``GROUP_M`` default 8; ``FAST_ACC`` from ``cfg.FAST_ACC``
    (default False).  With ``trans_a`` ``a`` holds ``K x M`` matrices, with ``trans_b`` ``b``
    holds ``N x K`` ones.
    """
    lat = int(_param(cfg, "LAT", 0))
    return (a, b, c, scale_a, scale_b,
            int(_param(cfg, "TM")), int(_param(cfg, "TN")), int(_param(cfg, "TK")),
            int(_param(cfg, "GROUP_M", 8)),
            int(_param(cfg, "LAT_A", lat)), int(_param(cfg, "LAT_B", lat)),
            bool(_param(cfg, "ALLOW_TMA", True)), bool(trans_a), bool(trans_b), bool(scaled),
            bool(_param(cfg, "FAST_ACC", False)))


def gemm_reference(a, b, c=None):
    """Reference ``a @ b`` with torch in fp32, cast to ``c``'s dtype (``a``'s without ``c``)."""
    out_dtype = a.dtype if c is None else c.dtype
    return (a.float() @ b.float()).to(out_dtype)


# --------------------------------------------------------------------------------------------
# split-K: the K loop of each output tile split over SPLIT_K work units, reduced in the same launch
# --------------------------------------------------------------------------------------------


@ct.kernel
def gemm_splitk_kernel(A, B, C, SA, SB, WS, SEM,
                       TM: ConstInt,
                       TN: ConstInt,
                       TK: ConstInt,
                       GROUP_M: ConstInt,
                       SPLIT_K: ConstInt,
                       LAT_A: ConstInt,
                       LAT_B: ConstInt,
                       ALLOW_TMA: ConstBool,
                       TRANS_A: ConstBool,
                       TRANS_B: ConstBool,
                       SCALED: ConstBool,
                       FAST_ACC: ConstBool):
    """Split-K batched ``C[b] = A[b] @ B[b]`` in one launch (serial fix-up by the last split).

    Work unit ``u`` is split ``u % SPLIT_K`` of output tile ``u // SPLIT_K`` (grouped order as in
    :func:`gemm_kernel`): it accumulates its share of the ``K`` tiles in float32 and stores the partial
    tile to ``WS[split * BATCH + b]`` (generic stores, no TMA, so the atomic below orders them), then
    increments the tile's counter ``SEM[tile]`` (acquire-release, device scope). The unit that sees
    ``SPLIT_K - 1`` there is the tile's last: it sums the ``SPLIT_K`` partials in split order (the
    result does not depend on which unit came last), casts the sum to ``C``'s dtype, stores it, and
    puts the counter back to zero, so ``SEM`` is all zeros again when the launch ends.

    Args:
        A, B, C, SA, SB: as for :func:`gemm_kernel`.
        WS: float32 workspace of ``(S * BATCH, MW, N)`` with ``S >= SPLIT_K`` and ``MW >= M``.
        SEM: int32 counters, at least ``BATCH * cdiv(M, TM) * cdiv(N, TN)`` of them, all zero on entry
            (left all zero on exit).
        SPLIT_K (constant int): work units per output tile.
        the other constants: as for :func:`gemm_kernel`.

    Any grid size >= 1 is correct (units are independent: no unit waits for another).
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
    k_per = ct.cdiv(num_k, SPLIT_K)
    per_batch = num_m * num_n
    num_units = BATCH * per_batch * SPLIT_K
    mma_dtype = ct.tfloat32 if A.dtype == ct.float32 else A.dtype

    for unit in range(ct.bid(0), num_units, ct.num_blocks(0)):
        tile = unit // SPLIT_K
        split = unit % SPLIT_K
        bz = tile // per_batch
        bid_m, bid_n = _tile_coords(tile % per_batch, num_m, num_n, GROUP_M)
        k_lo = split * k_per
        k_hi = min(k_lo + k_per, num_k)
        acc = ct.zeros((TM, TN), dtype=ct.float32)
        for k in range(k_lo, k_hi):
            a = _load_a(A, bz, bid_m, k, TM, TK, LAT_A, ALLOW_TMA, TRANS_A)
            b = _load_a(B, bz, k, bid_n, TK, TN, LAT_B, ALLOW_TMA, TRANS_B)
            if FAST_ACC:
                acc = ct.mma(a.astype(mma_dtype), b.astype(mma_dtype), acc, use_fast_acc=True)
            else:
                acc = ct.mma(a.astype(mma_dtype), b.astype(mma_dtype), acc)
        ct.store(WS, (split * BATCH + bz, bid_m, bid_n), acc.reshape((1, TM, TN)), allow_tma=False)
        arrived = ct.atomic_add(SEM, tile, 1, memory_order=ct.MemoryOrder.ACQ_REL,
                                memory_scope=ct.MemoryScope.DEVICE)
        if arrived == SPLIT_K - 1:
            total = ct.zeros((TM, TN), dtype=ct.float32)
            for s in range(SPLIT_K):
                part = ct.load(WS, (s * BATCH + bz, bid_m, bid_n), shape=(1, TM, TN),
                               padding_mode=ct.PaddingMode.ZERO, allow_tma=False)
                total = total + part.reshape((TM, TN))
            if SCALED:
                sa = ct.load(SA, (0,), shape=(1,)).reshape((1, 1))
                sb = ct.load(SB, (0,), shape=(1,)).reshape((1, 1))
                total = total * (sa * sb)
            ct.store(C, (bz, bid_m, bid_n), total.astype(C.dtype).reshape((1, TM, TN)))
            ct.atomic_xchg(SEM, tile, 0, memory_order=ct.MemoryOrder.RELAXED,
                           memory_scope=ct.MemoryScope.DEVICE)


#: ``SPLIT_K`` values of the split-K spaces (1: :func:`gemm_kernel` itself, no workspace).
SPLIT_K_VALUES = (1, 2, 4, 8, 16)


#: Token tiles (``TN``) below the template's 64 that only the swapped route (:func:`gemm_swap_kernel`) uses.
SWAP_NARROW_TN = (16, 32)


def splitk_space_params(elem_bytes: int, s_max: int) -> dict:
    """Parameters of a split-K space: the matmul template's (:func:`tiletune.space.templates.matmul_params`)
    plus ``SPLIT_K`` in :data:`SPLIT_K_VALUES` up to ``s_max``, ``SWAP`` (0: ``A @ B`` by
    :func:`gemm_kernel` / :func:`gemm_splitk_kernel`; 1: its transpose by :func:`gemm_swap_kernel`) and
    the narrow token tiles :data:`SWAP_NARROW_TN` of the swapped route. A regime's largest token tile is
    a constraint of :func:`splitk_space`, since the token side is ``TM`` or ``TN`` depending on ``SWAP``."""
    params = matmul_params(elem_bytes)
    params["TN"] = sorted(set(params["TN"]) | set(SWAP_NARROW_TN))
    params["SPLIT_K"] = [s for s in SPLIT_K_VALUES if s <= s_max]
    params["SWAP"] = [0, 1]
    return params


def splitk_space(elem_bytes: int, k_floor: int, m_cap: int, s_max: int) -> Space:
    """The small-M space of one regime (see :func:`splitk_regime`): the template's constraints plus

    * ``split_depth``: ``SPLIT_K * 2 * TK <= k_floor`` (every split gets at least two ``K`` tiles of a
      problem with ``K >= k_floor``);
    * ``token_tile``: the tile side along the tokens (``TM``, or ``TN`` when swapped) is at most
      ``m_cap`` (a 256-row tile for a 16-row problem only wastes tensor-core work);
    * ``swap_route``: the narrow token tiles only when swapped, and no split-K when swapped.

    Baseline (measured first, and the config a key first met during CUDA graph capture runs with): for
    ``m_cap <= 64`` the swapped 64 x 32 tile, otherwise the plain 64 x 64 one, both unsplit; the H200
    sweep of ``benchmarks/gemm_small_m.py`` found split-K behind the unsplit kernels on every decoder
    projection, and the swapped route ahead at 8 tokens."""

    def split_depth(cfg) -> bool:
        return cfg.SPLIT_K * 2 * cfg.TK <= k_floor

    def token_tile(cfg) -> bool:
        return (cfg.TN if cfg.SWAP else cfg.TM) <= m_cap

    def swap_route(cfg) -> bool:
        if cfg.SWAP:
            return cfg.SPLIT_K == 1
        return cfg.TN not in SWAP_NARROW_TN

    split_depth.__doc__ = f"SPLIT_K * 2 * TK <= {k_floor}: at least two K tiles per split."
    token_tile.__doc__ = f"The token-side tile (TM, or TN when swapped) is at most {m_cap}."
    swap_route.__doc__ = "Narrow token tiles only when swapped; a swapped config is unsplit."
    cons = dict(matmul_constraints(elem_bytes))
    cons.update(split_depth=split_depth, token_tile=token_tile, swap_route=swap_route)
    params = splitk_space_params(elem_bytes, s_max)
    if m_cap <= 64:
        base = dict(TM=64, TN=32, SWAP=1)
    else:
        base = dict(TM=64, TN=64, SWAP=0)
    base.update(TK=256 // elem_bytes, GROUP_M=8, LAT=0, SPLIT_K=1, occupancy=1, num_worker_warps=4)
    return Space(**params, constraints=cons, baseline=base)


def narrow_result(m: int, n: int, itemsize: int) -> bool:
    """Whether an ``m x n`` result is one row or one column (``m == 1`` or ``n == 1``) whose elements do not
    fill a multiple of 16 bytes: a tile store allowed to use TMA wrote past the end of such results on
    sm_90 (``benchmarks/probe_narrow_rows.py``), so the ops compute them with torch."""
    return (int(m) == 1 or int(n) == 1) and (int(m) * int(n) * int(itemsize)) % 16 != 0


def pow2_ceil(n: int) -> int:
    """Smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 << max(0, int(n) - 1).bit_length()


def pow2_floor(n: int) -> int:
    """Largest power of two ``<= n`` (``n >= 1``)."""
    return 1 << (int(n).bit_length() - 1)


#: Largest ``M`` (after folding leading dims) the split-K ops take; larger products have tiles enough.
SPLITK_MAX_M = 256
#: Largest float32 workspace a split-K op may use, in bytes (``S * BATCH * pow2_ceil(M) * N * 4``).
SPLITK_MAX_WORKSPACE = 64 << 20


def splitk_regime(m: int, n: int, k: int, elem_bytes: int, batch: int = 1) -> tuple[int, int, int, int] | None:
    """``(elem_bytes, k_floor, m_cap, s_max)`` of a problem the split-K op takes, or None.

    * ``m_cap = min(256, max(64, pow2_ceil(M)))``: the largest ``TM`` worth trying;
    * ``k_floor = min(pow2_floor(K), 2 * max_TK * 16)``: ``K`` rounded down (capped where every split
      is allowed), so problems of one regime share a space;
    * ``s_max``: the largest :data:`SPLIT_K_VALUES` entry whose workspace fits
      :data:`SPLITK_MAX_WORKSPACE` and that leaves two ``K`` tiles of the shallowest ``TK`` per split.

    None when ``M > SPLITK_MAX_M``, or no split above 1 is possible (then the plain GEMM op is used).
    """
    if m > SPLITK_MAX_M or m < 1 or n < 1 or k < 1:
        return None
    tks = matmul_params(elem_bytes)["TK"]
    k_floor = min(pow2_floor(k), 2 * max(tks) * max(SPLIT_K_VALUES))
    per_split = batch * pow2_ceil(m) * n * 4
    s_max = 1
    for s in SPLIT_K_VALUES:
        if s * per_split <= SPLITK_MAX_WORKSPACE and s * 2 * min(tks) <= k_floor:
            s_max = s
    if s_max < 2:
        return None
    return (elem_bytes, k_floor, min(SPLITK_MAX_M, max(64, pow2_ceil(m))), s_max)


def splitk_units(cfg, M: int, N: int, batch: int = 1) -> int:
    """Work units of a split-K launch: output tiles times ``SPLIT_K``."""
    return gemm_num_tiles(cfg, M, N, batch) * int(_param(cfg, "SPLIT_K", 1))


def splitk_grid(cfg, M: int, N: int, num_sms: int, batch: int = 1) -> tuple[int]:
    """Persistent grid of a split-K launch: ``(min(units, num_sms * occupancy),)``, at least 1."""
    occ = int(_param(cfg, "occupancy", 1))
    return (max(1, min(splitk_units(cfg, M, N, batch), int(num_sms) * occ)),)


def swap_grid(cfg, M: int, N: int, num_sms: int, batch: int = 1) -> tuple[int]:
    """Persistent grid of :func:`gemm_swap_kernel` for a ``batch x M x N`` result: ``(min(tiles, num_sms *
    occupancy),)`` with ``TM`` tiling ``N`` and ``TN`` tiling ``M``, at least 1."""
    return gemm_grid(cfg, N, M, num_sms, batch)


def splitk_args(cfg, a, b, c, scale_a, scale_b, ws, sem, trans_a: bool = False, trans_b: bool = False,
                scaled: bool = False) -> tuple:
    """Kernel arguments of :func:`gemm_splitk_kernel`, in order (constants as in :func:`gemm_args`)."""
    lat = int(_param(cfg, "LAT", 0))
    return (a, b, c, scale_a, scale_b, ws, sem,
            int(_param(cfg, "TM")), int(_param(cfg, "TN")), int(_param(cfg, "TK")),
            int(_param(cfg, "GROUP_M", 8)), int(_param(cfg, "SPLIT_K", 1)),
            int(_param(cfg, "LAT_A", lat)), int(_param(cfg, "LAT_B", lat)),
            bool(_param(cfg, "ALLOW_TMA", True)), bool(trans_a), bool(trans_b), bool(scaled),
            bool(_param(cfg, "FAST_ACC", False)))


def splitk_sem_count(M: int, N: int, batch: int = 1) -> int:
    """Counters a split-K launch may touch: one per 64 x 64 tile of ``batch x pow2_ceil(M) x N`` (the
    smallest tile of the spaces), so one counter array serves every config."""
    return int(batch) * -(-pow2_ceil(M) // 64) * -(-int(N) // 64)
