#!/usr/bin/env python
"""Where a served first forward spends its time: cProfile of one layer's first forward in a fresh process.

Runs the same child as ``first_forward.py`` up to the first forward, under ``cProfile``, once with an empty
cuTile cache and once on the cache the first filled (each with an empty tiletune database, tables on,
the library ops' default ``on_miss``). Writes ``<model>_<phase>_<cache>.txt`` (top functions by cumulative
and by own time) and a JSON summary.

    python benchmarks/diag_first_forward.py --out DIR [--model llama3-8b] [--phase decode]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CHILD = r"""
import cProfile, io, json, logging, pstats, sys, time
t_start = time.perf_counter()
import torch
import _layer as L
import tiletune.kernels as K
spec = json.loads(%r)
_h = logging.FileHandler(spec["txt"] + ".log")
_h.setFormatter(logging.Formatter("%%(relativeCreated)8.0f ms %%(message)s"))
logging.getLogger("tiletune").addHandler(_h)
logging.getLogger("tiletune").setLevel(logging.INFO)
d = L.dims(spec["model"])
shape = spec["shape"]
w = L.make_weights(d, "cuda", seed=0)
inp = L.Inputs(d, shape, "cuda")
layer = L.tiletune_layer(d, w, shape["phase"], inp.caches(), ops=K)
args = inp.args()
torch.cuda.synchronize()
pr = cProfile.Profile()
t0 = time.perf_counter()
pr.enable()
with torch.no_grad():
    layer(*args)
    torch.cuda.synchronize()
pr.disable()
first = time.perf_counter() - t0
s = io.StringIO()
st = pstats.Stats(pr, stream=s)
st.sort_stats("cumulative").print_stats(70)
st.sort_stats("tottime").print_stats(30)
open(spec["txt"], "w").write(s.getvalue())
print("RESULT " + json.dumps({"first_forward_s": first, "sessions": L.tuning_sessions()}))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--phases", default="decode,prefill")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from _common import fresh_env, run_child

    shapes = {"decode": {"phase": "decode", "B": 19, "L": 3111, "capacity": 3300},
              "prefill": {"phase": "prefill", "B": 2, "S": 1333}}
    summary = {}
    for phase in a.phases.split(","):
        cold = fresh_env(TILETUNE_TABLES="1")
        for cache, env in (("cold", cold), ("warm", {**fresh_env(TILETUNE_TABLES="1"),
                                                      "CUDA_TILE_CACHE_DIR": cold["CUDA_TILE_CACHE_DIR"]})):
            txt = out / f"ff{a.tag}_{a.model}_{phase}_{cache}.txt"
            spec = {"model": a.model, "shape": shapes[phase], "txt": str(txt)}
            t0 = time.perf_counter()
            try:
                r = run_child(CHILD % json.dumps(spec), env, timeout=300)
            except Exception as exc:  # noqa: BLE001
                r = {"error": str(exc)[-2000:]}
            r["process_s"] = time.perf_counter() - t0
            summary[f"{a.tag}{phase}_{cache}"] = r
            print(phase, cache, r, flush=True)
    (out / f"diag_first_forward{a.tag}.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
