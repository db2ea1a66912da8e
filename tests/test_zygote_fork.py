"""The zygote as a fork of the process that imports tiletune (CPU): started in milliseconds with the
caller's imports, and made a process of its own: it holds none of the caller's descriptors, runs none
of its signal handlers, flushes none of its buffered output; a caller that cannot be forked safely (a
thread, CUDA touched) gets a fresh interpreter, as ``TILETUNE_ZYGOTE_START=spawn`` asks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("cloudpickle")

from tiletune import settings

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")

PRELUDE = """
import json, os, sys, time
def ready(z, timeout=60.0):
    t0 = time.monotonic()
    while not z.ready and not z.dead and time.monotonic() - t0 < timeout:
        time.sleep(0.01)
    assert z.ready, open(z.log_path).read()[-3000:]
    return time.monotonic() - t0
"""


def run(body: str, timeout: float = 120.0, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TILETUNE_")}
    full_env.update({"TILETUNE_WORKER_ZYGOTE": "on", "PYTHONPATH": SRC + os.pathsep + full_env.get("PYTHONPATH", "")})
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def result(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_the_zygote_is_a_fork_of_the_importing_process_and_forks_working_workers():
    got = result(run("""
        import torch
        import tiletune
        from tiletune.devices.workers import zygote as zmod, WorkerProcess
        from tiletune.devices.backends import FakeBackend
        z = zmod._zygote
        wait = ready(z)
        w = WorkerProcess(FakeBackend(lambda c: 1.0), 0)
        w.start()
        ok = w.request({"op": "ping"}, 10).ok
        worker_parent = int(open(f"/proc/{w.proc.pid}/stat").read().rsplit(")", 1)[1].split()[1])
        zygote_parent = int(open(f"/proc/{z.proc.pid}/stat").read().rsplit(")", 1)[1].split()[1])
        closed = w.close(final=True)
        print("RESULT " + json.dumps({"by": z.started_by, "refused": z.fork_refused, "wait": wait, "ok": ok,
              "forked": w.forked, "worker_parent": worker_parent, "zygote": z.proc.pid, "zygote_parent": zygote_parent,
              "me": os.getpid(), "sid": os.getsid(z.proc.pid), "hazard": z.hazard, "closed": closed}))
    """))
    assert got["by"] == "fork" and got["refused"] == "" and got["hazard"] == ""
    assert got["zygote_parent"] == got["me"] and got["sid"] == got["zygote"]  # a session of its own
    assert got["ok"] and got["forked"] and got["worker_parent"] == got["zygote"]
    assert got["wait"] < 20.0  # its imports were done: no interpreter start, no torch import
    assert got["closed"] == 0


def test_the_fork_holds_none_of_the_callers_descriptors():
    """A child of the caller reading a pipe sees end-of-file when the caller closes its end: the zygote,
    forked after the pipe was made, must not hold a copy of that end (``cat`` would wait for ever)."""
    got = result(run("""
        import subprocess, torch
        cat = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        import tiletune
        from tiletune.devices.workers import zygote as zmod
        z = zmod._zygote
        ready(z)
        fds = sorted(int(fd) for fd in os.listdir(f"/proc/{z.proc.pid}/fd"))
        cat.stdin.close()
        try:
            code = cat.wait(timeout=10)
        except subprocess.TimeoutExpired:
            cat.kill()
            code = "hung"
        print("RESULT " + json.dumps({"by": z.started_by, "cat": code, "fds": fds}))
    """))
    assert got["by"] == "fork"
    assert got["cat"] == 0
    assert got["fds"][:3] == [0, 1, 2]


def test_the_callers_signal_handlers_and_buffered_output_stay_with_the_caller(tmp_path):
    marker = tmp_path / "handler-ran"
    proc = run(f"""
        import signal, torch
        signal.signal(signal.SIGTERM, lambda *a: open({str(marker)!r}, "a").write(str(os.getpid())))
        print("buffered before the fork", end="\\n")  # stdout is a pipe: block-buffered, not flushed yet
        import tiletune
        from tiletune.devices.workers import zygote as zmod, WorkerProcess
        from tiletune.devices.backends import FakeBackend
        z = zmod._zygote
        ready(z)
        w = WorkerProcess(FakeBackend(lambda c: 1.0), 0)
        w.start()
        w.request({{"op": "ping"}}, 10)
        w.close(final=True)
        os.kill(z.proc.pid, signal.SIGTERM)
        code = z.proc.wait(10)
        print("RESULT " + json.dumps({{"by": z.started_by, "code": code}}))
    """)
    got = result(proc)
    assert got["by"] == "fork"
    assert got["code"] == -15  # ended by the signal, not by the caller's handler
    assert not marker.exists()
    assert proc.stdout.count("buffered before the fork") == 1


@pytest.mark.parametrize("case", ["thread", "spawn"])
def test_a_caller_that_cannot_be_forked_gets_a_fresh_interpreter(case):
    body = """
        import threading, torch
        if CASE == "thread":
            threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        import tiletune
        from tiletune.devices.workers import zygote as zmod
        z = zmod._zygote
        ready(z)
        print("RESULT " + json.dumps({"by": z.started_by, "refused": z.fork_refused, "hazard": z.hazard}))
    """.replace("CASE", repr(case))
    got = result(run(body, **({"TILETUNE_ZYGOTE_START": "spawn"} if case == "spawn" else {})))
    assert got["by"] == "spawn" and got["hazard"] == ""
    assert got["refused"] == ("2 Python threads run" if case == "thread" else "")


def test_the_start_setting():
    assert settings.zygote_start() in ("fork", "spawn")
    old = os.environ.get("TILETUNE_ZYGOTE_START")
    try:
        os.environ["TILETUNE_ZYGOTE_START"] = " Spawn "
        assert settings.zygote_start() == "spawn"
        os.environ["TILETUNE_ZYGOTE_START"] = "vfork"
        with pytest.raises(ValueError, match="TILETUNE_ZYGOTE_START='vfork': choose one of fork, spawn"):
            settings.zygote_start()
        assert any("TILETUNE_ZYGOTE_START" in p for p in settings.check_all())
    finally:
        if old is None:
            os.environ.pop("TILETUNE_ZYGOTE_START", None)
        else:
            os.environ["TILETUNE_ZYGOTE_START"] = old


@pytest.mark.parametrize("forget", [True, False])
def test_a_fork_inside_an_import_lets_other_threads_import_once_its_import_locks_are_dropped(tmp_path, forget):
    """The zygote is forked inside ``import tiletune``: its main thread holds that import's lock for
    good. A thread of the copy (a worker's compile threads) importing a submodule waits for ever unless
    :func:`forget_import_locks` dropped it; the control case shows the hang it prevents (the import of a
    one-line module, a few milliseconds when the lock is dropped, still waiting after a second)."""
    pkg = tmp_path / "zfpkg"
    pkg.mkdir()
    (pkg / "sub.py").write_text("X = 1\n")
    (pkg / "__init__.py").write_text(textwrap.dedent(f"""
        import os, threading
        from tiletune.devices.workers.zygote_main import forget_import_locks
        pid = os.fork()
        if pid == 0:
            dropped = forget_import_locks() if {forget!r} else []
            done = threading.Event()
            def imp():
                import zfpkg.sub
                done.set()
            threading.Thread(target=imp, daemon=True).start()
            os._exit(0 if done.wait({5.0 if forget else 1.0}) and 'zfpkg' in dropped else (4 if done.is_set() else 3))
        CODE = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILETUNE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), SRC, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", "import zfpkg; print(zfpkg.CODE)"], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ("0" if forget else "3")


