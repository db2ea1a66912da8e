"""Problem keys: what makes two calls of a tuned op the "same problem".

The default key of a call holds, for each tensor argument, its shape, strides and dtype, plus the
device index; ints (numpy ints too), bools, strings, None and dtypes by value; floats and other
objects by type only (a learning
rate or an epsilon must not trigger a re-tune). The in-memory key is a tuple built for speed on
every call; the stored key (:func:`args_key_json`) is its JSON form, built only on a cache miss,
with the device recorded separately by name and compute capability.
"""

from __future__ import annotations

from typing import Any, Sequence

_SCALARS = (int, bool, str, type(None))
_tensor_types: set[type] = set()
_other_types: set[type] = set()
#: Argument types keyed by value (dtypes too, registered when torch is importable). Floats and
#: any other object are keyed by type only.
_BY_VALUE: set[type] = set(_SCALARS)
try:  # pragma: no branch
    import numpy as _np

    _BY_VALUE.update({_np.int8, _np.int16, _np.int32, _np.int64, _np.uint8, _np.uint16, _np.uint32, _np.uint64,
                      _np.bool_})
except ImportError:  # pragma: no cover
    pass


_torch: Any = None  # torch once it is imported in full (cached: the hot path reads it for free)


def imported_torch() -> Any:
    """The ``torch`` module if some thread imported it, else None; never a half-imported one.

    A module enters ``sys.modules`` before its code has run: while another thread (the worker
    prestart, the cuTile prewarm) is still importing torch, ``sys.modules["torch"]`` has no
    ``dtype`` yet. Then ``import torch`` waits on the import lock until that thread is done.
    Does not import torch when nobody has.
    """
    global _torch
    if _torch is not None:
        return _torch
    import sys

    mod = sys.modules.get("torch")
    if mod is None:
        return None
    if getattr(getattr(mod, "__spec__", None), "_initializing", False):
        try:
            import torch as mod  # blocks until the importing thread finishes
        except ImportError:  # that thread's import failed
            return None
        if getattr(getattr(mod, "__spec__", None), "_initializing", False):
            return None  # this very thread is importing torch (re-entered): not usable yet
    _torch = mod
    return mod


def _register_torch() -> None:
    torch = imported_torch()
    if torch is not None:
        _BY_VALUE.add(torch.dtype)


def is_tensor(a: Any) -> bool:
    """True for torch tensors and any object with ``shape``, ``dtype``, ``stride`` and ``get_device``."""
    t = type(a)
    if t in _tensor_types:
        return True
    if t in _other_types:
        return False
    _register_torch()
    ok = all(hasattr(a, n) for n in ("shape", "dtype", "stride", "get_device"))
    (_tensor_types if ok else _other_types).add(t)
    return ok


def default_key(args: Sequence[Any]) -> tuple:
    """The default problem key of a call's arguments (hashable; cheap enough for every call).

    A flat tuple: for each tensor its shape, strides and dtype; scalars by value (or type); and last
    the device index of the first tensor (the arguments of one launch share a device).
    """
    out: tuple = ()
    device = None
    for a in args:
        t = type(a)
        if t in _tensor_types or (t not in _BY_VALUE and t is not float and is_tensor(a)):
            out += (a.shape, a.stride(), a.dtype)
            if device is None:
                device = a.get_device()
        elif t in _BY_VALUE:
            out += (a,)
        else:
            out += (t,)
    return out + (device,)


def _dtype_name(dtype: Any) -> str:
    s = str(dtype)
    return s[6:] if s.startswith("torch.") else s


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(out))


def tensor_json(a: Any) -> dict[str, Any]:
    """Stored form of one tensor argument: shape, dtype, contiguity (and strides when not contiguous)."""
    shape = tuple(int(x) for x in a.shape)
    strides = tuple(int(x) for x in a.stride())
    d: dict[str, Any] = {"shape": list(shape), "dtype": _dtype_name(a.dtype)}
    contiguous = all(st == ex for st, ex, n in zip(strides, _contiguous_strides(shape), shape) if n > 1)
    d["contiguous"] = contiguous
    if not contiguous:
        d["strides"] = list(strides)
    return d


def args_key_json(args: Sequence[Any]) -> list[Any]:
    """JSON form of the default key of these arguments."""
    out: list[Any] = []
    for a in args:
        t = type(a)
        if t in _SCALARS:
            out.append(a)
        elif t is not float and t not in _BY_VALUE and is_tensor(a):
            out.append(tensor_json(a))
        elif t in _BY_VALUE:
            out.append({"value": a.item() if hasattr(a, "item") else _dtype_name(a), "type": t.__name__})
        else:
            out.append({"type": t.__name__})
    return out


def key_to_json(key: Any) -> Any:
    """JSON form of a user key. Raises TypeError for parts that cannot be stored."""
    if isinstance(key, type):
        return {"type": key.__name__}
    if isinstance(key, (tuple, list)):
        return [key_to_json(k) for k in key]
    if isinstance(key, dict):
        return {str(k): key_to_json(v) for k, v in key.items()}
    if key is None or isinstance(key, (bool, int, float, str)):
        return key
    if is_tensor(key):
        return tensor_json(key)
    s = str(key)
    if s.startswith("torch."):  # a dtype returned by a user key function
        return _dtype_name(key)
    raise TypeError(
        f"a key part of type {type(key).__name__} ({key!r}) cannot be stored; "
        "a key function must return ints, floats, strings, bools, None, dtypes or tuples of them"
    )
