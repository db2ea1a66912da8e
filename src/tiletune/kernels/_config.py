"""Helpers shared by the kernel modules' host-side launch helpers."""

from __future__ import annotations

from typing import Any


def param(cfg: Any, name: str, default: Any = None) -> Any:
    """Read ``name`` from a config (attribute access, e.g. :class:`tiletune.Config`) or a mapping."""
    if isinstance(cfg, dict):
        return cfg.get(name, default)
    try:
        return getattr(cfg, name)
    except AttributeError:
        return default


def make_module_callable(module_name: str, op_name: str) -> None:
    """Let ``tiletune.kernels.<op>`` be both the submodule and the op: calling the module calls the op.

    Importing a submodule binds it to the package attribute of the same name, which would hide
    the function that ``tiletune.kernels`` exports under that name (``softmax``, ``attention``...).
    """
    import sys
    import types

    module = sys.modules[module_name]

    class _CallableModule(types.ModuleType):
        __doc__ = f"``{module_name}`` is both this module and the op: calling the module calls ``{op_name}``."

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return getattr(self, op_name)(*args, **kwargs)

    module.__class__ = _CallableModule
