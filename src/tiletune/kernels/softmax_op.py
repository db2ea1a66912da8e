"""Autotuned row softmax in cuTile.

Public op::

    y = softmax(x, dim=-1)   # like torch.softmax(x, dim), float32 math, output in x's dtype

``x``: CUDA tensor of bfloat16, float16 or float32, any shape. The reduction runs over the last
dimension in place; another ``dim`` is moved last first (a copy), like a user would.

Kernel: persistent (``num_SMs * occupancy`` blocks over row blocks). Rows of up to 16384 padded
elements are one tile (``TM`` short rows per tile; zero-padded TMA loads, the padding set to
``-inf`` in registers): max, ``exp2`` of
the scaled difference, sum, one reciprocal, store. Longer rows use the online two-pass form: pass 1
keeps a running max and a running sum rescaled on every new max, pass 2 reloads each chunk (L2
hits while the rows in flight fit in L2) and writes ``exp(x - max) / sum``. The space comes from
:func:`tiletune.space.templates.rowwise_space` (occupancy, load latency hint, TMA or plain stores,
rows per tile or chunk width).
"""

from __future__ import annotations


import math
from typing import Any, Hashable

import cuda.tile as ct

from tiletune.devices.backends.base import Launch
from tiletune.kernels.fastcall import custom_op_route, fast_op
from tiletune.space.spaces import Space
from tiletune.space.templates import ROW_MAX_ELEMS, next_power_of_2, rowwise_space
from tiletune.kernels.library_op import LibraryOp
from tiletune.kernels._membound import Prepared, as_rows, check_device, check_float, int64_twin, needs_int64, persistent_grid
from tiletune.kernels._membound import rows_bucketed
from tiletune.kernels._tile_ops import load_zero_padded as _ld
from tiletune.devices.verify import derived_tolerances, exp_range

__all__ = ["SOFTMAX", "prepare_softmax", "softmax", "softmax_plan", "softmax_reference"]

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
LOG2E = 1.4426950408889634



def softmax_kernel_fn(X, Y, TM: ConstInt, TN: ConstInt, CHUNKED: ConstBool, EVEN: ConstBool, LAT: ConstInt,
                      STORE_TMA: ConstBool):
    """``Y = exp(X - max) / sum(exp(X - max))`` over the rows of a 2-D ``X`` (persistent grid).

    Loads are zero-padded (a ``-inf`` padding mode would rule out TMA); unless ``EVEN`` (every
    tile is full: ``N`` is a multiple of ``TN``) the padding columns are set to ``-inf`` in
    registers.
    """
    M = X.shape[0]
    N = X.shape[1]
    num_rb = ct.cdiv(M, TM)
    cols = ct.arange(TN, dtype=ct.int32).reshape((1, TN))
    if CHUNKED:
        nch = ct.cdiv(N, TN)
        for rb in range(ct.bid(0), num_rb, ct.num_blocks(0)):
            m = ct.full((TM, 1), -math.inf, dtype=ct.float32)
            s = ct.zeros((TM, 1), dtype=ct.float32)
            for c in range(nch):
                x = _ld(X, (rb, c), (TM, TN), LAT).astype(ct.float32)
                if not EVEN:
                    x = ct.where(cols + c * TN < N, x, -math.inf)
                m_new = ct.maximum(m, ct.max(x, axis=1, keepdims=True))
                e = ct.exp2((x - m_new) * LOG2E, flush_to_zero=True)
                s = s * ct.exp2((m - m_new) * LOG2E, flush_to_zero=True) + ct.sum(e, axis=1, keepdims=True)
                m = m_new
            inv = 1.0 / s
            for c in range(nch):
                x = _ld(X, (rb, c), (TM, TN), LAT).astype(ct.float32)
                e = ct.exp2((x - m) * LOG2E, flush_to_zero=True)
                ct.store(Y, (rb, c), (e * inv).astype(Y.dtype), allow_tma=STORE_TMA)
    else:
        for rb in range(ct.bid(0), num_rb, ct.num_blocks(0)):
            x = _ld(X, (rb, 0), (TM, TN), LAT).astype(ct.float32)
            if not EVEN:
                x = ct.where(cols < N, x, -math.inf)
            m = ct.max(x, axis=1, keepdims=True)
            e = ct.exp2((x - m) * LOG2E, flush_to_zero=True)
            inv = 1.0 / ct.sum(e, axis=1, keepdims=True)
            ct.store(Y, (rb, 0), (e * inv).astype(Y.dtype), allow_tma=STORE_TMA)


