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
