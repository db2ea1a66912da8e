"""``import tiletune.kernels`` imports the op modules on a side thread where that pays (a GPU visible,
torch already imported by the program), so a model's first forward does not import them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

CHILD = textwrap.dedent(
    """
    import json, sys, time
    {pre}
    import tiletune.devices.workers.zygote as z
    z.gpu_visible = lambda: {gpu}
    import tiletune.kernels as K
    started = K._background is not None
    if started:
        K._background.join(120)
    print("RESULT " + json.dumps({{"started": started,
                                   "norms": "tiletune.kernels.norms" in sys.modules,
                                   "gemm": "tiletune.kernels.gemm" in sys.modules,
                                   "again": K.load_in_background()}}))
    """
)


def _run(pre: str = "import torch", gpu: bool = True, **env: str) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("TILETUNE_")}
    e.update(TILETUNE_WORKER_PRESTART="0", TILETUNE_WORKER_ZYGOTE="0", TILETUNE_DB=":memory:", **env)
    out = subprocess.run([sys.executable, "-c", CHILD.format(pre=pre, gpu=gpu)], env=e, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]  # quiet at exit too
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_the_op_modules_load_in_the_background_where_a_gpu_is_visible():
    pytest.importorskip("cuda.tile")
    got = _run()
    assert got == {"started": True, "norms": True, "gemm": True, "again": False}


@pytest.mark.parametrize("case", ["no_gpu", "prewarm_off", "torch_not_imported"])
def test_nothing_loads_in_the_background_otherwise(case):
    kw = {"no_gpu": {"gpu": False}, "prewarm_off": {"TILETUNE_PREWARM": "0"}, "torch_not_imported": {"pre": ""}}[case]
    got = _run(**kw)
    assert got["started"] is False and got["norms"] is False and got["gemm"] is False


FORK_CHILD = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {path!r})
    import torch
    import tiletune.devices.workers.zygote as z
    import tiletune.kernels as K
    if K._background is not None:  # a GPU machine: the op modules' own import ran first
        K._background.join()
        K._background = None
    z.gpu_visible = lambda: True
    assert K.load_in_background(modules=["slowmod"])
    time.sleep(0.3)  # the side thread is inside slowmod's import now
    pid = os.fork()
    if pid == 0:  # the child imports what the parent's thread was importing
        import slowmod
        os._exit(0 if slowmod.DONE else 3)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print("RESULT", os.waitstatus_to_exitcode(status))
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        print("RESULT hung")
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_waits_for_the_background_import(tmp_path):
    """A child forked while the side thread imports a module would find that module half imported, its
    lock held by a thread it does not have, and hang on importing it; the fork waits for the thread."""
    pytest.importorskip("cuda.tile")
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(1.5)\nDONE = True\n")
    e = {k: v for k, v in os.environ.items() if not k.startswith("TILETUNE_")}
    e.update(TILETUNE_WORKER_PRESTART="0", TILETUNE_WORKER_ZYGOTE="0", TILETUNE_DB=":memory:")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", FORK_CHILD.format(path=str(tmp_path))], env=e,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT 0" in out.stdout, (out.stdout, out.stderr[-2000:])


STEP_CHILD = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {path!r})
    import torch
    import tiletune.devices.workers.zygote as z
    import tiletune.kernels as K
    if K._background is not None:
        K._background.join()
        K._background = None
    z.gpu_visible = lambda: True
    assert K.load_in_background(modules=["slow_a", "slow_b", "slow_c"])
    time.sleep(0.3)  # the side thread is inside slow_a's import now
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # slow_a whole, slow_b and slow_c not begun here: the child imports them itself
        began = [m for m in ("slow_b", "slow_c") if m in sys.modules]
        import slow_a, slow_b, slow_c
        os._exit(0 if (slow_a.DONE and slow_b.DONE and slow_c.DONE and not began) else 3)
    forked_after = time.monotonic() - t0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        print("RESULT hung")
        sys.exit(0)
    K._background.join(30)
    print("RESULT", os.waitstatus_to_exitcode(status), round(forked_after, 2),
          all(m in sys.modules for m in ("slow_a", "slow_b", "slow_c")))
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_waits_for_one_module_not_the_whole_list(tmp_path):
    """The fork is made between two of the side thread's imports (the one under way finishes first), and
    the thread goes on with the rest afterwards: a worker forked early does not wait for every op module."""
    pytest.importorskip("cuda.tile")
    for name in ("slow_a", "slow_b", "slow_c"):
        (tmp_path / f"{name}.py").write_text("import time\ntime.sleep(1.0)\nDONE = True\n")
    e = {k: v for k, v in os.environ.items() if not k.startswith("TILETUNE_")}
    e.update(TILETUNE_WORKER_PRESTART="0", TILETUNE_WORKER_ZYGOTE="0", TILETUNE_DB=":memory:")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", STEP_CHILD.format(path=str(tmp_path))], env=e,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT"))
    _, code, forked_after, all_imported = line.split()
    assert code == "0", (out.stdout, out.stderr[-2000:])
    assert 0.4 <= float(forked_after) < 1.9, line  # slow_a's remaining 0.7 s, not the list's 2.7 s
    assert all_imported == "True", line
