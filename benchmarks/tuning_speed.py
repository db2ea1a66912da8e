"""Cold tuning time: tiletune vs cuTile's ``exhaustive_search``, each side in a fresh process with empty caches.

Kernels (``--kernels``, default all three):

* ``tilegym_matmul``: TileGym 1.5.1's ``_matmul_kernel`` (``tilegym.ops.cutile.matmul``, from the
  ``tilegym`` wheel) over the catalogue's ``matmul`` template, 38 sm_90 configs (TM, TN, TK,
  occupancy, num_worker_warps; the template's GROUP_M and LAT are single values the kernel does not
  take), bf16 4096^3;
* ``matmul``: the project's example matmul (``tiletune.lab.examples.matmul_kernels``), 32 configs, bf16 4096^3;
* ``rmsnorm``: the example persistent RMSNorm (``tiletune.lab.examples.rmsnorm_kernels``), 4 configs
  (occupancy), bf16 16384x4096.

Every side of every repetition runs in its own fresh process with a fresh, empty
``CUDA_TILE_CACHE_DIR`` (cuTile reads it at import; tiletune's front-end cubin cache lives in
``<that folder>/tiletune-frontend``, so it starts empty too), a fresh ``TILETUNE_DB`` and
``TILETUNE_CACHE_DIR``, tuning tables off (``TILETUNE_TABLES=0``) and no inherited ``TILETUNE_*``
setting. The sides alternate: even repetitions run ``exhaustive_search`` first, odd ones tiletune
first. Only the tuning call is timed (imports and tensor set-up are not); the process's whole wall
time is reported beside it (``*_process_s``).

* exhaustive side: ``cuda.tile.tune.exhaustive_search`` in-process over the same configs (the
  space's candidates on sm_90, in the same order), the config's hints applied by ``hints_fn``;
* tiletune side: the child imports tiletune first, as README's troubleshooting asks of a program that
  imports a package which initialises CUDA (TileGym does), so its worker helper is forked from the child;
  the op is defined with ``tiletune.autotune`` right before its first call, and that call is timed. Isolation is tiletune's default (a worker process); the worker is
  started when the op is defined, so its start-up is inside the timed call.

Then, per kernel, every config either side picked in any repetition is re-timed in ONE process,
interleaved round-robin (cold L2, ``tiletune.devices.measure.ColdL2Timer``), and each repetition's
``pick_gap`` is (tiletune pick's time / exhaustive pick's time) - 1.

    python benchmarks/tuning_speed.py [--out DIR] [--reps 3] [--quick] [--kernels a,b]

Writes tuning_speed_cold.json::

    {"rows": [{"kernel", "configs", "exhaustive_s", "tiletune_s", "ratio", "pick_gap",
               "exhaustive_process_s", "tiletune_process_s", "reps": [...]}],
     "breakdown": {kernel: {stat: median over repetitions}}, gpu, driver, versions, date, ...}

``exhaustive_s``, ``tiletune_s``, ``pick_gap`` and the process times are medians over the
repetitions; ``ratio`` = median tiletune_s / median exhaustive_s. ``breakdown`` holds tiletune's own
``TuneResult.stats`` (numbers as they are, number lists as ``<name>_sum`` / ``<name>_n``), the
measurements' compile seconds (``compile_s_sum``: summed over configs, which compile in parallel,
so it can exceed the wall time) and ``outside_session_s`` (timed call minus the session clock), which
``miss_s`` (the miss's start to the chain's answer, the session inside it), ``store_s``, ``install_s`` and
``first_launch_s`` (the caller preparing and enqueuing the winner) break down.

``--quick``: 1 repetition, kernels ``tilegym_matmul`` and ``rmsnorm`` (about 2 min on the H200;
the full run about 6-7 min).

``--order-ab``: instead, only the tiletune side, ``--reps`` times per kernel with
``TILETUNE_COMPILE_ORDER=largest`` and ``given`` each (alternating which goes first), every run cold as
above; writes ``compile_order_ab.json``: ``{"rows": [{"kernel", "largest_s", "given_s", "ratio", "runs"}]}``
(medians; ``ratio`` = largest / given; each run keeps its compile-trace summary). ``--env-ab VAR=A,B`` does the
same for any environment variable (``TILETUNE_COMPILE_WORKERS=16,8``: how many compile processes the 16
host cores serve best) into ``env_ab_<var>.json``: ``{"rows": [{"kernel", "<A>_s", "<B>_s", "ratio", "runs"}]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from _common import ROOT, failure_fields, write_result

SIDES = ("exhaustive", "tiletune")
KERNELS = ("tilegym_matmul", "matmul", "rmsnorm")
QUICK_KERNELS = ("tilegym_matmul", "rmsnorm")

PROBLEMS = {
    "tilegym_matmul": "TileGym 1.5.1 _matmul_kernel, bf16 4096^3, catalogue matmul template (38 sm_90 configs)",
    "matmul": "tiletune.lab.examples matmul_kernel, bf16 4096^3, 32 configs (TM,TN in 64/128/256 not both 256, "
              "TK 32/64, occupancy 1/2)",
    "rmsnorm": "tiletune.lab.examples rmsnorm_kernel, bf16 16384x4096, occupancy 1/2/4/8",
}

# Each setup defines: NAME, SPACE (a tiletune Space), KERNEL, ARGS (the call's tensors), launch_of(cfg,
# *args) -> (grid, kernel args) written in terms of its arguments (the tiletune worker calls the plan on
# its own copies), hints_of(cfg) (cuTile hints), REFERENCE, TOLERANCE, WRITES.
SETUP = {
    "tilegym_matmul": """
