"""tiletune: autotuning for NVIDIA cuTile (``cuda.tile``) kernels.

Wrap a launch plan once; the first call with a new problem key tunes (parallel compilation,
correctness gate, cold-L2 adaptive timing), stores the winner in a persistent SQLite database, and
every later call, in this process or another, launches the cached kernel directly::

    import tiletune as tt

    space = tt.Space(TM=[64, 128, 256], TN=[64, 128, 256], TK=[32, 64], occupancy=[1, 2],
                     baseline=dict(TM=128, TN=128, TK=64, occupancy=1))

    @tt.autotune(space, reference=lambda a, b, c: a @ b, writes=["c"])
    def matmul(cfg, a, b, c):
        grid = (ct.cdiv(a.shape[0], cfg.TM) * ct.cdiv(b.shape[1], cfg.TN),)
        return tt.Launch(matmul_kernel, grid, (a, b, c, cfg.TM, cfg.TN, cfg.TK))
"""

from __future__ import annotations

from tiletune.lab.ab import ab
from tiletune.devices.backends.base import Launch
from tiletune.devices.bench import BenchResult, bench
from tiletune.buckets import Buckets
from tiletune.op.tuned_op import TunedOp, autotune
from tiletune.errors import (
    AllCandidatesFailed,
    DatabaseCorrupt,
    DatabaseError,
    DatabaseLocked,
    DatabaseReadOnly,
    DatabaseUnavailable,
    DatabaseWarning,
    ForeignDatabase,
    NewerDatabase,
    NoBackendError,
    SpaceError,
    TiletuneError,
)
from tiletune.resolve.fallback import wait_for_compiles
from tiletune.resolve.pins import PinError, pin
from tiletune.records import DeviceInfo, Measurement, Status, TuneResult, TuningIdentity
from tiletune.space.spaces import Config, PerArch, Space, per_arch
from tiletune.stats import StoppingRule
from tiletune.space.strategies import Budget, Strategy, register
from tiletune.store import TuningDB, default_db_path
from tiletune.engine.tuner import TunerOptions

__version__ = "0.1.0"

__all__ = [
    "AllCandidatesFailed",
    "BenchResult",
    "Buckets",
    "Budget",
    "Config",
    "DatabaseCorrupt",
    "DatabaseError",
    "DatabaseLocked",
    "DatabaseReadOnly",
    "DatabaseUnavailable",
    "DatabaseWarning",
    "DeviceInfo",
    "ForeignDatabase",
    "Launch",
    "Measurement",
    "NewerDatabase",
    "NoBackendError",
    "PinError",
    "PerArch",
    "Space",
    "SpaceError",
    "Status",
    "StoppingRule",
    "Strategy",
    "TiletuneError",
    "TuneResult",
    "TunedOp",
    "TunerOptions",
    "TuningDB",
    "TuningIdentity",
    "ab",
    "autotune",
    "bench",
    "default_db_path",
    "per_arch",
    "pin",
    "register",
    "wait_for_compiles",
    "__version__",
]

from tiletune.devices.workers.zygote import start_at_import as _start_zygote

_start_zygote()  # on a machine with an NVIDIA GPU: workers' imports start now, beside the program's
