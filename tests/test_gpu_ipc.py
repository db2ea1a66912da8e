"""CUDA IPC on the GPU (issue 43): tuning in a worker process gives the caller's memory back and
leaves no CUDA IPC share behind at exit (torch's "Producer process has been terminated before all
shared CUDA tensors released" warning). See tiletune.devices.workers.shipping for the life cycle."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("cuda.tile")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "helpers"))

from ipc_ops import make_double_op  # noqa: E402

N = 1 << 20  # float32: 4 MiB per argument, 8 MiB per session (x and y)
SLACK = 2 << 20  # less than one argument: a session's arguments (or their staging copies) left behind show


def _tune(op, tag: int) -> None:
    x = torch.randn(N, device="cuda")
    y = torch.empty_like(x)
    op(x, y, tag)
    torch.cuda.synchronize()
    assert torch.equal(y, x * 2)


def test_a_hundred_tuning_sessions_give_the_callers_memory_back():
    op = make_double_op("ipc_double_100")
    _tune(op, -1)  # the worker's start, cuTile's compiles and the allocator's pools are not what is measured
    torch.cuda.synchronize()
    torch.cuda.ipc_collect()
    base = torch.cuda.memory_allocated()
    for tag in range(100):
        _tune(op, tag)
    torch.cuda.synchronize()
    # tiletune collected after each worker reply: nothing waits in torch's IPC limbo
    assert torch.cuda.memory_allocated() - base < SLACK, (torch.cuda.memory_allocated() - base) / 2**20
    torch.cuda.ipc_collect()
    assert torch.cuda.memory_allocated() - base < SLACK, (torch.cuda.memory_allocated() - base) / 2**20
    assert op.tuning_count == 101
    for res in op.results.values():
        assert res.stats["isolation"] == "process", res.stats
        assert res.stats.get("shares_held") == 0, res.stats  # the worker kept no view of the caller's memory
        assert res.winner is not None, res.summary()


EXIT_SCRIPT = textwrap.dedent(r'''
    import ctypes, sys
    import torch
    from ipc_ops import make_double_op

    op = make_double_op("ipc_double_exit")
    kept = None
    for tag in range(5):
        x = torch.randn(1 << 20, device="cuda")
        y = torch.empty_like(x)
        op(x, y, tag)
        torch.cuda.synchronize()
        assert torch.equal(y, x * 2)
        if tag == 2:
            kept = (x, y)
    # arguments alive until the very end of the process (as a model's weights held by a compiled
    # graph are): a leaked reference keeps them past the interpreter's own clean-up
    for t in kept:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))
    assert op.tuning_count == 5
    print("OK", flush=True)
''')


def test_exit_after_tuning_is_silent(tmp_path):
    script = tmp_path / "ipc_exit.py"
    script.write_text(EXIT_SCRIPT)
    src = str(HERE.parent / "src")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([src, str(HERE / "helpers"), env.get("PYTHONPATH", "")])
    env["TILETUNE_ON_MISS"] = "tune"
    env.pop("TILETUNE_WORKER_TRACE", None)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK" in out.stdout
    assert "CudaIPCTypes" not in out.stderr and "Producer process has been terminated" not in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
