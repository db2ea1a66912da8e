"""Argument checks shared by :func:`~tiletune.kernels.attention`, :func:`~tiletune.kernels.decode_attention`
and :func:`~tiletune.kernels.kv_cache_append`, and by their fake (meta) implementations in
:mod:`tiletune.kernels.torch_ops`.

Each check raises one clear line naming the op (``op``: how the message starts, e.g. ``"attention"``
or ``"decode_attention()"``) and the arguments as the caller passed them (``names``: the names of
``q``, ``k``, ``v``). The ops call them in their own order (the decode op checks its query count
between the head dim and the cache shapes, and the device last), so each keeps the error it raised
first for a call with several faults.

Checks a fake implementation shares take ``require``: :func:`require` in eager calls, and
``torch._check_with`` (same arguments) while tracing, so a condition on a symbolic size is checked
without specializing the graph on it.
"""

from __future__ import annotations

import math
from typing import Any, Callable

__all__ = ["aligned_operand", "check_append", "check_cuda_device", "check_head_dim", "check_kv_shapes",
           "check_lengths", "check_qkv_tensors", "require", "softmax_scale"]

Names = tuple[str, str, str]
#: ``require(error_type, condition, message)``: :func:`require`, or ``torch._check_with`` while tracing.
Require = Callable[[type, Any, Callable[[], str]], None]


def require(error_type: type, cond: Any, message: Callable[[], str]) -> None:
    """Raise ``error_type(message())`` unless ``cond`` (``torch._check_with``'s arguments, in its order)."""
    if not cond:
        raise error_type(message())


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


def check_lengths(op: str, lengths: Any, bsz: int, cap: int, sq: int, causal: bool, device: Any = None,
                  require: Require = require) -> None:
    """Decode attention's ``lengths``: an int in ``[1, cap]`` (at least ``sq`` with ``causal``) or a ``(B,)``
    int32/int64 tensor (on ``device`` unless it is None); None passes."""
    import torch

    if lengths is None:
        return
    if isinstance(lengths, bool):
        raise TypeError(f"{op}: lengths must be an int, an integer tensor or None, got bool")
    if isinstance(lengths, (int, torch.SymInt)):
        require(ValueError, (1 <= lengths) & (lengths <= cap),
                lambda: f"{op}: lengths={lengths} is outside [1, capacity {cap}]")
        if causal:
            require(ValueError, lengths >= sq, lambda: f"{op}: lengths={lengths} is shorter than the {sq} causal query tokens")
        return
    if not isinstance(lengths, torch.Tensor):
        raise TypeError(f"{op}: lengths must be an int, an integer tensor or None, got {type(lengths).__name__}")
    if lengths.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: lengths must be int32 or int64, got {lengths.dtype}")
    require(ValueError, lengths.dim() == 1 and lengths.shape[0] == bsz,
            lambda: f"{op}: lengths must have shape ({bsz},), got {tuple(lengths.shape)}")
    if device is not None and lengths.device != device:
        raise ValueError(f"{op}: lengths is on {lengths.device}, the caches on {device}")


def check_append(op: str, cache_k: Any, cache_v: Any, k: Any, v: Any, start: Any, devices: bool = True,
                 require: Require = require) -> None:
    """``kv_cache_append``'s arguments: 4-D tensors, caches of one shape, rows of one shape fitting them,
    one dtype, ``start`` an int whose ``T`` positions fit the capacity or a ``(B,)`` int32/int64 tensor;
    with ``devices`` all on the caches' device."""
    import torch

    for name, t in (("cache_k", cache_k), ("cache_v", cache_v), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{op}: '{name}' must be 4-D (B, Hkv, S, D), got shape {tuple(t.shape)}")
    require(ValueError, cache_k.shape == cache_v.shape,
            lambda: f"{op}: cache_k {tuple(cache_k.shape)} and cache_v {tuple(cache_v.shape)} differ")
    require(ValueError, k.shape == v.shape, lambda: f"{op}: k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    bsz, hkv, cap, d = cache_k.shape
    t = k.shape[2]
    require(ValueError, (k.shape[0] == bsz) & (k.shape[1] == hkv) & (k.shape[3] == d),
            lambda: f"{op}: k/v of shape {tuple(k.shape)} do not fit caches of shape {tuple(cache_k.shape)}")
    for name, x in (("k", k), ("v", v), ("cache_v", cache_v)):
        if x.dtype != cache_k.dtype:
            raise TypeError(f"{op}: '{name}' has dtype {x.dtype}, the cache {cache_k.dtype}")
        if devices and x.device != cache_k.device:
            raise ValueError(f"{op}: '{name}' is on {x.device}, cache_k on {cache_k.device}")
    if isinstance(start, bool):
        raise TypeError(f"{op}: start must be an int or an integer tensor, got bool")
    if isinstance(start, (int, torch.SymInt)):
        require(ValueError, (start >= 0) & (start + t <= cap),
                lambda: f"{op}: positions [{start}, {start + t}) do not fit the capacity {cap}")
        return
    if not isinstance(start, torch.Tensor) or start.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: start must be an int or an int32/int64 tensor, got "
                        f"{getattr(start, 'dtype', type(start).__name__)}")
    require(ValueError, start.dim() == 1 and start.shape[0] == bsz,
            lambda: f"{op}: a start tensor must have shape ({bsz},), got {tuple(start.shape)}")
    if devices and start.device != cache_k.device:
        raise ValueError(f"{op}: start is on {start.device}, the caches on {cache_k.device}")
