"""Issue 17 results: A/B of every library op's tuned pick vs its baseline, and shrink of recorded spaces.

    python benchmarks/ab_shrink.py [--out DIR] [--deadline S] [--cpu]

* ``ab.json`` (GPU): for every library op over 1-2 of its benchmark shapes (``kernels_memory.py``
  QUICK shapes, two GEMM shapes and one attention shape of ``kernels_compute.py``), ``tt.ab`` of the
  tuned pick against the space's baseline: interleaved cold-L2 rounds, ratio time(pick)/time(baseline),
  95% CI, verdict. Rows ``{"op", "shape", "against", "ratio", "ci_low", "ci_high", "verdict", ...}``;
  ``ab.png``.
* ``shrink.json``: ``tiletune.lab.shrink`` of the three H200 recordings in ``benchmarks/spaces/`` (GEMM,
  attention, and LayerNorm as the memory-bound op; each one key) at 2% / <= 8 configs, with
  ``ab_geomean_replay`` (A/B by replaying the recording, CPU) and, on a GPU, ``ab_geomean``: the
  shrunk space tuned live over the recording's problem (``record_spaces.problems``) and A/B'd
  against the recording's full-space best. On a GPU it adds one row per library op the A/B run
  tuned on several keys (``space`` = ``db:<op>``: shrink of the run's own database records, verified
  by replay).

Budget on a fresh H200: about 3-4 minutes (cold tuning of ~20 keys dominates); ``--deadline``
(default 220 s) stops starting new A/B cases after that many seconds. ``--cpu`` (or no GPU) writes
only shrink.json without the live column.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))
from _common import DEFAULT_OUT, write_result  # noqa: E402

SPACES = HERE / "spaces"
RECORDINGS = {  # recording -> record_spaces problem name
    "h200_gemm_bf16_4096.json.gz": "gemm",
    "h200_attention_bf16_b4h16s4096d128_causal.json.gz": "attention",
    "h200_layernorm_bf16_16384x4096.json.gz": "layernorm",
}


def ab_cases() -> list[tuple[str, str, Any]]:
    """(op, shape label, zero-argument call of the library op), built lazily on the GPU."""
    import torch

    import kernels_memory as km

    out: list[tuple[str, str, Any]] = []
    for op, shapes in km.QUICK.items():
        for shape in shapes:
            out.append((op, "x".join(map(str, shape)) + ":bf16",
                        lambda op=op, shape=shape: km.build(op, shape, torch.bfloat16)["tiletune"]))
    import kernels_compute as kc

    for (m, n, k) in [(4096, 4096, 4096), (1024, 14336, 4096)]:
        p = dict(op="gemm", M=m, N=n, K=k, dtype="bfloat16")
        out.append(("matmul", f"{m}x{n}x{k}:bf16", lambda p=p: kc._setup_gemm(p, False)[0]))
    p = dict(op="attention", B=4, H=32, Hkv=8, S=4096, D=128, causal=True, dtype="bfloat16")
    out.append(("attention", "B4 H32/8 S4096 D128 causal:bf16", lambda p=p: kc._setup_attention(p)[0]))
    return out


def run_ab(out: Path, deadline: float) -> tuple[list[dict[str, Any]], dict[str, list]]:
    import torch

    import tiletune as tt
    from tiletune.lab.ab import ABReport

    rows: list[dict[str, Any]] = []
    reports = []
    t0 = time.perf_counter()
    for op, shape, make in ab_cases():
        if time.perf_counter() - t0 > deadline:
            rows.append({"op": op, "shape": shape, "against": "baseline", "ratio": None, "ci_low": None,
                         "ci_high": None, "verdict": None, "error": "skipped: deadline"})
            continue
        try:
            fn = make()
            rep = tt.ab(lambda: fn(), [()], labels=[shape])
            torch.cuda.synchronize()
            r = rep.rows[0]
            reports.append(r)
            rows.append({"op": op, "shape": shape, "against": "baseline", "ratio": round(r.ratio, 4),
                         "ci_low": round(r.ci_low, 4), "ci_high": round(r.ci_high, 4), "verdict": r.verdict,
                         "tuned_op": r.op, "pick": r.pick, "baseline": r.against, "pick_us": round(r.pick_us, 3),
                         "baseline_us": round(r.against_us, 3), "same_config": r.same_config})
            print(f"{op:20s} {shape:34s} ratio {r.ratio:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] {r.verdict}",
                  flush=True)
        except Exception as exc:  # noqa: BLE001 - one failing op must not stop the run
            traceback.print_exc()
            rows.append({"op": op, "shape": shape, "against": "baseline", "ratio": None, "ci_low": None,
                         "ci_high": None, "verdict": None, "error": f"{type(exc).__name__}: {exc}"[:300]})
    if reports:
        ABReport(op="library ops", against="baseline", rows=reports, band=0.01).plot(
            out / "ab.png", title="library ops on the H200: tuned pick / baseline")
    return rows, {}


def shrink_rows(gpu: bool, db_path: str | None) -> list[dict[str, Any]]:
    from tiletune.lab import shrink as sh

    rows = []
    for fname, prob in RECORDINGS.items():
        tables = sh.tables_from_recordings([SPACES / fname])
        (arch, table), = tables.items()
        res = sh.shrink(table, 0.02, 8)
        rep = sh.verify_replay(table, res)
        row: dict[str, Any] = {"space": fname.replace(".json.gz", ""), "keys": res.keys,
                               "configs_before": res.configs_before, "configs_after": len(res.configs),
                               "worst_loss": round(res.worst_loss, 5), "ab_geomean": None,
                               "ab_geomean_replay": round(rep["geomean"], 4), "method": res.method,
                               "configs": res.configs}
        if gpu:
            try:
                row.update(_live_ab(prob, table, res))
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                row["ab_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("space", "keys", "configs_before", "configs_after", "worst_loss",
                                              "ab_geomean", "ab_geomean_replay")}), flush=True)
    if db_path:
        rows += db_rows(db_path)
    return rows


def db_rows(db_path: str, source: str | None = None) -> list[dict[str, Any]]:
    """One row per op with records over >= 2 keys (per arch) in the database: its shrink at 2% / <= 8
    configs, verified by replaying the records (``space`` = ``db:<op>``)."""
    from tiletune.lab import shrink as sh
    from tiletune.store import TuningDB

    db = TuningDB(db_path)
    rows = []
    for name in sorted({w.identity.name for w in db.winners()}):
        for space, tables in sh.tables_by_space(db, name).items():  # an op may tune its regimes over several
            for arch, table in tables.items():
                if len(table.keys) < 2:
                    continue
                res = sh.shrink(table, 0.02, 8)
                rep = sh.verify_replay(table, res)
                row = {"space": f"db:{name}", "space_hash": space[:12], "arch": arch, "keys": res.keys,
                       "configs_before": res.configs_before,
                       "configs_after": len(res.configs), "worst_loss": round(res.worst_loss, 5), "ab_geomean": None,
                       "ab_geomean_replay": round(rep["geomean"], 4), "method": res.method, "configs": res.configs}
                if source:
                    row["source"] = source
                rows.append(row)
                print(json.dumps({k: row[k] for k in ("space", "keys", "configs_before", "configs_after", "worst_loss",
                                                      "ab_geomean_replay")}), flush=True)
    return rows


def merge_db_rows(out: Path, db_path: str, source: str) -> Path:
    """Replace the ``db:`` rows of ``out/shrink.json`` with the shrink of another database's records
    (e.g. a campaign's, over many keys per op), keeping the recordings' rows and their GPU columns."""
    path = out / "shrink.json"
    doc = json.loads(path.read_text())
    kept = [r for r in doc["rows"] if not str(r.get("space", "")).startswith("db:")]
    doc["rows"] = kept + db_rows(db_path, source)
    doc["db_source"] = source
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def _live_ab(prob: str, table: Any, res: Any) -> dict[str, Any]:
    """The shrunk space tuned live over the recording's problem, A/B vs the recording's full best."""
    import torch

    import record_spaces as rs
    import tiletune as tt
    from tiletune.lab import shrink as sh

    p = rs.problems(torch.cuda.get_device_properties(0).multi_processor_count)[prob]
    space = sh.build_space({res.arch: res})
    op = tt.autotune(space, reference=p.reference, writes=list(p.writes), name=p.op_name + ".shrunk", db=False,
                     progress=False)(p.plan)
    best = table.configs[min(range(len(table.configs)), key=lambda j: table.times[0][j])]
    rep = tt.ab(op, [p.make_args()], against=best, labels=[p.describe])
    r = rep.rows[0]
    return {"ab_geomean": round(rep.geomean, 4), "ab_ci": [round(r.ci_low, 4), round(r.ci_high, 4)],
            "ab_verdict": r.verdict, "ab_against": best}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(DEFAULT_OUT))
    ap.add_argument("--deadline", type=float, default=220.0)
    ap.add_argument("--cpu", action="store_true", help="shrink.json only, without the GPU columns")
    ap.add_argument("--merge-db", metavar="PATH", help="only replace the db: rows of OUT/shrink.json with the "
                    "shrink of this database's records (no GPU; the recordings' rows are kept)")
    ap.add_argument("--db-source", default="", help="with --merge-db: where the database's records come from")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge_db:
        print(merge_db_rows(out, args.merge_db, args.db_source or args.merge_db))
        return 0
    gpu = False
    if not args.cpu:
        try:
            import torch

            gpu = torch.cuda.is_available()
        except ImportError:
            gpu = False
    db_path = None
    if gpu:
        db_path = os.environ.get("TILETUNE_DB") or str(Path(tempfile.mkdtemp(prefix="tt-ab-")) / "tuning.db")
        os.environ["TILETUNE_DB"] = db_path  # a fresh database: every key is tuned in this run
        rows, _ = run_ab(out, args.deadline)
        ok = [r for r in rows if r.get("ratio")]
        g = math.exp(sum(math.log(r["ratio"]) for r in ok) / len(ok)) if ok else None
        write_result("ab", {"rows": rows, "geomean": g,
                            "verdicts": {v: sum(1 for r in ok if r["verdict"] == v) for v in ("faster", "tied", "slower")},
                            "method": "tt.ab: 10 interleaved rounds x 10 cold-L2 samples per config, ratio = "
                                      "median of round ratios, 95% CI from order statistics, band 1%"}, out)
    rows = shrink_rows(gpu, db_path)
    write_result("shrink", {"rows": rows, "tolerance": 0.02, "max_configs": 8, "gpu_columns": gpu,
                            "note": "each recording is one key: it shrinks to the one config within 2% of its best; "
                                    "db:<op> rows shrink the A/B run's own database over that op's keys"}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
