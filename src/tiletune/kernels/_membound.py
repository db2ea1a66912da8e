"""Shared pieces of the memory-bound op library (norms, softmax, gated activations, RoPE, CE).

* :class:`Prepared`: one call of a :class:`~tiletune.kernels.library_op.LibraryOp` (the op, its
  regime, the launch arguments and the result), ready to run.
* :func:`int64_twin`: a second cuTile kernel from the same Python function whose big array
  parameters index with 64-bit integers (``ct.IndexedWithInt64``), used when an array spans more
  than 2**31 elements.
* argument checks that speak like torch, and helpers to view ``[..., N]`` tensors as 2-D rows.

Every check that can fail on a CPU tensor (types, dtypes, shapes) runs before the device check, so
``tests/test_kernels_api.py`` exercises them without a GPU.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable, Hashable, Iterable, NamedTuple

from tiletune.kernels.library_op import LibraryOp

__all__ = [
    "FLOAT_DTYPES",
    "INDEX_LIMIT",
    "Prepared",
    "as_rows",
    "check_device",
    "check_float",
    "check_tensor",
    "int64_twin",
    "needs_int64",
    "persistent_grid",
    "sm_count",
]

#: Largest element offset a default (int32-indexed) cuTile array may reach.
INDEX_LIMIT = 2**31 - 1


def _torch() -> Any:
    import torch

    return torch


def float_dtypes() -> tuple[Any, ...]:
    torch = _torch()
    return (torch.bfloat16, torch.float16, torch.float32)


FLOAT_DTYPES = ("bfloat16", "float16", "float32")


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    """Number of SMs of a CUDA device (cached)."""
    return int(_torch().cuda.get_device_properties(device_index).multi_processor_count)


def rows_bucketed(*names: str, dim: int = 0) -> Any:
    """Buckets of a row-wise family: dimension ``dim`` (rows, tokens) of each named argument rounded up
    to a power of two, so a new token count inside a tuned bucket reuses its winner."""
    from tiletune.buckets import Buckets

    return Buckets({n: {dim: "pow2"} for n in names})


def persistent_grid(units: int, device_index: int, occupancy: int, frac: float = 1.0) -> tuple[int]:
    """``(min(units, max(1, round(num_SMs * occupancy * frac))),)``, at least one block."""
    blocks = max(1, int(round(sm_count(device_index) * int(occupancy) * float(frac))))
    return (max(1, min(int(units), blocks)),)


# ---------------------------------------------------------------------------------------------
# 64-bit indexing
# ---------------------------------------------------------------------------------------------


def max_offset(t: Any) -> int:
    """Largest element offset of a strided tensor view (0 for empty tensors)."""
    if t.numel() == 0:
        return 0
    return int(sum((int(s) - 1) * abs(int(st)) for s, st in zip(t.shape, t.stride())))


def needs_int64(*tensors: Any) -> bool:
    """True if any tensor reaches an element offset beyond :data:`INDEX_LIMIT`."""
    return any(max_offset(t) >= INDEX_LIMIT for t in tensors if t is not None)


def int64_twin(fn: Callable[..., Any], arrays: Iterable[str], suffix: str = "_i64") -> Any:
    """A cuTile kernel of ``fn`` whose parameters named in ``arrays`` are ``ct.IndexedWithInt64``.

    cuTile reads parameter annotations with ``typing.get_type_hints``, so a copy of the function
    object with extended ``__annotations__`` compiles to a kernel that computes shapes, strides and
    offsets of those arrays in 64 bits; the body (and its source, which identifies the kernel) is
    shared with the 32-bit kernel.
    """
    import cuda.tile as ct

    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    twin.__kwdefaults__ = fn.__kwdefaults__
    twin.__qualname__ = fn.__qualname__ + suffix
    twin.__module__ = fn.__module__
    twin.__doc__ = fn.__doc__
    ann = dict(getattr(fn, "__annotations__", {}))
    for name in arrays:
        ann[name] = ct.IndexedWithInt64
    twin.__annotations__ = ann
    return ct.kernel(twin)


# ---------------------------------------------------------------------------------------------
# One call of a library op
# ---------------------------------------------------------------------------------------------


class Prepared(NamedTuple):
    """One call of a library op, ready to launch: ``family.op(regime)(*args)``, then return ``result``
    (``family`` is the :class:`~tiletune.kernels.library_op.LibraryOp`, one tuned op per regime).

    Each op splits into checks and a ``prepare_*`` function that builds views and outputs; tools
    call ``prepare_*`` on meta tensors to see the plan (``tools/compile_check_memory.py``), and
    benchmarks to read the chosen configuration.
    """

    family: LibraryOp
    regime: Hashable
    args: tuple
    result: Any

    def run(self) -> Any:
        self.family.op(self.regime)(*self.args)
        return self.result

    def config(self) -> Any:
        """The configuration this call uses (tunes first if the problem is new)."""
        return self.family.op(self.regime).config_for(*self.args)


# ---------------------------------------------------------------------------------------------
# Argument checks (torch-like messages)
# ---------------------------------------------------------------------------------------------


def check_tensor(op: str, name: str, t: Any) -> None:
    """TypeError unless ``t`` is a torch tensor."""
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}(): argument '{name}' must be a torch.Tensor, got {type(t).__name__}")


def check_float(op: str, name: str, t: Any, like: Any = None) -> None:
    """TypeError unless ``t`` is bfloat16, float16 or float32 (and, with ``like``, of its dtype)."""
    check_tensor(op, name, t)
    if t.dtype not in float_dtypes():
        raise TypeError(
            f"{op}(): '{name}' must be bfloat16, float16 or float32, got {str(t.dtype).replace('torch.', '')}"
        )
    if like is not None and t.dtype != like.dtype:
        raise TypeError(
            f"{op}(): '{name}' has dtype {str(t.dtype).replace('torch.', '')} but the input has "
            f"{str(like.dtype).replace('torch.', '')}; they must match"
        )


def check_device(op: str, **tensors: Any) -> int:
    """ValueError unless every given tensor is on one CUDA device; returns its index."""
    present = {k: v for k, v in tensors.items() if v is not None}
    bad = {k: v.device for k, v in present.items() if v.device.type != "cuda"}
    if bad:
        where = ", ".join(f"'{k}' on {d}" for k, d in bad.items())
        raise ValueError(f"{op}(): expected CUDA tensors (cuTile kernels run on NVIDIA GPUs), got {where}")
    devices = {v.device for v in present.values()}
    if len(devices) > 1:
        where = ", ".join(f"'{k}' on {v.device}" for k, v in present.items())
        raise ValueError(f"{op}(): expected all tensors on the same device, got {where}")
    return next(iter(devices)).index if devices else 0


def as_rows(x: Any) -> Any:
    """``x`` as a 2-D ``(rows, x.shape[-1])`` view with unit column stride (copies only if needed).

    Rows may be strided (e.g. ``big[:, :n]``): the kernels read them through their row stride.
    """
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if x2.shape[0] > 1 and x2.stride(0) < n:  # overlapping or broadcast rows
        x2 = x2.contiguous()
    return x2
