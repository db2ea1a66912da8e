"""LayerNorm forward written in cuTile, plus its tuning space: the kernel of the recorded
16384 x 4096 LayerNorm space (``benchmarks/record_spaces.py``); the library's LayerNorm is
:func:`tiletune.kernels.layer_norm` (:mod:`tiletune.kernels.norms`, its own kernel).

``y[i, :] = (x[i, :] - mean_i) / sqrt(var_i + eps) * w + b`` over the last dimension of a 2-D
``x`` (``M x N``; bfloat16, float16 or float32; all statistics in float32; biased variance like
``torch.nn.functional.layer_norm``); ``w`` and ``b`` have length ``N``; ``y`` has its own dtype
(normally ``x``'s) and must not alias ``x``.

A block handles ``ROWS`` rows at a time (one ``ROWS x TILE_N`` tile per load):

* **one chunk** (``ONE_CHUNK``, ``TILE_N >= N``): the rows are loaded once and kept in
  registers; exact two-pass statistics (``mean``, then ``sum((x - mean)^2)``), then normalized
  and stored.  Padding columns load as zeros and are masked out of the variance.
* **chunked** (``TILE_N < N``): the row is walked in ``cdiv(N, TILE_N)`` chunks twice.  Pass 1
  accumulates shifted sums ``sum(x - s)`` and ``sum((x - s)^2)`` with the shift ``s`` = the mean
  of the first chunk (the "shifted data" algorithm: no catastrophic cancellation when
  ``|mean| >> std``, since ``s`` is close to the mean); pass 2 reloads each chunk (from L2),
  normalizes and stores.  Weight and bias chunks are loaded in pass 2.

``PERSISTENT`` (constant): the block loops over row blocks ``bid, bid + num_blocks, ...`` and is
launched with ``min(cdiv(M, ROWS), NUM_SMS * occupancy)`` blocks; otherwise one row block per
block and ``cdiv(M, ROWS)`` blocks.  In the persistent one-chunk variant ``w`` and ``b`` are
loaded once per block, before the loop.  ``LATENCY`` is the ``latency=`` hint of the ``x`` loads
(0: compiler's choice).

Tuning space (:data:`LAYERNORM_SPACE_PARAMS`): ``PERSISTENT``, ``ROWS``, ``CHUNK_N`` (the chunk
width; the kernel's ``TILE_N = min(CHUNK_N, next_power_of_2(N))``), ``LATENCY`` (constants) and
the hints ``occupancy`` and ``num_worker_warps``.  :func:`regs_fit` bounds the row tile:
``ROWS * CHUNK_N <= 16384`` fp32 values, leaving 11 (ROWS, CHUNK_N) pairs x 2 x 2 x 4 x 2 = 352
configs, all of which compile for sm_90 (``tools/compile_check_all.py``).
"""

from __future__ import annotations


import cuda.tile as ct
from tiletune.space.templates import param as _param
from tiletune.space.templates import next_power_of_2

__all__ = [
    "LAYERNORM_BASELINE",
    "LAYERNORM_CONSTRAINTS",
    "LAYERNORM_SPACE_PARAMS",
    "layernorm_args",
    "layernorm_grid",
    "layernorm_hints",
    "layernorm_kernel",
    "layernorm_reference",
    "layernorm_tile_n",
    "next_power_of_2",
    "regs_fit",
]

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

#: Tuning parameters (``occupancy`` and ``num_worker_warps`` are cuTile hints, the rest constants).
LAYERNORM_SPACE_PARAMS = dict(
    PERSISTENT=[False, True],
    ROWS=[1, 2, 4, 8],
    CHUNK_N=[1024, 2048, 4096],
    LATENCY=[0, 4],
    occupancy=[1, 2, 4, 8],
    num_worker_warps=[4, 8],
)

#: Untuned default: persistent, one row per iteration, whole rows (up to 4096) in registers.
LAYERNORM_BASELINE = dict(PERSISTENT=True, ROWS=1, CHUNK_N=4096, LATENCY=0, occupancy=2, num_worker_warps=4)


def regs_fit(cfg) -> bool:
    """The fp32 row tile has at most 16384 elements: ``ROWS * CHUNK_N <= 16384``."""
    return cfg.ROWS * cfg.CHUNK_N <= 16384


