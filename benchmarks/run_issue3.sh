#!/usr/bin/env bash
# Runs the tuning-speed, warm-start, dispatch-overhead, determinism and fault-matrix benchmarks on the GPU host.
# Usage (GPU host, repo root): source .gpu/activate.sh && bash benchmarks/run_issue3.sh [OUT_DIR]
set -uo pipefail
out=$(realpath -m "${1:-benchmarks/results/h200}")
mkdir -p "$out"
cd "$(dirname "$0")"
rc=0
for b in dispatch_overhead warm_start tuning_speed determinism fault_matrix; do
  echo "== $b"
  python "$b.py" --out "$out" || rc=1
done
exit $rc
