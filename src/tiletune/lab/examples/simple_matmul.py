"""``tiletune.lab.examples.simple_matmul``: the first autotuned bf16/fp16 matmul (32 configs: tile sizes x occupancy).

One output tile per block (not persistent). A benchmark fixture, not a library op: it is the kernel
of the tuning-speed, warm-start, determinism, fault-matrix and profile benchmarks and of ``tiletune
demo``; the library GEMM is :func:`tiletune.kernels.matmul` (:mod:`tiletune.kernels.gemm`).
"""

from __future__ import annotations

from typing import Any

from tiletune.devices.backends.base import Launch
from tiletune.op.tuned_op import autotune
from tiletune.space.spaces import Space
from tiletune.devices.verify import derived_tolerances
from tiletune.lab.examples.matmul_kernels import MATMUL_BASELINE, MATMUL_GROUP_M, MATMUL_SPACE_PARAMS, matmul_kernel, tile_fits

#: The 32-config space: TM, TN in {64, 128, 256} (not both 256), TK in {32, 64}, occupancy in {1, 2}.
MATMUL_SPACE = Space(**MATMUL_SPACE_PARAMS, constraints={"tile_fits": tile_fits}, baseline=MATMUL_BASELINE)


def _reference(a: Any, b: Any, c: Any) -> Any:
    return (a.float() @ b.float()).to(c.dtype)


def _tolerance(a: Any, b: Any, c: Any) -> dict:
    """float32 accumulation over ``K``, rounded once; 2 ulps of the output's RMS for sums near zero."""
    return derived_tolerances(length=a.shape[1], atol_ulps=2.0)


@autotune(MATMUL_SPACE, reference=_reference, writes=["c"], name="tiletune.matmul", tolerance=_tolerance)
def matmul_into(cfg: Any, a: Any, b: Any, c: Any) -> Launch:
    """Launch plan: ``c = a @ b`` for row-major 2-D ``a`` (MxK), ``b`` (KxN) and ``c`` (MxN)."""
    tm, tn = cfg.TM, cfg.TN
    grid = (((a.shape[0] + tm - 1) // tm) * ((b.shape[1] + tn - 1) // tn),)
    return Launch(matmul_kernel, grid, (a, b, c, tm, tn, cfg.TK, MATMUL_GROUP_M))


def matmul(a: Any, b: Any) -> Any:
    """``a @ b`` for 2-D CUDA tensors of bfloat16 or float16 (fp32 accumulation), autotuned."""
    import torch

    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        raise TypeError("matmul expects two torch tensors")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"matmul expects 2-D tensors, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != b.dtype or a.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"matmul expects two bfloat16 or two float16 tensors, got {a.dtype} and {b.dtype}")
    if not (a.is_cuda and b.is_cuda) or a.device != b.device:
        raise ValueError(f"matmul expects both tensors on one CUDA device, got {a.device} and {b.device}")
    a, b = a.contiguous(), b.contiguous()
    c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    matmul_into(a, b, c)
    return c
