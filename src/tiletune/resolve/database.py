"""The tuning database as a source of the chain: the record of the problem's identity, through the
op's :class:`~tiletune.resolve.handle.DatabaseHandle` (a database that fails is dropped there)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tiletune.resolve import fallback
from tiletune.resolve.problem import Choice

if TYPE_CHECKING:  # pragma: no cover
    from tiletune.resolve.attempt import Attempt
    from tiletune.resolve.problem import Problem

logger = logging.getLogger("tiletune")

__all__ = ["DatabaseSource"]


class DatabaseSource:
    """The database's record of the identity (no lease, no waiting: the tune source takes the lease); on a
    call that may fall back, the op's fallback while the record's config compiles, when no cache holds it."""

    name = "database"

    def get(self, problem: "Problem", attempt: "Attempt") -> "Choice | None":
        record = problem.database.lookup(problem.identity, problem.name)
        if record is None:
            return None
        cfg = problem.config_from(record.config)
        if cfg is None:
            return None
        logger.info("%s: database hit for %s -> %s", problem.name, problem.identity.key, cfg)
        return fallback.while_compiling(problem, cfg) or Choice(cfg, "database", median_us=record.median_us)
