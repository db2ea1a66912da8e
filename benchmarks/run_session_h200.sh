#!/usr/bin/env bash
# One device call of the 2026-12-04 evening session: GPU tests of what changed, then the issues' benchmarks.
# Usage (device): bash benchmarks/run_session_h200.sh PART   (PART: a = tests + first forward + fault space +
# compile tax; b = nearest quality + hf patch + cold tuning speed;
# c = off-grid rows (seed $SEED, default 7) + hf patch; d = fault space + cold tuning speed + fault/worker GPU
# tests + hf patch; e = first forward + nearest quality + race/compile GPU tests; f = the torch fallback while
# compiling (2026-12-05): its GPU test, compile pool and warm-model tests, first forward (cold rows are its case),
# off-grid non-causal attention served by causal kin); g = first forward profiled (seed 5), the warm-model and
# fallback GPU tests, off-grid attention (seed 5); h = the same after the
# front-end-only race and the SDPA references (seed 6, Qwen first), compile-pool and fallback GPU tests;
# i = fault space, cold tuning speed and compile-pool/fault GPU tests after the forked front ends;
# j (2026-12-06) = where a worker's start goes (probe_worker_start) and the fault space; k = the same after
# the zygote, with its GPU test and the fault tests; l = cold tuning speed; m = k and l in one call (short);
# n = the zygote without kernel packages (workers import those), its test, fault space, TileGym matmul speed;
# o = fault space and TileGym matmul speed (2 repetitions: the last of the session's device time);
# p (2026-12-06) = the GPU tests of kernels by value, the zygote, quiet exit and faults, then the fault space and
# cold tuning speed of all three kernels; q = first forward (12 shapes, seed $SEED) and nearest quality of
# the two worst families (softmax, matmul_linear; 40 shapes each as the budget allows); r = the compile tax of
# decode, one layer and a stack of 8 in one compiled frame (as when a whole model is compiled); s = r with
# tighter budgets, then the patched Hugging Face models (after the graph-break fix); t = GPU tests of the
# zygote forked from the caller, fault space, cold tuning speed of rmsnorm and matmul; u = TileGym matmul's
# cold tuning speed, the patched HF models after waiting for background compiles, first forward (seed $SEED).
# v (2026-12-06 evening) = the zygote-fork GPU tests (rewritten), fault space, cold tuning speed of matmul and
# rmsnorm with each session's compile trace (TILETUNE_COMPILE_TRACE), the patched HF models decode first.
# w (2026-12-06 night) = GPU tests (zygote fork, faults, compile pool), the compile order A/B (largest tiles first
# against the space's order, tiletune side only, cold), fault space, cold tuning speed of matmul and rmsnorm;
# x = the patched HF models (decode first) alone; y = the timeline of cold misses (TILETUNE_COMPILE_TRACE marks:
# the caller's sources and session, the worker's requests, the pool), tiletune side only, three kernels;
# z = after the zygote warms cuTile's compiler: cold tuning speed of the three kernels (with the timeline), the
# zygote GPU tests, fault space; zz = the fault space after the baseline-first checks, then cold tuning speed
# of rmsnorm and matmul (one repetition each), for what device time is left; ab (2026-12-06 night) = a spawned
# zygote's imports (importtime), fault space, cold tuning speed of the three kernels (1 repetition), first forward;
# ac = the patched HF models' decode under torch.compile with a torch.profiler profile of each column;
# ad = the recipe GPU tests (decode attention and Hugging Face's RoPE added), then ac with the recipes' report;
# ae = first forward of one prefill and one decode shape (Llama), profiled; af = decode attention and recipe GPU
# tests, the patched HF decode profiled with the recipes' report, ae; ag = fault space and cold tuning speed of the
# three kernels (2 repetitions); ah = the patched HF models in generation (a cache grown by one position per
# step, ms per token) and decode; ai = the patched HF decode with the memory-bound ops lowered under compile
# (and, as a column, as custom ops), profiled, then the compile tax of decode; aj = GPU tests of the ops and the
# patched HF models under torch.compile; ak = the HF decode in 3 interleaved rounds (lowered and custom-op compile
# routes), then first forward (seed $SEED, default 31) after the cheaper miss path;
# al (2026-12-07) = fault space, GPU tests of checks, faults, warm model and fallback, cold tuning of matmul and rmsnorm;
# am = the patched HF prefill in 2 interleaved rounds (both compile routes), then test_gpu_decode_attention.py;
# an = the first call of decode attention's two references (probe_reference_first_use), the direct-kernel GPU tests,
# first forward (seed $SEED, default 47), the patched HF decode in 3 interleaved rounds (Qwen2 first);
# ao = issue 42's causes: the whole attention space on off-grid GQA rows (probe_attention) and the tail-split GEMM
# on large-M rows (probe_gemm_space), each against SDPA / cuBLAS with do_bench;
# ap = the direct-kernel GPU tests (the fused SDPA reference), the references' first calls, then ao with one
# attention row; aq = first forward (seed $SEED) and the patched HF decode in rounds (an's second half), fault space.
# ar (2026-12-07) = the fallback and fault GPU tests (table answers fall back while compiling), the five shipped
# attention entries re-made in the 17-config space (make_table into $OUT/r/table.json: copy it over the shipped
# file), the off-grid GQA attention rows (seed $SEED, default 11); as = cold tuning of matmul and rmsnorm (the
# sessions' per-config measurements recorded) and the fault space, after the claims on assemblies;
# at = the fault and fallback GPU tests and the fault space twice after the watchdog's teardown allowance, the
# pick's load regimes (probe_pick_regimes), off-grid attention with the re-made table (seeds 61 and $SEED);
# au = the compile tax of decode after the lowering (one shape per model), then Nsight Compute on the two worst
# off-grid GEMM rows of seed 61 (the library GEMM against F.linear); av = first forward with served_vs_tuned
# (seed $SEED, default 79, 3 shapes per model, 2 of them tuned), then nearest-neighbour quality of softmax and
# matmul (40 shapes each as the budget allows, seed $SEED); aw = cold tuning of TileGym's matmul with 16 compile
# processes against 8 (tuning_speed --env-ab), then the cold tuning rows of all three kernels (2 repetitions);
# ax (owed on an H200 after 2026-12-07's H100 calls) = the narrow-row store probe (probe_narrow_rows), the pick's load regimes, cold tuning of the three kernels
# after the deferred reference (2 repetitions), the fault space, the compile tax of decode; ay = the two off-grid
# GEMM rows Nsight Compute read on 2026-12-07 tuned over the 512-config space (GROUP_M 16 included: does a swizzle
# band that covers all 9 row tiles stop the 1058-row kernel reading its weight twice?).
# az (2026-12-07 evening) = the worker, fault and fallback GPU tests after the deferred reference, the fault space,
# cold tuning of the three kernels; suite1, suite2 = the whole GPU suite in two calls (suite1: the kernel files on
# 6 pytest-xdist workers; suite2: the timing-sensitive and process-spawning files, one test at a time);
# ba = cold tuning of the three kernels, then nearest-neighbour quality of the GEMM (seed $SEED, default 97);
# bb = cold tuning of RMSNorm and TileGym's matmul with the caller's cuTile prewarm on and off (--env-ab);
# bc = the tables' bucket entry against the entry nearest the call's rows (probe_table_nearer), GEMM nearest quality;
# bd = ba's cold tuning, then bc, in one call.
# bg (2026-12-07 late) = the narrow-row fix: be's failing tests, the padded-row and narrow-product tests, the probe.
# bi (2026-12-08) = the fault space, then nearest quality of the eight memory-bound families; bj = first forward,
# then nearest quality of the GEMM and attention families; bk = bi with a shorter budget, then first forward.
# Results under $OUT/r (tarred by the caller).
set -u
source .gpu/activate.sh
python -m compileall -q src benchmarks
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
t0=$(date +%s)
case "$1" in
a)
  timeout 200 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_ipc.py \
    tests/test_gpu_compile_pool.py tests/test_gpu_warm_model.py tests/test_gpu_faults.py > $R/pytest_a.txt 2>&1
  tail -4 $R/pytest_a.txt
  (cd benchmarks && timeout 120 python fault_matrix.py --fault-space --out $R > $R/fault.log 2>&1; tail -2 $R/fault.log)
  (cd benchmarks && timeout 130 python compile_tax.py --out $R --quick > $R/ctax.log 2>&1; tail -2 $R/ctax.log)
  (cd benchmarks && timeout $(( ${FF_S:-200} + 30 )) python first_forward.py --out $R --shapes 6 --tuned-rows 1 --budget-s 210 > $R/ff.log 2>&1; tail -2 $R/ff.log)
  ;;
