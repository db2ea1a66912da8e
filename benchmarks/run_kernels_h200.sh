#!/bin/bash
# One device call for issues 5 and 6 on an nvidia-h200-x2 host (two H200s, 32 cores).
#   GPU 0, cores 0-15:  the GPU tests given in $TESTS, then kernels_compute.py --only attention
#   GPU 1, cores 16-31: kernels_memory.py, then kernels_compute.py --only gemm
# The two halves share nothing but the host; pinning the cores keeps one half's compiles from
# slowing the other half's host side. Logs and result JSONs go to $OUT (a folder per half).
# Budgets (seconds, wall): $TEST_S, $MEM_DEADLINE, $END (all work stops starting after it).
#   source .gpu/activate.sh && bash benchmarks/run_kernels_h200.sh
set -u
OUT=${OUT:-/tmp/kernels-out}
TESTS=${TESTS:-tests/test_gpu_kernels_compute.py}
TEST_S=${TEST_S:-240}
MEM_DEADLINE=${MEM_DEADLINE:-170}
END=${END:-540}
mkdir -p "$OUT/g0" "$OUT/g1"
pin() { if command -v taskset >/dev/null; then taskset -c "$@"; else shift; "$@"; fi; }
t0=$(date +%s)
left() { echo $(( END - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpus.csv"
(
  export CUDA_VISIBLE_DEVICES=0
  pin 0-15 timeout "$TEST_S" python -m pytest -m gpu -q -p no:cacheprovider $TESTS > "$OUT/g0/tests.log" 2>&1
  echo "rc=$?" >> "$OUT/g0/tests.log"
  l=$(left)
  pin 0-15 timeout $(( l > 30 ? l : 30 )) python benchmarks/kernels_compute.py --only attention --out "$OUT/g0" \
    --deadline $(( l - 80 > 10 ? l - 80 : 10 )) > "$OUT/g0/attention.log" 2>&1
  echo "rc=$?" >> "$OUT/g0/attention.log"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  pin 16-31 timeout $(( MEM_DEADLINE + 90 )) python benchmarks/kernels_memory.py --out "$OUT/g1" --no-readme \
    --deadline "$MEM_DEADLINE" > "$OUT/g1/memory.log" 2>&1
  echo "rc=$?" >> "$OUT/g1/memory.log"
  l=$(left)
  pin 16-31 timeout $(( l > 30 ? l : 30 )) python benchmarks/kernels_compute.py --only gemm --out "$OUT/g1" \
    --deadline $(( l - 60 > 10 ? l - 60 : 10 )) > "$OUT/g1/gemm.log" 2>&1
  echo "rc=$?" >> "$OUT/g1/gemm.log"
) &
wait
rm -f "$OUT"/g*/*.png "$OUT"/g*/*.partial.json "$OUT"/g*/*.md  # at most 8 files come back
ls -la "$OUT" "$OUT"/g0 "$OUT"/g1
