"""The memory-bound library ops as torch expressions, for ``torch.compile`` to fuse.

Under ``torch.compile`` a library op becomes either one opaque node, its ``torch.ops.tiletune`` custom op
(:mod:`tiletune.kernels.torch_ops`), or the torch expression below, which Inductor compiles like any
other code of the model and fuses with its neighbours (a residual add and the norm after it, the
activation after a projection, the rotation after the split of a fused qkv output). For these ops a
fused Triton kernel does the same memory traffic as the cuTile kernel or less, and each custom-op node
costs a dispatcher call and a launch of its own on the host, which is what a decode step spends its
time on. So while compiling, :data:`FUSED_OPS` lower to these expressions unless
``TILETUNE_COMPILE_FUSE`` is false; every other op (matmul, attention, decode attention, the KV cache
append, softmax, cross-entropy) stays a custom op. Eager calls never come here.

Each function takes the public function's arguments (same names, defaults and results) and computes
what the op's torch reference computes: float32 math, the result cast to the input's dtype. The checks
are the public function's checks of shapes and values (none reads a data pointer, so Dynamo traces them
without a graph break).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from tiletune.kernels._rope_checks import check_rope_shapes

__all__ = ["FUSED_OPS", "LOWERINGS", "lowering"]


def _check_rows(op: str, x: Tensor) -> None:
    if x.dim() < 1:
        raise ValueError(f"{op}(): the input must have at least one dimension, got a 0-d tensor")


def _check_vector(op: str, name: str, v: Optional[Tensor], n: int) -> None:
    if v is not None and (v.dim() != 1 or v.shape[0] != n):
        raise ValueError(f"{op}(): '{name}' must be a 1-D tensor of {n} elements, got shape {tuple(v.shape)}")


def _rms(xf: Tensor, weight: Optional[Tensor], eps: float, dtype: torch.dtype) -> Tensor:
    out = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        out = out * weight.float()
    return out.to(dtype)


# Float defaults are written in the bodies (``eps=None``), as in torch_ops: a float that is a function
# default may become a graph input under Dynamo.


def rms_norm(x: Tensor, weight: Optional[Tensor] = None, eps: Optional[float] = None) -> Tensor:
    _check_rows("rms_norm", x)
    _check_vector("rms_norm", "weight", weight, x.shape[-1])
    return _rms(x.float(), weight, 1e-6 if eps is None else float(eps), x.dtype)


def rms_norm_residual(x: Tensor, residual: Tensor, weight: Optional[Tensor] = None,
                      eps: Optional[float] = None) -> Tuple[Tensor, Tensor]:
    _check_rows("rms_norm_residual", x)
    if tuple(residual.shape) != tuple(x.shape):
        raise ValueError(f"rms_norm_residual(): 'residual' must have the shape of 'x' {tuple(x.shape)}, "
                         f"got {tuple(residual.shape)}")
    _check_vector("rms_norm_residual", "weight", weight, x.shape[-1])
    h = (x.float() + residual.float()).to(x.dtype)
    return _rms(h.float(), weight, 1e-6 if eps is None else float(eps), x.dtype), h


def layer_norm(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               eps: Optional[float] = None) -> Tensor:
    _check_rows("layer_norm", x)
    n = x.shape[-1]
    _check_vector("layer_norm", "weight", weight, n)
    _check_vector("layer_norm", "bias", bias, n)
    out = F.layer_norm(x.float(), (n,), None if weight is None else weight.float(),
                       None if bias is None else bias.float(), 1e-5 if eps is None else float(eps))
    return out.to(x.dtype)


def _halves(op: str, x: Tensor) -> Tuple[Tensor, Tensor]:
    if x.dim() < 1 or x.shape[-1] < 2 or x.shape[-1] % 2:
        raise ValueError(f"{op}(): the last dimension must be even and >= 2 (gate and up halves), got shape "
                         f"{tuple(x.shape)}")
    h = x.shape[-1] // 2
    return x[..., :h].float(), x[..., h:].float()


def swiglu(x: Tensor) -> Tensor:
    gate, up = _halves("swiglu", x)
    return (F.silu(gate) * up).to(x.dtype)


def geglu(x: Tensor, approximate: str = "none") -> Tensor:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"geglu(): approximate must be 'none' or 'tanh', got {approximate!r}")
    gate, up = _halves("geglu", x)
    return (F.gelu(gate, approximate=approximate) * up).to(x.dtype)


def apply_rope_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, layout: str = "bshd") -> Tuple[Tensor, Tensor]:
    """Rotate ``q`` and ``k`` in place (the rotate-half convention of :func:`tiletune.kernels.apply_rope_`);
    returns ``(q, k)``."""
    q4, k4, r = check_rope_shapes("apply_rope_", q, k, cos, sin, layout)
    h = r // 2
    c = (cos if cos.dim() == 3 else cos.unsqueeze(0)).float().unsqueeze(2)  # (1 or B, S, 1, R)
    sn = (sin if sin.dim() == 3 else sin.unsqueeze(0)).float().unsqueeze(2)
    c1, c2, s1, s2 = c[..., :h], c[..., h:], sn[..., :h], sn[..., h:]
    for x in (q4, k4):
        a, b = x[..., :h].float(), x[..., h:r].float()
        x[..., :r].copy_(torch.cat((a * c1 - b * s1, b * c2 + a * s2), dim=-1).to(x.dtype))
    return q, k


#: public op -> its torch expression
LOWERINGS: Dict[str, Callable[..., Any]] = {
    "rms_norm": rms_norm,
    "rms_norm_residual": rms_norm_residual,
    "layer_norm": layer_norm,
    "swiglu": swiglu,
    "geglu": geglu,
    "apply_rope_": apply_rope_,
}
#: the ops that lower to torch expressions while compiling (unless ``TILETUNE_COMPILE_FUSE`` is false)
FUSED_OPS = tuple(LOWERINGS)


def lowering(name: str) -> Optional[Callable[..., Any]]:
    """The torch expression public op ``name`` becomes while compiling, or None when it stays its custom
    op (not one of :data:`FUSED_OPS`, or ``TILETUNE_COMPILE_FUSE`` is false). Read once per trace."""
    from tiletune import settings

    if not settings.compile_fuse():
        return None
    return LOWERINGS.get(name)
