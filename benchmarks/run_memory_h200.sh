#!/bin/bash
# One device call for issue 5 on an nvidia-h200-x2 host (two H200s, 32 cores): two queues of work,
# one per GPU, each pinned to its 16 cores so one half's compiles do not slow the other's host side.
#   Q0 / Q1: ';'-separated steps for GPU 0 / GPU 1, each one of
#     tests:<pytest -k expression>   the GPU tests of tests/test_gpu_kernels_memory.py it selects
#     probe:<ops>                    benchmarks/probe_memory.py --only <ops> (empty: every problem)
#     bench:<ops>                    benchmarks/kernels_memory.py --only <ops> (empty: every op)
#   END: seconds after which no step starts; a running step is cut at END + 30.
# Logs and result JSONs go to $OUT/g0 and $OUT/g1 (at most 8 files come back: PNGs are dropped).
#   source .gpu/activate.sh && Q0='tests:dtype1' Q1='probe:' bash benchmarks/run_memory_h200.sh
set -u
OUT=${OUT:-/tmp/memory-out}
END=${END:-540}
mkdir -p "$OUT/g0" "$OUT/g1"
pin() { if command -v taskset >/dev/null; then taskset -c "$@"; else shift; "$@"; fi; }
t0=$(date +%s)
left() { echo $(( END + 30 - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpus.csv"
queue() {  # queue <gpu> <cores> <steps>
  local gpu=$1 cores=$2 steps=$3 i=0 step kind arg l
  export CUDA_VISIBLE_DEVICES=$gpu
  IFS=';' read -ra parts <<< "$steps"
  for step in "${parts[@]}"; do
    i=$((i + 1)); kind=${step%%:*}; arg=${step#*:}; l=$(left)
    if [ "$l" -le 40 ]; then echo "skipped (time): $step" >> "$OUT/g$gpu/skipped.log"; continue; fi
    case $kind in
      tests) pin "$cores" timeout "$l" python -m pytest -m gpu -q -p no:cacheprovider --durations=15 \
               tests/test_gpu_kernels_memory.py -k "$arg" > "$OUT/g$gpu/tests$i.log" 2>&1
             echo "rc=$?" >> "$OUT/g$gpu/tests$i.log" ;;
      probe) pin "$cores" timeout "$l" python benchmarks/probe_memory.py --out "$OUT/g$gpu" ${arg:+--only "$arg"} \
               --deadline $(( l - 60 > 10 ? l - 60 : 10 )) > "$OUT/g$gpu/probe.log" 2>&1
             echo "rc=$?" >> "$OUT/g$gpu/probe.log" ;;
      bench) pin "$cores" timeout "$l" python benchmarks/kernels_memory.py --out "$OUT/g$gpu" --no-readme \
               ${arg:+--only "$arg"} --deadline $(( l - 90 > 10 ? l - 90 : 10 )) > "$OUT/g$gpu/memory.log" 2>&1
             echo "rc=$?" >> "$OUT/g$gpu/memory.log" ;;
      *) echo "unknown step $step" >> "$OUT/g$gpu/skipped.log" ;;
    esac
  done
}
queue 0 0-15 "${Q0:-}" &
queue 1 16-31 "${Q1:-}" &
wait
rm -f "$OUT"/g*/*.png "$OUT"/g*/*.partial.json "$OUT"/g*/*.md
ls -la "$OUT" "$OUT"/g0 "$OUT"/g1
