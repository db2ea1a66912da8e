"""One pick per problem key across the ranks of a ``torch.distributed`` job.

Ranks tuning the same key on their own would each pick the winner of their own measurements, and
near-tied configs (a different reduction order, a different tiling) give slightly different
numerics: ranks of one model would no longer compute the same thing. So in a job whose default
process group is initialised (``torch.distributed.init_process_group``, more than one rank), a
tuned op that misses a key and would tune it agrees on it with the other ranks (:class:`PeerSource`):

* the first rank to miss the problem (kernel, space, key) claims it in the process group's
  key-value store (an atomic ``add``) and tunes it; then it publishes the pick in the store as JSON (``{"config", "median_us", "tied",
  "source", "rank"}``; JSON only, never a pickle);
* every other rank that misses the same problem waits for that pick and uses it (and records it in
  its own database, without measurements, so a later job finds it there).

Nothing here is a collective: a rank that never meets a key never waits for it, and ranks may meet
keys in any order, so a miss can never deadlock on another rank's control flow. The work splits
itself: the first rank to meet a key tunes it while the others keep going until they need it.
:func:`tiletune.lab.fill.tune_calls` splits a known list of calls across the ranks up front (rank ``r`` makes calls
``r, r + W, ...``), so the ranks tune in parallel on their own GPUs.

Cost: a miss checks whether a process group is initialised (a dictionary lookup and two calls);
outside a multi-rank job nothing else happens, and the hot path never comes here.
A failure on the tuning rank (every candidate failed, ...) is published too: the waiting ranks raise
a :class:`~tiletune.errors.TiletuneError` naming that rank and its error, instead of waiting forever.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tiletune.errors import TiletuneError
from tiletune.keys import imported_torch
from tiletune.records import TuningIdentity, stable_hash

if TYPE_CHECKING:  # pragma: no cover
    from tiletune.resolve.problem import Choice, Problem

logger = logging.getLogger("tiletune")

__all__ = ["PeerSource", "Peers", "peers", "torch_distributed", "PREFIX", "WAIT_S"]

#: Store keys of the picks: ``<PREFIX><problem hash>`` (the pick) and ``...:claim`` (the counter).
PREFIX = "tiletune/pick/"
#: How long a rank waits for another rank's pick before it gives up (seconds).
WAIT_S = 3600.0


def torch_distributed() -> Any:
    """``torch.distributed`` when torch is imported and a multi-rank default group is up, else None."""
    torch = imported_torch()  # never a torch another thread is still importing
    dist = None if torch is None else sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist if dist.get_world_size() > 1 else None


def peers() -> "Peers | None":
    """The ranks of the current ``torch.distributed`` job, or None outside one (or with one rank)."""
    dist = torch_distributed()
    if dist is None:
        return None
    from torch.distributed import distributed_c10d

    return Peers(distributed_c10d._get_default_store(), dist.get_rank(), dist.get_world_size())


def problem_key(identity: TuningIdentity) -> str:
    """The store key of an identity's pick: its kernel, space and problem key (not the device or the
    software versions, so ranks agree even where those differ)."""
    return PREFIX + stable_hash([identity.kernel_id, identity.space_hash, identity.key], 32)


@dataclass
class Peers:
    """The key-value store of a process group, this rank and the world size."""

    store: Any
    rank: int
    world_size: int

    def claim(self, identity: TuningIdentity) -> bool:
        """Whether this rank is the first to claim ``identity`` (it then resolves and publishes it)."""
        return int(self.store.add(problem_key(identity) + ":claim", 1)) == 1

    def publish(self, identity: TuningIdentity, choice: "Choice | None", error: BaseException | None = None) -> None:
        """Publish this rank's pick for ``identity`` (or the error that ended its resolution)."""
        key = problem_key(identity)
        if choice is None:
            self.store.set(key, json.dumps({"rank": self.rank, "error": f"{type(error).__name__}: {error}"}))
            return
        self.store.set(key, json.dumps({
            "rank": self.rank, "config": choice.config.as_dict(), "source": choice.source,
            "median_us": choice.median_us, "tied": [dict(t) for t in choice.result.tied] if choice.result else [],
        }, allow_nan=False))

    def wait(self, name: str, identity: TuningIdentity) -> dict[str, Any]:
        """The pick another rank published for ``identity``, waited for."""
        key = problem_key(identity)
        t0 = time.monotonic()
        pause = 0.001
        logged = False
        while not self.store.check([key]):
            if not logged and time.monotonic() - t0 > 1.0:
                logger.info("%s: rank %d waits for another rank's pick for %s", name, self.rank, identity.key)
                logged = True
            if time.monotonic() - t0 > WAIT_S:
                raise TiletuneError(f"{name}: rank {self.rank} waited {WAIT_S:.0f} s for another rank's pick "
                                    f"for {identity.key}; did the rank tuning it stop?")
            time.sleep(pause)
            pause = min(0.05, pause * 2)
        raw = self.store.get(key)
        try:
            doc = json.loads(raw.decode() if isinstance(raw, (bytes, bytearray)) else raw)
            if not isinstance(doc, dict) or not isinstance(doc.get("rank"), int):
                raise ValueError("not a pick")
        except ValueError as exc:
            raise TiletuneError(f"{name}: the pick another rank published for {identity.key} is invalid "
                                f"({exc})") from None
        return doc


class PeerSource:
    """In a multi-rank ``torch.distributed`` job: the pick of the rank that claimed the key first. The
    rank that claims it goes on to tune, and publishes whatever answers it (the chain calls
    :meth:`Attempt.finish` hooks); outside such a job, nothing (one dictionary lookup)."""

    name = "peer"

    def get(self, problem: "Problem", attempt: Any) -> "Choice | None":
        from tiletune.resolve.problem import Choice

        group = peers()
        if group is None:
            return None
        identity = problem.identity
        if group.claim(identity):
            attempt.on_finish(lambda choice, error: group.publish(identity, choice, error))
            return None
        doc = group.wait(problem.name, identity)
        if "error" in doc:
            raise TiletuneError(f"{problem.name}: rank {doc['rank']} failed to tune {identity.key}: {doc['error']}")
        values = doc.get("config")
        cfg = problem.config_from(values) if isinstance(values, dict) else None
        if cfg is None:
            raise TiletuneError(f"{problem.name}: rank {doc['rank']} picked {values!r} for {identity.key}, which is "
                                f"not a valid config of this rank's space ({problem.arch}); ranks must tune the same "
                                "space")
        logger.info("%s: %s -> %s (picked by rank %d)", problem.name, identity.key, cfg, doc["rank"])
        median = doc.get("median_us")
        tied = tuple(t for t in doc.get("tied", []) if isinstance(t, dict))
        attempt.peer_tied = tied
        return Choice(cfg, "peer", median_us=float(median) if isinstance(median, (int, float)) and median > 0 else None)
