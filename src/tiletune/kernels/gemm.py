"""``tiletune.kernels.gemm``: an autotuned persistent GEMM (tiles, swizzle, latency hints, hints).

``gemm(a, b)`` is ``a @ b`` for 2-D CUDA tensors (bfloat16 / float16; float32 runs as tf32) with
fp32 accumulation, on the persistent kernel of :mod:`tiletune.kernels.gemm_kernels`, tuned over
:data:`GEMM_SPACE` (512 configurations).  ``a`` or ``b`` may be the transpose of a contiguous
tensor (``x.t()``, e.g. ``x @ W.t()`` of a linear layer): such an operand is read in transposed
order instead of being copied.
"""

from __future__ import annotations

import functools
from typing import Any

from ..backends.base import Launch
from ..dispatch import autotune
from ..space import Space
from .gemm_kernels import (
    GEMM_BASELINE,
    GEMM_CONSTRAINTS,
    GEMM_SPACE_PARAMS,
    gemm_args,
    gemm_grid,
    gemm_kernel,
)

__all__ = ["GEMM_SPACE", "gemm", "gemm_into"]

#: TM, TN, TK x GROUP_M x LAT x occupancy x num_worker_warps, 512 configs after the constraints.
GEMM_SPACE = Space(**GEMM_SPACE_PARAMS, constraints=GEMM_CONSTRAINTS, baseline=GEMM_BASELINE)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    import torch

    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def _reference(a: Any, b: Any, c: Any, trans_a: bool, trans_b: bool) -> Any:
    af = a.float().t() if trans_a else a.float()
    bf = b.float().t() if trans_b else b.float()
    return (af @ bf).to(c.dtype)


@autotune(GEMM_SPACE, reference=_reference, writes=["c"], name="tiletune.gemm")
def gemm_into(cfg: Any, a: Any, b: Any, c: Any, trans_a: bool, trans_b: bool) -> Launch:
    """Launch plan: ``c = op(a) @ op(b)`` with ``op(x) = x.t()`` when the flag is set.

    ``a`` is ``M x K`` row-major (``K x M`` with ``trans_a``), ``b`` is ``K x N`` (``N x K`` with
    ``trans_b``), ``c`` is ``M x N`` row-major.
    """
    grid = gemm_grid(cfg, c.shape[0], c.shape[1], _sm_count(c.get_device()))
    return Launch(gemm_kernel, grid, gemm_args(cfg, a, b, c, trans_a, trans_b))


def _row_major(t: Any) -> bool:
    """C-contiguous with 16-byte aligned rows (what the kernel's loads want)."""
    return t.is_contiguous() and (t.shape[-1] * t.element_size()) % 16 == 0


def gemm(a: Any, b: Any) -> Any:
    """``a @ b`` for 2-D CUDA tensors of one dtype (bfloat16, float16; float32 as tf32), autotuned.

    Returns a new ``M x N`` tensor of the inputs' dtype.  Transposed views of contiguous tensors
    are used as they are; other non-contiguous inputs are copied first.
    """
    import torch

    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        raise TypeError("gemm expects two torch tensors")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"gemm expects 2-D tensors, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"gemm: inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != b.dtype or a.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"gemm expects two bfloat16, float16 or float32 tensors, got {a.dtype} and {b.dtype}")
    if not (a.is_cuda and b.is_cuda) or a.device != b.device:
        raise ValueError(f"gemm expects both tensors on one CUDA device, got {a.device} and {b.device}")
    m, n = a.shape[0], b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if a.shape[1] == 0:
        return c.zero_()
    trans_a = not _row_major(a) and _row_major(a.t())
    trans_b = not _row_major(b) and _row_major(b.t())
    a_arg = a.t() if trans_a else a.contiguous()
    b_arg = b.t() if trans_b else b.contiguous()
    gemm_into(a_arg, b_arg, c, trans_a, trans_b)
    return c
