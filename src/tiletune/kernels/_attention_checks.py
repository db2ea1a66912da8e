"""Argument checks shared by :func:`~tiletune.kernels.attention` and :func:`~tiletune.kernels.decode_attention`.

Each check raises one clear line naming the op (``op``: how the message starts, e.g. ``"attention"``
or ``"decode_attention()"``) and the arguments as the caller passed them (``names``: the names of
``q``, ``k``, ``v``). The ops call them in their own order (the decode op checks its query count
between the head dim and the cache shapes, and the device last), so each keeps the error it raised
first for a call with several faults.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["aligned_operand", "check_cuda_device", "check_head_dim", "check_kv_shapes", "check_qkv_tensors",
           "softmax_scale"]

Names = tuple[str, str, str]


def check_qkv_tensors(op: str, names: Names, q: Any, k: Any, v: Any) -> None:
    """``q``, ``k``, ``v`` are 4-D torch tensors of one dtype, bfloat16 or float16."""
    import torch

    for name, t in zip(names, (q, k, v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{op}: {name} must be 4-D (B, H, S, D), got shape {tuple(t.shape)}")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"{op} supports bfloat16 and float16, got {names[0]} of dtype {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"{op}: {', '.join(names)} must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


def check_cuda_device(op: str, names: Names, q: Any, k: Any, v: Any) -> None:
    """``q``, ``k``, ``v`` are on one CUDA device."""
    if not q.is_cuda or k.device != q.device or v.device != q.device:
        raise ValueError(f"{op} expects {', '.join(names)} on one CUDA device, got {q.device}, {k.device}, {v.device}")


def check_head_dim(op: str, q: Any, head_dims: tuple[int, ...]) -> None:
    """``q``'s head dim (its last) is one the kernels support."""
    d = q.shape[-1]
    if d not in head_dims:
        raise ValueError(f"{op}: head dim {d} is not supported (supported: {head_dims})")


def check_kv_shapes(op: str, names: Names, q: Any, k: Any, v: Any) -> None:
    """``k`` and ``v`` have one shape ``(B, Hkv, S, D)`` matching ``q``'s batch and head dim, and
    ``q``'s head count is a multiple of ``Hkv`` (grouped-query attention)."""
    _, kn, vn = names
    if k.shape != v.shape:
        raise ValueError(f"{op}: {kn} and {vn} shapes differ: {tuple(k.shape)} vs {tuple(v.shape)}")
    bsz, h, _, d = q.shape
    if k.shape[0] != bsz or k.shape[3] != d:
        raise ValueError(f"{op}: {kn}/{vn} of shape {tuple(k.shape)} do not match {names[0]} of shape "
                         f"{tuple(q.shape)} (batch and head dim must agree)")
    hkv = k.shape[1]
    if hkv < 1 or h % hkv:
        raise ValueError(f"{op}: query heads ({h}) must be a multiple of key/value heads ({hkv})")


def softmax_scale(op: str, scale: float | None, head_dim: int) -> float:
    """The softmax scale: ``1 / sqrt(head_dim)`` for None, else ``scale`` if a positive finite number."""
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0.0):
        raise ValueError(f"{op}: scale must be a positive finite number, got {scale}")
    return scale


def aligned_operand(t: Any) -> Any:
    """``t`` itself if its last dim is unit-stride and other strides are 16-byte multiples, else a copy."""
    if t.stride(-1) == 1 and all((s * t.element_size()) % 16 == 0 for s in t.stride()[:-1]):
        return t
    return t.contiguous()