#: ``Space(..., constraints=LAYERNORM_CONSTRAINTS)``.
LAYERNORM_CONSTRAINTS = {"regs_fit": regs_fit}


def _load_x(X, rb, c, ROWS, TILE_N, LATENCY):
    """The ``(ROWS, TILE_N)`` tile ``(rb, c)`` of ``X`` as float32 (zero padded)."""
    if LATENCY > 0:
        x = ct.load(X, (rb, c), shape=(ROWS, TILE_N), padding_mode=ct.PaddingMode.ZERO, latency=LATENCY)
    else:
        x = ct.load(X, (rb, c), shape=(ROWS, TILE_N), padding_mode=ct.PaddingMode.ZERO)
    return x.astype(ct.float32)


def _load_vec(W, c, TILE_N):
    """Chunk ``c`` of a length-``N`` vector as a ``(1, TILE_N)`` float32 tile (zero padded)."""
    w = ct.load(W, (c,), shape=(TILE_N,), padding_mode=ct.PaddingMode.ZERO)
    return w.astype(ct.float32).reshape((1, TILE_N))


def _one_chunk_rows(X, Y, w, bias, rb, N, inv_n, eps, ROWS, TILE_N, EVEN_N, LATENCY):
    """Normalize row block ``rb`` held entirely in registers (``TILE_N >= N``)."""
    x = _load_x(X, rb, 0, ROWS, TILE_N, LATENCY)
    mean = ct.sum(x, axis=1, keepdims=True) * inv_n  # padding columns are zeros
    d = x - mean
    if not EVEN_N:
        cols = ct.arange(TILE_N, dtype=ct.int32).reshape((1, TILE_N))
        d = ct.where(cols < N, d, 0.0)
    var = ct.sum(d * d, axis=1, keepdims=True) * inv_n
    rstd = ct.rsqrt(var + eps)
    ct.store(Y, (rb, 0), (d * rstd * w + bias).astype(Y.dtype))


def _chunked_rows(X, W, Bias, Y, rb, N, inv_n, eps, ROWS, TILE_N, EVEN_N, LATENCY):
    """Normalize row block ``rb`` in ``cdiv(N, TILE_N)`` chunks (``TILE_N < N``)."""
    num_chunks = ct.cdiv(N, TILE_N)
    cols0 = ct.arange(TILE_N, dtype=ct.int32).reshape((1, TILE_N))
    # shift: the mean of the first chunk (always full, since TILE_N < N)
    x0 = _load_x(X, rb, 0, ROWS, TILE_N, LATENCY)
    shift = ct.sum(x0, axis=1, keepdims=True) * (1.0 / TILE_N)
    d0 = x0 - shift
    s1 = ct.sum(d0, axis=1, keepdims=True)
    s2 = ct.sum(d0 * d0, axis=1, keepdims=True)
    for c in range(1, num_chunks):
        d = _load_x(X, rb, c, ROWS, TILE_N, LATENCY) - shift
        if not EVEN_N:
            d = ct.where(c * TILE_N + cols0 < N, d, 0.0)
        s1 = s1 + ct.sum(d, axis=1, keepdims=True)
        s2 = s2 + ct.sum(d * d, axis=1, keepdims=True)
    dmean = s1 * inv_n
    var = ct.maximum(s2 * inv_n - dmean * dmean, 0.0)
    mean = shift + dmean
    rstd = ct.rsqrt(var + eps)
    for c in range(num_chunks):
        x = _load_x(X, rb, c, ROWS, TILE_N, LATENCY)
        y = (x - mean) * rstd * _load_vec(W, c, TILE_N) + _load_vec(Bias, c, TILE_N)
        ct.store(Y, (rb, c), y.astype(Y.dtype))  # columns past N are dropped


