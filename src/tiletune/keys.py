"""Problem keys: what makes two calls of a tuned op the "same problem".

The default key of a call holds, for each tensor argument, its shape, dtype, contiguity and device
index; ints, bools, strings and None by value; floats and other objects by type only (a learning
rate or an epsilon must not trigger a re-tune). The in-memory key is a tuple built for speed; the
stored key is its JSON form (:func:`key_to_json`), with the device recorded separately by name and
compute capability.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

KeyFn = Callable[..., Any]

_SCALARS = (int, bool, str, type(None))
_tensor_types: set[type] = set()
_other_types: set[type] = set()


def is_tensor(a: Any) -> bool:
    """True for torch tensors and any object with ``shape``, ``dtype``, ``stride`` and ``is_contiguous``."""
    t = type(a)
    if t in _tensor_types:
        return True
    if t in _other_types:
        return False
    ok = all(hasattr(a, n) for n in ("shape", "dtype", "stride", "is_contiguous", "get_device"))
    (_tensor_types if ok else _other_types).add(t)
    return ok


class TensorKey(tuple):
    """Key part of one tensor argument: ``(shape, dtype, contiguous, device_index)``."""

    __slots__ = ()


def default_key(args: Sequence[Any]) -> tuple:
    """The default problem key of a call's arguments (fast; hashable)."""
    out = []
    for a in args:
        t = type(a)
        if t in _tensor_types or (t not in _SCALARS and t is not float and is_tensor(a)):
            out.append(TensorKey((a.shape, a.dtype, a.is_contiguous(), a.get_device())))
        elif t in _SCALARS:
            out.append(a)
        else:
            out.append(t)
    return tuple(out)


def key_device_index(key: tuple) -> int:
    """Device index of the first tensor in a default key (0 when there is none)."""
    for part in key:
        if type(part) is TensorKey:
            return max(int(part[3]), 0)
    return 0


def _dtype_name(dtype: Any) -> str:
    s = str(dtype)
    return s[6:] if s.startswith("torch.") else s


def key_to_json(key: Any) -> Any:
    """A JSON-able form of a key (default or user-made). Raises TypeError for unsupported parts."""
    if type(key) is TensorKey:
        shape, dtype, contiguous, _device = key
        return {"shape": [int(x) for x in shape], "dtype": _dtype_name(dtype), "contiguous": bool(contiguous)}
    if isinstance(key, type):
        return {"type": key.__name__}
    if isinstance(key, (tuple, list)):
        return [key_to_json(k) for k in key]
    if isinstance(key, dict):
        return {str(k): key_to_json(v) for k, v in key.items()}
    if key is None or isinstance(key, (bool, int, float, str)):
        return key
    if hasattr(key, "shape") and hasattr(key, "dtype"):
        return {"shape": [int(x) for x in key.shape], "dtype": _dtype_name(key.dtype)}
    s = str(key)
    if s.startswith("torch."):  # a dtype returned by a user key function
        return _dtype_name(key)
    raise TypeError(
        f"a key part of type {type(key).__name__} ({key!r}) cannot be stored; "
        "a key function must return ints, floats, strings, bools, None, dtypes or tuples of them"
    )