softmax_kernel = ct.kernel(softmax_kernel_fn)
softmax_kernel_i64 = int64_twin(softmax_kernel_fn, ["X", "Y"])


def _space_for(regime: Hashable) -> Space:
    row, tma = regime
    return rowwise_space(ROW_MAX_ELEMS * 2 if row == "chunked" else int(row), tma=tma)


def softmax_reference(x: Any, y: Any) -> Any:
    """Torch reference: float32 softmax over the last dimension, cast to ``y.dtype``."""
    return x.float().softmax(dim=-1).to(y.dtype)


def softmax_plan(cfg: Any, x: Any, y: Any) -> Launch:
    """Launch plan: row softmax of a 2-D ``x`` into ``y``."""
    m, n = x.shape
    if int(cfg.CHUNK) > 0:
        tm, tn, chunked = 1, int(cfg.CHUNK), True
    else:
        tm, tn, chunked = int(cfg.TM), next_power_of_2(n), False
    grid = persistent_grid(-(-m // tm), x.get_device(), cfg.occupancy, cfg.get("GRID_FRAC", 1.0))
    kernel = softmax_kernel_i64 if needs_int64(x, y) else softmax_kernel
    return Launch(kernel, grid, (x, y, tm, tn, chunked, n % tn == 0, cfg.LAT, cfg.STORE_TMA))


def softmax_tolerance(x: Any, y: Any) -> dict:
    """Quotients of exponentials, no cancellation: two ulps relative and no absolute slack tied to
    the output's scale (a probability of 1e-5 must be right relative to itself), plus the float32
    error of a row sum of ``N`` terms and of ``exp`` over the row's spread of logits."""
    return derived_tolerances(length=x.shape[-1], atol_ulps=0.0, exp_range=exp_range(x))


SOFTMAX = LibraryOp("tiletune.softmax", _space_for, softmax_plan, reference=softmax_reference, writes=["y"],
                    tolerance=softmax_tolerance, buckets=rows_bucketed("x", "y"), fallback="reference")


def prepare_softmax(x: Any) -> Prepared:
    """Views, output and regime of a last-dimension :func:`softmax` (no checks, no launch)."""
    import torch

    from tiletune.kernels.norms import row_key

    x2 = as_rows(x)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    return Prepared(SOFTMAX, row_key(x2), (x2, y), y.view(x.shape))


@fast_op(route=custom_op_route("softmax"))
def softmax(x: Any, dim: int = -1) -> Any:
    """Softmax along ``dim`` (default: the last), like ``torch.softmax(x, dim)``.

    Args:
        x: CUDA tensor of bfloat16, float16 or float32 with at least one dimension.
        dim: the dimension to normalize.

    Returns:
        a new tensor shaped and typed like ``x``.
    """
    op = "softmax"
    check_float(op, "x", x)
    if x.dim() < 1:
        raise ValueError(f"{op}(): the input must have at least one dimension, got a 0-d tensor")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"{op}(): dim {dim!r} is out of range for a {x.dim()}-d input")
    check_device(op, x=x)
    dim = dim % x.dim()
    if dim != x.dim() - 1:
        return softmax(x.movedim(dim, -1), -1).movedim(-1, dim)
    if x.numel() == 0:
        return x.new_empty(x.shape)
    return prepare_softmax(x).run()

