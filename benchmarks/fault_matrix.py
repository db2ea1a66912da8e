"""Fault matrix: a tuning session survives every kind of faulty candidate (issue 11).

One row per fault kind of ``tests/helpers/fault_kernels.py`` (real cuTile kernels: out-of-bounds
gather and scatter, a misaligned gather, an endless loop, a device-side trap, a wrong result, NaN
output, an exception in the launch plan, a compile error): each is tuned in its own session beside
three good configs, all in ONE caller process, with the default isolation (a worker process). Then:

* ``concurrent_8``: 8 fresh processes miss the same key (the 32-config bf16 matmul) at the same
  moment; one tunes, the others wait for its winner.
* ``kill9_resume``: a process tuning that matmul is SIGKILLed once 8 configs are recorded; a new
  process resumes from them.

    python benchmarks/fault_matrix.py [--out DIR]
Writes fault_matrix.json: {"rows": [{"fault", "candidates", "survived", "winner_correct",
"records_lost", "caller_context_ok", "wall_s", ...}]}.

``--fault-space`` (issue 41, item 4) runs only the fault space instead: ONE 1-D kernel
(``fault_space_kernel`` of ``tests/helpers/fault_kernels.py``) tuned in one session over 28 configs,
12 good and 4 each that read an illegal address, loop forever, are wrong only on the last partial
tile, or write past the end of the output. The output ``y`` is a view of a larger buffer whose tail
holds a canary, so a write past the end lands in memory of the caller's (in the worker: of its
copy), where it can be seen. Each config's status is compared with its expected verdict
(:data:`EXPECTED`: good -> ok, illegal_read -> launch_error, endless_loop -> timeout, tail_wrong ->
mismatch, write_past_end -> mismatch or launch_error). Writes fault_space.json (a file of its own,
so the rows' environment and date in fault_matrix.json stay those of their run).

The checked run of each candidate writes into guard-banded twins of the written arguments
(``verify.GuardBand``: sentinel bytes before and after the output's elements), so a write past the end
that does not fault changes a band and comes back ``mismatch`` ("wrote outside argument 1: N bytes past
its end"); such a config is never timed and never wins. ``caller.canary_untouched`` shows that no
write_past_end config won and then hit the caller's memory (before the bands, one did)::

    {"fault_space": {"configs", "wall_s", "restarts", "verdicts_ok", "verdicts": {label: {...}},
                     "caller_ok", "caller": {...}, "winner", ...}}
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, fresh_env, run_child, write_result

HELPERS = ROOT / "tests" / "helpers"

ROWS = f"""
import json, os, sys, time
sys.path.insert(0, {str(HELPERS)!r})
import torch
import tiletune as tt
from tiletune.store import TuningDB
from fault_kernels import FAULTS, make_fault_op
db = TuningDB(os.environ["TILETUNE_DB"])
x = torch.randn(1 << 20, device="cuda")
rows = []
modes = [int(m) for m in os.environ.get("FAULT_MODES", ",".join(map(str, FAULTS))).split(",")]
for mode in modes:
    op = make_fault_op((mode,), db=db, name="fault_" + FAULTS[mode])
    y = torch.full_like(x, 7.0)
    t0 = time.perf_counter()
    survived, err = True, ""
    try:
        op(x, y)
    except Exception as exc:
        survived, err = False, f"{{type(exc).__name__}}: {{exc}}"
    wall = time.perf_counter() - t0
    res = next(iter(op.results.values()), None)
    try:
        ok_ctx = float((torch.ones(1, device="cuda") + 1).item()) == 2.0
        torch.cuda.synchronize()
    except Exception as exc:
        ok_ctx, err = False, err + f" | caller context: {{exc}}"
    row = {{"fault": FAULTS[mode], "survived": survived, "caller_context_ok": ok_ctx, "wall_s": round(wall, 3),
           "error": err}}
    if res is not None:
        stored = db.measurements(res.identity)
        planted = [m for m in res.measurements if m.config["MODE"] == mode]
        row.update({{
            "candidates": len(res.measurements),
            "winner": dict(res.winner),
            "winner_correct": res.winner["MODE"] == 0 and bool(torch.equal(y, x * 2)),
            "records_lost": len(res.measurements) - len(stored),
            "planted_status": planted[0].status.value if planted else None,
            "planted_reason": (planted[0].reason[:400] if planted else None),
            "worker_restarts": res.stats.get("worker_restarts"),
            "isolation": res.stats.get("isolation"),
        }})
    rows.append(row)
    print(json.dumps(row), file=sys.stderr, flush=True)
