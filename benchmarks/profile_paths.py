"""Diagnostics: where the time of a cold tune and of a warm first call goes (cProfile, fresh processes).

    python benchmarks/profile_paths.py --out DIR
Writes profile_cold_tune.txt and profile_warm_first_call.txt (top functions by cumulative time).
Not a benchmark with targets: it explains the tuning_speed and warm_start figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import fresh_env, run_child

CODE = """
import cProfile, pstats, io, json, time, torch
from tiletune.lab.examples.simple_matmul import matmul_into
n = 4096
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
pr = cProfile.Profile()
t = time.perf_counter()
pr.enable()
matmul_into(a, b, c)
torch.cuda.synchronize()
pr.disable()
wall = time.perf_counter() - t
s = io.StringIO()
st = pstats.Stats(pr, stream=s).sort_stats("cumulative")
st.print_stats(45)
s2 = io.StringIO()
pstats.Stats(pr, stream=s2).sort_stats("tottime").print_stats(25)
open(%r, "w").write(f"wall {wall:.3f} s\\n" + s.getvalue() + "\\n==== by tottime\\n" + s2.getvalue())
print("RESULT " + json.dumps({"wall_s": wall}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = fresh_env()
    cold = run_child(CODE % str(out / "profile_cold_tune.txt"), env)
    warm = run_child(CODE % str(out / "profile_warm_first_call.txt"), env)
    print({"cold_tune_s": cold["wall_s"], "warm_first_call_s": warm["wall_s"]})


if __name__ == "__main__":
    sys.exit(main())
