"""The zygote forked from the importing process on a GPU machine: a script that imports torch and then
tiletune (CUDA untouched) gets a zygote that is a fork of itself, ready at once; the worker it forks
creates its CUDA context and runs a real tuning session. A script that touched the driver first
(``torch.cuda.is_available()``) gets a fresh interpreter instead, and tunes the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SCRIPT = """
import json, os, time
import torch
if TOUCH:
    torch.cuda.is_available()
t0 = time.perf_counter()
import tiletune as tt
from tiletune.devices.workers import zygote as zmod
from tiletune.lab.examples import rmsnorm_kernels as rk
z = zmod._zygote
x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
w = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x)

def ref(x, w, y, eps):
    return rk.rmsnorm_reference(x, w, eps)

@tt.autotune(tt.Space(occupancy=[1, 2, 4], baseline=rk.RMSNORM_BASELINE), reference=ref, writes=["y"], db=False,
             progress=False, name="zygote_fork_rmsnorm")
def op(cfg, x, w, y, eps):
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    return tt.Launch(rk.rmsnorm_kernel, rk.rmsnorm_grid(cfg, x.shape[0], sms), rk.rmsnorm_args(cfg, x, w, y, eps))

t1 = time.perf_counter()
op(x, w, y, 1e-6)
torch.cuda.synchronize()
tune_s = time.perf_counter() - t1
(res,) = op.results.values()
err = float((y.float() - ref(x, w, y, 1e-6).float()).abs().max())
print("RESULT " + json.dumps({"by": z.started_by, "refused": z.fork_refused, "hazard": z.hazard,
      "forked": res.stats.get("worker_forked"), "wait": res.stats.get("worker_wait_s"), "tune_s": tune_s,
      "err": err, "isolation": res.stats.get("isolation")}))
"""


def _run(touch: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILETUNE_")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT).replace("TOUCH", repr(touch))],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    got = json.loads(line[len("RESULT "):])
    got["stderr"] = proc.stderr
    return got


def test_a_script_that_imports_tiletune_before_cuda_forks_its_zygote_and_tunes_in_a_forked_worker():
    got = _run(touch=False)
    assert got["by"] == "fork" and got["refused"] == "" and got["hazard"] == "", got
    assert got["isolation"] == "process" and got["forked"] is True, got
    assert got["err"] < 0.1, got
    assert "Traceback" not in got["stderr"], got["stderr"][-3000:]


def test_a_script_that_touched_the_driver_gets_a_fresh_interpreter_and_tunes_the_same():
    got = _run(touch=True)
    assert got["by"] == "spawn" and got["refused"], got
    assert got["isolation"] == "process" and got["err"] < 0.1, got
