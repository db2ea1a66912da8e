"""Kernel-type search-space templates: small :class:`~tiletune.Space` objects for common kernel shapes.

A template knows which knobs pay for a *kind* of kernel and which combinations are hopeless, so an
op builds its space from the problem's few facts (row length, element size, whether its rows can
move by TMA) instead of listing values by hand. Every template returns a plain
:class:`~tiletune.Space` of a handful of configurations (4-12 in the common cases), with
per-architecture values through :func:`~tiletune.per_arch` where they differ.

What the knobs are, and what offline probing showed (``tools/compile_check_memory.py
--resources`` compiles every configuration for sm_90 and reads registers, spill stack, shared
memory, threads and TMA instructions from the cubins; tileiras 13.4):

* Row-reduction kernels (norms, softmax, cross-entropy) compile to warp-specialized TMA pipelines
  (256 threads: a producer warpgroup issuing ``UTMALDG``, a consumer warpgroup). Their knobs:

  - ``occupancy`` (cuTile hint; also sets the persistent grid, ``num_SMs * occupancy`` blocks):
    how many blocks, hence bytes in flight, share an SM;
  - ``LAT``, the ``latency=`` hint of the streaming loads (0: the compiler's choice). ``LAT=10``
    makes tileiras stage deeper TMA pipelines (1 x 4096 bf16 rows at occupancy 1: ~50 KB of shared
    memory staging becomes ~180 KB);
  - ``STORE_TMA``, whether the output store may use TMA (``allow_tma=``): TMA stores go through
    shared memory, plain ones straight from registers (public cuTile RMSNorm code reports +30%
    from turning TMA stores off);
  - the tile: ``TM`` short rows per tile, or ``CHUNK`` columns per pass for long rows;
  - ``num_worker_warps`` (4 or 8 with tileiras 13.4) for the widest rows.

  Padding modes other than zero rule TMA out (``PaddingMode.NEG_INF`` loads compiled to plain
  ``LDG``), so the kernels load zero-padded and mask in registers. Rows under 16 bytes, or with a
  row stride that is not a multiple of 16 bytes, cannot use TMA either (:func:`tma_rows`); there
  the latency hint changes nothing, and ``LAT=10`` even made tileiras unroll tiny-row kernels into
  10-40 s compiles that spill, so those spaces drop it. Their stores are plain (``STORE_TMA``
  False): a store allowed to use TMA wrote past the end of outputs of one-element rows and into
  the gaps of padded rows on sm_90 (``benchmarks/probe_narrow_rows.py``).
* Reduction-free streams (gated activations, RoPE) compile to vectorized plain ``LDG.128`` /
  ``STG.128`` with 128 threads per block, no TMA and no warp specialization, whatever the hints:
  ``LAT`` and ``STORE_TMA`` produced identical SASS. Their knobs are the bytes in flight and how
  they spread over threads: tile size, ``occupancy`` and ``num_worker_warps`` (the block size).

Register budget: a block keeps its fp32 tile in registers and ``occupancy`` blocks share 64K of
them; tiles of ``TM * TN * occupancy > 16384`` fp32 values spilled in the probe (a 1 x 8192 row
at occupancy 4; a 1 x 16384 row at occupancy 2 with 8 worker warps). :func:`fits_registers`
encodes that rule (``streams`` counts the tiles live at once: 2 for a fused residual or
LayerNorm's centered copy) and :func:`thread_regs_fit` the per-thread form for plain-load
kernels. A few configurations still spill (the compiler's unrolling is not monotone in the tile);
they stay in the spaces when a neighbour of theirs does not, since spilling a few registers is
not always slower, and the tuner measures.
"""

from __future__ import annotations

from typing import Any, Sequence

from tiletune.space.spaces import Space, per_arch

__all__ = [
    "FP32_VALUES_PER_SM",
    "ROW_MAX_ELEMS",
    "SHORT_ROWS_GRID_ALL",
    "SHORT_ROWS_HIGH_OCCUPANCY_TILE",
    "SHORT_ROWS_VALUES_PER_SM",
    "chunked_row_space",
    "cross_entropy_loss_triples",
    "cross_entropy_space",
    "elementwise_space",
    "acc_fits",
    "fits_registers",
    "matmul_baseline",
    "matmul_constraints",
    "matmul_params",
    "matmul_shape",
    "matmul_space",
    "next_power_of_2",
    "param",
    "row_regime",
    "thread_regs_fit",
    "tma_rows",
    "rowwise_space",
    "rope_space",
    "short_rows_space",
    "stage_fits",
    "warps_fit",
]

