"""A tuned op on the CPU fake backend, run in child processes by tests/test_tuning.py.

``python tuning_child.py DB SLEEP_S`` tunes one key with the database at DB (every fake kernel call
sleeps SLEEP_S) and prints one JSON line: how many sessions this process ran and the config it uses.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import tiletune as tt
from tiletune.devices.backends import FakeBackend

SPACE = tt.Space(K=list(range(8)), baseline=dict(K=0))
SLEEP_S = 0.0


def kernel(x, y):
    time.sleep(SLEEP_S)
    y.copy_(x * 2)


def make_op(db: str) -> tt.TunedOp:
    be = FakeBackend(lambda c: 100.0 - 5.0 * c.K, noise=0.002)

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=db, backend=be, progress=False)
    def op(cfg, x, y):
        return tt.Launch(kernel, (1,), (x, y))

    return op


if __name__ == "__main__":
    SLEEP_S = float(sys.argv[2])
    op = make_op(sys.argv[1])
    x, y = torch.arange(16, dtype=torch.float32), torch.empty(16)
    op(x, y)
    assert torch.equal(y, x * 2)
    res = next(iter(op.results.values()), None)
    print(json.dumps({"tuned": op.tuning_count, "config": op.config_for(x, y).as_dict(),
                      "resumed": res.stats["resumed"] if res else None}), flush=True)