b)
  (cd benchmarks && timeout 250 python nearest_quality.py --out $R --per-family 12 --seed 11 --budget-s 230 > $R/nq.log 2>&1; tail -2 $R/nq.log)
  (cd benchmarks && timeout 150 python hf_patch.py --out $R --quick --budget-s 130 > $R/hf.log 2>&1; tail -2 $R/hf.log)
  (cd benchmarks && timeout 150 python tuning_speed.py --out $R --quick > $R/ts.log 2>&1; tail -2 $R/ts.log)
  ;;
c)
  (cd benchmarks && timeout 340 python offgrid.py --out $R --seed ${SEED:-7} --per-family 30 --budget-s 310 > $R/offgrid.log 2>&1; tail -3 $R/offgrid.log)
  (cd benchmarks && timeout 200 python hf_patch.py --out $R --quick --budget-s 170 > $R/hf.log 2>&1; tail -3 $R/hf.log)
  ;;
d)
  (cd benchmarks && timeout 70 python fault_matrix.py --fault-space --out $R > $R/fault.log 2>&1; tail -2 $R/fault.log)
  (cd benchmarks && timeout ${TS_S:-300} python tuning_speed.py --out $R --reps 3 > $R/ts.log 2>&1; tail -3 $R/ts.log)
  timeout ${TEST_S:-110} python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_faults.py tests/test_gpu_ipc.py \
    > $R/pytest_d.txt 2>&1; tail -4 $R/pytest_d.txt
  (cd benchmarks && timeout 80 python hf_patch.py --out $R --quick --budget-s 70 > $R/hf.log 2>&1; tail -3 $R/hf.log)
  ;;
e)
  (cd benchmarks && timeout 190 python first_forward.py --out $R --shapes 6 --tuned-rows 1 --seed ${SEED:-3} --budget-s 170 > $R/ff.log 2>&1; tail -2 $R/ff.log)
  (cd benchmarks && timeout $(( ${FF_S:-200} + 30 )) python nearest_quality.py --out $R --per-family 40 --seed ${SEED:-3} --budget-s 195 > $R/nq.log 2>&1; tail -2 $R/nq.log)
  timeout 110 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_warm_model.py tests/test_gpu_compile_pool.py \
    tests/test_gpu_hf_patch.py > $R/pytest_e.txt 2>&1; tail -4 $R/pytest_e.txt
  ;;
f)
  timeout 170 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_fallback.py tests/test_gpu_compile_pool.py \
    tests/test_gpu_warm_model.py > $R/pytest_f.txt 2>&1; tail -4 $R/pytest_f.txt
  (cd benchmarks && timeout 220 python first_forward.py --out $R --shapes 6 --tuned-rows 1 --seed ${SEED:-4} --budget-s 200 > $R/ff.log 2>&1; tail -2 $R/ff.log)
  (cd benchmarks && timeout 120 python offgrid.py --out $R --seed ${SEED:-4} --per-family 30 --families attention_gqa --budget-s 100 > $R/offgrid.log 2>&1; tail -3 $R/offgrid.log)
  ;;
g)
  (cd benchmarks && timeout $(( ${FF_S:-200} + 30 )) python first_forward.py --out $R --shapes 3 --tuned-rows 1 --seed ${SEED:-5} --budget-s ${FF_S:-200} --profile > $R/ff.log 2>&1; tail -2 $R/ff.log)
  timeout 170 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_warm_model.py tests/test_gpu_fallback.py > $R/pytest_g.txt 2>&1; tail -4 $R/pytest_g.txt
  (cd benchmarks && timeout 120 python offgrid.py --out $R --seed ${SEED:-5} --per-family 30 --families attention_gqa --budget-s ${OG_S:-100} > $R/offgrid.log 2>&1; tail -3 $R/offgrid.log)
  ;;
h)
  (cd benchmarks && timeout $(( ${FF_S:-200} + 30 )) python first_forward.py --out $R --shapes 3 --tuned-rows 1 --seed ${SEED:-6} \
    --models ${MODELS:-qwen2.5-7b,llama3-8b} --budget-s ${FF_S:-200} --profile > $R/ff.log 2>&1; tail -2 $R/ff.log)
  timeout 120 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_compile_pool.py tests/test_gpu_fallback.py \
    > $R/pytest_h.txt 2>&1; tail -4 $R/pytest_h.txt
  (cd benchmarks && timeout $(( ${OG_S:-90} + 20 )) python offgrid.py --out $R --seed ${SEED:-6} --per-family 30 --families attention_gqa \
    --budget-s ${OG_S:-90} > $R/offgrid.log 2>&1; tail -3 $R/offgrid.log)
  ;;
