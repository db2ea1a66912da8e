"""The strategies by name: the registry behind ``strategy=``.

The built-in strategies are listed here by name and import path, and each is imported when its name is
first looked up (all of them when the names are listed): their modules import :mod:`tiletune.space.strategies.base` (and this module, where they
build other strategies), never the other way round. :func:`register` adds a user's
:class:`~tiletune.space.strategies.base.Strategy` subclass under a new name. :func:`resolve_strategy`
and :func:`make_strategy` accept a name, a ``"package.module:Name"`` path, a subclass or an instance
(a template).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Union

from tiletune.errors import TiletuneError
from tiletune.space.spaces import Space
from tiletune.space.strategies.base import Strategy

__all__ = ["BUILTINS", "STRATEGIES", "StrategyError", "StrategySpec", "make_strategy", "register",
           "resolve_strategy", "strategy_names"]

StrategyFactory = Callable[..., Strategy]

#: The built-in strategies: name -> ``"module:Class"``, in the order :func:`strategy_names` lists them.
BUILTINS: dict[str, str] = {
    "exhaustive": "tiletune.space.strategies.simple:ExhaustiveStrategy",
    "random": "tiletune.space.strategies.simple:RandomStrategy",
    "evolutionary": "tiletune.space.strategies.evolutionary:EvolutionaryStrategy",
    "model": "tiletune.space.strategies.model:ModelStrategy",
    "local": "tiletune.space.strategies.local:LocalSearchStrategy",
    "surrogate": "tiletune.space.strategies.surrogate:SurrogateStrategy",
    "hybrid": "tiletune.space.strategies.portfolio:HybridStrategy",
    "auto": "tiletune.space.strategies.portfolio:AutoStrategy",
}

#: The registry: name -> strategy class, the built-in ones first (imported at the first lookup), then
#: those added with :func:`register`, in their order. It is the only list of strategy names:
#: :func:`strategy_names` and ``tiletune.space.strategies.STRATEGY_NAMES`` are views of it.
STRATEGIES: dict[str, StrategyFactory] = {}

#: What ``strategy=`` accepts: a registered name (or ``"package.module:Name"``), a
#: :class:`Strategy` subclass, or a :class:`Strategy` instance (a template).
StrategySpec = Union[str, "type[Strategy]", Strategy]


class StrategyError(TiletuneError, ValueError):
    """An unknown strategy name, or something that is not a strategy, given as ``strategy=``."""


def _load_builtins() -> None:
    if all(name in STRATEGIES for name in BUILTINS):
        return
    loaded = {name: STRATEGIES.get(name) or _from_import_path(path) for name, path in BUILTINS.items()}
    added = {k: v for k, v in STRATEGIES.items() if k not in BUILTINS}
    STRATEGIES.clear()
    STRATEGIES.update(loaded)
    STRATEGIES.update(added)


def strategy_names() -> tuple[str, ...]:
    """The registered strategy names: the built-in ones, then those added with :func:`register`."""
    _load_builtins()
    return tuple(STRATEGIES)


def register(name: str) -> Callable[[type[Strategy]], type[Strategy]]:
    """Class decorator adding a :class:`Strategy` subclass to :data:`STRATEGIES` under ``name``.

    ``@register("mine")`` on ``class Mine(Strategy)`` makes ``"mine"`` valid wherever a strategy
    name is (``autotune(strategy="mine")``, ``make_strategy("mine", ...)``, the command line's
    ``--strategy``). A name already taken by another class (a built-in's included) is refused
    (re-registering the same class, e.g. on a module reload, replaces it).
    """
    if not isinstance(name, str) or not name.strip() or name != name.strip() or ":" in name:
        raise ValueError(f"strategy name must be a non-empty string without spaces at its ends or ':', got {name!r}")

    def deco(cls: type[Strategy]) -> type[Strategy]:
        if not (isinstance(cls, type) and issubclass(cls, Strategy)):
            raise TypeError(f"@register({name!r}) decorates a tiletune Strategy subclass, got {cls!r}")
        old = STRATEGIES.get(name)
        taken = (f"{old.__module__}.{old.__qualname__}" if old is not None and old is not cls
                 else BUILTINS[name].replace(":", ".") if old is None and name in BUILTINS else None)
        if taken is not None and taken != f"{cls.__module__}.{cls.__qualname__}":
            raise ValueError(f"strategy name {name!r} is already registered to {taken}")
        cls.name = name
        STRATEGIES[name] = cls
        return cls

    return deco


def _choices() -> str:
    return (f"registered strategies: {', '.join(strategy_names())} "
            "(or a Strategy subclass or instance, or 'package.module:Name')")


def _from_import_path(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise StrategyError(f"unknown strategy {spec!r}: cannot import {module_name!r} ({exc})") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise StrategyError(f"unknown strategy {spec!r}: {module_name!r} has no {attr!r}") from None
    return obj


def resolve_strategy(spec: Any) -> "type[Strategy] | Strategy":
    """The class (for a name or a class) or the template instance that ``spec`` names.

    Raises :class:`StrategyError` (a TiletuneError and a ValueError) for an unknown name, listing
    the registered ones, or for anything that is not a strategy.
    """
    obj = spec
    if isinstance(spec, str):
        if spec in BUILTINS and spec not in STRATEGIES:  # only its own module (a first miss imports no other)
            STRATEGIES[spec] = _from_import_path(BUILTINS[spec])
        if spec not in STRATEGIES:
            _load_builtins()
        if spec in STRATEGIES:
            return STRATEGIES[spec]  # type: ignore[return-value]
        if ":" not in spec:
            raise StrategyError(f"unknown strategy {spec!r}; {_choices()}")
        obj = _from_import_path(spec)
        if isinstance(obj, str) and obj in STRATEGIES:
            return STRATEGIES[obj]  # type: ignore[return-value]
    if isinstance(obj, type) and issubclass(obj, Strategy) and obj is not Strategy:
        return obj
    if isinstance(obj, Strategy):
        return obj
    what = f"{spec!r}" if isinstance(spec, str) else f"a {type(spec).__name__}"
    raise StrategyError(f"strategy must be a registered name, a Strategy subclass or a Strategy instance, "
                        f"got {what}; {_choices()}")


def make_strategy(spec: Any, space: Space, arch: str | None = None, seed: int = 0, **opts: Any) -> Strategy:
    """A fresh strategy over ``space`` on ``arch`` seeded with ``seed``.

    ``spec`` is a registered name (``"exhaustive"``, ``"random"``, ``"evolutionary"``, ``"model"``
    or one added with :func:`register`), a ``"package.module:Name"`` path to one, a
    :class:`Strategy` subclass, or a :class:`Strategy` instance. An instance is a template: a
    strategy holds the state of one search, so each call builds a new object of its class with the
    keyword options the instance was built with (``opts`` win over them), on this space,
    architecture and seed.

    ``opts`` are passed to the strategy's constructor (e.g. ``population=12`` for evolutionary).
    """
    target = resolve_strategy(spec)
    if isinstance(target, Strategy):
        cls: type[Strategy] = type(target)
        extra_args = tuple(getattr(target, "_init_args", ())[3:])
        kwargs = {**dict(getattr(target, "_init_kwargs", {})), **opts}
        for k in ("space", "arch", "seed"):
            kwargs.pop(k, None)
        return cls(space, arch, seed, *extra_args, **kwargs)
    return target(space, arch, seed, **opts)
