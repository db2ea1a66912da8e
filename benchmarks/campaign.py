"""A campaign over the library's memory-bound ops x LLM shapes vs the same sessions one after another.

Issue 18 (``campaign.json``): the same tasks (7 memory-bound library ops x 3 decoder shapes, Llama-3
8B and 70B and Qwen2.5 7B, x 3 token counts = 63 calls; calls whose keys coincide, e.g. RoPE of two
models with the same head layout, are one tuning session) run

* **serial**: one process, one call after another (``tiletune.lab.fill.run_calls``, what ``tiletune tune``
  does), and
* **campaign**: ``tiletune campaign`` with one worker per GPU (``--gpus``), each compiling the
  candidates of its next tasks on its share of the host cores while its GPU measures the current one,

each in a fresh process with an empty tuning database and an empty cuTile disk cache (every compile
cold). With one GPU the campaign cannot measure two sessions at once: its gain over the serial run is
the compiles it overlaps with measurement. ``wall_s`` and ``serial_wall_s`` are the whole processes
(start-up included, as a user waits for them). ``same_or_tied``: every key has the same pick in both
databases, or picks inside the tuner's noise band (:func:`tiletune.lab.campaign.compare_picks`); keys whose
picks differ by more than that in the two runs' own records are then A/B'd head to head on the GPU
(``tt.ab``, interleaved cold-L2 rounds in one process): ``tied`` when the ratio's 95% interval
reaches into the 3% band (the two runs' medians differ by run-to-run drift, not by the configs).
``resumed_ok``: the campaign run again on its database tunes nothing and keeps every pick; with
``--kill`` also a fresh campaign SIGKILLed half-way and started again ends with every session stored
once.

Issue 19 (``--scaling``, ``campaign_scaling.json``): the campaign on one and on two GPUs (fresh each
time); ``speedup`` = 1-GPU wall / 2-GPU wall.

    source .gpu/activate.sh && python benchmarks/campaign.py [--gpus 1] [--out DIR] [--kill]
    source .gpu/activate.sh && python benchmarks/campaign.py --scaling [--out DIR]
    python benchmarks/campaign.py --quick ...   # 8 sessions, a smoke run
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
from typing import Any

from _common import ROOT, fresh_env, write_result

OPS = ("rms_norm", "rms_norm_residual", "layer_norm", "softmax", "swiglu", "geglu", "apply_rope_")
MODELS = {  # Llama-3 8B and 70B, Qwen2.5 7B
    "8b": {"hidden": 4096, "intermediate": 14336, "heads": 32, "kv_heads": 8, "head_dim": 128},
    "70b": {"hidden": 8192, "intermediate": 28672, "heads": 64, "kv_heads": 8, "head_dim": 128},
    "qwen7b": {"hidden": 3584, "intermediate": 18944, "heads": 28, "kv_heads": 4, "head_dim": 128},
}
TOKENS = (16, 512, 4096)  # three row buckets: decode batch, a short and a long prefill


#: Environment of every child process (``--backlog-us`` adds the tuner's timer backlog).
CHILD_ENV: dict[str, str] = {"TILETUNE_PROGRESS": "0"}


def spec_doc(quick: bool) -> dict[str, Any]:
    models = {"8b": MODELS["8b"]} if quick else MODELS
    ops = OPS[:4] if quick else OPS
    tokens = TOKENS[:2] if quick else TOKENS
    entries = [{"op": op, "tokens": list(tokens), **dims} for op in ops for dims in models.values()]
    return {"name": "llm-memory-ops", "device": "cuda", "ops": entries}


SERIAL = """
import json, sys, time
from tiletune.lab.campaign import parse_campaign
from tiletune.lab.fill import run_calls
spec = parse_campaign(json.load(open(sys.argv[1])))
t0 = time.perf_counter()
report = run_calls([t.call for t in spec.tasks], device="cuda", progress=False)
print("RESULT " + json.dumps({"inner_s": time.perf_counter() - t0, "failed": report.failed,
                              "calls": len(report.rows)}))
"""


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


def _campaign_cmd(spec: Path, gpus: int, env: dict[str, str], report: Path, out: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "tiletune.cli", "campaign", str(spec), "--gpus", str(gpus), "--db", env["TILETUNE_DB"],
           "--json", str(report)]
    return cmd + (["--out", str(out)] if out is not None else [])


def campaign(spec: Path, gpus: int, env: dict[str, str], work: Path, tag: str, timeout: float) -> dict[str, Any]:
    report = work / f"{tag}.json"
    wall, _ = _run(_campaign_cmd(spec, gpus, env, report, work / f"{tag}-report"), env, timeout)
    rep = json.loads(report.read_text())
    ahead = [r.get("precompile", {}) for r in rep["rows"]]
    return {"wall_s": round(wall, 2), "inner_s": rep["wall_s"], "tuned": rep["tuned"], "stored": rep["stored"],
            "reused": rep["reused"], "failed": rep["failed"], "workers": rep["workers"], "per_op": rep["per_op"],
            "compiled_ahead": sum(1 for a in ahead if a.get("jobs")),
            "compiled_ahead_jobs": sum(a.get("jobs", 0) for a in ahead),
            "db": env["TILETUNE_DB"], "report": rep}


AB_CHILD = """
import json, sys
import torch
import tiletune as tt
from tiletune.lab.ab import ABCase, _tuned_launch
from tiletune.lab.campaign import parse_campaign
from tiletune.lab.fill import materialize, resolve_op

