"""The shape checks of :func:`tiletune.kernels.apply_rope_`, shared by the eager op and its torch expression
under ``torch.compile`` (:mod:`tiletune.kernels.lowerings`). Shapes and layout only: nothing here reads a
data pointer, so Dynamo traces it."""

from __future__ import annotations

from typing import Any


def check_rope_shapes(op: str, q: Any, k: Any, cos: Any, sin: Any, layout: str) -> tuple[Any, Any, int]:
    """``(q4, k4, r)``: ``q`` and ``k`` as ``(B, S, H, D)`` views and the rotary dimension; ValueError naming
    ``op`` for a layout, rank or shape the op does not take."""
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"{op}(): layout must be 'bshd' or 'bhsd', got {layout!r}")
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"{op}(): q and k must be 4-D ({'B, S, H, D' if layout == 'bshd' else 'B, H, S, D'}), "
                         f"got {tuple(q.shape)} and {tuple(k.shape)}")
    q4, k4 = (q, k) if layout == "bshd" else (q.transpose(1, 2), k.transpose(1, 2))
    bsz, s, _, d = q4.shape
    if k4.shape[0] != bsz or k4.shape[1] != s or k4.shape[3] != d:
        raise ValueError(f"{op}(): q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch, sequence or head "
                         f"dimension (layout {layout!r})")
    if tuple(cos.shape) != tuple(sin.shape):
        raise ValueError(f"{op}(): cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must have one shape")
    if cos.dim() not in (2, 3) or cos.shape[-2] != s or (cos.dim() == 3 and cos.shape[0] not in (1, bsz)):
        raise ValueError(f"{op}(): cos/sin must be (S, R) or (1 or B, S, R) with S={s}, B={bsz}; got "
                         f"{tuple(cos.shape)}")
    r = cos.shape[-1]
    if r < 2 or r % 2 or r > d:
        raise ValueError(f"{op}(): the rotary dimension (last of cos/sin) must be even and <= head_dim {d}, got {r}")
    return q4, k4, r
