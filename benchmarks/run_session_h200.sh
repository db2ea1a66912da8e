#!/usr/bin/env bash
# One device call of a GPU session: GPU tests of what changed, then the issues' benchmarks.
# Usage (device): bash benchmarks/run_session_h200.sh PART. Parts retired before 2026-12-07 evening (a to aw)
# are in git history (commit 625fc2d); docs/GPU-NOTES.md names the part behind each of its figures.
# ax (owed on an H200 after 2026-12-07's H100 calls) = the narrow-row store probe (probe_narrow_rows), the pick's
# load regimes, cold tuning of the three kernels after the deferred reference (2 repetitions), the fault space, the
# compile tax of decode; ay = the two off-grid GEMM rows Nsight Compute read on 2026-12-07 tuned over the
# 512-config space (GROUP_M 16 included: does a swizzle band that covers all 9 row tiles stop the 1058-row kernel
# reading its weight twice?).
# az (2026-12-07 evening) = the worker, fault and fallback GPU tests after the deferred reference, the fault space,
# cold tuning of the three kernels; suite1, suite2 = the whole GPU suite in two calls (suite1: the kernel files on
# 6 pytest-xdist workers; suite2: the timing-sensitive and process-spawning files, one test at a time);
# ba = cold tuning of the three kernels, then nearest-neighbour quality of the GEMM (seed $SEED, default 97);
# bb = cold tuning of RMSNorm and TileGym's matmul with the caller's cuTile prewarm on and off (--env-ab);
# bc = the tables' bucket entry against the entry nearest the call's rows (probe_table_nearer), GEMM nearest quality;
# bd = ba's cold tuning, then bc, in one call.
# bg (2026-12-07 late) = the narrow-row fix: be's failing tests, the padded-row and narrow-product tests, the probe.
# bi (2026-12-08) = the fault space, then nearest quality of the eight memory-bound families; bj = first forward,
# then nearest quality of the GEMM and attention families; bk = bi with a shorter budget, then first forward;
# bl = the held race's GPU test, then nearest quality of all ten families after it (seed $SEED, default 103); bm = the fault space and
# first forward (for an H200); bn = the race and compile-ahead GPU tests, first forward and nearest quality of all
# ten families in one call (seed $SEED, default 107: the next session's first call, on any GPU); bo = a warm first
# forward under cProfile (where its misses go).
# Results under $OUT/r (tarred by the caller).
set -u
source .gpu/activate.sh
python -m compileall -q src benchmarks
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
t0=$(date +%s)
case "$1" in
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
    tests/test_gpu_zygote.py tests/test_gpu_zygote_fork.py tests/test_gpu_fallback.py tests/test_gpu_warm_model.py
    tests/test_gpu_race.py"
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
bl)
  # after 2026-12-08's held race (a spin kernel before each batch of race samples): nearest-neighbour quality of all
  # ten families on a new seed, memory-bound families first (cheap rows), as far as the budget goes
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  timeout -s INT -k 15 90 python -m pytest -m gpu -v -rfEs --tb=short -p no:cacheprovider tests/test_gpu_race.py \
    > $TSO/pytest_race.txt 2>&1; grep -E "^E |passed|failed" $TSO/pytest_race.txt | tail -6
  (cd benchmarks && timeout ${NQ_S:-450} python nearest_quality.py --out $TSO --per-family 40 --seed ${SEED:-103} \
    --families rms_norm,swiglu,softmax,rope,rms_norm_residual,layer_norm,geglu,cross_entropy,attention,matmul_linear \
    --budget-s $(( ${NQ_S:-450} - 50 )) > $TSO/nq.log 2>&1; tail -2 $TSO/nq.log | cut -c1-300)
  ;;
bm)
  # on an H200: the fault space (Xid watch, floor rule), then a model's first forward (seed $SEED) after the held race
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout 70 python fault_matrix.py --fault-space --out $TSO > $TSO/fault.log 2>&1; head -1 $TSO/fault.log | cut -c1-300)
  (cd benchmarks && timeout $(( ${FF_S:-220} + 30 )) python first_forward.py --out $TSO --shapes 4 --tuned-rows 1 \
    --seed ${SEED:-103} --budget-s ${FF_S:-220} > $TSO/ff.log 2>&1; tail -2 $TSO/ff.log | cut -c1-300)
  ;;
bn)
  # 2026-12-08 (second session, no device lent): one call for whatever GPU comes first. The held race's GPU test and
  # the compile-ahead test (signatures now named without cuTile's self-check: every first launch still a prefetch
  # hit), a model's first forward (warm rows: the lookups' naming; seed $SEED), then nearest-neighbour quality of all
  # ten families (the two nearest configs compile together on a cold compile cache)
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  timeout -s INT -k 15 ${TEST_S:-100} python -m pytest -m gpu -v -rfEs --tb=short -p no:cacheprovider tests/test_gpu_race.py \
    tests/test_gpu_compile_pool.py > $TSO/pytest_bn.txt 2>&1; grep -E "^E |passed|failed" $TSO/pytest_bn.txt | tail -8
  (cd benchmarks && timeout $(( ${FF_S:-130} + 30 )) python first_forward.py --out $TSO --shapes 4 --tuned-rows 1 \
    --seed ${SEED:-107} --budget-s ${FF_S:-130} > $TSO/ff.log 2>&1; tail -2 $TSO/ff.log | cut -c1-300)
  (cd benchmarks && timeout ${NQ_S:-280} python nearest_quality.py --out $TSO --per-family 40 --seed ${SEED:-107} \
    --families rms_norm,swiglu,softmax,rope,rms_norm_residual,layer_norm,geglu,cross_entropy,attention,matmul_linear \
    --budget-s $(( ${NQ_S:-280} - 40 )) > $TSO/nq.log 2>&1; tail -2 $TSO/nq.log | cut -c1-300)
  ;;
bo)
  # where a warm first forward's misses go, under cProfile (the rows' times are the profiler's, not figures to quote):
  # one model, two shapes, after the naming, hold and compile changes of 2026-12-08
  TSO=${OUT:-/tmp/out}/r; mkdir -p $TSO
  (cd benchmarks && timeout $(( ${FF_S:-150} + 30 )) python first_forward.py --out $TSO --shapes 2 --tuned-rows 0 \
    --models ${MODELS:-llama3-8b} --seed ${SEED:-109} --budget-s ${FF_S:-150} --profile > $TSO/ffp.log 2>&1; tail -2 $TSO/ffp.log | cut -c1-300)
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
l)
  (cd benchmarks && timeout ${TS_S:-330} python tuning_speed.py --out $R --reps ${REPS:-3} --kernels ${KERNELS:-tilegym_matmul,rmsnorm} \
    > $R/ts.log 2>&1; tail -3 $R/ts.log)
  ;;
esac
echo "part $1 took $(( $(date +%s) - t0 )) s"
