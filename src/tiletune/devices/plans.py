"""A call's launch plans: the plan's output per config for one call's arguments, evaluated once each.

A tuning session, the identity of a key and the worker all ask the plan what a config launches; a
:class:`PlanCache` made for one call's arguments answers each config once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tiletune.devices.backends.base import Launch
from tiletune.space.spaces import Config

__all__ = ["KernelPart", "PlanCache"]


@dataclass(frozen=True)
class KernelPart:
    """The part of an op's identity that does not depend on the key: the kernel id (the plan's and
    its kernels' sources over the identity configs) and the backend's versions."""

    kernel_id: str
    versions: str


class PlanCache:
    """The launch plan's output per config for one call's arguments: the plan runs once per candidate.

    ``spec_for(cfg)`` evaluates the plan on the fixed arguments; the cache is called like a plan,
    ``cache(cfg, *args)`` (the arguments are those it was made for), so a session can use it as one.
    It also keeps the part of the op's identity that those arguments fix whatever the key
    (:class:`KernelPart`), so identities of one call under several keys (a bucket's and the
    exact one) hash the kernel sources once.
    """

    def __init__(self, spec_for: Callable[[Config], Launch]) -> None:
        self.spec_for = spec_for
        self.specs: dict[Config, Launch] = {}
        self.calls = 0
        self.kernel: KernelPart | None = None

    def __call__(self, cfg: Config, *args: Any) -> Launch:
        spec = self.specs.get(cfg)
        if spec is None:
            self.calls += 1
            spec = self.specs[cfg] = self.spec_for(cfg)
        return spec
