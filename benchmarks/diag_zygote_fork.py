"""Where a zygote forked from the caller stops on a GPU host (diagnostic; prints, writes nothing).

    python benchmarks/diag_zygote_fork.py [--wait 30]
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import time


def fds() -> list[str]:
    out = []
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            out.append(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            pass
    return out


def threads() -> list[str]:
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{t}/comm").read().strip())
        except OSError:
            pass
    return names


def proc_state(pid: int) -> str:
    try:
        st = [ln.strip() for ln in open(f"/proc/{pid}/status") if ln.startswith(("State", "Threads"))]
        wchan = open(f"/proc/{pid}/wchan").read()
        return f"{st} wchan={wchan}"
    except OSError as exc:
        return str(exc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wait", type=float, default=30.0)
    args = ap.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a C handler: survives the forks
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import cuda.tile  # noqa: F401

    print(f"[{time.perf_counter() - t0:.2f}] torch+cuda.tile: threads {threads()} fds {fds()}", flush=True)
    import tiletune  # noqa: F401
    from tiletune.devices.workers import WorkerProcess
    from tiletune.devices.workers import zygote as zmod

    z = zmod._zygote
    print(f"[{time.perf_counter() - t0:.2f}] zygote {z and z.started_by} refused={z and z.fork_refused!r} "
          f"pid={z and z.proc.pid}", flush=True)
    t1 = time.monotonic()
    while z is not None and not z.ready and not z.dead and time.monotonic() - t1 < args.wait:
        time.sleep(0.02)
    print(f"[{time.perf_counter() - t0:.2f}] ready={z and z.ready} dead={z and z.dead} info={z and z.info}", flush=True)
    if z is not None:
        print("zygote state:", proc_state(z.proc.pid), flush=True)
    w = WorkerProcess("cutile", 0)
    import threading

    box: dict = {}

    def start() -> None:
        try:
            w.start()
            box["ping"] = w.request({"op": "ping"}, 20).ok
        except BaseException as exc:  # noqa: BLE001
            box["error"] = f"{type(exc).__name__}: {exc}"

    th = threading.Thread(target=start, daemon=True)
    th.start()
    th.join(args.wait)
    print(f"[{time.perf_counter() - t0:.2f}] worker: {box} forked={w.forked} alive={th.is_alive()}", flush=True)
    pid = getattr(getattr(w, "proc", None), "pid", None)
    for who, p in (("zygote", z.proc.pid if z else None), ("worker", pid)):
        if p:
            print(who, p, proc_state(p), flush=True)
            try:
                os.kill(p, signal.SIGUSR1)
            except OSError as exc:
                print("kill", exc)
    time.sleep(1.0)
    if z is not None:
        print("---- zygote log ----\n" + open(z.log_path, errors="replace").read()[-6000:], flush=True)
    log = getattr(w, "_log_path", None)
    if log and os.path.exists(log):
        print("---- worker log ----\n" + open(log, errors="replace").read()[-8000:], flush=True)
    try:
        w.close(final=True)
    except BaseException as exc:  # noqa: BLE001
        print("close:", exc)
    print(f"[{time.perf_counter() - t0:.2f}] done", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