i)
  (cd benchmarks && timeout 70 python fault_matrix.py --fault-space --out $R > $R/fault.log 2>&1; tail -2 $R/fault.log)
  (cd benchmarks && timeout ${TS_S:-260} python tuning_speed.py --out $R --reps ${REPS:-3} --kernels ${KERNELS:-tilegym_matmul,rmsnorm} \
    > $R/ts.log 2>&1; tail -3 $R/ts.log)
  timeout ${TEST_S:-100} python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_compile_pool.py tests/test_gpu_faults.py \
    > $R/pytest_i.txt 2>&1; tail -4 $R/pytest_i.txt
  ;;
j)
  (cd benchmarks && timeout 150 python probe_worker_start.py --out $R --reps 3 > $R/probe_ws.log 2>&1; tail -3 $R/probe_ws.log)
  (cd benchmarks && timeout 70 python fault_matrix.py --fault-space --out $R > $R/fault.log 2>&1; tail -2 $R/fault.log)
  ;;
k)
  (cd benchmarks && timeout 120 python probe_worker_start.py --out $R --reps 2 > $R/probe_ws.log 2>&1; tail -3 $R/probe_ws.log)
  timeout 200 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_zygote.py tests/test_gpu_faults.py \
    > $R/pytest_k.txt 2>&1; tail -4 $R/pytest_k.txt
  (cd benchmarks && timeout 90 python fault_matrix.py --fault-space --out $R > $R/fault.log 2>&1; tail -2 $R/fault.log)
  ;;
m)
  (cd benchmarks && timeout 60 python probe_worker_start.py --out $R --reps 1 > $R/probe_ws.log 2>&1; tail -2 $R/probe_ws.log)
  cp -r $R/. ${OUT:-/tmp/out}/r/ 2>/dev/null
  timeout 100 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_zygote.py > $R/pytest_m.txt 2>&1; tail -3 $R/pytest_m.txt
  (cd benchmarks && timeout 80 python fault_matrix.py --fault-space --out $R > $R/fault.log 2>&1; tail -2 $R/fault.log)
  cp -r $R/. ${OUT:-/tmp/out}/r/ 2>/dev/null
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO  # written where the device tool collects it even if the call is cut short
  (cd benchmarks && timeout ${TS_S:-300} python tuning_speed.py --out $TSO --reps ${REPS:-3} --kernels ${KERNELS:-tilegym_matmul,rmsnorm} \
    > $TSO/ts.log 2>&1; tail -3 $TSO/ts.log)
  ;;
n)
  timeout 100 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_zygote.py > $R/pytest_n.txt 2>&1; tail -3 $R/pytest_n.txt
  (cd benchmarks && timeout 80 python fault_matrix.py --fault-space --out $R > $R/fault.log 2>&1; tail -2 $R/fault.log)
  cp -r $R/. ${OUT:-/tmp/out}/r/ 2>/dev/null
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${TS_S:-280} python tuning_speed.py --out $TSO --reps ${REPS:-3} --kernels ${KERNELS:-tilegym_matmul} \
    > $TSO/ts.log 2>&1; tail -3 $TSO/ts.log)
  ;;
o)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout 80 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; tail -1 $TSO/fault.log)
  (cd benchmarks && timeout ${TS_S:-165} python tuning_speed.py --out $TSO --reps ${REPS:-2} --kernels ${KERNELS:-tilegym_matmul} \
    > $TSO/ts.log 2>&1; tail -3 $TSO/ts.log)
  ;;
p)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  timeout 200 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_ship_kernels.py tests/test_gpu_zygote.py \
    tests/test_gpu_ipc.py tests/test_gpu_faults.py > $TSO/pytest_p.txt 2>&1; tail -3 $TSO/pytest_p.txt
  (cd benchmarks && timeout 60 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log)
  (cd benchmarks && timeout ${TS_S:-300} python tuning_speed.py --out $TSO --reps ${REPS:-3} > $TSO/ts.log 2>&1; tail -3 $TSO/ts.log)
  ;;
q)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout 260 python first_forward.py --out $TSO --shapes 6 --tuned-rows 1 --seed ${SEED:-15} --budget-s 220 \
    > $TSO/ff.log 2>&1; tail -1 $TSO/ff.log)
  (cd benchmarks && timeout 270 python nearest_quality.py --out $TSO --per-family 40 --seed ${SEED:-15} \
    --families softmax,matmul_linear --budget-s 240 > $TSO/nq.log 2>&1; tail -2 $TSO/nq.log)
  ;;
r)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout 200 python compile_tax.py --out $TSO --quick --phases decode --budget-s 150 > $TSO/ctax1.log 2>&1; tail -1 $TSO/ctax1.log)
  (cd benchmarks && timeout 260 python compile_tax.py --out $TSO --quick --phases decode --stack 8 --budget-s 200 \
    > $TSO/ctax8.log 2>&1; tail -1 $TSO/ctax8.log)
  ;;
s)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout 170 python compile_tax.py --out $TSO --quick --phases decode --budget-s 120 > $TSO/ctax1.log 2>&1; tail -1 $TSO/ctax1.log)
  (cd benchmarks && timeout 200 python compile_tax.py --out $TSO --quick --phases decode --stack 8 --budget-s 150 \
    > $TSO/ctax8.log 2>&1; tail -1 $TSO/ctax8.log)
  (cd benchmarks && timeout 170 python hf_patch.py --out $TSO --quick --budget-s 130 > $TSO/hf.log 2>&1; tail -2 $TSO/hf.log)
  ;;
t)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  timeout 170 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_zygote_fork.py tests/test_gpu_ship_kernels.py \
    tests/test_gpu_zygote.py tests/test_gpu_faults.py > $TSO/pytest_t.txt 2>&1; tail -3 $TSO/pytest_t.txt
  (cd benchmarks && timeout 60 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log)
  (cd benchmarks && timeout ${TS_S:-270} python tuning_speed.py --out $TSO --reps ${REPS:-3} --kernels ${KERNELS:-rmsnorm,matmul} \
    > $TSO/ts.log 2>&1; tail -3 $TSO/ts.log)
  ;;
