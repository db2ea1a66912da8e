"""First calls of the library ops on a new shape, each in a fresh process.

For every library op (LLM shapes of ``tiletune.lab.fill.llm_calls``), a fresh Python process makes the
op's arguments, then times its first call (to the end of the GPU work) and, for reference, its steady
per-call time. Where the config comes from:

- ``tuned``: empty database, tables off: the first call tunes (cuTile cache cold).
- ``database``: the tuned process's database, the same shape.
- ``bucket``: that database, another token count inside the same row bucket (ops that bucket rows).
- ``shipped``: an empty database with tables on: the tuning table shipped in the wheel answers
  (``src/tiletune/data/tables``; run ``benchmarks/make_table.py`` first on this GPU). Cold: an empty
  cuTile cache; warm: a second fresh process on the cache the first one filled.

``database`` and ``bucket`` run with cuTile's disk cache warm (the cache the tuning filled) and cold
(an empty cache folder: the chosen config is compiled once). What answered is read from tiletune's log
lines (``observed``); a row whose observed source differs from the intended one is flagged.

    python benchmarks/first_call.py [--out DIR] [--ops rms_norm,matmul,...] [--linear-weights]
Writes first_call.json (``--linear-weights``: matmul's weight in ``nn.Linear``'s layout, passed as ``w.t()``;
first_call_linear.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from _common import fresh_env, run_child, write_result

OPS = ("rms_norm", "rms_norm_residual", "layer_norm", "softmax", "swiglu", "geglu", "apply_rope_",
       "cross_entropy", "matmul", "attention")
# token counts: tuned / database, another one in the same power-of-two bucket, one the table covers
TOKENS = {"tuned": 100, "bucket": 120, "shipped": 16}
ATTENTION = {"tuned": 512, "shipped": 1024}  # attention keys are exact sequence lengths (not bucketed)
SOURCES = ("shipped", "tuned", "database", "bucket")

CHILD = r"""
import json, logging, statistics, time
t_start = time.perf_counter()
import torch
seen = []
class Seen(logging.Handler):
    def emit(self, record):
        m = record.getMessage()
        for needle, what in ((": tuning table ", "shipped"), (": database hit", "database"), (": bucket hit", "bucket"),
                             (": tuned ", "tuned")):
            if needle in m:
                seen.append(what)
log = logging.getLogger("tiletune"); log.addHandler(Seen()); log.setLevel(logging.INFO)
from tiletune.lab.fill import llm_calls, materialize, resolve_op
call = llm_calls([%(op)r], [%(m)d], linear_weights=%(linear)r)[0]
fn = resolve_op(call.op)
gen = torch.Generator("cuda").manual_seed(0)
args, kwargs = materialize(call, "cuda", gen)
torch.cuda.synchronize()
t_ready = time.perf_counter()
def timed():
    t = time.perf_counter(); fn(*args, **kwargs); torch.cuda.synchronize(); return time.perf_counter() - t
if %(profile)r:
    import cProfile
    from _common import profile_rows
    prof = cProfile.Profile(); prof.enable(); first = timed(); prof.disable()
    profile = profile_rows(prof, 60)
else:
    first = timed(); profile = None
import sys
compiler_imported = "cuda.tile._compile" in sys.modules  # False: cuTile's front end never ran (tiletune.devices.frontend_cache)
steady = statistics.median(timed() for _ in range(10))
print("RESULT " + json.dumps({"first_call_s": first, "steady_s": steady, "observed": sorted(set(seen)),
                              "setup_s": t_ready - t_start, "profile": profile,
                              "compiler_imported": compiler_imported}))
