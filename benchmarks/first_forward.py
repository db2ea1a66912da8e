#!/usr/bin/env python
"""A model's first forward on shapes no grid covers, each in a fresh process (issue 40).

Llama-3-8B and Qwen2.5-7B decoder layers built from ``tiletune.kernels`` the way a user writes them
(:mod:`_layer`: ``nn.Linear``-layout weights passed as ``w.t()``, fused qkv and gate-up projections,
``K.apply_rope_`` on views of the fused qkv output, GQA ``K.attention`` for prefill, ``K.kv_cache_append``
+ ``K.decode_attention`` over a KV cache with spare capacity for decode, ``K.rms_norm``, ``K.swiglu``).
Per model, ``--shapes`` shapes drawn with ``--seed`` (prefill and decode in turn; B 1-4 x S 300-5000 and
B 1-64 over a cache of 500-9000 positions, no token count or length a power of two:
:func:`_layer.draw_shapes`).

Each shape runs in two fresh processes, each with an EMPTY tiletune database (``TILETUNE_DB`` in a new
temporary folder), the shipped tuning tables on (``TILETUNE_TABLES=1``) and ``TILETUNE_LOG=1``:

* ``cutile_cache: "cold"``: cuTile's disk cache (``CUDA_TILE_CACHE_DIR``) a new empty folder;
* ``cutile_cache: "warm"``: a second process on the folder the first one filled (its database empty again).

Per row: ``first_forward_s`` (wall time of the layer's first forward, ``torch.cuda.synchronize()``
included, after the weights and inputs exist; the lazy imports of the ops are part of it, as for a
user), ``tuning_sessions`` (tuning sessions started during it: ``tuning_count`` summed over every
``LibraryOp``'s tuned ops; ``tuning_by_op`` per op), ``log_sources`` (tiletune's log lines by source:
table, database, bucket, tuned, ...), ``second_forward_s``, ``served_ms`` (``triton.testing.do_bench``
median of one forward as served) and ``served_vs_tuned``: ``served_ms`` over the same median after
tuning every key of this shape exactly (the same process, after the served timing: a new empty
database, tables off, ``LibraryOp.configure``, one forward, timed again). That last phase costs a
layer's tuning (20-40 s on an H200), so it runs in the warm process of the first ``--tuned-rows``
shapes of each model only (the value is put on both rows of the shape; null elsewhere).

    python benchmarks/first_forward.py [--out DIR] [--quick] [--seed 0] [--shapes 6] [--tuned-rows 2]
        [--models llama3-8b,qwen2.5-7b] [--budget-s 450 (--quick 300)] [--child-timeout 300] [--profile]

``--quick``: 2 shapes per model (one prefill, one decode: the first two of the full run's list), 1 tuned
row per model. Writes ``first_forward.json`` after every shape (a run cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _layer import MODELS, draw_shapes, shape_label  # noqa: E402

NAME = "first_forward"
QUICK_SHAPES = 2
QUICK_TUNED_ROWS = 1
ROW_KEYS = ("model", "phase", "shape", "cutile_cache", "first_forward_s", "tuning_sessions", "served_vs_tuned")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="output folder (default $OUT)")
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_SHAPES} shapes and {QUICK_TUNED_ROWS} tuned row per model")
    ap.add_argument("--seed", type=int, default=0, help="seed of the shape draw (default 0)")
    ap.add_argument("--shapes", type=int, default=None, help="shapes per model (default 6; --quick 2)")
    ap.add_argument("--tuned-rows", type=int, default=None,
                    help="shapes per model (the first ones) that also measure served_vs_tuned (default 2; --quick 1)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated (default llama3-8b,qwen2.5-7b)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no new shape after this many seconds of the run (default 450; --quick 300; "
                         "0: no limit)")
    ap.add_argument("--child-timeout", type=float, default=300.0, help="seconds one fresh process may take")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile each first forward: its top 120 functions by cumulative time (key 'profile')")
    args = ap.parse_args(argv)
    if args.shapes is None:
        args.shapes = QUICK_SHAPES if args.quick else 6
    if args.budget_s is None:
        args.budget_s = 300.0 if args.quick else 450.0
    if args.tuned_rows is None:
        args.tuned_rows = QUICK_TUNED_ROWS if args.quick else 2
    args.models = [m for m in args.models.split(",") if m]
    from _layer import ROPE_BASES

    bad = [m for m in args.models if m not in ROPE_BASES]
    if bad:
        ap.error(f"unknown model(s) {bad}; choose from {sorted(ROPE_BASES)}")
    if args.shapes < 1 or args.tuned_rows < 0:
        ap.error("--shapes must be >= 1 and --tuned-rows >= 0")
    return args


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The run's shapes, in order: ``{"model", "shape", "tune"}`` (pure)."""
    out = []
    for model in args.models:
        for i, shape in enumerate(draw_shapes(model, args.shapes, args.seed)):
            out.append({"model": model, "shape": shape, "tune": i < args.tuned_rows})
    return out