u)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${TS_S:-200} python tuning_speed.py --out $TSO --reps ${REPS:-3} --kernels tilegym_matmul \
    > $TSO/ts.log 2>&1; tail -3 $TSO/ts.log)
  (cd benchmarks && timeout 150 python hf_patch.py --out $TSO --quick --phases decode,prefill --budget-s 120 > $TSO/hf.log 2>&1; tail -2 $TSO/hf.log)
  (cd benchmarks && timeout ${FF_S:-200} python first_forward.py --out $TSO --shapes 6 --tuned-rows 1 --seed ${SEED:-16} \
    --budget-s $(( ${FF_S:-200} - 30 )) > $TSO/ff.log 2>&1; tail -1 $TSO/ff.log)
  ;;
v)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  timeout 150 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_zygote_fork.py tests/test_gpu_faults.py \
    > $TSO/pytest_v.txt 2>&1; tail -3 $TSO/pytest_v.txt
  (cd benchmarks && timeout 60 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log)
  (cd benchmarks && timeout ${TS_S:-200} python tuning_speed.py --out $TSO --reps ${REPS:-2} --kernels ${KERNELS:-matmul,rmsnorm} \
    > $TSO/ts.log 2>&1; tail -3 $TSO/ts.log)
  (cd benchmarks && timeout ${HF_S:-150} python hf_patch.py --out $TSO --quick --phases decode,prefill --budget-s $(( ${HF_S:-150} - 25 )) \
    > $TSO/hf.log 2>&1; tail -2 $TSO/hf.log)
  ;;
w)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  timeout 150 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_zygote_fork.py tests/test_gpu_faults.py \
    tests/test_gpu_compile_pool.py > $TSO/pytest_w.txt 2>&1; tail -3 $TSO/pytest_w.txt
  (cd benchmarks && timeout ${AB_S:-130} python tuning_speed.py --order-ab --out $TSO --reps ${AB_REPS:-3} --kernels matmul \
    > $TSO/ab.log 2>&1; tail -2 $TSO/ab.log)
  (cd benchmarks && timeout 60 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log)
  (cd benchmarks && timeout ${TS_S:-200} python tuning_speed.py --out $TSO --reps ${REPS:-2} --kernels ${KERNELS:-matmul,rmsnorm} \
    > $TSO/ts.log 2>&1; tail -3 $TSO/ts.log)
  ;;
x)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${HF_S:-300} python hf_patch.py --out $TSO --quick --phases decode,prefill --budget-s $(( ${HF_S:-300} - 25 )) \
    > $TSO/hf.log 2>&1; tail -4 $TSO/hf.log)
  ;;
y)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${AB_S:-200} python tuning_speed.py --order-ab --out $TSO --reps ${AB_REPS:-1} \
    --kernels ${KERNELS:-rmsnorm,matmul,tilegym_matmul} > $TSO/ab.log 2>&1; tail -2 $TSO/ab.log)
  ;;
z)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${TS_S:-300} python tuning_speed.py --out $TSO --reps ${REPS:-2} \
    --kernels ${KERNELS:-matmul,rmsnorm,tilegym_matmul} > $TSO/ts.log 2>&1; tail -4 $TSO/ts.log)
  timeout 120 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_zygote_fork.py tests/test_gpu_zygote.py \
    > $TSO/pytest_z.txt 2>&1; tail -3 $TSO/pytest_z.txt
  (cd benchmarks && timeout 60 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log)
  ;;
zz)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout 45 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log)
  (cd benchmarks && timeout ${TS_S:-90} python tuning_speed.py --out $TSO --reps 1 --kernels rmsnorm,matmul \
    > $TSO/ts.log 2>&1; tail -4 $TSO/ts.log)
  ;;
ab)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  # what a spawned zygote pays: a fresh interpreter's imports, idle machine (python -X importtime)
  for i in 1 2; do
    s0=$EPOCHREALTIME; python -c pass; s1=$EPOCHREALTIME
    TILETUNE_WORKER_ZYGOTE=off python -X importtime -c "import torch, torch.multiprocessing, cuda.tile
import tiletune.devices.workers.worker_main, tiletune.devices.backends.cutile, tiletune.devices.verify
import tiletune.devices.measure, tiletune.devices.compile_pool" 2> $TSO/importtime_$i.txt; s2=$EPOCHREALTIME
    echo "importtime $i: bare python $(awk "BEGIN{print $s1-$s0}") s, zygote imports $(awk "BEGIN{print $s2-$s1}") s" | tee -a $TSO/importtime.log
  done
  (cd benchmarks && timeout 45 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log)
  (cd benchmarks && timeout 150 python tuning_speed.py --out $TSO --reps 1 --kernels rmsnorm,matmul,tilegym_matmul \
    > $TSO/ts.log 2>&1; tail -4 $TSO/ts.log)
  (cd benchmarks && timeout ${FF_S:-230} python first_forward.py --out $TSO --shapes 6 --tuned-rows 1 --seed ${SEED:-21} \
    --budget-s $(( ${FF_S:-230} - 30 )) > $TSO/ff.log 2>&1; tail -1 $TSO/ff.log)
  ;;
ac)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${HF_S:-300} python hf_patch.py --out $TSO --quick --phases decode --models ${MODELS:-llama,qwen2} \
    --profile --budget-s $(( ${HF_S:-300} - 25 )) > $TSO/hf.log 2>&1; tail -3 $TSO/hf.log | cut -c1-600)
  ;;
ad)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  timeout 200 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_fastcall.py > $TSO/pytest_ad.txt 2>&1; tail -4 $TSO/pytest_ad.txt
  (cd benchmarks && timeout ${HF_S:-200} python hf_patch.py --out $TSO --quick --phases decode --models ${MODELS:-llama,qwen2} \
    --profile --budget-s $(( ${HF_S:-200} - 25 )) > $TSO/hf.log 2>&1; tail -1 $TSO/hf.log | cut -c1-300)
  ;;
ae)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${FF_S:-150} python first_forward.py --out $TSO --shapes 2 --tuned-rows 0 --models llama3-8b \
    --profile --seed ${SEED:-22} --budget-s $(( ${FF_S:-150} - 30 )) > $TSO/ffp.log 2>&1; tail -1 $TSO/ffp.log | cut -c1-300)
  ;;