print("RESULT " + json.dumps({{"rows": rows}}))
"""

MATMUL_CHILD = f"""
import json, os, sys, time
import torch
from tiletune.lab.examples.simple_matmul import matmul_into
torch.manual_seed(0)
n = 4096
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
want = (a.float() @ b.float())
ready, go = os.environ.get("READY_FILE"), os.environ.get("GO_FILE")
if ready:
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
t0 = time.perf_counter()
matmul_into(a, b, c)
torch.cuda.synchronize()
wall = time.perf_counter() - t0
res = next(iter(matmul_into.results.values()), None)
err = float(((c.float() - want).norm() / want.norm()).item())
print("RESULT " + json.dumps({{"wall_s": wall, "tuned": matmul_into.tuning_count,
      "config": matmul_into.config_for(a, b, c).as_dict(), "rel_err": err,
      "resumed": res.stats.get("resumed") if res else None,
      "measurements": len(res.measurements) if res else None}}))
"""


SPACE_CHILD = f"""
import json, os, sys, time
sys.path.insert(0, {str(HELPERS)!r})
import torch
from fault_kernels import SPACE_FAULTS, make_fault_space_op
n = int(os.environ.get("FAULT_SPACE_N", str((1 << 22) + 77)))  # no T divides it: the last tile is partial
PAD, CANARY = 8192, 12345.0
torch.manual_seed(0)
x = torch.randn(n, device="cuda")
buf = torch.full((n + PAD,), CANARY, device="cuda")
y = buf[:n]
y.fill_(7.0)
bystander = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
torch.cuda.synchronize()
x_before, bystander_before = x.cpu().clone(), bystander.cpu().clone()
op = make_fault_space_op(name="fault_space")
t0 = time.perf_counter()
error = ""
try:
    op(x, y)
    torch.cuda.synchronize()
except Exception as exc:
    error = f"{{type(exc).__name__}}: {{exc}}"[:2000]
wall = time.perf_counter() - t0
caller = {{}}
try:
    caller["context_ok"] = float((torch.ones(1, device="cuda") + 1).item()) == 2.0
    caller["x_untouched"] = bool(torch.equal(x.cpu(), x_before))
    caller["x_checksum"] = [float(x_before.double().sum()), float(x.double().sum().item())]
    caller["bystander_untouched"] = bool(torch.equal(bystander.cpu(), bystander_before))
    caller["canary_untouched"] = bool((buf[n:] == CANARY).all().item())
    caller["canary_overwritten"] = int((buf[n:] != CANARY).sum().item())
    caller["y_correct"] = bool(torch.equal(y, x * 2))
except Exception as exc:
    caller["context_ok"] = False
    caller["error"] = f"{{type(exc).__name__}}: {{exc}}"[:2000]
res = next(iter(op.results.values()), None)
out = {{"n": n, "wall_s": wall, "error": error, "caller": caller, "space_size": len(op.space.configs("sm_90"))}}
if res is not None:
    out.update({{
        "measurements": [{{"config": dict(m.config), "fault": SPACE_FAULTS[m.config["MODE"]], "status": m.status.value,
                           "reason": m.reason[:300]}} for m in res.measurements],
        "winner": dict(res.winner),
        "restarts": res.stats.get("worker_restarts"),
        "worker_starts": res.stats.get("worker_starts"),
        "fault_kinds": [f.get("kind") for f in res.stats.get("faults") or []],
        "isolation": res.stats.get("isolation"),
        "stats": json.loads(json.dumps(res.stats, default=str)),
    }})
