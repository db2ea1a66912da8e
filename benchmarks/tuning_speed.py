"""Cold tuning time: tiletune vs cuTile's exhaustive_search on the same space, same run.

For the 32-config bf16 4096^3 matmul space and the 4-config RMSNorm space, each tuner runs in a
fresh process with an empty cuTile disk cache (and tiletune with an empty database); only the
tuning call is timed (imports and tensor set-up are not). tiletune runs isolated (candidates in a
worker process, the default): the reported time waits for the worker tiletune starts in the
background when the op is defined; ``tiletune_incl_worker_start_s`` starts it on the first call
instead, and ``tiletune_in_process_s`` is ``TILETUNE_ISOLATION=none``. Then both winners are re-timed in one
process, interleaved (A/B, cold L2), and the relative gap of their kernel times is reported.

    python benchmarks/tuning_speed.py [--out DIR]
Writes tuning_speed.json.
"""

from __future__ import annotations

import argparse
import json
import sys

from _common import fresh_env, run_child, write_result

SETUP = {
    "matmul": """
import torch, cuda.tile as ct
from tiletune.lab.examples.simple_matmul import MATMUL_SPACE, matmul_into
from tiletune.lab.examples.matmul_kernels import matmul_kernel, MATMUL_GROUP_M
torch.manual_seed(0)
n = 4096
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
SPACE, OP, ARGS, KERNEL = MATMUL_SPACE, matmul_into, (a, b, c), matmul_kernel
def grid_fn(cfg): return (((n + cfg["TM"] - 1) // cfg["TM"]) * ((n + cfg["TN"] - 1) // cfg["TN"]),)
def args_fn(cfg): return (a, b, c, cfg["TM"], cfg["TN"], cfg["TK"], MATMUL_GROUP_M)
""",
    "rmsnorm": """
import torch, cuda.tile as ct
from tiletune.lab.examples.rmsnorm import RMSNORM_SPACE, rms_norm_into, _sm_count
from tiletune.lab.examples.rmsnorm_kernels import rmsnorm_kernel, next_power_of_2
torch.manual_seed(0)
m, k = 16384, 4096
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
w = torch.randn(k, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x)
SPACE, OP, ARGS, KERNEL = RMSNORM_SPACE, rms_norm_into, (x, w, y, 1e-6), rmsnorm_kernel
def grid_fn(cfg): return (min(m, _sm_count(0) * cfg["occupancy"]),)
def args_fn(cfg): return (x, w, y, 1e-6, next_power_of_2(k))
""",
}

EXHAUSTIVE = """
import json, time
from cuda.tile.tune import exhaustive_search
space = [c.as_dict() for c in SPACE.candidates("sm_90")]
torch.cuda.synchronize()
t0 = time.perf_counter()
res = exhaustive_search(space, torch.cuda.current_stream(), grid_fn, KERNEL, args_fn,
                        lambda cfg: {"occupancy": cfg["occupancy"]}, quiet=True)
torch.cuda.synchronize()
wall = time.perf_counter() - t0
print("RESULT " + json.dumps({"wall_s": wall, "winner": dict(res.best.config), "winner_us": res.best.mean_us,
                              "ok": len(res.successes), "failed": len(res.failures)}))
"""

TILETUNE = """
import json, os, time
from tiletune.devices.workers import wait_for_worker
if os.environ.get("WAIT_WORKER") == "1":
    wait_for_worker(timeout=300)  # started in the background when the op was defined (at import)
torch.cuda.synchronize()
t0 = time.perf_counter()
OP(*ARGS)
torch.cuda.synchronize()
wall = time.perf_counter() - t0
(r,) = OP.results.values()
print("RESULT " + json.dumps({"wall_s": wall, "winner": dict(r.winner), "winner_us": r.winner_median_us,
                              "ok": len(r.successes), "failed": len(r.failures), "samples": r.stats.get("samples"),
                              "parallel_compile": r.stats.get("parallel_compile"),
                              "prefetch_hits": r.stats.get("prefetch_hits"),
                              "max_first_launch_s": max(r.stats.get("first_launch_s") or [0]),
                              "isolation": r.stats.get("isolation", "none"),
                              "worker_wait_s": r.stats.get("worker_wait_s"),
                              "arg_copy_s": r.stats.get("arg_copy_s"),
                              "worker_restarts": r.stats.get("worker_restarts")}))
"""

