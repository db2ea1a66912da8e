"""The main job (``tiletune demo``): tune the example matmul and RMSNorm (:mod:`tiletune.lab.examples`) end to end.

With a GPU it tunes live: the 32-config bf16 4096^3 matmul space and the 4-config RMSNorm space,
through the decorator, compiled in parallel, verified and timed, stored in the tuning database.
Without one it says so and replays measurements recorded on an H200 (packaged with tiletune)
through the very same tuning loop, with a simulated clock.
"""

from __future__ import annotations

import importlib.resources
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tiletune.lab.recordings.replay import ReplayBackend
from tiletune.lab.recordings import Recording, save_recording
from tiletune.records import TuneResult


@dataclass(frozen=True)
class DemoRow:
    """One tuned problem of the demo."""

    op: str
    problem: str
    configs: int
    ok: int
    failed: int
    winner: dict[str, Any]
    winner_us: float
    baseline_us: float | None
    throughput: str
    tuning_s: float
    mode: str  # "live" or "replay"


def packaged_recordings() -> list[Path]:
    """Recordings shipped with tiletune (H200 measurements)."""
    root = importlib.resources.files("tiletune") / "data"
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".json.gz"))


class ShapeOnly:
    """A stand-in tensor for replay: shape, dtype and contiguity, no data."""

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape = tuple(shape)
        self.dtype = dtype

    def stride(self) -> tuple[int, ...]:
        out, acc = [], 1
        for s in reversed(self.shape):
            out.append(acc)
            acc *= s
        return tuple(reversed(out))

    def is_contiguous(self) -> bool:
        return True

    def get_device(self) -> int:
        return 0


def _row(op: str, problem: str, result: TuneResult, work: Callable[[float], str], mode: str) -> DemoRow:
    base = [m for m in result.measurements if m.is_baseline]
    return DemoRow(
        op=op,
        problem=problem,
        configs=len(result.measurements),
        ok=len(result.successes),
        failed=len(result.failures),
        winner=dict(result.winner),
        winner_us=result.winner_median_us,
        baseline_us=base[0].median_us if base and not base[0].status.failed else None,
        throughput=work(result.winner_median_us),
        tuning_s=result.wall_s if mode == "live" else float(result.stats.get("session_clock_s", 0.0)),
        mode=mode,
    )


def run_live(record_dir: Path | None = None) -> list[DemoRow]:
    """Tune matmul (bf16 4096^3) and RMSNorm (bf16 16384x4096) on the GPU."""
    import torch

    from tiletune.lab.examples.simple_matmul import matmul_into
    from tiletune.lab.examples.rmsnorm import rms_norm_into

    rows = []
    torch.manual_seed(0)
    dev = torch.device("cuda")
    n = 4096
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    matmul_into(a, b, c)
    torch.cuda.synchronize()
    res = _result_of(matmul_into, time.perf_counter() - t0)
    rows.append(_row("matmul", f"bf16 {n}x{n}x{n}", res, lambda us: f"{2 * n**3 / us / 1e6:.0f} TFLOP/s", "live"))
    if record_dir is not None and not res.from_database:
        _record(record_dir / "h200_matmul_bf16_4096.json.gz", "tiletune.matmul", res)

    m, k = 16384, 4096
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(k, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    t0 = time.perf_counter()
    rms_norm_into(x, w, y, 1e-6)
    torch.cuda.synchronize()
    res = _result_of(rms_norm_into, time.perf_counter() - t0)
    nbytes = 2 * m * k * 2 + k * 2
    rows.append(_row("rms_norm", f"bf16 {m}x{k}", res, lambda us: f"{nbytes / us / 1e3:.0f} GB/s", "live"))
    if record_dir is not None and not res.from_database:
        _record(record_dir / "h200_rmsnorm_bf16_16384x4096.json.gz", "tiletune.rms_norm", res)
    return rows


def _result_of(op: Any, wall_s: float) -> TuneResult:
    """The op's most recent tuning result, or a database-hit placeholder."""
    if op.results:
        return list(op.results.values())[-1]
    db = op.db
    raise RuntimeError(f"{op.name}: the key was already in the tuning database {db.where if db else ''}; "
                       "run with --fresh to tune from an empty cache")


def _record(path: Path, name: str, res: TuneResult) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    save_recording(
        path,
        name=name,
        key=json.loads(res.identity.key),
        device=res.identity.device,
        versions=json.loads(res.identity.versions),
        measurements=res.measurements,
        note="recorded by `tiletune demo --record` (tiletune's own harness: cold L2, adaptive, racing)",
    )


def run_replay(
    paths: list[Path] | None = None, seed: int = 0, strategy: str | None = None, budget: Any = None
) -> list[DemoRow]:
    """Replay recorded measurements through the decorator and tuning loop (no GPU needed).

    ``strategy`` / ``budget`` (a :class:`tiletune.Budget`) select the search, as on ``@autotune``.
    """
    search = dict(strategy=strategy, budget=budget, seed=seed)
    from tiletune.op.tuned_op import autotune
    from tiletune.lab.examples.simple_matmul import MATMUL_SPACE, matmul_into
    from tiletune.lab.examples.rmsnorm import RMSNORM_SPACE, rms_norm_into

    rows = []
    for path in paths or packaged_recordings():
        rec = Recording.load(path)
        backend = ReplayBackend(rec, seed=seed)
        if rec.name == "tiletune.matmul":
            op = autotune(MATMUL_SPACE, db=False, backend=backend, name=rec.name, progress=False,
                          **search)(matmul_into.plan)
            shapes = [tuple(p["shape"]) for p in rec.key]
            dtype = rec.key[0]["dtype"]
            args = tuple(ShapeOnly(s, dtype) for s in shapes)
            mm, kk = shapes[0]
            nn = shapes[1][1]
            op(*args)
            (res,) = op.results.values()
            rows.append(_row("matmul", f"{dtype} {mm}x{nn}x{kk}", res,
                             lambda us: f"{2 * mm * nn * kk / us / 1e6:.0f} TFLOP/s", "replay"))
        elif rec.name == "tiletune.rms_norm":
            op = autotune(RMSNORM_SPACE, db=False, backend=backend, name=rec.name, progress=False,
                          **search)(rms_norm_into.plan)
            xs, ws, ys = (tuple(p["shape"]) for p in rec.key[:3])
            dtype = rec.key[0]["dtype"]
            import tiletune.lab.examples.rmsnorm as rn

            rn._sm_count.cache_clear()
            _orig = rn._sm_count
            rn._sm_count = lambda _d: rec.device.sm_count  # type: ignore[assignment]
            try:
                op(ShapeOnly(xs, dtype), ShapeOnly(ws, dtype), ShapeOnly(ys, dtype), 1e-6)
            finally:
                rn._sm_count = _orig  # type: ignore[assignment]
            (res,) = op.results.values()
            nbytes = 2 * xs[0] * xs[1] * 2 + ws[0] * 2
            rows.append(_row("rms_norm", f"{dtype} {xs[0]}x{xs[1]}", res,
                             lambda us: f"{nbytes / us / 1e3:.0f} GB/s", "replay"))
    return rows
