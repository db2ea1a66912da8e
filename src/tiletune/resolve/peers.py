"""One pick per problem key across the ranks of a ``torch.distributed`` job.

Ranks tuning the same key on their own would each pick the winner of their own measurements, and
near-tied configs (a different reduction order, a different tiling) give slightly different
numerics: ranks of one model would no longer compute the same thing. So in a job whose default
process group is initialised (``torch.distributed.init_process_group``, more than one rank), a
tuned op that misses a key agrees on it with the other ranks (:func:`tiletune.resolve.tuning.resolve`):

* the first rank to miss the problem (kernel, space, key) claims it in the process group's
  key-value store (an atomic ``add``) and resolves it as usual: its database, a tuning table, or
  tuning; then it publishes the pick in the store as JSON (``{"config", "median_us", "tied",
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
from typing import TYPE_CHECKING, Any, Callable, Sequence

from tiletune.errors import DatabaseError, TiletuneError
from tiletune.keys import imported_torch
from tiletune.records import TuningIdentity, stable_hash

if TYPE_CHECKING:  # pragma: no cover
    from tiletune.op.tuned_op import TunedOp
    from tiletune.resolve.tuning import Resolution

logger = logging.getLogger("tiletune")

__all__ = ["Peers", "peers", "torch_distributed", "PREFIX", "WAIT_S"]

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

    def agree(self, op: "TunedOp", identity: TuningIdentity, arch: str,
              resolve_here: Callable[[], "Resolution"]) -> "Resolution":
        """The one pick of every rank for ``identity``: resolved here (``resolve_here()``) if this rank
        claims it first, else the claiming rank's, waited for."""
        key = problem_key(identity)
        if int(self.store.add(key + ":claim", 1)) == 1:
            try:
                res = resolve_here()
            except BaseException as exc:
                self.store.set(key, json.dumps({"rank": self.rank, "error": f"{type(exc).__name__}: {exc}"}))
                raise
            self.store.set(key, json.dumps({
                "rank": self.rank, "config": res.config.as_dict(), "source": res.source,
                "median_us": res.median_us, "tied": [dict(t) for t in res.result.tied] if res.result else [],
            }, allow_nan=False))
            return res
        return self._adopt(op, identity, arch, self._wait(op, identity, key))

    def _wait(self, op: "TunedOp", identity: TuningIdentity, key: str) -> dict[str, Any]:
        t0 = time.monotonic()
        pause = 0.001
        logged = False
        while not self.store.check([key]):
            if not logged and time.monotonic() - t0 > 1.0:
                logger.info("%s: rank %d waits for another rank's pick for %s", op.name, self.rank, identity.key)
                logged = True
            if time.monotonic() - t0 > WAIT_S:
                raise TiletuneError(f"{op.name}: rank {self.rank} waited {WAIT_S:.0f} s for another rank's pick "
                                    f"for {identity.key}; did the rank tuning it stop?")
            time.sleep(pause)
            pause = min(0.05, pause * 2)
        raw = self.store.get(key)
        try:
            doc = json.loads(raw.decode() if isinstance(raw, (bytes, bytearray)) else raw)
            if not isinstance(doc, dict) or not isinstance(doc.get("rank"), int):
                raise ValueError("not a pick")
        except ValueError as exc:
            raise TiletuneError(f"{op.name}: the pick another rank published for {identity.key} is invalid "
                                f"({exc})") from None
        return doc

    def _adopt(self, op: "TunedOp", identity: TuningIdentity, arch: str, doc: dict[str, Any]) -> "Resolution":
        from tiletune.resolve.tuning import Resolution, _config_from_record, _writable

        if "error" in doc:
            raise TiletuneError(f"{op.name}: rank {doc['rank']} failed to tune {identity.key}: {doc['error']}")
        values = doc.get("config")
        cfg = _config_from_record(op, values, arch) if isinstance(values, dict) else None
        if cfg is None:
            raise TiletuneError(f"{op.name}: rank {doc['rank']} picked {values!r} for {identity.key}, which is not a "
                                f"valid config of this rank's space ({arch}); ranks must tune the same space")
        logger.info("%s: %s -> %s (picked by rank %d)", op.name, identity.key, cfg, doc["rank"])
        median = doc.get("median_us")
        db = op.db
        if isinstance(median, (int, float)) and median > 0 and _writable(op, db):
            assert db is not None
            tied = [t for t in doc.get("tied", []) if isinstance(t, dict)]
            try:
                if db.lookup(identity) is None:
                    db.record_session(identity, [], cfg.as_dict(), float(median), tied)
            except DatabaseError as exc:
                from tiletune.resolve.tuning import database_failed

                database_failed(op, db, exc)
        return Resolution(cfg, launched=False, source="peer", median_us=float(median) if median else None)
