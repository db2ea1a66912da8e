"""Call guards: "does this call have the same key as that earlier one?" answered without building the key.

A tuned op's default key (:func:`tiletune.keys.default_key`) and a library op's call signature
(:mod:`tiletune.kernels.fastcall`) are Python tuples built on every call: about a microsecond of tensor
attribute reads, the largest part of a cached call's cost beyond the launch itself. A *call guard*
is built once per key from a call that had it. It checks a later call's tensors with torch's own
tensor guard (``torch._C._dynamo.guards.TensorGuards``: the C++ check ``torch.compile`` runs before
reusing a compiled graph; exact Python type, dtype, device, sizes, strides, ``requires_grad`` and
dispatch keys) and every other argument with straight-line generated code (its exact type, and its
value where the key holds the value).

A True answer implies the same key, so the caller may reuse what it cached for that key; a False
answer only means the caller computes the key as before. Guards are an accelerator: where torch
lacks ``TensorGuards`` or refuses an argument, :func:`call_guard` returns None and nothing changes.

:class:`GuardTable` holds a few guards per first-argument shape, the cheap selector the hot paths
read before checking.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, ContextManager, Generic, Mapping, TypeVar

logger = logging.getLogger("tiletune")

__all__ = ["Check", "GuardTable", "call_guard", "guards_available"]

Check = Callable[[tuple[Any, ...]], bool]
V = TypeVar("V")

#: guards kept per first-argument shape (keys that share it, e.g. one input against several weights)
PER_SELECTOR = 4
#: selectors kept per table before it starts over (a stream of new shapes must not grow memory)
MAX_SELECTORS = 256
#: keys whose guard a table keeps before it starts over
MAX_CHECKS = 4096

_tensor_guards: Any = None  # TensorGuards, False when unavailable, None before the first look


def _guard_class() -> Any:
    global _tensor_guards
    if _tensor_guards is None:
        try:
            from torch._C._dynamo.guards import TensorGuards

            _tensor_guards = TensorGuards
        except Exception:  # noqa: BLE001 - an old or unusual torch: no guards, the key path stays
            _tensor_guards = False
    return _tensor_guards


def guards_available() -> bool:
    """Whether this torch offers the tensor guard call guards are built on."""
    return bool(_guard_class())


def call_guard(args: tuple[Any, ...], by_value: Callable[[type], bool]) -> Check | None:
    """``check(args2) -> bool``: True only if ``args2`` has ``args``'s length, a torch tensor with the same
    Python type, dtype, device, sizes, strides (and autograd state) where ``args`` has a tensor, and
    elsewhere an object of the same exact type, equal to the one in ``args`` when ``by_value(type)``.

    None when no guard can be built: torch lacks ``TensorGuards``, an argument looks like a tensor
    without being a torch tensor, or a by-value argument does not equal itself (NaN)."""
    cls = _guard_class()
    if not cls:
        return None
    import torch

    tensor_pos: list[int] = []
    lines: list[str] = []
    ns: dict[str, Any] = {}
    for i, a in enumerate(args):
        t = type(a)
        if isinstance(a, torch.Tensor):
            tensor_pos.append(i)
            continue
        if hasattr(a, "shape") and hasattr(a, "stride"):
            return None  # a tensor-like the torch guard cannot read
        ns[f"_t{i}"] = t
        lines.append(f"type(a[{i}]) is _t{i}")
        if by_value(t):
            try:
                if not bool(a == a):
                    return None
            except Exception:  # noqa: BLE001 - a value that cannot be compared is not guarded
                return None
            ns[f"_v{i}"] = a
            lines.append(f"a[{i}] == _v{i}")
    if tensor_pos:
        try:
            guard = cls(*(args[i] for i in tensor_pos), dynamic_dims_sizes=None, dynamic_dims_strides=None)
            ok = guard.check(*(args[i] for i in tensor_pos))
        except Exception as exc:  # noqa: BLE001 - torch refused: no guard
            logger.debug("tiletune.op.guards: no tensor guard (%s)", exc)
            return None
        if ok is not True:
            return None
        ns["_tc"] = guard.check
        lines.insert(0, f"_tc({', '.join(f'a[{i}]' for i in tensor_pos)})")
    lines.insert(0, f"len(a) == {len(args)}")
    src = "def check(a):\n    return " + " and ".join(lines) + "\n"
    exec(compile(src, "<tiletune.op.guards check>", "exec"), ns)  # noqa: S102 - our own generated code
    check = ns["check"]
    check.source = src  # type: ignore[attr-defined]
    return check


def selector(args: tuple[Any, ...]) -> Any:
    """The table selector of a call: its first argument's shape (None when it has none)."""
    if not args:
        return None
    try:
        s = args[0].shape
        hash(s)
    except Exception:  # noqa: BLE001 - no hashable shape: not selectable
        return None
    return s


class GuardTable(Generic[V]):
    """Guards of recent keys, grouped by :func:`selector`, each with the value cached for its key.

    ``lookup(args)`` is the hot-path read; ``check_for(key, args, by_value)`` is a key's guard (built
    once: it depends on the key only); ``remember(args, check, value)`` adds a guard after a call went
    the slow way (``remember_current`` first checks the value is still the key's); ``clear()`` forgets
    the remembered values (whenever a cached value may have changed)."""

    __slots__ = ("rows", "checks")

    def __init__(self) -> None:
        self.rows: dict[Any, tuple[tuple[Check, V], ...]] = {}
        self.checks: dict[Any, Check | None] = {}  # key -> its call guard (None: not guardable)

    def check_for(self, key: Any, args: tuple[Any, ...], by_value: Callable[[type], bool]) -> Check | None:
        """``key``'s call guard, built from ``args`` (a call with that key) the first time it is asked for."""
        try:
            return self.checks[key]
        except KeyError:
            if len(self.checks) >= MAX_CHECKS:
                self.checks.clear()
            check = self.checks[key] = call_guard(args, by_value)
            return check

    def lookup(self, args: tuple[Any, ...]) -> V | None:
        """The value of the first guard that passes ``args``, or None."""
        try:
            row = self.rows[args[0].shape]
        except Exception:  # noqa: BLE001 - no args, no shape, unhashable, or not seen
            return None
        for check, value in row:
            if check(args):
                return value
        return None

    def remember(self, args: tuple[Any, ...], check: Check, value: V) -> None:
        sel = selector(args)
        if sel is None:
            return
        rows = self.rows
        if len(rows) >= MAX_SELECTORS and sel not in rows:
            rows = self.rows = {}
        row = tuple((c, v) for c, v in rows.get(sel, ()) if c is not check)
        rows[sel] = ((check, value),) + row[:PER_SELECTOR - 1]

    def remember_current(self, key: Any, args: tuple[Any, ...], by_value: Callable[[type], bool], value: V,
                         cache: Mapping[Any, V], lock: ContextManager[Any]) -> None:
        """Put ``key``'s guard (:meth:`check_for`) first in its selector's row with ``value``, if ``cache``
        still maps ``key`` to ``value``: checked under ``lock``, the lock ``cache`` changes under, so a
        value another thread just replaced is never remembered (it would be used until the next change)."""
        check = self.check_for(key, args, by_value)
        if check is not None:
            with lock:
                if cache.get(key) is value:
                    self.remember(args, check, value)

    def clear(self) -> None:
        self.rows = {}