spec = parse_campaign(json.load(open(sys.argv[1])))
want = json.loads(sys.argv[2])  # digest -> the other run's pick
gen = torch.Generator(device="cuda").manual_seed(0)
rows, done = [], set()
for task in spec.tasks:
    fn = resolve_op(task.call.op)
    args, kwargs = materialize(task.call, "cuda", gen)
    op, bargs = _tuned_launch(fn, ABCase(tuple(args), kwargs))
    dev = op.backend.arg_device(bargs)
    arch = op.backend.device_info(dev).arch
    ident = op.problem(bargs, op.key_of(*bargs)).identity
    if ident.digest not in want or ident.digest in done:
        continue
    done.add(ident.digest)
    rep = tt.ab(op, [bargs], against=want[ident.digest], band=0.03, labels=[task.id])
    r = rep.rows[0]
    rows.append({"digest": ident.digest, "task": task.id, "ratio": r.ratio, "ci_low": r.ci_low,
                 "ci_high": r.ci_high, "verdict": r.verdict, "pick_us": r.pick_us, "against_us": r.against_us})
print("RESULT " + json.dumps(rows))
"""


def settle_differing(spec: Path, picks: dict[str, Any], env: dict[str, str], timeout: float) -> list[dict[str, Any]]:
    """Head-to-head A/B of the keys whose picks differ between the runs: the campaign database's pick
    (``env``) against the serial run's pick, in one process; a row is ``tied`` when the ratio's 95%
    interval reaches into the 3% band."""
    want = {r["digest"]: r["config_a"] for r in picks["rows"] if r["verdict"] == "differ"}
    if not want:
        return []
    _, out = _run([sys.executable, "-c", AB_CHILD, str(spec), json.dumps(want)], env, timeout)
    rows = json.loads(next(ln for ln in reversed(out.splitlines()) if ln.startswith("RESULT "))[7:])
    for r in rows:
        r["settled"] = "tied" if r["ci_low"] <= 1.03 and r["ci_high"] >= 1 / 1.03 else "differ"
    return rows


def save_db(src: str, dest: Path) -> None:
    """A consistent copy of a SQLite database (its write-ahead log included)."""
    import sqlite3

    dest.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(src) as a, sqlite3.connect(dest) as b:
        a.backup(b)


def kill_and_resume(spec: Path, gpus: int, sessions: int, timeout: float, work: Path) -> dict[str, Any]:
    """A fresh campaign SIGKILLed once half its sessions are stored, then started again."""
    from tiletune.store import TuningDB

    env = fresh_env(**CHILD_ENV)
    db = Path(env["TILETUNE_DB"])
    cmd = _campaign_cmd(spec, gpus, env, work / "killed.json")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    stored = 0
    while time.monotonic() < deadline and proc.poll() is None:
        stored = len(TuningDB(db).winners()) if db.exists() else 0
        if stored >= sessions // 2:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    at_kill = len(TuningDB(db).winners())
    wall, _ = _run(_campaign_cmd(spec, gpus, env, work / "resumed.json"), env, timeout)
    rep = json.loads((work / "resumed.json").read_text())
    final = TuningDB(db)
    ok = (rep["failed"] == 0 and rep["stored"] >= at_kill and len(final.winners()) == sessions
          and len(final.sessions()) == sessions)
    return {"stored_at_kill": at_kill, "resumed_tuned": rep["tuned"], "resumed_stored": rep["stored"],
            "resume_wall_s": round(wall, 2), "sessions_after": len(final.sessions()), "ok": ok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=1, help="GPUs of the campaign (issue 18 mode)")
    ap.add_argument("--scaling", action="store_true", help="1 vs 2 GPUs (issue 19): campaign_scaling.json")
    ap.add_argument("--kill", action="store_true", help="also SIGKILL a fresh campaign half-way and resume it")
    ap.add_argument("--quick", action="store_true", help="8 sessions (a smoke run)")
    ap.add_argument("--out", default=None, help="result folder (default benchmarks/results/h200, or $BENCH_OUT)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per child process")
    ap.add_argument("--backlog-us", type=float, default=0.0,
                    help="TILETUNE_TIMER_BACKLOG_US for every run (a GPU spin before each tuning sample: does it "
                         "make the picks of ~5 us kernels reproducible?)")
    ap.add_argument("--save-dbs", metavar="DIR", help="copy the serial and campaign tuning databases here "
                    "(serial.db, campaign.db: per-config records over every key, e.g. for ab_shrink.py --merge-db)")
    args = ap.parse_args()
    if args.backlog_us:
        CHILD_ENV["TILETUNE_TIMER_BACKLOG_US"] = str(args.backlog_us)
    sys.path.insert(0, str(ROOT / "src"))
    from tiletune.lab.campaign import compare_picks, parse_campaign
    from tiletune.store import TuningDB

    work = Path(tempfile.mkdtemp(prefix="tiletune-campaign-bench-"))
    spec = work / "spec.json"
    spec.write_text(json.dumps(spec_doc(args.quick)))
    tasks = len(parse_campaign(json.loads(spec.read_text())).tasks)
    print(f"{tasks} tasks; work folder {work}", flush=True)

    if args.scaling:
        runs = {}
        for n in (1, 2):
            env = fresh_env(**CHILD_ENV)
            runs[n] = campaign(spec, n, env, work, f"gpus{n}", args.timeout)
            print(f"{n} GPU(s): {runs[n]['wall_s']} s, {runs[n]['tuned']} tuned", flush=True)
        picks = compare_picks(TuningDB(runs[1]["db"]), TuningDB(runs[2]["db"]))
        sessions = len(TuningDB(runs[1]["db"]).winners())
        write_result("campaign_scaling", {
            "sessions": sessions, "wall_s_1gpu": runs[1]["wall_s"], "wall_s_2gpu": runs[2]["wall_s"],
            "speedup": round(runs[1]["wall_s"] / runs[2]["wall_s"], 3), "same_or_tied": picks["same_or_tied"],
            "picks": {k: v for k, v in picks.items() if k != "rows"},
            "runs": {f"{n}gpu": {k: v for k, v in r.items() if k not in ("report", "db")} for n, r in runs.items()},
            "tasks": tasks, "quick": args.quick}, args.out)
        return

    serial_env = fresh_env(**CHILD_ENV)
    serial_wall, out = _run([sys.executable, "-c", SERIAL, str(spec)], serial_env, args.timeout)
    serial = json.loads(next(ln for ln in reversed(out.splitlines()) if ln.startswith("RESULT "))[7:])
    print(f"serial: {serial_wall:.1f} s ({serial['failed']} failed)", flush=True)
    env = fresh_env(**CHILD_ENV)
    run = campaign(spec, args.gpus, env, work, "campaign", args.timeout)
    print(f"campaign on {args.gpus} GPU(s): {run['wall_s']} s, {run['tuned']} tuned, {run['failed']} failed", flush=True)
    cdb, sdb = TuningDB(run["db"]), TuningDB(serial_env["TILETUNE_DB"])
    picks = compare_picks(sdb, cdb)
    settled = settle_differing(spec, picks, env, args.timeout)
    same_or_tied = picks["same_or_tied"] or (
        len(settled) == picks["differ"] and all(r["settled"] == "tied" for r in settled))
    again = campaign(spec, args.gpus, env, work, "again", args.timeout)  # resume: everything is stored
    resumed_ok = (again["tuned"] == 0 and again["failed"] == 0
                  and compare_picks(cdb, cdb)["same"] == len(cdb.winners())
                  and [k["config"] for r in again["report"]["rows"] for k in r["keys"]]
                  == [k["config"] for r in run["report"]["rows"] for k in r["keys"]])
    if args.save_dbs:
        save_db(serial_env["TILETUNE_DB"], Path(args.save_dbs) / "serial.db")
        save_db(run["db"], Path(args.save_dbs) / "campaign.db")
    kill = kill_and_resume(spec, args.gpus, len(cdb.winners()), args.timeout, work) if args.kill else None
    if kill is not None:
        resumed_ok = resumed_ok and kill["ok"]
    write_result("campaign", {
        "sessions": len(cdb.winners()), "gpus": args.gpus, "wall_s": run["wall_s"], "serial_wall_s": round(serial_wall, 2),
        "speedup": round(serial_wall / run["wall_s"], 3), "same_or_tied": same_or_tied,
        "resumed_ok": resumed_ok, "same_or_tied_from_records": picks["same_or_tied"], "differing_ab": settled,
        "tasks": tasks, "serial_inner_s": round(serial["inner_s"], 2), "campaign_inner_s": run["inner_s"],
        "serial_failed": serial["failed"], "campaign_failed": run["failed"],
        "compiled_ahead_tasks": run["compiled_ahead"], "compiled_ahead_jobs": run["compiled_ahead_jobs"],
        "picks": {k: v for k, v in picks.items() if k != "rows"},
        "picks_differ": [r for r in picks["rows"] if r["verdict"] == "differ"],
        "resume_wall_s": again["wall_s"], "kill_resume": kill, "workers": run["workers"], "per_op": run["per_op"],
        "spec": spec_doc(args.quick), "quick": args.quick, "timer_backlog_us": args.backlog_us}, args.out)


if __name__ == "__main__":
    main()