# --------------------------------------------------------------------------------------------
# the child process
# --------------------------------------------------------------------------------------------


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One fresh process: build the layer, time its first forward, count tuning sessions, time the
    served forward and (``spec["tune"]``) the exactly tuned one. Runs on the GPU."""
    t_start = time.perf_counter()
    import torch

    import _layer as L

    log = L.SourceLog().install()
    import tiletune.kernels as K  # what a user's module imports; the ops load on first use

    d = L.dims(spec["model"])
    shape = spec["shape"]
    w = L.make_weights(d, "cuda", seed=0)
    inp = L.Inputs(d, shape, "cuda")
    layer = L.tiletune_layer(d, w, shape["phase"], inp.caches(), ops=K)
    args = inp.args()
    torch.cuda.synchronize()
    out: dict[str, Any] = {"setup_s": time.perf_counter() - t_start}

    prof = None
    if spec.get("profile"):
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    with torch.no_grad():
        y_served = layer(*args)
        torch.cuda.synchronize()
    out["first_forward_s"] = time.perf_counter() - t0
    if prof is not None:
        prof.disable()
        from _common import profile_rows

        out["profile"] = profile_rows(prof, 120)
    out["tuning_sessions"], out["tuning_by_op"] = L.tuning_sessions(by_op=True)
    snap = log.snapshot()
    out["log_sources"], out["log_tuned_ops"], out["log_warnings"] = snap["sources"], snap["tuned_ops"], snap["warnings"]
    out["compiler_imported"] = "cuda.tile._compile" in sys.modules
    from tiletune.devices.measure import HOLD_CYCLES_PER_LAUNCH, ColdL2Timer

    # the race's spin per launch the process learnt (above the default: a host that outlasted a batch's spin)
    out["race_hold_per_launch"] = ColdL2Timer.hold_per_launch
    out["race_hold_raised"] = ColdL2Timer.hold_per_launch > HOLD_CYCLES_PER_LAUNCH

    with torch.no_grad():
        t0 = time.perf_counter()
        layer(*args)
        torch.cuda.synchronize()
        out["second_forward_s"] = time.perf_counter() - t0
        # ops that ran their fallback while their configs compiled: wait, then each key resolves to its config
        out["compile_wait_s"] = L.settle_compiles(lambda: layer(*args))
        torch.cuda.synchronize()
        out["served_ms"] = L.bench_ms(lambda: layer(*args))
    out["tuning_sessions_after_served_timing"] = L.tuning_sessions()  # > first: something tuned in the background

    if spec.get("tune"):
        y_served = y_served.clone()
        log.reset()
        L.use_fresh_database(str(Path(tempfile.mkdtemp(prefix="tiletune-ff-tuned-")) / "tuning.db"), tables=False,
                             on_miss="tune")  # every key exactly: no neighbour answers
        with torch.no_grad():
            t0 = time.perf_counter()
            y_tuned = layer(*args)
            torch.cuda.synchronize()
            out["tune_s"] = time.perf_counter() - t0
            out["tuned_sessions"] = L.tuning_sessions()
            out["tuned_log_sources"] = log.snapshot()["sources"]
            out["tuned_ms"] = L.bench_ms(lambda: layer(*args))
        out["served_vs_tuned"] = out["served_ms"] / out["tuned_ms"]
        out["rel_diff_served_tuned"] = L.rel_err(y_served, y_tuned)
    return out


CHILD = "import json, first_forward as f; print('RESULT ' + json.dumps(f.child(json.loads(%r))))"


def run_shape(item: dict[str, Any], timeout: float, profile: bool = False) -> list[dict[str, Any]]:
    """The cold and the warm row of one shape (each a fresh process)."""
    from _common import failure_fields, fresh_env, run_child

    rows = []
    cold = fresh_env(TILETUNE_LOG="1", TILETUNE_TABLES="1", TILETUNE_FALLBACK="1")  # as a user's process
    envs = (("cold", cold, False),
            ("warm", {**fresh_env(TILETUNE_LOG="1", TILETUNE_TABLES="1", TILETUNE_FALLBACK="1"),
                      "CUDA_TILE_CACHE_DIR": cold["CUDA_TILE_CACHE_DIR"]}, item["tune"]))
    for cache, env, tune in envs:
        spec = {"model": item["model"], "shape": item["shape"], "tune": tune, "profile": profile}
        t0 = time.perf_counter()
        try:
            r = run_child(CHILD % json.dumps(spec), env, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
            r = failure_fields(exc)
        rows.append(make_row(item, cache, r, time.perf_counter() - t0))
    tuned = [r["served_vs_tuned"] for r in rows if r.get("served_vs_tuned") is not None]
    for r in rows:  # a property of the shape (same configs served cold and warm): on both rows
        if tuned and r.get("served_vs_tuned") is None and "error" not in r:
            r["served_vs_tuned"], r["served_vs_tuned_from"] = tuned[0], "warm"
    return rows


def make_row(item: dict[str, Any], cache: str, r: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """A result row from a child's answer (pure): the issue's fields first, then the details."""
    row = {"model": item["model"], "phase": item["shape"]["phase"], "shape": dict(item["shape"]),
           "cutile_cache": cache, "first_forward_s": r.get("first_forward_s"),
           "tuning_sessions": r.get("tuning_sessions"), "served_vs_tuned": r.get("served_vs_tuned")}
    row.update({k: v for k, v in r.items() if k not in row})
    row["process_wall_s"] = round(wall_s, 2)
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per cuTile cache state: the rows, the worst first forward, rows with no tuning session (pure)."""
    out: dict[str, Any] = {}
    for cache in ("cold", "warm"):
        ok = [r for r in rows if r["cutile_cache"] == cache and r.get("first_forward_s") is not None]
        out[cache] = {"rows": len(ok),
                      "max_first_forward_s": max((r["first_forward_s"] for r in ok), default=None),
                      "median_first_forward_s": sorted(r["first_forward_s"] for r in ok)[len(ok) // 2] if ok else None,
                      "rows_without_tuning": sum(1 for r in ok if r.get("tuning_sessions") == 0),
                      "tuning_sessions": sum(r.get("tuning_sessions") or 0 for r in ok)}
    svt = [r["served_vs_tuned"] for r in rows if r.get("served_vs_tuned") is not None and r["cutile_cache"] == "warm"]
    out["served_vs_tuned"] = {"n": len(svt), "max": max(svt, default=None), "min": min(svt, default=None)}
    out["errors"] = sum(1 for r in rows if "error" in r)
    return out


def document(args: argparse.Namespace, rows: list[dict[str, Any]], skipped: list[dict[str, Any]], wall_s: float,
             complete: bool) -> dict[str, Any]:
    from _layer import dims

    return {"quick": args.quick, "seed": args.seed, "complete": complete, "wall_s": round(wall_s, 1),
            "settings": {"shapes_per_model": args.shapes, "profiled": args.profile, "tuned_rows_per_model": args.tuned_rows,
                         "budget_s": args.budget_s, "database": "empty per process",
                         "tables": "shipped (TILETUNE_TABLES=1)", "dtype": "bfloat16",
                         "timer": "triton.testing.do_bench median"},
            "layers": {m: dims(m).as_dict() for m in args.models},
            "summary": summary(rows), "skipped_for_budget": skipped, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from _common import write_result

    items = plan(args)
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for item in items:
        spent = time.perf_counter() - t0
        if args.budget_s and spent > args.budget_s:
            skipped.append({"model": item["model"], "shape": item["shape"]})
            continue
        print(f"[{spent:6.1f} s] {item['model']} {shape_label(item['shape'])}"
              + (" (+ exact tuning)" if item["tune"] else ""), flush=True)
        for r in run_shape(item, args.child_timeout, args.profile):
            rows.append(r)
            print("    " + json.dumps({k: r.get(k) for k in ROW_KEYS[3:]} | {"log_sources": r.get("log_sources"),
                                                                             "error": r.get("error")}), flush=True)
        write_result(NAME, document(args, rows, skipped, time.perf_counter() - t0, False), args.out, commit=True)
    write_result(NAME, document(args, rows, skipped, time.perf_counter() - t0, True), args.out, commit=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