def test_a_plan_defined_in_the_module_that_imported_tiletune_reaches_the_forked_worker_whole(tmp_path):
    """The zygote was forked while ``zfmod`` (which imports tiletune, then defines its op) was being
    imported: in the copy ``zfmod`` holds only its first lines. A worker loading the plan by reference
    must import the module whole, not find that stub (which would send the tuning back into the
    caller's process, unisolated)."""
    (tmp_path / "zfmod.py").write_text(textwrap.dedent("""
        import torch
        import tiletune as tt
        from tiletune.devices.backends import FakeBackend
        from tiletune.devices.workers import IsolatedBackend

        be = FakeBackend(lambda c: 10.0 + c.K, noise=0.002, compile_s=0.0)

        def kern(x, y):
            y.copy_(x * 2)

        @tt.autotune(tt.Space(K=[0, 1, 2], baseline=dict(K=0)), reference=lambda x, y: x * 2, writes=["y"],
                     db=False, backend=IsolatedBackend(be, worker_spec=be), progress=False)
        def op(cfg, x, y):
            return tt.Launch(kern, (1,), (x, y))
    """))
    got = result(run("""
        import warnings
        warnings.simplefilter("error", RuntimeWarning)  # "tuning in this process without isolation"
        import torch
        import zfmod
        from tiletune.devices.workers import zygote as zmod
        x, y = torch.randn(16), torch.empty(16)
        zfmod.op(x, y)
        (r,) = zfmod.op.results.values()
        print("RESULT " + json.dumps({"by": zmod._zygote.started_by, "isolation": r.stats.get("isolation"),
              "forks": zmod._zygote.forks, "ok": bool(torch.equal(y, x * 2)), "winner": dict(r.winner)}))
    """, PYTHONPATH=os.pathsep.join([str(tmp_path), SRC, os.environ.get("PYTHONPATH", "")])))
    assert got["by"] == "fork"
    assert got["isolation"] == "process" and got["forks"] >= 1
    assert got["ok"] and got["winner"] == {"K": 0}


