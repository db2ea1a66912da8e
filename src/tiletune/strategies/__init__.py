"""Search strategies: which configurations to measure, in which order (ask/tell; never a GPU).

``make_strategy(name, space, arch, seed, **opts)`` with ``name`` one of:

* ``"exhaustive"``: every valid config, baseline first, space order (racing is the loop's job);
* ``"random"``: uniform without replacement;
* ``"evolutionary"``: elitist genetic search, duplicate-free, failed candidates replaced;
* ``"model"``: an extra-trees surrogate (scikit-learn) with an exploit/expected-improvement batch.

:func:`tiletune.search.run_search` drives a strategy through the tuning loop under a :class:`Budget`.
"""

from __future__ import annotations

from .base import STRATEGIES, Budget, Result, Strategy, make_strategy, register
from .evolutionary import EvolutionaryStrategy
from .model import ModelStrategy
from .simple import ExhaustiveStrategy, RandomStrategy

#: The registered strategy names.
STRATEGY_NAMES: tuple[str, ...] = ("exhaustive", "random", "evolutionary", "model")

__all__ = [
    "STRATEGIES",
    "STRATEGY_NAMES",
    "Budget",
    "EvolutionaryStrategy",
    "ExhaustiveStrategy",
    "ModelStrategy",
    "RandomStrategy",
    "Result",
    "Strategy",
    "make_strategy",
    "register",
]
