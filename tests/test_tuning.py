"""One tuning pipeline (tiletune.resolve.tuning): the plan runs once per candidate, several processes tune a
key once between them, and a process killed mid-tune is resumed from its recorded configs.

The concurrency and SIGKILL tests use real child processes (tests/helpers/tuning_child.py) sharing
one SQLite tuning database.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tiletune as tt
from tiletune.devices.backends import FakeBackend
from tiletune.resolve.leases import progress
from tiletune.records import Status
from tiletune.store import TuningDB

CHILD = Path(__file__).parent / "helpers" / "tuning_child.py"
SPACE = tt.Space(K=list(range(8)), baseline=dict(K=0))


def _run_child(db: Path, sleep_s: float) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(CHILD.parent), *sys.path]))
    return subprocess.Popen([sys.executable, str(CHILD), str(db), str(sleep_s)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)


def test_the_plan_runs_once_per_candidate():
    calls = []

    def kernel(x, y):
        y.copy_(x * 2)

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False, backend=FakeBackend(lambda c: 10.0 + c.K),
                 progress=False, cache_plan=False)
    def op(cfg, x, y):
        calls.append(cfg["K"])
        return tt.Launch(kernel, (1,), (x, y))

    x, y = torch.randn(4), torch.empty(4)
    op(x, y)
    (res,) = op.results.values()
    assert res.stats["plan_calls"] == 8
    # the identity and the session share the evaluations; the hot path adds one for its entry
    assert sorted(calls[:8]) == list(range(8)) and len(calls) <= 8 + 2


def test_exhaustive_is_a_strategy_on_the_search_pipeline():
    be = FakeBackend(lambda c: 10.0 + c.K)
    op = tt.autotune(SPACE, db=False, backend=be, progress=False)(lambda cfg, n: tt.Launch(lambda: None, (1,), ()))
    op(3)
    (res,) = op.results.values()
    assert res.stats["strategy"] == "exhaustive" and res.stats["batches"] == 1 and res.stats["evaluations"] == 8


def test_concurrent_processes_tune_a_key_once(tmp_path):
    db = tmp_path / "t.db"
    procs = [_run_child(db, 0.05) for _ in range(4)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(o["tuned"] for o in outs) == 1
    assert len({json.dumps(o["config"]) for o in outs}) == 1
    with TuningDB(db) as d:
        assert len(d.sessions()) == 1
        assert d.stats()["leases"] == 0


def test_sigkill_mid_tune_then_resume_loses_nothing(tmp_path):
    db = tmp_path / "t.db"
    child = _run_child(db, 0.4)  # every kernel call sleeps: the session takes several seconds
    d = TuningDB(db)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with d._connection() as conn:
                n = conn.execute("SELECT count(*) FROM progress").fetchone()[0]
        except Exception:
            n = 0
        if n >= 3:
            break
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    with d._connection() as conn:
        rows = conn.execute("SELECT measurement FROM progress").fetchall()
    recorded = [json.loads(r[0]) for r in rows]
    assert len(recorded) >= 3 and not d.sessions()

    # a new process (here: this one) resumes: the recorded configs are not measured again
    sys.path.insert(0, str(CHILD.parent))
    try:
        import tuning_child
    finally:
        sys.path.remove(str(CHILD.parent))
    tuning_child.SLEEP_S = 0.0
    op = tuning_child.make_op(str(db))
    x, y = torch.arange(16, dtype=torch.float32), torch.empty(16)
    op(x, y)
    (res,) = op.results.values()
    assert res.stats["resumed"] == len(recorded)
    assert len(res.measurements) == 8 and all(m.status is Status.OK for m in res.measurements)
    done = {json.dumps(m["config"], sort_keys=True): m for m in recorded}
    for m in res.measurements:
        before = done.get(json.dumps(dict(m.config), sort_keys=True))
        if before is not None and m.reason != "raced_out":
            # resumed configs keep the samples they had (the showdown may add fresh ones)
            assert tuple(m.samples_us[: len(before["samples_us"])]) == tuple(before["samples_us"])
    torch.testing.assert_close(y, x * 2)
    assert len(d.sessions()) == 1 and progress(d, res.identity) == []
    d.close()


def test_resume_skips_recorded_failures():
    from tiletune.records import Measurement
    from tiletune.engine.tuner import run_loop
    from tiletune.devices.backends.base import Candidate

    be = FakeBackend(lambda c: 10.0 + c.K)
    session = be.open_session(lambda cfg, *a: tt.Launch(lambda: None, (1,), ()), (), device_index=0, writes=(),
                              reference=None, tolerance=None, name="op")
    cands = [Candidate(c, i, i == 0) for i, c in enumerate(SPACE.candidates("sm_90"))]
    failed = Measurement(config={"K": 0}, status=Status.LAUNCH_ERROR, reason="illegal address (earlier run)")
    measured = Measurement(config={"K": 1}, status=Status.OK, samples_us=(11.0,) * 10)
    seen = []
    loop = run_loop(session, cands, prior={failed.config_hash: failed, measured.config_hash: measured},
                    on_result=seen.append, showdown=False)
    by_k = {m.config["K"]: m for m in loop.measurements}
    assert by_k[0].status is Status.LAUNCH_ERROR and "earlier run" in by_k[0].reason
    assert by_k[1].samples_us == (11.0,) * 10 and by_k[1].reason == "resumed"
    assert {m.config["K"] for m in seen} == set(range(8))


def test_a_plan_that_raises_for_one_config_fails_that_config_only():
    def kernel(x, y):
        y.copy_(x * 2)

    @tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False, backend=FakeBackend(lambda c: 10.0 + c.K),
                 progress=False)
    def op(cfg, x, y):
        if cfg.K == 3:
            raise ValueError("no such tile")
        return tt.Launch(kernel, (1,), (x, y))

    x, y = torch.randn(4), torch.empty(4)
    op(x, y)
    (res,) = op.results.values()
    bad = [m for m in res.measurements if m.status is not Status.OK]
    assert [m.config["K"] for m in bad] == [3] and "no such tile" in bad[0].reason
