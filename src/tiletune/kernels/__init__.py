"""tiletune's library of autotuned cuTile ops (needs ``cuda-tile``; runs on an NVIDIA GPU).

Each op allocates its output, accepts torch tensors and tunes itself through :func:`tiletune.autotune`
the first time it sees a problem key.
"""

from __future__ import annotations

from typing import Any

__all__ = ["matmul", "rms_norm"]


def __getattr__(name: str) -> Any:  # imported lazily: cuda.tile is an optional dependency
    if name == "matmul":
        from .matmul import matmul

        return matmul
    if name == "rms_norm":
        from .rmsnorm import rms_norm

        return rms_norm
    raise AttributeError(f"module 'tiletune.kernels' has no attribute {name!r}")
