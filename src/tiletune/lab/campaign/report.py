"""A campaign's report: one row per task, a table per op, figures; and comparing the picks of two runs.

Rows are built from the caller's database after the campaign (the winner, its median, the
baseline's median, how many configs were measured), so a task whose keys were already stored reads
the same as one tuned now. :func:`write_report` writes ``campaign.json``, ``campaign.md`` and, when
matplotlib is importable, ``campaign_<op>.png`` (winner vs baseline per call) and
``campaign_timeline.png`` (what each worker ran when).
"""

from __future__ import annotations

import json
import math
import pathlib
import re
from typing import Any, Mapping, Sequence

from tiletune.records import TuningIdentity
from tiletune.store import TuningDB
from tiletune.lab.campaign.spec import Task

__all__ = ["build_rows", "summarize", "write_report", "compare_picks", "status_of"]


def status_of(result: Mapping[str, Any]) -> str:
    """``failed``, ``tuned`` (a key was tuned now), ``stored`` (every key came from the database, a
    table or another rank) or ``reused`` (the worker had resolved the key, or its bucket, already)."""
    if not result.get("ok"):
        return "failed"
    sources = {r["source"] for r in result.get("resolved", [])}
    if "tuned" in sources:
        return "tuned"
    return "stored" if sources else "reused"


def _key_row(db: TuningDB, resolved: Mapping[str, Any]) -> dict[str, Any]:
    ident = TuningIdentity.from_dict(resolved["identity"])
    rec = db.lookup(ident)
    ms = db.measurements(session_id=rec.session_id) if rec is not None else []
    base = next((m for m in ms if m.is_baseline and not m.status.failed), None)
    median = rec.median_us if rec is not None else None
    base_us = base.median_us if base is not None else None
    return {
        "op": resolved["op"], "digest": ident.digest, "key": json.loads(ident.key), "source": resolved["source"],
        "config": resolved["config"], "median_us": median, "baseline_us": base_us,
        "speedup": round(base_us / median, 4) if base_us and median else None,
        "configs": len(ms), "failed": sum(1 for m in ms if m.status.failed),
        "tied": [dict(t) for t in rec.tied] if rec is not None else [],
        "compile_s": round(sum(m.compile_s or 0.0 for m in ms), 3),
    }


def build_rows(tasks: Sequence[Task], results: Sequence[Mapping[str, Any]], db: TuningDB) -> list[dict[str, Any]]:
    """One row per task (in spec order) with the keys it resolved, read back from ``db``."""
    rows = []
    for task, res in zip(tasks, results):
        row: dict[str, Any] = {
            "task": task.id, "op": task.label, "status": status_of(res), "worker": res.get("worker"),
            "seconds": res.get("seconds"), "start": res.get("start"), "end": res.get("end"),
            "strategy": task.strategy or "exhaustive",
            "keys": [_key_row(db, r) for r in res.get("resolved", [])],
        }
        if res.get("error"):
            row["error"] = res["error"]
        if res.get("precompile"):
            row["precompile"] = res["precompile"]
        rows.append(row)
    return rows


def _geomean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return round(math.exp(sum(math.log(x) for x in xs) / len(xs)), 4) if xs else None


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per op: tasks, tuned, stored, reused, failed, seconds spent, geomean speedup over the baseline."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        s = out.setdefault(r["op"], {"tasks": 0, "tuned": 0, "stored": 0, "reused": 0, "failed": 0, "seconds": 0.0,
                                      "speedups": []})
        s["tasks"] += 1
        s[r["status"]] += 1
        s["seconds"] += float(r.get("seconds") or 0.0)
        s["speedups"] += [k["speedup"] for k in r["keys"] if k.get("speedup")]
    for s in out.values():
        s["seconds"] = round(s["seconds"], 3)
        s["geomean_speedup_vs_baseline"] = _geomean(s.pop("speedups"))
    return out


def _shape_label(task_id: str) -> str:
    inner = task_id[task_id.find("(") + 1:-1] if "(" in task_id else task_id
    return inner.split(", ")[0] if inner else task_id


