"""Where a new tuning worker's start-up goes on this host, and whether a process that imported torch,
cuda.tile and a kernel package (without touching the GPU) can fork children that use CUDA.

Each step runs in a fresh interpreter (medians of ``--reps``): bare start, ``import torch``, torch plus
a CUDA context, ``import cuda.tile``, ``import tilegym``. Then one process imports torch, cuda.tile and
tilegym, reports what a fork would inherit (CUDA initialised by torch, ``/dev/nvidia*`` descriptors
open, OS threads) and forks a child that creates a CUDA context and runs a kernel, timed.

Usage: python probe_worker_start.py --out DIR [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from _common import write_result

STEPS = {
    "python": "pass",
    "torch": "import torch",
    "torch_cuda_context": "import torch; torch.ones(1, device='cuda'); torch.cuda.synchronize()",
    "torch_cuda_tile": "import torch, cuda.tile",
    "torch_tilegym": "import torch, tilegym",
    "torch_tilegym_matmul": "import torch; from tilegym.ops.cutile.matmul import _matmul_kernel",
}

FORK_CHECK = r"""
import json, os, time, threading
t0 = time.perf_counter()
import torch, cuda.tile
t1 = time.perf_counter()
try:
    from tilegym.ops.cutile.matmul import _matmul_kernel
    tg = True
except Exception as exc:
    tg = repr(exc)
t2 = time.perf_counter()
def nvidia_fds():
    out = []
    for fd in os.listdir('/proc/self/fd'):
        try:
            p = os.readlink('/proc/self/fd/' + fd)
        except OSError:
            continue
        if p.startswith('/dev/nvidia'):
            out.append(p)
    return out
state = {"import_torch_cuda_tile_s": t1 - t0, "import_tilegym_s": t2 - t1, "tilegym": tg,
         "torch_cuda_initialized": torch.cuda.is_initialized(), "nvidia_fds": nvidia_fds(),
         "os_threads": len(os.listdir('/proc/self/task')), "py_threads": threading.active_count()}
r, w = os.pipe()
tf = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.close(r)
    res = {}
    try:
        a = time.perf_counter()
        x = torch.ones(1 << 20, device='cuda')
        torch.cuda.synchronize()
        res["child_cuda_context_s"] = time.perf_counter() - a
        res["child_sum"] = float(x.sum().item())
        res["child_since_fork_s"] = time.perf_counter() - tf
    except Exception as exc:
        res["child_error"] = repr(exc)
    os.write(w, json.dumps(res).encode())
    os._exit(0)
os.close(w)
data = b""
while True:
    chunk = os.read(r, 65536)
    if not chunk:
        break
    data += chunk
os.waitpid(pid, 0)
state.update(json.loads(data or b"{}"))
print("RESULT " + json.dumps(state))
"""


def run(code: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return time.perf_counter() - t0, (p.stdout + p.stderr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    steps = {}
    for name, code in STEPS.items():
        walls = []
        for _ in range(a.reps):
            wall, _out = run(code)
            walls.append(wall)
        steps[name] = {"median_s": round(statistics.median(walls), 3), "walls_s": [round(w, 3) for w in walls]}
        print(name, steps[name], flush=True)
    wall, out = run(FORK_CHECK)
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    fork = json.loads(line[-1][7:]) if line else {"error": out[-2000:]}
    fork["process_wall_s"] = round(wall, 3)
    print("fork", fork, flush=True)
    write_result("probe_worker_start", {"steps": steps, "fork_check": fork,
                                        "method": "fresh interpreters, medians of --reps; fork check: one process"}, a.out)


if __name__ == "__main__":
    main()
