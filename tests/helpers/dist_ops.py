"""Tuned ops for the rank-consistency test (tests/test_distributed.py): fake backends whose timings
depend on the rank (``RANK``), so ranks tuning on their own pick different configs."""

from __future__ import annotations

import os

import tiletune as tt
from tiletune.devices.backends import FakeBackend
from tiletune.store import TuningDB

RANK = int(os.environ.get("RANK", "0"))
DB = TuningDB(os.path.join(os.environ["DIST_TEST_DIR"], f"rank{RANK}.db")) if "DIST_TEST_DIR" in os.environ else False


def _double(x, y):
    y.copy_(x * 2)


def _make(name, ks, db):
    # on rank r, config K == r % len(ks) is clearly the fastest: what each rank measures on its own
    backend = FakeBackend(lambda cfg: 100.0 - (10.0 if cfg.K == RANK % len(ks) else 0.0) - 0.1 * cfg.K, noise=0.0)

    @tt.autotune(tt.Space(K=ks, baseline=dict(K=ks[-1])), reference=lambda x, y: x * 2, writes=["y"],
                 backend=backend, db=db, progress=False, name=name)
    def op(cfg, x, y):
        return tt.Launch(_double, (1,), (x, y))

    return op


alone = _make("dist.alone", [0, 1, 2, 3], False)
agree = _make("dist.agree", [0, 1, 2, 3], DB)
split = _make("dist.split", [0, 1, 2, 3, 4], DB)