AB = """
import json
from tiletune.devices.backends.cutile import HintedKernels
from _common import interleaved_ab
h = HintedKernels()
s = torch._C._cuda_getCurrentRawStream(0)
def launcher(cfg):
    k = h.get(KERNEL, {"occupancy": cfg["occupancy"]})
    g, a = grid_fn(cfg), args_fn(cfg)
    return lambda: ct.launch(s, g, k, a)
A, B = json.loads(%r)
print("RESULT " + json.dumps(interleaved_ab(launcher(A), launcher(B))))
"""


def measure(problem: str, repeats: int) -> dict:
    # cuTile's search runs without tiletune's worker (none is started in its process)
    ex = run_child(SETUP[problem] + EXHAUSTIVE, fresh_env(TILETUNE_WORKER_PRESTART="0"))
    # tiletune, isolated (the default): the worker is started when the op is defined; timed once it
    # is up, and once from a cold start of the worker on the first call
    tts = [run_child(SETUP[problem] + TILETUNE, fresh_env(WAIT_WORKER="1")) for _ in range(repeats)]
    cold = run_child(SETUP[problem] + TILETUNE, fresh_env(TILETUNE_WORKER_PRESTART="0"))
    inproc = run_child(SETUP[problem] + TILETUNE, fresh_env(TILETUNE_ISOLATION="none"))
    tt = tts[0]
    ab = run_child(SETUP[problem] + AB % json.dumps([ex["winner"], tt["winner"]]), fresh_env())
    return {
        "exhaustive_s": ex["wall_s"],
        "tiletune_s": tt["wall_s"],
        "tiletune_s_all": [r["wall_s"] for r in tts],
        "ratio": tt["wall_s"] / ex["wall_s"],
        "isolation": tt["isolation"],
        "tiletune_incl_worker_start_s": cold["wall_s"],
        "ratio_incl_worker_start": cold["wall_s"] / ex["wall_s"],
        "tiletune_in_process_s": inproc["wall_s"],
        "ratio_in_process": inproc["wall_s"] / ex["wall_s"],
        "exhaustive_winner": ex["winner"],
        "tiletune_winner": tt["winner"],
        "exhaustive_reported_us": ex["winner_us"],
        "tiletune_reported_us": tt["winner_us"],
        "ab_exhaustive_us": ab["a_us"],
        "ab_tiletune_us": ab["b_us"],
        "winner_gap": ab["gap"],
        "ab_samples_each": ab["samples_each"],
        "tiletune_detail": tts[0],
        "exhaustive_detail": ex,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeats", type=int, default=1, help="tiletune cold runs (the first is reported)")
    args = ap.parse_args()
    mm = measure("matmul", args.repeats)
    rn = measure("rmsnorm", args.repeats)
    write_result("tuning_speed", {
        "problem": "bf16 matmul 4096^3, 32 configs (TM,TN in 64/128/256 not both 256, TK 32/64, occupancy 1/2)",
        **{k: mm[k] for k in ("exhaustive_s", "tiletune_s", "ratio", "winner_gap")},
        "isolation": mm["isolation"],
        "ratio_incl_worker_start": mm["ratio_incl_worker_start"], "ratio_in_process": mm["ratio_in_process"],
        "target_ratio": 0.15, "target_winner_gap": 0.02,
        "matmul": mm,
        "rmsnorm": {"problem": "bf16 RMSNorm 16384x4096, occupancy 1/2/4/8", **rn},
    }, args.out)


if __name__ == "__main__":
    sys.exit(main())