af)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  timeout 150 python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_decode_attention.py tests/test_gpu_fastcall.py \
    > $TSO/pytest_af.txt 2>&1; tail -3 $TSO/pytest_af.txt
  (cd benchmarks && timeout 150 python hf_patch.py --out $TSO --quick --phases decode --profile --budget-s 125 \
    > $TSO/hf.log 2>&1; tail -1 $TSO/hf.log | cut -c1-300)
  (cd benchmarks && timeout 120 python first_forward.py --out $TSO --shapes 2 --tuned-rows 0 --models llama3-8b \
    --profile --seed ${SEED:-23} --budget-s 90 > $TSO/ffp.log 2>&1; tail -1 $TSO/ffp.log | cut -c1-300)
  ;;
ag)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout 45 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log)
  (cd benchmarks && timeout ${TS_S:-300} python tuning_speed.py --out $TSO --reps ${REPS:-2} \
    --kernels ${KERNELS:-matmul,rmsnorm,tilegym_matmul} > $TSO/ts.log 2>&1; tail -2 $TSO/ts.log | cut -c1-300)
  cp $TSO/tuning_speed_cold.json $TSO/ts_cold.json 2>/dev/null
  ;;
ah)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${HF_S:-280} python hf_patch.py --out $TSO --quick --phases generate,decode \
    --budget-s $(( ${HF_S:-280} - 25 )) > $TSO/hf.log 2>&1; tail -1 $TSO/hf.log | cut -c1-300)
  ;;
ai)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${HF_S:-300} python hf_patch.py --out $TSO --quick --phases ${PHASES:-decode} --custom-ops-column \
    --profile --rounds ${ROUNDS:-1} --budget-s $(( ${HF_S:-300} - 25 )) > $TSO/hf.log 2>&1; tail -1 $TSO/hf.log | cut -c1-300)
  [ "${CT_S:-200}" -gt 0 ] && (cd benchmarks && timeout ${CT_S:-200} python compile_tax.py --out $TSO --quick --phases decode \
    --budget-s $(( ${CT_S:-200} - 20 )) > $TSO/ctax.log 2>&1; tail -1 $TSO/ctax.log | cut -c1-300)
  ;;
ak)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${HF_S:-260} python hf_patch.py --out $TSO --quick --phases decode --custom-ops-column \
    --rounds ${ROUNDS:-3} --budget-s $(( ${HF_S:-260} - 20 )) > $TSO/hf.log 2>&1; tail -1 $TSO/hf.log | cut -c1-300)
  (cd benchmarks && timeout ${FF_S:-230} python first_forward.py --out $TSO --shapes ${FF_SHAPES:-4} --tuned-rows 0 \
    --seed ${SEED:-31} --budget-s $(( ${FF_S:-230} - 30 )) > $TSO/ff.log 2>&1; tail -1 $TSO/ff.log | cut -c1-300)
  ;;
al)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout 60 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log | cut -c1-300)
  timeout ${TEST_S:-220} python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_core.py tests/test_gpu_faults.py \
    tests/test_gpu_warm_model.py tests/test_gpu_fallback.py > $TSO/pytest_al.txt 2>&1; tail -3 $TSO/pytest_al.txt
  (cd benchmarks && timeout ${TS_S:-220} python tuning_speed.py --out $TSO --reps ${REPS:-2} \
    --kernels ${KERNELS:-matmul,rmsnorm} > $TSO/ts.log 2>&1; tail -2 $TSO/ts.log | cut -c1-300)
  ;;
am)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${HF_S:-240} python hf_patch.py --out $TSO --quick --phases prefill --custom-ops-column \
    --rounds ${ROUNDS:-2} --budget-s $(( ${HF_S:-240} - 20 )) > $TSO/hf_prefill.log 2>&1; tail -1 $TSO/hf_prefill.log | cut -c1-300)
  timeout ${TEST_S:-300} python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_decode_attention.py \
    > $TSO/pytest_am.txt 2>&1; tail -3 $TSO/pytest_am.txt
  ;;
an)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout 60 python probe_reference_first_use.py --out $TSO 2>&1 | cut -c1-300)
  timeout ${TEST_S:-90} python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_decode_attention.py -k direct \
    > $TSO/pytest_an.txt 2>&1; tail -3 $TSO/pytest_an.txt
  (cd benchmarks && timeout ${FF_S:-170} python first_forward.py --out $TSO --shapes ${FF_SHAPES:-4} --tuned-rows 0 \
    --seed ${SEED:-47} --budget-s $(( ${FF_S:-170} - 25 )) > $TSO/ff.log 2>&1; tail -1 $TSO/ff.log | cut -c1-300)
  (cd benchmarks && timeout ${HF_S:-240} python hf_patch.py --out $TSO --quick --models qwen2,llama --phases decode \
    --rounds ${ROUNDS:-3} --budget-s $(( ${HF_S:-240} - 15 )) > $TSO/hf.log 2>&1; tail -1 $TSO/hf.log | cut -c1-300)
  ;;
ao)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${PA_S:-260} python probe_attention.py --out $TSO \
    --rows ${PA_ROWS:-2:32:8:1404:128:1,3:32:8:552:128:0} > $TSO/probe_attention.log 2>&1; tail -6 $TSO/probe_attention.log | cut -c1-400)
  (cd benchmarks && TILETUNE_ON_MISS=tune timeout ${PG_S:-240} python probe_gemm_space.py --out $TSO \
    --rows ${PG_ROWS:-2076:4096:14336,4261:4096:4096} > $TSO/probe_gemm_space.log 2>&1; tail -12 $TSO/probe_gemm_space.log | cut -c1-400)
  ;;
ap)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  timeout ${TEST_S:-100} python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_decode_attention.py -k direct \
    > $TSO/pytest_ap.txt 2>&1; tail -3 $TSO/pytest_ap.txt
  if [ "${PR_S:-60}" -gt 0 ]; then  # PR_S=0: no reference probe
    (cd benchmarks && timeout ${PR_S:-60} python probe_reference_first_use.py --out $TSO 2>&1 | cut -c1-300)
  fi
  (cd benchmarks && TILETUNE_ON_MISS=tune timeout ${PG_S:-200} python probe_gemm_space.py --out $TSO \
    --rows ${PG_ROWS:-2076:4096:14336,4261:4096:4096} > $TSO/probe_gemm_space.log 2>&1; tail -12 $TSO/probe_gemm_space.log | cut -c1-400)
  if [ "${PA_S:-170}" -gt 0 ]; then  # PA_S=0: no attention probe (short of device time)
    (cd benchmarks && timeout ${PA_S:-170} python probe_attention.py --out $TSO \
      --rows ${PA_ROWS:-2:32:8:1404:128:1} > $TSO/probe_attention.log 2>&1; tail -4 $TSO/probe_attention.log | cut -c1-400)
  fi
  ;;
