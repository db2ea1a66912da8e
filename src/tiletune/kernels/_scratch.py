"""Memory the library keeps across calls (placeholders, split-K and reduction scratch), and when it may keep it.

A buffer allocated while the current stream belongs to a CUDA graph, or to the warm-up of
``torch.compile(mode="reduce-overhead")`` (its CUDA-graph trees run the function on a side stream
whose allocations go to the graph's private pool), must not outlive the call: kept in a module
cache it becomes an allocation of that pool that no graph output accounts for, which the graph
trees refuse ("tensors in the cudagraph pool not tracked as outputs"). So memory is kept only when
allocated on the device's default stream outside any capture; elsewhere the call gets a fresh buffer
of its own (and the library op stays on its slow path there, see :func:`tiletune.kernels.fastcall.fast_op`).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from tiletune.kernels.fastcall import constant_tensor

_placeholders: dict[tuple, Any] = {}
_reductions: dict[tuple, tuple[Any, Any]] = {}
_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _default_raw_stream(device_index: int) -> int:
    import torch

    return int(torch.cuda.default_stream(device_index).cuda_stream)


def current_raw_stream(device_index: int) -> int:
    """The raw handle of the current stream of a CUDA device (no stream object made)."""
    import torch

    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get is not None:
        return int(get(device_index))
    return int(torch.cuda.current_stream(device_index).cuda_stream)


def keepable(device: Any) -> bool:
    """Whether memory allocated now on ``device`` (a ``torch.device``) may be kept across calls: always
    on the CPU (the host-side tests); on a GPU only on its default stream, outside graph capture."""
    if getattr(device, "type", "cuda") != "cuda":
        return True
    import torch

    dev = device.index if device.index is not None else torch.cuda.current_device()
    if current_raw_stream(dev) != _default_raw_stream(dev):
        return False
    return not torch.cuda.is_current_stream_capturing()


def placeholder(device: Any, dtype: Any, shape: tuple[int, ...]) -> Any:
    """An uninitialised tensor standing for an argument a kernel never reads or writes (its constant
    switches it off): cached per (device, dtype, shape) and registered as a constant kernel argument
    (:func:`tiletune.kernels.fastcall.constant_tensor`) where :func:`keepable`, a fresh one otherwise."""
    key = (device, dtype, tuple(shape))
    ph = _placeholders.get(key)
    if ph is not None:
        return ph
    import torch

    if not keepable(device):
        return torch.empty(shape, dtype=dtype, device=device)
    return _kept(_placeholders, key, lambda: constant_tensor(torch.empty(shape, dtype=dtype, device=device)))


def reduction_scratch(device: Any, nparts: int) -> tuple[Any, Any]:
    """``(parts, counter)`` for a one-launch reduction across blocks: ``parts`` a float32 ``(nparts,)``
    buffer each block stores its partial result to, ``counter`` one int32 zero the blocks count their
    arrivals on (the last block to arrive sums the parts and puts the counter back to zero).

    Kept per (device, ``nparts``) and registered as constant kernel arguments where :func:`keepable`
    (so on the default stream only: launches there run in order and may share them; recipes that keep
    them must check :func:`on_default_stream`); a call elsewhere (a side stream, a CUDA graph capture)
    gets buffers of its own: an uninitialised ``parts`` and a zeroed counter."""
    import torch

    if not keepable(device):
        return (torch.empty((nparts,), dtype=torch.float32, device=device),
                torch.zeros((1,), dtype=torch.int32, device=device))
    return _kept(_reductions, (device, int(nparts)), lambda: (
        constant_tensor(torch.zeros((nparts,), dtype=torch.float32, device=device)),
        constant_tensor(torch.zeros((1,), dtype=torch.int32, device=device))))


def _kept(cache: dict, key: tuple, make: Callable[[], Any]) -> Any:
    """``cache[key]``, made by ``make()`` on first use (under the module lock, so two threads never
    keep two different buffers for one key)."""
    hit = cache.get(key)
    if hit is None:
        with _lock:
            hit = cache.get(key)
            if hit is None:
                hit = cache[key] = make()
    return hit


def on_default_stream(a: Any, *_: Any) -> bool:
    """Precheck of a library op whose recipes keep :func:`reduction_scratch` memory: True when the
    current stream of ``a``'s device is its default stream (always for a tensor not on a GPU)."""
    dev = a.get_device()
    return dev < 0 or current_raw_stream(dev) == _default_raw_stream(dev)