def _markdown(report: Mapping[str, Any]) -> str:
    lines = [f"# Campaign {report['name']}", "",
             f"{report['tasks']} tasks on {len(report['workers'])} worker(s) in {report['wall_s']:.1f} s: "
             f"{report['tuned']} tuned, {report['stored']} already stored, {report['reused']} reused, "
             f"{report['failed']} failed.", "",
             "| op | tasks | tuned | stored | reused | failed | seconds | geomean vs baseline |",
             "|---|---|---|---|---|---|---|---|"]
    for op, s in report["per_op"].items():
        g = s["geomean_speedup_vs_baseline"]
        lines.append(f"| {op} | {s['tasks']} | {s['tuned']} | {s['stored']} | {s['reused']} | {s['failed']} | "
                     f"{s['seconds']:.1f} | {f'{g:.2f}x' if g else '-'} |")
    lines += ["", "| task | status | worker | seconds | winner | us | vs baseline |", "|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        keys = r["keys"] or [{}]
        for k in keys:
            cfg = " ".join(f"{a}={b}" for a, b in (k.get("config") or {}).items()) or r.get("error", "-")
            us = f"{k['median_us']:.2f}" if k.get("median_us") else "-"
            sp = f"{k['speedup']:.2f}x" if k.get("speedup") else "-"
            lines.append(f"| `{r['task']}` | {r['status']} | {r['worker']} | {r.get('seconds') or 0:.2f} | "
                         f"{cfg} | {us} | {sp} |")
    return "\n".join(lines) + "\n"


def _pngs(report: Mapping[str, Any], out: pathlib.Path) -> list[pathlib.Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    by_op: dict[str, list[Mapping[str, Any]]] = {}
    for r in report["rows"]:
        if r["keys"]:
            by_op.setdefault(r["op"], []).append(r)
    for op, rows in by_op.items():
        labels = [_shape_label(r["task"]) for r in rows]
        win = [r["keys"][0].get("median_us") or 0.0 for r in rows]
        base = [r["keys"][0].get("baseline_us") or 0.0 for r in rows]
        fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * len(rows) + 2), 3.6))
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], base, 0.4, label="baseline config", color="#bbbbbb")
        ax.bar([x + 0.2 for x in xs], win, 0.4, label="tuned winner", color="#2a6fdb")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("median us (log)")
        if any(v > 0 for v in win + base):
            ax.set_yscale("log")
        ax.set_title(f"{op}: winner vs baseline per call", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out / f"campaign_{re.sub(r'[^A-Za-z0-9_]+', '_', op)}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    timed = [r for r in report["rows"] if r.get("start") and r.get("end") and r.get("worker") is not None]
    if timed:
        t0 = min(r["start"] for r in timed)
        colors = {"tuned": "#2a6fdb", "stored": "#7fbf7f", "reused": "#cccccc", "failed": "#d62728"}
        fig, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * len(report["workers"])))
        for r in timed:
            ax.barh(r["worker"], r["end"] - r["start"], left=r["start"] - t0, color=colors[r["status"]],
                    edgecolor="white", height=0.7)
        ax.set_xlabel("seconds since the first task started")
        ax.set_ylabel("worker")
        ax.set_yticks(sorted({r["worker"] for r in timed}))
        ax.set_title("campaign timeline (blue: tuned, green: stored, red: failed)", fontsize=9)
        fig.tight_layout()
        p = out / "campaign_timeline.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    return written


def write_report(report: Mapping[str, Any], out_dir: str | pathlib.Path) -> list[pathlib.Path]:
    """``campaign.json``, ``campaign.md`` and the PNGs (when matplotlib is importable) in ``out_dir``."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "campaign.json", out / "campaign.md"]
    paths[0].write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    paths[1].write_text(_markdown(report))
    return paths + _pngs(report, out)


def compare_picks(a: TuningDB, b: TuningDB, *, band: float = 0.03) -> dict[str, Any]:
    """Compare the winners of two databases key by key (identities present in both).

    ``same``: the same config. ``tied``: different configs, but one run's pick is inside the other's
    noise band: listed in its ``tied`` set, or its measured median in that run within ``band`` (the
    tuner's widest tie band, 3%) of that run's winner. ``differ``: anything else."""
    from tiletune.records import config_hash

    def pick_set(db: TuningDB) -> dict[str, Any]:
        return {w.identity.digest: w for w in db.winners()}

    wa, wb = pick_set(a), pick_set(b)
    rows = []
    for digest in sorted(set(wa) & set(wb)):
        x, y = wa[digest], wb[digest]
        if config_hash(x.config) == config_hash(y.config):
            rows.append({"digest": digest, "name": x.identity.name, "verdict": "same", "config": x.config})
            continue
        verdict = "differ"
        for win, other, db in ((x, y, a), (y, x, b)):
            if any(config_hash(t) == config_hash(other.config) for t in win.tied):
                verdict = "tied"
            meds = {m.config_hash: m.median_us for m in db.measurements(session_id=win.session_id)
                    if not m.status.failed and m.median_us}
            o = meds.get(config_hash(other.config))
            if o is not None and o <= win.median_us * (1.0 + band):
                verdict = "tied"
        rows.append({"digest": digest, "name": x.identity.name, "verdict": verdict, "config_a": x.config,
                     "config_b": y.config, "median_a_us": x.median_us, "median_b_us": y.median_us})
    counts = {v: sum(1 for r in rows if r["verdict"] == v) for v in ("same", "tied", "differ")}
    return {"keys": len(rows), **counts, "only_a": len(set(wa) - set(wb)), "only_b": len(set(wb) - set(wa)),
            "same_or_tied": bool(rows) and counts["differ"] == 0, "rows": rows}