#: fp32 values of live tile data one SM can hold in registers without spilling (all its blocks).
FP32_VALUES_PER_SM = 16384

#: Rows up to this many (padded) elements are processed as one tile; longer rows in chunks.
ROW_MAX_ELEMS = 16384

#: Short rows (several per tile): the most tile values a block's tiles (times the row streams) may hold
#: across the blocks of one SM. Measured on the H200 (``benchmarks/probe_memory.py``,
#: ``benchmarks/results/h200/probe_memory.json.gz``): rows of 1024 ran fastest with 2-4x the default rows per
#: tile, beyond :data:`FP32_VALUES_PER_SM`, with no failure over the probe's 64-72 configs per op.
SHORT_ROWS_VALUES_PER_SM = 65536
#: short rows: the largest tile (rows x padded row) tried at occupancy 8 and 16
SHORT_ROWS_HIGH_OCCUPANCY_TILE = 4096
#: short rows: the ``GRID_FRAC`` of the non-persistent launch (``num_SMs * occupancy * 1024`` blocks, more
#: than any realistic count of row blocks: one block each)
SHORT_ROWS_GRID_ALL = 1024.0


def param(cfg: Any, name: str, default: Any = None) -> Any:
    """Read ``name`` from a config (attribute access, e.g. :class:`tiletune.Config`) or a mapping, for the
    host-side launch helpers of kernels (the library's and the examples')."""
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    try:
        return getattr(cfg, name)
    except AttributeError:
        return default


