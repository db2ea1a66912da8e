"""tiletune's library of autotuned cuTile ops (needs ``cuda-tile``; runs on an NVIDIA GPU).

Each op allocates its output, accepts torch tensors and tunes itself through :func:`tiletune.autotune`
the first time it sees a problem key.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "apply_rope_",
    "attention",
    "cross_entropy",
    "geglu",
    "layer_norm",
    "matmul",
    "rms_norm",
    "rms_norm_residual",
    "softmax",
    "swiglu",
]

# memory-bound ops (issue 5): public name -> module that defines it
_MEMORY_OPS = {
    "rms_norm": "norms",
    "rms_norm_residual": "norms",
    "layer_norm": "norms",
    "softmax": "softmax_op",
    "swiglu": "glu",
    "geglu": "glu",
    "apply_rope_": "rope",
    "cross_entropy": "cross_entropy_op",
}

# KV-cache decode ops (issue 20): importable as tiletune.kernels.decode_attention / kv_cache_append; not
# in __all__ yet (benchmarks/host_cost.py covers exactly __all__); torch.compile traces them as the custom ops
# tiletune::decode_attention / kv_cache_append (torch_ops)
_DECODE_OPS = {"decode_attention": "decode_attention_op", "kv_cache_append": "decode_attention_op"}

# fused GEMM epilogues (issue 20): importable as tiletune.kernels.matmul_swiglu, not in __all__ either; not
# used by any other library path until tests/test_gpu_gemm_glu.py has passed on a GPU
_FUSED_OPS = {"matmul_swiglu": "gemm_glu"}


def __getattr__(name: str) -> Any:  # imported lazily: cuda.tile is an optional dependency
    if name in ("matmul", "attention"):
        import importlib

        fn = getattr(importlib.import_module(".gemm" if name == "matmul" else ".attention_op", __name__), name)
        globals()[name] = fn
        return fn
    if name in _MEMORY_OPS or name in _DECODE_OPS or name in _FUSED_OPS:
        import importlib

        module = _MEMORY_OPS.get(name) or _DECODE_OPS.get(name) or _FUSED_OPS[name]
        fn = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = fn
        return fn
    raise AttributeError(f"module 'tiletune.kernels' has no attribute {name!r}")
