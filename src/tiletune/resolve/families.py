"""Families of stored keys: what a key's structure and sizes are, and how far apart two keys of one family lie.

Two stored keys are of one *family* when they have the same structure: the same arguments, dtypes, layouts
(contiguity and the order of strides) and the same non-size values (flags, strings, dtypes, non-positive
ints). The distance between two keys of a family is the sum over their sizes (tensor dimensions and positive
ints) of ``|log2(1 + a) - log2(1 + b)|``: a neighbour twice as large in one dimension is one unit away,
whatever the dimension's scale. Used by the sources that answer a key from another key's winner: the
nearest-neighbour source (:mod:`tiletune.resolve.nearest`) and the tables' bucket answers
(:mod:`tiletune.resolve.tables`).
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any, NamedTuple, Sequence

__all__ = ["KeyFeatures", "key_features", "distance"]


class KeyFeatures(NamedTuple):
    """What :func:`neighbours` compares of a key: ``signature`` (equal: one family, sizes line up),
    ``sizes``, and ``kin``: the signature with its flags masked (the non-size values: booleans, strings,
    ``None``, non-positive ints, floats), equal for keys that differ only in such values (a causal and a
    non-causal attention of one shape)."""

    signature: str
    sizes: tuple[float, ...]
    kin: str


@functools.lru_cache(maxsize=16384)
def key_features(key_json: str) -> KeyFeatures | None:
    """The :class:`KeyFeatures` of a stored key; None for a key that is not JSON. Remembered per key
    (every miss of an op compares its key with each stored key of the op)."""
    try:
        doc = json.loads(key_json)
    except (TypeError, ValueError):
        return None
    sig: list[Any] = []
    sizes: list[float] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if "shape" in x and isinstance(x["shape"], list):
                shape = [int(s) for s in x["shape"]]
                strides = x.get("strides")
                order = None
                if isinstance(strides, list) and len(strides) == len(shape):
                    order = sorted(range(len(strides)), key=lambda i: (-int(strides[i]), i))
                sig.append(("tensor", x.get("dtype"), bool(x.get("contiguous", True)), len(shape), order,
                            sorted(k for k in x if k not in ("shape", "strides", "dtype", "contiguous"))))
                sizes.extend(float(s) for s in shape)
                for k in sorted(x):
                    if k not in ("shape", "strides", "dtype", "contiguous"):
                        walk(x[k])
                return
            sig.append(("dict", sorted(x)))
            for k in sorted(x):
                walk(x[k])
            return
        if isinstance(x, list):
            sig.append(("list", len(x)))
            for v in x:
                walk(v)
            return
        if isinstance(x, bool) or x is None or isinstance(x, str):
            sig.append(("value", x))
            return
        if isinstance(x, int):
            if x > 0:
                sig.append("size")
                sizes.append(float(x))
            else:
                sig.append(("value", x))
            return
        if isinstance(x, float):
            sig.append(("float", x))
            return
        sig.append(("other", repr(x)))

    walk(doc)
    kin = [s[0] if isinstance(s, tuple) and s[0] in ("value", "float") else s for s in sig]
    return KeyFeatures(json.dumps(sig, sort_keys=True, default=str), tuple(sizes),
                       json.dumps(kin, sort_keys=True, default=str))


def distance(a: Sequence[float], b: Sequence[float]) -> float:
    """The distance of two keys' sizes (same family): the sum of ``|log2(1+a) - log2(1+b)|``."""
    return sum(abs(math.log2(1.0 + x) - math.log2(1.0 + y)) for x, y in zip(a, b))