def next_power_of_2(n: int) -> int:
    """Smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def fits_registers(tile_elems: int, occupancy: int, streams: int = 1,
                   values_per_sm: int = FP32_VALUES_PER_SM) -> bool:
    """Whether ``occupancy`` blocks, each holding ``streams`` fp32 tiles of ``tile_elems``, stay within
    ``values_per_sm`` values per SM (by default what the registers hold)."""
    return int(tile_elems) * int(occupancy) * max(1, int(streams)) <= int(values_per_sm)


def thread_regs_fit(values_per_thread: int, occupancy: int, threads: int, per_value: float = 4.0,
                    fixed: int = 24) -> bool:
    """Whether ``fixed + per_value * values_per_thread`` registers fit the per-thread budget
    ``min(255, 65536 / (occupancy * threads))`` (a probed model for the plain-load kernels; the
    RoPE kernel spilled exactly where it predicts a miss)."""
    budget = min(255, 65536 // max(1, int(occupancy) * int(threads)))
    return fixed + per_value * values_per_thread <= budget


def row_regime(n_cols: int, streams: int = 1) -> str:
    """``"rows"`` (several short rows per tile), ``"row"`` (one row per tile) or ``"chunked"``.

    Rows longer than ``ROW_MAX_ELEMS / streams`` padded elements are chunked.
    """
    p = next_power_of_2(n_cols)
    if p > ROW_MAX_ELEMS // max(1, int(streams)):
        return "chunked"
    return "rows" if p < 4096 else "row"


def rows_per_tile(n_cols: int, target_elems: int = 4096) -> int:
    """Rows per tile for short rows: ``target_elems / next_power_of_2(n_cols)``, in [1, 256]."""
    return max(1, min(256, int(target_elems) // next_power_of_2(n_cols)))


def tma_rows(n_cols: int, row_stride: int, dtype_bytes: int) -> bool:
    """Whether row tiles of a 2-D array can move by TMA: a padded row of at least 16 bytes, a row of a
    multiple of 16 bytes and a row stride that is a multiple of 16 bytes (single rows need no stride).
    Otherwise tileiras falls back to plain loads, where the latency hint does nothing (and ``LAT=10``
    made tileiras unroll tiny-row kernels into 10-40 s compiles that spill), so the spaces drop it, and
    stores must not be allowed TMA: rows of one element (a ``(M, 1)`` array) and rows whose bytes are not
    a multiple of 16 inside a 16-byte row stride were written past their end by TMA stores."""
    b = int(dtype_bytes)
    return (next_power_of_2(n_cols) * b >= 16 and (int(n_cols) * b) % 16 == 0
            and (int(row_stride) * b) % 16 == 0)


def rowwise_space(n_cols: int, dtype_bytes: int = 2, *, streams: int = 1, tma: bool = True) -> Space:
    """Space of a persistent row-reduction kernel (norms, softmax) over rows of ``n_cols`` elements.

    Parameters: ``TM`` (rows per tile), ``CHUNK`` (0: the whole padded row is one tile; else the
    column chunk of the two-pass variant), ``LAT``, ``STORE_TMA`` and the hints ``occupancy`` and
    ``num_worker_warps``. ``streams`` is the number of row tiles a block holds at once (2 for a
    fused residual add), which tightens the register rule. ``tma=False`` (see :func:`tma_rows`, or
    rows shorter than 16 bytes) keeps only the knobs that matter for plain loads, and plain stores.

    * rows of 4096 to ``16384 / streams`` padded elements: one row per tile, occupancy {1, 2, 4} where
      the registers allow, ``LAT`` {0, 10}, ``STORE_TMA`` {False, True}: 4-12 configs; the widest rows
      also try 8 worker warps.
    * shorter rows (``TM`` rows per tile): :func:`short_rows_space`.
    * longer rows: :func:`chunked_row_space`.
    """
    if int(n_cols) < 1:
        raise ValueError(f"rowwise_space: n_cols must be >= 1, got {n_cols}")
    tma = bool(tma) and next_power_of_2(n_cols) * int(dtype_bytes) >= 16
    p = next_power_of_2(n_cols)
    if row_regime(n_cols, streams) == "chunked":
        if tma:
            return chunked_row_space(n_cols, streams=streams)
        # plain loads: chunks of 2048-4096 at occupancy <= 2 (occupancy 4 spilled in the probe)
        return chunked_row_space(n_cols, streams=streams, chunks=(2048, 4096), lat=(0,), store_tma=(False,),
                                 occupancies=(1, 2))
    if row_regime(n_cols, streams) == "rows":
        return short_rows_space(n_cols, streams=streams, tma=tma)
    tm = rows_per_tile(n_cols)
    tile = tm * p
    occ = [o for o in (1, 2, 4) if fits_registers(tile, o, streams)] or [1]
    occ_ampere = [o for o in (2, 4, 8) if fits_registers(tile, o, streams)] or occ
    params: dict[str, Any] = dict(
        TM=[tm],
        CHUNK=[0],
        occupancy=per_arch(sm_80=occ_ampere, default=occ),
        LAT=[0, 10] if tma else [0],
        STORE_TMA=[False, True] if tma else [False],
    )
    baseline: dict[str, Any] = dict(TM=tm, CHUNK=0, occupancy=occ[min(1, len(occ) - 1)], LAT=0, STORE_TMA=tma)
    if p * max(1, int(streams)) >= ROW_MAX_ELEMS:  # one very wide row per block: try 2 consumer warpgroups
        params["num_worker_warps"] = [4, 8]
        baseline["num_worker_warps"] = 4
    elif not tma:  # plain loads: the block size is a knob too (as in elementwise_space)
        params["num_worker_warps"] = [4, 8]
        baseline["num_worker_warps"] = 4
    return Space(**params, baseline=baseline)


def short_rows_space(n_cols: int, *, streams: int = 1, tma: bool = True) -> Space:
    """Space of a row-reduction kernel over rows shorter than 4096 padded elements, ``TM`` rows per tile.

    ``TM`` in {1, 2, 4} x :func:`rows_per_tile` (at most 256 rows, at most ``ROW_MAX_ELEMS`` values per
    tile) x ``occupancy`` {2, 4, 8, 16}, pairs keeping ``TM`` rows times the occupancy and ``streams``
    within :data:`SHORT_ROWS_VALUES_PER_SM`, occupancy 8 and 16 only for tiles of at most
    :data:`SHORT_ROWS_HIGH_OCCUPANCY_TILE` values (larger tiles spilled there in the H200 probe,
    ``benchmarks/probe_rows.py``); ``GRID_FRAC`` 1 (the persistent grid) or :data:`SHORT_ROWS_GRID_ALL`
    (in practice one block per row block: the hardware balances the blocks over the SMs); ``LAT`` 0;
    ``STORE_TMA`` {False, True}. ``tma=False``: plain stores (``STORE_TMA`` False), 4 or 8 worker warps and
    occupancy 2-4. About 16-32 configs.
    Baseline: ``rows_per_tile`` rows at occupancy 2 on the persistent grid."""
    p = next_power_of_2(n_cols)
    tm = rows_per_tile(n_cols)
    lanes = max(1, int(streams))
    tms = sorted({t for t in (tm, 2 * tm, 4 * tm) if t <= 256 and t * p <= ROW_MAX_ELEMS})
    occs = (2, 4, 8, 16) if tma else (2, 4)

    def pair_ok(t: int, o: int) -> bool:
        return t * p * o * lanes <= SHORT_ROWS_VALUES_PER_SM and (o <= 4 or t * p <= SHORT_ROWS_HIGH_OCCUPANCY_TILE)

    pairs = [(t, o) for t in tms for o in occs if pair_ok(t, o)] or [(tms[0], 2)]
    allowed = set(pairs)
    params: dict[str, Any] = dict(TM=sorted({t for t, _ in pairs}), CHUNK=[0],
                                  occupancy=sorted({o for _, o in pairs}), LAT=[0],
                                  STORE_TMA=[False, True] if tma else [False],
                                  GRID_FRAC=[1.0, SHORT_ROWS_GRID_ALL])
    first = (tm, 2) if (tm, 2) in allowed else pairs[0]
    baseline: dict[str, Any] = dict(TM=first[0], CHUNK=0, occupancy=first[1], LAT=0, STORE_TMA=tma, GRID_FRAC=1.0)
    if not tma:  # plain loads: the block size is a knob too (as in elementwise_space)
        params["num_worker_warps"] = [4, 8]
        baseline["num_worker_warps"] = 4
    return Space(**params, constraints={"rows_in_flight": lambda c: (c.TM, c.occupancy) in allowed},
                 baseline=baseline)


def chunked_row_space(n_cols: int, *, streams: int = 1, chunks: Sequence[int] = (4096, 8192),
                      grid_fracs: Sequence[float] = (1.0,), lat: Sequence[int] = (0, 10),
                      store_tma: Sequence[bool] = (False,), occupancies: Sequence[int] = (1, 2, 4),
                      values_per_sm: int = FP32_VALUES_PER_SM, worker_warps: Sequence[int] = ()) -> Space:
    """Space of a two-pass (or online) kernel that walks long rows in ``CHUNK``-column pieces.

    Pass 1 reduces over the chunks, pass 2 reloads them (L2 hits while ``blocks * row bytes`` is
    below the L2 size) and writes. ``CHUNK`` x ``occupancy`` pairs with at most ``values_per_sm``
    chunk values per SM (5 with the defaults), times ``LAT``, ``GRID_FRAC`` (the persistent grid is
    ``GRID_FRAC * num_SMs * occupancy`` blocks: fewer rows in flight keep pass-2 reloads in L2) and,
    when given, ``num_worker_warps``.
    """
    del n_cols
    pairs = [(c, o) for c in chunks for o in occupancies if fits_registers(c, o, streams, values_per_sm)]
    occ = sorted({o for _, o in pairs})
    first = pairs[0]
    params: dict[str, Any] = dict(TM=[1], CHUNK=list(chunks), occupancy=occ, LAT=list(lat),
                                  STORE_TMA=list(store_tma), GRID_FRAC=[float(g) for g in grid_fracs])
    baseline: dict[str, Any] = dict(TM=1, CHUNK=first[0], occupancy=first[1], LAT=lat[0], STORE_TMA=store_tma[0],
                                    GRID_FRAC=float(grid_fracs[-1]))
    if worker_warps:
        params["num_worker_warps"] = list(worker_warps)
        baseline["num_worker_warps"] = worker_warps[0]
    return Space(**params, constraints={"regs_fit": lambda c: [c.CHUNK, c.occupancy] in [list(p) for p in pairs]},
                 baseline=baseline)


def elementwise_space(*, streams: int = 2) -> Space:
    """Space of a persistent elementwise kernel over 2-D tiles (gated activations).

    Probed on sm_90 (cubin resources and SASS): tileiras compiles a reduction-free streaming loop
    to vectorized ``LDG.128``/``STG.128`` without TMA or warp specialization, so the load latency
    hint and ``allow_tma`` change nothing there (identical SASS) and are not searched. What moves
    the bandwidth is how many blocks and bytes each SM has in flight: ``TILE`` (elements per tile)
    x ``occupancy`` x ``num_worker_warps``. On the H200 (``benchmarks/results/h200/probe_memory.json.gz``,
    36 configs per shape) the best SwiGLU/GeGLU configs ran 4096-element tiles at occupancy 8-16
    with 4 warps, 15-20% faster than occupancy <= 4 (the grid is then effectively not persistent),
    although those cubins spill a few bytes per thread; kept: 8-32 elements per thread and
    8192-65536 elements per SM, 16 configs.
    """
    del streams  # the probed bounds already assume two input tiles (gate and up)

    def in_flight(c: Any) -> bool:
        per_thread = c.TILE // (32 * c.num_worker_warps)
        return 8 <= per_thread <= 32 and 8192 <= c.TILE * c.occupancy <= 65536

    return Space(
        TILE=[1024, 2048, 4096, 8192],
        occupancy=[4, 8, 16],
        num_worker_warps=[4, 8],
        LAT=[0],
        STORE_TMA=[True],
        constraints={"in_flight": in_flight},
        baseline=dict(TILE=4096, occupancy=8, num_worker_warps=4, LAT=0, STORE_TMA=True),
    )


#: (CHUNK, occupancy) pairs of the cross-entropy loss space with ``PREFETCH`` (two chunks in registers
#: per block): from one 16384-column chunk per block (few rows: each block streams long rows alone) to
#: 2048-column chunks at occupancy 16, at most 65536 values per SM in registers
CE_LOSS_PREFETCH_PAIRS = ((16384, 1), (16384, 2), (8192, 1), (8192, 2), (8192, 4), (4096, 4), (2048, 16))
#: pairs without ``PREFETCH``: 4096 columns at occupancy 8 (more blocks in flight instead of a second
#: chunk; prefetching there spills or loses occupancy)
CE_LOSS_PAIRS = ((4096, 8),)


def cross_entropy_loss_triples() -> frozenset[tuple[int, int, bool]]:
    """The cross-entropy loss space's ``(CHUNK, occupancy, PREFETCH)`` triples."""
    return frozenset({(c, o, True) for c, o in CE_LOSS_PREFETCH_PAIRS} | {(c, o, False) for c, o in CE_LOSS_PAIRS})