import torch, cuda.tile as ct
from tilegym.ops.cutile.matmul import _matmul_kernel as KERNEL
from tiletune.space.templates import matmul_space
from tiletune.devices.verify import derived_tolerances
try:
    import tilegym; VERSION = getattr(tilegym, "__version__", None)
except Exception:
    VERSION = None
torch.manual_seed(0)
n = 4096
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
NAME, SPACE, ARGS, WRITES = "bench.tilegym_matmul", matmul_space(2), (a, b, c), [2]
def launch_of(cfg, a, b, c):
    tm, tn = cfg["TM"], cfg["TN"]
    return (((a.shape[0] + tm - 1) // tm) * ((b.shape[1] + tn - 1) // tn), 1, 1), (a, b, c, tm, tn, cfg["TK"])
def hints_of(cfg):
    return {"occupancy": cfg["occupancy"], "num_worker_warps": cfg["num_worker_warps"]}
def REFERENCE(a, b, c):
    return (a.float() @ b.float()).to(c.dtype)
def TOLERANCE(a, b, c):
    return derived_tolerances(length=a.shape[1], atol_ulps=2.0)
""",
    "matmul": """
import torch, cuda.tile as ct
import tiletune as tt
from tiletune.lab.examples.matmul_kernels import (matmul_kernel as KERNEL, MATMUL_GROUP_M, MATMUL_SPACE_PARAMS,
                                              MATMUL_BASELINE, tile_fits)
from tiletune.devices.verify import derived_tolerances
VERSION = None
torch.manual_seed(0)
n = 4096
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
SPACE = tt.Space(**MATMUL_SPACE_PARAMS, constraints={"tile_fits": tile_fits}, baseline=MATMUL_BASELINE)
NAME, ARGS, WRITES = "bench.matmul", (a, b, c), [2]
def launch_of(cfg, a, b, c):
    tm, tn = cfg["TM"], cfg["TN"]
    return (((a.shape[0] + tm - 1) // tm) * ((b.shape[1] + tn - 1) // tn),), (a, b, c, tm, tn, cfg["TK"], MATMUL_GROUP_M)
def hints_of(cfg):
    return {"occupancy": cfg["occupancy"]}
def REFERENCE(a, b, c):
    return (a.float() @ b.float()).to(c.dtype)
def TOLERANCE(a, b, c):
    return derived_tolerances(length=a.shape[1], atol_ulps=2.0)
""",
    "rmsnorm": """
import torch, cuda.tile as ct
import tiletune as tt
from tiletune.lab.examples.rmsnorm_kernels import (rmsnorm_kernel as KERNEL, next_power_of_2, RMSNORM_SPACE_PARAMS,
                                               RMSNORM_BASELINE)
from tiletune.devices.verify import derived_tolerances
VERSION = None
torch.manual_seed(0)
m, k = 16384, 4096
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
w = torch.randn(k, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x)
SPACE = tt.Space(**RMSNORM_SPACE_PARAMS, baseline=RMSNORM_BASELINE)
NAME, ARGS, WRITES = "bench.rmsnorm", (x, w, y, 1e-6), [2]
def launch_of(cfg, x, w, y, eps):
    sms = torch.cuda.get_device_properties(x.get_device()).multi_processor_count
    return (max(1, min(x.shape[0], sms * cfg["occupancy"])),), (x, w, y, eps, next_power_of_2(x.shape[1]))
def hints_of(cfg):
    return {"occupancy": cfg["occupancy"]}
def REFERENCE(x, w, y, eps):
    xf = x.float()
    return (xf * (xf.pow(2).mean(dim=-1, keepdim=True) + eps).rsqrt() * w.float()).to(y.dtype)
def TOLERANCE(x, *_):
    return derived_tolerances(length=x.shape[-1])
""",
}

EXHAUSTIVE = """
import json, time
from cuda.tile.tune import exhaustive_search
space = [c.as_dict() for c in SPACE.candidates("sm_90")]
torch.cuda.synchronize()
t0 = time.perf_counter()
res = exhaustive_search(space, torch.cuda.current_stream(), lambda cfg: launch_of(cfg, *ARGS)[0], KERNEL,
                        lambda cfg: launch_of(cfg, *ARGS)[1], hints_of, quiet=True)
torch.cuda.synchronize()
wall = time.perf_counter() - t0
print("RESULT " + json.dumps({"wall_s": wall, "configs": len(space), "pick": dict(res.best.config),
                              "pick_us": res.best.mean_us, "ok": len(res.successes), "failed": len(res.failures),
                              "kernel_version": VERSION}))
"""

TILETUNE = """
import json, time
import tiletune as tt

def plan(cfg, *args):
    grid, kargs = launch_of(cfg.as_dict(), *args)
    return tt.Launch(KERNEL, grid, kargs)

torch.cuda.synchronize()
t0 = time.perf_counter()
call_at = time.time()
op = tt.autotune(SPACE, reference=REFERENCE, writes=WRITES, name=NAME, tolerance=TOLERANCE, progress=False)(plan)
op(*ARGS)
torch.cuda.synchronize()
wall = time.perf_counter() - t0
(r,) = op.results.values()
stats = {}
for key, v in dict(r.stats).items():
    if isinstance(v, bool):
        stats[key] = v
    elif isinstance(v, (int, float)):
        stats[key] = v
    elif isinstance(v, (list, tuple)) and v and all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in v):
        stats[key + "_sum"] = float(sum(v))
        stats[key + "_n"] = len(v)
    elif key == "faults":
        stats["faults_n"] = len(v)
    elif key == "phases" and isinstance(v, dict):  # where the session's time went (PhaseTimer)
        stats.update({"phase_" + k: x for k, x in v.items() if isinstance(x, (int, float)) and not isinstance(x, bool)})
comp = [m.compile_s for m in r.measurements if m.compile_s]
stats["compile_s_sum"] = float(sum(comp))
stats["compile_s_max"] = float(max(comp)) if comp else 0.0
stats["tune_wall_s"] = float(r.wall_s)
if isinstance(stats.get("session_clock_s"), (int, float)):
    stats["outside_session_s"] = wall - stats["session_clock_s"]
# what the session measured of each config (median, samples, how its race ended) and the tie band's members:
# a pick that differs from exhaustive_search's is read from these
measured = [{"config": dict(m.config), "status": m.status.value, "n": len(m.samples_us),
             "median_us": sorted(m.samples_us)[len(m.samples_us) // 2] if m.samples_us else None,
             "baseline": bool(m.is_baseline)} for m in r.measurements]
print("RESULT " + json.dumps({"wall_s": wall, "configs": len(SPACE.candidates("sm_90")), "pick": dict(r.winner),
                              "pick_us": r.winner_median_us, "ok": len(r.successes), "failed": len(r.failures),
                              "isolation": r.stats.get("isolation", "none"), "stats": stats, "call_at": call_at,
                              "kernel_version": VERSION, "measured": measured,
                              "tied": [dict(t) for t in (r.tied or ())]}))
"""

RETIME = """
import json
from tiletune.devices.backends.cutile import HintedKernels
from tiletune.devices.measure import ColdL2Timer
cfgs = json.loads(%r)
h = HintedKernels()
s = torch._C._cuda_getCurrentRawStream(0)
def launcher(cfg):
    k = h.get(KERNEL, hints_of(cfg))
    g, a = launch_of(cfg, *ARGS)
    return lambda: ct.launch(s, g, k, a)
fns = [launcher(c) for c in cfgs]
timer = ColdL2Timer(0)
for f in fns:
    timer.time(f, 3)
samples = [[] for _ in fns]
for _ in range(%d):
    for i, f in enumerate(fns):
        samples[i] += timer.time(f, %d)
med = [sorted(v)[len(v) // 2] for v in samples]
print("RESULT " + json.dumps({"us": med, "samples_each": len(samples[0])}))
"""


# -- pure parts (CPU-tested) ------------------------------------------------------------------------

def side_order(rep: int) -> tuple[str, str]:
    """Which side runs first in repetition ``rep``: exhaustive on even repetitions, tiletune on odd."""
    return SIDES if rep % 2 == 0 else (SIDES[1], SIDES[0])


def config_key(cfg: dict[str, Any]) -> str:
    return json.dumps(cfg, sort_keys=True)


def distinct_picks(reps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every config either side picked in any repetition, once each, in first-seen order."""
    seen: dict[str, dict[str, Any]] = {}
    for r in reps:
        for side in SIDES:
            cfg = r.get(f"{side}_pick")
            if cfg is not None:
                seen.setdefault(config_key(cfg), cfg)
    return list(seen.values())


def pick_gap(tiletune_us: float, exhaustive_us: float) -> float:
    """(tiletune pick's time / exhaustive pick's time) - 1: > 0 when tiletune's pick is slower."""
    return tiletune_us / exhaustive_us - 1.0


def median(values: Sequence[float | None]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(kernel: str, configs: int | None, reps: list[dict[str, Any]],
              retimed_us: dict[str, float] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The row of ``kernel`` (medians over ``reps``) and its tiletune breakdown.

    ``reps``: one dict per repetition with ``exhaustive_s``, ``tiletune_s``, ``exhaustive_process_s``,
    ``tiletune_process_s``, ``exhaustive_pick``, ``tiletune_pick`` and ``tiletune_stats``.
    ``retimed_us``: interleaved time of each picked config (by :func:`config_key`). Each repetition gets
    its ``ratio`` and ``pick_gap`` (written into the rep dicts).
    """
    for r in reps:
        ex, tt = r.get("exhaustive_s"), r.get("tiletune_s")
        r["ratio"] = tt / ex if ex and tt is not None else None
        r["pick_gap"] = None
        if retimed_us and r.get("exhaustive_pick") is not None and r.get("tiletune_pick") is not None:
            a = retimed_us.get(config_key(r["exhaustive_pick"]))
            b = retimed_us.get(config_key(r["tiletune_pick"]))
            if a and b is not None:
                r["pick_gap"] = pick_gap(b, a)
    ex_s = median([r.get("exhaustive_s") for r in reps])
    tt_s = median([r.get("tiletune_s") for r in reps])
    row = {
        "kernel": kernel,
        "problem": PROBLEMS.get(kernel, kernel),
        "configs": configs,
        "exhaustive_s": ex_s,
        "tiletune_s": tt_s,
        "ratio": tt_s / ex_s if ex_s and tt_s is not None else None,
        "pick_gap": median([r.get("pick_gap") for r in reps]),
        "exhaustive_process_s": median([r.get("exhaustive_process_s") for r in reps]),
        "tiletune_process_s": median([r.get("tiletune_process_s") for r in reps]),
        "reps": reps,
    }
    names: list[str] = []
    for r in reps:
        for k in (r.get("tiletune_stats") or {}):
            if k not in names:
                names.append(k)
    breakdown: dict[str, Any] = {}
    for k in names:
        vals = [r["tiletune_stats"].get(k) for r in reps if r.get("tiletune_stats")]
        nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if nums:
            breakdown[k] = median(nums)
        elif vals:
            breakdown[k] = vals[0]
    return row, breakdown


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="result folder (default benchmarks/results/h200)")
    ap.add_argument("--reps", type=int, default=None, help="alternated repetitions per kernel (default 3; 1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="1 repetition, kernels tilegym_matmul and rmsnorm")
    ap.add_argument("--kernels", default=None, help="comma-separated subset of " + ",".join(KERNELS))
    ap.add_argument("--rounds", type=int, default=30, help="interleaved re-timing rounds (10 samples per config each)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one child process may take")
    ap.add_argument("--order-ab", action="store_true",
                    help="only tiletune, TILETUNE_COMPILE_ORDER=largest against given (compile_order_ab.json)")
    ap.add_argument("--env-ab", default=None, metavar="VAR=A,B",
                    help="only tiletune, the environment variable VAR at A against B (env_ab_<var>.json), e.g. "
                         "TILETUNE_COMPILE_WORKERS=16,8")
    args = ap.parse_args(argv)
    if args.env_ab is not None:
        try:
            args.env_ab = parse_env_ab(args.env_ab)
        except ValueError as exc:
            ap.error(str(exc))
    if args.reps is None:
        args.reps = 1 if args.quick else 3
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    if args.kernels:
        ks = [k.strip() for k in args.kernels.split(",") if k.strip()]
        unknown = [k for k in ks if k not in KERNELS]
        if unknown:
            ap.error(f"unknown kernel(s) {unknown}: choose from {list(KERNELS)}")
        args.kernels = tuple(ks)
    else:
        args.kernels = QUICK_KERNELS if args.quick else KERNELS
    return args


# -- processes ------------------------------------------------------------------------------------

def cold_env(**extra: str) -> dict[str, str]:
    """A child's environment: fresh empty cuTile cache (and so tiletune's front-end cache inside it),
    fresh tiletune database and cache folder, tables off, no inherited TILETUNE_* setting."""
    tmp = Path(tempfile.mkdtemp(prefix="tiletune-cold-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILETUNE_") and k != "CUDA_TILE_CACHE_DIR"}
    (tmp / "cutile-cache").mkdir()
    env["CUDA_TILE_CACHE_DIR"] = str(tmp / "cutile-cache")
    env["TILETUNE_DB"] = str(tmp / "tuning.db")
    env["TILETUNE_CACHE_DIR"] = str(tmp / "tiletune-cache")
    env["TILETUNE_TABLES"] = "0"
    env["TILETUNE_PROGRESS"] = "0"
    env["PYTHONPATH"] = f"{ROOT / 'src'}{os.pathsep}{ROOT / 'benchmarks'}{os.pathsep}" + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_timed(code: str, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run ``code`` in a fresh process; its ``RESULT`` dict plus ``process_s`` (the process's wall time)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    process_s = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            out = json.loads(line[len("RESULT "):])
            out["process_s"] = process_s
            return out
    raise RuntimeError(f"child printed no RESULT line:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def run_side(kernel: str, side: str, timeout: float, **extra: str) -> dict[str, Any]:
    if side == "exhaustive":  # no tiletune op is defined there: no worker starts
        return run_timed(SETUP[kernel] + EXHAUSTIVE, cold_env(TILETUNE_WORKER_PRESTART="0"), timeout)
    env = cold_env(**extra)
    trace = Path(env["TILETUNE_DB"]).with_name("compile-trace.jsonl")
    env["TILETUNE_COMPILE_TRACE"] = str(trace)
    # tiletune first, as README's troubleshooting asks of programs that import a package which initialises CUDA
    # (TileGym does): its worker helper is then forked from the program instead of started afresh
    got = run_timed("import tiletune\n" + SETUP[kernel] + TILETUNE, env, timeout)
    if trace.exists():
        lines = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
        got["compile_trace"] = compile_trace_summary([x for x in lines if "front" in x], got.get("call_at"),
                                                     [x for x in lines if "mark" in x])
    return got


def compile_trace_summary(jobs: Sequence[dict[str, Any]], call_at: float | None,
                          marks: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Where a session's compiles spent their wall time, from ``TILETUNE_COMPILE_TRACE`` lines: seconds after
    the timed call began (``call_at``; else after the first front end) of the first front end's start, the
    last front end's end, the first and last assembler start and the last end; summed front-end and
    assembler seconds; the mean assemblers running at once while any ran; the longest assembler run; the
    summed wait between a bytecode's arrival and its assembler's start; front ends per process; and the
    timeline's marks (``tiletune.devices.timeline``: the miss, each source asked, the session's start,
    its worker's requests, the pool's start...) as ``[name, seconds after the call, pid, details]``."""
    if not jobs:
        return {"jobs": 0, "marks": _marks(marks, call_at)} if not marks else \
            {"jobs": 0, "marks": _marks(marks, call_at), "before_compile": before_compile(marks)}
    base = call_at if call_at is not None else min(j["front"][0] for j in jobs)
    fronts = [j["front"] for j in jobs]
    asms = [j["asm"] for j in jobs]
    asm_sum = sum(b - a for a, b in asms)
    asm_span = max(b for _, b in asms) - min(a for a, _ in asms)
    per_pid: dict[str, int] = {}
    for j in jobs:
        per_pid[str(j["front_pid"])] = per_pid.get(str(j["front_pid"]), 0) + 1
    r = lambda x: round(x, 3)  # noqa: E731
    return {
        "jobs": len(jobs),
        "front_first_start": r(min(a for a, _ in fronts) - base),
        "front_last_end": r(max(b for _, b in fronts) - base),
        "front_sum_s": r(sum(b - a for a, b in fronts)),
        "asm_first_start": r(min(a for a, _ in asms) - base),
        "asm_last_start": r(max(a for a, _ in asms) - base),
        "asm_last_end": r(max(b for _, b in asms) - base),
        "asm_sum_s": r(asm_sum),
        "asm_max_s": r(max(b - a for a, b in asms)),
        "asm_mean_running": r(asm_sum / asm_span) if asm_span > 0 else None,
        "queue_wait_sum_s": r(sum(max(0.0, j["asm"][0] - j["queued"]) for j in jobs)),
        "front_procs": len(per_pid),
        "front_per_proc_max": max(per_pid.values()),
        "tags": [j.get("tag") for j in jobs],
        "pool_pids": sorted({j.get("pool_pid") for j in jobs}, key=str),
        "front_at": [[r(j["front"][0] - base), r(j["front"][1] - base)] for j in jobs],
        "asm_at": [r(j["asm"][0] - base) for j in jobs],
        "bytecode_bytes": [j.get("bytecode") for j in jobs],
        "asm_s": [r(b - a) for a, b in asms],
        "marks": _marks(marks, base),
        "before_compile": before_compile(marks),
    }


def before_compile(marks: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """Where the caller's miss went before its session sent the first compile: ``[step, seconds]`` from each of
    the calling process's marks (a source asked is ``source:<name>``) to its next one, from the miss to
    ``session_compile_sent`` (the other processes' and threads' marks in between are not steps)."""
    miss = next((m for m in sorted(marks, key=lambda m: m["t"]) if m["mark"] == "miss"), None)
    if miss is None:
        return []
    own = [m for m in sorted(marks, key=lambda m: m["t"]) if m["pid"] == miss["pid"] and m["t"] >= miss["t"]
           and m["mark"] != "worker_start"]
    out: list[list[Any]] = []
    for a, b in zip(own, own[1:]):
        name = f"source:{a['name']}" if a["mark"] == "source" and "name" in a else a["mark"]
        out.append([name, round(b["t"] - a["t"], 4)])
        if b["mark"] == "session_compile_sent":
            break
    return out


def _marks(marks: Sequence[dict[str, Any]], base: float | None) -> list[list[Any]]:
    if not marks:
        return []
    base = base if base is not None else min(m["t"] for m in marks)
    out = []
    for m in sorted(marks, key=lambda m: m["t"]):
        extra = {k: v for k, v in m.items() if k not in ("mark", "t", "pid")}
        out.append([m["mark"], round(m["t"] - base, 4), m["pid"], extra])
    return out


def retime(kernel: str, picks: list[dict[str, Any]], rounds: int, timeout: float) -> dict[str, float]:
    out = run_timed(SETUP[kernel] + RETIME % (json.dumps(picks), rounds, 10), cold_env(TILETUNE_WORKER_PRESTART="0"),
                    timeout)
    return {config_key(c): us for c, us in zip(picks, out["us"])}


def measure_kernel(kernel: str, reps: int, rounds: int, timeout: float) -> tuple[dict[str, Any], dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    configs = None
    version = None
    for rep in range(reps):
        r: dict[str, Any] = {"rep": rep, "first": side_order(rep)[0]}
        for side in side_order(rep):
            print(f"  {kernel} rep {rep}: {side} ...", flush=True)
            try:
                got = run_side(kernel, side, timeout)
            except Exception as exc:  # noqa: BLE001 - one failing side must not lose the others
                r[f"{side}_error"] = failure_fields(exc)["error"]
                continue
            configs = configs or got.get("configs")
            version = version or got.get("kernel_version")
            r[f"{side}_s"] = got["wall_s"]
            r[f"{side}_process_s"] = got["process_s"]
            r[f"{side}_pick"] = got["pick"]
            r[f"{side}_pick_reported_us"] = got["pick_us"]
            r[f"{side}_ok"], r[f"{side}_failed"] = got["ok"], got["failed"]
            if side == "tiletune":
                r["tiletune_stats"] = got.get("stats", {})
                r["tiletune_measured"] = got.get("measured")
                r["tiletune_tied"] = got.get("tied")
                if got.get("compile_trace"):
                    r["compile_trace"] = got["compile_trace"]
                r["isolation"] = got.get("isolation")
            print(f"    {got['wall_s']:.2f} s tuning, {got['process_s']:.2f} s process, pick {got['pick']}", flush=True)
        rows.append(r)
    picks = distinct_picks(rows)
    retimed = None
    if picks:
        try:
            retimed = retime(kernel, picks, rounds, timeout)
        except Exception as exc:  # noqa: BLE001
            print(f"  {kernel}: re-timing failed: {failure_fields(exc)['error'].splitlines()[0]}", flush=True)
    row, breakdown = summarize(kernel, configs, rows, retimed)
    row["picks_retimed_us"] = [{"config": c, "us": retimed.get(config_key(c))} for c in picks] if retimed else None
    if version:
        row["kernel_version"] = version
    return row, breakdown


ORDERS = ("largest", "given")


def parse_env_ab(spec: str) -> tuple[str, tuple[str, str]]:
    """``VAR=A,B`` -> ``(VAR, (A, B))`` (pure); a bad spec raises ValueError naming the form."""
    var, sep, vals = spec.partition("=")
    values = tuple(v.strip() for v in vals.split(","))
    if not sep or not var.strip() or len(values) != 2 or not all(values) or values[0] == values[1]:
        raise ValueError(f"--env-ab wants VAR=A,B with two different values, got {spec!r}")
    return var.strip(), (values[0], values[1])


def env_ab(kernel: str, reps: int, timeout: float, var: str, values: tuple[str, str]) -> dict[str, Any]:
    """The tiletune side alone, cold, ``reps`` times under each value of the environment variable ``var``
    (alternating which goes first): median seconds of each (``<value>_s``) and their ratio (first / second)."""
    runs: list[dict[str, Any]] = []
    for rep in range(reps):
        for value in (values if rep % 2 == 0 else values[::-1]):
            print(f"  {kernel} rep {rep}: {var}={value} ...", flush=True)
            run: dict[str, Any] = {"rep": rep, "value": value}
            try:
                got = run_side(kernel, "tiletune", timeout, **{var: value})
            except Exception as exc:  # noqa: BLE001 - one failing run must not lose the others
                run["error"] = failure_fields(exc)["error"]
                runs.append(run)
                continue
            run.update({"tiletune_s": got["wall_s"], "pick": got["pick"], "pick_us": got["pick_us"],
                        "compile_trace": got.get("compile_trace"),
                        "stats": {k: v for k, v in got.get("stats", {}).items() if k.startswith(("phase_", "ahead_"))
                                  or k in ("session_clock_s", "outside_session_s", "worker_wait_s")}})
            print(f"    {got['wall_s']:.2f} s", flush=True)
            runs.append(run)
    med = {v: median([r.get("tiletune_s") for r in runs if r["value"] == v]) for v in values}
    a, b = (med[v] for v in values)
    return {"kernel": kernel, "variable": var, "values": list(values), **{f"{v}_s": med[v] for v in values},
            "ratio": a / b if a and b else None, "runs": runs}


def order_ab(kernel: str, reps: int, timeout: float) -> dict[str, Any]:
    """:func:`env_ab` of ``TILETUNE_COMPILE_ORDER`` largest against given (``largest_s``, ``given_s``, ratio
    largest / given; each run names its ``order``)."""
    row = env_ab(kernel, reps, timeout, "TILETUNE_COMPILE_ORDER", ORDERS)
    for run in row["runs"]:
        run["order"] = run.pop("value")
    for key in ("variable", "values"):
        row.pop(key)
    return row


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    t0 = time.perf_counter()
    if args.env_ab:
        var, values = args.env_ab
        ab_rows = []
        for kernel in args.kernels:
            print(f"[{time.perf_counter() - t0:6.1f} s] {kernel} ({var} A/B)", flush=True)
            ab_rows.append(env_ab(kernel, args.reps, args.timeout, var, values))
            print("  " + ", ".join(f"{v} {ab_rows[-1][v + '_s']} s" for v in values), flush=True)
            write_result("env_ab_" + var.lower(), {
                "method": "tiletune side only, each run in a fresh process with empty caches (as tuning_speed_cold); "
                          f"{var} {values[0]} vs {values[1]}, alternating which goes first; medians",
                "variable": var, "values": list(values), "reps": args.reps, "rows": ab_rows,
                "complete": len(ab_rows) == len(args.kernels), "wall_s": round(time.perf_counter() - t0, 1)}, args.out)
        return
    if args.order_ab:
        ab_rows = []
        for kernel in args.kernels:
            print(f"[{time.perf_counter() - t0:6.1f} s] {kernel} (compile order A/B)", flush=True)
            ab_rows.append(order_ab(kernel, args.reps, args.timeout))
            print(f"  largest {ab_rows[-1]['largest_s']} s, given {ab_rows[-1]['given_s']} s", flush=True)
            write_result("compile_order_ab", {
                "method": "tiletune side only, each run in a fresh process with empty caches (as tuning_speed_cold); "
                          "TILETUNE_COMPILE_ORDER largest vs given, alternating which goes first; medians",
                "reps": args.reps, "rows": ab_rows, "complete": len(ab_rows) == len(args.kernels),
                "wall_s": round(time.perf_counter() - t0, 1)}, args.out)
        return
    rows, breakdown = [], {}
    for kernel in args.kernels:
        print(f"[{time.perf_counter() - t0:6.1f} s] {kernel}", flush=True)
        row, bd = measure_kernel(kernel, args.reps, args.rounds, args.timeout)
        rows.append(row)
        breakdown[kernel] = bd
        print(f"  exhaustive {row['exhaustive_s']} s, tiletune {row['tiletune_s']} s, ratio {row['ratio']}, "
              f"pick_gap {row['pick_gap']}", flush=True)
        # written after every kernel: a run cut short keeps the kernels it finished
        write_result("tuning_speed_cold", {
            "method": "each side in a fresh process with an empty CUDA_TILE_CACHE_DIR (and tiletune's front-end "
                      "cache inside it), fresh TILETUNE_DB, tables off; sides alternate (even reps exhaustive "
                      "first); only the tuning call timed; medians of the repetitions; picks re-timed interleaved "
                      "in one process",
            "reps": args.reps, "quick": args.quick, "rows": rows, "breakdown": breakdown,
            "kernels_planned": list(args.kernels), "complete": len(rows) == len(args.kernels),
            "wall_s": round(time.perf_counter() - t0, 1),
        }, args.out)


if __name__ == "__main__":
    sys.exit(main())