@ct.kernel
def layernorm_kernel(X, W, Bias, Y, eps,
                     ROWS: ConstInt,
                     TILE_N: ConstInt,
                     ONE_CHUNK: ConstBool,
                     EVEN_N: ConstBool,
                     PERSISTENT: ConstBool,
                     LATENCY: ConstInt):
    """LayerNorm over the last dimension, ``ROWS`` rows per tile.

    Args:
        X: ``M x N`` input (bfloat16 / float16 / float32).
        W, Bias: length-``N`` weight and bias.
        Y: ``M x N`` output (must not alias ``X``).
        eps (runtime float32): added to the variance.
        ROWS (constant int, power of two): rows per tile.
        TILE_N (constant int, power of two): chunk width; ``>= N`` when ``ONE_CHUNK``.
        ONE_CHUNK (constant bool): ``TILE_N >= N`` (whole rows in one tile).
        EVEN_N (constant bool): ``N % TILE_N == 0`` (no padding columns to mask).
        PERSISTENT (constant bool): loop over row blocks with stride ``num_blocks``.
        LATENCY (constant int): ``latency=`` hint of the ``x`` loads (1-10), 0 for none.

    Grid: see :func:`layernorm_grid` (any size >= 1 is correct when ``PERSISTENT``).
    """
    M = X.shape[0]
    N = X.shape[1]
    inv_n = 1.0 / N
    num_rb = ct.cdiv(M, ROWS)
    if ONE_CHUNK:
        w = _load_vec(W, 0, TILE_N)
        bias = _load_vec(Bias, 0, TILE_N)
        if PERSISTENT:
            for rb in range(ct.bid(0), num_rb, ct.num_blocks(0)):
                _one_chunk_rows(X, Y, w, bias, rb, N, inv_n, eps, ROWS, TILE_N, EVEN_N, LATENCY)
        else:
            _one_chunk_rows(X, Y, w, bias, ct.bid(0), N, inv_n, eps, ROWS, TILE_N, EVEN_N, LATENCY)
    else:
        if PERSISTENT:
            for rb in range(ct.bid(0), num_rb, ct.num_blocks(0)):
                _chunked_rows(X, W, Bias, Y, rb, N, inv_n, eps, ROWS, TILE_N, EVEN_N, LATENCY)
        else:
            _chunked_rows(X, W, Bias, Y, ct.bid(0), N, inv_n, eps, ROWS, TILE_N, EVEN_N, LATENCY)


# --------------------------------------------------------------------------------------------
# host-side helpers
# --------------------------------------------------------------------------------------------



def layernorm_tile_n(cfg, N: int) -> int:
    """The kernel's ``TILE_N`` for rows of length ``N``: ``min(CHUNK_N, next_power_of_2(N))``."""
    return min(int(_param(cfg, "CHUNK_N", 1 << 30)), next_power_of_2(N))


def layernorm_grid(cfg, M: int, num_sms: int) -> tuple[int]:
    """``(cdiv(M, ROWS),)`` blocks, capped at ``num_sms * occupancy`` when ``PERSISTENT``."""
    row_blocks = -(-int(M) // int(_param(cfg, "ROWS", 1)))
    if bool(_param(cfg, "PERSISTENT", True)):
        row_blocks = min(row_blocks, int(num_sms) * int(_param(cfg, "occupancy", 1)))
    return (max(1, row_blocks),)


def layernorm_hints(cfg) -> dict:
    """cuTile hints of a config: ``occupancy`` and ``num_worker_warps`` (when present)."""
    hints = {"occupancy": int(_param(cfg, "occupancy", 1))}
    nww = _param(cfg, "num_worker_warps")
    if nww is not None:
        hints["num_worker_warps"] = int(nww)
    return hints


def layernorm_args(cfg, x, w, b, y, eps: float) -> tuple:
    """Kernel arguments, in order: ``(x, w, b, y, eps, ROWS, TILE_N, ONE_CHUNK, EVEN_N, PERSISTENT, LATENCY)``.

    ``x`` and ``y`` are 2-D ``M x N``; ``eps`` goes as a Python float (runtime float32, changing
    it does not recompile).
    """
    n = int(x.shape[-1])
    tile_n = layernorm_tile_n(cfg, n)
    return (x, w, b, y, float(eps), int(_param(cfg, "ROWS", 1)), tile_n, tile_n >= n, n % tile_n == 0,
            bool(_param(cfg, "PERSISTENT", True)), int(_param(cfg, "LATENCY", 0)))


def layernorm_reference(x, w, b, eps: float = 1e-5):
    """Reference LayerNorm with torch: fp32 math over the last dim, result in ``x.dtype``."""
    import torch

    y = torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(), eps)
    return y.to(x.dtype)
