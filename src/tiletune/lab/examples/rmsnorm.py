"""``tiletune.lab.examples.rmsnorm``: an autotuned persistent RMSNorm (occupancy: 4 configs).

A benchmark fixture, not a library op: the RMSNorm of ``tiletune demo`` and of the tuning-speed
benchmark. Its op name is the library's (``"tiletune.rms_norm"``, kept so recorded results still
match) but its space differs; the library RMSNorm is :func:`tiletune.kernels.rms_norm`
(:mod:`tiletune.kernels.norms`).
"""

from __future__ import annotations

import functools
from typing import Any

from tiletune.devices.backends.base import Launch
from tiletune.op.tuned_op import autotune
from tiletune.space.spaces import Space
from tiletune.devices.verify import derived_tolerances
from tiletune.lab.examples.rmsnorm_kernels import RMSNORM_BASELINE, RMSNORM_SPACE_PARAMS, next_power_of_2, rmsnorm_kernel

#: The 4-config space: occupancy in {1, 2, 4, 8} (also sets the persistent grid size).
RMSNORM_SPACE = Space(**RMSNORM_SPACE_PARAMS, baseline=RMSNORM_BASELINE)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    import torch

    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def _reference(x: Any, w: Any, y: Any, eps: float) -> Any:
    xf = x.float()
    return (xf * (xf.pow(2).mean(dim=-1, keepdim=True) + eps).rsqrt() * w.float()).to(y.dtype)


def _tolerance(x: Any, *_: Any) -> dict:
    """Products with float32 row statistics (a sum of ``N`` squares), rounded once."""
    return derived_tolerances(length=x.shape[-1])


@autotune(RMSNORM_SPACE, reference=_reference, writes=["y"], name="tiletune.rms_norm", tolerance=_tolerance)
def rms_norm_into(cfg: Any, x: Any, w: Any, y: Any, eps: float) -> Launch:
    """Launch plan: ``y = x * rsqrt(mean(x^2, -1) + eps) * w`` for 2-D ``x`` and ``y``."""
    m = x.shape[0]
    grid = (max(1, min(m, _sm_count(x.get_device()) * cfg.occupancy)),)
    return Launch(rmsnorm_kernel, grid, (x, w, y, eps, next_power_of_2(x.shape[1])))


def rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    """RMSNorm over the last dimension of a CUDA tensor (any leading shape), autotuned."""
    import torch

    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise TypeError("rms_norm expects torch tensors")
    if x.dim() < 1 or weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"rms_norm: weight of shape {tuple(weight.shape)} does not match x {tuple(x.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"rms_norm supports bfloat16, float16 and float32, got {x.dtype}")
    if not x.is_cuda or x.device != weight.device:
        raise ValueError(f"rms_norm expects x and weight on one CUDA device, got {x.device} and {weight.device}")
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(x2)
    rms_norm_into(x2, weight.contiguous(), y, float(eps))
    return y.view(x.shape)