print("RESULT " + json.dumps(out))
"""

#: expected statuses of each planted behaviour of the fault space (the right reason category)
EXPECTED = {
    "good": ("ok",),
    "illegal_read": ("launch_error",),
    "endless_loop": ("timeout",),
    "tail_wrong": ("mismatch",),
    "write_past_end": ("mismatch", "launch_error"),
}


def config_label(cfg: dict) -> str:
    """``T=512,occupancy=1,MODE=3``: a config's key in ``verdicts``."""
    return ",".join(f"{k}={cfg[k]}" for k in ("T", "occupancy", "MODE") if k in cfg)


def verdicts(measurements: list[dict], space: list[dict] | None = None) -> tuple[dict[str, dict], bool]:
    """Each measured config's status against its expected one (:data:`EXPECTED`), and whether all
    matched. ``measurements``: ``{"config", "fault", "status", "reason"}`` rows. A config of ``space``
    with no measurement counts as a wrong verdict (status ``missing``)."""
    out: dict[str, dict] = {}
    for m in measurements:
        want = EXPECTED[m["fault"]]
        out[config_label(m["config"])] = {"fault": m["fault"], "status": m["status"], "expected": list(want),
                                          "ok": m["status"] in want, "reason": m.get("reason", "")}
    for cfg in space or []:
        label = config_label(cfg)
        if label not in out:
            out[label] = {"fault": cfg.get("fault"), "status": "missing", "expected": [], "ok": False, "reason": ""}
    return out, bool(out) and all(v["ok"] for v in out.values())


def fault_space_row() -> dict:
    """Tune the 28-config fault space in a fresh process (own caches, default isolation)."""
    got = run_child(SPACE_CHILD, fresh_env(TILETUNE_WATCHDOG_S=os.environ.get("TILETUNE_WATCHDOG_S", "10"),
                                           TILETUNE_TABLES="0"), timeout=900)
    v, ok = verdicts(got.get("measurements") or [])
    caller = got["caller"]
    caller_ok = all(caller.get(k) is True for k in ("context_ok", "x_untouched", "bystander_untouched",
                                                      "canary_untouched", "y_correct"))
    by_fault: dict[str, dict[str, int]] = {}
    for row in v.values():
        tally = by_fault.setdefault(row["fault"], {})
        tally[row["status"]] = tally.get(row["status"], 0) + 1
    return {
        "configs": len(got.get("measurements") or []), "space_size": got.get("space_size"), "n": got.get("n"),
        "wall_s": round(got["wall_s"], 3), "restarts": got.get("restarts"), "worker_starts": got.get("worker_starts"),
        "fault_kinds": got.get("fault_kinds"), "isolation": got.get("isolation"),
        "verdicts_ok": ok and len(v) == got.get("space_size"), "wrong_verdicts": sorted(k for k, r in v.items() if not r["ok"]),
        "statuses_by_fault": by_fault, "verdicts": v,
        "caller_ok": caller_ok, "caller": caller, "winner": got.get("winner"), "error": got.get("error"),
        "stats": got.get("stats"),
    }


def fault_rows() -> list[dict]:
    return run_child(ROWS, fresh_env(TILETUNE_WATCHDOG_S=os.environ.get("TILETUNE_WATCHDOG_S", "10")),
                     timeout=900)["rows"]


