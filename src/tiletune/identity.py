"""Kernel identity: a hash of the source of the launch plan and of the kernels it launches.

Editing either changes the identity, so stored tuning results of the old code are never reused.
"""

from __future__ import annotations

import hashlib
import inspect
import textwrap
import weakref
from typing import Any, Callable, Iterable


_SOURCES: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def function_source(fn: Callable[..., Any]) -> str:
    """Source text of a function (dedented); falls back to its bytecode and constants. Remembered per
    function object (every new key of an op hashes its plan's and kernels' sources)."""
    fn = inspect.unwrap(fn)
    try:
        return _SOURCES[fn]
    except (KeyError, TypeError):  # not seen yet, or not weakly referable: computed
        pass
    src = _function_source(fn)
    try:
        _SOURCES[fn] = src
    except TypeError:
        pass
    return src


def _function_source(fn: Callable[..., Any]) -> str:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is None:
            return repr(fn)
        return f"{code.co_name}:{code.co_code.hex()}:{code.co_consts!r}"


def kernel_identity(plan: Callable[..., Any], kernel_sources: Iterable[str]) -> str:
    """A 24-hex-digit identity of a launch plan and the sources of the kernels it launches."""
    h = hashlib.sha256()
    h.update(function_source(plan).encode())
    for src in sorted(set(kernel_sources)):
        h.update(b"\0kernel\0")
        h.update(src.encode())
    return h.hexdigest()[:24]
