"""A tuned op on the fake backend for the fill tests (importable as tests.helpers.fill_ops:double)."""

from __future__ import annotations

import tiletune as tt
from tiletune.devices.backends import FakeBackend

SPACE = tt.Space(TM=[32, 64, 128], baseline=dict(TM=64))
BACKEND = FakeBackend(lambda cfg: 100.0 - 0.2 * cfg.TM, noise=0.0)


def _double(x, y):
    y.copy_(x * 2)


@tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], backend=BACKEND, progress=False, name="fill.double")
def double(cfg, x, y):
    return tt.Launch(_double, (cfg.TM,), (x, y))


def boom(x):
    raise RuntimeError("this op always fails")
