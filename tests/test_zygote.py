"""The zygote (CPU): workers forked from a process that imported their modules already, their exit
statuses reported through it, the caller's environment at fork time, and the fall-back to a worker
started from scratch whenever the zygote cannot fork safely."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cloudpickle")

from tiletune import settings
from tiletune.devices.backends import FakeBackend
from tiletune.devices.workers import WorkerProcess
from tiletune.devices.workers import zygote as zmod


@pytest.fixture(params=["fork", "spawn"])
def fresh_zygote(monkeypatch, tmp_path, request):
    """Zygotes on (this machine has no GPU), none shared with other tests; started either way (a fork of
    this process where it may be forked, else and with ``spawn`` a fresh interpreter)."""
    monkeypatch.setenv("TILETUNE_WORKER_ZYGOTE", "on")
    monkeypatch.setenv("TILETUNE_ZYGOTE_START", request.param)
    monkeypatch.setattr(zmod, "_zygote", None)
    monkeypatch.setattr(zmod, "_skip", set())
    monkeypatch.setattr(zmod, "_closed", False)
    yield
    z = zmod._zygote
    if z is not None:
        z.close()


def _wait_ready(z: zmod.Zygote, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while not z.ready and not z.dead and time.monotonic() - t0 < timeout:
        time.sleep(0.02)
    assert z.ready, open(z.log_path).read()[-2000:]


def test_setting_words():
    for raw, want in (("auto", "auto"), ("on", "on"), ("1", "on"), ("off", "off"), ("0", "off"), ("no", "off")):
        os.environ["TILETUNE_WORKER_ZYGOTE"] = raw
        try:
            assert settings.worker_zygote() == want
        finally:
            del os.environ["TILETUNE_WORKER_ZYGOTE"]
    assert settings.worker_zygote() == "auto"
    os.environ["TILETUNE_WORKER_ZYGOTE"] = "sometimes"
    try:
        with pytest.raises(ValueError, match="TILETUNE_WORKER_ZYGOTE"):
            settings.worker_zygote()
        assert any("TILETUNE_WORKER_ZYGOTE" in p for p in settings.check_all())
    finally:
        del os.environ["TILETUNE_WORKER_ZYGOTE"]


def test_off_or_no_gpu_means_no_zygote(monkeypatch):
    monkeypatch.setattr(zmod, "_zygote", None)
    monkeypatch.setenv("TILETUNE_WORKER_ZYGOTE", "off")
    assert zmod.zygote() is None
    monkeypatch.setenv("TILETUNE_WORKER_ZYGOTE", "auto")
    monkeypatch.setattr(zmod, "gpu_visible", lambda: False)
    assert zmod.zygote() is None
    monkeypatch.setenv("TILETUNE_WORKER_ZYGOTE", "on")
    monkeypatch.setenv("TILETUNE_IN_WORKER", "1")  # never inside a worker
    assert zmod.zygote() is None


def test_gpu_visible_honours_an_empty_device_list(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert zmod.gpu_visible() is False


# -- which modules a plan needs ------------------------------------------------------------------------
def _module(name: str, code: str) -> types.ModuleType:
    m = types.ModuleType(name)
    sys.modules[name] = m
    exec(textwrap.dedent(code), m.__dict__)
    return m


def test_plan_modules_follows_kernels_and_helpers():
    kern_mod = _module("zyg_kernels_pkg", """
        def _matmul(a, b):
            return a
        class Kernel:
            def __init__(self, f):
                self._f = f
            @property
            def _pyfunc(self):
                return self._f
        KERNEL = Kernel(_matmul)
    """)
    user = _module("zyg_user_main", """
        import json
        from zyg_kernels_pkg import KERNEL
        def launch_of(cfg, a):
            return KERNEL, json.dumps(cfg)
        def plan(cfg, a):
            def inner():
                return launch_of(cfg, a)
            return inner()
    """)
    try:
        user.__name__ = "__main__"  # a script's functions: followed, never imported
        for f in (user.plan, user.launch_of):
            f.__module__ = "__main__"
        mods = zmod.plan_modules([user.plan, None])
        assert "zyg_kernels_pkg" in mods  # the kernel object's function (cuTile keeps it as _pyfunc)
        assert "json" in mods  # a module the helper names
        assert "__main__" not in mods
        assert zmod.plan_modules([kern_mod._matmul]) == ["zyg_kernels_pkg"]
    finally:
        del sys.modules["zyg_kernels_pkg"], sys.modules["zyg_user_main"]


def test_fork_hazards_see_python_threads_and_extra_os_threads():
    import subprocess

    env = {**os.environ, "TILETUNE_WORKER_ZYGOTE": "off"}  # no zygote started on import: no thread of tiletune's
    code = ("import os; from tiletune.devices.workers.zygote_main import fork_hazards, os_threads;"
            "print(repr(fork_hazards(os_threads())))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=env).stdout.strip()
    assert out == "''"
    code = ("import threading, time; from tiletune.devices.workers.zygote_main import fork_hazards, os_threads;"
            "n = os_threads(); threading.Thread(target=time.sleep, args=(5,), daemon=True).start();"
            "print(fork_hazards(n))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=env).stdout.strip()
    assert out == "2 Python threads run", out


# -- workers forked ------------------------------------------------------------------------------------
def test_a_worker_forked_by_the_zygote_serves_and_reports_its_exit(fresh_zygote, monkeypatch):
    z = zmod.zygote()
    assert z is not None
    _wait_ready(z)
    assert not z.hazard, z.info
    w = WorkerProcess(FakeBackend(lambda c: 1.0), 0)
    try:
        w.start()
        assert w.forked and z.forks == 1
        assert isinstance(w.proc, zmod.ForkedProcess)
        assert w.request({"op": "ping"}, 10).ok
        pid = w.proc.pid
        assert os.readlink(f"/proc/{pid}/cwd") == os.getcwd()
        assert os.getpgid(pid) == pid  # a process group of its own, as a worker started from scratch
        proc = w.proc
        os.kill(pid, signal.SIGKILL)  # its status arrives through the zygote
        assert proc.wait(10) == -signal.SIGKILL
        assert w._exit_text() == "killed by signal SIGKILL"
        w.kill()
        w.start()  # the next one is forked too
        assert w.forked and z.forks == 2
        assert w.close() == 0 and w.graceful_exits == 1
    finally:
        w.close(final=True)


def test_a_changed_import_time_environment_gets_a_fresh_zygote(fresh_zygote, monkeypatch):
    z1 = zmod.zygote()
    _wait_ready(z1)
    monkeypatch.setenv("CUDA_TILE_CACHE_DIR", "/tmp/zyg-other-cache")  # cuda.tile reads it on import
    w = WorkerProcess(FakeBackend(lambda c: 1.0), 0)
    try:
        z2 = zmod.zygote()
        assert z2 is not z1 and z2.env_key != z1.env_key
        assert z1.fork(dict(os.environ), os.getcwd(), "/dev/null", 5) is None  # refused: stale imports
        w.start()
        assert w.alive
    finally:
        w.close(final=True)


def test_an_import_that_starts_a_thread_makes_the_zygote_refuse_and_workers_start_from_scratch(
        fresh_zygote, monkeypatch, tmp_path):
    (tmp_path / "zyg_threaded.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TILETUNE_ZYGOTE_IMPORTS", "json, zyg_threaded,zyg_no_such_module")
    z = zmod.zygote()
    _wait_ready(z)
    assert "Python threads run" in z.hazard and z.hazard_module == "zyg_threaded"
    assert "json" in z.info["modules"]
    assert z.fork(dict(os.environ), os.getcwd(), "/dev/null", 5) is None
    w = WorkerProcess(FakeBackend(lambda c: 1.0), 0)
    try:
        w.start()  # a fresh zygote that skips the module serves it
        z2 = zmod._zygote
        assert z2 is not z and "zyg_threaded" in z2.skip
        assert w.alive and w.forked
        w.request({"op": "ping"}, 10)
    finally:
        w.close(final=True)


def test_workers_import_the_modules_the_ops_plans_need_as_they_start(fresh_zygote, monkeypatch, tmp_path):
    from tiletune.devices.workers import client

    marker = tmp_path / "imported-by"
    (tmp_path / "zyg_kernel_pkg.py").write_text(
        f"import os\nopen({str(marker)!r}, 'a').write(str(os.getpid()) + '\\n')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(client, "_preload", [])
    monkeypatch.setattr(client, "_prestarted", {None})  # recorded, no worker of its own started here
    client.prestart(modules=["zyg_kernel_pkg"])
    assert client._preload == ["zyg_kernel_pkg"]
    w = WorkerProcess(FakeBackend(lambda c: 1.0), 0)
    try:
        w.start()
        assert w.forked
        assert marker.read_text().split() == [str(w.proc.pid)]  # imported there, before the first request
        assert "zyg_kernel_pkg" not in sys.modules or sys.modules["zyg_kernel_pkg"] is not None
    finally:
        w.close(final=True)


def test_a_dead_zygote_never_blocks_a_worker(fresh_zygote):
    z = zmod.zygote()
    _wait_ready(z)
    z.proc.kill()
    z.proc.wait(10)
    t0 = time.monotonic()
    while not z.dead and time.monotonic() - t0 < 10:
        time.sleep(0.02)
    w = WorkerProcess(FakeBackend(lambda c: 1.0), 0)
    try:
        w.start()
        assert w.alive
        assert zmod._zygote is not z  # replaced
    finally:
        w.close(final=True)


def test_a_tuning_session_through_a_forked_worker_with_the_environment_of_now(fresh_zygote, monkeypatch, tmp_path):
    import tiletune as tt
    from tiletune.devices.workers import IsolatedBackend

    z = zmod.zygote()
    _wait_ready(z)
    monkeypatch.setenv("ZYG_SIGN", "-1")  # set after the zygote started: the worker must see it
    monkeypatch.chdir(tmp_path)
    be = FakeBackend(lambda c: 10.0 + c.K * float(os.environ["ZYG_SIGN"]), noise=0.002, compile_s=0.0)
    iso = IsolatedBackend(be, worker_spec=be)

    def kern(x, y):
        y.copy_(x * 2)

    @tt.autotune(tt.Space(K=[0, 1, 2], baseline=dict(K=0)), reference=lambda x, y: x * 2, writes=["y"],
                 db=False, backend=iso, progress=False)
    def op(cfg, x, y):
        return tt.Launch(kern, (1,), (x, y))

    x, y = torch.randn(16), torch.empty(16)
    op(x, y)
    assert torch.equal(y, x * 2)
    (r,) = op.results.values()
    assert r.winner["K"] == 2
    assert zmod._zygote is not None and zmod._zygote.forks >= 1


def test_the_zygote_warms_cutiles_compiler_for_its_workers(fresh_zygote):
    """After its imports the zygote loads cuTile's compiler and asks tileiras its versions (where there is
    none, as here, the step's failure is reported, not fatal), then still forks."""
    from tiletune.devices.workers import zygote_main

    z = zmod.zygote()
    _wait_ready(z)
    assert z.info.get("compiler_s") is not None and not z.hazard
    failed = z.info.get("failed", {})
    assert set(failed) <= {zygote_main.COMPILER_STEP}
    w = WorkerProcess(FakeBackend(lambda c: 1.0), 0)
    try:
        w.start()
        assert w.alive and w.forked
    finally:
        w.close(final=True)