aq)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${FF_S:-170} python first_forward.py --out $TSO --shapes ${FF_SHAPES:-4} --tuned-rows 0 \
    --seed ${SEED:-47} --budget-s $(( ${FF_S:-170} - 25 )) > $TSO/ff.log 2>&1; tail -1 $TSO/ff.log | cut -c1-300)
  (cd benchmarks && timeout ${HF_S:-240} python hf_patch.py --out $TSO --quick --models qwen2,llama --phases decode \
    --rounds ${ROUNDS:-3} --budget-s $(( ${HF_S:-240} - 15 )) > $TSO/hf.log 2>&1; tail -1 $TSO/hf.log | cut -c1-300)
  (cd benchmarks && timeout 60 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log | cut -c1-300)
  ;;
ar)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  timeout ${TEST_S:-150} python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_fallback.py tests/test_gpu_faults.py \
    > $TSO/pytest_ar.txt 2>&1; tail -4 $TSO/pytest_ar.txt
  cp src/tiletune/data/tables/h200-sm90.json $TSO/table.json
  (cd benchmarks && TILETUNE_TABLES=0 timeout ${MT_S:-200} python make_table.py --db /tmp/attn_fill.db --table $TSO/table.json \
    --ops "" --attention-s 512,1024,2048,4096,8192 --model llama3-8b --deadline-s $(( ${MT_S:-200} - 40 )) \
    --report $TSO/make_table_attention.json > $TSO/make_table.log 2>&1; tail -2 $TSO/make_table.log | cut -c1-300)
  (cd benchmarks && timeout ${OG_S:-200} python offgrid.py --out $TSO --families attention_gqa --per-family ${PER:-8} \
    --seed ${SEED:-11} --budget-s $(( ${OG_S:-200} - 20 )) > $TSO/offgrid.log 2>&1; tail -3 $TSO/offgrid.log | cut -c1-300)
  ;;
as)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${TS_S:-300} python tuning_speed.py --out $TSO --reps ${REPS:-2} \
    --kernels ${KERNELS:-matmul,rmsnorm} > $TSO/ts.log 2>&1; tail -2 $TSO/ts.log | cut -c1-300)
  (cd benchmarks && timeout 60 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log | cut -c1-300)
  ;;
at)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  timeout ${TEST_S:-90} python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_faults.py tests/test_gpu_fallback.py \
    > $TSO/pytest_at.txt 2>&1; tail -3 $TSO/pytest_at.txt
  for i in 1 2; do mkdir -p $TSO/fs$i; (cd benchmarks && timeout 60 python fault_matrix.py --fault-space --out $TSO/fs$i \
    > $TSO/fs$i/fault.log 2>&1; head -1 $TSO/fs$i/fault.log | cut -c1-300); done
  (cd benchmarks && timeout 60 python probe_pick_regimes.py --out $TSO > $TSO/regimes.log 2>&1; tail -6 $TSO/regimes.log | cut -c1-200)
  for sd in 61 ${SEED:-71}; do mkdir -p $TSO/og$sd; (cd benchmarks && timeout 70 python offgrid.py --out $TSO/og$sd \
    --families attention_gqa --per-family 8 --seed $sd --budget-s 60 > $TSO/og$sd/offgrid.log 2>&1; tail -1 $TSO/og$sd/offgrid.log | cut -c1-200); done
  ;;
au)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${CT_S:-220} python compile_tax.py --out $TSO --quick --phases decode \
    --budget-s $(( ${CT_S:-220} - 20 )) > $TSO/ctax.log 2>&1; tail -2 $TSO/ctax.log | cut -c1-300)
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout ${NCU_S:-200} "$NCU" --profile-from-start off --clock-control none --target-processes application-only --nvtx \
    --set full -f -o "$TSO/ncu_gemm_offgrid" python benchmarks/ncu_rows.py \
    --rows ${NCU_ROWS:-gemm:5008x512x3584,gemm:1058x4608x3584} 2>&1 | grep -v "^==PROF==" | tail -6
  "$NCU" --import "$TSO/ncu_gemm_offgrid.ncu-rep" --csv --page details > "$TSO/ncu_gemm_details.csv" 2> "$TSO/ncu_import.err"
  "$NCU" --import "$TSO/ncu_gemm_offgrid.ncu-rep" --csv --page raw > "$TSO/ncu_gemm_raw.csv" 2>> "$TSO/ncu_import.err"
  python benchmarks/ncu_rows.py --summarize "$TSO/ncu_gemm_details.csv" "$TSO/ncu_gemm_raw.csv" --name ncu_gemm_offgrid \
    --out "$TSO" 2>&1 | tail -2
  rm -f "$TSO/ncu_gemm_raw.csv" "$TSO/ncu_gemm_offgrid.ncu-rep"
  ;;
av)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${FF_S:-260} python first_forward.py --out $TSO --shapes ${FF_SHAPES:-3} --tuned-rows 2 \
    --seed ${SEED:-79} --budget-s $(( ${FF_S:-260} - 60 )) > $TSO/ff.log 2>&1; tail -1 $TSO/ff.log | cut -c1-300)
  (cd benchmarks && timeout ${NQ_S:-280} python nearest_quality.py --out $TSO --per-family 40 --seed ${SEED:-79} \
    --families softmax,matmul_linear --budget-s $(( ${NQ_S:-280} - 30 )) > $TSO/nq.log 2>&1; tail -2 $TSO/nq.log | cut -c1-300)
  ;;
aw)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${AB_S:-150} python tuning_speed.py --out $TSO --reps ${AB_REPS:-3} --kernels tilegym_matmul \
    --env-ab ${AB:-TILETUNE_COMPILE_WORKERS=16,8} > $TSO/envab.log 2>&1; tail -2 $TSO/envab.log | cut -c1-300)
  (cd benchmarks && timeout ${TS_S:-300} python tuning_speed.py --out $TSO --reps ${REPS:-2} \
    --kernels ${KERNELS:-tilegym_matmul,matmul,rmsnorm} > $TSO/ts.log 2>&1; tail -2 $TSO/ts.log | cut -c1-300)
  ;;