@pytest.mark.parametrize("detach", [True, False])
def test_the_callers_log_handlers_never_write_into_a_descriptor_the_fork_reuses(tmp_path, monkeypatch, detach):
    """The caller logs to a file (descriptor 3). In the fork that descriptor is closed and its number
    reused by the next socket (a worker's connection): a record sent through the caller's
    handler would land there. :func:`isolate` detaches the caller's handlers; the control case (the
    detaching stubbed out) shows the record arriving through the socket."""
    body = f"""
        import logging
        from tiletune.devices.workers import zygote_main
        logging.basicConfig(filename={str(tmp_path / "parent.log")!r}, level=logging.INFO)
        if not {detach!r}:
            zygote_main._detach_logging = lambda: None
        cmd_r, cmd_w = os.pipe()
        ev_r, ev_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            zygote_main.isolate(cmd_r, ev_w, {str(tmp_path / "child.log")!r})
            import socket
            mine, peer = socket.socketpair()  # the first free numbers: the log file's 3 among them
            logging.getLogger("app").warning("RECORD-FROM-THE-FORK")
            peer.setblocking(False)
            try:
                got = peer.recv(4096)
            except BlockingIOError:
                got = b""
            os._exit(3 if b"RECORD-FROM-THE-FORK" in got else 0)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        print("RESULT " + json.dumps({{"code": code}}))
    """
    got = result(run(body))
    assert got["code"] == (0 if detach else 3)


def test_a_plan_a_forked_worker_cannot_load_is_tuned_in_a_worker_started_from_scratch(tmp_path):
    """A module that imports differently in a copy of the zygote than in a fresh interpreter (here: it
    refuses to load where the zygote imported a marker module): the forked worker cannot open the
    session, so the op's workers start from scratch and the session runs there, isolated, instead of
    falling back to tuning in the caller's process."""
    (tmp_path / "zsmark.py").write_text("import builtins\nbuiltins._ZS_IN_ZYGOTE = True\n")
    (tmp_path / "zsplan.py").write_text(textwrap.dedent("""
        import builtins
        if getattr(builtins, "_ZS_IN_ZYGOTE", False):
            raise ImportError("zsplan refuses to load in a copy of the zygote")
        import tiletune as tt

        def kern(x, y):
            y.copy_(x * 2)

        def plan(cfg, x, y):
            return tt.Launch(kern, (1,), (x, y))
    """))
    got = result(run("""
        import warnings
        warnings.simplefilter("error", RuntimeWarning)  # "tuning in this process without isolation"
        import torch
        import tiletune as tt
        import zsplan
        from tiletune.devices.backends import FakeBackend
        from tiletune.devices.workers import IsolatedBackend, zygote as zmod
        be = FakeBackend(lambda c: 10.0 + c.K, noise=0.002, compile_s=0.0)
        op = tt.autotune(tt.Space(K=[0, 1, 2], baseline=dict(K=0)), reference=lambda x, y: x * 2, writes=["y"],
                         db=False, backend=IsolatedBackend(be, worker_spec=be), progress=False, name="zs")(zsplan.plan)
        x, y = torch.randn(16), torch.empty(16)
        op(x, y)
        (r,) = op.results.values()
        print("RESULT " + json.dumps({"by": zmod._zygote.started_by, "imports": zmod._zygote.info.get("modules"),
              "isolation": r.stats.get("isolation"), "retried": r.stats.get("fork_refused_session"),
              "forked": r.stats.get("worker_forked"), "ok": bool(torch.equal(y, x * 2)), "winner": dict(r.winner)}))
    """, TILETUNE_ZYGOTE_IMPORTS="zsmark",
        PYTHONPATH=os.pathsep.join([str(tmp_path), SRC, os.environ.get("PYTHONPATH", "")])))
    assert "zsmark" in got["imports"]
    assert got["isolation"] == "process" and got["retried"] is True and got["forked"] is False
    assert got["ok"] and got["winner"] == {"K": 0}


def test_a_compiler_warm_up_that_makes_forking_unsafe_is_skipped_by_the_next_zygote():
    """A fresh process (one Python thread: it can be forked) patches the zygote's compiler warm-up to start
    a thread before its zygote forks from it: forks are refused with the step named as the hazard, and the
    worker then gets a fresh zygote that skips the step and forks it."""
    from tiletune.devices.workers import zygote_main

    got = result(run("""
        import threading
        import torch
        from tiletune.devices.backends import cutile, FakeBackend
        from tiletune.devices.workers import zygote as zmod, WorkerProcess
        cutile.warm_compiler = lambda: threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        z = zmod.zygote()
        ready(z)
        w = WorkerProcess(FakeBackend(lambda c: 1.0), 0)
        w.start()
        z2 = zmod._zygote
        print("RESULT " + json.dumps({"by": z.started_by, "refused": z.fork_refused, "hazard": z.hazard,
              "module": z.hazard_module, "new": z2 is not z, "skip": sorted(z2.skip), "forked": w.forked,
              "compiler_s": z2.info.get("compiler_s"), "ping": w.request({"op": "ping"}, 10).ok}))
        w.close(final=True)
    """, TILETUNE_WORKER_PRESTART="0", TILETUNE_ZYGOTE_START="fork"))
    assert got["by"] == "fork", got["refused"]
    assert "Python threads run" in got["hazard"] and got["module"] == zygote_main.COMPILER_STEP
    assert got["new"] and zygote_main.COMPILER_STEP in got["skip"] and got["compiler_s"] is None
    assert got["forked"] and got["ping"]
