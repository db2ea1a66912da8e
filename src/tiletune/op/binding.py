"""Keyword arguments bound to a function's positional parameters, fast enough for every call.

``inspect.Signature.bind`` costs several microseconds; a tuned op or a library op called with
keywords on every step cannot pay that. :func:`positional_binder` precomputes parameter positions
and defaults and binds with one dict lookup per keyword; anything unusual (an unknown or repeated
name, a missing required argument, keyword-only parameters) goes to ``inspect`` for its exact error
or result.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

__all__ = ["positional_binder"]

_EMPTY = inspect.Parameter.empty
_IN_ORDER: Any = object()  # a fill pattern: the keyword values, in the order given, are the next positions


def positional_binder(signature: inspect.Signature) -> Callable[[tuple[Any, ...], Mapping[str, Any]], tuple]:
    """``bind(args, kwargs) -> (positional args, remaining keyword-only args)``.

    The positional tuple runs up to the last parameter given; defaults fill the gaps before it. The
    second item is empty unless the signature has keyword-only parameters that were passed. Raises
    TypeError like a call would.
    """
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    simple = len(positional) == len(params) and not any(p.kind is p.POSITIONAL_ONLY for p in params)
    pos = {p.name: i for i, p in enumerate(positional)}
    defaults = [p.default for p in positional]
    required = max((i + 1 for i, d in enumerate(defaults) if d is _EMPTY), default=0)

    def slow(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple:
        bound = signature.bind(*args, **kwargs)
        if bound.kwargs:
            bound.apply_defaults()
        return tuple(bound.args), dict(bound.kwargs)

    if not simple:
        return slow

    def general(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple:
        n = len(args)
        try:
            given = [pos[k] for k in kwargs]
        except KeyError:
            return slow(args, kwargs)  # an unknown name: inspect's error
        if min(given) < n:
            return slow(args, kwargs)  # given twice: inspect's error
        out = list(args)
        for i in range(n, max(given) + 1):
            name = positional[i].name
            if name in kwargs:
                out.append(kwargs[name])
            elif defaults[i] is not _EMPTY:
                out.append(defaults[i])
            else:
                return slow(args, kwargs)  # a required argument is missing: inspect's error
        if len(out) < required:
            return slow(args, kwargs)  # a required argument after the last one given is missing
        return tuple(out), {}

    # The outcome's shape depends only on how many positional arguments came and which names: per
    # pattern, the names (or defaults) filling the positions after the positional ones, learnt from
    # the first call with that pattern (None: the pattern takes the general path, e.g. an error).
    fills: dict[tuple, tuple | None] = {}

    def learn(n: int, names: tuple[str, ...]) -> tuple | None:
        given = [pos.get(k) for k in names]
        if (not given or None in given or min(given) < n or len(set(given)) != len(given)
                or max(given) + 1 < required):
            return None
        fill = tuple((positional[i].name, None) if positional[i].name in names else (None, defaults[i])
                     for i in range(n, max(given) + 1))
        if any(name is None and d is _EMPTY for name, d in fill):
            return None
        if len(fills) >= 256:
            fills.clear()
        if tuple(name for name, _ in fill) == names:
            return _IN_ORDER  # the names fill the next positions in their order: the values as they come
        return fill

    def bind(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple:
        pattern = (len(args), *kwargs)
        try:
            fill = fills[pattern]
        except KeyError:
            fill = fills[pattern] = learn(len(args), tuple(kwargs))
        if fill is _IN_ORDER:
            return args + tuple(kwargs.values()), {}
        if fill is None:
            return general(args, kwargs)
        return args + tuple([kwargs[name] if name is not None else d for name, d in fill]), {}

    return bind