ax)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout 90 python probe_narrow_rows.py --out $TSO > $TSO/narrow.log 2>&1; tail -40 $TSO/narrow.log | cut -c1-260)
  (cd benchmarks && timeout 60 python probe_pick_regimes.py --out $TSO > $TSO/regimes.log 2>&1; tail -6 $TSO/regimes.log | cut -c1-200)
  (cd benchmarks && timeout ${TS_S:-260} python tuning_speed.py --out $TSO --reps ${REPS:-2} \
    --kernels ${KERNELS:-tilegym_matmul,matmul,rmsnorm} > $TSO/ts.log 2>&1; tail -2 $TSO/ts.log | cut -c1-300)
  (cd benchmarks && timeout 60 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log | cut -c1-300)
  (cd benchmarks && timeout ${CT_S:-120} python compile_tax.py --out $TSO --quick --phases decode \
    --budget-s $(( ${CT_S:-120} - 20 )) > $TSO/ctax.log 2>&1; tail -1 $TSO/ctax.log | cut -c1-300)
  ;;
ay)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${PG_S:-400} python probe_gemm_space.py --rows ${ROWS:-1058:4608:3584,5008:512:3584} --full \
    --out $TSO > $TSO/pgs.log 2>&1; tail -8 $TSO/pgs.log | cut -c1-300)
  ;;
az)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  timeout ${TEST_S:-230} python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_faults.py tests/test_gpu_ipc.py \
    tests/test_gpu_zygote.py tests/test_gpu_zygote_fork.py tests/test_gpu_fallback.py tests/test_gpu_core.py \
    > $TSO/pytest_az.txt 2>&1; tail -4 $TSO/pytest_az.txt
  (cd benchmarks && timeout 60 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log | cut -c1-300)
  (cd benchmarks && timeout ${TS_S:-250} python tuning_speed.py --out $TSO --reps ${REPS:-2} \
    --kernels ${KERNELS:-tilegym_matmul,matmul,rmsnorm} > $TSO/ts.log 2>&1; tail -2 $TSO/ts.log | cut -c1-300)
  ;;
suite1|suite2)
  # the whole GPU suite in two calls: suite1 = the kernel files on 6 pytest-xdist workers (timing does not
  # decide their verdicts); suite2 = the timing-sensitive and process-spawning files, one test at a time
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  ls tests/test_gpu_*.py > $TSO/gpu_files.txt
  SEQ="tests/test_gpu_call_gap.py tests/test_gpu_bench.py tests/test_gpu_core.py tests/test_gpu_fastcall.py
    tests/test_gpu_faults.py tests/test_gpu_compile_pool.py tests/test_gpu_campaign.py tests/test_gpu_ipc.py
    tests/test_gpu_zygote.py tests/test_gpu_zygote_fork.py tests/test_gpu_fallback.py tests/test_gpu_warm_model.py"
  PAR=$(for f in tests/test_gpu_*.py; do case " $(echo $SEQ) " in *" $f "*) ;; *) echo $f;; esac; done)
  # at the limit pytest gets SIGINT, not SIGKILL: it still prints every failure's traceback and the summary
  # (2026-12-07's suite1 was cut at 95% with 16 failures and no reason for any of them)
  if [ "$1" = suite1 ]; then
    timeout -s INT -k 30 ${TEST_S:-520} python -m pytest -m gpu -v -rfEs --tb=short -n 6 --dist load \
      -p no:cacheprovider --junitxml=$TSO/suite1.xml $PAR > $TSO/pytest_suite1.txt 2>&1
    grep -cE " PASSED" $TSO/pytest_suite1.txt; grep -E "^(FAILED|ERROR)|_ test_| passed| failed" $TSO/pytest_suite1.txt | tail -24
  else
    timeout -s INT -k 30 ${TEST_S:-520} python -m pytest -m gpu -v -rfEs --tb=short -p no:cacheprovider \
      --junitxml=$TSO/suite2.xml $SEQ > $TSO/pytest_suite2.txt 2>&1
    grep -cE " PASSED" $TSO/pytest_suite2.txt; grep -E "^(FAILED|ERROR)|_ test_| passed| failed" $TSO/pytest_suite2.txt | tail -24
  fi
  ;;
ba)
  # after 2026-12-07 evening's CPU-tested changes: cold tuning of the three kernels (the examples no longer import
  # the library; before_compile and the open's marks in the result), then nearest-neighbour quality of the GEMM
  # (neighbours measured from the call's own rows) on a fresh seed
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout ${TS_S:-250} python tuning_speed.py --out $TSO --reps ${REPS:-2} \
    --kernels ${KERNELS:-tilegym_matmul,matmul,rmsnorm} > $TSO/ts.log 2>&1; tail -2 $TSO/ts.log | cut -c1-300)
  (cd benchmarks && timeout ${NQ_S:-280} python nearest_quality.py --out $TSO --per-family 40 --seed ${SEED:-97} \
    --families matmul_linear --budget-s $(( ${NQ_S:-280} - 30 )) > $TSO/nq.log 2>&1; tail -2 $TSO/nq.log | cut -c1-300)
  ;;
bb)
  # is the caller's cuTile prewarm thread what slows the first miss's sources (0.1-0.25 s in the database source on
  # the GPU host, 4 ms on a CPU one)? cold tuning with TILETUNE_PREWARM on and off, alternated
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  for k in rmsnorm tilegym_matmul; do
    (cd benchmarks && timeout ${AB_S:-200} python tuning_speed.py --out $TSO/$k --reps ${AB_REPS:-3} --kernels $k \
      --env-ab TILETUNE_PREWARM=1,0 > $TSO/envab_$k.log 2>&1; tail -2 $TSO/envab_$k.log | cut -c1-300)
  done
  ;;
bc|bd)
  # bc: the tables' bucket answers from the entry nearest the call's rows (2026-12-07 late): the bucket entry's
  # config against the nearer entry's on drawn rows where the rule switches, then GEMM nearest quality (seed
  # $SEED); bd: cold tuning of the three kernels (ba's first half) first, all in one call
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  if [ "$1" = bd ]; then
    (cd benchmarks && timeout ${TS_S:-220} python tuning_speed.py --out $TSO --reps ${REPS:-2} \
      --kernels ${KERNELS:-tilegym_matmul,matmul,rmsnorm} > $TSO/ts.log 2>&1; tail -2 $TSO/ts.log | cut -c1-300)
  fi
  (cd benchmarks && timeout ${PT_S:-150} python probe_table_nearer.py --seed ${SEED:-5} --per-pair ${PER_PAIR:-2} \
    --out $TSO > $TSO/ptn.log 2>&1; grep -E "nearer \(|wrote" $TSO/ptn.log | cut -c1-160)
  (cd benchmarks && timeout ${NQ_S:-200} python nearest_quality.py --out $TSO --per-family 40 --seed ${SEED:-5} \
    --families matmul_linear --budget-s $(( ${NQ_S:-200} - 25 )) > $TSO/nq.log 2>&1; tail -2 $TSO/nq.log | cut -c1-300)
  ;;