def cross_entropy_space(pass_: str = "loss") -> Space:
    """Space of the library's one-launch cross-entropy kernel (``tiletune.kernels.cross_entropy_op``):
    rows walked in ``CHUNK``-column pieces with plain loads (``LAT=10``), ``PREFETCH`` loading the next
    chunk before the current one is reduced.

    * ``"loss"`` (one read of the logits): the :func:`cross_entropy_loss_triples`, 8 configs.
      ``benchmarks/probe_ce_tail.py`` timed these and more on the H200 (12 pairs, with and without
      ``PREFETCH``): the configs kept hold each probed shape's best or come within a few percent of it.
    * ``"grad"`` (the row read twice, the gradient written): chunks {8192, 16384} at occupancy 2, 4 or
      8 worker warps, plain gradient stores, with ``PREFETCH``: 4 configs. ``probe_ce_tail.py --grad``
      timed each of these pairs on the H200 with and without ``PREFETCH`` and with TMA stores: the
      kept configs hold every probed shape's best, ``PREFETCH`` beat its absence and plain stores beat
      TMA stores in every pair. The full grid (``GRID_FRAC`` 1) beat 0.25 and 0.5 of it in every
      probed pair, so fewer rows in flight is not searched.
    """
    if pass_ == "loss":
        allowed = cross_entropy_loss_triples()
        return Space(TM=[1], CHUNK=sorted({c for c, _, _ in allowed}), occupancy=sorted({o for _, o, _ in allowed}),
                     LAT=[10], STORE_TMA=[False], GRID_FRAC=[1.0], PREFETCH=[False, True],
                     constraints={"triples": lambda c: (c.CHUNK, c.occupancy, bool(c.PREFETCH)) in allowed},
                     baseline=dict(TM=1, CHUNK=8192, occupancy=4, LAT=10, STORE_TMA=False, GRID_FRAC=1.0,
                                   PREFETCH=True))
    if pass_ == "grad":
        return Space(TM=[1], CHUNK=[8192, 16384], occupancy=[2], LAT=[10], STORE_TMA=[False], GRID_FRAC=[1.0],
                     num_worker_warps=[4, 8], PREFETCH=[True],
                     baseline=dict(TM=1, CHUNK=8192, occupancy=2, LAT=10, STORE_TMA=False, GRID_FRAC=1.0,
                                   num_worker_warps=4, PREFETCH=True))
    raise ValueError(f"cross_entropy_space: pass_ must be 'loss' or 'grad', got {pass_!r}")