def concurrent_row(n: int = 8) -> dict:
    env = fresh_env()
    tmp = Path(tempfile.mkdtemp(prefix="tiletune-conc-"))
    go = tmp / "go"
    procs = []
    for i in range(n):
        e = dict(env, READY_FILE=str(tmp / f"ready{i}"), GO_FILE=str(go))
        procs.append(subprocess.Popen([sys.executable, "-c", MATMUL_CHILD], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    deadline = time.time() + 300
    while time.time() < deadline and sum((tmp / f"ready{i}").exists() for i in range(n)) < n:
        time.sleep(0.05)
    t0 = time.perf_counter()
    go.touch()
    outs, survived = [], True
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode != 0:
            survived = False
            print(err[-3000:], file=sys.stderr)
            continue
        outs.append(json.loads([l for l in out.splitlines() if l.startswith("RESULT ")][-1][7:]))
    wall = time.perf_counter() - t0
    from tiletune.store import TuningDB

    with TuningDB(env["TILETUNE_DB"]) as db:
        sessions = db.sessions()
        stored = db.measurements()
    configs = {json.dumps(o["config"], sort_keys=True) for o in outs}
    return {
        "fault": "concurrent_8", "processes": n, "candidates": 32, "survived": survived and len(outs) == n,
        "winner_correct": len(configs) == 1 and all(o["rel_err"] < 1e-2 for o in outs),
        "records_lost": 32 - len(stored), "sessions": len(sessions), "tuned": sum(o["tuned"] for o in outs),
        "caller_context_ok": len(outs) == n, "wall_s": round(wall, 3),
        "per_process_wall_s": [round(o["wall_s"], 3) for o in outs],
    }


def kill9_row(kill_after: int = 8) -> dict:
    env = fresh_env()
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", MATMUL_CHILD], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    import sqlite3

    recorded: list[str] = []
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        try:
            con = sqlite3.connect(env["TILETUNE_DB"], timeout=1)
            recorded = [r[0] for r in con.execute("SELECT config_hash FROM progress")]
            con.close()
        except sqlite3.Error:
            recorded = []
        if len(recorded) >= kill_after:
            break
        time.sleep(0.02)
    killed = p.poll() is None
    p.send_signal(signal.SIGKILL)
    p.communicate()
    con = sqlite3.connect(env["TILETUNE_DB"])
    recorded = [r[0] for r in con.execute("SELECT config_hash FROM progress")]
    con.close()
    resumed = run_child(MATMUL_CHILD, env)
    wall = time.perf_counter() - t0
    from tiletune.store import TuningDB

    with TuningDB(env["TILETUNE_DB"]) as db:
        stored = db.measurements()
    return {
        "fault": "kill9_resume", "candidates": 32, "killed_mid_tune": killed, "recorded_before_kill": len(recorded),
        "survived": True, "resumed": resumed["resumed"], "winner_correct": resumed["rel_err"] < 1e-2,
        "records_lost": len(recorded) - int(resumed["resumed"] or 0) + (32 - len(stored)),
        "caller_context_ok": True, "wall_s": round(wall, 3), "resume_wall_s": round(resumed["wall_s"], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--fault-space", action="store_true",
                    help="only the 28-config fault space (writes fault_space.json)")
    args = ap.parse_args()
    if args.fault_space:
        fs = fault_space_row()
        print(f"fault space: {fs['configs']} configs, {fs['wall_s']} s, restarts {fs['restarts']}, "
              f"verdicts_ok {fs['verdicts_ok']} (wrong: {fs['wrong_verdicts']}), caller_ok {fs['caller_ok']}")
        write_result("fault_space", {"isolation": "process", "fault_space": fs}, args.out)
        return
    rows = fault_rows()
    rows.append(concurrent_row())
    rows.append(kill9_row())
    for r in rows:
        print(f"{r['fault']:>16}: survived={r.get('survived')} winner_correct={r.get('winner_correct')} "
              f"lost={r.get('records_lost')} ctx={r.get('caller_context_ok')} {r.get('wall_s')} s "
              f"{r.get('planted_status') or ''}")
    write_result("fault_matrix", {"isolation": "process", "rows": rows}, args.out)


if __name__ == "__main__":
    sys.exit(main())
