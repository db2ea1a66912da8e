"""Tuned ops on the fake backend for the campaign tests (importable as campaign_ops:<name>).

Their timing models are functions of the config only (noise on, seeded: every session of a key draws
the same samples), so the picks of a key do not depend on which worker, process or host tunes it.
"""

from __future__ import annotations

import os
import time

import tiletune as tt
from tiletune.devices.backends import FakeBackend

ROWS = tt.Space(TM=[16, 32, 64, 128], occupancy=[1, 2], baseline=dict(TM=32, occupancy=1))
COLS = tt.Space(TN=[64, 128, 256, 512, 1024], baseline=dict(TN=128))


def _rows_model(cfg) -> float:
    return 50.0 + abs(cfg.TM - 64) * 0.3 + (0.0 if cfg.occupancy == 2 else 4.0)  # TM=64, occupancy 2


def _cols_model(cfg) -> float:
    return 80.0 - 0.01 * cfg.TN + (30.0 if cfg.TN == 1024 else 0.0)  # TN=512


def _double(x, y):
    y.copy_(x * 2)


def _slow_double(x, y):
    time.sleep(float(os.environ.get("CAMPAIGN_TEST_SLEEP", "0.01")))
    y.copy_(x * 2)


@tt.autotune(ROWS, reference=lambda x, y: x * 2, writes=["y"], backend=FakeBackend(_rows_model, noise=0.02),
             progress=False, name="campaign.double")
def double(cfg, x, y):
    return tt.Launch(_double, (cfg.TM,), (x, y))


@tt.autotune(COLS, reference=lambda x, y: x * 2, writes=["y"], backend=FakeBackend(_cols_model, noise=0.02),
             progress=False, name="campaign.scale")
def scale(cfg, x, y):
    return tt.Launch(_double, (cfg.TN,), (x, y))


@tt.autotune(ROWS, reference=lambda x, y: x * 2, writes=["y"], backend=FakeBackend(_rows_model, noise=0.02),
             progress=False, name="campaign.slow_double")
def slow_double(cfg, x, y):
    return tt.Launch(_slow_double, (cfg.TM,), (x, y))


def boom(x):
    raise RuntimeError("this op always fails")