def rope_space(heads_elems: int) -> Space:
    """Space of the in-place RoPE kernel: ``TS`` positions per tile x occupancy x worker warps.

    ``heads_elems`` is the padded size of one half of one position's heads (``heads * half_dim``,
    both rounded up to powers of two); a q tile holds both halves of ``TS`` positions, i.e.
    ``V = 2 * TS * heads_elems`` values. Like :func:`elementwise_space` (the kernel has no
    reduction, tileiras streams it with vectorized plain loads and stores), the knobs are the
    bytes in flight and their spread over threads: 16-32 values per thread, 4096-16384 values per
    SM, and registers by :func:`thread_regs_fit` (relaxed for very wide heads, where one position
    alone is bigger). At most 12 configs.
    """
    he = max(1, int(heads_elems))

    def combos(lo_thread: int, hi_thread: int, lo_sm: int, hi_sm: int) -> list[list[int]]:
        out = []
        for t in (1, 2, 4, 8, 16, 32, 64):
            v = 2 * t * he
            for w in (4, 8):
                for o in (1, 2, 4):
                    per_thread = v // (32 * w)
                    if (lo_thread <= per_thread <= hi_thread and lo_sm <= v * o <= hi_sm
                            and thread_regs_fit(per_thread, o, 32 * w)):
                        out.append([t, o, w])
        return out

    picked = combos(16, 32, 4096, 16384) or combos(1, 64, 1, max(16384, 2 * he)) or [[1, 1, 8]]
    picked = picked[:12]
    ts = sorted({c[0] for c in picked})
    occ = sorted({c[1] for c in picked})
    nww = sorted({c[2] for c in picked})
    base = picked[len(picked) // 2]

    def in_flight(c: Any) -> bool:
        return [c.TS, c.occupancy, c.num_worker_warps] in picked

    return Space(
        TS=ts,
        occupancy=occ,
        num_worker_warps=nww,
        STORE_TMA=[True],
        constraints={"in_flight": in_flight},
        baseline=dict(TS=base[0], occupancy=base[1], num_worker_warps=base[2], STORE_TMA=True),
    )


# --------------------------------------------------------------------------------------------
# matmul (tensor-core GEMM) template
# --------------------------------------------------------------------------------------------


def acc_fits(cfg: Any) -> bool:
    """``TM * TN * occupancy <= 256 * 128``: the co-resident fp32 accumulators fit in registers."""
    return cfg.TM * cfg.TN * cfg.occupancy <= 256 * 128


def warps_fit(cfg: Any) -> bool:
    """256x128 / 128x256 accumulators need two consumer warpgroups (``num_worker_warps=8``)."""
    return cfg.TM * cfg.TN < 256 * 128 or cfg.num_worker_warps == 8


def stage_fits(elem_bytes: int) -> Any:
    """Constraint: one ``A`` + ``B`` stage of ``elem_bytes``-byte elements is at most 48 KiB."""

    def fits(cfg: Any) -> bool:
        return (cfg.TM + cfg.TN) * cfg.TK * elem_bytes <= 49152

    fits.__doc__ = f"One A + B stage of {elem_bytes}-byte elements is at most 48 KiB."
    return fits


def _library_shape(elem_bytes: int) -> Any:
    """Two consumer warpgroups only for tiles of at least 128x128, and the deepest K tile
    (``256 // elem_bytes``) only for tiles with ``TM + TN <= 192``."""
    deepest = 256 // elem_bytes

    def shape_ok(cfg: Any) -> bool:
        if cfg.num_worker_warps == 8 and not (cfg.TM >= 128 and cfg.TN >= 128):
            return False
        return not (cfg.TK >= deepest and cfg.TM + cfg.TN > 192)

    shape_ok.__doc__ = _library_shape.__doc__
    return shape_ok


def matmul_shape(elem_bytes: int = 2) -> Any:
    """Constraint of the matmul template: two consumer warpgroups only for tiles of at least 128x128,
    and the deepest K tile (``256 // elem_bytes``) only for tiles with ``TM + TN <= 192``."""
    return _library_shape(elem_bytes)


def matmul_params(elem_bytes: int = 2) -> dict[str, list[int]]:
    """Parameters of the matmul template for inputs of ``elem_bytes`` bytes (2: bf16/fp16, 4: fp32 as
    tf32, 1: fp8): output tiles ``TM`` x ``TN`` in {64, 128, 256}, K depth ``TK`` in
    ``{64, 128, 256} // elem_bytes`` (same bytes per stage), swizzle band ``GROUP_M`` 8, no latency
    hint (``LAT`` 0), ``occupancy`` 1-2 and ``num_worker_warps`` 4 / 8 (one or two consumer
    warpgroups). The exhaustive H200 recording of the wider space (GROUP_M 8/16, LAT 0/2/4/8; 512
    configs, ``benchmarks/spaces/h200_gemm_bf16_4096.json.gz``) puts the best config without GROUP_M
    16 or a latency hint within 0.3% of the best of all (a hint does rescue some individual configs,
    e.g. 128x128x32 at occupancy 2: 191 us with ``LAT`` 4, 1056 us without, but never the leaders).
    No ``num_ctas``: on the H200 (``probe_gemm_clusters.json``) 2-CTA clusters of the leading configs were
    correct but slower than the same configs without, so the template leaves cuTile's default."""
    if elem_bytes not in (1, 2, 4):
        raise ValueError(f"matmul template: elem_bytes must be 1, 2 or 4, got {elem_bytes!r}")
    return dict(
        TM=[64, 128, 256],
        TN=[64, 128, 256],
        TK=[64 // elem_bytes, 128 // elem_bytes, 256 // elem_bytes],
        GROUP_M=[8],
        LAT=[0],
        occupancy=[1, 2],
        num_worker_warps=[4, 8],
    )


def matmul_baseline(elem_bytes: int = 2) -> dict[str, int]:
    """The template's hand-picked config: 128x256 tiles, two consumer warpgroups, 128 bytes of K."""
    return dict(TM=128, TN=256, TK=128 // elem_bytes, GROUP_M=8, LAT=0, occupancy=1, num_worker_warps=8)


def matmul_constraints(elem_bytes: int = 2) -> dict[str, Any]:
    """The template's constraints: ``stage_fits`` (one A + B stage <= 48 KiB), ``acc_fits``,
    ``warps_fit`` and ``library_shape`` (see :func:`_library_shape`)."""
    return {"stage_fits": stage_fits(elem_bytes), "acc_fits": acc_fits, "warps_fit": warps_fit,
            "library_shape": _library_shape(elem_bytes)}


def matmul_space(elem_bytes: int = 2) -> Space:
    """Tensor-core GEMM space for inputs of ``elem_bytes`` bytes: 38 configurations (see
    :func:`matmul_params`, :func:`matmul_constraints`)."""
    return Space(**matmul_params(elem_bytes), constraints=matmul_constraints(elem_bytes),
                 baseline=matmul_baseline(elem_bytes))

