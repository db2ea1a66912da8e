#!/usr/bin/env bash
# The GPU work still owed (as of 2026-12-01), in parts that each fit one device call (< 10 minutes on a
# fresh H200). Run the parts in order, one `run` call each, back to back (the machine is released after
# 30 s idle), and copy what lands under OUT into benchmarks/results/h200/.
#
#   source .gpu/activate.sh && bash benchmarks/run_pending_h200.sh PART "$OUT"
#
# LIMIT=SECONDS overrides the per-part time limit (to run several parts in one call).
# PART (what is still owed after the 2026-12-02 10:13 session: projections, splits; gputests, gputests2, ncuattn, layout
# lineartable and linearcheck ran on 2026-12-02 09:29-10:13; gemmwt ran on 2026-12-02 08:00 and timer at 08:57; splitktail, cetail, callgap, attn, gapgrad, ncu, attnhost, rowwarps, ncugemm and
# clusters ran on 2026-12-02 06:35-07:12, see docs/GPU-NOTES.md):
#   timer    issue 14 (timer check): probe_timer.py, tt.bench (with and without its spin) against triton's do_bench on
#             copies and two torch GEMMs, with each harness's kernel durations read from CUPTI (torch.profiler)
#   lineartable issue 14: shipped-table keys for nn.Linear weights (a Hugging Face decoder's separate q, k, v, o, gate,
#             up, down layers, w.t()) at small M, every config measured (make_table --whole-spaces; copy the table back
#             from OUT), then the gemmwt sweep again with the table answering
#   linearcheck the Llama-3-8B nn.Linear key the lineartable calls left (64 x 14336 -> 4096), then first_call.py for a
#             matmul with its weight passed as w.t() in fresh processes: does the shipped table answer it?
#   layout   issue 14: 128x4096x4096 and 1024x4096x4096 with B as K x N and as W.t(), both tuned the same way (no
#             shipped table, the split-K op over its whole regime space): is the W.t() gap the layout or the budget?
#   ncuattn  issue 14: Nsight Compute of the library attention against SDPA (default choice and cuDNN alone) on
#             the two attention rows whose miss has no measured cause yet (B4 H32/8 S4096 D128 causal, B16 S1024 D64)
#   gputests, gputests2  every GPU test file over two calls: 6 pytest-xdist workers where timing does not matter
#             (norms/softmax/GLU/RoPE/CE and the KV cache; then split-K, GEMM, attention, decode, custom ops), then
#             the timing-sensitive and process-spawning files one at a time (the 2026-12-02 run: 617 + 42 of 664 passed)
#   ce       issue 12: the one-launch cross_entropy (plain loads): the shipped table's CE entries re-made (copy the table
#             back from OUT), the CE GPU tests, host_cost's and graphs_compile's CE rows (ran on 2026-12-02 05:50)
#   splitktail issue 14 (correctness): probe_splitk_tail.py, the split-K GEMM's real splits launched directly on small-M
#             Llama shapes in both weight layouts (TMA loads before an acquire-release counter, like the withdrawn
#             TMA cross-entropy kernel): wrong products and counters left non-zero (ran on 2026-12-02 06:37: 0 of 288)
#   attn     issue 14 item 5: attention as a LibraryOp (new kernel id): the shipped table's 5 attention entries re-made
#             (copy the table back from OUT), the attention GPU tests
#   gapgrad  issue 14 item 4: test_gpu_call_gap.py (the tuner's timer and a 2 ms backlog); the CE loss + grad GPU tests
#             (grad space: plain stores only)
#   ncu      issue 14: Nsight Compute of the library kernel and the fastest torch route's kernel on the memory-bound rows
#             that miss (ncu_rows.py; ncu_rows.json.gz, the report and its CSVs under OUT)
#   ncugemm  issue 14: the same for the library GEMM against cuBLAS (F.linear) on three Llama-3-8B / square rows
#   gemmwt   issue 14 (not run yet): the GEMM rows with the weight in nn.Linear's layout (N x K, passed as w.t());
#             every committed GEMM row times B row-major (K x N)
#   clusters issue 14: probe_gemm_clusters.py, num_ctas 1 vs 2 on the GEMM template's leading configs vs F.linear
#   attnhost issue 12 after attention became a LibraryOp: host_cost.py's and graphs_compile.py's attention rows
#   rowwarps issue 14: probe_row_warps.py, the short-row kernels with 1-4 worker warps per block (TMA loads) against the
#             shipped space and torch.compile (layer_norm and softmax at 65536x1024)
#   callgap  issue 14 item 4: tools/gemm_call_gap.py on 4096^3 and 1024x4096x4096 (the public call, a bare launch of
#             the winner and torch.matmul under the tuner's own timer and two backlog timers, NVML clocks, and the op
#             tuned again in process), then probe_launch_args.py (host cost of a launch by argument list)
#   cetail   issue 12: probe_ce_tail.py --time --grad, the one-launch cross-entropy kernels (wrong losses with TMA loads,
#             GPU time of the plain-load configs, the loss + gradient configs with --grad; ran on 2026-12-02 06:41)
#   issue12  issue 12: the fastcall and torch_ops GPU tests, dispatch_overhead.py and host_cost.py (call guards; the
#             host-cost rows' bare-launch floor), without the matmul and attention rows (hostmm: those)
#   power    issue 14: probe_power.py, the attention space timed at the power cap (hot) against its cool ranking
#   sustained issue 14: sustained_timing.py: the long attention rows and GEMM 4096^3 timed alone (the tuner's way),
#             back to back and alternating with torch, with NVML clocks (why the A/B reads 5-15% above the tuner)
#   smallhead issue 14: every config of the D<=64 attention space (occupancy 2-4) through the gate on MHA/GQA/MQA
#   graphs    issue 12: graphs_compile.py's torch.compile cases again (reduce-overhead of matmul and of the decoder
#             block failed on 2026-12-01 16:37: split-K scratch kept on the graph trees' stream; fixed on CPU since)
#   projections issue 13/20: shipped-table keys for a decoder layer's projection GEMMs (qkv, o, gate-up, down) of
#             Llama-3-8B and Qwen2.5-7B and Qwen's memory-op buckets (merged into the table; copy it back from OUT)
#   decoder   issue 20: decoder_layer.py --quick --fused-mlp --profile-kernels: per-kernel GPU time of one forward,
#             tiletune vs torch.compile (why the graph replay is 0.76-0.93x of reduce-overhead), and first forward
#   gap       issue 14: tests/test_gpu_call_gap.py again (4 of 5 passed; 4096^3: public call = bare launch of the
#             winner, 3.15% above the tuner's recorded median) and the graph-capture GPU tests of the ops
#   qwen      issue 20: the decoder layer with Qwen2.5-7B shapes (GQA 28/4, MLP 18944), --quick
#   gemm      issue 14: kernels_compute.py --only gemm --quick (tune_s of the budgeted split-K search per row)
#   first     issue 13: first_call.py for matmul with --profile (met on 2026-12-01: all served rows <= 0.057 s warm)
#   table     issue 13: split-K and attention keys of the shipped table (done on 2026-12-01)
#   verify    regression: the GPU test files of the split-K, decode attention, compile pool and campaign
#   tests     the GPU test files of the kernel library: kernels_compute, kernels_memory
#   campaign  issue 18: benchmarks/campaign.py --gpus 1 --kill (campaign.json; ran on 2026-12-01, 56 sessions)
#   backlog   issue 18: the campaign again with TILETUNE_TIMER_BACKLOG_US=50 (out/backlog/campaign.json): do
#             the two ~5 us keys whose picks differed between runs agree with a GPU spin before each sample?
#   gemmglu   issue 20: the fused gate-up + SwiGLU GEMM's GPU tests, then the decoder layer with --fused-mlp
#   memory    issue 14: kernels_memory.py --quick (every torch route: eager, compile, max-autotune)
#   attention issue 14: kernels_compute.py --only attention --quick (SDPA's backends, both GQA routes)
# The GPU host sets PYTHONDONTWRITEBYTECODE=1 and the bundle installs without .pyc: every part first compiles
# them (python -m compileall), as a pip install would have, so first-call timings are not dominated by
# compiling cuTile's sources in every fresh process.
#   swapgpu   issue 20 (2026-12-01 evening): GPU tests of the swapped small-M GEMM route, the direct (one-split) decode
#             attention and the one-kernel kv_cache_append
#   smalltable the shipped table's small-M matmul keys again (the split-K space changed: its entries were dropped;
#             copy the table back from OUT)
#   decoderq  issue 20: decoder_layer.py --quick --profile-kernels (unfused MLP) with the first forward
#   splits    issue 20: decode_splits.py, decode attention's KV split count swept per decode shape
#   context   issue 20: configs_in_context.py, rms_norm_residual's configs at Qwen's 3584 (the LAT=10 pick ran 10.7 us in
#             the layer) and Llama's 4096: tuner's median vs CUDA-graph replay cold, warm and after its producer GEMM
#   memtests  issue 14: the norms' and softmax's GPU tests in bf16 and fp32 (every candidate of every session must pass)
#   rows      issue 14: probe_rows.py, why the short-row kernels (65536x1024) trail torch.compile: plain vs TMA loads,
#             prefetch of the next row block, occupancy up to 16, against the library kernel and torch.compile
#   grouped   issue 20: the grouped direct decode kernel (any query-group size, e.g. Qwen's 7) against SDPA and
#             the split path (tests/test_gpu_decode_attention.py -k "grouped or qwen")
set -uo pipefail
part=${1:?PART}
out=$(realpath -m "${2:-/tmp/pending-h200}")
mkdir -p "$out"
cd "$(dirname "$0")/.."
limit() { timeout -k 10 "${LIMIT:-$1}" "${@:2}"; echo "[$part] $2 ${3:-} rc $?"; }
python -m compileall -q -j 0 "$(python -c 'import cuda.tile, os; print(os.path.dirname(os.path.dirname(os.path.dirname(cuda.tile.__file__))))')" src > /dev/null 2>&1
case "$part" in
  ce)
    T=src/tiletune/data/tables/h200-sm90.json
    limit 90 python benchmarks/make_table.py --db "$out/fill_ce.db" --table $T --ops cross_entropy --no-attention \
      --deadline-s 70 --report "$out/make_table_ce.json" 2>&1 | tail -3
    cp $T "$out/"
    limit 200 python -m pytest -m gpu -q -rs --durations=5 tests/test_gpu_kernels_memory.py tests/test_gpu_fastcall.py \
      tests/test_gpu_torch_ops.py -k cross_entropy --junitxml="$out/ce2.xml" > "$out/ce2.log" 2>&1
    tail -8 "$out/ce2.log"
    limit 40 python benchmarks/host_cost.py --only cross_entropy --out "$out/hc" 2>&1 | tail -3
    limit 60 python benchmarks/graphs_compile.py --ops cross_entropy,cross_entropy_grad --out "$out/gc" 2>&1 | tail -2 ;;
  splitktail)
    limit 400 python benchmarks/probe_splitk_tail.py --out "$out" 2>&1 | tail -20 ;;
  attn)
    T=src/tiletune/data/tables/h200-sm90.json
    limit 150 python benchmarks/make_table.py --db "$out/fill_attn.db" --table $T --ops "" --attention-s 512,1024,2048,4096,8192 \
      --deadline-s 120 --report "$out/make_table_attention.json" 2>&1 | tail -7
    cp $T "$out/"
    limit 300 python -m pytest -m gpu -q -rs --durations=5 tests/test_gpu_kernels_compute.py tests/test_gpu_torch_ops.py \
      -k "attention or (heads_of_64 and False)" --junitxml="$out/attn.xml" > "$out/attn.log" 2>&1
    tail -6 "$out/attn.log" ;;
  gapgrad)
    limit 330 python -m pytest -m gpu -q -rs --durations=5 tests/test_gpu_call_gap.py --junitxml="$out/gap.xml" > "$out/gap.log" 2>&1
    tail -4 "$out/gap.log"
    limit 200 python -m pytest -m gpu -q -rs --durations=5 tests/test_gpu_kernels_memory.py -k "grad" \
      --junitxml="$out/grad.xml" > "$out/grad.log" 2>&1
    tail -4 "$out/grad.log" ;;
  ncu)
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    limit 330 "$NCU" --profile-from-start off --clock-control none --target-processes application-only --nvtx \
      --set full -f -o "$out/ncu_rows" python benchmarks/ncu_rows.py 2>&1 | grep -v "^==PROF==" | tail -8
    "$NCU" --import "$out/ncu_rows.ncu-rep" --csv --page details > "$out/ncu_details.csv" 2> "$out/ncu_import.err"
    "$NCU" --import "$out/ncu_rows.ncu-rep" --csv --page raw > "$out/ncu_raw.csv" 2>> "$out/ncu_import.err"
    python benchmarks/ncu_rows.py --summarize "$out/ncu_details.csv" "$out/ncu_raw.csv" --out "$out" 2>&1 | tail -2
    gzip -f "$out/ncu_raw.csv" ;;
  ncugemm)
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    limit 300 "$NCU" --profile-from-start off --clock-control none --target-processes application-only --nvtx \
      --set full -f -o "$out/ncu_gemm" python benchmarks/ncu_rows.py \
      --rows gemm:1024x14336x4096,gemm:4096x4096x4096,gemm:16x4096x14336 2>&1 | grep -v "^==PROF==" | tail -6
    "$NCU" --import "$out/ncu_gemm.ncu-rep" --csv --page details > "$out/ncu_gemm_details.csv" 2> "$out/ncu_import.err"
    "$NCU" --import "$out/ncu_gemm.ncu-rep" --csv --page raw > "$out/ncu_gemm_raw.csv" 2>> "$out/ncu_import.err"
    python benchmarks/ncu_rows.py --summarize "$out/ncu_gemm_details.csv" "$out/ncu_gemm_raw.csv" --name ncu_gemm \
      --out "$out" 2>&1 | tail -2
    gzip -f "$out/ncu_gemm_raw.csv" ;;
  timer)
    limit 200 python benchmarks/probe_timer.py --out "$out" 2>&1 | grep -v "^{" | tail -8 ;;
  layout)
    for lay in kn nk; do
      flag=""; [ "$lay" = nk ] && flag="--b-transposed"
      limit 280 env TILETUNE_TABLES=0 TILETUNE_DB="/tmp/layout_$lay.db" python benchmarks/kernels_compute.py --only gemm \
        --quick --shapes 128x4096x4096,1024x4096x4096 --splitk-evals 0 --timer-check 0 $flag --out "$out/layout_$lay" 2>&1 \
        | grep -E "^\|" | tail -3
    done ;;
  ncuattn)
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    limit 400 "$NCU" --profile-from-start off --clock-control none --target-processes application-only --nvtx \
      --set full -f -o "$out/ncu_attention" python benchmarks/ncu_rows.py --launches 1 \
      --rows attention:4x32x8x4096x128c,attention:16x32x32x1024x64c 2>&1 | grep -v "^==PROF==" | tail -6
    "$NCU" --import "$out/ncu_attention.ncu-rep" --csv --page details > "$out/ncu_attention_details.csv" 2> "$out/ncu_import.err"
    "$NCU" --import "$out/ncu_attention.ncu-rep" --csv --page raw > "$out/ncu_attention_raw.csv" 2>> "$out/ncu_import.err"
    python benchmarks/ncu_rows.py --summarize "$out/ncu_attention_details.csv" "$out/ncu_attention_raw.csv" \
      --name ncu_attention --out "$out" 2>&1 | tail -2
    gzip -f "$out/ncu_attention_raw.csv" ;;
  gputests|gputests2)
    # two calls' worth: 6 pytest-xdist workers over the files where timing does not matter (-v: a cut run still
    # names what passed); gputests2 ends with the timing-sensitive and process-spawning files, one at a time
    if [ "$part" = gputests ]; then files="tests/test_gpu_kernels_memory.py tests/test_gpu_kv_cache.py"; else
      files="tests/test_gpu_splitk.py tests/test_gpu_kernels_compute.py tests/test_gpu_decode_attention.py
        tests/test_gpu_torch_ops.py tests/test_gpu_layernorm_kernel.py tests/test_gpu_gemm_glu.py"; fi
    limit "$([ "$part" = gputests ] && echo 560 || echo 300)" python -m pytest -m gpu -v -rs -n 6 --dist load \
      -p no:cacheprovider $files --junitxml="$out/${part}_parallel.xml" > "$out/${part}_parallel.log" 2>&1
    grep -cE " PASSED" "$out/${part}_parallel.log"; grep -E "FAILED|ERROR| passed| failed" "$out/${part}_parallel.log" | tail -8
    if [ "$part" = gputests2 ]; then
      limit 260 python -m pytest -m gpu -v -rs -p no:cacheprovider tests/test_gpu_call_gap.py tests/test_gpu_bench.py \
        tests/test_gpu_core.py tests/test_gpu_fastcall.py tests/test_gpu_faults.py tests/test_gpu_compile_pool.py \
        tests/test_gpu_campaign.py --junitxml="$out/gputests_sequential.xml" > "$out/gputests_sequential.log" 2>&1
      grep -E "FAILED|ERROR| passed| failed" "$out/gputests_sequential.log" | tail -8
    fi ;;
  lineartable)
    T=src/tiletune/data/tables/h200-sm90.json
    limit 340 python benchmarks/make_table.py --db "$out/fill_linear.db" --table $T --ops matmul --projections \
      --linear-weights --whole-spaces --tokens 128,16,1,8,64,256 --no-attention --deadline-s 230 \
      --report "$out/make_table_linear.json" 2>&1 | tail -14
    cp $T "$out/"
    limit 200 python benchmarks/kernels_compute.py --only gemm --quick --b-transposed --deadline 170 --out "$out/wt" 2>&1 \
      | grep -E "^\|" | tail -10 ;;
  linearcheck)
    T=src/tiletune/data/tables/h200-sm90.json
    limit 100 python benchmarks/make_table.py --db "$out/fill_linear3.db" --table $T --ops matmul --projections \
      --linear-weights --whole-spaces --tokens 64 --no-attention --deadline-s 60 \
      --report "$out/make_table_linear3.json" 2>&1 | grep -v "^\[W" | tail -6
    cp $T "$out/"
    limit 120 python benchmarks/first_call.py --ops matmul --sources shipped --linear-weights --out "$out" 2>&1 \
      | grep -v "^{" | tail -4 ;;
  gemmwt)
    limit 560 python benchmarks/kernels_compute.py --only gemm --quick --b-transposed --deadline 420 --out "$out/wt" 2>&1 \
      | tail -30 ;;
  clusters)
    limit 200 python benchmarks/probe_gemm_clusters.py --out "$out" 2>&1 | tail -4 ;;
  attnhost)
    limit 200 python benchmarks/host_cost.py --only attention --rounds 9 --out "$out/hc" 2>&1 | tail -6
    limit 150 python benchmarks/graphs_compile.py --ops attention --out "$out/gc" 2>&1 | tail -6 ;;
  rowwarps)
    limit 420 python benchmarks/probe_row_warps.py --rows layer_norm:65536x1024,softmax:65536x1024 --out "$out" 2>&1 \
      | grep -v "^ " | tail -8 ;;
  callgap)
    limit 300 python tools/gemm_call_gap.py --problems 1x4096x4096x4096,1x1024x4096x4096 --out "$out" 2>&1 | tail -4
    limit 60 python benchmarks/probe_launch_args.py --out "$out" 2>&1 | tail -2 ;;
  cetail)
    limit 400 python benchmarks/probe_ce_tail.py --time --grad --out "$out" 2>&1 | grep -v "^{'shape'" | tail -18 ;;
  verify)
    limit 560 python -m pytest -m gpu -q -rs --durations=10 tests/test_gpu_compile_pool.py tests/test_gpu_splitk.py tests/test_gpu_decode_attention.py \
      tests/test_gpu_campaign.py --junitxml="$out/verify.xml" > "$out/verify.log" 2>&1
    tail -40 "$out/verify.log" ;;
  tests)
    limit 560 python -m pytest -m gpu -q -rs -x tests/test_gpu_kernels_compute.py tests/test_gpu_kernels_memory.py \
      --durations=15 --junitxml="$out/tests.xml" 2>&1 | tail -40 ;;
  campaign)
    limit 560 python benchmarks/campaign.py --gpus 1 --kill --save-dbs "$out/dbs" --out "$out" 2>&1 | tail -30 ;;
  backlog)
    limit 560 python benchmarks/campaign.py --gpus 1 --backlog-us 50 --out "$out/backlog" 2>&1 | tail -20 ;;
  gemmglu)
    limit 240 python -m pytest -m gpu -q -rs --durations=10 tests/test_gpu_gemm_glu.py > "$out/gemmglu.log" 2>&1
    tail -30 "$out/gemmglu.log"
    limit 300 python benchmarks/decoder_layer.py --quick --fused-mlp --no-first-forward --out "$out" 2>&1 | tail -12 ;;
  first)
    limit 560 python benchmarks/first_call.py --ops matmul --profile --out "$out" 2>&1 | grep -v "^ " | tail -30 ;;
  gap)
    limit 560 python -m pytest -m gpu -q -rs --durations=10 tests/test_gpu_call_gap.py tests/test_gpu_torch_ops.py \
      tests/test_gpu_kernels_compute.py --junitxml="$out/gap.xml" > "$out/gap.log" 2>&1
    tail -40 "$out/gap.log" ;;
  projections)
    T=src/tiletune/data/tables/h200-sm90.json
    limit 330 python benchmarks/make_table.py --db "$out/fill.db" --table $T --ops matmul --projections \
      --tokens 1,8,16,64,128,256,512,2048,4096 --no-attention --deadline-s 300 --report "$out/make_table_projections.json" 2>&1 | tail -8
    limit 230 python benchmarks/make_table.py --db "$out/fill_qwen.db" --table $T --model qwen2.5-7b \
      --ops rms_norm,rms_norm_residual,swiglu,apply_rope_,matmul --projections --tokens 1,8,16,128,1024,2048 \
      --attention-s 2048,4096 --deadline-s 200 --report "$out/make_table_qwen.json" 2>&1 | tail -8
    cp $T "$out/" ;;
  swapgpu)
    limit 170 python -m pytest -m gpu -q -rs --durations=5 tests/test_gpu_splitk.py -k "swap or production" \
      --junitxml="$out/swapgpu_gemm.xml" > "$out/swapgpu_gemm.log" 2>&1
    tail -12 "$out/swapgpu_gemm.log"
    limit 200 python -m pytest -m gpu -q -rs --durations=5 tests/test_gpu_decode_attention.py tests/test_gpu_kv_cache.py \
      --junitxml="$out/swapgpu_decode.xml" > "$out/swapgpu_decode.log" 2>&1
    tail -25 "$out/swapgpu_decode.log" ;;
  smalltable)
    T=src/tiletune/data/tables/h200-sm90.json
    limit 200 python benchmarks/make_table.py --db "$out/fill.db" --table $T --ops matmul --no-attention \
      --tokens 1,16,128,8,64,256,32 --deadline-s 170 --report "$out/make_table_small_m.json" 2>&1 | tail -10
    cp $T "$out/" ;;
  decoderq)
    limit 560 python benchmarks/decoder_layer.py --quick --profile-kernels --out "$out" 2>&1 | tail -5 ;;
  grouped)
    limit 300 python -m pytest -m gpu -q -rs --durations=5 tests/test_gpu_decode_attention.py -k "grouped or qwen" \
      --junitxml="$out/grouped.xml" > "$out/grouped.log" 2>&1
    tail -15 "$out/grouped.log" ;;
  issue12)
    limit 200 python -m pytest -m gpu -q -rs --durations=5 tests/test_gpu_fastcall.py tests/test_gpu_torch_ops.py \
      --junitxml="$out/issue12.xml" > "$out/issue12.log" 2>&1
    tail -12 "$out/issue12.log"
    limit 100 python benchmarks/dispatch_overhead.py --out "$out" 2>&1 | tail -4
    limit 250 python benchmarks/host_cost.py --skip matmul,attention --out "$out" 2>&1 | tail -30 ;;
  hostmm)
    limit 400 python benchmarks/host_cost.py --only matmul --rounds 9 --out "$out/mm" 2>&1 | tail -12
    limit 150 python benchmarks/host_cost.py --only attention --rounds 9 --out "$out/attn" 2>&1 | tail -6 ;;
  power)
    limit 300 python benchmarks/probe_power.py --out "$out" 2>&1 | tail -45 ;;
  sustained)
    limit 300 python benchmarks/sustained_timing.py --out "$out" 2>&1 | tail -8 ;;
  smallhead)
    limit 300 python -m pytest -m gpu -q -rs --durations=5 tests/test_gpu_kernels_compute.py -k "small_head" \
      --junitxml="$out/smallhead.xml" > "$out/smallhead.log" 2>&1
    tail -15 "$out/smallhead.log" ;;
  memtests)
    TILETUNE_GPU_QUICK=1 limit 400 python -m pytest -m gpu -q -rs --durations=5 tests/test_gpu_kernels_memory.py \
      -k "rms_norm or layer_norm or softmax" --junitxml="$out/memtests.xml" > "$out/memtests.log" 2>&1
    tail -15 "$out/memtests.log" ;;
  rows)
    limit 420 python benchmarks/probe_rows.py --out "$out" 2>&1 | tail -40 ;;
  context)
    for shape in "8 3584" "64 3584" "8 4096"; do
      set -- $shape
      mkdir -p "$out/context_$1x$2"
      limit 150 python benchmarks/configs_in_context.py --op rms_norm_residual --rows $1 --cols $2 \
        --out "$out/context_$1x$2" 2>&1 | tail -3
    done ;;
  splits)
    limit 330 python benchmarks/decode_splits.py --deadline-s 270 --out "$out" 2>&1 | grep "ns=" | tail -80 ;;
  graphs)
    limit 560 python benchmarks/graphs_compile.py --cases compile_fullgraph,reduce_overhead --deadline 500 --out "$out" 2>&1 | tail -30 ;;
  table)
    limit 540 python benchmarks/make_table.py --db "$out/fill.db" --table src/tiletune/data/tables/h200-sm90.json \
      --tokens 1,16,128,1024,4096,8,64,512,2048,2,4,32,256,8192,16384 \
      --deadline-s 480 --report "$out/make_table.json" 2>&1 | tail -20
    cp src/tiletune/data/tables/h200-sm90.json "$out/" ;;
  qwen)
    limit 560 python benchmarks/decoder_layer.py --quick --model qwen2.5-7b --no-first-forward --out "$out" 2>&1 | tail -12 ;;
  decoder1)
    limit 400 python benchmarks/decoder_layer.py --rows decode:8:2048 --no-first-forward --out "$out" 2>&1 | tail -12 ;;
  decoder)
    limit 560 python benchmarks/decoder_layer.py --quick --fused-mlp --profile-kernels --out "$out" 2>&1 | tail -30 ;;
  gemm)
    limit 560 python benchmarks/kernels_compute.py --only gemm --quick --deadline 420 --out "$out" 2>&1 | tail -30 ;;
  memory)
    limit 560 python benchmarks/kernels_memory.py --quick --no-readme --out "$out" 2>&1 | tail -30 ;;
  attention)
    limit 560 python benchmarks/kernels_compute.py --only attention --quick --deadline 300 --out "$out" 2>&1 | tail -30 ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
esac
