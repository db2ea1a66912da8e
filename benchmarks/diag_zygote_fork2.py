"""A tuning session through a zygote forked from the caller, with every process's stacks on a hang
(diagnostic; prints only).  python benchmarks/diag_zygote_fork2.py [--wait 40]"""

from __future__ import annotations

import argparse
import faulthandler
import glob
import os
import signal
import sys
import threading
import time


def children(pid: int) -> list[int]:
    out = []
    for task in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            out += [int(x) for x in open(task).read().split()]
        except OSError:
            pass
    return out


def tree(pid: int) -> list[int]:
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += children(p)
    return seen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wait", type=float, default=40.0)
    args = ap.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    import torch

    import tiletune as tt
    from tiletune.devices.workers import zygote as zmod
    from tiletune.lab.examples import rmsnorm_kernels as rk

    z = zmod._zygote
    print("zygote", z and z.started_by, z and z.fork_refused, flush=True)
    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    op = tt.autotune(tt.Space(occupancy=[1, 2, 4], baseline=rk.RMSNORM_BASELINE),
                     reference=lambda x, w, y, eps: rk.rmsnorm_reference(x, w, eps), writes=["y"], db=False,
                     progress=False, name="diag_fork_rmsnorm")(
        lambda cfg, x, w, y, eps: tt.Launch(rk.rmsnorm_kernel, rk.rmsnorm_grid(cfg, x.shape[0], sms),
                                            rk.rmsnorm_args(cfg, x, w, y, eps)))

    box: dict = {}

    def run() -> None:
        t0 = time.perf_counter()
        try:
            op(x, w, y, 1e-6)
            torch.cuda.synchronize()
            (res,) = op.results.values()
            box["ok"] = {k: res.stats.get(k) for k in ("isolation", "worker_forked", "worker_wait_s")}
        except BaseException as exc:  # noqa: BLE001
            import traceback

            box["error"] = traceback.format_exc()[-3000:]
        box["s"] = time.perf_counter() - t0

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(args.wait)
    print("result", box, "hung" if th.is_alive() else "", flush=True)
    if th.is_alive():
        for p in tree(os.getpid()):
            try:
                comm = open(f"/proc/{p}/cmdline").read().replace("\0", " ")[:120]
                wchan = open(f"/proc/{p}/wchan").read()
            except OSError:
                comm = wchan = "?"
            print("proc", p, comm, "wchan", wchan, flush=True)
            if p != os.getpid():
                try:
                    os.kill(p, signal.SIGUSR1)
                except OSError:
                    pass
        faulthandler.dump_traceback(all_threads=True)
        time.sleep(1.0)
    if z is not None:
        print("---- zygote log ----\n" + open(z.log_path, errors="replace").read()[-5000:], flush=True)
    for log in glob.glob("/tmp/tiletune-worker-*/*.log") + glob.glob("/tmp/tiletune-*/worker*.log"):
        print(f"---- {log} ----\n" + open(log, errors="replace").read()[-6000:], flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