bf)
  # after shipped tables left calls off their buckets' bounds to the race (2026-12-07 late): a model's first forward
  # (warm and cold, served vs tuned) and GEMM nearest quality on a new seed
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout $(( ${FF_S:-220} + 30 )) python first_forward.py --out $TSO --shapes 4 --tuned-rows 1 \
    --seed ${SEED:-29} --budget-s ${FF_S:-220} > $TSO/ff.log 2>&1; tail -2 $TSO/ff.log | cut -c1-300)
  (cd benchmarks && timeout ${NQ_S:-240} python nearest_quality.py --out $TSO --per-family 40 --seed ${SEED:-29} \
    --families matmul_linear --budget-s $(( ${NQ_S:-240} - 25 )) > $TSO/nq.log 2>&1; tail -2 $TSO/nq.log | cut -c1-300)
  ;;
bg)
  # after the narrow-row fix (2026-12-07 late): plain stores for rows that cannot use TMA, one-row or one-column
  # products off 16 bytes through torch; the tests that failed in be, the padded-row test, the narrow products
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  TILETUNE_GPU_QUICK=1 timeout -s INT -k 30 ${TEST_S:-240} python -m pytest -m gpu -v -rfEs --tb=short -p no:cacheprovider \
    "tests/test_gpu_kernels_compute.py::test_matmul_batched_and_vector_shapes" tests/test_gpu_kernels_memory.py \
    tests/test_gpu_gemm_glu.py -k "test_matmul_batched or shape1 or narrow or test_ragged_shapes or (glu and shape6)" > $TSO/pytest_bg.txt 2>&1
  grep -cE " PASSED" $TSO/pytest_bg.txt; grep -E "^(FAILED|ERROR)|^E |_ test_| passed| failed" $TSO/pytest_bg.txt | tail -40
  (cd benchmarks && timeout 90 python probe_narrow_rows.py --out $TSO > $TSO/narrow.log 2>&1; tail -3 $TSO/narrow.log | cut -c1-260)
  ;;
bh)
  # one call for 2026-12-07 night: part bg (the narrow-row fix), the fault space (the watchdog asks the GPU for
  # Xid events at a check kernel's deadline), a model's first forward on a new seed
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  TEST_S=${TEST_S:-200} bash "$0" bg
  (cd benchmarks && timeout 70 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log | cut -c1-300)
  (cd benchmarks && timeout $(( ${FF_S:-150} + 30 )) python first_forward.py --out $TSO --shapes 4 --tuned-rows 1 \
    --seed ${SEED:-41} --budget-s ${FF_S:-150} > $TSO/ff.log 2>&1; tail -2 $TSO/ff.log | cut -c1-300)
  ;;
bi)
  # 2026-12-08: the fault space (the Xid floor rule and grace, first GPU run), then nearest-neighbour quality of the
  # eight memory-bound families (the nearest config's variants race when a compile cache holds them), seed $SEED
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout 70 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log | cut -c1-300)
  (cd benchmarks && timeout ${NQ_S:-420} python nearest_quality.py --out $TSO --per-family 40 --seed ${SEED:-101} \
    --families rms_norm,swiglu,softmax,rope,rms_norm_residual,layer_norm,geglu,cross_entropy \
    --budget-s $(( ${NQ_S:-420} - 40 )) > $TSO/nq.log 2>&1; tail -2 $TSO/nq.log | cut -c1-300)
  ;;
bj)
  # 2026-12-08: a model's first forward on the H200 (warm and cold, served vs tuned), then nearest-neighbour quality
  # of the GEMM and attention families, seed $SEED
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout $(( ${FF_S:-150} + 30 )) python first_forward.py --out $TSO --shapes 4 --tuned-rows 1 \
    --seed ${SEED:-101} --budget-s ${FF_S:-150} > $TSO/ff.log 2>&1; tail -2 $TSO/ff.log | cut -c1-300)
  (cd benchmarks && timeout ${NQ_S:-360} python nearest_quality.py --out $TSO --per-family 40 --seed ${SEED:-101} \
    --families matmul_linear,attention --budget-s $(( ${NQ_S:-360} - 40 )) > $TSO/nq.log 2>&1; tail -2 $TSO/nq.log | cut -c1-300)
  ;;
bk)
  # 2026-12-08, one call for what is left of the session's device time: bi's fault space and memory-bound nearest
  # quality with a shorter budget, then a model's first forward (seed $SEED)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  NQ_S=${NQ_S:-300} bash "$0" bi
  (cd benchmarks && timeout $(( ${FF_S:-110} + 30 )) python first_forward.py --out $TSO --shapes 4 --tuned-rows 1 \
    --seed ${SEED:-101} --budget-s ${FF_S:-110} > $TSO/ff.log 2>&1; tail -2 $TSO/ff.log | cut -c1-300)
  ;;
be)
  # suite1's 16 failures of 2026-12-07 20:00 (6 xdist workers on one GPU), one process, with their reasons: is it the
  # contention (a watchdog or a check deadline under six tuning processes) or the kernels?
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  timeout -s INT -k 30 ${TEST_S:-300} python -m pytest -m gpu -v -rfEs --tb=short -p no:cacheprovider \
    "tests/test_gpu_kernels_compute.py::test_matmul_batched_and_vector_shapes" \
    tests/test_gpu_kernels_memory.py -k "test_matmul_batched or shape1 or test_swiglu or test_layer_norm" \
    > $TSO/pytest_be.txt 2>&1
  grep -cE " PASSED" $TSO/pytest_be.txt; grep -E "^(FAILED|ERROR)|^E |_ test_| passed| failed" $TSO/pytest_be.txt | tail -40
  ;;
aj)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  timeout ${TEST_S:-400} python -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_gpu_torch_ops.py tests/test_gpu_hf_patch.py \
    > $TSO/pytest_aj.txt 2>&1; tail -5 $TSO/pytest_aj.txt
  ;;
l)
  (cd benchmarks && timeout ${TS_S:-330} python tuning_speed.py --out $R --reps ${REPS:-3} --kernels ${KERNELS:-tilegym_matmul,rmsnorm} \
    > $R/ts.log 2>&1; tail -3 $R/ts.log)
  ;;
esac
echo "part $1 took $(( $(date +%s) - t0 )) s"
