"""Persistent RMSNorm written in cuTile, plus its tuning space (the kernel of :mod:`.rmsnorm`).

``y[i, :] = x[i, :] / sqrt(mean(x[i, :] ** 2) + eps) * w`` for a 2D ``x`` of shape ``M x N``
(bfloat16, float16 or float32; all math in float32; ``y`` has its own dtype, normally ``x``'s).

The kernel is persistent: it is launched with ``min(M, NUM_SMS * occupancy)`` blocks, and each
block walks the rows ``bid, bid + num_blocks, bid + 2 * num_blocks, ...``.  A whole row is one
``(1, TILE_N)`` tile, ``TILE_N`` being the next power of two ``>= N``; the padding columns load
as zeros (they add nothing to the sum of squares, and the mean divides by the true ``N``) and
the store drops them.  The weight row is loaded once per block, before the row loop.

Tuning space: only ``occupancy`` (a compiler hint, ``kernel.replace_hints(occupancy=...)``),
which also sets the grid size.  ``TILE_N`` is derived from the input, not tuned.
"""

from __future__ import annotations


import cuda.tile as ct
from tiletune.space.templates import param as _param
from tiletune.space.templates import next_power_of_2

__all__ = [
    "RMSNORM_BASELINE",
    "RMSNORM_SPACE_PARAMS",
    "next_power_of_2",
    "rmsnorm_args",
    "rmsnorm_grid",
    "rmsnorm_hints",
    "rmsnorm_kernel",
    "rmsnorm_reference",
]

ConstInt = ct.Constant[int]

#: Tuning parameters and their candidate values (``occupancy`` is a compiler hint).
RMSNORM_SPACE_PARAMS = dict(occupancy=[1, 2, 4, 8])

#: Untuned default.
RMSNORM_BASELINE = dict(occupancy=1)


@ct.kernel
def rmsnorm_kernel(X, W, Y, eps, TILE_N: ConstInt):
    """Persistent RMSNorm over the last dimension; one row per loop iteration.

    Args:
        X: ``M x N`` input array (bfloat16 / float16 / float32), row-major.
        W: length-``N`` weight vector.
        Y: ``M x N`` output array (may differ in dtype from ``X``; must not alias ``X``).
        eps (float, runtime float32 scalar): added to the mean of squares.
        TILE_N (constant int): power of two ``>= N``; a whole row is one tile.

    Launch with ``(min(M, NUM_SMS * occupancy),)`` blocks (see :func:`rmsnorm_grid`); any
    grid size >= 1 is correct, it only changes how many rows each block handles.
    """
    M = X.shape[0]
    N = X.shape[1]
    inv_n = 1.0 / N

    # Weight row: loaded once per block, reused for every row this block handles.
    w = ct.load(W, (0,), shape=(TILE_N,), padding_mode=ct.PaddingMode.ZERO)
    w = w.astype(ct.float32).reshape((1, TILE_N))

    for row in range(ct.bid(0), M, ct.num_blocks(0)):
        x = ct.load(X, (row, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.ZERO)
        x = x.astype(ct.float32)
        mean_sq = ct.sum(x * x, axis=1, keepdims=True) * inv_n
        rstd = ct.rsqrt(mean_sq + eps)
        ct.store(Y, (row, 0), (x * rstd * w).astype(Y.dtype))



def rmsnorm_grid(cfg, M: int, num_sms: int) -> tuple[int]:
    """Persistent grid: ``min(M, num_sms * occupancy)`` blocks (at least 1)."""
    occupancy = int(_param(cfg, "occupancy", 1))
    return (max(1, min(int(M), int(num_sms) * occupancy)),)


def rmsnorm_hints(cfg) -> dict:
    """Compiler hints for a config: ``{"occupancy": cfg.occupancy}``.

    Use ``rmsnorm_kernel.replace_hints(**rmsnorm_hints(cfg))`` (and cache the result), with the
    same ``occupancy`` that :func:`rmsnorm_grid` used to size the grid.
    """
    return {"occupancy": int(_param(cfg, "occupancy", 1))}


def rmsnorm_args(cfg, x, w, y, eps) -> tuple:
    """Kernel arguments for ``rmsnorm_kernel``, in order: ``(x, w, y, eps, TILE_N)``.

    ``eps`` is passed as a Python float (a runtime float32 scalar, so changing it does not
    recompile); ``TILE_N = next_power_of_2(x.shape[-1])``.  ``cfg`` is unused (occupancy is a
    hint, not an argument) but kept for a uniform ``args_fn(cfg, ...)`` interface.
    """
    return (x, w, y, float(eps), next_power_of_2(x.shape[-1]))


def rmsnorm_reference(x, w, eps):
    """Reference RMSNorm with torch: fp32 math over the last dim, result cast to ``x.dtype``."""
    xf = x.float()
    rstd = (xf.pow(2).mean(dim=-1, keepdim=True) + eps).rsqrt()
    return (xf * rstd * w.float()).to(x.dtype)