"""


def _child(op: str, m: int, env: dict[str, str], profile: bool = False, linear: bool = False) -> dict:
    return run_child(CHILD % {"op": op, "m": m, "profile": profile, "linear": linear}, env)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--sources", default=",".join(SOURCES), help="which rows to make")
    ap.add_argument("--profile", action="store_true", help="also run each served row once more under cProfile "
                    "and keep its top entries (where a first call's time goes)")
    ap.add_argument("--note", default=None, help="a line kept in the result file (how the host was set up)")
    ap.add_argument("--linear-weights", action="store_true",
                    help="matmul's weight in nn.Linear's layout (N x K, passed as w.t()); writes first_call_linear.json")
    args = ap.parse_args()
    linear = args.linear_weights
    ops = [o for o in args.ops.split(",") if o]
    sources = set(args.sources.split(","))
    rows = []

    def cold_cache() -> str:
        return tempfile.mkdtemp(prefix="tiletune-cold-")

    for op in ops:
        plan = ATTENTION if op == "attention" else TOKENS
        # shipped first: an empty database, tables on, an empty cuTile cache (cold: the table's pick is
        # compiled once), then the same cache again (warm)
        shipped = fresh_env(TILETUNE_TABLES="1")
        cases = [("shipped", "cold", plan["shipped"], shipped),
                 ("shipped", "warm", plan["shipped"], {**fresh_env(TILETUNE_TABLES="1"),
                                                       "CUDA_TILE_CACHE_DIR": shipped["CUDA_TILE_CACHE_DIR"]})]
        env = fresh_env(TILETUNE_TABLES="0")  # its own empty database and cuTile cache
        cases.append(("tuned", "cold", plan["tuned"], env))
        for source in ("database", "bucket"):
            if source in plan or source == "database":
                m = plan.get(source, plan["tuned"])
                cases.append((source, "warm", m, env))
                cases.append((source, "cold", m, {**env, "CUDA_TILE_CACHE_DIR": cold_cache()}))
        cases = [c for c in cases if c[0] in sources]
        for source, cache, m, e in cases:
            try:
                r = _child(op, m, e, linear=linear)
            except Exception as exc:  # noqa: BLE001 - one failing row is reported, the rest go on
                rows.append({"op": op, "tokens": m, "source": source, "cutile_cache": cache, "error": str(exc)[-800:]})
                print(f"{op:18s} {source:9s} {cache:5s} ERROR {str(exc)[-300:]}", flush=True)
                continue
            expected = {"bucket": "database"}.get(source, source)  # a bucket answers through the database
            row = {"op": op, "shape": _shape(op, m, linear), "tokens": m, "source": source, "cutile_cache": cache,
                   "first_call_s": r["first_call_s"], "steady_s": r["steady_s"], "setup_s": r["setup_s"],
                   "observed": r["observed"], "source_ok": expected in r["observed"],
                   "compiler_imported": r.get("compiler_imported")}
            if args.profile and source != "tuned" and cache == "warm":  # a separate run: profiling slows it
                row["profile"] = _child(op, m, e, profile=True, linear=linear)["profile"]
            rows.append(row)
            print(f"{op:18s} {source:9s} {cache:5s} first {r['first_call_s']:8.3f} s  steady "
                  f"{r['steady_s'] * 1e6:9.1f} us  observed {r['observed']}", flush=True)
        _write(rows, args.out, complete=False, note=args.note, linear=linear)  # a cut run keeps what it measured
    _write(rows, args.out, complete=True, note=args.note, linear=linear)
    return 0


def _write(rows: list, out: str | None, complete: bool, note: str | None = None, linear: bool = False) -> None:
    served = [r for r in rows if r.get("source") in ("shipped", "bucket", "database") and "first_call_s" in r]
    as_intended = [r for r in served if r.get("source_ok")]
    warm = [r for r in as_intended if r["cutile_cache"] == "warm"]
    cold = [r for r in as_intended if r["cutile_cache"] == "cold"]
    tuned = [r["first_call_s"] for r in rows if r.get("source") == "tuned" and "first_call_s" in r]
    write_result("first_call_linear" if linear else "first_call", {
        "complete": complete,
        "linear_weights": linear,
        "note": note,
        "targets": {"served_warm_s": 0.5, "served_cold_s": 3.0},
        "served_stats_cover": "rows served as intended only (source_ok); the others are in not_as_intended",
        "served_rows": len(served),
        "served_rows_as_intended": len(as_intended),
        "not_as_intended": [f"{r['op']} {r['source']} {r['cutile_cache']}: observed {r['observed']}"
                            for r in served if not r.get("source_ok")],
        "max_served_warm_s": max((r["first_call_s"] for r in warm), default=None),
        "max_served_cold_s": max((r["first_call_s"] for r in cold), default=None),
        "served_warm_within_target": sum(r["first_call_s"] <= 0.5 for r in warm),
        "served_warm_rows": len(warm),
        "served_warm_over_target": [f"{r['op']} {r['source']} {r['first_call_s']:.3f}" for r in warm
                                    if r["first_call_s"] > 0.5],
        "served_cold_over_target": [f"{r['op']} {r['source']} {r['first_call_s']:.3f}" for r in cold
                                    if r["first_call_s"] > 3.0],
        "served_warm_compiler_imported": sum(bool(r.get("compiler_imported")) for r in warm),
        "tuned_first_call_s_range": [min(tuned), max(tuned)] if tuned else None,
        "all_sources_as_intended": all(r.get("source_ok", False) for r in rows),
        "rows": rows,
    }, out)


def _shape(op: str, m: int, linear: bool = False) -> str:
    from tiletune.lab.fill import llm_calls

    call = llm_calls([op], [m], linear_weights=linear)[0]
    return " ".join("x".join(map(str, a["shape"])) + (".t()" if a.get("transposed") else "")
                    for a in call.args if isinstance(a, dict) and "shape" in a)


if __name__ == "__main__":
    sys.exit(main())
